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

#include "core-internal.h"
#include "diag.h"
#include "jobview.h"
#include "node-report.h"
#include "proto.h"
#include "rdzv-policy.h"
#include "rdzv-report.h"

#define EXPLAIN_RANKS_MAX 65536
#define STUCK_S                                                                                    \
    1.0 /* status shows where the ranks are once one is inside an operation this long  \
                     */

/* A connection's latest report, decoded once when it came. */
typedef struct {
    uint64_t conn;
    double at; /* when it came */
    dl_proto_node_report_t rep;
} entry_t;

typedef struct {
    dl__rdzv_hnode_t node;
    char *run_id;
    int round;
    dl_diag_judge_t *judge; /* NULL until a report brings the rule's settings */
    entry_t *reports;       /* in the order they first came */
    size_t nreports, cap;
    bool has_view; /* the judge's last evaluation had figures */
} job_t;

struct dl__jobview_s {
    uint64_t hash_key[2];
    dl__rdzv_map_t jobs; /* run id -> job_t */
};

int dl__jobview_new(dl__jobview_t **ret)
{
    dl__jobview_t *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    /* Run ids are the clients': a key of our own keeps them from choosing the chains. */
    if (dl_proto_random(v->hash_key, sizeof(v->hash_key)) < 0) {
        v->hash_key[0] = (uint64_t)(uintptr_t)v;
        v->hash_key[1] = 0x9e3779b97f4a7c15ull;
    }
    *ret = v;
    return 0;
}

static void clear_reports(job_t *j)
{
    for (size_t i = 0; i < j->nreports; i++)
        dl_proto_rec_free(&dl_proto_node_report_type, &j->reports[i].rep);
    j->nreports = 0;
}

static void job_free(job_t *j)
{
    if (j == NULL)
        return;
    dl_diag_judge_free(j->judge);
    clear_reports(j);
    free(j->reports);
    free(j->run_id);
    free(j);
}

static uint64_t hash_of(const dl__jobview_t *v, const char *run_id)
{
    return dl__rdzv_hash(v->hash_key, run_id, strlen(run_id));
}

static job_t *job_of(const dl__jobview_t *v, const char *run_id)
{
    uint64_t h = hash_of(v, run_id);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&v->jobs, h); n != NULL; n = n->next) {
        job_t *j = dl__rdzv_container_of(n, job_t, node);
        if (n->hash == h && strcmp(j->run_id, run_id) == 0)
            return j;
    }
    return NULL;
}

void dl__jobview_forget(dl__jobview_t *v, const char *run_id)
{
    job_t *j = v != NULL && run_id != NULL ? job_of(v, run_id) : NULL;
    if (j == NULL)
        return;
    dl__rdzv_map_remove(&v->jobs, &j->node);
    job_free(j);
}

void dl__jobview_free(dl__jobview_t *v)
{
    if (v == NULL)
        return;
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&v->jobs);
    while (n != NULL) {
        dl__rdzv_hnode_t *next = n->next;
        job_free(dl__rdzv_container_of(n, job_t, node));
        n = next;
    }
    dl__rdzv_map_free(&v->jobs);
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
        clear_reports(j);
        j->has_view = false;
        if (j->judge != NULL)
            dl_diag_judge_reset(j->judge);
    }
    if (j == NULL) {
        j = calloc(1, sizeof(*j));
        if (j == NULL || (j->run_id = strdup(run_id)) == NULL ||
            dl__rdzv_map_reserve(&v->jobs, 1) < 0) {
            job_free(j);
            return -ENOMEM;
        }
        j->round = round;
        dl__rdzv_map_insert(&v->jobs, &j->node, hash_of(v, run_id));
    }
    *ret = j;
    return 0;
}

/* The rule's settings come with the reports (from the agents' job spec); the first ones hold. */
static int ensure_judge(job_t *j, const dl_proto_node_report_t *rep)
{
    if (j->judge != NULL || !rep->has_threshold)
        return 0;
    dl_diag_straggler_opts_t o;
    dl_diag_straggler_opts_init(&o);
    o.threshold = rep->threshold;
    if (rep->has_window && rep->window > 0)
        o.window = (uint64_t)rep->window;
    int r = dl_diag_judge_new(&o, &j->judge);
    return r == -EINVAL ? 0 : r; /* nonsense settings: no rule, still a view */
}

/* Keeps rep (taken) as conn's report, in the place of its last one. Returns where, or NULL (no
 * memory; rep freed). */
static const dl_proto_node_report_t *keep_report(job_t *j, uint64_t conn, double now,
                                                 dl_proto_node_report_t *rep)
{
    entry_t *e = NULL;
    for (size_t i = 0; i < j->nreports && e == NULL; i++)
        if (j->reports[i].conn == conn)
            e = &j->reports[i];
    if (e != NULL) {
        dl_proto_rec_free(&dl_proto_node_report_type, &e->rep);
    } else {
        if (j->nreports == j->cap) {
            size_t cap = j->cap == 0 ? 4 : j->cap * 2;
            entry_t *x = realloc(j->reports, cap * sizeof(*x));
            if (x == NULL) {
                dl_proto_rec_free(&dl_proto_node_report_type, rep);
                return NULL;
            }
            j->reports = x;
            j->cap = cap;
        }
        e = &j->reports[j->nreports++];
    }
    *e = (entry_t){.conn = conn, .at = now, .rep = *rep};
    memset(rep, 0, sizeof(*rep));
    return &e->rep;
}

int dl__jobview_report(dl__jobview_t *v, const char *run_id, int round, uint64_t conn,
                       const json_t *report, double now, char *err, size_t errlen)
{
    dl_proto_node_report_t rep;
    job_t *j;
    int r = dl_proto_node_report_decode(report, &rep, err, errlen);
    if (r < 0)
        return r;
    if ((r = job_for(v, run_id, round, &j)) < 0) {
        dl_proto_rec_free(&dl_proto_node_report_type, &rep);
        return r;
    }
    const dl_proto_node_report_t *kept = keep_report(j, conn, now, &rep);
    if (kept == NULL)
        return -ENOMEM;
    r = ensure_judge(j, kept);
    if (r < 0 || j->judge == NULL)
        return r;
    dl_diag_totals_t *t = calloc(kept->nranks + 1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    /* Ranks without figures (no beats yet, or a worker that writes bare bytes) stay out. */
    size_t k = 0;
    for (size_t i = 0; i < kept->nranks; i++)
        k += dl_rdzv_report_totals(kept, i, &t[k]);
    dl_diag_view_t view;
    r = dl_diag_judge_feed(j->judge, t, k);
    if (r == 0)
        r = dl_diag_judge_eval(j->judge, &view);
    free(t);
    if (r < 0)
        return r;
    j->has_view = view.ranks > 0;
    return 0;
}

/* The judge's last view as the wire's, into d. */
static int view_of(const job_t *j, dl_proto_status_diag_t *d)
{
    dl_diag_view_t v;
    dl_diag_judge_view(j->judge, &v);
    return dl_rdzv_report_view(&v, d);
}

json_t *dl__jobview_view(dl__jobview_t *v, const char *run_id)
{
    job_t *j = job_of(v, run_id);
    dl_proto_status_diag_t d;
    if (j == NULL || !j->has_view)
        return NULL;
    json_t *o = view_of(j, &d) == 0 ? dl_proto_rec_encode(&dl_proto_status_diag_type, &d) : NULL;
    dl_proto_rec_free(&dl_proto_status_diag_type, &d);
    return o;
}

/* Every rank of every report, ages made current. */
static size_t all_ranks(const job_t *j, double now, dl_diag_rank_t **ret)
{
    size_t total = 0;
    for (size_t i = 0; i < j->nreports; i++)
        total += j->reports[i].rep.nranks;
    if (total > EXPLAIN_RANKS_MAX)
        total = EXPLAIN_RANKS_MAX;
    dl_diag_rank_t *ranks = calloc(total + 1, sizeof(*ranks));
    if (ranks == NULL)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < j->nreports; i++) {
        const entry_t *e = &j->reports[i];
        double age = now - e->at;
        for (size_t k = 0; k < e->rep.nranks && n < total; k++)
            dl_rdzv_report_rank(&e->rep, k, age > 0 ? age : 0, &ranks[n++]);
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

/* A copy of src into dst that dst owns. Returns 0 or -ENOMEM (dst then holds what was made). */
static int rank_copy(dl_proto_status_rank_t *dst, const dl_proto_status_rank_t *src)
{
    *dst = *src;
    dst->proc = NULL;
    dst->host = NULL;
    dst->ops = NULL;
    dst->nops = 0;
    if (src->proc != NULL && (dst->proc = strdup(src->proc)) == NULL)
        return -ENOMEM;
    if (src->nops > 0 && (dst->ops = calloc(src->nops, sizeof(*dst->ops))) == NULL)
        return -ENOMEM;
    for (size_t k = 0; k < src->nops; k++) {
        const dl_proto_status_op_t *o = &src->ops[k];
        dl_proto_status_op_t *x = &dst->ops[dst->nops++];
        *x = (dl_proto_status_op_t){
            .seq = o->seq, .bytes = o->bytes, .age_s = o->age_s, .has_age_s = o->has_age_s};
        if ((o->op != NULL && (x->op = strdup(o->op)) == NULL) ||
            (o->state != NULL && (x->state = strdup(o->state)) == NULL) ||
            (o->algo != NULL && (x->algo = strdup(o->algo)) == NULL) ||
            (o->transport != NULL && (x->transport = strdup(o->transport)) == NULL))
            return -ENOMEM;
    }
    return 0;
}

int dl__jobview_status(dl__jobview_t *v, const char *run_id, bool ranks, double now,
                       dl_proto_status_job_t *st)
{
    job_t *j = job_of(v, run_id);
    if (j == NULL)
        return 0;
    if (j->has_view) {
        if ((st->diag = calloc(1, sizeof(*st->diag))) == NULL)
            return -ENOMEM;
        if (view_of(j, st->diag) < 0)
            return -ENOMEM;
    }
    if (!ranks)
        return 0;
    char where[1024];
    if (dl__jobview_explain(v, run_id, now, STUCK_S, where, sizeof(where)) > 0 &&
        (st->where = strdup(where)) == NULL)
        return -ENOMEM;
    size_t total = 0;
    for (size_t i = 0; i < j->nreports; i++)
        total += j->reports[i].rep.nranks;
    if ((st->ranks = calloc(total + 1, sizeof(*st->ranks))) == NULL)
        return -ENOMEM;
    st->has_ranks = true;
    for (size_t i = 0; i < j->nreports; i++) {
        const entry_t *e = &j->reports[i];
        double age = now - e->at;
        for (size_t k = 0; k < e->rep.nranks; k++) {
            dl_proto_status_rank_t *x = &st->ranks[st->nranks++];
            if (rank_copy(x, &e->rep.ranks[k]) < 0 ||
                (e->rep.host != NULL && (x->host = strdup(e->rep.host)) == NULL))
                return -ENOMEM;
            x->node_rank = e->rep.node_rank;
            x->has_node_rank = e->rep.has_node_rank;
            x->report_age_s = age > 0 ? age : 0;
            x->has_report_age_s = true;
        }
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
    for (size_t i = 0; j != NULL && i < j->nreports; i++)
        if (j->reports[i].conn == conn) {
            dl_proto_rec_free(&dl_proto_node_report_type, &j->reports[i].rep);
            memmove(&j->reports[i], &j->reports[i + 1],
                    (j->nreports - i - 1) * sizeof(j->reports[0]));
            j->nreports--;
            return;
        }
}
