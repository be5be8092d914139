/* Checkpoints: bitwise round trip, every kind of damage detected and skipped in favour of the
 * next newest, writes atomic (a failed write leaves nothing under a checkpoint's name), pruning. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dl-test.h"
#include "trainer.h"
#include "util.h"

#define NP 1000

static char *dir;
static char err[DL_TRAIN_ERRLEN];
static float params[NP], momentum[NP];

static void setup(void)
{
    dir = tu_tmpdir();
    err[0] = '\0';
}

static void teardown(void)
{
    tu_rmtree(dir);
    free(dir);
}

/* A 30-20-10 tanh shape has 30*20 + 20 + 20*10 + 10 = 830 parameters; NP is a bit larger so the
 * buffers fit any of the shapes below. */
static dl_train_ckpt_t make(uint64_t step, float base)
{
    dl_train_ckpt_t ck = {
        .n_layers = 2,
        .sizes = {30, 20, 10},
        .act = DL_TRAIN_ACT_TANH,
        .n_params = 830,
        .params = params,
        .momentum = momentum,
        .step = step,
        .epoch = step / 7,
        .consumed = step % 7 * 64,
        .seed = 99,
        .rng = {1, 2, 3, 0xfedcba9876543210ULL},
        .world_size = 2,
    };
    for (size_t i = 0; i < 830; i++) {
        params[i] = base + (float)i * 1e-3f;
        momentum[i] = -base * (float)i;
    }
    params[5] = -0.0f; /* bit patterns, not values, must survive */
    params[6] = 1e-45f;
    return ck;
}

/* A receiving checkpoint of the same shape with its own buffers. */
static dl_train_ckpt_t receiver(float *p, float *m)
{
    dl_train_ckpt_t ck = make(0, 0.0f);
    ck.params = p;
    ck.momentum = m;
    ck.step = ck.epoch = ck.consumed = ck.seed = 0;
    memset(ck.rng, 0, sizeof(ck.rng));
    return ck;
}

static void save(uint64_t step, float base, char *path)
{
    dl_train_ckpt_t ck = make(step, base);
    ck_assert_msg(dl_train_ckpt_save(dir, &ck, path, path ? 4096 : 0, err, sizeof(err)) == 0, "%s",
                  err);
}

static size_t count_entries(const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t n = 0;
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)) != NULL)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

typedef struct {
    int count;
    char lines[8][DL_TRAIN_ERRLEN];
} skips_t;

static void on_skip(void *ud, const char *why)
{
    skips_t *s = ud;
    if (s->count < 8)
        snprintf(s->lines[s->count], DL_TRAIN_ERRLEN, "%s", why);
    s->count++;
}

DL_TEST(round_trip_is_bitwise)
{
    char path[4096];
    float p[NP], m[NP];
    save(123, 0.5f, path);
    ck_assert_ptr_nonnull(strstr(path, "ckpt-000000000123.dlck"));

    dl_train_ckpt_t in = receiver(p, m);
    ck_assert_msg(dl_train_ckpt_load(path, &in, err, sizeof(err)) == 0, "%s", err);
    dl_train_ckpt_t want = make(123, 0.5f);
    ck_assert_mem_eq(p, params, 830 * sizeof(float));
    ck_assert_mem_eq(m, momentum, 830 * sizeof(float));
    ck_assert_uint_eq(in.step, 123);
    ck_assert_uint_eq(in.epoch, want.epoch);
    ck_assert_uint_eq(in.consumed, want.consumed);
    ck_assert_uint_eq(in.seed, 99);
    ck_assert_uint_eq(in.world_size, 2);
    ck_assert_mem_eq(in.rng, want.rng, sizeof(in.rng));
    /* Nothing but the checkpoint is left in the folder. */
    ck_assert_uint_eq(count_entries("."), 2); /* "." and ".." */
}

DL_TEST(latest_wins_and_damage_is_skipped)
{
    char p1[4096], p2[4096], p3[4096], got[4096];
    float p[NP], m[NP];
    save(10, 1.0f, p1);
    save(20, 2.0f, p2);
    save(30, 3.0f, p3);

    /* Flip one bit in the newest file's parameters. */
    size_t len;
    uint8_t *raw = tu_read_file(p3, &len);
    raw[len / 2] ^= 0x10;
    tu_write_file(p3, raw, len);
    free(raw);

    skips_t skips = {0};
    dl_train_ckpt_t in = receiver(p, m);
    ck_assert_int_eq(
        dl_train_ckpt_load_latest(dir, &in, on_skip, &skips, got, sizeof(got), err, sizeof(err)),
        1);
    ck_assert_str_eq(got, p2);
    ck_assert_uint_eq(in.step, 20);
    ck_assert_float_eq(p[100], 2.0f + 100e-3f);
    ck_assert_int_eq(skips.count, 1);
    ck_assert_msg(strstr(skips.lines[0], p3) && strstr(skips.lines[0], "checksum"), "%s",
                  skips.lines[0]);

    /* Truncate the next one: the oldest is used. */
    raw = tu_read_file(p2, &len);
    tu_write_file(p2, raw, len - 100);
    free(raw);
    memset(&skips, 0, sizeof(skips));
    ck_assert_int_eq(
        dl_train_ckpt_load_latest(dir, &in, on_skip, &skips, got, sizeof(got), err, sizeof(err)),
        1);
    ck_assert_str_eq(got, p1);
    ck_assert_int_eq(skips.count, 2);
    ck_assert_msg(strstr(skips.lines[1], p2) && strstr(skips.lines[1], "truncated"), "%s",
                  skips.lines[1]);
}

DL_TEST(damage_leaves_the_model_alone)
{
    char path[4096];
    float p[NP], m[NP];
    save(5, 1.0f, path);
    size_t len;
    uint8_t *raw = tu_read_file(path, &len);
    raw[len - 1] ^= 1; /* the checksum itself */
    tu_write_file(path, raw, len);
    free(raw);

    for (size_t i = 0; i < NP; i++)
        p[i] = m[i] = 42.0f;
    dl_train_ckpt_t in = receiver(p, m);
    DL_CHECK_ERRNO(dl_train_ckpt_load(path, &in, err, sizeof(err)), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "bad checksum"));
    for (size_t i = 0; i < NP; i++) {
        ck_assert_float_eq(p[i], 42.0f);
        ck_assert_float_eq(m[i], 42.0f);
    }
    ck_assert_uint_eq(in.step, 0);
}

DL_TEST(wrong_shape_and_garbage)
{
    char path[4096], bad[4096];
    float p[NP], m[NP];
    save(7, 1.0f, path);

    dl_train_ckpt_t in = receiver(p, m);
    in.sizes[1] = 21;
    in.n_params = 30 * 21 + 21 + 21 * 10 + 10;
    DL_CHECK_ERRNO(dl_train_ckpt_load(path, &in, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "30-20-10 tanh, expected 30-21-10 tanh"), "%s", err);

    in = receiver(p, m);
    in.act = DL_TRAIN_ACT_RELU;
    DL_CHECK_ERRNO(dl_train_ckpt_load(path, &in, err, sizeof(err)), -EINVAL);

    in = receiver(p, m);
    snprintf(bad, sizeof(bad), "%s/ckpt-000000000999.dlck", dir);
    char junk[120];
    memset(junk, 'j', sizeof(junk));
    tu_write_file(bad, junk, sizeof(junk));
    DL_CHECK_ERRNO(dl_train_ckpt_load(bad, &in, err, sizeof(err)), -EBADMSG);
    ck_assert_msg(strstr(err, bad) && strstr(err, "bad magic"), "%s", err);
    tu_write_file(bad, "DLTR", 4);
    DL_CHECK_ERRNO(dl_train_ckpt_load(bad, &in, err, sizeof(err)), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "truncated header"));

    /* The newest is garbage; the valid one behind it is found. */
    skips_t skips = {0};
    ck_assert_int_eq(
        dl_train_ckpt_load_latest(dir, &in, on_skip, &skips, NULL, 0, err, sizeof(err)), 1);
    ck_assert_uint_eq(in.step, 7);
    ck_assert_int_eq(skips.count, 1);
}

DL_TEST(empty_or_missing_folder)
{
    float p[NP], m[NP];
    char missing[4096];
    dl_train_ckpt_t in = receiver(p, m);
    DL_CHECK_ERRNO(dl_train_ckpt_load_latest(dir, &in, NULL, NULL, NULL, 0, err, sizeof(err)), 0);
    snprintf(missing, sizeof(missing), "%s/nope", dir);
    ck_assert_int_eq(dl_train_ckpt_load_latest(missing, &in, NULL, NULL, NULL, 0, err, sizeof(err)),
                     0);
}

DL_TEST(failed_write_leaves_no_partial_file)
{
    char good[4096];
    save(1, 1.0f, good);

    /* Run the second save in a child whose file size limit stops the write half way: the
     * write fails like a full disk would. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit rl = {2000, 2000};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        dl_train_ckpt_t ck = make(2, 2.0f);
        int r = dl_train_ckpt_save(dir, &ck, NULL, 0, err, sizeof(err));
        _exit(r == -EFBIG && strstr(err, "write") != NULL ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* No step-2 checkpoint, no temporary file, and the step-1 one still loads. */
    ck_assert_uint_eq(count_entries("ckpt-"), 1);
    ck_assert_uint_eq(count_entries(".ckpt-"), 0);
    float p[NP], m[NP];
    dl_train_ckpt_t in = receiver(p, m);
    ck_assert_int_eq(dl_train_ckpt_load_latest(dir, &in, NULL, NULL, NULL, 0, err, sizeof(err)), 1);
    ck_assert_uint_eq(in.step, 1);
}

DL_TEST(leftover_temporary_is_ignored_then_pruned)
{
    char tmp[4096];
    float p[NP], m[NP];
    save(3, 1.0f, NULL);
    /* What a writer killed mid-write leaves behind: a partial file under a temporary name. */
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-000000000004.tmp-99999999", dir);
    tu_write_file(tmp, "DLTRCKPT", 8);

    dl_train_ckpt_t in = receiver(p, m);
    skips_t skips = {0};
    ck_assert_int_eq(
        dl_train_ckpt_load_latest(dir, &in, on_skip, &skips, NULL, 0, err, sizeof(err)), 1);
    ck_assert_uint_eq(in.step, 3);
    ck_assert_int_eq(skips.count, 0);
    dl_train_ckpt_t shape = make(0, 0.0f);
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 3, &shape, NULL, NULL, err, sizeof(err)), 0);
    ck_assert_uint_eq(count_entries(".ckpt-"), 0);
    ck_assert_uint_eq(count_entries("ckpt-"), 1);
}

static bool exists(uint64_t step)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/ckpt-%012llu.dlck", dir, (unsigned long long)step);
    return stat(path, &st) == 0;
}

static void damage(uint64_t step, bool truncate)
{
    char path[4096];
    size_t len;
    snprintf(path, sizeof(path), "%s/ckpt-%012llu.dlck", dir, (unsigned long long)step);
    uint8_t *raw = tu_read_file(path, &len);
    if (truncate)
        len -= 100;
    else
        raw[len / 2] ^= 0x10;
    tu_write_file(path, raw, len);
    free(raw);
}

/* What a resume after a crash saw: the two newest files damaged (a bad checksum, a truncation).
 * Pruning must keep the valid ones behind them, which are all a resume can use. */
DL_TEST(prune_counts_only_valid_checkpoints)
{
    float p[NP], m[NP];
    for (uint64_t s = 1; s <= 5; s++)
        save(s * 10, (float)s, NULL);
    damage(50, false);
    damage(40, true);
    dl_train_ckpt_t shape = make(0, 0.0f);
    skips_t skips = {0};
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 3, &shape, on_skip, &skips, err, sizeof(err)), 0);
    /* Only three valid ones exist: nothing is surplus, and the damaged ones stay for a look. */
    for (uint64_t s = 1; s <= 5; s++)
        ck_assert_msg(exists(s * 10), "step %llu was deleted", (unsigned long long)s * 10);
    ck_assert_int_eq(skips.count, 2);
    ck_assert_msg(strstr(skips.lines[0], "checksum"), "%s", skips.lines[0]);
    ck_assert_msg(strstr(skips.lines[1], "truncated"), "%s", skips.lines[1]);

    /* keep 1: the newest valid (30) stays, the damaged newer ones stay, the older go. */
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 1, &shape, NULL, NULL, err, sizeof(err)), 0);
    ck_assert(exists(50) && exists(40) && exists(30));
    ck_assert(!exists(20) && !exists(10));
    dl_train_ckpt_t in = receiver(p, m);
    ck_assert_int_eq(dl_train_ckpt_load_latest(dir, &in, NULL, NULL, NULL, 0, err, sizeof(err)), 1);
    ck_assert_uint_eq(in.step, 30);

    /* A newer good one arrives: it is the one kept, and everything older goes, damaged or not. */
    save(60, 6.0f, NULL);
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 1, &shape, NULL, NULL, err, sizeof(err)), 0);
    ck_assert(exists(60));
    ck_assert(!exists(50) && !exists(40) && !exists(30));

    /* A checkpoint of another model shape is not one of ours to count on. */
    save(70, 7.0f, NULL);
    dl_train_ckpt_t other = make(0, 0.0f);
    other.act = DL_TRAIN_ACT_RELU;
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 1, &other, NULL, NULL, err, sizeof(err)), 0);
    ck_assert(exists(70) && exists(60));
}

DL_TEST(prune_keeps_newest)
{
    char path[4096];
    for (uint64_t s = 1; s <= 12; s++)
        save(s * 10, (float)s, NULL);
    /* Something else in the folder is not ours to delete. */
    snprintf(path, sizeof(path), "%s/notes.txt", dir);
    tu_write_file(path, "x", 1);
    dl_train_ckpt_t shape = make(0, 0.0f);
    DL_CHECK_ERRNO(dl_train_ckpt_prune(dir, 3, &shape, NULL, NULL, err, sizeof(err)), 0);
    ck_assert_uint_eq(count_entries("ckpt-"), 3);
    ck_assert_uint_eq(count_entries("notes"), 1);
    for (uint64_t s = 10; s <= 12; s++) {
        struct stat st;
        snprintf(path, sizeof(path), "%s/ckpt-%012llu.dlck", dir, (unsigned long long)s * 10);
        ck_assert_int_eq(stat(path, &st), 0);
    }
}

DL_TEST_SUITE(.setup = setup, .teardown = teardown);
