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

/* ---- The server's half (codec-server.c, in the server's library: it needs the core's names) -- */

/* Requests, read into typed structs. Each message has passed dl_proto_validate, so a field is of
 * its table's type or absent; strings are borrowed from msg. */

typedef struct {
    const char *role; /* its name, for dl_proto_role_parse */
    const char *run_id;
    long long proto;   /* the protocol version it speaks; 0: none said */
    const char *nonce; /* the client's, asking the server to prove the key back; or NULL */
} dl_rdzv_hello_msg_t;
void dl_rdzv_dec_hello(const json_t *msg, dl_rdzv_hello_msg_t *ret);

/* join into the core's JOIN event (ev->join; kind and ids are the caller's). The job's parameters
 * go over what opts holds where the message has them, and ev->join.opts is opts when it carries
 * them (min_nodes), else NULL. *ret_torch: it asks for the job's store in torch's protocol. */
void dl_rdzv_dec_join(const json_t *msg, dl_rdzv_job_opts_t *opts, dl_rdzv_event_t *ev,
                      bool *ret_torch);

/* heartbeat, the fields dl_rdzv_enc_heartbeat writes (has_progress: it had a step; loss and
 * samples_per_s NaN when absent; diag and recovery borrowed, NULL when absent). */
void dl_rdzv_dec_heartbeat(const json_t *msg, dl_rdzv_beat_msg_t *ret);
/* A heartbeat's "progress" object alone into ret's progress fields (for an owner that hears it
 * elsewhere, rendezvous.h's dl_rdzv_server_progress). */
void dl_rdzv_dec_progress(const json_t *progress, dl_rdzv_beat_msg_t *ret);

/* worker_failed, the fields dl_rdzv_enc_worker_failed writes; what is absent is -1 (local_rank,
 * exit_code, step), 0 (signal), NaN (time) or NULL (reason, log_tail, diag). */
void dl_rdzv_dec_worker_failed(const json_t *msg, dl_rdzv_failure_msg_t *ret);

/* The store's requests (kv_set, _get, _add, _cas, _del, _wait) into the core's event: its kind,
 * store or wait (keys: room for DL_PROTO_WAIT_KEYS_MAX, what ev->wait.keys points to). */
void dl_rdzv_dec_kv_req(const json_t *msg, dl_proto_type_t type, dl_rdzv_event_t *ev,
                        dl_rdzv_buf_t *keys);

/* The control requests dl_rdzv_enc_control writes (status: all, ranks; stop, restart: reason),
 * events_follow (since) and revoke (before), node_done (round) and leave (reason). */
typedef struct {
    bool all, ranks;
    const char *reason; /* or NULL */
    long long since;    /* events_follow: 0 from the start */
    long long before;   /* revoke */
    int round;          /* node_done */
} dl_rdzv_control_msg_t;
void dl_rdzv_dec_control(const json_t *msg, dl_rdzv_control_msg_t *ret);

/* auth: the proof, and the key span it claims (dl_proto_auth_claimed_life). */
typedef struct {
    const char *proof;
    dl_proto_key_life_t claimed;
} dl_rdzv_auth_msg_t;
void dl_rdzv_dec_auth(const json_t *msg, dl_rdzv_auth_msg_t *ret);

/* Replies and notifications; each returns a new message, NULL when out of memory. */

json_t *dl_rdzv_enc_challenge(json_int_t id, const char *nonce);
/* auth_ok: the heartbeat period (seconds) and the server's proof, when hello asked for one. */
json_t *dl_rdzv_enc_auth_ok(json_int_t id, double heartbeat, const char *proof);
/* A heartbeat's reply: its round and the job-wide diagnostics view (stolen; NULL: none). */
json_t *dl_rdzv_enc_beat_reply(json_int_t id, int round, json_t *view);
json_t *dl_rdzv_enc_revoke_reply(json_int_t id, long long before);
/* One journaled event (borrowed) to a follower, its sequence number beside it. */
json_t *dl_rdzv_enc_event(json_int_t seq, const json_t *event);

/* The wire error code of a core's -errno. */
dl_proto_errcode_t dl_rdzv_errcode_of(int code);
/* A failed job's exit code (docs/exit-codes.md): 5 when the same failure ended it, else 1. */
int dl_rdzv_failed_exit_code(const dl_rdzv_msg_t *m);

/* Where the server is, for what it tells agents of it: the store's address when the core was
 * given none, and the job's torch store (docs/store.md): torch_embedded, the embedded server's,
 * at MASTER already; else torch_addr:torch_port, a job's own among many, or torch_addr NULL. */
typedef struct {
    const char *store_host;
    int store_port;
    bool torch_embedded;
    const char *torch_addr;
    int torch_port;
} dl_rdzv_server_where_t;

/* A core message (rdzv-core.h) as the frame for its connection, id the request it answers (-1:
 * none); NULL when nothing is sent (JOINED, an OK nobody asked for) or out of memory. STATUS is
 * the caller's (proto/status-reply.h): NULL here. */
json_t *dl_rdzv_enc_core_msg(json_int_t id, const dl_rdzv_msg_t *m,
                             const dl_rdzv_server_where_t *where);

/* The job's story as `dlaunch events` tells it (docs/events.md): {"event": name, "time", ...}.
 * A core message's event (ASSIGNMENT: "rendezvous", with MASTER as the workers have it;
 * ROUND_CHANGED; FAILED, STOP, SUCCEEDED: "job_end"), NULL for other kinds; and a log line's. */
json_t *dl_rdzv_enc_journal_msg(const dl_rdzv_msg_t *m, double time, const char *master_addr,
                                int master_port);
json_t *dl_rdzv_enc_journal_log(double time, dl_rdzv_log_level_t level, const char *text);

#endif
