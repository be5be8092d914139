/* The job's store in PyTorch's TCPStore protocol: the libuv shell around torch-codec.c. Each
 * query becomes one or more store events of the rendezvous core, whose answers arrive
 * synchronously (captured in the connection's `got`) except a WAIT's, which may come later.
 * Everything a query does happens in one turn of the loop, so a compare-set or an append made of
 * a get and a set is as atomic as torch's own. Torch clients carry no credential: only loopback
 * and the addresses of the job's joined agents may connect. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigzero.h"
#include "peer.h"
#include "torch-codec.h"
#include "torch-queue.h"
#include "torch-store.h"

#define READ_SIZE (64 * 1024)
/* A client that does not read its answers is closed past this many unsent bytes. */
#define MAX_UNSENT ((size_t)64 << 20)
/* Torch 1.13's key watches (WATCH_KEY) a store holds; every write to a watched key is
 * O(watches), and torch's own Python API never sends one. */
#define MAX_WATCHES 4096
/* A connection id's slot and generation (torch-store.h). */
#define SLOT_MAX ((size_t)1 << 24)
#define GEN_MASK 0x7fffffu

/* What torch 1.13 sends a watcher: registered, and then each change of the key. */
enum {
    WATCH_KEY_UPDATED = 0,
    WATCH_KEY_CREATED = 1,
    WATCH_KEY_DELETED = 2,
    WATCH_KEY_CALLBACK_REGISTERED = 3,
    WATCH_KEY_APPENDED = 4,
};

typedef struct tconn_s tconn_t;

struct tconn_s {
    uv_tcp_t tcp; /* first: the handle's pointer is the connection's */
    dl__torch_store_t *ts;
    uint32_t slot;
    dl_torch_dialect_t dialect;
    bool waiting; /* a WAIT is pending in the core */
    bool closing;
    uint64_t serial; /* this connection's alone, for the watches it holds */
    /* While waiting: the keys the core waits on (as a WAIT sends them), so that a queue push
     * can end the wait too; and the store's list of waiting connections. */
    uint8_t *wkeys;
    size_t wkeys_len;
    uint64_t nwkeys;
    tconn_t *wprev, *wnext;
    uint8_t *in; /* an unfinished query */
    size_t in_len;
    /* The core's answer to the event being fed (in_call). */
    bool in_call, got;
    dl_rdzv_msg_kind_t kind;
    int code;
    bool found, deleted;
    int64_t counter;
    uint8_t *value;
    size_t value_len;
    char peer[64];
};

struct dl__torch_store_s {
    uv_loop_t *loop;
    dl_rdzv_server_t *s;
    uv_tcp_t listener;
    uint32_t index; /* in its server, carried by its connections' ids */
    char run_id[256];
    dl_torch_limits_t lim;
    int port;
    tconn_t **slots;
    uint32_t *gens;
    uint32_t *free_slots;
    size_t nslots, nfree, cap;
    size_t nconns, peak;
    int open; /* handles not closed yet, the listener included */
    bool closing;
    uint8_t readbuf[READ_SIZE];
    bool readbuf_busy;
    dl__tqueues_t *queues; /* QUEUE_*: the round's queues */
    int round;             /* the round the queues and watches belong to */
    tconn_t *waiters;      /* connections with a WAIT pending, oldest first */
    tconn_t *waiters_tail;
    struct watch_s {
        uint32_t slot;
        uint64_t serial;
        size_t key_len;
        uint8_t *key;
    } * watches;
    size_t nwatches;
    uint64_t next_serial;
};

static uint64_t conn_id(const tconn_t *tc)
{
    return DL__TORCH_CONN_BIT | ((uint64_t)tc->ts->gens[tc->slot] << 40) |
           ((uint64_t)tc->ts->index << 24) | tc->slot;
}

static tconn_t *conn_by_id(dl__torch_store_t *ts, uint64_t id)
{
    uint32_t slot = (uint32_t)id & 0xffffffu, gen = (uint32_t)(id >> 40) & GEN_MASK;
    if (!(id & DL__TORCH_CONN_BIT) || DL__TORCH_STORE_INDEX(id) != ts->index ||
        slot >= ts->nslots || ts->gens[slot] != gen)
        return NULL;
    return ts->slots[slot];
}

static int slot_take(dl__torch_store_t *ts, tconn_t *tc)
{
    if (ts->nfree == 0 && ts->nslots == SLOT_MAX)
        return -EMFILE;
    if (ts->nfree == 0 && ts->nslots == ts->cap) {
        size_t cap = ts->cap ? ts->cap * 2 : 256;
        tconn_t **sl = realloc(ts->slots, cap * sizeof(*sl));
        if (sl == NULL)
            return -ENOMEM;
        ts->slots = sl;
        uint32_t *g = realloc(ts->gens, cap * sizeof(*g));
        if (g == NULL)
            return -ENOMEM;
        ts->gens = g;
        uint32_t *f = realloc(ts->free_slots, cap * sizeof(*f));
        if (f == NULL)
            return -ENOMEM;
        ts->free_slots = f;
        ts->cap = cap;
    }
    if (ts->nfree > 0) {
        tc->slot = ts->free_slots[--ts->nfree];
    } else {
        tc->slot = (uint32_t)ts->nslots++;
        ts->gens[tc->slot] = 1;
    }
    ts->slots[tc->slot] = tc;
    return 0;
}

/* A later id for the same slot: answers meant for the old one find nobody. */
static void next_gen(dl__torch_store_t *ts, uint32_t slot)
{
    ts->gens[slot] = (ts->gens[slot] + 1) & GEN_MASK;
    if (ts->gens[slot] == 0)
        ts->gens[slot] = 1;
}

/* ---- waits and watches held here, next to the core's ---- */

static void waiter_unlink(tconn_t *tc)
{
    dl__torch_store_t *ts = tc->ts;
    if (!tc->waiting)
        return;
    if (tc->wprev != NULL)
        tc->wprev->wnext = tc->wnext;
    else
        ts->waiters = tc->wnext;
    if (tc->wnext != NULL)
        tc->wnext->wprev = tc->wprev;
    else
        ts->waiters_tail = tc->wprev;
    tc->wprev = tc->wnext = NULL;
    tc->waiting = false;
    free(tc->wkeys);
    tc->wkeys = NULL;
    tc->wkeys_len = 0;
    tc->nwkeys = 0;
}

static void waiter_link(tconn_t *tc)
{
    dl__torch_store_t *ts = tc->ts;
    tc->waiting = true;
    tc->wnext = NULL;
    tc->wprev = ts->waiters_tail;
    if (ts->waiters_tail != NULL)
        ts->waiters_tail->wnext = tc;
    else
        ts->waiters = tc;
    ts->waiters_tail = tc;
}

static tconn_t *watcher(dl__torch_store_t *ts, const struct watch_s *w)
{
    tconn_t *tc = w->slot < ts->nslots ? ts->slots[w->slot] : NULL;
    return tc != NULL && tc->serial == w->serial && !tc->closing ? tc : NULL;
}

static void watches_clear(dl__torch_store_t *ts)
{
    for (size_t i = 0; i < ts->nwatches; i++)
        free(ts->watches[i].key);
    free(ts->watches);
    ts->watches = NULL;
    ts->nwatches = 0;
}

static bool watched(const dl__torch_store_t *ts, const uint8_t *key, size_t len)
{
    for (size_t i = 0; i < ts->nwatches; i++)
        if (ts->watches[i].key_len == len && memcmp(ts->watches[i].key, key, len) == 0)
            return true;
    return false;
}

static void conn_send(tconn_t *tc, const uint8_t *p, size_t n);

/* Tells every watcher of key what changed, in torch 1.13's callback framing: the change, the
 * key, the old and the new value. Watches of connections gone are dropped on the way. */
static void notify_watchers(dl__torch_store_t *ts, const uint8_t *key, size_t key_len,
                            uint8_t change, const uint8_t *old, size_t old_len, const uint8_t *cur,
                            size_t cur_len)
{
    size_t n = 1 + DL_TORCH_BYTES_SIZE(key_len) + DL_TORCH_BYTES_SIZE(old_len) +
               DL_TORCH_BYTES_SIZE(cur_len);
    uint8_t *msg = NULL;
    for (size_t i = 0; i < ts->nwatches;) {
        struct watch_s *w = &ts->watches[i];
        tconn_t *tc = watcher(ts, w);
        if (tc == NULL) {
            free(w->key);
            *w = ts->watches[--ts->nwatches];
            continue;
        }
        i++;
        if (w->key_len != key_len || memcmp(w->key, key, key_len) != 0)
            continue;
        if (msg == NULL) {
            size_t len = 0;
            if ((msg = malloc(n)) == NULL) {
                dl__rdzv_server_log(ts->s, DL_RDZV_LOG_ERROR, ts->run_id,
                                    "torch store: out of memory telling watchers of a change");
                return;
            }
            dl_torch_put_u8(msg, n, &len, change);
            dl_torch_put_bytes(msg, n, &len, key, key_len);
            dl_torch_put_bytes(msg, n, &len, old, old_len);
            dl_torch_put_bytes(msg, n, &len, cur, cur_len);
        }
        conn_send(tc, msg, n);
    }
    free(msg);
}

static void maybe_free(dl__torch_store_t *ts)
{
    if (!ts->closing || ts->open > 0)
        return;
    watches_clear(ts);
    dl__tqueues_free(ts->queues);
    free(ts->slots);
    free(ts->gens);
    free(ts->free_slots);
    dl__bigzero_free(ts, sizeof(*ts));
}

static void on_conn_closed(uv_handle_t *h)
{
    tconn_t *tc = (tconn_t *)h;
    dl__torch_store_t *ts = tc->ts;
    /* The core forgets the connection's waits. */
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_DISCONNECT, .conn = conn_id(tc), .run_id = ts->run_id};
    dl__rdzv_server_feed(ts->s, &ev);
    waiter_unlink(tc);
    ts->slots[tc->slot] = NULL;
    next_gen(ts, tc->slot);
    ts->free_slots[ts->nfree++] = tc->slot;
    ts->nconns--;
    free(tc->in);
    free(tc->value);
    free(tc);
    dl_rdzv_server_t *s = ts->s;
    ts->open--;
    maybe_free(ts);
    dl__rdzv_server_release(s);
}

static void conn_close(tconn_t *tc)
{
    if (tc->closing)
        return;
    tc->closing = true;
    uv_close((uv_handle_t *)&tc->tcp, on_conn_closed);
}

/* Closes tc with the one log line bad input gets. */
static void conn_fail(tconn_t *tc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void conn_fail(tconn_t *tc, const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (!tc->closing)
        dl__rdzv_server_log(tc->ts->s, DL_RDZV_LOG_WARN, tc->ts->run_id,
                            "torch store: closing the connection from %s: %s", tc->peer, text);
    conn_close(tc);
}

/* ---- writing ---- */

typedef struct {
    uv_write_t req;
    uv_buf_t buf;
    uint8_t data[];
} wreq_t;

static void on_written(uv_write_t *req, int status)
{
    (void)status;
    free(req);
}

static void conn_send(tconn_t *tc, const uint8_t *p, size_t n)
{
    if (tc->closing || n == 0)
        return;
    if (tc->tcp.write_queue_size == 0) {
        int w = uv_try_write((uv_stream_t *)&tc->tcp, &(uv_buf_t){(char *)p, n}, 1);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w != UV_EAGAIN) {
            conn_close(tc);
            return;
        }
        if (n == 0)
            return;
    }
    if (tc->tcp.write_queue_size + n > MAX_UNSENT) {
        conn_fail(tc, "%zu bytes of answers unread", tc->tcp.write_queue_size + n);
        return;
    }
    wreq_t *wr = malloc(sizeof(*wr) + n);
    if (wr == NULL) {
        conn_fail(tc, "out of memory for an answer of %zu bytes", n);
        return;
    }
    memcpy(wr->data, p, n);
    wr->buf = uv_buf_init((char *)wr->data, (unsigned)n);
    if (uv_write(&wr->req, (uv_stream_t *)&tc->tcp, &wr->buf, 1, on_written) < 0) {
        free(wr);
        conn_close(tc);
    }
}

/* An answer being built: small ones on the stack, a value's size on the heap. */
typedef struct {
    uint8_t small[64];
    uint8_t *p;
    size_t len, cap;
} out_t;

static void out_init(out_t *o)
{
    o->p = o->small;
    o->len = 0;
    o->cap = sizeof(o->small);
}

static int out_room(out_t *o, size_t n)
{
    if (o->cap - o->len >= n)
        return 0;
    size_t cap = o->cap * 2 > o->len + n ? o->cap * 2 : o->len + n;
    uint8_t *p = malloc(cap);
    if (p == NULL)
        return -ENOMEM;
    memcpy(p, o->p, o->len);
    if (o->p != o->small)
        free(o->p);
    o->p = p;
    o->cap = cap;
    return 0;
}

static void out_free(out_t *o)
{
    if (o->p != o->small)
        free(o->p);
}

static int out_bytes(out_t *o, const void *data, size_t n)
{
    int r = out_room(o, DL_TORCH_BYTES_SIZE(n));
    return r < 0 ? r : dl_torch_put_bytes(o->p, o->cap, &o->len, data, n);
}

/* ---- the core ---- */

void dl__torch_store_reply(dl__torch_store_t *ts, uint64_t conn, const dl_rdzv_msg_t *msg)
{
    tconn_t *tc = conn_by_id(ts, conn);
    if (tc == NULL || tc->closing)
        return;
    if (msg == NULL) {
        conn_close(tc);
        return;
    }
    if (!tc->in_call) {
        /* A WAIT's late answer: the keys came, or the round ended under it. */
        waiter_unlink(tc);
        if (msg->kind == DL_RDZV_MSG_WAIT_DONE) {
            uint8_t b = DL_TORCH_WAIT_STOP_WAITING;
            conn_send(tc, &b, 1);
        } else if (msg->kind == DL_RDZV_MSG_ERROR && msg->error.code == -ESTALE) {
            /* The round ended under the wait: its workers are being stopped, and every one of
             * them waiting would be a line. */
            conn_close(tc);
        } else if (msg->kind == DL_RDZV_MSG_ERROR) {
            conn_fail(tc, "%s", msg->error.message);
        }
        return;
    }
    tc->got = true;
    tc->kind = msg->kind;
    switch (msg->kind) {
    case DL_RDZV_MSG_ERROR:
        tc->code = msg->error.code;
        /* The reason goes to the log line; the value buffer carries it there. */
        free(tc->value);
        tc->value = (uint8_t *)strdup(msg->error.message ? msg->error.message : "");
        tc->value_len = 0;
        break;
    case DL_RDZV_MSG_VALUE:
        tc->found = msg->value.found;
        tc->value_len = 0;
        if (tc->found && msg->value.value.len > 0) {
            uint8_t *v = realloc(tc->value, msg->value.value.len);
            if (v == NULL) {
                tc->kind = DL_RDZV_MSG_ERROR;
                tc->code = -ENOMEM;
                break;
            }
            tc->value = v;
            memcpy(v, msg->value.value.data, msg->value.value.len);
            tc->value_len = msg->value.value.len;
        }
        break;
    case DL_RDZV_MSG_COUNTER: tc->counter = msg->counter.value; break;
    case DL_RDZV_MSG_DELETED: tc->deleted = msg->deleted.deleted; break;
    default: break;
    }
}

/* Feeds one store event for tc and returns the answer's kind, or -1 when none came (a WAIT
 * left pending). An ERROR closes tc with its reason. */
static int call(tconn_t *tc, dl_rdzv_event_t *ev)
{
    ev->conn = conn_id(tc);
    ev->run_id = tc->ts->run_id;
    tc->in_call = true;
    tc->got = false;
    dl__rdzv_server_feed(tc->ts->s, ev);
    tc->in_call = false;
    if (!tc->got)
        return -1;
    if (tc->kind == DL_RDZV_MSG_ERROR) {
        conn_fail(tc, "%s",
                  tc->code == -ENOMEM && tc->value == NULL ? "out of memory" : (char *)tc->value);
        return DL_RDZV_MSG_ERROR;
    }
    return (int)tc->kind;
}

static dl_rdzv_buf_t rbuf(dl_torch_bytes_t b)
{
    return (dl_rdzv_buf_t){b.data, b.len};
}

static int do_set(tconn_t *tc, dl_torch_bytes_t key, const void *v, size_t n)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_SET};
    ev.store.round = -1;
    ev.store.key = rbuf(key);
    ev.store.value = (dl_rdzv_buf_t){v, n};
    return call(tc, &ev) == DL_RDZV_MSG_OK ? 0 : -1;
}

/* tc->found and tc->value(_len) hold what key has. */
static int do_get(tconn_t *tc, dl_torch_bytes_t key)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_GET};
    ev.store.round = -1;
    ev.store.key = rbuf(key);
    return call(tc, &ev) == DL_RDZV_MSG_VALUE ? 0 : -1;
}

/* Torch's compare-set: a missing key is set when nothing was expected, and the answer is
 * what the key holds afterwards (or, missing, what was expected). */
static int do_compare_set(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    if (do_get(tc, q->key) < 0)
        return -1;
    bool match =
        tc->found ? tc->value_len == q->value.len &&
                        (q->value.len == 0 || memcmp(tc->value, q->value.data, q->value.len) == 0)
                  : q->value.len == 0;
    if (match) {
        if (do_set(tc, q->key, q->desired.data, q->desired.len) < 0)
            return -1;
        return out_bytes(o, q->desired.data, q->desired.len);
    }
    if (!tc->found)
        return out_bytes(o, q->value.data, q->value.len);
    return out_bytes(o, tc->value, tc->value_len);
}

static int do_append(tconn_t *tc, const dl_torch_query_t *q)
{
    if (do_get(tc, q->key) < 0)
        return -1;
    if (!tc->found)
        return do_set(tc, q->key, q->value.data, q->value.len);
    size_t n = tc->value_len + q->value.len;
    uint8_t *v = malloc(n ? n : 1);
    if (v == NULL) {
        conn_fail(tc, "out of memory appending %zu bytes", q->value.len);
        return -1;
    }
    if (tc->value_len)
        memcpy(v, tc->value, tc->value_len);
    if (q->value.len)
        memcpy(v + tc->value_len, q->value.data, q->value.len);
    int r = do_set(tc, q->key, v, n);
    free(v);
    return r;
}

static bool queued(const dl__torch_store_t *ts, dl_torch_bytes_t key)
{
    return dl__tqueues_len(ts->queues, key.data, key.len) > 0;
}

/* The core forgets tc's pending wait; tc goes on under a new id, so that a late answer for the
 * old wait finds nobody. */
static void drop_core_wait(tconn_t *tc)
{
    dl_rdzv_event_t ev = {
        .kind = DL_RDZV_EV_DISCONNECT, .conn = conn_id(tc), .run_id = tc->ts->run_id};
    dl__rdzv_server_feed(tc->ts->s, &ev);
    next_gen(tc->ts, tc->slot);
    waiter_unlink(tc);
}

/* As torch's: a key is there when it holds a value or names a queue with items. The core waits
 * on the keys no queue answers; the wait also ends when a push makes every one of them there. */
static int do_wait(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    if (tc->waiting) {
        conn_fail(tc, "a second wait while one is pending");
        return -1;
    }
    dl_rdzv_buf_t *keys = malloc(q->nitems * sizeof(*keys));
    uint8_t *copy = malloc(q->items.len);
    if (keys == NULL || copy == NULL) {
        free(keys);
        free(copy);
        conn_fail(tc, "out of memory for a wait on %llu keys", (unsigned long long)q->nitems);
        return -1;
    }
    size_t pos = 0, n = 0, copied = 0;
    dl_torch_bytes_t k;
    while (dl_torch_items_next(q, &pos, &k, NULL)) {
        if (queued(tc->ts, k))
            continue;
        keys[n++] = rbuf(k);
        dl_torch_put_bytes(copy, q->items.len, &copied, k.data, k.len);
    }
    int kind = DL_RDZV_MSG_WAIT_DONE;
    if (n > 0) {
        /* No deadline here: torch's client keeps its own, and a wait ends with its
         * connection or its round. */
        dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_WAIT};
        ev.wait.round = -1;
        ev.wait.keys = keys;
        ev.wait.nkeys = n;
        ev.wait.timeout = -1;
        kind = call(tc, &ev);
    }
    free(keys);
    if (kind == -1) {
        tc->wkeys = copy;
        tc->wkeys_len = copied;
        tc->nwkeys = n;
        waiter_link(tc);
        return 0;
    }
    free(copy);
    if (kind != DL_RDZV_MSG_WAIT_DONE)
        return -1;
    return dl_torch_put_u8(o->p, o->cap, &o->len, DL_TORCH_WAIT_STOP_WAITING);
}

static int do_cancel_wait(tconn_t *tc, out_t *o)
{
    if (tc->waiting)
        drop_core_wait(tc);
    return dl_torch_put_u8(o->p, o->cap, &o->len, DL_TORCH_WAIT_CANCELED);
}

/* Whether every key w waits on is there now; asked through tc (the pusher), whose call
 * captures the answers. -1: tc was closed. */
static int wait_met(tconn_t *tc, const tconn_t *w)
{
    dl_torch_query_t wq = {
        .op = DL_TORCH_Q_WAIT, .nitems = w->nwkeys, .items = {w->wkeys, w->wkeys_len}};
    size_t pos = 0;
    dl_torch_bytes_t k;
    while (dl_torch_items_next(&wq, &pos, &k, NULL)) {
        if (queued(tc->ts, k))
            continue;
        if (do_get(tc, k) < 0)
            return -1;
        if (!tc->found)
            return 0;
    }
    return 1;
}

static bool waits_on(const tconn_t *w, dl_torch_bytes_t key)
{
    dl_torch_query_t wq = {
        .op = DL_TORCH_Q_WAIT, .nitems = w->nwkeys, .items = {w->wkeys, w->wkeys_len}};
    size_t pos = 0;
    dl_torch_bytes_t k;
    while (dl_torch_items_next(&wq, &pos, &k, NULL))
        if (k.len == key.len && memcmp(k.data, key.data, k.len) == 0)
            return true;
    return false;
}

/* A push wakes one waiter, as torch's does: the oldest that waits on the queue and whose keys
 * are then all there. O(waiters). */
static int wake_one(tconn_t *tc, dl_torch_bytes_t key)
{
    for (tconn_t *w = tc->ts->waiters; w != NULL; w = w->wnext) {
        if (w->closing || !waits_on(w, key))
            continue;
        int met = wait_met(tc, w);
        if (met < 0)
            return -1;
        if (met == 0)
            continue;
        drop_core_wait(w);
        uint8_t b = DL_TORCH_WAIT_STOP_WAITING;
        conn_send(w, &b, 1);
        return 0;
    }
    return 0;
}

static int do_queue_push(tconn_t *tc, const dl_torch_query_t *q)
{
    dl__torch_store_t *ts = tc->ts;
    /* A value and its queue's bookkeeping, under the room every store shares. */
    if (dl_rdzv_core_memory_room(dl__rdzv_server_core(ts->s)) < q->value.len + q->key.len + 64) {
        conn_fail(tc, "queue_push: the stores' memory is full");
        return -1;
    }
    int r = dl__tqueues_push(ts->queues, q->key.data, q->key.len, q->value.data, q->value.len);
    if (r == -ENOSPC) {
        size_t items, bytes;
        dl__tqueues_usage(ts->queues, &items, &bytes);
        conn_fail(tc, "queue_push: the job's queues are full (%zu items, %zu bytes)", items, bytes);
        return -1;
    }
    if (r < 0) {
        conn_fail(tc, "out of memory for a queue_push of %zu bytes", q->value.len);
        return -1;
    }
    return wake_one(tc, q->key);
}

/* Torch's answer: the queue's length before the pop, then the item when there was one. */
static int do_queue_pop(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    dl__torch_store_t *ts = tc->ts;
    size_t n = dl__tqueues_len(ts->queues, q->key.data, q->key.len);
    if (dl_torch_put_i64(o->p, o->cap, &o->len, (int64_t)n) < 0)
        return -1;
    if (n == 0)
        return 0;
    uint8_t *v;
    size_t len;
    dl__tqueues_pop(ts->queues, q->key.data, q->key.len, &v, &len);
    int r = out_bytes(o, v, len);
    free(v);
    return r;
}

static int do_watch(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    dl__torch_store_t *ts = tc->ts;
    if (ts->nwatches == MAX_WATCHES) {
        conn_fail(tc, "watch_key: %d watches already", MAX_WATCHES);
        return -1;
    }
    if (ts->watches == NULL && (ts->watches = calloc(MAX_WATCHES, sizeof(*ts->watches))) == NULL)
        return -1;
    uint8_t *key = malloc(q->key.len);
    if (key == NULL)
        return -1;
    memcpy(key, q->key.data, q->key.len);
    ts->watches[ts->nwatches++] =
        (struct watch_s){.slot = tc->slot, .serial = tc->serial, .key_len = q->key.len, .key = key};
    return dl_torch_put_u8(o->p, o->cap, &o->len, WATCH_KEY_CALLBACK_REGISTERED);
}

/* A write of key by tc, with watchers told of it: the old value is read first only when
 * someone watches the key. */
static int do_watched_set(tconn_t *tc, dl_torch_bytes_t key, const void *v, size_t n)
{
    dl__torch_store_t *ts = tc->ts;
    if (ts->nwatches == 0 || !watched(ts, key.data, key.len))
        return do_set(tc, key, v, n);
    if (do_get(tc, key) < 0)
        return -1;
    bool existed = tc->found;
    uint8_t *old = existed ? tc->value : NULL;
    size_t old_len = existed ? tc->value_len : 0;
    if (existed)
        tc->value = NULL; /* kept until the watchers are told */
    int r = do_set(tc, key, v, n);
    if (r == 0)
        notify_watchers(ts, key.data, key.len, existed ? WATCH_KEY_UPDATED : WATCH_KEY_CREATED, old,
                        old_len, v, n);
    free(old);
    return r;
}

static int execute_query(tconn_t *tc, const dl_torch_query_t *q, out_t *o);

/* A write of a watched key (torch 1.13's WATCH_KEY): the value before and after it, and the
 * watchers told what torch 1.13's server would tell them. */
static int execute_watched(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    dl__torch_store_t *ts = tc->ts;
    if (do_get(tc, q->key) < 0)
        return -1;
    bool existed = tc->found;
    uint8_t *old = existed ? tc->value : NULL;
    size_t old_len = existed ? tc->value_len : 0;
    if (existed)
        tc->value = NULL; /* kept until the watchers are told */
    int r = execute_query(tc, q, o);
    if (r == 0 && do_get(tc, q->key) == 0) {
        bool now = tc->found;
        const uint8_t *cur = now ? tc->value : NULL;
        size_t cur_len = now ? tc->value_len : 0;
        bool same = existed == now && old_len == cur_len &&
                    (cur_len == 0 || memcmp(old, cur, cur_len) == 0);
        if (q->op == DL_TORCH_Q_DELETE_KEY && existed)
            notify_watchers(ts, q->key.data, q->key.len, WATCH_KEY_DELETED, old, old_len, NULL, 0);
        else if (q->op == DL_TORCH_Q_APPEND)
            notify_watchers(ts, q->key.data, q->key.len,
                            existed ? WATCH_KEY_APPENDED : WATCH_KEY_CREATED, NULL, 0,
                            q->value.data, q->value.len);
        else if (q->op != DL_TORCH_Q_DELETE_KEY && now && (!same || q->op == DL_TORCH_Q_ADD))
            notify_watchers(ts, q->key.data, q->key.len,
                            existed ? WATCH_KEY_UPDATED : WATCH_KEY_CREATED, old, old_len, cur,
                            cur_len);
    }
    free(old);
    return r;
}

/* Carries out one query; its answer (if any) goes into o. Returns 0, or -1 when tc was
 * closed. */
static int execute(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    dl__torch_store_t *ts = tc->ts;
    bool writes = q->op == DL_TORCH_Q_ADD || q->op == DL_TORCH_Q_COMPARE_SET ||
                  q->op == DL_TORCH_Q_APPEND || q->op == DL_TORCH_Q_DELETE_KEY;
    if (writes && ts->nwatches > 0 && watched(ts, q->key.data, q->key.len))
        return execute_watched(tc, q, o);
    return execute_query(tc, q, o);
}

static int execute_query(tconn_t *tc, const dl_torch_query_t *q, out_t *o)
{
    size_t pos = 0;
    dl_torch_bytes_t k, v;
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_ADD};

    switch (q->op) {
    case DL_TORCH_Q_VALIDATE: return 0;
    case DL_TORCH_Q_SET: return do_watched_set(tc, q->key, q->value.data, q->value.len);
    case DL_TORCH_Q_COMPARE_SET: return do_compare_set(tc, q, o) < 0 ? -1 : 0;
    case DL_TORCH_Q_GET:
        if (do_get(tc, q->key) < 0)
            return -1;
        return out_bytes(o, tc->value, tc->found ? tc->value_len : 0) < 0 ? -1 : 0;
    case DL_TORCH_Q_ADD:
        ev.store.round = -1;
        ev.store.key = rbuf(q->key);
        ev.store.delta = q->delta;
        if (call(tc, &ev) != DL_RDZV_MSG_COUNTER)
            return -1;
        return dl_torch_put_i64(o->p, o->cap, &o->len, tc->counter);
    case DL_TORCH_Q_CHECK: {
        bool all = true;
        while (all && dl_torch_items_next(q, &pos, &k, NULL)) {
            if (queued(tc->ts, k))
                continue;
            if (do_get(tc, k) < 0)
                return -1;
            all = tc->found;
        }
        return dl_torch_put_u8(o->p, o->cap, &o->len,
                               all ? DL_TORCH_CHECK_READY : DL_TORCH_CHECK_NOT_READY);
    }
    case DL_TORCH_Q_WAIT: return do_wait(tc, q, o) < 0 ? -1 : 0;
    case DL_TORCH_Q_GETNUMKEYS: {
        size_t n = 0;
        dl_rdzv_core_store_count(dl__rdzv_server_core(tc->ts->s), tc->ts->run_id, &n);
        return dl_torch_put_i64(o->p, o->cap, &o->len, (int64_t)n);
    }
    case DL_TORCH_Q_DELETE_KEY:
        ev.kind = DL_RDZV_EV_STORE_DELETE;
        ev.store.round = -1;
        ev.store.key = rbuf(q->key);
        if (call(tc, &ev) != DL_RDZV_MSG_DELETED)
            return -1;
        return dl_torch_put_i64(o->p, o->cap, &o->len, tc->deleted ? 1 : 0);
    case DL_TORCH_Q_APPEND: return do_append(tc, q);
    case DL_TORCH_Q_MULTI_GET:
        while (dl_torch_items_next(q, &pos, &k, NULL)) {
            if (do_get(tc, k) < 0)
                return -1;
            if (out_bytes(o, tc->value, tc->found ? tc->value_len : 0) < 0) {
                conn_fail(tc, "out of memory for a multi_get answer");
                return -1;
            }
        }
        return 0;
    case DL_TORCH_Q_MULTI_SET:
        while (dl_torch_items_next(q, &pos, &k, &v))
            if (do_watched_set(tc, k, v.data, v.len) < 0)
                return -1;
        return 0;
    case DL_TORCH_Q_CANCEL_WAIT: return do_cancel_wait(tc, o);
    case DL_TORCH_Q_PING: return dl_torch_put_u32(o->p, o->cap, &o->len, q->nonce);
    case DL_TORCH_Q_QUEUE_PUSH: return do_queue_push(tc, q);
    case DL_TORCH_Q_QUEUE_POP: return do_queue_pop(tc, q, o) < 0 ? -1 : 0;
    case DL_TORCH_Q_QUEUE_LEN:
        return dl_torch_put_i64(o->p, o->cap, &o->len,
                                (int64_t)dl__tqueues_len(tc->ts->queues, q->key.data, q->key.len));
    case DL_TORCH_Q_WATCH_KEY: return do_watch(tc, q, o) < 0 ? -1 : 0;
    }
    return 0;
}

/* Runs every whole query in p[0..n) and answers them in one write; returns the bytes used, or
 * -1 when tc was closed. */
static long run_queries(tconn_t *tc, const uint8_t *p, size_t n)
{
    out_t o;
    size_t used = 0;
    char err[256];
    out_init(&o);
    while (used < n && !tc->closing) {
        dl_torch_query_t q;
        int r =
            dl_torch_parse(p + used, n - used, &tc->dialect, &tc->ts->lim, &q, err, sizeof(err));
        if (r == 0)
            break;
        if (r < 0) {
            conn_fail(tc, "%s", err);
            break;
        }
        used += (size_t)r;
        if (out_room(&o, 16) < 0 || execute(tc, &q, &o) < 0) {
            if (!tc->closing)
                conn_fail(tc, "out of memory");
            break;
        }
    }
    if (!tc->closing)
        conn_send(tc, o.p, o.len);
    out_free(&o);
    return tc->closing ? -1 : (long)used;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    tconn_t *tc = (tconn_t *)h;
    (void)hint;
    /* One buffer for every connection: a query is copied out only when it is cut short. */
    if (tc->ts->readbuf_busy) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    tc->ts->readbuf_busy = true;
    buf->base = (char *)tc->ts->readbuf;
    buf->len = sizeof(tc->ts->readbuf);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tconn_t *tc = (tconn_t *)st;
    dl__torch_store_t *ts = tc->ts;
    if (buf->base == (char *)ts->readbuf)
        ts->readbuf_busy = false;
    if (nread < 0) {
        conn_close(tc);
        return;
    }
    if (nread == 0 || tc->closing)
        return;
    const uint8_t *p = (const uint8_t *)buf->base;
    size_t n = (size_t)nread;
    if (tc->in_len > 0) {
        if (tc->in_len + n > ts->lim.max_query_len + 16) {
            conn_fail(tc, "a query of more than %zu bytes", ts->lim.max_query_len);
            return;
        }
        uint8_t *in = realloc(tc->in, tc->in_len + n);
        if (in == NULL) {
            conn_fail(tc, "out of memory for a query of %zu bytes", tc->in_len + n);
            return;
        }
        memcpy(in + tc->in_len, p, n);
        tc->in = in;
        tc->in_len += n;
        p = tc->in;
        n = tc->in_len;
    }
    long used = run_queries(tc, p, n);
    if (used < 0)
        return;
    size_t rest = n - (size_t)used;
    if (rest > ts->lim.max_query_len) {
        conn_fail(tc, "a query of more than %zu bytes", ts->lim.max_query_len);
        return;
    }
    if (rest == 0) {
        free(tc->in);
        tc->in = NULL;
        tc->in_len = 0;
        return;
    }
    if (p == tc->in) {
        memmove(tc->in, tc->in + used, rest);
    } else {
        uint8_t *in = malloc(rest);
        if (in == NULL) {
            conn_fail(tc, "out of memory for a query of %zu bytes", rest);
            return;
        }
        memcpy(in, p + used, rest);
        tc->in = in;
    }
    tc->in_len = rest;
}

static void drop_backlog(dl__torch_store_t *ts)
{
    uv_tcp_t *tmp = malloc(sizeof(*tmp));
    if (tmp == NULL)
        return;
    uv_tcp_init(ts->loop, tmp);
    uv_accept((uv_stream_t *)&ts->listener, (uv_stream_t *)tmp);
    uv_close((uv_handle_t *)tmp, (uv_close_cb)free);
}

static void on_connection(uv_stream_t *server, int status)
{
    dl__torch_store_t *ts = server->data;
    if (status < 0 || ts->closing)
        return;
    tconn_t *tc = calloc(1, sizeof(*tc));
    if (tc == NULL || slot_take(ts, tc) < 0) {
        free(tc);
        dl__rdzv_server_log(ts->s, DL_RDZV_LOG_ERROR, ts->run_id,
                            "torch store: out of memory: dropping a connection");
        drop_backlog(ts);
        return;
    }
    tc->ts = ts;
    tc->serial = ++ts->next_serial;
    uv_tcp_init(ts->loop, &tc->tcp);
    ts->open++;
    ts->nconns++;
    if (ts->nconns > ts->peak)
        ts->peak = ts->nconns;
    dl__rdzv_server_hold(ts->s);
    snprintf(tc->peer, sizeof(tc->peer), "?");
    int r = uv_accept(server, (uv_stream_t *)&tc->tcp);
    struct sockaddr_storage sa;
    int len = sizeof(sa);
    if (r == 0)
        r = uv_tcp_getpeername(&tc->tcp, (struct sockaddr *)&sa, &len);
    if (r < 0) {
        conn_close(tc);
        return;
    }
    char ip[INET6_ADDRSTRLEN] = "?";
    uv_ip_name((struct sockaddr *)&sa, ip, sizeof(ip));
    snprintf(tc->peer, sizeof(tc->peer), "%s:%d", ip,
             ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                           : ((struct sockaddr_in6 *)&sa)->sin6_port));
    if (!dl__peer_is_loopback((struct sockaddr *)&sa) &&
        !dl__rdzv_server_knows_host(ts->s, ts->run_id, (struct sockaddr *)&sa)) {
        conn_fail(tc, "not loopback and not a node of job '%s'", ts->run_id);
        return;
    }
    uv_tcp_nodelay(&tc->tcp, 1);
    if ((r = uv_read_start((uv_stream_t *)&tc->tcp, on_alloc, on_read)) < 0)
        conn_close(tc);
}

static void on_listener_closed(uv_handle_t *h)
{
    dl__torch_store_t *ts = h->data;
    dl_rdzv_server_t *s = ts->s;
    ts->open--;
    maybe_free(ts);
    dl__rdzv_server_release(s);
}

int dl__torch_store_start(dl_rdzv_server_t *s, uv_loop_t *loop, const char *host, int port,
                          const char *run_id, uint32_t index, dl__torch_store_t **ret, char *err,
                          size_t errlen)
{
    struct sockaddr_storage sa;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0) {
        snprintf(err, errlen, "'%s' is not an IP address", host);
        return -EINVAL;
    }
    dl__torch_store_t *ts = dl__bigzero_alloc(sizeof(*ts));
    if (ts == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    const dl_rdzv_core_opts_t *co = dl__rdzv_server_core_opts(s);
    ts->loop = loop;
    ts->s = s;
    ts->index = index;
    snprintf(ts->run_id, sizeof(ts->run_id), "%s", run_id);
    ts->lim.max_key_len = co->max_key_len;
    ts->lim.max_value_len = co->max_value_len;
    ts->lim.max_keys = co->max_wait_keys;
    /* A MULTI_SET of many values near the limit would be a query of gigabytes: one query may
     * carry what one value may, and its keys, and a little. */
    ts->lim.max_query_len = co->max_value_len + co->max_wait_keys * (co->max_key_len + 16) + 64;
    /* The queues get the caps of the keys beside them. */
    ts->queues = dl__tqueues_new(co->max_keys, co->max_store_bytes);
    ts->round = -1;
    if (ts->queues == NULL) {
        dl__bigzero_free(ts, sizeof(*ts));
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    uv_tcp_init(loop, &ts->listener);
    ts->listener.data = ts;
    ts->open = 1;
    dl__rdzv_server_hold(s);
    int r = uv_tcp_bind(&ts->listener, (struct sockaddr *)&sa, 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&ts->listener, 4096, on_connection);
    if (r < 0) {
        snprintf(err, errlen, "cannot serve the torch store on %s:%d: %s", host, port,
                 uv_strerror(r));
        dl__torch_store_close(ts);
        return r;
    }
    int len = sizeof(sa);
    uv_tcp_getsockname(&ts->listener, (struct sockaddr *)&sa, &len);
    ts->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                             : ((struct sockaddr_in6 *)&sa)->sin6_port);
    *ret = ts;
    return 0;
}

void dl__torch_store_close(dl__torch_store_t *ts)
{
    if (ts == NULL || ts->closing)
        return;
    ts->closing = true;
    uv_close((uv_handle_t *)&ts->listener, on_listener_closed);
    for (size_t i = 0; i < ts->nslots; i++)
        if (ts->slots[i] != NULL)
            conn_close(ts->slots[i]);
}

void dl__torch_store_new_round(dl__torch_store_t *ts, int round)
{
    if (round >= 0 && round <= ts->round)
        return;
    if (round >= 0)
        ts->round = round;
    dl__tqueues_clear(ts->queues);
    watches_clear(ts);
}

const char *dl__torch_store_run_id(const dl__torch_store_t *ts)
{
    return ts->run_id;
}

int dl__torch_store_port(const dl__torch_store_t *ts)
{
    return ts->port;
}

void dl__torch_store_clients(const dl__torch_store_t *ts, size_t *ret_now, size_t *ret_peak,
                             size_t *ret_conn_bytes)
{
    *ret_now = ts->nconns;
    *ret_peak = ts->peak;
    *ret_conn_bytes = sizeof(tconn_t) + sizeof(void *) + 2 * sizeof(uint32_t);
}
