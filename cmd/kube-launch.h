/* dlaunch in a Kubernetes pod (see kube-launch.c). */
#ifndef DL_KUBE_LAUNCH_H
#define DL_KUBE_LAUNCH_H

#include <stddef.h>

#include "config.h"
#include "kube.h"

/* Fills what the user left unset from the operator's variables: nodes, node rank, rendezvous
 * endpoint (or, for --rdzv-backend static, --master-addr/--master-port) and run id; a value given
 * by a flag or a DLAUNCH_ variable wins. A job of several pods needs a token the pods share
 * (DLAUNCH_TOKEN or --token-file, from a Secret): none is an error, as the rendezvous would
 * refuse every other pod. Returns 0 or -errno with one line in err. */
int dl_kube_apply(dl_job_spec_t *spec, const dl_kube_env_t *ke, char *err, size_t errlen);

#endif
