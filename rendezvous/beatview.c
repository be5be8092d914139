/* A status's account of a job's ranks made from its nodes' latest heartbeats (rendezvous.h,
 * dl_rdzv_beats_status): for a rendezvous kept elsewhere (etcd), where each agent publishes the
 * heartbeat it would have sent a server. The server's own pieces do the work (jobview.c for the
 * diagnostics, stats.c for the in-job recoveries), so that both backends say the same. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "jobview.h"
#include "rendezvous.h"
#include "stats.h"

/* Feeds the beats' reports to view (time: their ages before 0). */
static void feed(dl__jobview_t *view, const char *run_id, const json_t *beats)
{
    char err[256];
    size_t i;
    const json_t *e;
    json_array_foreach (beats, i, e) {
        const json_t *beat = json_object_get(e, "beat"), *rep = json_object_get(beat, "diag");
        double age = json_number_value(json_object_get(e, "age_s"));
        json_int_t round = json_integer_value(json_object_get(beat, "round"));
        /* A report of an older round than one fed before is stale (-ESTALE), as with a server;
         * a bad one is its sender's problem: either way the others still count. */
        if (rep != NULL)
            (void)dl__jobview_report(view, run_id, (int)round, (uint64_t)i + 1, rep,
                                     age > 0 ? -age : 0, err, sizeof(err));
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
    size_t i;
    const json_t *e;

    if (dl__jobview_new(&view) < 0)
        return -ENOMEM;
    if (dl__rdzv_stats_init(&stats, 0) < 0) {
        dl__jobview_free(view);
        return -ENOMEM;
    }
    dl__rdzv_stats_join(&stats, run_id, 0);
    /* Time is the reports' ages: each was made age_s before "now", 0. */
    feed(view, run_id, beats);
    json_array_foreach (beats, i, e) {
        const json_t *r = json_object_get(json_object_get(e, "beat"), "recovery");
        if (r != NULL)
            dl__rdzv_stats_recovery(&stats, run_id, r);
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

struct dl_rdzv_judge_s {
    dl__jobview_t *view;
    char *run_id;
    json_t *nodes; /* node id -> its number, the "connection" the view knows it by */
};

int dl_rdzv_judge_new(const char *run_id, dl_rdzv_judge_t **ret)
{
    dl_rdzv_judge_t *j = calloc(1, sizeof(*j));
    if (j == NULL || (j->run_id = strdup(run_id)) == NULL || (j->nodes = json_object()) == NULL ||
        dl__jobview_new(&j->view) < 0) {
        dl_rdzv_judge_free(j);
        return -ENOMEM;
    }
    *ret = j;
    return 0;
}

void dl_rdzv_judge_free(dl_rdzv_judge_t *j)
{
    if (j == NULL)
        return;
    dl__jobview_free(j->view);
    json_decref(j->nodes);
    free(j->run_id);
    free(j);
}

int dl_rdzv_judge_feed(dl_rdzv_judge_t *j, const char *node_id, const json_t *beat, double age_s,
                       char *err, size_t errlen)
{
    const json_t *rep = json_object_get(beat, "diag");
    if (rep == NULL)
        return 0;
    const json_t *num = json_object_get(j->nodes, node_id);
    json_int_t n =
        json_is_integer(num) ? json_integer_value(num) : (json_int_t)json_object_size(j->nodes) + 1;
    if (num == NULL && json_object_set_new(j->nodes, node_id, json_integer(n)) < 0)
        return -ENOMEM;
    /* Time is the reports' ages, as in dl_rdzv_beats_status: the rule weighs steps alone. */
    return dl__jobview_report(j->view, j->run_id,
                              (int)json_integer_value(json_object_get(beat, "round")), (uint64_t)n,
                              rep, age_s > 0 ? -age_s : 0, err, errlen);
}

json_t *dl_rdzv_judge_view(dl_rdzv_judge_t *j)
{
    return dl__jobview_view(j->view, j->run_id);
}
