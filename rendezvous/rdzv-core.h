/* The rendezvous core: a pure state machine that gathers node agents into rounds, assigns ranks,
 * watches their health and keeps a key-value store per job. It reads no clock and touches no
 * socket: the shell feeds it one event at a time with the current time and carries out the
 * actions it returns (send a message on a connection, close a connection, arm the one timer).
 *
 * Connections are opaque to the core: the shell names each one by a nonzero uint64_t of its
 * choosing and tells the core when it goes away. Messages are plain structs; encoding them on the
 * wire is the shell's business. See docs/rendezvous.md for the state machine. */
#ifndef DL_RDZV_CORE_H
#define DL_RDZV_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest run id, agent id, host name or master address, in bytes without the NUL. */
#define DL_RDZV_MAX_NAME 255

/* Largest max_nodes and slots a job may ask for; keeps world sizes within an int. */
#define DL_RDZV_MAX_NODES (1 << 20)
#define DL_RDZV_MAX_SLOTS 4096

/* Connection id 0 belongs to no one: replies to it are dropped. */
#define DL_RDZV_CONN_NONE 0

typedef struct dl_rdzv_core_s dl_rdzv_core_t;

typedef enum {
    DL_RDZV_LOG_DEBUG = 0,
    DL_RDZV_LOG_INFO,
    DL_RDZV_LOG_WARN,
    DL_RDZV_LOG_ERROR,
} dl_rdzv_log_level_t;

/* Per-job settings, fixed when the job is created (by its first JOIN or dl_rdzv_core_add_job). */
typedef struct {
    int min_nodes;       /* the round may close once this many joined, after the last call */
    int max_nodes;       /* the round closes at once when this many joined */
    double last_call;    /* seconds to wait for more nodes once min_nodes joined */
    double join_timeout; /* seconds from the round's start (round 0: first join) to reach min */
    double dead_after;   /* seconds without a heartbeat before a member is declared dead */
    int max_restarts;    /* round changes allowed after round 0 before the job fails */
    /* Rounds in a row that a worker failure ends the same way (the same global rank, the same
     * exit code, signal, hang or OOM kill, and no training step further than the failure
     * before) after which the job fails as a same failure (exit 5, docs/exit-codes.md) rather
     * than spend more restarts; 0: never. */
    int max_same_failures;
    int master_port; /* MASTER_PORT when node rank 0's JOIN names none */
    double linger;   /* seconds a finished job still answers before it is forgotten */
} dl_rdzv_job_opts_t;

typedef struct {
    dl_rdzv_job_opts_t job_defaults; /* for JOINs that carry no settings */
    size_t max_jobs;
    size_t max_key_len;     /* store key, bytes */
    size_t max_value_len;   /* store value, bytes */
    size_t max_keys;        /* keys per job, counting keys that are only waited on */
    size_t max_wait_keys;   /* keys in one WAIT */
    size_t max_store_bytes; /* keys and values of one job together */
    size_t max_waits;       /* WAITs pending in one job */
    /* Every store and every pending WAIT of every job together, in bytes, counting what the core
     * allocates for them (entries, links), not only the keys' and values' bytes. */
    size_t max_memory;
    size_t max_waits_per_conn;   /* WAITs one connection may have pending */
    size_t max_jobs_per_creator; /* live jobs created by JOINs of one creator (see join.creator) */
    /* The longest join_timeout, last_call and dead_after a JOIN may ask for, seconds: an agent
     * cannot make the server keep a job, or a silent member, for longer. */
    double max_timeout;
    /* The key of the store's hash (SipHash-1-3): the shell draws it at random, so that peers
     * cannot compute keys that all land in one bucket. */
    uint64_t hash_key[2];
    const char *store_host; /* echoed in every ASSIGNMENT; copied; NULL: none */
    int store_port;
    dl_rdzv_log_level_t log_level; /* LOG actions below it are not even formatted */
    /* Whether assignments name the round's first nodes as successors: an agent's embedded
     * rendezvous dies with its agent, and the others host it again in that order
     * (docs/rendezvous.md, "Failover"); dlaunchd is restarted where it was instead. */
    bool successors;
    /* The agent id of the agent this rendezvous is embedded in (copied), or NULL: assignments
     * say its node rank, so that when it is lost the others can name it. */
    const char *host_agent_id;
} dl_rdzv_core_opts_t;

/* Successors an assignment names at most. */
#define DL_RDZV_SUCCESSORS_MAX 8

typedef enum {
    DL_RDZV_JOB_GATHERING = 0, /* the current round is open for JOINs */
    DL_RDZV_JOB_RUNNING,       /* the current round closed: ranks are assigned */
    DL_RDZV_JOB_SUCCEEDED,     /* every member of the last round left OK */
    DL_RDZV_JOB_FAILED,        /* restarts exhausted */
    DL_RDZV_JOB_STOPPED,       /* a STOP request */
    DL_RDZV_JOB_TIMED_OUT,     /* fewer than min_nodes joined within join_timeout */
} dl_rdzv_job_state_t;

/* Why a round ended before its time: what restarts are counted by (see docs/operations.md). */
typedef enum {
    DL_RDZV_CAUSE_WORKER_FAILED = 0, /* an agent reported a failed worker */
    DL_RDZV_CAUSE_NODE_LOST,         /* a member sent no heartbeat within dead_after */
    DL_RDZV_CAUSE_NODE_JOINED,       /* an agent joined a running round (new, or again) */
    DL_RDZV_CAUSE_REQUESTED,         /* a RESTART control request */
    /* An agent went away on purpose (its operator's signal: QUIT) and min_nodes are left: a
     * departure, no failure. Last, so that the numbers of the others stay as they were. */
    DL_RDZV_CAUSE_NODE_LEFT,
    DL_RDZV_CAUSE_COUNT
} dl_rdzv_cause_t;

typedef struct {
    const void *data;
    size_t len;
} dl_rdzv_buf_t;

/* Who ended a round: one worker (rank >= 0), or a whole node (rank -1, cause node_lost, or
 * node_left for a departure, which is no failure). A failure seen on a node because another
 * node died first is put on the dead node. The one culprit type: the core's, the wire's
 * (round_changed's, an assignment's and shutdown's `failure`, rdzv-codec.h's one encoder and
 * reader) and the etcd job state's (`culprit`) alike. Strings borrowed. */
typedef struct {
    const char *cause; /* dl_rdzv_cause_name() of its cause, as on the wire; NULL: none */
    const char *node;  /* the culprit's node (its agent id) */
    const char *host;
    int node_rank;    /* in the round that ended; -1: not known */
    int rank;         /* the failed worker's global rank, or -1: the node itself */
    int exit_code;    /* -1: it did not exit (a signal, a hang, a lost node) */
    int signal;       /* 0: none */
    bool hung;        /* killed by the hang watchdog */
    bool oom;         /* killed by the kernel's OOM killer */
    long long step;   /* the furthest step its node's workers reached in the round; -1 */
    const char *text; /* the one-line account, as in the round change's reason */
} dl_rdzv_culprit_t;

/* A culprit that names nothing yet: every number unknown. */
#define DL_RDZV_CULPRIT_NONE                                                                       \
    ((dl_rdzv_culprit_t){.node_rank = -1, .rank = -1, .exit_code = -1, .step = -1})

typedef enum {
    DL_RDZV_EV_TICK = 0,      /* only runs expired timers; every event does that first anyway */
    DL_RDZV_EV_JOIN,          /* run_id, join */
    DL_RDZV_EV_HEARTBEAT,     /* conn: the member that joined on it is alive; never replied */
    DL_RDZV_EV_LEAVE,         /* conn, round: the agent's workers all exited 0 */
    DL_RDZV_EV_QUIT,          /* conn, report.description: the agent goes away before the end
                               * (an operator's signal); never replied */
    DL_RDZV_EV_WORKER_FAILED, /* conn, round, failure */
    DL_RDZV_EV_DISCONNECT,    /* conn is gone; never replied */
    DL_RDZV_EV_RESTART,       /* run_id: control request, start the next round */
    DL_RDZV_EV_STOP,          /* run_id: control request, stop every member */
    DL_RDZV_EV_STATUS,        /* run_id, or NULL for every job */
    DL_RDZV_EV_STORE_SET,     /* run_id, store: key, value */
    DL_RDZV_EV_STORE_GET,     /* run_id, store: key */
    DL_RDZV_EV_STORE_ADD,     /* run_id, store: key, delta */
    DL_RDZV_EV_STORE_CAS,     /* run_id, store: key, expect_absent or expected, value */
    DL_RDZV_EV_STORE_DELETE,  /* run_id, store: key */
    DL_RDZV_EV_STORE_WAIT,    /* run_id, wait: keys, timeout */
    DL_RDZV_EV_STORE_RESET,   /* run_id: empty the store, as a new round does; never replied */
} dl_rdzv_event_kind_t;

/* One event. Strings are NUL-terminated and borrowed for the duration of the step. */
typedef struct {
    dl_rdzv_event_kind_t kind;
    uint64_t conn;   /* where it came from and where replies go */
    uint64_t req_id; /* echoed in the reply */
    const char *run_id;
    union {
        struct {
            const char *agent_id;    /* unique within the job, stable across reconnects */
            const char *host;        /* this node's address as the others can reach it */
            int slots;               /* workers on this node */
            int node_rank;           /* explicit node rank wanted, or -1 */
            int slurm_node_id;       /* SLURM_NODEID, or -1 */
            const char *master_addr; /* where this node would serve MASTER_ADDR; NULL: host */
            int master_port;         /* its MASTER_PORT; 0: the job's master_port */
            int resume_round;        /* the round this agent still runs workers of, or -1 */
            /* The job's restarts spent on failures as this agent last heard, or -1: with
             * resume_round, what a restarted rendezvous adopts (the highest) to go on counting. */
            int failures;
            const dl_rdzv_job_opts_t *opts; /* creates the job, else its min:max must match */
            /* Who creates the job if this JOIN does (the shell's name for the peer, e.g. a hash
             * of its address), counted against max_jobs_per_creator; 0: nobody in particular. */
            uint64_t creator;
        } join;
        struct {
            int round;               /* the round the agent's workers belong to */
            const char *description; /* WORKER_FAILED: what failed, kept for the summary;
                                      * QUIT: why the agent goes */
            int rank;                /* WORKER_FAILED: the worker's global rank */
            int exit_code;           /* WORKER_FAILED: -1 when it did not exit */
            int signal;              /* WORKER_FAILED: 0 when none */
            bool hung;               /* WORKER_FAILED: killed by the hang watchdog */
            bool oom;                /* WORKER_FAILED: killed by the OOM killer */
            /* WORKER_FAILED: the furthest training step the node's workers reported in the
             * round, or -1 when they report none (then the failure alone is compared). */
            long long step;
            /* WORKER_FAILED: every rank of the job as the nodes' latest reports have them (the
             * failing node's with this failure), for the first-failure rule (rdzv-policy.h);
             * none: the failure is put on its own rank. */
            const struct dl_rdzv_policy_rank_s *ranks;
            size_t nranks;
        } report;
        struct {
            int round; /* the namespace: the job's current round, or -1 for whatever is current */
            dl_rdzv_buf_t key;
            dl_rdzv_buf_t value;    /* SET, CAS: the new value */
            dl_rdzv_buf_t expected; /* CAS */
            bool expect_absent;     /* CAS: swap only if the key does not exist */
            int64_t delta;          /* ADD */
        } store;
        struct {
            int round;
            const dl_rdzv_buf_t *keys;
            size_t nkeys;
            double timeout; /* seconds; < 0: until the round ends or the connection goes */
        } wait;
    };
} dl_rdzv_event_t;

typedef enum {
    DL_RDZV_MSG_OK = 0,        /* reply: done (LEAVE, WORKER_FAILED, RESTART, STOP, SET) */
    DL_RDZV_MSG_ERROR,         /* reply: error.code is -errno, error.message one line */
    DL_RDZV_MSG_JOINED,        /* reply to JOIN: waiting for round joined.round to close */
    DL_RDZV_MSG_ASSIGNMENT,    /* the round closed: here is your place in it */
    DL_RDZV_MSG_TIMEOUT,       /* the round did not reach min_nodes in time; agents exit 3 */
    DL_RDZV_MSG_ROUND_CHANGED, /* round_changed.round opened: stop workers and JOIN again */
    DL_RDZV_MSG_FAILED,        /* the job failed: restarts exhausted */
    DL_RDZV_MSG_STOP,          /* the job was stopped: stop workers and exit */
    DL_RDZV_MSG_SUCCEEDED,     /* every member left OK: the job is done */
    DL_RDZV_MSG_VALUE,         /* reply to GET */
    DL_RDZV_MSG_COUNTER,       /* reply to ADD */
    DL_RDZV_MSG_CAS,           /* reply to CAS */
    DL_RDZV_MSG_DELETED,       /* reply to DELETE */
    DL_RDZV_MSG_WAIT_DONE,     /* reply to WAIT: every key exists */
    DL_RDZV_MSG_STATUS,        /* reply to STATUS */
} dl_rdzv_msg_kind_t;

typedef struct {
    const char *agent_id;
    const char *host;
    int slots;
    int node_rank;        /* -1 while the round gathers */
    double heartbeat_age; /* seconds since its last heartbeat (or its JOIN) */
    bool connected;
    bool left;
} dl_rdzv_member_status_t;

typedef struct {
    const char *run_id;
    dl_rdzv_job_state_t state;
    int round;
    int restarts;
    int max_restarts;
    int min_nodes;
    int max_nodes;
    int world_size;      /* of the running round, 0 while gathering */
    const char *failure; /* the first failure, or NULL */
    const dl_rdzv_member_status_t *members;
    size_t nmembers;
    size_t nkeys;       /* in the store of the current round */
    size_t store_bytes; /* its keys and values together */
    size_t store_waits; /* WAITs pending on it */
} dl_rdzv_job_status_t;

typedef struct {
    const dl_rdzv_job_status_t *jobs;
    size_t njobs;
} dl_rdzv_status_t;

/* A message for the shell to encode. Pointers are owned by the core and stay valid until the next
 * call into the core. */
typedef struct {
    dl_rdzv_msg_kind_t kind;
    uint64_t req_id; /* the request answered; 0 for messages nobody asked for */
    const char *run_id;
    union {
        struct {
            int code; /* -errno */
            const char *message;
        } error;
        struct {
            int round;
        } joined;
        struct {
            int round;
            int node_rank;
            int nnodes;
            int world_size;
            int first_rank; /* global rank of this node's local rank 0 */
            int local_world_size;
            int restarts; /* rounds before this one: TORCHELASTIC_RESTART_COUNT */
            int failures; /* of them, those that spent the restart budget */
            int max_restarts;
            const char *master_addr;
            int master_port;
            const char *store_host; /* NULL when the core was given none */
            int store_port;
            /* The addresses of node ranks 0, 1, ... (at most DL_RDZV_SUCCESSORS_MAX), where the
             * rendezvous is hosted again if its host dies; none unless opts.successors. */
            const char *const *successors;
            size_t nsuccessors;
            int host_node_rank; /* the node rank of the agent hosting us, or -1 */
            /* Who ended the round before this one (a failure), or NULL. */
            const dl_rdzv_culprit_t *culprit;
        } assignment;
        struct {
            int round;
        } timeout;
        struct {
            int round;
            const char *reason;
            dl_rdzv_cause_t cause;
            /* Who ended the round: a failure's culprit, or the node that departed (cause
             * NODE_LEFT); NULL otherwise. */
            const dl_rdzv_culprit_t *culprit;
        } round_changed;
        struct {
            int round;
            int restarts;
            const char *failure;
            dl_rdzv_cause_t cause;            /* of the round change that was one too many */
            const dl_rdzv_culprit_t *culprit; /* the job's first failure */
            /* > 0: the job failed because the same failure ended this many rounds in a row
             * (max_same_failures; agents exit 5 and failure says so); 0: restarts ran out. */
            int same_failures;
        } failed;
        struct {
            int round;
        } stop;
        struct {
            int round;
        } succeeded;
        struct {
            bool found;
            dl_rdzv_buf_t value;
        } value;
        struct {
            int64_t value;
        } counter;
        struct {
            bool swapped;
            bool found;          /* the key exists after the operation */
            dl_rdzv_buf_t value; /* its value after the operation */
        } cas;
        struct {
            bool deleted;
        } deleted;
        const dl_rdzv_status_t *status;
    };
} dl_rdzv_msg_t;

typedef enum {
    DL_RDZV_ACT_SEND = 0,     /* conn, msg */
    DL_RDZV_ACT_CLOSE,        /* conn: close it once what was queued before is written */
    DL_RDZV_ACT_ARM_TIMER,    /* at: the earliest deadline changed; call step(TICK) then */
    DL_RDZV_ACT_DISARM_TIMER, /* no deadline is pending any more */
    DL_RDZV_ACT_LOG,          /* log */
    DL_RDZV_ACT_FORGET,       /* run_id: the job is forgotten; what the shell keeps of it can go */
} dl_rdzv_action_kind_t;

typedef struct {
    dl_rdzv_action_kind_t kind;
    uint64_t conn;
    double at;
    union {
        dl_rdzv_msg_t msg;
        const char *run_id; /* FORGET */
        struct {
            dl_rdzv_log_level_t level;
            const char *run_id; /* NULL when no job is concerned */
            const char *text;
        } log;
    };
} dl_rdzv_action_t;

/* What one step asks the shell to do, in order. Owned by the core, valid until the next call. */
typedef struct {
    const dl_rdzv_action_t *v;
    size_t n;
} dl_rdzv_actions_t;

/* Defaults: nodes 1:1, last call 30 s, join timeout 600 s, dead after 30 s, 3 restarts, no
 * same-failure limit (agents send theirs), master port 29500, linger 60 s. */
void dl_rdzv_job_opts_init(dl_rdzv_job_opts_t *opts);

/* Defaults: the job defaults above, 4096 jobs, keys up to 4 KiB, values up to 1 MiB, 1,048,576
 * keys a job, 4096 keys a WAIT, 256 MiB a job's store, 1,048,576 pending WAITs a job, 1 GiB for
 * all stores and waits, 256 WAITs a connection, 512 jobs a creator, timeouts up to 3600 s, hash
 * key 0 (the server draws a random one), no store address, log level INFO (DEBUG adds a line per
 * JOIN). */
void dl_rdzv_core_opts_init(dl_rdzv_core_opts_t *opts);

/* Checks a job's settings; on failure returns -EINVAL and, when err is not NULL, writes one line
 * naming the field into err. */
int dl_rdzv_job_opts_check(const dl_rdzv_job_opts_t *opts, char *err, size_t errlen);

/* Creates a core. Returns 0, -EINVAL (bad opts) or -ENOMEM; *ret_core is set only on success. */
int dl_rdzv_core_new(const dl_rdzv_core_opts_t *opts, dl_rdzv_core_t **ret_core);

/* Counts *bytes (the server's replies queued to clients that have not read them yet, which it
 * keeps up to date) against max_memory with the stores: one budget for both. NULL: none. */
void dl_rdzv_core_count_replies(dl_rdzv_core_t *core, const size_t *bytes);

/* What max_memory leaves now, the stores and the replies counted. */
size_t dl_rdzv_core_memory_room(const dl_rdzv_core_t *core);

/* Frees the core and every job in it. Accepts NULL. */
void dl_rdzv_core_free(dl_rdzv_core_t *core);

/* Creates a job ahead of its first JOIN (the embedded server knows its job spec) and fills
 * *acts (may be NULL: dropped) with what that does, as dl_rdzv_core_step does: its "job created"
 * log line, its join timer. Returns 0, -EEXIST, -EINVAL (bad run id or opts), -ENOSPC
 * (max_jobs) or -ENOMEM. */
int dl_rdzv_core_add_job(dl_rdzv_core_t *core, const char *run_id, const dl_rdzv_job_opts_t *opts,
                         dl_rdzv_actions_t *acts);

/* Feeds one event that happened at time now (seconds >= 0 on a monotonic clock; a time
 * earlier than the last one counts as the last one) and fills *acts with what to do. Timers due by
 * now run first. Requests that cannot be served are answered with an ERROR message, not a failure
 * of the step. Returns 0, -EINVAL (unknown event kind) or -ENOMEM; on -ENOMEM the state stays
 * consistent, *acts still holds the actions produced so far (carry them out) and a timer that
 * could not be handled is retried at the next step. */
int dl_rdzv_core_step(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now,
                      dl_rdzv_actions_t *acts);

/* The keys with a value in the job's store (torch's getNumKeys). Returns 0 or -ENOENT. */
int dl_rdzv_core_store_count(dl_rdzv_core_t *core, const char *run_id, size_t *ret_keys);

/* The earliest pending deadline. Returns 0, or -ENOENT when none is pending. */
int dl_rdzv_core_next_deadline(const dl_rdzv_core_t *core, double *ret_at);

/* The loop that steps this core was held up (stopped, or starved of the CPU) well past its next
 * deadline, and heard nobody meanwhile: every member gets a fair period from now, as if heard
 * at now, as the agents' failover machine gives their rendezvous (rdzv-failover.h). Silence the
 * core could not hear is nobody's fault, least of all that of the agent an embedded rendezvous
 * stops with. Call it before the late step; a member really gone is lost --dead-after later. */
void dl_rdzv_core_held_up(dl_rdzv_core_t *core, double now);

/* Names for logs and the wire: "gathering", "running", ...; "ok", "error", "joined", ... */
const char *dl_rdzv_job_state_name(dl_rdzv_job_state_t state);
const char *dl_rdzv_msg_kind_name(dl_rdzv_msg_kind_t kind);
/* "worker_failed", "node_lost", "node_joined", "requested", "node_left": stable, they label
 * metrics. */
const char *dl_rdzv_cause_name(dl_rdzv_cause_t cause);

#endif
