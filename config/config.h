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

/* --gpus-per-node auto. */
#define DL_GPUS_AUTO (-1)

typedef struct dl_job_spec_s dl_job_spec_t;

struct dl_job_spec_s {
    int nodes_min;
    int nodes_max;
    int gpus_per_node; /* DL_GPUS_AUTO or >= 1 */
    int max_restarts;
    double stop_timeout; /* seconds */
    double health_timeout; /* seconds without a health beat before a beating worker is hung; 0 off */
    char *run_id;        /* NULL: the agent makes one up */
    char *log_dir;
    char *events; /* NULL: none; "-": stdout */
    bool dry_run;
    bool quiet;
    bool verbose;
    bool nodes_set; /* nodes came from a flag, a variable or the YAML, not the default */
    bool gpus_set;

    /* Several nodes: the rendezvous. */
    char *rdzv_endpoint; /* HOST:PORT; NULL: none (one node on its own) */
    int node_rank;       /* -1: let the rendezvous choose */
    double join_timeout; /* seconds for the job to gather its nodes */
    double last_call;    /* seconds to wait for more nodes once MIN joined */
    double heartbeat;    /* seconds between an agent's heartbeats */
    double dead_after;   /* seconds without a heartbeat before a node is dead */
    char *token_file;

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
     * and beside each where it came from ("job.yaml:7:3"), both NULL-terminated and owned.
     * Non-NULL (possibly empty) when the spec has a train: section. */
    char **train;
    char **train_where;
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
int dl_config_load_yaml_string(dl_job_spec_t *spec, const char *name, const char *text,
                               size_t len, char *err, size_t errlen);

void dl_job_spec_init(dl_job_spec_t *spec);
void dl_job_spec_free(dl_job_spec_t *spec);

/* Writes --help to the given stream (FILE * kept opaque to spare users stdio.h). */
void dl_config_print_help(void *stream, const char *progname);

/* Checked number parsing: the whole string must be a number within [min, max].
 * Returns 0 or -EINVAL (junk, empty) / -ERANGE. */
int dl_parse_int(const char *s, long min, long max, long *ret);
int dl_parse_double(const char *s, double min, double max, double *ret);

/* The value of name in envp (NULL-terminated NAME=value strings; may be NULL), or NULL; the first
 * occurrence wins, as with getenv(). */
const char *dl_env_get(char *const *envp, const char *name);

/* "N" or "MIN:MAX" with 1 <= MIN <= MAX. */
int dl_parse_nodes(const char *s, int *ret_min, int *ret_max);

#endif
