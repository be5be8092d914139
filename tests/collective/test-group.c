/* Process groups whose ranks are threads of this process: every operation, type and transport
 * (shared memory, TCP, and both with made-up hosts), checked against a serial reference and
 * against each other bit for bit; the bootstrap's waiting and refusals; failures that must end
 * in an error instead of a hang. Small chunks make a few thousand elements take many rounds. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collective.h"
#include "dl-test.h"
#include "harness.h"
#include "internal.h" /* dl__coll_shm_in_place_calls: whether the in-place path ran */

#define MAX_RANKS 8

typedef struct world_s world_t;

typedef struct {
    world_t *w;
    int rank;
    dl_coll_options_t o;
    int create_rc, body_rc;
    char err[512];
    dl_coll_group_t *g;
    void *out; /* what the body leaves for the main thread to compare */
    size_t out_bytes;
    double elapsed;
    long differ; /* body_rank_order under DL_COLL_ORDER_ANY: elements unlike the loop's */
} rank_t;

/* body returns 0 or a count of wrong results / a negative error */
typedef int (*body_fn)(rank_t *r, void *arg);

struct world_s {
    int n;
    rank_t ranks[MAX_RANKS];
    body_fn body;
    void *arg;
    int start_delay_ms[MAX_RANKS];
    _Atomic int counter;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* hosts: NULL = all on one host; else hosts[r] names rank r's host. */
static void world_init(world_t *w, int n, dl_coll_transport_t tr, const char *const *hosts)
{
    memset(w, 0, sizeof(*w));
    w->n = n;
    int port = harness_free_port();
    ck_assert_int_gt(port, 0);
    for (int r = 0; r < n; r++) {
        dl_coll_options_t *o = &w->ranks[r].o;
        dl_coll_options_init(o);
        o->rank = r;
        o->world_size = n;
        snprintf(o->master_addr, sizeof(o->master_addr), "127.0.0.1");
        o->master_port = port;
        snprintf(o->run_id, sizeof(o->run_id), "test-group");
        snprintf(o->host_id, sizeof(o->host_id), "%s", hosts != NULL ? hosts[r] : "one");
        o->transport = tr;
        o->timeout_ms = 10000;
        /* Tiny rounds: a few thousand elements exercise every pipelining path. */
        o->shm_chunk_bytes = 4096;
        o->tcp_chunk_bytes = 4096;
        o->shm_small_bytes = 256;
        o->tcp_small_bytes = 256;
        w->ranks[r].w = w;
        w->ranks[r].rank = r;
    }
}

static void *rank_main(void *p)
{
    rank_t *r = p;
    world_t *w = r->w;
    if (w->start_delay_ms[r->rank] > 0) {
        struct timespec ts = {w->start_delay_ms[r->rank] / 1000,
                              (w->start_delay_ms[r->rank] % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    double t0 = now_s();
    r->create_rc = dl_coll_group_create(&r->o, &r->g, r->err, sizeof(r->err));
    if (r->create_rc == 0 && w->body != NULL)
        r->body_rc = w->body(r, w->arg);
    r->elapsed = now_s() - t0;
    /* A broken group's message wins; otherwise the body's own, if it left one. */
    if (r->g != NULL && r->body_rc != 0 && dl_coll_group_error(r->g)[0] != '\0')
        snprintf(r->err, sizeof(r->err), "%s", dl_coll_group_error(r->g));
    dl_coll_group_destroy(r->g);
    r->g = NULL;
    return NULL;
}

static void world_run(world_t *w, body_fn body, void *arg)
{
    pthread_t th[MAX_RANKS];
    w->body = body;
    w->arg = arg;
    for (int r = 0; r < w->n; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &w->ranks[r]), 0);
    for (int r = 0; r < w->n; r++)
        pthread_join(th[r], NULL);
}

/* Every rank created its group, ran the body without a wrong result, and left the same bytes. */
static void world_check(world_t *w)
{
    /* Every rank's complaint, not only the first: the first is often an echo of another's. */
    for (int r = 0; r < w->n; r++)
        if (w->ranks[r].create_rc != 0 || w->ranks[r].body_rc != 0)
            fprintf(stderr, "world %d, rank %d: %d: %s\n", w->n, r,
                    w->ranks[r].create_rc != 0 ? w->ranks[r].create_rc : w->ranks[r].body_rc,
                    w->ranks[r].err);
    for (int r = 0; r < w->n; r++) {
        ck_assert_msg(w->ranks[r].create_rc == 0, "world %d, rank %d: create: %s", w->n, r,
                      w->ranks[r].err);
        ck_assert_msg(w->ranks[r].body_rc == 0, "world %d, rank %d: body returned %d: %s", w->n, r,
                      w->ranks[r].body_rc, w->ranks[r].err);
    }
    for (int r = 1; r < w->n; r++) {
        ck_assert_uint_eq(w->ranks[r].out_bytes, w->ranks[0].out_bytes);
        if (w->ranks[0].out_bytes > 0)
            ck_assert_msg(memcmp(w->ranks[r].out, w->ranks[0].out, w->ranks[0].out_bytes) == 0,
                          "world %d: rank %d's results differ from rank 0's", w->n, r);
    }
    for (int r = 0; r < w->n; r++)
        free(w->ranks[r].out);
}

/* ---- values ---------------------------------------------------------------------------------- */

/* Small integers: sums are exact in any order, so floats compare exactly too. */
static long long val(int rank, size_t i, int salt)
{
    return (long long)((i * 7 + (size_t)rank * 13 + (size_t)salt * 5) % 23) - 11;
}

static void put(void *buf, size_t i, dl_coll_dtype_t t, long long v)
{
    switch (t) {
    case DL_COLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DL_COLL_FLOAT64: ((double *)buf)[i] = (double)v; break;
    case DL_COLL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DL_COLL_INT64: ((int64_t *)buf)[i] = v; break;
    }
}

static double get(const void *buf, size_t i, dl_coll_dtype_t t)
{
    switch (t) {
    case DL_COLL_FLOAT32: return ((const float *)buf)[i];
    case DL_COLL_FLOAT64: return ((const double *)buf)[i];
    case DL_COLL_INT32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}

static double reference(int n, size_t i, int salt, dl_coll_dtype_t t, dl_coll_op_t op)
{
    long long acc = val(0, i, salt);
    for (int r = 1; r < n; r++) {
        long long v = val(r, i, salt);
        acc = op == DL_COLL_MIN   ? (v < acc ? v : acc)
              : op == DL_COLL_MAX ? (v > acc ? v : acc)
                                  : acc + v;
    }
    if (op != DL_COLL_AVG)
        return (double)acc;
    if (t == DL_COLL_INT32 || t == DL_COLL_INT64)
        return (double)(acc / n);
    return t == DL_COLL_FLOAT32 ? (double)((float)acc / (float)n) : (double)acc / n;
}

/* val() repeats every VAL_PERIOD elements (it depends on i through i * 7 % 23), and so does the
 * reference: one period's table checks the 8M-element cases without a fold over the ranks for
 * each element, which cost more than the all-reduces themselves. */
#define VAL_PERIOD 23

static void reference_table(int n, int salt, dl_coll_dtype_t t, dl_coll_op_t op,
                            double want[VAL_PERIOD])
{
    for (size_t i = 0; i < VAL_PERIOD; i++)
        want[i] = reference(n, i, salt, t, op);
}

/* ---- bodies ---------------------------------------------------------------------------------- */

static const size_t sizes[] = {0, 1, 2, 5, 63, 1000, 4099};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Keeps a copy of a result for the cross-rank comparison. */
static void keep(rank_t *r, const void *buf, size_t bytes)
{
    r->out = realloc(r->out, r->out_bytes + bytes + 1);
    memcpy((char *)r->out + r->out_bytes, buf, bytes);
    r->out_bytes += bytes;
}

static int body_allreduce(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), bad = 0, salt = 0;
    for (size_t s = 0; s < NSIZES; s++)
        for (int t = 0; t < 4; t++)
            for (int op = 0; op < 4; op++, salt++) {
                size_t count = sizes[s], es = dl_coll_dtype_size(t);
                char *src = malloc(count * es + 1), *dst = malloc(count * es + 1);
                for (size_t i = 0; i < count; i++)
                    put(src, i, t, val(r->rank, i, salt));
                int in_place = salt & 1;
                int rc = dl_coll_allreduce(r->g, src, in_place ? src : dst, count, t, op);
                const char *res = in_place ? src : dst;
                if (rc < 0)
                    return rc;
                double want[VAL_PERIOD];
                reference_table(n, salt, t, op, want);
                for (size_t i = 0; i < count; i++)
                    bad += get(res, i, t) != want[i % VAL_PERIOD];
                keep(r, res, count * es);
                free(src);
                free(dst);
            }
    return bad;
}

static int body_reduce_scatter(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), bad = 0, salt = 100;
    for (size_t s = 0; s < NSIZES; s++)
        for (int t = 0; t < 4; t++)
            for (int op = 0; op < 4; op++, salt++) {
                size_t count = sizes[s], es = dl_coll_dtype_size(t);
                char *src = malloc(count * (size_t)n * es + 1), *dst = malloc(count * es + 1);
                for (size_t i = 0; i < count * (size_t)n; i++)
                    put(src, i, t, val(r->rank, i, salt));
                int rc = dl_coll_reduce_scatter(r->g, src, dst, count, t, op);
                if (rc < 0)
                    return rc;
                double want[VAL_PERIOD];
                reference_table(n, salt, t, op, want);
                for (size_t i = 0; i < count; i++)
                    bad += get(dst, i, t) != want[((size_t)r->rank * count + i) % VAL_PERIOD];
                free(src);
                free(dst);
            }
    return bad;
}

static int body_allgather(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), bad = 0, salt = 200;
    for (size_t s = 0; s < NSIZES; s++)
        for (int t = 0; t < 4; t++, salt++) {
            size_t count = sizes[s], es = dl_coll_dtype_size(t);
            char *dst = malloc(count * (size_t)n * es + 1), *src = malloc(count * es + 1);
            int in_place = salt & 1;
            char *mine = in_place ? dst + (size_t)r->rank * count * es : src;
            for (size_t i = 0; i < count; i++)
                put(mine, i, t, val(r->rank, i, salt));
            int rc = dl_coll_allgather(r->g, mine, dst, count, t);
            if (rc < 0)
                return rc;
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < count; i++)
                    bad += get(dst, (size_t)q * count + i, t) != (double)val(q, i, salt);
            keep(r, dst, count * (size_t)n * es);
            free(dst);
            free(src);
        }
    return bad;
}

static int body_broadcast(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), bad = 0, salt = 300;
    for (size_t s = 0; s < NSIZES; s++)
        for (int root = 0; root < n; root++, salt++) {
            size_t count = sizes[s];
            int64_t *buf = malloc(count * 8 + 1);
            for (size_t i = 0; i < count; i++)
                buf[i] = val(r->rank, i, salt);
            int rc = dl_coll_broadcast(r->g, buf, count, DL_COLL_INT64, root);
            if (rc < 0)
                return rc;
            for (size_t i = 0; i < count; i++)
                bad += buf[i] != val(root, i, salt);
            free(buf);
        }
    return bad;
}

/* Nobody leaves a barrier before everyone has entered it. */
static int body_barrier(rank_t *r, void *arg)
{
    (void)arg;
    world_t *w = r->w;
    int bad = 0;
    for (int k = 1; k <= 5; k++) {
        struct timespec ts = {0, (long)((w->n - r->rank) * 3) * 1000000L};
        nanosleep(&ts, NULL);
        atomic_fetch_add(&w->counter, 1);
        int rc = dl_coll_barrier(r->g);
        if (rc < 0)
            return rc;
        bad += atomic_load(&w->counter) < k * w->n;
        /* A second barrier keeps the next round's increments out of this round's check. */
        rc = dl_coll_barrier(r->g);
        if (rc < 0)
            return rc;
    }
    return bad;
}

/* Asynchronous all-reduces, then a synchronous one: all finish, in order, correctly. */
static int body_async(rank_t *r, void *arg)
{
    (void)arg;
    enum { K = 5, COUNT = 3001 };
    int n = dl_coll_world_size(r->g), bad = 0;
    dl_coll_request_t *req[K];
    float *buf = malloc(sizeof(float) * COUNT * (K + 1));
    for (int k = 0; k <= K; k++)
        for (size_t i = 0; i < COUNT; i++)
            buf[k * COUNT + i] = (float)val(r->rank, i, k);
    for (int k = 0; k < K; k++) {
        int rc =
            dl_coll_allreduce_async(r->g, buf + k * COUNT, buf + k * COUNT, COUNT, DL_COLL_FLOAT32,
                                    k & 1 ? DL_COLL_MAX : DL_COLL_SUM, &req[k]);
        if (rc < 0)
            return rc;
    }
    int rc = dl_coll_allreduce(r->g, buf + K * COUNT, buf + K * COUNT, COUNT, DL_COLL_FLOAT32,
                               DL_COLL_MIN);
    for (int k = 0; k < K; k++) {
        int done = 0;
        dl_coll_test(req[k], &done);
        bad += !done;
        int rk = dl_coll_wait(req[k]);
        if (rk < 0)
            return rk;
    }
    if (rc < 0)
        return rc;
    for (int k = 0; k <= K; k++) {
        dl_coll_op_t op = k == K ? DL_COLL_MIN : k & 1 ? DL_COLL_MAX : DL_COLL_SUM;
        for (size_t i = 0; i < COUNT; i++)
            bad += buf[k * COUNT + i] != reference(n, i, k, DL_COLL_FLOAT32, op);
    }
    keep(r, buf, sizeof(float) * COUNT * (K + 1));
    free(buf);
    return bad;
}

/* Buffers in dl_coll_mem_alloc memory, or not, in every combination: results must not depend on
 * it, and two ranks on one host read each other's input in place exactly when both send from
 * shared blocks (and, if an output lies over its input, both outputs lie in them too). */
enum { REG_COUNT = 4099 };

/* dst NULL: a private output. */
static int registered_case(rank_t *r, char *src, char *dst, int expect_in_place, int salt,
                           uint64_t *calls, int *bad)
{
    int n = dl_coll_world_size(r->g);
    for (int t = 0; t < 4; t++) {
        size_t es = dl_coll_dtype_size(t);
        char *priv = malloc(REG_COUNT * es), *out = dst != NULL ? dst : priv;
        dl_coll_op_t op = t & 1 ? DL_COLL_MAX : DL_COLL_SUM;
        for (size_t i = 0; i < REG_COUNT; i++)
            put(src, i, t, val(r->rank, i, salt + t));
        int rc = dl_coll_allreduce(r->g, src, out, REG_COUNT, t, op);
        double want[VAL_PERIOD];
        reference_table(n, salt + t, t, op, want);
        for (size_t i = 0; rc == 0 && i < REG_COUNT; i++)
            *bad += get(out, i, t) != want[i % VAL_PERIOD];
        if (rc == 0)
            keep(r, out, REG_COUNT * es);
        free(priv);
        if (rc < 0)
            return rc;
        uint64_t now = dl__coll_shm_in_place_calls(r->g->shm);
        if (now - *calls != (uint64_t)expect_in_place) {
            snprintf(r->err, sizeof(r->err), "salt %d, %s: %llu in-place calls, expected %d", salt,
                     dl_coll_dtype_name(t), (unsigned long long)(now - *calls), expect_in_place);
            (*bad)++;
        }
        *calls = now;
    }
    return 0;
}

static int body_registered(rank_t *r, void *arg)
{
    const dl_coll_algo_t *algo = arg;
    int n = dl_coll_world_size(r->g), bad = 0, rc;
    size_t bytes = REG_COUNT * 8 + 256;
    char err[256];
    void *a = NULL, *b = NULL, *c = NULL, *none = NULL;
    if (dl_coll_mem_alloc(r->g, 0, &none, err, sizeof(err)) != -EINVAL || none != NULL)
        return 1;
    /* Sizes differ by rank: each maps the others' blocks at their own length. */
    rc = dl_coll_mem_alloc(r->g, bytes + (size_t)r->rank * 4096, &a, err, sizeof(err));
    if (rc == 0)
        rc = dl_coll_mem_alloc(r->g, bytes, &b, err, sizeof(err));
    if (rc < 0) {
        snprintf(r->err, sizeof(r->err), "%s", err);
        return rc;
    }
    /* The pair path reads in place: one shared-memory host of two, not forced to slicing. */
    int pair = r->g->shm != NULL && r->g->nhosts == 1 && n == 2 && *algo != DL_COLL_ALGO_BANDWIDTH;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    char *priv = malloc(bytes), *off = (char *)a + 64 * (size_t)r->rank;
    char *pa = a, *pb = b;
    rc = registered_case(r, pa, NULL, pair, 0, &calls, &bad);
    if (rc == 0) /* different offsets of one allocation */
        rc = registered_case(r, off, NULL, pair, 10, &calls, &bad);
    if (rc == 0) /* only rank 0 registered */
        rc = registered_case(r, r->rank == 0 ? pa : priv, NULL, 0, 20, &calls, &bad);
    if (rc == 0) /* two allocations: each maps both, so in place too */
        rc = registered_case(r, r->rank == 0 ? pa : pb, NULL, pair, 30, &calls, &bad);
    if (rc == 0) /* outputs over inputs, all shared: halves */
        rc = registered_case(r, pa, pa, pair, 40, &calls, &bad);
    if (rc == 0) /* inputs and outputs shared, apart: halves */
        rc = registered_case(r, pa, pb, pair, 50, &calls, &bad);
    if (rc == 0) /* output over input on rank 0 only: the other's output is private */
        rc = registered_case(r, pa, r->rank == 0 ? pa : NULL, 0, 60, &calls, &bad);
    if (rc == 0) /* outputs shared on rank 0 only, apart from the inputs: whole */
        rc = registered_case(r, pa, r->rank == 0 ? pb : NULL, pair, 70, &calls, &bad);
    /* Freed and allocated again: the new allocation is shared as well. */
    dl_coll_mem_free(r->g, a);
    if (rc == 0)
        rc = dl_coll_mem_alloc(r->g, bytes, &c, err, sizeof(err));
    if (rc == 0)
        rc = registered_case(r, c, NULL, pair, 80, &calls, &bad);
    else
        snprintf(r->err, sizeof(r->err), "%s", err);
    free(priv);
    dl_coll_mem_free(r->g, b);
    dl_coll_mem_free(r->g, c);
    return rc < 0 ? rc : bad;
}

/* One rank asks for more than it can map: every rank of its host fails the allocation, with the
 * cause named, and the group keeps working. */
static int body_registered_refused(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), bad = 0;
    size_t huge = (size_t)1 << 60, bytes = r->rank == n - 1 ? huge : 4096;
    void *p = NULL;
    char err[256] = "";
    int rc = dl_coll_mem_alloc(r->g, bytes, &p, err, sizeof(err));
    /* Ranks sharing a host with the greedy one (or the greedy one) must fail; TCP-only ranks
     * allocate alone. */
    int fails = r->rank == n - 1 || (r->g->shm != NULL && r->g->host == r->g->host_of[n - 1]);
    if (fails ? rc >= 0 || p != NULL || err[0] == '\0' : rc < 0) {
        snprintf(r->err, sizeof(r->err), "rank %d: rc %d, err '%s'", r->rank, rc, err);
        bad++;
    }
    if (r->rank == n - 1 && strstr(err, "mmap") == NULL) {
        snprintf(r->err, sizeof(r->err), "the greedy rank's error names no mmap: '%s'", err);
        bad++;
    }
    if (r->rank != n - 1 && fails && strstr(err, "could not") == NULL) {
        snprintf(r->err, sizeof(r->err), "rank %d's error names no culprit: '%s'", r->rank, err);
        bad++;
    }
    dl_coll_mem_free(r->g, p);
    int v = r->rank, sum = 0;
    rc = dl_coll_allreduce(r->g, &v, &sum, 1, DL_COLL_INT32, DL_COLL_SUM);
    if (rc < 0)
        return rc;
    return bad + (sum != n * (n - 1) / 2);
}

/* ---- the matrix ------------------------------------------------------------------------------ */

static const char *const split2[] = {"a", "b", "a", "b", "a", "b", "a", "b"};
static const char *const split3[] = {"x", "x", "y", "z", "y", "x", "z", "y"};

/* Hosts of consecutive ranks, as dlaunch lays them out: two of two (and a fifth alone), and
 * three, one, four. */
static const char *const blocks2[] = {"a", "a", "b", "b", "c", "c", "d", "d"};
static const char *const blocks3[] = {"p", "p", "p", "q", "r", "r", "r", "r"};

typedef struct {
    dl_coll_transport_t tr;
    const char *const *hosts;
    dl_coll_algo_t algo;
    dl_coll_order_t order;
} setup_t;

static const setup_t setups[] = {
    {DL_COLL_TRANSPORT_SHM, NULL, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_TCP, NULL, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_AUTO, split2, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_AUTO, split3, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_AUTO, blocks2, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_AUTO, blocks3, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_SHM, NULL, DL_COLL_ALGO_LATENCY, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_TCP, NULL, DL_COLL_ALGO_LATENCY, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_SHM, NULL, DL_COLL_ALGO_BANDWIDTH, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_TCP, NULL, DL_COLL_ALGO_BANDWIDTH, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_AUTO, blocks2, DL_COLL_ALGO_BANDWIDTH, DL_COLL_ORDER_RANK},
    {DL_COLL_TRANSPORT_TCP, NULL, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_ANY},
    {DL_COLL_TRANSPORT_AUTO, split2, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_ANY},
    {DL_COLL_TRANSPORT_AUTO, blocks2, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_ANY},
};
#define NSETUPS (int)(sizeof(setups) / sizeof(setups[0]))

/* ---- the order of reduction ------------------------------------------------------------------ */

/* Values whose float sums depend on the order they are added in: magnitudes from 2^-12 to 2^12,
 * both signs, and for MIN and MAX signed zeros and NaNs, where `a < b ? a : b` keeps one operand
 * or the other by position. */
static double order_val(int rank, size_t i, int salt, dl_coll_op_t op)
{
    uint64_t h = (uint64_t)rank * 0x9e3779b97f4a7c15ull ^
                 (uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)salt * 0x94d049bb133111ebull;
    h ^= h >> 31;
    h *= 0xd6e8feb86659fd39ull;
    h ^= h >> 29;
    if ((op == DL_COLL_MIN || op == DL_COLL_MAX) && h % 7 == 0)
        return h % 3 == 0 ? -0.0 : h % 3 == 1 ? 0.0 : NAN;
    double m = 1.0 + (double)(h >> 40) / (double)(1u << 24);
    return ldexp(h & 1 ? -m : m, (int)((h >> 8) % 25) - 12);
}

/* What a loop over ranks 0..n-1 computes, in the element's own type. */
static void order_reference(int n, size_t count, int salt, dl_coll_dtype_t t, dl_coll_op_t op,
                            void *out)
{
    for (size_t i = 0; i < count; i++) {
        if (t == DL_COLL_FLOAT32) {
            float acc = (float)order_val(0, i, salt, op);
            for (int r = 1; r < n; r++) {
                float v = (float)order_val(r, i, salt, op);
                acc = op == DL_COLL_MIN   ? (acc < v ? acc : v)
                      : op == DL_COLL_MAX ? (acc > v ? acc : v)
                                          : acc + v;
            }
            ((float *)out)[i] = op == DL_COLL_AVG ? acc / (float)n : acc;
        } else {
            double acc = order_val(0, i, salt, op);
            for (int r = 1; r < n; r++) {
                double v = order_val(r, i, salt, op);
                acc = op == DL_COLL_MIN   ? (acc < v ? acc : v)
                      : op == DL_COLL_MAX ? (acc > v ? acc : v)
                                          : acc + v;
            }
            ((double *)out)[i] = op == DL_COLL_AVG ? acc / n : acc;
        }
    }
}

/* Sizes that take every path: one element, the small-message forms, several pipeline pieces. */
static const size_t order_sizes[] = {1, 5, 63, 1000, 4099};

/* Every all-reduce (and reduce-scatter) gives, bit for bit, the serial fold in rank order. arg:
 * the setup; with DL_COLL_ORDER_ANY the body counts the differences instead, and leaves them in
 * r->out for the caller. */
static int body_rank_order(rank_t *r, void *arg)
{
    const setup_t *st = arg;
    int n = dl_coll_world_size(r->g), salt = 500, bad = 0;
    long differ = 0;
    static const dl_coll_op_t ops[] = {DL_COLL_SUM, DL_COLL_AVG, DL_COLL_MIN, DL_COLL_MAX};
    for (size_t s = 0; s < sizeof(order_sizes) / sizeof(order_sizes[0]); s++)
        for (int t = DL_COLL_FLOAT32; t <= DL_COLL_FLOAT64; t++)
            for (int o = 0; o < 4; o++, salt++) {
                size_t count = order_sizes[s], es = dl_coll_dtype_size(t);
                dl_coll_op_t op = ops[o];
                char *src = malloc(count * (size_t)n * es), *dst = malloc(count * (size_t)n * es);
                char *want = malloc(count * (size_t)n * es);
                for (size_t i = 0; i < count * (size_t)n; i++) {
                    double v = order_val(r->rank, i, salt, op);
                    if (t == DL_COLL_FLOAT32)
                        ((float *)src)[i] = (float)v;
                    else
                        ((double *)src)[i] = v;
                }
                order_reference(n, count * (size_t)n, salt, t, op, want);
                int in_place = salt & 1;
                int rc =
                    dl_coll_allreduce(r->g, src, in_place ? src : dst, count * (size_t)n, t, op);
                const char *res = in_place ? src : dst;
                long d = 0;
                for (size_t i = 0; rc == 0 && i < count * (size_t)n; i++)
                    d += memcmp(res + i * es, want + i * es, es) != 0;
                if (d > 0 && st->order == DL_COLL_ORDER_RANK && bad == 0)
                    snprintf(r->err, sizeof(r->err),
                             "all-reduce %s %s of %zu: %ld of the elements differ from the "
                             "rank-order fold",
                             dl_coll_dtype_name(t), dl_coll_op_name(op), count * (size_t)n, d);
                differ += d;
                if (rc == 0) {
                    keep(r, res, count * (size_t)n * es);
                    /* The reduce-scatter of the same inputs: this rank's block of the same. */
                    for (size_t i = 0; i < count * (size_t)n; i++)
                        if (t == DL_COLL_FLOAT32)
                            ((float *)src)[i] = (float)order_val(r->rank, i, salt, op);
                        else
                            ((double *)src)[i] = order_val(r->rank, i, salt, op);
                    rc = dl_coll_reduce_scatter(r->g, src, dst, count, t, op);
                }
                d = 0;
                for (size_t i = 0; rc == 0 && i < count; i++)
                    d += memcmp(dst + i * es, want + ((size_t)r->rank * count + i) * es, es) != 0;
                if (d > 0 && st->order == DL_COLL_ORDER_RANK && bad == 0)
                    snprintf(r->err, sizeof(r->err),
                             "reduce-scatter %s %s of %zu: %ld of the elements differ from the "
                             "rank-order fold",
                             dl_coll_dtype_name(t), dl_coll_op_name(op), count, d);
                differ += d;
                if (st->order == DL_COLL_ORDER_RANK)
                    bad += differ > 0;
                free(src);
                free(dst);
                free(want);
                if (rc < 0)
                    return rc;
            }
    if (st->order == DL_COLL_ORDER_ANY) {
        r->differ = differ;
        return 0;
    }
    return bad;
}

/* One setup (_i), every world size from 1 to max_n. */
static void matrix(int i, int max_n, body_fn body)
{
    const setup_t *s = &setups[i];
    for (int n = 1; n <= max_n; n++) {
        world_t w;
        world_init(&w, n, s->tr, s->hosts);
        for (int r = 0; r < n; r++) {
            w.ranks[r].o.algo = s->algo;
            w.ranks[r].o.order = s->order;
        }
        world_run(&w, body, (void *)s);
        world_check(&w);
    }
}

/* Buffers read in place (dl_coll_mem_alloc's, and ordinary ones adopted on first use), the
 * matrix of one test per setup over world sizes from 1, the bootstrap, and recovery. */
DL_TEST_CASE(inplace_tests, .timeout = 120);
DL_TEST_CASE(matrix_tests, .timeout = 120);
DL_TEST_CASE(bootstrap_tests, .timeout = 30);
DL_TEST_CASE(recovery_tests, .timeout = 60);

DL_TEST_LOOP_IN(matrix_tests, allreduce_matrix, 0, NSETUPS)
{
    matrix(_i, 5, body_allreduce);
}

/* The promise of docs/collective.md: whatever the transport, algorithm and layout, bits equal to
 * a loop over the ranks. */
DL_TEST_LOOP_IN(matrix_tests, rank_order_matrix, 0, NSETUPS)
{
    if (setups[_i].order == DL_COLL_ORDER_RANK)
        matrix(_i, 5, body_rank_order);
}

/* The values do tell orders apart: across hosts, any order gives other bits than the loop's. */
DL_TEST_LOOP_IN(matrix_tests, any_order_is_not_rank_order_across_hosts, 0, 2)
{
    static const setup_t any[] = {
        {DL_COLL_TRANSPORT_TCP, NULL, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_ANY},
        {DL_COLL_TRANSPORT_AUTO, blocks2, DL_COLL_ALGO_AUTO, DL_COLL_ORDER_ANY},
    };
    world_t w;
    world_init(&w, 4, any[_i].tr, any[_i].hosts);
    for (int r = 0; r < 4; r++)
        w.ranks[r].o.order = DL_COLL_ORDER_ANY;
    world_run(&w, body_rank_order, (void *)&any[_i]);
    long differ = w.ranks[0].differ;
    world_check(&w);
    ck_assert_msg(differ > 0, "order any gave the loop's bits everywhere");
}

DL_TEST_LOOP_IN(matrix_tests, reduce_scatter_matrix, 0, NSETUPS)
{
    matrix(_i, 4, body_reduce_scatter);
}

DL_TEST_LOOP_IN(matrix_tests, allgather_matrix, 0, NSETUPS)
{
    matrix(_i, 4, body_allgather);
}

DL_TEST_LOOP_IN(matrix_tests, broadcast_matrix, 0, NSETUPS)
{
    matrix(_i, 3, body_broadcast);
}

DL_TEST_LOOP_IN(matrix_tests, barrier_matrix, 0, NSETUPS)
{
    matrix(_i, 3, body_barrier);
}

DL_TEST_LOOP_IN(matrix_tests, async_matrix, 0, NSETUPS)
{
    matrix(_i, 3, body_async);
}

DL_TEST_LOOP_IN(inplace_tests, registered_refused_matrix, 0, NSETUPS)
{
    matrix(_i, 3, body_registered_refused);
}

DL_TEST_LOOP_IN(inplace_tests, registered_matrix, 0, NSETUPS)
{
    const setup_t *s = &setups[_i];
    for (int n = 1; n <= 4; n++) {
        world_t w;
        world_init(&w, n, s->tr, s->hosts);
        for (int r = 0; r < n; r++) {
            w.ranks[r].o.algo = s->algo;
            w.ranks[r].o.order = s->order;
            /* Its private buffers are the copied kind (adoption: adopted_matrix). */
            w.ranks[r].o.adopt_min_bytes = 0;
        }
        world_run(&w, body_registered, (void *)&s->algo);
        world_check(&w);
    }
}

/* ---- ordinary buffers adopted on first use --------------------------------------------------- */

/* One all-reduce of count elements of type t from src into dst (src itself: in place), checked
 * against the reference; *calls tracks the in-place counter, which must have moved by expect. */
static int adopted_case(rank_t *r, char *src, char *dst, size_t count, dl_coll_dtype_t t,
                        dl_coll_op_t op, int expect, int salt, uint64_t *calls, int *bad)
{
    int n = dl_coll_world_size(r->g);
    size_t wrong = 0;
    long long mine[VAL_PERIOD];
    for (size_t i = 0; i < VAL_PERIOD; i++)
        mine[i] = val(r->rank, i, salt);
    for (size_t i = 0; i < count; i++)
        put(src, i, t, mine[i % VAL_PERIOD]);
    int rc = dl_coll_allreduce(r->g, src, dst, count, t, op);
    double want[VAL_PERIOD];
    reference_table(n, salt, t, op, want);
    for (size_t i = 0; rc == 0 && i < count; i++)
        wrong += get(dst, i, t) != want[i % VAL_PERIOD];
    if (rc < 0)
        return rc;
    if (wrong > 0) {
        snprintf(r->err, sizeof(r->err), "salt %d, %zu %s: %zu wrong elements", salt, count,
                 dl_coll_dtype_name(t), wrong);
        (*bad)++;
    }
    keep(r, dst, 64);
    uint64_t now = dl__coll_shm_in_place_calls(r->g->shm);
    if (now - *calls != (uint64_t)expect) {
        snprintf(r->err, sizeof(r->err), "salt %d, %zu %s: %llu in-place calls, expected %d", salt,
                 count, dl_coll_dtype_name(t), (unsigned long long)(now - *calls), expect);
        (*bad)++;
    }
    *calls = now;
    return 0;
}

/* Sizes from a few pages to 32 MiB and beyond (the halves form), odd counts, buffers at odd
 * offsets from their pages, in and out of place, every type; the same buffers again; a buffer
 * unmapped and mapped anew at the same address (the adoption must be noticed gone, or the peer
 * would read the old pages); memory that cannot be adopted (shared, so the fallback is taken and
 * said); and a fork, whose child must not write into the parent's adopted pages. */
static int body_adopted(rank_t *r, void *arg)
{
    const dl_coll_algo_t *algo = arg;
    int n = dl_coll_world_size(r->g), bad = 0, rc = 0;
    int pair = r->g->shm != NULL && r->g->nhosts == 1 && n == 2 && *algo != DL_COLL_ALGO_BANDWIDTH;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    static const size_t counts[] = {5003, 65537, 300007};
    int salt = 100;
    for (size_t c = 0; c < 3 && rc == 0; c++) {
        size_t count = counts[c], misalign = 8 * (size_t)(r->rank + 1);
        char *a = malloc(count * 8 + 64), *b = malloc(count * 8 + 64);
        char *src = a + misalign, *dst = b + 8;
        for (int t = 0; t < 4 && rc == 0; t++) {
            dl_coll_op_t op = t & 1 ? DL_COLL_MAX : DL_COLL_SUM;
            rc = adopted_case(r, src, dst, count, t, op, pair, salt++, &calls, &bad);
            if (rc == 0) /* in place: the halves form */
                rc = adopted_case(r, src, src, count, t, DL_COLL_MIN, pair, salt++, &calls, &bad);
            if (rc == 0) /* the same buffers again: the adoption is found */
                rc = adopted_case(r, src, dst, count, t, DL_COLL_AVG, pair, salt++, &calls, &bad);
        }
        free(a);
        free(b);
    }
    /* Beyond 32 MiB apart: both outputs adopted too, the halves form. */
    size_t big = (32u << 20) / 4 + 3;
    char *ba = malloc(big * 4 + 64), *bb = malloc(big * 4 + 64);
    if (rc == 0 && ba != NULL && bb != NULL)
        rc = adopted_case(r, ba + 4, bb + 12, big, DL_COLL_FLOAT32, DL_COLL_SUM, pair, salt++,
                          &calls, &bad);
    free(ba);
    free(bb);
    /* Unmapped and mapped anew: same place, new pages. */
    size_t mlen = 256 << 10, mcount = (mlen - 64) / 8;
    char *m1 = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *out = malloc(mlen);
    if (rc == 0 && m1 != MAP_FAILED)
        rc = adopted_case(r, m1 + 16, out, mcount, DL_COLL_INT64, DL_COLL_SUM, pair, salt++, &calls,
                          &bad);
    if (m1 != MAP_FAILED)
        munmap(m1, mlen);
    char *m2 = mmap(m1, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rc == 0 && m2 != MAP_FAILED)
        rc = adopted_case(r, m2 + 16, out, mcount, DL_COLL_INT64, DL_COLL_SUM, pair, salt++, &calls,
                          &bad);
    /* fork: the child's writes stay its own. */
    if (rc == 0 && m2 != MAP_FAILED && pair) {
        long long before = ((long long *)(m2 + 16))[1000];
        pid_t pid = fork();
        if (pid == 0) {
            memset(m2, 0x5a, mlen);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (((long long *)(m2 + 16))[1000] != before) {
            snprintf(r->err, sizeof(r->err), "a forked child wrote into the parent's buffer");
            bad++;
        }
    }
    if (m2 != MAP_FAILED)
        munmap(m2, mlen);
    /* Not adoptable on rank 0 (a shared mapping): both copy, and rank 0 says why. */
    char *sh = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *priv = malloc(mlen);
    if (rc == 0 && sh != MAP_FAILED && priv != NULL)
        rc = adopted_case(r, r->rank == 0 ? sh : priv, out, mcount, DL_COLL_FLOAT64, DL_COLL_SUM, 0,
                          salt++, &calls, &bad);
    if (rc == 0 && pair && r->rank == 0 &&
        strstr(dl__coll_shm_note(r->g->shm), "not private anonymous") == NULL) {
        snprintf(r->err, sizeof(r->err), "the fallback was not said: '%s'",
                 dl__coll_shm_note(r->g->shm));
        bad++;
    }
    if (sh != MAP_FAILED)
        munmap(sh, mlen);
    free(priv);
    free(out);
    return rc < 0 ? rc : bad;
}

/* With adoption off, the same buffers copy through the segment. */
static int body_adopt_off(rank_t *r, void *arg)
{
    (void)arg;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    int bad = 0;
    size_t count = 300007;
    char *a = malloc(count * 8 + 64), *b = malloc(count * 8 + 64);
    int rc = adopted_case(r, a + 8, b, count, DL_COLL_FLOAT64, DL_COLL_SUM, 0, 7, &calls, &bad);
    if (rc == 0)
        rc = adopted_case(r, a + 8, a + 8, count, DL_COLL_INT32, DL_COLL_SUM, 0, 8, &calls, &bad);
    free(a);
    free(b);
    return rc < 0 ? rc : bad;
}

DL_TEST_LOOP_IN(inplace_tests, adopted_matrix, 0, 3)
{
    /* Shared memory (the pair path at 2), slices forced, and hosts of two ranks. */
    static const int which[] = {0, 8, 4};
    const setup_t *s = &setups[which[_i]];
    for (int n = 1; n <= 4; n++) {
        world_t w;
        world_init(&w, n, s->tr, s->hosts);
        for (int r = 0; r < n; r++) {
            w.ranks[r].o.algo = s->algo;
            w.ranks[r].o.order = s->order;
            w.ranks[r].o.adopt_min_bytes = 16 << 10;
        }
        world_run(&w, body_adopted, (void *)&s->algo);
        world_check(&w);
    }
}

DL_TEST_IN(inplace_tests, adopt_off_copies)
{
    world_t w;
    world_init(&w, 2, DL_COLL_TRANSPORT_SHM, NULL);
    for (int r = 0; r < 2; r++)
        w.ranks[r].o.adopt_min_bytes = 0;
    world_run(&w, body_adopt_off, NULL);
    world_check(&w);
}

/* ---- the two-rank switch to the pair form ---------------------------------------------------- */

/* With the default switch points, two ranks on a host reduce up to 4 KiB through one round of
 * the segment and beyond it in the pair form, which reads registered buffers in place at any
 * size (below a chunk too); sums must be right on both sides of it, for either kind of memory. */
static int body_pair_switch(rank_t *r, void *arg)
{
    (void)arg;
    static const size_t counts[] = {1023, 1024, 1025, 2048, 131072, 131073};
    size_t most = 131073 * sizeof(float) + 64;
    int bad = 0, rc = 0, salt = 0;
    char err[256];
    void *ra = NULL, *rb = NULL;
    char *ma = malloc(most), *mb = malloc(most);
    if (ma == NULL || mb == NULL || dl_coll_mem_alloc(r->g, most, &ra, err, sizeof(err)) < 0 ||
        dl_coll_mem_alloc(r->g, most, &rb, err, sizeof(err)) < 0) {
        snprintf(r->err, sizeof(r->err), "buffers: %s",
                 ma == NULL || mb == NULL ? "no memory" : err);
        rc = -ENOMEM;
    }
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    /* kind 0: malloc'd, 16 bytes past a line as malloc's own; 1: registered, apart; 2:
     * registered, the output over the input. */
    for (int kind = 0; kind < 3 && rc == 0; kind++) {
        char *src = kind == 0 ? ma + 16 : ra, *dst = kind == 0 ? mb + 16 : kind == 1 ? rb : ra;
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && rc == 0; c++, salt++) {
            size_t count = counts[c], bytes = count * sizeof(float);
            dl_coll_rec_algo_t want_algo =
                bytes <= 4096 ? DL_COLL_REC_ALGO_SHM_SMALL : DL_COLL_REC_ALGO_SHM_PAIR;
            dl_coll_rec_algo_t algo = dl__coll_shm_allreduce_algo(r->g->shm, bytes, 0);
            if (algo != want_algo) {
                snprintf(r->err, sizeof(r->err), "%zu bytes: algorithm %d, expected %d", bytes,
                         (int)algo, (int)want_algo);
                bad++;
            }
            for (size_t i = 0; i < count; i++)
                put(src, i, DL_COLL_FLOAT32, val(r->rank, i, salt));
            rc = dl_coll_allreduce(r->g, src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM);
            double want[VAL_PERIOD];
            reference_table(2, salt, DL_COLL_FLOAT32, DL_COLL_SUM, want);
            size_t wrong = 0;
            for (size_t i = 0; rc == 0 && i < count; i++)
                wrong += get(dst, i, DL_COLL_FLOAT32) != want[i % VAL_PERIOD];
            if (wrong > 0) {
                snprintf(r->err, sizeof(r->err), "kind %d, %zu bytes: %zu wrong sums", kind, bytes,
                         wrong);
                bad++;
            }
            if (rc == 0)
                keep(r, dst, bytes);
            uint64_t now = dl__coll_shm_in_place_calls(r->g->shm);
            dl_coll_options_t defaults;
            dl_coll_options_init(&defaults);
            uint64_t want_in_place = kind > 0 ? bytes > 4096 : bytes >= defaults.adopt_min_bytes;
            if (rc == 0 && now - calls != want_in_place) {
                snprintf(r->err, sizeof(r->err),
                         "kind %d, %zu bytes: %llu in-place calls, "
                         "expected %llu",
                         kind, bytes, (unsigned long long)(now - calls),
                         (unsigned long long)want_in_place);
                bad++;
            }
            calls = now;
        }
    }
    free(ma);
    free(mb);
    dl_coll_mem_free(r->g, ra);
    dl_coll_mem_free(r->g, rb);
    return rc < 0 ? rc : bad;
}

/* Two ranks over shared memory with the library's own chunk and switch sizes (world_init sets
 * smaller ones), where what a test checks is the defaults' forms. */
static void init_two_at_default_sizes(world_t *w)
{
    world_init(w, 2, DL_COLL_TRANSPORT_SHM, NULL);
    for (int r = 0; r < 2; r++) {
        dl_coll_options_t defaults;
        dl_coll_options_init(&defaults);
        w->ranks[r].o.shm_chunk_bytes = defaults.shm_chunk_bytes;
        w->ranks[r].o.shm_small_bytes = defaults.shm_small_bytes;
    }
}

static void run_two_at_default_sizes(body_fn body)
{
    world_t w;
    init_two_at_default_sizes(&w);
    world_run(&w, body, NULL);
    world_check(&w);
}

DL_TEST_IN(inplace_tests, two_ranks_take_the_pair_form_beyond_4k)
{
    run_two_at_default_sizes(body_pair_switch);
}

/* With the default options two ranks' one-round all-reduce copies in halves from 2 KiB (the
 * other reads the first while the second is copied): exact sums for every type, counts whose
 * halves differ, in and out of place, call after call (the slots and the counters reused), and
 * just below 2 KiB the whole copy as before. */
static int body_halves(rank_t *r, void *arg)
{
    (void)arg;
    static const size_t lens[] = {2040, 2048, 2056, 3000, 4088, 4096};
    char *a = malloc(4096 + 64), *b = malloc(4096 + 64);
    int bad = 0, rc = a != NULL && b != NULL ? 0 : -ENOMEM, salt = 800;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    for (int t = 0; t <= DL_COLL_INT64 && rc == 0; t++) {
        size_t es = dl_coll_dtype_size((dl_coll_dtype_t)t);
        for (size_t c = 0; c < sizeof(lens) / sizeof(lens[0]) && rc == 0; c++) {
            size_t count = lens[c] / es;
            if (dl__coll_shm_allreduce_algo(r->g->shm, count * es, 0) !=
                DL_COLL_REC_ALGO_SHM_SMALL) {
                snprintf(r->err, sizeof(r->err), "%zu bytes: not the one-round form", count * es);
                bad++;
            }
            for (int call = 0; call < 3 && rc == 0; call++) {
                dl_coll_op_t op = call == 1 ? DL_COLL_MAX : DL_COLL_SUM;
                char *src = a + 16, *dst = call == 2 ? src : b + 8;
                rc = adopted_case(r, src, dst, count, (dl_coll_dtype_t)t, op, 0, salt++, &calls,
                                  &bad);
            }
        }
    }
    free(a);
    free(b);
    return rc < 0 ? rc : bad;
}

DL_TEST_IN(inplace_tests, two_ranks_copy_one_round_in_halves_from_2k)
{
    run_two_at_default_sizes(body_halves);
}

/* ---- a re-used malloc'd buffer ------------------------------------------------------------- */

/* With the default options, two ranks all-reduce the same malloc'd buffers (16 bytes past a line,
 * as malloc's own) three times at sizes around every switch: one round up to 4 KiB, the pair form
 * copying below the adoption's threshold, in place from it (the partial pages at either end
 * carried in the announcement round), up to and past a chunk. The first call of an adoption
 * waits for the other's verdict; the calls after it are read in place without one, and every
 * sum is exact though the inputs change between calls. */
static int body_reused(rank_t *r, void *arg)
{
    (void)arg;
    dl_coll_options_t defaults;
    dl_coll_options_init(&defaults);
    size_t adopt = defaults.adopt_min_bytes, chunk = defaults.shm_chunk_bytes;
    const size_t lens[] = {4096,  4100,         adopt - 4, adopt,        adopt + 4,
                           65536, chunk - 4096, chunk,     chunk + 4096, 4 * chunk + 4};
    /* mmap'd as malloc's large chunks are, so that both ranks' pages lie alike. */
    size_t most = 4 * chunk + 4096 + 64, page = 4096, covered = 0;
    char *a = mmap(NULL, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(NULL, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int bad = 0, rc = a != MAP_FAILED && b != MAP_FAILED ? 0 : -ENOMEM, salt = 300;
    char *src = a + 32, *dst = b + 32;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    for (size_t c = 0; c < sizeof(lens) / sizeof(lens[0]) && rc == 0; c++) {
        size_t bytes = lens[c], count = bytes / sizeof(float);
        /* A size whose whole pages the last adoption covers needs no new one. */
        size_t end = ((uintptr_t)src + bytes) / page * page;
        int adopts = bytes >= adopt && end > covered;
        if (bytes >= adopt)
            covered = end > covered ? end : covered;
        for (int call = 0; call < 3 && rc == 0; call++, salt++) {
            uint64_t verdicts = dl__coll_shm_verdict_rounds(r->g->shm);
            rc = adopted_case(r, src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM, bytes >= adopt,
                              salt, &calls, &bad);
            uint64_t verdict = dl__coll_shm_verdict_rounds(r->g->shm) - verdicts;
            uint64_t want_verdict = call == 0 && adopts;
            if (rc == 0 && verdict != want_verdict) {
                snprintf(r->err, sizeof(r->err),
                         "%zu bytes, call %d: %llu verdict rounds (expected %llu)", bytes, call + 1,
                         (unsigned long long)verdict, (unsigned long long)want_verdict);
                bad++;
            }
        }
    }
    /* The output over the input below a chunk: copied as before, not adopted (the halves form
     * would not read it in place), so no verdict either. */
    for (int call = 0; call < 2 && rc == 0; call++, salt++) {
        uint64_t verdicts = dl__coll_shm_verdict_rounds(r->g->shm);
        rc = adopted_case(r, dst, dst, (64 << 10) / sizeof(float), DL_COLL_FLOAT32, DL_COLL_SUM, 0,
                          salt, &calls, &bad);
        if (rc == 0 && dl__coll_shm_verdict_rounds(r->g->shm) != verdicts) {
            snprintf(r->err, sizeof(r->err), "64 KiB over itself: %llu verdict rounds",
                     (unsigned long long)(dl__coll_shm_verdict_rounds(r->g->shm) - verdicts));
            bad++;
        }
    }
    /* Buffers taken in turn, as a loop over a model's tensors: the one held changes every call,
     * each is mapped once and read in place every time, with its verdict round. */
    enum { NBUF = 12 };
    char *bufs[NBUF] = {0};
    size_t count = (adopt + (8 << 10)) / sizeof(double) + 3;
    for (int i = 0; i < NBUF && rc == 0; i++)
        if ((bufs[i] = malloc(count * sizeof(double) + 64)) == NULL)
            rc = -ENOMEM;
    for (int pass = 0; pass < 2 * NBUF && rc == 0; pass++, salt++)
        rc = adopted_case(r, bufs[pass % NBUF] + 8, dst, count, DL_COLL_FLOAT64, DL_COLL_SUM, 1,
                          salt, &calls, &bad);
    for (int i = 0; i < NBUF; i++)
        free(bufs[i]);
    if (a != MAP_FAILED)
        munmap(a, most);
    if (b != MAP_FAILED)
        munmap(b, most);
    return rc < 0 ? rc : bad;
}

DL_TEST_IN(inplace_tests, reused_malloc_buffer_is_read_in_place_without_verdict)
{
    run_two_at_default_sizes(body_reused);
}

/* With the default options and inputs written anew before every call (as gradients are), a
 * malloc'd buffer under 128 KiB is copied through the segment, which is faster there than
 * reading it in place (64 KiB: 8.1 against 8.9-9.1 us, docs/performance.md), and one of
 * 128 KiB and more is adopted and read in place; the sums are exact either way. */
static int body_adopt_threshold(rank_t *r, void *arg)
{
    (void)arg;
    const size_t lens[] = {32 << 10, 64 << 10, 96 << 10, (128 << 10) - 4, 128 << 10, 192 << 10};
    size_t most = (192 << 10) + 4096;
    char *a = mmap(NULL, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(NULL, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int bad = 0, rc = a != MAP_FAILED && b != MAP_FAILED ? 0 : -ENOMEM, salt = 500;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    for (size_t c = 0; c < sizeof(lens) / sizeof(lens[0]) && rc == 0; c++)
        for (int call = 0; call < 2 && rc == 0; call++, salt++)
            rc = adopted_case(r, a + 16, b + 16, lens[c] / sizeof(float), DL_COLL_FLOAT32,
                              DL_COLL_SUM, lens[c] >= (128 << 10), salt, &calls, &bad);
    if (a != MAP_FAILED)
        munmap(a, most);
    if (b != MAP_FAILED)
        munmap(b, most);
    return rc < 0 ? rc : bad;
}

DL_TEST_IN(inplace_tests, malloc_buffers_are_read_in_place_from_128k)
{
    run_two_at_default_sizes(body_adopt_threshold);
}

/* Two ranks' pair form copies into the slot that the last data round did not use, where a round
 * without data (a barrier) came between, so that it does not take back at once the lines the
 * other core has just read (48-64 KiB: 1.4x as long; docs/performance.md); back to back it
 * takes the next round as before. Each step: an all-reduce of one round (8 or 64 KiB) or of
 * several (600 KiB, 1.6 MiB: a round skipped must not leave the next round's wait for the
 * skipped one's departure unanswered), then `between` barriers or a 1 KiB all-reduce (the small
 * form, a data round of its own). Adoption is off, so every round is copied. The sums are exact
 * every call. */
static int body_turn(rank_t *r, void *arg)
{
    (void)arg;
    const size_t lens[] = {8 << 10, 64 << 10, 600 << 10, (1600 << 10) + 4};
    size_t chunk = r->o.shm_chunk_bytes, most = (1600 << 10) + 64;
    char *src = malloc(most), *dst = malloc(most);
    int bad = 0, rc = src != NULL && dst != NULL ? 0 : -ENOMEM, salt = 700;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    for (size_t c = 0; c < sizeof(lens) / sizeof(lens[0]) && rc == 0; c++) {
        size_t count = lens[c] / sizeof(float);
        uint32_t rounds = (uint32_t)((lens[c] + chunk - 1) / chunk);
        /* between: 0 back to back, 1-2 barriers, 3 a small all-reduce. */
        for (int between = 0; between < 4 && rc == 0; between++) {
            rc = adopted_case(r, src + 16, dst + 16, count, DL_COLL_FLOAT32, DL_COLL_SUM, 0, salt++,
                              &calls, &bad);
            for (int b = 0; b < (between == 3 ? 0 : between) && rc == 0; b++)
                rc = dl_coll_barrier(r->g);
            if (rc == 0 && between == 3)
                rc = adopted_case(r, src + 16, dst + 16, 256, DL_COLL_FLOAT32, DL_COLL_SUM, 0,
                                  salt++, &calls, &bad);
            uint32_t before = dl__coll_shm_slot_round(r->g->shm);
            if (rc == 0)
                rc = adopted_case(r, src + 16, dst + 16, count, DL_COLL_FLOAT32, DL_COLL_SUM, 0,
                                  salt++, &calls, &bad);
            uint32_t last = dl__coll_shm_slot_round(r->g->shm);
            /* One barrier takes the round after the data's, two the one after that: the
             * all-reduce then starts two rounds on (the other slot), one round skipped or not.
             * Back to back or after the small form: the next round. */
            uint32_t want = before + (between == 1 || between == 2 ? 3 : 1) + rounds - 1;
            if (rc == 0 && last != want) {
                snprintf(r->err, sizeof(r->err),
                         "%zu bytes, %d between: last round %u after the data round %u, "
                         "expected %u",
                         lens[c], between, (unsigned)last, (unsigned)before, (unsigned)want);
                bad++;
            }
        }
    }
    free(src);
    free(dst);
    return rc < 0 ? rc : bad;
}

DL_TEST_IN(inplace_tests, pair_form_after_a_barrier_copies_into_the_other_slot)
{
    world_t w;
    init_two_at_default_sizes(&w);
    for (int r = 0; r < 2; r++) {
        w.ranks[r].o.adopt_min_bytes = 0;
        /* A hang (the skipped round's departure never posted) fails within seconds. */
        w.ranks[r].o.timeout_ms = 3000;
    }
    world_run(&w, body_turn, NULL);
    world_check(&w);
}

/* An adopted buffer one of whose whole pages (the first, one in the middle, the last) is unmapped
 * and mapped anew, anonymous, at the same address between two calls: the adoption no longer
 * stands, and the next call must read the new page, not the memfd's old one (the peer maps the
 * memfd, so a check that looked only at some of the pages would hand it stale data there). The
 * buffer is adopted again and read in place, with exact sums, and the call after that finds the
 * new adoption. */
static int body_adopted_remapped(rank_t *r, void *arg)
{
    (void)arg;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), mlen = 64 * page, count = (mlen - 64) / 8;
    int bad = 0, rc = 0, salt = 700;
    uint64_t calls = dl__coll_shm_in_place_calls(r->g->shm);
    char *out = malloc(mlen);
    /* The buffer starts 16 bytes in: its whole pages are [page, mlen - page). */
    const size_t where[] = {page, mlen / 2, mlen - 2 * page};
    for (size_t w = 0; w < sizeof(where) / sizeof(where[0]) && rc == 0; w++) {
        char *m = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || out == NULL) {
            rc = -ENOMEM;
            break;
        }
        rc = adopted_case(r, m + 16, out, count, DL_COLL_INT64, DL_COLL_SUM, 1, salt++, &calls,
                          &bad);
        char *pg = m + where[w];
        if (rc == 0 &&
            (munmap(pg, page) < 0 || mmap(pg, page, PROT_READ | PROT_WRITE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != pg))
            rc = -errno;
        for (int call = 0; call < 2 && rc == 0; call++)
            rc = adopted_case(r, m + 16, out, count, DL_COLL_INT64, DL_COLL_SUM, 1, salt++, &calls,
                              &bad);
        munmap(m, mlen);
    }
    free(out);
    return rc < 0 ? rc : bad;
}

DL_TEST_IN(inplace_tests, adopted_buffer_with_a_page_mapped_anew_is_read_anew)
{
    run_two_at_default_sizes(body_adopted_remapped);
}

/* ---- the bootstrap --------------------------------------------------------------------------- */

static int body_info(rank_t *r, void *arg)
{
    (void)arg;
    int info[4] = {dl_coll_local_rank(r->g), dl_coll_local_size(r->g), dl_coll_num_hosts(r->g),
                   (int)strlen(dl_coll_transport_name(r->g))};
    r->out = malloc(sizeof(info));
    memcpy(r->out, info, sizeof(info));
    return 0;
}

DL_TEST_IN(bootstrap_tests, hosts_and_local_ranks)
{
    world_t w;
    world_init(&w, 6, DL_COLL_TRANSPORT_AUTO, split3);
    world_run(&w, body_info, NULL);
    /* split3 for 6 ranks: x = {0,1,5}, y = {2,4}, z = {3}. */
    static const int local_rank[6] = {0, 1, 0, 0, 1, 2}, local_size[6] = {3, 3, 2, 1, 2, 3};
    for (int r = 0; r < 6; r++) {
        ck_assert_msg(w.ranks[r].create_rc == 0, "rank %d: %s", r, w.ranks[r].err);
        int *info = w.ranks[r].out;
        ck_assert_int_eq(info[0], local_rank[r]);
        ck_assert_int_eq(info[1], local_size[r]);
        ck_assert_int_eq(info[2], 3);
        ck_assert_int_eq(info[3], (int)strlen("shm+tcp"));
        free(info);
    }
}

DL_TEST_IN(bootstrap_tests, rank0_may_start_last)
{
    world_t w;
    world_init(&w, 3, DL_COLL_TRANSPORT_AUTO, NULL);
    w.start_delay_ms[0] = 400;
    world_run(&w, body_allreduce, NULL);
    world_check(&w);
}

DL_TEST_IN(bootstrap_tests, missing_rank0_times_out)
{
    world_t w;
    world_init(&w, 2, DL_COLL_TRANSPORT_AUTO, NULL);
    w.ranks[1].o.timeout_ms = 300;
    w.n = 2;
    /* Only rank 1 runs. */
    rank_main(&w.ranks[1]);
    DL_CHECK_ERRNO(w.ranks[1].create_rc, -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(w.ranks[1].err, "rank 0"));
    ck_assert_double_lt(w.ranks[1].elapsed, 2.0);
}

DL_TEST_IN(bootstrap_tests, missing_peer_times_out_at_rank0)
{
    world_t w;
    world_init(&w, 3, DL_COLL_TRANSPORT_AUTO, NULL);
    w.ranks[0].o.timeout_ms = 300;
    rank_main(&w.ranks[0]);
    DL_CHECK_ERRNO(w.ranks[0].create_rc, -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(w.ranks[0].err, "1 of 3 ranks connected"));
    ck_assert_double_lt(w.ranks[0].elapsed, 2.0);
}

DL_TEST_IN(bootstrap_tests, two_claims_on_one_rank_are_refused)
{
    world_t w;
    world_init(&w, 3, DL_COLL_TRANSPORT_AUTO, NULL);
    w.ranks[2].o = w.ranks[1].o; /* a second "rank 1" instead of rank 2 */
    for (int r = 0; r < 3; r++)
        w.ranks[r].o.timeout_ms = 2000;
    world_run(&w, NULL, NULL);
    DL_CHECK_ERRNO(w.ranks[0].create_rc, -EEXIST);
    ck_assert_ptr_nonnull(strstr(w.ranks[0].err, "two processes claim rank 1"));
    ck_assert_int_lt(w.ranks[1].create_rc, 0);
    ck_assert_int_lt(w.ranks[2].create_rc, 0);
}

DL_TEST_IN(bootstrap_tests, shm_only_across_hosts_is_refused)
{
    world_t w;
    world_init(&w, 2, DL_COLL_TRANSPORT_SHM, split2);
    world_run(&w, NULL, NULL);
    for (int r = 0; r < 2; r++) {
        DL_CHECK_ERRNO(w.ranks[r].create_rc, -EINVAL);
        ck_assert_ptr_nonnull(strstr(w.ranks[r].err, "on 2 hosts"));
    }
}

/* DLAUNCH_SOCKET_IFNAME: ranks listen on that interface's address; one that does not exist is
 * an error naming it, on every rank. */
DL_TEST_IN(bootstrap_tests, socket_ifname_binds_that_interface)
{
    world_t w;
    world_init(&w, 3, DL_COLL_TRANSPORT_TCP, NULL);
    for (int r = 0; r < 3; r++)
        snprintf(w.ranks[r].o.ifname, sizeof(w.ranks[r].o.ifname), "lo");
    world_run(&w, body_allreduce, NULL);
    world_check(&w);

    world_init(&w, 2, DL_COLL_TRANSPORT_TCP, NULL);
    for (int r = 0; r < 2; r++) {
        snprintf(w.ranks[r].o.ifname, sizeof(w.ranks[r].o.ifname), "nosuchif0");
        w.ranks[r].o.timeout_ms = 2000;
    }
    world_run(&w, NULL, NULL);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(w.ranks[r].create_rc == -ENODEV &&
                          strstr(w.ranks[r].err,
                                 "DLAUNCH_SOCKET_IFNAME=nosuchif0: no such interface") != NULL,
                      "rank %d: %d %s", r, w.ranks[r].create_rc, w.ranks[r].err);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* Rank 1 leaves at once; rank 0's all-reduce must fail, not hang. */
static int body_leave_early(rank_t *r, void *arg)
{
    (void)arg;
    if (r->rank != 0)
        return 0;
    float x[1000] = {0};
    double t0 = now_s();
    int rc = dl_coll_allreduce(r->g, x, x, 1000, DL_COLL_FLOAT32, DL_COLL_SUM);
    r->elapsed = now_s() - t0;
    int again = dl_coll_allreduce(r->g, x, x, 1000, DL_COLL_FLOAT32, DL_COLL_SUM);
    r->out = malloc(2 * sizeof(int));
    ((int *)r->out)[0] = rc;
    ((int *)r->out)[1] = again;
    snprintf(r->err, sizeof(r->err), "%s", dl_coll_group_error(r->g));
    return 0;
}

DL_TEST_LOOP_IN(bootstrap_tests, peer_gone_fails_within_timeout, 0, 2)
{
    /* shm: the peer's process lives on (it is this one), so only the timeout can tell. */
    static const dl_coll_transport_t trs[] = {DL_COLL_TRANSPORT_SHM, DL_COLL_TRANSPORT_TCP};
    world_t w;
    world_init(&w, 2, trs[_i], NULL);
    for (int r = 0; r < 2; r++)
        w.ranks[r].o.timeout_ms = 400;
    world_run(&w, body_leave_early, NULL);
    ck_assert_int_eq(w.ranks[0].create_rc, 0);
    int *rc = w.ranks[0].out;
    ck_assert_int_lt(rc[0], 0);
    ck_assert_int_eq(rc[1], rc[0]); /* the error sticks */
    ck_assert_msg(rc[0] == -ETIMEDOUT || rc[0] == -ECONNRESET, "got %d", rc[0]);
    ck_assert_msg(strlen(w.ranks[0].err) > 0, "no error text");
    ck_assert_double_lt(w.ranks[0].elapsed, 3.0);
    free(rc);
}

/* ---- in-job recovery's pieces ---------------------------------------------------------------- */

typedef struct {
    dl_coll_group_t *g;
    int after_ms;
} aborter_t;

static void *aborter(void *p)
{
    aborter_t *a = p;
    struct timespec ts = {0, a->after_ms * 1000000L};
    nanosleep(&ts, NULL);
    dl_coll_group_abort(a->g, "told to: the group broke");
    return NULL;
}

/* Rank 0 waits in an all-reduce for rank 1, which comes late; another thread aborts rank 0's
 * group meanwhile: the wait ends at once, with that reason, and rank 1's call fails too. */
static int body_abort(rank_t *r, void *arg)
{
    (void)arg;
    float x[1024] = {0};
    int *out = calloc(2, sizeof(int));
    r->out = out;
    if (r->rank == 0) {
        aborter_t a = {r->g, 100};
        pthread_t t;
        pthread_create(&t, NULL, aborter, &a);
        double t0 = now_s();
        out[0] = dl_coll_allreduce(r->g, x, x, 1024, DL_COLL_FLOAT32, DL_COLL_SUM);
        out[1] = (int)((now_s() - t0) * 1000);
        pthread_join(t, NULL);
        snprintf(r->err, sizeof(r->err), "%s", dl_coll_group_error(r->g));
    } else {
        struct timespec ts = {0, 400 * 1000000L};
        nanosleep(&ts, NULL);
        out[0] = dl_coll_allreduce(r->g, x, x, 1024, DL_COLL_FLOAT32, DL_COLL_SUM);
    }
    return 0;
}

DL_TEST_LOOP_IN(recovery_tests, abort_ends_the_wait_at_once, 0, 2)
{
    static const dl_coll_transport_t trs[] = {DL_COLL_TRANSPORT_SHM, DL_COLL_TRANSPORT_TCP};
    world_t w;
    world_init(&w, 2, trs[_i], NULL);
    world_run(&w, body_abort, NULL);
    int *r0 = w.ranks[0].out, *r1 = w.ranks[1].out;
    ck_assert_int_eq(w.ranks[0].create_rc, 0);
    DL_CHECK_ERRNO(r0[0], -ECANCELED);
    ck_assert_int_lt(r0[1], 2000); /* the timeout is 10 s */
    ck_assert_str_eq(w.ranks[0].err, "told to: the group broke");
    ck_assert_int_lt(r1[0], 0);
    free(r0);
    free(r1);
}

/* Each rank's extra block is the next rank's own, bit for bit. */
static int body_rs_extra(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), me = r->rank;
    size_t count = 1003;
    float *src = malloc(count * (size_t)n * sizeof(float));
    float *all = calloc(count * (size_t)n, sizeof(float));
    for (size_t i = 0; i < count * (size_t)n; i++)
        src[i] = (float)val(me, i, 3) * 0.1f + (float)me * 1e-3f;
    int extra = (me + 1) % n;
    int rc =
        dl_coll_reduce_scatter_extra(r->g, src, all + count * (size_t)me, count, DL_COLL_FLOAT32,
                                     DL_COLL_SUM, n > 1 ? extra : -1, all + count * (size_t)extra);
    free(src);
    r->out = all;
    r->out_bytes = count * (size_t)n * sizeof(float);
    return rc;
}

DL_TEST_LOOP_IN(recovery_tests, reduce_scatter_extra_has_the_owners_bits, 0, NSETUPS)
{
    const setup_t *s = &setups[_i];
    for (int n = 1; n <= 4; n++) {
        world_t w;
        world_init(&w, n, s->tr, s->hosts);
        for (int r = 0; r < n; r++) {
            w.ranks[r].o.algo = s->algo;
            w.ranks[r].o.order = s->order;
        }
        world_run(&w, body_rs_extra, NULL);
        size_t count = 1003;
        for (int r = 0; r < n; r++)
            ck_assert_msg(w.ranks[r].body_rc == 0, "world %d rank %d: %s", n, r, w.ranks[r].err);
        for (int r = 0; r < n; r++) {
            int e = (r + 1) % n;
            const float *mine = (const float *)w.ranks[r].out + count * (size_t)e;
            const float *owner = (const float *)w.ranks[e].out + count * (size_t)e;
            ck_assert_msg(memcmp(mine, owner, count * sizeof(float)) == 0,
                          "setup %d, world %d: rank %d's copy of block %d differs", _i, n, r, e);
        }
        for (int r = 0; r < n; r++)
            free(w.ranks[r].out);
    }
}

/* A host rank's shared block is readable through mem_peer, also once the group is broken; a
 * rank on another host is not. */
static int body_mem_peer(rank_t *r, void *arg)
{
    (void)arg;
    int n = dl_coll_world_size(r->g), me = r->rank;
    int *out = calloc((size_t)n, sizeof(int));
    r->out = out;
    char err[256];
    int *mine = NULL;
    int rc = dl_coll_mem_alloc(r->g, 4096, (void **)&mine, err, sizeof(err));
    if (rc < 0)
        return rc;
    mine[0] = 1000 + me;
    rc = dl_coll_barrier(r->g);
    if (rc < 0)
        return rc;
    if (me == 0)
        dl_coll_group_abort(r->g, "broken on purpose");
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    for (int q = 0; q < n; q++) {
        const int *p = NULL;
        size_t len = 0;
        int e = dl_coll_mem_peer(r->g, mine, q, (const void **)&p, &len);
        out[q] = e < 0 ? e : len >= 4096 ? p[0] : -1;
    }
    return 0;
}

DL_TEST_IN(recovery_tests, mem_peer_reads_the_blocks_of_the_host)
{
    static const char *const hosts[] = {"a", "a", "b", "b"};
    world_t w;
    world_init(&w, 4, DL_COLL_TRANSPORT_AUTO, hosts);
    world_run(&w, body_mem_peer, NULL);
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(w.ranks[r].body_rc == 0, "rank %d: %s", r, w.ranks[r].err);
        int *out = w.ranks[r].out;
        for (int q = 0; q < 4; q++) {
            if (q / 2 == r / 2)
                ck_assert_int_eq(out[q], 1000 + q);
            else
                DL_CHECK_ERRNO(out[q], -EXDEV);
        }
        free(out);
    }
}

/* Another rank's block is writable through mem_peer_rw: what a rank writes there, its owner reads
 * in its own block after a barrier (the trainer's sharded step hands each other the new
 * parameters so), and the read-only mapping shows it too. */
static int body_mem_peer_write(rank_t *r, void *arg)
{
    (void)arg;
    int me = r->rank, other = 1 - me;
    char err[256];
    int *mine = NULL, *theirs = NULL;
    size_t len = 0;
    int rc = dl_coll_mem_alloc(r->g, 4096, (void **)&mine, err, sizeof(err));
    if (rc == 0)
        rc = dl_coll_mem_peer_rw(r->g, mine, other, (void **)&theirs, &len);
    if (rc < 0)
        return rc;
    theirs[7] = 3000 + me;
    rc = dl_coll_barrier(r->g);
    const int *seen = NULL;
    if (rc == 0)
        rc = dl_coll_mem_peer(r->g, mine, other, (const void **)&seen, &len);
    int *out = calloc(2, sizeof(int));
    r->out = out;
    out[0] = mine[7];
    out[1] = seen != NULL ? seen[7] : -1;
    return rc;
}

DL_TEST_IN(recovery_tests, mem_peer_writes_into_the_other_block)
{
    world_t w;
    world_init(&w, 2, DL_COLL_TRANSPORT_SHM, NULL);
    world_run(&w, body_mem_peer_write, NULL);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(w.ranks[r].body_rc == 0, "rank %d: %s", r, w.ranks[r].err);
        int *out = w.ranks[r].out;
        ck_assert_int_eq(out[0], 3000 + (1 - r));
        ck_assert_int_eq(out[1], 3000 + r);
        free(w.ranks[r].out);
    }
}
