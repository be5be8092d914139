/* The distributed sampler: which samples each rank trains on, epoch by epoch.
 *
 * Pure: the permutation is a function of (seed, epoch) alone, so every rank computes the same one
 * without talking to the others, and a resumed run recomputes the one it was in.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dl_train_sampler_init(dl_train_sampler_t *s, size_t n, int rank, int world, uint64_t seed,
                          bool drop_last)
{
    if (n == 0 || n > UINT32_MAX || world < 1 || rank < 0 || rank >= world)
        return -EINVAL;
    if (drop_last && n < (size_t)world)
        return -EINVAL;

    uint32_t *perm = malloc(n * sizeof(*perm));
    if (perm == NULL)
        return -ENOMEM;

    memset(s, 0, sizeof(*s));
    s->n = n;
    s->rank = rank;
    s->world = world;
    s->seed = seed;
    s->drop_last = drop_last;
    s->num_samples = drop_last ? n / (size_t)world : (n + (size_t)world - 1) / (size_t)world;
    s->perm = perm;
    dl_train_sampler_set_epoch(s, 0);
    return 0;
}

void dl_train_sampler_free(dl_train_sampler_t *s)
{
    if (s == NULL)
        return;
    free(s->perm);
    s->perm = NULL;
}

void dl_train_sampler_set_epoch(dl_train_sampler_t *s, uint64_t epoch)
{
    dl__train_rng_t rng;

    /* Mixing the epoch in before seeding keeps consecutive epochs' streams unrelated. */
    dl__train_rng_seed(&rng, s->seed ^ dl__train_mix64(epoch + 0x5a17u));
    for (size_t i = 0; i < s->n; i++)
        s->perm[i] = (uint32_t)i;
    for (size_t i = s->n - 1; i > 0; i--) {
        size_t j = (size_t)dl__train_rng_below(&rng, (uint64_t)i + 1);
        uint32_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->epoch = epoch;
    s->pos = 0;
}

size_t dl_train_sampler_next(dl_train_sampler_t *s, size_t max, uint32_t *ret_idx)
{
    size_t k = 0;

    while (k < max && s->pos < s->num_samples) {
        /* Position in the padded permutation; padding repeats the permutation from its start
         * (more than once if world > n), as torch does. */
        size_t j = (size_t)s->rank + s->pos * (size_t)s->world;
        ret_idx[k++] = s->perm[j % s->n];
        s->pos++;
    }
    return k;
}

void dl_train_sampler_tell(const dl_train_sampler_t *s, uint64_t *ret_epoch, uint64_t *ret_consumed)
{
    *ret_epoch = s->epoch;
    *ret_consumed = (uint64_t)s->pos * (uint64_t)s->world;
}

int dl_train_sampler_seek(dl_train_sampler_t *s, uint64_t epoch, uint64_t consumed)
{
    /* With the same world size this is exact. With another one, rounding down may repeat up to
     * world - 1 samples of the epoch, which is better than skipping any; a position in padding
     * that this world does not have means the epoch is over. */
    uint64_t pos = consumed / (uint64_t)s->world;

    if (pos > s->num_samples)
        pos = s->num_samples;
    if (epoch != s->epoch || s->pos != 0)
        dl_train_sampler_set_epoch(s, epoch);
    s->pos = (size_t)pos;
    return 0;
}
