/* dlaunch under Slurm: inside a step (srun) the Slurm environment fills in what the user did
 * not say; inside an allocation but outside a step (an sbatch script, salloc) dlaunch starts
 * itself once per node through srun, so the one-liner works as typed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto.h"
#include "slurm-launch.h"

/* A token for the job, shared by its nodes through the submit folder (Slurm jobs share a
 * filesystem for their logs anyway). The first node to link it in wins; link() is atomic, so a
 * reader never sees half a file. Mode 0600: only the job's user can read it. */
static int job_token_file(const dl_slurm_env_t *se, char **ret_path, char *err, size_t errlen)
{
    char dir[4096], tmp[4200], *path;
    char nonce[DL_PROTO_NONCE_HEX_LEN + 1];
    const char *base = se->submit_dir != NULL ? se->submit_dir : ".";
    int fd, r;

    snprintf(dir, sizeof(dir), "%s/.dlaunch", base);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        r = -errno;
        snprintf(err, errlen, "cannot create '%s' for the job token: %s", dir, strerror(errno));
        return r;
    }
    /* The submit folder may be shared: a .dlaunch someone else made holds a token they know. */
    struct stat st;
    if (lstat(dir, &st) < 0) {
        r = -errno;
        snprintf(err, errlen, "'%s': %s", dir, strerror(errno));
        return r;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        snprintf(err, errlen,
                 "'%s' is not a folder of this user closed to others (mode %04o, uid %u): "
                 "refusing to keep or take the job token there",
                 dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return -EACCES;
    }
    if (asprintf(&path, "%s/job-%ld.token", dir, se->job_id) < 0)
        return -ENOMEM;
    if (access(path, F_OK) == 0) {
        *ret_path = path;
        return 0;
    }
    snprintf(tmp, sizeof(tmp), "%s/.job-%ld.%d.tmp", dir, se->job_id, (int)getpid());
    if (dl_proto_nonce_new(nonce) < 0) {
        snprintf(err, errlen, "no randomness for the job token");
        free(path);
        return -EIO;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, nonce, strlen(nonce)) != (ssize_t)strlen(nonce) || fsync(fd) < 0) {
        r = -errno;
        snprintf(err, errlen, "cannot write the job token '%s': %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        free(path);
        return r;
    }
    close(fd);
    if (link(tmp, path) < 0 && errno != EEXIST) {
        r = -errno;
        snprintf(err, errlen, "cannot publish the job token '%s': %s", path, strerror(errno));
        unlink(tmp);
        free(path);
        return r;
    }
    unlink(tmp);
    *ret_path = path;
    return 0;
}

int dl_slurm_apply(dl_job_spec_t *spec, const dl_slurm_env_t *se, char *err, size_t errlen)
{
    char buf[512];

    if (spec->nodes_set && (se->nnodes < spec->nodes_min || se->nnodes > spec->nodes_max)) {
        snprintf(err, errlen,
                 "--nodes %d%s%.0d asks for a different job than the Slurm step, which has %d "
                 "node%s (%s)",
                 spec->nodes_min, spec->nodes_min != spec->nodes_max ? ":" : "",
                 spec->nodes_min != spec->nodes_max ? spec->nodes_max : 0, se->nnodes,
                 se->nnodes == 1 ? "" : "s", se->nodelist_var);
        return -EINVAL;
    }
    if (!spec->nodes_set) {
        spec->nodes_min = spec->nodes_max = se->nnodes;
        spec->nodes_set = true;
    }
    if (spec->rdzv_endpoint == NULL) {
        snprintf(buf, sizeof(buf), "%s:%d", se->rdzv_host, se->rdzv_port);
        if ((spec->rdzv_endpoint = strdup(buf)) == NULL)
            return -ENOMEM;
    }
    if (spec->run_id == NULL) {
        snprintf(buf, sizeof(buf), "%ld", se->job_id);
        if ((spec->run_id = strdup(buf)) == NULL)
            return -ENOMEM;
    }
    if (spec->node_rank < 0 && se->node_id >= 0)
        spec->node_rank = se->node_id;
    if (!spec->gpus_set && se->gpus_per_node > 0)
        spec->gpus_per_node = se->gpus_per_node;
    if (spec->token_file == NULL && getenv("DLAUNCH_TOKEN") == NULL) {
        int r = job_token_file(se, &spec->token_file, err, errlen);
        if (r < 0)
            return r;
    }
    return 0;
}

int dl_slurm_self_launch(const dl_job_spec_t *spec, const dl_slurm_env_t *se, int argc, char **argv,
                         char *err, size_t errlen)
{
    char nodes[32], ntasks[32], cpus[32], self[4096];
    char nonce[DL_PROTO_NONCE_HEX_LEN + 1];
    int n = spec->nodes_set ? spec->nodes_max : se->nnodes;

    if (n > se->nnodes) {
        snprintf(err, errlen, "--nodes %d: the Slurm allocation has only %d node%s (%s)", n,
                 se->nnodes, se->nnodes == 1 ? "" : "s", se->nodelist_var);
        return -EINVAL;
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len < 0) {
        snprintf(err, errlen, "cannot find our own binary: %s", strerror(errno));
        return -errno;
    }
    self[len] = '\0';
    /* Every agent of the step gets the same fresh token through srun's environment. */
    if (!spec->dry_run && spec->token_file == NULL && getenv("DLAUNCH_TOKEN") == NULL) {
        if (dl_proto_nonce_new(nonce) < 0 || setenv("DLAUNCH_TOKEN", nonce, 1) < 0) {
            snprintf(err, errlen, "cannot make a job token");
            return -EIO;
        }
    }
    snprintf(nodes, sizeof(nodes), "--nodes=%d", n);
    snprintf(ntasks, sizeof(ntasks), "--ntasks=%d", n);
    snprintf(cpus, sizeof(cpus), "--cpus-per-task=%d", se->cpus_on_node > 0 ? se->cpus_on_node : 1);
    char **av = calloc((size_t)argc + 16, sizeof(char *));
    if (av == NULL)
        return -ENOMEM;
    int k = 0;
    av[k++] = "srun";
    av[k++] = nodes;
    av[k++] = ntasks;
    av[k++] = "--ntasks-per-node=1";
    av[k++] = cpus;
    av[k++] = "--kill-on-bad-exit=0";
    av[k++] = "--export=ALL";
    av[k++] = self;
    for (int i = 1; i < argc; i++)
        av[k++] = argv[i];
    av[k] = NULL;
    if (spec->dry_run) {
        /* The plan here is srun's line; each agent plans its own node inside the step. */
        printf("in Slurm allocation %ld (%d node%s): would run\n ", se->job_id, se->nnodes,
               se->nnodes == 1 ? "" : "s");
        for (int i = 0; i < k; i++)
            printf(" %s", av[i]);
        printf("\nwith a fresh job token in DLAUNCH_TOKEN; each agent then takes its node, rank "
               "and rendezvous from the step (`srun ... dlaunch --dry-run ...` shows one)\n");
        free(av);
        return 0;
    }
    fflush(stdout);
    execvp("srun", av);
    int e = errno;
    snprintf(err, errlen, "cannot run srun to start one agent per node: %s", strerror(e));
    free(av);
    return -e;
}
