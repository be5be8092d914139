/* Internals shared between the collective library's files. */
#ifndef DL_COLLECTIVE_INTERNAL_H
#define DL_COLLECTIVE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include "collective.h"
#include "recorder.h"

/* ---- errors ---------------------------------------------------------------------------------- */

/* The first failure of a group; later ones keep the first message (it names the cause, the
 * others are echoes of it). */
typedef struct {
    int code;
    char msg[256];
} dl__coll_err_t;

/* Records code with a printf-style message unless an error is already recorded; returns code. */
int dl__coll_fail(dl__coll_err_t *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- reductions (reduce.c) ------------------------------------------------------------------- */

/* out[i] = a[i] op b[i]; out may equal a or b exactly, never overlap them partly. AVG reduces as
 * SUM; the division happens once at the end (dl__coll_scale). */
void dl__coll_reduce(void *out, const void *a, const void *b, size_t count, dl_coll_dtype_t dtype,
                     dl_coll_op_t op);

/* out = d[0] op d[1] op ... op d[n-1], left to right (the rank order of the d[]). out may be
 * d[0] or d[1] exactly, never a later one nor overlap any partly. */
void dl__coll_fold(void *out, const void *const *d, int n, size_t count, dl_coll_dtype_t dtype,
                   dl_coll_op_t op);

/* buf[i] /= divisor, for AVG. */
void dl__coll_scale(void *buf, size_t count, dl_coll_dtype_t dtype, int divisor);

/* ---- time and sockets (net.c) ---------------------------------------------------------------- */

int64_t dl__coll_now_ms(void);

typedef struct {
    struct sockaddr_storage ss;
    socklen_t len;
} dl__coll_addr_t;

/* "10.0.0.4:41234" or "[::1]:41234". */
void dl__coll_addr_str(const dl__coll_addr_t *a, char *buf, size_t buflen);

/* Resolves host:port (numeric or name) to the first address getaddrinfo gives. */
int dl__coll_resolve(const char *host, int port, dl__coll_addr_t *ret_addr);

/* The local address the kernel would use to reach dst (a UDP connect; nothing is sent). */
int dl__coll_route_addr(const dl__coll_addr_t *dst, dl__coll_addr_t *ret_addr);

/* The address of interface ifname to listen on: prefer (the route's source toward rank 0) when
 * that interface has it, else its first address of prefer's family, else any; link-local IPv6
 * addresses never (they mean nothing on another host). Port 0. -ENODEV: no such interface;
 * -EADDRNOTAVAIL: it has no usable address. The search over list (getifaddrs' form) is pure. */
struct ifaddrs;
int dl__coll_iface_pick(const struct ifaddrs *list, const char *ifname,
                        const dl__coll_addr_t *prefer, dl__coll_addr_t *ret_addr);
int dl__coll_iface_addr(const char *ifname, const dl__coll_addr_t *prefer,
                        dl__coll_addr_t *ret_addr);

/* A nonblocking listening TCP socket bound to addr (port 0: ephemeral). *ret_bound gets the
 * address with the port the kernel picked. */
int dl__coll_listen(const dl__coll_addr_t *addr, int backlog, int *ret_fd,
                    dl__coll_addr_t *ret_bound);

/* Connects to addr, retrying refused or unreachable attempts until deadline_ms (monotonic).
 * Returns a nonblocking, tuned socket in *ret_fd. */
int dl__coll_connect(const dl__coll_addr_t *addr, int64_t deadline_ms, int *ret_fd);

/* Accepts one connection on a nonblocking listener, waiting until deadline_ms. */
int dl__coll_accept(int lfd, int64_t deadline_ms, int *ret_fd);

/* TCP_NODELAY, large buffers, nonblocking, close-on-exec. */
int dl__coll_tune_socket(int fd);

/* Send or receive exactly len bytes on a nonblocking socket, polling until deadline_ms. A peer
 * that closes gives -ECONNRESET. */
int dl__coll_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms);
int dl__coll_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms);

uint64_t dl__coll_hash64(const void *data, size_t len, uint64_t seed);

/* ---- bootstrap (bootstrap.c) ----------------------------------------------------------------- */

/* How ranks find each other before any transport exists: an all-gather of small blobs, through
 * the job's store (DLAUNCH_STORE) under dlaunch, else hosted by rank 0 at MASTER_ADDR:MASTER_PORT
 * (like torch's TCPStore) for a worker started some other way. */
typedef struct dl__coll_boot_s dl__coll_boot_t;
struct dl__coll_boot_s {
    int rank;
    int size;
    /* Every rank passes len bytes; all gets size * len bytes in rank order. len must match. */
    int (*allgather)(dl__coll_boot_t *b, const void *mine, size_t len, void *all, char *err,
                     size_t errlen);
    void (*close)(dl__coll_boot_t *b);
};

#define DL__COLL_BOOT_BLOB_MAX 1024

int dl__coll_boot_tcp_open(const dl_coll_options_t *o, dl__coll_boot_t **ret_boot, char *err,
                           size_t errlen);
/* Through the job's store, o->store (bootstrap-store.c). */
int dl__coll_boot_store_open(const dl_coll_options_t *o, dl__coll_boot_t **ret_boot, char *err,
                             size_t errlen);

/* ---- TCP transport (tcp.c) ------------------------------------------------------------------- */

typedef struct dl__coll_tcp_s dl__coll_tcp_t;

/* Which pairs of an n-rank TCP group the algorithms use: ring neighbours and recursive-doubling
 * partners. Symmetric, so both ends agree on who connects. */
int dl__coll_tcp_needs_link(int n, int a, int b);

/* Connects this member (me of n) to the members it needs. addrs[i] is member i's listener,
 * lfd this member's own listener, ranks[i] member i's global rank (for messages). busy: every
 * rank on this machine has a core, so waits may spin. Takes a copy of what it needs; lfd stays
 * the caller's. */
int dl__coll_tcp_open(int me, int n, const dl__coll_addr_t *addrs, const int *ranks, int lfd,
                      uint64_t job_key, const dl_coll_options_t *o, int busy, dl__coll_err_t *err,
                      dl__coll_tcp_t **ret_tcp);
void dl__coll_tcp_close(dl__coll_tcp_t *t);
/* Shuts every connection down so that peers blocked on this rank fail at once. */
void dl__coll_tcp_abort(dl__coll_tcp_t *t);

/* Which algorithm dl__coll_tcp_allreduce takes (for the flight recorder, and itself). */
dl_coll_rec_algo_t dl__coll_tcp_allreduce_algo(const dl__coll_tcp_t *t, size_t count, size_t esize);
int dl__coll_tcp_allreduce(dl__coll_tcp_t *t, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op);
int dl__coll_tcp_reduce_scatter(dl__coll_tcp_t *t, const void *src, void *dst, size_t recvcount,
                                dl_coll_dtype_t dtype, dl_coll_op_t op);
/* Member i's block is bytes[i] long at offset offs[i] of dst; mine comes from src (or is
 * already in place when src == dst + offs[me]). */
int dl__coll_tcp_allgatherv(dl__coll_tcp_t *t, const void *src, void *dst, const size_t *offs,
                            const size_t *bytes);
int dl__coll_tcp_broadcast(dl__coll_tcp_t *t, void *buf, size_t bytes, int root);
/* The same as dl__coll_tcp_allgatherv in log2(n) exchanges (recursive doubling) instead of n-1,
 * for small blocks; the blocks must lie in member order, back to back. */
int dl__coll_tcp_allgatherv_rd(dl__coll_tcp_t *t, const void *src, void *dst, const size_t *offs,
                               const size_t *bytes);

/* Adds this member's part to the partial result of the members before it, for elements
 * [first, first + count): out = partial op mine, in rank order; partial is NULL for member 0
 * (out = mine). out may be the partial or mine exactly. Returns 0 or a negative errno. */
typedef int (*dl__coll_fold_fn)(void *ctx, const void *partial, void *out, size_t first,
                                size_t count);

/* The all-reduce in rank order: a pipelined chain. Member 0 folds its part of a piece of
 * piece_count elements and sends it to member 1, which folds its own onto it and sends it on;
 * member n-1's result is final and flows back down the chain into every member's dst while
 * later pieces still go up. Every element is folded by every member in turn, 0 first. */
int dl__coll_tcp_chain(dl__coll_tcp_t *t, void *dst, size_t count, dl_coll_dtype_t dtype,
                       size_t piece_count, dl__coll_fold_fn fold, void *ctx);
int dl__coll_tcp_barrier(dl__coll_tcp_t *t);

/* ---- memory the host's ranks read in place (mem.c) ------------------------------------------ */

/* One dl_coll_mem_alloc: this rank's memfd-backed block, and every other host member's block of
 * the same allocation, mapped read-only here (and for writing when asked: dl_coll_mem_peer_rw).
 * Allocations are collective, so their serial numbers agree across ranks. */
typedef struct {
    uint32_t serial;
    char *base;
    size_t len; /* whole pages */
    int fd;
    const char **peer_base; /* per shm member, read-only; NULL for this rank */
    size_t *peer_len;
    struct dl__coll_peer_w_s {
        int32_t pid, fd; /* the member's memfd, in its process */
        dev_t dev;       /* the file peer_base maps, to know it again */
        ino_t ino;
        char *base; /* mapped for writing on demand (dl_coll_mem_peer_rw), NULL until then */
    } * peer_w;     /* per shm member */
} dl__coll_region_t;

typedef struct {
    dl__coll_region_t *v;
    size_t n, cap;
    int members; /* shm members, 1 without shared memory */
    uint32_t next_serial;
} dl__coll_mem_t;

/* The region holding all of [p, p + bytes), or NULL. */
const dl__coll_region_t *dl__coll_mem_find(const dl__coll_mem_t *m, const void *p, size_t bytes);
const dl__coll_region_t *dl__coll_mem_by_serial(const dl__coll_mem_t *m, uint32_t serial);
void dl__coll_mem_release(dl__coll_mem_t *m);

/* ---- ordinary memory adopted on first use (adopt.c) ----------------------------------------- */

/* Serials of adoptions have this bit; dl_coll_mem_alloc's never do. */
#define DL__COLL_ADOPTED 0x80000000u

/* The whole pages of a buffer, now a memfd mapped over them: the peer maps fd through /proc. */
typedef struct {
    char *base;
    size_t len;
    int fd;
    uint32_t serial; /* unique in this process, never reused */
} dl__coll_adoption_t;

/* Finds or makes the adoption of the whole pages inside [p, p + bytes). Returns 0 and fills
 * *ret; 1 when this memory cannot be adopted (why says why: not anonymous memory, no whole
 * page, ...); or a negative errno (why names the step). The fd stays the registry's. */
int dl__coll_adopt(const void *p, size_t bytes, dl__coll_adoption_t *ret, char *why, size_t whylen);

/* ---- shared-memory transport (shm.c) --------------------------------------------------------- */

typedef struct dl__coll_shm_s dl__coll_shm_t;

/* Size of the segment for n ranks with the given chunk. */
size_t dl__coll_shm_segment_size(int n, size_t chunk);

/* The creator (member 0) makes and maps the named segment; the others map it after it exists.
 * Each returns the mapping in *ret_map. */
int dl__coll_shm_create(const char *name, int n, size_t chunk, void **ret_map, dl__coll_err_t *err);
int dl__coll_shm_attach(const char *name, int n, size_t chunk, void **ret_map, dl__coll_err_t *err);

/* Wraps a mapped segment for member me of n; pids[i] is member i's process, ranks[i] its global
 * rank; busy as for TCP. Takes ownership of map. */
int dl__coll_shm_open(void *map, size_t chunk, int me, int n, const int *pids, const int *ranks,
                      const dl_coll_options_t *o, int busy, dl__coll_err_t *err,
                      dl__coll_shm_t **ret_shm);
void dl__coll_shm_close(dl__coll_shm_t *s);
/* Raises the segment's abort flag and wakes every waiter: the host's other ranks fail at once. */
void dl__coll_shm_abort(dl__coll_shm_t *s);

/* Which algorithm dl__coll_shm_allreduce takes (for the flight recorder, and itself). */
dl_coll_rec_algo_t dl__coll_shm_allreduce_algo(const dl__coll_shm_t *s, size_t bytes,
                                               int root_only);
/* root_only: only member 0 gets the result (the first half of a hierarchical all-reduce). */
int dl__coll_shm_allreduce(dl__coll_shm_t *s, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op, int root_only);
int dl__coll_shm_reduce_scatter(dl__coll_shm_t *s, const void *src, void *dst, size_t recvcount,
                                dl_coll_dtype_t dtype, dl_coll_op_t op);
/* Equal blocks of bytes each; src may be dst + me * bytes. root_only: only member 0 collects. */
int dl__coll_shm_allgather(dl__coll_shm_t *s, const void *src, void *dst, size_t bytes,
                           int root_only);
int dl__coll_shm_broadcast(dl__coll_shm_t *s, void *buf, size_t bytes, int root);
int dl__coll_shm_barrier(dl__coll_shm_t *s);
/* The two-member all-reduce reads the other's input in place when both inputs lie in
 * dl_coll_mem_alloc blocks or in ordinary memory adopted on first use (adopt.c); mem is the
 * group's table, consulted on each call. */
void dl__coll_shm_use_mem(dl__coll_shm_t *s, const dl__coll_mem_t *mem);
/* This rank's index among the members, and member j's global rank. */
int dl__coll_shm_member(const dl__coll_shm_t *s);
int dl__coll_shm_member_rank(const dl__coll_shm_t *s, int j);
/* How many all-reduces read the other member's input in place (for tests). NULL gives 0. */
uint64_t dl__coll_shm_in_place_calls(const dl__coll_shm_t *s);
/* How many of them waited for the other's verdict on an adoption (for tests). NULL gives 0. */
uint64_t dl__coll_shm_verdict_rounds(const dl__coll_shm_t *s);
/* The last round of the last collective operation other than a barrier (for tests). NULL
 * gives 0. */
uint32_t dl__coll_shm_slot_round(const dl__coll_shm_t *s);
/* Why all-reduces from ordinary memory went through the segment after all ("" if they never
 * did for a reason worth saying); said once on stderr too. */
const char *dl__coll_shm_note(const dl__coll_shm_t *s);

/* ---- the flight recorder (recorder.c) ------------------------------------------------------- */

/* The caller's thread writes the entries of the operations it runs itself and the header's
 * `issued`; the communication thread writes the entries of asynchronous all-reduces. Synchronous
 * operations run only once the queue has drained, so no entry ever has two writers. */
typedef struct {
    dl__rec_header_t *hdr; /* NULL: the recorder is off */
    dl__rec_entry_t *ring;
    size_t len;
    int fd;       /* the file, held with flock so that no other group writes it; or -1 */
    int mem_fd;   /* the memfd holding the ring when the file could not (a full disk); or -1 */
    uint64_t seq; /* the newest operation issued; the caller's thread only */
    size_t timed; /* operations of this many bytes or more are timed */
} dl__coll_rec_t;

/* Sets the ring up as o->recorder asks: in the file o->recorder_path (created if need be) or in
 * private memory. A file that cannot be had (another group holds it) falls back to private
 * memory; one whose blocks cannot be reserved (a full disk) to a memfd that the agent finds
 * among this process's files: the recorder never makes a group fail, and never faults. */
void dl__coll_rec_open(dl__coll_rec_t *rec, const dl_coll_options_t *o, int rank, int world,
                       const char *transport);
void dl__coll_rec_close(dl__coll_rec_t *rec);

static inline uint64_t dl__coll_rec_tick(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* The entry's writer is a sequence lock, in as few stores as the layout allows: the version
 * (odd: changing) shares its 8-byte word with the operation's kind and state, so one store opens
 * the entry and says what it is. On x86 the fences cost nothing but the compiler's ordering. */
static inline void dl__coll_rec_open_entry(dl__rec_entry_t *e, dl__rec_head_t h)
{
    __atomic_store_n(&e->h.word, h.word, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* Whole words both ways: a narrower store under the next wider load would keep the processor
 * from forwarding it (measured: 4.6 ns an operation became 8.5). */
static inline void dl__coll_rec_close_entry(dl__rec_entry_t *e, dl__rec_head_t h)
{
    h.ver++;
    __atomic_store_n(&e->h.word, h.word, __ATOMIC_RELEASE);
}

/* A new operation's sequence number (0 when the recorder is off). For an asynchronous one the
 * communication thread fills its entry with dl__coll_rec_start. */
static inline uint64_t dl__coll_rec_issue(dl__coll_rec_t *rec)
{
    if (rec->hdr == NULL)
        return 0;
    uint64_t seq = ++rec->seq;
    __atomic_store_n(&rec->hdr->issued, seq, __ATOMIC_RELEASE);
    return seq;
}

static inline void dl__coll_rec_start(dl__coll_rec_t *rec, uint64_t seq, dl_coll_rec_op_t op,
                                      size_t bytes, dl_coll_rec_algo_t algo, dl_coll_dtype_t dtype,
                                      int root)
{
    if (seq == 0)
        return;
    dl__rec_entry_t *e = &rec->ring[seq & (DL__REC_CAPACITY - 1)];
    dl__rec_head_t h;
    dl__rec_head_t was;
    was.word = __atomic_load_n(&e->h.word, __ATOMIC_RELAXED);
    h.word = 0;
    h.ver = was.ver + 1;
    h.op = (uint8_t)op;
    h.state = DL_COLL_REC_RUNNING;
    h.algo = (uint8_t)algo;
    h.dtype = (uint8_t)dtype;
    dl__coll_rec_open_entry(e, h);
    e->seq = seq;
    e->bytes = bytes;
    /* One read of the time-stamp counter costs 11 ns on the build VM, 1% of a 4 KiB all-reduce
     * there: small operations go untimed unless asked (DLAUNCH_COLL_RECORDER_TIMED). */
    e->t_start = bytes >= rec->timed ? dl__coll_rec_tick() : 0;
    e->t_end = 0;
    union {
        struct {
            int32_t error, root;
        };
        uint64_t word;
    } er = {{0, root}}; /* both in one store, whatever the byte order */
    e->error_root = er.word;
    dl__coll_rec_close_entry(e, h);
}

/* issue + start, for an operation the caller's thread runs now. */
static inline uint64_t dl__coll_rec_begin(dl__coll_rec_t *rec, dl_coll_rec_op_t op, size_t bytes,
                                          dl_coll_rec_algo_t algo, dl_coll_dtype_t dtype, int root)
{
    uint64_t seq = dl__coll_rec_issue(rec);
    dl__coll_rec_start(rec, seq, op, bytes, algo, dtype, root);
    return seq;
}

static inline void dl__coll_rec_end(dl__coll_rec_t *rec, uint64_t seq, int result)
{
    if (seq == 0)
        return;
    dl__rec_entry_t *e = &rec->ring[seq & (DL__REC_CAPACITY - 1)];
    dl__rec_head_t h;
    h.word = __atomic_load_n(&e->h.word, __ATOMIC_RELAXED);
    h.ver++;
    h.state = result < 0 ? DL_COLL_REC_FAILED : DL_COLL_REC_DONE;
    dl__coll_rec_open_entry(e, h);
    if (e->t_start != 0)
        e->t_end = dl__coll_rec_tick();
    if (result < 0)
        e->error = result;
    dl__coll_rec_close_entry(e, h);
}

/* ---- the group (group.c, async.c) ----------------------------------------------------------- */

struct dl_coll_group_s {
    dl_coll_options_t opts;
    int rank, size;
    /* Topology: hosts numbered by their lowest rank, members of a host by rank. */
    int nhosts, host, local_rank, local_size;
    int busy;                /* no more ranks on this machine than cores: waits may spin */
    int *host_of, *local_of; /* per rank */
    int *host_leader;        /* per host: its lowest rank */
    int *host_sizes;         /* per host */
    int *host_start;         /* per host + 1: where its ranks start in host_order */
    int *host_order;         /* ranks, host by host */
    dl__coll_shm_t *shm;     /* NULL when alone on the host */
    dl__coll_tcp_t *tcp;     /* host leaders only, when there are several hosts */
    dl__coll_err_t err;
    dl__coll_mem_t mem; /* dl_coll_mem_alloc's blocks */
    dl__coll_rec_t rec; /* the flight recorder */
    char *scratch;      /* hierarchical all-gather and reduce-scatter; grown, never shrunk */
    size_t scratch_cap;
    int hosts_in_rank_order; /* every host's ranks consecutive, hosts in rank order */
    char *order_buf;         /* order.c's gathered inputs; grown, never shrunk */
    size_t order_cap;
    const void **order_ptrs; /* per rank */
    size_t *order_offs;      /* per host, twice */
    /* The communication thread and its queue, guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int async_ok, thread_started, stopping, pending;
    dl_coll_request_t *head, *tail;
    /* dl_coll_group_abort, from any thread: set once, read by the failure path. */
    int aborted;
    char abort_why[200];
};

/* The all-reduce itself, on the calling thread (the comm thread's work too). */
int dl__coll_run_allreduce(dl_coll_group_t *g, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op);

/* The all-reduce of a group over several hosts in rank order (order.c); AVG left as a sum. */
int dl__coll_allreduce_hosts(dl_coll_group_t *g, const void *src, void *dst, size_t count,
                             dl_coll_dtype_t dtype, dl_coll_op_t op);
/* The all-reduce's algorithm, for the flight recorder. */
dl_coll_rec_algo_t dl__coll_allreduce_algo(const dl_coll_group_t *g, size_t count,
                                           dl_coll_dtype_t dtype);

/* What every operation does with its result: a failure breaks the group and aborts the peers. */
int dl__coll_broken(dl_coll_group_t *g, int r);

int dl__coll_async_init(dl_coll_group_t *g);
/* Finishes queued operations and joins the thread. */
void dl__coll_async_shutdown(dl_coll_group_t *g);
/* Returns once no asynchronous operation is queued or running, so a synchronous one that runs on
 * the caller's thread next keeps the issue order. */
void dl__coll_drain(dl_coll_group_t *g);

/* ---- options (options.c) --------------------------------------------------------------------- */

const char *dl__coll_transport_str(dl_coll_transport_t t);
const char *dl__coll_algo_str(dl_coll_algo_t a);

#endif
