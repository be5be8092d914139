/* Whole lines out of a byte stream. Lines that arrive complete in one read are passed straight
 * from the caller's buffer; only a partial tail is copied. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "linebuf.h"

void dl_linebuf_init(dl_linebuf_t *lb)
{
    memset(lb, 0, sizeof(*lb));
}

void dl_linebuf_free(dl_linebuf_t *lb)
{
    if (lb == NULL)
        return;
    free(lb->buf);
    dl_linebuf_init(lb);
}

static int append(dl_linebuf_t *lb, const char *data, size_t n)
{
    if (lb->len + n > lb->cap) {
        size_t cap = lb->cap ? lb->cap : 256;
        while (cap < lb->len + n)
            cap *= 2;
        char *p = realloc(lb->buf, cap);
        if (p == NULL)
            return -ENOMEM;
        lb->buf = p;
        lb->cap = cap;
    }
    memcpy(lb->buf + lb->len, data, n);
    lb->len += n;
    return 0;
}

int dl_linebuf_feed(dl_linebuf_t *lb, const char *data, size_t n, dl_linebuf_line_cb cb, void *ctx)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl != NULL ? (size_t)(nl - data) : n;

        if (lb->len + take >= DL_LINEBUF_MAX_LINE) {
            /* Over-long line: emit what fits as a line of its own. */
            size_t room = DL_LINEBUF_MAX_LINE - lb->len;
            if (append(lb, data, room) < 0) {
                cb(ctx, data, n);
                return -ENOMEM;
            }
            cb(ctx, lb->buf, lb->len);
            lb->len = 0;
            data += room;
            n -= room;
            continue;
        }
        if (nl == NULL) {
            if (append(lb, data, n) < 0) {
                cb(ctx, data, n);
                return -ENOMEM;
            }
            return 0;
        }
        if (lb->len == 0) {
            cb(ctx, data, take);
        } else {
            if (append(lb, data, take) < 0) {
                cb(ctx, lb->buf, lb->len);
                lb->len = 0;
                cb(ctx, data, take);
                return -ENOMEM;
            }
            cb(ctx, lb->buf, lb->len);
            lb->len = 0;
        }
        data += take + 1;
        n -= take + 1;
    }
    return 0;
}

void dl_linebuf_flush(dl_linebuf_t *lb, dl_linebuf_line_cb cb, void *ctx)
{
    if (lb->len > 0) {
        cb(ctx, lb->buf, lb->len);
        lb->len = 0;
    }
}
