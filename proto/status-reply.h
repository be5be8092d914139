/* The status reply declared once (docs/control.md, docs/operations.md "/api/jobs"): a job's status
 * as our rendezvous, dlaunchd and an etcd job's readers make it, the reply listing every job, and
 * the snapshot the HTTP side renders (the same jobs with what the server keeps of them, and its
 * counters). Each is a struct and a field table (status-reply.c) read and written by record.h:
 * `dlaunch status`, the status page and /metrics decode once and read C fields; the server
 * fills the struct. Adding a field is a member here and one row there.
 *
 * Strings are the record's own copies; a `has_X` flag says an optional number was there (and
 * makes the encoder write it); an optional object is a pointer, NULL when absent. */
#ifndef DL_PROTO_STATUS_REPLY_H
#define DL_PROTO_STATUS_REPLY_H

#include "record.h"

typedef struct {
    char *node_id;
    char *host;
    long long slots;
    long long node_rank; /* -1 while gathering */
    double heartbeat_age;
    bool connected;
    bool left;
    double last_heartbeat; /* the snapshot's: Unix time */
    bool has_last_heartbeat;
} dl_proto_status_node_t;

/* In-job recovery (docs/recovery.md). */
typedef struct {
    long long recoveries;
    bool recovering;
    long long step; /* where the last went on */
    bool has_step;
    double duration_ms;
    bool has_duration_ms;
} dl_proto_status_recovery_t;

/* The job-wide figures and the stragglers named (docs/diagnostics.md; diag.h makes them). */
typedef struct {
    long long rank;
    double compute_ms;
} dl_proto_status_slowest_t;

typedef struct {
    long long rank;
    long long node_rank;
    char *host;
    double compute_ms;
    double median_ms;
    double slower_pct;
    long long steps;
    double cost_samples_per_s;
} dl_proto_status_straggler_t;

typedef struct {
    long long ranks;
    double median_compute_ms;
    double step_ms;
    double samples_per_s;
    dl_proto_status_straggler_t *stragglers;
    size_t nstragglers;
    dl_proto_status_slowest_t *slowest;
} dl_proto_status_diag_t;

/* status --ranks: a rank's figures and last operations as its node last reported them. */
typedef struct {
    long long seq;
    char *op;
    char *state;
    long long bytes;
    char *algo;
    char *transport;
    double age_s;
    bool has_age_s;
} dl_proto_status_op_t;

typedef struct {
    long long rank;
    bool recorder; /* it keeps a flight recorder (its agent always says) */
    bool has_recorder;
    long long step;
    bool has_step;
    double steps, compute_ms, wait_ms, samples; /* totals */
    bool has_steps, has_compute_ms, has_wait_ms, has_samples;
    double loss;
    bool has_loss;
    double silent_s;
    bool has_silent_s;
    char *proc; /* the process state letter, or NULL */
    dl_proto_status_op_t *ops;
    size_t nops;
    bool has_ops;
    long long node_rank;
    bool has_node_rank;
    char *host;
    double report_age_s;
    bool has_report_age_s;
} dl_proto_status_rank_t;

/* What the server keeps of a job for the snapshot (stats.c). */
typedef struct {
    double time;
    long long round;
    char *cause;
    char *reason;
} dl_proto_status_restart_t;

typedef struct {
    double time;
    char *peer;
    long long round;
    bool has_round;
    long long rank;
    bool has_rank;
    long long local_rank;
    bool has_local_rank;
    long long exit_code;
    bool has_exit_code;
    long long signal;
    bool has_signal;
    char *reason;
    char *log_tail;
} dl_proto_status_failure_t;

typedef struct {
    double time;
    long long step;
    double loss;
    bool has_loss;
    double samples_per_s;
    bool has_samples_per_s;
} dl_proto_status_point_t;

typedef struct {
    double time;
    char *level;
    char *text;
} dl_proto_status_log_t;

typedef struct {
    char *run_id;
    char *state;
    long long round, restarts, max_restarts, min_nodes, max_nodes, world_size;
    /* The store's figures: an etcd job's store is in node 0's agent, and they come only with
     * its report. */
    long long keys;
    bool has_keys;
    dl_proto_status_node_t *nodes;
    size_t nnodes;
    char *failure; /* the job's first failure, or NULL */
    long long store_bytes, store_waits, store_clients;
    bool has_store_bytes, has_store_waits, has_store_clients;
    dl_proto_status_diag_t *diag;
    char *where; /* status --ranks: where the ranks are stuck */
    dl_proto_status_rank_t *ranks;
    size_t nranks;
    bool has_ranks;
    dl_proto_status_recovery_t *recovery;
    /* The snapshot's additions. */
    dl_proto_rec_count_t *restarts_by_cause;
    size_t nrestarts_by_cause;
    bool has_restarts_by_cause;
    dl_proto_status_restart_t *history;
    size_t nhistory;
    bool has_history;
    dl_proto_status_failure_t *last_failure;
    dl_proto_status_point_t *progress;
    size_t nprogress;
    bool has_progress;
    dl_proto_status_log_t *log;
    size_t nlog;
    bool has_log;
} dl_proto_status_job_t;

/* status without a RUN_ID: every job the server has (state "serving", round 0); an etcd
 * backend's, every job under /dlaunch/, has neither. */
typedef struct {
    char *state; /* "serving" */
    long long round;
    bool has_round;
    dl_proto_status_job_t *jobs;
    size_t njobs;
} dl_proto_status_list_t;

/* A latency histogram: bounds, cumulative counts (one per bound, then +Inf), sum, count. */
typedef struct {
    double *bounds;
    size_t nbounds;
    long long *counts;
    size_t ncounts;
    double sum;
    long long count;
} dl_proto_status_hist_t;

typedef struct {
    dl_proto_status_hist_t *round_seconds;
    dl_proto_status_hist_t *step_seconds;
} dl_proto_status_hists_t;

typedef struct {
    double started;
    long long connections, peak_connections, accepted, auth_failures, auth_timeouts, rounds;
    dl_proto_rec_count_t *rejected, *messages, *restarts, *ended;
    size_t nrejected, nmessages, nrestarts, nended;
    dl_proto_status_hists_t *histograms;
} dl_proto_status_server_t;

typedef struct {
    char *version;
    double time;
    dl_proto_status_server_t *server; /* NULL: an agent's page of an etcd job */
    dl_proto_status_job_t *jobs;
    size_t njobs;
} dl_proto_status_snapshot_t;

extern const dl_proto_rec_type_t dl_proto_status_job_type;
/* A job's parts its producers fill apart (rendezvous/jobview.c, rendezvous/stats.c). */
extern const dl_proto_rec_type_t dl_proto_status_diag_type;
extern const dl_proto_rec_type_t dl_proto_status_rank_type;
extern const dl_proto_rec_type_t dl_proto_status_recovery_type;
/* A heartbeat's "recovery" (docs/protocol.md): the same struct, recoveries and recovering
 * required. */
extern const dl_proto_rec_type_t dl_proto_beat_recovery_type;
extern const dl_proto_rec_type_t dl_proto_status_list_type;
extern const dl_proto_rec_type_t dl_proto_status_server_type;
extern const dl_proto_rec_type_t dl_proto_status_snapshot_type;

/* A status reply's result, one job or every job: *ret_list gets the jobs either way (one job's
 * reply is a list of one, with state NULL). Returns 0, or -EBADMSG / -ENOMEM with one line in
 * err naming the field (dl_proto_rec_decode). Free with dl_proto_rec_free(&dl_proto_status_list_type, ...). */
int dl_proto_status_decode_reply(const json_t *result, dl_proto_status_list_t *ret_list, char *err,
                                 size_t errlen);

#endif
