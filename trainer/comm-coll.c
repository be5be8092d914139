/* The trainer's gradient hooks on the collective library: every bucket becomes an asynchronous
 * all-reduce on the group's communication thread, so it travels while backward goes on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "comm-coll.h"

#define MAX_INFLIGHT 4096

struct dl_train_coll_s {
    dl_coll_group_t *group;
    dl_coll_request_t *reqs[MAX_INFLIGHT];
    size_t n;
};

static int start(void *ctx, size_t bucket, float *buf, size_t n)
{
    dl_train_coll_t *c = ctx;
    if (c->n == MAX_INFLIGHT)
        return -E2BIG;
    int r = dl_coll_allreduce_async(c->group, buf, buf, n, DL_COLL_FLOAT32, DL_COLL_SUM,
                                    &c->reqs[c->n]);
    if (r < 0)
        return r;
    c->n++;
    return 0;
}

static int wait_all(void *ctx)
{
    dl_train_coll_t *c = ctx;
    int first = 0;
    /* Every request is waited on, even after a failure, so none is left behind. */
    for (size_t i = 0; i < c->n; i++) {
        int r = dl_coll_wait(c->reqs[i]);
        if (r < 0 && first == 0)
            first = r;
    }
    c->n = 0;
    return first;
}

/* Bytes travel as int32 words; a ragged tail goes through a padded copy. */
static int broadcast(void *ctx, void *buf, size_t len, int root)
{
    dl_train_coll_t *c = ctx;
    size_t words = len / 4, tail = len % 4;
    int r = words > 0 ? dl_coll_broadcast(c->group, buf, words, DL_COLL_INT32, root) : 0;
    if (r < 0 || tail == 0)
        return r;
    int32_t last = 0;
    memcpy(&last, (char *)buf + words * 4, tail);
    r = dl_coll_broadcast(c->group, &last, 1, DL_COLL_INT32, root);
    if (r == 0)
        memcpy((char *)buf + words * 4, &last, tail);
    return r;
}

int dl_train_coll_open(dl_train_comm_t *comm, dl_train_coll_t **ret, char *err, size_t errlen)
{
    dl_train_coll_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    int r = dl_coll_group_from_env(&c->group, err, errlen);
    if (r < 0) {
        free(c);
        return r;
    }
    comm->rank = dl_coll_rank(c->group);
    comm->world_size = dl_coll_world_size(c->group);
    comm->ctx = c;
    comm->allreduce_start = start;
    comm->allreduce_wait_all = wait_all;
    comm->broadcast = broadcast;
    *ret = c;
    return 0;
}

const char *dl_train_coll_describe(const dl_train_coll_t *c)
{
    return dl_coll_transport_name(c->group);
}

void dl_train_coll_close(dl_train_coll_t *c)
{
    if (c == NULL)
        return;
    wait_all(c);
    dl_coll_group_destroy(c->group);
    free(c);
}
