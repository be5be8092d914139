/* dl_coll_mem_alloc: memory the other ranks on this host map and read in place, so that a large
 * all-reduce between two ranks need not copy its input through the shared segment (NCCL's
 * registered buffers, MPI_Alloc_mem).
 *
 * Each allocation is a memfd. The host's members swap (pid, fd, length) through the segment,
 * and each maps the others' blocks read-only through /proc/PID/fd/FD, which needs only what
 * reading another process of the same user needs (ptrace read access), unlike pidfd_getfd.
 * dl_coll_mem_peer_rw maps a block for writing too, on demand (the trainer's sharded step hands
 * each rank's new parameters into the other's block): only the blocks a protocol writes, so that
 * a stray store elsewhere (into the optimizer state's replica, say) still faults.
 * A second exchange of outcomes makes the result the same everywhere: either every member holds
 * every block or the allocation fails on all of them, so no rank ever sends from memory a peer
 * cannot see. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

typedef struct {
    int32_t pid;
    int32_t fd; /* -1: this member could not allocate */
    uint64_t len;
} block_desc_t;

const dl__coll_region_t *dl__coll_mem_find(const dl__coll_mem_t *m, const void *p, size_t bytes)
{
    const char *c = p;
    for (size_t i = 0; i < m->n; i++) {
        const dl__coll_region_t *r = &m->v[i];
        if (c >= r->base && c < r->base + r->len && bytes <= (size_t)(r->base + r->len - c))
            return r;
    }
    return NULL;
}

const dl__coll_region_t *dl__coll_mem_by_serial(const dl__coll_mem_t *m, uint32_t serial)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].serial == serial)
            return &m->v[i];
    return NULL;
}

static void region_unmap(dl__coll_region_t *r, int members)
{
    for (int j = 0; r->peer_base != NULL && j < members; j++) {
        if (r->peer_base[j] != NULL)
            munmap((void *)r->peer_base[j], r->peer_len[j]);
        if (r->peer_w != NULL && r->peer_w[j].base != NULL)
            munmap(r->peer_w[j].base, r->peer_len[j]);
    }
    free(r->peer_base);
    free(r->peer_len);
    free(r->peer_w);
    if (r->base != NULL)
        munmap(r->base, r->len);
    if (r->fd >= 0)
        close(r->fd);
}

void dl__coll_mem_release(dl__coll_mem_t *m)
{
    for (size_t i = 0; i < m->n; i++)
        region_unmap(&m->v[i], m->members);
    free(m->v);
    memset(m, 0, sizeof(*m));
}

/* This rank's block: zero-filled, whole pages. */
static int make_block(dl__coll_region_t *r, size_t bytes, char *err, size_t errlen)
{
    long page = sysconf(_SC_PAGESIZE);
    r->len = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    r->fd = memfd_create("dlaunch-coll", MFD_CLOEXEC);
    if (r->fd < 0) {
        int e = errno;
        snprintf(err, errlen, "memfd_create: %s", strerror(e));
        return -e;
    }
    if (ftruncate(r->fd, (off_t)r->len) < 0) {
        int e = errno;
        snprintf(err, errlen, "ftruncate of the shared block to %zu bytes: %s", r->len,
                 strerror(e));
        return -e;
    }
    void *p = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        snprintf(err, errlen, "mmap of %zu shared bytes: %s", r->len, strerror(e));
        return -e;
    }
    r->base = p;
    return 0;
}

static int map_peer(dl__coll_region_t *r, int j, const block_desc_t *d, int rank, char *err,
                    size_t errlen)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)d->pid, (int)d->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "opening rank %d's shared block (%s): %s", rank, path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "fstat of rank %d's shared block (%s): %s", rank, path, strerror(e));
        return -e;
    }
    void *p = mmap(NULL, (size_t)d->len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "mapping rank %d's shared block (%s, %llu bytes): %s", rank, path,
                 (unsigned long long)d->len, strerror(e));
        return -e;
    }
    r->peer_base[j] = p;
    r->peer_len[j] = (size_t)d->len;
    r->peer_w[j] =
        (struct dl__coll_peer_w_s){.pid = d->pid, .fd = d->fd, .dev = st.st_dev, .ino = st.st_ino};
    return 0;
}

/* Swaps descriptors with the host's members and maps theirs; returns 0 only when every member
 * mapped every block. */
static int share_block(dl_coll_group_t *g, dl__coll_region_t *r, int made, char *err, size_t errlen)
{
    dl__coll_shm_t *s = g->shm;
    int n = g->mem.members, me = dl__coll_shm_member(s);
    block_desc_t mine = {.pid = getpid(), .fd = made == 0 ? r->fd : -1, .len = r->len};
    block_desc_t *all = calloc((size_t)n, sizeof(*all));
    int32_t *oks = calloc((size_t)n, sizeof(*oks));
    r->peer_base = calloc((size_t)n, sizeof(*r->peer_base));
    r->peer_len = calloc((size_t)n, sizeof(*r->peer_len));
    r->peer_w = calloc((size_t)n, sizeof(*r->peer_w));
    if (all == NULL || oks == NULL || r->peer_base == NULL || r->peer_len == NULL ||
        r->peer_w == NULL) {
        free(all);
        free(oks);
        /* Without room for the exchange this rank cannot take part: abort the others' wait. */
        int e = dl__coll_broken(g, dl__coll_fail(&g->err, -ENOMEM, "out of memory"));
        snprintf(err, errlen, "%s", g->err.msg);
        return e;
    }
    int local = made;
    int r2 = dl__coll_shm_allgather(s, &mine, all, sizeof(mine), 0);
    if (r2 < 0)
        goto out;
    for (int j = 0; j < n && local == 0; j++) {
        if (j == me)
            continue;
        if (all[j].fd < 0) {
            snprintf(err, errlen, "rank %d on this host could not allocate its block",
                     dl__coll_shm_member_rank(s, j));
            local = -EIO;
        } else {
            local = map_peer(r, j, &all[j], dl__coll_shm_member_rank(s, j), err, errlen);
        }
    }
    int32_t ok = local == 0;
    r2 = dl__coll_shm_allgather(s, &ok, oks, sizeof(ok), 0);
    if (r2 < 0)
        goto out;
    for (int j = 0; j < n && local == 0; j++)
        if (!oks[j]) {
            snprintf(err, errlen, "rank %d on this host could not map the others' blocks",
                     dl__coll_shm_member_rank(s, j));
            local = -EIO;
        }
out:
    free(all);
    free(oks);
    if (r2 < 0) {
        snprintf(err, errlen, "%s", g->err.msg);
        return dl__coll_broken(g, r2);
    }
    return local;
}

static int mem_alloc(dl_coll_group_t *g, size_t bytes, void **ret_ptr, char *err, size_t errlen);

int dl_coll_mem_alloc(dl_coll_group_t *g, size_t bytes, void **ret_ptr, char *err, size_t errlen)
{
    if (g == NULL || ret_ptr == NULL || bytes == 0) {
        snprintf(err, errlen, "dl_coll_mem_alloc: bytes must be more than 0");
        return -EINVAL;
    }
    dl__coll_drain(g);
    /* Collective too: a rank that never comes leaves the others waiting here. */
    uint64_t seq = dl__coll_rec_begin(
        &g->rec, DL_COLL_REC_MEM_ALLOC, bytes,
        g->shm != NULL ? DL_COLL_REC_ALGO_NONE : DL_COLL_REC_ALGO_LOCAL, DL_COLL_INT32, -1);
    int r = mem_alloc(g, bytes, ret_ptr, err, errlen);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

static int mem_alloc(dl_coll_group_t *g, size_t bytes, void **ret_ptr, char *err, size_t errlen)
{
    if (g->err.code != 0) {
        snprintf(err, errlen, "%s", g->err.msg);
        return g->err.code;
    }
    if (g->mem.n == g->mem.cap) {
        size_t cap = g->mem.cap == 0 ? 4 : 2 * g->mem.cap;
        dl__coll_region_t *v = realloc(g->mem.v, cap * sizeof(*v));
        if (v == NULL) {
            /* The host's other ranks are about to wait for this one's block: abort their wait. */
            int e = dl__coll_broken(g, dl__coll_fail(&g->err, -ENOMEM, "out of memory"));
            snprintf(err, errlen, "%s", g->err.msg);
            return e;
        }
        g->mem.v = v;
        g->mem.cap = cap;
    }
    dl__coll_region_t r = {.serial = ++g->mem.next_serial, .fd = -1};
    int rc = make_block(&r, bytes, err, errlen);
    if (g->shm != NULL)
        rc = share_block(g, &r, rc, err, errlen);
    if (rc < 0) {
        region_unmap(&r, g->mem.members);
        return rc;
    }
    g->mem.v[g->mem.n++] = r;
    *ret_ptr = r.base;
    return 0;
}

/* Where rank's block of the allocation holding mine is: the allocation's index in g->mem and
 * rank's member index (-1: this rank). 0, -ENOENT when mine is no such memory, -EXDEV when rank
 * is on another host, out of range, or has no block here. */
static int peer_block(const dl_coll_group_t *g, const void *mine, int rank, size_t *ret_i,
                      int *ret_j)
{
    const dl__coll_region_t *r = g != NULL ? dl__coll_mem_find(&g->mem, mine, 1) : NULL;
    if (r == NULL)
        return -ENOENT;
    if (rank < 0 || rank >= g->size || g->host_of == NULL || g->host_of[rank] != g->host)
        return -EXDEV;
    *ret_i = (size_t)(r - g->mem.v);
    *ret_j = rank == g->rank ? -1 : g->local_of[rank];
    if (*ret_j >= 0 && (r->peer_base == NULL || r->peer_base[*ret_j] == NULL))
        return -EXDEV;
    return 0;
}

int dl_coll_mem_peer(const dl_coll_group_t *g, const void *mine, int rank, const void **ret_ptr,
                     size_t *ret_len)
{
    size_t i;
    int j;
    int rc = peer_block(g, mine, rank, &i, &j);
    if (rc < 0)
        return rc;
    const dl__coll_region_t *r = &g->mem.v[i];
    *ret_ptr = j < 0 ? r->base : r->peer_base[j];
    *ret_len = j < 0 ? r->len : r->peer_len[j];
    return 0;
}

int dl_coll_mem_peer_rw(dl_coll_group_t *g, const void *mine, int rank, void **ret_ptr,
                        size_t *ret_len)
{
    size_t i;
    int j;
    int rc = peer_block(g, mine, rank, &i, &j);
    if (rc < 0)
        return rc;
    dl__coll_region_t *r = &g->mem.v[i];
    if (j < 0) {
        *ret_ptr = r->base;
        *ret_len = r->len;
        return 0;
    }
    struct dl__coll_peer_w_s *w = &r->peer_w[j];
    if (w->base == NULL) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)w->pid, (int)w->fd);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return -errno;
        /* The same file the read-only mapping shows, not whatever that number names now (the
         * member gone, its pid or descriptor reused). */
        struct stat st;
        if (fstat(fd, &st) < 0 || st.st_dev != w->dev || st.st_ino != w->ino) {
            close(fd);
            return -ESTALE;
        }
        void *p = mmap(NULL, r->peer_len[j], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (p == MAP_FAILED)
            return -e;
        w->base = p;
    }
    *ret_ptr = w->base;
    *ret_len = r->peer_len[j];
    return 0;
}

void dl_coll_mem_free(dl_coll_group_t *g, void *ptr)
{
    if (g == NULL || ptr == NULL)
        return;
    dl__coll_drain(g);
    for (size_t i = 0; i < g->mem.n; i++) {
        if (g->mem.v[i].base != ptr)
            continue;
        region_unmap(&g->mem.v[i], g->mem.members);
        g->mem.v[i] = g->mem.v[--g->mem.n];
        return;
    }
}
