/* Prints N store keys that all fall into one bucket of a hash table hashed as the rendezvous
 * core hashed keys until it took a keyed hash: splitmix64's finalizer over 8-byte words, seeded
 * with 0. The finalizer is a bijection, so inverting it aims a key at any hash wanted; here the
 * low 20 bits are zero, which is bucket 0 of any table of up to a million buckets. The attack of
 * tests/integration/test_security.py sends them; a server with a secret hash key spreads them
 * like any other keys.
 *
 *   collide-keys N     (8 printable bytes a key, one a line) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define GOLDEN 0x9e3779b97f4a7c15ULL
#define TAIL 0xff51afd7ed558ccdULL
#define C1 0xbf58476d1ce4e5b9ULL
#define C2 0x94d049bb133111ebULL

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= C1;
    x ^= x >> 27;
    x *= C2;
    x ^= x >> 31;
    return x;
}

/* The inverse of x ^= x >> s, for s >= 22 (two steps reach every bit). */
static uint64_t unshift(uint64_t x, int s)
{
    return x ^ (x >> s) ^ (x >> (2 * s)) ^ (s < 22 ? x >> (3 * s) : 0);
}

static uint64_t inverse(uint64_t a)
{
    uint64_t x = a; /* Newton's iteration: correct bits double each step */
    for (int i = 0; i < 6; i++)
        x *= 2 - a * x;
    return x;
}

static uint64_t inv_c1, inv_c2;

static uint64_t unmix(uint64_t x)
{
    x = unshift(x, 31);
    x *= inv_c2;
    x = unshift(x, 27);
    x *= inv_c1;
    x = unshift(x, 30);
    return x;
}

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
    /* The old hash of an 8-byte key k with seed 0: h0 = mix(8 * GOLDEN);
     * h1 = mix(h0 ^ k) + GOLDEN; hash = mix(h1 ^ TAIL). */
    uint64_t h0 = mix(8 * GOLDEN);
    inv_c1 = inverse(C1);
    inv_c2 = inverse(C2);
    for (long made = 0; made < n;) {
        uint64_t want = next_random() << 20;
        uint64_t h1 = unmix(want) ^ TAIL;
        uint64_t k = unmix(h1 - GOLDEN) ^ h0;
        unsigned char b[9];
        int ok = 1;
        for (int i = 0; i < 8; i++) {
            b[i] = (unsigned char)(k >> (8 * i));
            ok &= b[i] > ' ' && b[i] < 0x7f && b[i] != '"' && b[i] != '\\';
        }
        if (!ok)
            continue;
        /* Checked forward, so a slip in the inverse cannot pass unnoticed. */
        if ((mix((mix(h0 ^ k) + GOLDEN) ^ TAIL) & 0xfffff) != 0)
            return 1;
        b[8] = '\0';
        printf("%s\n", b);
        made++;
    }
    return 0;
}
