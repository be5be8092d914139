/* The divergence watch: a pure function of the losses it is fed, so that every rank, fed the same
 * job-wide loss, reaches the same verdict at the same step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

/* Below this many healthy steps the median says too little to judge by. */
#define MIN_HISTORY 16
/* A loss this small a share of where the run started is no divergence, however far above the
 * median: a model that has learnt its data down to 0.02 sees batches at 0.1 as noise, not as a
 * climb back towards the 2.3 it began at. */
#define START_SHARE 0.25

void dl_train_divergence_init(dl_train_divergence_t *d, double factor, uint64_t window)
{
    memset(d, 0, sizeof(*d));
    d->factor = factor;
    d->window = window < 1                                ? 1
                : window > DL_TRAIN_DIVERGENCE_WINDOW_MAX ? DL_TRAIN_DIVERGENCE_WINDOW_MAX
                                                          : window;
}

void dl_train_divergence_forgive(dl_train_divergence_t *d)
{
    memset(d->was_high, 0, sizeof(d->was_high));
    d->high_in_window = 0;
    d->judged = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static double median_of(const dl_train_divergence_t *d)
{
    double v[DL_TRAIN_DIVERGENCE_HISTORY];

    memcpy(v, d->healthy, d->n * sizeof(double));
    qsort(v, d->n, sizeof(double), cmp_double);
    return d->n % 2 ? v[d->n / 2] : 0.5 * (v[d->n / 2 - 1] + v[d->n / 2]);
}

dl_train_loss_verdict_t dl_train_divergence_feed(dl_train_divergence_t *d, double loss)
{
    if (!isfinite(loss))
        return DL_TRAIN_LOSS_DIVERGED;
    bool high = false;
    if (d->fed < MIN_HISTORY) {
        d->start += loss / MIN_HISTORY;
        d->fed++;
    }
    if (d->factor > 0 && d->n >= MIN_HISTORY) {
        d->median = median_of(d);
        high = loss > d->factor * d->median && loss > START_SHARE * d->start;
        /* The window slides over the steps judged: the oldest one leaves as this one enters. */
        size_t slot = (size_t)(d->judged % d->window);
        if (d->judged >= d->window && d->was_high[slot])
            d->high_in_window--;
        d->was_high[slot] = high;
        d->high_in_window += high;
        d->judged++;
    }
    if (high)
        return d->high_in_window * 2 > d->window ? DL_TRAIN_LOSS_DIVERGED : DL_TRAIN_LOSS_HIGH;
    /* Only healthy losses join the history, so a run that goes bad, or drifts up, stays measured
     * against the losses it had while it was well. */
    d->healthy[d->next] = loss;
    d->next = (d->next + 1) % DL_TRAIN_DIVERGENCE_HISTORY;
    if (d->n < DL_TRAIN_DIVERGENCE_HISTORY)
        d->n++;
    return DL_TRAIN_LOSS_OK;
}
