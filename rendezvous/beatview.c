/* A status's account of a job's ranks made from its nodes' latest heartbeats (rendezvous.h,
 * dl_rdzv_beats_status): for a rendezvous kept elsewhere (etcd), where each agent publishes the
 * heartbeat it would have sent a server. The server's own pieces do the work (jobview.c for the
 * diagnostics, stats.c for the in-job recoveries), so that both backends say the same. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"
#include "jobview.h"
#include "rdzv-codec.h"
#include "rendezvous.h"
#include "stats.h"

/* Entry i of beats: its heartbeat as the server would read it, and its age (seconds, not
 * negative). */
static double beat_at(const json_t *beats, size_t i, dl_rdzv_beat_msg_t *b)
{
    const json_t *e = json_array_get(beats, i);
    double age = dl_proto_get_num(e, "age_s", 0);
    dl_rdzv_dec_heartbeat(json_object_get(e, "beat"), b);
    return age > 0 ? age : 0;
}

/* Feeds the beats' reports to view (time: their ages before 0). */
static void feed(dl__jobview_t *view, const char *run_id, const json_t *beats)
{
    char err[256];
    for (size_t i = 0; i < json_array_size(beats); i++) {
        dl_rdzv_beat_msg_t b;
        double age = beat_at(beats, i, &b);
        /* A report of an older round than one fed before is stale (-ESTALE), as with a server;
         * a bad one is its sender's problem: either way the others still count. */
        if (b.diag != NULL)
            (void)dl__jobview_report(view, run_id, b.round, (uint64_t)i + 1, b.diag, -age, err,
                                     sizeof(err));
    }
}

size_t dl_rdzv_beats_explain(const char *run_id, const json_t *beats, char *buf, size_t len)
{
    dl__jobview_t *view = NULL;
    if (len > 0)
        buf[0] = '\0';
    if (dl__jobview_new(&view) < 0)
        return 0;
    feed(view, run_id, beats);
    /* As the server explains a failure: whatever the ranks' stuck time (min_stuck 0). */
    size_t w = dl__jobview_explain(view, run_id, 0, 0, buf, len);
    dl__jobview_free(view);
    return w;
}

size_t dl_rdzv_beats_policy_ranks(const char *run_id, const json_t *beats,
                                  struct dl_rdzv_policy_rank_s **ret)
{
    dl__jobview_t *view = NULL;
    *ret = NULL;
    if (dl__jobview_new(&view) < 0)
        return 0;
    feed(view, run_id, beats);
    size_t n = dl__jobview_policy_ranks(view, run_id, 0, ret);
    dl__jobview_free(view);
    return n;
}

int dl_rdzv_beats_status(const char *run_id, const json_t *beats, bool ranks,
                         dl_proto_status_job_t *st)
{
    dl__jobview_t *view = NULL;
    dl__rdzv_stats_t stats;
    dl_proto_status_recovery_t rec;

    if (dl__jobview_new(&view) < 0)
        return -ENOMEM;
    if (dl__rdzv_stats_init(&stats, 0) < 0) {
        dl__jobview_free(view);
        return -ENOMEM;
    }
    dl__rdzv_stats_join(&stats, run_id, 0);
    /* Time is the reports' ages: each was made age_s before "now", 0. */
    feed(view, run_id, beats);
    for (size_t i = 0; i < json_array_size(beats); i++) {
        dl_rdzv_beat_msg_t b;
        beat_at(beats, i, &b);
        if (b.recovery != NULL)
            dl__rdzv_stats_recovery(&stats, run_id, b.recovery);
    }
    int r = dl__jobview_status(view, run_id, ranks, 0, st);
    if (r == 0 && dl__rdzv_stats_recovery_get(&stats, run_id, &rec)) {
        st->recovery = malloc(sizeof(*st->recovery));
        if (st->recovery != NULL)
            *st->recovery = rec;
        else
            r = -ENOMEM;
    }
    dl__rdzv_stats_free(&stats);
    dl__jobview_free(view);
    return r;
}

/* A node the judge has heard, by the number the view knows it by (its "connection"). */
typedef struct {
    dl__rdzv_hnode_t node;
    char *id;
    uint64_t n;
} node_t;

struct dl_rdzv_judge_s {
    dl__jobview_t *view;
    char *run_id;
    uint64_t hash_key[2];
    dl__rdzv_map_t nodes;
};

int dl_rdzv_judge_new(const char *run_id, dl_rdzv_judge_t **ret)
{
    dl_rdzv_judge_t *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->run_id = strdup(run_id)) == NULL || dl__jobview_new(&j->view) < 0) {
        dl_rdzv_judge_free(j);
        return -ENOMEM;
    }
    /* Node ids are the agents': a key of our own keeps them from choosing the chains. */
    if (dl_proto_random(j->hash_key, sizeof(j->hash_key)) < 0)
        j->hash_key[0] = (uint64_t)(uintptr_t)j;
    *ret = j;
    return 0;
}

void dl_rdzv_judge_free(dl_rdzv_judge_t *j)
{
    if (j == NULL)
        return;
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&j->nodes);
    while (n != NULL) {
        node_t *x = dl__rdzv_container_of(n, node_t, node);
        n = n->next;
        free(x->id);
        free(x);
    }
    dl__rdzv_map_free(&j->nodes);
    dl__jobview_free(j->view);
    free(j->run_id);
    free(j);
}

/* The node's number, given in the order the nodes are first heard (from 1); 0: no memory. */
static uint64_t node_number(dl_rdzv_judge_t *j, const char *node_id)
{
    uint64_t h = dl__rdzv_hash(j->hash_key, node_id, strlen(node_id));
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&j->nodes, h); n != NULL; n = n->next) {
        node_t *x = dl__rdzv_container_of(n, node_t, node);
        if (n->hash == h && strcmp(x->id, node_id) == 0)
            return x->n;
    }
    node_t *x = calloc(1, sizeof(*x));
    if (x == NULL || (x->id = strdup(node_id)) == NULL || dl__rdzv_map_reserve(&j->nodes, 1) < 0) {
        if (x != NULL)
            free(x->id);
        free(x);
        return 0;
    }
    x->n = j->nodes.count + 1;
    dl__rdzv_map_insert(&j->nodes, &x->node, h);
    return x->n;
}

int dl_rdzv_judge_feed(dl_rdzv_judge_t *j, const char *node_id, const json_t *beat, double age_s,
                       char *err, size_t errlen)
{
    dl_rdzv_beat_msg_t b;
    dl_rdzv_dec_heartbeat(beat, &b);
    if (b.diag == NULL)
        return 0;
    uint64_t n = node_number(j, node_id);
    if (n == 0)
        return -ENOMEM;
    /* Time is the reports' ages, as in dl_rdzv_beats_status: the rule weighs steps alone. */
    return dl__jobview_report(j->view, j->run_id, b.round, n, b.diag, age_s > 0 ? -age_s : 0, err,
                              errlen);
}

json_t *dl_rdzv_judge_view(dl_rdzv_judge_t *j)
{
    return dl__jobview_view(j->view, j->run_id);
}
