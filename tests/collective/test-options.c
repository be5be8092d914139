/* Group options from the launcher's environment: what is read, the defaults, and a one-line error
 * naming the variable for anything malformed. */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "collective.h"

START_TEST(defaults_are_a_world_of_one)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *env[] = {"PATH=/bin", NULL};
    ck_assert_int_eq(dl_coll_options_from_env(&o, env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.rank, 0);
    ck_assert_int_eq(o.world_size, 1);
    ck_assert_int_eq(o.transport, DL_COLL_TRANSPORT_AUTO);
    ck_assert_int_eq(o.algo, DL_COLL_ALGO_AUTO);
    ck_assert_int_eq(o.timeout_ms, 30000);
    ck_assert_uint_gt(o.shm_chunk_bytes, 0);
    ck_assert_uint_eq(o.shm_small_bytes, DL_COLL_SMALL_AUTO);
    char *env2[] = {"DLAUNCH_COLL_SHM_SMALL=auto", NULL};
    o.shm_small_bytes = 5;
    ck_assert_int_eq(dl_coll_options_from_env(&o, env2, err, sizeof(err)), 0);
    ck_assert_uint_eq(o.shm_small_bytes, DL_COLL_SMALL_AUTO);
}
END_TEST

START_TEST(torchrun_variables_are_read)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *env[] = {"RANK=3",
                   "WORLD_SIZE=8",
                   "LOCAL_RANK=1",
                   "LOCAL_WORLD_SIZE=2",
                   "MASTER_ADDR=node0.example",
                   "MASTER_PORT=29500",
                   "TORCHELASTIC_RUN_ID=job-7",
                   "DLAUNCH_COLL_TRANSPORT=tcp",
                   "DLAUNCH_COLL_ALGO=bandwidth",
                   "DLAUNCH_COLL_TIMEOUT=2.5",
                   "DLAUNCH_COLL_HOST_ID=rack1-n4",
                   "DLAUNCH_COLL_SHM_SMALL=32K",
                   "DLAUNCH_COLL_TCP_SMALL=1M",
                   "DLAUNCH_COLL_SHM_CHUNK=8192",
                   "DLAUNCH_COLL_TCP_CHUNK=64k",
                   "DLAUNCH_COLL_SPIN_US=250",
                   "DLAUNCH_STORE=127.0.0.1:41000",
                   "DLAUNCH_TOKEN_FILE=/run/job.token",
                   "DLAUNCH_TOKEN=s3cret",
                   NULL};
    ck_assert_int_eq(dl_coll_options_from_env(&o, env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.rank, 3);
    ck_assert_int_eq(o.world_size, 8);
    ck_assert_int_eq(o.local_rank, 1);
    ck_assert_int_eq(o.local_world_size, 2);
    ck_assert_str_eq(o.master_addr, "node0.example");
    ck_assert_int_eq(o.master_port, 29500);
    ck_assert_str_eq(o.run_id, "job-7");
    ck_assert_int_eq(o.transport, DL_COLL_TRANSPORT_TCP);
    ck_assert_int_eq(o.algo, DL_COLL_ALGO_BANDWIDTH);
    ck_assert_int_eq(o.timeout_ms, 2500);
    ck_assert_str_eq(o.host_id, "rack1-n4");
    ck_assert_uint_eq(o.shm_small_bytes, 32 << 10);
    ck_assert_uint_eq(o.tcp_small_bytes, 1 << 20);
    ck_assert_uint_eq(o.shm_chunk_bytes, 8192);
    ck_assert_uint_eq(o.tcp_chunk_bytes, 64 << 10);
    ck_assert_int_eq(o.spin_us, 250);
    ck_assert_str_eq(o.store, "127.0.0.1:41000");
    ck_assert_str_eq(o.token_file, "/run/job.token");
    ck_assert_str_eq(o.token, "s3cret");
}
END_TEST

static const struct {
    const char *var;
} bad[] = {
    {"RANK=-1"},
    {"RANK=2x"},
    {"WORLD_SIZE=0"},
    {"WORLD_SIZE="},
    {"LOCAL_RANK=one"},
    {"MASTER_PORT=70000"},
    {"MASTER_PORT=99999999999999999999"},
    {"MASTER_ADDR="},
    {"DLAUNCH_COLL_TRANSPORT=udp"},
    {"DLAUNCH_COLL_ALGO=fast"},
    {"DLAUNCH_COLL_TIMEOUT=0"},
    {"DLAUNCH_COLL_TIMEOUT=-3"},
    {"DLAUNCH_COLL_TIMEOUT=nan"},
    {"DLAUNCH_COLL_TIMEOUT=10s"},
    {"DLAUNCH_COLL_SHM_CHUNK=100"},
    {"DLAUNCH_COLL_SHM_CHUNK=4T"},
    {"DLAUNCH_COLL_TCP_SMALL=-1"},
    {"DLAUNCH_COLL_SPIN_US=-5"},
};

START_TEST(bad_values_name_the_variable)
{
    dl_coll_options_t o, before;
    char err[256] = "";
    dl_coll_options_init(&o);
    before = o;
    char *env[] = {(char *)bad[_i].var, NULL};
    ck_assert_int_eq(dl_coll_options_from_env(&o, env, err, sizeof(err)), -EINVAL);
    char name[64];
    size_t n = strcspn(bad[_i].var, "=");
    memcpy(name, bad[_i].var, n);
    name[n] = '\0';
    ck_assert_msg(strstr(err, name) != NULL, "'%s' does not name %s", err, name);
    /* Untouched on failure. */
    ck_assert(memcmp(&o, &before, sizeof(o)) == 0);
}
END_TEST

START_TEST(rank_must_be_below_world_size)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *env[] = {"RANK=4", "WORLD_SIZE=4", NULL};
    ck_assert_int_eq(dl_coll_options_from_env(&o, env, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "RANK=4"));
}
END_TEST

START_TEST(world_of_one_needs_no_master)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    ck_assert_int_eq(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    ck_assert_int_eq(dl_coll_world_size(g), 1);
    ck_assert_str_eq(dl_coll_transport_name(g), "self");
    int x[3] = {1, 2, 3}, y[3] = {0};
    ck_assert_int_eq(dl_coll_allreduce(g, x, y, 3, DL_COLL_INT32, DL_COLL_AVG), 0);
    ck_assert_int_eq(y[2], 3);
    ck_assert_int_eq(dl_coll_barrier(g), 0);
    dl_coll_group_destroy(g);
    dl_coll_group_destroy(NULL);
}
END_TEST

START_TEST(world_of_two_needs_a_master)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    o.world_size = 2;
    ck_assert_int_eq(dl_coll_group_create(&o, &g, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(err, "MASTER_ADDR"));
}
END_TEST

START_TEST(bad_arguments_are_refused)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    ck_assert_int_eq(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    int x = 0;
    ck_assert_int_eq(dl_coll_allreduce(g, &x, &x, 1, (dl_coll_dtype_t)9, DL_COLL_SUM), -EINVAL);
    ck_assert_int_eq(dl_coll_allreduce(g, &x, &x, 1, DL_COLL_INT32, (dl_coll_op_t)9), -EINVAL);
    ck_assert_int_eq(dl_coll_allreduce(g, NULL, &x, 1, DL_COLL_INT32, DL_COLL_SUM), -EINVAL);
    ck_assert_int_eq(dl_coll_broadcast(g, &x, 1, DL_COLL_INT32, 1), -EINVAL);
    ck_assert_int_eq(dl_coll_broadcast(g, &x, 1, DL_COLL_INT32, -1), -EINVAL);
    /* Zero elements need no buffers. */
    ck_assert_int_eq(dl_coll_allreduce(g, NULL, NULL, 0, DL_COLL_INT32, DL_COLL_SUM), 0);
    ck_assert_str_eq(dl_coll_group_error(g), "");
    dl_coll_group_destroy(g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, defaults_are_a_world_of_one);
    tcase_add_test(tc, torchrun_variables_are_read);
    tcase_add_loop_test(tc, bad_values_name_the_variable, 0, sizeof(bad) / sizeof(bad[0]));
    tcase_add_test(tc, rank_must_be_below_world_size);
    tcase_add_test(tc, world_of_one_needs_no_master);
    tcase_add_test(tc, world_of_two_needs_a_master);
    tcase_add_test(tc, bad_arguments_are_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
