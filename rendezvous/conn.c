/* Framed connections. Reads land in one buffer of the owner's, so an idle connection costs only
 * its handle and decoder (a few hundred bytes): thousands of agents fit in a few MiB. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"

typedef struct {
    uv_write_t req;
    dl__conn_t *conn;
    size_t len;
    char *frame;
} write_req_t;

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    dl__conn_t *c = (dl__conn_t *)h;
    *buf = uv_buf_init(c->readbuf, (unsigned int)c->readbuf_len);
}

/* Keeps the owner's count of held bytes in step with the decoder. Returns false when this
 * connection's growth took the count over the owner's limit. */
static bool update_held(dl__conn_t *c)
{
    size_t now = dl_proto_decoder_buffered(&c->dec), before = c->held;
    if (c->held_total == NULL)
        return true;
    *c->held_total = *c->held_total - c->held + now;
    if (c->held_job != NULL)
        *c->held_job = *c->held_job - c->held + now;
    c->held = now;
    return now <= before || (*c->held_total <= c->held_limit &&
                             (c->held_job == NULL || *c->held_job <= c->held_job_limit));
}

static void on_closed(uv_handle_t *h)
{
    dl__conn_t *c = (dl__conn_t *)h;
    dl_proto_decoder_cleanup(&c->dec);
    update_held(c);
    if (c->on_closed != NULL)
        c->on_closed(c, c->close_status);
}

void dl__conn_close(dl__conn_t *c, int status)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_status = status;
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    /* uv_close cancels pending writes; their callbacks still run and free the frames. */
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    dl__conn_t *c = (dl__conn_t *)s;
    const char *p = buf->base;
    size_t left = nread > 0 ? (size_t)nread : 0;

    if (nread < 0) {
        dl__conn_close(c, (int)nread);
        return;
    }
    bool completed = false;
    while (left > 0 && !c->closing) {
        json_t *msg = NULL;
        dl_proto_type_t type;
        dl_proto_error_t err;
        size_t used = 0;
        int r = dl_proto_decoder_feed(&c->dec, p, left, &used, &msg, &type, &err);
        p += used;
        left -= used;
        if (r != DL_PROTO_NEED_MORE) {
            c->last_frame = uv_now(c->tcp.loop);
            completed = true;
        }
        if (r == DL_PROTO_MESSAGE) {
            c->on_message(c, msg, type);
            json_decref(msg);
        } else if (r == DL_PROTO_INVALID) {
            c->on_invalid(c, &err, false);
        } else if (r < 0) {
            c->on_invalid(c, &err, true);
            dl__conn_close(c, UV_EPROTO);
        }
    }
    /* A frame left unfinished began in this read if one finished in it: a client that streams
     * frames back to back, every read ending inside the next one, is no slow sender. */
    bool pending = dl_proto_decoder_pending(&c->dec);
    if (!pending)
        c->pending_since = 0;
    else if (completed || c->pending_since == 0)
        c->pending_since = uv_now(c->tcp.loop);
    if (!update_held(c) && !c->closing) {
        json_auto_t *m = dl_proto_error_new(-1, DL_PROTO_E_LIMIT_EXCEEDED,
                                            "the server (or this job) holds too many "
                                            "unfinished frames; closing");
        if (m != NULL)
            dl__conn_send(c, m);
        dl__conn_close(c, UV_ENOBUFS);
    }
}

static void on_written(uv_write_t *req, int status)
{
    write_req_t *w = (write_req_t *)req;
    dl__conn_t *c = w->conn;
    c->queued -= w->len;
    if (c->queued_total != NULL)
        *c->queued_total -= w->len;
    free(w->frame);
    free(w);
    if (status < 0 && status != UV_ECANCELED)
        dl__conn_close(c, status);
}

int dl__conn_init(uv_loop_t *loop, dl__conn_t *c, uint32_t limit, char *readbuf, size_t readbuf_len)
{
    memset(c, 0, sizeof(*c));
    c->readbuf = readbuf;
    c->readbuf_len = readbuf_len;
    dl_proto_decoder_init(&c->dec, limit);
    c->max_queued = 64u << 20;
    c->last_frame = uv_now(loop);
    return uv_tcp_init(loop, &c->tcp);
}

int dl__conn_start(dl__conn_t *c)
{
    uv_tcp_nodelay(&c->tcp, 1);
    int r = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (r == 0)
        c->reading = true;
    return r;
}

int dl__conn_send(dl__conn_t *c, const json_t *msg)
{
    char *frame;
    size_t len;
    int r;

    if (c->closing)
        return -EPIPE;
    r = dl_proto_encode(msg, &frame, &len, NULL);
    if (r < 0)
        return r;
    /* Try the fast path first: most frames go out whole at once and need no request. */
    uv_buf_t b = uv_buf_init(frame, (unsigned int)len);
    if (c->queued == 0) {
        int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (n == (int)len) {
            free(frame);
            return 0;
        }
        if (n > 0) {
            b.base += n;
            b.len -= (size_t)n;
        }
    }
    /* One frame waiting is always allowed (a full store must not cut off every reader); a
     * backlog beyond it takes from the owner's budget. */
    if (c->queued + b.len > c->max_queued ||
        (c->queue_room != NULL && c->queued > 0 && b.len > c->queue_room(c))) {
        free(frame);
        dl__conn_close(c, UV_ENOBUFS);
        return -ENOBUFS;
    }
    write_req_t *w = malloc(sizeof(*w));
    if (w == NULL) {
        free(frame);
        return -ENOMEM;
    }
    w->conn = c;
    w->frame = frame;
    w->len = b.len;
    r = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written);
    if (r < 0) {
        free(frame);
        free(w);
        dl__conn_close(c, r);
        return r;
    }
    c->queued += w->len;
    if (c->queued_total != NULL)
        *c->queued_total += w->len;
    return 0;
}

void dl__conn_peer(const dl__conn_t *c, char *buf, size_t len)
{
    struct sockaddr_storage sa;
    int n = sizeof(sa);
    char host[64] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &n) == 0) {
        if (sa.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&sa, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        } else if (sa.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&sa, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
        }
    }
    snprintf(buf, len, "%s:%d", host, port);
}
