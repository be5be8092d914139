/* The sharded step's exchange in place, when every rank is on one host.
 *
 * The reduce-scatter and the all-gather through the collective copy each block into the shared
 * segment and out again: a rank writes lines the other has read a step before (each store a
 * cross-core invalidation) and the other reads them. With the parameters and the gradients in
 * memory the host's ranks map (three buffers, which take turns as the trainer's kept step rotates
 * them), rank r instead takes block r of every rank's gradient straight from that rank's buffer q,
 * and the new parameters of block r reach every rank's q: two ranks write them there in the pass
 * that makes them (dl_train_sgd_step_pair, over the gradients just read), more ranks copy each
 * other's new blocks after the update. What remains of the collective is one small all-gather
 * once the gradients are written and one once the new blocks are, which order the accesses.
 *
 * Why two synchronizations a step suffice (train.c's sharded_update_kept). Between the first and
 * the second, block r of every rank's q is touched by rank r alone: it reads the gradients there
 * and writes the new parameters into block r of its own q (two ranks: of both q's). After the
 * second, every rank reads its whole q (more ranks: having copied block j from rank j's q, which
 * rank j no longer writes), and nobody writes into a q again before the backward pass that takes
 * it for gradients three steps later (q serves as the parameters, then as the step before them),
 * past four more synchronizations. The stores go to lines the others last read steps before; the
 * plain step, which updates the parameters in place, would store into lines the others read at
 * the last gather, and is left to the collective (train.c, peers_attach). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dl__train_peers_open(dl__train_peers_t *p, const dl_train_comm_t *c, size_t floats)
{
    memset(p, 0, sizeof(*p));
    if (c->world_size < 2 || c->mem_alloc == NULL || c->mem_peer == NULL || c->allgather == NULL ||
        (c->world_size == 2 && c->mem_peer_rw == NULL))
        return -EINVAL;
    /* The collective part first and whole, so that a rank failing here on its own (below) has
     * still made every allocation the others make, and the caller's vote can tell them. */
    for (int b = 0; b < DL__TRAIN_PEER_BUFS; b++) {
        void *mine = NULL;
        int rc = c->mem_alloc(c->ctx, floats * sizeof(float), &mine);
        if (rc < 0) {
            dl__train_peers_close(p);
            return rc;
        }
        p->mine[b] = mine;
    }
    p->world = c->world_size;
    p->rank = c->rank;
    p->sync = calloc((size_t)p->world, sizeof(float));
    p->theirs = calloc((size_t)DL__TRAIN_PEER_BUFS * (size_t)p->world, sizeof(*p->theirs));
    if (p->sync == NULL || p->theirs == NULL) {
        dl__train_peers_close(p);
        return -ENOMEM;
    }
    for (int b = 0; b < DL__TRAIN_PEER_BUFS; b++) {
        for (int j = 0; j < p->world; j++) {
            void *ptr = NULL;
            size_t len = 0;
            /* Two ranks write the new parameters into each other's buffer (train.c); more
             * only read each other's. */
            int rc = p->world == 2 ? c->mem_peer_rw(c->ctx, p->mine[b], j, &ptr, &len)
                                   : c->mem_peer(c->ctx, p->mine[b], j, (const void **)&ptr, &len);
            if (rc == 0 && len < floats * sizeof(float))
                rc = -EPROTO;
            if (rc < 0) {
                dl__train_peers_close(p);
                return rc;
            }
            p->theirs[b * p->world + j] = ptr;
        }
    }
    return 0;
}

/* The group's memory goes with the group (rejoin, or the caller's destroy): only the tables. */
void dl__train_peers_close(dl__train_peers_t *p)
{
    free(p->sync);
    free(p->theirs);
    memset(p, 0, sizeof(*p));
}

bool dl__train_peers_on(const dl__train_peers_t *p)
{
    return p->theirs != NULL;
}

int dl__train_peers_meet(dl__train_peers_t *p, const dl_train_comm_t *c)
{
    return c->allgather(c->ctx, p->sync, 1);
}

float *dl__train_peers_of(const dl__train_peers_t *p, const float *q, int rank)
{
    for (int b = 0; b < DL__TRAIN_PEER_BUFS; b++)
        if (p->mine[b] == q)
            return p->theirs[b * p->world + rank];
    return NULL;
}

DL__TRAIN_HOT
static void sum_of(float *restrict out, const float *restrict a, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

DL__TRAIN_HOT
static void add_into(float *restrict out, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] += b[i];
}

int dl__train_peers_sum(const dl__train_peers_t *p, const float *q, float *out, size_t lo,
                        size_t len)
{
    const float *b0 = dl__train_peers_of(p, q, 0), *b1 = dl__train_peers_of(p, q, 1);
    if (b0 == NULL || b1 == NULL)
        return -EINVAL;
    sum_of(out, b0 + lo, b1 + lo, len);
    /* In rank order, as the collective's reduce-scatter adds: the same bits either way. */
    for (int j = 2; j < p->world; j++)
        add_into(out, dl__train_peers_of(p, q, j) + lo, len);
    return 0;
}

int dl__train_peers_copy(const dl__train_peers_t *p, float *q, size_t len)
{
    for (int j = 0; j < p->world; j++) {
        const float *b = dl__train_peers_of(p, q, j);
        if (b == NULL)
            return -EINVAL;
        if (j != p->rank)
            memcpy(q + (size_t)j * len, b + (size_t)j * len, len * sizeof(float));
    }
    return 0;
}
