/* Group options from the launcher's environment: what is read, the defaults, and a one-line error
 * naming the variable for anything malformed. */
#include <errno.h>
#include <string.h>

#include "collective.h"
#include "dl-test.h"
#include "internal.h" /* dl__coll_iface_pick */

#include <arpa/inet.h>
#include <ifaddrs.h>

DL_TEST(defaults_are_a_world_of_one)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *env[] = {"PATH=/bin", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env, err, sizeof(err)), 0);
    ck_assert_int_eq(o.rank, 0);
    ck_assert_int_eq(o.world_size, 1);
    ck_assert_int_eq(o.transport, DL_COLL_TRANSPORT_AUTO);
    ck_assert_int_eq(o.algo, DL_COLL_ALGO_AUTO);
    ck_assert_int_eq(o.order, DL_COLL_ORDER_RANK);
    ck_assert_int_eq(o.timeout_ms, 30000);
    ck_assert_uint_gt(o.shm_chunk_bytes, 0);
    ck_assert_uint_eq(o.shm_small_bytes, DL_COLL_SMALL_AUTO);
    char *env2[] = {"DLAUNCH_COLL_SHM_SMALL=auto", NULL};
    o.shm_small_bytes = 5;
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env2, err, sizeof(err)), 0);
    ck_assert_uint_eq(o.shm_small_bytes, DL_COLL_SMALL_AUTO);
}

DL_TEST(torchrun_variables_are_read)
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
                   "DLAUNCH_COLL_ADOPT_MIN=4M",
                   "DLAUNCH_STORE=127.0.0.1:41000",
                   "DLAUNCH_TOKEN_FILE=/run/job.token",
                   "DLAUNCH_TOKEN=s3cret",
                   "DLAUNCH_SOCKET_IFNAME=eth1",
                   "DLAUNCH_COLL_ORDER=any",
                   NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env, err, sizeof(err)), 0);
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
    ck_assert_uint_eq(o.adopt_min_bytes, 4 << 20);
    ck_assert_str_eq(o.store, "127.0.0.1:41000");
    ck_assert_str_eq(o.token_file, "/run/job.token");
    ck_assert_str_eq(o.token, "s3cret");
    ck_assert_str_eq(o.ifname, "eth1");
    ck_assert_int_eq(o.order, DL_COLL_ORDER_ANY);
}

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
    {"DLAUNCH_COLL_ORDER=fast"},
    {"DLAUNCH_COLL_TIMEOUT=0"},
    {"DLAUNCH_COLL_TIMEOUT=-3"},
    {"DLAUNCH_COLL_TIMEOUT=nan"},
    {"DLAUNCH_COLL_TIMEOUT=10s"},
    {"DLAUNCH_COLL_SHM_CHUNK=100"},
    {"DLAUNCH_COLL_SHM_CHUNK=4T"},
    {"DLAUNCH_COLL_TCP_SMALL=-1"},
    {"DLAUNCH_COLL_SPIN_US=-5"},
    {"DLAUNCH_COLL_ADOPT_MIN=100"},
    {"DLAUNCH_COLL_ADOPT_MIN=never"},
    {"DLAUNCH_SOCKET_IFNAME=a-name-longer-than-any-interface-could-have-0123456789abcdefghij"},
};

DL_TEST_LOOP(bad_values_name_the_variable, 0, sizeof(bad) / sizeof(bad[0]))
{
    dl_coll_options_t o, before;
    char err[256] = "";
    dl_coll_options_init(&o);
    before = o;
    char *env[] = {(char *)bad[_i].var, NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env, err, sizeof(err)), -EINVAL);
    char name[64];
    size_t n = strcspn(bad[_i].var, "=");
    memcpy(name, bad[_i].var, n);
    name[n] = '\0';
    ck_assert_msg(strstr(err, name) != NULL, "'%s' does not name %s", err, name);
    /* Untouched on failure. */
    ck_assert(memcmp(&o, &before, sizeof(o)) == 0);
}

DL_TEST(adoption_is_on_from_128k_and_may_be_off)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    ck_assert_uint_eq(o.adopt_min_bytes, 128 << 10);
    char *env[] = {"DLAUNCH_COLL_ADOPT_MIN=off", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env, err, sizeof(err)), 0);
    ck_assert_uint_eq(o.adopt_min_bytes, 0);
}

DL_TEST(rank_must_be_below_world_size)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_options_init(&o);
    char *env[] = {"RANK=4", "WORLD_SIZE=4", NULL};
    DL_CHECK_ERRNO(dl_coll_options_from_env(&o, env, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "RANK=4"));
}

DL_TEST(world_of_one_needs_no_master)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    DL_CHECK_ERRNO(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    ck_assert_int_eq(dl_coll_world_size(g), 1);
    ck_assert_str_eq(dl_coll_transport_name(g), "self");
    int x[3] = {1, 2, 3}, y[3] = {0};
    DL_CHECK_ERRNO(dl_coll_allreduce(g, x, y, 3, DL_COLL_INT32, DL_COLL_AVG), 0);
    ck_assert_int_eq(y[2], 3);
    DL_CHECK_ERRNO(dl_coll_barrier(g), 0);
    dl_coll_group_destroy(g);
    dl_coll_group_destroy(NULL);
}

DL_TEST(world_of_two_needs_a_master)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    o.world_size = 2;
    DL_CHECK_ERRNO(dl_coll_group_create(&o, &g, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_null(g);
    ck_assert_ptr_nonnull(strstr(err, "MASTER_ADDR"));
}

DL_TEST(bad_arguments_are_refused)
{
    dl_coll_options_t o;
    char err[256] = "";
    dl_coll_group_t *g = NULL;
    dl_coll_options_init(&o);
    DL_CHECK_ERRNO(dl_coll_group_create(&o, &g, err, sizeof(err)), 0);
    int x = 0;
    DL_CHECK_ERRNO(dl_coll_allreduce(g, &x, &x, 1, (dl_coll_dtype_t)9, DL_COLL_SUM), -EINVAL);
    DL_CHECK_ERRNO(dl_coll_allreduce(g, &x, &x, 1, DL_COLL_INT32, (dl_coll_op_t)9), -EINVAL);
    DL_CHECK_ERRNO(dl_coll_allreduce(g, NULL, &x, 1, DL_COLL_INT32, DL_COLL_SUM), -EINVAL);
    DL_CHECK_ERRNO(dl_coll_broadcast(g, &x, 1, DL_COLL_INT32, 1), -EINVAL);
    DL_CHECK_ERRNO(dl_coll_broadcast(g, &x, 1, DL_COLL_INT32, -1), -EINVAL);
    /* Zero elements need no buffers. */
    DL_CHECK_ERRNO(dl_coll_allreduce(g, NULL, NULL, 0, DL_COLL_INT32, DL_COLL_SUM), 0);
    ck_assert_str_eq(dl_coll_group_error(g), "");
    dl_coll_group_destroy(g);
}

/* ---- which address of DLAUNCH_SOCKET_IFNAME a rank listens on ----------------------------- */

typedef struct {
    struct ifaddrs ifa;
    struct sockaddr_storage ss;
} entry_t;

static void add(entry_t *e, int *n, const char *name, const char *text)
{
    entry_t *x = &e[*n];
    memset(x, 0, sizeof(*x));
    x->ifa.ifa_name = (char *)name;
    if (strchr(text, ':') != NULL) {
        x->ss.ss_family = AF_INET6;
        ck_assert_int_eq(inet_pton(AF_INET6, text, &((struct sockaddr_in6 *)&x->ss)->sin6_addr), 1);
    } else {
        x->ss.ss_family = AF_INET;
        ck_assert_int_eq(inet_pton(AF_INET, text, &((struct sockaddr_in *)&x->ss)->sin_addr), 1);
    }
    x->ifa.ifa_addr = (struct sockaddr *)&x->ss;
    if (*n > 0)
        e[*n - 1].ifa.ifa_next = &x->ifa;
    (*n)++;
}

static dl__coll_addr_t v4(const char *text)
{
    dl__coll_addr_t a;
    memset(&a, 0, sizeof(a));
    struct sockaddr_in *s4 = (struct sockaddr_in *)&a.ss;
    s4->sin_family = AF_INET;
    ck_assert_int_eq(inet_pton(AF_INET, text, &s4->sin_addr), 1);
    a.len = sizeof(*s4);
    return a;
}

static void pick_is(const struct ifaddrs *list, const char *ifname, const char *prefer,
                    const char *want)
{
    dl__coll_addr_t p = v4(prefer), got;
    DL_CHECK_ERRNO(dl__coll_iface_pick(list, ifname, &p, &got), 0);
    char buf[128];
    dl__coll_addr_str(&got, buf, sizeof(buf));
    ck_assert_msg(strncmp(buf, want, strlen(want)) == 0 && buf[strlen(want)] == ':',
                  "%s toward %s: got %s, want %s", ifname, prefer, buf, want);
}

DL_TEST(socket_ifname_picks_an_address_of_that_interface)
{
    entry_t e[8];
    int n = 0;
    add(e, &n, "eth0", "10.77.1.1");
    add(e, &n, "eth1", "fe80::2");
    add(e, &n, "eth1", "fd00::2");
    add(e, &n, "eth1", "10.77.0.2");
    add(e, &n, "eth1", "10.77.0.12");
    add(e, &n, "ll0", "fe80::3");
    const struct ifaddrs *list = &e[0].ifa;
    /* The route's own source, when the interface has it. */
    pick_is(list, "eth1", "10.77.0.12", "10.77.0.12");
    /* Else the interface's first address of the same family, never the wrong interface's. */
    pick_is(list, "eth1", "10.77.1.1", "10.77.0.2");
    pick_is(list, "eth0", "10.77.0.2", "10.77.1.1");
    dl__coll_addr_t p = v4("10.77.0.2"), got;
    DL_CHECK_ERRNO(dl__coll_iface_pick(list, "eth9", &p, &got), -ENODEV);
    /* Link-local only: nothing another host could connect to. */
    DL_CHECK_ERRNO(dl__coll_iface_pick(list, "ll0", &p, &got), -EADDRNOTAVAIL);
}
