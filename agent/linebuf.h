/* Splits a byte stream into whole lines. Pure: no I/O. */
#ifndef DL_LINEBUF_H
#define DL_LINEBUF_H

#include <stddef.h>

/* A line longer than this is cut into pieces of this size, so one worker printing without
 * newlines cannot grow the agent without bound. */
#define DL_LINEBUF_MAX_LINE (64 * 1024)

/* Called for each line, without its '\n'. */
typedef void (*dl_linebuf_line_cb)(void *ctx, const char *line, size_t len);

typedef struct dl_linebuf_s {
    char *buf; /* the partial line, owned */
    size_t len;
    size_t cap;
} dl_linebuf_t;

void dl_linebuf_init(dl_linebuf_t *lb);
void dl_linebuf_free(dl_linebuf_t *lb);

/* Feeds n bytes; calls cb for every completed line. Returns 0 or -ENOMEM (the bytes of that
 * call that could not be buffered are passed to cb as a line first, so nothing is lost). */
int dl_linebuf_feed(dl_linebuf_t *lb, const char *data, size_t n, dl_linebuf_line_cb cb, void *ctx);

/* Emits the partial last line, if any (at end of stream). */
void dl_linebuf_flush(dl_linebuf_t *lb, dl_linebuf_line_cb cb, void *ctx);

#endif
