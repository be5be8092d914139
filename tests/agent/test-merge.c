/* --merge-output's core (merge.h): what the terminal shows for lines of several ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "merge.h"

static char out[64][300];
static int nout;

static void record(void *ctx, int stream, const char *ranks, const char *line, size_t len)
{
    (void)ctx;
    /* Counts every line; keeps the first 64 to compare. */
    if (nout < 64)
        snprintf(out[nout], sizeof(out[0]), "%d [%s] %.*s", stream, ranks, (int)len, line);
    nout++;
}

static void feed(dl_merge_t *m, int stream, int rank, const char *line, double now)
{
    DL_CHECK_ERRNO(dl_merge_line(m, stream, rank, line, strlen(line), now), 0);
}

DL_TEST(the_same_line_from_eight_ranks_is_printed_once)
{
    dl_merge_t m;
    nout = 0;
    dl_merge_init(&m, 0.2, record, NULL);
    for (int r = 7; r >= 0; r--)
        feed(&m, 0, r, "epoch 1 loss 0.25", 1.0 + r * 0.01);
    ck_assert_int_eq(nout, 0);
    ck_assert(dl_merge_next(&m) > 1.0);
    dl_merge_due(&m, 1.15);
    ck_assert_int_eq(nout, 0);
    dl_merge_due(&m, 1.3);
    ck_assert_int_eq(nout, 1);
    ck_assert_str_eq(out[0], "0 [ranks 0-7] epoch 1 loss 0.25");
    ck_assert(dl_merge_next(&m) < 0);
}

DL_TEST(different_lines_streams_and_late_ranks_stay_apart)
{
    dl_merge_t m;
    nout = 0;
    dl_merge_init(&m, 0.2, record, NULL);
    feed(&m, 0, 0, "hello", 1.0);
    feed(&m, 0, 2, "hello", 1.0);
    feed(&m, 0, 3, "hello", 1.0);
    feed(&m, 0, 5, "hello", 1.0);
    feed(&m, 1, 1, "hello", 1.0); /* stderr: its own line */
    feed(&m, 0, 1, "rank one only", 1.0);
    feed(&m, 0, 6, "hello", 1.5); /* after the window: a line of its own */
    dl_merge_flush(&m);
    ck_assert_int_eq(nout, 4);
    ck_assert_str_eq(out[0], "0 [ranks 0,2-3,5] hello");
    ck_assert_str_eq(out[1], "1 [rank 1] hello");
    ck_assert_str_eq(out[2], "0 [rank 1] rank one only");
    ck_assert_str_eq(out[3], "0 [rank 6] hello");
}

DL_TEST(a_ranks_own_repeated_line_is_never_folded)
{
    dl_merge_t m;
    nout = 0;
    dl_merge_init(&m, 1.0, record, NULL);
    feed(&m, 0, 0, "tick", 1.0);
    feed(&m, 0, 1, "tick", 1.0);
    feed(&m, 0, 0, "tick", 1.1);
    ck_assert_int_eq(nout, 1);
    ck_assert_str_eq(out[0], "0 [ranks 0-1] tick");
    dl_merge_flush(&m);
    ck_assert_int_eq(nout, 2);
    ck_assert_str_eq(out[1], "0 [rank 0] tick");
}

DL_TEST(a_flood_of_distinct_lines_is_bounded_and_loses_nothing)
{
    dl_merge_t m;
    nout = 0;
    dl_merge_init(&m, 10.0, record, NULL);
    char line[32];
    int printed = 0;
    for (int i = 0; i < DL_MERGE_MAX_PENDING + 40; i++) {
        snprintf(line, sizeof(line), "line %d", i);
        feed(&m, 0, 0, line, 1.0);
        printed += nout;
        nout = 0;
    }
    ck_assert_uint_eq(m.n, DL_MERGE_MAX_PENDING);
    ck_assert_int_eq(printed, 40);
    dl_merge_flush(&m);
    ck_assert_int_eq(printed + nout, DL_MERGE_MAX_PENDING + 40);
    ck_assert_uint_eq(m.n, 0);
}
