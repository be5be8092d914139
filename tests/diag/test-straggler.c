/* The straggler rule: a slow rank named after the window, steady or in bursts of the same cost
 * alike, even when some of its intervals look normal; an even job never, nor noise on every rank
 * or load that slows them all; recovery, restarts, the figures and the cost. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "diag.h"
#include "dl-test.h"

#define N 8

typedef struct {
    dl_diag_judge_t *j;
    dl_diag_totals_t t[N];
} sim_t;

static void sim_init(sim_t *s, int n, const dl_diag_straggler_opts_t *o)
{
    dl_diag_straggler_opts_t d;
    dl_diag_straggler_opts_init(&d);
    memset(s, 0, sizeof(*s));
    DL_CHECK_ERRNO(dl_diag_judge_new(o ? o : &d, &s->j), 0);
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
    DL_CHECK_ERRNO(dl_diag_judge_feed(s->j, s->t, (size_t)n), 0);
    dl_diag_view_t v;
    DL_CHECK_ERRNO(dl_diag_judge_eval(s->j, &v), 0);
    return v;
}

DL_TEST(a_slow_rank_is_named_after_the_window)
{
    sim_t s;
    sim_init(&s, 4, NULL);
    double even[N] = {2, 2, 2, 2}, slow[N] = {2, 2, 2, 3};
    dl_diag_view_t v = report(&s, 4, 0, even); /* first sums: no interval yet */
    ck_assert_int_eq(v.ranks, 0);
    /* Reports of 40 steps: a window of 120 steps >= 100 that spans three reports, and a second
     * window before it, both slow: the sixth report. */
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    ck_assert_int_eq(v.ranks, 0); /* no window yet */
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    v = report(&s, 4, 40, slow);
    ck_assert_int_eq(v.ranks, 4);
    ck_assert_double_eq_tol(v.median_ms, 2.0, 1e-9);
    ck_assert_int_eq(v.slowest_rank, 3);
    ck_assert_double_eq_tol(v.slowest_ms, 3.0, 1e-9);
    ck_assert_uint_eq(v.nstragglers, 0); /* one window is not enough */
    for (int i = 4; i < 6; i++)
        ck_assert_uint_eq(report(&s, 4, 40, slow).nstragglers, 0);
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
    ck_assert_uint_eq(x->steps, 240);
    /* The job steps in 3.1 ms (3 of compute, 0.1 of sum); at the median it would take 2.1:
     * 256 samples a step. */
    ck_assert_double_eq_tol(x->step_ms, 3.1, 1e-9);
    ck_assert_double_eq_tol(x->cost, 256 * 1000 / 2.1 - 256 * 1000 / 3.1, 1e-6);
    ck_assert_double_eq_tol(v.samples_per_s, 256 * 1000 / 3.1, 1e-6);
    char line[256];
    dl_diag_straggler_text(x, line, sizeof(line));
    ck_assert_str_eq(line, "rank 3 on node 1 (b) computes 3.00 ms a step against the median "
                           "2.00 ms (+50%) for 240 steps; it costs the job about 39324 samples/s");
    /* Still slow: still there, but named only once. */
    v = report(&s, 4, 40, slow);
    ck_assert_uint_eq(v.nstragglers, 1);
    ck_assert(!v.stragglers[0].named);
    dl_diag_judge_free(s.j);
}

DL_TEST(few_steps_or_few_reports_are_not_enough)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4};
    report(&s, 2, 0, slow);
    /* Reports of 10 steps: a window needs 100 steps, so the tenth report makes the first and
     * the twentieth names the rank. */
    for (int i = 1; i < 20; i++) {
        dl_diag_view_t v = report(&s, 2, 10, slow);
        ck_assert_uint_eq(v.nstragglers, 0);
        ck_assert_int_eq(v.ranks, i < 10 ? 0 : 2);
    }
    /* With two ranks the lower middle is the median: the slow one against the other. */
    dl_diag_view_t v = report(&s, 2, 10, slow);
    ck_assert_uint_eq(v.nstragglers, 1);
    ck_assert_uint_eq(v.stragglers[0].steps, 200);
    ck_assert_double_eq_tol(v.median_ms, 2.0, 1e-9);
    /* Many more reports of a step each: each window stays near 100 steps (a snapshot every 12.5
     * steps at least), however many reports there were. */
    for (int i = 0; i < 200; i++)
        v = report(&s, 2, 1, slow);
    ck_assert_uint_ge(v.stragglers[0].steps, 200);
    ck_assert_uint_le(v.stragglers[0].steps, 226);
    dl_diag_judge_free(s.j);

    /* One huge report is one report: a window spans three. */
    sim_init(&s, 2, NULL);
    report(&s, 2, 0, slow);
    for (int i = 1; i < 6; i++)
        ck_assert_uint_eq(report(&s, 2, 10000, slow).nstragglers, 0);
    ck_assert_uint_eq(report(&s, 2, 10000, slow).nstragglers, 1);
    dl_diag_judge_free(s.j);
}

/* Reports of 20 steps until rank 3 is named, its compute in report i being pattern[i % len] (the
 * others at 2 ms). Returns the report that named it (0: none within max), and its figures. */
static int named_at(const double *pattern, int len, int max, dl_diag_straggler_t *ret)
{
    sim_t s;
    sim_init(&s, 4, NULL);
    double c[N] = {2, 2, 2, 2};
    report(&s, 4, 0, c);
    int at = 0;
    for (int i = 1; i <= max && at == 0; i++) {
        c[3] = pattern[(i - 1) % len];
        dl_diag_view_t v = report(&s, 4, 20, c);
        if (v.nstragglers > 0) {
            at = i;
            *ret = v.stragglers[0];
        }
    }
    dl_diag_judge_free(s.j);
    return at;
}

DL_TEST(steady_and_bursty_slowdowns_of_the_same_cost_are_named_alike)
{
    /* Both cost the job a half of a step over any five reports (100 steps, a window): one
     * steadily, the other in one stall of 5 ms more every fifth report, the four between at the
     * median. Both are named with the second window. */
    double steady[] = {3}, bursty[] = {2, 2, 7, 2, 2};
    dl_diag_straggler_t a, b;
    ck_assert_int_eq(named_at(steady, 1, 50, &a), 10);
    ck_assert_int_eq(named_at(bursty, 5, 50, &b), 10);
    ck_assert_int_eq(a.rank, 3);
    ck_assert_int_eq(b.rank, 3);
    ck_assert_double_eq_tol(a.slower, 0.5, 1e-9);
    ck_assert_double_eq_tol(b.slower, 0.5, 1e-9);
    ck_assert_double_eq_tol(a.cost, b.cost, 1e-6);
    ck_assert_uint_eq(a.steps, 200);
}

DL_TEST(intervals_that_look_normal_do_not_hide_a_slow_rank)
{
    /* +75% in three reports of five and normal in the two between: no three in a row are slow,
     * yet over any window it costs the job +45%; named with the second window, as a steady one. */
    double noisy[] = {3.5, 2, 3.5, 2, 3.5};
    dl_diag_straggler_t x;
    ck_assert_int_eq(named_at(noisy, 5, 50, &x), 10);
    ck_assert_double_eq_tol(x.slower, 0.45, 1e-9);
    /* Normal every other report, +80% between: over +30% in any window of five reports. */
    double alternating[] = {2, 3.6};
    ck_assert_int_eq(named_at(alternating, 2, 50, &x), 10);
    ck_assert_double_gt(x.slower, 0.3);
    /* One stall that alone costs a window +100% (a report at +500%) is not a straggler: the
     * window before was even. */
    double once[50] = {2, 2, 2, 2, 2, 2, 2, 12};
    for (int i = 8; i < 50; i++)
        once[i] = 2;
    ck_assert_int_eq(named_at(once, 50, 50, &x), 0);
    /* A rank that is slow only now and then, below the threshold on the whole (one report of
     * five at +100%: +20%), is not. */
    double spiky[] = {2, 2, 4, 2, 2};
    ck_assert_int_eq(named_at(spiky, 5, 200, &x), 0);
}

/* A deterministic generator, [0, 1). */
static double lcg(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*state >> 11) / 9007199254740992.0;
}

/* 500 reports of 20 to 40 steps on 8 ranks: background load slows every rank alike, three times
 * over in a fifth of the reports, and each rank has noise of its own in every interval, from
 * lo to hi of the unloaded step. Returns how many reports named someone. */
static int noisy_run(const dl_diag_straggler_opts_t *o, double lo, double hi, uint64_t seed)
{
    sim_t s;
    sim_init(&s, 8, o);
    double c[N];
    for (int r = 0; r < 8; r++)
        c[r] = 2;
    report(&s, 8, 0, c);
    int named = 0;
    for (int i = 0; i < 500; i++) {
        double load = lcg(&seed) < 0.2 ? 3 : 1;
        for (int r = 0; r < 8; r++)
            c[r] = 2 * load + 2 * (lo + (hi - lo) * lcg(&seed));
        named += report(&s, 8, 20 + (int)(20 * lcg(&seed)), c).nstragglers > 0;
    }
    dl_diag_judge_free(s.j);
    return named;
}

DL_TEST(noise_on_every_rank_or_load_on_all_names_nobody)
{
    dl_diag_straggler_opts_t o;
    dl_diag_straggler_opts_init(&o);
    for (uint64_t seed = 1; seed <= 10; seed++) {
        /* Up to +25% in any interval, with the default window of 100 steps. */
        ck_assert_int_eq(noisy_run(&o, -0.15, 0.25, seed), 0);
    }
    /* Noise over the threshold in a sixth of the intervals (-20% to +40%) averages out over a
     * window of a dozen intervals, not over the default's three or four: a noisy machine
     * wants a longer window (docs/diagnostics.md). */
    o.window = 300;
    for (uint64_t seed = 1; seed <= 10; seed++)
        ck_assert_int_eq(noisy_run(&o, -0.2, 0.4, seed), 0);
}

DL_TEST(an_even_or_noisy_job_names_nobody)
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
    dl_diag_judge_free(s.j);
}

DL_TEST(a_rank_that_recovers_is_cleared)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4}, even[N] = {2, 2};
    report(&s, 2, 0, slow);
    for (int i = 0; i < 6; i++)
        report(&s, 2, 50, slow);
    dl_diag_view_t v;
    dl_diag_judge_view(s.j, &v);
    ck_assert_uint_eq(v.nstragglers, 1);
    v = report(&s, 2, 50, even);
    ck_assert_uint_eq(v.nstragglers, 1); /* one good report is not enough */
    /* Nor a window that began before it was named, even one back under the limit. */
    v = report(&s, 2, 50, even);
    ck_assert_uint_eq(v.nstragglers, 1);
    v = report(&s, 2, 50, even);
    ck_assert_uint_eq(v.nstragglers, 0);
    ck_assert_uint_eq(v.ncleared, 1);
    ck_assert_int_eq(v.cleared[0], 1);
    dl_diag_judge_free(s.j);
}

DL_TEST(a_restarted_worker_starts_over)
{
    sim_t s;
    sim_init(&s, 2, NULL);
    double slow[N] = {2, 4};
    report(&s, 2, 0, slow);
    report(&s, 2, 50, slow);
    report(&s, 2, 50, slow);
    /* Rank 1's worker started again: its sums went down. Its next interval starts there. */
    s.t[1].steps = s.t[1].compute_ms = s.t[1].wait_ms = s.t[1].samples = 0;
    DL_CHECK_ERRNO(dl_diag_judge_feed(s.j, &s.t[1], 1), 0);
    dl_diag_view_t v;
    DL_CHECK_ERRNO(dl_diag_judge_eval(s.j, &v), 0);
    ck_assert_uint_eq(v.nstragglers, 0);
    v = report(&s, 2, 50, slow);
    ck_assert_uint_eq(v.nstragglers, 0);
    dl_diag_judge_reset(s.j);
    dl_diag_judge_view(s.j, &v);
    ck_assert_int_eq(v.ranks, 0);
    ck_assert_int_eq(v.slowest_rank, -1);
    dl_diag_judge_free(s.j);
}

DL_TEST(settings_are_checked)
{
    dl_diag_straggler_opts_t o;
    dl_diag_judge_t *j = NULL;
    dl_diag_straggler_opts_init(&o);
    ck_assert_double_eq_tol(o.threshold, 0.3, 1e-12);
    ck_assert_uint_eq(o.window, 100);
    o.threshold = 0;
    DL_CHECK_ERRNO(dl_diag_judge_new(&o, &j), -EINVAL);
    ck_assert_ptr_null(j);
    dl_diag_straggler_opts_init(&o);
    DL_CHECK_ERRNO(dl_diag_judge_new(&o, &j), 0);
    dl_diag_totals_t bad = {.rank = -1};
    DL_CHECK_ERRNO(dl_diag_judge_feed(j, &bad, 1), -EINVAL);
    dl_diag_judge_free(j);
    j = NULL;
    o.min_reports = 8; /* more than the snapshots a rank keeps can span */
    DL_CHECK_ERRNO(dl_diag_judge_new(&o, &j), -EINVAL);
    o.min_reports = 3;
    o.threshold = NAN;
    DL_CHECK_ERRNO(dl_diag_judge_new(&o, &j), -EINVAL);
    ck_assert_ptr_null(j);
    dl_diag_judge_free(NULL);
}
