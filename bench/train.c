/* bench/train: training throughput of the bundled trainer (dlaunch-train) with 1 and 2 workers
 * launched by dlaunch, side by side in one run with PyTorch DDP (gloo, CPU, one thread a rank) on
 * the same model, batch and data (bench/train_torch.py, also launched by dlaunch).
 *
 *   bench/train [--steps N] [--warmup N] [--runs N] [--workers 1,2] [--json] [--keep-coretype]
 *               [--no-torch] [--dlaunch PATH] [--trainer PATH] [--python PATH] [--script PATH]
 *               [--dataset DIR] [--recorder-ab] [--recovery-ab] [--peer-reads-ab] [--no-pair]
 *
 * --recorder-ab adds, for each worker count, a row of ours with the collective's flight recorder
 * off (DLAUNCH_COLL_RECORDER=off), interleaved with the others like any row, and a column with
 * each dlaunch row against its recorder-off twin (the median of the rounds' ratios).
 *
 * --recovery-ab adds, for each worker count above 1, a row of ours with --recovery restart,
 * interleaved like any row. The trainer's default is in-job recovery (the state of the last step
 * kept whole while the next is made, the momentum blocks in shared memory), so the plain row is
 * in-job and this one shows what it costs: its `default/this` column is the plain row of the same
 * count against it.
 *
 * --peer-reads-ab adds, for each worker count above 1, a row of ours with peer_reads off
 * (DLAUNCH_TRAIN_PEER_READS=false: the sharded step copies every block through the collective
 * instead of reading it from the owner's buffer), and `default/this` says what reading in place
 * gains.
 *
 * Beside the 1- and 2-worker rows, `1+1` runs two independent 1-worker jobs at the same time and
 * sums their rates: what the machine's two cores give two workers that never wait for each other,
 * the ceiling of any 2-worker row (on a VM whose two vCPUs share a physical core, or a host that
 * is busy elsewhere, it is well under twice one worker). The 2-worker row is also given against
 * it (`vs 1+1`); --no-pair leaves the row out.
 *
 * Each figure is steady-state samples a second over all workers: the trainer's own per-window
 * rate from its progress lines, windows inside the first `warmup` steps left out; PyTorch's is
 * timed by the script after `warmup` steps. Runs of the rows are interleaved, so a burst of load
 * from elsewhere hits every row alike; the table shows each row's median and best run, and each
 * ratio is the median of the ratios within one round of runs.
 *
 * OPENBLAS_CORETYPE is removed from every child's environment unless --keep-coretype, so both
 * sides use the kernels OpenBLAS picks for the CPU (the table names them). PyTorch rows also
 * get OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DL_BENCH_TRAIN_TORCH
#define DL_BENCH_TRAIN_TORCH "bench/train_torch.py"
#endif

#define MAX_RUNS 64
#define MAX_ROWS 24 /* 4 worker counts: ours, recorder off, restart, copied, PyTorch; 1+1 */

extern char **environ;

typedef struct {
    const char *impl; /* "dlaunch" or "pytorch" */
    int workers;
    int n;
    double sps[MAX_RUNS];
    char kernels[64];
    char detail[128]; /* overlap mode, or torch version */
    const char *why;  /* set when a run failed */
    bool norec;       /* the flight recorder off */
    bool restart;     /* --recovery restart (the trainer's default is in-job) */
    bool copied;      /* peer_reads off */
    bool pair;        /* two independent 1-worker jobs at once, their rates summed */
} row_t;

typedef struct {
    int steps, warmup, runs, json, keep_coretype, torch, recorder_ab, recovery_ab, reads_ab, pair;
    int workers[4];
    int n_workers;
    char dlaunch[PATH_MAX], trainer[PATH_MAX], script[PATH_MAX];
    const char *python, *dataset;
    char tmp[PATH_MAX];
} opts_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const row_t *r)
{
    double t[MAX_RUNS];
    memcpy(t, r->sps, sizeof(double) * (size_t)r->n);
    qsort(t, (size_t)r->n, sizeof(double), cmp_double);
    return r->n % 2 ? t[r->n / 2] : (t[r->n / 2 - 1] + t[r->n / 2]) / 2;
}

static double best(const row_t *r)
{
    double b = 0;
    for (int i = 0; i < r->n; i++)
        b = r->sps[i] > b ? r->sps[i] : b;
    return b;
}

/* The median over runs of r's figure against base's in the same round of the interleaving:
 * what the machine did in between (this VM's speed drifts by 15% over minutes) cancels out. */
static double paired_ratio(const row_t *r, const row_t *base)
{
    row_t q = {.n = r->n < base->n ? r->n : base->n};
    for (int i = 0; i < q.n; i++)
        q.sps[i] = r->sps[i] / base->sps[i];
    return median(&q);
}

/* A row of ours as a user runs it: no A/B variant, not the side-by-side pair. */
static bool plain(const row_t *r)
{
    return strcmp(r->impl, "dlaunch") == 0 && !r->norec && !r->restart && !r->copied && !r->pair;
}

static double ours_rate(FILE *f, int warmup, int global_batch, row_t *row);
static double torch_rate(FILE *f, row_t *row);

/* Starts argv with stdout and stderr into out_path; returns its pid or -1. */
static pid_t start(char **argv, const char *out_path)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path, O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return r == 0 ? pid : -1;
}

/* Waits for pid; returns its exit status (128 + signal) or -1. */
static int finish(pid_t pid)
{
    int status;

    if (pid < 0)
        return -1;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The rate of one finished run from its output file, or -1. */
static double rate_of(const opts_t *o, row_t *row, int status, const char *out, int torch)
{
    FILE *f = fopen(out, "r");
    double sps = -1;
    if (status == 0 && f != NULL)
        sps = torch ? torch_rate(f, row) : ours_rate(f, o->warmup, 64 * row->workers, row);
    if (f != NULL)
        fclose(f);
    return sps;
}

/* Steady-state samples/s from the trainer's progress lines ("step S/T ... samples/s R", one every
 * `every` steps, each the rate over its own window); windows ending by `warmup` are left out. */
static double ours_rate(FILE *f, int warmup, int global_batch, row_t *row)
{
    char line[1024];
    long prev = 0;
    double samples = 0, seconds = 0;

    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p;
        if ((p = strstr(line, "OpenBLAS ")) != NULL && strstr(p, " kernels") != NULL)
            sscanf(p, "OpenBLAS %63s", row->kernels);
        if (strstr(line, "(overlap on)") != NULL)
            snprintf(row->detail, sizeof(row->detail), "overlap on");
        if (strstr(line, "(overlap off)") != NULL)
            snprintf(row->detail, sizeof(row->detail), "overlap off%s",
                     strstr(line, "each rank updating") != NULL ? ", sharded update" : "");
        const char *s = strstr(line, " step ");
        const char *r = strstr(line, " samples/s ");
        if (s == NULL || r == NULL || strstr(line, "epoch ") == NULL)
            continue;
        long step = strtol(s + 6, NULL, 10);
        double rate = strtod(r + 11, NULL);
        if (step > warmup && prev >= warmup && rate > 0) {
            samples += (double)(step - prev) * global_batch;
            seconds += (double)(step - prev) * global_batch / rate;
        }
        prev = step;
    }
    return seconds > 0 ? samples / seconds : -1;
}

static double torch_rate(FILE *f, row_t *row)
{
    char line[2048];
    double sps = -1;

    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "\"samples_per_s\": ");
        if (p == NULL)
            continue;
        sps = strtod(p + 17, NULL);
        const char *k = strstr(line, "\"blas_kernels\": \"");
        if (k != NULL)
            sscanf(k + 17, "%63[^\"]", row->kernels);
        const char *v = strstr(line, "\"torch\": \"");
        if (v != NULL) {
            char ver[64] = "";
            sscanf(v + 10, "%63[^\"]", ver);
            snprintf(row->detail, sizeof(row->detail), "torch %s, gloo", ver);
        }
    }
    return sps;
}

static void measure(const opts_t *o, row_t *row, int i)
{
    char out[PATH_MAX + 64], ws[16], st[48], wu[48], le[48], ds[PATH_MAX + 16];
    char logdir[PATH_MAX + 8];
    char *argv[32];
    int k = 0;

    if (row->why != NULL)
        return;
    snprintf(out, sizeof(out), "%s/%s%s%s%s%s-%d-%d.out", o->tmp, row->impl,
             row->norec ? "-norec" : "", row->restart ? "-restart" : "",
             row->copied ? "-copied" : "", row->pair ? "-pair" : "", row->workers, i);
    snprintf(logdir, sizeof(logdir), "%s/logs", o->tmp);
    snprintf(ws, sizeof(ws), "%d", row->workers);
    argv[k++] = (char *)o->dlaunch;
    argv[k++] = "--gpus-per-node";
    argv[k++] = ws;
    argv[k++] = "--log-dir";
    argv[k++] = logdir;
    if (row->restart) {
        argv[k++] = "--recovery";
        argv[k++] = "restart";
    }
    argv[k++] = "--";
    if (strcmp(row->impl, "dlaunch") == 0) {
        snprintf(st, sizeof(st), "steps=%d", o->steps);
        snprintf(le, sizeof(le), "log_every=%d", o->warmup > 0 ? o->warmup : 100);
        snprintf(ds, sizeof(ds), "dataset_dir=%s", o->dataset);
        argv[k++] = (char *)o->trainer;
        char *sets[] = {st, le, "eval_every=1000000000", ds};
        for (size_t j = 0; j < sizeof(sets) / sizeof(sets[0]); j++) {
            argv[k++] = "--set";
            argv[k++] = sets[j];
        }
    } else {
        snprintf(st, sizeof(st), "%d", o->steps);
        snprintf(wu, sizeof(wu), "%d", o->warmup);
        argv[k++] = (char *)o->python;
        argv[k++] = (char *)o->script;
        argv[k++] = "--steps";
        argv[k++] = st;
        argv[k++] = "--warmup";
        argv[k++] = wu;
        argv[k++] = "--dataset";
        argv[k++] = (char *)o->dataset;
    }
    argv[k] = NULL;

    int torch = strcmp(row->impl, "pytorch") == 0;
    if (torch) {
        setenv("OMP_NUM_THREADS", "1", 1);
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
    }
    if (row->norec)
        setenv("DLAUNCH_COLL_RECORDER", "off", 1);
    if (row->copied)
        setenv("DLAUNCH_TRAIN_PEER_READS", "false", 1);
    char out2[PATH_MAX + 72];
    snprintf(out2, sizeof(out2), "%s.2", out);
    pid_t first = start(argv, out), second = row->pair ? start(argv, out2) : -1;
    int status = finish(first), status2 = row->pair ? finish(second) : 0;
    unsetenv("DLAUNCH_COLL_RECORDER");
    unsetenv("DLAUNCH_TRAIN_PEER_READS");
    if (torch) {
        unsetenv("OMP_NUM_THREADS");
        unsetenv("OPENBLAS_NUM_THREADS");
    }
    double sps = rate_of(o, row, status, out, torch);
    if (row->pair) {
        double sps2 = rate_of(o, row, status2, out2, torch);
        sps = sps > 0 && sps2 > 0 ? sps + sps2 : -1;
    }
    if (sps <= 0) {
        fprintf(stderr, "bench/train: %s with %d workers failed (exit %d); its output: %s\n",
                row->impl, row->workers, status, out);
        row->why = "a run failed";
        return;
    }
    row->sps[row->n++] = sps;
}

static int have_torch(const char *python)
{
    char *argv[] = {(char *)python, "-c", "import torch.distributed", NULL};
    return access(python, X_OK) == 0 && finish(start(argv, "/dev/null")) == 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void beside_me(char *buf, size_t len, const char *rel)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(buf, len, "%s/%s", dirname(self), rel);
}

static int parse_args(opts_t *o, int argc, char **argv)
{
    *o = (opts_t){.steps = 2000,
                  .warmup = 200,
                  .runs = 3,
                  .torch = 1,
                  .pair = 1,
                  .workers = {1, 2},
                  .n_workers = 2,
                  .python = "/usr/bin/python3",
                  .dataset = "/usr/share/datasets/fashion-mnist"};
    beside_me(o->dlaunch, sizeof(o->dlaunch), "../cmd/dlaunch");
    beside_me(o->trainer, sizeof(o->trainer), "../trainer/dlaunch-train");
    snprintf(o->script, sizeof(o->script), "%s", DL_BENCH_TRAIN_TORCH);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (strcmp(a, "--keep-coretype") == 0) {
            o->keep_coretype = 1;
            continue;
        }
        if (strcmp(a, "--no-pair") == 0) {
            o->pair = 0;
            continue;
        }
        if (strcmp(a, "--no-torch") == 0) {
            o->torch = 0;
            continue;
        }
        if (strcmp(a, "--recovery-ab") == 0) {
            o->recovery_ab = 1;
            continue;
        }
        if (strcmp(a, "--peer-reads-ab") == 0) {
            o->reads_ab = 1;
            continue;
        }
        if (strcmp(a, "--recorder-ab") == 0) {
            o->recorder_ab = 1;
            continue;
        }
        if (v == NULL)
            return -EINVAL;
        i++;
        if (strcmp(a, "--steps") == 0 || strcmp(a, "--warmup") == 0 || strcmp(a, "--runs") == 0) {
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno != 0 || *end != '\0' || n < 0 || n > 100000000)
                return -EINVAL;
            if (a[2] == 's')
                o->steps = (int)n;
            else if (a[2] == 'w')
                o->warmup = (int)n;
            else
                o->runs = (int)n;
        } else if (strcmp(a, "--workers") == 0) {
            o->n_workers = 0;
            for (const char *p = v; *p != '\0' && o->n_workers < 4;) {
                errno = 0;
                long n = strtol(p, &end, 10);
                if (errno != 0 || end == p || n < 1 || n > 1024 || (*end != ',' && *end != '\0'))
                    return -EINVAL;
                o->workers[o->n_workers++] = (int)n;
                p = *end == ',' ? end + 1 : end;
            }
        } else if (strcmp(a, "--dlaunch") == 0) {
            snprintf(o->dlaunch, sizeof(o->dlaunch), "%s", v);
        } else if (strcmp(a, "--trainer") == 0) {
            snprintf(o->trainer, sizeof(o->trainer), "%s", v);
        } else if (strcmp(a, "--script") == 0) {
            snprintf(o->script, sizeof(o->script), "%s", v);
        } else if (strcmp(a, "--python") == 0) {
            o->python = v;
        } else if (strcmp(a, "--dataset") == 0) {
            o->dataset = v;
        } else {
            return -EINVAL;
        }
    }
    if (o->runs < 1 || o->runs > MAX_RUNS || o->n_workers == 0 || o->warmup >= o->steps)
        return -EINVAL;
    return 0;
}

static void print_table(const opts_t *o, const row_t *rows, int n)
{
    const row_t *ours1 = NULL;
    const row_t *pair = NULL;
    for (int i = 0; i < n; i++) {
        if (plain(&rows[i]) && rows[i].workers == 1 && rows[i].why == NULL)
            ours1 = &rows[i];
        if (rows[i].pair && rows[i].why == NULL)
            pair = &rows[i];
    }

    if (o->json) {
        for (int i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            if (r->why != NULL) {
                printf("{\"impl\": \"%s\", \"workers\": %d, \"error\": \"%s\"}\n", r->impl,
                       r->workers, r->why);
                continue;
            }
            printf("{\"impl\": \"%s\", \"workers\": %d, \"side_by_side\": %s, \"recorder\": %s, "
                   "\"recovery\": \"%s\", \"peer_reads\": %s, \"samples_per_s\": %.0f, "
                   "\"best_samples_per_s\": %.0f, \"blas_kernels\": \"%s\", \"detail\": \"%s\", "
                   "\"runs\": [",
                   r->impl, r->workers, r->pair ? "true" : "false", r->norec ? "false" : "true",
                   r->restart ? "restart" : "in-job", r->copied ? "false" : "true", median(r),
                   best(r), r->kernels, r->detail);
            for (int j = 0; j < r->n; j++)
                printf("%s%.0f", j ? ", " : "", r->sps[j]);
            printf("]}\n");
        }
        return;
    }
    printf("%d steps of batch 64 a worker, the first %d left out; median (best) of %d runs, "
           "ratios the median of each round's; OPENBLAS_CORETYPE %s\n",
           o->steps, o->warmup, o->runs,
           o->keep_coretype ? "as in the environment" : "unset for every row");
    printf("%-8s %7s %14s %14s %10s %12s %8s %10s  %s\n", "impl", "workers", "samples/s", "best",
           "vs ours1", "vs pytorch", "rec/off", "default/this", "kernels, notes");
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        if (r->why != NULL) {
            printf("%-8s %7d %s\n", r->impl, r->workers, r->why);
            continue;
        }
        const row_t *peer = NULL;
        for (int j = 0; j < n; j++)
            if (strcmp(rows[j].impl, "pytorch") == 0 && rows[j].workers == r->workers &&
                rows[j].why == NULL)
                peer = &rows[j];
        const row_t *twin = NULL, *base = NULL;
        for (int j = 0; j < n; j++)
            if (rows[j].norec && plain(r) && rows[j].workers == r->workers && rows[j].why == NULL)
                twin = &rows[j];
        for (int j = 0; j < n && (r->restart || r->copied); j++)
            if (plain(&rows[j]) && rows[j].workers == r->workers && rows[j].why == NULL)
                base = &rows[j];
        char vs1[16] = "-", vsp[16] = "-", vsr[16] = "-", vsj[16] = "-";
        if (base != NULL)
            snprintf(vsj, sizeof(vsj), "%.3fx", paired_ratio(base, r));
        if (ours1 != NULL)
            snprintf(vs1, sizeof(vs1), "%.2fx", paired_ratio(r, ours1));
        if (peer != NULL && strcmp(r->impl, "dlaunch") == 0)
            snprintf(vsp, sizeof(vsp), "%.2fx", paired_ratio(r, peer));
        if (twin != NULL)
            snprintf(vsr, sizeof(vsr), "%.3fx", paired_ratio(r, twin));
        char workers[16];
        snprintf(workers, sizeof(workers), r->pair ? "1+1" : "%d", r->workers);
        printf("%-8s %7s %14.0f %14.0f %10s %12s %8s %12s  %s%s%s%s%s%s%s\n", r->impl, workers,
               median(r), best(r), vs1, r->pair ? "-" : vsp, vsr, vsj, r->kernels,
               r->detail[0] ? ", " : "", r->detail, r->norec ? ", flight recorder off" : "",
               r->restart ? ", --recovery restart" : "",
               r->copied ? ", peer_reads off (blocks copied through the collective)" : "",
               r->pair ? ", two 1-worker jobs at once, rates summed" : "");
    }
    for (int i = 0; i < n && pair != NULL; i++)
        if (plain(&rows[i]) && rows[i].workers == 2 && rows[i].why == NULL)
            printf("2 workers against two 1-worker jobs side by side (this machine's ceiling for "
                   "2 workers): %.2fx\n",
                   paired_ratio(&rows[i], pair));
}

int main(int argc, char **argv)
{
    opts_t o;
    row_t rows[MAX_ROWS];
    int n = 0;

    if (parse_args(&o, argc, argv) < 0) {
        fprintf(stderr,
                "usage: %s [--steps N] [--warmup N] [--runs N] [--workers 1,2] [--json] "
                "[--keep-coretype] [--no-torch] [--no-pair] [--dlaunch PATH] [--trainer PATH] "
                "[--python PATH] [--script PATH] [--dataset DIR] [--recorder-ab] "
                "[--recovery-ab] [--peer-reads-ab]\n",
                argv[0]);
        return 2;
    }
    if (!o.keep_coretype)
        unsetenv("OPENBLAS_CORETYPE");
    for (int i = 0; i < o.n_workers; i++) {
        rows[n++] = (row_t){.impl = "dlaunch", .workers = o.workers[i]};
        if (o.recorder_ab)
            rows[n++] = (row_t){.impl = "dlaunch", .workers = o.workers[i], .norec = true};
        if (o.recovery_ab && o.workers[i] > 1)
            rows[n++] = (row_t){.impl = "dlaunch", .workers = o.workers[i], .restart = true};
        if (o.reads_ab && o.workers[i] > 1)
            rows[n++] = (row_t){.impl = "dlaunch", .workers = o.workers[i], .copied = true};
        if (o.pair && o.workers[i] == 1)
            rows[n++] = (row_t){.impl = "dlaunch", .workers = 1, .pair = true};
    }
    if (o.torch) {
        int ok = have_torch(o.python) && access(o.script, R_OK) == 0;
        for (int i = 0; i < o.n_workers; i++)
            rows[n++] = (row_t){.impl = "pytorch",
                                .workers = o.workers[i],
                                .why = ok ? NULL : "skipped: no torch or no script"};
    }
    snprintf(o.tmp, sizeof(o.tmp), "%s/dl-bench-train-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(o.tmp) == NULL) {
        fprintf(stderr, "bench/train: %s: %s\n", o.tmp, strerror(errno));
        return 1;
    }
    for (int run = 0; run < o.runs; run++)
        for (int i = 0; i < n; i++)
            measure(&o, &rows[i], run);
    print_table(&o, rows, n);
    int failed = 0;
    for (int i = 0; i < n; i++)
        failed |= rows[i].why != NULL && strncmp(rows[i].why, "skipped", 7) != 0;
    if (!failed)
        nftw(o.tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed ? 1 : 0;
}
