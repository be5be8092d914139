/* The status reply's field tables (status-reply.h): one row a field, in the order the server
 * writes them, which is the order `status --json` and /api/jobs show. docs/control.md and
 * docs/operations.md describe the same fields for people; change both together. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record-rows.h"
#include "status-reply.h"

#define T dl_proto_status_node_t
static const dl_proto_rec_field_t node_fields[] = {
    REQ(DL_PROTO_REC_STR, node_id),
    OPT(DL_PROTO_REC_STR, host),
    OPT(DL_PROTO_REC_INT, slots),
    OPT(DL_PROTO_REC_INT, node_rank),
    OPT(DL_PROTO_REC_REAL, heartbeat_age),
    OPT(DL_PROTO_REC_BOOL, connected),
    OPT(DL_PROTO_REC_BOOL, left),
    HAS(DL_PROTO_REC_REAL, last_heartbeat),
    END,
};
#undef T
static const dl_proto_rec_type_t node_type = {sizeof(dl_proto_status_node_t), node_fields};

#define T dl_proto_status_recovery_t
static const dl_proto_rec_field_t recovery_fields[] = {
    OPT(DL_PROTO_REC_INT, recoveries),
    OPT(DL_PROTO_REC_BOOL, recovering),
    HAS(DL_PROTO_REC_INT, step),
    HAS(DL_PROTO_REC_REAL, duration_ms),
    END,
};
/* An agent's heartbeat says the same, and says nothing without the first two. */
static const dl_proto_rec_field_t beat_recovery_fields[] = {
    REQ(DL_PROTO_REC_INT, recoveries),
    REQ(DL_PROTO_REC_BOOL, recovering),
    HAS(DL_PROTO_REC_INT, step),
    HAS(DL_PROTO_REC_REAL, duration_ms),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_recovery_type = {sizeof(dl_proto_status_recovery_t),
                                                           recovery_fields};
const dl_proto_rec_type_t dl_proto_beat_recovery_type = {sizeof(dl_proto_status_recovery_t),
                                                         beat_recovery_fields};

#define T dl_proto_status_slowest_t
static const dl_proto_rec_field_t slowest_fields[] = {
    OPT(DL_PROTO_REC_INT, rank),
    OPT(DL_PROTO_REC_REAL, compute_ms),
    END,
};
#undef T
static const dl_proto_rec_type_t slowest_type = {sizeof(dl_proto_status_slowest_t), slowest_fields};

#define T dl_proto_status_straggler_t
static const dl_proto_rec_field_t straggler_fields[] = {
    OPT(DL_PROTO_REC_INT, rank),
    OPT(DL_PROTO_REC_INT, node_rank),
    OPT(DL_PROTO_REC_STR, host),
    OPT(DL_PROTO_REC_REAL, compute_ms),
    OPT(DL_PROTO_REC_REAL, median_ms),
    OPT(DL_PROTO_REC_REAL, slower_pct),
    OPT(DL_PROTO_REC_INT, steps),
    OPT(DL_PROTO_REC_REAL, cost_samples_per_s),
    END,
};
#undef T
static const dl_proto_rec_type_t straggler_type = {sizeof(dl_proto_status_straggler_t),
                                                   straggler_fields};

#define T dl_proto_status_diag_t
static const dl_proto_rec_field_t diag_fields[] = {
    OPT(DL_PROTO_REC_INT, ranks),
    OPT(DL_PROTO_REC_REAL, median_compute_ms),
    OPT(DL_PROTO_REC_REAL, step_ms),
    OPT(DL_PROTO_REC_REAL, samples_per_s),
    LIST(stragglers, straggler_type),
    OBJ(slowest, slowest_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_diag_type = {sizeof(dl_proto_status_diag_t), diag_fields};

#define T dl_proto_status_op_t
static const dl_proto_rec_field_t op_fields[] = {
    OPT(DL_PROTO_REC_INT, seq), /* the rank's count of collective operations */
    OPT(DL_PROTO_REC_STR, op),
    OPT(DL_PROTO_REC_STR, state),
    OPT(DL_PROTO_REC_INT, bytes),
    OPT(DL_PROTO_REC_STR, algo),
    OPT(DL_PROTO_REC_STR, transport),
    HAS(DL_PROTO_REC_REAL, age_s),
    END,
};
#undef T
static const dl_proto_rec_type_t op_type = {sizeof(dl_proto_status_op_t), op_fields};

#define T dl_proto_status_rank_t
static const dl_proto_rec_field_t rank_fields[] = {
    OPT(DL_PROTO_REC_INT, rank),
    HAS(DL_PROTO_REC_BOOL, recorder),
    HAS(DL_PROTO_REC_INT, step),
    HAS(DL_PROTO_REC_REAL, steps),
    HAS(DL_PROTO_REC_REAL, compute_ms),
    HAS(DL_PROTO_REC_REAL, wait_ms),
    HAS(DL_PROTO_REC_REAL, samples),
    HAS(DL_PROTO_REC_REAL, loss),
    HAS(DL_PROTO_REC_REAL, silent_s),
    OPT(DL_PROTO_REC_STR, proc),
    LIST_HAS(ops, op_type),
    HAS(DL_PROTO_REC_INT, node_rank),
    OPT(DL_PROTO_REC_STR, host),
    HAS(DL_PROTO_REC_REAL, report_age_s),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_rank_type = {sizeof(dl_proto_status_rank_t), rank_fields};

#define T dl_proto_status_restart_t
static const dl_proto_rec_field_t restart_fields[] = {
    OPT(DL_PROTO_REC_REAL, time),
    OPT(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_STR, cause),
    OPT(DL_PROTO_REC_STR, reason),
    END,
};
#undef T
static const dl_proto_rec_type_t restart_type = {sizeof(dl_proto_status_restart_t), restart_fields};

#define T dl_proto_status_failure_t
static const dl_proto_rec_field_t failure_fields[] = {
    OPT(DL_PROTO_REC_REAL, time),
    OPT(DL_PROTO_REC_STR, peer), /* the reporting agent's address */
    HAS(DL_PROTO_REC_INT, round),
    HAS(DL_PROTO_REC_INT, rank),
    HAS(DL_PROTO_REC_INT, local_rank),
    HAS(DL_PROTO_REC_INT, exit_code),
    HAS(DL_PROTO_REC_INT, signal),
    OPT(DL_PROTO_REC_STR, reason),
    OPT(DL_PROTO_REC_STR, log_tail),
    END,
};
#undef T
static const dl_proto_rec_type_t failure_type = {sizeof(dl_proto_status_failure_t), failure_fields};

#define T dl_proto_status_point_t
static const dl_proto_rec_field_t point_fields[] = {
    OPT(DL_PROTO_REC_REAL, time),
    OPT(DL_PROTO_REC_INT, step),
    HAS(DL_PROTO_REC_REAL, loss),
    HAS(DL_PROTO_REC_REAL, samples_per_s),
    END,
};
#undef T
static const dl_proto_rec_type_t point_type = {sizeof(dl_proto_status_point_t), point_fields};

#define T dl_proto_status_log_t
static const dl_proto_rec_field_t log_fields[] = {
    OPT(DL_PROTO_REC_REAL, time),
    OPT(DL_PROTO_REC_STR, level),
    OPT(DL_PROTO_REC_STR, text),
    END,
};
#undef T
static const dl_proto_rec_type_t log_type = {sizeof(dl_proto_status_log_t), log_fields};

#define T dl_proto_status_job_t
static const dl_proto_rec_field_t job_fields[] = {
    REQ(DL_PROTO_REC_STR, run_id),
    REQ(DL_PROTO_REC_STR, state),
    OPT(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_INT, restarts),
    OPT(DL_PROTO_REC_INT, max_restarts),
    OPT(DL_PROTO_REC_INT, min_nodes),
    OPT(DL_PROTO_REC_INT, max_nodes),
    OPT(DL_PROTO_REC_INT, world_size),
    HAS(DL_PROTO_REC_INT, keys),
    LIST(nodes, node_type),
    OPT(DL_PROTO_REC_STR, failure),
    HAS(DL_PROTO_REC_INT, store_bytes),
    HAS(DL_PROTO_REC_INT, store_waits),
    HAS(DL_PROTO_REC_INT, store_clients),
    OBJ(diag, dl_proto_status_diag_type),
    OPT(DL_PROTO_REC_STR, where),
    LIST_HAS(ranks, dl_proto_status_rank_type),
    OBJ(recovery, dl_proto_status_recovery_type),
    COUNTS_HAS(restarts_by_cause),
    LIST_HAS(history, restart_type),
    OBJ(last_failure, failure_type),
    LIST_HAS(progress, point_type),
    LIST_HAS(log, log_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_job_type = {sizeof(dl_proto_status_job_t), job_fields};

#define T dl_proto_status_list_t
static const dl_proto_rec_field_t list_fields[] = {
    REQ(DL_PROTO_REC_STR, state),
    HAS(DL_PROTO_REC_INT, round),
    LIST(jobs, dl_proto_status_job_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_list_type = {sizeof(dl_proto_status_list_t), list_fields};

#define T dl_proto_status_hist_t
static const dl_proto_rec_field_t hist_fields[] = {
    VEC(DL_PROTO_REC_REALV, bounds),
    VEC(DL_PROTO_REC_INTV, counts),
    OPT(DL_PROTO_REC_REAL, sum),
    OPT(DL_PROTO_REC_INT, count),
    END,
};
#undef T
static const dl_proto_rec_type_t hist_type = {sizeof(dl_proto_status_hist_t), hist_fields};

#define T dl_proto_status_hists_t
static const dl_proto_rec_field_t hists_fields[] = {
    OBJ(round_seconds, hist_type),
    OBJ(step_seconds, hist_type),
    END,
};
#undef T
static const dl_proto_rec_type_t hists_type = {sizeof(dl_proto_status_hists_t), hists_fields};

#define T dl_proto_status_server_t
static const dl_proto_rec_field_t server_fields[] = {
    OPT(DL_PROTO_REC_REAL, started),
    OPT(DL_PROTO_REC_INT, connections),
    OPT(DL_PROTO_REC_INT, peak_connections),
    OPT(DL_PROTO_REC_INT, accepted),
    OPT(DL_PROTO_REC_INT, auth_failures),
    OPT(DL_PROTO_REC_INT, auth_timeouts),
    COUNTS(rejected),
    COUNTS(messages),
    COUNTS(restarts),
    OPT(DL_PROTO_REC_INT, rounds),
    COUNTS(ended),
    OBJ(histograms, hists_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_server_type = {sizeof(dl_proto_status_server_t),
                                                         server_fields};

#define T dl_proto_status_snapshot_t
static const dl_proto_rec_field_t snapshot_fields[] = {
    OPT(DL_PROTO_REC_STR, version),
    OPT(DL_PROTO_REC_REAL, time),
    OBJ(server, dl_proto_status_server_type),
    LIST(jobs, dl_proto_status_job_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_proto_status_snapshot_type = {sizeof(dl_proto_status_snapshot_t),
                                                           snapshot_fields};

int dl_proto_status_decode_reply(const json_t *result, dl_proto_status_list_t *ret, char *err,
                                 size_t errlen)
{
    if (json_object_get(result, "jobs") != NULL)
        return dl_proto_rec_decode(&dl_proto_status_list_type, result, ret, "status reply", err,
                                   errlen);
    /* One job: a list of one, so that a reader has one shape to walk. */
    dl_proto_status_job_t *job = calloc(1, sizeof(*job));
    memset(ret, 0, sizeof(*ret));
    if (job == NULL) {
        snprintf(err, errlen, "status reply: out of memory");
        return -ENOMEM;
    }
    int r =
        dl_proto_rec_decode(&dl_proto_status_job_type, result, job, "status reply", err, errlen);
    if (r < 0) {
        free(job);
        return r;
    }
    ret->round = job->round;
    ret->jobs = job;
    ret->njobs = 1;
    return 0;
}
