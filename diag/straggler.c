/* The straggler rule as a state machine: fed every rank's running sums (steps, compute and wait
 * time, samples), it keeps for each rank its compute time a step over its latest interval, and at
 * each evaluation holds the ranks with a new interval against the median of all. A data-parallel
 * job runs at its slowest rank's pace: the others' compute stays put while their waits grow, so
 * compute time, not step time, tells who holds the job up.
 *
 * Cost: feeding a rank is O(log ranks) (the states are kept sorted by rank, one per rank seen,
 * so a report naming rank 2^30 costs one state, not 2^30); an evaluation is O(ranks log ranks). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

typedef struct {
    int rank;
    bool known;    /* has sums */
    bool fresh;    /* a new interval since the last evaluation */
    bool has_mean; /* has had an interval */
    int node_rank;
    char host[64];
    double last_steps, last_compute, last_wait, last_samples; /* sums at the interval's start */
    double mean_compute, mean_step, mean_samples;             /* of the latest interval */
    double interval_steps;
    /* The rule's count: reports in a row on one side of the threshold and their steps. */
    int slow_reports, ok_reports;
    double slow_steps, ok_steps;
    bool named;
} rank_state_t;

struct dl_diag_judge_s {
    dl_diag_straggler_opts_t o;
    rank_state_t *r; /* sorted by rank */
    size_t n, cap;
    double *scratch;
    size_t scratch_cap;
    dl_diag_straggler_t *out;
    size_t nout, out_cap;
    int *cleared;
    size_t ncleared, cleared_cap;
    dl_diag_view_t view;
};

void dl_diag_straggler_opts_init(dl_diag_straggler_opts_t *o)
{
    o->threshold = DL_DIAG_THRESHOLD_DEFAULT;
    o->window = DL_DIAG_WINDOW_DEFAULT;
    o->min_reports = DL_DIAG_MIN_REPORTS;
}

int dl_diag_judge_new(const dl_diag_straggler_opts_t *o, dl_diag_judge_t **ret)
{
    if (o->threshold <= 0 || o->min_reports < 1)
        return -EINVAL;
    dl_diag_judge_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return -ENOMEM;
    j->o = *o;
    j->view.slowest_rank = -1;
    *ret = j;
    return 0;
}

void dl_diag_judge_free(dl_diag_judge_t *j)
{
    if (j == NULL)
        return;
    free(j->r);
    free(j->scratch);
    free(j->out);
    free(j->cleared);
    free(j);
}

void dl_diag_judge_reset(dl_diag_judge_t *j)
{
    j->n = 0;
    j->nout = 0;
    j->ncleared = 0;
    memset(&j->view, 0, sizeof(j->view));
    j->view.slowest_rank = -1;
}

static int grow(void **p, size_t *cap, size_t need, size_t size, bool zero)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (q == NULL)
        return -ENOMEM;
    if (zero)
        memset((char *)q + *cap * size, 0, (c - *cap) * size);
    *p = q;
    *cap = c;
    return 0;
}

/* Rank's state, made (zeroed) if need be; NULL when out of memory. */
static rank_state_t *state_of(dl_diag_judge_t *j, int rank)
{
    size_t lo = 0, hi = j->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (j->r[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < j->n && j->r[lo].rank == rank)
        return &j->r[lo];
    if (grow((void **)&j->r, &j->cap, j->n + 1, sizeof(*j->r), false) < 0)
        return NULL;
    memmove(&j->r[lo + 1], &j->r[lo], (j->n - lo) * sizeof(*j->r));
    j->n++;
    memset(&j->r[lo], 0, sizeof(*j->r));
    j->r[lo].rank = rank;
    return &j->r[lo];
}

int dl_diag_judge_feed(dl_diag_judge_t *j, const dl_diag_totals_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const dl_diag_totals_t *t = &v[i];
        if (t->rank < 0)
            return -EINVAL;
        rank_state_t *s = state_of(j, t->rank);
        if (s == NULL)
            return -ENOMEM;
        s->node_rank = t->node_rank;
        snprintf(s->host, sizeof(s->host), "%s", t->host != NULL ? t->host : "");
        if (!s->known || t->steps < s->last_steps || t->compute_ms < s->last_compute) {
            /* First sums, or a worker that started again: the next interval starts here. */
            bool named = s->named;
            memset(s, 0, sizeof(*s));
            s->rank = t->rank;
            s->named = named;
            s->known = true;
            s->node_rank = t->node_rank;
            snprintf(s->host, sizeof(s->host), "%s", t->host != NULL ? t->host : "");
            s->last_steps = t->steps;
            s->last_compute = t->compute_ms;
            s->last_wait = t->wait_ms;
            s->last_samples = t->samples;
            continue;
        }
        /* An interval covers a third of the window at least (min_reports of them make one):
         * a few steps between two close reports say more about the scheduler than the rank. */
        double steps = t->steps - s->last_steps;
        double least = (double)j->o.window / (double)j->o.min_reports;
        if (steps < 1 || steps < least)
            continue;
        s->mean_compute = (t->compute_ms - s->last_compute) / steps;
        s->mean_step = s->mean_compute + (t->wait_ms - s->last_wait) / steps;
        s->mean_samples = (t->samples - s->last_samples) / steps;
        s->interval_steps = steps;
        s->has_mean = true;
        s->fresh = true;
        s->last_steps = t->steps;
        s->last_compute = t->compute_ms;
        s->last_wait = t->wait_ms;
        s->last_samples = t->samples;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The lower median of v[0..n), n >= 1; reorders v. */
static double low_median(double *v, size_t n)
{
    /* Quickselect would be O(n) against qsort's O(n log n); jobs of up to a few thousand ranks
     * evaluated once a second do not need it yet. */
    qsort(v, n, sizeof(*v), cmp_double);
    return v[(n - 1) / 2];
}

static int add_out(dl_diag_judge_t *j, int rank, const rank_state_t *s, double median, double step,
                   double samples_all, bool named)
{
    if (grow((void **)&j->out, &j->out_cap, j->nout + 1, sizeof(*j->out), false) < 0)
        return -ENOMEM;
    dl_diag_straggler_t *o = &j->out[j->nout++];
    memset(o, 0, sizeof(*o));
    o->rank = rank;
    o->node_rank = s->node_rank;
    snprintf(o->host, sizeof(o->host), "%s", s->host);
    o->compute_ms = s->mean_compute;
    o->median_ms = median;
    o->step_ms = step;
    o->slower = median > 0 ? s->mean_compute / median - 1 : 0;
    o->steps = (uint64_t)s->slow_steps;
    /* The job steps at its slowest rank's pace: were this one at the median, a step would be
     * shorter by the difference (no shorter than the median's own step). */
    double fixed = step - (s->mean_compute - median);
    if (fixed < median)
        fixed = median;
    o->cost = step > 0 && fixed > 0 && fixed < step
                  ? samples_all * 1000.0 / fixed - samples_all * 1000.0 / step
                  : 0;
    o->named = named;
    return 0;
}

int dl_diag_judge_eval(dl_diag_judge_t *j, dl_diag_view_t *ret)
{
    size_t n = 0;
    if (grow((void **)&j->scratch, &j->scratch_cap, j->n * 2 + 1, sizeof(double), false) < 0)
        return -ENOMEM;
    double *means = j->scratch, *steps = j->scratch + j->n;
    double samples_all = 0, slowest = -1;
    int slowest_rank = -1;
    for (size_t i = 0; i < j->n; i++) {
        const rank_state_t *s = &j->r[i];
        if (!s->has_mean)
            continue;
        means[n] = s->mean_compute;
        steps[n] = s->mean_step;
        n++;
        samples_all += s->mean_samples;
        if (s->mean_compute > slowest) {
            slowest = s->mean_compute;
            slowest_rank = s->rank;
        }
    }
    j->nout = 0;
    j->ncleared = 0;
    memset(&j->view, 0, sizeof(j->view));
    j->view.slowest_rank = -1;
    if (n > 0) {
        double median = low_median(means, n);
        /* Every rank steps together: the median of compute + wait is the job's step. */
        double step = low_median(steps, n);
        j->view.ranks = (int)n;
        j->view.median_ms = median;
        j->view.step_ms = step;
        j->view.slowest_rank = slowest_rank;
        j->view.slowest_ms = slowest;
        j->view.samples_per_s = step > 0 ? samples_all * 1000.0 / step : 0;
        double limit = median * (1.0 + j->o.threshold);
        for (size_t i = 0; i < j->n; i++) {
            rank_state_t *s = &j->r[i];
            if (!s->has_mean)
                continue;
            if (s->fresh) {
                s->fresh = false;
                if (s->mean_compute > limit) {
                    s->slow_reports++;
                    s->slow_steps += s->interval_steps;
                    s->ok_reports = 0;
                    s->ok_steps = 0;
                } else {
                    s->ok_reports++;
                    s->ok_steps += s->interval_steps;
                    s->slow_reports = 0;
                    s->slow_steps = 0;
                }
            }
            bool named_now = false;
            if (!s->named && s->slow_reports >= j->o.min_reports &&
                s->slow_steps >= (double)j->o.window) {
                s->named = true;
                named_now = true;
            } else if (s->named && s->ok_reports >= j->o.min_reports &&
                       s->ok_steps >= (double)j->o.window) {
                s->named = false;
                if (grow((void **)&j->cleared, &j->cleared_cap, j->ncleared + 1,
                         sizeof(*j->cleared), false) < 0)
                    return -ENOMEM;
                j->cleared[j->ncleared++] = s->rank;
            }
            if (s->named && add_out(j, s->rank, s, median, step, samples_all, named_now) < 0)
                return -ENOMEM;
        }
    }
    j->view.stragglers = j->out;
    j->view.nstragglers = j->nout;
    j->view.cleared = j->cleared;
    j->view.ncleared = j->ncleared;
    if (ret != NULL)
        *ret = j->view;
    return 0;
}

void dl_diag_judge_view(const dl_diag_judge_t *j, dl_diag_view_t *ret)
{
    *ret = j->view;
}

size_t dl_diag_straggler_text(const dl_diag_straggler_t *s, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "rank %d on node %d (%s) computes %.2f ms a step against the median %.2f ms "
                     "(+%.0f%%) for %llu steps; it costs the job about %.0f samples/s",
                     s->rank, s->node_rank, s->host[0] ? s->host : "?", s->compute_ms, s->median_ms,
                     s->slower * 100.0, (unsigned long long)s->steps, s->cost);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len ? len - 1 : 0;
}
