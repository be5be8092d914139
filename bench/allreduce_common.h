/* What the all-reduce benchmark's two workers (ours and Open MPI's) share: the sizes, how many
 * iterations each size gets, and the row they write. Header-only so the MPI worker needs nothing
 * of the project but this file. */
#ifndef DL_BENCH_ALLREDUCE_COMMON_H
#define DL_BENCH_ALLREDUCE_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each size is timed in this many batches of bench_iters() calls; the fastest batch counts, so a
 * burst of unrelated load on the machine does not decide the figure. */
#define BENCH_BATCHES 3

typedef struct {
    size_t min_bytes, max_bytes;
    int step;            /* multiply by this from one size to the next */
    double budget_bytes; /* per size: iterations * bytes stays near this */
    const char *out;     /* rows are appended here by rank 0 */
    const char *impl, *transport;
} bench_args_t;

/* --min BYTES --max BYTES --step K --budget BYTES --out FILE --impl NAME --transport NAME */
static inline int bench_parse(bench_args_t *a, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (v == NULL)
            return -1;
        errno = 0;
        if (strcmp(k, "--out") == 0) {
            a->out = v;
        } else if (strcmp(k, "--impl") == 0) {
            a->impl = v;
        } else if (strcmp(k, "--transport") == 0) {
            a->transport = v;
        } else {
            double x = strtod(v, &end);
            if (errno != 0 || *end != '\0' || x < 1)
                return -1;
            if (strcmp(k, "--min") == 0)
                a->min_bytes = (size_t)x;
            else if (strcmp(k, "--max") == 0)
                a->max_bytes = (size_t)x;
            else if (strcmp(k, "--step") == 0 && x >= 2)
                a->step = (int)x;
            else if (strcmp(k, "--budget") == 0)
                a->budget_bytes = x;
            else
                return -1;
        }
    }
    return a->out != NULL && a->min_bytes <= a->max_bytes ? 0 : -1;
}

/* Small messages get many iterations (their time is a few microseconds), large ones few. */
static inline int bench_iters(const bench_args_t *a, size_t bytes)
{
    double n = a->budget_bytes / (double)bytes / BENCH_BATCHES;
    return n < 3 ? 3 : n > 1000 ? 1000 : (int)n;
}

static inline void bench_row(FILE *f, const bench_args_t *a, int world, size_t bytes, double time_s)
{
    double algbw = (double)bytes / time_s / 1e9;
    double busbw = algbw * 2.0 * (world - 1) / world;
    fprintf(f, "%s %s %d %zu %.3f %.4f\n", a->impl, a->transport, world, bytes, time_s * 1e6,
            busbw);
}

#endif
