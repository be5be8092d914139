/* The Kubernetes pod environment of the operators dlaunch knows (kube.h). Pure: it reads an
 * environ-style list and a host name, nothing else. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kube.h"

#define MAX_PODS 100000
#define MAX_TASKS 64

typedef struct {
    char *const *envp;
    char *err;
    size_t errlen;
} ctx_t;

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int
bad(ctx_t *c, int code, const char *name, const char *fmt, ...)
{
    char what[300];
    const char *v = dl_env_get(c->envp, name);
    va_list ap;

    if (c->errlen == 0)
        return code;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (v == NULL)
        snprintf(c->err, c->errlen, "%s: %s", name, what);
    else
        snprintf(c->err, c->errlen, "%s='%.64s': %s", name, v, what);
    for (char *p = c->err; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return code;
}

/* A count variable: -ENOENT (no message) when unset. */
static int count(ctx_t *c, const char *name, long min, long max, int *ret)
{
    const char *v = dl_env_get(c->envp, name);
    long n;
    int r;

    if (v == NULL)
        return -ENOENT;
    r = dl_parse_int(v, min, max, &n);
    if (r == -ERANGE)
        return bad(c, r, name, "out of range %ld..%ld", min, max);
    if (r < 0)
        return bad(c, -EINVAL, name, "not a number");
    *ret = (int)n;
    return 0;
}

static int required(ctx_t *c, const char *name, long min, long max, int *ret, const char *because)
{
    int r = count(c, name, min, max, ret);
    if (r == -ENOENT)
        return bad(c, r, name, "not set, although %s", because);
    return r;
}

/* The port of name, or dflt when unset. */
static int port(ctx_t *c, const char *name, int dflt, int *ret)
{
    int r = count(c, name, 1, 65535, ret);
    if (r == -ENOENT) {
        *ret = dflt;
        return 0;
    }
    return r;
}

static int set_host(ctx_t *c, dl_kube_env_t *e, const char *name, const char *host, size_t len)
{
    if (len == 0 || len >= sizeof(e->rdzv_host) || memchr(host, ':', len) != NULL ||
        memchr(host, ' ', len) != NULL)
        return bad(c, -EINVAL, name, "not a host name");
    memcpy(e->rdzv_host, host, len);
    e->rdzv_host[len] = '\0';
    return 0;
}

/* The same run id on every pod: node 0's name, in the characters a run id takes. */
static void make_run_id(dl_kube_env_t *e)
{
    size_t i;
    for (i = 0; e->rdzv_host[i] != '\0' && i < sizeof(e->run_id) - 1; i++) {
        char ch = e->rdzv_host[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_';
        e->run_id[i] = ok ? ch : '-';
    }
    e->run_id[i] = '\0';
}

/* ---- Volcano and TorchX */

typedef struct {
    char key[128];     /* TASK in VC_TASK_HOSTS */
    const char *hosts; /* the list, comma-separated */
    int nhosts;
} task_t;

static int hosts_count(const char *list)
{
    int n = 1;
    for (const char *p = list; *p != '\0'; p++)
        n += *p == ',';
    return *list == '\0' ? 0 : n;
}

/* Host i of a list, as pointer and length. */
static const char *host_at(const char *list, int i, size_t *ret_len)
{
    const char *p = list;
    for (; i > 0; i--)
        p = strchr(p, ',') + 1;
    *ret_len = strcspn(p, ",");
    return p;
}

/* Whether a host entry ("name.subdomain") is this pod's host name. */
static bool is_me(const char *host, size_t len, const char *hostname)
{
    size_t label = strcspn(host, ".,");
    if (label > len)
        label = len;
    return hostname != NULL && strlen(hostname) == label && strncmp(host, hostname, label) == 0;
}

static int volcano_tasks(ctx_t *c, task_t *tasks, int *ret_n)
{
    int n = 0;

    for (char *const *p = c->envp; *p != NULL; p++) {
        const char *eq = strchr(*p, '=');
        if (eq == NULL || strncmp(*p, "VC_", 3) != 0)
            continue;
        size_t len = (size_t)(eq - *p);
        if (len <= 9 || strncmp(eq - 6, "_HOSTS", 6) != 0)
            continue;
        char name[160];
        if (len >= sizeof(name) || len - 9 >= sizeof(tasks[0].key))
            continue;
        memcpy(name, *p, len);
        name[len] = '\0';
        bool dup = false;
        for (int i = 0; i < n && !dup; i++)
            dup = strlen(tasks[i].key) == len - 9 && strncmp(tasks[i].key, *p + 3, len - 9) == 0;
        if (dup)
            continue;
        if (n == MAX_TASKS)
            return bad(c, -E2BIG, name, "more than %d Volcano tasks", MAX_TASKS);
        task_t *t = &tasks[n++];
        memcpy(t->key, *p + 3, len - 9);
        t->key[len - 9] = '\0';
        t->hosts = eq + 1;
        t->nhosts = hosts_count(t->hosts);
        if (t->nhosts == 0)
            return bad(c, -EINVAL, name, "names no host");
        char num_name[160];
        int num;
        snprintf(num_name, sizeof(num_name), "VC_%s_NUM", t->key);
        int r = count(c, num_name, 0, MAX_PODS, &num);
        if (r < 0 && r != -ENOENT)
            return r;
        if (r == 0 && num != t->nhosts)
            return bad(c, -EINVAL, num_name, "does not match %s (%d host%s)", name, t->nhosts,
                       t->nhosts == 1 ? "" : "s");
    }
    *ret_n = n;
    return 0;
}

/* TorchX makes one task a replica, named <role>-<i>: VC_<ROLE>_<i>_HOSTS for i in 0..n-1, each
 * with one host. Returns the number of replicas, or 0 when the tasks are not laid out so. */
static int torchx_layout(const task_t *tasks, int n, int *order)
{
    const char *base = NULL;
    size_t base_len = 0;

    for (int i = 0; i < n; i++) {
        const char *us = strrchr(tasks[i].key, '_');
        long idx;
        if (us == NULL || tasks[i].nhosts != 1 || dl_parse_int(us + 1, 0, n - 1, &idx) < 0)
            return 0;
        if (base == NULL) {
            base = tasks[i].key;
            base_len = (size_t)(us - base);
        } else if ((size_t)(us - tasks[i].key) != base_len ||
                   strncmp(tasks[i].key, base, base_len) != 0) {
            return 0;
        }
        order[idx] = i;
    }
    for (int i = 0; i < n; i++)
        if (order[i] < 0)
            return 0;
    return n;
}

static int parse_volcano(ctx_t *c, const char *hostname, dl_kube_env_t *e)
{
    task_t tasks[MAX_TASKS];
    int order[MAX_TASKS], n = 0, r, index;
    const char *index_var =
        dl_env_get(c->envp, "VC_TASK_INDEX") ? "VC_TASK_INDEX" : "VK_TASK_INDEX";
    size_t len;
    const char *h;

    r = count(c, index_var, 0, MAX_PODS - 1, &index);
    if (r < 0)
        return r;
    r = volcano_tasks(c, tasks, &n);
    if (r < 0)
        return r;
    if (n == 0)
        return bad(c, -ENOENT, index_var,
                   "set, but no VC_<TASK>_HOSTS names the job's pods "
                   "(the job needs Volcano's svc plugin)");
    for (int i = 0; i < n; i++)
        order[i] = -1;

    if (torchx_layout(tasks, n, order) == n) {
        e->kind = DL_KUBE_TORCHX;
        e->name = "TorchX (Volcano)";
        e->nnodes = n;
        e->node_rank = -1;
        for (int i = 0; i < n; i++)
            if (is_me(tasks[order[i]].hosts, strlen(tasks[order[i]].hosts), hostname))
                e->node_rank = i;
        char first[160];
        snprintf(first, sizeof(first), "VC_%s_HOSTS", tasks[order[0]].key);
        if (e->node_rank < 0)
            return bad(c, -EINVAL, first,
                       "neither it nor its %d sibling%s names this pod's "
                       "host name '%.64s'",
                       n - 1, n == 2 ? "" : "s", hostname != NULL ? hostname : "");
        h = host_at(tasks[order[0]].hosts, 0, &len);
        if ((r = set_host(c, e, first, h, len)) < 0)
            return r;
        snprintf(e->from, sizeof(e->from), "VC_<ROLE>_<i>_HOSTS and the host name");
        return port(c, "PET_MASTER_PORT", DL_KUBE_TORCHX_PORT, &e->rdzv_port);
    }

    e->kind = DL_KUBE_VOLCANO;
    e->name = "Volcano";
    if (dl_env_get(c->envp, "MASTER_ADDR") != NULL) {
        /* The pytorch plugin: master first, then workers, RANK the pod's index. */
        const char *m = dl_env_get(c->envp, "MASTER_ADDR");
        int world;
        e->nnodes = 0;
        for (int i = 0; i < n; i++)
            e->nnodes += tasks[i].nhosts;
        if ((r = required(c, "RANK", 0, MAX_PODS - 1, &e->node_rank,
                          "MASTER_ADDR (Volcano's pytorch plugin) is")) < 0)
            return r;
        if (e->node_rank >= e->nnodes)
            return bad(c, -ERANGE, "RANK",
                       "out of range 0..%d (the VC_<TASK>_HOSTS lists name "
                       "%d pods)",
                       e->nnodes - 1, e->nnodes);
        r = count(c, "WORLD_SIZE", 1, MAX_PODS, &world);
        if (r < 0 && r != -ENOENT)
            return r;
        if (r == 0 && world != e->nnodes)
            return bad(c, -EINVAL, "WORLD_SIZE", "the VC_<TASK>_HOSTS lists name %d pods",
                       e->nnodes);
        if ((r = set_host(c, e, "MASTER_ADDR", m, strlen(m))) < 0)
            return r;
        snprintf(e->from, sizeof(e->from), "VC_<TASK>_HOSTS, RANK, MASTER_ADDR, MASTER_PORT");
        return port(c, "MASTER_PORT", 23456, &e->rdzv_port);
    }
    if (n > 1) {
        char names[200] = "";
        for (int i = 0; i < n && strlen(names) < 120; i++)
            snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
                     i > 0 ? ", " : "", tasks[i].key);
        return bad(c, -EINVAL, index_var,
                   "the Volcano job has %d tasks (%s) and no MASTER_ADDR "
                   "(its pytorch plugin) to order their pods; give "
                   "--nodes, --node-rank and --rdzv-endpoint, or set "
                   "DLAUNCH_NO_KUBERNETES=1",
                   n, names);
    }
    char var[160];
    snprintf(var, sizeof(var), "VC_%s_HOSTS", tasks[0].key);
    e->nnodes = tasks[0].nhosts;
    e->node_rank = index;
    if (index >= e->nnodes)
        return bad(c, -ERANGE, index_var, "out of range 0..%d (%s names %d pods)", e->nnodes - 1,
                   var, e->nnodes);
    h = host_at(tasks[0].hosts, 0, &len);
    if ((r = set_host(c, e, var, h, len)) < 0)
        return r;
    snprintf(e->from, sizeof(e->from), "%s, %s", var, index_var);
    return port(c, "PET_MASTER_PORT", DL_KUBE_RDZV_PORT, &e->rdzv_port);
}

/* ---- Kubeflow Trainer (JobSet) */

static int parse_trainer(ctx_t *c, dl_kube_env_t *e)
{
    const char *m = dl_env_get(c->envp, "PET_MASTER_ADDR");
    const char *because = "JOB_COMPLETION_INDEX and PET_MASTER_ADDR (Kubeflow Trainer) are";
    int index, rank, r;

    e->kind = DL_KUBE_TRAINER;
    e->name = "Kubeflow Trainer (JobSet)";
    if ((r = count(c, "JOB_COMPLETION_INDEX", 0, MAX_PODS - 1, &index)) < 0)
        return r;
    if ((r = required(c, "PET_NNODES", 1, MAX_PODS, &e->nnodes, because)) < 0)
        return r;
    r = count(c, "PET_NODE_RANK", 0, MAX_PODS - 1, &rank);
    if (r < 0 && r != -ENOENT)
        return r;
    if (r == 0 && rank != index)
        return bad(c, -EINVAL, "PET_NODE_RANK", "differs from JOB_COMPLETION_INDEX=%d", index);
    e->node_rank = index;
    if (index >= e->nnodes)
        return bad(c, -ERANGE, "JOB_COMPLETION_INDEX", "out of range 0..%d (PET_NNODES=%d)",
                   e->nnodes - 1, e->nnodes);
    if ((r = set_host(c, e, "PET_MASTER_ADDR", m, strlen(m))) < 0)
        return r;
    snprintf(e->from, sizeof(e->from),
             "PET_NNODES, JOB_COMPLETION_INDEX, PET_MASTER_ADDR, "
             "PET_MASTER_PORT");
    return port(c, "PET_MASTER_PORT", DL_KUBE_RDZV_PORT, &e->rdzv_port);
}

/* ---- Kubeflow PyTorchJob */

static int same_as(ctx_t *c, const char *pet, const char *plain)
{
    const char *a = dl_env_get(c->envp, pet), *b = dl_env_get(c->envp, plain);
    if (a != NULL && strcmp(a, b) != 0)
        return bad(c, -EINVAL, pet, "differs from %s='%.64s'", plain, b);
    return 0;
}

static int parse_pytorchjob(ctx_t *c, dl_kube_env_t *e)
{
    const char *m = dl_env_get(c->envp, "MASTER_ADDR");
    const char *because = "MASTER_ADDR and RANK (a Kubeflow PyTorchJob) are";
    int pod, world, rank, nproc, r;

    e->kind = DL_KUBE_PYTORCHJOB;
    e->name = "Kubeflow PyTorchJob";
    /* RANK and WORLD_SIZE describe the pod here, never a worker: the agent gives each worker its
     * own. */
    if ((r = count(c, "RANK", 0, MAX_PODS - 1, &pod)) < 0)
        return r;
    if ((r = required(c, "WORLD_SIZE", 1, (long)MAX_PODS * 1024, &world, because)) < 0)
        return r;
    r = count(c, "PET_NODE_RANK", 0, MAX_PODS - 1, &rank);
    if (r < 0 && r != -ENOENT)
        return r;
    if (r == 0 && rank != pod)
        return bad(c, -EINVAL, "PET_NODE_RANK", "differs from RANK=%d, the pod's index", pod);
    e->node_rank = pod;

    const char *nn = dl_env_get(c->envp, "PET_NNODES");
    if (nn == NULL) {
        /* Operators before PET_NNODES counted pods in WORLD_SIZE. */
        e->nnodes = world;
    } else if (strchr(nn, ':') != NULL) {
        e->nnodes = -1; /* elasticPolicy: a range, which the option table reads */
    } else {
        if ((r = count(c, "PET_NNODES", 1, MAX_PODS, &e->nnodes)) < 0)
            return r;
        r = count(c, "PET_NPROC_PER_NODE", 1, 1024, &nproc);
        if (r == 0 && world != e->nnodes * nproc)
            return bad(c, -EINVAL, "WORLD_SIZE",
                       "is not PET_NNODES x PET_NPROC_PER_NODE = %d "
                       "x %d, as the PyTorchJob sets it",
                       e->nnodes, nproc);
    }
    if (e->nnodes > 0 && pod >= e->nnodes)
        return bad(c, -ERANGE, "RANK", "out of range 0..%d (%s=%d pods)", e->nnodes - 1,
                   nn != NULL ? "PET_NNODES" : "WORLD_SIZE", e->nnodes);
    if ((r = same_as(c, "PET_MASTER_ADDR", "MASTER_ADDR")) < 0)
        return r;
    if ((r = set_host(c, e, "MASTER_ADDR", m, strlen(m))) < 0)
        return r;
    if ((r = required(c, "MASTER_PORT", 1, 65535, &e->rdzv_port, because)) < 0)
        return r;
    if (dl_env_get(c->envp, "PET_MASTER_PORT") != NULL &&
        (r = same_as(c, "PET_MASTER_PORT", "MASTER_PORT")) < 0)
        return r;
    snprintf(e->from, sizeof(e->from), "%s, RANK, MASTER_ADDR, MASTER_PORT",
             nn != NULL ? "PET_NNODES" : "WORLD_SIZE");
    return 0;
}

/* MASTER_ADDR, RANK and WORLD_SIZE are torch's worker variables too: a launcher's worker (or a
 * shell under one) has them, with a rank of its own, and is no pod of a PyTorchJob. */
static bool is_pytorchjob_pod(char *const *envp)
{
    if (dl_env_get(envp, "MASTER_ADDR") == NULL || dl_env_get(envp, "RANK") == NULL)
        return false;
    if (dl_env_get(envp, "LOCAL_RANK") != NULL || dl_env_get(envp, "GROUP_RANK") != NULL ||
        dl_env_get(envp, "TORCHELASTIC_RUN_ID") != NULL)
        return false;
    return dl_env_get(envp, "PET_NODE_RANK") != NULL ||
           dl_env_get(envp, "KUBERNETES_SERVICE_HOST") != NULL;
}

int dl_kube_env_parse(char *const *envp, const char *hostname, dl_kube_env_t *ret, char *err,
                      size_t errlen)
{
    dl_kube_env_t e = {.kind = DL_KUBE_NONE, .name = "", .nnodes = -1, .node_rank = -1};
    ctx_t c = {envp, err, errlen};
    int r = 0;

    if (dl_env_get(envp, "VC_TASK_INDEX") != NULL || dl_env_get(envp, "VK_TASK_INDEX") != NULL)
        r = parse_volcano(&c, hostname, &e);
    else if (dl_env_get(envp, "JOB_COMPLETION_INDEX") != NULL &&
             dl_env_get(envp, "PET_MASTER_ADDR") != NULL)
        r = parse_trainer(&c, &e);
    else if (is_pytorchjob_pod(envp))
        r = parse_pytorchjob(&c, &e);
    if (r < 0)
        return r;
    if (e.kind != DL_KUBE_NONE)
        make_run_id(&e);
    *ret = e;
    return 0;
}
