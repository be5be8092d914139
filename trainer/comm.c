/* Gradient buckets and the driver that hands them to the communication hooks.
 *
 * Backward reports how much of the gradient buffer is final; every bucket that lies wholly inside
 * that prefix is started at once, so with an asynchronous backend the sum of the last layers'
 * gradients travels while the first layers' are still being computed. Buckets are cut by bytes,
 * not by layer: the buffer is contiguous, so a bucket may span a layer boundary or split a large
 * weight, and every rank cuts the same buckets from the same shape.
 *
 * Without overlap the whole buffer is one bucket, summed after backward by one blocking call:
 * when the workers fill every core, a communication thread only takes turns with backward on
 * the same cores, and each hand-off to it costs a context switch.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

void dl_train_comm_init_local(dl_train_comm_t *c)
{
    c->rank = 0;
    c->world_size = 1;
    c->ctx = NULL;
    c->allreduce_start = NULL;
    c->allreduce_wait_all = NULL;
    c->broadcast = NULL;
    c->allreduce = NULL;
    c->reduce_scatter = NULL;
    c->allgather = NULL;
    c->overlap_pays = false;
    c->error = NULL;
    c->joining = false;
    c->rejoin = NULL;
    c->allgather_bytes = NULL;
    c->mem_alloc = NULL;
    c->mem_peer = NULL;
    c->mem_peer_rw = NULL;
    c->host_of = NULL;
    c->reduce_scatter_extra = NULL;
    c->recovered = NULL;
}

int dl_train_buckets_plan(size_t n, size_t bucket_bytes, size_t **ret_ends, size_t *ret_count)
{
    size_t per = bucket_bytes / sizeof(float);

    if (n == 0)
        return -EINVAL;
    if (per == 0 || per > n)
        per = n;
    size_t count = (n + per - 1) / per;
    size_t *ends = malloc(count * sizeof(*ends));
    if (ends == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < count; i++)
        ends[i] = i + 1 < count ? (i + 1) * per : n;
    *ret_ends = ends;
    *ret_count = count;
    return 0;
}

int dl__train_reducer_init(dl__train_reducer_t *r, const dl_train_comm_t *comm, float *grads,
                           size_t n, size_t bucket_bytes, bool overlap)
{
    r->comm = comm;
    r->grads = grads;
    r->next = 0;
    r->overlap = overlap;
    return dl_train_buckets_plan(n, overlap ? bucket_bytes : 0, &r->ends, &r->count);
}

void dl__train_reducer_free(dl__train_reducer_t *r)
{
    if (r == NULL)
        return;
    free(r->ends);
    r->ends = NULL;
}

/* Starts every bucket that lies inside the first `ready` floats and has not started yet. */
static int start_ready(dl__train_reducer_t *r, size_t ready)
{
    const dl_train_comm_t *c = r->comm;

    while (r->next < r->count && r->ends[r->next] <= ready) {
        size_t begin = r->next == 0 ? 0 : r->ends[r->next - 1];
        if (c->allreduce_start != NULL) {
            int rc =
                c->allreduce_start(c->ctx, r->next, r->grads + begin, r->ends[r->next] - begin);
            if (rc < 0)
                return rc;
        }
        r->next++;
    }
    return 0;
}

int dl__train_reducer_ready(void *ud, size_t ready)
{
    dl__train_reducer_t *r = ud;
    return r->overlap ? start_ready(r, ready) : 0;
}

int dl__train_reducer_finish(dl__train_reducer_t *r)
{
    const dl_train_comm_t *c = r->comm;

    /* One blocking sum: no thread hand-off, and the backend picks its algorithm for the size. */
    if (!r->overlap && c->allreduce != NULL)
        return c->allreduce(c->ctx, r->grads, r->ends[0]);
    int rc = start_ready(r, r->ends[r->count - 1]);
    r->next = 0;
    if (rc < 0)
        return rc;
    if (c->allreduce_wait_all != NULL)
        return c->allreduce_wait_all(c->ctx);
    return 0;
}
