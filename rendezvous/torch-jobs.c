/* One torch store per job of a server that serves many (torch-jobs.h). Index 0 is the embedded
 * server's one store; the table hands out 1 .. DL__TORCH_MAX_STORES - 1, reusing closed ones. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"
#include "proto.h"
#include "torch-jobs.h"

typedef struct {
    dl__rdzv_hnode_t node; /* in by_run_id */
    dl__torch_store_t *ts;
    uint32_t index;
} entry_t;

struct dl__torch_jobs_s {
    dl__rdzv_map_t by_run_id;
    uint64_t hash_key[2]; /* run ids are the agents' to choose: a key they cannot know */
    entry_t **by_index;   /* [index], NULL when free; grown as needed */
    size_t cap;           /* entries of by_index */
    uint32_t *free_idx;   /* closed indexes, to reuse */
    size_t nfree;
    uint32_t next; /* the next index never used */
    size_t count;
};

int dl__torch_jobs_new(dl__torch_jobs_t **ret)
{
    dl__torch_jobs_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    int r = dl_proto_random(t->hash_key, sizeof(t->hash_key));
    if (r < 0) {
        free(t);
        return r;
    }
    t->next = 1;
    *ret = t;
    return 0;
}

static uint64_t hash_of(const dl__torch_jobs_t *t, const char *run_id)
{
    return dl__rdzv_hash(t->hash_key, run_id, strlen(run_id));
}

static entry_t *find(const dl__torch_jobs_t *t, const char *run_id)
{
    uint64_t h = hash_of(t, run_id);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&t->by_run_id, h); n != NULL; n = n->next) {
        entry_t *e = dl__rdzv_container_of(n, entry_t, node);
        if (n->hash == h && strcmp(dl__torch_store_run_id(e->ts), run_id) == 0)
            return e;
    }
    return NULL;
}

dl__torch_store_t *dl__torch_jobs_find(const dl__torch_jobs_t *t, const char *run_id)
{
    entry_t *e = find(t, run_id);
    return e != NULL ? e->ts : NULL;
}

dl__torch_store_t *dl__torch_jobs_of_conn(const dl__torch_jobs_t *t, uint64_t conn)
{
    uint32_t i = DL__TORCH_STORE_INDEX(conn);
    return i < t->cap && t->by_index[i] != NULL ? t->by_index[i]->ts : NULL;
}

/* An index free to use, with room for it in by_index. */
static int take_index(dl__torch_jobs_t *t, uint32_t *ret)
{
    if (t->nfree > 0) {
        *ret = t->free_idx[--t->nfree];
        return 0;
    }
    if (t->next >= DL__TORCH_MAX_STORES)
        return -ENOSPC;
    if (t->next >= t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        entry_t **v = realloc(t->by_index, cap * sizeof(*v));
        if (v == NULL)
            return -ENOMEM;
        memset(v + t->cap, 0, (cap - t->cap) * sizeof(*v));
        t->by_index = v;
        uint32_t *f = realloc(t->free_idx, cap * sizeof(*f));
        if (f == NULL)
            return -ENOMEM;
        t->free_idx = f;
        t->cap = cap;
    }
    *ret = t->next++;
    return 0;
}

int dl__torch_jobs_open(dl__torch_jobs_t *t, dl_rdzv_server_t *s, uv_loop_t *loop, const char *host,
                        const char *run_id, dl__torch_store_t **ret, char *err, size_t errlen)
{
    uint32_t index = 0;
    entry_t *e = calloc(1, sizeof(*e));
    int r = e != NULL ? dl__rdzv_map_reserve(&t->by_run_id, 1) : -ENOMEM;
    if (r == 0)
        r = take_index(t, &index);
    if (r < 0) {
        free(e);
        snprintf(err, errlen, "%s",
                 r == -ENOSPC ? "every torch store port of this server is open" : "out of memory");
        return r;
    }
    r = dl__torch_store_start(s, loop, host, 0, run_id, index, &e->ts, err, errlen);
    if (r < 0) {
        t->free_idx[t->nfree++] = index;
        free(e);
        return r;
    }
    e->index = index;
    t->by_index[index] = e;
    dl__rdzv_map_insert(&t->by_run_id, &e->node, hash_of(t, run_id));
    t->count++;
    *ret = e->ts;
    return 0;
}

static void close_entry(dl__torch_jobs_t *t, entry_t *e)
{
    dl__rdzv_map_remove(&t->by_run_id, &e->node);
    t->by_index[e->index] = NULL;
    t->free_idx[t->nfree++] = e->index;
    t->count--;
    dl__torch_store_close(e->ts);
    free(e);
}

void dl__torch_jobs_close(dl__torch_jobs_t *t, const char *run_id)
{
    entry_t *e = find(t, run_id);
    if (e != NULL)
        close_entry(t, e);
}

void dl__torch_jobs_close_if(dl__torch_jobs_t *t, int (*gone)(void *ctx, const char *run_id),
                             void *ctx)
{
    for (uint32_t i = 1; i < t->next && t->count > 0; i++) {
        entry_t *e = t->by_index[i];
        if (e != NULL && gone(ctx, dl__torch_store_run_id(e->ts)))
            close_entry(t, e);
    }
}

size_t dl__torch_jobs_count(const dl__torch_jobs_t *t)
{
    return t->count;
}

void dl__torch_jobs_free(dl__torch_jobs_t *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 1; i < t->next; i++)
        if (t->by_index[i] != NULL)
            close_entry(t, t->by_index[i]);
    dl__rdzv_map_free(&t->by_run_id);
    free(t->by_index);
    free(t->free_idx);
    free(t);
}
