/* A worker for the collective tests, started by dlaunch (or by a test directly) with torchrun's
 * environment. It runs every operation on every type and size it is told, checks each result
 * against a serial reference it computes itself (every rank's input is a known function of rank
 * and index), and writes a hash of every result to OUT/rank-R.txt, so the test can check that all
 * ranks got the same bits.
 *
 *   coll-worker --out DIR [--ops LIST] [--types LIST] [--rops LIST] [--sizes LIST]
 *               [--mem private|shared] [--die-rank R | --stop-rank R] [--fail-after N]
 *
 * --mem shared: send and receive buffers come from dl_coll_mem_alloc (else malloc). The file ends
 * with how many all-reduces read another rank's buffers in place. *
 * Exit codes: 0 all checks passed, 1 a result was wrong, 2 bad usage or setup, 3 a collective
 * returned an error (OUT/rank-R.err then says which, and after how long). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collective.h"
#include "internal.h" /* dl__coll_shm_in_place_calls: whether the in-place path ran */

typedef struct {
    const char *out;
    char ops[256], types[64], rops[64];
    size_t sizes[64];
    int nsizes;
    int die_rank, stop_rank, fail_after;
    int rank, world;
    int shared; /* P_SRC and P_DST are dl_coll_mem_alloc memory, sized once */
    FILE *log;
    dl_coll_group_t *g;
    int done_ops;
    double coll_s; /* time inside collectives */
    /* Buffers reused across cases: page faults cost more than the checks in a VM. */
    char *pool[8];
    size_t pool_cap[8];
} worker_t;

enum { P_SRC, P_DST, P_WANT, P_IN, P_FS, P_FA, P_IS, P_ASYNC };

static void *pool(worker_t *w, int slot, size_t bytes)
{
    if (w->pool_cap[slot] < bytes + 64) {
        if ((slot == P_SRC || slot == P_DST) && w->shared) {
            fprintf(stderr, "coll-worker: %zu bytes do not fit the shared buffers\n", bytes);
            exit(2);
        }
        free(w->pool[slot]);
        w->pool_cap[slot] = (bytes + 64) * 2;
        w->pool[slot] = malloc(w->pool_cap[slot]);
        if (w->pool[slot] == NULL) {
            fprintf(stderr, "coll-worker: out of memory\n");
            exit(2);
        }
    }
    return w->pool[slot];
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's element i for a case (salt): full-range integers, so sums wrap, and floats in
 * [-1, 1) with a few exact ties and signed zeros for MIN/MAX. */
static void fill_at(void *buf, size_t count, dl_coll_dtype_t t, int rank, uint64_t salt,
                    size_t start)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t h = mix(salt * 1000003u + (uint64_t)rank * 0x100000001b3ull + start + i);
        double f = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        if ((h & 15) == 0)
            f = (h & 16) ? 0.0 : -0.0;
        switch (t) {
        case DL_COLL_FLOAT32: ((float *)buf)[i] = (float)f; break;
        case DL_COLL_FLOAT64: ((double *)buf)[i] = f; break;
        case DL_COLL_INT32: ((int32_t *)buf)[i] = (int32_t)(uint32_t)h; break;
        case DL_COLL_INT64: ((int64_t *)buf)[i] = (int64_t)h; break;
        }
    }
}

static void fill(void *buf, size_t count, dl_coll_dtype_t t, int rank, uint64_t salt)
{
    fill_at(buf, count, t, rank, salt, 0);
}

static double getf(const void *buf, size_t i, dl_coll_dtype_t t)
{
    return t == DL_COLL_FLOAT32 ? ((const float *)buf)[i] : ((const double *)buf)[i];
}

static uint64_t geti(const void *buf, size_t i, dl_coll_dtype_t t)
{
    return t == DL_COLL_INT32 ? (uint64_t)(int64_t)((const int32_t *)buf)[i]
                              : (uint64_t)((const int64_t *)buf)[i];
}

static int is_float(dl_coll_dtype_t t)
{
    return t == DL_COLL_FLOAT32 || t == DL_COLL_FLOAT64;
}

/* Checks got[i] (elements lo..lo+count of the reduced vector) against op over every rank's
 * input. Integers must match exactly (sums wrap like the library's); float sums must be within
 * the rounding bound of any summation order, n * eps * sum|x|; MIN/MAX exactly. */
static int check_reduced(worker_t *w, const char *name, const void *got, size_t count, size_t lo,
                         dl_coll_dtype_t t, dl_coll_op_t op, uint64_t salt)
{
    size_t es = dl_coll_dtype_size(t);
    char *in = pool(w, P_IN, count * es);
    double *fs = pool(w, P_FS, count * sizeof(double));
    double *fa = pool(w, P_FA, count * sizeof(double));
    uint64_t *is = pool(w, P_IS, count * sizeof(uint64_t));
    int bad = 0;
    memset(fa, 0, count * sizeof(double));
    for (int r = 0; r < w->world; r++) {
        fill_at(in, count, t, r, salt, lo);
        for (size_t i = 0; i < count; i++) {
            size_t k = i;
            if (is_float(t)) {
                double x = getf(in, k, t);
                if (r == 0 || op == DL_COLL_SUM || op == DL_COLL_AVG)
                    fs[i] = r == 0 ? x : fs[i] + x;
                else if (op == DL_COLL_MIN)
                    fs[i] = fs[i] < x ? fs[i] : x;
                else
                    fs[i] = fs[i] > x ? fs[i] : x;
                fa[i] += fabs(x);
            } else {
                uint64_t x = geti(in, k, t);
                if (t == DL_COLL_INT32)
                    x = (uint32_t)x;
                int64_t a = t == DL_COLL_INT32 ? (int32_t)(uint32_t)is[i] : (int64_t)is[i];
                int64_t b = t == DL_COLL_INT32 ? (int32_t)(uint32_t)x : (int64_t)x;
                if (r == 0 || op == DL_COLL_SUM || op == DL_COLL_AVG)
                    is[i] = r == 0 ? x : is[i] + x;
                else if (op == DL_COLL_MIN)
                    is[i] = a < b ? is[i] : x;
                else
                    is[i] = a > b ? is[i] : x;
            }
        }
    }
    for (size_t i = 0; i < count && bad < 5; i++) {
        if (is_float(t)) {
            double want = fs[i], g = getf(got, i, t);
            double eps = t == DL_COLL_FLOAT32 ? 1.2e-7 : 2.3e-16;
            double tol = 0;
            if (op == DL_COLL_AVG)
                want /= w->world;
            if (op == DL_COLL_SUM || op == DL_COLL_AVG)
                tol = 2.0 * w->world * eps * fa[i] + 1e-30;
            /* MIN/MAX: bits may differ only for zeros of different sign. */
            if (!(fabs(g - want) <= tol)) {
                fprintf(stderr, "rank %d: %s: element %zu: got %.17g, want %.17g (tol %.3g)\n",
                        w->rank, name, lo + i, g, want, tol);
                bad++;
            }
        } else {
            int64_t want = t == DL_COLL_INT32 ? (int32_t)(uint32_t)is[i] : (int64_t)is[i];
            int64_t g = (int64_t)geti(got, i, t);
            if (op == DL_COLL_AVG)
                want /= w->world;
            if (g != want) {
                fprintf(stderr, "rank %d: %s: element %zu: got %" PRId64 ", want %" PRId64 "\n",
                        w->rank, name, lo + i, g, want);
                bad++;
            }
        }
    }
    return bad;
}

static uint64_t hash_buf(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint64_t h = 1469598103934665603ull, x;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&x, p + i, 8);
        h = mix(h ^ x);
    }
    for (; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A collective failed: say so where the test looks, and leave with 3. */
static void died(worker_t *w, const char *what, int r, double t0)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank-%d.err", w->out, w->rank);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "%d %.3f %s\n", -r, now_s() - t0, dl_coll_group_error(w->g));
        fclose(f);
    }
    fprintf(stderr, "rank %d: %s failed after %.3f s: %s (%s)\n", w->rank, what, now_s() - t0,
            strerror(-r), dl_coll_group_error(w->g));
    dl_coll_group_destroy(w->g);
    exit(3);
}

/* Before each operation: the failure drills. */
static void maybe_fail(worker_t *w)
{
    if (w->done_ops++ != w->fail_after)
        return;
    if (w->rank == w->die_rank)
        raise(SIGKILL);
    if (w->rank == w->stop_rank)
        raise(SIGSTOP);
}

static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static const char *short_type(dl_coll_dtype_t t)
{
    static const char *n[] = {"f32", "f64", "i32", "i64"};
    return n[t];
}

static int run_allreduce(worker_t *w, dl_coll_dtype_t t, dl_coll_op_t op, size_t count, int idx)
{
    size_t es = dl_coll_dtype_size(t);
    uint64_t salt = (uint64_t)idx * 131 + t * 7 + op;
    char *src = pool(w, P_SRC, count * es), *dst = pool(w, P_DST, count * es);
    int in_place = idx & 1, bad;
    char name[96];
    snprintf(name, sizeof(name), "allreduce-%s-%s-%zu%s", short_type(t), dl_coll_op_name(op), count,
             in_place ? "-inplace" : "");
    fill(src, count, t, w->rank, salt);
    maybe_fail(w);
    double t0 = now_s();
    int r = dl_coll_allreduce(w->g, src, in_place ? src : dst, count, t, op);
    w->coll_s += now_s() - t0;
    if (r < 0)
        died(w, name, r, t0);
    const char *res = in_place ? src : dst;
    /* One rank checks the values; the hashes show the others hold the same bits. */
    bad = idx % w->world == w->rank ? check_reduced(w, name, res, count, 0, t, op, salt) : 0;
    fprintf(w->log, "%s %016" PRIx64 "\n", name, hash_buf(res, count * es));
    return bad;
}

static int run_reduce_scatter(worker_t *w, dl_coll_dtype_t t, dl_coll_op_t op, size_t count,
                              int idx)
{
    size_t es = dl_coll_dtype_size(t), total = count * (size_t)w->world;
    uint64_t salt = (uint64_t)idx * 137 + t * 7 + op + 5000;
    char *src = pool(w, P_SRC, total * es), *dst = pool(w, P_DST, count * es);
    char name[96];
    snprintf(name, sizeof(name), "reduce_scatter-%s-%s-%zu", short_type(t), dl_coll_op_name(op),
             count);
    fill(src, total, t, w->rank, salt);
    maybe_fail(w);
    double t0 = now_s();
    int r = dl_coll_reduce_scatter(w->g, src, dst, count, t, op);
    w->coll_s += now_s() - t0;
    if (r < 0)
        died(w, name, r, t0);
    int bad = check_reduced(w, name, dst, count, (size_t)w->rank * count, t, op, salt);
    /* Blocks differ by rank; hash what every rank can agree on: the rank and its block. */
    fprintf(w->log, "%s rank%d %016" PRIx64 "\n", name, w->rank, hash_buf(dst, count * es));
    return bad;
}

static int run_allgather(worker_t *w, dl_coll_dtype_t t, size_t count, int idx)
{
    size_t es = dl_coll_dtype_size(t), total = count * (size_t)w->world;
    uint64_t salt = (uint64_t)idx * 139 + t + 9000;
    char *dst = pool(w, P_DST, total * es), *src = pool(w, P_SRC, count * es);
    char *want = pool(w, P_WANT, count * es);
    int in_place = idx & 1, bad = 0;
    char name[96];
    snprintf(name, sizeof(name), "allgather-%s-%zu%s", short_type(t), count,
             in_place ? "-inplace" : "");
    char *mine = in_place ? dst + (size_t)w->rank * count * es : src;
    fill(mine, count, t, w->rank, salt);
    maybe_fail(w);
    double t0 = now_s();
    int r = dl_coll_allgather(w->g, mine, dst, count, t);
    w->coll_s += now_s() - t0;
    if (r < 0)
        died(w, name, r, t0);
    for (int q = 0; q < w->world && bad == 0 && idx % w->world == w->rank; q++) {
        fill(want, count, t, q, salt);
        if (count > 0 && memcmp(dst + (size_t)q * count * es, want, count * es) != 0) {
            fprintf(stderr, "rank %d: %s: block of rank %d differs\n", w->rank, name, q);
            bad++;
        }
    }
    fprintf(w->log, "%s %016" PRIx64 "\n", name, hash_buf(dst, total * es));
    return bad;
}

static int run_broadcast(worker_t *w, dl_coll_dtype_t t, size_t count, int idx)
{
    size_t es = dl_coll_dtype_size(t);
    int root = (int)((count + (size_t)idx) % (size_t)w->world), bad = 0;
    uint64_t salt = (uint64_t)idx * 149 + t + 13000;
    char *buf = pool(w, P_SRC, count * es), *want = pool(w, P_WANT, count * es);
    char name[96];
    snprintf(name, sizeof(name), "broadcast-%s-%zu-root%d", short_type(t), count, root);
    fill(buf, count, t, w->rank, salt);
    maybe_fail(w);
    double t0 = now_s();
    int r = dl_coll_broadcast(w->g, buf, count, t, root);
    w->coll_s += now_s() - t0;
    if (r < 0)
        died(w, name, r, t0);
    fill(want, count, t, root, salt);
    if (count > 0 && memcmp(buf, want, count * es) != 0) {
        fprintf(stderr, "rank %d: %s: differs from the root's data\n", w->rank, name);
        bad++;
    }
    fprintf(w->log, "%s %016" PRIx64 "\n", name, hash_buf(buf, count * es));
    return bad;
}

/* Every rank leaves a mark, then enters the barrier; after it, every mark must be there. The
 * ranks enter at different times so that a barrier that does not wait shows. */
static int run_barrier(worker_t *w, int idx)
{
    char path[4096];
    int bad = 0;
    struct timespec nap = {0, (long)((w->world - 1 - w->rank) * 10 + idx % 7) * 1000000L};
    nanosleep(&nap, NULL);
    snprintf(path, sizeof(path), "%s/barrier-%d-%d", w->out, idx, w->rank);
    FILE *f = fopen(path, "w");
    if (f != NULL)
        fclose(f);
    maybe_fail(w);
    double t0 = now_s();
    int r = dl_coll_barrier(w->g);
    if (r < 0)
        died(w, "barrier", r, t0);
    for (int q = 0; q < w->world; q++) {
        snprintf(path, sizeof(path), "%s/barrier-%d-%d", w->out, idx, q);
        if (access(path, F_OK) != 0) {
            fprintf(stderr, "rank %d: barrier %d: left before rank %d entered\n", w->rank, idx, q);
            bad++;
        }
    }
    fprintf(w->log, "barrier-%d ok\n", idx);
    return bad;
}

/* Several all-reduces in flight on the comm thread, a synchronous one queued behind them, then
 * every result checked: the order is the issue order on every rank. */
static int run_async(worker_t *w, size_t count, int idx)
{
    enum { K = 4 };
    dl_coll_request_t *req[K];
    float *buf[K + 1];
    int bad = 0;
    double t0 = now_s();
    for (int k = 0; k <= K; k++) {
        buf[k] = (float *)pool(w, P_ASYNC, (K + 1) * (count * sizeof(float) + 64)) +
                 (size_t)k * (count + 16);
        fill(buf[k], count, DL_COLL_FLOAT32, w->rank, (uint64_t)idx * 151 + (uint64_t)k + 17000);
    }
    maybe_fail(w);
    for (int k = 0; k < K; k++) {
        int r = dl_coll_allreduce_async(w->g, buf[k], buf[k], count, DL_COLL_FLOAT32,
                                        k % 2 ? DL_COLL_MAX : DL_COLL_SUM, &req[k]);
        if (r < 0)
            died(w, "allreduce_async", r, t0);
    }
    int r = dl_coll_allreduce(w->g, buf[K], buf[K], count, DL_COLL_FLOAT32, DL_COLL_MIN);
    for (int k = 0; k < K; k++) {
        int done = 0;
        dl_coll_test(req[k], &done);
        if (!done) {
            fprintf(stderr, "rank %d: async %d not done after a later synchronous call\n", w->rank,
                    k);
            bad++;
        }
        int rk = dl_coll_wait(req[k]);
        if (rk < 0)
            died(w, "allreduce_async wait", rk, t0);
    }
    if (r < 0)
        died(w, "allreduce after async", r, t0);
    for (int k = 0; k <= K; k++) {
        char name[64];
        dl_coll_op_t op = k == K ? DL_COLL_MIN : (k % 2 ? DL_COLL_MAX : DL_COLL_SUM);
        snprintf(name, sizeof(name), "async-%d-%zu-%d", idx, count, k);
        if ((idx + k) % w->world == w->rank)
            bad += check_reduced(w, name, buf[k], count, 0, DL_COLL_FLOAT32, op,
                                 (uint64_t)idx * 151 + (uint64_t)k + 17000);
        fprintf(w->log, "%s %016" PRIx64 "\n", name, hash_buf(buf[k], count * sizeof(float)));
    }
    return bad;
}

static int parse_sizes(worker_t *w, const char *s)
{
    w->nsizes = 0;
    while (*s != '\0' && w->nsizes < 64) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno != 0 || end == s || (*end != ',' && *end != '\0'))
            return -1;
        w->sizes[w->nsizes++] = (size_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return w->nsizes > 0 ? 0 : -1;
}

static int parse_rank(const char *s, int *ret)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < -1 || v > 1 << 20)
        return -1;
    *ret = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    worker_t w = {.die_rank = -1, .stop_rank = -1, .fail_after = 1};
    snprintf(w.ops, sizeof(w.ops), "allreduce,reduce_scatter,allgather,broadcast,barrier,async");
    snprintf(w.types, sizeof(w.types), "f32,f64,i32,i64");
    snprintf(w.rops, sizeof(w.rops), "sum,avg,min,max");
    parse_sizes(&w, "0,1,2,3,7,13,97,1031");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = v == NULL;
        if (!bad && strcmp(a, "--out") == 0)
            w.out = v;
        else if (!bad && strcmp(a, "--ops") == 0)
            snprintf(w.ops, sizeof(w.ops), "%s", v);
        else if (!bad && strcmp(a, "--types") == 0)
            snprintf(w.types, sizeof(w.types), "%s", v);
        else if (!bad && strcmp(a, "--rops") == 0)
            snprintf(w.rops, sizeof(w.rops), "%s", v);
        else if (!bad && strcmp(a, "--sizes") == 0)
            bad = parse_sizes(&w, v) < 0;
        else if (!bad && strcmp(a, "--mem") == 0)
            bad = (w.shared = strcmp(v, "shared") == 0) == 0 && strcmp(v, "private") != 0;
        else if (!bad && strcmp(a, "--die-rank") == 0)
            bad = parse_rank(v, &w.die_rank) < 0;
        else if (!bad && strcmp(a, "--stop-rank") == 0)
            bad = parse_rank(v, &w.stop_rank) < 0;
        else if (!bad && strcmp(a, "--fail-after") == 0)
            bad = parse_rank(v, &w.fail_after) < 0;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "coll-worker: bad argument '%s'\n", a);
            return 2;
        }
        i++;
    }
    if (w.out == NULL) {
        fprintf(stderr, "coll-worker: --out DIR is required\n");
        return 2;
    }
    char err[512];
    double t0 = now_s();
    int r = dl_coll_group_from_env(&w.g, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "coll-worker: group: %s\n", err);
        return 2;
    }
    w.rank = dl_coll_rank(w.g);
    w.world = dl_coll_world_size(w.g);
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank-%d.txt", w.out, w.rank);
    w.log = fopen(path, "w");
    if (w.log == NULL) {
        fprintf(stderr, "coll-worker: %s: %s\n", path, strerror(errno));
        return 2;
    }
    fprintf(w.log, "world %d transport %s hosts %d\n", w.world, dl_coll_transport_name(w.g),
            dl_coll_num_hosts(w.g));
    if (w.shared) {
        size_t most = 0;
        for (int s = 0; s < w.nsizes; s++)
            most = w.sizes[s] > most ? w.sizes[s] : most;
        /* Room for the largest case of the widest type, a block per rank (all-gather and
         * reduce-scatter use one of the two per rank). */
        for (int slot = P_SRC; slot <= P_DST; slot++) {
            void *p = NULL;
            w.pool_cap[slot] = most * 8 * (size_t)w.world + 64;
            if (dl_coll_mem_alloc(w.g, w.pool_cap[slot], &p, err, sizeof(err)) < 0) {
                fprintf(stderr, "coll-worker: dl_coll_mem_alloc: %s\n", err);
                return 2;
            }
            w.pool[slot] = p;
        }
    }
    int bad = 0, idx = 0;
    static const dl_coll_dtype_t types[] = {DL_COLL_FLOAT32, DL_COLL_FLOAT64, DL_COLL_INT32,
                                            DL_COLL_INT64};
    static const dl_coll_op_t rops[] = {DL_COLL_SUM, DL_COLL_AVG, DL_COLL_MIN, DL_COLL_MAX};
    for (int s = 0; s < w.nsizes; s++) {
        size_t n = w.sizes[s];
        for (int ti = 0; ti < 4; ti++) {
            if (!listed(w.types, short_type(types[ti])))
                continue;
            for (int oi = 0; oi < 4; oi++) {
                if (!listed(w.rops, dl_coll_op_name(rops[oi])))
                    continue;
                if (listed(w.ops, "allreduce"))
                    bad += run_allreduce(&w, types[ti], rops[oi], n, idx++);
                if (listed(w.ops, "reduce_scatter"))
                    bad += run_reduce_scatter(&w, types[ti], rops[oi], n, idx++);
            }
            if (listed(w.ops, "allgather"))
                bad += run_allgather(&w, types[ti], n, idx++);
            if (listed(w.ops, "broadcast"))
                bad += run_broadcast(&w, types[ti], n, idx++);
        }
        if (listed(w.ops, "async"))
            bad += run_async(&w, n, idx++);
        if (listed(w.ops, "barrier"))
            bad += run_barrier(&w, idx++);
    }
    fprintf(w.log, "in-place %" PRIu64 "\n", dl__coll_shm_in_place_calls(w.g->shm));
    fprintf(w.log, "%s\n", bad == 0 ? "done" : "WRONG");
    fclose(w.log);
    for (int slot = P_SRC; slot <= P_DST && w.shared; slot++) {
        dl_coll_mem_free(w.g, w.pool[slot]);
        w.pool[slot] = NULL;
    }
    dl_coll_group_destroy(w.g);
    for (int i = 0; i < 8; i++)
        free(w.pool[i]);
    if (bad == 0 && w.rank == 0)
        printf("coll-worker: world %d, %d cases, %.2f s, %.2f s of it in collectives\n", w.world,
               idx, now_s() - t0, w.coll_s);
    return bad == 0 ? 0 : 1;
}
