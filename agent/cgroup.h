/* The CPU quota of the agent's own cgroups (v1 cpu.cfs_quota_us, v2 cpu.max), so that
 * --nproc-per-node cpu|auto counts the CPUs the job may use, not the host's. */
#ifndef DL_CGROUP_H
#define DL_CGROUP_H

#include <stddef.h>

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
