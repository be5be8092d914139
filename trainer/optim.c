/* The optimizer step and the learning-rate schedule. */
#include <math.h>

#include "internal.h"

DL__TRAIN_HOT
void dl_train_sgd_step(float *restrict p, float *restrict m, const float *restrict g, size_t n,
                       float lr, float momentum, float weight_decay)
{
    /* torch.optim.SGD's first step sets m = d; starting from m = 0 gives the same value. */
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + weight_decay * p[i];
        float v = momentum * m[i] + d;
        m[i] = v;
        p[i] -= lr * v;
    }
}

DL__TRAIN_HOT
void dl_train_sgd_step_to(float *restrict p_out, float *restrict m_out, const float *restrict p_in,
                          const float *restrict m_in, const float *restrict g, size_t n, float lr,
                          float momentum, float weight_decay)
{
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + weight_decay * p_in[i];
        float v = momentum * m_in[i] + d;
        m_out[i] = v;
        p_out[i] = p_in[i] - lr * v;
    }
}

DL__TRAIN_HOT
void dl_train_sgd_step_pair(float *restrict g_mine, float *restrict g_theirs, float *restrict m_out,
                            const float *restrict p_in, const float *restrict m_in, size_t n,
                            float lr, float momentum, float weight_decay)
{
    for (size_t i = 0; i < n; i++) {
        float g = g_mine[i] + g_theirs[i];
        float d = g + weight_decay * p_in[i];
        float v = momentum * m_in[i] + d;
        m_out[i] = v;
        float p = p_in[i] - lr * v;
        g_mine[i] = p;
        g_theirs[i] = p;
    }
}

DL__TRAIN_HOT
void dl_train_sgd_momentum_to(float *restrict m_out, const float *restrict m_in,
                              const float *restrict p_in, const float *restrict g, size_t n,
                              float momentum, float weight_decay)
{
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + weight_decay * p_in[i];
        m_out[i] = momentum * m_in[i] + d;
    }
}

double dl_train_lr_at(const dl_train_schedule_t *s, uint64_t step)
{
    if (step < s->warmup_steps)
        return s->lr * (double)(step + 1) / (double)s->warmup_steps;

    switch (s->kind) {
    case DL_TRAIN_SCHED_STEP:
        if (s->step_size == 0)
            return s->lr;
        return s->lr * pow(s->gamma, (double)(step / s->step_size));
    case DL_TRAIN_SCHED_COSINE: {
        /* Cosine from the end of warmup to the last step, reaching lr_min at total_steps. */
        if (s->total_steps <= s->warmup_steps)
            return s->lr;
        double t = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
        if (t > 1.0)
            t = 1.0;
        return s->lr_min + (s->lr - s->lr_min) * 0.5 * (1.0 + cos(M_PI * t));
    }
    case DL_TRAIN_SCHED_CONSTANT:
    default: return s->lr;
    }
}

void dl_train_scaled_lr(const dl_train_config_t *cfg, int world, uint64_t total_steps,
                        double *ret_lr, uint64_t *ret_warmup)
{
    double k = (double)(cfg->batch_size * (size_t)world) / (double)cfg->base_batch;
    double lr = cfg->lr, warmup = (double)cfg->warmup_steps;

    switch (cfg->lr_scaling) {
    case DL_TRAIN_SCALE_NONE: break;
    case DL_TRAIN_SCALE_LINEAR:
        /* Goyal et al. (2017): a k times larger rate is safe only if reached gradually, so the
         * ramp is k times longer too, but never more than half the run, which must still have
         * time to anneal. */
        lr *= k;
        if (k > 1) {
            warmup *= k;
            if (warmup > (double)(total_steps / 2))
                warmup = (double)(total_steps / 2);
            if (warmup < (double)cfg->warmup_steps)
                warmup = (double)cfg->warmup_steps;
        }
        break;
    case DL_TRAIN_SCALE_SQRT: lr *= sqrt(k); break;
    }
    *ret_lr = lr;
    *ret_warmup = (uint64_t)warmup;
}
