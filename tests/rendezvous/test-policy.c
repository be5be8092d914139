/* The job's one policy (rdzv-policy.h): what ending a round costs, for every cause, at the
 * edges of the budget and of the same-failure limit; when a round closes; who gets which node
 * rank. */
#include <stdint.h>
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

DL_TEST(a_round_closes_at_max_or_at_min_after_the_last_call)
{
    ck_assert_int_eq(dl_rdzv_policy_round_step(1, 2, 4, 5.0, false), DL_RDZV_ROUND_GATHER);
    ck_assert_int_eq(dl_rdzv_policy_round_step(1, 2, 4, 5.0, true), DL_RDZV_ROUND_GATHER);
    ck_assert_int_eq(dl_rdzv_policy_round_step(2, 2, 4, 5.0, false), DL_RDZV_ROUND_LAST_CALL);
    ck_assert_int_eq(dl_rdzv_policy_round_step(3, 2, 4, 5.0, true), DL_RDZV_ROUND_CLOSE);
    ck_assert_int_eq(dl_rdzv_policy_round_step(2, 2, 4, 0.0, false), DL_RDZV_ROUND_CLOSE);
    ck_assert_int_eq(dl_rdzv_policy_round_step(4, 2, 4, 5.0, false), DL_RDZV_ROUND_CLOSE);
}

/* Ranks of nodes given as (slurm id, hint, host, id), in the order given. */
static void ranks_of(const dl_rdzv_policy_node_t *in, size_t n, int *ret)
{
    dl_rdzv_policy_node_t nodes[8], *v[8];
    bool taken[8];
    for (size_t i = 0; i < n; i++) {
        nodes[i] = in[i];
        nodes[i].ctx = (void *)(uintptr_t)i;
        v[i] = &nodes[i];
    }
    dl_rdzv_policy_node_ranks(v, n, taken);
    for (size_t r = 0; r < n; r++) {
        ck_assert_int_eq(v[r]->node_rank, (int)r); /* left in node-rank order */
        ret[(uintptr_t)v[r]->ctx] = (int)r;
    }
}

DL_TEST(node_ranks_follow_slurm_ids_then_hints_then_host_and_id)
{
    int r[8];
    /* No ids or hints: host, then id; whatever the order of joins. */
    dl_rdzv_policy_node_t plain[] = {
        {-1, -1, "b", "x", NULL, 0}, {-1, -1, "a", "z", NULL, 0}, {-1, -1, "a", "y", NULL, 0}};
    ranks_of(plain, 3, r);
    ck_assert(r[0] == 2 && r[1] == 1 && r[2] == 0);
    /* A hint below the count is that node's rank; the others fill the free ranks in order. */
    dl_rdzv_policy_node_t hinted[] = {{-1, -1, "a", "a", NULL, 0},
                                      {-1, 0, "z", "z", NULL, 0},
                                      {-1, 7, "b", "b", NULL, 0},
                                      {-1, -1, "c", "c", NULL, 0}};
    ranks_of(hinted, 4, r);
    ck_assert(r[1] == 0 && r[2] == 1 && r[0] == 2 && r[3] == 3);
    /* The same hint twice: the first in the rule's order has it. */
    dl_rdzv_policy_node_t twice[] = {{-1, 1, "b", "b", NULL, 0}, {-1, 1, "a", "a", NULL, 0}};
    ranks_of(twice, 2, r);
    ck_assert(r[1] == 1 && r[0] == 0);
    /* Slurm node ids come first, known before unknown. */
    dl_rdzv_policy_node_t slurm[] = {
        {-1, -1, "a", "a", NULL, 0}, {5, -1, "z", "z", NULL, 0}, {2, -1, "y", "y", NULL, 0}};
    ranks_of(slurm, 3, r);
    ck_assert(r[2] == 0 && r[1] == 1 && r[0] == 2);
}

/* Ranks of a two-node job, as their nodes' reports have them. */
static dl_rdzv_policy_rank_t at(int rank, int node_rank, uint64_t seq, bool inside, bool failed)
{
    return (dl_rdzv_policy_rank_t){.rank = rank,
                                   .node_rank = node_rank,
                                   .step = 20,
                                   .known = true,
                                   .seq = seq,
                                   .inside = inside,
                                   .failed = failed};
}

DL_TEST(a_victims_failure_is_put_on_the_rank_it_waited_for)
{
    /* Rank 1 (node 1) stopped after all-gather #40; rank 0's reduce-scatter #41 failed when
     * rank 1 was killed: whichever node reports first, rank 1 is named. */
    dl_rdzv_policy_rank_t v[] = {at(0, 0, 41, false, true), at(1, 1, 40, false, false)};
    v[1].stopped = true;
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 0, false), 1);
    /* Rank 1's own failure (its node's report) is its own. */
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 1, true), -1);
    /* Not stopped, only behind: the one waited for all the same. */
    v[1].stopped = false;
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 0, false), 1);
    /* Named hung while it waited inside (the watchdog's last resort): the same. */
    v[0] = at(0, 0, 41, true, false);
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 0, true), 1);
}

DL_TEST(a_failure_of_its_own_stays_with_the_failed_rank)
{
    /* Crashed inside a collective (running, no hang named): its own. */
    dl_rdzv_policy_rank_t v[] = {at(0, 0, 41, true, false), at(1, 1, 40, false, false)};
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 0, false), -1);
    /* Failed between collectives (its newest one done): its own. */
    v[0] = at(0, 0, 41, false, false);
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 2, 0, false), -1);
    /* Its collective failed, but every other rank entered it too: nobody to blame but it. */
    dl_rdzv_policy_rank_t all[] = {at(0, 0, 41, false, true), at(1, 1, 41, true, false),
                                   at(2, 1, 42, false, false)};
    ck_assert_int_eq(dl_rdzv_policy_waited_for(all, 3, 0, false), -1);
    /* Ranks whose reports say nothing (no recorder) are blamed for nothing. */
    all[1] = at(1, 1, 3, false, false);
    all[1].known = false;
    ck_assert_int_eq(dl_rdzv_policy_waited_for(all, 3, 0, false), -1);
    /* A failed rank not in the reports, or with no recorder, is its own culprit. */
    ck_assert_int_eq(dl_rdzv_policy_waited_for(all, 3, 7, false), -1);
    all[0].known = false;
    ck_assert_int_eq(dl_rdzv_policy_waited_for(all, 3, 0, false), -1);
    ck_assert_int_eq(dl_rdzv_policy_waited_for(NULL, 0, 0, false), -1);
}

DL_TEST(of_several_waited_for_a_stopped_one_then_the_furthest_behind)
{
    dl_rdzv_policy_rank_t v[] = {at(0, 0, 41, false, true), at(1, 0, 40, false, false),
                                 at(2, 1, 39, false, false), at(3, 1, 40, false, false)};
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 4, 0, false), 2);
    /* Stopped inside the collective still holds it up; stopped goes first. */
    v[3] = at(3, 1, 41, true, false);
    v[3].stopped = true;
    ck_assert_int_eq(dl_rdzv_policy_waited_for(v, 4, 0, false), 3);
    /* The same seq: the lowest rank. */
    dl_rdzv_policy_rank_t tie[] = {at(5, 1, 9, false, true), at(4, 1, 8, false, false),
                                   at(2, 0, 8, false, false)};
    ck_assert_int_eq(dl_rdzv_policy_waited_for(tie, 3, 5, false), 2);
}
