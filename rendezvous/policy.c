/* The job's rules (rdzv-policy.h). */
#include <stdlib.h>
#include <string.h>

#include "rdzv-policy.h"

bool dl_rdzv_policy_is_failure(dl_rdzv_cause_t cause)
{
    return cause == DL_RDZV_CAUSE_WORKER_FAILED || cause == DL_RDZV_CAUSE_NODE_LOST;
}

bool dl_rdzv_policy_same_failure(const dl_rdzv_culprit_t *prev, const dl_rdzv_culprit_t *next)
{
    if (prev->rank < 0 || next->rank != prev->rank)
        return false;
    if (next->exit_code != prev->exit_code || next->signal != prev->signal ||
        next->hung != prev->hung || next->oom != prev->oom)
        return false;
    /* A worker that got further than last time may get further again after a restart. */
    return next->step < 0 || next->step <= prev->step;
}

/* Whether a is a better culprit than b: stopped first, then furthest behind, then lowest. */
static bool rather(const dl_rdzv_policy_rank_t *a, const dl_rdzv_policy_rank_t *b)
{
    if (a->stopped != b->stopped)
        return a->stopped;
    if (a->seq != b->seq)
        return a->seq < b->seq;
    return a->rank < b->rank;
}

int dl_rdzv_policy_waited_for(const dl_rdzv_policy_rank_t *v, size_t n, int failed_rank, bool hung)
{
    const dl_rdzv_policy_rank_t *f = NULL;
    for (size_t i = 0; i < n && f == NULL; i++)
        if (v[i].rank == failed_rank)
            f = &v[i];
    /* A rank that crashed inside a collective (its operation still running, no hang named)
     * failed of its own. */
    if (f == NULL || !f->known || f->stopped || !(f->failed || (hung && f->inside)))
        return -1;
    int best = -1;
    for (size_t i = 0; i < n; i++) {
        const dl_rdzv_policy_rank_t *r = &v[i];
        if (r == f || !r->known || !(r->seq < f->seq || r->stopped))
            continue;
        if (best < 0 || rather(r, &v[best]))
            best = (int)i;
    }
    return best;
}

bool dl_rdzv_policy_departure_goes_on(int left, int min_nodes)
{
    return left >= min_nodes;
}

bool dl_rdzv_policy_restart_left(int restarts, int max_restarts)
{
    return restarts < max_restarts;
}

bool dl_rdzv_policy_overspent(int restarts, int max_restarts)
{
    return restarts > max_restarts;
}

int dl_rdzv_policy_recovery_restarts_left(int restarts, int max_restarts, bool rendezvous_decides)
{
    int left = dl_rdzv_policy_restart_left(restarts, max_restarts) ? max_restarts - restarts : 0;
    return rendezvous_decides && left < 1 ? 1 : left;
}

dl_rdzv_budget_t dl_rdzv_policy_round_end(dl_rdzv_cause_t cause, int restarts, int max_restarts,
                                          int same, int max_same)
{
    if (!dl_rdzv_policy_is_failure(cause))
        return DL_RDZV_BUDGET_FREE;
    /* Another restart would fail alike: the budget is not spent on it. */
    if (max_same > 0 && same >= max_same)
        return DL_RDZV_BUDGET_SAME;
    return dl_rdzv_policy_restart_left(restarts, max_restarts) ? DL_RDZV_BUDGET_SPEND
                                                               : DL_RDZV_BUDGET_SPENT;
}

dl_rdzv_round_step_t dl_rdzv_policy_round_step(size_t joined, int min_nodes, int max_nodes,
                                               double last_call, bool last_call_over)
{
    if (joined >= (size_t)max_nodes)
        return DL_RDZV_ROUND_CLOSE;
    if (joined < (size_t)min_nodes)
        return DL_RDZV_ROUND_GATHER;
    return last_call <= 0 || last_call_over ? DL_RDZV_ROUND_CLOSE : DL_RDZV_ROUND_LAST_CALL;
}

/* Known before unknown (< 0), then ascending. */
static int cmp_known(int a, int b)
{
    if (a == b)
        return 0;
    if (a < 0)
        return 1;
    if (b < 0)
        return -1;
    return a < b ? -1 : 1;
}

static int node_cmp(const void *pa, const void *pb)
{
    const dl_rdzv_policy_node_t *a = *(dl_rdzv_policy_node_t *const *)pa;
    const dl_rdzv_policy_node_t *b = *(dl_rdzv_policy_node_t *const *)pb;
    int c = cmp_known(a->slurm_node_id, b->slurm_node_id);
    if (c == 0)
        c = cmp_known(a->hint, b->hint);
    if (c == 0)
        c = strcmp(a->host, b->host);
    return c != 0 ? c : strcmp(a->id, b->id);
}

void dl_rdzv_policy_node_ranks(dl_rdzv_policy_node_t **v, size_t n, bool *taken)
{
    qsort(v, n, sizeof(*v), node_cmp);
    memset(taken, 0, n * sizeof(*taken));
    for (size_t i = 0; i < n; i++) {
        int h = v[i]->hint;
        v[i]->node_rank = -1;
        if (h >= 0 && (size_t)h < n && !taken[h]) {
            v[i]->node_rank = h;
            taken[h] = true;
        }
    }
    size_t next = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i]->node_rank >= 0)
            continue;
        while (taken[next])
            next++;
        v[i]->node_rank = (int)next;
        taken[next] = true;
    }
    /* The ranks are a permutation of 0..n-1: cycle each node to its slot. */
    for (size_t i = 0; i < n; i++) {
        while ((size_t)v[i]->node_rank != i) {
            size_t j = (size_t)v[i]->node_rank;
            dl_rdzv_policy_node_t *t = v[j];
            v[j] = v[i];
            v[i] = t;
        }
    }
}
