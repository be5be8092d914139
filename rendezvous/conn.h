/* A framed JSON connection over libuv TCP, shared by the rendezvous server and its clients:
 * bytes in go through the proto decoder, messages out are encoded and queued. Internal to
 * rendezvous/. */
#ifndef DL_RDZV_CONN_H
#define DL_RDZV_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "proto.h"

typedef struct dl__conn_s dl__conn_t;

/* A valid message arrived; msg is borrowed for the call. */
typedef void (*dl__conn_message_cb)(dl__conn_t *c, json_t *msg, dl_proto_type_t type);
/* A frame was invalid (fatal: the stream is unusable and the connection is closing). The
 * callee decides whether to answer; err is borrowed. */
typedef void (*dl__conn_invalid_cb)(dl__conn_t *c, const dl_proto_error_t *err, bool fatal);
/* The connection is gone (peer closed, error, or dl__conn_close); called once, after which the
 * memory belongs to the owner again (free it here if it was malloc'd). status: 0 for a close
 * we asked for, else a libuv error (UV_EOF for a peer that hung up). */
typedef void (*dl__conn_closed_cb)(dl__conn_t *c, int status);

struct dl__conn_s {
    uv_tcp_t tcp; /* first: the handle's address is the connection's */
    dl_proto_decoder_t dec;
    dl__conn_message_cb on_message;
    dl__conn_invalid_cb on_invalid;
    dl__conn_closed_cb on_closed;
    void *data;
    uint64_t id;
    char *readbuf; /* the owner's, shared by all its connections on this thread */
    size_t readbuf_len;
    size_t queued;     /* bytes written but not yet acknowledged by libuv */
    size_t max_queued; /* a peer that reads slower than this much backlog is cut off */
    /* The owner's count of every connection's queued bytes (NULL: not counted), and how much
     * more they may queue together (NULL: no bound but max_queued): a peer with a frame waiting
     * already whose next one does not fit is cut off as one over max_queued is. */
    size_t *queued_total;
    size_t (*queue_room)(const dl__conn_t *c);
    /* The owner's count of bytes every connection's decoder holds for frames that arrived in
     * part (NULL: not counted), and this connection's share of it. */
    size_t *held_total;
    size_t held;
    size_t held_limit; /* past it, the connection whose frame grew is closed */
    /* The same for the job the connection authenticated for (NULL before, or not counted), so
     * that one job's clients cannot take the whole pool from the others. */
    size_t *held_job;
    size_t held_job_limit;
    uint64_t last_frame;    /* uv_now() when the last whole frame came in (or the start) */
    uint64_t pending_since; /* uv_now() when the frame in progress began, 0 when none is */
    int close_status;
    bool closing;
    bool reading;
};

/* Prepares c on loop (the tcp handle is initialized here). The caller then either accepts into
 * &c->tcp or connects it, and calls dl__conn_start. limit: the decoder's frame cap. readbuf:
 * scratch space for reads, shared by every connection of the owner (one read is handled at a
 * time on a loop). */
int dl__conn_init(uv_loop_t *loop, dl__conn_t *c, uint32_t limit, char *readbuf,
                  size_t readbuf_len);

/* Starts reading. Returns 0 or a libuv error (then close with dl__conn_close). */
int dl__conn_start(dl__conn_t *c);

/* Encodes and queues msg (borrowed). Returns 0 or -errno: -EBADMSG/-EMSGSIZE for a message the
 * protocol refuses (a bug of ours), -EPIPE when closing, -ENOBUFS when the peer is not reading
 * (the connection is then being closed). */
int dl__conn_send(dl__conn_t *c, const json_t *msg);

/* Closes after what was queued is flushed as far as the kernel takes it. Idempotent. */
void dl__conn_close(dl__conn_t *c, int status);

/* "127.0.0.1:50312" of the peer, for logs. */
void dl__conn_peer(const dl__conn_t *c, char *buf, size_t len);

#endif
