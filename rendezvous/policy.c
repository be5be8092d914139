/* The job's restart budget (rdzv-policy.h). */
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
