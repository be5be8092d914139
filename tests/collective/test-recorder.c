/* The flight recorder: what a group writes for each operation, what another reader sees while a
 * rank waits, and how the file is found, refused and shared. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collective.h"
#include "dl-test.h"
#include "harness.h"

static dl_coll_group_t *solo(const char *path)
{
    dl_coll_options_t o;
    dl_coll_group_t *g = NULL;
    char err[256];
    dl_coll_options_init(&o);
    snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", path);
    DL_CHECK_ERRNO(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    return g;
}

static size_t read_all(const char *path, dl_coll_rec_info_t *info, dl_coll_rec_entry_t *v)
{
    dl_coll_rec_reader_t *r = NULL;
    DL_CHECK_ERRNO(dl_coll_rec_open(path, &r), 0);
    size_t n = dl_coll_rec_read(r, info, v, DL_COLL_REC_CAPACITY);
    dl_coll_rec_close(r);
    return n;
}

DL_TEST(every_operation_is_recorded)
{
    char *dir = harness_tmpdir(), path[512];
    snprintf(path, sizeof(path), "%s/rank_0.rec", dir);
    dl_coll_group_t *g = solo(path);
    static float a[1 << 16], b[1 << 16];
    DL_CHECK_ERRNO(dl_coll_allreduce(g, a, b, 16, DL_COLL_FLOAT32, DL_COLL_SUM), 0);
    DL_CHECK_ERRNO(dl_coll_allreduce(g, a, b, 1 << 16, DL_COLL_FLOAT32, DL_COLL_SUM), 0);
    DL_CHECK_ERRNO(dl_coll_broadcast(g, a, 8, DL_COLL_INT64, 0), 0);
    DL_CHECK_ERRNO(dl_coll_allgather(g, a, b, 4, DL_COLL_FLOAT32), 0);
    DL_CHECK_ERRNO(dl_coll_reduce_scatter(g, a, b, 4, DL_COLL_FLOAT32, DL_COLL_MAX), 0);
    DL_CHECK_ERRNO(dl_coll_barrier(g), 0);
    dl_coll_request_t *req;
    DL_CHECK_ERRNO(dl_coll_allreduce_async(g, a, a, 32, DL_COLL_INT32, DL_COLL_SUM, &req), 0);
    DL_CHECK_ERRNO(dl_coll_wait(req), 0);
    /* Refused arguments are no operation. */
    DL_CHECK_ERRNO(dl_coll_allreduce(g, NULL, b, 4, DL_COLL_FLOAT32, DL_COLL_SUM), -EINVAL);

    dl_coll_rec_info_t info;
    dl_coll_rec_entry_t v[DL_COLL_REC_CAPACITY];
    size_t n = read_all(path, &info, v);
    ck_assert_uint_eq(n, 7);
    ck_assert_int_eq(info.rank, 0);
    ck_assert_int_eq(info.world_size, 1);
    ck_assert_int_eq(info.pid, getpid());
    ck_assert_str_eq(info.transport, "self");
    ck_assert_uint_eq(info.issued, 7);
    static const dl_coll_rec_op_t ops[] = {DL_COLL_REC_ALLREDUCE,      DL_COLL_REC_ALLREDUCE,
                                           DL_COLL_REC_BROADCAST,      DL_COLL_REC_ALLGATHER,
                                           DL_COLL_REC_REDUCE_SCATTER, DL_COLL_REC_BARRIER,
                                           DL_COLL_REC_ALLREDUCE};
    static const unsigned long long bytes[] = {64, 1 << 18, 64, 16, 16, 0, 128};
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(v[i].seq, i + 1);
        ck_assert_int_eq(v[i].op, ops[i]);
        ck_assert_uint_eq(v[i].bytes, bytes[i]);
        ck_assert_int_eq(v[i].state, DL_COLL_REC_DONE);
        ck_assert_int_eq(v[i].algo, DL_COLL_REC_ALGO_LOCAL);
        ck_assert_int_eq(v[i].error, 0);
    }
    ck_assert_int_eq(v[2].root, 0);
    ck_assert_int_eq(v[0].root, -1);
    ck_assert_int_eq(v[6].dtype, DL_COLL_INT32);
    /* Small operations go untimed; large ones get both ends, in this process's clock. */
    ck_assert(v[0].start == 0 && v[0].end == 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    ck_assert(v[1].start > 0 && v[1].end >= v[1].start);
    ck_assert_msg(now - v[1].start < 5.0 && now - v[1].start >= -0.01, "start %f now %f",
                  v[1].start, now);
    ck_assert_str_eq(dl_coll_rec_op_name(v[4].op), "reduce-scatter");
    ck_assert_str_eq(dl_coll_rec_state_name(v[4].state), "done");
    dl_coll_group_destroy(g);
    /* The file outlives the group: it is the post-mortem. */
    ck_assert_uint_eq(read_all(path, NULL, v), 7);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST(the_ring_keeps_the_newest)
{
    char *dir = harness_tmpdir(), path[512];
    snprintf(path, sizeof(path), "%s/r.rec", dir);
    dl_coll_group_t *g = solo(path);
    for (int i = 0; i < 100; i++)
        DL_CHECK_ERRNO(dl_coll_barrier(g), 0);
    dl_coll_rec_entry_t v[DL_COLL_REC_CAPACITY];
    size_t n = read_all(path, NULL, v);
    ck_assert_uint_eq(n, DL_COLL_REC_CAPACITY);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(v[i].seq, 100 - DL_COLL_REC_CAPACITY + 1 + i);
    /* A reader may ask for fewer: the newest ones. */
    dl_coll_rec_reader_t *r;
    DL_CHECK_ERRNO(dl_coll_rec_open(path, &r), 0);
    ck_assert_uint_eq(dl_coll_rec_read(r, NULL, v, 3), 3);
    ck_assert_uint_eq(v[0].seq, 98);
    ck_assert_uint_eq(v[2].seq, 100);
    dl_coll_rec_close(r);
    dl_coll_group_destroy(g);
    harness_rmdir(dir);
    free(dir);
}

/* Two ranks as threads of this process; rank 1 holds back before its third all-reduce. */
typedef struct {
    int rank, port;
    char path[512];
    int hold_ms; /* before the third all-reduce; < 0: never make it */
    int rc[3];
} pair_rank_t;

static void *pair_main(void *p)
{
    pair_rank_t *r = p;
    dl_coll_options_t o;
    dl_coll_group_t *g = NULL;
    char err[256];
    dl_coll_options_init(&o);
    o.rank = r->rank;
    o.world_size = 2;
    snprintf(o.master_addr, sizeof(o.master_addr), "127.0.0.1");
    o.master_port = r->port;
    o.timeout_ms = 1500;
    snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", r->path);
    if (dl_coll_group_create(&o, &g, err, sizeof(err)) < 0) {
        r->rc[0] = -1;
        return NULL;
    }
    float x[256] = {0};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && r->hold_ms != 0) {
            if (r->hold_ms < 0)
                break;
            struct timespec ts = {r->hold_ms / 1000, (r->hold_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        r->rc[i] = dl_coll_allreduce(g, x, x, 256, DL_COLL_FLOAT32, DL_COLL_SUM);
    }
    dl_coll_group_destroy(g);
    return NULL;
}

/* The newest entry of path, waiting up to 5 s for it to reach seq in state. */
static dl_coll_rec_entry_t newest_when(const char *path, unsigned long long seq,
                                       dl_coll_rec_state_t state)
{
    dl_coll_rec_entry_t v[DL_COLL_REC_CAPACITY] = {{0}};
    size_t n = 0;
    for (int i = 0; i < 500; i++) {
        dl_coll_rec_reader_t *r = NULL;
        if (dl_coll_rec_open(path, &r) == 0) {
            n = dl_coll_rec_read(r, NULL, v, DL_COLL_REC_CAPACITY);
            dl_coll_rec_close(r);
            if (n > 0 && v[n - 1].seq == seq && v[n - 1].state == state)
                return v[n - 1];
        }
        usleep(10000);
    }
    ck_abort_msg("%s: newest is #%llu %s, wanted #%llu %s", path, n ? v[n - 1].seq : 0,
                 n ? dl_coll_rec_state_name(v[n - 1].state) : "-", seq,
                 dl_coll_rec_state_name(state));
    return v[0];
}

DL_TEST(a_waiting_rank_is_seen_running_and_the_late_one_behind)
{
    char *dir = harness_tmpdir();
    pair_rank_t rk[2] = {{.rank = 0}, {.rank = 1, .hold_ms = 600}};
    pthread_t th[2];
    int port = harness_free_port();
    for (int i = 0; i < 2; i++) {
        rk[i].port = port;
        snprintf(rk[i].path, sizeof(rk[i].path), "%s/rank_%d.rec", dir, i);
        ck_assert_int_eq(pthread_create(&th[i], NULL, pair_main, &rk[i]), 0);
    }
    /* While rank 1 holds back: rank 0 is inside #3, rank 1 finished #2. */
    dl_coll_rec_entry_t e0 = newest_when(rk[0].path, 3, DL_COLL_REC_RUNNING);
    dl_coll_rec_entry_t e1 = newest_when(rk[1].path, 2, DL_COLL_REC_DONE);
    ck_assert_int_eq(e0.op, DL_COLL_REC_ALLREDUCE);
    ck_assert_int_eq(e0.algo, DL_COLL_REC_ALGO_SHM_SMALL);
    ck_assert_uint_eq(e0.bytes, 1024);
    ck_assert_int_eq(e1.state, DL_COLL_REC_DONE);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(rk[i].rc[2], 0);
    newest_when(rk[0].path, 3, DL_COLL_REC_DONE);
    newest_when(rk[1].path, 3, DL_COLL_REC_DONE);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST(a_failed_operation_says_so)
{
    char *dir = harness_tmpdir();
    pair_rank_t rk[2] = {{.rank = 0}, {.rank = 1, .hold_ms = -1}};
    pthread_t th[2];
    int port = harness_free_port();
    for (int i = 0; i < 2; i++) {
        rk[i].port = port;
        snprintf(rk[i].path, sizeof(rk[i].path), "%s/rank_%d.rec", dir, i);
        ck_assert_int_eq(pthread_create(&th[i], NULL, pair_main, &rk[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_lt(rk[0].rc[2], 0);
    dl_coll_rec_entry_t e = newest_when(rk[0].path, 3, DL_COLL_REC_FAILED);
    ck_assert_int_eq(e.error, rk[0].rc[2]);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST(readers_are_told_what_is_wrong)
{
    char *dir = harness_tmpdir(), path[512];
    dl_coll_rec_reader_t *r = NULL;
    snprintf(path, sizeof(path), "%s/none.rec", dir);
    DL_CHECK_ERRNO(dl_coll_rec_open(path, &r), -ENOENT);
    snprintf(path, sizeof(path), "%s/empty.rec", dir);
    close(open(path, O_CREAT | O_WRONLY, 0644));
    DL_CHECK_ERRNO(dl_coll_rec_open(path, &r), -ENODATA);
    snprintf(path, sizeof(path), "%s/junk.rec", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 10000; i++)
        fputc('x', f);
    fclose(f);
    DL_CHECK_ERRNO(dl_coll_rec_open(path, &r), -EBADMSG);
    ck_assert_ptr_null(r);
    dl_coll_rec_close(NULL);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST(a_second_group_leaves_the_file_to_the_first)
{
    char *dir = harness_tmpdir(), path[512];
    snprintf(path, sizeof(path), "%s/rank_0.rec", dir);
    dl_coll_group_t *g1 = solo(path), *g2 = solo(path);
    for (int i = 0; i < 5; i++)
        DL_CHECK_ERRNO(dl_coll_barrier(g2), 0);
    DL_CHECK_ERRNO(dl_coll_barrier(g1), 0);
    dl_coll_rec_entry_t v[DL_COLL_REC_CAPACITY];
    ck_assert_uint_eq(read_all(path, NULL, v), 1);
    dl_coll_group_destroy(g2);
    dl_coll_group_destroy(g1);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST(the_environment_places_the_file)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *auto_env[] = {"RANK=3", "WORLD_SIZE=4", "DLAUNCH_ATTEMPT_DIR=/logs/j/attempt_2", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, auto_env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.recorder, 1);
    ck_assert_str_eq(o.recorder_path, "/logs/j/attempt_2/rank_3.rec");
    ck_assert_uint_eq(o.recorder_timed_bytes, 64 << 10);
    char *mem_env[] = {"RANK=3", "WORLD_SIZE=4", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, mem_env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.recorder, 1);
    ck_assert_str_eq(o.recorder_path, "");
    char *off_env[] = {"DLAUNCH_COLL_RECORDER=off", "DLAUNCH_ATTEMPT_DIR=/x", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, off_env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.recorder, 0);
    char *path_env[] = {"DLAUNCH_COLL_RECORDER=/tmp/mine.rec", "DLAUNCH_COLL_RECORDER_TIMED=0",
                        NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, path_env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.recorder, 1);
    ck_assert_str_eq(o.recorder_path, "/tmp/mine.rec");
    ck_assert_uint_eq(o.recorder_timed_bytes, 0);
    char *bad_env[] = {"DLAUNCH_COLL_RECORDER_TIMED=lots", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, bad_env, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "DLAUNCH_COLL_RECORDER_TIMED: 'lots' is not a byte count such as 0 "
                          "or 64K");
}

DL_TEST(off_writes_nothing)
{
    char *dir = harness_tmpdir(), path[512];
    snprintf(path, sizeof(path), "%s/rank_0.rec", dir);
    dl_coll_options_t o;
    dl_coll_group_t *g = NULL;
    char err[256];
    dl_coll_options_init(&o);
    o.recorder = 0;
    snprintf(o.recorder_path, sizeof(o.recorder_path), "%s", path);
    DL_CHECK_ERRNO(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_coll_barrier(g), 0);
    ck_assert_int_eq(access(path, F_OK), -1);
    dl_coll_group_destroy(g);
    harness_rmdir(dir);
    free(dir);
}

DL_TEST_SUITE(.timeout = 60);
