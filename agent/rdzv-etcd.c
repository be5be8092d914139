/* The etcd backend (rdzv-backend.h): not written yet. */
#include <stdio.h>

#include "rdzv-backend.h"

static int etcd_start(const dl_rdzv_backend_conf_t *conf, const dl_rdzv_backend_cbs_t *cbs,
                      void *ctx, dl_rdzv_impl_t **ret)
{
    *ret = NULL;
    fprintf(stderr, "dlaunch: --rdzv-backend etcd: not available in this build yet; use c10d (our "
                    "rendezvous) or static\n");
    return 2;
}

const dl_rdzv_backend_ops_t dl__rdzv_backend_etcd = {.name = "etcd", .start = etcd_start};
