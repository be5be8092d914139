/* The flight recorder: every group's last operations in a small ring that another process can
 * read at any moment, even while this one is stopped or after it died.
 *
 * The writer (the group's operations, inline in internal.h) costs eight plain stores per
 * operation, 2.5 ns in an empty loop (bench/recorder): no lock, no system call. Operations of
 * 64 KiB and more also read the time-stamp counter twice (11 ns each on the build VM; a vDSO
 * clock_gettime costs 30-40 ns), which is nothing next to what they move. Each entry is guarded
 * by a sequence lock so that a reader never takes half an update for a whole one.
 * The reader converts ticks to CLOCK_MONOTONIC through the anchor the writer took at setup and a
 * second one of its own. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define READ_TRIES 64

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the writer ------------------------------------------------------------------------------ */

/* The file, locked for this group, sized, and its blocks reserved: a page of a shared mapping
 * that the file system cannot back raises SIGBUS at first touch, in this rank and in the agent
 * that reads it (tmpfs allocates on a read fault too). Returns the fd, or -1 when the file cannot
 * be had; *ret_error is the errno for which its blocks could not be reserved (the fd is then
 * returned, locked, and the file left empty so that no reader maps it). */
static int open_file(const char *path, int *ret_error)
{
    *ret_error = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return -1;
    /* Another group of this process (or a stray process) writing the same ring would make both
     * unreadable: the first one keeps it. */
    struct stat st;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0 || fstat(fd, &st) < 0 ||
        (st.st_size != DL__REC_FILE_BYTES && ftruncate(fd, DL__REC_FILE_BYTES) < 0)) {
        close(fd);
        return -1;
    }
    int e = posix_fallocate(fd, 0, DL__REC_FILE_BYTES);
    if (e != 0) {
        *ret_error = e;
        if (ftruncate(fd, 0) < 0) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

/* Shared memory for the ring when its file cannot hold it, named after the file so that the
 * agent can find it in /proc/PID/fd; its pages are reserved as the file's would be. -1 when
 * it cannot be had. */
static int memory_ring(const char *path)
{
    const char *base = strrchr(path, '/');
    char name[250]; /* memfd_create's limit: longer names are cut, and then never found */
    base = base != NULL ? base + 1 : path;
    if (strlen(DL__REC_MEMFD_PREFIX) + strlen(base) >= sizeof(name))
        return -1;
    memcpy(name, DL__REC_MEMFD_PREFIX, strlen(DL__REC_MEMFD_PREFIX));
    strcpy(name + strlen(DL__REC_MEMFD_PREFIX), base);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, DL__REC_FILE_BYTES) < 0 || posix_fallocate(fd, 0, DL__REC_FILE_BYTES) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void dl__coll_rec_open(dl__coll_rec_t *rec, const dl_coll_options_t *o, int rank, int world,
                       const char *transport)
{
    void *map = MAP_FAILED;
    int file_error = 0;
    memset(rec, 0, sizeof(*rec));
    rec->fd = rec->mem_fd = -1;
    if (!o->recorder)
        return;
    if (o->recorder_path[0] != '\0')
        rec->fd = open_file(o->recorder_path, &file_error);
    if (rec->fd >= 0 && file_error != 0)
        rec->mem_fd = memory_ring(o->recorder_path);
    int shared_fd = file_error != 0 ? rec->mem_fd : rec->fd;
    if (shared_fd >= 0)
        map = mmap(NULL, DL__REC_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
    if (map == MAP_FAILED) {
        if (rec->mem_fd >= 0)
            close(rec->mem_fd);
        if (rec->fd >= 0)
            close(rec->fd);
        rec->fd = rec->mem_fd = -1;
        map = mmap(NULL, DL__REC_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    }
    if (map == MAP_FAILED)
        return;
    dl__rec_header_t *h = map;
    /* A file left by an earlier run of the same job: unreadable until it is whole again. */
    __atomic_store_n(&h->magic, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memset((char *)map + sizeof(h->magic), 0, DL__REC_FILE_BYTES - sizeof(h->magic));
    h->version = DL__REC_VERSION;
    h->header_bytes = DL__REC_HEADER_BYTES;
    h->entry_bytes = DL__REC_ENTRY_BYTES;
    h->capacity = DL__REC_CAPACITY;
    h->rank = rank;
    h->world_size = world;
    h->pid = (int32_t)getpid();
#if defined(__x86_64__) || defined(__i386__)
    h->tick_kind = DL__REC_TICK_TSC;
#else
    h->tick_kind = DL__REC_TICK_NS;
#endif
    h->anchor_mono_ns = clock_ns(CLOCK_MONOTONIC);
    h->anchor_tick = dl__coll_rec_tick();
    h->anchor_real_ns = clock_ns(CLOCK_REALTIME);
    snprintf(h->transport, sizeof(h->transport), "%s", transport);
    h->file_error = rec->mem_fd >= 0 ? file_error : 0;
    __atomic_store_n(&h->magic, DL__REC_MAGIC, __ATOMIC_RELEASE);
    rec->hdr = h;
    rec->ring = (dl__rec_entry_t *)((char *)map + DL__REC_HEADER_BYTES);
    rec->len = DL__REC_FILE_BYTES;
    rec->timed = o->recorder_timed_bytes;
}

void dl__coll_rec_close(dl__coll_rec_t *rec)
{
    if (rec->hdr != NULL)
        munmap(rec->hdr, rec->len);
    if (rec->fd >= 0)
        close(rec->fd); /* the file stays: it is the post-mortem */
    if (rec->mem_fd >= 0)
        close(rec->mem_fd); /* a reader that mapped it keeps its copy */
    memset(rec, 0, sizeof(*rec));
    rec->fd = rec->mem_fd = -1;
}

/* ---- the reader ------------------------------------------------------------------------------ */

struct dl_coll_rec_reader_s {
    const dl__rec_header_t *hdr;
    const dl__rec_entry_t *ring;
};

/* Whether every byte of the ring has a page behind it: tmpfs allocates one on a read fault of a
 * hole and raises SIGBUS when it cannot (a full one); elsewhere a read fault maps zeros. */
static bool backed(int fd, const struct stat *st)
{
    struct statfs fs;
    if (fstatfs(fd, &fs) < 0 || fs.f_type != TMPFS_MAGIC)
        return true;
    return (long long)st->st_blocks * 512 >= DL__REC_FILE_BYTES;
}

static int map_fd(int fd, dl_coll_rec_reader_t **ret)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    /* Created but not yet sized or reserved: its rank is setting it up right now (or could not,
     * and keeps the ring in memory). */
    if (st.st_size < DL__REC_FILE_BYTES)
        return st.st_size == 0 ? -ENODATA : -EBADMSG;
    if (!backed(fd, &st))
        return -ENODATA;
    void *map = mmap(NULL, DL__REC_FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return -errno;
    const dl__rec_header_t *h = map;
    int r = 0;
    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    if (magic == 0)
        r = -ENODATA;
    else if (magic != DL__REC_MAGIC || h->version != DL__REC_VERSION ||
             h->capacity != DL__REC_CAPACITY || h->entry_bytes != DL__REC_ENTRY_BYTES ||
             h->header_bytes != DL__REC_HEADER_BYTES)
        r = -EBADMSG;
    dl_coll_rec_reader_t *rd = r == 0 ? calloc(1, sizeof(*rd)) : NULL;
    if (r == 0 && rd == NULL)
        r = -ENOMEM;
    if (r < 0) {
        munmap(map, DL__REC_FILE_BYTES);
        return r;
    }
    rd->hdr = h;
    rd->ring = (const dl__rec_entry_t *)((const char *)map + DL__REC_HEADER_BYTES);
    *ret = rd;
    return 0;
}

int dl_coll_rec_open(const char *path, dl_coll_rec_reader_t **ret)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int r = map_fd(fd, ret);
    close(fd);
    return r;
}

/* The fd of pid's memfd that holds the ring of the file named base, opened read-only; -1. */
static int open_memory_ring(int pid, const char *base)
{
    char dir[64], want[300], link[300], path[sizeof(dir) + 256 + 1];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
    snprintf(want, sizeof(want), "/memfd:%s%s (deleted)", DL__REC_MEMFD_PREFIX, base);
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int fd = -1;
    struct dirent *e;
    while (fd < 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (strcmp(link, want) == 0)
            fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    closedir(d);
    return fd;
}

int dl_coll_rec_open_pid(const char *path, int pid, dl_coll_rec_reader_t **ret)
{
    int r = dl_coll_rec_open(path, ret);
    if (r != -ENODATA || pid <= 0)
        return r;
    const char *base = strrchr(path, '/');
    int fd = open_memory_ring(pid, base != NULL ? base + 1 : path);
    if (fd < 0)
        return r;
    int m = map_fd(fd, ret);
    close(fd);
    return m == 0 ? 1 : r;
}

int dl_coll_rec_file_error(const dl_coll_rec_reader_t *r)
{
    return r->hdr->file_error;
}

void dl_coll_rec_close(dl_coll_rec_reader_t *r)
{
    if (r == NULL)
        return;
    munmap((void *)r->hdr, DL__REC_FILE_BYTES);
    free(r);
}

/* A consistent copy of entry e, or 0 when it keeps changing (or never held anything). */
static int read_entry(const dl__rec_entry_t *e, dl__rec_entry_t *out)
{
    for (int i = 0; i < READ_TRIES; i++) {
        uint32_t v1 = __atomic_load_n(&e->h.ver, __ATOMIC_ACQUIRE);
        memcpy(out, (const void *)e, sizeof(*out));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint32_t v2 = __atomic_load_n(&e->h.ver, __ATOMIC_RELAXED);
        if (v1 == v2 && (v1 & 1) == 0)
            return v1 != 0 && out->seq != 0;
        sched_yield();
    }
    return 0;
}

/* Ticks to CLOCK_MONOTONIC seconds: through the writer's anchor and, for the counter's rate, a
 * second anchor taken now (same machine, same counter). */
typedef struct {
    double tick0, mono0, rate; /* rate: ticks per second */
} conv_t;

static void conv_init(const dl__rec_header_t *h, conv_t *c)
{
    c->tick0 = (double)h->anchor_tick;
    c->mono0 = (double)h->anchor_mono_ns / 1e9;
    c->rate = 1e9;
    if (h->tick_kind == DL__REC_TICK_TSC) {
        double mono = (double)clock_ns(CLOCK_MONOTONIC) / 1e9;
        double tick = (double)dl__coll_rec_tick();
        if (mono - c->mono0 > 1e-3 && tick > c->tick0)
            c->rate = (tick - c->tick0) / (mono - c->mono0);
        else
            c->rate = 0; /* too soon to tell: times read as the anchor's */
    }
}

static double conv(const conv_t *c, uint64_t tick)
{
    if (tick == 0)
        return 0;
    if (c->rate <= 0)
        return c->mono0;
    return c->mono0 + ((double)tick - c->tick0) / c->rate;
}

size_t dl_coll_rec_read(const dl_coll_rec_reader_t *r, dl_coll_rec_info_t *ret_info,
                        dl_coll_rec_entry_t *v, size_t max)
{
    const dl__rec_header_t *h = r->hdr;
    uint64_t issued = __atomic_load_n(&h->issued, __ATOMIC_ACQUIRE);
    conv_t c;
    conv_init(h, &c);
    if (ret_info != NULL) {
        memset(ret_info, 0, sizeof(*ret_info));
        ret_info->rank = h->rank;
        ret_info->world_size = h->world_size;
        ret_info->pid = h->pid;
        memcpy(ret_info->transport, h->transport, sizeof(ret_info->transport));
        ret_info->transport[sizeof(ret_info->transport) - 1] = '\0';
        ret_info->issued = issued;
        ret_info->created = (double)h->anchor_real_ns / 1e9;
    }
    /* Newest first from the newest issued. A slot that does not hold the operation it should
     * is an asynchronous all-reduce not yet started, as long as nothing newer started; below an
     * operation that did, it was overwritten, and the history ends there. */
    size_t n = 0;
    bool started = false;
    dl__rec_entry_t tmp[DL__REC_CAPACITY];
    for (uint64_t k = 0; k < DL__REC_CAPACITY && k < issued && n < max; k++) {
        uint64_t seq = issued - k;
        dl__rec_entry_t *e = &tmp[n];
        if (read_entry(&r->ring[seq & (DL__REC_CAPACITY - 1)], e) && e->seq == seq) {
            started = true;
            n++;
            continue;
        }
        if (started)
            break;
        memset(e, 0, sizeof(*e));
        e->seq = seq;
        e->h.op = DL_COLL_REC_ALLREDUCE;
        e->h.state = DL_COLL_REC_QUEUED;
        e->root = -1;
        n++;
    }
    for (size_t i = 0; i < n; i++) {
        const dl__rec_entry_t *e = &tmp[n - 1 - i];
        v[i] = (dl_coll_rec_entry_t){
            .seq = e->seq,
            .op = (dl_coll_rec_op_t)e->h.op,
            .state = (dl_coll_rec_state_t)e->h.state,
            .algo = (dl_coll_rec_algo_t)e->h.algo,
            .dtype = (dl_coll_dtype_t)e->h.dtype,
            .bytes = e->bytes,
            .root = e->root,
            .error = e->error,
            .start = conv(&c, e->t_start),
            .end = conv(&c, e->t_end),
        };
    }
    return n;
}

const char *dl_coll_rec_op_name(dl_coll_rec_op_t op)
{
    static const char *names[] = {"none",       "all-reduce",     "broadcast",
                                  "all-gather", "reduce-scatter", "barrier",
                                  "mem-alloc",  "send",           "recv"};
    return (unsigned)op < sizeof(names) / sizeof(names[0]) ? names[op] : "?";
}

const char *dl_coll_rec_state_name(dl_coll_rec_state_t state)
{
    static const char *names[] = {"?", "queued", "running", "done", "failed"};
    return (unsigned)state < sizeof(names) / sizeof(names[0]) ? names[state] : "?";
}

const char *dl_coll_rec_algo_name(dl_coll_rec_algo_t algo)
{
    static const char *names[] = {"",          "local",        "shm-small", "shm-pair",
                                  "shm-slice", "tcp-doubling", "tcp-ring",  "hierarchical"};
    return (unsigned)algo < sizeof(names) / sizeof(names[0]) ? names[algo] : "?";
}
