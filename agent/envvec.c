/* See envvec.h. A short hash of the name, linear probing; the table is rebuilt when v grows,
 * which dl_envvec_reserve makes once at most. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "envvec.h"

static size_t name_len(const char *entry)
{
    const char *eq = strchr(entry, '=');
    return eq != NULL ? (size_t)(eq - entry) : strlen(entry);
}

/* A few of the name's bytes and its length, mixed: hashing all of it would cost more than the
 * probes it saves for names this short; equal hashes are told apart by memcmp. */
static uint32_t hash(const char *name, size_t n)
{
    uint32_t h = (uint32_t)n * 0x9E3779B1u;
    if (n > 0)
        h ^= (uint32_t)(unsigned char)name[0] << 16 ^ (uint32_t)(unsigned char)name[n - 1] << 8 ^
             (uint32_t)(unsigned char)name[n / 2] ^ (uint32_t)(unsigned char)name[n / 3] << 24;
    h *= 0x85EBCA6Bu;
    return h ^ h >> 15;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t probe(const dl_envvec_t *ev, const char *name, size_t n)
{
    size_t mask = ev->nslots - 1;
    for (size_t s = hash(name, n) & mask;; s = (s + 1) & mask) {
        uint32_t i = ev->slot[s];
        if (i == 0 || (ev->name_len[i - 1] == n && memcmp(ev->v[i - 1], name, n) == 0))
            return s;
    }
}

long dl_envvec_find(const dl_envvec_t *ev, const char *name, size_t n)
{
    if (ev->nslots == 0)
        return -1;
    uint32_t i = ev->slot[probe(ev, name, n)];
    return i == 0 ? -1 : (long)i - 1;
}

/* Room for cap entries and the NULL after them; the index is rebuilt at the new size, so it
 * never fills past half. */
static int grow(dl_envvec_t *ev, size_t cap)
{
    if (cap > UINT32_MAX / 2)
        return -ENOMEM;
    char **p = realloc(ev->v, (cap + 1) * sizeof(char *));
    if (p == NULL)
        return -ENOMEM;
    ev->v = p;
    ev->v[ev->len] = NULL;
    size_t *l = realloc(ev->name_len, cap * sizeof(size_t));
    if (l == NULL)
        return -ENOMEM;
    ev->name_len = l;
    size_t nslots = 16;
    while (nslots < cap * 2)
        nslots *= 2;
    uint32_t *slot = calloc(nslots, sizeof(uint32_t));
    if (slot == NULL)
        return -ENOMEM;
    free(ev->slot);
    ev->slot = slot;
    ev->nslots = nslots;
    ev->cap = cap;
    for (size_t i = 0; i < ev->len; i++)
        ev->slot[probe(ev, ev->v[i], ev->name_len[i])] = (uint32_t)i + 1;
    return 0;
}

int dl_envvec_reserve(dl_envvec_t *ev, size_t n)
{
    return n > ev->cap ? grow(ev, n) : 0;
}

int dl_envvec_put(dl_envvec_t *ev, char *entry)
{
    if (entry == NULL)
        return -ENOMEM;
    if (ev->len + 1 > ev->cap && grow(ev, ev->cap ? ev->cap * 2 : 64) < 0) {
        free(entry);
        return -ENOMEM;
    }
    size_t n = name_len(entry);
    size_t s = probe(ev, entry, n);
    uint32_t i = ev->slot[s];
    if (i != 0) {
        free(ev->v[i - 1]);
        ev->v[i - 1] = entry;
        return 0;
    }
    ev->name_len[ev->len] = n;
    ev->v[ev->len++] = entry;
    ev->v[ev->len] = NULL;
    ev->slot[s] = (uint32_t)ev->len;
    return 0;
}

void dl_envvec_drop_index(dl_envvec_t *ev)
{
    free(ev->name_len);
    free(ev->slot);
    ev->name_len = NULL;
    ev->slot = NULL;
    ev->nslots = 0;
}
