/* A peer that dies or stops answering makes every other rank's call fail, within a bound, with an
 * error, never a hang. The workers are started here directly, with torchrun's variables, so
 * nothing but the library decides when the survivors give up; one case goes through dlaunch.
 * Nothing may be left behind in /dev/shm.
 *
 *   test-failure COLL-WORKER      (DLAUNCH names the launcher) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"

#define MAX_N 8

static const char *worker;
static const char *dlaunch;

typedef struct {
    int n;
    const char *transport;
    const char *hosts; /* "mod2": fake host RANK % 2; NULL: one host */
    const char *drill; /* --die-rank or --stop-rank */
    int victim;
    int timeout_s;       /* DLAUNCH_COLL_TIMEOUT */
    double bound_s;      /* survivors must be out by then */
    double not_before_s; /* a stopped peer is only found by the timeout */
} drill_t;

static const drill_t drills[] = {
    /* A dead peer is noticed long before the timeout: pidfd on shm, a reset on TCP. */
    {3, "shm", NULL, "--die-rank", 1, 30, 10, 0},
    {4, "tcp", NULL, "--die-rank", 2, 30, 10, 0},
    {4, "auto", "mod2", "--die-rank", 3, 30, 10, 0},
    {2, "shm", NULL, "--die-rank", 0, 30, 10, 0},
    /* A stopped peer is alive: only the timeout can tell. */
    {2, "shm", NULL, "--stop-rank", 1, 2, 12, 1.5},
    {3, "tcp", NULL, "--stop-rank", 1, 2, 12, 1.5},
    {4, "auto", "mod2", "--stop-rank", 0, 2, 12, 1.5},
};

static int err_code(const char *dir, int rank, char *msg, size_t msglen)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/rank-%d.err", dir, rank);
    char *text = harness_read(path);
    if (text == NULL)
        return 0;
    int code = 0;
    double t = 0;
    int used = 0;
    if (sscanf(text, "%d %lf %n", &code, &t, &used) < 2)
        code = 0;
    snprintf(msg, msglen, "%s", text + used);
    free(text);
    return code;
}

DL_TEST_LOOP(survivors_fail_in_bounded_time, 0, sizeof(drills) / sizeof(drills[0]))
{
    const drill_t *d = &drills[_i];
    char *dir = harness_tmpdir();
    ck_assert_ptr_nonnull(dir);
    int port = harness_free_port();
    ck_assert_int_gt(port, 0);
    char log[512], victim[16];
    snprintf(log, sizeof(log), "%s/workers.log", dir);
    snprintf(victim, sizeof(victim), "%d", d->victim);
    proc_t p[MAX_N];
    static char env[MAX_N][10][128];
    double t0 = harness_now();
    for (int r = 0; r < d->n; r++) {
        snprintf(env[r][0], 128, "RANK=%d", r);
        snprintf(env[r][1], 128, "WORLD_SIZE=%d", d->n);
        snprintf(env[r][2], 128, "LOCAL_RANK=%d", r);
        snprintf(env[r][3], 128, "LOCAL_WORLD_SIZE=%d", d->n);
        snprintf(env[r][4], 128, "MASTER_ADDR=127.0.0.1");
        snprintf(env[r][5], 128, "MASTER_PORT=%d", port);
        snprintf(env[r][6], 128, "DLAUNCH_COLL_TIMEOUT=%d", d->timeout_s);
        snprintf(env[r][7], 128, "DLAUNCH_COLL_TRANSPORT=%s", d->transport);
        snprintf(env[r][8], 128, "DLAUNCH_COLL_HOST_ID=h%d", d->hosts != NULL ? r % 2 : 0);
        char *e[] = {env[r][0], env[r][1], env[r][2], env[r][3], env[r][4],
                     env[r][5], env[r][6], env[r][7], env[r][8], NULL};
        char *argv[] = {(char *)worker,
                        "--out",
                        dir,
                        "--ops",
                        "allreduce",
                        "--types",
                        "f32",
                        "--rops",
                        "sum",
                        "--sizes",
                        "1000,200000,1000,200000",
                        (char *)d->drill,
                        victim,
                        "--fail-after",
                        "1",
                        NULL};
        p[r].pid = harness_spawn(argv, e, log);
    }
    /* The survivors first; then the victim, stopped or dead, is put away. */
    proc_t survivors[MAX_N];
    int ns = 0;
    for (int r = 0; r < d->n; r++)
        if (r != d->victim)
            survivors[ns++] = p[r];
    harness_wait(survivors, ns, t0, d->bound_s + 20);
    kill(p[d->victim].pid, SIGKILL);
    kill(p[d->victim].pid, SIGCONT);
    harness_wait(&p[d->victim], 1, harness_now(), 10);
    for (int r = 0, k = 0; r < d->n; r++)
        if (r != d->victim)
            p[r] = survivors[k++];
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "dlcoll-%d-", port);
    ck_assert_msg(harness_count_shm(prefix) == 0, "shared memory left in /dev/shm");
    for (int r = 0; r < d->n; r++) {
        char msg[512] = "";
        if (r == d->victim) {
            ck_assert_int_eq(p[r].status, 128 + SIGKILL); /* died, or killed after the drill */
            continue;
        }
        int code = err_code(dir, r, msg, sizeof(msg));
        ck_assert_msg(p[r].status == 3, "rank %d exited %d, not with an error from the library", r,
                      p[r].status);
        ck_assert_msg(p[r].exited_s < d->bound_s, "rank %d took %.2f s (bound %.1f s)", r,
                      p[r].exited_s, d->bound_s);
        ck_assert_msg(p[r].exited_s >= d->not_before_s,
                      "rank %d gave up after %.2f s, before the %d s timeout", r, p[r].exited_s,
                      d->timeout_s);
        ck_assert_msg(code == ECONNRESET || code == ETIMEDOUT || code == ECONNABORTED ||
                          code == EPIPE,
                      "rank %d: error %d (%s)", r, code, msg);
        ck_assert_msg(strlen(msg) > 1, "rank %d: no error text", r);
        if (d->not_before_s == 0)
            ck_assert_msg(code != ETIMEDOUT, "rank %d waited for the timeout: %s", r, msg);
    }
    harness_rmdir(dir);
    free(dir);
}

/* Through the launcher: a rank dies, the others fail, dlaunch reports the job failed. */
DL_TEST(dlaunch_reports_the_failure)
{
    char *dir = harness_tmpdir();
    char logs[512], log[512];
    snprintf(logs, sizeof(logs), "%s/logs", dir);
    snprintf(log, sizeof(log), "%s/dlaunch.log", dir);
    char *argv[] = {(char *)dlaunch,
                    "-q",
                    "--log-dir",
                    logs,
                    "--stop-timeout",
                    "30",
                    "--gpus-per-node",
                    "3",
                    "--",
                    (char *)worker,
                    "--out",
                    dir,
                    "--ops",
                    "allreduce",
                    "--types",
                    "f32",
                    "--rops",
                    "sum",
                    "--sizes",
                    "1000,200000,1000,200000",
                    "--die-rank",
                    "2",
                    "--fail-after",
                    "1",
                    NULL};
    char *env[] = {"DLAUNCH_COLL_TIMEOUT=30", NULL};
    double t0 = harness_now();
    proc_t p = {.pid = harness_spawn(argv, env, log)};
    harness_wait(&p, 1, t0, 60);
    ck_assert_int_ne(p.status, 0);
    ck_assert_msg(p.exited_s < 20, "dlaunch took %.1f s", p.exited_s);
    char *text = harness_read(log);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(strstr(text, "failed") != NULL, "%s", text);
    free(text);
    harness_rmdir(dir);
    free(dir);
}

static int take_programs(int argc, char **argv)
{
    return harness_programs(argc, argv, &worker, &dlaunch);
}

DL_TEST_SUITE(.timeout = 120, .init = take_programs);
