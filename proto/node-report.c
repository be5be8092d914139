/* The node report's field tables and bounds (node-report.h). The order is the one agents have
 * always written, which docs/protocol.md shows. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "node-report.h"
#include "record-rows.h"

#define T dl_proto_status_op_t
static const dl_proto_rec_field_t op_fields[] = {
    REQ(DL_PROTO_REC_INT, seq),    REQ(DL_PROTO_REC_STR, op),
    REQ(DL_PROTO_REC_STR, state),  OPT(DL_PROTO_REC_INT, bytes),
    OPT(DL_PROTO_REC_STR, algo),   OPT(DL_PROTO_REC_STR, transport),
    HAS(DL_PROTO_REC_REAL, age_s), END,
};
static const dl_proto_rec_type_t op_type = {sizeof(dl_proto_status_op_t), op_fields};
#undef T

#define T dl_proto_status_rank_t
static const dl_proto_rec_field_t rank_fields[] = {
    REQ(DL_PROTO_REC_INT, rank),
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
    END,
};
static const dl_proto_rec_type_t rank_type = {sizeof(dl_proto_status_rank_t), rank_fields};
#undef T

#define T dl_proto_node_report_t
static const dl_proto_rec_field_t report_fields[] = {
    HAS(DL_PROTO_REC_INT, node_rank),  OPT(DL_PROTO_REC_STR, host),   REQ_LIST(ranks, rank_type),
    HAS(DL_PROTO_REC_REAL, threshold), HAS(DL_PROTO_REC_INT, window), END,
};
const dl_proto_rec_type_t dl_proto_node_report_type = {sizeof(dl_proto_node_report_t),
                                                       report_fields};
#undef T

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen > 0) {
        int n = snprintf(err, errlen, "diag: field '");
        if (n > 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    }
    va_end(ap);
    return -EBADMSG;
}

static bool name_ok(const char *s)
{
    return s == NULL || strlen(s) <= DL_PROTO_REPORT_NAME_MAX;
}

#define NAME "' must be a string of at most 64 bytes"
#define NOT_NEG "' must be a number >= 0"

static int check_op(const dl_proto_status_op_t *o, size_t i, size_t k, char *err, size_t errlen)
{
    if (o->seq < 0)
        return bad(err, errlen, "ranks[%zu].ops[%zu].seq" NOT_NEG, i, k);
    if (o->bytes < 0)
        return bad(err, errlen, "ranks[%zu].ops[%zu].bytes" NOT_NEG, i, k);
    if (o->has_age_s && !(o->age_s >= 0))
        return bad(err, errlen, "ranks[%zu].ops[%zu].age_s" NOT_NEG, i, k);
    const char *names[] = {"op", "state", "algo", "transport"};
    const char *vals[] = {o->op, o->state, o->algo, o->transport};
    for (size_t f = 0; f < 4; f++)
        if (!name_ok(vals[f]))
            return bad(err, errlen, "ranks[%zu].ops[%zu].%s" NAME, i, k, names[f]);
    return 0;
}

static int check_rank(const dl_proto_status_rank_t *r, size_t i, char *err, size_t errlen)
{
    if (r->rank < 0 || r->rank > INT32_MAX)
        return bad(err, errlen, "ranks[%zu].rank' must be a whole number from 0 to 2^31 - 1", i);
    if (r->has_step && r->step < 0)
        return bad(err, errlen, "ranks[%zu].step" NOT_NEG, i);
    const char *names[] = {"steps", "compute_ms", "wait_ms", "samples", "silent_s"};
    const double vals[] = {r->steps, r->compute_ms, r->wait_ms, r->samples, r->silent_s};
    const bool has[] = {r->has_steps, r->has_compute_ms, r->has_wait_ms, r->has_samples,
                        r->has_silent_s};
    for (size_t f = 0; f < 5; f++)
        if (has[f] && !(vals[f] >= 0))
            return bad(err, errlen, "ranks[%zu].%s" NOT_NEG, i, names[f]);
    if (!name_ok(r->proc))
        return bad(err, errlen, "ranks[%zu].proc" NAME, i);
    if (r->nops > DL_PROTO_REPORT_OPS_MAX)
        return bad(err, errlen, "ranks[%zu].ops' must be an array of at most %d operations", i,
                   DL_PROTO_REPORT_OPS_MAX);
    for (size_t k = 0; k < r->nops; k++) {
        int e = check_op(&r->ops[k], i, k, err, errlen);
        if (e < 0)
            return e;
    }
    return 0;
}

static int check(const dl_proto_node_report_t *rep, char *err, size_t errlen)
{
    if (rep->has_node_rank && (rep->node_rank < 0 || rep->node_rank > INT32_MAX))
        return bad(err, errlen, "node_rank' must be a whole number from 0 to 2^31 - 1");
    if (!name_ok(rep->host))
        return bad(err, errlen, "host" NAME);
    if (rep->has_threshold && !(rep->threshold > 0))
        return bad(err, errlen, "threshold' must be a number above 0");
    if (rep->nranks > DL_PROTO_REPORT_RANKS_MAX)
        return bad(err, errlen, "ranks' must be an array of at most %d ranks",
                   DL_PROTO_REPORT_RANKS_MAX);
    for (size_t i = 0; i < rep->nranks; i++) {
        int e = check_rank(&rep->ranks[i], i, err, errlen);
        if (e < 0)
            return e;
    }
    return 0;
}

int dl_proto_node_report_decode(const json_t *obj, dl_proto_node_report_t *rep, char *err,
                                size_t errlen)
{
    int r = dl_proto_rec_decode(&dl_proto_node_report_type, obj, rep, "diag", err, errlen);
    if (r == 0 && (r = check(rep, err, errlen)) < 0)
        dl_proto_rec_free(&dl_proto_node_report_type, rep);
    return r;
}
