/* A NULL-terminated "NAME=value" vector with at most one entry a name, indexed by name so that
 * a worker's environment of some 70 variables costs one hash per variable, not a scan of
 * every entry before it. Pure: memory only. */
#ifndef DL_ENVVEC_H
#define DL_ENVVEC_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char **v;         /* NULL-terminated once anything was put */
    size_t *name_len; /* of each v[i]: up to its first '=', else all of it */
    size_t len;
    size_t cap;     /* entries v has room for, besides its NULL */
    uint32_t *slot; /* open addressing: 0 empty, else an index into v plus 1 */
    size_t nslots;  /* a power of two, above twice cap */
} dl_envvec_t;

/* Takes ownership of entry (NULL: -ENOMEM, as from a failed strdup). An entry whose name is
 * already there replaces that one in its place; else it is appended. Returns 0 or -ENOMEM
 * (entry is freed then). */
int dl_envvec_put(dl_envvec_t *ev, char *entry);

/* Room for n entries in all, so that a vector whose size is known is not rebuilt on the way.
 * Returns 0 or -ENOMEM. */
int dl_envvec_reserve(dl_envvec_t *ev, size_t n);

/* The index of the entry named by the n bytes at name, or -1. */
long dl_envvec_find(const dl_envvec_t *ev, const char *name, size_t n);

/* Frees the index, leaving ev->v (NULL-terminated) to the caller. */
void dl_envvec_drop_index(dl_envvec_t *ev);

#endif
