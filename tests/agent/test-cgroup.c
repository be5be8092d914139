/* CPU quotas read from fake cgroup trees: v1 and v2, nested limits, "max", fractions of a CPU,
 * a container's mount of its own cgroup, and malformed files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cgroup.h"
#include "dl-test.h"

static char base[] = "/tmp/dl-test-cgroup-XXXXXX";
static char root[256];
static int case_no;

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(base));
}

/* Each test gets a fresh fake root. */
static void new_root(void)
{
    snprintf(root, sizeof(root), "%s/%d", base, ++case_no);
    ck_assert_int_eq(mkdir(root, 0755), 0);
}

static void put(const char *rel, const char *text)
{
    dl_test_put_file(root, rel, text);
}

static void ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    ck_assert_msg(n >= t && strcmp(s + n - t, tail) == 0, "'%s' does not end in '%s'", s, tail);
}

static const char v1_mounts[] =
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n";

DL_TEST(v1_nested_quotas_smallest_wins)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "3:cpuset:/\n2:cpu,cpuacct:/slurm/job1/step0\n0::/\n");
    put("proc/self/mountinfo", v1_mounts);
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/cpu.cfs_quota_us", "400000\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/cpu.cfs_period_us", "100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/job1/cpu.cfs_quota_us", "75000\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/job1/cpu.cfs_period_us", "50000\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/job1/step0/cpu.cfs_quota_us", "-1\n");
    put("sys/fs/cgroup/cpu,cpuacct/slurm/job1/step0/cpu.cfs_period_us", "100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_str_eq(warn, "");
    ck_assert_int_eq(q.quota_us, 75000);
    ck_assert_int_eq(q.period_us, 50000);
    ends_with(q.file, "/sys/fs/cgroup/cpu,cpuacct/slurm/job1/cpu.cfs_quota_us");
    /* 1.5 CPUs: one worker, whatever the affinity mask allows. */
    ck_assert_int_eq(dl_cgroup_cpu_workers(2, &q), 1);
    ck_assert_int_eq(dl_cgroup_cpu_workers(64, &q), 1);
}

DL_TEST(v1_quota_below_affinity_and_above_it)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "2:cpu,cpuacct:/job\n");
    put("proc/self/mountinfo", v1_mounts);
    put("sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "350000\n");
    put("sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_int_eq(dl_cgroup_cpu_workers(16, &q), 3);
    /* The affinity mask is the tighter bound here. */
    ck_assert_int_eq(dl_cgroup_cpu_workers(2, &q), 2);
}

DL_TEST(v2_max_is_no_limit_and_a_parent_limits)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "0::/user.slice/job.scope\n");
    put("proc/self/mountinfo", "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/user.slice/cpu.max", "200000 100000\n");
    put("sys/fs/cgroup/user.slice/job.scope/cpu.max", "max 100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_str_eq(warn, "");
    ck_assert_int_eq(q.quota_us, 200000);
    ck_assert_int_eq(q.period_us, 100000);
    ends_with(q.file, "/sys/fs/cgroup/user.slice/cpu.max");
    ck_assert_int_eq(dl_cgroup_cpu_workers(8, &q), 2);
}

DL_TEST(v2_no_quota_anywhere)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "0::/a/b\n");
    put("proc/self/mountinfo", "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/a/cpu.max", "max 100000\n");
    /* b has no cpu controller enabled: no file at all. */
    put("sys/fs/cgroup/a/b/cgroup.procs", "");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_int_eq(q.quota_us, -1);
    ck_assert_str_eq(q.file, "");
    ck_assert_int_eq(dl_cgroup_cpu_workers(8, &q), 8);
}

DL_TEST(container_sees_its_own_cgroup_as_the_mount_root)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    /* Without a cgroup namespace the path is the host's; the mount shows only our part. */
    put("proc/self/cgroup", "0::/docker/abc123\n");
    put("proc/self/mountinfo",
        "700 690 0:30 /docker/abc123 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n");
    put("sys/fs/cgroup/cpu.max", "50000 100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_int_eq(q.quota_us, 50000);
    /* Half a CPU still runs one worker. */
    ck_assert_int_eq(dl_cgroup_cpu_workers(4, &q), 1);
}

DL_TEST(cgroup_outside_the_mount_is_not_read)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "0::/other/place\n");
    put("proc/self/mountinfo", "700 690 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 c rw\n");
    put("sys/fs/cgroup/cpu.max", "50000 100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_int_eq(q.quota_us, -1);
}

DL_TEST(malformed_files_are_named_and_skipped)
{
    dl_cpu_quota_t q;
    char warn[256];
    new_root();
    put("proc/self/cgroup", "0::/a/b\n2:cpu,cpuacct:/x\n");
    put("proc/self/mountinfo",
        "25 1 0:22 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "garbage line\n"
        "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n");
    put("sys/fs/cgroup/unified/a/b/cpu.max", "lots\n");
    put("sys/fs/cgroup/unified/a/cpu.max", "300000 100000\n");
    put("sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_quota_us", "-7\n");
    put("sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_ptr_nonnull(strstr(warn, "/sys/fs/cgroup/unified/a/b/cpu.max: is not"));
    /* The readable level still counts. */
    ck_assert_int_eq(q.quota_us, 300000);
    ck_assert_int_eq(dl_cgroup_cpu_workers(8, &q), 3);

    new_root();
    put("proc/self/cgroup", "2:cpu:/x\n");
    put("proc/self/mountinfo", "31 30 0:28 / /cg rw - cgroup cgroup rw,cpu\n");
    put("cg/x/cpu.cfs_quota_us", "100000\n");
    put("cg/x/cpu.cfs_period_us", "0\n");
    put("cg/cpu.max", "100 100 100\n"); /* a v2 file in a v1 tree is not read */
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_ptr_nonnull(strstr(warn, "/cg/x/cpu.cfs_period_us: is not a count"));
    ck_assert_int_eq(q.quota_us, -1);

    new_root();
    put("proc/self/cgroup", "0::/\n");
    put("proc/self/mountinfo", "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/cpu.max", "150000 abc\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), 0);
    ck_assert_ptr_nonnull(strstr(warn, "cpu.max: is not 'QUOTA PERIOD'"));
    ck_assert_int_eq(q.quota_us, -1);
}

DL_TEST(unreadable_proc_is_an_error)
{
    dl_cpu_quota_t q = {7, 7, "untouched"};
    char warn[256];
    new_root();
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), -ENOENT);
    ck_assert_int_eq(q.quota_us, 7);
    put("proc/self/cgroup", "0::/\n");
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota(root, &q, warn, sizeof(warn)), -ENOENT);
}

DL_TEST(this_machine_reads_without_error)
{
    dl_cpu_quota_t q;
    char warn[256];
    DL_CHECK_ERRNO(dl_cgroup_cpu_quota("", &q, warn, sizeof(warn)), 0);
    ck_assert_int_ge(dl_cgroup_cpu_workers(1, &q), 1);
}

/* The memory controller's places as death.c asks for them: v1 beside v2, a hierarchy shared
 * with another controller, a mount of a sub-tree, escaped blanks, and another namespace's. */
DL_TEST(places_of_a_controller)
{
    dl_cgroup_place_t p[DL_CGROUP_PLACES];
    int n = -1;
    new_root();
    put("proc/42/cgroup", "9:name=systemd:/\n4:cpu,memory:/outer/job a\n0::/u\n");
    put("proc/42/mountinfo",
        "30 22 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "34 30 0:31 /outer /sys/fs/cgroup/mem\\040ory rw shared:7 - cgroup cgroup rw,cpu,memory\n"
        "40 30 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
    DL_CHECK_ERRNO(dl_cgroup_places(root, 42, "memory", p, DL_CGROUP_PLACES, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert(!p[0].v2);
    ck_assert_str_eq(p[0].mount, "/sys/fs/cgroup/mem ory");
    ck_assert_str_eq(p[0].dir, "/sys/fs/cgroup/mem ory/job a");
    ck_assert(p[1].v2);
    ck_assert_str_eq(p[1].dir, "/sys/fs/cgroup/unified/u");
    /* Up to the mount point and no further. */
    ck_assert(dl_cgroup_parent(p[0].dir, p[0].mount));
    ck_assert_str_eq(p[0].dir, "/sys/fs/cgroup/mem ory");
    ck_assert(!dl_cgroup_parent(p[0].dir, p[0].mount));
    /* A hierarchy mounted at / (a container's): its root is the last level. */
    char dir[64] = "/a/b";
    ck_assert(dl_cgroup_parent(dir, "/"));
    ck_assert_str_eq(dir, "/a");
    ck_assert(dl_cgroup_parent(dir, "/"));
    ck_assert_str_eq(dir, "/");
    ck_assert(!dl_cgroup_parent(dir, "/"));
    /* Another controller: only v2 is a candidate. */
    DL_CHECK_ERRNO(dl_cgroup_places(root, 42, "pids", p, DL_CGROUP_PLACES, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert(p[0].v2);
    /* A cgroup outside the mounted sub-tree is not readable here. */
    put("proc/43/cgroup", "4:memory:/elsewhere\n");
    put("proc/43/mountinfo", "34 30 0:31 /outer /sys/fs/cgroup/memory rw - cgroup cgroup "
                             "rw,memory\n");
    DL_CHECK_ERRNO(dl_cgroup_places(root, 43, "memory", p, DL_CGROUP_PLACES, &n), 0);
    ck_assert_int_eq(n, 0);
    DL_CHECK_ERRNO(dl_cgroup_places(root, 44, "memory", p, DL_CGROUP_PLACES, &n), -ENOENT);
}

/* The quick look (no mountinfo) finds what mountinfo finds on this machine, whichever
 * layout it has; where it cannot tell, it says so and mountinfo is read instead. */
DL_TEST(quick_place_agrees_with_mountinfo_here)
{
    dl_cgroup_place_t quick, p[DL_CGROUP_PLACES];
    int n = 0;
    int r = dl_cgroup_place_quick("", "memory", "memory.oom_control", &quick);
    ck_assert_int_ge(r, 0);
    if (r == 0) {
        printf("# this machine's memory cgroup is not where the quick look checks\n");
        return;
    }
    DL_CHECK_ERRNO(dl_cgroup_places("", 0, "memory", p, DL_CGROUP_PLACES, &n), 0);
    const dl_cgroup_place_t *want = dl_cgroup_charging(p, n);
    ck_assert_ptr_nonnull(want);
    ck_assert_int_eq(quick.v2, want->v2);
    ck_assert_str_eq(quick.mount, want->mount);
    ck_assert_str_eq(quick.dir, want->dir);
}

/* A fake /proc over this machine's real cgroup file system (linked in): the quick look trusts
 * /proc/self/cgroup's path only in the first cgroup namespace, and only at a hierarchy's root. */
DL_TEST(quick_place_only_in_the_first_namespace)
{
    struct statfs sf;
    char target[512], link[512];
    dl_cgroup_place_t q;
    bool v1 = statfs("/sys/fs/cgroup/memory", &sf) == 0 && sf.f_type == 0x27e0eb &&
              access("/sys/fs/cgroup/memory/release_agent", F_OK) == 0;
    bool v2 = !v1 && statfs("/sys/fs/cgroup", &sf) == 0 && sf.f_type == 0x63677270 &&
              access("/sys/fs/cgroup/cgroup.type", F_OK) != 0;
    if (!v1 && !v2) {
        printf("# no memory cgroup root at /sys/fs/cgroup here: nothing to link to\n");
        return;
    }
    new_root();
    put("proc/self/cgroup", v1 ? "4:memory:/job\n0::/\n" : "0::/job\n");
    snprintf(link, sizeof(link), "%s/sys/fs/cgroup%s", root, v1 ? "/memory" : "");
    put(v1 ? "sys/fs/cgroup/x" : "sys/fs/x", "");
    snprintf(target, sizeof(target), "/sys/fs/cgroup%s", v1 ? "/memory" : "");
    if (v2)
        ck_assert_int_eq(rmdir(link) == 0 || errno == ENOENT, 1);
    ck_assert_int_eq(symlink(target, link), 0);
    snprintf(link, sizeof(link), "%s/proc/self/ns", root);
    ck_assert_int_eq(mkdir(link, 0755), 0);
    snprintf(link, sizeof(link), "%s/proc/self/ns/cgroup", root);
    ck_assert_int_eq(symlink("cgroup:[4026531835]", link), 0);
    DL_CHECK_ERRNO(dl_cgroup_place_quick(root, "memory", "memory.oom_control", &q), 1);
    ck_assert_int_eq(q.v2, v2);
    ck_assert_str_eq(q.mount, target);
    ends_with(q.dir, "/job");
    ck_assert_int_eq(strncmp(q.dir, target, strlen(target)), 0);
    /* Another namespace: its paths start at its own root, which only mountinfo places. */
    ck_assert_int_eq(unlink(link), 0);
    ck_assert_int_eq(symlink("cgroup:[4026532999]", link), 0);
    DL_CHECK_ERRNO(dl_cgroup_place_quick(root, "memory", "memory.oom_control", &q), 0);
    /* No namespace link at all (an old kernel, a made-up tree): the same. */
    ck_assert_int_eq(unlink(link), 0);
    DL_CHECK_ERRNO(dl_cgroup_place_quick(root, "memory", "memory.oom_control", &q), 0);
}

DL_TEST_SUITE(.setup_once = setup, .no_fork = true, .scratch_dir = base);
