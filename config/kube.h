/* Kubernetes support of the config layer: which operator started this pod, how many pods the job
 * has, which one this is, and where node 0 (the rendezvous host) is reached.
 *
 * Pure: it reads only the strings it is given (the environment and this pod's host name), so every
 * operator's set-up is a unit test. See docs/kubernetes.md for what each operator sets. */
#ifndef DL_CONFIG_KUBE_H
#define DL_CONFIG_KUBE_H

#include <stdbool.h>
#include <stddef.h>

/* The rendezvous port where the operator names none: torchrun's c10d default, which Kubeflow
 * Trainer also exposes; TorchX's dist.ddp component uses 29500 on its Volcano jobs. */
#define DL_KUBE_RDZV_PORT 29400
#define DL_KUBE_TORCHX_PORT 29500
/* A pod's terminationGracePeriodSeconds when its spec says none. Pods cannot read theirs (the
 * downward API does not carry it), so dlaunch assumes this one. */
#define DL_KUBE_GRACE_S 30

typedef enum {
    DL_KUBE_NONE = 0,
    DL_KUBE_PYTORCHJOB, /* Kubeflow training-operator's PyTorchJob (master and workers) */
    DL_KUBE_TRAINER,    /* Kubeflow Trainer (v2) on a JobSet: an indexed Job of nodes */
    DL_KUBE_VOLCANO,    /* a Volcano job with its env and svc plugins */
    DL_KUBE_TORCHX,     /* TorchX's kubernetes scheduler: a Volcano job, one task a replica */
} dl_kube_kind_t;

typedef struct dl_kube_env_s {
    dl_kube_kind_t kind;
    const char *name;    /* "Kubeflow PyTorchJob", ...; "" for DL_KUBE_NONE */
    int nnodes;          /* pods of the job; -1: an elastic range, left to PET_NNODES */
    int node_rank;       /* this pod's index */
    char rdzv_host[254]; /* node 0's name (a service or headless-service DNS name) */
    int rdzv_port;
    char run_id[129]; /* made of rdzv_host: the same on every pod of the job */
    char from[200];   /* the variables the values came from, for messages */
} dl_kube_env_t;

/* Reads an operator's variables from envp (a NULL-terminated "NAME=value" list; the first of
 * duplicate names wins); hostname is this pod's host name (Volcano and TorchX pods are told apart
 * by it), or NULL. Outside those set-ups it succeeds with kind DL_KUBE_NONE.
 * What is recognised, in this order:
 *   Volcano      VC_TASK_INDEX (or VK_TASK_INDEX) with VC_<TASK>_HOSTS / VC_<TASK>_NUM. TorchX's
 *                layout (tasks <ROLE>_0..<ROLE>_N-1 of one pod each) gives node rank by host
 *                name; with the pytorch plugin (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE in
 *                pods) RANK is the pod's index; else the job must have one task, and
 *                VC_TASK_INDEX is the index.
 *   Trainer      JOB_COMPLETION_INDEX with PET_MASTER_ADDR: PET_NNODES pods, PET_NODE_RANK (which
 *                must equal JOB_COMPLETION_INDEX), node 0 at PET_MASTER_ADDR:PET_MASTER_PORT.
 *   PyTorchJob   MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in a pod (KUBERNETES_SERVICE_HOST or
 *                PET_NODE_RANK set) that is no launcher's worker (no LOCAL_RANK, GROUP_RANK or
 *                TORCHELASTIC_RUN_ID): RANK is the pod's index and WORLD_SIZE counts processes
 *                (PET_NNODES x PET_NPROC_PER_NODE) where PET_NNODES is set, pods where it is not
 *                (operators before PET_NNODES).
 * On failure *ret is untouched and err names the variable ("PET_NODE_RANK='2': differs from
 * JOB_COMPLETION_INDEX='1'"): -EINVAL or -ERANGE for a bad or contradictory value, -ENOENT for a
 * variable the set-up must have. */
int dl_kube_env_parse(char *const *envp, const char *hostname, dl_kube_env_t *ret, char *err,
                      size_t errlen);

#endif
