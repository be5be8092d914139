/* The runs whose older keys a server no longer takes: for each run id, a time before which every
 * key of that run was issued in vain (`dlaunch revoke`). Optionally kept in a file, so that a
 * restarted dlaunchd refuses what it refused before. Internal to rendezvous/. */
#ifndef DL_RDZV_REVOKED_H
#define DL_RDZV_REVOKED_H

#include <stddef.h>
#include <stdint.h>

/* Run ids a server remembers revocations for: each costs a few hundred bytes, and only the
 * server's own token adds one. */
#define DL__REVOKED_MAX 65536

typedef struct dl__revoked_s dl__revoked_t;

/* An empty table, or with path the one in that file (JSON {"RUN_ID": BEFORE, ...}; a file that
 * does not exist yet is an empty table, and is made at the first revocation). Returns 0, or
 * -errno with one line in err naming the file (unreadable, not JSON, a bad run id or time). */
int dl__revoked_new(const char *path, dl__revoked_t **ret, char *err, size_t errlen);

void dl__revoked_free(dl__revoked_t *t);

/* The time before which run_id's keys are revoked; 0 when none are. */
int64_t dl__revoked_before(const dl__revoked_t *t, const char *run_id);

/* Revokes run_id's keys issued before `before` (an earlier time than one already revoked before
 * changes nothing: revocation only grows) and, with a file, writes the table to it (a new file
 * renamed over the old, so that a crash leaves one or the other). *ret_before is the time now in
 * force. Returns 0, -ENOSPC when DL__REVOKED_MAX run ids are kept already, -ENOMEM, or -errno of
 * the file (the table keeps the revocation in memory), with one line in err. */
int dl__revoked_add(dl__revoked_t *t, const char *run_id, int64_t before, int64_t *ret_before,
                    char *err, size_t errlen);

#endif
