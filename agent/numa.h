/* Placing workers near their GPU (--numa-binding): the machine's topology as data, read from
 * sysfs (topology.c), and a pure function from it to each worker's CPUs and memory node
 * (numa.c), with torchrun's rules (torch/numa/binding.py). */
#ifndef DL_NUMA_H
#define DL_NUMA_H

#include <stddef.h>

#include "config.h"
#include "cpulist.h"

#define DL_NUMA_NODES_MAX 256
#define DL_NUMA_GPUS_MAX 64

typedef struct {
    int cpu_count;            /* entries of core, package and llc: CPUs 0..cpu_count-1 */
    int core[DL_CPUS_MAX];    /* lowest CPU of the physical core (hyperthreads share it) */
    int package[DL_CPUS_MAX]; /* the socket (physical_package_id) */
    int llc[DL_CPUS_MAX];     /* lowest CPU sharing its last-level data/unified cache */
    int node_count;           /* entries of node_cpus: nodes 0..node_count-1 */
    dl_cpus_t node_cpus[DL_NUMA_NODES_MAX]; /* all CPUs of each node, allowed or not */
    int gpu_count;                          /* the GPUs the workers see, in CUDA's order */
    int gpu_node[DL_NUMA_GPUS_MAX];         /* each GPU's NUMA node (sysfs -1 read as 0) */
    char gpu_addr[DL_NUMA_GPUS_MAX][32];    /* its PCI address, for messages */
    dl_cpus_t allowed;                      /* where the agent may run (affinity, cpuset) */
} dl_topo_t;

/* Where one worker runs. */
typedef struct dl_place_s {
    dl_cpus_t cpus;    /* its CPU affinity */
    int node;          /* its GPU's NUMA node */
    char gpu_addr[32]; /* its GPU's PCI address */
    int mem_node;      /* the node its memory is preferred on, -1 to leave the policy alone (a
                     * machine of one node) */
} dl_place_t;

/* The plan for nworkers workers: worker i is placed by GPU i's node as mode says (a mode of
 * its own, not DL_NUMA_AUTO or DL_NUMA_NONE). Returns 0 with ret[0..nworkers-1] filled, or
 * -EINVAL with a one-line reason in err (a worker without a GPU, a node with no allowed CPU,
 * fewer cores than GPUs, a CPU whose topology was not read). */
int dl_numa_plan(const dl_topo_t *t, dl_numa_mode_t mode, int nworkers, dl_place_t *ret, char *err,
                 size_t errlen);

/* Reads the topology that mode needs under root ("" is the real system; a test points it at a
 * fake tree): GPUs from root/proc/driver/nvidia/gpus, sorted by PCI address, as
 * CUDA_VISIBLE_DEVICES (cuda_visible, may be NULL: indices or GPU- UUIDs) picks them; each
 * one's node from root/sys/bus/pci/devices/ADDR/numa_node; nodes and CPUs from
 * root/sys/devices/system (not read when no GPU is visible). allowed is kept as the set every
 * binding is cut down to. Returns 0
 * with *t filled, or -errno with a one-line reason naming the file in err. */
int dl_topo_read(const char *root, const char *cuda_visible, dl_numa_mode_t mode,
                 const dl_cpus_t *allowed, dl_topo_t *t, char *err, size_t errlen);

/* The mode's name as the flag spells it. */
const char *dl_numa_mode_name(dl_numa_mode_t mode);

#endif
