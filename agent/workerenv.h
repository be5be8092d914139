/* The environment a worker starts with: the agent's own, the job spec's env:, then torchrun's
 * variables and ours, which win. Pure: builds a vector, touches no process. */
#ifndef DL_WORKERENV_H
#define DL_WORKERENV_H

#include <stdbool.h>
#include <stddef.h>

#include <stdbool.h>

typedef struct {
    int rank;
    int local_rank;
    int world_size;
    int local_world_size;
    int group_rank; /* node rank */
    int group_world_size;
    int restart_count;
    int max_restarts;
    const char *run_id;
    const char *master_addr;
    int master_port;
    const char *attempt_dir; /* the attempt's log folder */
    const char *store;       /* DLAUNCH_STORE: HOST:PORT of the job's key-value store, or NULL */
    const char *token_file;  /* DLAUNCH_TOKEN_FILE, or NULL */
    int health_fd;           /* DLAUNCH_HEALTH_FD, or -1 */
    const char *recovery;    /* DLAUNCH_RECOVERY: "restart" or "in-job"; NULL: not set */
    int control_fd;          /* DLAUNCH_CONTROL_FD (in-job recovery's channel), or -1 */
    int group_gen;           /* DLAUNCH_GROUP_GEN, with control_fd: the group generation */
    bool spare;              /* DLAUNCH_SPARE=1, with control_fd: a hot spare (docs/recovery.md) */
    const char *role;        /* ROLE_NAME; NULL: "default" */
    const char *error_file;  /* TORCHELASTIC_ERROR_FILE, or NULL */
    const char *python_exec; /* PYTHON_EXEC, or NULL */
    int verbose;             /* DLAUNCH_VERBOSE=1 when set */
    /* The interface that reaches MASTER_ADDR, or NULL: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME
     * (as "=NAME", an exact match), TP_SOCKET_IFNAME and DLAUNCH_SOCKET_IFNAME, each unless
     * base or extra already has it. */
    const char *ifname;
    /* TORCHELASTIC_USE_AGENT_STORE=True: an agent serves torch's store at MASTER_ADDR:PORT
     * (docs/store.md); false: the workers' rank 0 hosts it. */
    bool agent_store;
    /* A folder put first on PYTHONPATH (the dlaunch package's), or NULL. */
    const char *python_path;
    /* torchrun's --virtual-local-rank: LOCAL_RANK=0, and CUDA_VISIBLE_DEVICES only the
     * worker's own device (its entry of base's list, else its local rank). */
    bool virtual_local_rank;
    /* TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun's agent passes --signals-to-handle on (torch's
     * process contexts read it); NULL: not set. */
    const char *signals_to_handle;
    /* TORCHELASTIC_TIMER_FILE: the file-timer watchdog's pipe; NULL: not set. */
    const char *timer_file;
} dl_worker_env_t;

/* Returns a NULL-terminated "NAME=value" vector in *ret_envp (caller frees it with
 * dl_worker_env_free) built from base (environ-style, may be NULL) and extra (the spec's env:,
 * may be NULL). Returns 0 or -ENOMEM. */
int dl_worker_env_build(const dl_worker_env_t *w, char **base, char **extra, char ***ret_envp);

void dl_worker_env_free(char **envp);

/* The variables dl_worker_env_build sets itself, in order, for --dry-run and tests. */
extern const char *const dl_worker_env_names[];

#endif
