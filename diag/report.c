/* A node's report read straight from its JSON, for the etcd backend's account of where its own
 * ranks are (agent/rdzv-etcd.c). The agent writes the report, and the rendezvous reads it, as the
 * record proto/node-report.h declares (rendezvous/rdzv-report.h converts): these two go once
 * their last caller reads the record too. The shape is checked, with bounds, before anything
 * reads it: a report comes from the network. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"

#define MAX_REPORT_RANKS 65536
#define NAME_MAX_BYTES 64

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
