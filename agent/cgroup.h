/* Where a process's cgroups lie, for every reader of a controller's files (the CPU quota
 * here, the memory cgroup's OOM counters in death.c), and the CPU quota of the agent's own
 * cgroups (v1 cpu.cfs_quota_us, v2 cpu.max), so that --nproc-per-node cpu|auto counts the CPUs
 * the job may use, not the host's. Every reader takes the root of the file system it reads
 * ("" for the real one), so that tests can hand it a made-up tree. */
#ifndef DL_CGROUP_H
#define DL_CGROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DL_CGROUP_PLACES 4

/* A process's cgroup in one hierarchy: its folder, and the hierarchy's mount point above which
 * nothing is the process's. Both are paths of the real tree (the reader prepends root). */
typedef struct {
    bool v2;
    char mount[2048];
    char dir[4096];
} dl_cgroup_place_t;

/* pid's cgroup (0: the caller's) in the v2 hierarchy and in each mounted v1 hierarchy that holds
 * controller ("cpu", "memory"), from root/proc/PID/cgroup and root/proc/PID/mountinfo (whose
 * \ooo escapes are undone). A cgroup outside its hierarchy's mount (another namespace's) is left
 * out. Returns 0 with *ret_n places (maybe 0) in ret, or -errno when /proc cannot be read. */
int dl_cgroup_places(const char *root, pid_t pid, const char *controller, dl_cgroup_place_t *ret,
                     int max, int *ret_n);

/* Of a process's places for a controller, the one the kernel charges: a v1 hierarchy's, even
 * beside a v2 one. NULL when n is 0. */
const dl_cgroup_place_t *dl_cgroup_charging(const dl_cgroup_place_t *places, int n);

/* The caller's cgroup for controller where most systems have it, found without reading
 * mountinfo (the kernel prints every mount for it, some 20 us even on a small host): in the
 * first cgroup namespace, a v1 hierarchy holding controller (and v1_file) whose root is mounted
 * at /sys/fs/cgroup/CONTROLLER, else the v2 one whose root is at /sys/fs/cgroup. A v1 hierarchy
 * is taken before the v2 one. Returns 1 with *ret set, 0 when the layout is another (then
 * dl_cgroup_places finds it), or -errno when /proc cannot be read. */
int dl_cgroup_place_quick(const char *root, const char *controller, const char *v1_file,
                          dl_cgroup_place_t *ret);

/* Moves dir to its parent folder; false when dir is already place's mount point. */
bool dl_cgroup_parent(char *dir, const char *mount);

typedef struct {
    long long quota_us;  /* CPU time a period, -1 when no level limits it */
    long long period_us; /* the period it is measured over, 0 when unlimited */
    char file[512];      /* the file that set the smallest limit, "" when none */
} dl_cpu_quota_t;

/* Reads root/proc/self/cgroup and root/proc/self/mountinfo (root "" is the real system),
 * finds this process's cgroup in every mounted v1 hierarchy with the cpu controller and in the
 * v2 hierarchy, and walks each up to its mount's root: the smallest quota/period of any level
 * wins. A level whose file is malformed is skipped, and the first such file is named in warn
 * (warn[0] stays '\0' when there is none). Returns 0 with *ret set, or -errno when
 * /proc/self/cgroup or /proc/self/mountinfo cannot be read. */
int dl_cgroup_cpu_quota(const char *root, dl_cpu_quota_t *ret, char *warn, size_t warnlen);

/* Workers for `cpu`: the usable CPUs (affinity), lowered to the whole CPUs the quota allows,
 * rounding down, and at least 1 (a quota of 1.5 CPUs gives 1). */
int dl_cgroup_cpu_workers(int affinity_cpus, const dl_cpu_quota_t *q);

#endif
