/* The torch stores of a server that serves many jobs (dlaunchd): one for each job whose agents
 * ask for it, each on a port of its own, for torch's clients carry no run id (docs/store.md,
 * "Where it is"). Found by run id when the core speaks of a job, and by the index that their
 * connections' ids carry when the core answers one. Internal to the rendezvous layer. */
#ifndef DL_TORCH_JOBS_H
#define DL_TORCH_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include "torch-store.h"

typedef struct dl__torch_jobs_s dl__torch_jobs_t;

/* Returns 0 with *ret, or -ENOMEM. */
int dl__torch_jobs_new(dl__torch_jobs_t **ret);

/* run_id's store, or NULL. O(1). */
dl__torch_store_t *dl__torch_jobs_find(const dl__torch_jobs_t *t, const char *run_id);

/* The store a torch connection id belongs to (DL__TORCH_STORE_INDEX), or NULL. */
dl__torch_store_t *dl__torch_jobs_of_conn(const dl__torch_jobs_t *t, uint64_t conn);

/* Opens run_id's store on host, on any free port. Returns 0 with *ret, -ENOSPC when
 * DL__TORCH_MAX_STORES - 1 are open, or what dl__torch_store_start returns; err gets one line. */
int dl__torch_jobs_open(dl__torch_jobs_t *t, dl_rdzv_server_t *s, uv_loop_t *loop, const char *host,
                        const char *run_id, dl__torch_store_t **ret, char *err, size_t errlen);

/* Closes run_id's store, if it has one. */
void dl__torch_jobs_close(dl__torch_jobs_t *t, const char *run_id);

/* Closes the stores of the jobs that gone(ctx, run_id) says are over. O(stores). */
void dl__torch_jobs_close_if(dl__torch_jobs_t *t, int (*gone)(void *ctx, const char *run_id),
                             void *ctx);

size_t dl__torch_jobs_count(const dl__torch_jobs_t *t);

/* Closes every store and frees the table. Accepts NULL. */
void dl__torch_jobs_free(dl__torch_jobs_t *t);

#endif
