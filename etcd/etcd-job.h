/* A dlaunch job kept in etcd (docs/etcd.md): its keys under one prefix, the documents they hold,
 * the view an agent or a control command builds of them, and the transactions that change them.
 * Pure: no I/O; etcd.h carries the bodies built here.
 *
 *   PREFIX job            the job's settings (min/max nodes, timings, max_restarts)
 *   PREFIX state          the job's state: round, gathering|running|succeeded|failed|stopped|
 *                         timed-out, restarts spent, why the round opened, the first failure,
 *                         and once the round closed its assignment (nodes, ranks, addresses)
 *   PREFIX m/NODE_ID      a member: the round it joined and what it offers; on its agent's lease
 *   PREFIX done/NODE_ID   the round whose workers all exited 0 on that node
 *   PREFIX a/ROUND/REV/NODE_ID  that node's assignment in the running round ROUND
 *   PREFIX ev/RRRRRRRR-K  the job's events (round_changed, rendezvous, job_end), and after
 *                         each at ev/RRRRRRRR-K-1 the log line our rendezvous writes then
 *   PREFIX verdict        the straggler rule's verdict over the reports (node 0's)
 *   PREFIX n/NODE_ID      what that node's agent would tell a rendezvous server with its
 *                         heartbeats (its ranks' diagnostics, progress, in-job recoveries; node
 *                         0's store figures), on its agent's lease: `dlaunch status` reads them
 *
 * Every change of the state is a transaction that compares the state's mod revision with the
 * one the view holds, so that two agents can never move the job differently: the second one's
 * comparison fails, and it sees the first one's change through its watch. */
#ifndef DL_ETCD_JOB_H
#define DL_ETCD_JOB_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "job-records.h"
#include "reply.h"
#include "status-reply.h"

#define DL_EJOB_MAX_PREFIX 512

typedef struct {
    char prefix[DL_EJOB_MAX_PREFIX]; /* "/dlaunch/RUN_ID/" */
    dl_ejob_job_rec_t *job;          /* the settings, or NULL */
    dl_ejob_state_rec_t *state;      /* the state, or NULL */
    int64_t state_rev;               /* its mod revision (0: none) */
    dl_ejob_table_t members;         /* node id -> member, with its key's lease and revision */
    dl_ejob_table_t done;            /* node id -> the round it was done */
    json_t *events;                  /* key -> event */
    dl_ejob_table_t assign;  /* "ROUND/REV/NODE_ID" -> that node's assignment (a/ keys read) */
    dl_ejob_table_t reports; /* node id -> its agent's report (n/ keys), with its revision */
    dl_ejob_verdict_rec_t *verdict; /* the straggler rule's verdict, or NULL */
    int64_t rev;                    /* the view holds every change up to this revision */
    /* Why the last load, watch or merge failed: one line naming the key (and the field). */
    char err[768];
} dl_ejob_view_t;

/* What an update changed. */
enum {
    DL_EJOB_CH_JOB = 1 << 0,
    DL_EJOB_CH_STATE = 1 << 1,
    DL_EJOB_CH_MEMBERS = 1 << 2,
    DL_EJOB_CH_DONE = 1 << 3,
    DL_EJOB_CH_EVENTS = 1 << 4,
    DL_EJOB_CH_ASSIGN = 1 << 5,
    DL_EJOB_CH_REPORTS = 1 << 6,
};

/* The prefix: conf_prefix (a trailing '/' added) or "/dlaunch/RUN_ID/". Returns 0, or -EINVAL
 * when it does not fit. */
int dl_ejob_prefix(const char *conf_prefix, const char *run_id, char *buf, size_t len);

void dl_ejob_view_init(dl_ejob_view_t *v, const char *prefix);
void dl_ejob_view_clear(dl_ejob_view_t *v);
/* Replaces the view with a range answer over the whole prefix. Returns DL_EJOB_CH_*, or -EPROTO
 * (not etcd's answer), -EBADMSG (a value of the job's that is not as job-records.h declares it)
 * or -ENOMEM, with one line in v->err naming the key and the field. */
int dl_ejob_view_load(dl_ejob_view_t *v, const dl_etcd_range_t *range);
/* The same with the keys of every range response of a read (dl_ejob_txn_read's answer). */
int dl_ejob_view_load_read(dl_ejob_view_t *v, const dl_etcd_txn_t *answer);
/* Applies a watch message's events. Returns DL_EJOB_CH_* or what dl_ejob_view_load does. */
int dl_ejob_view_watch(dl_ejob_view_t *v, const dl_etcd_watch_t *msg);
/* node_id's member record in the view, or NULL; the round node_id was done in, or -1. */
const dl_ejob_member_rec_t *dl_ejob_member(const dl_ejob_view_t *v, const char *node_id);
int64_t dl_ejob_done_round(const dl_ejob_view_t *v, const char *node_id);
/* What this node's own transactions put, recorded in its view (the view follows no member or
 * done keys): 0 or -ENOMEM. */
int dl_ejob_view_note_member(dl_ejob_view_t *v, const char *node_id, int round, int node_rank);
int dl_ejob_view_note_done(dl_ejob_view_t *v, const char *node_id, int64_t round);

/* The state's fields, with defaults when there is none. */
int dl_ejob_round(const dl_ejob_view_t *v);
const char *dl_ejob_state_name(const dl_ejob_view_t *v); /* "" when there is no state */
bool dl_ejob_over(const dl_ejob_view_t *v);
/* Members that joined round `round`. */
int dl_ejob_count(const dl_ejob_view_t *v, int round);
/* A running round's assignment: the revision that names its keys (a/ROUND/REV/NODE_ID; 0: none)
 * and its node count, from the state. */
int64_t dl_ejob_assignment(const dl_ejob_view_t *v);
int dl_ejob_node_count(const dl_ejob_view_t *v);
/* node_id's assignment in the running round ({node_id, host, addr, store, slots, node_rank,
 * first_rank, master_port, next: the node ranked after it, wrapping}), if the view read it
 * (dl_ejob_range_assignment), else NULL. */
const dl_ejob_assign_rec_t *dl_ejob_assigned(const dl_ejob_view_t *v, const char *node_id);
/* Every assignment of the running round the view read, in rank order (borrowed from the view),
 * their count in *ret_n: an array to free(), or NULL (no memory). */
const dl_ejob_assign_rec_t **dl_ejob_assigned_nodes(const dl_ejob_view_t *v, size_t *ret_n);

/* ---- Documents -------------------------------------------------------------------------------- */

typedef struct {
    int min_nodes, max_nodes, max_restarts;
    int max_same_failures; /* rounds in a row ended by the same failure that fail it; 0 never */
    double last_call, join_timeout, dead_after; /* seconds */
    int master_port;                            /* the job's default MASTER_PORT */
    const char *store_key; /* the store's key for agents without a token of their own, or NULL */
} dl_ejob_settings_t;

/* Whether the job's settings (its job key, read) agree with s: min:max must. Returns 0, or -EINVAL with one
 * line in err. */
int dl_ejob_settings_check(const dl_ejob_job_rec_t *job, const dl_ejob_settings_t *s, char *err,
                           size_t errlen);

/* A member's offer. */
typedef struct {
    const char *node_id;
    const char *host;  /* its host name */
    const char *addr;  /* where other nodes reach it (MASTER_ADDR if it becomes node 0) */
    const char *store; /* HOST:PORT of the store it serves for its workers' job */
    int slots;
    int node_rank; /* the rank asked for, or -1 */
    int master_port;
    int round;
} dl_ejob_member_t;

json_t *dl_ejob_member_doc(const dl_ejob_member_t *m);

/* ---- Transitions: each returns the body of a /v3/kv/txn (new reference), NULL on ENOMEM ------- */

/* The job's first agent: creates the settings and round 0 unless the job exists; either way the
 * answer carries both (a range in the failure branch). */
json_t *dl_ejob_txn_create(const char *prefix, const dl_ejob_settings_t *s, double now);
/* Joins the round the view holds, on lease. */
json_t *dl_ejob_txn_join(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int64_t lease);
/* etcd's default limit of operations in one transaction (--max-txn-ops). */
#define DL_EJOB_MAX_TXN_OPS 128

/* Closes the gathering round with its members (the first max_nodes to join), ranked by the
 * rule of docs/rendezvous.md: an array of transactions to make in order, each only while the
 * state is the view's. Every node's assignment is a key of its own, PREFIX a/ROUND/REV/NODE_ID
 * (REV: the view's revision), put in batches of at most DL_EJOB_MAX_TXN_OPS before the last
 * transaction, which puts the state (the round's summary: assignment REV, node_count, node0,
 * world_size, MASTER_ADDR/PORT, the store) and fails if a member joined since the view; with
 * few nodes it is the only one. NULL when no member is there to close with, or the state allows
 * fewer than one node (another etcd client wrote it). */
json_t *dl_ejob_txn_close(const dl_ejob_view_t *v, double now);

typedef enum {
    DL_EJOB_CAUSE_WORKER_FAILED, /* spends a restart */
    DL_EJOB_CAUSE_NODE_LOST,     /* spends a restart */
    DL_EJOB_CAUSE_NODE_JOINED,
    DL_EJOB_CAUSE_REQUESTED,
    DL_EJOB_CAUSE_EXCLUDED,  /* a straggler stepped out */
    DL_EJOB_CAUSE_NODE_LEFT, /* an agent departed on its operator's signal: no failure */
} dl_ejob_cause_t;

/* Opens round R+1 for reason, or, a failure past max_restarts, ends the job as failed. culprit
 * (may be NULL) names who ended the round as our rendezvous does ({node, host, node_rank, rank,
 * exit_code | signal | hung}; the cause is added); it goes into the state ("culprit") and the
 * round_changed event ("failure"). join (may be NULL) also joins the new round in the same
 * transaction (a newcomer); linger_lease carries the job's keys once it ends (0: none). */
json_t *dl_ejob_txn_next(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const char *reason,
                         const json_t *culprit, const dl_ejob_member_t *join, int64_t join_lease,
                         int64_t linger_lease, double now);
/* The rounds in a row that the same worker failure will have ended once culprit ends this one
 * with cause: the state's culprit (the last round's) again, by the rule of docs/exit-codes.md
 * (same rank, same exit code, signal, hang or OOM kill, and no step further), counts on from the
 * state's same_failures; any other failure starts at 1, and what is no worker failure at 0. */
int dl_ejob_same_failures(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const json_t *culprit);
/* Whether dl_ejob_txn_next with these ends the job (failed): no restart left, or the same
 * failure max_same_failures times in a row (exit 5). Such a transaction wants a linger lease. */
bool dl_ejob_next_fails(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const json_t *culprit);
/* Ends the job: status succeeded, stopped or timed-out (failed comes from txn_next). Every key
 * but the settings, the state and the events goes now; those stay on linger_lease (0: for
 * good), so that status still answers for a while. */
json_t *dl_ejob_txn_end(const dl_ejob_view_t *v, const char *status, const char *reason,
                        int64_t linger_lease, double now);
/* Marks node_id's workers of the running round done. */
json_t *dl_ejob_txn_done(const dl_ejob_view_t *v, const char *node_id);

/* An event's seq (docs/control.md), which every reader computes alike from the key and its
 * create revision: the revision times DL_EJOB_SEQ_SLOTS, plus S for a key ev/RRRRRRRR-K-S (the
 * log line put with the event ev/RRRRRRRR-K, in the same transaction), so that every event has
 * a seq of its own, increasing in the order they happened. */
#define DL_EJOB_SEQ_SLOTS 16
int64_t dl_ejob_event_seq(const char *prefix, const char *key, int64_t create_revision);
/* The log line our rendezvous writes as a node's workers are all done (done: the round's done
 * count that node's dl_ejob_txn_done_counted answered), put on its own (a seq of its own) on
 * the agent's lease: the job's end puts it on the linger lease with the other events. The body
 * of a /v3/kv/put. */
json_t *dl_ejob_put_done_log(const dl_ejob_view_t *v, const char *node_id, const char *host,
                             int64_t done, int64_t lease, double now);

/* ---- Reading ---------------------------------------------------------------------------------- */

/* The job as `dlaunch status --json` shows it (the fields of our own rendezvous' status):
 * run_id, state, round, restarts, max_restarts, min_nodes, max_nodes, world_size, failure,
 * nodes. New reference. */
json_t *dl_ejob_status(const dl_ejob_view_t *v, const char *run_id);
/* The job as `dlaunch status --json` shows it with what the nodes' reports (n/ keys) add, as our
 * own rendezvous' status has it: the store's figures (keys, store_bytes, store_waits,
 * store_clients: node 0's report), in-job recoveries (recovery), the job-wide diagnostics
 * (diag) and, with ranks, where the ranks are and every rank's figures (where, ranks); reports
 * of an older round than the state's are left out. now: this clock's Unix time, against the
 * reports' own. New reference (job-status.c). */
json_t *dl_ejob_status_full(const dl_ejob_view_t *v, const char *run_id, bool ranks, double now);
/* The job's fields of dl_ejob_status, as the status reply's struct (0 or -ENOMEM). */
int dl_ejob_status_base(const dl_ejob_view_t *v, const char *run_id, dl_proto_status_job_t *st);
/* The same as the status reply's struct (proto/status-reply.h), all its own: free it with
 * dl_proto_rec_free(&dl_proto_status_job_type, st). Returns 0, -EBADMSG (the state's status is
 * not one, err says why) or -ENOMEM. */
int dl_ejob_status_rec(const dl_ejob_view_t *v, const char *run_id, bool ranks, double now,
                       dl_proto_status_job_t *st, char *err, size_t errlen);

/* The rank a failure of failed_rank on node_id (hung: its watchdog named it) waited for, by the
 * first-failure rule (rdzv-policy.h) over the same reports as dl_ejob_explain's: 0 with it in
 * *out (node and host borrowed from the view, or node_id), or -ENOENT when the failure is the
 * failed rank's own. */
typedef struct {
    const char *node;
    const char *host;
    int node_rank;
    int rank;
    long long step;
} dl_ejob_waited_t;
int dl_ejob_waited_for(const dl_ejob_view_t *v, const char *run_id, const char *node_id, int round,
                       const json_t *diag, double now, int failed_rank, bool hung,
                       dl_ejob_waited_t *out);

/* Where every rank of the job was when node_id's worker failed in round, in the one line our
 * server adds to the round change's text: node_id's report diag (borrowed, may be NULL) and the
 * other nodes' latest reports of that round in the view (dl_ejob_view_reports). now: this
 * clock's Unix time. Returns its length, 0 when the reports say nothing. */
size_t dl_ejob_explain(const dl_ejob_view_t *v, const char *run_id, const char *node_id, int round,
                       const json_t *diag, double now, char *buf, size_t len);

/* For the status page: the failure that ended the last round, from the state's culprit, as a
 * server keeps it (time, round, rank, exit_code | signal, reason, peer: the host), into *f (its
 * strings its own). Returns 1, 0 when a worker's failure did not end it (*f cleared), or
 * -ENOMEM. */
int dl_ejob_last_failure(const dl_ejob_view_t *v, dl_proto_status_failure_t *f);

/* A node's report (n/NODE_ID): its heartbeat message as rdzv-codec.h encodes it (borrowed) and
 * the time it was made, with node 0's store figures when store is not NULL (borrowed). Reports larger than DL_EJOB_REPORT_MAX are refused
 * (-EMSGSIZE: the caller leaves out the ranks' diagnostics). Returns 0 with *ret, the body of a
 * /v3/kv/put on lease (new reference), or a negative errno. */
#define DL_EJOB_REPORT_MAX (64 * 1024)
int dl_ejob_put_report(const dl_ejob_view_t *v, const char *node_id, const json_t *beat,
                       const dl_ejob_store_rec_t *store, double now, int64_t lease, json_t **ret);
/* A report as the heartbeat message it holds, for the rendezvous' readers of heartbeats
 * (rendezvous.h): new reference, or NULL (no memory). */
json_t *dl_ejob_report_beat(const dl_ejob_report_rec_t *rep);
/* The job-wide straggler rule's verdict (PREFIX verdict): the view our server answers each
 * heartbeat with, made by the running round's node 0 from every node's report
 * (dl_rdzv_judge_t) and read by every node with its report's put.
 *
 * A report's put (dl_ejob_put_report's body, stolen) made a transaction that also reads the
 * verdict. */
json_t *dl_ejob_txn_report(const dl_ejob_view_t *v, json_t *put);
/* The verdict such a transaction's answer read, when it is round's ({stragglers, ...}, new
 * reference), else NULL. */
json_t *dl_ejob_verdict_of(const dl_etcd_txn_t *answer, int round);
/* The body of a /v3/kv/put of round's verdict (view, borrowed) on lease. */
json_t *dl_ejob_put_verdict(const dl_ejob_view_t *v, int round, const json_t *view, int64_t lease);

/* A range body of every node's report. */
json_t *dl_ejob_range_reports(const dl_ejob_view_t *v);
/* Replaces the view's reports with those of a range answer of them. Returns 0, or what
 * dl_ejob_view_merge returns. */
int dl_ejob_view_reports(dl_ejob_view_t *v, const dl_etcd_range_t *range);

/* The exit code of an ended job (docs/exit-codes.md): 0 succeeded or stopped, 1 failed (5 when
 * the same failure ended it), 3 timed out. */
int dl_ejob_exit_code(const dl_ejob_view_t *v);

/* ---- Counting: what lets an agent watch the state alone --------------------------------------- */

/* Two more kinds of keys, on their agent's lease, never watched but counted (count_only ranges)
 * by the transaction that adds one, so that no agent needs every member's key:
 *
 *   PREFIX j/ROUND/NODE_ID   NODE_ID joined round ROUND
 *   PREFIX d/ROUND/NODE_ID   NODE_ID's workers of round ROUND all exited 0
 *
 * The answer's last response carries the count after the change (dl_ejob_txn_count): the
 * member that makes it max_nodes closes the round, the one that makes it min_nodes keeps the last
 * call, the one that makes the done count the round's node count ends the job. */
json_t *dl_ejob_txn_join_counted(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int64_t lease);
/* dl_ejob_txn_next for a newcomer (join), which joins and is counted in the new round. */
json_t *dl_ejob_txn_next_join_counted(const dl_ejob_view_t *v, dl_ejob_cause_t cause,
                                      const char *reason, const dl_ejob_member_t *join,
                                      int64_t lease, double now);
json_t *dl_ejob_txn_done_counted(const dl_ejob_view_t *v, const char *node_id, int64_t lease);
/* The count in a transaction's last range response, or -1. */
int64_t dl_ejob_txn_count(const dl_etcd_txn_t *answer);
/* A /v3/kv/range body counting round's members. */
json_t *dl_ejob_range_joined(const dl_ejob_view_t *v, int round);
/* A read-only transaction of the job's settings and state, with member's key (member a node id)
 * or every member's (member ""), or neither (NULL); dl_ejob_view_load_read loads its answer. */
json_t *dl_ejob_txn_read(const char *prefix, const char *member);
/* While the state is the view's: node_id's member key, its done key, its assignment, and the
 * count of the round's done nodes (four responses); else nothing (succeeded false). */
json_t *dl_ejob_txn_check_member(const dl_ejob_view_t *v, const char *node_id);
/* Watch bodies: the state key from the view's revision on; node_id's member key's deletions. */
json_t *dl_ejob_watch_state(const dl_ejob_view_t *v);
json_t *dl_ejob_watch_gone(const dl_ejob_view_t *v, const char *node_id, int64_t start_rev);
/* A range body of the job's events, and its answer put into the view (for the end, which keeps
 * them on the linger lease). Returns 0 or -EPROTO. */
json_t *dl_ejob_range_events(const dl_ejob_view_t *v);
/* A range body of node_id's assignment in the running round, or of every node's (node_id
 * NULL); serializable: answered by the member asked from what it has applied, without a round
 * trip to the leader (good when the answer's revision is the state's or later: the keys went
 * in before the state). dl_ejob_view_merge puts a range answer's keys into the view (0, or what
 * dl_ejob_view_load returns, v->err saying why). */
json_t *dl_ejob_range_assignment(const dl_ejob_view_t *v, const char *node_id, bool serializable);
int dl_ejob_view_merge(dl_ejob_view_t *v, const dl_etcd_range_t *range);
/* This node's assignment read again when a read found none: a transaction that gives the key
 * while the state is the view's (then its absence is the round's word), else the state that
 * changed meanwhile (a round change took the round's keys away before the watch said so). */
json_t *dl_ejob_txn_assignment_check(const dl_ejob_view_t *v, const char *node_id);
/* The value of the first key of a transaction answer's response i, read into rec (a struct of
 * t's): 1, or 0 when there is no key (rec cleared), or -EBADMSG / -EPROTO / -ENOMEM with one line
 * in err naming the key and the field. */
int dl_ejob_txn_rec(const dl_etcd_txn_t *answer, size_t i, const dl_proto_rec_type_t *t, void *rec,
                    char *err, size_t errlen);
int dl_ejob_view_events(dl_ejob_view_t *v, const dl_etcd_range_t *range);
/* How many nodes' "finished" journal lines (dl_ejob_put_done_log) of round the view's events
 * hold. */
int dl_ejob_done_logs(const dl_ejob_view_t *v, int round);

/* Between job.c and job-count.c: the base64 key prefix + printf(fmt, ...), and the end of the
 * range of keys under prefix + sub. */
json_t *dl__ejob_key(const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
json_t *dl__ejob_range_end(const char *prefix, const char *sub);

#endif
