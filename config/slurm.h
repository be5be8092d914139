/* Slurm support of the config layer: hostlist expansion and the job's environment.
 *
 * Both are pure: they read only the strings they are given, so every case is a unit test. */
#ifndef DL_CONFIG_SLURM_H
#define DL_CONFIG_SLURM_H

#include <stdbool.h>
#include <stddef.h>

/* ---- hostlists ("node[01-04,07],login1") */

/* Limits of one expansion. A single range holds at most 65,536 hosts, as in Slurm. */
#define DL_HOSTLIST_MAX_HOSTS 1000000
#define DL_HOSTLIST_MAX_RANGE 65536
#define DL_HOSTLIST_MAX_NAME 255
#define DL_HOSTLIST_MAX_BYTES (64 * 1024 * 1024)

/* Expands a Slurm hostlist into host names, in the order `scontrol show hostnames` prints them,
 * duplicates kept. Items are separated by ',', ' ', '\t' or '\n' outside brackets; an empty list
 * gives zero hosts. On success *ret_hosts is a NULL-terminated vector of *ret_n names, owned by the
 * caller and freed with dl_hostlist_free() (one allocation).
 * Errors, with a one-line message in err naming the list and the byte offset:
 *   -EINVAL        malformed (unbalanced or nested brackets, empty range, non-digit, reversed
 *                  range, text after the last ']')
 *   -ERANGE        a number above 2^64-1
 *   -E2BIG         a range over 65,536 hosts, or over 1,000,000 hosts or 64 MiB of names in all
 *   -ENAMETOOLONG  a host name over 255 characters
 *   -ENOMEM */
int dl_hostlist_expand(const char *list, char ***ret_hosts, size_t *ret_n, char *err,
                       size_t errlen);

/* Validates the list and counts its hosts without expanding it; same errors. */
int dl_hostlist_count(const char *list, size_t *ret_n, char *err, size_t errlen);

/* Frees what dl_hostlist_expand() returned; NULL is fine. */
void dl_hostlist_free(char **hosts);

/* ---- the Slurm job environment */

/* The rendezvous port of a job: DL_SLURM_PORT_BASE + job_id % DL_SLURM_PORT_SPAN, i.e.
 * 20000..31999: unprivileged, below Linux's default ephemeral range (32768..60999), so no
 * outgoing connection holds it by chance, and every node of the job computes the same one. */
#define DL_SLURM_PORT_BASE 20000
#define DL_SLURM_PORT_SPAN 12000

typedef struct dl_slurm_env_s {
    bool in_allocation; /* SLURM_JOB_ID is set: inside sbatch, salloc or srun */
    bool in_step;       /* SLURM_STEP_ID is set: a task that srun started */
    long job_id;        /* 0 outside an allocation */
    long step_id;       /* -1 outside a step */
    /* The nodes of the step inside a step, else of the job. */
    int nnodes;
    char **hosts; /* NULL-terminated, expanded; NULL outside an allocation */
    size_t nhosts;
    const char *nodelist_var; /* the variable hosts came from, for messages */
    int node_id;           /* index of this node in hosts; -1 where Slurm does not say (salloc) */
    const char *rdzv_host; /* hosts[0]: node 0 hosts the rendezvous; points into hosts */
    int rdzv_port;         /* dl_slurm_rdzv_port(job_id); 0 outside an allocation */
    int gpus_per_node;     /* -1 when Slurm allocated none or does not say */
    int cpus_on_node;      /* -1 when not set */
    int restart_count;     /* SLURM_RESTART_COUNT: times the job was requeued */
    int proc_id;           /* SLURM_PROCID, -1 when not set */
    int local_id;          /* SLURM_LOCALID, -1 when not set */
    int ntasks;            /* SLURM_NTASKS (or SLURM_NPROCS), -1 when not set */
    char *submit_dir;      /* SLURM_SUBMIT_DIR or NULL */
} dl_slurm_env_t;

/* Reads the Slurm variables from envp, a NULL-terminated "NAME=value" list such as environ (the
 * first of duplicate names wins). Outside an allocation (no SLURM_JOB_ID) it succeeds with
 * in_allocation false and every other field at its "unknown" value.
 * Which variable wins where Slurm sets several:
 *   job id     SLURM_JOB_ID, else SLURM_JOBID
 *   step       SLURM_STEP_ID, else SLURM_STEPID
 *   node list  in a step SLURM_STEP_NODELIST; otherwise (or if unset) SLURM_JOB_NODELIST, then
 *              SLURM_NODELIST
 *   nnodes     in a step SLURM_STEP_NUM_NODES, then SLURM_NNODES; otherwise SLURM_JOB_NUM_NODES,
 *              then SLURM_NNODES; it must equal the number of hosts in the list
 *   GPUs       SLURM_GPUS_ON_NODE (what this node got), else SLURM_GPUS_PER_NODE
 * SLURM_GPUS_PER_NODE is accepted as a comma-separated list of "[type:]count" or
 * "gpu:type:count", each optionally followed by "(xN)" (the same count on N nodes); the counts of
 * the list add up ("volta:3,kepler:1" is 4 GPUs a node).
 * On success *ret is filled, owns its strings, and is freed with dl_slurm_env_free(). On failure
 * *ret is untouched and err names the variable and its value ("SLURM_NODEID='x': not a number"):
 * -EINVAL or -ERANGE for a bad value, -ENOENT for a variable a step or allocation must have,
 * -ENOMEM, or the hostlist errors above. */
int dl_slurm_env_parse(char *const *envp, dl_slurm_env_t *ret, char *err, size_t errlen);

/* Frees what the struct owns and resets it; NULL is fine. */
void dl_slurm_env_free(dl_slurm_env_t *env);

/* See DL_SLURM_PORT_BASE; job_id must be >= 0. */
int dl_slurm_rdzv_port(long job_id);

/* Parses a GPU count as described for SLURM_GPUS_PER_NODE into *ret (0..1024). */
int dl_slurm_parse_gpus(const char *text, int *ret);

#endif
