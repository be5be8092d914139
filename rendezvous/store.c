/* The key-value store of a job: set, get, add, compare-set, delete and wait, all O(1) in the
 * number of keys held; a write wakes only the WAITs linked to its key.
 *
 * Keys are scoped per job and per round: every request names the round it belongs to (or -1 for
 * the current one), a request for another round is refused with -ESTALE, and a new round starts
 * with an empty store, so workers of a round being torn down can neither read nor disturb the
 * next one. A WAIT completes at the first moment all of its keys exist at once: each key it waits
 * on is a link on that key's entry, counted as missing or present, and a delete moves it back. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"

void dl__rdzv_store_init(dl__rdzv_store_t *store)
{
    memset(store, 0, sizeof(*store));
}

/* Memory, counted twice: per job against max_store_bytes (keys and values, as documented) and
 * over all jobs against max_memory (with what entries and waits cost the core besides). */
#define ENTRY_COST(key_len) (sizeof(dl__rdzv_entry_t) + (key_len))
#define WAITER_COST(nkeys) (sizeof(dl__rdzv_waiter_t) + (nkeys) * sizeof(dl__rdzv_link_t))

static bool mem_room(const dl_rdzv_core_t *core, size_t n)
{
    return n <= dl_rdzv_core_memory_room(core);
}

size_t dl_rdzv_core_memory_room(const dl_rdzv_core_t *core)
{
    size_t used = core->memory + (core->replies != NULL ? *core->replies : 0);
    return used < core->opts.max_memory ? core->opts.max_memory - used : 0;
}

void dl_rdzv_core_count_replies(dl_rdzv_core_t *core, const size_t *bytes)
{
    core->replies = bytes;
}

static void mem_add(dl_rdzv_core_t *core, dl__rdzv_store_t *store, size_t n)
{
    core->memory += n;
    store->memory += n;
}

static void mem_sub(dl_rdzv_core_t *core, dl__rdzv_store_t *store, size_t n)
{
    core->memory -= n;
    store->memory -= n;
}

static uint64_t key_hash(const dl_rdzv_core_t *core, const dl_rdzv_buf_t *key)
{
    return dl__rdzv_hash(core->opts.hash_key, key->data, key->len);
}

static dl__rdzv_entry_t *entry_find(const dl_rdzv_core_t *core, dl__rdzv_store_t *store,
                                    const dl_rdzv_buf_t *key)
{
    uint64_t h = key_hash(core, key);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&store->keys, h); n; n = n->next) {
        dl__rdzv_entry_t *e = dl__rdzv_container_of(n, dl__rdzv_entry_t, node);
        if (n->hash == h && e->key_len == key->len && memcmp(e->key, key->data, key->len) == 0)
            return e;
    }
    return NULL;
}

/* Finds or creates the entry for key. Returns 0, -ENOSPC (a limit of the job), -ENOBUFS (the
 * server's memory for stores) or -ENOMEM. */
static int entry_get(dl_rdzv_core_t *core, dl__rdzv_store_t *store, const dl_rdzv_buf_t *key,
                     dl__rdzv_entry_t **ret_entry)
{
    dl__rdzv_entry_t *e = entry_find(core, store, key);
    if (e) {
        *ret_entry = e;
        return 0;
    }
    if (store->keys.count >= core->opts.max_keys ||
        key->len > core->opts.max_store_bytes - store->bytes)
        return -ENOSPC;
    if (!mem_room(core, ENTRY_COST(key->len)))
        return -ENOBUFS;
    if (dl__rdzv_map_reserve(&store->keys, 1) < 0)
        return -ENOMEM;
    e = calloc(1, sizeof(*e) + key->len);
    if (!e)
        return -ENOMEM;
    memcpy(e->key, key->data, key->len);
    e->key_len = key->len;
    store->bytes += key->len;
    mem_add(core, store, ENTRY_COST(key->len));
    dl__rdzv_map_insert(&store->keys, &e->node, key_hash(core, key));
    *ret_entry = e;
    return 0;
}

static void entry_free(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_entry_t *e)
{
    store->npresent -= e->present;
    store->bytes -= e->key_len + e->value_len;
    mem_sub(core, store, ENTRY_COST(e->key_len) + e->value_len);
    free(e->value);
    free(e);
}

/* An entry without a value is kept only for the WAITs linked to it. */
static void entry_gc(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_entry_t *e)
{
    if (!e || e->present || e->pending || e->satisfied)
        return;
    dl__rdzv_map_remove(&store->keys, &e->node);
    entry_free(core, store, e);
}

static void link_push(dl__rdzv_link_t **head, dl__rdzv_link_t *l)
{
    l->prev = NULL;
    l->next = *head;
    if (*head)
        (*head)->prev = l;
    *head = l;
}

static void link_unlink(dl__rdzv_link_t **head, dl__rdzv_link_t *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else
        *head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

static void link_remove(dl__rdzv_link_t *l)
{
    dl__rdzv_entry_t *e = l->entry;
    if (l->satisfied) {
        link_unlink(&e->satisfied, l);
        e->nsatisfied--;
    } else {
        link_unlink(&e->pending, l);
        e->npending--;
    }
}

/* Frees w without replying. Leaves w->conn for the caller to gc. */
static void waiter_free(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_waiter_t *w)
{
    for (size_t i = 0; i < w->nlinks; i++) {
        link_remove(&w->links[i]);
        entry_gc(core, store, w->links[i].entry);
    }
    dl__rdzv_timer_disarm(&core->heap, &w->timer);
    mem_sub(core, store, WAITER_COST(w->nkeys));
    w->conn->nwaiters--;
    if (w->job_prev)
        w->job_prev->job_next = w->job_next;
    else
        store->waiters = w->job_next;
    if (w->job_next)
        w->job_next->job_prev = w->job_prev;
    store->nwaiters--;
    if (w->conn_prev)
        w->conn_prev->conn_next = w->conn_next;
    else
        w->conn->waiters = w->conn_next;
    if (w->conn_next)
        w->conn_next->conn_prev = w->conn_prev;
    free(w);
}

static void waiter_finish(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_waiter_t *w)
{
    dl__rdzv_conn_t *conn = w->conn;
    waiter_free(core, store, w);
    dl__rdzv_conn_gc(core, conn);
}

/* The key now exists: every WAIT missing it counts it, and those missing nothing more are done.
 * The caller reserved one action per pending WAIT. */
static void became_present(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_entry_t *e,
                           const char *run_id)
{
    while (e->pending) {
        dl__rdzv_link_t *l = e->pending;
        link_unlink(&e->pending, l);
        e->npending--;
        link_push(&e->satisfied, l);
        e->nsatisfied++;
        l->satisfied = true;
        dl__rdzv_waiter_t *w = l->waiter;
        if (--w->nmissing > 0)
            continue;
        dl__rdzv_send(core, w->conn->id, DL_RDZV_MSG_WAIT_DONE, w->req_id, run_id);
        waiter_finish(core, store, w);
    }
}

static void became_absent(dl__rdzv_entry_t *e)
{
    while (e->satisfied) {
        dl__rdzv_link_t *l = e->satisfied;
        link_unlink(&e->satisfied, l);
        e->nsatisfied--;
        link_push(&e->pending, l);
        e->npending++;
        l->satisfied = false;
        l->waiter->nmissing++;
    }
}

/* Stores a copy of v as e's value. Returns 0, -ENOSPC or -ENOMEM, leaving e as it was. */
static int set_value(dl_rdzv_core_t *core, dl__rdzv_store_t *store, dl__rdzv_entry_t *e,
                     const void *v, size_t len, const char *run_id)
{
    if (len > e->value_len && len - e->value_len > core->opts.max_store_bytes - store->bytes)
        return -ENOSPC;
    if (len > e->value_len && !mem_room(core, len - e->value_len))
        return -ENOBUFS;
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy)
        return -ENOMEM;
    if (len)
        memcpy(copy, v, len);
    store->bytes = store->bytes - e->value_len + len;
    mem_sub(core, store, e->value_len);
    mem_add(core, store, len);
    free(e->value);
    e->value = copy;
    e->value_len = len;
    if (!e->present) {
        e->present = true;
        store->npresent++;
        became_present(core, store, e, run_id);
    }
    return 0;
}

static const char *op_name(dl_rdzv_event_kind_t kind)
{
    switch (kind) {
    case DL_RDZV_EV_STORE_SET: return "store set";
    case DL_RDZV_EV_STORE_GET: return "store get";
    case DL_RDZV_EV_STORE_ADD: return "store add";
    case DL_RDZV_EV_STORE_CAS: return "store compare_set";
    case DL_RDZV_EV_STORE_DELETE: return "store delete";
    default: return "store wait";
    }
}

static void store_error(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, dl__rdzv_job_t *job,
                        int code)
{
    const char *what = op_name(ev->kind);
    if (code == -ENOBUFS)
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, code,
                       "%s: the server's memory for stores and waits (%zu bytes, every job "
                       "together) is spent",
                       what, core->opts.max_memory);
    else if (code == -ENOSPC)
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, code,
                       "%s: job '%s' holds %zu keys and %zu bytes, at the limit of %zu keys or "
                       "%zu bytes",
                       what, job->run_id, job->store.keys.count, job->store.bytes,
                       core->opts.max_keys, core->opts.max_store_bytes);
    else
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, code, "%s: out of memory", what);
}

static int check_key(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, const dl_rdzv_buf_t *key,
                     const char *run_id)
{
    if (key->len >= 1 && key->len <= core->opts.max_key_len && key->data)
        return 0;
    dl__rdzv_error(core, ev->conn, ev->req_id, run_id, -EINVAL,
                   "%s: key of %zu bytes is outside 1..%zu", op_name(ev->kind), key->len,
                   core->opts.max_key_len);
    return -EINVAL;
}

static int check_value(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, const dl_rdzv_buf_t *v,
                       const char *field, const char *run_id)
{
    if (v->len <= core->opts.max_value_len && (v->data || v->len == 0))
        return 0;
    dl__rdzv_error(core, ev->conn, ev->req_id, run_id, -EMSGSIZE,
                   "%s: %s of %zu bytes is over the limit of %zu", op_name(ev->kind), field, v->len,
                   core->opts.max_value_len);
    return -EMSGSIZE;
}

/* Writes value to key, creating it; replies with an error and returns < 0 when it cannot. */
static int write_key(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev,
                     dl__rdzv_entry_t **pe, const void *value, size_t len)
{
    dl__rdzv_store_t *store = &job->store;
    dl__rdzv_entry_t *e = *pe;
    int r = e ? 0 : entry_get(core, store, &ev->store.key, &e);
    if (r == 0 && dl__rdzv_reserve(core, e->npending + 4) < 0)
        r = -ENOMEM;
    if (r == 0)
        r = set_value(core, store, e, value, len, job->run_id);
    if (r < 0) {
        entry_gc(core, store, e);
        store_error(core, ev, job, r);
        return r;
    }
    *pe = e;
    return 0;
}

/* A decimal int64, nothing else: what ADD left there, or a value a client SET to a number. */
static int parse_i64(const unsigned char *p, size_t len, int64_t *ret)
{
    size_t i = 0;
    bool neg = len > 0 && p[0] == '-';
    if (neg)
        i++;
    if (i == len)
        return -EINVAL;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -EINVAL;
        unsigned d = p[i] - '0';
        if (v > (limit - d) / 10)
            return -ERANGE;
        v = v * 10 + d;
    }
    *ret = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static void do_add(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev)
{
    dl__rdzv_entry_t *e = entry_find(core, &job->store, &ev->store.key);
    int64_t cur = 0;
    if (e && e->present && parse_i64(e->value, e->value_len, &cur) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EINVAL,
                       "store add: the value of the key is not a decimal integer");
        return;
    }
    int64_t d = ev->store.delta;
    if ((d > 0 && cur > INT64_MAX - d) || (d < 0 && cur < INT64_MIN - d)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ERANGE,
                       "store add: %" PRId64 " + %" PRId64 " overflows", cur, d);
        return;
    }
    cur += d;
    char text[24];
    int len = snprintf(text, sizeof(text), "%" PRId64, cur);
    if (write_key(core, job, ev, &e, text, (size_t)len) < 0)
        return;
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_COUNTER, ev->req_id, job->run_id)->counter.value =
        cur;
}

static void do_cas(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev)
{
    dl__rdzv_entry_t *e = entry_find(core, &job->store, &ev->store.key);
    bool present = e && e->present;
    const dl_rdzv_buf_t *x = &ev->store.expected;
    bool match = ev->store.expect_absent
                     ? !present
                     : present && e->value_len == x->len &&
                           (x->len == 0 || memcmp(e->value, x->data, x->len) == 0);
    if (match && write_key(core, job, ev, &e, ev->store.value.data, ev->store.value.len) < 0)
        return;
    dl_rdzv_msg_t *m = dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_CAS, ev->req_id, job->run_id);
    m->cas.swapped = match;
    m->cas.found = e && e->present;
    if (m->cas.found)
        m->cas.value = (dl_rdzv_buf_t){e->value, e->value_len};
}

static void do_delete(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev)
{
    dl__rdzv_store_t *store = &job->store;
    dl__rdzv_entry_t *e = entry_find(core, store, &ev->store.key);
    bool deleted = e && e->present;
    if (deleted) {
        store->bytes -= e->value_len;
        mem_sub(core, store, e->value_len);
        free(e->value);
        e->value = NULL;
        e->value_len = 0;
        e->present = false;
        store->npresent--;
        became_absent(e);
        entry_gc(core, store, e);
    }
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_DELETED, ev->req_id, job->run_id)->deleted.deleted =
        deleted;
}

static void link_waiter(dl__rdzv_store_t *store, dl__rdzv_conn_t *conn, dl__rdzv_waiter_t *w)
{
    w->job_prev = NULL;
    w->job_next = store->waiters;
    if (store->waiters)
        store->waiters->job_prev = w;
    store->waiters = w;
    store->nwaiters++;
    w->conn = conn;
    w->conn_prev = NULL;
    w->conn_next = conn->waiters;
    if (conn->waiters)
        conn->waiters->conn_prev = w;
    conn->waiters = w;
    conn->nwaiters++;
}

static void do_wait(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev,
                    double now)
{
    dl__rdzv_store_t *store = &job->store;
    size_t nkeys = ev->wait.nkeys;
    if (nkeys < 1 || nkeys > core->opts.max_wait_keys || !ev->wait.keys) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EINVAL,
                       "store wait: %zu keys is outside 1..%zu", nkeys, core->opts.max_wait_keys);
        return;
    }
    if (isnan(ev->wait.timeout)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EINVAL,
                       "store wait: the timeout is not a number");
        return;
    }
    size_t missing = 0, unknown = 0;
    for (size_t i = 0; i < nkeys; i++) {
        if (check_key(core, ev, &ev->wait.keys[i], job->run_id) < 0)
            return;
        dl__rdzv_entry_t *e = entry_find(core, store, &ev->wait.keys[i]);
        missing += !e || !e->present;
        unknown += !e;
    }
    if (missing == 0) {
        dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_WAIT_DONE, ev->req_id, job->run_id);
        return;
    }
    if (ev->wait.timeout == 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ETIMEDOUT,
                       "store wait: %zu of %zu keys missing", missing, nkeys);
        return;
    }
    if (ev->conn == DL_RDZV_CONN_NONE)
        return;
    if (store->nwaiters >= core->opts.max_waits) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOSPC,
                       "store wait: job '%s' has %zu waits pending, the limit", job->run_id,
                       store->nwaiters);
        return;
    }
    if (unknown > core->opts.max_keys - store->keys.count) {
        store_error(core, ev, job, -ENOSPC);
        return;
    }
    dl__rdzv_conn_t *have = dl__rdzv_conn_find(core, ev->conn);
    if (have && have->nwaiters >= core->opts.max_waits_per_conn) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOSPC,
                       "store wait: this connection has %zu waits pending, the limit",
                       have->nwaiters);
        return;
    }
    /* The wait itself; an entry for each key nobody set yet is charged as it is made. */
    if (!mem_room(core, WAITER_COST(nkeys))) {
        store_error(core, ev, job, -ENOBUFS);
        return;
    }
    dl__rdzv_conn_t *conn = NULL;
    dl__rdzv_waiter_t *w = NULL;
    int r = dl__rdzv_heap_reserve(&core->heap, 1);
    if (r == 0)
        r = dl__rdzv_map_reserve(&store->keys, unknown);
    if (r == 0)
        r = dl__rdzv_conn_get(core, ev->conn, &conn);
    if (r == 0 && !(w = calloc(1, sizeof(*w) + nkeys * sizeof(w->links[0]))))
        r = -ENOMEM;
    if (r < 0) {
        dl__rdzv_conn_gc(core, conn);
        store_error(core, ev, job, -ENOMEM);
        return;
    }
    w->job = job;
    w->req_id = ev->req_id;
    w->timeout = ev->wait.timeout;
    w->nkeys = nkeys;
    mem_add(core, store, WAITER_COST(nkeys));
    dl__rdzv_timer_init(&w->timer, DL__RDZV_T_WAIT);
    link_waiter(store, conn, w);
    for (size_t i = 0; i < nkeys; i++) {
        dl__rdzv_entry_t *e;
        r = entry_get(core, store, &ev->wait.keys[i], &e);
        if (r < 0) {
            waiter_finish(core, store, w);
            store_error(core, ev, job, r);
            return;
        }
        dl__rdzv_link_t *l = &w->links[w->nlinks++];
        l->entry = e;
        l->waiter = w;
        l->satisfied = e->present;
        if (e->present) {
            link_push(&e->satisfied, l);
            e->nsatisfied++;
        } else {
            link_push(&e->pending, l);
            e->npending++;
            w->nmissing++;
        }
    }
    if (ev->wait.timeout > 0)
        dl__rdzv_timer_arm(&core->heap, &w->timer, now + ev->wait.timeout);
}

void dl__rdzv_store_request(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev,
                            double now)
{
    const char *what = op_name(ev->kind);
    if (job->state >= DL_RDZV_JOB_SUCCEEDED) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESHUTDOWN,
                       "%s: job '%s' is over (%s)", what, job->run_id,
                       dl_rdzv_job_state_name(job->state));
        return;
    }
    int round = ev->kind == DL_RDZV_EV_STORE_WAIT ? ev->wait.round : ev->store.round;
    if (round != -1 && round != job->round) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESTALE,
                       "%s: round %d is not the current round %d", what, round, job->round);
        return;
    }
    if (ev->kind == DL_RDZV_EV_STORE_WAIT) {
        do_wait(core, job, ev, now);
        return;
    }
    if (check_key(core, ev, &ev->store.key, job->run_id) < 0)
        return;
    if ((ev->kind == DL_RDZV_EV_STORE_SET || ev->kind == DL_RDZV_EV_STORE_CAS) &&
        check_value(core, ev, &ev->store.value, "value", job->run_id) < 0)
        return;
    dl__rdzv_entry_t *e = NULL;
    switch (ev->kind) {
    case DL_RDZV_EV_STORE_SET:
        if (write_key(core, job, ev, &e, ev->store.value.data, ev->store.value.len) == 0)
            dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
        break;
    case DL_RDZV_EV_STORE_GET: {
        e = entry_find(core, &job->store, &ev->store.key);
        dl_rdzv_msg_t *m =
            dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_VALUE, ev->req_id, job->run_id);
        m->value.found = e && e->present;
        if (m->value.found)
            m->value.value = (dl_rdzv_buf_t){e->value, e->value_len};
        break;
    }
    case DL_RDZV_EV_STORE_ADD: do_add(core, job, ev); break;
    case DL_RDZV_EV_STORE_CAS: do_cas(core, job, ev); break;
    default: do_delete(core, job, ev); break;
    }
}

void dl__rdzv_store_wait_expired(dl_rdzv_core_t *core, dl__rdzv_timer_t *timer, double now)
{
    dl__rdzv_waiter_t *w = dl__rdzv_container_of(timer, dl__rdzv_waiter_t, timer);
    dl__rdzv_job_t *job = w->job;
    dl__rdzv_error(core, w->conn->id, w->req_id, job->run_id, -ETIMEDOUT,
                   "store wait: %zu of %zu keys still missing after %g s", w->nmissing, w->nlinks,
                   w->timeout);
    waiter_finish(core, &job->store, w);
}

void dl__rdzv_store_drop_conn(dl_rdzv_core_t *core, dl__rdzv_conn_t *conn)
{
    while (conn->waiters) {
        dl__rdzv_waiter_t *w = conn->waiters;
        waiter_free(core, &w->job->store, w);
    }
}

void dl__rdzv_store_clear(dl_rdzv_core_t *core, dl__rdzv_job_t *job, int code, const char *message)
{
    dl__rdzv_store_t *store = &job->store;
    if (code)
        dl__rdzv_reserve(core, store->nwaiters + 1);
    while (store->waiters) {
        dl__rdzv_waiter_t *w = store->waiters;
        if (code)
            dl__rdzv_error(core, w->conn->id, w->req_id, job->run_id, code, "store wait: %s",
                           message);
        waiter_finish(core, store, w);
    }
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&store->keys);
    while (n) {
        dl__rdzv_hnode_t *next = n->next;
        entry_free(core, store, dl__rdzv_container_of(n, dl__rdzv_entry_t, node));
        n = next;
    }
}
