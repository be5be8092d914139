/* The trainer's gradient hooks on the collective library: with overlap every bucket becomes an
 * asynchronous all-reduce on the group's communication thread, so it travels while backward goes
 * on; without, the caller's thread sums the whole gradient in blocking calls (reduce-scatter and
 * all-gather around the sharded update). */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int allreduce(void *ctx, float *buf, size_t n)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_allreduce(c->group, buf, buf, n, DL_COLL_FLOAT32, DL_COLL_SUM);
}

static int reduce_scatter(void *ctx, const float *send, float *recv, size_t count)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_reduce_scatter(c->group, send, recv, count, DL_COLL_FLOAT32, DL_COLL_SUM);
}

static int allgather(void *ctx, float *buf, size_t count)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_allgather(c->group, buf + (size_t)dl_coll_rank(c->group) * count, buf, count,
                             DL_COLL_FLOAT32);
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

static const char *error(void *ctx)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_group_error(c->group);
}

/* The CPUs this process may run on. */
static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Shared memory moves a message in rounds of one chunk per rank, each with its own waits for the
 * other ranks. A chunk that holds the whole gradient makes a step's sum one round: fewer points
 * where a rank that the scheduler has set aside holds up the others. The segment holds two
 * chunks a rank; this keeps it within 32 MiB. The sum's bits do not depend on the chunk (every
 * element is added in rank order). */
static size_t shm_chunk_for(size_t grad_bytes, int local_ranks, size_t dflt)
{
    size_t cap = ((size_t)32 << 20) / (2 * (size_t)(local_ranks > 0 ? local_ranks : 1));
    size_t want = (grad_bytes + 65535) & ~(size_t)65535;
    if (want > cap)
        want = cap & ~(size_t)65535;
    return want > dflt ? want : dflt;
}

int dl_train_coll_open(dl_train_comm_t *comm, size_t grad_bytes, dl_train_coll_t **ret, char *err,
                       size_t errlen)
{
    dl_coll_options_t opts;
    dl_coll_options_init(&opts);
    int r = dl_coll_options_from_env(&opts, NULL, err, errlen);
    if (r < 0)
        return r;
    if (getenv("DLAUNCH_COLL_SHM_CHUNK") == NULL)
        opts.shm_chunk_bytes =
            shm_chunk_for(grad_bytes, opts.local_world_size, opts.shm_chunk_bytes);

    dl_train_coll_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    r = dl_coll_group_create(&opts, &c->group, err, errlen);
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
    comm->allreduce = allreduce;
    comm->reduce_scatter = reduce_scatter;
    comm->allgather = allgather;
    /* A communication thread is worth its hand-offs only with a core to run on that backward
     * does not already use. */
    comm->overlap_pays = dl_coll_local_size(c->group) < usable_cpus();
    comm->error = error;
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
