/* The workers' credential file (DLAUNCH_TOKEN_FILE): the job's worker key, never the agent's
 * token. */
#ifndef DL_AGENT_WORKERCRED_H
#define DL_AGENT_WORKERCRED_H

#include <stddef.h>

#include "proto.h"

/* Derives the worker key of run_id from token (a master, which makes one issued now that lasts
 * DL_PROTO_KEY_LIFETIME_S, or the job's key, whose span it keeps) and writes it, mode 0600, as
 * $XDG_RUNTIME_DIR/dlaunch/RUN_ID.PID.worker-key (else $TMPDIR/dlaunch-UID/..., /tmp by
 * default; the folder must be ours and closed to others, and when another user made it first a
 * fresh folder of a random name is used, said in note, "" otherwise). Returns 0 with *ret_path
 * (malloc'd, the caller's), or -errno with one line in err. When *ret_path is set already, the
 * new key replaces the one in that file at once (renamed over it), and *ret_path stays. */
int dl__worker_cred_write(const dl_proto_token_t *token, const char *run_id, char **ret_path,
                          char *note, size_t notelen, char *err, size_t errlen);

/* Removes the file (and the folder of a random name it may be in), when the job is over.
 * Accepts NULL. */
void dl__worker_cred_remove(const char *path);

#endif
