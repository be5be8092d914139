/* dlaunch-train: the bundled data-parallel trainer as a worker program.
 *
 * Settings come from the defaults, then DLAUNCH_TRAIN_<KEY> variables, then --set key=value
 * flags (the later wins). The rank and world size come from RANK and WORLD_SIZE as the agent sets
 * them. SIGINT and SIGTERM stop the run after the current step, with a checkpoint.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm-coll.h"
#include "config.h"
#include "trainer.h"

static volatile sig_atomic_t stop_signal;

typedef struct {
    long rank;
    uint64_t fail_at_step; /* 0: never */
    int fail_phase;        /* 0: after the step; else a DL_TRAIN_PHASE_* inside it */
    uint64_t fail_delay_us;
    FILE *checksums;       /* where crc_line writes; NULL: stdout */
    bool prefix;           /* own prefix on each line: not under dlaunch, which adds its own */
    uint64_t hang_at_step; /* 0: never */
    bool killer_pending;   /* the killer thread of fail_delay_us may not have fired yet */
    pthread_t killer;
    double slow_s; /* 0: not slowed; else slept in each step's compute */
    double slow_after_s;
    double first_step_at; /* monotonic seconds; 0 until the first step */
} prog_t;

static void on_signal(int sig)
{
    stop_signal = sig;
}

static bool stop_signalled(void)
{
    return stop_signal != 0;
}

static int should_stop(void *ud, uint64_t step)
{
    const prog_t *p = ud;

    /* A crash on purpose, for restart tests: no stop vote, no checkpoint, no goodbye. */
    if (p->fail_at_step > 0 && step == p->fail_at_step && p->fail_phase == 0) {
        printf("%sfail_at_step: killing myself after step %llu\n", p->prefix ? "[train] " : "",
               (unsigned long long)step);
        raise(SIGKILL);
    }
    return stop_signal != 0;
}

/* A hang on purpose, for hang-report tests: stopped in the middle of a step, the other ranks
 * wait for it in the gradient sum. */
static void mid_step(void *ud, uint64_t step)
{
    const prog_t *p = ud;

    if (p->hang_at_step > 0 && step == p->hang_at_step) {
        printf("%shang_at_step: stopping myself in step %llu\n", p->prefix ? "[train] " : "",
               (unsigned long long)step);
        raise(SIGSTOP);
    }
}

static void *killer(void *arg)
{
    uint64_t us = *(const uint64_t *)arg;
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    kill(getpid(), SIGKILL);
    return NULL;
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A straggler on purpose (straggler rule tests): asleep inside the compute phase, so the time
 * counts as its compute, as a slow device's would, and the same on a loaded machine as on a
 * quiet one (a stop from outside lands in a wait as often as in a compute). */
static void slow_down(prog_t *p, uint64_t step)
{
    double t = monotonic_s();

    if (p->first_step_at == 0)
        p->first_step_at = t;
    if (t - p->first_step_at < p->slow_after_s)
        return;
    if (p->slow_after_s >= 0) {
        printf("%sslow_ms_per_step: sleeping %.1f ms in each step's compute from step %llu\n",
               p->prefix ? "[train] " : "", p->slow_s * 1e3, (unsigned long long)step);
        p->slow_after_s = -1; /* said once */
    }
    time_t whole = (time_t)p->slow_s;
    struct timespec ts = {whole, (long)((p->slow_s - (double)whole) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR && stop_signal == 0)
        ;
}

/* A crash on purpose inside a step (recovery tests): fail_delay_us after entering the phase,
 * from a thread, so that the rank dies wherever it is by then (inside a collective, say). A
 * loaded machine can run the thread late: the next phase waits for it, so that the rank never
 * gets past the step after the one it was told to die in. */
static void on_phase(void *ud, uint64_t step, int phase)
{
    prog_t *p = ud;

    if (p->killer_pending)
        pthread_join(p->killer, NULL); /* does not return: the thread kills the process */
    if (p->slow_s > 0 && phase == DL_TRAIN_PHASE_COMPUTE)
        slow_down(p, step);
    if (p->fail_at_step == 0 || step != p->fail_at_step || phase != p->fail_phase)
        return;
    printf("%sfail_at_step: killing myself in step %llu, %llu us into its %s\n",
           p->prefix ? "[train] " : "", (unsigned long long)step,
           (unsigned long long)p->fail_delay_us,
           phase == DL_TRAIN_PHASE_COMPUTE    ? "compute"
           : phase == DL_TRAIN_PHASE_EXCHANGE ? "gradient exchange"
           : phase == DL_TRAIN_PHASE_UPDATE   ? "update"
                                              : "parameter gather");
    if (p->fail_delay_us == 0)
        raise(SIGKILL);
    if (pthread_create(&p->killer, NULL, killer, &p->fail_delay_us) != 0)
        raise(SIGKILL);
    p->killer_pending = true;
    p->fail_at_step = 0;
}

static void log_line(void *ud, const char *line)
{
    const prog_t *p = ud;
    printf("%s%s\n", p->prefix ? "[train rank=0] " : "", line);
}

/* Every rank reports this line at each checkpoint and at the end: equal CRCs at the same step
 * mean the replicas are bitwise equal. Under dlaunch they go to rank_N.checksums in the attempt's
 * log folder, beside rank_N.out, unless dlaunch is --verbose: a line per rank per checkpoint is
 * noise on a console. */
static void crc_line(void *ud, uint64_t step, uint32_t crc, const char *path)
{
    prog_t *p = ud;
    FILE *f = p->checksums != NULL ? p->checksums : stdout;

    fprintf(f, "step %llu params_crc32 %08x%s%s\n", (unsigned long long)step, crc,
            path != NULL ? " checkpoint " : "", path != NULL ? path : "");
    fflush(f);
}

static int open_checksums(prog_t *p)
{
    const char *dir = getenv("DLAUNCH_ATTEMPT_DIR"), *verbose = getenv("DLAUNCH_VERBOSE");
    char path[4096];

    if (dir == NULL || *dir == '\0' || (verbose != NULL && strcmp(verbose, "1") == 0))
        return 0;
    snprintf(path, sizeof(path), "%s/rank_%ld.checksums", dir, p->rank);
    /* The log folder may be on shared storage: never through a link, into a FIFO or into a
     * file of another user. */
    struct stat st;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0640);
    int e = 0;
    if (fd < 0 || fstat(fd, &st) < 0)
        e = errno;
    else if (!S_ISREG(st.st_mode))
        e = EINVAL;
    else if (st.st_uid != geteuid())
        e = EPERM;
    if (e == 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        e = errno;
    if (e == 0 && (p->checksums = fdopen(fd, "a")) == NULL)
        e = errno;
    if (e != 0) {
        if (fd >= 0)
            close(fd);
        fprintf(stderr, "[train rank=%ld] %s: %s\n", p->rank, path,
                e == EINVAL  ? "not a regular file"
                : e == EPERM ? "another user's file"
                             : strerror(e));
        return -e;
    }
    return 0;
}

/* The command line: --set pairs are kept in order as typed and applied after the environment's
 * settings, so that each error names the pair's key as the environment's do. */
typedef struct {
    const char **pairs;
    size_t npairs, max_pairs;
    bool help, version;
} train_argv_t;

static int keep_pair(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    train_argv_t *a = obj;
    (void)o;
    (void)why;
    (void)whylen;
    if (a->npairs >= a->max_pairs)
        return -ERANGE; /* cannot happen: max_pairs is argc */
    a->pairs[a->npairs++] = text;
    return 0;
}

static const dl_opt_type_t pair_type = {"KEY=VALUE", keep_pair, NULL, false};

static const dl_opt_t argv_options[] = {
    {"set", NULL, 0, &pair_type, 0, 0, 0, NULL, NULL, "KEY=VALUE",
     "set one of the keys below (repeatable; wins over DLAUNCH_TRAIN_<KEY>)", DL_OPT_CLI_ONLY, 0},
    {"help", NULL, 'h', &dl_opt_bool, offsetof(train_argv_t, help), 0, 0, NULL, NULL, NULL,
     "show this help and exit", DL_OPT_FLAG | DL_OPT_CLI_ONLY | DL_OPT_STOP, 0},
    {"version", NULL, 0, &dl_opt_bool, offsetof(train_argv_t, version), 0, 0, NULL, NULL, NULL,
     "print the version and exit", DL_OPT_FLAG | DL_OPT_CLI_ONLY | DL_OPT_STOP, 0},
};

static const dl_opt_table_t argv_table = {
    argv_options, sizeof(argv_options) / sizeof(argv_options[0]), "DLAUNCH_TRAIN_", NULL, true};

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "Usage: %s [--set KEY=VALUE]...\n"
            "Trains an MLP on Fashion-MNIST with data parallelism (RANK, WORLD_SIZE).\n\n"
            "Options:\n",
            prog);
    dl_opt_print_help(&argv_table, f);
    fprintf(f, "\nKeys (each also from the variable DLAUNCH_TRAIN_<KEY>; --set wins):\n");
    for (size_t i = 0; i < dl_train_settings.n; i++) {
        const dl_opt_t *o = &dl_train_settings.opts[i];
        char help[512];
        snprintf(help, sizeof(help), "%s%s%s%s", o->help, o->def != NULL ? " [" : "",
                 o->def != NULL ? o->def : "", o->def != NULL ? "]" : "");
        dl_opt_print_item(f, o->name, help);
    }
}

static int set_pair(dl_train_config_t *cfg, const char *pair, const char *where)
{
    char key[64], err[DL_TRAIN_ERRLEN];
    const char *eq = strchr(pair, '=');

    if (eq == NULL || eq == pair || (size_t)(eq - pair) >= sizeof(key)) {
        fprintf(stderr, "dlaunch-train: %s: '%s': expected KEY=VALUE\n", where, pair);
        return -EINVAL;
    }
    memcpy(key, pair, (size_t)(eq - pair));
    key[eq - pair] = '\0';
    int r = dl_train_config_set(cfg, key, eq + 1, err, sizeof(err));
    if (r < 0)
        fprintf(stderr, "dlaunch-train: %s: %s\n", where, err);
    return r;
}

static void warn_unknown(void *ctx, const char *var, const char *closest)
{
    (void)ctx;
    fprintf(stderr, "dlaunch-train: warning: %s is no setting%s%s%s; it is ignored\n", var,
            closest ? " (did you mean " : "", closest ? closest : "", closest ? "?)" : "");
}

static int from_environment(dl_train_config_t *cfg)
{
    char err[DL_TRAIN_ERRLEN];
    extern char **environ;

    /* Under dlaunch the variables were checked, and typos named, before any worker started. */
    if (getenv("DLAUNCH_ATTEMPT_DIR") == NULL)
        dl_opt_unknown_vars(&dl_train_settings, environ, warn_unknown, NULL);
    if (dl_opt_from_env(&dl_train_settings, cfg, environ, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch-train: %s\n", err);
        return -EINVAL;
    }
    return 0;
}

static int env_int(const char *name, long min, long max, long def, long *ret)
{
    const char *v = getenv(name);

    if (v == NULL || v[0] == '\0') {
        *ret = def;
        return 0;
    }
    if (dl_parse_int(v, min, max, ret) < 0) {
        fprintf(stderr, "dlaunch-train: %s: '%s' is not a number in [%ld, %ld]\n", name, v, min,
                max);
        return -EINVAL;
    }
    return 0;
}

/* The watchdog's pipe: nonblocking, so a stalled reader can never stall training. */
static int health_fd(int *ret_fd)
{
    long fd;

    if (env_int("DLAUNCH_HEALTH_FD", -1, 1 << 20, -1, &fd) < 0)
        return -EINVAL;
    if (fd >= 0) {
        int fl = fcntl((int)fd, F_GETFL);
        if (fl < 0 || fcntl((int)fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            fprintf(stderr, "dlaunch-train: DLAUNCH_HEALTH_FD=%ld: %s\n", fd, strerror(errno));
            return -EBADF;
        }
    }
    *ret_fd = (int)fd;
    return 0;
}

int main(int argc, char **argv)
{
    dl_train_config_t cfg;
    dl_train_comm_t comm;
    dl_train_result_t res;
    char err[DL_TRAIN_ERRLEN];
    long rank, world, attempt;
    int fd = -1, r;
    dl_train_coll_t *coll = NULL;

    setvbuf(stdout, NULL, _IOLBF, 0);
    dl_train_config_init(&cfg);
    if (from_environment(&cfg) < 0)
        goto fail;
    const char **pairs = calloc((size_t)argc + 1, sizeof(*pairs));
    if (pairs == NULL) {
        fprintf(stderr, "dlaunch-train: out of memory\n");
        goto fail;
    }
    train_argv_t cli = {.pairs = pairs, .max_pairs = (size_t)argc};
    dl_opt_argv_t a = {.prog = "dlaunch-train", .args = NULL, .max_args = 0};
    if (dl_opt_parse_argv(&argv_table, &cli, argc - 1, argv + 1, &a, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch-train: %s\n", err);
        free(pairs);
        goto fail;
    }
    if (cli.help || cli.version) {
        if (cli.help)
            usage(stdout, argv[0]);
        else
            printf("dlaunch-train %s\n", DL_VERSION);
        free(pairs);
        dl_train_config_free(&cfg);
        return 0;
    }
    for (size_t i = 0; i < cli.npairs; i++) {
        if (set_pair(&cfg, cli.pairs[i], "--set") < 0) {
            free(pairs);
            goto fail;
        }
    }
    free(pairs);
    if (env_int("RANK", 0, 1 << 20, 0, &rank) < 0 ||
        env_int("WORLD_SIZE", 1, 1 << 20, 1, &world) < 0 ||
        env_int("TORCHELASTIC_RESTART_COUNT", 0, INT_MAX, 0, &attempt) < 0 || health_fd(&fd) < 0)
        goto fail;
    if (rank >= world) {
        fprintf(stderr, "dlaunch-train: RANK %ld is not below WORLD_SIZE %ld\n", rank, world);
        goto fail;
    }
    if ((cfg.fail_at_step > 0 || cfg.hang_at_step > 0) && cfg.fail_rank >= world) {
        fprintf(stderr, "dlaunch-train: fail_rank %d is not below WORLD_SIZE %ld\n", cfg.fail_rank,
                world);
        goto fail;
    }
    prog_t prog = {.rank = rank, .prefix = getenv("DLAUNCH_ATTEMPT_DIR") == NULL};
    if (open_checksums(&prog) < 0)
        goto fail;
    if (attempt == 0 && rank == cfg.fail_rank) {
        prog.fail_at_step = cfg.fail_at_step;
        prog.fail_phase = cfg.fail_phase;
        prog.fail_delay_us = cfg.fail_delay_us;
        prog.hang_at_step = cfg.hang_at_step;
    }
    if (rank == cfg.slow_rank && cfg.slow_ms_per_step > 0) {
        prog.slow_s = cfg.slow_ms_per_step / 1e3;
        prog.slow_after_s = cfg.slow_after_s;
    }
    dl_train_comm_init_local(&comm);
    size_t grad_floats = DL_TRAIN_SPARE_FLOATS;
    for (size_t l = 0; l < cfg.n_layers; l++)
        grad_floats += cfg.sizes[l + 1] * (cfg.sizes[l] + 1);
    if (world > 1 &&
        (r = dl_train_coll_open(&comm, grad_floats * sizeof(float), &coll, err, sizeof(err))) < 0) {
        fprintf(stderr, "%scannot join the process group: %s\n",
                prog.prefix ? "[train] " : "dlaunch-train: ", err);
        dl_train_config_free(&cfg);
        if (prog.checksums != NULL)
            fclose(prog.checksums);
        return 1;
    }
    if (coll != NULL)
        dl_train_coll_set_stop_check(coll, stop_signalled);

    /* A second failure in the middle of a recovery, for its tests: the group is formed, the
     * state not yet shared. */
    if (cfg.fail_on_join && comm.joining && getenv("DLAUNCH_GROUP_GEN") != NULL &&
        strcmp(getenv("DLAUNCH_GROUP_GEN"), "1") == 0) {
        printf("%sfail_on_join: killing myself in the middle of the recovery\n",
               prog.prefix ? "[train] " : "");
        raise(SIGKILL);
    }

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    dl_train_hooks_t hooks = {.ud = &prog,
                              .log = log_line,
                              .should_stop = should_stop,
                              .params_crc = crc_line,
                              .health_fd = fd,
                              .mid_step = mid_step,
                              .phase = on_phase};
    r = dl_train_run(&cfg, &comm, &hooks, &res, err, sizeof(err));
    dl_train_config_free(&cfg);
    dl_train_coll_close(coll);
    if (prog.checksums != NULL)
        fclose(prog.checksums);
    if (r < 0 || r == DL_TRAIN_DIVERGED) {
        if (prog.prefix)
            fprintf(stderr, "[train rank=%ld] %s\n", rank, err);
        else
            fprintf(stderr, "dlaunch-train: %s\n", err);
        /* Its group broke and then the launcher stopped it: the stop is what ended it. */
        if (r < 0 && stop_signal != 0)
            return 128 + stop_signal;
        return r < 0 ? 1 : 3;
    }
    /* Stopped by a signal, with a checkpoint: exit as the signal would have, so a supervisor
     * sees why. A rank stopped by a peer's vote got no signal itself; it exits as the peer's
     * SIGTERM would have made it, never as a failure of its own (128 + 0). */
    return r == 1 ? 128 + (stop_signal != 0 ? stop_signal : SIGTERM) : 0;

fail:
    dl_train_config_free(&cfg);
    return 2;
}
