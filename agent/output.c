/* Worker output. Files get the bytes exactly as written; the console gets whole lines with a
 * prefix, one writev per line, so lines of different workers never mix mid-line. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "linebuf.h"
#include "output.h"
#include "ownfile.h"

typedef struct {
    dl_output_t *owner;
    uv_pipe_t pipe;
    int file_fd;
    int console_fd;
    bool open;        /* the pipe handle is initialized and not yet closing */
    bool echo;        /* lines go to the console too */
    bool via_cb;      /* ...through the line callback only */
    bool file_failed; /* a write to the file failed: said once, then the file is left alone */
    char path[4096];
    dl_linebuf_t lb;
} stream_t;

struct dl_output_s {
    stream_t s[2];
    uv_timer_t drain;
    int refs;           /* the owner's, plus one per handle whose close callback has not run */
    bool drain_started; /* the owner let go: the drained callback is due when the last ref goes */
    dl_output_cbs_t cbs;
    void *ctx;
    char *readbuf;
    size_t readbuf_len;
    char prefix[256];
    size_t prefix_len;
};

/* Returns 0 or -errno. */
static int write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static void echo_line(void *ctx, const char *line, size_t len)
{
    stream_t *s = ctx;
    struct iovec iov[3] = {
        {s->owner->prefix, s->owner->prefix_len},
        {(void *)line, len},
        {"\n", 1},
    };
    /* A closed console must not stop the job; the files keep everything. */
    if (!s->via_cb)
        (void)write_all(s->console_fd, iov, 3);
    if (s->owner->cbs.line != NULL)
        s->owner->cbs.line(s->owner->ctx, s == &s->owner->s[0] ? 0 : 1, s->owner->prefix, line,
                           len);
}

static void release(dl_output_t *o)
{
    if (--o->refs > 0)
        return;
    if (o->drain_started && o->cbs.drained != NULL)
        o->cbs.drained(o->ctx);
    for (int i = 0; i < 2; i++) {
        dl_linebuf_free(&o->s[i].lb);
        if (o->s[i].file_fd >= 0)
            close(o->s[i].file_fd);
    }
    free(o);
}

static void pipe_closed(uv_handle_t *h)
{
    stream_t *s = h->data;
    release(s->owner);
}

static void timer_closed(uv_handle_t *h)
{
    release(h->data);
}

static void stream_close(stream_t *s)
{
    if (!s->open)
        return;
    s->open = false;
    if (s->echo)
        dl_linebuf_flush(&s->lb, echo_line, s);
    uv_close((uv_handle_t *)&s->pipe, pipe_closed);
    dl_output_t *o = s->owner;
    if (!o->s[0].open && !o->s[1].open && !uv_is_closing((uv_handle_t *)&o->drain))
        uv_close((uv_handle_t *)&o->drain, timer_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    stream_t *s = h->data;
    *buf = uv_buf_init(s->owner->readbuf, (unsigned int)s->owner->readbuf_len);
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf)
{
    stream_t *s = h->data;
    if (nread > 0) {
        struct iovec iov = {buf->base, (size_t)nread};
        int r = s->file_failed ? 0 : write_all(s->file_fd, &iov, 1);
        if (r < 0) {
            s->file_failed = true;
            if (s->owner->cbs.write_failed != NULL)
                s->owner->cbs.write_failed(s->owner->ctx, s->path, -r);
        }
        if (s->echo)
            dl_linebuf_feed(&s->lb, buf->base, (size_t)nread, echo_line, s);
    } else if (nread < 0) {
        stream_close(s);
    }
}

static void on_drain_timeout(uv_timer_t *t)
{
    dl_output_t *o = t->data;
    stream_close(&o->s[0]);
    stream_close(&o->s[1]);
}

void dl_output_drain(dl_output_t *o, uint64_t timeout_ms)
{
    o->drain_started = true;
    if (o->s[0].open || o->s[1].open)
        uv_timer_start(&o->drain, on_drain_timeout, timeout_ms, 0);
    release(o);
}

static int open_log(stream_t *s, const char *dir, int rank, const char *ext)
{
    if (rank < 0)
        snprintf(s->path, sizeof(s->path), "%s/spare_%d.%s", dir, -1 - rank, ext);
    else
        snprintf(s->path, sizeof(s->path), "%s/rank_%d.%s", dir, rank, ext);
    /* The log folder may be on shared storage: no symbolic link, FIFO or another's file. */
    int fd = dl_ownfile_open(s->path, O_WRONLY | O_CREAT | O_APPEND, 0640);
    if (fd < 0)
        return fd;
    s->file_fd = fd;
    return 0;
}

void dl_output_set_prefix(dl_output_t *o, const char *prefix)
{
    snprintf(o->prefix, sizeof(o->prefix), "%s", prefix);
    o->prefix_len = strlen(o->prefix);
}

int dl_output_open(uv_loop_t *loop, const char *attempt_dir, int rank, const char *prefix,
                   unsigned echo, char *readbuf, size_t readbuf_len, const dl_output_cbs_t *cbs,
                   void *ctx, dl_output_t **ret, int *ret_child_out, int *ret_child_err)
{
    dl_output_t *o = calloc(1, sizeof(*o));
    int fds[2][2] = {{-1, -1}, {-1, -1}};
    int r;

    if (o == NULL)
        return -ENOMEM;
    o->s[0].file_fd = o->s[1].file_fd = -1;
    r = open_log(&o->s[0], attempt_dir, rank, "out");
    if (r == 0)
        r = open_log(&o->s[1], attempt_dir, rank, "err");
    if (r == 0 && pipe2(fds[0], O_CLOEXEC) < 0)
        r = -errno;
    if (r == 0 && pipe2(fds[1], O_CLOEXEC) < 0)
        r = -errno;
    if (r < 0)
        goto fail;

    o->refs = 1; /* the owner's, given back by dl_output_drain() */
    if (cbs != NULL)
        o->cbs = *cbs;
    o->ctx = ctx;
    o->readbuf = readbuf;
    o->readbuf_len = readbuf_len;
    snprintf(o->prefix, sizeof(o->prefix), "%s", prefix);
    o->prefix_len = strlen(o->prefix);
    for (int i = 0; i < 2; i++) {
        stream_t *s = &o->s[i];
        s->owner = o;
        s->console_fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
        s->echo = (echo & (i == 0 ? DL_OUTPUT_ECHO_OUT : DL_OUTPUT_ECHO_ERR)) != 0;
        s->via_cb = (echo & DL_OUTPUT_ECHO_VIA_CB) != 0 && cbs != NULL && cbs->line != NULL;
        dl_linebuf_init(&s->lb);
        uv_pipe_init(loop, &s->pipe, 0);
        s->pipe.data = s;
        o->refs++;
        s->open = true;
        /* From here the handle owns the read end, even if opening it fails. */
        r = uv_pipe_open(&s->pipe, fds[i][0]);
        fds[i][0] = -1;
        if (r == 0)
            r = uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read);
        if (r < 0)
            break;
    }
    uv_timer_init(loop, &o->drain);
    o->drain.data = o;
    o->refs++;
    if (r < 0) {
        /* Closing through the handles keeps the one free path: release(). */
        o->s[0].echo = o->s[1].echo = false;
        o->cbs = (dl_output_cbs_t){0};
        for (int i = 0; i < 2; i++) {
            if (fds[i][0] >= 0)
                close(fds[i][0]);
            close(fds[i][1]);
            if (o->s[i].open) {
                o->s[i].open = false;
                uv_close((uv_handle_t *)&o->s[i].pipe, pipe_closed);
            }
        }
        uv_close((uv_handle_t *)&o->drain, timer_closed);
        release(o);
        return r;
    }
    *ret = o;
    *ret_child_out = fds[0][1];
    *ret_child_err = fds[1][1];
    return 0;

fail:
    for (int i = 0; i < 2; i++) {
        if (o->s[i].file_fd >= 0)
            close(o->s[i].file_fd);
        if (fds[i][0] >= 0) {
            close(fds[i][0]);
            close(fds[i][1]);
        }
    }
    free(o);
    return r;
}
