/* The element-wise kernels. Plain loops over restrict pointers that the compiler vectorizes (this
 * file is built with -O3); target_clones adds AVX-512 and AVX2 copies picked at load time by the
 * CPU's features. One call reduces a whole buffer: no per-element function calls.
 *
 * Integer sums run in unsigned arithmetic: wrapping is defined there, and the bits are the same
 * as two's complement signed addition. Float MIN/MAX are `a < b ? a : b`, which is what
 * vminps/vmaxps compute, and keeps operand order meaningful: callers always pass the lower
 * rank's operand first so every rank gets the same bits even for NaN and signed zeros. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL
#endif

#define ADD(a, b) ((a) + (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Three shapes per (type, operator) so that restrict is never a lie: out distinct from both
 * inputs, out = out op b, and out = a op out. */
#define DEFINE_KERNELS(name, T, EXPR)                                                              \
    KERNEL static void name##_3(T *restrict out, const T *restrict a, const T *restrict b,         \
                                size_t n)                                                          \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            out[i] = EXPR(a[i], b[i]);                                                             \
    }                                                                                              \
    KERNEL static void name##_l(T *restrict io, const T *restrict b, size_t n)                     \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            io[i] = EXPR(io[i], b[i]);                                                             \
    }                                                                                              \
    KERNEL static void name##_r(T *restrict io, const T *restrict a, size_t n)                     \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            io[i] = EXPR(a[i], io[i]);                                                             \
    }

DEFINE_KERNELS(f32_sum, float, ADD)
DEFINE_KERNELS(f32_min, float, MIN)
DEFINE_KERNELS(f32_max, float, MAX)
DEFINE_KERNELS(f64_sum, double, ADD)
DEFINE_KERNELS(f64_min, double, MIN)
DEFINE_KERNELS(f64_max, double, MAX)
DEFINE_KERNELS(u32_sum, uint32_t, ADD)
DEFINE_KERNELS(i32_min, int32_t, MIN)
DEFINE_KERNELS(i32_max, int32_t, MAX)
DEFINE_KERNELS(u64_sum, uint64_t, ADD)
DEFINE_KERNELS(i64_min, int64_t, MIN)
DEFINE_KERNELS(i64_max, int64_t, MAX)

#define DISPATCH(name, T)                                                                          \
    do {                                                                                           \
        if (out == a)                                                                              \
            name##_l((T *)out, (const T *)b, count);                                               \
        else if (out == b)                                                                         \
            name##_r((T *)out, (const T *)a, count);                                               \
        else                                                                                       \
            name##_3((T *)out, (const T *)a, (const T *)b, count);                                 \
    } while (0)

void dl__coll_reduce(void *out, const void *a, const void *b, size_t count, dl_coll_dtype_t dtype,
                     dl_coll_op_t op)
{
    if (count == 0)
        return;
    switch (dtype) {
    case DL_COLL_FLOAT32:
        if (op == DL_COLL_MIN)
            DISPATCH(f32_min, float);
        else if (op == DL_COLL_MAX)
            DISPATCH(f32_max, float);
        else
            DISPATCH(f32_sum, float);
        break;
    case DL_COLL_FLOAT64:
        if (op == DL_COLL_MIN)
            DISPATCH(f64_min, double);
        else if (op == DL_COLL_MAX)
            DISPATCH(f64_max, double);
        else
            DISPATCH(f64_sum, double);
        break;
    case DL_COLL_INT32:
        if (op == DL_COLL_MIN)
            DISPATCH(i32_min, int32_t);
        else if (op == DL_COLL_MAX)
            DISPATCH(i32_max, int32_t);
        else
            DISPATCH(u32_sum, uint32_t);
        break;
    case DL_COLL_INT64:
        if (op == DL_COLL_MIN)
            DISPATCH(i64_min, int64_t);
        else if (op == DL_COLL_MAX)
            DISPATCH(i64_max, int64_t);
        else
            DISPATCH(u64_sum, uint64_t);
        break;
    }
}

void dl__coll_fold(void *out, const void *const *d, int n, size_t count, dl_coll_dtype_t dtype,
                   dl_coll_op_t op)
{
    if (n == 1) {
        if (out != d[0])
            memcpy(out, d[0], count * dl_coll_dtype_size(dtype));
        return;
    }
    dl__coll_reduce(out, d[0], d[1], count, dtype, op);
    for (int j = 2; j < n; j++)
        dl__coll_reduce(out, out, d[j], count, dtype, op);
}

KERNEL static void f32_div(float *restrict x, float d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / d;
}

KERNEL static void f64_div(double *restrict x, double d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / d;
}

static void i32_div(int32_t *restrict x, int32_t d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / d;
}

static void i64_div(int64_t *restrict x, int64_t d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / d;
}

void dl__coll_scale(void *buf, size_t count, dl_coll_dtype_t dtype, int divisor)
{
    if (divisor == 1 || count == 0)
        return;
    switch (dtype) {
    case DL_COLL_FLOAT32: f32_div(buf, (float)divisor, count); break;
    case DL_COLL_FLOAT64: f64_div(buf, (double)divisor, count); break;
    case DL_COLL_INT32: i32_div(buf, divisor, count); break;
    case DL_COLL_INT64: i64_div(buf, divisor, count); break;
    }
}
