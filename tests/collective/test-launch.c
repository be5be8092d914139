/* The collective library in real processes started by the real launcher: `dlaunch
 * --gpus-per-node N -- coll-worker`, for world sizes 1 to 8, over shared memory, TCP and both
 * (made-up hosts), every operation and type, sizes 0, 1, primes, sizes that do not divide by the
 * world, and 64 MiB. Each worker checks its results against a serial reference; this test checks
 * that dlaunch exits 0, that every rank finished, and that all ranks hold the same bits (the
 * hashes in their files match line by line).
 *
 *   test-launch COLL-WORKER      (DLAUNCH names the launcher) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"

static const char *worker;
static const char *dlaunch;

typedef struct {
    int n;
    const char *transport; /* DLAUNCH_COLL_TRANSPORT */
    const char *algo;      /* DLAUNCH_COLL_ALGO */
    const char *hosts;     /* shell arithmetic on RANK naming fake hosts, or NULL */
    const char *args;      /* extra worker arguments */
    int in_place;          /* --mem shared: 1 if all-reduces must read inputs in place, else 0 */
} case_t;

#define SMALL "--sizes 0,1,2,3,7,13,97,1031"
#define MID "--sizes 65537,300007"
#define BIG "--ops allreduce --types f32 --rops sum --sizes 16777216"

static const case_t cases[] = {
    /* Every world size on one host: shared memory. */
    {1, "auto", "auto", NULL, SMALL, 0},
    {2, "shm", "auto", NULL, SMALL, 0},
    {3, "shm", "auto", NULL, SMALL, 0},
    {4, "shm", "auto", NULL, SMALL, 0},
    {5, "shm", "auto", NULL, SMALL, 0},
    {6, "shm", "auto", NULL, SMALL, 0},
    {7, "shm", "auto", NULL, SMALL, 0},
    {8, "shm", "auto", NULL, SMALL, 0},
    /* The same over TCP. */
    {2, "tcp", "auto", NULL, SMALL, 0},
    {3, "tcp", "auto", NULL, SMALL, 0},
    {4, "tcp", "auto", NULL, SMALL, 0},
    {5, "tcp", "auto", NULL, SMALL, 0},
    {6, "tcp", "auto", NULL, SMALL, 0},
    {7, "tcp", "auto", NULL, SMALL, 0},
    {8, "tcp", "auto", NULL, SMALL, 0},
    /* Primes above the switch points: every algorithm on uneven segments. */
    {3, "shm", "bandwidth", NULL, MID " --types f32,i64", 0},
    {5, "shm", "latency", NULL, "--sizes 65537 --types f64,i32", 0},
    {3, "tcp", "bandwidth", NULL, MID " --types f32,i64", 0},
    {5, "tcp", "latency", NULL, "--sizes 65537 --types f64,i32", 0},
    {6, "tcp", "auto", NULL, MID " --types f32 --ops allreduce,reduce_scatter,allgather", 0},
    /* Several made-up hosts with several ranks each: hierarchical. */
    {6, "auto", "auto", "% 3", SMALL " --types f32,i32", 0},
    {5, "auto", "auto", "/ 2", "--sizes 1,13,65537,300007 --types f64,i64", 0},
    /* 64 MiB. */
    {2, "shm", "auto", NULL, BIG, 0},
    {4, "shm", "auto", NULL, BIG, 0},
    {2, "tcp", "auto", NULL, BIG, 0},
    {3, "tcp", "auto", NULL, BIG, 0},
    {4, "auto", "auto", "/ 2", BIG, 0},
    /* Buffers from dl_coll_mem_alloc: two ranks read each other's in place (whole or by halves,
     * which from 32 MiB and for an output over its input); more ranks and hierarchical groups
     * allocate alike and copy. */
    {2, "shm", "auto", NULL,
     "--mem shared --ops allreduce --types f32,i64 --rops sum,max --sizes 1,1031,300007,8388609",
     1},
    {3, "shm", "auto", NULL, "--mem shared --sizes 13,300007 --types f32,i64", 0},
    {4, "auto", "auto", "/ 2", "--mem shared --ops allreduce,allgather --sizes 300007", 0},
    /* Ordinary malloc'd buffers from 1 MiB: two ranks adopt them on first use and read each
     * other's in place too (whole, halves from 32 MiB and in place); odd sizes, buffers 16 bytes
     * past their pages (malloc's), reallocated as the sizes grow. */
    {2, "shm", "auto", NULL,
     "--ops allreduce --types f32,i64 --rops sum,max --sizes 1031,300007,8388609", 1},
};

static char *line_end(char *p)
{
    char *e = strchr(p, '\n');
    return e != NULL ? e : p + strlen(p);
}

/* Lines that name a rank (reduce-scatter blocks) differ by design; the rest must match. */
static void compare_ranks(const char *dir, int n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/rank-0.txt", dir);
    char *first = harness_read(path);
    ck_assert_msg(first != NULL, "rank 0 left no results");
    ck_assert_msg(strstr(first, "\ndone\n") != NULL, "rank 0 did not finish: %s", first);
    int lines = 0;
    for (int r = 1; r < n; r++) {
        snprintf(path, sizeof(path), "%s/rank-%d.txt", dir, r);
        char *other = harness_read(path);
        ck_assert_msg(other != NULL, "rank %d left no results", r);
        ck_assert_msg(strstr(other, "\ndone\n") != NULL, "rank %d did not finish", r);
        char *a = first, *b = other;
        while (*a != '\0' && *b != '\0') {
            char *ea = line_end(a), *eb = line_end(b);
            if (strstr(a, " rank") == NULL || strstr(a, " rank") > ea) {
                ck_assert_msg(ea - a == eb - b && memcmp(a, b, (size_t)(ea - a)) == 0,
                              "rank %d differs from rank 0: '%.*s' vs '%.*s'", r, (int)(eb - b), b,
                              (int)(ea - a), a);
                lines++;
            }
            a = *ea ? ea + 1 : ea;
            b = *eb ? eb + 1 : eb;
        }
        ck_assert_msg(*a == '\0' && *b == '\0', "rank %d ran other cases than rank 0", r);
        free(other);
    }
    free(first);
    ck_assert(n == 1 || lines > 0);
}

/* Runs case c under dlaunch (with DLAUNCH_COLL_ORDER=order), its workers writing into dir;
 * fails the test unless dlaunch exits 0. */
static void launch(const case_t *c, const char *order, const char *dir, int idx)
{
    char n[16], logs[512], log[512], cmd[2048];
    snprintf(n, sizeof(n), "%d", c->n);
    snprintf(logs, sizeof(logs), "%s/logs", dir);
    snprintf(log, sizeof(log), "%s/dlaunch.log", dir);
    /* The worker line goes through sh so that fake hosts can be derived from RANK. */
    snprintf(cmd, sizeof(cmd), "%s%s%s exec %s --out %s %s",
             c->hosts != NULL ? "DLAUNCH_COLL_HOST_ID=h$((RANK " : "",
             c->hosts != NULL ? c->hosts : "", c->hosts != NULL ? ")) " : "", worker, dir, c->args);
    char *argv[] = {(char *)dlaunch,
                    "-q",
                    "--log-dir",
                    logs,
                    "--gpus-per-node",
                    n,
                    "--",
                    "sh",
                    "-c",
                    cmd,
                    NULL};
    char tr[64], algo[64], ord[64];
    snprintf(tr, sizeof(tr), "DLAUNCH_COLL_TRANSPORT=%s", c->transport);
    snprintf(algo, sizeof(algo), "DLAUNCH_COLL_ALGO=%s", c->algo);
    snprintf(ord, sizeof(ord), "DLAUNCH_COLL_ORDER=%s", order);
    char *env[] = {tr, algo, ord, "DLAUNCH_COLL_TIMEOUT=60", NULL};
    double t0 = harness_now();
    proc_t p = {.pid = harness_spawn(argv, env, log)};
    harness_wait(&p, 1, t0, 240);
    if (p.status != 0) {
        char *text = harness_read(log);
        ck_abort_msg("case %d (world %d, %s, %s): dlaunch exited %d\n%s", idx, c->n, c->transport,
                     c->args, p.status, text != NULL ? text : "");
    }
}

DL_TEST_LOOP(worlds_transports_sizes, 0, sizeof(cases) / sizeof(cases[0]))
{
    const case_t *c = &cases[_i];
    char *dir = harness_tmpdir();
    ck_assert_ptr_nonnull(dir);
    launch(c, "rank", dir, _i);
    compare_ranks(dir, c->n);
    if (strstr(c->args, "--mem shared") != NULL || c->in_place) {
        char path[600];
        snprintf(path, sizeof(path), "%s/rank-0.txt", dir);
        char *text = harness_read(path), *at = text != NULL ? strstr(text, "\nin-place ") : NULL;
        ck_assert_msg(at != NULL, "case %d: rank 0 did not report its in-place all-reduces", _i);
        long calls = strtol(at + 10, NULL, 10);
        ck_assert_msg(c->in_place ? calls > 0 : calls == 0,
                      "case %d (world %d): %ld all-reduces read inputs in place, expected %s", _i,
                      c->n, calls, c->in_place ? "some" : "none");
        free(text);
    }
    harness_rmdir(dir);
    free(dir);
}

/* docs/collective.md's promise, in real processes under dlaunch: four ranks on one host, on
 * four hosts, on two hosts of two consecutive ranks and on two of interleaved ones hold the same
 * bits for every float all-reduce and reduce-scatter (the inputs are uniform in [-1, 1), whose
 * sums change with the order of addition); with DLAUNCH_COLL_ORDER=any over TCP they do not. */
DL_TEST(same_bits_whatever_the_transport)
{
    static const char args[] = "--ops allreduce,reduce_scatter --types f32,f64 "
                               "--rops sum,avg,min,max --sizes 1,13,1031,65537,300007";
    static const case_t layouts[] = {
        {4, "shm", "auto", NULL, args, 0},      {4, "tcp", "auto", NULL, args, 0},
        {4, "auto", "auto", "/ 2", args, 0},    {4, "auto", "auto", "% 2", args, 0},
        {4, "tcp", "bandwidth", NULL, args, 0}, {4, "tcp", "auto", NULL, args, 0},
    };
    const int any = 5; /* the last one runs with DLAUNCH_COLL_ORDER=any */
    char *first = NULL;
    for (int i = 0; i < (int)(sizeof(layouts) / sizeof(layouts[0])); i++) {
        char *dir = harness_tmpdir(), path[600];
        ck_assert_ptr_nonnull(dir);
        launch(&layouts[i], i == any ? "any" : "rank", dir, i);
        compare_ranks(dir, 4);
        snprintf(path, sizeof(path), "%s/rank-0.txt", dir);
        char *text = harness_read(path);
        ck_assert_ptr_nonnull(text);
        harness_rmdir(dir);
        free(dir);
        if (i == 0) {
            first = text;
            continue;
        }
        /* The first line that differs, if any, after the one naming the transport. */
        const char *a = line_end(text), *b = line_end(first);
        while (*a != '\0' && *a == *b) {
            const char *ea = line_end((char *)a), *eb = line_end((char *)b);
            if (ea - a != eb - b || memcmp(a, b, (size_t)(ea - a)) != 0)
                break;
            a = *ea ? ea + 1 : ea;
            b = *eb ? eb + 1 : eb;
        }
        if (i == any)
            ck_assert_msg(*a != '\0' || *b != '\0', "order any gave the rank-order bits on tcp");
        else
            ck_assert_msg(*a == '\0' && *b == '\0',
                          "layout %d (%s, hosts %s, %s) differs from one host: '%.*s' against "
                          "'%.*s'",
                          i, layouts[i].transport, layouts[i].hosts ? layouts[i].hosts : "-",
                          layouts[i].algo, (int)(line_end((char *)a) - a), a,
                          (int)(line_end((char *)b) - b), b);
        free(text);
    }
    free(first);
}

static int take_programs(int argc, char **argv)
{
    return harness_programs(argc, argv, &worker, &dlaunch);
}

DL_TEST_SUITE(.timeout = 300, .init = take_programs);
