/* torchrun's placement rules (torch/numa/binding.py) as one pure function, so that every mode
 * is tested on made-up machines: worker i belongs to GPU i, and every set is cut down to the
 * CPUs the agent itself may use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numa.h"

const char *dl_numa_mode_name(dl_numa_mode_t mode)
{
    switch (mode) {
    case DL_NUMA_AUTO: return "auto";
    case DL_NUMA_NONE: return "none";
    case DL_NUMA_NODE: return "node";
    case DL_NUMA_SOCKET: return "socket";
    case DL_NUMA_EXCLUSIVE: return "exclusive";
    case DL_NUMA_CORE_COMPLEX: return "core-complex";
    }
    return "?";
}

static void node_allowed(const dl_topo_t *t, int node, dl_cpus_t *ret)
{
    *ret = t->node_cpus[node];
    dl_cpus_and(ret, &t->allowed);
}

/* A CPU's entry of one of the per-CPU tables, -1 when it was not read. */
static int cpu_field(const dl_topo_t *t, const int *field, int cpu)
{
    return cpu >= 0 && cpu < t->cpu_count ? field[cpu] : -1;
}

/* Groups of CPUs: the allowed CPUs of a node, keyed by a per-CPU table (core or llc). */
typedef struct {
    int key;
    dl_cpus_t cpus;
    int size;
} group_t;

static int by_key(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    return (x->key > y->key) - (x->key < y->key);
}

static int by_size_then_key(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    return by_key(a, b);
}

/* Fills groups (room for one per allowed CPU) from the node's allowed CPUs; returns their count, or
 * -1 with the CPU whose key is missing in *ret_cpu. */
static int group_cpus(const dl_topo_t *t, const dl_cpus_t *cpus, const int *field, group_t *groups,
                      int *ret_cpu)
{
    int n = 0;
    for (int c = 0; c < DL_CPUS_MAX; c++) {
        if (!dl_cpus_has(cpus, c))
            continue;
        int key = cpu_field(t, field, c), g;
        if (key < 0) {
            *ret_cpu = c;
            return -1;
        }
        for (g = 0; g < n && groups[g].key != key; g++)
            ;
        if (g == n) {
            memset(&groups[n], 0, sizeof(groups[n]));
            groups[n++].key = key;
        }
        dl_cpus_set(&groups[g].cpus, c);
        groups[g].size++;
    }
    return n;
}

/* GPU gpu's position among the GPUs on its node, and how many there are. */
static void rank_on_node(const dl_topo_t *t, int gpu, int *ret_pos, int *ret_count)
{
    int pos = 0, count = 0;
    for (int g = 0; g < t->gpu_count; g++) {
        if (t->gpu_node[g] != t->gpu_node[gpu])
            continue;
        if (g < gpu)
            pos++;
        count++;
    }
    *ret_pos = pos;
    *ret_count = count;
}

static int place_one(const dl_topo_t *t, dl_numa_mode_t mode, int gpu, group_t *groups,
                     dl_place_t *ret, char *err, size_t errlen)
{
    int node = t->gpu_node[gpu], pos, count, cpu = -1;
    dl_cpus_t mine;
    char allowed[256];

    if (node < 0 || node >= t->node_count) {
        snprintf(err, errlen, "GPU %d (%s) is on NUMA node %d, which has no CPU list", gpu,
                 t->gpu_addr[gpu], node);
        return -EINVAL;
    }
    node_allowed(t, node, &mine);
    if (dl_cpus_first(&mine) < 0) {
        dl_cpus_format(&t->allowed, allowed, sizeof(allowed));
        snprintf(err, errlen,
                 "NUMA node %d of GPU %d (%s) has no CPU this agent may use "
                 "(allowed: %s)",
                 node, gpu, t->gpu_addr[gpu], allowed);
        return -EINVAL;
    }
    rank_on_node(t, gpu, &pos, &count);
    switch (mode) {
    case DL_NUMA_NODE: break;
    case DL_NUMA_SOCKET: {
        /* A node's socket is that of its lowest allowed CPU; nodes with no allowed CPU (memory
         * only, or outside the cpuset) belong to no socket here. */
        int socket = cpu_field(t, t->package, dl_cpus_first(&mine));
        if (socket < 0) {
            snprintf(err, errlen, "the socket of CPU %d is unknown", dl_cpus_first(&mine));
            return -EINVAL;
        }
        for (int m = 0; m < t->node_count; m++) {
            dl_cpus_t other;
            node_allowed(t, m, &other);
            int first = dl_cpus_first(&other);
            if (first >= 0 && cpu_field(t, t->package, first) == socket)
                dl_cpus_or(&mine, &other);
        }
        break;
    }
    case DL_NUMA_EXCLUSIVE: {
        int cores = group_cpus(t, &mine, t->core, groups, &cpu);
        if (cores < 0) {
            snprintf(err, errlen, "the physical core of CPU %d is unknown", cpu);
            return -EINVAL;
        }
        if (cores < count) {
            snprintf(err, errlen,
                     "NUMA node %d has %d physical core%s this agent may use, "
                     "fewer than its %d GPUs",
                     node, cores, cores == 1 ? "" : "s", count);
            return -EINVAL;
        }
        qsort(groups, (size_t)cores, sizeof(groups[0]), by_key);
        /* The cores split evenly; the lowest GPUs take one more each while some are left. */
        int each = cores / count, extra = cores % count;
        int start = pos * each + (pos < extra ? pos : extra);
        int end = start + each + (pos < extra ? 1 : 0);
        memset(&mine, 0, sizeof(mine));
        for (int g = start; g < end; g++)
            dl_cpus_or(&mine, &groups[g].cpus);
        break;
    }
    case DL_NUMA_CORE_COMPLEX: {
        int n = group_cpus(t, &mine, t->llc, groups, &cpu);
        if (n < 0) {
            snprintf(err, errlen, "the last-level cache of CPU %d is unknown", cpu);
            return -EINVAL;
        }
        /* Fullest cache groups first, so that GPUs share a group only when they must. */
        qsort(groups, (size_t)n, sizeof(groups[0]), by_size_then_key);
        mine = groups[pos % n].cpus;
        break;
    }
    default:
        snprintf(err, errlen, "--numa-binding %s places nothing", dl_numa_mode_name(mode));
        return -EINVAL;
    }
    ret->cpus = mine;
    ret->node = node;
    snprintf(ret->gpu_addr, sizeof(ret->gpu_addr), "%s", t->gpu_addr[gpu]);
    /* On a machine of one node every allocation is local already. */
    ret->mem_node = t->node_count > 1 ? node : -1;
    return 0;
}

int dl_numa_plan(const dl_topo_t *t, dl_numa_mode_t mode, int nworkers, dl_place_t *ret, char *err,
                 size_t errlen)
{
    group_t *groups;
    int r = 0;

    if (t->gpu_count == 0) {
        snprintf(err, errlen,
                 "no GPU found (none in /proc/driver/nvidia/gpus, or "
                 "CUDA_VISIBLE_DEVICES hides them), and a worker is bound near the GPU of its "
                 "local rank");
        return -EINVAL;
    }
    if (nworkers > t->gpu_count) {
        snprintf(err, errlen,
                 "local rank %d has no GPU to be placed near (%d found); a worker "
                 "is bound near the GPU of its local rank",
                 t->gpu_count, t->gpu_count);
        return -EINVAL;
    }
    groups = malloc(sizeof(*groups) * (size_t)(dl_cpus_count(&t->allowed) + 1));
    if (groups == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < nworkers && r == 0; i++)
        r = place_one(t, mode, i, groups, &ret[i], err, errlen);
    free(groups);
    return r;
}
