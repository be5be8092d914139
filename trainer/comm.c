/* Gradient buckets and the driver that hands them to the communication hooks.
 *
 * Backward reports how much of the gradient buffer is final; every bucket that lies wholly inside
 * that prefix is started at once, so with an asynchronous backend the sum of the last layers'
 * gradients travels while the first layers' are still being computed. Buckets are cut by bytes,
 * not by layer: the buffer is contiguous, so a bucket may span a layer boundary or split a large
 * weight, and every rank cuts the same buckets from the same shape.
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
                           size_t n, size_t bucket_bytes)
{
    r->comm = comm;
    r->grads = grads;
    r->next = 0;
    return dl_train_buckets_plan(n, bucket_bytes, &r->ends, &r->count);
}

void dl__train_reducer_free(dl__train_reducer_t *r)
{
    if (r == NULL)
        return;
    free(r->ends);
    r->ends = NULL;
}

int dl__train_reducer_ready(void *ud, size_t ready)
{
    dl__train_reducer_t *r = ud;
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

int dl__train_reducer_finish(dl__train_reducer_t *r)
{
    const dl_train_comm_t *c = r->comm;
    int rc = dl__train_reducer_ready(r, r->ends[r->count - 1]);

    r->next = 0;
    if (rc < 0)
        return rc;
    if (c->allreduce_wait_all != NULL)
        return c->allreduce_wait_all(c->ctx);
    return 0;
}
