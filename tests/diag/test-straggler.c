/* The straggler rule: a slow rank named after the window, an even job never, noise below the
 * threshold ignored, recovery, restarts, the figures and the cost. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"

#define N 4

typedef struct {
    dl_diag_judge_t *j;
    dl_diag_totals_t t[N];
} sim_t;

static void sim_init(sim_t *s, int n, const dl_diag_straggler_opts_t *o)
{
    dl_diag_straggler_opts_t d;
    dl_diag_straggler_opts_init(&d);
    memset(s, 0, sizeof(*s));
    ck_assert_int_eq(dl_diag_judge_new(o ? o : &d, &s->j), 0);
    for (int r = 0; r < n; r++)
        s->t[r] = (dl_diag_totals_t){.rank = r, .node_rank = r / 2, .host = r < 2 ? "a" : "b"};
}

/* One report: every rank did steps at compute[r] ms (and waited so that all step together). */
static dl_diag_view_t report(sim_t *s, int n, double steps, const double *compute)
{
    double slowest = 0;
    for (int r = 0; r < n; r++)
        slowest = compute[r] > slowest ? compute[r] : slowest;
    for (int r = 0; r < n; r++) {
        s->t[r].steps += steps;
        s->t[r].compute_ms += steps * compute[r];
        s->t[r].wait_ms += steps * (slowest - compute[r] + 0.1);
        s->t[r].samples += steps * 64;
    }
    ck_assert_int_eq(dl_diag_judge_feed(s->j, s->t, (size_t)n), 0);
    dl_diag_view_t v;
    ck_assert_int_eq(dl_diag_judge_eval(s->j, &v), 0);
    return v;
}

START_TEST(a_slow_rank_is_named_after_the_window)
{
    sim_t s;
    sim_init(&s, 4, NULL);
    double even[N] = {2, 2, 2, 2}, slow[N] = {2, 2, 2, 3};
    dl_diag_view_t v = report(&s, 4, 0, even); /* first sums: no interval yet */
    ck_assert_int_eq(v.ranks, 0);
    /* Three reports of 40 steps: 120 steps >= the window of 100, three in a row. */
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    ck_assert_int_eq(v.ranks, 4);
    ck_assert_double_eq_tol(v.median_ms, 2.0, 1e-9);
    ck_assert_int_eq(v.slowest_rank, 3);
    ck_assert_double_eq_tol(v.slowest_ms, 3.0, 1e-9);
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 1);
    const dl_diag_straggler_t *x = &v.stragglers[0];
    ck_assert_int_eq(x->rank, 3);
    ck_assert_int_eq(x->node_rank, 1);
    ck_assert_str_eq(x->host, "b");
    ck_assert(x->named);
    ck_assert_double_eq_tol(x->compute_ms, 3.0, 1e-9);
    ck_assert_double_eq_tol(x->median_ms, 2.0, 1e-9);
    ck_assert_double_eq_tol(x->slower, 0.5, 1e-9);
    ck_assert_uint_eq(x->steps, 120);
    /* The job steps in 3.1 ms (3 of compute, 0.1 of sum); at the median it would take 2.1:
     * 256 samples a step. */
    ck_assert_double_eq_tol(x->step_ms, 3.1, 1e-9);
    ck_assert_double_eq_tol(x->cost, 256 * 1000 / 2.1 - 256 * 1000 / 3.1, 1e-6);
    ck_assert_double_eq_tol(v.samples_per_s, 256 * 1000 / 3.1, 1e-6);
    char line[256];
    dl_diag_straggler_text(x, line, sizeof(line));
    ck_assert_str_eq(line, "rank 3 on node 1 (b) computes 3.00 ms a step against the median "
                           "2.00 ms (+50%) for 120 steps; it costs the job about 39324 samples/s");
    /* Still slow: still there, but named only once. */
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 1);
    ck_assert(!v.stragglers[0].named);
    dl_diag_judge_free(s.j);
}
END_TEST

START_TEST(few_steps_or_few_reports_are_not_enough)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4};
    report(&s, 2, 0, slow);
    /* Reports of 10 steps: an interval needs a third of the window (34 steps), so every fourth
     * report makes one, and the third interval (120 steps) names the rank. */
    for (int i = 1; i < 12; i++) {
        dl_diag_view_t v = report(&s, 2, 10, slow);
        ck_assert_uint_eq(v.nstragglers, 0);
        ck_assert_int_eq(v.ranks, i < 4 ? 0 : 2);
    }
    /* With two ranks the lower middle is the median: the slow one against the other. */
    dl_diag_view_t v = report(&s, 2, 10, slow);
    ck_assert_uint_eq(v.nstragglers, 1);
    ck_assert_uint_eq(v.stragglers[0].steps, 120);
    ck_assert_double_eq_tol(v.median_ms, 2.0, 1e-9);
    dl_diag_judge_free(s.j);

    /* One huge report is one report: three are needed. */
    sim_init(&s, 2, NULL);
    report(&s, 2, 0, slow);
    ck_assert_uint_eq(report(&s, 2, 10000, slow).nstragglers, 0);
    ck_assert_uint_eq(report(&s, 2, 10000, slow).nstragglers, 0);
    ck_assert_uint_eq(report(&s, 2, 10000, slow).nstragglers, 1);
    dl_diag_judge_free(s.j);
}
END_TEST

START_TEST(an_even_or_noisy_job_names_nobody)
{
    sim_t s;
    sim_init(&s, 4, NULL);
    double even[N] = {2, 2, 2, 2};
    report(&s, 4, 0, even);
    for (int i = 0; i < 50; i++) {
        /* Noise up to 25% on a different rank each time, under the 30% threshold. */
        double noisy[N] = {2, 2, 2, 2};
        noisy[i % 4] = 2.5;
        noisy[(i + 1) % 4] = 1.9;
        dl_diag_view_t v = report(&s, 4, 100, i % 3 ? noisy : even);
        ck_assert_uint_eq(v.nstragglers, 0);
    }
    /* A slow report now and then breaks the run of reports: nobody. */
    for (int i = 0; i < 30; i++) {
        double spiky[N] = {2, 2, 2, i % 3 == 2 ? 2 : 5};
        ck_assert_uint_eq(report(&s, 4, 100, spiky).nstragglers, 0);
    }
    dl_diag_judge_free(s.j);
}
END_TEST

START_TEST(a_rank_that_recovers_is_cleared)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4}, even[N] = {2, 2};
    report(&s, 2, 0, slow);
    for (int i = 0; i < 3; i++)
        report(&s, 2, 50, slow);
    dl_diag_view_t v = report(&s, 2, 50, even);
    ck_assert_uint_eq(v.nstragglers, 1); /* one good report is not enough */
    report(&s, 2, 50, even);
    v = report(&s, 2, 50, even);
    ck_assert_uint_eq(v.nstragglers, 0);
    ck_assert_uint_eq(v.ncleared, 1);
    ck_assert_int_eq(v.cleared[0], 1);
    dl_diag_judge_free(s.j);
}
END_TEST

START_TEST(a_restarted_worker_starts_over)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4};
    report(&s, 2, 0, slow);
    report(&s, 2, 50, slow);
    report(&s, 2, 50, slow);
    /* Rank 1's worker started again: its sums went down. Its next interval starts there. */
    s.t[1].steps = s.t[1].compute_ms = s.t[1].wait_ms = s.t[1].samples = 0;
    ck_assert_int_eq(dl_diag_judge_feed(s.j, &s.t[1], 1), 0);
    dl_diag_view_t v;
    ck_assert_int_eq(dl_diag_judge_eval(s.j, &v), 0);
    ck_assert_uint_eq(v.nstragglers, 0);
    v = report(&s, 2, 50, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    dl_diag_judge_reset(s.j);
    dl_diag_judge_view(s.j, &v);
    ck_assert_int_eq(v.ranks, 0);
    ck_assert_int_eq(v.slowest_rank, -1);
    dl_diag_judge_free(s.j);
}
END_TEST

START_TEST(settings_are_checked)
{
    dl_diag_straggler_opts_t o;
    dl_diag_judge_t *j = NULL;
    dl_diag_straggler_opts_init(&o);
    ck_assert_double_eq_tol(o.threshold, 0.3, 1e-12);
    ck_assert_uint_eq(o.window, 100);
    o.threshold = 0;
    ck_assert_int_eq(dl_diag_judge_new(&o, &j), -EINVAL);
    ck_assert_ptr_null(j);
    dl_diag_straggler_opts_init(&o);
    ck_assert_int_eq(dl_diag_judge_new(&o, &j), 0);
    dl_diag_totals_t bad = {.rank = -1};
    ck_assert_int_eq(dl_diag_judge_feed(j, &bad, 1), -EINVAL);
    dl_diag_judge_free(j);
    dl_diag_judge_free(NULL);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("straggler");
    TCase *t = tcase_create("straggler");
    tcase_add_test(t, a_slow_rank_is_named_after_the_window);
    tcase_add_test(t, few_steps_or_few_reports_are_not_enough);
    tcase_add_test(t, an_even_or_noisy_job_names_nobody);
    tcase_add_test(t, a_rank_that_recovers_is_cleared);
    tcase_add_test(t, a_restarted_worker_starts_over);
    tcase_add_test(t, settings_are_checked);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
