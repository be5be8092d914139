/* The restart policy, driven event by event with made-up times. */
#include <signal.h>
#include <stdbool.h>

#include "dl-test.h"
#include "supervisor.h"

static dl_sup_actions_t exit_ev(dl_sup_t *s, int rank, int code, double now)
{
    dl_sup_event_t ev = {.kind = DL_SUP_EV_WORKER_EXIT, .rank = rank, .exit_code = code};
    return dl_sup_step(s, &ev, now);
}

static dl_sup_actions_t killed_ev(dl_sup_t *s, int rank, int sig, double now)
{
    dl_sup_event_t ev = {
        .kind = DL_SUP_EV_WORKER_EXIT, .rank = rank, .exit_code = -1, .signal = sig};
    return dl_sup_step(s, &ev, now);
}

static dl_sup_actions_t simple(dl_sup_t *s, dl_sup_event_kind_t kind, int sig)
{
    dl_sup_event_t ev = {.kind = kind, .signal = sig};
    return dl_sup_step(s, &ev, 0);
}

DL_TEST(all_succeed)
{
    dl_sup_t s;
    dl_sup_init(&s, 3, 0);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_START, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_SPAWN);
    ck_assert_int_eq(a.attempt, 0);
    ck_assert_uint_eq(exit_ev(&s, 0, 0, 1).flags, 0);
    ck_assert_uint_eq(exit_ev(&s, 2, 0, 2).flags, 0);
    a = exit_ev(&s, 1, 0, 3);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 0);
    ck_assert_int_eq(s.phase, DL_SUP_DONE);
    /* Nothing moves a finished job. */
    ck_assert_uint_eq(simple(&s, DL_SUP_EV_SIGNAL, SIGTERM).flags, 0);
}

DL_TEST(failure_restarts_then_succeeds)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 1);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_actions_t a = exit_ev(&s, 1, 3, 10.5);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert_int_eq(a.kill_signal, SIGTERM);
    ck_assert(s.has_failure);
    ck_assert_int_eq(s.first_failure.rank, 1);
    ck_assert_int_eq(s.first_failure.exit_code, 3);
    ck_assert(s.first_failure.time == 10.5);
    /* The survivor dies of our SIGTERM: that is not a second failure. */
    a = killed_ev(&s, 0, SIGTERM, 11);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_SPAWN);
    ck_assert_int_eq(a.attempt, 1);
    ck_assert_int_eq(s.first_failure.rank, 1);
    exit_ev(&s, 0, 0, 12);
    a = exit_ev(&s, 1, 0, 13);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 0);
}

DL_TEST(restarts_exhausted)
{
    dl_sup_t s;
    dl_sup_init(&s, 1, 2);
    simple(&s, DL_SUP_EV_START, 0);
    for (int attempt = 0; attempt < 2; attempt++) {
        dl_sup_actions_t a = killed_ev(&s, 0, SIGSEGV, attempt);
        ck_assert_uint_eq(a.flags, DL_SUP_SPAWN); /* nothing left to stop: straight on */
        ck_assert_int_eq(a.attempt, attempt + 1);
    }
    dl_sup_actions_t a = exit_ev(&s, 0, 7, 5);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 1);
    ck_assert_int_eq(s.first_failure.attempt, 2);
    ck_assert_int_eq(s.first_failure.exit_code, 7);
}

DL_TEST(signal_stops_with_128_plus_n)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 5);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_SIGNAL, SIGINT);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert_int_eq(a.kill_signal, SIGINT);
    /* Workers that exit with an error while we stop them do not trigger a restart. */
    ck_assert_uint_eq(exit_ev(&s, 0, 1, 1).flags, 0);
    a = killed_ev(&s, 1, SIGINT, 2);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 128 + SIGINT);
}

DL_TEST(stop_timeout_escalates_and_second_signal_kills)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 0);
    simple(&s, DL_SUP_EV_START, 0);
    simple(&s, DL_SUP_EV_SIGNAL, SIGTERM);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_STOP_TIMEOUT, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL);
    ck_assert_int_eq(a.kill_signal, SIGKILL);
    a = simple(&s, DL_SUP_EV_SIGNAL, SIGTERM);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL);
    ck_assert_int_eq(a.kill_signal, SIGKILL);
}

DL_TEST(signal_during_restart_wins)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 3);
    simple(&s, DL_SUP_EV_START, 0);
    exit_ev(&s, 0, 1, 0);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_SIGNAL, SIGHUP);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL);
    ck_assert_int_eq(a.kill_signal, SIGHUP);
    a = killed_ev(&s, 1, SIGHUP, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 128 + SIGHUP);
}

DL_TEST(spawn_failure_counts_as_failure)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 0);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_event_t ev = {.kind = DL_SUP_EV_SPAWN_FAILED, .rank = 1, .spawn_errno = 11};
    dl_sup_actions_t a = dl_sup_step(&s, &ev, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert_int_eq(s.first_failure.spawn_errno, 11);
    a = exit_ev(&s, 0, 0, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 1);
}

DL_TEST(ten_thousand_workers_one_failure)
{
    dl_sup_t s;
    const int n = 10000;
    dl_sup_init(&s, n, 1);
    simple(&s, DL_SUP_EV_START, 0);
    killed_ev(&s, 4242, SIGKILL, 0);
    dl_sup_actions_t a = {0};
    for (int r = 0; r < n; r++)
        if (r != 4242)
            a = killed_ev(&s, r, SIGTERM, 1);
    ck_assert(a.flags & DL_SUP_SPAWN);
    ck_assert_int_eq(s.running, n);
    ck_assert_int_eq(s.first_failure.rank, 4242);
    ck_assert_int_eq(s.first_failure.signal, SIGKILL);
}

static dl_sup_actions_t remote_ev(dl_sup_t *s, dl_sup_event_kind_t kind, int value)
{
    dl_sup_event_t ev = {.kind = kind, .attempt = value, .exit_code = value};
    return dl_sup_step(s, &ev, 0);
}

DL_TEST(remote_join_run_done)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 2);
    ck_assert_uint_eq(simple(&s, DL_SUP_EV_START, 0).flags, DL_SUP_JOIN);
    dl_sup_actions_t a = remote_ev(&s, DL_SUP_EV_ASSIGNED, 4);
    ck_assert_uint_eq(a.flags, DL_SUP_SPAWN);
    ck_assert_int_eq(a.attempt, 4); /* the round's restart count, not ours */
    exit_ev(&s, 0, 0, 1);
    a = exit_ev(&s, 1, 0, 2);
    ck_assert_uint_eq(a.flags, DL_SUP_NODE_DONE); /* not EXIT: another node may still fail */
    ck_assert_int_eq(s.phase, DL_SUP_WAITING);
    a = remote_ev(&s, DL_SUP_EV_JOB_END, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 0);
}

DL_TEST(remote_failure_is_reported_not_restarted)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 2);
    simple(&s, DL_SUP_EV_START, 0);
    remote_ev(&s, DL_SUP_EV_ASSIGNED, 0);
    dl_sup_actions_t a = exit_ev(&s, 1, 9, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_REPORT | DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert_int_eq(s.first_failure.exit_code, 9);
    a = killed_ev(&s, 0, SIGTERM, 2);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER); /* and wait for the rendezvous */
    ck_assert_int_eq(s.phase, DL_SUP_WAITING);
    ck_assert_uint_eq(remote_ev(&s, DL_SUP_EV_ROUND_CHANGED, 1).flags, DL_SUP_JOIN);
    a = remote_ev(&s, DL_SUP_EV_ASSIGNED, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_SPAWN);
    ck_assert_int_eq(a.attempt, 1);
}

DL_TEST(remote_round_change_stops_healthy_workers)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 2);
    simple(&s, DL_SUP_EV_START, 0);
    remote_ev(&s, DL_SUP_EV_ASSIGNED, 0);
    dl_sup_actions_t a = remote_ev(&s, DL_SUP_EV_ROUND_CHANGED, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    killed_ev(&s, 0, SIGTERM, 1);
    a = killed_ev(&s, 1, SIGTERM, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_JOIN);
    ck_assert(!s.has_failure); /* dying of our SIGTERM is no failure */
}

DL_TEST(remote_job_end_while_running)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 1);
    simple(&s, DL_SUP_EV_START, 0);
    remote_ev(&s, DL_SUP_EV_ASSIGNED, 0);
    dl_sup_actions_t a = remote_ev(&s, DL_SUP_EV_JOB_END, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    a = killed_ev(&s, 0, SIGTERM, 1);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 1);
}

DL_TEST(remote_signal_while_waiting)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 1);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_SIGNAL, SIGTERM);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 143);
}

/* ---- In-job recovery -------------------------------------------------------------------- */

static dl_sup_actions_t rec_exit(dl_sup_t *s, int rank, int sig, bool recoverable)
{
    dl_sup_event_t ev = {.kind = DL_SUP_EV_WORKER_EXIT,
                         .rank = rank,
                         .exit_code = -1,
                         .signal = sig,
                         .recoverable = recoverable};
    return dl_sup_step(s, &ev, 1);
}

DL_TEST(in_job_replaces_one_worker_and_spends_a_restart)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 2);
    dl_sup_set_in_job(&s, true);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_actions_t a = rec_exit(&s, 1, SIGKILL, true);
    ck_assert_uint_eq(a.flags, DL_SUP_RECOVER);
    ck_assert_int_eq(a.rank, 1);
    ck_assert_int_eq(a.attempt, 0);
    ck_assert(s.recovering);
    ck_assert_int_eq(s.running, 2); /* the survivor and the replacement */
    ck_assert_int_eq(dl_sup_restarts_used(&s), 1);
    ck_assert_uint_eq(simple(&s, DL_SUP_EV_RECOVERED, 0).flags, 0);
    ck_assert(!s.recovering);
    /* A second one, later: another recovery, the last restart. */
    a = rec_exit(&s, 0, SIGKILL, true);
    ck_assert_uint_eq(a.flags, DL_SUP_RECOVER);
    simple(&s, DL_SUP_EV_RECOVERED, 0);
    ck_assert_int_eq(dl_sup_restarts_used(&s), 2);
    /* No restart left: the job fails as it would. */
    a = rec_exit(&s, 1, SIGKILL, true);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    a = killed_ev(&s, 0, SIGTERM, 2);
    ck_assert_uint_eq(a.flags & DL_SUP_EXIT, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, 1);
    ck_assert_int_eq(dl_sup_attempts(&s), 1);
}

DL_TEST(in_job_failure_during_a_recovery_restarts)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 3);
    dl_sup_set_in_job(&s, true);
    simple(&s, DL_SUP_EV_START, 0);
    ck_assert_uint_eq(rec_exit(&s, 1, SIGKILL, true).flags, DL_SUP_RECOVER);
    /* The replacement dies before every worker recovered: back to a restart. */
    dl_sup_actions_t a = rec_exit(&s, 1, SIGKILL, true);
    ck_assert_uint_eq(a.flags, DL_SUP_RECOVERY_OFF | DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert(!s.recovering);
    a = killed_ev(&s, 0, SIGTERM, 2);
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_SPAWN);
    ck_assert_int_eq(a.attempt, 1);
    ck_assert_int_eq(dl_sup_restarts_used(&s), 2);
    ck_assert_int_eq(dl_sup_attempts(&s), 2);
}

DL_TEST(in_job_not_for_workers_without_the_protocol)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 1);
    dl_sup_set_in_job(&s, true);
    simple(&s, DL_SUP_EV_START, 0);
    ck_assert_uint_eq(rec_exit(&s, 1, SIGKILL, false).flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    /* A recovery that times out restarts too. */
    dl_sup_init(&s, 2, 2);
    dl_sup_set_in_job(&s, true);
    simple(&s, DL_SUP_EV_START, 0);
    rec_exit(&s, 0, SIGKILL, true);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_RECOVERY_FAILED, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_RECOVERY_OFF | DL_SUP_KILL | DL_SUP_ARM_TIMER);
}

DL_TEST(in_job_remote_keeps_the_workers_across_rounds)
{
    dl_sup_t s;
    dl_sup_init_remote(&s, 2);
    dl_sup_set_in_job(&s, true);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_event_t as = {.kind = DL_SUP_EV_ASSIGNED, .attempt = 0};
    dl_sup_step(&s, &as, 0);
    /* A worker dies: reported, the other stays. */
    dl_sup_actions_t a = rec_exit(&s, 1, SIGKILL, true);
    ck_assert_uint_eq(a.flags, DL_SUP_REPORT);
    ck_assert_int_eq(s.phase, DL_SUP_RUNNING);
    /* The round changes: kept, joined again. */
    dl_sup_event_t rc = {.kind = DL_SUP_EV_ROUND_CHANGED, .recoverable = true};
    a = dl_sup_step(&s, &rc, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_KEEP | DL_SUP_JOIN);
    ck_assert(s.awaiting && s.recovering);
    /* Another change before the assignment: join that one. */
    a = dl_sup_step(&s, &rc, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_JOIN);
    as.attempt = 1;
    a = dl_sup_step(&s, &as, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_RESUME);
    ck_assert_int_eq(a.attempt, 1);
    ck_assert_int_eq(s.running, 2);
    simple(&s, DL_SUP_EV_RECOVERED, 0);
    /* A round change while a recovery is under way stops the workers: a restart. */
    rec_exit(&s, 0, SIGKILL, true);
    dl_sup_step(&s, &rc, 0);
    dl_sup_step(&s, &as, 0);
    a = dl_sup_step(&s, &rc, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_RECOVERY_OFF | DL_SUP_KILL | DL_SUP_ARM_TIMER);
    ck_assert_int_eq(dl_sup_attempts(&s), 1);
}

/* One worker failing: rank, code, the furthest step of the attempt. */
static dl_sup_actions_t fail_at(dl_sup_t *s, int rank, int code, long long step, double now)
{
    dl_sup_event_t ev = {
        .kind = DL_SUP_EV_WORKER_EXIT, .rank = rank, .exit_code = code, .step = step};
    return dl_sup_step(s, &ev, now);
}

DL_TEST(the_same_failure_three_times_ends_the_job_with_5)
{
    dl_sup_t s;
    dl_sup_init(&s, 1, 10);
    dl_sup_set_max_same(&s, 3);
    simple(&s, DL_SUP_EV_START, 0);
    /* Rank 0 exits 3 at step 40, three attempts in a row: no restart would do better. */
    ck_assert_uint_eq(fail_at(&s, 0, 3, 40, 1).flags & DL_SUP_SPAWN, DL_SUP_SPAWN);
    ck_assert_uint_eq(fail_at(&s, 0, 3, 40, 2).flags & DL_SUP_SPAWN, DL_SUP_SPAWN);
    dl_sup_actions_t a = fail_at(&s, 0, 3, 40, 3);
    ck_assert_uint_eq(a.flags, DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, DL_SUP_EXIT_SAME_FAILURE);
    ck_assert_int_eq(dl_sup_restarts_used(&s), 2); /* 8 of the 10 restarts were not spent */
}

DL_TEST(progress_or_another_cause_is_no_same_failure)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 10);
    dl_sup_set_max_same(&s, 3);
    simple(&s, DL_SUP_EV_START, 0);
    /* Each attempt gets further: a flaky fault, not a deterministic one. */
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(fail_at(&s, 1, 1, 100 * (i + 1), i).flags & DL_SUP_KILL, DL_SUP_KILL);
        ck_assert_uint_eq(killed_ev(&s, 0, SIGTERM, i + 0.5).flags & DL_SUP_SPAWN, DL_SUP_SPAWN);
    }
    /* No step known (no beats), but the rank or the code differs each time. */
    int ranks[] = {0, 1, 1}, codes[] = {1, 1, 2};
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(fail_at(&s, ranks[i], codes[i], -1, 10 + i).flags & DL_SUP_KILL,
                          DL_SUP_KILL);
        ck_assert_uint_eq(killed_ev(&s, 1 - ranks[i], SIGTERM, 10.5 + i).flags & DL_SUP_SPAWN,
                          DL_SUP_SPAWN);
    }
    /* 0 turns the rule off: restarts are spent to the last. */
    dl_sup_init(&s, 1, 3);
    dl_sup_set_max_same(&s, 0);
    simple(&s, DL_SUP_EV_START, 0);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(fail_at(&s, 0, 3, -1, i).flags & DL_SUP_SPAWN, DL_SUP_SPAWN);
    dl_sup_actions_t a = fail_at(&s, 0, 3, -1, 4);
    ck_assert_int_eq(a.exit_code, 1);
}

DL_TEST(an_unreapable_worker_ends_the_job_with_6)
{
    dl_sup_t s;
    dl_sup_init(&s, 2, 5);
    simple(&s, DL_SUP_EV_START, 0);
    /* Rank 1 fails; rank 0 ignores SIGTERM, then SIGKILL, and is given up on. */
    ck_assert_uint_eq(exit_ev(&s, 1, 1, 1).flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    dl_sup_actions_t a = simple(&s, DL_SUP_EV_STOP_TIMEOUT, 0);
    ck_assert_int_eq(a.kill_signal, SIGKILL);
    dl_sup_event_t ev = {.kind = DL_SUP_EV_UNREAPABLE, .rank = 0, .step = -1};
    a = dl_sup_step(&s, &ev, 3);
    /* Restarts were left, but nothing starts again on this node. */
    ck_assert_uint_eq(a.flags, DL_SUP_DISARM_TIMER | DL_SUP_EXIT);
    ck_assert_int_eq(a.exit_code, DL_SUP_EXIT_UNHEALTHY);

    /* Given up on while the attempt ran (killed for a hang): it is the attempt's failure. */
    dl_sup_init(&s, 2, 5);
    simple(&s, DL_SUP_EV_START, 0);
    a = dl_sup_step(&s, &ev, 1);
    ck_assert(s.first_failure.unreapable);
    ck_assert_int_eq(s.first_failure.rank, 0);
    ck_assert_uint_eq(a.flags, DL_SUP_KILL | DL_SUP_ARM_TIMER);
    a = killed_ev(&s, 1, SIGTERM, 2);
    ck_assert_int_eq(a.exit_code, DL_SUP_EXIT_UNHEALTHY);

    /* A stop signal still says how the agent ends. */
    dl_sup_init(&s, 1, 5);
    simple(&s, DL_SUP_EV_START, 0);
    simple(&s, DL_SUP_EV_SIGNAL, SIGTERM);
    a = dl_sup_step(&s, &ev, 1);
    ck_assert_int_eq(a.exit_code, 128 + SIGTERM);
}

DL_TEST(an_oom_kill_is_kept_in_the_failure)
{
    dl_sup_t s;
    dl_sup_init(&s, 1, 1);
    simple(&s, DL_SUP_EV_START, 0);
    dl_sup_event_t ev = {.kind = DL_SUP_EV_WORKER_EXIT,
                         .rank = 0,
                         .exit_code = -1,
                         .signal = SIGKILL,
                         .oom = true,
                         .mem_peak = 190LL << 20,
                         .mem_limit = 192LL << 20};
    dl_sup_step(&s, &ev, 1);
    ck_assert(s.first_failure.oom);
    ck_assert_int_eq(s.first_failure.mem_peak, 190LL << 20);
    ck_assert_int_eq(s.first_failure.mem_limit, 192LL << 20);
}
