/* The pod environment of each Kubernetes operator (config/kube.c): the variables each sets, as
 * read in their sources (training-operator, kubeflow/trainer, volcano, torchx), then errors. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "kube.h"

static char err[512];

static dl_kube_env_t parsed(char **envp, const char *host)
{
    dl_kube_env_t e;
    int r = dl_kube_env_parse(envp, host, &e, err, sizeof(err));
    ck_assert_msg(r == 0, "parse failed: %d %s", r, err);
    return e;
}

DL_TEST(pytorchjob_worker)
{
    char *env[] = {"KUBERNETES_SERVICE_HOST=10.96.0.1",
                   "MASTER_ADDR=pj-master-0",
                   "MASTER_PORT=23456",
                   "WORLD_SIZE=8",
                   "RANK=2",
                   "PET_NPROC_PER_NODE=2",
                   "PET_NODE_RANK=2",
                   "PET_NNODES=4",
                   "PYTHONUNBUFFERED=1",
                   NULL};
    dl_kube_env_t e = parsed(env, "pj-worker-1");
    ck_assert_int_eq(e.kind, DL_KUBE_PYTORCHJOB);
    ck_assert_int_eq(e.nnodes, 4); /* pods, not WORLD_SIZE's processes */
    ck_assert_int_eq(e.node_rank, 2);
    ck_assert_str_eq(e.rdzv_host, "pj-master-0");
    ck_assert_int_eq(e.rdzv_port, 23456);
    ck_assert_str_eq(e.run_id, "pj-master-0");
}

DL_TEST(pytorchjob_old_operator_and_workers_are_not_pods)
{
    char *old[] = {"KUBERNETES_SERVICE_HOST=10.96.0.1",
                   "MASTER_ADDR=pj-master-0",
                   "MASTER_PORT=23456",
                   "WORLD_SIZE=3",
                   "RANK=1",
                   NULL};
    dl_kube_env_t e = parsed(old, NULL);
    ck_assert_int_eq(e.nnodes, 3);
    ck_assert_int_eq(e.node_rank, 1);
    /* A torch worker's own variables (under torchrun or dlaunch) are no pod's. */
    char *worker[] = {"KUBERNETES_SERVICE_HOST=10.96.0.1",
                      "MASTER_ADDR=127.0.0.1",
                      "MASTER_PORT=29500",
                      "WORLD_SIZE=4",
                      "RANK=3",
                      "LOCAL_RANK=1",
                      NULL};
    ck_assert_int_eq(parsed(worker, NULL).kind, DL_KUBE_NONE);
    char *none[] = {"HOME=/root", NULL};
    ck_assert_int_eq(parsed(none, NULL).kind, DL_KUBE_NONE);
}

DL_TEST(trainer_jobset)
{
    char *env[] = {"JOB_COMPLETION_INDEX=1",
                   "PET_NNODES=2",
                   "PET_NPROC_PER_NODE=auto",
                   "PET_NODE_RANK=1",
                   "PET_MASTER_ADDR=tj-node-0-0.tj",
                   "PET_MASTER_PORT=29400",
                   NULL};
    dl_kube_env_t e = parsed(env, "tj-node-0-1");
    ck_assert_int_eq(e.kind, DL_KUBE_TRAINER);
    ck_assert_int_eq(e.nnodes, 2);
    ck_assert_int_eq(e.node_rank, 1);
    ck_assert_str_eq(e.rdzv_host, "tj-node-0-0.tj");
    ck_assert_int_eq(e.rdzv_port, 29400);
}

DL_TEST(volcano_one_task)
{
    char *env[] = {"VC_TASK_INDEX=1", "VK_TASK_INDEX=1",
                   "VC_WORKER_HOSTS=vj-worker-0.vj,"
                   "vj-worker-1.vj,vj-worker-2.vj",
                   "VC_WORKER_NUM=3", NULL};
    dl_kube_env_t e = parsed(env, "vj-worker-1");
    ck_assert_int_eq(e.kind, DL_KUBE_VOLCANO);
    ck_assert_int_eq(e.nnodes, 3);
    ck_assert_int_eq(e.node_rank, 1);
    ck_assert_str_eq(e.rdzv_host, "vj-worker-0.vj");
    ck_assert_int_eq(e.rdzv_port, DL_KUBE_RDZV_PORT);
}

DL_TEST(volcano_pytorch_plugin)
{
    char *env[] = {"VC_TASK_INDEX=0",
                   "VC_MASTER_HOSTS=vj-master-0.vj",
                   "VC_MASTER_NUM=1",
                   "VC_WORKER_HOSTS=vj-worker-0.vj,vj-worker-1.vj",
                   "VC_WORKER_NUM=2",
                   "MASTER_ADDR=vj-master-0.vj",
                   "MASTER_PORT=23456",
                   "WORLD_SIZE=3",
                   "RANK=2",
                   NULL};
    dl_kube_env_t e = parsed(env, "vj-worker-1");
    ck_assert_int_eq(e.nnodes, 3);
    ck_assert_int_eq(e.node_rank, 2);
    ck_assert_str_eq(e.rdzv_host, "vj-master-0.vj");
    ck_assert_int_eq(e.rdzv_port, 23456);
}

DL_TEST(torchx_one_task_a_replica)
{
    char *env[] = {"VC_TASK_INDEX=0",    "VC_TRAINER_1_HOSTS=app-trainer-1-0.app",
                   "VC_TRAINER_1_NUM=1", "VC_TRAINER_0_HOSTS=app-trainer-0-0.app",
                   "VC_TRAINER_0_NUM=1", NULL};
    dl_kube_env_t e = parsed(env, "app-trainer-1-0");
    ck_assert_int_eq(e.kind, DL_KUBE_TORCHX);
    ck_assert_int_eq(e.nnodes, 2);
    ck_assert_int_eq(e.node_rank, 1);
    ck_assert_str_eq(e.rdzv_host, "app-trainer-0-0.app");
    ck_assert_int_eq(e.rdzv_port, DL_KUBE_TORCHX_PORT);
    e = parsed(env, "app-trainer-0-0");
    ck_assert_int_eq(e.node_rank, 0);
}

DL_TEST(errors_name_the_variable)
{
    static const struct {
        const char *env[10];
        int code;
        const char *msg;
    } cases[] = {
        {{"JOB_COMPLETION_INDEX=1", "PET_MASTER_ADDR=a.b", NULL}, -ENOENT, "PET_NNODES: not set"},
        {{"JOB_COMPLETION_INDEX=1", "PET_MASTER_ADDR=a.b", "PET_NNODES=2", "PET_NODE_RANK=0", NULL},
         -EINVAL,
         "PET_NODE_RANK='0': differs from JOB_COMPLETION_INDEX=1"},
        {{"JOB_COMPLETION_INDEX=2", "PET_MASTER_ADDR=a.b", "PET_NNODES=2", NULL},
         -ERANGE,
         "JOB_COMPLETION_INDEX='2': out of range 0..1"},
        {{"KUBERNETES_SERVICE_HOST=x", "MASTER_ADDR=m", "RANK=0", "WORLD_SIZE=2", NULL},
         -ENOENT,
         "MASTER_PORT: not set"},
        {{"KUBERNETES_SERVICE_HOST=x", "MASTER_ADDR=m", "MASTER_PORT=1", "RANK=x", "WORLD_SIZE=2",
          NULL},
         -EINVAL,
         "RANK='x': not a number"},
        {{"KUBERNETES_SERVICE_HOST=x", "MASTER_ADDR=m", "MASTER_PORT=1", "RANK=0", "WORLD_SIZE=2",
          "PET_MASTER_ADDR=n", NULL},
         -EINVAL,
         "PET_MASTER_ADDR='n': differs from MASTER_ADDR='m'"},
        {{"VC_TASK_INDEX=0", NULL}, -ENOENT, "VC_TASK_INDEX='0': set, but no VC_<TASK>_HOSTS"},
        {{"VC_TASK_INDEX=0", "VC_W_HOSTS=a,b", "VC_W_NUM=3", NULL},
         -EINVAL,
         "VC_W_NUM='3': does not match VC_W_HOSTS (2 hosts)"},
        {{"VC_TASK_INDEX=2", "VC_W_HOSTS=a,b", NULL}, -ERANGE, "VC_TASK_INDEX='2': out of range"},
        {{"VC_TASK_INDEX=0", "VC_A_HOSTS=a", "VC_B_HOSTS=b,c", NULL},
         -EINVAL,
         "the Volcano job has 2 tasks (A, B)"},
        {{"VC_TASK_INDEX=0", "VC_T_0_HOSTS=j-t-0-0.j", "VC_T_1_HOSTS=j-t-1-0.j", NULL},
         -EINVAL,
         "names this pod's host name 'other'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dl_kube_env_t e = {.kind = DL_KUBE_TORCHX, .nnodes = 77};
        err[0] = '\0';
        int r = dl_kube_env_parse((char *const *)cases[i].env, "other", &e, err, sizeof(err));
        ck_assert_msg(r == cases[i].code, "case %zu: %d (%s)", i, r, err);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "case %zu: '%s'", i, err);
        ck_assert_int_eq(e.nnodes, 77); /* untouched on failure */
    }
}
