/* The restart budget's one policy (rdzv-policy.h): what ending a round costs, for every cause,
 * at the edges of the budget and of the same-failure limit. */
#include <stdlib.h>

#include "dl-test.h"
#include "rdzv-policy.h"

DL_TEST(only_failures_spend_a_restart)
{
    ck_assert(dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_WORKER_FAILED));
    ck_assert(dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_NODE_LOST));
    ck_assert(!dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_NODE_JOINED));
    ck_assert(!dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_REQUESTED));
    ck_assert(!dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_NODE_LEFT));
    ck_assert(!dl_rdzv_policy_is_failure(DL_RDZV_CAUSE_COUNT)); /* no cause: a straggler */
    for (int c = 0; c <= DL_RDZV_CAUSE_COUNT; c++) {
        dl_rdzv_budget_t want = dl_rdzv_policy_is_failure((dl_rdzv_cause_t)c) ? DL_RDZV_BUDGET_SPEND
                                                                              : DL_RDZV_BUDGET_FREE;
        ck_assert_int_eq(dl_rdzv_policy_round_end((dl_rdzv_cause_t)c, 0, 3, 0, 3), want);
    }
}

DL_TEST(the_budget_runs_out_only_for_failures)
{
    /* 3 restarts: the 3rd failure still restarts, the 4th fails the job. */
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_NODE_LOST, 2, 3, 0, 0),
                     DL_RDZV_BUDGET_SPEND);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_NODE_LOST, 3, 3, 0, 0),
                     DL_RDZV_BUDGET_SPENT);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_WORKER_FAILED, 0, 0, 1, 0),
                     DL_RDZV_BUDGET_SPENT);
    /* An operator's restart, a join or a departure with none left: still free. */
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_REQUESTED, 0, 0, 0, 0),
                     DL_RDZV_BUDGET_FREE);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_NODE_LEFT, 5, 0, 0, 0),
                     DL_RDZV_BUDGET_FREE);
    ck_assert(dl_rdzv_policy_restart_left(2, 3));
    ck_assert(!dl_rdzv_policy_restart_left(3, 3));
    ck_assert(!dl_rdzv_policy_overspent(3, 3));
    ck_assert(dl_rdzv_policy_overspent(4, 3));
}

DL_TEST(a_departure_goes_on_with_min_nodes_left)
{
    ck_assert(dl_rdzv_policy_departure_goes_on(1, 1));
    ck_assert(dl_rdzv_policy_departure_goes_on(3, 2));
    ck_assert(!dl_rdzv_policy_departure_goes_on(1, 2));
    ck_assert(!dl_rdzv_policy_departure_goes_on(0, 1));
}

DL_TEST(the_same_failure_wins_over_the_budget)
{
    /* At the limit the job fails as a same failure, restarts left or not; below it, or with
     * no limit, the budget decides. */
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_WORKER_FAILED, 0, 10, 3, 3),
                     DL_RDZV_BUDGET_SAME);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_WORKER_FAILED, 10, 10, 3, 3),
                     DL_RDZV_BUDGET_SAME);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_WORKER_FAILED, 0, 10, 2, 3),
                     DL_RDZV_BUDGET_SPEND);
    ck_assert_int_eq(dl_rdzv_policy_round_end(DL_RDZV_CAUSE_WORKER_FAILED, 0, 10, 50, 0),
                     DL_RDZV_BUDGET_SPEND);
}

DL_TEST(a_failed_recovery_falls_back_on_the_restarts_left)
{
    /* 3 restarts, 1 spent: 2 to fall back on; all 3 spent (or more, adopted): none, the job
     * fails; no budget at all: none. */
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(1, 3, false), 2);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(2, 3, false), 1);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(3, 3, false), 0);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(5, 3, false), 0);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(0, 0, false), 0);
    /* The rendezvous keeps the budget: this node falls back to a restart and lets it decide. */
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(3, 3, true), 1);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(0, 0, true), 1);
    ck_assert_int_eq(dl_rdzv_policy_recovery_restarts_left(1, 3, true), 2);
}
