/* bench/allreduce: our all-reduce against Open MPI's, in one run, as an nccl-tests-style table.
 *
 *   allreduce [--worlds 2,4] [--transports shm,tcp,shm-reg] [--min BYTES] [--max BYTES]
 *             [--step K] [--budget BYTES] [--no-mpi] [--order-ab] [--json] [--dlaunch PATH]
 *             [--mpi-worker PATH] [--recorder-ab ROUNDS] [--floor] [--floor-mean]
 *             [--fresh-inputs] [--aligned-calls]
 *
 * --floor: for world 2, beside every size of the shared-memory tables, bench/shm-floor's
 * zero-copy figure for that size (two processes summing both inputs straight out of one shared
 * mapping, no library), measured right after our rows of that size's transport, and our busbw
 * over it: what the "within 0.85x of the zero-copy floor" is read against; then
 * shm-floor's copy figure (each process copies its private input into shared memory for the
 * other: the least an all-reduce from ordinary buffers pays without reading them in place) and
 * our busbw over that. The floors are shm-floor's fastest single run; --floor-mean makes them
 * the fastest of three batches' mean, the statistic of our own rows (shm-floor --mean).
 *
 * --fresh-inputs: each rank rewrites its whole input (a memset, its byte changing from call to
 * call) before every call, as a training step writes its gradients just before their
 * all-reduce; without it the inputs are written once, so their lines stay clean in both cores'
 * caches from call to call, which flatters whatever reads the other rank's input in place. The
 * write is outside the timed region (it is the program's work, not the all-reduce's, and at
 * 256 MiB it takes as long as the call), so each call is timed alone, after a barrier that
 * starts both ranks together once both have written (a rank that wrote first would otherwise
 * count the other's write as waiting). Passed on to shm-floor with --floor, which writes its
 * input the same way before its first barrier. --aligned-calls times the same way (a barrier,
 * then the call alone) without the writes: what the timing alone changes.
 *
 * --recorder-ab: instead of Open MPI, ours with the flight recorder on (the default) and off
 * (DLAUNCH_COLL_RECORDER=off), ROUNDS times each, the two alternating (on first in even rounds,
 * off first in odd ones); the table gives each side's median and the median of the rounds'
 * on/off ratios.
 *
 * shm-reg is shm with both buffers from dl_coll_mem_alloc (and MPI_Alloc_mem for MPI); hier is
 * ours only: the ranks as hosts of two consecutive ranks each (DLAUNCH_COLL_HOST_ID), shared
 * memory within and TCP between them. --order-ab times DLAUNCH_COLL_ORDER=rank (the default)
 * against any in the same processes, batch by batch alternately, and prints a table of both.
 * For every world size and transport it runs `dlaunch --gpus-per-node N -- allreduce --worker`
 * with DLAUNCH_COLL_TRANSPORT set, then `mpirun -n N allreduce-mpi` (its default shared-memory
 * path for shm, `--mca btl tcp,self` for tcp), and prints one table per pair: bytes, time per
 * call, algorithm bandwidth, bus bandwidth (algbw * 2(n-1)/n, what each link carries), and the
 * ratio ours/MPI. Float32 sum, out of place (in place, the output over the input, for ours with
 * ALLREDUCE_BENCH_IN_PLACE=1 in the environment); the time is the slowest rank's mean. --json
 * prints one object per row instead. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "allreduce_common.h"
#include "collective.h"

#ifndef DL_BENCH_DLAUNCH
#define DL_BENCH_DLAUNCH "dlaunch"
#endif

#define MAX_ROWS 256
#define RUN_LIMIT_S 600

/* ---- the worker: one rank of ours, under dlaunch --------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The slowest rank's mean per call over iters calls, or a negative errno. */
static int timed(dl_coll_group_t *g, const float *src, float *dst, size_t count, int iters,
                 double *ret_s)
{
    int r = dl_coll_barrier(g);
    double t0 = now_s();
    for (int i = 0; i < iters && r == 0; i++)
        r = dl_coll_allreduce(g, src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM);
    double t = (now_s() - t0) / iters;
    if (r == 0)
        r = dl_coll_allreduce(g, &t, ret_s, 1, DL_COLL_FLOAT64, DL_COLL_MAX);
    return r;
}

/* --fresh-inputs: the same, but each rank rewrites its input before every call, and only the
 * call, started by a barrier once both have written, is timed. The byte alternates between two
 * normal floats' patterns (0x3f3f3f3f, 0x40404040): no denormals to slow the sums. */
static int timed_fresh(dl_coll_group_t *g, float *src, float *dst, size_t count, int iters,
                       int write, double *ret_s)
{
    int r = 0;
    double sum = 0;
    for (int i = 0; i < iters && r == 0; i++) {
        if (write)
            memset(src, i & 1 ? 0x40 : 0x3f, count * sizeof(float));
        r = dl_coll_barrier(g);
        double t0 = now_s();
        if (r == 0)
            r = dl_coll_allreduce(g, src, dst, count, DL_COLL_FLOAT32, DL_COLL_SUM);
        sum += now_s() - t0;
    }
    double t = sum / iters;
    if (r == 0)
        r = dl_coll_allreduce(g, &t, ret_s, 1, DL_COLL_FLOAT64, DL_COLL_MAX);
    return r;
}

static int worker(int argc, char **argv)
{
    bench_args_t a = {4096, 256 << 20, 4, 2e9, NULL, "dlaunch", "?"};
    /* --ab: a second group with DLAUNCH_COLL_ORDER=any, timed alternately with the first. */
    int ab = 0, fresh = 0, aligned = 0, k = 0;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    for (int i = 0; args != NULL && i < argc; i++)
        if (strcmp(argv[i], "--ab") == 0)
            ab = 1;
        else if (strcmp(argv[i], "--fresh-inputs") == 0)
            fresh = 1;
        else if (strcmp(argv[i], "--aligned-calls") == 0)
            aligned = 1;
        else
            args[k++] = argv[i];
    if (args == NULL || bench_parse(&a, k, args, 2) < 0) {
        fprintf(stderr, "allreduce --worker: bad arguments\n");
        return 2;
    }
    free(args);
    char err[512], host[32];
    /* hier: hosts of two consecutive ranks, as dlaunch would lay out two workers a node. */
    if (strcmp(a.transport, "hier") == 0 && getenv("RANK") != NULL) {
        snprintf(host, sizeof(host), "bench-host-%ld", strtol(getenv("RANK"), NULL, 10) / 2);
        setenv("DLAUNCH_COLL_HOST_ID", host, 1);
    }
    dl_coll_group_t *g = NULL, *g2 = NULL;
    int r = dl_coll_group_from_env(&g, err, sizeof(err));
    if (r == 0 && ab) {
        dl_coll_options_t o;
        dl_coll_options_init(&o);
        r = dl_coll_options_from_env(&o, NULL, err, sizeof(err));
        o.order = DL_COLL_ORDER_ANY;
        if (r == 0)
            r = dl_coll_group_create(&o, &g2, err, sizeof(err));
    }
    if (r < 0) {
        fprintf(stderr, "allreduce --worker: %s\n", err);
        return 2;
    }
    int rank = dl_coll_rank(g), world = dl_coll_world_size(g);
    /* shm-reg: both buffers in memory the other ranks read in place. */
    int reg = strcmp(a.transport, "shm-reg") == 0;
    float *src = NULL, *dst = NULL;
    if (reg) {
        void *p = NULL, *q = NULL;
        if (dl_coll_mem_alloc(g, a.max_bytes, &p, err, sizeof(err)) < 0 ||
            dl_coll_mem_alloc(g, a.max_bytes, &q, err, sizeof(err)) < 0) {
            fprintf(stderr, "allreduce --worker: dl_coll_mem_alloc: %s\n", err);
            return 2;
        }
        src = p;
        dst = q;
    } else {
        src = malloc(a.max_bytes);
        dst = malloc(a.max_bytes);
    }
    if (src == NULL || dst == NULL) {
        fprintf(stderr, "allreduce --worker: out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < a.max_bytes / sizeof(float); i++)
        src[i] = dst[i] = (float)(i % 1000) * 0.001f;
    float *into = getenv("ALLREDUCE_BENCH_IN_PLACE") != NULL ? src : dst;
    FILE *out = rank == 0 ? fopen(a.out, "a") : NULL;
    for (size_t bytes = a.min_bytes; bytes <= a.max_bytes && r == 0; bytes *= (size_t)a.step) {
        size_t count = bytes / sizeof(float);
        int iters = bench_iters(&a, bytes);
        for (int i = 0; i < 2 && r == 0; i++) {
            r = dl_coll_allreduce(g, src, into, count, DL_COLL_FLOAT32, DL_COLL_SUM);
            if (r == 0 && g2 != NULL)
                r = dl_coll_allreduce(g2, src, into, count, DL_COLL_FLOAT32, DL_COLL_SUM);
        }
        /* The best of a few batches: the slowest rank's mean per call in each. With --ab the
         * two groups take turns, batch by batch, so both see the same moments of the machine. */
        double best = 0, best2 = 0, t, t2, ratio[4 * BENCH_BATCHES + 1];
        /* Alternating gives a noisy machine more chances to be quiet for each; the ratio of
         * each adjacent pair sees the same moment of the machine, and their median is what
         * --order-ab reports. */
        int batches = g2 != NULL ? 4 * BENCH_BATCHES + 1 : BENCH_BATCHES;
        for (int b = 0; b < batches && r == 0; b++) {
            r = fresh || aligned ? timed_fresh(g, src, into, count, iters, fresh, &t)
                                 : timed(g, src, into, count, iters, &t);
            if (r == 0 && (b == 0 || t < best))
                best = t;
            if (r == 0 && g2 != NULL) {
                r = timed(g2, src, into, count, iters, &t2);
                if (r == 0 && (b == 0 || t2 < best2))
                    best2 = t2;
                ratio[b] = t / t2;
            }
        }
        if (r == 0 && out != NULL) {
            bench_row(out, &a, world, bytes, best);
            if (g2 != NULL) {
                bench_args_t any = a;
                any.impl = "dlaunch-any";
                bench_row(out, &any, world, bytes, best2);
                qsort(ratio, (size_t)batches, sizeof(double), cmp_double);
                fprintf(out, "ab-median %s %d %zu %.4f 0\n", a.transport, world, bytes,
                        ratio[batches / 2]);
            }
            fflush(out);
        }
    }
    if (r < 0)
        fprintf(stderr, "allreduce --worker: rank %d: %s\n", rank, dl_coll_group_error(g));
    if (out != NULL)
        fclose(out);
    if (reg) {
        dl_coll_mem_free(g, src);
        dl_coll_mem_free(g, dst);
    } else {
        free(src);
        free(dst);
    }
    dl_coll_group_destroy(g);
    dl_coll_group_destroy(g2);
    return r < 0 ? 1 : 0;
}

/* ---- the driver ------------------------------------------------------------------------------ */

typedef struct {
    char impl[16], transport[16];
    int world;
    size_t bytes;
    double time_us, busbw;
} row_t;

typedef struct {
    char worlds[64], transports[64];
    const char *dlaunch, *mpi_worker, *self;
    char min[32], max[32], step[16], budget[32];
    int mpi, json, ab, floor, floor_mean, fresh, aligned;
    int ab_rounds; /* --recorder-ab */
    char shm_floor[PATH_MAX + 32];
    char dir[64];
    row_t rows[MAX_ROWS];
    int nrows;
} driver_t;

/* Runs argv with up to two extra environment variables (NAME=value or NULL), output to log. */
static int run(const driver_t *d, char *const argv[], const char *env1, const char *env2,
               const char *log)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (env1 != NULL)
            putenv((char *)env1);
        if (env2 != NULL)
            putenv((char *)env2);
        if (chdir(d->dir) < 0)
            _exit(127);
        alarm(RUN_LIMIT_S);
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void load_rows(driver_t *d, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    row_t r;
    while (d->nrows < MAX_ROWS && fscanf(f, "%15s %15s %d %zu %lf %lf", r.impl, r.transport,
                                         &r.world, &r.bytes, &r.time_us, &r.busbw) == 6)
        d->rows[d->nrows++] = r;
    fclose(f);
}

static const row_t *find(const driver_t *d, const char *impl, const char *tr, int world,
                         size_t bytes)
{
    for (int i = 0; i < d->nrows; i++) {
        const row_t *r = &d->rows[i];
        if (strcmp(r->impl, impl) == 0 && strcmp(r->transport, tr) == 0 && r->world == world &&
            r->bytes == bytes)
            return r;
    }
    return NULL;
}

/* bench/shm-floor's zero-copy and copy figures for every size, appended to the rows as impl
 * "floor" and "copyfloor" of transport tr, world 2 (busbw: with 2 ranks it equals the algorithm
 * bandwidth). */
static void bench_floor(const driver_t *d, const char *tr, const char *rows, const char *log)
{
    double min = strtod(d->min, NULL), max = strtod(d->max, NULL), step = strtod(d->step, NULL);
    for (double b = min; b <= max && step >= 2; b *= step) {
        char bytes[32], runs[16], cmd[PATH_MAX + 256];
        snprintf(bytes, sizeof(bytes), "%.0f", b);
        /* About as much data as our rows move per batch, at least 10 runs. */
        double n = strtod(d->budget, NULL) / b / 3;
        snprintf(runs, sizeof(runs), "%d", n < 10 ? 10 : n > 1000 ? 1000 : (int)n);
        int len =
            snprintf(cmd, sizeof(cmd),
                     "%s --bytes %s --chunk 4096 --runs %s%s%s --json 2>>%s | sed -n "
                     "-e 's/.*\"zero-copy\", \"bytes\": \\([0-9]*\\), \"gbs\": \\([0-9.]*\\)}/"
                     "floor %s 2 \\1 0 \\2/p' "
                     "-e 's/.*\"copy\", \"bytes\": \\([0-9]*\\), \"gbs\": \\([0-9.]*\\)}/"
                     "copyfloor %s 2 \\1 0 \\2/p' >>%s",
                     d->shm_floor, bytes, runs, d->fresh ? " --fresh-inputs" : "",
                     d->floor_mean ? " --mean" : "", log, tr, tr, rows);
        if (len < 0 || (size_t)len >= sizeof(cmd) || system(cmd) != 0)
            fprintf(stderr, "allreduce: shm-floor --bytes %s failed (see %s)\n", bytes, log);
    }
}

static void bench_pair(driver_t *d, int world, const char *tr)
{
    char n[16], out[128], log[128], env[64];
    snprintf(n, sizeof(n), "%d", world);
    snprintf(out, sizeof(out), "%s/rows.txt", d->dir);
    snprintf(log, sizeof(log), "%s/log.txt", d->dir);
    snprintf(env, sizeof(env), "DLAUNCH_COLL_TRANSPORT=%s",
             strcmp(tr, "shm-reg") == 0 ? "shm"
             : strcmp(tr, "hier") == 0  ? "auto"
                                        : tr);
    char *ours[] = {(char *)d->dlaunch,
                    "-q",
                    "--log-dir",
                    d->dir,
                    "--gpus-per-node",
                    n,
                    "--",
                    (char *)d->self,
                    "--worker",
                    "--out",
                    out,
                    "--impl",
                    "dlaunch",
                    "--transport",
                    (char *)tr,
                    "--min",
                    d->min,
                    "--max",
                    d->max,
                    "--step",
                    d->step,
                    "--budget",
                    d->budget,
                    NULL,
                    NULL,
                    NULL,
                    NULL};
    size_t extra = sizeof(ours) / sizeof(ours[0]) - 4; /* the first of the four NULLs */
    if (d->ab)
        ours[extra++] = "--ab";
    if (d->fresh)
        ours[extra++] = "--fresh-inputs";
    if (d->aligned)
        ours[extra++] = "--aligned-calls";
    int rc = run(d, ours, env, NULL, log);
    if (rc != 0)
        fprintf(stderr, "allreduce: dlaunch, %s, world %d: exit %d (see %s)\n", tr, world, rc, log);
    if (d->floor && world == 2 && strncmp(tr, "shm", 3) == 0)
        bench_floor(d, tr, out, log);
    if (!d->mpi || strcmp(tr, "hier") == 0)
        return;
    int tcp = strcmp(tr, "tcp") == 0;
    char *mpi[32];
    int k = 0;
    mpi[k++] = "mpirun";
    mpi[k++] = "--allow-run-as-root";
    mpi[k++] = "--oversubscribe";
    mpi[k++] = "-n";
    mpi[k++] = n;
    if (tcp) {
        mpi[k++] = "--mca";
        mpi[k++] = "btl";
        mpi[k++] = "tcp,self";
    }
    char *rest[] = {(char *)d->mpi_worker,
                    "--out",
                    out,
                    "--impl",
                    "mpi",
                    "--transport",
                    (char *)tr,
                    "--min",
                    d->min,
                    "--max",
                    d->max,
                    "--step",
                    d->step,
                    "--budget",
                    d->budget,
                    NULL};
    for (int i = 0; rest[i] != NULL; i++)
        mpi[k++] = rest[i];
    mpi[k] = NULL;
    rc = run(d, mpi, NULL, NULL, log);
    if (rc != 0)
        fprintf(stderr, "allreduce: mpirun, %s, world %d: exit %d (see %s)\n", tr, world, rc, log);
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The flight recorder on and off, rounds times each, alternating; one table. */
static void recorder_ab(driver_t *d, int world, const char *tr)
{
    enum { MAXB = 32, MAXR = 64 };
    char n[16], out[2][128], log[128], env[64];
    size_t sizes[MAXB];
    double t[2][MAXB][MAXR], ratio[MAXB][MAXR];
    int nsizes = 0, rounds = d->ab_rounds > MAXR ? MAXR : d->ab_rounds;
    snprintf(n, sizeof(n), "%d", world);
    snprintf(log, sizeof(log), "%s/log.txt", d->dir);
    snprintf(env, sizeof(env), "DLAUNCH_COLL_TRANSPORT=%s",
             strcmp(tr, "shm-reg") == 0 ? "shm" : tr);
    static const char *rec_env[2] = {"DLAUNCH_COLL_RECORDER=auto", "DLAUNCH_COLL_RECORDER=off"};
    int ok = 1;
    for (int r = 0; r < rounds && ok; r++) {
        for (int k = 0; k < 2 && ok; k++) {
            int v = (r + k) % 2; /* on first in even rounds, off first in odd ones */
            snprintf(out[v], sizeof(out[v]), "%s/ab-%s-%d-%d-%d.txt", d->dir, tr, world, r, v);
            char *argv[] = {(char *)d->dlaunch,
                            "-q",
                            "--log-dir",
                            d->dir,
                            "--gpus-per-node",
                            n,
                            "--",
                            (char *)d->self,
                            "--worker",
                            "--out",
                            out[v],
                            "--impl",
                            "dlaunch",
                            "--transport",
                            (char *)tr,
                            "--min",
                            d->min,
                            "--max",
                            d->max,
                            "--step",
                            d->step,
                            "--budget",
                            d->budget,
                            NULL};
            int rc = run(d, argv, env, rec_env[v], log);
            if (rc != 0) {
                fprintf(stderr, "allreduce: recorder %s, %s, world %d: exit %d (see %s)\n",
                        v ? "off" : "on", tr, world, rc, log);
                ok = 0;
            }
        }
        for (int v = 0; v < 2 && ok; v++) {
            driver_t *tmp = calloc(1, sizeof(*tmp));
            if (tmp == NULL)
                return;
            load_rows(tmp, out[v]);
            for (int i = 0; i < tmp->nrows && i < MAXB; i++) {
                sizes[i] = tmp->rows[i].bytes;
                t[v][i][r] = tmp->rows[i].time_us;
            }
            nsizes = tmp->nrows < MAXB ? tmp->nrows : MAXB;
            free(tmp);
        }
        for (int i = 0; i < nsizes && ok; i++)
            ratio[i][r] = t[0][i][r] / t[1][i][r];
    }
    if (!ok)
        return;
    printf("\n# all-reduce with the flight recorder on and off: %s, world %d, %d rounds "
           "alternating\n",
           tr, world, rounds);
    printf("%12s %14s %14s %12s %22s\n", "bytes", "on_us_median", "off_us_median", "on/off",
           "on/off range (rounds)");
    for (int i = 0; i < nsizes; i++) {
        double lo = ratio[i][0], hi = ratio[i][0];
        for (int r = 1; r < rounds; r++) {
            lo = ratio[i][r] < lo ? ratio[i][r] : lo;
            hi = ratio[i][r] > hi ? ratio[i][r] : hi;
        }
        double on = median_of(t[0][i], rounds), off = median_of(t[1][i], rounds);
        double rm = median_of(ratio[i], rounds);
        printf("%12zu %14.2f %14.2f %12.3f %12.3f-%.3f\n", sizes[i], on, off, rm, lo, hi);
    }
}

static void print_table(const driver_t *d, int world, const char *tr)
{
    printf("\n# all-reduce, float32 sum, out of place: %s, world %d%s\n", tr, world,
           d->fresh     ? ", inputs rewritten before every call"
           : d->aligned ? ", every call timed alone after a barrier"
                        : "");
    int floor = 0;
    for (int i = 0; i < d->nrows && !floor; i++)
        floor = find(d, "floor", tr, world, d->rows[i].bytes) != NULL;
    printf("%12s %12s %10s %10s %12s %10s %8s %8s%s\n", "bytes", "time_us", "algbw_GB/s",
           "busbw_GB/s", "mpi_time_us", "mpi_busbw", "time", "busbw",
           floor ? "   floor_busbw    busbw    copy_busbw    busbw" : "");
    printf("%12s %12s %10s %10s %12s %10s %8s %8s%s\n", "", "", "", "", "", "", "ours/mpi",
           "ours/mpi", floor ? "    (zero-copy) ours/floor        (copy) ours/copy" : "");
    for (int i = 0; i < d->nrows; i++) {
        const row_t *o = &d->rows[i];
        if (strcmp(o->impl, "dlaunch") != 0 || strcmp(o->transport, tr) != 0 || o->world != world)
            continue;
        const row_t *m = find(d, "mpi", tr, world, o->bytes);
        double algbw = (double)o->bytes / o->time_us / 1e3;
        printf("%12zu %12.2f %10.3f %10.3f", o->bytes, o->time_us, algbw, o->busbw);
        if (m != NULL)
            printf(" %12.2f %10.3f %8.2f %8.2f", m->time_us, m->busbw, o->time_us / m->time_us,
                   o->busbw / m->busbw);
        else
            printf(" %12s %10s %8s %8s", "-", "-", "-", "-");
        const row_t *f = floor ? find(d, "floor", tr, world, o->bytes) : NULL;
        if (f != NULL)
            printf(" %13.3f %8.2f", f->busbw, o->busbw / f->busbw);
        const row_t *c = floor ? find(d, "copyfloor", tr, world, o->bytes) : NULL;
        if (c != NULL)
            printf(" %13.3f %8.2f", c->busbw, o->busbw / c->busbw);
        printf("\n");
    }
}

/* --order-ab: rank order against any order, timed alternately in the same processes. */
static void print_ab(const driver_t *d, int world, const char *tr)
{
    printf("\n# all-reduce, float32 sum, out of place: %s, world %d: DLAUNCH_COLL_ORDER rank "
           "against any\n",
           tr, world);
    printf("%12s %12s %12s %10s %10s %10s %12s\n", "bytes", "rank_us", "any_us", "rank_busbw",
           "any_busbw", "best", "median of");
    printf("%12s %12s %12s %10s %10s %10s %12s\n", "", "(best)", "(best)", "", "", "rank/any",
           "pairs r/a");
    for (int i = 0; i < d->nrows; i++) {
        const row_t *o = &d->rows[i];
        if (strcmp(o->impl, "dlaunch") != 0 || strcmp(o->transport, tr) != 0 || o->world != world)
            continue;
        const row_t *m = find(d, "dlaunch-any", tr, world, o->bytes);
        const row_t *med = find(d, "ab-median", tr, world, o->bytes);
        if (m != NULL && med != NULL)
            printf("%12zu %12.2f %12.2f %10.3f %10.3f %10.2f %12.2f\n", o->bytes, o->time_us,
                   m->time_us, o->busbw, m->busbw, o->time_us / m->time_us, med->time_us);
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) < 0 ? 0 : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: allreduce [--worlds 2,4] [--transports shm,tcp,shm-reg] [--min BYTES] "
                    "[--max BYTES] [--step K] [--budget BYTES] [--no-mpi] [--order-ab] [--json] "
                    "[--dlaunch PATH] [--mpi-worker PATH] [--recorder-ab ROUNDS] [--floor] "
                    "[--floor-mean] [--fresh-inputs] [--aligned-calls]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--worker") == 0)
        return worker(argc, argv);
    static driver_t d = {.worlds = "2,4",
                         .transports = "shm,shm-reg,tcp",
                         .min = "4096",
                         .max = "268435456",
                         .step = "4",
                         .budget = "2e9",
                         .mpi = 1};
    static char self[PATH_MAX], mpi_worker[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 2;
    self[n] = '\0';
    d.self = self;
    char dirbuf[PATH_MAX];
    snprintf(dirbuf, sizeof(dirbuf), "%s", self);
    snprintf(mpi_worker, sizeof(mpi_worker), "%s/allreduce-mpi", dirname(dirbuf));
    d.mpi_worker = mpi_worker;
    snprintf(dirbuf, sizeof(dirbuf), "%s", self);
    snprintf(d.shm_floor, sizeof(d.shm_floor), "%s/shm-floor", dirname(dirbuf));
    d.dlaunch = getenv("DLAUNCH") != NULL ? getenv("DLAUNCH") : DL_BENCH_DLAUNCH;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--no-mpi") == 0) {
            d.mpi = 0;
            continue;
        }
        if (strcmp(k, "--json") == 0) {
            d.json = 1;
            continue;
        }
        if (strcmp(k, "--floor") == 0) {
            d.floor = 1;
            continue;
        }
        if (strcmp(k, "--fresh-inputs") == 0) {
            d.fresh = 1;
            continue;
        }
        if (strcmp(k, "--aligned-calls") == 0) {
            d.aligned = 1;
            continue;
        }
        if (strcmp(k, "--floor-mean") == 0) {
            d.floor = d.floor_mean = 1;
            continue;
        }
        if (strcmp(k, "--order-ab") == 0) {
            d.ab = 1;
            d.mpi = 0;
            continue;
        }
        if (v == NULL)
            return usage();
        i++;
        if (strcmp(k, "--worlds") == 0)
            snprintf(d.worlds, sizeof(d.worlds), "%s", v);
        else if (strcmp(k, "--transports") == 0)
            snprintf(d.transports, sizeof(d.transports), "%s", v);
        else if (strcmp(k, "--min") == 0)
            snprintf(d.min, sizeof(d.min), "%s", v);
        else if (strcmp(k, "--max") == 0)
            snprintf(d.max, sizeof(d.max), "%s", v);
        else if (strcmp(k, "--step") == 0)
            snprintf(d.step, sizeof(d.step), "%s", v);
        else if (strcmp(k, "--budget") == 0)
            snprintf(d.budget, sizeof(d.budget), "%s", v);
        else if (strcmp(k, "--dlaunch") == 0)
            d.dlaunch = v;
        else if (strcmp(k, "--mpi-worker") == 0)
            d.mpi_worker = v;
        else if (strcmp(k, "--recorder-ab") == 0) {
            char *end;
            long r = strtol(v, &end, 10);
            if (*end != '\0' || r < 1 || r > 64)
                return usage();
            d.ab_rounds = (int)r;
        } else
            return usage();
    }
    if (d.mpi && access(d.mpi_worker, X_OK) != 0) {
        fprintf(stderr, "allreduce: no MPI worker at %s; comparing nothing (--no-mpi)\n",
                d.mpi_worker);
        d.mpi = 0;
    }
    snprintf(d.dir, sizeof(d.dir), "/tmp/dl-bench-XXXXXX");
    if (mkdtemp(d.dir) == NULL)
        return 2;
    char rows[128];
    snprintf(rows, sizeof(rows), "%s/rows.txt", d.dir);
    /* The pairs: every world with every transport. */
    char wl[64], tl[64];
    snprintf(wl, sizeof(wl), "%s", d.worlds);
    for (char *ws = strtok(wl, ","); ws != NULL; ws = strtok(NULL, ",")) {
        char *end;
        long w = strtol(ws, &end, 10);
        if (*end != '\0' || w < 2 || w > 64)
            return usage();
        snprintf(tl, sizeof(tl), "%s", d.transports);
        for (char *save = NULL, *t = strtok_r(tl, ",", &save); t != NULL;
             t = strtok_r(NULL, ",", &save)) {
            if (d.ab_rounds > 0)
                recorder_ab(&d, (int)w, t);
            else
                bench_pair(&d, (int)w, t);
        }
    }
    if (d.ab_rounds > 0) {
        nftw(d.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 0;
    }
    load_rows(&d, rows);
    for (int i = 0; d.json && i < d.nrows; i++) {
        const row_t *r = &d.rows[i];
        printf("{\"impl\":\"%s\",\"transport\":\"%s\",\"world\":%d,\"bytes\":%zu,"
               "\"time_us\":%.3f,\"busbw_gbs\":%.4f}\n",
               r->impl, r->transport, r->world, r->bytes, r->time_us, r->busbw);
    }
    if (!d.json) {
        snprintf(wl, sizeof(wl), "%s", d.worlds);
        for (char *ws = strtok(wl, ","); ws != NULL; ws = strtok(NULL, ",")) {
            snprintf(tl, sizeof(tl), "%s", d.transports);
            for (char *save = NULL, *t = strtok_r(tl, ",", &save); t != NULL;
                 t = strtok_r(NULL, ",", &save))
                d.ab ? print_ab(&d, (int)strtol(ws, NULL, 10), t)
                     : print_table(&d, (int)strtol(ws, NULL, 10), t);
        }
    }
    nftw(d.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return d.nrows > 0 ? 0 : 1;
}
