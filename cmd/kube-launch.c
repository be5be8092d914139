/* dlaunch in a pod that a Kubernetes operator started: the operator's variables say what the
 * flags would (config/kube.c reads them), so the pod's command needs none. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube-launch.h"

int dl_kube_apply(dl_job_spec_t *spec, const dl_kube_env_t *ke, char *err, size_t errlen)
{
    char buf[300];

    if (ke->kind == DL_KUBE_NONE || spec->standalone)
        return 0;
    if (!spec->nodes_set && ke->nnodes > 0) {
        spec->nodes_min = spec->nodes_max = ke->nnodes;
        spec->nodes_set = true;
    }
    if (spec->node_rank < 0)
        spec->node_rank = ke->node_rank;
    if (spec->rdzv_backend == DL_RDZV_C10D && spec->rdzv_endpoint == NULL) {
        snprintf(buf, sizeof(buf), "%s:%d", ke->rdzv_host, ke->rdzv_port);
        if ((spec->rdzv_endpoint = strdup(buf)) == NULL)
            return -ENOMEM;
    } else if (spec->rdzv_backend == DL_RDZV_STATIC) {
        if (spec->master_addr == NULL && (spec->master_addr = strdup(ke->rdzv_host)) == NULL)
            return -ENOMEM;
        if (spec->master_port <= 0)
            spec->master_port = ke->rdzv_port;
    }
    if (spec->run_id == NULL && (spec->run_id = strdup(ke->run_id)) == NULL)
        return -ENOMEM;
    if (spec->nodes_max > 1 && spec->token_file == NULL &&
        (getenv("DLAUNCH_TOKEN") == NULL || *getenv("DLAUNCH_TOKEN") == '\0')) {
        snprintf(err, errlen,
                 "in a pod of a %s of %d pods (from %s), the pods need a token they share to "
                 "trust each other: set DLAUNCH_TOKEN from a Secret (docs/kubernetes.md), or "
                 "give --token-file",
                 ke->name, spec->nodes_max, ke->from);
        return -ENOKEY;
    }
    return 0;
}
