/* The plumbing of the rendezvous core: a seeded hash, an intrusive hash map, the deadline heap,
 * the per-step arena and the action list. Each keeps per-event work bounded: map operations are
 * O(1) on average, timer operations O(log n). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"

/* Keys come from the network, so a peer that knew the hash could send thousands of keys for one
 * bucket and turn every lookup into a walk of them all. The hash is SipHash-1-3 (what Python and
 * Rust use for the same reason) under a 128-bit key the shell draws at random: without the key,
 * nobody can aim at a bucket. */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

uint64_t dl__rdzv_hash(const uint64_t key[2], const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t v0 = key[0] ^ 0x736f6d6570736575ULL;
    uint64_t v1 = key[1] ^ 0x646f72616e646f6dULL;
    uint64_t v2 = key[0] ^ 0x6c7967656e657261ULL;
    uint64_t v3 = key[1] ^ 0x7465646279746573ULL;
    uint64_t b = (uint64_t)len << 56;

    for (; len >= 8; p += 8, len -= 8) {
        uint64_t m = load_le64(p);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t i = 0; i < len; i++)
        b |= (uint64_t)p[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* Connection ids are the shell's own numbers, not a peer's choice: a cheap mix is enough. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t dl__rdzv_hash_u64(const uint64_t key[2], uint64_t v)
{
    return mix(key[0] ^ mix(v + 0x9e3779b97f4a7c15ULL));
}

int dl__rdzv_map_reserve(dl__rdzv_map_t *map, size_t extra)
{
    size_t need = map->count + extra;
    size_t nb = map->buckets ? map->mask + 1 : 0;
    if (need <= nb)
        return 0;
    size_t newnb = nb ? nb : 16;
    while (newnb < need) {
        if (newnb > SIZE_MAX / 4 / sizeof(void *))
            return -ENOMEM;
        newnb *= 2;
    }
    dl__rdzv_hnode_t **b = calloc(newnb, sizeof(*b));
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < nb; i++) {
        dl__rdzv_hnode_t *n = map->buckets[i];
        while (n) {
            dl__rdzv_hnode_t *next = n->next;
            size_t j = n->hash & (newnb - 1);
            n->next = b[j];
            b[j] = n;
            n = next;
        }
    }
    free(map->buckets);
    map->buckets = b;
    map->mask = newnb - 1;
    return 0;
}

void dl__rdzv_map_insert(dl__rdzv_map_t *map, dl__rdzv_hnode_t *node, uint64_t hash)
{
    size_t i = hash & map->mask;
    node->hash = hash;
    node->next = map->buckets[i];
    map->buckets[i] = node;
    map->count++;
}

void dl__rdzv_map_remove(dl__rdzv_map_t *map, dl__rdzv_hnode_t *node)
{
    dl__rdzv_hnode_t **pp = &map->buckets[node->hash & map->mask];
    while (*pp && *pp != node)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = node->next;
        map->count--;
    }
    node->next = NULL;
}

dl__rdzv_hnode_t *dl__rdzv_map_chain(const dl__rdzv_map_t *map, uint64_t hash)
{
    return map->buckets ? map->buckets[hash & map->mask] : NULL;
}

dl__rdzv_hnode_t *dl__rdzv_map_take_all(dl__rdzv_map_t *map)
{
    dl__rdzv_hnode_t *list = NULL;
    if (!map->buckets)
        return NULL;
    for (size_t i = 0; i <= map->mask; i++) {
        dl__rdzv_hnode_t *n = map->buckets[i];
        while (n) {
            dl__rdzv_hnode_t *next = n->next;
            n->next = list;
            list = n;
            n = next;
        }
        map->buckets[i] = NULL;
    }
    map->count = 0;
    return list;
}

void dl__rdzv_map_free(dl__rdzv_map_t *map)
{
    free(map->buckets);
    map->buckets = NULL;
    map->mask = 0;
    map->count = 0;
}

void dl__rdzv_timer_init(dl__rdzv_timer_t *t, int kind)
{
    t->at = 0;
    t->seq = 0;
    t->idx = DL__RDZV_UNARMED;
    t->kind = kind;
}

static bool earlier(const dl__rdzv_timer_t *a, const dl__rdzv_timer_t *b)
{
    return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static void heap_set(dl__rdzv_heap_t *heap, size_t i, dl__rdzv_timer_t *t)
{
    heap->v[i] = t;
    t->idx = i;
}

static void sift_up(dl__rdzv_heap_t *heap, size_t i)
{
    dl__rdzv_timer_t *t = heap->v[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!earlier(t, heap->v[parent]))
            break;
        heap_set(heap, i, heap->v[parent]);
        i = parent;
    }
    heap_set(heap, i, t);
}

static void sift_down(dl__rdzv_heap_t *heap, size_t i)
{
    dl__rdzv_timer_t *t = heap->v[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap->n)
            break;
        if (c + 1 < heap->n && earlier(heap->v[c + 1], heap->v[c]))
            c++;
        if (!earlier(heap->v[c], t))
            break;
        heap_set(heap, i, heap->v[c]);
        i = c;
    }
    heap_set(heap, i, t);
}

int dl__rdzv_heap_reserve(dl__rdzv_heap_t *heap, size_t extra)
{
    if (heap->n + extra <= heap->cap)
        return 0;
    size_t cap = heap->cap ? heap->cap : 64;
    while (cap < heap->n + extra) {
        if (cap > SIZE_MAX / 4 / sizeof(void *))
            return -ENOMEM;
        cap *= 2;
    }
    dl__rdzv_timer_t **v = realloc(heap->v, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    heap->v = v;
    heap->cap = cap;
    return 0;
}

void dl__rdzv_timer_arm(dl__rdzv_heap_t *heap, dl__rdzv_timer_t *t, double at)
{
    t->at = at;
    t->seq = heap->seq++;
    if (dl__rdzv_timer_armed(t)) {
        /* A new seq makes it later than equal deadlines, so both directions may apply. */
        sift_up(heap, t->idx);
        sift_down(heap, t->idx);
        return;
    }
    heap->n++;
    heap_set(heap, heap->n - 1, t);
    sift_up(heap, heap->n - 1);
}

void dl__rdzv_timer_disarm(dl__rdzv_heap_t *heap, dl__rdzv_timer_t *t)
{
    if (!dl__rdzv_timer_armed(t))
        return;
    size_t i = t->idx;
    t->idx = DL__RDZV_UNARMED;
    heap->n--;
    if (i == heap->n)
        return;
    dl__rdzv_timer_t *moved = heap->v[heap->n];
    heap_set(heap, i, moved);
    sift_up(heap, i);
    sift_down(heap, moved->idx);
}

dl__rdzv_timer_t *dl__rdzv_heap_top(const dl__rdzv_heap_t *heap)
{
    return heap->n ? heap->v[0] : NULL;
}

void dl__rdzv_heap_free(dl__rdzv_heap_t *heap)
{
    free(heap->v);
    heap->v = NULL;
    heap->n = heap->cap = 0;
}

/* Blocks of at least 16 KiB; a larger request gets a block of its own. */
struct dl__rdzv_block_s {
    dl__rdzv_block_t *next;
    size_t used;
    size_t size;
    max_align_t data[];
};

#define BLOCK_SIZE 16384

void *dl__rdzv_arena_alloc(dl__rdzv_arena_t *arena, size_t size)
{
    size_t align = sizeof(max_align_t);
    size = (size + align - 1) / align * align;
    dl__rdzv_block_t *b = arena->head;
    if (!b || b->size - b->used < size) {
        size_t bs = size > BLOCK_SIZE ? size : BLOCK_SIZE;
        if (bs > SIZE_MAX - sizeof(*b))
            return NULL;
        b = malloc(sizeof(*b) + bs);
        if (!b)
            return NULL;
        b->used = 0;
        b->size = bs;
        b->next = arena->head;
        arena->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += size;
    return p;
}

void dl__rdzv_arena_reset(dl__rdzv_arena_t *arena)
{
    /* Keep one ordinary block: most steps need a few strings at most. */
    dl__rdzv_block_t *keep = NULL;
    dl__rdzv_block_t *b = arena->head;
    while (b) {
        dl__rdzv_block_t *next = b->next;
        if (!keep && b->size == BLOCK_SIZE) {
            keep = b;
            keep->used = 0;
            keep->next = NULL;
        } else {
            free(b);
        }
        b = next;
    }
    arena->head = keep;
}

void dl__rdzv_arena_free(dl__rdzv_arena_t *arena)
{
    dl__rdzv_block_t *b = arena->head;
    while (b) {
        dl__rdzv_block_t *next = b->next;
        free(b);
        b = next;
    }
    arena->head = NULL;
}

int dl__rdzv_reserve(dl_rdzv_core_t *core, size_t n)
{
    if (n > SIZE_MAX / 2 / sizeof(dl_rdzv_action_t) - core->nacts)
        return -ENOMEM;
    if (core->nacts + n <= core->acts_cap)
        return 0;
    size_t cap = core->acts_cap ? core->acts_cap : 64;
    while (cap < core->nacts + n)
        cap *= 2;
    dl_rdzv_action_t *v = realloc(core->acts, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    core->acts = v;
    core->acts_cap = cap;
    return 0;
}

dl_rdzv_action_t *dl__rdzv_push(dl_rdzv_core_t *core, dl_rdzv_action_kind_t kind)
{
    dl_rdzv_action_t *a = &core->scratch;
    if (dl__rdzv_reserve(core, 1) < 0)
        core->oom = true;
    else
        a = &core->acts[core->nacts++];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    return a;
}

dl_rdzv_msg_t *dl__rdzv_send(dl_rdzv_core_t *core, uint64_t conn, dl_rdzv_msg_kind_t kind,
                             uint64_t req_id, const char *run_id)
{
    dl_rdzv_action_t *a;
    if (conn == DL_RDZV_CONN_NONE) {
        a = &core->scratch;
        memset(a, 0, sizeof(*a));
    } else {
        a = dl__rdzv_push(core, DL_RDZV_ACT_SEND);
    }
    a->conn = conn;
    a->msg.kind = kind;
    a->msg.req_id = req_id;
    a->msg.run_id = run_id;
    return &a->msg;
}

void dl__rdzv_close(dl_rdzv_core_t *core, uint64_t conn)
{
    if (conn != DL_RDZV_CONN_NONE)
        dl__rdzv_push(core, DL_RDZV_ACT_CLOSE)->conn = conn;
}

DL__RDZV_PRINTF(2, 0)
static const char *vformat(dl_rdzv_core_t *core, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = n >= 0 ? dl__rdzv_arena_alloc(&core->arena, (size_t)n + 1) : NULL;
    if (!s)
        return "(message lost: out of memory)";
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

dl_rdzv_culprit_t *dl__rdzv_culprit(dl_rdzv_core_t *core, dl_rdzv_culprit_t c)
{
    dl_rdzv_culprit_t *p = dl__rdzv_arena_alloc(&core->arena, sizeof(*p));
    if (p)
        *p = c;
    return p;
}

const char *dl__rdzv_printf(dl_rdzv_core_t *core, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *s = vformat(core, fmt, ap);
    va_end(ap);
    return s;
}

void dl__rdzv_error(dl_rdzv_core_t *core, uint64_t conn, uint64_t req_id, const char *run_id,
                    int code, const char *fmt, ...)
{
    if (conn == DL_RDZV_CONN_NONE)
        return;
    va_list ap;
    va_start(ap, fmt);
    const char *text = vformat(core, fmt, ap);
    va_end(ap);
    dl_rdzv_msg_t *m = dl__rdzv_send(core, conn, DL_RDZV_MSG_ERROR, req_id, run_id);
    m->error.code = code;
    m->error.message = text;
}

void dl__rdzv_log(dl_rdzv_core_t *core, dl_rdzv_log_level_t level, const char *run_id,
                  const char *fmt, ...)
{
    if (level < core->opts.log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    const char *text = vformat(core, fmt, ap);
    va_end(ap);
    dl_rdzv_action_t *a = dl__rdzv_push(core, DL_RDZV_ACT_LOG);
    a->log.level = level;
    a->log.run_id = run_id;
    a->log.text = text;
}

dl__rdzv_conn_t *dl__rdzv_conn_find(dl_rdzv_core_t *core, uint64_t id)
{
    uint64_t h = dl__rdzv_hash_u64(core->opts.hash_key, id);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&core->conns, h); n; n = n->next) {
        dl__rdzv_conn_t *c = dl__rdzv_container_of(n, dl__rdzv_conn_t, node);
        if (n->hash == h && c->id == id)
            return c;
    }
    return NULL;
}

int dl__rdzv_conn_get(dl_rdzv_core_t *core, uint64_t id, dl__rdzv_conn_t **ret_conn)
{
    dl__rdzv_conn_t *c = dl__rdzv_conn_find(core, id);
    if (c) {
        *ret_conn = c;
        return 0;
    }
    if (dl__rdzv_map_reserve(&core->conns, 1) < 0)
        return -ENOMEM;
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->id = id;
    dl__rdzv_map_insert(&core->conns, &c->node, dl__rdzv_hash_u64(core->opts.hash_key, id));
    *ret_conn = c;
    return 0;
}

void dl__rdzv_conn_gc(dl_rdzv_core_t *core, dl__rdzv_conn_t *conn)
{
    if (!conn || conn->member || conn->waiters)
        return;
    dl__rdzv_map_remove(&core->conns, &conn->node);
    free(conn);
}
