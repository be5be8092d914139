/* What the nodes of an etcd job report beside the rendezvous (PREFIX n/NODE_ID: etcd-job.h),
 * and the status made of it with the state: the same fields as our own rendezvous' status, by
 * the same rules (rendezvous.h, dl_rdzv_beats_status), for `dlaunch status` and an agent's
 * status page alike (docs/etcd.md, "Control"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd-job.h"
#include "etcd.h"
#include "rdzv-codec.h"
#include "rdzv-policy.h"
#include "rendezvous.h"

int dl_ejob_put_report(const dl_ejob_view_t *v, const char *node_id, const json_t *beat,
                       const dl_ejob_store_rec_t *store, double now, int64_t lease, json_t **ret)
{
    dl_ejob_report_rec_t rep;
    char err[256];
    int r = dl_proto_rec_decode(&dl_ejob_report_type, beat, &rep, "heartbeat", err, sizeof(err));
    if (r < 0)
        return r;
    rep.time = now;
    rep.store = (dl_ejob_store_rec_t *)store; /* borrowed: given back before the free */
    char *text = dl_ejob_rec_text(&dl_ejob_report_type, &rep);
    rep.store = NULL;
    dl_proto_rec_free(&dl_ejob_report_type, &rep);
    if (text == NULL)
        return -ENOMEM;
    size_t len = strlen(text);
    if (len > DL_EJOB_REPORT_MAX) {
        free(text);
        return -EMSGSIZE;
    }
    json_t *body = json_pack("{s:o, s:o, s:o}", "key", dl__ejob_key(v->prefix, "n/%s", node_id),
                             "value", dl_etcd_b64(text, len), "lease", dl_etcd_num(lease));
    free(text);
    if (body == NULL)
        return -ENOMEM;
    *ret = body;
    return 0;
}

json_t *dl_ejob_report_beat(const dl_ejob_report_rec_t *rep)
{
    return dl_proto_rec_encode(&dl_ejob_report_type, rep);
}

/* {"beat", "age_s"}, as the rendezvous' readers of heartbeats take them (rendezvous.h), appended
 * to beats: age by this clock against the writer's (never below 0). */
static void add_beat(json_t *beats, const dl_ejob_report_rec_t *rep, double now)
{
    double age = now - rep->time;
    json_array_append_new(beats, json_pack("{s:o, s:f}", "beat", dl_ejob_report_beat(rep), "age_s",
                                           age > 0 ? age : 0.0));
}

json_t *dl_ejob_txn_report(const dl_ejob_view_t *v, json_t *put)
{
    if (put == NULL)
        return NULL;
    return json_pack("{s:[{s:o}, {s:{s:o}}]}", "success", "request_put", put, "request_range",
                     "key", dl__ejob_key(v->prefix, "verdict"));
}

json_t *dl_ejob_verdict_of(const dl_etcd_txn_t *answer, int round)
{
    dl_ejob_verdict_rec_t verdict;
    char err[256];
    json_t *view = NULL;
    /* A verdict that is none is no verdict: the round goes on without one, as without a put. */
    if (dl_ejob_txn_rec(answer, 1, &dl_ejob_verdict_type, &verdict, err, sizeof(err)) > 0) {
        if (verdict.round == round)
            view = json_incref(verdict.view);
        dl_proto_rec_free(&dl_ejob_verdict_type, &verdict);
    }
    return view;
}

json_t *dl_ejob_put_verdict(const dl_ejob_view_t *v, int round, const json_t *view, int64_t lease)
{
    dl_ejob_verdict_rec_t verdict = {.round = round, .view = (json_t *)view};
    char *text = dl_ejob_rec_text(&dl_ejob_verdict_type, &verdict);
    if (text == NULL)
        return NULL;
    json_t *body = json_pack("{s:o, s:o, s:o}", "key", dl__ejob_key(v->prefix, "verdict"), "value",
                             dl_etcd_b64_str(text), "lease", dl_etcd_num(lease));
    free(text);
    return body;
}

json_t *dl_ejob_range_reports(const dl_ejob_view_t *v)
{
    return json_pack("{s:o, s:o}", "key", dl__ejob_key(v->prefix, "n/"), "range_end",
                     dl__ejob_range_end(v->prefix, "n/"));
}

int dl_ejob_view_reports(dl_ejob_view_t *v, const dl_etcd_range_t *range)
{
    dl_ejob_table_clear(&v->reports);
    return dl_ejob_view_merge(v, range);
}

int dl_ejob_status_rec(const dl_ejob_view_t *v, const char *run_id, bool ranks, double now,
                       dl_proto_status_job_t *st, char *err, size_t errlen)
{
    int r = dl_ejob_status_base(v, run_id, st);
    if (r < 0) {
        snprintf(err, errlen, "etcd job status: out of memory");
        return r;
    }
    json_t *beats = json_array();
    int round = dl_ejob_round(v);
    if (beats == NULL)
        return -ENOMEM;
    /* The running round's nodes' reports; node 0's carries the store's figures. */
    for (size_t i = 0; i < v->reports.n; i++) {
        const dl_ejob_report_rec_t *rep = v->reports.items[i].rec;
        if (rep->round != round)
            continue;
        add_beat(beats, rep, now);
        const dl_ejob_assign_rec_t *a = dl_ejob_assigned(v, v->reports.items[i].key);
        const dl_ejob_store_rec_t *store = rep->store;
        if (a == NULL || a->node_rank != 0 || store == NULL)
            continue;
        st->keys = store->keys;
        st->has_keys = store->has_keys;
        st->store_bytes = store->store_bytes;
        st->has_store_bytes = store->has_store_bytes;
        st->store_waits = store->store_waits;
        st->has_store_waits = store->has_store_waits;
        st->store_clients = store->store_clients;
        st->has_store_clients = store->has_store_clients;
    }
    r = dl_rdzv_beats_status(run_id, beats, ranks, st);
    json_decref(beats);
    /* The job-wide figures and stragglers as the rule has them over the round (node 0's
     * verdict), where one reading of the reports has no windows to weigh. One that is not
     * such a view is left out. */
    const json_t *verdict = v->verdict != NULL ? v->verdict->view : NULL;
    dl_proto_status_diag_t *diag = calloc(1, sizeof(*diag));
    if (r == 0 && verdict != NULL && v->verdict->round == round && diag != NULL &&
        dl_proto_rec_decode(&dl_proto_status_diag_type, verdict, diag, "verdict", err, errlen) ==
            0) {
        dl_proto_rec_free(&dl_proto_status_diag_type, st->diag);
        free(st->diag);
        st->diag = diag;
        diag = NULL;
    }
    free(diag);
    /* A node's heartbeat is its report: its age by the reader's clock against the writer's
     * (never below 0), as a server's is the time since the node's last message. */
    for (size_t i = 0; i < st->nnodes; i++) {
        const dl_ejob_report_rec_t *rep = dl_ejob_table_get(&v->reports, st->nodes[i].node_id);
        if (rep == NULL || rep->round != round)
            continue;
        double age = now - rep->time;
        st->nodes[i].heartbeat_age = age > 0 ? age : 0;
    }
    return r;
}

json_t *dl_ejob_status_full(const dl_ejob_view_t *v, const char *run_id, bool ranks, double now)
{
    dl_proto_status_job_t st;
    char err[256];
    json_t *o = NULL;
    if (dl_ejob_status_rec(v, run_id, ranks, now, &st, err, sizeof(err)) == 0)
        o = dl_proto_rec_encode(&dl_proto_status_job_type, &st);
    dl_proto_rec_free(&dl_proto_status_job_type, &st);
    return o;
}

int dl_ejob_last_failure(const dl_ejob_view_t *v, dl_proto_status_failure_t *f)
{
    dl_rdzv_culprit_t c;
    memset(f, 0, sizeof(*f));
    if (v->state == NULL)
        return 0;
    dl_rdzv_dec_culprit(v->state->culprit, &c);
    if (c.cause == NULL || strcmp(c.cause, "worker_failed") != 0 || c.rank < 0)
        return 0;
    /* When: the round change's event (the state's time is its last change, a close maybe). */
    char key[DL_EJOB_MAX_PREFIX + 32];
    snprintf(key, sizeof(key), "%sev/%08d-0", v->prefix, dl_ejob_round(v));
    const json_t *changed = json_object_get(v->events, key);
    f->time =
        changed != NULL ? json_number_value(json_object_get(changed, "time")) : v->state->time;
    f->round = dl_ejob_round(v) > 0 ? dl_ejob_round(v) - 1 : 0;
    f->has_round = true;
    f->rank = c.rank;
    f->has_rank = true;
    if (c.signal > 0) {
        f->signal = c.signal;
        f->has_signal = true;
    } else {
        f->exit_code = c.exit_code >= 0 ? c.exit_code : 0;
        f->has_exit_code = true;
    }
    if ((c.host != NULL && (f->peer = strdup(c.host)) == NULL) ||
        (v->state->reason != NULL && (f->reason = strdup(v->state->reason)) == NULL)) {
        free(f->peer);
        free(f->reason);
        memset(f, 0, sizeof(*f));
        return -ENOMEM;
    }
    return 1;
}

/* The failing node's report as its failure brings it, the others' latest of that round, as
 * our server has them when a failure comes: {"beat", "age_s"} each. */
static json_t *failure_beats(const dl_ejob_view_t *v, const char *node_id, int round,
                             const json_t *diag, double now)
{
    json_t *beats = json_array();
    if (beats == NULL)
        return NULL;
    if (diag != NULL)
        json_array_append_new(beats, json_pack("{s:{s:i, s:O}, s:f}", "beat", "round", round,
                                               "diag", diag, "age_s", 0.0));
    for (size_t i = 0; i < v->reports.n; i++) {
        const dl_ejob_report_rec_t *rep = v->reports.items[i].rec;
        if (strcmp(v->reports.items[i].key, node_id) != 0 && rep->round == round)
            add_beat(beats, rep, now);
    }
    return beats;
}

size_t dl_ejob_explain(const dl_ejob_view_t *v, const char *run_id, const char *node_id, int round,
                       const json_t *diag, double now, char *buf, size_t len)
{
    if (len > 0)
        buf[0] = '\0';
    json_t *beats = failure_beats(v, node_id, round, diag, now);
    if (beats == NULL)
        return 0;
    size_t w = dl_rdzv_beats_explain(run_id, beats, buf, len);
    json_decref(beats);
    return w;
}

static int report_node_rank(const json_t *diag)
{
    const json_t *nr = json_object_get(diag, "node_rank");
    return json_is_integer(nr) ? (int)json_integer_value(nr) : -1;
}

int dl_ejob_waited_for(const dl_ejob_view_t *v, const char *run_id, const char *node_id, int round,
                       const json_t *diag, double now, int failed_rank, bool hung,
                       dl_ejob_waited_t *out)
{
    json_t *beats = failure_beats(v, node_id, round, diag, now);
    dl_rdzv_policy_rank_t *ranks = NULL;
    size_t n = beats != NULL ? dl_rdzv_beats_policy_ranks(run_id, beats, &ranks) : 0;
    json_decref(beats);
    int w = dl_rdzv_policy_waited_for(ranks, n, failed_rank, hung);
    if (w < 0) {
        free(ranks);
        return -ENOENT;
    }
    *out = (dl_ejob_waited_t){
        .node_rank = ranks[w].node_rank, .rank = ranks[w].rank, .step = ranks[w].step};
    free(ranks);
    /* Its node: this one, or the one whose report of the round has its node rank. */
    if (report_node_rank(diag) == out->node_rank) {
        out->node = node_id;
        out->host = json_string_value(json_object_get(diag, "host"));
        return 0;
    }
    for (size_t i = 0; i < v->reports.n; i++) {
        const char *id = v->reports.items[i].key;
        const dl_ejob_report_rec_t *rep = v->reports.items[i].rec;
        const json_t *d = rep->diag;
        if (strcmp(id, node_id) == 0 || rep->round != round ||
            report_node_rank(d) != out->node_rank)
            continue;
        out->node = id;
        out->host = json_string_value(json_object_get(d, "host"));
        return 0;
    }
    return -ENOENT;
}
