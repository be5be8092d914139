/* Whole lines out of arbitrary reads. */
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "linebuf.h"

typedef struct {
    char out[1 << 20];
    size_t len;
    int lines;
} sink_t;

static void collect(void *ctx, const char *line, size_t len)
{
    sink_t *s = ctx;
    memcpy(s->out + s->len, line, len);
    s->len += len;
    s->out[s->len++] = '|';
    s->lines++;
}

static sink_t sink;

DL_TEST(split_at_every_boundary)
{
    const char *text = "alpha\nbeta\n\ngamma delta\nlast";
    size_t n = strlen(text);
    for (size_t cut = 0; cut <= n; cut++) {
        dl_linebuf_t lb;
        memset(&sink, 0, sizeof(sink));
        dl_linebuf_init(&lb);
        DL_CHECK_ERRNO(dl_linebuf_feed(&lb, text, cut, collect, &sink), 0);
        DL_CHECK_ERRNO(dl_linebuf_feed(&lb, text + cut, n - cut, collect, &sink), 0);
        sink.out[sink.len] = '\0';
        ck_assert_str_eq(sink.out, "alpha|beta||gamma delta|");
        dl_linebuf_flush(&lb, collect, &sink);
        sink.out[sink.len] = '\0';
        ck_assert_str_eq(sink.out, "alpha|beta||gamma delta|last|");
        dl_linebuf_free(&lb);
    }
}

DL_TEST(byte_at_a_time)
{
    const char *text = "one\ntwo\nthree\n";
    dl_linebuf_t lb;
    memset(&sink, 0, sizeof(sink));
    dl_linebuf_init(&lb);
    for (const char *p = text; *p != '\0'; p++)
        dl_linebuf_feed(&lb, p, 1, collect, &sink);
    dl_linebuf_flush(&lb, collect, &sink); /* nothing partial: no extra line */
    sink.out[sink.len] = '\0';
    ck_assert_str_eq(sink.out, "one|two|three|");
    ck_assert_int_eq(sink.lines, 3);
    dl_linebuf_free(&lb);
}

DL_TEST(overlong_line_is_cut_not_lost)
{
    size_t n = DL_LINEBUF_MAX_LINE * 2 + 100;
    char *big = malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\n';
    dl_linebuf_t lb;
    memset(&sink, 0, sizeof(sink));
    dl_linebuf_init(&lb);
    for (size_t off = 0; off <= n; off += 1000)
        dl_linebuf_feed(&lb, big + off, off + 1000 <= n + 1 ? 1000 : n + 1 - off, collect, &sink);
    ck_assert_int_eq(sink.lines, 3);
    ck_assert_uint_eq(sink.len, n + 3); /* every byte plus one separator a piece */
    ck_assert_uint_le(lb.cap, DL_LINEBUF_MAX_LINE * 2);
    dl_linebuf_free(&lb);
    free(big);
}
