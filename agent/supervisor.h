/* The worker supervisor: a pure state machine that decides when to start, stop, restart and give
 * up. It reads no clock and touches no process; agent.c feeds it events and carries out the
 * actions it returns. */
#ifndef DL_SUPERVISOR_H
#define DL_SUPERVISOR_H

#include <stdbool.h>

typedef enum {
    DL_SUP_IDLE = 0,
    DL_SUP_RUNNING,  /* workers of the current attempt are up */
    DL_SUP_STOPPING, /* waiting for every worker of the attempt to exit */
    DL_SUP_WAITING,  /* remote: no workers; waiting for the rendezvous to say what next */
    DL_SUP_DONE,
} dl_sup_phase_t;

/* Why the current attempt is being stopped. */
typedef enum {
    DL_SUP_STOP_NONE = 0,
    DL_SUP_STOP_RESTART, /* a worker failed and restarts are left */
    DL_SUP_STOP_FAIL,    /* a worker failed and none are left */
    DL_SUP_STOP_SIGNAL,  /* the agent got a signal */
    DL_SUP_STOP_REPORT,  /* remote: a worker failed; the rendezvous decides what next */
    DL_SUP_STOP_REJOIN,  /* remote: a new round opened; join it once the workers are gone */
    DL_SUP_STOP_END,     /* remote: the job is over (end_code) */
    DL_SUP_STOP_SAME,    /* a worker failed as on the attempts before: no restart helps */
} dl_sup_stop_t;

typedef struct {
    int rank;
    int attempt;
    int exit_code;   /* >= 0 when it exited */
    int signal;      /* > 0 when killed by a signal */
    int spawn_errno; /* > 0 when it could not be started */
    bool hung;       /* killed by the agent for going silent */
    bool oom;        /* killed by the kernel's OOM killer */
    bool unreapable; /* still there after SIGKILL: given up on, the node is unhealthy */
    long long mem_peak, mem_limit; /* oom: its peak and the limit hit, bytes (0 unknown) */
    double time;
} dl_sup_failure_t;

typedef enum {
    DL_SUP_EV_START,
    DL_SUP_EV_WORKER_EXIT,  /* rank, exit_code or signal */
    DL_SUP_EV_SPAWN_FAILED, /* rank, spawn_errno */
    DL_SUP_EV_SIGNAL,       /* signal */
    DL_SUP_EV_STOP_TIMEOUT,
    /* remote mode only: what the rendezvous said */
    DL_SUP_EV_ASSIGNED,      /* attempt: the round's restart count; start the workers */
    DL_SUP_EV_ROUND_CHANGED, /* stop the workers and join the next round */
    DL_SUP_EV_JOB_END,       /* exit_code: the job is over for every node */
    /* in-job recovery (docs/recovery.md) */
    DL_SUP_EV_RECOVERED,       /* every worker trains again after a recovery */
    DL_SUP_EV_RECOVERY_FAILED, /* a recovery cannot finish: fall back to a restart */
    /* rank's process outlived its SIGKILL (uninterruptible sleep): it counts as gone, and the
     * node as unhealthy: the job ends here (exit DL_SUP_EXIT_UNHEALTHY), never restarts on it */
    DL_SUP_EV_UNREAPABLE,
} dl_sup_event_kind_t;

/* Exit codes of the supervisor's own (docs/exit-codes.md). */
#define DL_SUP_EXIT_SAME_FAILURE 5 /* every attempt failed the same way: do not requeue */
#define DL_SUP_EXIT_UNHEALTHY 6    /* a worker could not be reaped: this node is unhealthy */

typedef struct {
    dl_sup_event_kind_t kind;
    int rank;
    int exit_code;
    int signal;
    int spawn_errno;
    int attempt;
    bool hung; /* WORKER_EXIT: the agent killed it for missing its health beats */
    bool oom;  /* WORKER_EXIT: the kernel's OOM killer killed it */
    long long mem_peak, mem_limit;
    /* WORKER_EXIT, SPAWN_FAILED: the furthest step a worker of the attempt reported in its
     * beats, or -1 when none beats: a failure after no progress may be the same one again. */
    long long step;
    /* WORKER_EXIT, SPAWN_FAILED: the others can go on without it while a replacement joins
     * (in-job recovery: every worker speaks the protocol; the shell decides). ROUND_CHANGED
     * (remote): the living workers can be kept into the next round. */
    bool recoverable;
} dl_sup_event_t;

/* Action flags, carried out by the shell in this order: disarm, kill, spawn, arm, exit. */
enum {
    DL_SUP_DISARM_TIMER = 1 << 0,
    DL_SUP_KILL = 1 << 1,      /* send kill_signal to every live worker's process group */
    DL_SUP_SPAWN = 1 << 2,     /* start every worker for attempt */
    DL_SUP_ARM_TIMER = 1 << 3, /* the stop timeout */
    DL_SUP_EXIT = 1 << 4,      /* the job is over: exit with exit_code */
    /* remote mode only */
    DL_SUP_REPORT = 1 << 5,    /* tell the rendezvous about first_failure */
    DL_SUP_NODE_DONE = 1 << 6, /* tell the rendezvous every local worker exited 0 */
    DL_SUP_JOIN = 1 << 7,      /* join the rendezvous's current round */
    /* in-job recovery */
    DL_SUP_RECOVER = 1 << 8,      /* start a replacement for rank and tell the others */
    DL_SUP_RECOVERY_OFF = 1 << 9, /* the recovery under way failed: the workers stop waiting */
    /* remote in-job recovery */
    DL_SUP_KEEP = 1 << 10,   /* the round changes, the living workers stay (a recovery starts) */
    DL_SUP_RESUME = 1 << 11, /* assigned with workers kept: tell them the new group, refill */
};

typedef struct {
    unsigned flags;
    int kill_signal;
    int attempt;
    int exit_code;
    int rank; /* DL_SUP_RECOVER: the rank to replace */
} dl_sup_actions_t;

typedef struct dl_sup_s {
    bool remote; /* restarts are decided by the rendezvous, not here */
    int nworkers;
    int max_restarts;
    int end_code; /* DL_SUP_STOP_END: the exit code once the workers are gone */
    int attempt;
    dl_sup_phase_t phase;
    dl_sup_stop_t stop;
    int running;   /* workers of this attempt not yet reported gone */
    int succeeded; /* workers of this attempt that exited 0 */
    int signal;    /* the signal that stopped the job */
    bool has_failure;
    dl_sup_failure_t first_failure; /* first failure of the last failed attempt */
    /* In-job recovery (local mode): a failed worker is replaced while the others run on. Each
     * recovery spends a restart, as a restart does. */
    bool in_job;
    int recoveries;  /* so far, in the job */
    bool recovering; /* one is under way */
    /* Remote: the round changed and the living workers were kept; joined again, waiting for
     * the assignment (each such recovery is a round change the rendezvous counts). */
    bool awaiting;
    int starts; /* attempts started: every worker started afresh (recoveries are none) */
    /* The same failure on attempt after attempt (same rank, same cause, no step further): after
     * max_same of them in a row the job ends (DL_SUP_EXIT_SAME_FAILURE); 0: never. */
    int max_same;
    int same;            /* attempts in a row that failed as the last one did */
    long long same_step; /* the furthest step of the last failed attempt */
    bool unhealthy;      /* a worker could not be reaped */
} dl_sup_t;

/* Local mode: this node alone decides restarts, up to max_restarts. */
void dl_sup_init(dl_sup_t *sup, int nworkers, int max_restarts);

/* In-job recovery on (after init): a recoverable failure replaces one worker while the others
 * run on, until a failure comes during a recovery or no restart is left. */
void dl_sup_set_in_job(dl_sup_t *sup, bool on);

/* Ends the job after n attempts in a row that failed the same way (local mode; 0 never). */
void dl_sup_set_max_same(dl_sup_t *sup, int n);

/* Restarts spent: attempts after the first, and in-job recoveries. */
int dl_sup_restarts_used(const dl_sup_t *sup);

/* The attempts to say in the closing line and job_end: with in-job recovery the times every
 * worker started afresh (over several nodes each recovery is a round, no attempt), else the
 * attempt number + 1 as ever. */
int dl_sup_attempts(const dl_sup_t *sup);

/* Remote mode: a rendezvous decides rounds; the supervisor reports failures and success, stops
 * workers when a round changes, and joins again. */
void dl_sup_init_remote(dl_sup_t *sup, int nworkers);

/* Feeds one event that happened at time now (seconds, any epoch) and returns what to do. */
dl_sup_actions_t dl_sup_step(dl_sup_t *sup, const dl_sup_event_t *ev, double now);

#endif
