/* dlaunch under Slurm (see slurm-launch.c). */
#ifndef DL_SLURM_LAUNCH_H
#define DL_SLURM_LAUNCH_H

#include <stddef.h>

#include "config.h"
#include "slurm.h"

/* Inside a step: fills what the user left unset from the Slurm environment (nodes, rendezvous
 * endpoint and run id from the job, node rank from SLURM_NODEID, GPUs, a job token) and checks
 * what the user did set against it. Returns 0 or -errno with one line in err. */
int dl_slurm_apply(dl_job_spec_t *spec, const dl_slurm_env_t *se, char *err, size_t errlen);

/* Inside an allocation but outside a step: replaces this process with
 * `srun --nodes N --ntasks-per-node 1 ... dlaunch ARGS`. Returns only on failure, or with 0
 * after printing that srun line when spec->dry_run (then nothing else is to run). */
int dl_slurm_self_launch(const dl_job_spec_t *spec, const dl_slurm_env_t *se, int argc, char **argv,
                         char *err, size_t errlen);

#endif
