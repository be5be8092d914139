/* Health beats: bare bytes, lines with figures, lines in pieces, junk, and the sums the straggler
 * rule reads. */
#include <math.h>
#include <string.h>

#include "diag.h"
#include "dl-test.h"

static int feed(dl_diag_beats_t *b, const char *s, double now)
{
    return dl_diag_beats_feed(b, s, strlen(s), now);
}

DL_TEST(bare_bytes_are_beats)
{
    dl_diag_beats_t b;
    dl_diag_beats_init(&b);
    ck_assert_int_eq(feed(&b, "....", 1.5), 0);
    ck_assert_uint_eq(b.beats, 1);
    ck_assert(b.last_beat == 1.5);
    ck_assert(!b.figures);
    ck_assert_int_eq(feed(&b, "beat\n", 2.0), 0);
    ck_assert_uint_eq(b.beats, 2);
    ck_assert(b.last_beat == 2.0);
    ck_assert(!b.figures);
    ck_assert(isnan(b.loss));
    /* A worker that only ever writes dots: the line stays bounded. */
    for (int i = 0; i < 2000; i++)
        feed(&b, ".", 3.0);
    ck_assert_uint_lt(b.partial_len, sizeof(b.partial));
    ck_assert(!b.figures);
}

DL_TEST(a_line_carries_figures)
{
    dl_diag_beats_t b;
    dl_diag_beats_init(&b);
    ck_assert_int_eq(feed(&b, "step=812 compute_ms=3.1 wait_ms=0.4 loss=0.52 samples=256\n", 1), 1);
    ck_assert(b.figures);
    ck_assert_uint_eq(b.step, 812);
    ck_assert_double_eq_tol(b.compute_ms, 3.1, 1e-9);
    ck_assert_double_eq_tol(b.wait_ms, 0.4, 1e-9);
    ck_assert_double_eq_tol(b.loss, 0.52, 1e-9);
    ck_assert_double_eq_tol(b.samples, 256, 1e-9);
    ck_assert_double_eq_tol(b.total_steps, 1, 1e-9);
    ck_assert_double_eq_tol(b.total_compute_ms, 3.1, 1e-9);
    /* steps=K: the means hold for K steps, and the sums grow by K of them. */
    ck_assert_int_eq(feed(&b, "step=852 steps=40 compute_ms=2 wait_ms=1 samples=64 new_key=x\n", 2),
                     1);
    ck_assert_uint_eq(b.step, 852);
    ck_assert(isnan(b.loss));
    ck_assert_double_eq_tol(b.total_steps, 41, 1e-9);
    ck_assert_double_eq_tol(b.total_compute_ms, 3.1 + 80, 1e-9);
    ck_assert_double_eq_tol(b.total_wait_ms, 0.4 + 40, 1e-9);
    ck_assert_double_eq_tol(b.total_samples, 256 + 40 * 64, 1e-9);
    ck_assert_uint_eq(b.beats, 2);
}

DL_TEST(lines_may_come_in_pieces)
{
    dl_diag_beats_t b;
    dl_diag_beats_init(&b);
    ck_assert_int_eq(feed(&b, "step=1 comp", 1), 0);
    ck_assert_int_eq(feed(&b, "ute_ms=2.5\nstep=2 compute_ms=3.5\nstep=", 2), 2);
    ck_assert_uint_eq(b.step, 2);
    ck_assert_double_eq_tol(b.total_compute_ms, 6.0, 1e-9);
    ck_assert_int_eq(feed(&b, "3 compute_ms=1\r\n", 3), 1);
    ck_assert_uint_eq(b.step, 3);
    /* Cut before its first '=' (a read of the pipe may end anywhere). */
    ck_assert_int_eq(feed(&b, "ste", 4), 0);
    ck_assert_int_eq(feed(&b, "p=4 compute_ms=1\n", 4), 1);
    ck_assert_uint_eq(b.step, 4);
}

DL_TEST(junk_is_a_beat_and_nothing_more)
{
    dl_diag_beats_t b;
    dl_diag_beats_init(&b);
    ck_assert_int_eq(feed(&b, "step=-4 compute_ms=1\n", 1), 0);
    ck_assert_int_eq(feed(&b, "step=x compute_ms=1\n", 1), 0);
    ck_assert_int_eq(feed(&b, "step=1e400\n", 1), 0);
    ck_assert_int_eq(feed(&b, "=== step= compute_ms=\n", 1), 0);
    ck_assert(!b.figures);
    /* A bad value drops that key only. */
    ck_assert_int_eq(feed(&b, "step=5 compute_ms=nan wait_ms=-1 loss=-0.5\n", 1), 1);
    ck_assert_uint_eq(b.step, 5);
    ck_assert_double_eq_tol(b.loss, -0.5, 1e-9);
    ck_assert_double_eq_tol(b.total_steps, 0, 1e-9); /* untimed: not in the sums */
    /* An overlong line is dropped whole; the next one counts. */
    char big[2000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "step=9 ", 7);
    ck_assert_int_eq(feed(&b, big, 2), 0);
    ck_assert_int_eq(feed(&b, "\nstep=10 compute_ms=1\n", 3), 1);
    ck_assert_uint_eq(b.step, 10);
}
