/* Which CPUs and which NUMA node each of this node's workers gets (--numa-binding): torchrun's
 * default rule, the topology, and the plan that dl_spawn carries out between clone and exec. */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "numa.h"

const char *dl__place_hw_root(const dl_agent_t *a)
{
    /* For tests only (docs/agent.md): a fake machine's /sys and /proc/driver/nvidia. */
    const char *root = dl_env_get(a->environ_list, "DLAUNCH_SYSFS_ROOT");
    return root != NULL ? root : "";
}

/* Decides the mode; false (with the reason in a->unbound_why) when workers run unbound. */
static bool decide_mode(dl_agent_t *a)
{
    dl_numa_mode_t mode = a->spec->numa_binding;
    char *why = a->unbound_why;
    size_t len = sizeof(a->unbound_why);

    a->numa_mode = mode;
    a->numa_by_default = false;
    if (mode == DL_NUMA_NONE) {
        snprintf(why, len, "--numa-binding none");
        return false;
    }
    if (mode != DL_NUMA_AUTO)
        return true;
    /* torchrun (LaunchConfig) binds unasked only when local rank i can be GPU i for all. */
    if (a->gpus == 0) {
        snprintf(why, len, "no GPU found");
        return false;
    }
    if (a->nworkers != a->gpus) {
        snprintf(why, len, "%d worker%s for %d GPU%s, and no --numa-binding", a->nworkers,
                 a->nworkers == 1 ? "" : "s", a->gpus, a->gpus == 1 ? "" : "s");
        return false;
    }
    a->numa_mode = DL_NUMA_NODE;
    a->numa_by_default = true;
    return true;
}

int dl__place_plan(dl_agent_t *a)
{
    char err[600];
    dl_cpus_t allowed;
    dl_topo_t *t = NULL;
    dl_place_t *places = NULL;
    int r;

    if (!decide_mode(a))
        return 0;
    memset(&allowed, 0, sizeof(allowed));
    if (sched_getaffinity(0, sizeof(allowed.bits), (cpu_set_t *)(void *)allowed.bits) < 0) {
        r = -errno;
        snprintf(err, sizeof(err), "cannot read this agent's CPU affinity: %s", strerror(-r));
        goto fail;
    }
    t = malloc(sizeof(*t));
    places = calloc((size_t)a->nworkers, sizeof(*places));
    if (t == NULL || places == NULL) {
        r = -ENOMEM;
        snprintf(err, sizeof(err), "out of memory");
        goto fail;
    }
    r = dl_topo_read(dl__place_hw_root(a), dl_env_get(a->environ_list, "CUDA_VISIBLE_DEVICES"),
                     a->numa_mode, &allowed, t, err, sizeof(err));
    if (r == 0)
        r = dl_numa_plan(t, a->numa_mode, a->nworkers, places, err, sizeof(err));
    if (r < 0)
        goto fail;
    free(t);
    a->places = places;
    a->nplaces = a->nworkers;
    return 0;

fail:
    free(t);
    free(places);
    if (!a->numa_by_default) {
        fprintf(stderr, "dlaunch: --numa-binding %s: %s\n", dl_numa_mode_name(a->numa_mode), err);
        return 2;
    }
    /* Unasked, a binding that cannot be made is not worth failing the job over (torchrun's
     * default falls back too), but it is said. */
    if (!a->spec->quiet)
        fprintf(stderr,
                "dlaunch: warning: workers are not bound near their GPUs (torchrun's "
                "default when the workers are as many as the GPUs): %s; "
                "--numa-binding none says not to try\n",
                err);
    snprintf(a->unbound_why, sizeof(a->unbound_why), "the default binding failed: %s", err);
    a->numa_by_default = false;
    return 0;
}

const dl_cpus_t *dl__place_cpus(const dl_agent_t *a, int local_rank, int *ret_mem_node)
{
    if (local_rank < 0 || local_rank >= a->nplaces) {
        *ret_mem_node = -1;
        return NULL;
    }
    *ret_mem_node = a->places[local_rank].mem_node;
    return &a->places[local_rank].cpus;
}

void dl__place_print(const dl_agent_t *a)
{
    char cpus[1024];
    if (a->nplaces == 0) {
        printf("placement: workers are not bound (%s)\n", a->unbound_why);
        return;
    }
    printf("placement: --numa-binding %s%s\n", dl_numa_mode_name(a->numa_mode),
           a->numa_by_default ? " (torchrun's default: as many workers as GPUs)" : "");
    for (int i = 0; i < a->nplaces; i++) {
        const dl_place_t *p = &a->places[i];
        dl_cpus_format(&p->cpus, cpus, sizeof(cpus));
        printf("placement: local rank %d (GPU %d at %s, NUMA node %d): CPUs %s, memory %s\n", i, i,
               p->gpu_addr, p->node, cpus,
               p->mem_node >= 0 ? "preferred on its node" : "as is (one NUMA node)");
    }
}

void dl__place_free(dl_agent_t *a)
{
    free(a->places);
    a->places = NULL;
    a->nplaces = 0;
}
