/* The rendezvous protocol's messages as typed calls: the one place outside proto/ where they are
 * built and read (docs/protocol.md). Agents (agent/rdzv-tcp.c), control commands (cmd/ctl.c),
 * dlaunch kv and workers (collective/bootstrap-store.c) go through here; proto/ validates what
 * comes back. Needs jansson and proto only. */
#ifndef DL_RDZV_CODEC_H
#define DL_RDZV_CODEC_H

#include <jansson.h>
#include <stdbool.h>

#include "proto.h"
#include "rdzv-core.h"

/* ---- Agents ----------------------------------------------------------------------------------- */

typedef struct {
    const char *node_id;
    const char *host;        /* the host name */
    const char *master_addr; /* where other nodes reach this one */
    int master_port;
    int slots;
    int node_rank; /* wanted, or -1 */
    int min_nodes, max_nodes, max_restarts;
    int max_same_failures;                      /* 0: never */
    double last_call, join_timeout, dead_after; /* seconds */
    /* Once it took part in a round: that round, and the restarts spent as it was told (a
     * restarted rendezvous, or a successor, goes on counting from the highest it hears). */
    bool assigned;
    int round;
    int failures;
    /* Asks a rendezvous serving many jobs (dlaunchd) to serve the job's store in torch's
     * protocol at MASTER (docs/store.md); an agent's embedded one serves it unasked. */
    bool torch_store;
} dl_rdzv_join_msg_t;

typedef struct {
    int round;
    bool has_progress;
    long long step;
    double loss;          /* NaN: not sent */
    double samples_per_s; /* NaN: not sent */
    json_t *diag;         /* the node's report, borrowed, or NULL */
    json_t *recovery;     /* the node's in-job recoveries, borrowed, or NULL */
} dl_rdzv_beat_msg_t;

typedef struct {
    int round;
    int rank;
    int local_rank;
    int exit_code; /* when signal is 0 (< 0: 127) */
    int signal;
    bool hung;      /* killed by the hang watchdog */
    bool oom;       /* killed by the kernel's OOM killer */
    bool excluded;  /* a straggler steps out: exit_code 0, no local rank */
    long long step; /* the furthest step the node's workers reported in the round; < 0: none */
    const char *reason;
    double time;
    const char *log_tail; /* or NULL */
    json_t *diag;         /* borrowed, or NULL */
} dl_rdzv_failure_msg_t;

/* Each returns a new message with request id `id` (NULL: out of memory). */
json_t *dl_rdzv_enc_join(json_int_t id, const dl_rdzv_join_msg_t *j);
json_t *dl_rdzv_enc_heartbeat(json_int_t id, const dl_rdzv_beat_msg_t *b);
json_t *dl_rdzv_enc_worker_failed(json_int_t id, const dl_rdzv_failure_msg_t *f);
json_t *dl_rdzv_enc_node_done(json_int_t id, int round);
json_t *dl_rdzv_enc_leave(json_int_t id, const char *reason);
json_t *dl_rdzv_enc_events_follow(json_int_t id);

/* Who ended a round, on the wire and in the etcd job state: the one culprit type of
 * rdzv-core.h, read field by field, as the object is not trusted to hold what it should. The
 * name the etcd backend still spells it with. */
typedef dl_rdzv_culprit_t dl_rdzv_culprit_msg_t;

/* The culprit object: the one encoder, for the server's messages and the etcd job state. Fields
 * unknown are left out; one of hung, signal (a number) or exit_code. NULL: out of memory. */
json_t *dl_rdzv_enc_culprit(const dl_rdzv_culprit_t *culprit);

/* Its one reader; cause NULL when obj is NULL or names none. Strings borrowed from obj. */
void dl_rdzv_dec_culprit(const json_t *obj, dl_rdzv_culprit_t *ret_culprit);

/* round_changed: the new round, why, and who (borrowed from msg). */
void dl_rdzv_dec_round_changed(const json_t *msg, int *ret_round, const char **ret_reason,
                               dl_rdzv_culprit_t *ret_culprit);

typedef struct {
    const char *reason; /* succeeded, stopped, failed... (borrowed) */
    int exit_code;
    const char *failure; /* the job's first failure, or NULL (borrowed) */
} dl_rdzv_shutdown_msg_t;
void dl_rdzv_dec_shutdown(const json_t *msg, dl_rdzv_shutdown_msg_t *ret);

/* An event notification: its name and, for job_end, its status (borrowed; NULL when absent). */
void dl_rdzv_dec_event(const json_t *msg, const char **ret_name, const char **ret_status);

/* A heartbeat's reply: the job-wide diagnostics view, or NULL (borrowed). */
const json_t *dl_rdzv_dec_beat_view(const json_t *reply);

/* ---- Control ---------------------------------------------------------------------------------- */

/* status (all: every job; ranks: every rank's figures), stop or restart (reason). */
json_t *dl_rdzv_enc_control(dl_proto_type_t type, bool all, bool ranks, const char *reason);

/* ---- The key-value store ---------------------------------------------------------------------- */

typedef struct {
    dl_proto_type_t op;      /* DL_PROTO_KV_SET, _GET, _ADD, _WAIT, _CAS, _DEL */
    const char *key;         /* all but WAIT */
    const char *value;       /* SET, CAS */
    long long delta;         /* ADD */
    const char *expected;    /* CAS: NULL for "absent" */
    const char *const *keys; /* WAIT */
    size_t nkeys;
    long long timeout_ms; /* WAIT */
} dl_rdzv_kv_req_t;

typedef struct {
    bool has_value;    /* GET, ADD, CAS: a value came back */
    const char *value; /* its text when a string (borrowed from the reply), else NULL */
    long long number;  /* ADD: the counter */
    bool swapped;      /* CAS */
    bool deleted;      /* DEL */
} dl_rdzv_kv_result_t;

json_t *dl_rdzv_enc_kv(json_int_t id, const dl_rdzv_kv_req_t *req);
/* Reads a store reply's result (a reply that is not an error). */
void dl_rdzv_dec_kv(const json_t *reply, dl_rdzv_kv_result_t *ret);

#endif
