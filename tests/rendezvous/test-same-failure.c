/* The same failure round after round (max_same_failures): the rule that tells one failure from
 * the next, and the core ending the job with it before the restart budget is spent. */
#include <errno.h>
#include <string.h>

#include "core-internal.h"
#include "dl-test.h"
#include "harness.h"
#include "rdzv-policy.h"

static dl_rdzv_culprit_t worker(int rank, int exit_code, long long step)
{
    return (dl_rdzv_culprit_t){.cause = "worker_failed",
                               .node_rank = 1,
                               .rank = rank,
                               .exit_code = exit_code,
                               .step = step};
}

DL_TEST(the_rule_compares_rank_cause_and_progress)
{
    dl_rdzv_culprit_t prev = worker(1, 7, 40), next = worker(1, 7, 40);
    ck_assert(dl_rdzv_policy_same_failure(&prev, &next));
    next.step = 12; /* failed earlier this time: no progress either */
    ck_assert(dl_rdzv_policy_same_failure(&prev, &next));
    next.step = -1; /* the workers report no steps: the failure alone counts */
    ck_assert(dl_rdzv_policy_same_failure(&prev, &next));
    next.step = 41;
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    next = worker(0, 7, 40);
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    next = worker(1, 8, 40);
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    next = worker(1, -1, 40);
    next.signal = 9;
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    prev = next;
    ck_assert(dl_rdzv_policy_same_failure(&prev, &next));
    next.oom = true; /* SIGKILL by the OOM killer is not SIGKILL by an operator */
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    next = prev;
    next.signal = 0;
    next.hung = true;
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
    /* A lost node has no rank: never a same failure, a requeue elsewhere may cure it. */
    prev = worker(-1, -1, -1);
    next = prev;
    ck_assert(!dl_rdzv_policy_same_failure(&prev, &next));
}

static dl_rdzv_job_opts_t opts(int max_restarts, int max_same)
{
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = max_restarts;
    o.max_same_failures = max_same;
    return o;
}

/* Both agents join round `round`'s gathering (conns 1 and 2, agents a1 and a2). */
static void gather(harness_t *h, const dl_rdzv_job_opts_t *o, double now)
{
    h_join(h, 1, "job", 1, o, now);
    h_join(h, 2, "job", 1, o, now);
    ck_assert_uint_eq(h_count(h, DL_RDZV_MSG_ASSIGNMENT), 2);
}

static void fail_rank(harness_t *h, uint64_t conn, int round, int rank, int code, long long step,
                      double now)
{
    char what[64];
    snprintf(what, sizeof(what), "rank %d exited with code %d", rank, code);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_WORKER_FAILED, .conn = conn, .req_id = 9};
    ev.report.round = round;
    ev.report.description = what;
    ev.report.rank = rank;
    ev.report.exit_code = code;
    ev.report.step = step;
    h_step(h, &ev, now);
}

DL_TEST(the_same_failure_three_rounds_in_a_row_fails_the_job_early)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = opts(10, 3);
    for (int round = 0; round < 2; round++) {
        gather(&h, &o, 10 * round);
        fail_rank(&h, 2, round, 1, 7, -1, 10 * round + 1);
        ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, round + 1);
    }
    gather(&h, &o, 20);
    fail_rank(&h, 2, 2, 1, 7, -1, 21);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 2);
    for (uint64_t conn = 1; conn <= 2; conn++) {
        const dl_rdzv_msg_t *m = h_msg(&h, conn, DL_RDZV_MSG_FAILED);
        ck_assert_int_eq(m->failed.same_failures, 3);
        ck_assert_int_eq(m->failed.restarts, 2); /* of 10: the rest was not spent */
        ck_assert_ptr_nonnull(strstr(m->failed.failure, "the same failure ended 3 rounds"));
        ck_assert_ptr_nonnull(strstr(m->failed.failure, "rank 1 exited with code 7"));
        ck_assert_ptr_nonnull(m->failed.culprit);
        ck_assert_int_eq(m->failed.culprit->rank, 1);
        ck_assert_int_eq(m->failed.culprit->exit_code, 7);
        ck_assert_str_eq(m->failed.culprit->node, "a2");
    }
    ck_assert_int_eq(h_status(&h, "job", 22)->state, DL_RDZV_JOB_FAILED);
    h_fini(&h);
}

/* Another rank, another code, or a step further: the row starts again, and the restarts are
 * spent as ever (the job fails as restarts exhausted, not as a same failure). */
DL_TEST(a_failure_that_changes_spends_the_budget)
{
    static const struct {
        int rank, code;
        long long step;
    } seq[] = {{1, 7, 5}, {1, 7, 5}, {1, 7, 9}, {1, 7, 9}, {0, 7, 9}, {0, 3, 9}};
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = opts(5, 3);
    for (int round = 0; round < 6; round++) {
        gather(&h, &o, 10 * round);
        fail_rank(&h, 2, round, seq[round].rank, seq[round].code, seq[round].step, 10 * round + 1);
        if (round < 5)
            ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    }
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->failed.same_failures, 0);
    ck_assert_int_eq(m->failed.restarts, 5);
    ck_assert_ptr_null(strstr(m->failed.failure, "same failure"));
    h_fini(&h);
}

/* An operator's restart between two alike failures, or a lost node, breaks the row. */
DL_TEST(a_round_change_of_another_kind_breaks_the_row)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = opts(10, 2);
    gather(&h, &o, 0);
    fail_rank(&h, 2, 0, 1, 7, -1, 1);
    gather(&h, &o, 2);
    h_control(&h, DL_RDZV_EV_RESTART, 9, "job", 3);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    gather(&h, &o, 4);
    fail_rank(&h, 2, 2, 1, 7, -1, 5);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    gather(&h, &o, 6);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 3, 20);
    h_tick(&h, 27); /* a2 sent nothing for 21 s: lost */
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    gather(&h, &o, 28);
    fail_rank(&h, 2, 4, 1, 7, -1, 29);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    gather(&h, &o, 30);
    fail_rank(&h, 2, 5, 1, 7, -1, 31); /* the second in a row */
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->failed.same_failures, 2);
    h_fini(&h);
}

DL_TEST(zero_never_stops_early_and_below_zero_is_refused)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = opts(3, 0);
    for (int round = 0; round < 4; round++) {
        gather(&h, &o, 10 * round);
        fail_rank(&h, 2, round, 1, 7, -1, 10 * round + 1);
    }
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->failed.same_failures, 0);
    ck_assert_int_eq(m->failed.restarts, 3);
    h_fini(&h);

    char err[128];
    o.max_same_failures = -1;
    DL_CHECK_ERRNO(dl_rdzv_job_opts_check(&o, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "max_same_failures: -1 is below 0");
}
