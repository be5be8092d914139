/* Builds a worker's environment. Later entries replace earlier ones with the same name, so a
 * stale RANK inherited from an outer launcher never reaches the worker. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envvec.h"
#include "workerenv.h"

const char *const dl_worker_env_names[] = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCHELASTIC_TIMER_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHON_EXEC",
    "OMP_NUM_THREADS",
    "DLAUNCH_ATTEMPT_DIR",
    "DLAUNCH_STORE",
    "DLAUNCH_TOKEN_FILE",
    "DLAUNCH_HEALTH_FD",
    "DLAUNCH_RECOVERY",
    "DLAUNCH_CONTROL_FD",
    "DLAUNCH_GROUP_GEN",
    "DLAUNCH_SPARE",
    "DLAUNCH_VERBOSE",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "DLAUNCH_SOCKET_IFNAME",
    "PYTHONPATH",
    NULL,
};

/* "NAME=abc" without printf: a worker's environment is some 35 of these, per worker. */
static char *fmt3(const char *name, const char *a, const char *b, const char *c)
{
    size_t n = strlen(name), la = strlen(a), lb = strlen(b), lc = strlen(c);
    char *s = malloc(n + la + lb + lc + 2);
    if (s == NULL)
        return NULL;
    memcpy(s, name, n);
    s[n] = '=';
    memcpy(s + n + 1, a, la);
    memcpy(s + n + 1 + la, b, lb);
    memcpy(s + n + 1 + la + lb, c, lc + 1);
    return s;
}

static char *fmt(const char *name, const char *value)
{
    return fmt3(name, value, "", "");
}

static char *fmt_int(const char *name, int value)
{
    char digits[16], *p = digits + sizeof(digits);
    unsigned u = value < 0 ? 0u - (unsigned)value : (unsigned)value;
    *--p = '\0';
    do
        *--p = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (value < 0)
        *--p = '-';
    return fmt(name, p);
}

static int has(char **v, const char *name)
{
    size_t n = strlen(name);
    for (; v != NULL && *v != NULL; v++)
        if (strncmp(*v, name, n) == 0 && (*v)[n] == '=')
            return 1;
    return 0;
}

/* Whether base or extra sets name, which nothing of ours has been put as yet (nor is it one of
 * the DLAUNCH_ names left out). sv holds all of both: its entry answers, unless that one lacks
 * '=' (then an earlier one may have had it). */
static int inherited(const dl_envvec_t *sv, char **base, char **extra, const char *name)
{
    size_t n = strlen(name);
    long i = dl_envvec_find(sv, name, n);
    if (i < 0)
        return 0;
    return sv->v[i][n] == '=' || has(base, name) || has(extra, name);
}

/* Set and not empty in sv: an empty variable is how scripts unset one. */
static int has_value(const dl_envvec_t *sv, const char *name)
{
    size_t n = strlen(name);
    long i = dl_envvec_find(sv, name, n);
    return i >= 0 && sv->v[i][n] == '=' && sv->v[i][n + 1] != '\0';
}

/* "NAME=dir:what sv has", or "NAME=dir" when sv has nothing; NULL without memory. */
static char *prepend_path(const dl_envvec_t *sv, const char *name, const char *dir)
{
    size_t n = strlen(name);
    long i = dl_envvec_find(sv, name, n);
    if (i >= 0 && sv->v[i][n] == '=' && sv->v[i][n + 1] != '\0')
        return fmt3(name, dir, ":", sv->v[i] + n + 1);
    return fmt(name, dir);
}

/* The worker's own device under --virtual-local-rank: entry local_rank of base's
 * CUDA_VISIBLE_DEVICES, or the local rank when it is unset. -ERANGE: the list is shorter. */
static int own_device(char **base, int local_rank, char **ret)
{
    const char *list = NULL;
    for (char **e = base; e != NULL && *e != NULL; e++)
        if (strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0)
            list = *e + 21;
    if (list == NULL || *list == '\0') {
        *ret = fmt_int("CUDA_VISIBLE_DEVICES", local_rank);
        return *ret == NULL ? -ENOMEM : 0;
    }
    for (int i = 0; i < local_rank; i++) {
        list = strchr(list, ',');
        if (list == NULL)
            return -ERANGE;
        list++;
    }
    size_t n = strcspn(list, ",");
    return asprintf(ret, "CUDA_VISIBLE_DEVICES=%.*s", (int)n, list) < 0 ? -ENOMEM : 0;
}

int dl_worker_env_build(const dl_worker_env_t *w, char **base, char **extra, char ***ret_envp)
{
    dl_envvec_t sv = {0};
    /* Ours (CUDA_VISIBLE_DEVICES in the place of the list's NULL) and all inherited: the index
     * is built once, not rebuilt as it grows. */
    size_t n = sizeof(dl_worker_env_names) / sizeof(dl_worker_env_names[0]);
    for (char **e = base; e != NULL && *e != NULL; e++)
        n++;
    for (char **e = extra; e != NULL && *e != NULL; e++)
        n++;
    int r = dl_envvec_reserve(&sv, n);

    /* The agent's token never reaches a worker: a worker gets its job's worker key through
     * DLAUNCH_TOKEN_FILE below, which reaches the job's store and nothing else. */
    for (char **e = base; e != NULL && *e != NULL && r == 0; e++)
        /* Nor does an outer launcher's control channel: it names another process's fd. */
        if (strncmp(*e, "DLAUNCH_", 8) != 0 ||
            (strncmp(*e + 8, "TOKEN=", 6) != 0 && strncmp(*e + 8, "TOKEN_FILE=", 11) != 0 &&
             strncmp(*e + 8, "CONTROL_FD=", 11) != 0 && strncmp(*e + 8, "GROUP_GEN=", 10) != 0 &&
             strncmp(*e + 8, "SPARE=", 6) != 0))
            r = dl_envvec_put(&sv, strdup(*e));
    for (char **e = extra; e != NULL && *e != NULL && r == 0; e++)
        r = dl_envvec_put(&sv, strdup(*e));
    /* Several CPU-bound workers each spawning a thread per core would oversubscribe the
     * machine; torchrun makes the same choice. */
    if (r == 0 && w->local_world_size > 1 && !inherited(&sv, base, extra, "OMP_NUM_THREADS"))
        r = dl_envvec_put(&sv, fmt("OMP_NUM_THREADS", "1"));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("RANK", w->rank));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("LOCAL_RANK", w->virtual_local_rank ? 0 : w->local_rank));
    if (r == 0 && w->virtual_local_rank) {
        char *dev = NULL;
        r = own_device(base, w->local_rank, &dev);
        if (r == 0)
            r = dl_envvec_put(&sv, dev);
    }
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("WORLD_SIZE", w->world_size));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("LOCAL_WORLD_SIZE", w->local_world_size));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("GROUP_RANK", w->group_rank));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("GROUP_WORLD_SIZE", w->group_world_size));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("ROLE_RANK", w->rank));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt("ROLE_NAME", w->role != NULL ? w->role : "default"));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("ROLE_WORLD_SIZE", w->world_size));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt("MASTER_ADDR", w->master_addr));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("MASTER_PORT", w->master_port));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("TORCHELASTIC_RESTART_COUNT", w->restart_count));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt_int("TORCHELASTIC_MAX_RESTARTS", w->max_restarts));
    if (r == 0)
        r = dl_envvec_put(&sv, fmt("TORCHELASTIC_RUN_ID", w->run_id));
    if (r == 0 && w->signals_to_handle != NULL)
        r = dl_envvec_put(&sv, fmt("TORCHELASTIC_SIGNALS_TO_HANDLE", w->signals_to_handle));
    if (r == 0 && w->timer_file != NULL)
        r = dl_envvec_put(&sv, fmt("TORCHELASTIC_TIMER_FILE", w->timer_file));
    /* As torchrun since 2.4: the store outlives every worker, rank 0 included, for an agent
     * serves it at MASTER_ADDR:MASTER_PORT. Else rank 0 of torch.distributed hosts it there. */
    if (r == 0)
        r = dl_envvec_put(&sv,
                          fmt("TORCHELASTIC_USE_AGENT_STORE", w->agent_store ? "True" : "False"));
    /* As torchrun: NCCL's asynchronous error handling on, unless the user said otherwise. */
    if (r == 0 && !inherited(&sv, base, extra, "TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        r = dl_envvec_put(&sv, fmt("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"));
    if (r == 0 && w->error_file != NULL)
        r = dl_envvec_put(&sv, fmt("TORCHELASTIC_ERROR_FILE", w->error_file));
    if (r == 0 && w->python_exec != NULL)
        r = dl_envvec_put(&sv, fmt("PYTHON_EXEC", w->python_exec));
    if (r == 0 && w->verbose)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_VERBOSE", "1"));
    if (r == 0 && w->attempt_dir != NULL)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_ATTEMPT_DIR", w->attempt_dir));
    if (r == 0 && w->store != NULL)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_STORE", w->store));
    if (r == 0 && w->token_file != NULL)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_TOKEN_FILE", w->token_file));
    if (r == 0 && w->health_fd >= 0)
        r = dl_envvec_put(&sv, fmt_int("DLAUNCH_HEALTH_FD", w->health_fd));
    if (r == 0 && w->recovery != NULL)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_RECOVERY", w->recovery));
    if (r == 0 && w->control_fd >= 0)
        r = dl_envvec_put(&sv, fmt_int("DLAUNCH_CONTROL_FD", w->control_fd));
    if (r == 0 && w->control_fd >= 0)
        r = dl_envvec_put(&sv, fmt_int("DLAUNCH_GROUP_GEN", w->group_gen));
    if (r == 0 && w->control_fd >= 0 && w->spare)
        r = dl_envvec_put(&sv, fmt("DLAUNCH_SPARE", "1"));
    /* Left alone, Gloo binds what the host name resolves to and NCCL the first interface that
     * looks usable; either may be one the other nodes cannot reach. A user's own choice stays. */
    static const char *const ifvars[] = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                         "TP_SOCKET_IFNAME", "DLAUNCH_SOCKET_IFNAME"};
    for (size_t i = 0; i < 4 && r == 0 && w->ifname != NULL; i++) {
        if (has_value(&sv, ifvars[i]))
            continue;
        /* NCCL reads a bare name as a prefix (eth1 would match eth10 too); '=' makes it exact. */
        r = dl_envvec_put(&sv, fmt3(ifvars[i], i == 1 ? "=" : "", w->ifname, ""));
    }
    /* `import dlaunch` finds the agent's own copy first, installed or not (docs/python.md). */
    if (r == 0 && w->python_path != NULL)
        r = dl_envvec_put(&sv, prepend_path(&sv, "PYTHONPATH", w->python_path));
    if (r == 0 && sv.len == 0)
        r = dl_envvec_put(&sv, strdup("DLAUNCH=1"));
    dl_envvec_drop_index(&sv);
    if (r < 0) {
        dl_worker_env_free(sv.v);
        return r;
    }
    *ret_envp = sv.v;
    return 0;
}

void dl_worker_env_free(char **envp)
{
    if (envp == NULL)
        return;
    for (char **e = envp; *e != NULL; e++)
        free(*e);
    free(envp);
}
