/* A node's report to and from diag.h's types (rdzv-report.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv-report.h"

/* JSON has no NaN or infinity, and four decimals say all a figure means. */
static double fig(double x)
{
    return __builtin_isfinite(x) ? dl_diag_round(x * 1e4) / 1e4 : 0;
}

static int dup_to(char **dst, const char *s)
{
    return (*dst = strdup(s)) != NULL ? 0 : -ENOMEM;
}

static int fill_op(dl_proto_status_op_t *x, const dl_diag_op_t *op)
{
    *x = (dl_proto_status_op_t){
        .seq = (long long)op->seq,
        .bytes = (long long)op->bytes,
        .age_s = op->age_s >= 0 ? fig(op->age_s) : 0,
        .has_age_s = op->age_s >= 0,
    };
    if (dup_to(&x->op, op->op != NULL ? op->op : "?") < 0 ||
        dup_to(&x->state, dl_diag_op_state_name(op->state)) < 0 ||
        dup_to(&x->algo, op->algo != NULL ? op->algo : "") < 0 ||
        dup_to(&x->transport, op->transport != NULL ? op->transport : "") < 0)
        return -ENOMEM;
    return 0;
}

static int fill_rank(dl_proto_status_rank_t *x, const dl_diag_rank_t *r, const dl_diag_beats_t *b)
{
    x->rank = r->rank;
    x->recorder = r->recorder;
    x->has_recorder = true;
    if (b != NULL && b->figures) {
        x->step = (long long)b->step;
        x->steps = fig(b->total_steps);
        x->compute_ms = fig(b->total_compute_ms);
        x->wait_ms = fig(b->total_wait_ms);
        x->samples = fig(b->total_samples);
        x->has_step = x->has_steps = x->has_compute_ms = x->has_wait_ms = x->has_samples = true;
        x->loss = fig(b->loss);
        x->has_loss = __builtin_isfinite(b->loss);
    }
    x->silent_s = r->silent_s >= 0 ? fig(r->silent_s) : 0;
    x->has_silent_s = r->silent_s >= 0;
    if (r->proc != 0 && dup_to(&x->proc, (char[]){r->proc, '\0'}) < 0)
        return -ENOMEM;
    if (r->nops == 0)
        return 0;
    size_t n = r->nops < DL_DIAG_OPS_MAX ? r->nops : DL_DIAG_OPS_MAX;
    if ((x->ops = calloc(n, sizeof(*x->ops))) == NULL)
        return -ENOMEM;
    x->has_ops = true;
    for (size_t k = 0; k < n; k++) {
        x->nops++;
        if (fill_op(&x->ops[k], &r->ops[k]) < 0)
            return -ENOMEM;
    }
    return 0;
}

int dl_rdzv_report_fill(dl_proto_node_report_t *rep, int node_rank, const char *host,
                        const dl_diag_rank_t *ranks, const dl_diag_beats_t *const *beats, size_t n)
{
    *rep = (dl_proto_node_report_t){.node_rank = node_rank, .has_node_rank = true};
    if (dup_to(&rep->host, host != NULL ? host : "") < 0 ||
        (rep->ranks = calloc(n + 1, sizeof(*rep->ranks))) == NULL)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        rep->nranks++;
        if (fill_rank(&rep->ranks[i], &ranks[i], beats != NULL ? beats[i] : NULL) < 0)
            goto oom;
    }
    return 0;
oom:
    dl_proto_rec_free(&dl_proto_node_report_type, rep);
    return -ENOMEM;
}

void dl_rdzv_report_rank(const dl_proto_node_report_t *rep, size_t i, double older_s,
                         dl_diag_rank_t *d)
{
    const dl_proto_status_rank_t *r = &rep->ranks[i];
    *d = (dl_diag_rank_t){
        .rank = (int)r->rank,
        .node_rank = rep->has_node_rank ? (int)rep->node_rank : -1,
        .host = rep->host != NULL ? rep->host : "",
        .recorder = r->recorder,
        .proc = r->proc != NULL ? r->proc[0] : 0,
        .silent_s = r->has_silent_s ? r->silent_s + older_s : -1,
        .step = r->has_step ? (uint64_t)r->step : 0,
    };
    for (size_t k = 0; k < r->nops && d->nops < DL_DIAG_OPS_MAX; k++) {
        const dl_proto_status_op_t *o = &r->ops[k];
        d->ops[d->nops++] = (dl_diag_op_t){
            .seq = (uint64_t)o->seq,
            .op = o->op != NULL ? o->op : "?",
            .state = dl_diag_op_state_parse(o->state != NULL ? o->state : ""),
            .bytes = (uint64_t)o->bytes,
            .algo = o->algo != NULL ? o->algo : "",
            .transport = o->transport != NULL ? o->transport : "",
            .age_s = o->has_age_s ? o->age_s + older_s : -1,
        };
    }
}

bool dl_rdzv_report_totals(const dl_proto_node_report_t *rep, size_t i, dl_diag_totals_t *ret)
{
    const dl_proto_status_rank_t *x = &rep->ranks[i];
    *ret = (dl_diag_totals_t){
        .rank = (int)x->rank,
        .node_rank = rep->has_node_rank ? (int)rep->node_rank : -1,
        .host = rep->host != NULL ? rep->host : "",
        .steps = x->steps,
        .compute_ms = x->compute_ms,
        .wait_ms = x->wait_ms,
        .samples = x->samples,
    };
    return x->has_steps;
}

int dl_rdzv_report_view(const dl_diag_view_t *v, dl_proto_status_diag_t *d)
{
    *d = (dl_proto_status_diag_t){
        .ranks = v->ranks,
        .median_compute_ms = fig(v->median_ms),
        .step_ms = fig(v->step_ms),
        .samples_per_s = fig(v->samples_per_s),
    };
    if ((d->stragglers = calloc(v->nstragglers + 1, sizeof(*d->stragglers))) == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < v->nstragglers; i++) {
        const dl_diag_straggler_t *s = &v->stragglers[i];
        dl_proto_status_straggler_t *x = &d->stragglers[d->nstragglers++];
        *x = (dl_proto_status_straggler_t){
            .rank = s->rank,
            .node_rank = s->node_rank,
            .compute_ms = fig(s->compute_ms),
            .median_ms = fig(s->median_ms),
            .slower_pct = fig(s->slower * 100.0),
            .steps = (long long)s->steps,
            .cost_samples_per_s = fig(s->cost),
        };
        if (dup_to(&x->host, s->host) < 0)
            return -ENOMEM;
    }
    if (v->slowest_rank >= 0) {
        if ((d->slowest = malloc(sizeof(*d->slowest))) == NULL)
            return -ENOMEM;
        *d->slowest = (dl_proto_status_slowest_t){v->slowest_rank, fig(v->slowest_ms)};
    }
    return 0;
}
