/* The sharded step's exchange read in place, when every rank is on one host.
 *
 * The reduce-scatter and the all-gather through the collective copy each block into the shared
 * segment and out again: a rank writes lines the other has read a step before (each store a
 * cross-core invalidation) and the other reads them. With the parameters and the gradients in
 * memory the host's ranks map (three buffers, which take turns as the trainer's kept step
 * rotates them), a rank instead sums every rank's gradient block straight from its owner's
 * buffer, and copies every other rank's new parameter block straight from its owner's buffer.
 * What remains of the collective is one small all-gather before each half, which orders the
 * reads after the writes.
 *
 * Why two synchronizations a step suffice (train.c's sharded_update_kept): rank j reads block r
 * of rank r's gradient buffer q after the first, while rank r writes only its own block of q (the
 * update) until the second; rank j copies block r of rank r's q after the second, and rank r
 * writes into q again only in the backward pass three steps later (q serves as the parameters,
 * then as the step before them, then takes the gradients), past four more synchronizations. The
 * update's stores go to lines the others last read steps before; the plain step, which updates the parameters in place, would store into lines
 * the others read at the last gather, and is left to the collective (train.c, peers_attach). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dl__train_peers_open(dl__train_peers_t *p, const dl_train_comm_t *c, size_t floats)
{
    memset(p, 0, sizeof(*p));
    if (c->world_size < 2 || c->mem_alloc == NULL || c->mem_peer == NULL || c->allgather == NULL)
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
    p->floats = floats;
    p->sync = calloc((size_t)p->world, sizeof(float));
    p->theirs = calloc((size_t)DL__TRAIN_PEER_BUFS * (size_t)p->world, sizeof(*p->theirs));
    if (p->sync == NULL || p->theirs == NULL) {
        dl__train_peers_close(p);
        return -ENOMEM;
    }
    for (int b = 0; b < DL__TRAIN_PEER_BUFS; b++) {
        for (int j = 0; j < p->world; j++) {
            const void *ptr = NULL;
            size_t len = 0;
            int rc = c->mem_peer(c->ctx, p->mine[b], j, &ptr, &len);
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

/* Rank j's mapping of the buffer this rank knows as `mine`. */
static const float *theirs(const dl__train_peers_t *p, const float *mine, int j)
{
    for (int b = 0; b < DL__TRAIN_PEER_BUFS; b++)
        if (p->mine[b] == mine)
            return p->theirs[b * p->world + j];
    return NULL;
}

int dl__train_peers_meet(dl__train_peers_t *p, const dl_train_comm_t *c)
{
    return c->allgather(c->ctx, p->sync, 1);
}

const float *dl__train_peers_of(const dl__train_peers_t *p, const float *q, int rank)
{
    return theirs(p, q, rank);
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
    const float *b0 = theirs(p, q, 0), *b1 = theirs(p, q, 1);
    if (b0 == NULL || b1 == NULL)
        return -EINVAL;
    sum_of(out, b0 + lo, b1 + lo, len);
    /* In rank order, as the collective's reduce-scatter adds: the same bits either way. */
    for (int j = 2; j < p->world; j++)
        add_into(out, theirs(p, q, j) + lo, len);
    return 0;
}

int dl__train_peers_copy(const dl__train_peers_t *p, float *q, size_t len)
{
    for (int j = 0; j < p->world; j++) {
        const float *b = theirs(p, q, j);
        if (b == NULL)
            return -EINVAL;
        if (j != p->rank)
            memcpy(q + (size_t)j * len, b + (size_t)j * len, len * sizeof(float));
    }
    return 0;
}
