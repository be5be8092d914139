/* Shared between the files of agent/: the agent's state. */
#ifndef DL_AGENT_INTERNAL_H
#define DL_AGENT_INTERNAL_H

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"
#include "death.h"
#include "diag.h"
#include "event-table.h"
#include "merge.h"
#include "output.h"
#include "spawn.h"
#include "summary.h"
#include "supervisor.h"

typedef struct dl_agent_s dl_agent_t;
struct dl__rdzv_s;
typedef struct dl__diag_s dl__diag_t;

typedef struct {
    long long step;
    double loss;          /* NaN: not known */
    double samples_per_s; /* NaN: not known */
} dl_agent_progress_t;

typedef struct {
    dl_agent_t *agent;
    int rank;
    int local_rank;
    pid_t pid;   /* 0 when not running */
    int attempt; /* of the running process */
    dl_output_t *output;
    int health_rd;         /* read end of its health pipe, or -1 */
    bool beating;          /* it has sent a beat this attempt */
    bool hung;             /* we killed it for going silent */
    double killed_at;      /* monotonic seconds of the SIGKILL we sent it, 0 none */
    double last_beat;      /* monotonic seconds of the last beat seen */
    bool output_open;      /* the output of `attempt` has not drained yet */
    dl_diag_beats_t beats; /* what its beats said: step, loss, compute and wait times (diag.h) */
    unsigned incarnation;  /* processes started in this slot: tells a replacement's output apart */
    unsigned dir_serial;   /* the attempt folder it last started in (attempt_serial) */
    /* In-job recovery's control channel (recovery.c): the agent's end, what came on it. */
    int ctl_fd;
    uv_poll_t *ctl_poll;
    char ctl_buf[1024];
    size_t ctl_len;
    bool ctl_hello; /* it speaks the protocol */
    int ctl_gen;    /* the generation it said it recovered in */
    /* Hot spares (spares.c): a spare has no rank yet (rank is -1 - its index); its output's
     * owner record, renamed when the spare takes a rank. */
    bool spare;
    void *output_owner;
} dl__worker_t;

/* One file of --duplicate-std{out,err}-filters (dupfilter.c). */
typedef struct {
    bool open; /* tried for attempt; fd -1 if that failed */
    bool failed;
    int attempt;
    int fd;
} dl__dup_t;

struct dl_agent_s {
    uv_loop_t loop;
    const dl_job_spec_t *spec;
    char **environ_list;
    dl_sup_t sup;
    int nworkers;
    int node_rank;
    int nnodes;
    int world_size;
    dl__worker_t *workers;
    int gpus;                  /* GPUs found (CUDA_VISIBLE_DEVICES, or the driver's list) */
    dl_numa_mode_t numa_mode;  /* the binding in force, --numa-binding's or the default */
    bool numa_by_default;      /* bound unasked: as many workers as GPUs */
    struct dl_place_s *places; /* per local rank, NULL when unbound (placement.c) */
    int nplaces;
    char unbound_why[700];   /* why unbound, for --dry-run */
    uv_signal_t signals[32]; /* --signals-to-handle, then SIGCHLD */
    int nsignals;
    /* --forward-signals (forward.c): those that do not stop the job, read from a signalfd. */
    int forward[32];
    int nforward;
    int forward_fd;
    uv_poll_t forward_poll;
    bool forward_open;
    uv_timer_t stop_timer;
    uv_timer_t reap_timer;   /* a worker SIGKILLed long ago and still not reaped is named */
    dl_memcg_t memcg;        /* the memory cgroups the workers are charged to, for OOM kills */
    bool memcg_read;         /* memcg found and its counters read (after the first spawns) */
    uv_timer_t health_timer; /* --health-timeout: looks at the health pipes now and then */
    dl_events_t *events;
    dl_guard_t guard;
    char *run_id;
    char *command_path;
    char *run_dir;     /* LOGDIR/RUN_ID, as given, for messages */
    char *run_dir_abs; /* the same, absolute, for files and workers */
    char attempt_dir[4096];
    unsigned attempt_serial; /* counts start_attempt's folders: a worker's dir_serial names one */
    char *made_dir; /* the last of them when this agent made it, so it holds only what it started */
    dl__dup_t dup[2];            /* stdout's and stderr's filtered copies */
    dl_merge_t merge;            /* --merge-output's pending lines */
    uv_timer_t merge_timer;      /* prints them when their window passes */
    bool merge_closed;           /* the timer is closed: lines still draining are printed at once */
    struct dl__ftimer_s *ftimer; /* the file-timer watchdog (filetimer-watch.c), or NULL */
    char master_addr[256];
    int master_port;
    char *endpoint;     /* the rendezvous to join (--rdzv-endpoint, or static's master), or NULL */
    int want_node_rank; /* the node rank asked for (static: --node-rank, default 0), or -1 */
    int nodes_min, nodes_max;
    double started_at;         /* wall clock at start, for the closing line */
    char prefix_template[256]; /* TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, or "" */
    char ifname[64];           /* the interface the workers bind (GLOO_SOCKET_IFNAME...), or "" */
    char if_addr[128];         /* its address that reaches MASTER_ADDR */
    int exit_code;
    bool remote;          /* a rendezvous decides rounds (several nodes) */
    dl__worker_t *spares; /* --spares' slots (spares.c), nspares of them */
    int nspares;
    bool spares_lost;        /* one failed to start or died waiting: none is started again */
    struct dl__rdzv_s *rdzv; /* rdzv.c's state, when remote */
    int round;               /* the rendezvous round the workers belong to */
    /* The job's restarts spent on failures, as the round's assignment said: the workers'
     * TORCHELASTIC_RESTART_COUNT over several nodes (rounds opened by a join, a departure or
     * `dlaunch restart` are attempts, not restarts, as torchrun counts them). */
    int restarts_spent;
    char failure_text[512];    /* the job's failure as the rendezvous described it */
    char report_reason[400];   /* a failure report's text when no worker's exit says it */
    char store_addr[300];      /* DLAUNCH_STORE for the workers, or "" */
    bool agent_store;          /* an agent serves torch's store at MASTER_ADDR:MASTER_PORT */
    char *token_path;          /* the workers' key file (DLAUNCH_TOKEN_FILE), or NULL */
    dl__diag_t *diag;          /* inspect.c: recorders, stragglers, hang accounts */
    dl_sup_failure_t *history; /* the first failure of every failed attempt */
    size_t nhistory;
    dl_summary_unwritten_t *unwritten; /* log files that could not be written, for the summary */
    size_t nunwritten;
    bool report_pending;     /* the failure report waits for the failed rank's output */
    bool stopped_by_request; /* the rendezvous ended the job on a stop request */
    /* The job's training progress, passed on with each heartbeat while progress_valid. */
    dl_agent_progress_t progress;
    bool progress_valid;
    /* In-job recovery (recovery.c, docs/recovery.md). */
    int gen;              /* the workers' group generation: 0 each attempt, +1 a recovery */
    bool recovering;      /* a recovery is under way */
    uv_timer_t rec_timer; /* gives up on it */
    bool rec_timer_armed;
    int rec_rank; /* the rank being replaced */
    dl_sup_failure_t rec_failure;
    double rec_started;   /* monotonic seconds */
    long long rec_step;   /* where the workers said they went on */
    long long rec_was;    /* the newest step one of them had completed before */
    char rec_reason[600]; /* remote: the round change's reason */
    char rec_reason_short[220];
    long long rec_last_step; /* the last recovery that finished: where, how long */
    double rec_last_ms;
    int rec_replaced[64];    /* remote: the ranks this node replaced in this recovery */
    uv_timer_t broken_timer; /* remote: a worker's group broke; report it unless told why */
    char broken_reason[400];
    int nrec_replaced;
    int rec_source;
    char readbuf[64 * 1024];
};

double dl__now_unix(void);
/* Sends SIGKILL to w's process group and watches that it goes (an unreapable worker is named
 * and given up on). */
void dl__agent_sigkill(dl_agent_t *a, dl__worker_t *w);
/* forward.c: whether the agent passes sig on to its workers and goes on (--forward-signals);
 * starting (after the stop signals are set up) and closing that. */
bool dl__agent_forwards(const dl_agent_t *a, int sig);
int dl__forward_start(dl_agent_t *a);
void dl__forward_close(dl_agent_t *a);
/* A console line of a worker's stream (0 stdout, 1 stderr): copied to the attempt's
 * filtered_std{out,err}.log when it matches the stream's --duplicate-*-filters. */
void dl__dup_line(dl_agent_t *a, int attempt, int stream, const char *prefix, const char *line,
                  size_t len);
void dl__dup_close(dl_agent_t *a);

/* torch's file-timer watchdog (filetimer-watch.c): started when TORCHELASTIC_ENABLE_FILE_TIMER=1
 * (0 when not asked; -errno, said, when the pipe cannot be made); closed with the loop's
 * handles. dl__ftimer_path: TORCHELASTIC_TIMER_FILE for the workers, or NULL. */
typedef struct dl__ftimer_s dl__ftimer_t;
int dl__ftimer_start(dl_agent_t *a);
const char *dl__ftimer_path(const dl_agent_t *a);
void dl__ftimer_close(dl_agent_t *a);
void dl__agent_log(const dl_agent_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Feeds the supervisor and carries out what it says. */
void dl__agent_feed(dl_agent_t *a, dl_sup_event_t ev);
/* The rendezvous event of a round (docs/events.md); kept only where has_kept (in-job
 * recovery's rounds). */
void dl__agent_rendezvous_event(dl_agent_t *a, int round, bool has_kept, bool kept);
/* Sizes the worker table for n local workers whose global ranks start at first_rank. */
int dl__agent_set_ranks(dl_agent_t *a, int first_rank, int n);

/* placement.c: --numa-binding. */
const char *dl__place_hw_root(const dl_agent_t *a); /* "" or DLAUNCH_SYSFS_ROOT (tests) */
int dl__place_plan(dl_agent_t *a); /* after the count; returns 0 or 2, having said why */
/* Local rank's CPUs (NULL: unbound) and memory node (-1: none) for dl_spawn. */
const dl_cpus_t *dl__place_cpus(const dl_agent_t *a, int local_rank, int *ret_mem_node);
void dl__place_print(const dl_agent_t *a); /* --dry-run's lines */
void dl__place_free(dl_agent_t *a);

/* rdzv.c: the agent's side of the rendezvous (several nodes). */
int dl__rdzv_start(dl_agent_t *a); /* returns 0 or an exit code, having said why */
void dl__rdzv_join(dl_agent_t *a);
void dl__rdzv_report(dl_agent_t *a);
void dl__rdzv_node_done(dl_agent_t *a);
void dl__rdzv_finish(dl_agent_t *a, int exit_code); /* says goodbye and lets go of every handle */
/* The agent got a stop signal: it leaves the job now, before its workers stop, so that a job
 * that cannot go on without this node stops on every node rather than restart or wait. */
void dl__rdzv_quit(dl_agent_t *a, int signum);
void dl__rdzv_free(dl_agent_t *a);
/* Tells the rendezvous that this node steps out as a straggler (rank, reason): the job goes on
 * without it; it joins again once dl__diag_excluded says the cool-down is over. */
void dl__rdzv_exclude(dl_agent_t *a, int rank, const char *reason);

/* inspect.c: what the agent sees inside its workers (docs/diagnostics.md). */
bool dl__diag_beats_wanted(const dl_agent_t *a); /* workers get a beat pipe */
/* The dlaunch Python package's folder for the workers' PYTHONPATH (pythondir.c, looked up once
 * per process): 0, or -errno when there is none to give. */
int dl__python_dir(char *buf, size_t len);

/* Asks a watched Python rank for its stacks (stacks.c) and writes its main thread's innermost
 * frames (up to frames) into buf: 0, or -errno (-ENOENT: not a watched Python rank;
 * -ETIMEDOUT: no dump came, as from a stopped rank). Blocks up to half a second: call it only
 * where the account of a hang or a request is made. */
int dl__stacks_read(dl_agent_t *a, const dl__worker_t *w, int frames, char *buf, size_t len);

int dl__diag_start(dl_agent_t *a);  /* after the loop is set up */
void dl__diag_close(dl_agent_t *a); /* lets go of its handle */
void dl__diag_free(dl_agent_t *a);
void dl__diag_attempt(dl_agent_t *a); /* a new attempt: forget the last one's */
void dl__diag_worker_spawning(dl_agent_t *a, dl__worker_t *w);
void dl__diag_beats(dl__worker_t *w, const char *data, size_t len, double now);
void dl__diag_tick(dl_agent_t *a, double now); /* now: monotonic seconds */
/* Says where this node's ranks are (log line, `ranks` event); keep: as this attempt's account. */
void dl__diag_explain(dl_agent_t *a, const char *why, bool keep);
/* Adds text to this attempt's account (the summary's "where the ranks were"). */
void dl__diag_append(dl_agent_t *a, const char *text);
const char *dl__diag_text(const dl_agent_t *a); /* this attempt's account, or "" */
/* What the agent sees of worker w now: its silence, process state and newest operations. The
 * strings point into static tables and the agent's own state. */
void dl__diag_snapshot(dl_agent_t *a, dl__worker_t *w, double now, dl_diag_rank_t *out);
/* The hang watchdog (watchdog.c), after the beats were drained: names and kills at most one hung
 * worker of this node (diag.h's dl_diag_hang_culprit). */
void dl__watchdog_check(dl_agent_t *a, double now);
json_t *dl__diag_report(dl_agent_t *a);         /* the node's report, new reference or NULL */
json_t *dl__diag_failure_report(dl_agent_t *a); /* the one kept by explain, else a fresh one */
void dl__diag_on_view(dl_agent_t *a, const json_t *view); /* the rendezvous's job-wide view */
bool dl__diag_excluded(dl_agent_t *a, double *ret_wait);  /* stepped out; seconds left */

/* One node alone: serve the job's key-value store on loopback for its workers. */
int dl__rdzv_local_store(dl_agent_t *a); /* after the loop has ended */
/* One node alone: serve the job's key-value store on loopback for its workers, guarded by the
 * job's token when there is one. Returns 0 (a store that cannot start is only logged), or an
 * exit code having said why. */
int dl__rdzv_local_store(dl_agent_t *a);
void dl__rdzv_local_store_reset(dl_agent_t *a); /* a restart: the workers start with no keys */
/* A restart: when the workers' key was made from a master, a new one, issued now, in the same
 * file, so that a job run with the master outlasts the lifetime of the keys it makes. */
void dl__rdzv_renew_worker_key(dl_agent_t *a);

/* recovery.c: in-job recovery (docs/recovery.md). */
bool dl__rec_in_job(const dl_agent_t *a);
void dl__rec_init(dl_agent_t *a);  /* after the loop is set up */
void dl__rec_close(dl_agent_t *a); /* lets go of its handles */
/* A worker's control channel: *ret_child_fd (the worker's end, or -1 without in-job recovery). */
int dl__rec_channel_open(dl_agent_t *a, dl__worker_t *w, int *ret_child_fd);
void dl__rec_channel_close(dl__worker_t *w);
/* Whether the others can go on without this worker while a replacement joins. */
bool dl__rec_recoverable(const dl_agent_t *a, const dl__worker_t *failed);
/* A failure that in-job recovery cannot take because a worker never said hello: says so (the
 * log, a "recovery" event with status "failed"); the supervisor restarts as it would anyway. */
void dl__rec_unspoken(dl_agent_t *a, const dl__worker_t *failed, const dl_sup_failure_t *f);
/* Remote: the heartbeat's "recovery" object (docs/recovery.md), or NULL without in-job. */
json_t *dl__rec_status(const dl_agent_t *a);
/* Remote: whether the living workers can be kept into the next round. */
bool dl__rec_keepable(const dl_agent_t *a);
/* Remote: the round changes with the workers kept (DL_SUP_KEEP): a recovery starts. */
void dl__rec_keep(dl_agent_t *a);
/* Remote: assigned with workers kept (DL_SUP_RESUME): the kept ones learn the new group, the
 * empty slots get workers that join it. */
void dl__rec_resume(dl_agent_t *a, int attempt);
/* The supervisor's DL_SUP_RECOVER: a replacement for rank, the others told. */
int dl__rec_start(dl_agent_t *a, int rank, int attempt);
/* The recovery under way is over without success: the workers stop waiting for it. */
void dl__rec_off(dl_agent_t *a);
/* The job failed: every worker that speaks the protocol drops its group at once (a collective
 * waiting on a lost node would hold it until the stop timeout's SIGKILL otherwise). */
void dl__rec_job_failed(dl_agent_t *a);
/* A worker failed while a recovery was under way (said, then off). */
void dl__rec_interrupted(dl_agent_t *a, const dl_sup_failure_t *f);
/* agent.c: the workers' TORCHELASTIC_RESTART_COUNT in attempt: on one node the attempt (every
 * restart follows a failure), over several nodes the restarts the job spent on failures. */
int dl__agent_restart_count(const dl_agent_t *a, int attempt);
/* agent.c: starts a replacement in w's slot (same rank, same attempt folder). */
int dl__agent_respawn(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count);
/* Starts w's process (a rank's, or a spare's); 0 or -errno, then nothing of it runs. */
int dl__agent_spawn(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count);

/* Hot spares (spares.c). */
int dl__spares_plan(dl_agent_t *a);  /* checks --spares, makes the slots; 0 or exit code */
void dl__spares_fill(dl_agent_t *a); /* starts the missing ones once every rank said hello */
dl__worker_t *dl__spares_ready(dl_agent_t *a); /* a spare that can take a rank, or NULL */
void dl__spares_handed_on(dl__worker_t *s);    /* its process went to a rank's slot */
bool dl__spares_reaped(dl_agent_t *a, pid_t pid, int status); /* pid was a spare's */
void dl__spares_kill(dl_agent_t *a);  /* SIGKILLs them (the attempt stops) */
void dl__spares_close(dl_agent_t *a); /* at the end: killed, their handles let go */
/* inspect.c: in-job recovery's hang rule: which of this node's workers hold the others up (never
 * entered the operation some other rank waits in, or stopped). culprit[i] per worker; returns
 * how many. */
int dl__diag_culprits(dl_agent_t *a, bool *culprit);

/* The furthest step a worker of the attempt said it reached (health beats), or -1 when none
 * beats: what tells a failure repeated from one after progress (docs/exit-codes.md, 5). */
long long dl__agent_attempt_step(const dl_agent_t *a);

/* progress.c: fills a->progress from what this node's workers report, if they do. */
void dl__agent_progress_poll(dl_agent_t *a);

#endif
