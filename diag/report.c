/* A node's figures and its ranks' last operations as JSON, for its heartbeat and failure reports,
 * and the job-wide view the rendezvous sends back. The shape is checked here, with bounds, before
 * anything reads it: a report comes from the network. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"

#define MAX_REPORT_RANKS 65536
#define NAME_MAX_BYTES 64

static json_t *num(double v)
{
    /* JSON has no NaN or infinity; a figure nobody reported is left out by the callers. */
    return json_real(isfinite(v) ? dl_diag_round(v * 1e4) / 1e4 : 0);
}

static json_t *op_json(const dl_diag_op_t *op)
{
    json_t *o = json_pack("{s:I, s:s, s:s, s:I, s:s, s:s}", "seq", (json_int_t)op->seq, "op",
                          op->op ? op->op : "?", "state", dl_diag_op_state_name(op->state), "bytes",
                          (json_int_t)op->bytes, "algo", op->algo ? op->algo : "", "transport",
                          op->transport ? op->transport : "");
    if (o != NULL && op->age_s >= 0)
        json_object_set_new(o, "age_s", num(op->age_s));
    return o;
}

json_t *dl_diag_report_new(int node_rank, const char *host, const dl_diag_rank_t *ranks,
                           const dl_diag_beats_t *const *beats, size_t n)
{
    json_t *list = json_array();
    json_t *rep = json_pack("{s:i, s:s, s:o}", "node_rank", node_rank, "host", host ? host : "",
                            "ranks", list);
    if (rep == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_rank_t *r = &ranks[i];
        const dl_diag_beats_t *b = beats != NULL ? beats[i] : NULL;
        json_t *o = json_pack("{s:i, s:b}", "rank", r->rank, "recorder", r->recorder);
        if (o == NULL || json_array_append_new(list, o) < 0) {
            json_decref(rep);
            return NULL;
        }
        if (b != NULL && b->figures) {
            json_object_set_new(o, "step", json_integer((json_int_t)b->step));
            json_object_set_new(o, "steps", num(b->total_steps));
            json_object_set_new(o, "compute_ms", num(b->total_compute_ms));
            json_object_set_new(o, "wait_ms", num(b->total_wait_ms));
            json_object_set_new(o, "samples", num(b->total_samples));
            if (isfinite(b->loss))
                json_object_set_new(o, "loss", num(b->loss));
        }
        if (r->silent_s >= 0)
            json_object_set_new(o, "silent_s", num(r->silent_s));
        if (r->proc != 0) {
            char p[2] = {r->proc, '\0'};
            json_object_set_new(o, "proc", json_string(p));
        }
        if (r->nops > 0) {
            json_t *ops = json_array();
            for (size_t k = 0; k < r->nops && k < DL_DIAG_OPS_MAX; k++)
                json_array_append_new(ops, op_json(&r->ops[k]));
            json_object_set_new(o, "ops", ops);
        }
    }
    return rep;
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err != NULL && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EBADMSG;
}

/* Field f of o, if present, is of the JSON type test accepts (and a string no longer than the
 * limit, a number not below 0). */
static int field(const json_t *o, const char *where, size_t idx, const char *f, char kind,
                 char *err, size_t errlen)
{
    const json_t *v = json_object_get(o, f);
    if (v == NULL)
        return 0;
    bool ok;
    switch (kind) {
    case 'i':
        ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX;
        break;
    case 'I': ok = json_is_integer(v) && json_integer_value(v) >= 0; break;
    case 'n': ok = json_is_number(v) && json_number_value(v) >= 0; break;
    case 'f': ok = json_is_number(v); break;
    case 'b': ok = json_is_boolean(v); break;
    default: /* 's' */
        ok = json_is_string(v) && json_string_length(v) <= NAME_MAX_BYTES &&
             strlen(json_string_value(v)) == json_string_length(v);
        break;
    }
    if (!ok)
        return bad(err, errlen, "diag: %s %zu: field '%s' must be %s", where, idx, f,
                   kind == 'i' || kind == 'I' ? "a whole number >= 0"
                   : kind == 'n'              ? "a number >= 0"
                   : kind == 'f'              ? "a number"
                   : kind == 'b'              ? "true or false"
                                              : "a string of at most 64 bytes");
    return 0;
}

int dl_diag_report_check(const json_t *report, char *err, size_t errlen)
{
    if (!json_is_object(report))
        return bad(err, errlen, "diag: the report must be an object");
    if (field(report, "report", 0, "node_rank", 'i', err, errlen) < 0 ||
        field(report, "report", 0, "host", 's', err, errlen) < 0)
        return -EBADMSG;
    const json_t *ranks = json_object_get(report, "ranks");
    if (!json_is_array(ranks) || json_array_size(ranks) > MAX_REPORT_RANKS)
        return bad(err, errlen, "diag: 'ranks' must be an array of at most %d ranks",
                   MAX_REPORT_RANKS);
    size_t i;
    const json_t *r;
    json_array_foreach (ranks, i, r) {
        static const char *ints[] = {"rank", NULL};
        static const char *nums[] = {"steps", "compute_ms", "wait_ms", "samples", "silent_s", NULL};
        if (!json_is_object(r) || !json_is_integer(json_object_get(r, "rank")))
            return bad(err, errlen, "diag: rank %zu must be an object with a 'rank'", i);
        for (const char **f = ints; *f; f++)
            if (field(r, "rank", i, *f, 'i', err, errlen) < 0)
                return -EBADMSG;
        for (const char **f = nums; *f; f++)
            if (field(r, "rank", i, *f, 'n', err, errlen) < 0)
                return -EBADMSG;
        if (field(r, "rank", i, "step", 'I', err, errlen) < 0 ||
            field(r, "rank", i, "loss", 'f', err, errlen) < 0 ||
            field(r, "rank", i, "recorder", 'b', err, errlen) < 0 ||
            field(r, "rank", i, "proc", 's', err, errlen) < 0)
            return -EBADMSG;
        const json_t *ops = json_object_get(r, "ops");
        if (ops == NULL)
            continue;
        if (!json_is_array(ops) || json_array_size(ops) > DL_DIAG_OPS_MAX)
            return bad(err, errlen, "diag: rank %zu: 'ops' must be an array of at most %d", i,
                       DL_DIAG_OPS_MAX);
        size_t k;
        const json_t *op;
        json_array_foreach (ops, k, op) {
            if (!json_is_object(op) || !json_is_integer(json_object_get(op, "seq")) ||
                !json_is_string(json_object_get(op, "op")) ||
                !json_is_string(json_object_get(op, "state")))
                return bad(err, errlen,
                           "diag: rank %zu: operation %zu needs 'seq', 'op' and 'state'", i, k);
            if (field(op, "operation", k, "seq", 'I', err, errlen) < 0 ||
                field(op, "operation", k, "op", 's', err, errlen) < 0 ||
                field(op, "operation", k, "state", 's', err, errlen) < 0 ||
                field(op, "operation", k, "bytes", 'I', err, errlen) < 0 ||
                field(op, "operation", k, "algo", 's', err, errlen) < 0 ||
                field(op, "operation", k, "transport", 's', err, errlen) < 0 ||
                field(op, "operation", k, "age_s", 'n', err, errlen) < 0)
                return -EBADMSG;
        }
    }
    return 0;
}

static double get_num(const json_t *o, const char *f, double dflt)
{
    const json_t *v = json_object_get(o, f);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static const char *get_str(const json_t *o, const char *f, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, f));
    return s != NULL ? s : dflt;
}

size_t dl_diag_report_read(const json_t *report, double older_s, dl_diag_totals_t *totals,
                           dl_diag_rank_t *ranks, size_t max)
{
    int node_rank = (int)get_num(report, "node_rank", -1);
    const char *host = get_str(report, "host", "");
    const json_t *list = json_object_get(report, "ranks"), *r;
    size_t i, n = 0;
    json_array_foreach (list, i, r) {
        if (n == max)
            break;
        int rank = (int)json_integer_value(json_object_get(r, "rank"));
        if (totals != NULL)
            totals[n] = (dl_diag_totals_t){
                .rank = rank,
                .node_rank = node_rank,
                .host = host,
                .steps = get_num(r, "steps", 0),
                .compute_ms = get_num(r, "compute_ms", 0),
                .wait_ms = get_num(r, "wait_ms", 0),
                .samples = get_num(r, "samples", 0),
            };
        if (ranks != NULL) {
            dl_diag_rank_t *d = &ranks[n];
            memset(d, 0, sizeof(*d));
            d->rank = rank;
            d->node_rank = node_rank;
            d->host = host;
            d->recorder = json_is_true(json_object_get(r, "recorder"));
            const char *p = get_str(r, "proc", "");
            d->proc = p[0];
            double silent = get_num(r, "silent_s", -1);
            d->silent_s = silent >= 0 ? silent + older_s : -1;
            d->step = (uint64_t)get_num(r, "step", 0);
            size_t k;
            const json_t *op;
            json_array_foreach (json_object_get(r, "ops"), k, op) {
                if (d->nops == DL_DIAG_OPS_MAX)
                    break;
                dl_diag_op_t *x = &d->ops[d->nops++];
                double age = get_num(op, "age_s", -1);
                *x = (dl_diag_op_t){
                    .seq = (uint64_t)json_integer_value(json_object_get(op, "seq")),
                    .op = get_str(op, "op", "?"),
                    .state = dl_diag_op_state_parse(get_str(op, "state", "")),
                    .bytes = (uint64_t)get_num(op, "bytes", 0),
                    .algo = get_str(op, "algo", ""),
                    .transport = get_str(op, "transport", ""),
                    .age_s = age >= 0 ? age + older_s : -1,
                };
            }
        }
        n++;
    }
    return n;
}

json_t *dl_diag_view_json(const dl_diag_view_t *v)
{
    json_t *list = json_array();
    json_t *o = json_pack("{s:i, s:o, s:o, s:o, s:o}", "ranks", v->ranks, "median_compute_ms",
                          num(v->median_ms), "step_ms", num(v->step_ms), "samples_per_s",
                          num(v->samples_per_s), "stragglers", list);
    if (o == NULL)
        return NULL;
    if (v->slowest_rank >= 0)
        json_object_set_new(
            o, "slowest",
            json_pack("{s:i, s:o}", "rank", v->slowest_rank, "compute_ms", num(v->slowest_ms)));
    for (size_t i = 0; i < v->nstragglers; i++) {
        const dl_diag_straggler_t *s = &v->stragglers[i];
        json_array_append_new(list,
                              json_pack("{s:i, s:i, s:s, s:o, s:o, s:o, s:I, s:o}", "rank", s->rank,
                                        "node_rank", s->node_rank, "host", s->host, "compute_ms",
                                        num(s->compute_ms), "median_ms", num(s->median_ms),
                                        "slower_pct", num(s->slower * 100.0), "steps",
                                        (json_int_t)s->steps, "cost_samples_per_s", num(s->cost)));
    }
    return o;
}
