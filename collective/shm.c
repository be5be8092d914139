/* The shared-memory transport between the ranks of one host.
 *
 * One segment per host: a header, a control block per member, and two slots of `chunk` bytes
 * per member (double buffering: round k uses slot k % 2). Operations run in rounds, numbered
 * the same way on every member. In a round a member copies its part into its slot and bumps its
 * `arrive` counter, waits for the others' counters, reads what it needs straight out of their
 * slots, and bumps `depart` when it no longer reads anything of that round. A member writes its
 * slot of round k only once every member has departed round k-2, so slots are reused without
 * locks, and a slow member is never overwritten.
 *
 * Large all-reduce: with two members each reduces everything (see allreduce_pair); with more,
 * each member reduces one slice of the round's chunk over every member's slot
 * in rank order, publishes it (`mid`), and copies the other slices out of their owners' slots.
 * Each element is reduced once, in rank order, so every member gets the same bits, and they
 * equal a serial sum over ranks 0..n-1. Small all-reduce needs one synchronization only: every
 * member reduces the whole message over all slots, in rank order, so the bits match again.
 *
 * Waiting spins briefly on the counter (a round trip between cores costs well under a
 * microsecond), then sleeps on it with futex in slices; between slices it checks the abort flag,
 * the timeout, and whether the member it waits for is still alive (pidfd, else kill(pid, 0)).
 * A member that fails raises the abort flag and wakes everyone. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define SEG_MAGIC 0x444c434d53484d31ull /* "DLCMSHM1" */
#define LINE 128                        /* a cache line pair: the prefetcher pulls two */
#define HDR_BYTES 4096
#define SLICE_MS 20            /* futex sleep between liveness checks */
#define PIECE_BYTES (64 << 10) /* the large all-reduce's private reduce buffer: fits L2 */
/* Both buffers shared on both members: from here each reduces half (A/B, 2 members, 16 MiB:
 * 11.0-13.3 GB/s against 11.7-14.8 for the whole; 32 to 256 MiB: better in 12 of 16 pairs). */
#define SLICED_BYTES (32u << 20)
/* Two members' all-reduce goes through one slot round up to here, the pair form beyond. 8 KiB to
 * 512 KiB, pair over one round: registered buffers 3-4x (read in place), malloc'd ones equal at
 * 8 KiB under load and 1.1-1.6x from 16 KiB (docs/performance.md, issue #27). */
#define PAIR_MIN (4u << 10)
/* Two members' one-round all-reduce copies in halves from here (below, 1 KiB: no faster). */
#define HALVES_MIN (2u << 10)

typedef struct {
    _Atomic uint64_t magic;
    uint32_t n;
    uint32_t pad;
    uint64_t chunk;
    char pad2[LINE - 24];
    _Atomic uint32_t abort; /* its own line: read on every spin, written once */
} seg_hdr_t;

typedef struct {
    _Atomic uint32_t arrive;
    _Atomic uint32_t mid;
    _Atomic uint32_t depart;
    _Atomic uint32_t waiters; /* members sleeping on one of this member's counters */
    /* Where round k's buffers lie, in [k & 1], written before arrive(k), of the input [0] and the
     * output [1]: the serial of the dl_coll_mem_alloc allocation or adoption (adopt.c) holding
     * them (0: neither), the buffer's offset from the block's start (negative when an adoption
     * starts at the buffer's first whole page), the block's length, and an adoption's memfd,
     * which the other member maps through /proc. */
    uint32_t buf_serial[2][2];
    int32_t buf_fd[2][2];
    int64_t buf_off[2][2];
    uint64_t buf_len[2][2];
    uint32_t verdict[2]; /* round k: which of the other's buffers this member mapped (bit i) */
    /* Round k, written with the announcement: the other member's adoption this member has mapped
     * and keeps mapped through the round (0: none). Where each holds what the other announces,
     * both know the verdicts already and skip that round. */
    uint32_t held[2];
} ctl_t;

_Static_assert(sizeof(ctl_t) == LINE, "a member's control block is one line pair");

/* The other member's adopted blocks mapped here, by serial, the least recently used unmapped first
 * (a block whose buffer its owner freed lives on until then): as many as it may adopt, so that a
 * loop over a few dozen buffers maps each once, but beyond PEER_MAPS_FEW only while all of them
 * together stay under PEER_MAP_BYTES. */
#define PEER_MAPS 64
#define PEER_MAPS_FEW 8
#define PEER_MAP_BYTES ((size_t)256 << 20)
typedef struct {
    uint32_t serial;
    const char *base;
    size_t len;
    uint64_t used;
} peer_map_t;

struct dl__coll_shm_s {
    int me, n;
    size_t chunk;
    char *map;
    size_t map_len;
    seg_hdr_t *hdr;
    ctl_t *ctl;
    char *data;
    uint32_t round;
    /* The last round of the last collective operation other than a barrier (the slots of
     * in-place forms may have carried nothing, alike on every member): the pair form starts
     * on the other slot than that round's (turn_slot). */
    uint32_t slot_round;
    uint32_t *known_depart; /* the highest depart seen of each member, to skip rereads */
    const char **ptrs;      /* scratch: one input pointer per member */
    char *piece;            /* PIECE_BYTES, private */
    int *pidfd;             /* -1 where pidfd_open is unavailable: kill(pid, 0) instead */
    int *pids, *ranks;
    const dl__coll_mem_t *mem; /* the group's dl_coll_mem_alloc blocks, or NULL */
    uint64_t in_place;         /* all-reduces that read the other's input where it lies */
    size_t adopt_min;          /* adopt ordinary buffers from this size (0: never) */
    peer_map_t pmap[PEER_MAPS];
    uint64_t pmap_clock;
    uint32_t held;     /* the pmap entry announced as held: never the one evicted */
    uint64_t verdicts; /* verdict rounds run (for tests) */
    char note[256];    /* why ordinary buffers were copied after all; said once */
    int timeout_ms;
    int64_t spin_ns;
    int yield_spins;
    size_t small, small_root; /* the latency form up to this size; to a root */
    dl_coll_algo_t algo;
    dl__coll_err_t *err;
};

static int ge(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b) >= 0;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

size_t dl__coll_shm_segment_size(int n, size_t chunk)
{
    size_t ctl = ((size_t)n * sizeof(ctl_t) + 4095) / 4096 * 4096;
    return HDR_BYTES + ctl + (size_t)n * 2 * chunk;
}

static char *slot(const dl__coll_shm_t *s, int j, uint32_t k)
{
    return s->data + ((size_t)j * 2 + (k & 1)) * s->chunk;
}

/* ---- waiting and posting --------------------------------------------------------------------- */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void post(dl__coll_shm_t *s, _Atomic uint32_t *word, uint32_t k)
{
    atomic_store_explicit(word, k, memory_order_seq_cst);
    /* Pairs with the waiter's increment-then-recheck: either it sees k, or we see it waiting. */
    if (atomic_load_explicit(&s->ctl[s->me].waiters, memory_order_seq_cst) != 0)
        futex(word, FUTEX_WAKE, INT_MAX, NULL);
}

static int peer_alive(const dl__coll_shm_t *s, int j)
{
    if (s->pidfd[j] >= 0) {
        struct pollfd p = {.fd = s->pidfd[j], .events = POLLIN};
        return poll(&p, 1, 0) == 0;
    }
    return kill(s->pids[j], 0) == 0 || errno != ESRCH;
}

static int aborted(const dl__coll_shm_t *s)
{
    return atomic_load_explicit(&s->hdr->abort, memory_order_relaxed) != 0;
}

static int abort_fail(dl__coll_shm_t *s)
{
    return dl__coll_fail(s->err, -ECONNABORTED,
                         "shm: another rank on this host failed and aborted the group");
}

/* Waits until member j's counter `word` reaches k. */
/* Spins until *word reaches k: 1 once it has, 0 when spin_ns ran out first, or the abort's
 * error. The clock is read only once the spin has gone on a while. */
static int spin_for(dl__coll_shm_t *s, _Atomic uint32_t *word, uint32_t k)
{
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (ge(atomic_load_explicit(word, memory_order_acquire), k))
            return 1;
        cpu_relax();
        if ((i & 63) == 0) {
            if (aborted(s))
                return abort_fail(s);
            if (t0 == 0)
                t0 = now_ns();
            else if (now_ns() - t0 > s->spin_ns)
                return 0;
        }
    }
}

static int wait_for(dl__coll_shm_t *s, int j, _Atomic uint32_t *word, uint32_t k, const char *what)
{
    int r = spin_for(s, word, k);
    if (r != 0)
        return r < 0 ? r : 0;
    for (int i = 0; i < s->yield_spins; i++) {
        sched_yield();
        if (ge(atomic_load_explicit(word, memory_order_acquire), k))
            return 0;
    }
    int64_t deadline = dl__coll_now_ms() + s->timeout_ms;
    _Atomic uint32_t *waiters = &s->ctl[j].waiters;
    for (;;) {
        atomic_fetch_add_explicit(waiters, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(word, memory_order_seq_cst);
        if (!ge(v, k) && !aborted(s)) {
            struct timespec ts = {0, SLICE_MS * 1000000L};
            futex(word, FUTEX_WAIT, v, &ts);
        }
        atomic_fetch_sub_explicit(waiters, 1, memory_order_seq_cst);
        if (ge(atomic_load_explicit(word, memory_order_acquire), k))
            return 0;
        if (aborted(s))
            return abort_fail(s);
        if (!peer_alive(s, j))
            return dl__coll_fail(s->err, -ECONNRESET,
                                 "shm: rank %d (pid %d) on this host died while this rank "
                                 "waited for its %s",
                                 s->ranks[j], s->pids[j], what);
        if (dl__coll_now_ms() >= deadline)
            return dl__coll_fail(s->err, -ETIMEDOUT,
                                 "shm: rank %d (pid %d) on this host made no progress for %d ms "
                                 "(waiting for its %s)",
                                 s->ranks[j], s->pids[j], s->timeout_ms, what);
    }
}

/* Before writing round k's slot: every member must be done with round k-2. */
static int wait_slot_free(dl__coll_shm_t *s, uint32_t k)
{
    for (int j = 0; j < s->n; j++) {
        if (j == s->me || ge(s->known_depart[j], k - 2))
            continue;
        int r = wait_for(s, j, &s->ctl[j].depart, k - 2, "departure");
        if (r < 0)
            return r;
        s->known_depart[j] = atomic_load_explicit(&s->ctl[j].depart, memory_order_relaxed);
    }
    return 0;
}

static int wait_arrive(dl__coll_shm_t *s, int j, uint32_t k)
{
    int r = wait_for(s, j, &s->ctl[j].arrive, k, "data");
    if (r < 0)
        return r;
    /* A member arrives at k only after departing k-2 (the pipelined all-reduce arrives at k while
     * it still reads k-1), and usually k-1 too. Its depart shares the line just read: taken now,
     * the next round's wait_slot_free need not fetch that line again from the other core, after
     * the member has written it once more (a fifth of a bare round: 0.20-0.23 us against
     * 0.27-0.31, docs/performance.md). Acquire: what it read of that round comes before our
     * writes into the slots it read. */
    uint32_t d = atomic_load_explicit(&s->ctl[j].depart, memory_order_acquire);
    if (!ge(d, k - 2))
        d = k - 2;
    if (ge(d, s->known_depart[j]))
        s->known_depart[j] = d;
    return 0;
}

static int wait_all_arrive(dl__coll_shm_t *s, uint32_t k)
{
    for (int j = 0; j < s->n; j++) {
        if (j == s->me)
            continue;
        int r = wait_arrive(s, j, k);
        if (r < 0)
            return r;
    }
    return 0;
}

void dl__coll_shm_abort(dl__coll_shm_t *s)
{
    if (s == NULL)
        return;
    atomic_store_explicit(&s->hdr->abort, 1, memory_order_seq_cst);
    for (int j = 0; j < s->n; j++) {
        futex(&s->ctl[j].arrive, FUTEX_WAKE, INT_MAX, NULL);
        futex(&s->ctl[j].mid, FUTEX_WAKE, INT_MAX, NULL);
        futex(&s->ctl[j].depart, FUTEX_WAKE, INT_MAX, NULL);
    }
}

static int begin(dl__coll_shm_t *s)
{
    return aborted(s) ? abort_fail(s) : 0;
}

/* ---- slicing --------------------------------------------------------------------------------- */

/* Member i's share of count elements: [lo, hi). */
static void slice(size_t count, int n, int i, size_t *lo, size_t *hi)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *lo = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
    *hi = *lo + base + ((size_t)i < extra ? 1 : 0);
}

/* out = d[0] op d[1] op ... op d[n-1], left to right. */
static void reduce_all(char *out, const char *const *d, int n, size_t count, dl_coll_dtype_t dtype,
                       dl_coll_op_t op)
{
    if (n == 1) {
        if (out != d[0])
            memcpy(out, d[0], count * dl_coll_dtype_size(dtype));
        return;
    }
    dl__coll_reduce(out, d[0], d[1], count, dtype, op);
    for (int j = 2; j < n; j++)
        dl__coll_reduce(out, out, d[j], count, dtype, op);
}

/* ---- all-reduce ------------------------------------------------------------------------------ */

/* Until member j's first half of round k is in its slot (or all of it): spins on its `mid`, which
 * the halves form sets with a plain store and wakes nobody for, so where the spin runs out the
 * wait goes on for `arrive`, whose post wakes a sleeper. */
static int wait_first_half(dl__coll_shm_t *s, int j, uint32_t k)
{
    int r = spin_for(s, &s->ctl[j].mid, k);
    if (r != 0)
        return r < 0 ? r : 0;
    return wait_arrive(s, j, k);
}

static int allreduce_small(dl__coll_shm_t *s, const char *src, char *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op, int root_only)
{
    size_t esize = dl_coll_dtype_size(dtype), bytes = count * esize;
    uint32_t k = ++s->round;
    const char **d = s->ptrs;
    int r = wait_slot_free(s, k);
    if (r < 0)
        return r;
    char *mine = slot(s, s->me, k);
    if (s->n == 2 && !root_only && bytes >= HALVES_MIN) {
        /* Two members: the copy in halves, the first published alone, so that the other reads
         * it while the second still takes its lines back from the other core (which read them
         * two rounds ago): 4 KiB with fresh inputs 1.09-1.23 us against 1.32-1.66 malloc'd,
         * 1.18-1.26 against 1.28-1.45 registered (docs/performance.md). Each member reads its
         * own input where it lies. */
        int me = s->me, peer = 1 - me;
        size_t h = count / 2 * esize;
        memcpy(mine, src, h);
        atomic_store_explicit(&s->ctl[me].mid, k, memory_order_release);
        memcpy(mine + h, src + h, bytes - h);
        post(s, &s->ctl[me].arrive, k);
        r = wait_first_half(s, peer, k);
        for (int half = 0; half < 2 && r == 0; half++) {
            size_t lo = half == 0 ? 0 : h, n = half == 0 ? count / 2 : count - count / 2;
            d[me] = src + lo;
            d[peer] = slot(s, peer, k) + lo;
            reduce_all(dst + lo, d, 2, n, dtype, op);
            if (half == 0)
                r = wait_arrive(s, peer, k);
        }
        if (r == 0)
            post(s, &s->ctl[me].depart, k);
        return r;
    }
    memcpy(mine, src, bytes);
    post(s, &s->ctl[s->me].arrive, k);
    if (!root_only || s->me == 0) {
        r = wait_all_arrive(s, k);
        if (r < 0)
            return r;
        for (int j = 0; j < s->n; j++)
            d[j] = slot(s, j, k);
        reduce_all(dst, d, s->n, count, dtype, op);
    }
    post(s, &s->ctl[s->me].depart, k);
    return 0;
}

/* Copies everything but my slice of the round starting at element base into my slot. */
static void copy_in(dl__coll_shm_t *s, const char *src, size_t base, size_t count, size_t esize,
                    uint32_t k)
{
    size_t per_round = s->chunk / esize, lo, hi;
    size_t len = count - base < per_round ? count - base : per_round;
    char *mine = slot(s, s->me, k);
    for (int j = 0; j < s->n; j++) {
        slice(len, s->n, j, &lo, &hi);
        if (j != s->me && hi > lo)
            memcpy(mine + lo * esize, src + (base + lo) * esize, (hi - lo) * esize);
    }
}

/* My slice [lo, hi) of round k, over every member in rank order, to my slot (from where the
 * others copy it) and to out (NULL: not wanted). It goes through a small private buffer a piece
 * at a time: reducing straight into the slot stores into lines the other members hold (they
 * copied them out two rounds ago) and pays a read for ownership of each, which copying a cached
 * piece avoids (64 MiB, 2 ranks: 6.3-7.2 GB/s against 5.8 in A/B runs). */
static void reduce_slice(dl__coll_shm_t *s, const char *in, uint32_t k, size_t lo, size_t hi,
                         char *out, dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t esize = dl_coll_dtype_size(dtype), per = PIECE_BYTES / esize;
    const char **d = s->ptrs;
    char *mine = slot(s, s->me, k);
    for (size_t a = lo; a < hi; a += per) {
        size_t m = hi - a < per ? hi - a : per;
        for (int j = 0; j < s->n; j++)
            d[j] = (j == s->me ? in : slot(s, j, k)) + a * esize;
        reduce_all(s->piece, d, s->n, m, dtype, op);
        memcpy(mine + a * esize, s->piece, m * esize);
        if (out != NULL)
            memcpy(out + a * esize, s->piece, m * esize);
    }
}

/* Software-pipelined: the next round's data goes into the other slot right after my slice of
 * this one is published, once every member has left the round before (the last reader of that
 * slot), so a member has work to do while the others catch up. */
static int allreduce_large(dl__coll_shm_t *s, const char *src, char *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op, int root_only)
{
    size_t esize = dl_coll_dtype_size(dtype);
    size_t per_round = s->chunk / esize;
    int me = s->me, n = s->n;
    int collect = !root_only || me == 0;
    uint32_t k = s->round + 1;
    int r = wait_slot_free(s, k);
    if (r < 0)
        return r;
    copy_in(s, src, 0, count, esize, k);
    post(s, &s->ctl[me].arrive, k);
    for (size_t base = 0; base < count; base += per_round, k++) {
        size_t len = count - base < per_round ? count - base : per_round;
        const char *in = src + base * esize;
        char *out = dst + base * esize;
        size_t lo, hi;
        s->round = k;
        r = wait_all_arrive(s, k);
        if (r < 0)
            return r;
        /* My slice goes to my own slot (nobody reads it during this phase). */
        slice(len, n, me, &lo, &hi);
        reduce_slice(s, in, k, lo, hi, collect ? out : NULL, dtype, op);
        post(s, &s->ctl[me].mid, k);
        if (base + per_round < count) {
            r = wait_slot_free(s, k + 1);
            if (r < 0)
                return r;
            copy_in(s, src, base + per_round, count, esize, k + 1);
            post(s, &s->ctl[me].arrive, k + 1);
        }
        for (int j = 0; j < n && collect; j++) {
            if (j == me)
                continue;
            r = wait_for(s, j, &s->ctl[j].mid, k, "reduced slice");
            if (r < 0)
                return r;
            slice(len, n, j, &lo, &hi);
            memcpy(out + lo * esize, slot(s, j, k) + lo * esize, (hi - lo) * esize);
        }
        post(s, &s->ctl[me].depart, k);
    }
    return 0;
}

/* Says once, on stderr, why ordinary buffers go through the segment after all (a library that
 * falls back to the slow path must not do it silently), and keeps it for dl__coll_shm_note. */
static void note(dl__coll_shm_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(dl__coll_shm_t *s, const char *fmt, ...)
{
    if (s->note[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->note, sizeof(s->note), fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "dlaunch-collective: rank %d: all-reduces from ordinary memory copy through the "
            "shared segment: %s\n",
            s->ranks[s->me], s->note);
}

/* Says where my input and output for round k lie, for the other member to read in place: in a
 * dl_coll_mem_alloc block, or in ordinary memory adopted now (the input from adopt_min bytes;
 * the output too when the halves form may use it). */
static void announce(dl__coll_shm_t *s, uint32_t k, const char *src, const char *dst, size_t bytes)
{
    const char *bufs[2] = {src, dst};
    ctl_t *c = &s->ctl[s->me];
    /* An output over its input takes the halves form, whose partial pages cost a round each: it
     * reads an adopted buffer in place only for a chunk or more (plan_in_place), so below that
     * adopting it would only add the announcement round to the copy. */
    size_t in_place_min = s->chunk + 2 * (size_t)sysconf(_SC_PAGESIZE);
    /* Partly overlapping buffers are the caller's error; never read them in place. */
    int tangled = src != dst && dst < src + bytes && src < dst + bytes;
    for (int i = 0; i < 2; i++) {
        const dl__coll_region_t *reg =
            s->mem == NULL || tangled ? NULL : dl__coll_mem_find(s->mem, bufs[i], bytes);
        uint32_t serial = 0;
        int32_t fd = -1;
        int64_t off = 0;
        uint64_t len = 0;
        if (reg != NULL) {
            serial = reg->serial;
            off = bufs[i] - reg->base;
            len = reg->len;
        } else if (i == 1 && src == dst) {
            serial = c->buf_serial[k & 1][0];
            fd = c->buf_fd[k & 1][0];
            off = c->buf_off[k & 1][0];
            len = c->buf_len[k & 1][0];
        } else if (!tangled && s->adopt_min != 0 && bytes >= s->adopt_min &&
                   (i == 0 || bytes >= SLICED_BYTES) && (src != dst || bytes >= in_place_min)) {
            dl__coll_adoption_t ad;
            char why[200];
            int r = dl__coll_adopt(bufs[i], bytes, &ad, why, sizeof(why));
            if (r == 0) {
                serial = ad.serial;
                fd = ad.fd;
                off = (int64_t)((uintptr_t)bufs[i] - (uintptr_t)ad.base);
                len = ad.len;
            } else {
                note(s, "this rank's %s of %zu bytes cannot be shared: %s",
                     i == 0 ? "input" : "output", bytes, why);
            }
        }
        c->buf_serial[k & 1][i] = serial;
        c->buf_fd[k & 1][i] = fd;
        c->buf_off[k & 1][i] = off;
        c->buf_len[k & 1][i] = len;
    }
    c->held[k & 1] = s->held;
}

/* Whether member j announced its output over its input for round k. */
static int announced_over(const dl__coll_shm_t *s, int j, uint32_t k)
{
    const ctl_t *c = &s->ctl[j];
    return c->buf_serial[k & 1][0] != 0 && c->buf_serial[k & 1][0] == c->buf_serial[k & 1][1] &&
           c->buf_off[k & 1][0] == c->buf_off[k & 1][1];
}

/* Unmaps the least recently used block but the held one and keep's; returns its entry, or NULL
 * when there is none. */
static peer_map_t *evict(dl__coll_shm_t *s, uint32_t keep)
{
    peer_map_t *lru = NULL;
    for (int i = 0; i < PEER_MAPS; i++) {
        peer_map_t *m = &s->pmap[i];
        if (m->base != NULL && m->serial != s->held && m->serial != keep &&
            (lru == NULL || m->used < lru->used))
            lru = m;
    }
    if (lru != NULL) {
        munmap((void *)lru->base, lru->len);
        memset(lru, 0, sizeof(*lru));
    }
    return lru;
}

/* The peer's adopted block `serial` (memfd fd in its process, len bytes), mapped here: from the
 * cache, or now. NULL when it cannot be mapped (said once). */
static const char *map_adopted(dl__coll_shm_t *s, int peer, uint32_t serial, int fd, size_t len)
{
    peer_map_t *to = NULL;
    for (int i = 0; i < PEER_MAPS; i++) {
        peer_map_t *m = &s->pmap[i];
        if (m->base != NULL && m->serial == serial && m->len == len) {
            m->used = ++s->pmap_clock;
            return m->base;
        }
        if (m->base == NULL && to == NULL)
            to = m;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", s->pids[peer], fd);
    int pfd = open(path, O_RDONLY | O_CLOEXEC);
    if (pfd < 0) {
        note(s, "opening rank %d's buffer (%s): %s", s->ranks[peer], path, strerror(errno));
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, pfd, 0);
    int e = errno;
    close(pfd);
    if (p == MAP_FAILED) {
        note(s, "mapping rank %d's buffer (%s, %zu bytes): %s", s->ranks[peer], path, len,
             strerror(e));
        return NULL;
    }
    if (to == NULL)
        to = evict(s, 0);
    if (to == NULL) { /* not reached: at most one entry is held */
        munmap(p, len);
        return NULL;
    }
    *to = (peer_map_t){.serial = serial, .base = p, .len = len, .used = ++s->pmap_clock};
    for (;;) {
        size_t n = 0, total = 0;
        for (int i = 0; i < PEER_MAPS; i++)
            if (s->pmap[i].base != NULL) {
                n++;
                total += s->pmap[i].len;
            }
        if (n <= PEER_MAPS_FEW || total <= PEER_MAP_BYTES || evict(s, serial) == NULL)
            break;
    }
    return p;
}

/* The start of the other member's block holding its buffer i (0 input, 1 output) of round k, as
 * mapped here; NULL when it announced none or it cannot be mapped here. */
static int peer_block(dl__coll_shm_t *s, int peer, uint32_t k, int i, size_t bytes,
                      const char **ret)
{
    const ctl_t *c = &s->ctl[peer];
    uint32_t serial = c->buf_serial[k & 1][i];
    int64_t off = c->buf_off[k & 1][i];
    uint64_t len = c->buf_len[k & 1][i];
    *ret = NULL;
    if (serial == 0)
        return 0;
    if (serial & DL__COLL_ADOPTED) {
        /* An adoption holds the buffer's whole pages, or more (an earlier buffer's); the
         * buffer must overlap it. */
        if (len == 0 || len > ((uint64_t)1 << 62) || off >= (int64_t)len || off <= -(int64_t)bytes)
            return dl__coll_fail(s->err, -EPROTO,
                                 "shm: rank %d announced a buffer outside its "
                                 "adopted block",
                                 s->ranks[peer]);
        *ret = map_adopted(s, peer, serial, c->buf_fd[k & 1][i], (size_t)len);
        return 0;
    }
    const dl__coll_region_t *reg = s->mem != NULL ? dl__coll_mem_by_serial(s->mem, serial) : NULL;
    if (reg == NULL || reg->peer_base == NULL || reg->peer_base[peer] == NULL || off < 0 ||
        (uint64_t)off > reg->peer_len[peer] || bytes > reg->peer_len[peer] - (uint64_t)off)
        return dl__coll_fail(s->err, -EPROTO,
                             "shm: rank %d announced a buffer outside its shared block",
                             s->ranks[peer]);
    *ret = reg->peer_base[peer];
    return 0;
}

/* The elements [lo, hi) of a count-element buffer at off in a block of len bytes that lie in
 * the block. */
static void block_range(int64_t off, uint64_t len, size_t count, size_t es, size_t *lo, size_t *hi)
{
    uint64_t first = off >= 0 ? 0 : ((uint64_t)(-off) + es - 1) / es;
    uint64_t end = (uint64_t)((int64_t)len - off) / es; /* off < len always */
    *lo = (size_t)first;
    *hi = end < count ? (size_t)end : count;
}

enum { FORM_COPY, FORM_WHOLE, FORM_HALVES };

/* How round k runs in place, decided by both members alike from both announcements (and, where
 * an adoption is involved, both verdicts on what each could map): the form, the elements
 * [lo, hi) read in place (the rest goes through the segment), and the other member's buffers at
 * lo as mapped here. */
typedef struct {
    int form;
    size_t lo, hi;
    const char *their_src, *their_dst;
    uint32_t round; /* the round the in-place form synchronizes on */
    uint32_t ann;   /* the announcement's round */
    /* The whole form with both members' ends carried in the announcement round: [lo, hi) is
     * then the other's input read in place, its ends are in its slot (carry_ends). */
    int carried;
} plan_t;

/* Member j's input of round k, where its block holds [*lo, *hi) of it: whether the ends outside
 * went into its slot with the announcement, head then tail (carry_ends). Both members decide it
 * alike from the announcement. */
static int carries_ends(const dl__coll_shm_t *s, int j, uint32_t k, size_t count, size_t es,
                        size_t *lo, size_t *hi)
{
    const ctl_t *c = &s->ctl[j];
    if (c->buf_serial[k & 1][0] == 0)
        return 0;
    block_range(c->buf_off[k & 1][0], c->buf_len[k & 1][0], count, es, lo, hi);
    return *lo <= *hi && (*lo + (count - *hi)) * es <= s->chunk;
}

/* The parts of my input outside the block the other reads in place (under a page at either end
 * of an adopted buffer) go into my slot with the announcement, where they cost no round of their
 * own. */
static void carry_ends(dl__coll_shm_t *s, uint32_t k, const char *src, size_t count, size_t es)
{
    size_t lo, hi;
    if (!carries_ends(s, s->me, k, count, es, &lo, &hi))
        return;
    char *mine = slot(s, s->me, k);
    memcpy(mine, src, lo * es);
    memcpy(mine + lo * es, src + hi * es, (count - hi) * es);
}

/* Whether member a holds mapped every adoption member b announced for round k. */
static int holds_all(const dl__coll_shm_t *s, int a, int b, uint32_t k)
{
    for (int i = 0; i < 2; i++) {
        uint32_t serial = s->ctl[b].buf_serial[k & 1][i];
        if ((serial & DL__COLL_ADOPTED) && serial != s->ctl[a].held[k & 1])
            return 0;
    }
    return 1;
}

static int plan_in_place(dl__coll_shm_t *s, int peer, uint32_t k, size_t count, size_t es,
                         plan_t *p)
{
    int me = s->me;
    size_t bytes = count * es;
    const char *base[2];
    memset(p, 0, sizeof(*p));
    p->round = p->ann = k;
    for (int i = 0; i < 2; i++) {
        int r = peer_block(s, peer, k, i, bytes, &base[i]);
        if (r < 0)
            return r;
    }
    if (base[0] == NULL)
        base[1] = NULL; /* the halves form needs both */
    uint32_t mine = (base[0] != NULL) | (uint32_t)(base[1] != NULL) << 1, theirs = 0;
    int adopted = 0;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 2; i++)
            adopted |= (s->ctl[j].buf_serial[k & 1][i] & DL__COLL_ADOPTED) != 0;
    uint32_t their_in = s->ctl[peer].buf_serial[k & 1][0];
    if ((their_in & DL__COLL_ADOPTED) && base[0] != NULL)
        s->held = their_in; /* announced from the next round on */
    if (adopted && !(holds_all(s, me, peer, k) && holds_all(s, peer, me, k))) {
        /* Whether the other could map mine is known only to it. */
        s->ctl[me].verdict[k & 1] = mine;
        post(s, &s->ctl[me].mid, k);
        int r = wait_for(s, peer, &s->ctl[peer].mid, k, "verdict");
        if (r < 0)
            return r;
        theirs = s->ctl[peer].verdict[k & 1];
        p->round = k + 1;
        s->verdicts++;
    } else {
        /* dl_coll_mem_alloc blocks are mapped by every member of the host; adoptions the other
         * announced it holds it mapped already (and keeps them so this round). */
        theirs = (s->ctl[me].buf_serial[k & 1][0] != 0) |
                 (uint32_t)(s->ctl[me].buf_serial[k & 1][1] != 0) << 1;
    }
    uint32_t both = mine & theirs;
    int over = announced_over(s, me, k) || announced_over(s, peer, k);
    /* An output over its input needs the halves form; apart, the whole form is faster until the
     * message is far larger than the caches. */
    if ((both & 3) == 3 && (over || bytes >= SLICED_BYTES))
        p->form = FORM_HALVES;
    else if ((both & 1) && !over)
        p->form = FORM_WHOLE;
    else
        return 0;
    size_t mlo, mhi, plo, phi;
    if (p->form == FORM_WHOLE && carries_ends(s, me, k, count, es, &mlo, &mhi) &&
        carries_ends(s, peer, k, count, es, &plo, &phi)) {
        p->carried = 1;
        p->lo = plo;
        p->hi = phi;
        p->their_src = base[0] + (s->ctl[peer].buf_off[k & 1][0] + (int64_t)(plo * es));
        return 0;
    }
    int used = p->form == FORM_HALVES ? 2 : 1;
    p->lo = 0;
    p->hi = count;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < used; i++) {
            size_t lo, hi;
            block_range(s->ctl[j].buf_off[k & 1][i], s->ctl[j].buf_len[k & 1][i], count, es, &lo,
                        &hi);
            p->lo = lo > p->lo ? lo : p->lo;
            p->hi = hi < p->hi ? hi : p->hi;
        }
    /* What lies outside the blocks (under a page at either end) goes through the segment, a
     * round each: worth it only for a chunk or more in place. A buffer wholly in place is
     * worth it at any size the pair form takes (registered, 128-512 KiB: docs/performance.md). */
    int ends = p->lo > 0 || p->hi < count;
    if (p->hi <= p->lo || (ends && (p->hi - p->lo) * es < s->chunk)) {
        p->form = FORM_COPY;
        return 0;
    }
    const ctl_t *c = &s->ctl[peer];
    p->their_src = base[0] + (c->buf_off[k & 1][0] + (int64_t)(p->lo * es));
    if (p->form == FORM_HALVES)
        p->their_dst = base[1] + (c->buf_off[k & 1][1] + (int64_t)(p->lo * es));
    return 0;
}

/* Both inputs read where they lie, each member reducing everything into its own output (which
 * must not be its input: the other reads that meanwhile). One pass, then a wait until the other
 * has finished reading mine, since the caller may change it as soon as this returns. */
static int reduce_in_place(dl__coll_shm_t *s, int peer, uint32_t k, const char *src,
                           const char *theirs, char *dst, size_t count, dl_coll_dtype_t dtype,
                           dl_coll_op_t op)
{
    const char **d = s->ptrs;
    d[s->me] = src;
    d[peer] = theirs;
    reduce_all(dst, d, 2, count, dtype, op);
    s->in_place++;
    s->round = k;
    post(s, &s->ctl[s->me].depart, k);
    int r = wait_for(s, peer, &s->ctl[peer].depart, k, "departure");
    if (r == 0)
        s->known_depart[peer] = k;
    return r;
}

/* Inputs and outputs all in shared blocks: each member reduces its half of the message from both
 * inputs into its own output, then copies the other half from the other's output. A quarter less
 * memory traffic than reduce_in_place (64 MiB: 9.4-11.3 against 8.2-10.1 GB/s in alternating
 * runs); works with the output over the input too, since nobody writes a half the other reads. */
static int reduce_sliced_in_place(dl__coll_shm_t *s, int peer, uint32_t k, const char *src,
                                  const char *their_src, char *dst, const char *their_dst,
                                  size_t count, dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype), lo, hi;
    const char **d = s->ptrs;
    slice(count, 2, s->me, &lo, &hi);
    d[s->me] = src + lo * es;
    d[peer] = their_src + lo * es;
    reduce_all(dst + lo * es, d, 2, hi - lo, dtype, op);
    s->in_place++;
    s->round = k;
    post(s, &s->ctl[s->me].mid, k);
    int r = wait_for(s, peer, &s->ctl[peer].mid, k, "reduced half");
    if (r < 0)
        return r;
    slice(count, 2, peer, &lo, &hi);
    memcpy(dst + lo * es, their_dst + lo * es, (hi - lo) * es);
    post(s, &s->ctl[s->me].depart, k);
    r = wait_for(s, peer, &s->ctl[peer].depart, k, "departure");
    if (r == 0)
        s->known_depart[peer] = k;
    return r;
}

/* Copies the chunk of round k, which starts at element base, into my slot and posts it. */
static int send_chunk(dl__coll_shm_t *s, const char *src, size_t base, size_t count, size_t esize,
                      uint32_t k)
{
    size_t per_round = s->chunk / esize;
    size_t len = count - base < per_round ? count - base : per_round;
    int r = wait_slot_free(s, k);
    if (r < 0)
        return r;
    memcpy(slot(s, s->me, k), src + base * esize, len * esize);
    post(s, &s->ctl[s->me].arrive, k);
    return 0;
}

/* Elements [first, first + n) the small way, a chunk a round: the ends of a buffer that lie
 * outside the blocks read in place. */
static int through_segment(dl__coll_shm_t *s, const char *src, char *dst, size_t first, size_t n,
                           dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype), per_round = s->chunk / es;
    for (size_t a = first; a < first + n; a += per_round) {
        size_t m = first + n - a < per_round ? first + n - a : per_round;
        int r = allreduce_small(s, src + a * es, dst + a * es, m, dtype, op, 0);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The whole form with the other's ends in its slot of the announcement round k: head, the
 * middle in place, tail, each element in rank order as everywhere. */
static int reduce_carried(dl__coll_shm_t *s, int peer, const plan_t *p, const char *src, char *dst,
                          size_t count, dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype), lo = p->lo, hi = p->hi;
    const char **d = s->ptrs;
    const char *ends = slot(s, peer, p->ann);
    d[s->me] = src;
    d[peer] = ends;
    reduce_all(dst, d, 2, lo, dtype, op);
    d[s->me] = src + lo * es;
    d[peer] = p->their_src;
    reduce_all(dst + lo * es, d, 2, hi - lo, dtype, op);
    d[s->me] = src + hi * es;
    d[peer] = ends + lo * es;
    reduce_all(dst + hi * es, d, 2, count - hi, dtype, op);
    s->in_place++;
    s->round = p->round;
    post(s, &s->ctl[s->me].depart, p->round);
    int r = wait_for(s, peer, &s->ctl[peer].depart, p->round, "departure");
    if (r == 0)
        s->known_depart[peer] = p->round;
    return r;
}

static int run_in_place(dl__coll_shm_t *s, int peer, const plan_t *p, const char *src, char *dst,
                        size_t count, dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype), m = p->hi - p->lo;
    const char *in = src + p->lo * es;
    char *out = dst + p->lo * es;
    if (p->carried)
        return reduce_carried(s, peer, p, src, dst, count, dtype, op);
    int r = p->form == FORM_HALVES
                ? reduce_sliced_in_place(s, peer, p->round, in, p->their_src, out, p->their_dst, m,
                                         dtype, op)
                : reduce_in_place(s, peer, p->round, in, p->their_src, out, m, dtype, op);
    if (r == 0 && p->lo > 0)
        r = through_segment(s, src, dst, 0, p->lo, dtype, op);
    if (r == 0 && p->hi < count)
        r = through_segment(s, src, dst, p->hi, count - p->hi, dtype, op);
    return r;
}

/* Round k, or k + 1 where round k would copy into the slot that the last data round used and the
 * other member read last: a round between them carried none (a barrier), so the lines the other
 * core has just read would be taken back at once. With one slot a call, 48-64 KiB took 1.4x as
 * long as with the two in turn (issue #27, docs/performance.md); every member skips alike, since
 * the rounds and their data are the same on all. The skipped round is never arrived at, only
 * departed (allreduce_pair): the counters only grow, and every wait is for "at least". */
static uint32_t turn_slot(const dl__coll_shm_t *s, uint32_t k)
{
    return s->slot_round != 0 && ((k - s->slot_round) & 1) == 0 ? k + 1 : k;
}

/* Two members, beyond one chunk: the small all-reduce a chunk a round, pipelined (the next
 * round's copy goes in before waiting for this one's). Each member reduces the whole message,
 * its own input against the other's copy, in rank order: one synchronization a round and no
 * copies out, where slicing needs two and copies the other's half back. A/B at 64 MiB:
 * 6.1-7.5 GB/s against 5.7-6.7 for slicing; never slower from 1 MiB up. The first round's
 * announcements decide whether to read the buffers in place instead (dl_coll_mem_alloc blocks,
 * or ordinary memory adopted on first use); a member whose input may go in place sends in that
 * round only the partial pages outside its block (carry_ends), and if it does not go in place
 * after all the copying starts a round later. */
static int allreduce_pair(dl__coll_shm_t *s, const char *src, char *dst, size_t count,
                          dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t esize = dl_coll_dtype_size(dtype);
    size_t per_round = s->chunk / esize;
    int me = s->me, peer = 1 - me;
    const char **d = s->ptrs;
    uint32_t k = turn_slot(s, s->round + 1);
    /* The skipped round has nothing to read: departed at once, else the next round's
     * wait_slot_free (for k - 1) would wait for ever on a member that waits likewise. */
    if (k != s->round + 1)
        post(s, &s->ctl[me].depart, k - 1);
    int r = wait_slot_free(s, k);
    if (r < 0)
        return r;
    announce(s, k, src, dst, count * esize);
    int shared = s->ctl[me].buf_serial[k & 1][0] != 0;
    if (shared) {
        carry_ends(s, k, src, count, esize);
        post(s, &s->ctl[me].arrive, k);
    } else
        r = send_chunk(s, src, 0, count, esize, k);
    if (r == 0)
        r = wait_arrive(s, peer, k);
    plan_t p = {.form = FORM_COPY};
    if (r == 0)
        r = plan_in_place(s, peer, k, count, esize, &p);
    if (r < 0)
        return r;
    if (p.form != FORM_COPY)
        return run_in_place(s, peer, &p, src, dst, count, dtype, op);
    if (shared || s->ctl[peer].buf_serial[k & 1][0] != 0) {
        /* Round k carried no data from one of us: done with it, nobody reads it. */
        post(s, &s->ctl[me].depart, k);
        s->round = k++;
        r = send_chunk(s, src, 0, count, esize, k);
        if (r == 0)
            r = wait_arrive(s, peer, k);
        if (r < 0)
            return r;
    }
    for (size_t base = 0; base < count; base += per_round, k++) {
        size_t len = count - base < per_round ? count - base : per_round;
        s->round = k;
        if (base + per_round < count) {
            r = send_chunk(s, src, base + per_round, count, esize, k + 1);
            if (r < 0)
                return r;
        }
        if (base > 0) {
            r = wait_arrive(s, peer, k);
            if (r < 0)
                return r;
        }
        d[me] = src + base * esize;
        d[peer] = slot(s, peer, k);
        reduce_all(dst + base * esize, d, 2, len, dtype, op);
        post(s, &s->ctl[me].depart, k);
    }
    return 0;
}

int dl__coll_shm_allreduce(dl__coll_shm_t *s, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op, int root_only)
{
    size_t bytes = count * dl_coll_dtype_size(dtype);
    int r = begin(s);
    if (r < 0 || count == 0)
        return r;
    switch (dl__coll_shm_allreduce_algo(s, bytes, root_only)) {
    case DL_COLL_REC_ALGO_SHM_SMALL:
        r = allreduce_small(s, src, dst, count, dtype, op, root_only);
        break;
    case DL_COLL_REC_ALGO_SHM_PAIR: r = allreduce_pair(s, src, dst, count, dtype, op); break;
    default: r = allreduce_large(s, src, dst, count, dtype, op, root_only);
    }
    if (r == 0)
        s->slot_round = s->round;
    return r;
}

dl_coll_rec_algo_t dl__coll_shm_allreduce_algo(const dl__coll_shm_t *s, size_t bytes, int root_only)
{
    size_t small = root_only ? s->small_root : s->small;
    int latency =
        s->algo == DL_COLL_ALGO_LATENCY || (s->algo == DL_COLL_ALGO_AUTO && bytes <= small);
    if (latency && bytes <= s->chunk)
        return DL_COLL_REC_ALGO_SHM_SMALL;
    if (s->n == 2 && !root_only && s->algo != DL_COLL_ALGO_BANDWIDTH)
        return DL_COLL_REC_ALGO_SHM_PAIR;
    return DL_COLL_REC_ALGO_SHM_SLICE;
}

/* ---- reduce-scatter -------------------------------------------------------------------------- */

int dl__coll_shm_reduce_scatter(dl__coll_shm_t *s, const void *src_v, void *dst_v, size_t recvcount,
                                dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    const char *src = src_v;
    char *dst = dst_v;
    size_t esize = dl_coll_dtype_size(dtype), block = recvcount * esize;
    size_t per_round = s->chunk / ((size_t)s->n * esize);
    const char **d = s->ptrs;
    int me = s->me, n = s->n;
    int r = begin(s);
    if (r < 0)
        return r;
    /* Each round takes the same stretch of every block; region j of a slot holds block j's. */
    for (size_t b = 0; b < recvcount; b += per_round) {
        size_t len = recvcount - b < per_round ? recvcount - b : per_round;
        size_t region = len * esize;
        uint32_t k = ++s->round;
        r = wait_slot_free(s, k);
        if (r < 0)
            return r;
        for (int j = 0; j < n; j++)
            if (j != me)
                memcpy(slot(s, me, k) + (size_t)j * region, src + (size_t)j * block + b * esize,
                       region);
        post(s, &s->ctl[me].arrive, k);
        r = wait_all_arrive(s, k);
        if (r < 0)
            return r;
        for (int j = 0; j < n; j++)
            d[j] = j == me ? src + (size_t)me * block + b * esize
                           : slot(s, j, k) + (size_t)me * region;
        reduce_all(dst + b * esize, d, n, len, dtype, op);
        post(s, &s->ctl[me].depart, k);
        s->slot_round = k;
    }
    return 0;
}

/* ---- all-gather, broadcast, barrier ---------------------------------------------------------- */

int dl__coll_shm_allgather(dl__coll_shm_t *s, const void *src_v, void *dst_v, size_t bytes,
                           int root_only)
{
    const char *src = src_v;
    char *dst = dst_v;
    int me = s->me, n = s->n;
    int collect = !root_only || me == 0;
    int r = begin(s);
    if (r < 0)
        return r;
    if (collect && src != dst + (size_t)me * bytes && bytes > 0)
        memcpy(dst + (size_t)me * bytes, src, bytes);
    for (size_t b = 0; b < bytes; b += s->chunk) {
        size_t len = bytes - b < s->chunk ? bytes - b : s->chunk;
        uint32_t k = ++s->round;
        r = wait_slot_free(s, k);
        if (r < 0)
            return r;
        memcpy(slot(s, me, k), src + b, len);
        post(s, &s->ctl[me].arrive, k);
        for (int j = 0; j < n && collect; j++) {
            if (j == me)
                continue;
            r = wait_arrive(s, j, k);
            if (r < 0)
                return r;
            memcpy(dst + (size_t)j * bytes + b, slot(s, j, k), len);
        }
        post(s, &s->ctl[me].depart, k);
        s->slot_round = k;
    }
    return 0;
}

int dl__coll_shm_broadcast(dl__coll_shm_t *s, void *buf_v, size_t bytes, int root)
{
    char *buf = buf_v;
    int r = begin(s);
    if (r < 0)
        return r;
    for (size_t b = 0; b < bytes; b += s->chunk) {
        size_t len = bytes - b < s->chunk ? bytes - b : s->chunk;
        uint32_t k = ++s->round;
        if (s->me == root) {
            r = wait_slot_free(s, k);
            if (r < 0)
                return r;
            memcpy(slot(s, root, k), buf + b, len);
            post(s, &s->ctl[root].arrive, k);
        } else {
            r = wait_arrive(s, root, k);
            if (r < 0)
                return r;
            memcpy(buf + b, slot(s, root, k), len);
        }
        post(s, &s->ctl[s->me].depart, k);
        s->slot_round = k;
    }
    return 0;
}

int dl__coll_shm_barrier(dl__coll_shm_t *s)
{
    int r = begin(s);
    if (r < 0)
        return r;
    uint32_t k = ++s->round;
    post(s, &s->ctl[s->me].arrive, k);
    r = wait_all_arrive(s, k);
    if (r == 0)
        post(s, &s->ctl[s->me].depart, k);
    return r;
}

/* ---- setup ----------------------------------------------------------------------------------- */

static int map_fd(int fd, size_t len, void **ret_map)
{
    /* MAP_POPULATE: every page is faulted in here, once, not inside an operation. */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    *ret_map = p;
    return 0;
}

int dl__coll_shm_create(const char *name, int n, size_t chunk, void **ret_map, dl__coll_err_t *err)
{
    size_t len = dl__coll_shm_segment_size(n, chunk);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Left over by a job that died during setup with the same port and pid. */
        shm_unlink(name);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return dl__coll_fail(err, -errno, "shm: create /dev/shm%s: %s", name, strerror(errno));
    void *map = NULL;
    /* posix_fallocate reserves the pages now, so a full /dev/shm is an error here and not a
     * SIGBUS in the middle of an operation. */
    int r = ftruncate(fd, (off_t)len) < 0 ? -errno : -posix_fallocate(fd, 0, (off_t)len);
    if (r == 0)
        r = map_fd(fd, len, &map);
    close(fd);
    if (r < 0) {
        shm_unlink(name);
        return dl__coll_fail(err, r, "shm: size /dev/shm%s to %zu bytes: %s", name, len,
                             strerror(-r));
    }
    seg_hdr_t *h = map;
    h->n = (uint32_t)n;
    h->chunk = chunk;
    atomic_store_explicit(&h->magic, SEG_MAGIC, memory_order_release);
    *ret_map = map;
    return 0;
}

int dl__coll_shm_attach(const char *name, int n, size_t chunk, void **ret_map, dl__coll_err_t *err)
{
    size_t len = dl__coll_shm_segment_size(n, chunk);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return dl__coll_fail(err, -errno, "shm: open /dev/shm%s: %s", name, strerror(errno));
    struct stat st;
    void *map = NULL;
    int r = fstat(fd, &st) < 0 ? -errno : 0;
    if (r == 0 && (size_t)st.st_size != len)
        r = -EPROTO;
    if (r == 0)
        r = map_fd(fd, len, &map);
    close(fd);
    if (r < 0)
        return dl__coll_fail(err, r, "shm: map /dev/shm%s: %s", name, strerror(-r));
    seg_hdr_t *h = map;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != SEG_MAGIC || h->n != (uint32_t)n ||
        h->chunk != chunk) {
        munmap(map, len);
        return dl__coll_fail(err, -EPROTO, "shm: /dev/shm%s is not this job's segment", name);
    }
    *ret_map = map;
    return 0;
}

int dl__coll_shm_open(void *map, size_t chunk, int me, int n, const int *pids, const int *ranks,
                      const dl_coll_options_t *o, int busy, dl__coll_err_t *err,
                      dl__coll_shm_t **ret_shm)
{
    dl__coll_shm_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        munmap(map, dl__coll_shm_segment_size(n, chunk));
        return dl__coll_fail(err, -ENOMEM, "shm: out of memory");
    }
    s->me = me;
    s->n = n;
    s->chunk = chunk;
    s->map = map;
    s->map_len = dl__coll_shm_segment_size(n, s->chunk);
    s->hdr = map;
    s->ctl = (ctl_t *)(s->map + HDR_BYTES);
    s->data = s->map + dl__coll_shm_segment_size(n, s->chunk) - (size_t)n * 2 * s->chunk;
    s->timeout_ms = o->timeout_ms;
    /* Every member reading every slot costs n times the message; one slice each costs about two
     * messages but one more synchronization. Measured: with two members the first wins up to
     * the chunk size, with four up to 32 KiB. Two members' all-reduce (not to a root) takes
     * the pair form instead from PAIR_MIN: its own input read where it lies, and registered
     * buffers read in place (docs/performance.md, issue #27). */
    s->small = s->small_root = o->shm_small_bytes;
    if (o->shm_small_bytes == DL_COLL_SMALL_AUTO) {
        s->small = n == 2 ? PAIR_MIN : 32 << 10;
        s->small_root = n == 2 ? chunk : 32 << 10;
    }
    s->algo = o->algo;
    s->adopt_min = o->adopt_min_bytes;
    s->err = err;
    /* With more ranks than cores a spinning waiter only delays the rank it waits for; yield
     * the core instead. */
    if (busy) {
        s->spin_ns = (int64_t)o->spin_us * 1000;
        s->yield_spins = 0;
    } else {
        s->spin_ns = 2000;
        s->yield_spins = 16;
    }
    s->known_depart = calloc((size_t)n, sizeof(uint32_t));
    s->ptrs = calloc((size_t)n, sizeof(char *));
    s->piece = aligned_alloc(LINE, PIECE_BYTES);
    s->pidfd = malloc(sizeof(int) * (size_t)n);
    s->pids = malloc(sizeof(int) * (size_t)n);
    s->ranks = malloc(sizeof(int) * (size_t)n);
    if (s->known_depart == NULL || s->ptrs == NULL || s->piece == NULL || s->pidfd == NULL ||
        s->pids == NULL || s->ranks == NULL) {
        dl__coll_shm_close(s);
        return dl__coll_fail(err, -ENOMEM, "shm: out of memory");
    }
    for (int j = 0; j < n; j++) {
        s->pids[j] = pids[j];
        s->ranks[j] = ranks[j];
        s->pidfd[j] = -1;
#ifdef SYS_pidfd_open
        if (j == me || pids[j] == getpid())
            continue;
        s->pidfd[j] = (int)syscall(SYS_pidfd_open, pids[j], 0);
        if (s->pidfd[j] < 0 && errno == ESRCH) {
            int pid = pids[j], rank = ranks[j];
            dl__coll_shm_close(s);
            return dl__coll_fail(err, -ECONNRESET, "shm: rank %d (pid %d) is gone", rank, pid);
        }
        if (s->pidfd[j] >= 0)
            (void)fcntl(s->pidfd[j], F_SETFD, FD_CLOEXEC);
#endif
    }
    *ret_shm = s;
    return 0;
}

void dl__coll_shm_close(dl__coll_shm_t *s)
{
    if (s == NULL)
        return;
    if (s->pidfd != NULL)
        for (int j = 0; j < s->n; j++)
            if (s->pidfd[j] >= 0)
                close(s->pidfd[j]);
    if (s->map != NULL)
        munmap(s->map, s->map_len);
    for (int i = 0; i < PEER_MAPS; i++)
        if (s->pmap[i].base != NULL)
            munmap((void *)s->pmap[i].base, s->pmap[i].len);
    free(s->known_depart);
    free(s->ptrs);
    free(s->piece);
    free(s->pidfd);
    free(s->pids);
    free(s->ranks);
    free(s);
}

void dl__coll_shm_use_mem(dl__coll_shm_t *s, const dl__coll_mem_t *mem)
{
    s->mem = mem;
}

int dl__coll_shm_member(const dl__coll_shm_t *s)
{
    return s->me;
}

int dl__coll_shm_member_rank(const dl__coll_shm_t *s, int j)
{
    return s->ranks[j];
}

uint64_t dl__coll_shm_in_place_calls(const dl__coll_shm_t *s)
{
    return s == NULL ? 0 : s->in_place;
}

uint32_t dl__coll_shm_slot_round(const dl__coll_shm_t *s)
{
    return s == NULL ? 0 : s->slot_round;
}

uint64_t dl__coll_shm_verdict_rounds(const dl__coll_shm_t *s)
{
    return s == NULL ? 0 : s->verdicts;
}

const char *dl__coll_shm_note(const dl__coll_shm_t *s)
{
    return s == NULL ? "" : s->note;
}
