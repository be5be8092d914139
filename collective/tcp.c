/* The TCP transport: one connection per pair of members that an algorithm uses (ring neighbours
 * and recursive-doubling partners), nonblocking sockets driven by one poll loop per operation.
 *
 * Large all-reduce is a pipelined ring. The message is cut into n segments; in step t a member
 * sends one segment to the next member and receives another from the previous one. Reduce-scatter
 * takes n-1 steps, all-gather n-1 more, and the send of step t is the segment received in step
 * t-1, so the whole operation is two byte streams (out to the next member, in from the previous)
 * where the outgoing stream may run as far as the incoming one has been reduced. Data received
 * during reduce-scatter lands in a cache-sized staging buffer and is reduced from there;
 * all-gather data lands directly in the caller's buffer. Each segment's final value is computed
 * once, by its owner, and only copied after that, so every member ends with the same bits.
 *
 * Small all-reduce is recursive doubling: log2(n) exchanges with partners at distance 1, 2, 4, ...
 * In a world that is not a power of two, the first 2r members (r = n - 2^k) pair up, the even
 * one hands its data to the odd one and gets the result back at the end. Each exchange reduces
 * (lower half, upper half) in that order on both sides, so both get the same bits.
 *
 * Both add partial sums in an order that depends on who sits where (DL_COLL_ORDER_ANY). The
 * chain (dl__coll_tcp_chain) keeps rank order instead: partials go up from member 0 to n-1 a
 * piece at a time, each member folding its own part on, and the final values come back down.
 *
 * Any wait that makes no progress for the timeout fails with -ETIMEDOUT; a peer that closes gives
 * -ECONNRESET. The group then shuts every connection down, so the failure reaches the peers'
 * blocked calls through their own sockets. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define HELLO_MAGIC 0x444c4354u /* "DLCT" */
#define HELLO_BYTES 16
/* One send() call moves at most this much, so a step does not monopolize the loop. */
#define SEND_MAX (1 << 20)

struct dl__coll_tcp_s {
    int me, n;
    int *fd;    /* per member; -1 where no link */
    int *ranks; /* global ranks, for messages */
    dl__coll_addr_t *addrs;
    int timeout_ms;
    size_t small, chunk;
    dl_coll_algo_t algo;
    int64_t spin_ns; /* how long a wait polls before it sleeps */
    dl__coll_err_t *err;
    char *tmp; /* staging for received data; at least chunk bytes */
    size_t tmp_cap;
    char *work; /* reduce-scatter's partial sums, as big as its input */
    size_t work_cap;
};

typedef struct {
    size_t off, len; /* bytes, within the full buffer */
} seg_t;

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Recursive doubling runs on p = 2^floor(log2 n) virtual members; see the file comment. */
static int pow2_floor(int n)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    return p;
}

static int vrank_of(int n, int r)
{
    int rem = n - pow2_floor(n);
    if (r < 2 * rem)
        return (r & 1) ? r / 2 : -1;
    return r - rem;
}

static int rank_of_vrank(int n, int v)
{
    int rem = n - pow2_floor(n);
    return v < rem ? 2 * v + 1 : v + rem;
}

int dl__coll_tcp_needs_link(int n, int a, int b)
{
    if (a == b || a < 0 || b < 0 || a >= n || b >= n)
        return 0;
    if (b == mod(a + 1, n) || a == mod(b + 1, n))
        return 1;
    int va = vrank_of(n, a), vb = vrank_of(n, b);
    if (va < 0 || vb < 0)
        return 0;
    int x = va ^ vb;
    return (x & (x - 1)) == 0;
}

/* ---- failures -------------------------------------------------------------------------------- */

static int link_fail(dl__coll_tcp_t *t, int peer, const char *what, int code)
{
    char where[64];
    dl__coll_addr_str(&t->addrs[peer], where, sizeof(where));
    if (code == -ETIMEDOUT)
        return dl__coll_fail(t->err, code, "tcp %s rank %d (%s): no progress for %d ms", what,
                             t->ranks[peer], where, t->timeout_ms);
    if (code == -ECONNRESET)
        return dl__coll_fail(t->err, code, "tcp %s rank %d (%s): connection closed by the peer",
                             what, t->ranks[peer], where);
    return dl__coll_fail(t->err, code, "tcp %s rank %d (%s): %s", what, t->ranks[peer], where,
                         strerror(-code));
}

void dl__coll_tcp_abort(dl__coll_tcp_t *t)
{
    if (t == NULL)
        return;
    for (int i = 0; i < t->n; i++)
        if (t->fd[i] >= 0)
            shutdown(t->fd[i], SHUT_RDWR);
}

/* ---- buffers --------------------------------------------------------------------------------- */

/* Grows a scratch buffer and touches every page once, so no operation pays page faults later. */
static int ensure(char **buf, size_t *cap, size_t need)
{
    if (*cap >= need)
        return 0;
    char *p = NULL;
    if (posix_memalign((void **)&p, 64, need) != 0)
        return -ENOMEM;
    memset(p, 0, need);
    free(*buf);
    *buf = p;
    *cap = need;
    return 0;
}

/* Polls until an event or deadline_ms. With a core of its own, a rank first polls without sleeping
 * for a while: waking a sleeping (halted) CPU costs tens of microseconds in a VM, more than a
 * small message's whole round trip. */
static int wait_events(const dl__coll_tcp_t *t, struct pollfd *p, int np, int64_t deadline_ms)
{
    if (t->spin_ns > 0) {
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            int k = poll(p, (nfds_t)np, 0);
            if (k != 0)
                return k;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) > t->spin_ns)
                break;
        }
    }
    int64_t left = deadline_ms - dl__coll_now_ms();
    return poll(p, (nfds_t)np, left > 0 ? (int)left : 0);
}

/* Sleeps until member sp's socket takes more (want_send) or member rp's has more (want_recv),
 * and clears *sblocked or *rblocked for the side that can move; one poll, possibly on one
 * socket for both sides. At the deadline, the receiving side if wanted, else the sending one,
 * is the failure. */
static int wait_sides(dl__coll_tcp_t *t, int want_send, int sp, int want_recv, int rp,
                      int64_t deadline, int *sblocked, int *rblocked)
{
    struct pollfd p[2];
    int np = 0, si = -1, ri = -1;
    if (want_send) {
        p[np] = (struct pollfd){.fd = t->fd[sp], .events = POLLOUT};
        si = np++;
    }
    if (want_recv) {
        if (si >= 0 && t->fd[rp] == t->fd[sp]) {
            p[si].events |= POLLIN;
            ri = si;
        } else {
            p[np] = (struct pollfd){.fd = t->fd[rp], .events = POLLIN};
            ri = np++;
        }
    }
    if (deadline - dl__coll_now_ms() <= 0)
        return link_fail(t, want_recv ? rp : sp, want_recv ? "recv from" : "send to", -ETIMEDOUT);
    int k = wait_events(t, p, np, deadline);
    if (k < 0 && errno != EINTR)
        return dl__coll_fail(t->err, -errno, "tcp poll: %s", strerror(errno));
    if (k > 0 && si >= 0 && p[si].revents != 0)
        *sblocked = 0;
    if (k > 0 && ri >= 0 && p[ri].revents != 0)
        *rblocked = 0;
    return 0;
}

/* ---- a two-way transfer with a no-progress timeout ----------------------------------------- */

/* Sends slen bytes to member sp and receives rlen bytes from member rp at the same time (either
 * may be absent: -1). With forward set, sbuf == rbuf and only what has arrived is sent on (a
 * chain broadcast). */
static int xfer(dl__coll_tcp_t *t, int sp, const char *sbuf, size_t slen, int rp, char *rbuf,
                size_t rlen, int forward)
{
    int sfd = sp >= 0 ? t->fd[sp] : -1, rfd = rp >= 0 ? t->fd[rp] : -1;
    size_t so = 0, ro = 0;
    int64_t deadline = dl__coll_now_ms() + t->timeout_ms;
    int sblocked = 0, rblocked = 0;

    if (sp < 0)
        slen = 0;
    if (rp < 0)
        rlen = 0;
    while (so < slen || ro < rlen) {
        int moved = 0;
        size_t ready = forward && ro < slen ? ro : slen;
        if (so < ready && !sblocked) {
            size_t want = ready - so < SEND_MAX ? ready - so : SEND_MAX;
            ssize_t k = send(sfd, sbuf + so, want, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                so += (size_t)k;
                moved = 1;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                sblocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, sp, "send to", -errno);
            }
        }
        if (ro < rlen && !rblocked) {
            ssize_t k = recv(rfd, rbuf + ro, rlen - ro, MSG_DONTWAIT);
            if (k > 0) {
                ro += (size_t)k;
                moved = 1;
            } else if (k == 0) {
                return link_fail(t, rp, "recv from", -ECONNRESET);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                rblocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, rp, "recv from", -errno);
            }
        }
        if (moved) {
            deadline = dl__coll_now_ms() + t->timeout_ms;
            continue;
        }
        int r = wait_sides(t, so < ready, sp, ro < rlen, rp, deadline, &sblocked, &rblocked);
        if (r < 0)
            return r;
    }
    return 0;
}

/* ---- the ring -------------------------------------------------------------------------------- */

typedef struct {
    const seg_t *segs;
    int rs, ag;      /* reduce-scatter and all-gather steps (each 0 or n-1) */
    const char *src; /* full-layout input of the reduce-scatter */
    char *acc;       /* full-layout partial sums */
    char *fin;       /* where my own segment's final value goes */
    char *dst;       /* full-layout all-gather output */
    const char *own; /* all-gather only: my block */
    dl_coll_dtype_t dtype;
    dl_coll_op_t op;
} ring_t;

static int send_seg(const dl__coll_tcp_t *t, const ring_t *g, int step)
{
    return step < g->rs ? mod(t->me - 1 - step, t->n) : mod(t->me - (step - g->rs), t->n);
}

static int recv_seg(const dl__coll_tcp_t *t, const ring_t *g, int step)
{
    return step < g->rs ? mod(t->me - 2 - step, t->n) : mod(t->me - 1 - (step - g->rs), t->n);
}

/* Where the data sent in `step` lives: the input at first, then wherever the previous step's
 * receive put it. */
static const char *send_ptr(const dl__coll_tcp_t *t, const ring_t *g, int step)
{
    const seg_t *s = &g->segs[send_seg(t, g, step)];
    if (step == 0)
        return g->rs > 0 ? g->src + s->off : g->own;
    if (step - 1 == g->rs - 1)
        return g->fin;
    if (step - 1 < g->rs)
        return g->acc + s->off;
    return g->dst + s->off;
}

static char *reduce_out(const dl__coll_tcp_t *t, const ring_t *g, int step)
{
    if (step == g->rs - 1)
        return g->fin;
    return g->acc + g->segs[recv_seg(t, g, step)].off;
}

static int ring_run(dl__coll_tcp_t *t, const ring_t *g)
{
    int next = mod(t->me + 1, t->n), prev = mod(t->me - 1, t->n);
    int sfd = t->fd[next], rfd = t->fd[prev];
    int steps = g->rs + g->ag;
    size_t esize = dl_coll_dtype_size(g->dtype);
    size_t piece = t->chunk / esize * esize;
    int st = 0, rt = 0;            /* current send and receive steps */
    size_t so = 0, ro = 0, rr = 0; /* sent, received and reduced bytes of those steps */
    int sblocked = 0, rblocked = 0;
    int64_t deadline = dl__coll_now_ms() + t->timeout_ms;

    while (st < steps || rt < steps) {
        int moved = 0;
        /* Receive: into staging during reduce-scatter, straight into place after. */
        while (rt < steps && g->segs[recv_seg(t, g, rt)].len == 0)
            rt++, ro = rr = 0;
        if (rt < steps && !rblocked) {
            const seg_t *s = &g->segs[recv_seg(t, g, rt)];
            int staged = rt < g->rs;
            char *to = staged ? t->tmp + (ro - rr) : g->dst + s->off + ro;
            size_t want = s->len - ro;
            if (staged && want > piece - (ro - rr))
                want = piece - (ro - rr);
            ssize_t k = recv(rfd, to, want, MSG_DONTWAIT);
            if (k > 0) {
                ro += (size_t)k;
                moved = 1;
            } else if (k == 0) {
                return link_fail(t, prev, "recv from", -ECONNRESET);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                rblocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, prev, "recv from", -errno);
            }
            if (!staged) {
                rr = ro;
            } else {
                /* Reduce when the staging piece is full, the segment is complete, or the socket
                 * ran dry, so the outgoing stream never waits on data that sits here. */
                size_t have = (ro - rr) / esize * esize;
                if (have > 0 && (ro - rr == piece || ro == s->len || rblocked)) {
                    /* What arrives holds members from mine + 1 on, wrapping past n-1 to 0:
                     * lower ranks than mine, except at member 0. Lower first, so that two
                     * members' sums are in rank order (x0 op x1 on both). */
                    const char *own = g->src + s->off + rr;
                    dl__coll_reduce(reduce_out(t, g, rt) + rr, t->me == 0 ? own : t->tmp,
                                    t->me == 0 ? t->tmp : own, have / esize, g->dtype, g->op);
                    rr += have;
                    if (ro > rr)
                        memmove(t->tmp, t->tmp + have, ro - rr);
                }
            }
            if (rr == s->len) {
                rt++;
                ro = rr = 0;
            }
        }
        /* Send whatever of this step's segment is ready. */
        while (st < steps && g->segs[send_seg(t, g, st)].len == 0)
            st++, so = 0;
        size_t ready = 0;
        if (st < steps) {
            const seg_t *s = &g->segs[send_seg(t, g, st)];
            ready = (st == 0 || rt > st - 1) ? s->len : (rt == st - 1 ? rr : 0);
            if (so < ready && !sblocked) {
                size_t want = ready - so < SEND_MAX ? ready - so : SEND_MAX;
                ssize_t k = send(sfd, send_ptr(t, g, st) + so, want, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k > 0) {
                    so += (size_t)k;
                    moved = 1;
                } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    sblocked = 1;
                } else if (errno != EINTR) {
                    return link_fail(t, next, "send to", -errno);
                }
                if (so == s->len) {
                    st++;
                    so = 0;
                }
            }
        }
        if (moved) {
            deadline = dl__coll_now_ms() + t->timeout_ms;
            continue;
        }
        if (st >= steps && rt >= steps)
            break;
        int r = wait_sides(t, st < steps && so < ready, next, rt < steps, prev, deadline, &sblocked,
                           &rblocked);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Splits count elements into n segments whose sizes differ by at most one element. */
static int even_segs(const dl__coll_tcp_t *t, size_t count, size_t esize, seg_t **ret)
{
    seg_t *s = malloc(sizeof(*s) * (size_t)t->n);
    if (s == NULL)
        return dl__coll_fail(t->err, -ENOMEM, "tcp: out of memory");
    size_t base = count / (size_t)t->n, extra = count % (size_t)t->n, off = 0;
    for (int i = 0; i < t->n; i++) {
        size_t c = base + ((size_t)i < extra ? 1 : 0);
        s[i] = (seg_t){off * esize, c * esize};
        off += c;
    }
    *ret = s;
    return 0;
}

/* ---- recursive doubling ---------------------------------------------------------------------- */

static int rd_allreduce(dl__coll_tcp_t *t, void *dst, size_t count, dl_coll_dtype_t dtype,
                        dl_coll_op_t op)
{
    size_t bytes = count * dl_coll_dtype_size(dtype);
    int n = t->n, me = t->me, p = pow2_floor(n), rem = n - p;
    int r = ensure(&t->tmp, &t->tmp_cap, bytes);
    if (r < 0)
        return dl__coll_fail(t->err, r, "tcp: out of memory for %zu bytes", bytes);
    if (me < 2 * rem && !(me & 1)) {
        /* Sits out the doubling: hands its data over, gets the result back. */
        r = xfer(t, me + 1, dst, bytes, -1, NULL, 0, 0);
        if (r == 0)
            r = xfer(t, -1, NULL, 0, me + 1, dst, bytes, 0);
        return r;
    }
    if (me < 2 * rem) {
        r = xfer(t, -1, NULL, 0, me - 1, t->tmp, bytes, 0);
        if (r < 0)
            return r;
        dl__coll_reduce(dst, t->tmp, dst, count, dtype, op);
    }
    int v = vrank_of(n, me);
    for (int mask = 1; mask < p; mask <<= 1) {
        int pv = v ^ mask, peer = rank_of_vrank(n, pv);
        r = xfer(t, peer, dst, bytes, peer, t->tmp, bytes, 0);
        if (r < 0)
            return r;
        if (pv < v)
            dl__coll_reduce(dst, t->tmp, dst, count, dtype, op);
        else
            dl__coll_reduce(dst, dst, t->tmp, count, dtype, op);
    }
    if (me < 2 * rem)
        r = xfer(t, me - 1, dst, bytes, -1, NULL, 0, 0);
    return r;
}

/* ---- all-gather by recursive doubling ------------------------------------------------------- */

/* Where virtual member v's blocks start and end: the first member it stands for, and one past
 * the last (a virtual member below rem stands for a pair). */
static int vfirst(int n, int v)
{
    int rem = n - pow2_floor(n);
    return v < rem ? 2 * v : v + rem;
}

int dl__coll_tcp_allgatherv_rd(dl__coll_tcp_t *t, const void *src, void *dst_v, const size_t *offs,
                               const size_t *bytes)
{
    char *dst = dst_v;
    int n = t->n, me = t->me, p = pow2_floor(n), rem = n - p, r = 0;
    size_t total = offs[n - 1] + bytes[n - 1];
    if (src != dst + offs[me] && bytes[me] > 0)
        memcpy(dst + offs[me], src, bytes[me]);
    if (me < 2 * rem && !(me & 1)) {
        /* Sits out the doubling: hands its block over, gets everything back. */
        r = xfer(t, me + 1, dst + offs[me], bytes[me], -1, NULL, 0, 0);
        if (r == 0)
            r = xfer(t, -1, NULL, 0, me + 1, dst, total, 0);
        return r;
    }
    if (me < 2 * rem)
        r = xfer(t, -1, NULL, 0, me - 1, dst + offs[me - 1], bytes[me - 1], 0);
    int v = vrank_of(n, me);
    for (int mask = 1; r == 0 && mask < p; mask <<= 1) {
        /* Both sides hold the blocks of `mask` virtual members by now, each a run of members,
         * so each sends one contiguous range and receives one. */
        int mine = v & ~(mask - 1), theirs = (v ^ mask) & ~(mask - 1);
        int peer = rank_of_vrank(n, v ^ mask);
        size_t mlo = offs[vfirst(n, mine)],
               mhi = mine + mask < p ? offs[vfirst(n, mine + mask)] : total;
        size_t tlo = offs[vfirst(n, theirs)],
               thi = theirs + mask < p ? offs[vfirst(n, theirs + mask)] : total;
        r = xfer(t, peer, dst + mlo, mhi - mlo, peer, dst + tlo, thi - tlo, 0);
    }
    if (r == 0 && me < 2 * rem)
        r = xfer(t, me - 1, dst, total, -1, NULL, 0, 0);
    return r;
}

/* ---- the chain: rank order ------------------------------------------------------------------ */

/* Four streams at once, two per socket: partial results up from the previous member and on to
 * the next, final results back from the next and on to the previous. Partials arrive into a
 * piece-sized staging buffer and are folded into dst a whole piece at a time (the fold may be a
 * collective of its own, so its boundaries must not depend on timing); finals land straight in
 * dst. A final byte can only arrive after the next member got the partial byte it replaces, so
 * receiving into dst never overwrites a partial still to be sent. */
int dl__coll_tcp_chain(dl__coll_tcp_t *t, void *dst_v, size_t count, dl_coll_dtype_t dtype,
                       size_t piece_count, dl__coll_fold_fn fold, void *ctx)
{
    char *dst = dst_v;
    size_t es = dl_coll_dtype_size(dtype), total = count * es, piece = piece_count * es;
    int prev = t->me > 0 ? t->me - 1 : -1, next = t->me < t->n - 1 ? t->me + 1 : -1;
    size_t folded = 0, staged = 0, sent = 0, got = 0, back = 0;
    int in_blocked = 0, up_blocked = 0, fin_blocked = 0, down_blocked = 0, r;
    int64_t deadline = dl__coll_now_ms() + t->timeout_ms;

    if (piece == 0)
        return dl__coll_fail(t->err, -EINVAL, "tcp chain: empty pieces");
    if (prev >= 0 && (r = ensure(&t->tmp, &t->tmp_cap, piece)) < 0)
        return dl__coll_fail(t->err, r, "tcp: out of memory for %zu bytes", piece);
    for (;;) {
        int moved = 0;
        size_t plen = total - folded < piece ? total - folded : piece;
        /* Member 0 folds a piece once the last one is on its way: nothing is ever waiting. */
        if (prev < 0 && folded < total && (next < 0 || sent == folded)) {
            r = fold(ctx, NULL, dst + folded, folded / es, plen / es);
            if (r < 0)
                return r;
            folded += plen;
            moved = 1;
        }
        if (prev >= 0 && folded < total && !in_blocked) {
            ssize_t k = recv(t->fd[prev], t->tmp + staged, plen - staged, MSG_DONTWAIT);
            if (k > 0) {
                staged += (size_t)k;
                moved = 1;
            } else if (k == 0) {
                return link_fail(t, prev, "recv from", -ECONNRESET);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                in_blocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, prev, "recv from", -errno);
            }
            if (staged == plen) {
                r = fold(ctx, t->tmp, dst + folded, folded / es, plen / es);
                if (r < 0)
                    return r;
                folded += plen;
                staged = 0;
            }
        }
        if (next >= 0 && sent < folded && !up_blocked) {
            size_t want = folded - sent < SEND_MAX ? folded - sent : SEND_MAX;
            ssize_t k = send(t->fd[next], dst + sent, want, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                sent += (size_t)k;
                moved = 1;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                up_blocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, next, "send to", -errno);
            }
        }
        if (next >= 0 && got < total && !fin_blocked) {
            ssize_t k = recv(t->fd[next], dst + got, total - got, MSG_DONTWAIT);
            if (k > 0) {
                got += (size_t)k;
                moved = 1;
            } else if (k == 0) {
                return link_fail(t, next, "recv from", -ECONNRESET);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                fin_blocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, next, "recv from", -errno);
            }
        }
        /* The last member's folds are final; the others pass on what came back. */
        size_t final = next >= 0 ? got : folded;
        if (prev >= 0 && back < final && !down_blocked) {
            size_t want = final - back < SEND_MAX ? final - back : SEND_MAX;
            ssize_t k = send(t->fd[prev], dst + back, want, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                back += (size_t)k;
                moved = 1;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                down_blocked = 1;
            } else if (errno != EINTR) {
                return link_fail(t, prev, "send to", -errno);
            }
        }
        if (folded == total && (next < 0 || (sent == total && got == total)) &&
            (prev < 0 || back == total))
            return 0;
        if (moved) {
            deadline = dl__coll_now_ms() + t->timeout_ms;
            continue;
        }
        /* Nothing moved: sleep on whatever is blocked. */
        struct pollfd p[2];
        int np = 0, pi = -1, ni = -1;
        short pev = (short)((prev >= 0 && folded < total ? POLLIN : 0) |
                            (prev >= 0 && back < final ? POLLOUT : 0));
        short nev = (short)((next >= 0 && sent < folded ? POLLOUT : 0) |
                            (next >= 0 && got < total ? POLLIN : 0));
        if (pev != 0) {
            p[np] = (struct pollfd){.fd = t->fd[prev], .events = pev};
            pi = np++;
        }
        if (nev != 0) {
            p[np] = (struct pollfd){.fd = t->fd[next], .events = nev};
            ni = np++;
        }
        int waited_on = pi >= 0 && (pev & POLLIN) ? prev : next >= 0 ? next : prev;
        if (np == 0)
            return dl__coll_fail(t->err, -EPROTO, "tcp chain: nothing to wait for");
        if (deadline - dl__coll_now_ms() <= 0)
            return link_fail(t, waited_on, "recv from", -ETIMEDOUT);
        int k = wait_events(t, p, np, deadline);
        if (k < 0 && errno != EINTR)
            return dl__coll_fail(t->err, -errno, "tcp poll: %s", strerror(errno));
        if (k > 0 && pi >= 0 && p[pi].revents != 0)
            in_blocked = down_blocked = 0;
        if (k > 0 && ni >= 0 && p[ni].revents != 0)
            up_blocked = fin_blocked = 0;
    }
}

/* ---- operations ------------------------------------------------------------------------------ */

dl_coll_rec_algo_t dl__coll_tcp_allreduce_algo(const dl__coll_tcp_t *t, size_t count, size_t esize)
{
    size_t bytes = count * esize;
    int latency =
        t->algo == DL_COLL_ALGO_LATENCY || (t->algo == DL_COLL_ALGO_AUTO && bytes <= t->small);
    return latency || count < (size_t)t->n ? DL_COLL_REC_ALGO_TCP_DOUBLING
                                           : DL_COLL_REC_ALGO_TCP_RING;
}

int dl__coll_tcp_allreduce(dl__coll_tcp_t *t, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t esize = dl_coll_dtype_size(dtype), bytes = count * esize;
    if (dl__coll_tcp_allreduce_algo(t, count, esize) == DL_COLL_REC_ALGO_TCP_DOUBLING) {
        if (src != dst)
            memcpy(dst, src, bytes);
        return rd_allreduce(t, dst, count, dtype, op);
    }
    seg_t *segs = NULL;
    int r = even_segs(t, count, esize, &segs);
    if (r < 0)
        return r;
    ring_t g = {.segs = segs,
                .rs = t->n - 1,
                .ag = t->n - 1,
                .src = src,
                .acc = dst,
                .fin = (char *)dst + segs[t->me].off,
                .dst = dst,
                .dtype = dtype,
                .op = op};
    r = ring_run(t, &g);
    free(segs);
    return r;
}

int dl__coll_tcp_reduce_scatter(dl__coll_tcp_t *t, const void *src, void *dst, size_t recvcount,
                                dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t esize = dl_coll_dtype_size(dtype), block = recvcount * esize;
    seg_t *segs = malloc(sizeof(*segs) * (size_t)t->n);
    if (segs == NULL)
        return dl__coll_fail(t->err, -ENOMEM, "tcp: out of memory");
    for (int i = 0; i < t->n; i++)
        segs[i] = (seg_t){(size_t)i * block, block};
    int r = ensure(&t->work, &t->work_cap, block * (size_t)t->n);
    if (r < 0) {
        free(segs);
        return dl__coll_fail(t->err, r, "tcp: out of memory for %zu bytes", block * t->n);
    }
    ring_t g = {.segs = segs,
                .rs = t->n - 1,
                .ag = 0,
                .src = src,
                .acc = t->work,
                .fin = dst,
                .dst = NULL,
                .dtype = dtype,
                .op = op};
    r = ring_run(t, &g);
    free(segs);
    return r;
}

int dl__coll_tcp_allgatherv(dl__coll_tcp_t *t, const void *src, void *dst, const size_t *offs,
                            const size_t *bytes)
{
    seg_t *segs = malloc(sizeof(*segs) * (size_t)t->n);
    if (segs == NULL)
        return dl__coll_fail(t->err, -ENOMEM, "tcp: out of memory");
    for (int i = 0; i < t->n; i++)
        segs[i] = (seg_t){offs[i], bytes[i]};
    char *mine = (char *)dst + offs[t->me];
    if (src != mine && bytes[t->me] > 0)
        memcpy(mine, src, bytes[t->me]);
    /* Int32 is only the element size the engine aligns receives to; nothing is reduced. */
    ring_t g = {.segs = segs,
                .rs = 0,
                .ag = t->n - 1,
                .dst = dst,
                .own = mine,
                .dtype = DL_COLL_INT32,
                .op = DL_COLL_SUM};
    int r = ring_run(t, &g);
    free(segs);
    return r;
}

int dl__coll_tcp_broadcast(dl__coll_tcp_t *t, void *buf, size_t bytes, int root)
{
    int rel = mod(t->me - root, t->n);
    int next = rel == t->n - 1 ? -1 : mod(t->me + 1, t->n);
    int prev = rel == 0 ? -1 : mod(t->me - 1, t->n);
    return xfer(t, next, buf, bytes, prev, buf, bytes, prev >= 0);
}

int dl__coll_tcp_barrier(dl__coll_tcp_t *t)
{
    int32_t token = 0;
    return rd_allreduce(t, &token, 1, DL_COLL_INT32, DL_COLL_SUM);
}

/* ---- setup ----------------------------------------------------------------------------------- */

static void hello_pack(unsigned char *p, uint64_t key, int me, int n)
{
    uint32_t v[4] = {HELLO_MAGIC, (uint32_t)(key >> 32) ^ (uint32_t)key, (uint32_t)me, (uint32_t)n};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            p[i * 4 + j] = (unsigned char)(v[i] >> (24 - 8 * j));
}

static uint32_t word(const unsigned char *p, int i)
{
    return (uint32_t)p[i * 4] << 24 | (uint32_t)p[i * 4 + 1] << 16 | (uint32_t)p[i * 4 + 2] << 8 |
           p[i * 4 + 3];
}

/* Lower members connect to higher ones: every connect completes in the listener's backlog, so
 * doing all of them before any accept cannot deadlock. */
static int connect_links(dl__coll_tcp_t *t, int lfd, uint64_t key, int64_t deadline)
{
    unsigned char hello[HELLO_BYTES];
    int expect = 0;
    for (int j = 0; j < t->n; j++) {
        if (!dl__coll_tcp_needs_link(t->n, t->me, j))
            continue;
        if (j < t->me) {
            expect++;
            continue;
        }
        int r = dl__coll_connect(&t->addrs[j], deadline, &t->fd[j]);
        if (r == 0) {
            hello_pack(hello, key, t->me, t->n);
            r = dl__coll_send_all(t->fd[j], hello, sizeof(hello), deadline);
        }
        if (r < 0)
            return link_fail(t, j, "connect to", r);
    }
    while (expect > 0) {
        int fd = -1;
        int r = dl__coll_accept(lfd, deadline, &fd);
        if (r < 0)
            return dl__coll_fail(t->err, r, "tcp accept from %d lower ranks: %s", expect,
                                 strerror(-r));
        r = dl__coll_recv_all(fd, hello, sizeof(hello), deadline);
        int j = (int)word(hello, 2);
        if (r < 0 || word(hello, 0) != HELLO_MAGIC ||
            word(hello, 1) != ((uint32_t)(key >> 32) ^ (uint32_t)key) ||
            word(hello, 3) != (uint32_t)t->n || j < 0 || j >= t->me ||
            !dl__coll_tcp_needs_link(t->n, t->me, j) || t->fd[j] >= 0) {
            close(fd); /* a stray connection, not this job's */
            continue;
        }
        t->fd[j] = fd;
        expect--;
    }
    return 0;
}

int dl__coll_tcp_open(int me, int n, const dl__coll_addr_t *addrs, const int *ranks, int lfd,
                      uint64_t job_key, const dl_coll_options_t *o, int busy, dl__coll_err_t *err,
                      dl__coll_tcp_t **ret_tcp)
{
    dl__coll_tcp_t *t = calloc(1, sizeof(*t));
    int r = -ENOMEM;
    if (t == NULL)
        return dl__coll_fail(err, -ENOMEM, "tcp: out of memory");
    t->me = me;
    t->n = n;
    t->err = err;
    t->timeout_ms = o->timeout_ms;
    t->small = o->tcp_small_bytes;
    t->chunk = o->tcp_chunk_bytes;
    t->algo = o->algo;
    t->spin_ns = busy ? (int64_t)o->spin_us * 1000 : 0;
    t->fd = malloc(sizeof(int) * (size_t)n);
    t->ranks = malloc(sizeof(int) * (size_t)n);
    t->addrs = malloc(sizeof(*addrs) * (size_t)n);
    if (t->fd == NULL || t->ranks == NULL || t->addrs == NULL)
        goto fail;
    for (int i = 0; i < n; i++)
        t->fd[i] = -1;
    memcpy(t->ranks, ranks, sizeof(int) * (size_t)n);
    memcpy(t->addrs, addrs, sizeof(*addrs) * (size_t)n);
    r = ensure(&t->tmp, &t->tmp_cap, t->chunk > t->small ? t->chunk : t->small);
    if (r < 0)
        goto fail;
    r = connect_links(t, lfd, job_key, dl__coll_now_ms() + o->timeout_ms);
    if (r < 0)
        goto fail;
    *ret_tcp = t;
    return 0;
fail:
    if (r == -ENOMEM)
        dl__coll_fail(err, r, "tcp: out of memory");
    dl__coll_tcp_close(t);
    return r;
}

void dl__coll_tcp_close(dl__coll_tcp_t *t)
{
    if (t == NULL)
        return;
    if (t->fd != NULL)
        for (int i = 0; i < t->n; i++)
            if (t->fd[i] >= 0)
                close(t->fd[i]);
    free(t->fd);
    free(t->ranks);
    free(t->addrs);
    free(t->tmp);
    free(t->work);
    free(t);
}
