/* Random numbers and error text shared by the trainer's files.
 *
 * The trainer draws all its randomness from xoshiro256** seeded by splitmix64, never from libc,
 * so a seed means the same numbers on every machine and the state can be checkpointed. */
#include <stdio.h>

#include "internal.h"

uint64_t dl__train_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void dl__train_rng_seed(dl__train_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;

    for (int i = 0; i < 4; i++) {
        r->s[i] = dl__train_mix64(x);
        x += 0x9e3779b97f4a7c15ULL;
    }
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t dl__train_rng_next(dl__train_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t dl__train_rng_below(dl__train_rng_t *r, uint64_t bound)
{
    /* Lemire's multiply-and-reject on 32-bit halves keeps this portable C. Bounds here are
     * dataset sizes, far below 2^32; larger ones fall back to rejection on the full word. */
    if (bound <= UINT32_MAX) {
        uint32_t b = (uint32_t)bound;
        uint64_t m = (dl__train_rng_next(r) >> 32) * b;
        uint32_t low = (uint32_t)m;

        if (low < b) {
            uint32_t threshold = (uint32_t)(-b) % b;
            while (low < threshold) {
                m = (dl__train_rng_next(r) >> 32) * b;
                low = (uint32_t)m;
            }
        }
        return m >> 32;
    }
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t v;
    do
        v = dl__train_rng_next(r);
    while (v >= limit);
    return v % bound;
}

float dl__train_rng_float(dl__train_rng_t *r)
{
    return (float)(dl__train_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

int dl__train_err(int rc, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
