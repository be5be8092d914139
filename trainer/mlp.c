/* The multi-layer perceptron: forward and backward on CBLAS sgemm, float32 throughout.
 *
 * All memory is allocated once in dl_train_mlp_new(); a training step allocates nothing. The
 * parameter and gradient buffers share one layout, in the order backward produces gradients
 * (last layer first, [bias | weight] within a layer), so that the optimizer is one flat loop and
 * a bucketed all-reduce can ship any prefix of the gradient as soon as backward has passed it.
 *
 * Shapes, row-major: input X [b][in], weight W [out][in], output Y = act(X W^T + bias) [b][out].
 *   forward:  Y  = X W^T        sgemm(NoTrans, Trans)
 *   backward: dW = dY^T X       sgemm(Trans, NoTrans)
 *             dX = dY W         sgemm(NoTrans, NoTrans), skipped for the first layer
 * Each sgemm runs with a fixed split of work (OpenBLAS on one thread by default), so the results
 * do not depend on timing.
 */
#include <cblas.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct dl_train_mlp_s {
    size_t n_layers;
    size_t sizes[DL_TRAIN_MAX_LAYERS + 1];
    dl_train_act_t act;
    size_t max_batch;
    size_t n_params;
    size_t w_off[DL_TRAIN_MAX_LAYERS];
    size_t b_off[DL_TRAIN_MAX_LAYERS];
    float *params;
    float *grads;
    size_t cap; /* floats in params and grads: n_params + the spares, more after dl_train_mlp_pad */
    /* out[l]: layer l's output [max_batch][sizes[l + 1]]; the last one holds logits and then
     * probabilities. pre[l]: layer l's input to the activation (kept for GELU only). */
    float *out[DL_TRAIN_MAX_LAYERS];
    float *pre[DL_TRAIN_MAX_LAYERS];
    float *delta[2]; /* backward ping-pong, [max_batch][widest layer] */
    float *slab;     /* the single allocation behind out, pre and delta */
};

static float *aligned_floats(size_t n)
{
    void *p = NULL;

    /* 64-byte alignment: a cache line, and what AVX-512 loads like. */
    if (posix_memalign(&p, 64, (n == 0 ? 1 : n) * sizeof(float)) != 0)
        return NULL;
    return p;
}

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static void init_params(dl_train_mlp_t *m, uint64_t seed)
{
    dl__train_rng_t rng;

    dl__train_rng_seed(&rng, seed);
    /* Kaiming-uniform: bound = gain * sqrt(3 / fan_in), gain sqrt(2) before ReLU and GELU, 5/3
     * before tanh, 1 for the output layer. Layers are drawn first to last so that a shape's
     * initial weights do not depend on the buffer layout. */
    for (size_t l = 0; l < m->n_layers; l++) {
        size_t in = m->sizes[l], outw = m->sizes[l + 1];
        double gain = 1.0;
        if (l + 1 < m->n_layers)
            gain = m->act == DL_TRAIN_ACT_TANH ? 5.0 / 3.0 : sqrt(2.0);
        float bound = (float)(gain * sqrt(3.0 / (double)in));
        float *w = m->params + m->w_off[l];
        for (size_t i = 0; i < outw * in; i++)
            w[i] = (2.0f * dl__train_rng_float(&rng) - 1.0f) * bound;
        memset(m->params + m->b_off[l], 0, outw * sizeof(float));
    }
}

int dl_train_mlp_new(const size_t *sizes, size_t n_layers, dl_train_act_t act, size_t max_batch,
                     uint64_t seed, dl_train_mlp_t **ret_mlp)
{
    if (n_layers == 0 || n_layers > DL_TRAIN_MAX_LAYERS || max_batch == 0)
        return -EINVAL;
    if (act != DL_TRAIN_ACT_RELU && act != DL_TRAIN_ACT_TANH && act != DL_TRAIN_ACT_GELU)
        return -EINVAL;
    for (size_t l = 0; l <= n_layers; l++)
        if (sizes[l] == 0 || sizes[l] > (1u << 20))
            return -EINVAL;

    dl_train_mlp_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return -ENOMEM;
    m->n_layers = n_layers;
    memcpy(m->sizes, sizes, (n_layers + 1) * sizeof(*sizes));
    m->act = act;
    m->max_batch = max_batch;

    size_t off = 0;
    for (size_t k = n_layers; k-- > 0;) {
        m->b_off[k] = off;
        off += sizes[k + 1];
        m->w_off[k] = off;
        off += sizes[k + 1] * sizes[k];
    }
    m->n_params = off;

    size_t widest = 0, slab = 0;
    for (size_t l = 0; l < n_layers; l++) {
        size_t w = sizes[l + 1];
        if (w > widest)
            widest = w;
        slab += round16(max_batch * w);
        if (act == DL_TRAIN_ACT_GELU)
            slab += round16(max_batch * w);
    }
    slab += 2 * round16(max_batch * widest);

    m->cap = m->n_params + DL_TRAIN_SPARE_FLOATS;
    m->params = aligned_floats(m->cap);
    m->grads = aligned_floats(m->cap);
    m->slab = aligned_floats(slab);
    if (m->params == NULL || m->grads == NULL || m->slab == NULL) {
        dl_train_mlp_free(m);
        return -ENOMEM;
    }
    float *p = m->slab;
    for (size_t l = 0; l < n_layers; l++) {
        m->out[l] = p;
        p += round16(max_batch * sizes[l + 1]);
        if (act == DL_TRAIN_ACT_GELU) {
            m->pre[l] = p;
            p += round16(max_batch * sizes[l + 1]);
        }
    }
    m->delta[0] = p;
    m->delta[1] = p + round16(max_batch * widest);
    memset(m->grads, 0, m->cap * sizeof(float));
    memset(m->params + m->n_params, 0, DL_TRAIN_SPARE_FLOATS * sizeof(float));
    init_params(m, seed);
    *ret_mlp = m;
    return 0;
}

void dl_train_mlp_free(dl_train_mlp_t *m)
{
    if (m == NULL)
        return;
    free(m->params);
    free(m->grads);
    free(m->slab);
    free(m);
}

size_t dl_train_mlp_num_params(const dl_train_mlp_t *m)
{
    return m->n_params;
}

float *dl_train_mlp_params(dl_train_mlp_t *m)
{
    return m->params;
}

float *dl_train_mlp_grads(dl_train_mlp_t *m)
{
    return m->grads;
}

int dl_train_mlp_pad(dl_train_mlp_t *m, size_t floats)
{
    if (floats <= m->cap)
        return 0;
    float *p = aligned_floats(floats), *g = aligned_floats(floats);
    if (p == NULL || g == NULL) {
        free(p);
        free(g);
        return -ENOMEM;
    }
    memcpy(p, m->params, m->cap * sizeof(float));
    memcpy(g, m->grads, m->cap * sizeof(float));
    memset(p + m->cap, 0, (floats - m->cap) * sizeof(float));
    memset(g + m->cap, 0, (floats - m->cap) * sizeof(float));
    free(m->params);
    free(m->grads);
    m->params = p;
    m->grads = g;
    m->cap = floats;
    return 0;
}

size_t dl_train_mlp_capacity(const dl_train_mlp_t *m)
{
    return m->cap;
}

float *dl_train_mlp_swap_params(dl_train_mlp_t *m, float *other)
{
    float *old = m->params;
    m->params = other;
    return old;
}

float *dl_train_mlp_swap_grads(dl_train_mlp_t *m, float *other)
{
    float *old = m->grads;
    m->grads = other;
    return old;
}

void dl_train_mlp_layer_offsets(const dl_train_mlp_t *m, size_t l, size_t *ret_w, size_t *ret_b)
{
    *ret_w = m->w_off[l];
    *ret_b = m->b_off[l];
}

/* GELU with the exact normal CDF, as torch's default. */
static inline float gelu(float z)
{
    return 0.5f * z * (1.0f + erff(z * 0.70710678f));
}

static inline float gelu_grad(float z)
{
    float cdf = 0.5f * (1.0f + erff(z * 0.70710678f));
    float pdf = 0.39894228f * expf(-0.5f * z * z);
    return cdf + z * pdf;
}

/* y[r][j] = act(y[r][j] + bias[j]), in one pass over the sgemm output. */
static void bias_act(float *restrict y, float *restrict pre, const float *restrict bias, size_t b,
                     size_t n, dl_train_act_t act)
{
    switch (act) {
    case DL_TRAIN_ACT_RELU:
        for (size_t r = 0; r < b; r++) {
            float *restrict row = y + r * n;
            for (size_t j = 0; j < n; j++) {
                float v = row[j] + bias[j];
                row[j] = v > 0.0f ? v : 0.0f;
            }
        }
        break;
    case DL_TRAIN_ACT_TANH:
        for (size_t i = 0; i < b * n; i++)
            y[i] = tanhf(y[i] + bias[i % n]);
        break;
    case DL_TRAIN_ACT_GELU:
        for (size_t i = 0; i < b * n; i++) {
            pre[i] = y[i] + bias[i % n];
            y[i] = gelu(pre[i]);
        }
        break;
    }
}

/* d[i] *= act'(layer input) for the layer whose output is y (pre for GELU). */
static void act_backward(float *restrict d, const float *restrict y, const float *restrict pre,
                         size_t count, dl_train_act_t act)
{
    switch (act) {
    case DL_TRAIN_ACT_RELU:
        for (size_t i = 0; i < count; i++)
            d[i] = y[i] > 0.0f ? d[i] : 0.0f;
        break;
    case DL_TRAIN_ACT_TANH:
        for (size_t i = 0; i < count; i++)
            d[i] *= 1.0f - y[i] * y[i];
        break;
    case DL_TRAIN_ACT_GELU:
        for (size_t i = 0; i < count; i++)
            d[i] *= gelu_grad(pre[i]);
        break;
    }
}

/* Leaves the logits (bias added) in out[n_layers - 1]. */
static void forward(dl_train_mlp_t *m, const float *x, size_t b)
{
    const float *in = x;

    for (size_t l = 0; l < m->n_layers; l++) {
        size_t ni = m->sizes[l], no = m->sizes[l + 1];
        const float *w = m->params + m->w_off[l];
        const float *bias = m->params + m->b_off[l];
        float *y = m->out[l];

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)no, (int)ni, 1.0f, in,
                    (int)ni, w, (int)ni, 0.0f, y, (int)no);
        if (l + 1 < m->n_layers) {
            bias_act(y, m->pre[l], bias, b, no, m->act);
        } else {
            for (size_t r = 0; r < b; r++)
                for (size_t j = 0; j < no; j++)
                    y[r * no + j] += bias[j];
        }
        in = y;
    }
}

/* Numerically stable log-softmax pieces of one row: its max and log-sum-exp. */
static float row_logsumexp(const float *z, size_t n, float *ret_max)
{
    float mx = z[0];
    double sum = 0.0;

    for (size_t j = 1; j < n; j++)
        if (z[j] > mx)
            mx = z[j];
    for (size_t j = 0; j < n; j++)
        sum += (double)expf(z[j] - mx);
    *ret_max = mx;
    return (float)log(sum);
}

/* Turns the logits into the loss gradient scale * (softmax - onehot), in place; returns the
 * summed loss. */
static double softmax_xent_grad(float *z, const uint8_t *y, size_t b, size_t n, float scale)
{
    double loss = 0.0;

    for (size_t r = 0; r < b; r++) {
        float *row = z + r * n;
        float mx;
        float lse = row_logsumexp(row, n, &mx);
        loss += (double)(lse - (row[y[r]] - mx));
        for (size_t j = 0; j < n; j++)
            row[j] = expf(row[j] - mx - lse) * scale;
        row[y[r]] -= scale;
    }
    return loss;
}

int dl_train_mlp_train_step(dl_train_mlp_t *m, const float *x, const uint8_t *y, size_t b,
                            float grad_scale, size_t split_bytes, dl_train_grad_ready_cb ready,
                            void *ud, double *ret_loss)
{
    const size_t L = m->n_layers;
    int r;

    if (b == 0 || b > m->max_batch)
        return -EINVAL;
    for (size_t i = 0; i < b; i++)
        if (y[i] >= m->sizes[L])
            return -EINVAL;

    forward(m, x, b);
    double loss = softmax_xent_grad(m->out[L - 1], y, b, m->sizes[L], grad_scale);

    /* dY of layer l lives in out[L - 1] for the last layer, then in the delta buffers. */
    float *dy = m->out[L - 1];
    for (size_t l = L; l-- > 0;) {
        size_t ni = m->sizes[l], no = m->sizes[l + 1];
        const float *in = l == 0 ? x : m->out[l - 1];
        float *restrict db = m->grads + m->b_off[l];
        float *dw = m->grads + m->w_off[l];

        memset(db, 0, no * sizeof(float));
        for (size_t rr = 0; rr < b; rr++) {
            const float *restrict row = dy + rr * no;
            for (size_t j = 0; j < no; j++)
                db[j] += row[j];
        }
        if (ready != NULL && (r = ready(ud, m->b_off[l] + no)) < 0)
            return r;

        /* Rows of dW are contiguous slices of the gradient buffer; cutting the product by rows
         * lets the caller ship the first rows while the rest are computed. */
        size_t rows = no;
        if (split_bytes > 0 && ready != NULL) {
            rows = split_bytes / (ni * sizeof(float));
            if (rows == 0)
                rows = 1;
        }
        for (size_t r0 = 0; r0 < no; r0 += rows) {
            size_t nr = no - r0 < rows ? no - r0 : rows;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nr, (int)ni, (int)b, 1.0f,
                        dy + r0, (int)no, in, (int)ni, 0.0f, dw + r0 * ni, (int)ni);
            if (ready != NULL && (r = ready(ud, m->w_off[l] + (r0 + nr) * ni)) < 0)
                return r;
        }

        if (l == 0)
            break;
        float *dx = m->delta[(L - l) & 1];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)ni, (int)no, 1.0f, dy,
                    (int)no, m->params + m->w_off[l], (int)ni, 0.0f, dx, (int)ni);
        act_backward(dx, m->out[l - 1], m->pre[l - 1], b * ni, m->act);
        dy = dx;
    }
    if (ret_loss != NULL)
        *ret_loss = loss / (double)b;
    return 0;
}

void dl_train_mlp_evaluate(dl_train_mlp_t *m, const float *x, const uint8_t *y, size_t b,
                           double *ret_loss_sum, size_t *ret_correct)
{
    const size_t L = m->n_layers, n = m->sizes[L];
    double loss = 0.0;
    size_t correct = 0;

    for (size_t done = 0; done < b;) {
        size_t k = b - done < m->max_batch ? b - done : m->max_batch;
        forward(m, x + done * m->sizes[0], k);
        const float *z = m->out[L - 1];
        for (size_t r = 0; r < k; r++) {
            const float *row = z + r * n;
            uint8_t label = y[done + r];
            size_t best = 0;
            float mx;
            for (size_t j = 1; j < n; j++)
                if (row[j] > row[best])
                    best = j;
            float lse = row_logsumexp(row, n, &mx);
            if (label < n)
                loss += (double)(lse - (row[label] - mx));
            else
                loss += INFINITY;
            correct += best == label;
        }
        done += k;
    }
    *ret_loss_sum = loss;
    *ret_correct = correct;
}
