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
    default:
        return s->lr;
    }
}
