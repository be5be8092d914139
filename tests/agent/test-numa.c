/* --numa-binding's plan on made-up machines built the way torchrun's tests build theirs
 * (sockets, NUMA nodes, GPUs, L3 caches, cores, hyperthreads), CPU lists, and the sysfs
 * reader on a fake tree. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpulist.h"
#include "dl-test.h"
#include "numa.h"

static char base[] = "/tmp/dl-test-numa-XXXXXX";

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(base));
}

/* Linux numbers a core's second hyperthread after every first one: core c is CPUs c and
 * c + cores. Nodes, caches and sockets take consecutive cores; GPUs go node by node. */
static dl_topo_t *machine(int sockets, int nodes_per_socket, int gpus_per_node, int l3_per_node,
                          int cores_per_l3, int threads)
{
    dl_topo_t *t = calloc(1, sizeof(*t));
    int cores_per_node = l3_per_node * cores_per_l3;
    int nodes = sockets * nodes_per_socket, cores = nodes * cores_per_node;
    ck_assert_ptr_nonnull(t);
    t->cpu_count = cores * threads;
    t->node_count = nodes;
    for (int c = 0; c < cores; c++) {
        int node = c / cores_per_node;
        int l3_first = c - c % cores_per_l3;
        for (int h = 0; h < threads; h++) {
            int cpu = c + h * cores;
            t->core[cpu] = c;
            t->llc[cpu] = l3_first;
            t->package[cpu] = node / nodes_per_socket;
            dl_cpus_set(&t->node_cpus[node], cpu);
            dl_cpus_set(&t->allowed, cpu);
        }
    }
    t->gpu_count = nodes * gpus_per_node;
    for (int g = 0; g < t->gpu_count; g++) {
        t->gpu_node[g] = g / gpus_per_node;
        snprintf(t->gpu_addr[g], sizeof(t->gpu_addr[g]), "0000:%02x:00.0", 0x10 + g);
    }
    return t;
}

static void cpus_are(const dl_place_t *p, const char *want)
{
    char got[256];
    dl_cpus_format(&p->cpus, got, sizeof(got));
    ck_assert_str_eq(got, want);
}

static void plan_ok(const dl_topo_t *t, dl_numa_mode_t mode, int n, dl_place_t *ret)
{
    char err[512] = "";
    int r = dl_numa_plan(t, mode, n, ret, err, sizeof(err));
    ck_assert_msg(r == 0, "plan failed: %s", err);
}

static void plan_fails(const dl_topo_t *t, dl_numa_mode_t mode, int n, const char *want)
{
    dl_place_t ret[16];
    char err[512] = "";
    DL_CHECK_ERRNO(dl_numa_plan(t, mode, n, ret, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, want) != NULL, "'%s' does not say '%s'", err, want);
    ck_assert_ptr_null(strchr(err, '\n'));
}

DL_TEST(cpu_lists_parse_and_print)
{
    dl_cpus_t s;
    char buf[64];
    DL_CHECK_ERRNO(dl_cpus_parse("0-3,8,10-11\n", &s), 0);
    ck_assert_int_eq(dl_cpus_count(&s), 7);
    DL_CHECK_ERRNO(dl_cpus_first(&s), 0);
    dl_cpus_format(&s, buf, sizeof(buf));
    ck_assert_str_eq(buf, "0-3,8,10-11");
    DL_CHECK_ERRNO(dl_cpus_parse("", &s), 0);
    ck_assert_int_eq(dl_cpus_first(&s), -1);
    dl_cpus_format(&s, buf, sizeof(buf));
    ck_assert_str_eq(buf, "");
    DL_CHECK_ERRNO(dl_cpus_parse("4095", &s), 0);
    ck_assert(dl_cpus_has(&s, 4095));
    const char *bad[] = {"1-", "a", "3-1", "1,,2", "1,", "-1", "1 2", "0x1", NULL};
    for (int i = 0; bad[i] != NULL; i++)
        ck_assert_msg(dl_cpus_parse(bad[i], &s) == -EINVAL, "'%s' parsed", bad[i]);
    DL_CHECK_ERRNO(dl_cpus_parse("4096", &s), -ERANGE);
    DL_CHECK_ERRNO(dl_cpus_parse("0-99999999999999999999", &s), -ERANGE);
    /* A short buffer truncates, never overflows. */
    DL_CHECK_ERRNO(dl_cpus_parse("0,2,4,6,8,10,12", &s), 0);
    dl_cpus_format(&s, buf, 6);
    ck_assert_int_le(strlen(buf), 5);
}

DL_TEST(node_binds_to_the_gpus_node)
{
    dl_topo_t *t = machine(2, 1, 2, 1, 4, 2);
    dl_place_t p[4];
    plan_ok(t, DL_NUMA_NODE, 4, p);
    cpus_are(&p[0], "0-3,8-11");
    cpus_are(&p[1], "0-3,8-11");
    cpus_are(&p[2], "4-7,12-15");
    cpus_are(&p[3], "4-7,12-15");
    ck_assert_int_eq(p[3].node, 1);
    ck_assert_int_eq(p[3].mem_node, 1);
    ck_assert_str_eq(p[3].gpu_addr, "0000:13:00.0");
    /* Fewer workers than GPUs: worker i still belongs to GPU i. */
    plan_ok(t, DL_NUMA_NODE, 1, p);
    cpus_are(&p[0], "0-3,8-11");
    free(t);
}

DL_TEST(node_is_cut_down_to_the_allowed_cpus)
{
    dl_topo_t *t = machine(2, 1, 1, 1, 4, 1);
    dl_place_t p[2];
    /* A cpuset of 1-2 and 6: node 0 keeps 1-2, node 1 keeps 6. */
    DL_CHECK_ERRNO(dl_cpus_parse("1-2,6", &t->allowed), 0);
    plan_ok(t, DL_NUMA_NODE, 2, p);
    cpus_are(&p[0], "1-2");
    cpus_are(&p[1], "6");
    DL_CHECK_ERRNO(dl_cpus_parse("4-7", &t->allowed), 0);
    plan_fails(t, DL_NUMA_NODE, 2,
               "NUMA node 0 of GPU 0 (0000:10:00.0) has no CPU this agent "
               "may use (allowed: 4-7)");
    free(t);
}

DL_TEST(socket_takes_every_node_of_the_socket)
{
    dl_topo_t *t = machine(2, 2, 1, 1, 2, 1);
    dl_place_t p[4];
    plan_ok(t, DL_NUMA_SOCKET, 4, p);
    cpus_are(&p[0], "0-3");
    cpus_are(&p[1], "0-3");
    cpus_are(&p[2], "4-7");
    cpus_are(&p[3], "4-7");
    ck_assert_int_eq(p[1].node, 1);
    ck_assert_int_eq(p[1].mem_node, 1);
    /* A node of the socket with no allowed CPU adds nothing and breaks nothing. */
    DL_CHECK_ERRNO(dl_cpus_parse("0-1,4-7", &t->allowed), 0);
    plan_ok(t, DL_NUMA_SOCKET, 1, p);
    cpus_are(&p[0], "0-1");
    free(t);
}

DL_TEST(exclusive_splits_cores_lowest_gpus_get_the_extra)
{
    /* One node, 8 cores of 2 threads, 3 GPUs: 3, 3 and 2 cores, hyperthreads together. */
    dl_topo_t *t = machine(1, 1, 3, 1, 8, 2);
    dl_place_t p[3];
    plan_ok(t, DL_NUMA_EXCLUSIVE, 3, p);
    cpus_are(&p[0], "0-2,8-10");
    cpus_are(&p[1], "3-5,11-13");
    cpus_are(&p[2], "6-7,14-15");
    ck_assert_int_eq(p[0].mem_node, -1); /* one node: nothing to prefer */
    /* A half-allowed core still counts as a core, with what is allowed of it. */
    DL_CHECK_ERRNO(dl_cpus_parse("0-7,9-15", &t->allowed), 0);
    plan_ok(t, DL_NUMA_EXCLUSIVE, 3, p);
    cpus_are(&p[0], "0-2,9-10");
    free(t);

    /* Per node: the GPUs of node 1 split node 1's cores among themselves. */
    t = machine(2, 1, 2, 1, 3, 1);
    dl_place_t q[4];
    plan_ok(t, DL_NUMA_EXCLUSIVE, 4, q);
    cpus_are(&q[0], "0-1");
    cpus_are(&q[1], "2");
    cpus_are(&q[2], "3-4");
    cpus_are(&q[3], "5");
    free(t);

    t = machine(1, 1, 4, 1, 3, 2);
    plan_fails(t, DL_NUMA_EXCLUSIVE, 4,
               "NUMA node 0 has 3 physical cores this agent may use, "
               "fewer than its 4 GPUs");
    free(t);
}

DL_TEST(core_complex_one_cache_group_per_gpu)
{
    dl_topo_t *t = machine(1, 1, 2, 2, 4, 1);
    dl_place_t p[3];
    plan_ok(t, DL_NUMA_CORE_COMPLEX, 2, p);
    cpus_are(&p[0], "0-3");
    cpus_are(&p[1], "4-7");
    /* The fullest group comes first: with CPU 0 taken away, 4-7 goes to GPU 0. */
    DL_CHECK_ERRNO(dl_cpus_parse("1-7", &t->allowed), 0);
    plan_ok(t, DL_NUMA_CORE_COMPLEX, 2, p);
    cpus_are(&p[0], "4-7");
    cpus_are(&p[1], "1-3");
    free(t);
    /* More GPUs than groups: they wrap around. */
    t = machine(1, 1, 3, 2, 2, 1);
    plan_ok(t, DL_NUMA_CORE_COMPLEX, 3, p);
    cpus_are(&p[0], "0-1");
    cpus_are(&p[1], "2-3");
    cpus_are(&p[2], "0-1");
    free(t);
}

DL_TEST(what_cannot_be_placed_is_an_error)
{
    dl_topo_t *t = machine(1, 1, 2, 1, 4, 1);
    plan_fails(t, DL_NUMA_NODE, 3, "local rank 2 has no GPU to be placed near (2 found)");
    t->core[1] = -1;
    plan_fails(t, DL_NUMA_EXCLUSIVE, 2, "the physical core of CPU 1 is unknown");
    t->llc[2] = -1;
    plan_fails(t, DL_NUMA_CORE_COMPLEX, 2, "the last-level cache of CPU 2 is unknown");
    t->package[0] = -1;
    plan_fails(t, DL_NUMA_SOCKET, 1, "the socket of CPU 0 is unknown");
    t->gpu_node[1] = 5;
    plan_fails(t, DL_NUMA_NODE, 2, "GPU 1 (0000:11:00.0) is on NUMA node 5, which has no CPU");
    t->gpu_count = 0;
    plan_fails(t, DL_NUMA_NODE, 1, "no GPU found");
    free(t);
}

/* ---- The reader, on a fake tree ---------------------------------------------------------- */

static char root[256];
static int case_no;

static void put(const char *rel, const char *text)
{
    dl_test_put_file(root, rel, text);
}

/* Two nodes (CPU 0 on node 0, CPU 1 on node 1, one socket), three GPUs: two on node 0 (one
 * of them says -1) and one on node 1. */
static void fake_machine(void)
{
    snprintf(root, sizeof(root), "%s/%d", base, ++case_no);
    ck_assert_int_eq(mkdir(root, 0755), 0);
    put("sys/devices/system/node/node0/cpulist", "0\n");
    put("sys/devices/system/node/node1/cpulist", "1\n");
    put("sys/devices/system/node/possible", "0-1\n");
    const char *gpus[][3] = {{"0000:3b:00.0", "0", "GPU-aaaa1111"},
                             {"0000:86:00.0", "1", "GPU-bbbb2222"},
                             {"0000:1a:00.0", "-1", "GPU-cccc3333"}};
    for (int g = 0; g < 3; g++) {
        char rel[256], text[256];
        snprintf(rel, sizeof(rel), "proc/driver/nvidia/gpus/%s/information", gpus[g][0]);
        snprintf(text, sizeof(text), "Model: \t\t Fake\nGPU UUID: \t %s\nBus Location: \t %s\n",
                 gpus[g][2], gpus[g][0]);
        put(rel, text);
        snprintf(rel, sizeof(rel), "sys/bus/pci/devices/%s/numa_node", gpus[g][0]);
        snprintf(text, sizeof(text), "%s\n", gpus[g][1]);
        put(rel, text);
    }
    for (int c = 0; c < 2; c++) {
        char rel[256], text[16];
        snprintf(text, sizeof(text), "%d\n", c);
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        put(rel, text);
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        put(rel, "0\n");
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index0/level", c);
        put(rel, "1\n");
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index0/type", c);
        put(rel, "Instruction\n");
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index3/level", c);
        put(rel, "3\n");
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index3/type", c);
        put(rel, "Unified\n");
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list", c);
        put(rel, text);
    }
}

static dl_topo_t *read_ok(const char *cuda_visible, dl_numa_mode_t mode)
{
    dl_topo_t *t = malloc(sizeof(*t));
    dl_cpus_t allowed;
    char err[512] = "";
    DL_CHECK_ERRNO(dl_cpus_parse("0-1", &allowed), 0);
    int r = dl_topo_read(root, cuda_visible, mode, &allowed, t, err, sizeof(err));
    ck_assert_msg(r == 0, "read failed: %s", err);
    return t;
}

static void read_fails(const char *cuda_visible, dl_numa_mode_t mode, const char *want)
{
    dl_topo_t *t = malloc(sizeof(*t));
    dl_cpus_t allowed;
    char err[512] = "";
    DL_CHECK_ERRNO(dl_cpus_parse("0-1", &allowed), 0);
    ck_assert_int_lt(dl_topo_read(root, cuda_visible, mode, &allowed, t, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, want) != NULL, "'%s' does not say '%s'", err, want);
    free(t);
}

DL_TEST(reader_sorts_gpus_by_bus_and_follows_cuda_visible_devices)
{
    fake_machine();
    dl_topo_t *t = read_ok(NULL, DL_NUMA_NODE);
    ck_assert_int_eq(t->gpu_count, 3);
    ck_assert_str_eq(t->gpu_addr[0], "0000:1a:00.0");
    ck_assert_str_eq(t->gpu_addr[1], "0000:3b:00.0");
    ck_assert_str_eq(t->gpu_addr[2], "0000:86:00.0");
    ck_assert_int_eq(t->gpu_node[0], 0); /* -1 in sysfs */
    ck_assert_int_eq(t->gpu_node[2], 1);
    ck_assert_int_eq(t->node_count, 2);
    free(t);
    t = read_ok("2,GPU-cccc", DL_NUMA_NODE);
    ck_assert_int_eq(t->gpu_count, 2);
    ck_assert_str_eq(t->gpu_addr[0], "0000:86:00.0");
    ck_assert_str_eq(t->gpu_addr[1], "0000:1a:00.0");
    dl_place_t p[2];
    plan_ok(t, DL_NUMA_NODE, 2, p);
    cpus_are(&p[0], "1");
    cpus_are(&p[1], "0");
    free(t);
    t = read_ok("", DL_NUMA_NODE);
    ck_assert_int_eq(t->gpu_count, 0);
    free(t);
    read_fails("3", DL_NUMA_NODE,
               "CUDA_VISIBLE_DEVICES: '3' is not the index or GPU- UUID of "
               "one of the 3 GPUs in");
    read_fails("MIG-1234", DL_NUMA_NODE, "'MIG-1234' is not the index");
}

DL_TEST(reader_reads_what_each_mode_needs)
{
    fake_machine();
    dl_place_t p[3];
    dl_topo_t *t = read_ok(NULL, DL_NUMA_EXCLUSIVE);
    ck_assert_int_eq(t->core[1], 1);
    plan_fails(t, DL_NUMA_EXCLUSIVE, 3,
               "NUMA node 0 has 1 physical core this agent may use, "
               "fewer than its 2 GPUs");
    free(t);
    t = read_ok(NULL, DL_NUMA_CORE_COMPLEX);
    ck_assert_int_eq(t->llc[1], 1);
    plan_ok(t, DL_NUMA_CORE_COMPLEX, 3, p);
    cpus_are(&p[0], "0");
    cpus_are(&p[2], "1");
    free(t);
    t = read_ok(NULL, DL_NUMA_SOCKET);
    plan_ok(t, DL_NUMA_SOCKET, 3, p);
    cpus_are(&p[0], "0-1");
    cpus_are(&p[2], "0-1");
    ck_assert_int_eq(p[2].mem_node, 1);
    free(t);
}

DL_TEST(reader_without_gpus_reads_nothing_more)
{
    /* No GPU, no topology: the plan's "no GPU found" is the one error, in every mode. */
    snprintf(root, sizeof(root), "%s/%d", base, ++case_no);
    ck_assert_int_eq(mkdir(root, 0755), 0);
    dl_topo_t *t = read_ok(NULL, DL_NUMA_CORE_COMPLEX);
    ck_assert_int_eq(t->gpu_count, 0);
    plan_fails(t, DL_NUMA_CORE_COMPLEX, 1, "no GPU found");
    free(t);
}

DL_TEST(reader_names_the_bad_file)
{
    fake_machine();
    put("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1-\n");
    read_fails(NULL, DL_NUMA_EXCLUSIVE, "cpu1/topology/thread_siblings_list: is not a CPU list");
    put("sys/devices/system/cpu/cpu0/topology/physical_package_id", "zero\n");
    read_fails(NULL, DL_NUMA_SOCKET, "cpu0/topology/physical_package_id: is not a number");
    put("sys/bus/pci/devices/0000:86:00.0/numa_node", "");
    read_fails(NULL, DL_NUMA_NODE, "0000:86:00.0/numa_node: is not a number");
    unlink(strcat(strcpy((char[512]){0}, root), "/sys/bus/pci/devices/0000:86:00.0/numa_node"));
    read_fails(NULL, DL_NUMA_NODE, "0000:86:00.0/numa_node: No such file or directory");

    fake_machine();
    put("sys/devices/system/node/node1/cpulist", "1,x\n");
    read_fails(NULL, DL_NUMA_NODE, "node1/cpulist: is not a CPU list");

    fake_machine();
    put("sys/devices/system/cpu/cpu0/cache/index3/type", "Instruction\n");
    /* Only the instruction cache is left at level 3: the data level 1 is none, so nothing. */
    read_fails(NULL, DL_NUMA_CORE_COMPLEX, "cpu0/cache: has no data or unified cache");

    /* A machine whose kernel has no NUMA support shows no node folder at all. */
    snprintf(root, sizeof(root), "%s/%d", base, ++case_no);
    ck_assert_int_eq(mkdir(root, 0755), 0);
    put("proc/driver/nvidia/gpus/0000:3b:00.0/information", "GPU UUID: GPU-1\n");
    put("sys/bus/pci/devices/0000:3b:00.0/numa_node", "-1\n");
    read_fails(NULL, DL_NUMA_NODE, "sys/devices/system/node: No such file or directory");
}

DL_TEST_SUITE(.setup_once = setup, .no_fork = true, .scratch_dir = base);
