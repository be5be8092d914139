/* The MLP: backward matches finite differences of an independent double-precision forward pass,
 * initialization is reproducible, the buffer layout is what bucketing relies on, and the
 * optimizer and schedule compute what they document. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "trainer.h"

#define B 6

/* An independent forward pass in double over the model's parameter buffer: the mean
 * cross-entropy of the batch. */
static double ref_loss(const dl_train_mlp_t *mc, const size_t *sizes, size_t L, dl_train_act_t act,
                       const float *x, const uint8_t *y, const double *p)
{
    double cur[B][32], nxt[B][32], loss = 0.0;

    for (size_t r = 0; r < B; r++)
        for (size_t j = 0; j < sizes[0]; j++)
            cur[r][j] = x[r * sizes[0] + j];
    for (size_t l = 0; l < L; l++) {
        size_t wo, bo;
        dl_train_mlp_layer_offsets(mc, l, &wo, &bo);
        for (size_t r = 0; r < B; r++) {
            for (size_t o = 0; o < sizes[l + 1]; o++) {
                double z = p[bo + o];
                for (size_t i = 0; i < sizes[l]; i++)
                    z += p[wo + o * sizes[l] + i] * cur[r][i];
                if (l + 1 < L) {
                    if (act == DL_TRAIN_ACT_RELU)
                        z = z > 0 ? z : 0;
                    else if (act == DL_TRAIN_ACT_TANH)
                        z = tanh(z);
                    else
                        z = 0.5 * z * (1.0 + erf(z / sqrt(2.0)));
                }
                nxt[r][o] = z;
            }
        }
        memcpy(cur, nxt, sizeof(cur));
    }
    for (size_t r = 0; r < B; r++) {
        double mx = cur[r][0], s = 0.0;
        for (size_t j = 1; j < sizes[L]; j++)
            mx = fmax(mx, cur[r][j]);
        for (size_t j = 0; j < sizes[L]; j++)
            s += exp(cur[r][j] - mx);
        loss += log(s) + mx - cur[r][y[r]];
    }
    return loss / B;
}

typedef struct {
    size_t calls;
    size_t last;
    int monotone;
} ready_log_t;

static int log_ready(void *ud, size_t ready)
{
    ready_log_t *log = ud;
    if (ready < log->last)
        log->monotone = 0;
    log->last = ready;
    log->calls++;
    return 0;
}

static void gradient_check(dl_train_act_t act)
{
    const size_t sizes[4] = {7, 9, 5, 4};
    const size_t L = 3;
    dl_train_mlp_t *m;
    float x[B * 7];
    uint8_t y[B] = {0, 3, 1, 2, 3, 0};

    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, L, act, B, 1234, &m), 0);
    size_t n = dl_train_mlp_num_params(m);
    ck_assert_uint_eq(n, 9 * 7 + 9 + 5 * 9 + 5 + 4 * 5 + 4);
    float *p = dl_train_mlp_params(m);
    /* Nonzero biases, so that their gradients are tested at a generic point too. */
    for (size_t l = 0; l < L; l++) {
        size_t wo, bo;
        dl_train_mlp_layer_offsets(m, l, &wo, &bo);
        for (size_t o = 0; o < sizes[l + 1]; o++)
            p[bo + o] = 0.05f * (float)((int)(o % 5) - 2);
    }
    for (size_t i = 0; i < B * 7; i++)
        x[i] = (float)((i * 37) % 11) / 10.0f - 0.4f;

    ready_log_t log = {0, 0, 1};
    double loss;
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, B, 1.0f / B, 0, log_ready, &log, &loss), 0);
    ck_assert_int_eq(log.monotone, 1);
    ck_assert_uint_eq(log.last, n); /* the whole gradient is final at the end */
    ck_assert_uint_eq(log.calls, 2 * L);

    double *pd = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        pd[i] = p[i];
    double ref = ref_loss(m, sizes, L, act, x, y, pd);
    ck_assert_double_eq_tol(loss, ref, 1e-5);

    const float *g = dl_train_mlp_grads(m);
    const double h = 1e-6;
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        double keep = pd[i];
        pd[i] = keep + h;
        double up = ref_loss(m, sizes, L, act, x, y, pd);
        pd[i] = keep - h;
        double down = ref_loss(m, sizes, L, act, x, y, pd);
        pd[i] = keep;
        double fd = (up - down) / (2 * h);
        ck_assert_msg(fabs(fd - g[i]) <= 2e-5 + 1e-3 * fabs(fd),
                      "parameter %zu: backward %.8f, finite difference %.8f", i, g[i], fd);
        checked += fabs(fd) > 1e-4;
    }
    /* Most gradients are far from zero: the check compared real numbers. */
    ck_assert_uint_gt(checked, n / 2);
    free(pd);
    dl_train_mlp_free(m);
}

DL_TEST(gradient_relu)
{
    gradient_check(DL_TRAIN_ACT_RELU);
}

DL_TEST(gradient_tanh)
{
    gradient_check(DL_TRAIN_ACT_TANH);
}

DL_TEST(gradient_gelu)
{
    gradient_check(DL_TRAIN_ACT_GELU);
}

DL_TEST(grad_scale_multiplies)
{
    const size_t sizes[3] = {5, 8, 3};
    dl_train_mlp_t *m;
    float x[4 * 5];
    uint8_t y[4] = {2, 1, 0, 2};
    for (size_t i = 0; i < 20; i++)
        x[i] = (float)i / 20.0f;
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 2, DL_TRAIN_ACT_RELU, 4, 3, &m), 0);
    size_t n = dl_train_mlp_num_params(m);
    float *a = malloc(n * sizeof(float));
    double l1, l2;
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 4, 0.25f, 0, NULL, NULL, &l1), 0);
    memcpy(a, dl_train_mlp_grads(m), n * sizeof(float));
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 4, 0.125f, 0, NULL, NULL, &l2), 0);
    ck_assert_double_eq(l1, l2);
    /* Halving a power of two is exact. */
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq(dl_train_mlp_grads(m)[i] * 2.0f, a[i]);
    free(a);
    dl_train_mlp_free(m);
}

DL_TEST(layout_is_backward_order)
{
    const size_t sizes[4] = {784, 256, 128, 10};
    dl_train_mlp_t *m;
    size_t wo, bo;

    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 3, DL_TRAIN_ACT_RELU, 64, 1, &m), 0);
    ck_assert_uint_eq(dl_train_mlp_num_params(m), 235146);
    dl_train_mlp_layer_offsets(m, 2, &wo, &bo);
    ck_assert_uint_eq(bo, 0);
    ck_assert_uint_eq(wo, 10);
    dl_train_mlp_layer_offsets(m, 1, &wo, &bo);
    ck_assert_uint_eq(bo, 10 + 1280);
    ck_assert_uint_eq(wo, bo + 128);
    dl_train_mlp_layer_offsets(m, 0, &wo, &bo);
    ck_assert_uint_eq(wo + 256 * 784, 235146);
    dl_train_mlp_free(m);
}

DL_TEST(init_is_reproducible)
{
    const size_t sizes[4] = {784, 256, 128, 10};
    dl_train_mlp_t *a, *b, *c;
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 3, DL_TRAIN_ACT_RELU, 8, 77, &a), 0);
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 3, DL_TRAIN_ACT_RELU, 64, 77, &b), 0);
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 3, DL_TRAIN_ACT_RELU, 8, 78, &c), 0);
    size_t n = dl_train_mlp_num_params(a);
    ck_assert_mem_eq(dl_train_mlp_params(a), dl_train_mlp_params(b), n * sizeof(float));
    ck_assert_int_ne(memcmp(dl_train_mlp_params(a), dl_train_mlp_params(c), n * sizeof(float)), 0);
    /* Kaiming-uniform bound for the first layer: sqrt(2) * sqrt(3 / 784). */
    size_t wo, bo;
    dl_train_mlp_layer_offsets(a, 0, &wo, &bo);
    float bound = sqrtf(6.0f / 784.0f), mx = 0.0f;
    for (size_t i = 0; i < 256 * 784; i++)
        mx = fmaxf(mx, fabsf(dl_train_mlp_params(a)[wo + i]));
    ck_assert_float_le(mx, bound);
    ck_assert_float_gt(mx, 0.99f * bound);
    ck_assert_float_eq(dl_train_mlp_params(a)[bo], 0.0f);
    dl_train_mlp_free(a);
    dl_train_mlp_free(b);
    dl_train_mlp_free(c);
    dl_train_mlp_free(NULL);
}

DL_TEST(split_backward_reports_more_often)
{
    /* Slicing the weight gradients changes when they are reported, not their values. */
    const size_t sizes[4] = {100, 64, 32, 10};
    dl_train_mlp_t *m;
    float x[16 * 100];
    uint8_t y[16];
    for (size_t i = 0; i < 1600; i++)
        x[i] = (float)((i * 7919) % 255) / 255.0f;
    for (size_t i = 0; i < 16; i++)
        y[i] = (uint8_t)(i % 10);
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 3, DL_TRAIN_ACT_RELU, 16, 5, &m), 0);
    size_t n = dl_train_mlp_num_params(m);
    float *whole = malloc(n * sizeof(float));
    ready_log_t a = {0, 0, 1}, b = {0, 0, 1};
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 16, 1.0f / 16, 0, log_ready, &a, NULL), 0);
    memcpy(whole, dl_train_mlp_grads(m), n * sizeof(float));
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 16, 1.0f / 16, 4096, log_ready, &b, NULL), 0);
    ck_assert_uint_eq(a.calls, 6);
    ck_assert_uint_gt(b.calls, 10);
    ck_assert_int_eq(b.monotone, 1);
    ck_assert_uint_eq(b.last, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_float_eq_tol(dl_train_mlp_grads(m)[i], whole[i], 1e-6f);
    free(whole);
    dl_train_mlp_free(m);
}

/* Padding for equal per-rank blocks keeps the model and its gradients as they are, and nothing
 * ever writes the padding. */
DL_TEST(pad_keeps_the_model)
{
    const size_t sizes[3] = {20, 8, 3};
    dl_train_mlp_t *a, *b;
    float x[4 * 20];
    uint8_t y[4] = {0, 1, 2, 1};
    for (size_t i = 0; i < 80; i++)
        x[i] = (float)(i % 13) / 13.0f;
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 2, DL_TRAIN_ACT_RELU, 4, 9, &a), 0);
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 2, DL_TRAIN_ACT_RELU, 4, 9, &b), 0);
    size_t n = dl_train_mlp_num_params(a);
    ck_assert_int_eq(dl_train_mlp_pad(b, n + 1), 0); /* no growth needed: the spare float */
    DL_CHECK_ERRNO(dl_train_mlp_pad(b, n + 37), 0);
    ck_assert_uint_eq(dl_train_mlp_num_params(b), n);
    ck_assert_mem_eq(dl_train_mlp_params(a), dl_train_mlp_params(b), n * sizeof(float));
    DL_CHECK_ERRNO(dl_train_mlp_train_step(a, x, y, 4, 0.25f, 0, NULL, NULL, NULL), 0);
    DL_CHECK_ERRNO(dl_train_mlp_train_step(b, x, y, 4, 0.25f, 0, NULL, NULL, NULL), 0);
    ck_assert_mem_eq(dl_train_mlp_grads(a), dl_train_mlp_grads(b), n * sizeof(float));
    for (size_t i = n; i < n + 37; i++) {
        ck_assert_float_eq(dl_train_mlp_grads(b)[i], 0.0f);
        ck_assert_float_eq(dl_train_mlp_params(b)[i], 0.0f);
    }
    dl_train_mlp_free(a);
    dl_train_mlp_free(b);
}

DL_TEST(evaluate_counts)
{
    /* One layer, weights set by hand: the class is the largest input. */
    const size_t sizes[2] = {3, 3};
    dl_train_mlp_t *m;
    size_t wo, bo, correct;
    double loss;
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 1, DL_TRAIN_ACT_RELU, 2, 1, &m), 0);
    dl_train_mlp_layer_offsets(m, 0, &wo, &bo);
    float *p = dl_train_mlp_params(m);
    memset(p, 0, 12 * sizeof(float));
    p[wo + 0] = p[wo + 4] = p[wo + 8] = 1.0f;
    float x[9] = {5, 0, 0, 0, 0, 5, 0, 5, 0};
    uint8_t y[3] = {0, 2, 0}; /* the third is wrong */
    dl_train_mlp_evaluate(m, x, y, 3, &loss, &correct);
    ck_assert_uint_eq(correct, 2);
    double right = log(exp(5.0) + 2.0) - 5.0, wrong = log(exp(5.0) + 2.0);
    ck_assert_double_eq_tol(loss, 2 * right + wrong, 1e-5);
    dl_train_mlp_free(m);
}

DL_TEST(rejects_bad_labels_and_shapes)
{
    const size_t sizes[3] = {4, 4, 3}, zero[3] = {4, 0, 3};
    dl_train_mlp_t *m = NULL;
    float x[4] = {0};
    uint8_t y[1] = {3};
    DL_CHECK_ERRNO(dl_train_mlp_new(zero, 2, DL_TRAIN_ACT_RELU, 4, 1, &m), -EINVAL);
    ck_assert_ptr_null(m);
    DL_CHECK_ERRNO(dl_train_mlp_new(sizes, 2, DL_TRAIN_ACT_RELU, 4, 1, &m), 0);
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 1, 1.0f, 0, NULL, NULL, NULL), -EINVAL);
    DL_CHECK_ERRNO(dl_train_mlp_train_step(m, x, y, 5, 1.0f, 0, NULL, NULL, NULL), -EINVAL);
    dl_train_mlp_free(m);
}

DL_TEST(sgd_matches_torch_formula)
{
    float p[2] = {1.0f, -2.0f}, m[2] = {0.0f, 0.0f}, g[2] = {0.5f, 0.25f};
    /* Step 1: d = g + wd p; m = d; p -= lr m. */
    dl_train_sgd_step(p, m, g, 2, 0.1f, 0.9f, 0.01f);
    ck_assert_float_eq_tol(m[0], 0.51f, 1e-7f);
    ck_assert_float_eq_tol(p[0], 1.0f - 0.051f, 1e-7f);
    ck_assert_float_eq_tol(m[1], 0.23f, 1e-7f);
    /* Step 2: m = 0.9 m + d. */
    dl_train_sgd_step(p, m, g, 2, 0.1f, 0.9f, 0.01f);
    float d0 = 0.5f + 0.01f * 0.949f;
    ck_assert_float_eq_tol(m[0], 0.9f * 0.51f + d0, 1e-6f);
    ck_assert_float_eq_tol(p[0], 0.949f - 0.1f * (0.9f * 0.51f + d0), 1e-6f);
}

/* The fused form two ranks in place use (the two gradients summed, the step, the new parameters
 * over both gradients) leaves the bits of the sum followed by the out-of-place step in both,
 * whichever rank's gradient is the own one; and the same as the in-place step. 1003 elements:
 * the vector loops' bodies and tails both. */
DL_TEST(sgd_step_pair_is_sum_then_step)
{
    enum { N = 1003 };
    static float g0[N], g1[N], p[N], m[N], sum[N], p_ref[N], m_ref[N], p_in[N], m_in[N];
    static float mine[N], theirs[N], m_out[N];
    uint64_t x = 42;
    for (size_t i = 0; i < N; i++) {
        /* Spread over magnitudes, so that a different rounding order would show. */
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        g0[i] = (float)((int64_t)(x >> 11) % 100003) * 1e-3f;
        g1[i] = (float)((int64_t)(x >> 29) % 7919) * 3.7e-7f - 1e-3f;
        p[i] = (float)((int64_t)(x >> 37) % 1009) * 1e-2f;
        m[i] = (float)((int64_t)(x >> 17) % 499) * -3e-4f;
        sum[i] = g0[i] + g1[i];
    }
    memcpy(p_in, p, sizeof(p));
    memcpy(m_in, m, sizeof(m));
    dl_train_sgd_step_to(p_ref, m_ref, p_in, m_in, sum, N, 0.05f, 0.9f, 5e-4f);
    for (int own = 0; own < 2; own++) {
        memcpy(mine, own == 0 ? g0 : g1, sizeof(mine));
        memcpy(theirs, own == 0 ? g1 : g0, sizeof(theirs));
        dl_train_sgd_step_pair(mine, theirs, m_out, p_in, m_in, N, 0.05f, 0.9f, 5e-4f);
        ck_assert_mem_eq(mine, p_ref, sizeof(mine));
        ck_assert_mem_eq(theirs, p_ref, sizeof(theirs));
        ck_assert_mem_eq(m_out, m_ref, sizeof(m_out));
    }
    /* The inputs of the step stay as they were (in-job recovery keeps them). */
    ck_assert_mem_eq(p_in, p, sizeof(p));
    ck_assert_mem_eq(m_in, m, sizeof(m));
    dl_train_sgd_step(p, m, sum, N, 0.05f, 0.9f, 5e-4f);
    ck_assert_mem_eq(p, p_ref, sizeof(p));
    ck_assert_mem_eq(m, m_ref, sizeof(m));
}

DL_TEST(schedules)
{
    dl_train_schedule_t s = {DL_TRAIN_SCHED_COSINE, 0.4, 0.0, 0.1, 0, 10, 110};
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 0), 0.04, 1e-12);  /* warmup: 1/10 */
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 9), 0.4, 1e-12);   /* end of warmup */
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 10), 0.4, 1e-12);  /* cosine starts at peak */
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 60), 0.2, 1e-12);  /* half way */
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 110), 0.0, 1e-12); /* floor */
    s.lr_min = 0.01;
    ck_assert_double_eq_tol(dl_train_lr_at(&s, 110), 0.01, 1e-12);

    dl_train_schedule_t st = {DL_TRAIN_SCHED_STEP, 1.0, 0.0, 0.5, 100, 0, 1000};
    ck_assert_double_eq(dl_train_lr_at(&st, 99), 1.0);
    ck_assert_double_eq(dl_train_lr_at(&st, 100), 0.5);
    ck_assert_double_eq(dl_train_lr_at(&st, 250), 0.25);

    dl_train_schedule_t c = {DL_TRAIN_SCHED_CONSTANT, 0.3, 0.0, 0.1, 0, 0, 1000};
    ck_assert_double_eq(dl_train_lr_at(&c, 999), 0.3);
}
