/* bench/recorder: what the collective's flight recorder costs an all-reduce, measured so that a
 * busy machine does not drown it. Two ranks are two threads of this process; each builds two
 * groups over shared memory, one recording (into a file, as under dlaunch) and one not, and they
 * run blocks of all-reduces on the two groups in turn. For each block the slower rank's time
 * counts; the table gives, per size, each group's median and fastest block, and the median of
 * the ratios of neighbouring blocks (on against the off block next to it), which a burst of load
 * from elsewhere hits alike.
 *
 *   bench/recorder [--sizes 4096,65536] [--blocks N] [--iters N] [--timed BYTES]
 *
 * --timed: DLAUNCH_COLL_RECORDER_TIMED for the recording group (default 64K; 0 times every
 * operation, to see what the clock reads cost).
 *
 * First it times the recorder's writer alone: a begin and an end around nothing, against the
 * same loop without them, fastest of many short blocks (what the recorder adds to any operation,
 * whatever the machine is doing meanwhile). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collective.h"
#include "internal.h" /* the writer's inline functions, timed alone */

#define MAX_BLOCKS 400
#define MAX_SIZES 8

typedef struct {
    int rank, port[2];
    char path[256];
    size_t timed;
    size_t sizes[MAX_SIZES];
    int nsizes, blocks, iters;
    pthread_barrier_t *bar;
    double t[MAX_SIZES][MAX_BLOCKS]; /* seconds a block */
    int rc;
    char err[256];
} rank_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int free_port(void)
{
    /* Below the ephemeral range, from the pid: two runs side by side rarely meet. */
    return 20000 + (int)(getpid() * 7 % 11000);
}

static void *rank_main(void *p)
{
    rank_t *r = p;
    dl_coll_group_t *g[2] = {NULL, NULL};
    for (int k = 0; k < 2 && r->rc == 0; k++) {
        dl_coll_options_t o;
        dl_coll_options_init(&o);
        o.rank = r->rank;
        o.world_size = 2;
        snprintf(o.master_addr, sizeof(o.master_addr), "127.0.0.1");
        o.master_port = r->port[k];
        o.transport = DL_COLL_TRANSPORT_SHM;
        o.recorder = k == 0;
        o.recorder_timed_bytes = r->timed;
        snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", k == 0 ? r->path : "");
        r->rc = dl_coll_group_create(&o, &g[k], r->err, sizeof(r->err));
    }
    size_t max = 0;
    for (int s = 0; s < r->nsizes; s++)
        max = r->sizes[s] > max ? r->sizes[s] : max;
    float *src = calloc(max / 4 + 1, sizeof(float)), *dst = calloc(max / 4 + 1, sizeof(float));
    if (r->rc == 0 && (src == NULL || dst == NULL))
        r->rc = -ENOMEM;
    for (int s = 0; s < r->nsizes && r->rc == 0; s++) {
        size_t count = r->sizes[s] / 4;
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 50 && r->rc == 0; i++)
                r->rc = dl_coll_allreduce(g[k], src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM);
        for (int b = 0; b < r->blocks && r->rc == 0; b++) {
            /* Block b runs on group (b / 2 + b) % 2: on, off, off, on, on, off, ... so that
             * neither comes first more often. */
            dl_coll_group_t *gg = g[(b / 2 + b) % 2];
            pthread_barrier_wait(r->bar);
            double t0 = now_s();
            for (int i = 0; i < r->iters && r->rc == 0; i++)
                r->rc = dl_coll_allreduce(gg, src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM);
            r->t[s][b] = now_s() - t0;
        }
    }
    if (r->rc < 0 && r->err[0] == '\0')
        snprintf(r->err, sizeof(r->err), "%s", strerror(-r->rc));
    free(src);
    free(dst);
    dl_coll_group_destroy(g[0]);
    dl_coll_group_destroy(g[1]);
    return NULL;
}

/* ns an operation of the writer alone (begin + end), untimed (small) and timed (large). */
static double writer_cost(size_t bytes, const char *path)
{
    dl_coll_options_t o;
    dl__coll_rec_t rec;
    dl_coll_options_init(&o);
    snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", path);
    dl__coll_rec_open(&rec, &o, 0, 1, "self");
    volatile uint64_t sink = 0;
    double best[2] = {1e9, 1e9};
    for (int b = 0; b < 400; b++) {
        int with = b % 2;
        double t0 = now_s();
        for (int i = 0; i < 20000; i++) {
            uint64_t seq = 0;
            if (with)
                seq = dl__coll_rec_begin(&rec, DL_COLL_REC_ALLREDUCE, bytes,
                                         DL_COLL_REC_ALGO_SHM_SMALL, DL_COLL_FLOAT32, -1);
            sink += (uint64_t)i;
            if (with)
                dl__coll_rec_end(&rec, seq, 0);
        }
        double t = (now_s() - t0) / 20000 * 1e9;
        best[with] = t < best[with] ? t : best[with];
    }
    dl__coll_rec_close(&rec);
    (void)sink;
    return best[1] - best[0];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    static rank_t rk[2];
    rank_t base = {
        .blocks = 100, .iters = 1000, .timed = 64 << 10, .nsizes = 2, .sizes = {4096, 65536}};
    for (int i = 1; i + 1 < argc; i += 2) {
        char *end;
        if (strcmp(argv[i], "--blocks") == 0)
            base.blocks = (int)strtol(argv[i + 1], &end, 10);
        else if (strcmp(argv[i], "--iters") == 0)
            base.iters = (int)strtol(argv[i + 1], &end, 10);
        else if (strcmp(argv[i], "--timed") == 0)
            base.timed = (size_t)strtoull(argv[i + 1], &end, 10);
        else if (strcmp(argv[i], "--sizes") == 0) {
            base.nsizes = 0;
            for (char *p = argv[i + 1]; *p != '\0' && base.nsizes < MAX_SIZES;) {
                base.sizes[base.nsizes++] = (size_t)strtoull(p, &end, 10);
                p = *end == ',' ? end + 1 : end;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--sizes 4096,65536] [--blocks N] [--iters N] "
                    "[--timed BYTES]\n",
                    argv[0]);
            return 2;
        }
    }
    if (base.blocks < 2 || base.blocks > MAX_BLOCKS || base.iters < 1) {
        fprintf(stderr, "recorder: --blocks 2..%d, --iters >= 1\n", MAX_BLOCKS);
        return 2;
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    char dir[] = "/tmp/dl-bench-rec-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char wpath[300];
    snprintf(wpath, sizeof(wpath), "%s/writer.rec", dir);
    double small = writer_cost(4096, wpath), large = writer_cost(1 << 20, wpath);
    unlink(wpath);
    printf("the writer alone (fastest of 200 blocks of 20000, less the empty loop): %.2f ns an "
           "untimed operation (< %zu bytes), %.2f ns a timed one\n",
           small, base.timed, large);
    fflush(stdout);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        rk[r] = base;
        rk[r].rank = r;
        rk[r].port[0] = free_port();
        rk[r].port[1] = free_port() + 1;
        rk[r].bar = &bar;
        snprintf(rk[r].path, sizeof(rk[r].path), "%s/rank_%d.rec", dir, r);
        pthread_create(&th[r], NULL, rank_main, &rk[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        char path[300];
        snprintf(path, sizeof(path), "%s/rank_%d.rec", dir, r);
        unlink(path);
    }
    rmdir(dir);
    for (int r = 0; r < 2; r++)
        if (rk[r].rc < 0) {
            fprintf(stderr, "recorder: rank %d: %s\n", r, rk[r].err);
            return 1;
        }
    printf("all-reduce, float32 sum, 2 ranks (threads) over shared memory; %d blocks of %d, "
           "recorder on (file, timed from %zu bytes) and off in turn\n",
           base.blocks, base.iters, base.timed);
    printf("%10s %12s %12s %12s %12s %10s %14s\n", "bytes", "on_ns_med", "off_ns_med", "on_ns_best",
           "off_ns_best", "on/off", "on-off ns");
    for (int s = 0; s < base.nsizes; s++) {
        double on[MAX_BLOCKS], off[MAX_BLOCKS], ratio[MAX_BLOCKS], diff[MAX_BLOCKS];
        int non = 0, noff = 0, nr = 0;
        double last_on = -1, last_off = -1;
        for (int b = 0; b < base.blocks; b++) {
            double t =
                (rk[0].t[s][b] > rk[1].t[s][b] ? rk[0].t[s][b] : rk[1].t[s][b]) / base.iters * 1e9;
            if ((b / 2 + b) % 2 == 0) {
                on[non++] = t;
                last_on = t;
            } else {
                off[noff++] = t;
                last_off = t;
            }
            /* Each pair of neighbouring blocks (one of each) gives a ratio. */
            if (b % 2 == 1 && last_on > 0 && last_off > 0) {
                ratio[nr] = last_on / last_off;
                diff[nr++] = last_on - last_off;
            }
        }
        double best_on = on[0], best_off = off[0];
        for (int i = 0; i < non; i++)
            best_on = on[i] < best_on ? on[i] : best_on;
        for (int i = 0; i < noff; i++)
            best_off = off[i] < best_off ? off[i] : best_off;
        printf("%10zu %12.1f %12.1f %12.1f %12.1f %10.4f %14.2f\n", base.sizes[s], median(on, non),
               median(off, noff), best_on, best_off, median(ratio, nr), median(diff, nr));
    }
    return 0;
}
