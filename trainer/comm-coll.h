/* The trainer's communication hooks backed by the collective library (see comm-coll.c). */
#ifndef DL_TRAIN_COMM_COLL_H
#define DL_TRAIN_COMM_COLL_H

#include <stddef.h>

#include "trainer.h"

typedef struct dl_train_coll_s dl_train_coll_t;

/* Builds the process group from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)
 * and fills comm's hooks. grad_bytes, the size of one step's gradient sum, sizes the
 * shared-memory rounds unless DLAUNCH_COLL_SHM_CHUNK does. Returns 0 with *ret (owned;
 * dl_train_coll_close) or -errno with one line in err. */
int dl_train_coll_open(dl_train_comm_t *comm, size_t grad_bytes, dl_train_coll_t **ret, char *err,
                       size_t errlen);

/* How the program asks whether a stop signal came (read, async-signal-safe, by a waiting rank):
 * a rank waiting for its next group must end when its launcher stops it, and a signal wakes
 * no condition variable. NULL: never. */
void dl_train_coll_set_stop_check(dl_train_coll_t *c, bool (*stopped)(void));

/* "shm", "tcp", "shm+tcp": what the gradients travel over. */
const char *dl_train_coll_describe(const dl_train_coll_t *c);

/* Waits for what is in flight and tears the group down. Accepts NULL. */
void dl_train_coll_close(dl_train_coll_t *c);

#endif
