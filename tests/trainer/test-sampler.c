/* The distributed sampler: shards are disjoint and cover the data, padding and drop_last behave
 * as torch's DistributedSampler, permutations are reproducible, positions survive a restart. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "trainer.h"

/* Draws one rank's whole epoch. */
static size_t draw_epoch(dl_train_sampler_t *s, uint32_t *out)
{
    size_t n = 0, k;
    while ((k = dl_train_sampler_next(s, 7, out + n)) > 0)
        n += k;
    return n;
}

DL_TEST(padded_shards_cover_everything)
{
    const size_t n = 103;
    const int world = 4;
    unsigned seen[103] = {0};
    size_t total = 0;

    for (int r = 0; r < world; r++) {
        dl_train_sampler_t s;
        uint32_t idx[64];
        DL_CHECK_ERRNO(dl_train_sampler_init(&s, n, r, world, 42, false), 0);
        ck_assert_uint_eq(s.num_samples, 26);
        dl_train_sampler_set_epoch(&s, 3);
        size_t got = draw_epoch(&s, idx);
        ck_assert_uint_eq(got, 26);
        for (size_t i = 0; i < got; i++) {
            ck_assert_uint_lt(idx[i], n);
            seen[idx[i]]++;
        }
        total += got;
        dl_train_sampler_free(&s);
    }
    /* 104 draws over 103 samples: every sample once, exactly one repeated for padding. */
    ck_assert_uint_eq(total, 104);
    size_t twice = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_ge(seen[i], 1);
        ck_assert_uint_le(seen[i], 2);
        twice += seen[i] == 2;
    }
    ck_assert_uint_eq(twice, 1);
}

DL_TEST(drop_last_shards_are_disjoint)
{
    const size_t n = 103;
    const int world = 4;
    unsigned seen[103] = {0};

    for (int r = 0; r < world; r++) {
        dl_train_sampler_t s;
        uint32_t idx[64];
        DL_CHECK_ERRNO(dl_train_sampler_init(&s, n, r, world, 42, true), 0);
        ck_assert_uint_eq(draw_epoch(&s, idx), 25);
        for (size_t i = 0; i < 25; i++)
            seen[idx[i]]++;
        dl_train_sampler_free(&s);
    }
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_le(seen[i], 1);
        distinct += seen[i];
    }
    ck_assert_uint_eq(distinct, 100);
}

DL_TEST(rank_takes_every_world_th_entry)
{
    /* Rank r's k-th sample is entry r + k * world of the epoch's permutation. */
    dl_train_sampler_t s0, s2;
    uint32_t a[48], b[48];
    DL_CHECK_ERRNO(dl_train_sampler_init(&s0, 40, 0, 1, 9, false), 0);
    DL_CHECK_ERRNO(dl_train_sampler_init(&s2, 40, 2, 3, 9, false), 0);
    ck_assert_uint_eq(draw_epoch(&s0, a), 40);
    ck_assert_uint_eq(draw_epoch(&s2, b), 14);
    for (size_t k = 0; k < 14; k++)
        ck_assert_uint_eq(b[k], a[(2 + 3 * k) % 40]); /* position 41 wraps to the start */
    dl_train_sampler_free(&s0);
    dl_train_sampler_free(&s2);
}

DL_TEST(world_larger_than_data)
{
    /* 3 samples, 5 ranks: the permutation repeats; every rank still gets one. */
    unsigned seen[3] = {0};
    for (int r = 0; r < 5; r++) {
        dl_train_sampler_t s;
        uint32_t idx[4];
        DL_CHECK_ERRNO(dl_train_sampler_init(&s, 3, r, 5, 1, false), 0);
        ck_assert_uint_eq(draw_epoch(&s, idx), 1);
        seen[idx[0]]++;
        dl_train_sampler_free(&s);
    }
    ck_assert_uint_ge(seen[0], 1);
    ck_assert_uint_ge(seen[1], 1);
    ck_assert_uint_ge(seen[2], 1);
    dl_train_sampler_t s;
    DL_CHECK_ERRNO(dl_train_sampler_init(&s, 3, 0, 5, 1, true), -EINVAL);
    DL_CHECK_ERRNO(dl_train_sampler_init(&s, 3, 5, 5, 1, false), -EINVAL);
    DL_CHECK_ERRNO(dl_train_sampler_init(&s, 0, 0, 1, 1, false), -EINVAL);
}

DL_TEST(permutation_depends_on_seed_and_epoch_only)
{
    const size_t n = 1000;
    dl_train_sampler_t a, b, c;
    DL_CHECK_ERRNO(dl_train_sampler_init(&a, n, 0, 2, 7, false), 0);
    DL_CHECK_ERRNO(dl_train_sampler_init(&b, n, 1, 2, 7, false), 0);
    DL_CHECK_ERRNO(dl_train_sampler_init(&c, n, 0, 2, 8, false), 0);

    dl_train_sampler_set_epoch(&a, 5);
    dl_train_sampler_set_epoch(&b, 5);
    dl_train_sampler_set_epoch(&c, 5);
    /* Every rank computes the same permutation for the same (seed, epoch)... */
    ck_assert_mem_eq(a.perm, b.perm, n * sizeof(uint32_t));
    /* ...a different one for another seed or epoch... */
    ck_assert_int_ne(memcmp(a.perm, c.perm, n * sizeof(uint32_t)), 0);
    uint32_t *e5 = malloc(n * sizeof(uint32_t));
    memcpy(e5, a.perm, n * sizeof(uint32_t));
    dl_train_sampler_set_epoch(&a, 6);
    ck_assert_int_ne(memcmp(a.perm, e5, n * sizeof(uint32_t)), 0);
    /* ...and the same again when it comes back to the epoch. */
    dl_train_sampler_set_epoch(&a, 5);
    ck_assert_mem_eq(a.perm, e5, n * sizeof(uint32_t));

    /* It is a permutation, and actually shuffled. */
    unsigned char hit[1000] = {0};
    size_t fixed = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(hit[a.perm[i]], 0);
        hit[a.perm[i]] = 1;
        fixed += a.perm[i] == i;
    }
    ck_assert_uint_lt(fixed, 10);
    free(e5);
    dl_train_sampler_free(&a);
    dl_train_sampler_free(&b);
    dl_train_sampler_free(&c);
    dl_train_sampler_free(NULL);
}

DL_TEST(position_survives_restart)
{
    dl_train_sampler_t s, t;
    uint32_t ref[200], got[200], tmp[64];
    uint64_t epoch, consumed;

    DL_CHECK_ERRNO(dl_train_sampler_init(&s, 500, 1, 3, 11, false), 0);
    dl_train_sampler_set_epoch(&s, 2);
    ck_assert_uint_eq(draw_epoch(&s, ref), 167);

    dl_train_sampler_set_epoch(&s, 2);
    ck_assert_uint_eq(dl_train_sampler_next(&s, 50, tmp), 50);
    dl_train_sampler_tell(&s, &epoch, &consumed);
    ck_assert_uint_eq(epoch, 2);
    ck_assert_uint_eq(consumed, 150);

    /* A new process, a new sampler, the saved position. */
    DL_CHECK_ERRNO(dl_train_sampler_init(&t, 500, 1, 3, 11, false), 0);
    DL_CHECK_ERRNO(dl_train_sampler_seek(&t, epoch, consumed), 0);
    ck_assert_uint_eq(draw_epoch(&t, got), 117);
    ck_assert_mem_eq(got, ref + 50, 117 * sizeof(uint32_t));
    dl_train_sampler_free(&s);
    dl_train_sampler_free(&t);
}

DL_TEST(resume_with_another_world_skips_nothing)
{
    /* Two ranks consume 2 x 30 samples; three ranks resume. Together the epoch's first 60
     * permutation entries and the rest drawn by the three cover every sample. */
    const size_t n = 300;
    unsigned seen[300] = {0};
    uint32_t idx[300];
    uint64_t epoch = 0, consumed = 0;

    for (int r = 0; r < 2; r++) {
        dl_train_sampler_t s;
        DL_CHECK_ERRNO(dl_train_sampler_init(&s, n, r, 2, 5, false), 0);
        ck_assert_uint_eq(dl_train_sampler_next(&s, 30, idx), 30);
        for (size_t i = 0; i < 30; i++)
            seen[idx[i]]++;
        dl_train_sampler_tell(&s, &epoch, &consumed);
        dl_train_sampler_free(&s);
    }
    ck_assert_uint_eq(consumed, 60);
    for (int r = 0; r < 3; r++) {
        dl_train_sampler_t s;
        DL_CHECK_ERRNO(dl_train_sampler_init(&s, n, r, 3, 5, false), 0);
        DL_CHECK_ERRNO(dl_train_sampler_seek(&s, epoch, consumed), 0);
        size_t k = draw_epoch(&s, idx);
        ck_assert_uint_eq(k, 80);
        for (size_t i = 0; i < k; i++)
            seen[idx[i]]++;
        dl_train_sampler_free(&s);
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(seen[i], 1);
}
