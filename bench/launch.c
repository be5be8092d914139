/* bench/launch: median wall time to start and finish 8 workers of /bin/true with dlaunch, side by
 * side with the spawn floor, Open MPI's and MPICH's mpirun and torchrun, in one run; and dlaunch
 * given torchrun's own command line (flags and a positional Python script) beside torchrun on
 * the same empty script.
 *
 *   bench/launch [--runs N] [--workers N] [--baseline PATH] [--no-peers] [--log-dir DIR] [--json]
 *
 * --baseline adds another build's dlaunch (before a change) as a row; dlaunch, the baseline and
 * the floor are run in turn, run by run, so that the machine's load weighs on each alike.
 * --no-peers leaves out Open MPI, MPICH and torchrun. --log-dir: the folder under which the runs'
 * log folder is made (default /tmp). dlaunch creates 18 files and folders a launch there, and what
 * a creation costs is the file system's: on an ext4 without a journal, whose allocator passes over
 * every inode freed in the last minute, a folder that other jobs fill and empty (a shared /tmp)
 * makes each one cost up to a millisecond; a tmpfs (/dev/shm) measures the launcher alone.
 *
 * Every tool is started the same way (posix_spawn, output to /dev/null, waitpid), so the figures
 * include each launcher's own start-up. Ratios are against dlaunch in the same run. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    const char *tool;
    char *argv[24];
    double median_s;
    double min_s;
    int ok;
    const char *why; /* when not ok */
} row_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs argv once; returns seconds, or -1 when it fails. */
static double run_once(char **argv)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status;

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    double t0 = now();
    int r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0)
        return -1;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    double t = now() - t0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? t : -1;
}

static void summarize(row_t *row, double *t, int runs)
{
    qsort(t, (size_t)runs, sizeof(double), cmp_double);
    row->median_s = runs % 2 ? t[runs / 2] : (t[runs / 2 - 1] + t[runs / 2]) / 2;
    row->min_s = t[0];
    row->ok = 1;
}

/* Rows measured in turn, run by run (each ok row's first run a warm-up). */
static void measure_in_turn(row_t **rs, size_t n, int runs)
{
    double *t = calloc((size_t)runs * n, sizeof(double));
    for (size_t j = 0; j < n; j++)
        rs[j]->ok = t != NULL && run_once(rs[j]->argv) >= 0;
    for (int i = 0; i < runs && t != NULL; i++) {
        for (size_t j = 0; j < n; j++) {
            if (!rs[j]->ok)
                continue;
            t[j * (size_t)runs + (size_t)i] = run_once(rs[j]->argv);
            if (t[j * (size_t)runs + (size_t)i] < 0) {
                rs[j]->ok = 0;
                rs[j]->why = "a run failed";
            }
        }
    }
    for (size_t j = 0; j < n; j++) {
        if (rs[j]->ok)
            summarize(rs[j], t + j * (size_t)runs, runs);
        else if (rs[j]->why == NULL)
            rs[j]->why = "failed to run";
    }
    free(t);
}

static void measure(row_t *row, int runs)
{
    double *t = calloc((size_t)runs, sizeof(double));
    if (t == NULL || run_once(row->argv) < 0) { /* also a warm-up */
        row->ok = 0;
        row->why = row->why ? row->why : "failed to run";
        free(t);
        return;
    }
    for (int i = 0; i < runs; i++) {
        t[i] = run_once(row->argv);
        if (t[i] < 0) {
            row->ok = 0;
            row->why = "a run failed";
            free(t);
            return;
        }
    }
    summarize(row, t, runs);
    free(t);
}

static int have(const char *prog)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

static const char *bin_dir(const char *argv0)
{
    static char dir[4096];
    snprintf(dir, sizeof(dir), "%s", argv0);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        return ".";
    *slash = '\0';
    return dir;
}

int main(int argc, char **argv)
{
    int runs = 21, json = 0, peers = 1;
    const char *baseline = NULL, *log_base = "/tmp";
    char workers[16] = "8";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 21;
        else if (strcmp(argv[i], "--baseline") == 0 && i + 1 < argc)
            baseline = argv[++i];
        else if (strcmp(argv[i], "--no-peers") == 0)
            peers = 0;
        else if (strcmp(argv[i], "--log-dir") == 0 && i + 1 < argc)
            log_base = argv[++i];
        else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc)
            snprintf(workers, sizeof(workers), "%d", atoi(argv[++i]) > 0 ? atoi(argv[i]) : 8);
        else {
            fprintf(stderr,
                    "usage: %s [--runs N] [--workers N] [--baseline PATH] [--no-peers] "
                    "[--log-dir DIR] [--json]\n",
                    argv[0]);
            return 2;
        }
    }

    const char *dir = bin_dir(argv[0]);
    static char dlaunch[4200], floor_bin[4200], logdir[4200];
    static char torch_script[4300], torch_wrapper[4300];
    snprintf(dlaunch, sizeof(dlaunch), "%s/../cmd/dlaunch", dir);
    snprintf(floor_bin, sizeof(floor_bin), "%s/spawn-floor", dir);
    snprintf(logdir, sizeof(logdir), "%s/dl-bench-launch-XXXXXX", log_base);
    if (mkdtemp(logdir) == NULL) {
        fprintf(stderr, "bench/launch: --log-dir %s: %s\n", log_base, strerror(errno));
        return 1;
    }
    int as_root = geteuid() == 0;
    /* Both torchrun rows run their workers with the interpreter that has torch. */
    setenv("PYTHON_EXEC", "/usr/bin/python3", 1);

    row_t rows[] = {
        {.tool = "dlaunch",
         .argv = {dlaunch, "--gpus-per-node", workers, "--log-dir", logdir, "--", "/bin/true"}},
        {.tool = "floor", .argv = {floor_bin, workers, "/bin/true"}},
        {.tool = "openmpi",
         .argv = {"mpirun.openmpi", "-n", workers, "--oversubscribe", "/bin/true"}},
        {.tool = "mpich", .argv = {"mpirun.mpich", "-n", workers, "/bin/true"}},
        {.tool = "torchrun",
         .argv = {"/usr/bin/python3", torch_wrapper, "--standalone", "--nproc_per_node", workers,
                  torch_script}},
        {.tool = "dlaunch-as-torchrun",
         .argv = {dlaunch, "--standalone", "--nproc_per_node", workers, "--log-dir", logdir,
                  torch_script}},
        {.tool = "dlaunch-baseline",
         .argv = {(char *)baseline, "--gpus-per-node", workers, "--log-dir", logdir, "--",
                  "/bin/true"}},
    };
    size_t nrows = sizeof(rows) / sizeof(rows[0]);
    if (as_root) { /* Open MPI refuses root unless told */
        rows[2].argv[5] = rows[2].argv[4];
        rows[2].argv[4] = "--allow-run-as-root";
    }
    snprintf(torch_script, sizeof(torch_script), "%s/empty.py", logdir);
    snprintf(torch_wrapper, sizeof(torch_wrapper), "%s/torchrun-wrapper.py", logdir);
    FILE *f = fopen(torch_script, "w");
    if (f != NULL)
        fclose(f);
    /* Debian's torch 1.13 on Python 3.11 dies parsing its own --redirects default: 3.11 no
     * longer lists the zero member of an IntFlag, so Std.from_str("0") returns None. Mapping
     * that None back to Std.NONE lets its real launcher run unchanged. */
    f = fopen(torch_wrapper, "w");
    if (f != NULL) {
        fputs("import sys\n"
              "import torch.distributed.elastic.multiprocessing.api as api\n"
              "_from_str = api.Std.from_str.__func__\n"
              "def _fixed(cls, vm):\n"
              "    r = _from_str(cls, vm)\n"
              "    if isinstance(r, dict):\n"
              "        return {k: cls.NONE if v is None else v for k, v in r.items()}\n"
              "    return cls.NONE if r is None else r\n"
              "api.Std.from_str = classmethod(_fixed)\n"
              "from torch.distributed.run import main\n"
              "sys.exit(main())\n",
              f);
        fclose(f);
    }

    if (baseline == NULL)
        rows[6].why = "no --baseline";
    if (!peers)
        for (size_t i = 2; i < 6; i++)
            rows[i].why = "--no-peers";
    row_t *together[3] = {&rows[0], &rows[1], &rows[6]};
    measure_in_turn(together, baseline != NULL ? 3 : 2, runs);
    for (size_t i = 2; i < 6; i++) {
        row_t *r = &rows[i];
        if (r->why != NULL)
            continue;
        if (strcmp(r->tool, "openmpi") == 0 && !have("mpirun.openmpi"))
            r->why = "not installed (openmpi-bin)";
        else if (strcmp(r->tool, "mpich") == 0 && !have("mpirun.mpich"))
            r->why = "not installed (mpich)";
        else if (strcmp(r->tool, "torchrun") == 0 &&
                 system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
            r->why = "not installed (python3-torch)";
        if (r->why != NULL)
            continue;
        /* torchrun takes seconds a run: fewer runs keep the benchmark short. */
        measure(r, strcmp(r->tool, "torchrun") == 0 && runs > 5 ? 5 : runs);
    }

    double base = rows[0].ok ? rows[0].median_s : 0;
    if (!json)
        printf("log files under %s\n%-20s %8s %12s %12s %14s\n", log_base, "tool", "workers",
               "median_ms", "min_ms", "vs dlaunch");
    for (size_t i = 0; i < nrows; i++) {
        row_t *r = &rows[i];
        if (json) {
            if (r->ok)
                printf("{\"tool\": \"%s\", \"workers\": %s, \"median_s\": %.6f, \"min_s\": %.6f, "
                       "\"ratio_to_dlaunch\": %.3f}\n",
                       r->tool, workers, r->median_s, r->min_s, base > 0 ? r->median_s / base : 0);
            else
                printf("{\"tool\": \"%s\", \"workers\": %s, \"median_s\": null, \"skipped\": "
                       "\"%s\"}\n",
                       r->tool, workers, r->why);
        } else if (r->ok) {
            printf("%-20s %8s %12.2f %12.2f %13.2fx\n", r->tool, workers, r->median_s * 1e3,
                   r->min_s * 1e3, base > 0 ? r->median_s / base : 0);
        } else {
            printf("%-20s %8s %12s %12s   (%s)\n", r->tool, workers, "-", "-", r->why);
        }
    }
    /* The drop-in's figure: the same command line and script, torchrun against dlaunch. */
    if (!json && rows[4].ok && rows[5].ok)
        printf("torchrun's command line and script: torchrun takes %.1fx dlaunch's time\n",
               rows[4].median_s / rows[5].median_s);
    char cmd[4300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", logdir);
    return system(cmd) == 0 ? 0 : 1;
}
