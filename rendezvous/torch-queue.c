/* Named FIFO queues for the torch store (torch-queue.h). Queues hang off a fixed table of
 * buckets by an FNV-1a hash of their name; the items cap bounds the queues too, since an empty
 * queue is freed at once, so a chain never outgrows max_items / NBUCKETS on average. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "torch-queue.h"

#define NBUCKETS 1024

typedef struct item_s {
    struct item_s *next;
    size_t len;
    uint8_t data[];
} item_t;

typedef struct queue_s {
    struct queue_s *next; /* in its bucket */
    item_t *head, *tail;
    size_t nitems;
    size_t name_len;
    uint8_t name[];
} queue_t;

struct dl__tqueues_s {
    queue_t *buckets[NBUCKETS];
    size_t items, bytes;
    size_t max_items, max_bytes;
};

static size_t bucket_of(const void *name, size_t len)
{
    const uint8_t *p = name;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)(h % NBUCKETS);
}

static queue_t **find(const dl__tqueues_t *q, const void *name, size_t len)
{
    queue_t **pp = (queue_t **)&q->buckets[bucket_of(name, len)];
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->name_len == len && memcmp((*pp)->name, name, len) == 0)
            return pp;
    return pp;
}

dl__tqueues_t *dl__tqueues_new(size_t max_items, size_t max_bytes)
{
    dl__tqueues_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->max_items = max_items;
    q->max_bytes = max_bytes;
    return q;
}

void dl__tqueues_free(dl__tqueues_t *q)
{
    if (q == NULL)
        return;
    dl__tqueues_clear(q);
    free(q);
}

int dl__tqueues_push(dl__tqueues_t *q, const void *name, size_t name_len, const void *value,
                     size_t value_len)
{
    queue_t **pp = find(q, name, name_len);
    bool fresh = *pp == NULL;
    size_t cost = value_len + (fresh ? name_len : 0);
    if (q->items + 1 > q->max_items || cost > q->max_bytes - q->bytes)
        return -ENOSPC;
    item_t *it = malloc(sizeof(*it) + value_len);
    if (it == NULL)
        return -ENOMEM;
    it->next = NULL;
    it->len = value_len;
    if (value_len > 0)
        memcpy(it->data, value, value_len);
    if (fresh) {
        queue_t *nq = calloc(1, sizeof(*nq) + name_len);
        if (nq == NULL) {
            free(it);
            return -ENOMEM;
        }
        nq->name_len = name_len;
        memcpy(nq->name, name, name_len);
        *pp = nq;
    }
    queue_t *qu = *pp;
    if (qu->tail != NULL)
        qu->tail->next = it;
    else
        qu->head = it;
    qu->tail = it;
    qu->nitems++;
    q->items++;
    q->bytes += cost;
    return 0;
}

size_t dl__tqueues_len(const dl__tqueues_t *q, const void *name, size_t name_len)
{
    queue_t **pp = find(q, name, name_len);
    return *pp != NULL ? (*pp)->nitems : 0;
}

int dl__tqueues_pop(dl__tqueues_t *q, const void *name, size_t name_len, uint8_t **ret,
                    size_t *ret_len)
{
    queue_t **pp = find(q, name, name_len);
    queue_t *qu = *pp;
    if (qu == NULL || qu->head == NULL)
        return 0;
    item_t *it = qu->head;
    /* The item's own block goes to the caller: its data move to its start. */
    size_t len = it->len;
    qu->head = it->next;
    if (qu->head == NULL)
        qu->tail = NULL;
    qu->nitems--;
    q->items--;
    q->bytes -= len;
    if (len > 0) {
        memmove(it, it->data, len);
        *ret = (uint8_t *)it;
    } else {
        free(it);
        *ret = NULL;
    }
    *ret_len = len;
    if (qu->nitems == 0) {
        q->bytes -= qu->name_len;
        *pp = qu->next;
        free(qu);
    }
    return 1;
}

void dl__tqueues_clear(dl__tqueues_t *q)
{
    for (size_t b = 0; b < NBUCKETS; b++) {
        while (q->buckets[b] != NULL) {
            queue_t *qu = q->buckets[b];
            q->buckets[b] = qu->next;
            while (qu->head != NULL) {
                item_t *it = qu->head;
                qu->head = it->next;
                free(it);
            }
            free(qu);
        }
    }
    q->items = q->bytes = 0;
}

void dl__tqueues_usage(const dl__tqueues_t *q, size_t *ret_items, size_t *ret_bytes)
{
    *ret_items = q->items;
    *ret_bytes = q->bytes;
}
