/* The values a dlaunch job keeps under its etcd prefix (etcd-job.h, docs/etcd.md "Keys"),
 * declared once: each a struct and a field table (job-records.c) read and written by the one
 * codec of proto/record.h. The view decodes a key's value once, as it comes from etcd, and the
 * transactions encode once what they put; the logic reads C fields. A value that is not as its
 * table says is refused with one line naming the key and the field.
 *
 * The culprit is kept whole (a json_t): its one codec is rdzv-codec.h's, shared with our own
 * rendezvous' messages; a verdict's view is the heartbeat reply's (rdzv-codec.h). The events
 * (the journal's, docs/control.md) and the nodes' reports (heartbeats, rdzv-codec.h) stay the
 * documents they are. Strings are the record's own; has_X says an optional number was there. */
#ifndef DL_ETCD_JOB_RECORDS_H
#define DL_ETCD_JOB_RECORDS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "record.h"

/* PREFIX job: the settings, made by the job's first agent. */
typedef struct {
    long long min_nodes, max_nodes, max_restarts, max_same_failures;
    long long last_call_ms, join_timeout_ms, dead_after_ms;
    long long master_port;
    bool has_master_port;
    char *store_key; /* the store's key for agents without a token of their own, or NULL */
} dl_ejob_job_rec_t;

/* PREFIX state: the round and what became of it; once it closed, its summary. */
typedef struct {
    long long round;
    char *state; /* gathering, running, succeeded, failed, stopped, timed-out */
    long long restarts, max_restarts, max_same_failures;
    long long min_nodes, max_nodes;
    bool has_min_nodes, has_max_nodes;
    char *reason;
    char *cause;     /* what opened the round or ended the job, or NULL */
    char *failure;   /* the job's first failure, or NULL */
    json_t *culprit; /* who ended the last round (rdzv-codec.h's culprit), or NULL */
    long long same_failures, exit_code;
    bool has_same_failures, has_exit_code;
    double time;
    bool has_time;
    /* The round's summary once it closed. */
    long long assignment, node_count, world_size, master_port;
    bool has_assignment, has_node_count, has_world_size, has_master_port;
    char *node0, *master_addr, *store_addr;
} dl_ejob_state_rec_t;

/* PREFIX m/NODE_ID: a member, the round it joined and what it offers. */
typedef struct {
    long long round;
    char *node_id, *host, *addr, *store;
    long long slots, node_rank;
    bool has_slots, has_node_rank;
    long long master_port;
} dl_ejob_member_rec_t;

/* PREFIX done/NODE_ID: the round whose workers all exited 0 there. */
typedef struct {
    long long round;
} dl_ejob_done_rec_t;

/* PREFIX a/ROUND/REV/NODE_ID: that node's assignment in the round. */
typedef struct {
    char *node_id, *host, *addr, *store;
    long long slots, node_rank, first_rank, master_port;
    char *next; /* the node ranked after it, wrapping; NULL alone */
} dl_ejob_assign_rec_t;

/* PREFIX verdict: the straggler rule's verdict over the running round. */
typedef struct {
    long long round;
    json_t *view; /* the heartbeat reply's view (rdzv-codec.h) */
} dl_ejob_verdict_rec_t;

/* PREFIX n/NODE_ID: a node's report, the heartbeat its agent would send our rendezvous
 * (rdzv-codec.h's: v, type, round, progress, diag, recovery), the time it was made, and node 0's
 * store figures. */
typedef struct {
    long long keys, store_bytes, store_waits, store_clients;
    bool has_keys, has_store_bytes, has_store_waits, has_store_clients;
} dl_ejob_store_rec_t;

typedef struct {
    long long step;
    double loss, samples_per_s;
    bool has_loss, has_samples_per_s;
} dl_ejob_progress_rec_t;

typedef struct {
    long long v;
    bool has_v;
    char *type;
    long long round;
    dl_ejob_progress_rec_t *progress; /* NULL: none yet */
    json_t *diag;                     /* its ranks' diagnostics report (diag.h's), or NULL */
    json_t *recovery;                 /* its in-job recoveries, or NULL */
    double time;                      /* when it was made, by its writer's clock */
    dl_ejob_store_rec_t *store;       /* node 0's, or NULL */
} dl_ejob_report_rec_t;

extern const dl_proto_rec_type_t dl_ejob_job_type;
extern const dl_proto_rec_type_t dl_ejob_report_type;
extern const dl_proto_rec_type_t dl_ejob_progress_type;
extern const dl_proto_rec_type_t dl_ejob_state_type;
extern const dl_proto_rec_type_t dl_ejob_member_type;
extern const dl_proto_rec_type_t dl_ejob_done_type;
extern const dl_proto_rec_type_t dl_ejob_assign_type;
extern const dl_proto_rec_type_t dl_ejob_verdict_type;

/* A value as etcd stores it (compact, keys sorted, so that a value reads the same however its
 * struct's table orders the fields): a new string, or NULL (no memory). */
char *dl_ejob_rec_text(const dl_proto_rec_type_t *t, const void *rec);

/* Reads the value of key (text, len bytes) into rec (a struct of t's). Returns 0, or -EBADMSG
 * with one line in err naming the key and the field ("etcd key /dlaunch/J/state: field 'round'
 * must be an integer, got a string"), or -ENOMEM. */
int dl_ejob_rec_read(const dl_proto_rec_type_t *t, const char *key, const char *text, size_t len,
                     void *rec, char *err, size_t errlen);

/* Records by key (a node id, or ROUND/REV/NODE_ID), in the order first put, each with its
 * key's lease and mod revision. */
typedef struct {
    char *key;
    int64_t lease, rev;
    void *rec; /* a struct of the table's type */
} dl_ejob_entry_t;

typedef struct {
    const dl_proto_rec_type_t *type;
    dl_ejob_entry_t *items;
    size_t n, cap;
} dl_ejob_table_t;

void dl_ejob_table_init(dl_ejob_table_t *t, const dl_proto_rec_type_t *type);
void dl_ejob_table_clear(dl_ejob_table_t *t);
/* The record at key, or NULL. */
void *dl_ejob_table_get(const dl_ejob_table_t *t, const char *key);
/* Puts rec (moved: its struct is cleared) at key, replacing what was there. 0 or -ENOMEM. */
int dl_ejob_table_put(dl_ejob_table_t *t, const char *key, void *rec, int64_t lease, int64_t rev);
void dl_ejob_table_del(dl_ejob_table_t *t, const char *key);

#endif
