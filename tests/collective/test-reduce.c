/* The reduction kernels against a scalar loop: every type and operator, every aliasing shape,
 * lengths around the vector widths and odd alignments; the operand order rules for NaN and
 * signed zeros; integer wrap-around; the AVG division. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "internal.h"

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(void *buf, size_t n, dl_coll_dtype_t t, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd(&s);
        double f = (double)(r >> 11) / 9007199254740992.0 * 200.0 - 100.0;
        switch (t) {
        case DL_COLL_FLOAT32: ((float *)buf)[i] = (float)f; break;
        case DL_COLL_FLOAT64: ((double *)buf)[i] = f; break;
        case DL_COLL_INT32: ((int32_t *)buf)[i] = (int32_t)(uint32_t)r; break;
        case DL_COLL_INT64: ((int64_t *)buf)[i] = (int64_t)r; break;
        }
    }
}

/* The scalar truth for one element, as the header documents it. */
static void ref(void *out, const void *a, const void *b, size_t i, dl_coll_dtype_t t,
                dl_coll_op_t op)
{
    switch (t) {
    case DL_COLL_FLOAT32: {
        float x = ((const float *)a)[i], y = ((const float *)b)[i];
        ((float *)out)[i] = op == DL_COLL_MIN   ? (x < y ? x : y)
                            : op == DL_COLL_MAX ? (x > y ? x : y)
                                                : x + y;
        break;
    }
    case DL_COLL_FLOAT64: {
        double x = ((const double *)a)[i], y = ((const double *)b)[i];
        ((double *)out)[i] = op == DL_COLL_MIN   ? (x < y ? x : y)
                             : op == DL_COLL_MAX ? (x > y ? x : y)
                                                 : x + y;
        break;
    }
    case DL_COLL_INT32: {
        int32_t x = ((const int32_t *)a)[i], y = ((const int32_t *)b)[i];
        ((int32_t *)out)[i] = op == DL_COLL_MIN   ? (x < y ? x : y)
                              : op == DL_COLL_MAX ? (x > y ? x : y)
                                                  : (int32_t)((uint32_t)x + (uint32_t)y);
        break;
    }
    case DL_COLL_INT64: {
        int64_t x = ((const int64_t *)a)[i], y = ((const int64_t *)b)[i];
        ((int64_t *)out)[i] = op == DL_COLL_MIN   ? (x < y ? x : y)
                              : op == DL_COLL_MAX ? (x > y ? x : y)
                                                  : (int64_t)((uint64_t)x + (uint64_t)y);
        break;
    }
    }
}

/* _i: type * 4 + op */
DL_TEST_LOOP(matches_scalar_in_every_shape, 0, 16)
{
    dl_coll_dtype_t t = (dl_coll_dtype_t)(_i / 4);
    dl_coll_op_t op = (dl_coll_op_t)(_i % 4);
    size_t es = dl_coll_dtype_size(t);
    enum { MAXN = 300, PAD = 8 };
    char *a = malloc((MAXN + PAD) * 8), *b = malloc((MAXN + PAD) * 8);
    char *out = malloc((MAXN + PAD) * 8), *want = malloc((MAXN + PAD) * 8);
    for (size_t n = 0; n < MAXN; n += n < 70 ? 1 : 37) {
        for (size_t off = 0; off < 3; off++) {
            /* Misaligned starts: the kernels may not assume vector alignment. */
            char *pa = a + off * es, *pb = b + off * es, *po = out + off * es;
            for (int shape = 0; shape < 3; shape++) {
                fill(pa, n, t, n * 3 + off);
                fill(pb, n, t, n * 3 + off + 1000);
                for (size_t i = 0; i < n; i++)
                    ref(want, pa, pb, i, t, op);
                const void *res;
                if (shape == 0) {
                    /* Canary after the end: nothing past n may be written. */
                    memset(po, 0x5a, (n + 1) * es);
                    dl__coll_reduce(po, pa, pb, n, t, op);
                    ck_assert_int_eq((unsigned char)po[n * es], 0x5a);
                    res = po;
                } else if (shape == 1) {
                    dl__coll_reduce(pa, pa, pb, n, t, op);
                    res = pa;
                } else {
                    dl__coll_reduce(pb, pa, pb, n, t, op);
                    res = pb;
                }
                ck_assert_msg(n == 0 || memcmp(res, want, n * es) == 0,
                              "%s %s n=%zu off=%zu shape=%d", dl_coll_dtype_name(t),
                              dl_coll_op_name(op), n, off, shape);
            }
        }
    }
    free(a);
    free(b);
    free(out);
    free(want);
}

DL_TEST(float_min_max_keep_operand_order)
{
    /* The first operand wins ties and loses to nothing unordered: same bits on every rank as
     * long as every rank passes the lower rank's data first. */
    float a[4] = {-0.0f, 0.0f, NAN, 1.0f}, b[4] = {0.0f, -0.0f, 1.0f, NAN}, out[4];
    dl__coll_reduce(out, a, b, 4, DL_COLL_FLOAT32, DL_COLL_MIN);
    ck_assert(signbit(out[0]) == 0); /* -0 < 0 is false: b */
    ck_assert(signbit(out[1]) != 0);
    ck_assert_float_eq(out[2], 1.0f); /* NaN < 1 is false: b */
    ck_assert(isnan(out[3]));         /* 1 < NaN is false: b */
    dl__coll_reduce(out, a, b, 4, DL_COLL_FLOAT32, DL_COLL_MAX);
    ck_assert(signbit(out[0]) == 0);
    ck_assert(signbit(out[1]) != 0);
    ck_assert_float_eq(out[2], 1.0f);
    ck_assert(isnan(out[3]));
}

DL_TEST(integer_sums_wrap)
{
    int32_t a[2] = {INT32_MAX, INT32_MIN}, b[2] = {1, -1}, out[2];
    dl__coll_reduce(out, a, b, 2, DL_COLL_INT32, DL_COLL_SUM);
    ck_assert_int_eq(out[0], INT32_MIN);
    ck_assert_int_eq(out[1], INT32_MAX);
    int64_t c[1] = {INT64_MAX}, d[1] = {1}, o64[1];
    dl__coll_reduce(o64, c, d, 1, DL_COLL_INT64, DL_COLL_SUM);
    ck_assert(o64[0] == INT64_MIN);
}

DL_TEST(avg_reduces_as_sum_then_divides)
{
    float f[3] = {3.0f, 1.0f, -7.0f}, g[3] = {3.0f, 1.0f, 0.0f};
    dl__coll_reduce(f, f, g, 3, DL_COLL_FLOAT32, DL_COLL_AVG);
    ck_assert_float_eq(f[0], 6.0f);
    dl__coll_scale(f, 3, DL_COLL_FLOAT32, 2);
    ck_assert_float_eq(f[0], 3.0f);
    ck_assert_float_eq(f[1], 1.0f);
    ck_assert_float_eq(f[2], -3.5f);
    int32_t i[2] = {7, -7};
    dl__coll_scale(i, 2, DL_COLL_INT32, 2);
    ck_assert_int_eq(i[0], 3); /* toward zero */
    ck_assert_int_eq(i[1], -3);
    int64_t l[1] = {-9};
    dl__coll_scale(l, 1, DL_COLL_INT64, 4);
    ck_assert(l[0] == -2);
    double d[1] = {1.0};
    dl__coll_scale(d, 1, DL_COLL_FLOAT64, 3);
    ck_assert(d[0] == 1.0 / 3.0);
}

DL_TEST(large_buffer)
{
    size_t n = (1 << 20) + 3;
    float *a = malloc(n * 4), *b = malloc(n * 4), *o = malloc(n * 4);
    fill(a, n, DL_COLL_FLOAT32, 1);
    fill(b, n, DL_COLL_FLOAT32, 2);
    dl__coll_reduce(o, a, b, n, DL_COLL_FLOAT32, DL_COLL_SUM);
    for (size_t i = 0; i < n; i += 997)
        ck_assert(o[i] == a[i] + b[i]);
    ck_assert(o[n - 1] == a[n - 1] + b[n - 1]);
    free(a);
    free(b);
    free(o);
}
