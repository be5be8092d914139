/* Reading the machine for --numa-binding: which GPU the workers see as GPU i, which NUMA node
 * it hangs off, and how that node's CPUs group into cores, sockets and caches. Only what the
 * mode needs is read: a per-CPU file for every CPU of a big node costs milliseconds. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "numa.h"
#include "sysfile.h"

#define TEXT_MAX 32768
/* Longest root accepted: with it, every path below fits its buffer. */
#define ROOT_MAX 1024

/* snprintf for paths whose parts are bounded (ROOT_MAX, a file name): never truncates. */
__attribute__((format(printf, 3, 4))) static void path_of(char *buf, size_t len, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

static int fail(char *err, size_t errlen, int r, const char *path, const char *why)
{
    snprintf(err, errlen, "%s: %s", path, why != NULL ? why : strerror(-r));
    return r;
}

static int read_int(const char *path, long lo, long hi, long *ret, char *err, size_t errlen)
{
    char buf[64];
    int r = dl_sysfile_read(path, buf, sizeof(buf));
    if (r < 0)
        return fail(err, errlen, r, path, NULL);
    if (dl_parse_int(buf, lo, hi, ret) < 0)
        return fail(err, errlen, -EINVAL, path, "is not a number in range");
    return 0;
}

static int read_cpus(const char *path, dl_cpus_t *ret, char *err, size_t errlen)
{
    char *buf = malloc(TEXT_MAX);
    if (buf == NULL)
        return fail(err, errlen, -ENOMEM, path, NULL);
    int r = dl_sysfile_read(path, buf, TEXT_MAX);
    if (r == 0 && dl_cpus_parse(buf, ret) < 0)
        r = -EINVAL;
    free(buf);
    if (r < 0)
        return fail(err, errlen, r, path, r == -EINVAL ? "is not a CPU list" : NULL);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The "GPU UUID:" line of the driver's information file, "" when there is none. */
static void gpu_uuid(const char *dir, const char *addr, char *uuid, size_t len)
{
    char path[4400], line[256];
    uuid[0] = '\0';
    path_of(path, sizeof(path), "%s/%s/information", dir, addr);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "GPU UUID:", 9) != 0)
            continue;
        char *v = line + 9 + strspn(line + 9, " \t");
        v[strcspn(v, " \t\n")] = '\0';
        snprintf(uuid, len, "%s", v);
        break;
    }
    fclose(f);
}

/* Picks the visible GPUs out of the sorted list as CUDA does: by index or by (a prefix of)
 * UUID. */
static int pick_visible(const char *dir, char (*all)[32], int n_all, const char *cuda_visible,
                        dl_topo_t *t, char *err, size_t errlen)
{
    char list[1024];
    if (*cuda_visible == '\0' || strncmp(cuda_visible, "-1", 2) == 0)
        return 0;
    snprintf(list, sizeof(list), "%s", cuda_visible);
    char *save = NULL;
    for (char *e = strtok_r(list, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
        e += strspn(e, " ");
        long idx = -1;
        if (strncmp(e, "GPU-", 4) == 0) {
            for (int g = 0; g < n_all && idx < 0; g++) {
                char uuid[128];
                gpu_uuid(dir, all[g], uuid, sizeof(uuid));
                if (uuid[0] != '\0' && strncmp(uuid, e, strlen(e)) == 0)
                    idx = g;
            }
        } else if (dl_parse_int(e, 0, n_all - 1, &idx) < 0) {
            idx = -1;
        }
        if (idx < 0) {
            snprintf(err, errlen,
                     "CUDA_VISIBLE_DEVICES: '%s' is not the index or GPU- UUID "
                     "of one of the %d GPUs in %s",
                     e, n_all, dir);
            return -EINVAL;
        }
        if (t->gpu_count == DL_NUMA_GPUS_MAX) {
            snprintf(err, errlen, "CUDA_VISIBLE_DEVICES names more than %d GPUs", DL_NUMA_GPUS_MAX);
            return -E2BIG;
        }
        snprintf(t->gpu_addr[t->gpu_count++], sizeof(t->gpu_addr[0]), "%s", all[idx]);
    }
    return 0;
}

static int read_gpus(const char *root, const char *cuda_visible, dl_topo_t *t, char *err,
                     size_t errlen)
{
    char dir[4200], path[4400];
    char(*all)[32] = calloc(DL_NUMA_GPUS_MAX, sizeof(*all));
    int n = 0, r = 0;
    if (all == NULL)
        return fail(err, errlen, -ENOMEM, "GPUs", NULL);
    path_of(dir, sizeof(dir), "%s/proc/driver/nvidia/gpus", root);
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL && r == 0) {
            if (e->d_name[0] == '.')
                continue;
            if (n == DL_NUMA_GPUS_MAX || strlen(e->d_name) >= sizeof(all[0]))
                r = fail(err, errlen, -E2BIG, dir,
                         "has more GPUs, or longer names, than "
                         "placement handles");
            else
                memcpy(all[n++], e->d_name, strlen(e->d_name) + 1);
        }
        closedir(d);
    } else if (errno != ENOENT) {
        r = fail(err, errlen, -errno, dir, NULL);
    }
    qsort(all, (size_t)n, sizeof(all[0]), by_name);
    t->gpu_count = 0;
    if (r == 0 && cuda_visible != NULL)
        r = pick_visible(dir, all, n, cuda_visible, t, err, errlen);
    else if (r == 0)
        for (int g = 0; g < n; g++)
            snprintf(t->gpu_addr[t->gpu_count++], sizeof(t->gpu_addr[0]), "%s", all[g]);
    free(all);
    for (int g = 0; g < t->gpu_count && r == 0; g++) {
        long node;
        path_of(path, sizeof(path), "%s/sys/bus/pci/devices/%s/numa_node", root, t->gpu_addr[g]);
        r = read_int(path, -1, DL_NUMA_NODES_MAX - 1, &node, err, errlen);
        /* -1: the firmware gave no node, which is what a machine of one node says. */
        t->gpu_node[g] = node < 0 ? 0 : (int)node;
    }
    return r;
}

static int read_nodes(const char *root, dl_topo_t *t, dl_cpus_t *all_cpus, char *err, size_t errlen)
{
    char dir[4200], path[4400];
    path_of(dir, sizeof(dir), "%s/sys/devices/system/node", root);
    DIR *d = opendir(dir);
    if (d == NULL)
        return fail(err, errlen, -errno, dir, NULL);
    struct dirent *e;
    int r = 0;
    memset(all_cpus, 0, sizeof(*all_cpus));
    t->node_count = 0;
    while ((e = readdir(d)) != NULL && r == 0) {
        long node;
        if (strncmp(e->d_name, "node", 4) != 0 ||
            dl_parse_int(e->d_name + 4, 0, 1L << 30, &node) < 0)
            continue;
        path_of(path, sizeof(path), "%s/%s/cpulist", dir, e->d_name);
        if (node >= DL_NUMA_NODES_MAX) {
            r = fail(err, errlen, -E2BIG, path, "is of a node beyond what placement handles");
            break;
        }
        r = read_cpus(path, &t->node_cpus[node], err, errlen);
        if (r == 0) {
            dl_cpus_or(all_cpus, &t->node_cpus[node]);
            if (node >= t->node_count)
                t->node_count = (int)node + 1;
        }
    }
    closedir(d);
    if (r == 0 && t->node_count == 0)
        r = fail(err, errlen, -ENOENT, dir, "lists no NUMA node");
    return r;
}

/* The lowest CPU sharing cpu's last-level data or unified cache. */
static int read_llc(const char *cpu_dir, int *ret, char *err, size_t errlen)
{
    char dir[4400], path[4600], buf[64];
    path_of(dir, sizeof(dir), "%s/cache", cpu_dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        return fail(err, errlen, -errno, dir, NULL);
    struct dirent *e;
    long best_level = -1;
    int r = 0, best = -1;
    while ((e = readdir(d)) != NULL && r == 0) {
        long level, k;
        if (strncmp(e->d_name, "index", 5) != 0 || dl_parse_int(e->d_name + 5, 0, 1000, &k) < 0)
            continue;
        path_of(path, sizeof(path), "%s/%s/type", dir, e->d_name);
        r = dl_sysfile_read(path, buf, sizeof(buf));
        if (r < 0) {
            fail(err, errlen, r, path, NULL);
            break;
        }
        if (strcmp(buf, "Unified") != 0 && strcmp(buf, "Data") != 0)
            continue;
        path_of(path, sizeof(path), "%s/%s/level", dir, e->d_name);
        r = read_int(path, 0, 100, &level, err, errlen);
        if (r < 0 || level <= best_level)
            continue;
        dl_cpus_t shared;
        path_of(path, sizeof(path), "%s/%s/shared_cpu_list", dir, e->d_name);
        r = read_cpus(path, &shared, err, errlen);
        if (r == 0 && (best = dl_cpus_first(&shared)) < 0)
            r = fail(err, errlen, -EINVAL, path, "is empty");
        best_level = level;
    }
    closedir(d);
    if (r == 0 && best < 0)
        r = fail(err, errlen, -ENOENT, dir, "has no data or unified cache");
    if (r == 0)
        *ret = best;
    return r;
}

static int read_cpu(const char *root, int cpu, dl_numa_mode_t mode, dl_topo_t *t, char *err,
                    size_t errlen)
{
    char dir[4200], path[4400];
    long v;
    int r = 0;
    path_of(dir, sizeof(dir), "%s/sys/devices/system/cpu/cpu%d", root, cpu);
    if (mode == DL_NUMA_SOCKET) {
        path_of(path, sizeof(path), "%s/topology/physical_package_id", dir);
        r = read_int(path, 0, 1L << 30, &v, err, errlen);
        if (r == 0)
            t->package[cpu] = (int)v;
    } else if (mode == DL_NUMA_EXCLUSIVE) {
        dl_cpus_t siblings;
        path_of(path, sizeof(path), "%s/topology/thread_siblings_list", dir);
        r = read_cpus(path, &siblings, err, errlen);
        if (r == 0 && (t->core[cpu] = dl_cpus_first(&siblings)) < 0)
            r = fail(err, errlen, -EINVAL, path, "is empty");
    } else if (mode == DL_NUMA_CORE_COMPLEX) {
        r = read_llc(dir, &t->llc[cpu], err, errlen);
    }
    return r;
}

int dl_topo_read(const char *root, const char *cuda_visible, dl_numa_mode_t mode,
                 const dl_cpus_t *allowed, dl_topo_t *t, char *err, size_t errlen)
{
    dl_cpus_t cpus;
    int r;

    memset(t, 0, sizeof(*t));
    t->allowed = *allowed;
    if (strlen(root) > ROOT_MAX)
        return fail(err, errlen, -ENAMETOOLONG, "DLAUNCH_SYSFS_ROOT", NULL);
    r = read_gpus(root, cuda_visible, t, err, errlen);
    /* Without a GPU nothing can be placed, as the plan says; the rest is not worth reading. */
    if (r == 0 && t->gpu_count == 0)
        return 0;
    if (r == 0)
        r = read_nodes(root, t, &cpus, err, errlen);
    if (r < 0)
        return r;
    /* Only the CPUs a worker could be given need their topology. */
    dl_cpus_and(&cpus, allowed);
    for (int c = 0; c < DL_CPUS_MAX; c++)
        t->core[c] = t->package[c] = t->llc[c] = -1;
    t->cpu_count = DL_CPUS_MAX;
    for (int c = 0; c < DL_CPUS_MAX && r == 0; c++)
        if (dl_cpus_has(&cpus, c))
            r = read_cpu(root, c, mode, t, err, errlen);
    return r;
}
