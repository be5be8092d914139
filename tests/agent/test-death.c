/* Why a worker died: the memory cgroup's OOM counters found from /proc and mountinfo, on
 * made-up trees of both cgroup versions, and a process's state and wait channel. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "death.h"
#include "dl-test.h"

static char root[] = "/tmp/dl-test-death-XXXXXX";

static void put(const char *rel, const char *text)
{
    dl_test_put_file(root, rel, text);
}

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(root, "/tmp/dl-test-death-XXXXXX");
}

DL_TEST(counter_and_limit_parsers)
{
    ck_assert_int_eq(dl_memcg_parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"), 7);
    ck_assert_int_eq(dl_memcg_parse_oom_kills("low 0\nhigh 2\nmax 5\noom 3\noom_kill 2\n"), 2);
    DL_CHECK_ERRNO(dl_memcg_parse_oom_kills("oom 3\n"), -ENOENT);
    DL_CHECK_ERRNO(dl_memcg_parse_oom_kills("oom_kill x\n"), -EINVAL);
    ck_assert_int_eq(dl_memcg_parse_limit("201326592\n"), 201326592);
    DL_CHECK_ERRNO(dl_memcg_parse_limit("max\n"), 0);
    DL_CHECK_ERRNO(dl_memcg_parse_limit("9223372036854771712\n"), 0);
    DL_CHECK_ERRNO(dl_memcg_parse_limit("nonsense"), 0);
}

DL_TEST(oom_kills_counted_at_any_level_v1)
{
    dl_memcg_t w;
    dl_oom_t what = {0};
    put("/proc/77/cgroup", "4:memory:/outer/job/step\n");
    put("/proc/77/mountinfo", "34 30 0:31 /outer /sys/fs/cgroup/memory rw - cgroup cgroup "
                              "rw,memory\n");
    put("/sys/fs/cgroup/memory/job/step/memory.oom_control", "oom_kill 0\n");
    put("/sys/fs/cgroup/memory/job/memory.oom_control", "oom_kill 1\n");
    put("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "201326592\n");
    put("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill 4\n");
    DL_CHECK_ERRNO(dl_memcg_open(&w, root, 77), 0);
    ck_assert_int_eq(w.version, 1);
    ck_assert_int_eq(w.n, 3); /* step, job, the mount's root */
    ck_assert(!dl_memcg_oom_since(&w, root, &what));
    /* The job's cgroup ran out: the kill is counted there, not in the step's. */
    put("/sys/fs/cgroup/memory/job/memory.oom_control", "oom_kill 2\n");
    ck_assert(dl_memcg_oom_since(&w, root, &what));
    ck_assert(what.killed);
    ck_assert_int_eq(what.limit, 201326592);
    ck_assert_ptr_nonnull(strstr(what.cgroup, "/sys/fs/cgroup/memory/job"));
    /* Counted once: the next look sees nothing new. */
    memset(&what, 0, sizeof(what));
    ck_assert(!dl_memcg_oom_since(&w, root, &what));
}

DL_TEST(oom_kills_v2_and_no_controller)
{
    dl_memcg_t w;
    dl_oom_t what = {0};
    put("/proc/5/cgroup", "0::/app\n");
    put("/proc/5/mountinfo", "40 30 0:33 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("/sys/fs/cgroup/app/memory.events", "low 0\nhigh 0\nmax 9\noom 1\noom_kill 0\n");
    put("/sys/fs/cgroup/app/memory.max", "max\n");
    DL_CHECK_ERRNO(dl_memcg_open(&w, root, 5), 0);
    ck_assert_int_eq(w.version, 2);
    put("/sys/fs/cgroup/app/memory.events", "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n");
    ck_assert(dl_memcg_oom_since(&w, root, &what));
    ck_assert_int_eq(what.limit, 0); /* "max": no figure to give */
    /* No memory controller at all: said, not guessed. */
    put("/proc/6/cgroup", "2:cpu:/\n");
    put("/proc/6/mountinfo", "");
    DL_CHECK_ERRNO(dl_memcg_open(&w, root, 6), -ENOENT);
    ck_assert_int_eq(dl_memcg_open(&w, root, 99), -ENOENT); /* no such process */
}

DL_TEST(kernel_log_names_the_pid)
{
    dl_oom_t what = {0};
    put("/dev/kmsg", "6,418,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/dlt,"
                     "task_memcg=/dlt,task=python3,pid=31338,uid=0\n"
                     "3,419,2,-;Memory cgroup out of memory: Killed process 31338 (python3)\n");
    ck_assert_int_eq(dl_kmsg_oom_killed(root, 31338, &what), 1);
    ck_assert(what.killed);
    ck_assert_str_eq(what.cgroup, "/dlt");
    memset(&what, 0, sizeof(what));
    DL_CHECK_ERRNO(dl_kmsg_oom_killed(root, 3133, &what), 0);
    ck_assert(!what.killed);
}

DL_TEST(process_state_and_wait_channel)
{
    char state, wchan[64];
    put("/proc/12/stat", "12 (a (b) c) D 1 12 12 0 -1\n");
    put("/proc/12/wchan", "__refrigerator");
    DL_CHECK_ERRNO(dl_proc_wait_state(root, 12, &state, wchan, sizeof(wchan)), 0);
    ck_assert_int_eq(state, 'D');
    ck_assert_str_eq(wchan, "__refrigerator");
    ck_assert_str_eq(dl_proc_state_name(state), "uninterruptible sleep");
    put("/proc/13/stat", "13 (x) S 1\n");
    put("/proc/13/wchan", "0");
    DL_CHECK_ERRNO(dl_proc_wait_state(root, 13, &state, wchan, sizeof(wchan)), 0);
    ck_assert_str_eq(wchan, "");
    DL_CHECK_ERRNO(dl_proc_wait_state(root, 14, &state, wchan, sizeof(wchan)), -ESRCH);
    put("/proc/15/stat", "15 (broken");
    DL_CHECK_ERRNO(dl_proc_wait_state(root, 15, &state, wchan, sizeof(wchan)), -EINVAL);
    /* The real one: this process is running. */
    DL_CHECK_ERRNO(dl_proc_wait_state("", getpid(), &state, wchan, sizeof(wchan)), 0);
    ck_assert_int_eq(state, 'R');
}

DL_TEST_SUITE(.setup = setup, .teardown = teardown);
