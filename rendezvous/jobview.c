/* The job-wide view of the ranks. Agents send their node's report with every heartbeat; this
 * file keeps the latest one per connection, runs the straggler rule over the whole job (one
 * place, so every agent hears the same names) and makes the account of a hang from all nodes.
 *
 * Bounds: one report per connection and job (a report is one frame, 1 MiB at most), so memory
 * follows connections, which the server already bounds. Work per report: O(ranks of the job)
 * for the rule; an account or a status with ranks reads every report once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "jobview.h"
#include "rdzv-policy.h"

#define EXPLAIN_RANKS_MAX 65536
#define STUCK_S                                                                                    \
    1.0 /* status shows where the ranks are once one is inside an operation this long  \
                     */

typedef struct {
    int round;
    dl_diag_judge_t *judge; /* NULL until a report brings the rule's settings */
    json_t *reports;        /* conn id (decimal) -> {"at": seconds, "report": {...}} */
    json_t *view;           /* the last evaluation */
} job_t;

struct dl__jobview_s {
    /* run id -> the address of its job_t, as an integer: jansson's hash table finds a job in
     * O(1) without one of our own. */
    json_t *jobs;
};

int dl__jobview_new(dl__jobview_t **ret)
{
    dl__jobview_t *v = calloc(1, sizeof(*v));
    if (v == NULL || (v->jobs = json_object()) == NULL) {
        free(v);
        return -ENOMEM;
    }
    *ret = v;
    return 0;
}

static void job_free(job_t *j)
{
    if (j == NULL)
        return;
    dl_diag_judge_free(j->judge);
    json_decref(j->reports);
    json_decref(j->view);
    free(j);
}

static job_t *job_of(const dl__jobview_t *v, const char *run_id)
{
    json_t *p = json_object_get(v->jobs, run_id);
    return p != NULL ? (job_t *)(uintptr_t)json_integer_value(p) : NULL;
}

void dl__jobview_forget(dl__jobview_t *v, const char *run_id)
{
    if (v == NULL || run_id == NULL)
        return;
    job_free(job_of(v, run_id));
    json_object_del(v->jobs, run_id);
}

void dl__jobview_free(dl__jobview_t *v)
{
    if (v == NULL)
        return;
    const char *k;
    json_t *p;
    json_object_foreach (v->jobs, k, p) {
        job_free((job_t *)(uintptr_t)json_integer_value(p));
    }
    json_decref(v->jobs);
    free(v);
}

/* The job's state for round, new (or renewed, for a newer round) if need be. */
static int job_for(dl__jobview_t *v, const char *run_id, int round, job_t **ret)
{
    job_t *j = job_of(v, run_id);
    if (j != NULL && round < j->round)
        return -ESTALE;
    if (j != NULL && round > j->round) {
        /* A new round: new workers, new sums, maybe other nodes. */
        j->round = round;
        json_object_clear(j->reports);
        json_decref(j->view);
        j->view = NULL;
        if (j->judge != NULL)
            dl_diag_judge_reset(j->judge);
    }
    if (j == NULL) {
        j = calloc(1, sizeof(*j));
        if (j == NULL || (j->reports = json_object()) == NULL) {
            job_free(j);
            return -ENOMEM;
        }
        j->round = round;
        if (json_object_set_new(v->jobs, run_id, json_integer((json_int_t)(uintptr_t)j)) < 0) {
            job_free(j);
            return -ENOMEM;
        }
    }
    *ret = j;
    return 0;
}

/* The rule's settings come with the reports (from the agents' job spec); the first ones hold. */
static int ensure_judge(job_t *j, const json_t *report)
{
    const json_t *th = json_object_get(report, "threshold"),
                 *win = json_object_get(report, "window");
    if (j->judge != NULL || !json_is_number(th))
        return 0;
    dl_diag_straggler_opts_t o;
    dl_diag_straggler_opts_init(&o);
    o.threshold = json_number_value(th);
    if (json_is_integer(win) && json_integer_value(win) > 0)
        o.window = (uint64_t)json_integer_value(win);
    int r = dl_diag_judge_new(&o, &j->judge);
    return r == -EINVAL ? 0 : r; /* nonsense settings: no rule, still a view */
}

int dl__jobview_report(dl__jobview_t *v, const char *run_id, int round, uint64_t conn,
                       const json_t *report, double now, char *err, size_t errlen)
{
    char key[32];
    job_t *j;
    int r = dl_diag_report_check(report, err, errlen);
    if (r < 0)
        return r;
    const json_t *th = json_object_get(report, "threshold");
    if (th != NULL && !(json_is_number(th) && json_number_value(th) > 0)) {
        snprintf(err, errlen, "diag: 'threshold' must be a number above 0");
        return -EBADMSG;
    }
    r = job_for(v, run_id, round, &j);
    if (r < 0)
        return r;
    snprintf(key, sizeof(key), "%llu", (unsigned long long)conn);
    json_t *entry = json_pack("{s:f, s:O}", "at", now, "report", report);
    if (entry == NULL || json_object_set_new(j->reports, key, entry) < 0)
        return -ENOMEM;
    r = ensure_judge(j, report);
    if (r < 0 || j->judge == NULL)
        return r;
    size_t n = json_array_size(json_object_get(report, "ranks"));
    dl_diag_totals_t *t = calloc(n + 1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    /* Ranks without figures (no beats yet, or a worker that writes bare bytes) stay out. */
    size_t got = dl_diag_report_read(report, 0, t, NULL, n), k = 0;
    const json_t *list = json_object_get(report, "ranks");
    for (size_t i = 0; i < got; i++)
        if (json_object_get(json_array_get(list, i), "steps") != NULL)
            t[k++] = t[i];
    dl_diag_view_t view;
    r = dl_diag_judge_feed(j->judge, t, k);
    if (r == 0)
        r = dl_diag_judge_eval(j->judge, &view);
    free(t);
    if (r < 0)
        return r;
    json_decref(j->view);
    j->view = view.ranks > 0 ? dl_diag_view_json(&view) : NULL;
    return 0;
}

json_t *dl__jobview_view(dl__jobview_t *v, const char *run_id)
{
    job_t *j = job_of(v, run_id);
    return j != NULL && j->view != NULL ? json_incref(j->view) : NULL;
}

/* Every rank of every report, ages made current. */
static size_t all_ranks(const job_t *j, double now, dl_diag_rank_t **ret)
{
    size_t total = 0;
    const char *k;
    json_t *e;
    json_object_foreach (j->reports, k, e) {
        total += json_array_size(json_object_get(json_object_get(e, "report"), "ranks"));
    }
    if (total > EXPLAIN_RANKS_MAX)
        total = EXPLAIN_RANKS_MAX;
    dl_diag_rank_t *ranks = calloc(total + 1, sizeof(*ranks));
    if (ranks == NULL)
        return 0;
    size_t n = 0;
    json_object_foreach (j->reports, k, e) {
        double age = now - json_number_value(json_object_get(e, "at"));
        n += dl_diag_report_read(json_object_get(e, "report"), age > 0 ? age : 0, NULL, ranks + n,
                                 total - n);
    }
    *ret = ranks;
    return n;
}

size_t dl__jobview_explain(dl__jobview_t *v, const char *run_id, double now, double min_stuck,
                           char *buf, size_t len)
{
    job_t *j = job_of(v, run_id);
    dl_diag_rank_t *ranks = NULL;
    size_t n = j != NULL ? all_ranks(j, now, &ranks) : 0, w = 0;
    if (len > 0)
        buf[0] = '\0';
    /* Reports of nodes a heartbeat apart, of a job that moves, disagree by an operation or two:
     * only a rank stuck for a while makes the account worth reading. */
    if (n > 0 && dl_diag_stuck_s(ranks, n) >= min_stuck)
        w = dl_diag_explain(ranks, n, buf, len);
    free(ranks);
    return w;
}

size_t dl__jobview_policy_ranks(dl__jobview_t *v, const char *run_id, double now,
                                dl_rdzv_policy_rank_t **ret)
{
    job_t *j = job_of(v, run_id);
    dl_diag_rank_t *ranks = NULL;
    size_t n = j != NULL ? all_ranks(j, now, &ranks) : 0;
    dl_rdzv_policy_rank_t *out = n > 0 ? calloc(n, sizeof(*out)) : NULL;
    *ret = out;
    for (size_t i = 0; out != NULL && i < n; i++) {
        const dl_diag_rank_t *r = &ranks[i];
        const dl_diag_op_t *last = r->nops > 0 ? &r->ops[r->nops - 1] : NULL;
        out[i] = (dl_rdzv_policy_rank_t){
            .rank = r->rank,
            .node_rank = r->node_rank,
            .step = r->step > 0 ? (long long)r->step : -1,
            .known = r->recorder && last != NULL,
            .seq = last != NULL ? last->seq : 0,
            .inside = last != NULL &&
                      (last->state == DL_DIAG_OP_RUNNING || last->state == DL_DIAG_OP_QUEUED),
            .failed = last != NULL && last->state == DL_DIAG_OP_FAILED,
            .stopped = r->proc == 'T' || r->proc == 't',
        };
    }
    free(ranks);
    return out != NULL ? n : 0;
}

/* The report's ranks (rep borrowed) into out (room for them all) as a status shows them, each with
 * its node and the report's age; returns how many. A rank that cannot be read is left out. */
static size_t ranks_of(const json_t *rep, double age, dl_proto_status_rank_t *out)
{
    const json_t *node_rank = json_object_get(rep, "node_rank"), *r;
    const char *host = json_string_value(json_object_get(rep, "host"));
    char err[160];
    size_t i, n = 0;
    json_array_foreach (json_object_get(rep, "ranks"), i, r) {
        dl_proto_status_rank_t *x = &out[n];
        /* diag.h checked the report: what is read here is of the table's types. */
        if (dl_proto_rec_decode(&dl_proto_status_rank_type, r, x, "report", err, sizeof(err)) < 0)
            continue;
        x->node_rank = (long long)json_integer_value(node_rank);
        x->has_node_rank = json_is_integer(node_rank);
        free(x->host);
        x->host = host != NULL ? strdup(host) : NULL;
        x->report_age_s = age > 0 ? age : 0;
        x->has_report_age_s = true;
        n++;
    }
    return n;
}

int dl__jobview_status(dl__jobview_t *v, const char *run_id, bool ranks, double now,
                       dl_proto_status_job_t *st)
{
    job_t *j = job_of(v, run_id);
    char err[160];
    int r = 0;
    if (j == NULL)
        return 0;
    if (j->view != NULL && (st->diag = calloc(1, sizeof(*st->diag))) == NULL)
        return -ENOMEM;
    if (st->diag != NULL)
        r = dl_proto_rec_decode(&dl_proto_status_diag_type, j->view, st->diag, "view", err,
                                sizeof(err));
    if (r < 0 || !ranks)
        return r;
    char where[1024];
    if (dl__jobview_explain(v, run_id, now, STUCK_S, where, sizeof(where)) > 0 &&
        (st->where = strdup(where)) == NULL)
        return -ENOMEM;
    size_t total = 0;
    const char *k;
    json_t *e;
    json_object_foreach (j->reports, k, e) {
        total += json_array_size(json_object_get(json_object_get(e, "report"), "ranks"));
    }
    if ((st->ranks = calloc(total + 1, sizeof(*st->ranks))) == NULL)
        return -ENOMEM;
    st->has_ranks = true;
    json_object_foreach (j->reports, k, e) {
        double age = now - json_number_value(json_object_get(e, "at"));
        st->nranks += ranks_of(json_object_get(e, "report"), age, st->ranks + st->nranks);
    }
    return 0;
}

void dl__jobview_status_clear(dl_proto_status_job_t *st)
{
    dl_proto_rec_free(&dl_proto_status_diag_type, st->diag);
    free(st->diag);
    free(st->where);
    for (size_t i = 0; st->ranks != NULL && i < st->nranks; i++)
        dl_proto_rec_free(&dl_proto_status_rank_type, &st->ranks[i]);
    free(st->ranks);
    st->diag = NULL;
    st->where = NULL;
    st->ranks = NULL;
    st->nranks = 0;
    st->has_ranks = false;
}

void dl__jobview_drop_conn(dl__jobview_t *v, const char *run_id, uint64_t conn)
{
    job_t *j = v != NULL && run_id != NULL ? job_of(v, run_id) : NULL;
    char key[32];
    if (j == NULL)
        return;
    snprintf(key, sizeof(key), "%llu", (unsigned long long)conn);
    json_object_del(j->reports, key);
}
