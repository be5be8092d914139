/* The job spec: one table of options feeds the command line, DLAUNCH_* variables, the YAML job
 * file, --help and the docs. Precedence: flag > environment > YAML > default.
 *
 * The library never prints: every failure comes back as -errno plus a one-line message that names
 * where the bad value came from ("job.yaml:3:5: ...", "--nodes: ...", "DLAUNCH_NODES: ...").
 */
#ifndef DL_CONFIG_H
#define DL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define DL_CONFIG_ERRLEN 512

/* --gpus-per-node / --nproc-per-node values other than a count. */
#define DL_GPUS_DEFAULT (-1) /* unset: one worker per GPU found, else one */
#define DL_GPUS_AUTO (-2)    /* torchrun's auto: one per GPU found, else one per usable CPU */
#define DL_GPUS_CPU (-3)     /* one per usable CPU */
#define DL_GPUS_GPU (-4)     /* one per GPU found; none found is an error */
#define DL_GPUS_XPU (-5)     /* one per Intel GPU (torch's xpu) found; none is an error */

typedef enum {
    DL_RDZV_C10D = 0, /* our rendezvous: embedded in an agent, or dlaunchd */
    DL_RDZV_STATIC,   /* torchrun's static: --master-addr/--master-port, fixed --node-rank */
    DL_RDZV_ETCD,     /* etcd's v3 API */
    DL_RDZV_ETCD_V2,  /* refused: etcd 3.6 removed the v2 API */
} dl_rdzv_backend_t;

typedef enum {
    DL_START_SPAWN = 0, /* torchrun's --start-method; we always fork and exec */
    DL_START_FORK,
    DL_START_FORKSERVER,
} dl_start_method_t;

/* --numa-binding: torchrun's modes, in the order of numa_modes in config/options.c. */
typedef enum {
    DL_NUMA_AUTO = 0, /* torchrun's default: node when the workers are as many as the GPUs */
    DL_NUMA_NONE,     /* never bind */
    DL_NUMA_NODE,
    DL_NUMA_SOCKET,
    DL_NUMA_EXCLUSIVE,
    DL_NUMA_CORE_COMPLEX,
} dl_numa_mode_t;

typedef struct dl_job_spec_s dl_job_spec_t;

struct dl_job_spec_s {
    int nodes_min;
    int nodes_max;
    int gpus_per_node; /* DL_GPUS_* or >= 1 */
    int max_restarts;
    double stop_timeout;   /* seconds */
    int max_same_failures; /* attempts in a row failing the same way that end the job; 0 never */
    double
        health_timeout; /* seconds without a health beat before a beating worker is hung; 0 off */
    char *recovery;     /* "restart" or "in-job" (docs/recovery.md); NULL: restart, but
                            * dl_train_command makes it in-job for the bundled trainer */
    int spares;         /* in-job: workers per node started ahead to take a failed rank's place */
    char *run_id;       /* NULL: the agent makes one up */
    char *log_dir;
    char *events; /* NULL: none; "-": stdout */
    bool dry_run;
    bool quiet;
    bool verbose;
    bool nodes_set; /* nodes came from a flag, a variable or the YAML, not the default */
    bool gpus_set;
    bool gpus_from_nproc; /* the count came from --nproc-per-node (processes, not GPUs) */

    /* Several nodes: the rendezvous. */
    dl_rdzv_backend_t rdzv_backend;
    char *rdzv_endpoint;  /* HOST:PORT; NULL: none (one node on its own) */
    int node_rank;        /* -1: let the rendezvous choose */
    double join_timeout;  /* seconds for the job to gather its nodes */
    double last_call;     /* seconds to wait for more nodes once MIN joined */
    double close_timeout; /* --rdzv-conf close_timeout: accepted, for torchrun's sake */
    double read_timeout;  /* --rdzv-conf read_timeout: a rendezvous reply later than this fails */
    int is_host;          /* --rdzv-conf is_host: -1 decide, 0 never host, 1 host */
    bool store_worker;    /* --rdzv-conf store=worker: rank 0 hosts torch's store, not the agent */
    double heartbeat;     /* seconds between an agent's heartbeats */
    double dead_after;    /* seconds without a heartbeat before a node is dead */
    char *token_file;
    char *rdzv_conf;                /* as given, for --dry-run */
    char *duplicate_stdout_filters; /* torchrun's: lines with one of these strings (a, b) */
    char *duplicate_stderr_filters; /* are copied to attempt_K/filtered_std{out,err}.log */
    bool merge_output;       /* ours: identical console lines of several ranks printed once */
    double merge_window;     /* seconds a merged line waits for the other ranks' */
    bool virtual_local_rank; /* torchrun's: each worker sees LOCAL_RANK=0 and its own device */
    bool standalone;         /* torchrun's --standalone: one node, a rendezvous of its own */
    char *master_addr;       /* --master-addr, or NULL */
    int master_port;         /* --master-port, or -1 */
    char *local_addr;        /* --local-addr: the address this node advertises, or NULL */
    /* etcd (--rdzv-conf user=..., password_file=..., protocol=..., cacert=..., cert=..., key=...,
     * prefix=...), all NULL when not given. */
    char *etcd_user;
    char *etcd_password_file;
    char *etcd_protocol;
    char *etcd_cacert;
    char *etcd_cert;
    char *etcd_key;
    char *etcd_prefix;

    /* What runs. */
    char *role;              /* ROLE_NAME, "default" */
    bool module;             /* -m: the script is a Python module */
    bool no_python;          /* run the script itself, not python3 script */
    bool run_path;           /* --run-path: python3 runs the script by path (as runpy) */
    char *python_exec;       /* the interpreter of a script command (PYTHON_EXEC), or NULL */
    double monitor_interval; /* accepted; workers are watched by events, not polled */
    dl_start_method_t start_method;
    char *redirects;             /* torchrun's -r: 0-3, or LOCAL_RANK:N,... ("0": none) */
    char *tee;                   /* torchrun's -t, the same form */
    char *local_ranks_filter;    /* comma-separated local ranks shown on the console, or NULL */
    char *signals;               /* --signals-to-handle, comma-separated signal names */
    dl_numa_mode_t numa_binding; /* where workers run (agent/placement.c) */
    /* --forward-signals: passed on to the workers while the job goes on; NULL means the
     * default (SIGUSR1,SIGUSR2 under Slurm, none elsewhere: dl_forward_signals), "none" none. */
    char *forward_signals;
    char *logs_specs;        /* accepted, warned, ignored */
    char *event_log_handler; /* accepted, warned, ignored */
    char *http; /* ADDR:PORT where the hosted rendezvous serves /metrics, / and /api; NULL off */

    /* Diagnostics (docs/diagnostics.md). */
    char *straggler_action;     /* "warn" (NULL means it too), "exclude" or "off" */
    double straggler_threshold; /* slower than the median by this fraction */
    int straggler_window;       /* steps */
    double straggler_cooldown;  /* seconds an excluded node waits before joining again */

    char *spec_path; /* the YAML file, or NULL */
    char **command;  /* NULL-terminated argv, owned */
    size_t command_len;
    char **env; /* NULL-terminated "NAME=value" list from the spec's env:, owned */
    size_t env_len;
    /* The spec's train: section, for the bundled trainer: "key=value" (lists joined with ','),
     * and beside each where its value came from ("job.yaml:7:3") and where its key did, all
     * NULL-terminated and owned. Non-NULL (possibly empty) when the spec has a train: section. */
    char **train;
    char **train_where;
    char **train_key_where;
    size_t train_len;
};

typedef enum {
    DL_CONFIG_RUN = 0,
    DL_CONFIG_HELP,
    DL_CONFIG_VERSION,
} dl_config_action_t;

/* Fills spec from argv (argv[0] is the program), the environment (a NULL-terminated environ-style
 * list) and the YAML file named on the command line. On success *ret_action says what to do.
 * On failure returns -EINVAL (bad input) or -ENOMEM/-errno and writes one line into err.
 * The caller frees spec with dl_job_spec_free() either way. */
int dl_config_load(dl_job_spec_t *spec, int argc, char **argv, char **environ_list,
                   dl_config_action_t *ret_action, char *err, size_t errlen);

/* Loads only the YAML file into spec (used by dl_config_load; public for tests). */
int dl_config_load_yaml(dl_job_spec_t *spec, const char *path, char *err, size_t errlen);

/* Same, from a buffer; name is used in messages in place of a path. */
int dl_config_load_yaml_string(dl_job_spec_t *spec, const char *name, const char *text, size_t len,
                               char *err, size_t errlen);

void dl_job_spec_init(dl_job_spec_t *spec);
void dl_job_spec_free(dl_job_spec_t *spec);

/* Writes --help to the given stream (FILE * kept opaque to spare users stdio.h). */
void dl_config_print_help(void *stream, const char *progname);

/* The job spec's option table (opt.h's dl_opt_table_t), for the generated documentation: the
 * man pages' option list, the job spec's keys for dlaunch-jobspec(5), the shell completion. */
const struct dl_opt_table_s *dl_config_options(void);

/* Checked number parsing: the whole string must be a number within [min, max].
 * Returns 0 or -EINVAL (junk, empty) / -ERANGE. */
int dl_parse_int(const char *s, long min, long max, long *ret);
int dl_parse_double(const char *s, double min, double max, double *ret);

/* The value of name in envp (NULL-terminated NAME=value strings; may be NULL), or NULL; the first
 * occurrence wins, as with getenv(). */
const char *dl_env_get(char *const *envp, const char *name);

/* "N" or "MIN:MAX" with 1 <= MIN <= MAX. */
int dl_parse_nodes(const char *s, int *ret_min, int *ret_max);

/* What --signals-to-handle forwards by default, as torchrun. */
#define DL_DEFAULT_SIGNALS "SIGTERM,SIGINT,SIGHUP,SIGQUIT"

/* What --forward-signals passes on under Slurm when it is not given: the signals `sbatch
 * --signal` sends before a time limit or a preemption. */
#define DL_SLURM_FORWARD_SIGNALS "SIGUSR1,SIGUSR2"

/* The signals a job passes on to its workers: the spec's --forward-signals, else the default,
 * which depends on whether envp is a Slurm job's. Never NULL; "" for none. */
const char *dl_forward_signals(const dl_job_spec_t *spec, char *const *envp);

/* torchrun's std spec (-r/--redirects, -t/--tee): "N" for every local rank, or
 * "LOCAL_RANK:N,..." (unlisted ranks 0), N being 0 none, 1 stdout, 2 stderr, 3 both.
 * Returns N for local_rank (0 for a NULL spec), or -EINVAL for a bad spec. */
int dl_std_spec_for(const char *spec, int local_rank);

/* Whether n is in a comma-separated list of whole numbers; a NULL list holds everything.
 * A bad list is -EINVAL. */
int dl_int_list_has(const char *list, int n);

/* Calls cb for each signal named in a comma-separated list ("SIGTERM,SIGUSR1" or "TERM,USR1");
 * returns 0, or -EINVAL naming the bad entry in bad (badlen bytes). */
int dl_signal_list_each(const char *list, void (*cb)(void *ctx, int sig), void *ctx, char *bad,
                        size_t badlen);

/* Warns (through warn) about every DLAUNCH_* variable in envp that is no option and no variable
 * the programs read, naming the closest option's variable when there is one. */
void dl_config_unknown_vars(char *const *envp,
                            void (*warn)(void *ctx, const char *var, const char *closest),
                            void *ctx);

#endif
