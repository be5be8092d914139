/* The straggler rule as a state machine: fed every rank's running sums (steps, compute and wait
 * time, samples), it keeps for each rank a few snapshots of those sums, and at each evaluation
 * holds every rank's compute time a step over its latest window of steps against the median of
 * all. A data-parallel job runs at its slowest rank's pace: the others' compute stays put while
 * their waits grow, so compute time, not step time, tells who holds the job up.
 *
 * Why a sum over a window and not a streak of slow intervals: on a noisy machine a rank that
 * costs the job a steady share of its time has intervals that look normal by chance (a stall
 * falls between two reports, the scheduler favours it for a second), and a streak breaks on any
 * of them; the window's sum counts what the rank cost, wherever in the window it fell. Load that
 * slows every rank moves the median with it and names nobody. The window before must be slow too:
 * one window can be a one-off stall that a busy machine dealt a rank once.
 *
 * Cost: feeding a rank is O(log ranks) (the states are kept sorted by rank, one per rank seen,
 * so a report naming rank 2^30 costs one state, not 2^30); an evaluation is O(ranks log ranks).
 * Memory is SNAPS snapshots a rank whatever the window, as snapshots are at least
 * window / SLOTS steps apart. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

/* A snapshot every window / SLOTS steps at most: the window a rank is judged over spans between
 * window and window x (1 + 1 / SLOTS) steps when reports come often. */
#define SLOTS 8
/* Enough for two windows back to back: the start of one is the newest snapshot both window steps
 * and min_reports reports back from its end, and the ones after it are fewer than SLOTS + 1 by
 * steps or fewer than min_reports by reports. */
#define SNAPS 32

typedef struct {
    double steps, compute, wait, samples;
    uint64_t report; /* the rank's reports counted when the sums were taken */
} snap_t;

typedef struct {
    int rank;
    bool known; /* has sums */
    int node_rank;
    char host[64];
    snap_t now;         /* the latest sums */
    snap_t snap[SNAPS]; /* a ring, oldest at first */
    size_t first, nsnap;
    /* The latest evaluation's window. */
    bool has_window;
    double w_compute, w_step, w_samples, w_steps; /* a step's means, and the steps */
    double w_start;                               /* the rank's steps where it starts */
    bool has_prev;                                /* and the window before it */
    double p_compute, p_steps;
    bool named;
    double named_at; /* the rank's steps when it was named */
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
    if (!(o->threshold > 0) || o->min_reports < 1 || o->min_reports > (SNAPS - 2) / 2 - SLOTS)
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

static void push_snap(rank_state_t *s)
{
    if (s->nsnap == SNAPS) {
        s->first = (s->first + 1) % SNAPS;
        s->nsnap--;
    }
    s->snap[(s->first + s->nsnap) % SNAPS] = s->now;
    s->nsnap++;
}

static const snap_t *newest_snap(const rank_state_t *s)
{
    return &s->snap[(s->first + s->nsnap - 1) % SNAPS];
}

int dl_diag_judge_feed(dl_diag_judge_t *j, const dl_diag_totals_t *v, size_t n)
{
    double spacing = (double)j->o.window / SLOTS;
    if (spacing < 1)
        spacing = 1;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_totals_t *t = &v[i];
        if (t->rank < 0)
            return -EINVAL;
        rank_state_t *s = state_of(j, t->rank);
        if (s == NULL)
            return -ENOMEM;
        s->node_rank = t->node_rank;
        snprintf(s->host, sizeof(s->host), "%s", t->host != NULL ? t->host : "");
        snap_t now = {.steps = t->steps,
                      .compute = t->compute_ms,
                      .wait = t->wait_ms,
                      .samples = t->samples,
                      .report = s->now.report + 1};
        if (!s->known || t->steps < s->now.steps || t->compute_ms < s->now.compute) {
            /* First sums, or a worker that started again: its history starts here. A rank
             * named before stays named until a window after this start clears it. */
            s->known = true;
            s->has_window = false;
            s->nsnap = 0;
            s->first = 0;
            s->named_at = 0;
            s->now = now;
            s->now.report = 0;
            push_snap(s);
            continue;
        }
        if (t->steps == s->now.steps)
            continue; /* no step since: not a report of anything */
        s->now = now;
        if (now.steps - newest_snap(s)->steps >= spacing)
            push_snap(s);
    }
    return 0;
}

static const snap_t *snap_at(const rank_state_t *s, size_t k)
{
    return &s->snap[(s->first + k) % SNAPS];
}

/* The newest of rank's snapshots [0, below) at least window steps and min_reports reports before
 * end: where a window that ends at end starts. Returns its index, or -1. */
static long window_start(const dl_diag_judge_t *j, const rank_state_t *s, const snap_t *end,
                         size_t below)
{
    for (size_t k = below; k-- > 0;) {
        const snap_t *a = snap_at(s, k);
        double steps = end->steps - a->steps;
        if (steps >= (double)j->o.window && steps >= 1 &&
            end->report - a->report >= (uint64_t)j->o.min_reports)
            return (long)k;
    }
    return -1;
}

/* Rank's latest window (to its latest sums) and the one before it (to where the latest starts):
 * sets their means; false when it has no window yet. */
static bool windows_of(const dl_diag_judge_t *j, rank_state_t *s)
{
    long k = window_start(j, s, &s->now, s->nsnap);
    if (k < 0)
        return false;
    const snap_t *a = snap_at(s, (size_t)k);
    double steps = s->now.steps - a->steps;
    s->w_steps = steps;
    s->w_compute = (s->now.compute - a->compute) / steps;
    s->w_step = s->w_compute + (s->now.wait - a->wait) / steps;
    s->w_samples = (s->now.samples - a->samples) / steps;
    s->w_start = a->steps;
    long p = window_start(j, s, a, (size_t)k);
    s->has_prev = p >= 0;
    if (s->has_prev) {
        const snap_t *b = snap_at(s, (size_t)p);
        s->p_steps = a->steps - b->steps;
        s->p_compute = (a->compute - b->compute) / s->p_steps;
    }
    return true;
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
    o->compute_ms = s->w_compute;
    o->median_ms = median;
    o->step_ms = step;
    o->slower = median > 0 ? s->w_compute / median - 1 : 0;
    o->steps = (uint64_t)(s->w_steps + (s->has_prev ? s->p_steps : 0));
    /* The job steps at its slowest rank's pace: were this one at the median, a step would be
     * shorter by the difference (no shorter than the median's own step). */
    double fixed = step - (s->w_compute - median);
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
    size_t n = 0, nprev = 0;
    if (grow((void **)&j->scratch, &j->scratch_cap, j->n * 3 + 1, sizeof(double), false) < 0)
        return -ENOMEM;
    double *means = j->scratch, *steps = j->scratch + j->n, *prev = j->scratch + 2 * j->n;
    double samples_all = 0, slowest = -1;
    int slowest_rank = -1;
    for (size_t i = 0; i < j->n; i++) {
        rank_state_t *s = &j->r[i];
        s->has_window = s->known && windows_of(j, s);
        if (!s->has_window)
            continue;
        means[n] = s->w_compute;
        steps[n] = s->w_step;
        n++;
        if (s->has_prev)
            prev[nprev++] = s->p_compute;
        samples_all += s->w_samples;
        if (s->w_compute > slowest) {
            slowest = s->w_compute;
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
        /* The window before, against its own median: load that came and went moved both. */
        double prev_limit = nprev > 0 ? low_median(prev, nprev) * (1.0 + j->o.threshold) : 0;
        for (size_t i = 0; i < j->n; i++) {
            rank_state_t *s = &j->r[i];
            if (!s->has_window)
                continue;
            bool named_now = false;
            if (!s->named && s->w_compute > limit && s->has_prev && s->p_compute > prev_limit) {
                s->named = true;
                s->named_at = s->now.steps;
                named_now = true;
            } else if (s->named && s->w_compute <= limit && s->w_start >= s->named_at) {
                /* Only a window wholly after the naming clears it: the one that named it
                 * dips under the limit as its slow steps age out, which says nothing yet. */
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
