/* The all-reduce across hosts in rank order (DL_COLL_ORDER_RANK, the default): every element is
 * x0 op x1 op ... op x(n-1), left to right, the bits a loop over the ranks gives, whatever the
 * transport and the host layout. Within one host shm.c already folds in rank order; across
 * hosts a ring or recursive doubling would add partial sums in an order that depends on which
 * rank sits on which host, so neither is used here.
 *
 * Two ranks on two hosts need nothing of this: both of tcp.c's algorithms compute x0 op x1.
 * Otherwise, two forms:
 *
 * - The chain, for hosts whose ranks are consecutive (as dlaunch lays them out): a fold over
 *   ranks 0..n-1 is a fold over hosts in order, each host continuing from the previous host's
 *   partial. The leaders form a pipelined chain (dl__coll_tcp_chain) a piece at a time; host
 *   h's leader adds its own input to the partial and gives that to the host's shared-memory fold
 *   as its input, so the host's other ranks follow in rank order. The last host's result is
 *   final and flows back down the chain, then out to each host's members. Per leader that is
 *   the message once up and once down each way, what a ring costs with two hosts, H/(H-1) times
 *   it with H.
 *
 * - The gather, for tiny messages on more than two hosts and for any other layout: the
 *   leaders collect every rank's input (shared memory within the host, recursive doubling
 *   between hosts), fold them in rank order and hand the result to their members. Its traffic
 *   grows with the world size, so larger messages go a bounded piece at a time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Chain pieces: at least this much a piece, so a piece's cost is not all overhead, and at
 * least 8 pieces when the message allows, so the pipeline fills. */
#define MIN_PIECE (64u << 10)
/* The gather serves messages whose every input together is at most this share of
 * DLAUNCH_COLL_TCP_SMALL (16 KiB by default). */
#define GATHER_SHARE 16

typedef struct {
    dl_coll_group_t *g;
    const char *src;
    dl_coll_dtype_t dtype;
    dl_coll_op_t op;
} fold_ctx_t;

/* Grows the group's buffers for n ranks and need bytes: never shrunk, touched once here. */
static int grow(dl_coll_group_t *g, size_t need, char **ret)
{
    if (g->order_ptrs == NULL) {
        g->order_ptrs = malloc(sizeof(*g->order_ptrs) * (size_t)g->size);
        g->order_offs = malloc(sizeof(*g->order_offs) * 2 * (size_t)g->nhosts);
        if (g->order_ptrs == NULL || g->order_offs == NULL)
            return dl__coll_fail(&g->err, -ENOMEM, "out of memory");
    }
    if (g->order_cap < need) {
        char *p = NULL;
        if (posix_memalign((void **)&p, 64, need) != 0)
            return dl__coll_fail(&g->err, -ENOMEM, "out of memory for %zu bytes", need);
        memset(p, 0, need);
        free(g->order_buf);
        g->order_buf = p;
        g->order_cap = need;
    }
    *ret = g->order_buf;
    return 0;
}

/* A leader's fold of one piece: its host's ranks onto the previous hosts' partial. */
static int fold_host(void *ctx, const void *partial, void *out, size_t first, size_t count)
{
    fold_ctx_t *c = ctx;
    size_t es = dl_coll_dtype_size(c->dtype);
    const char *mine = c->src + first * es;
    const void *in = mine;
    if (partial != NULL) {
        /* The leader is its host's lowest rank: it comes right after the partial. */
        dl__coll_reduce(out, partial, mine, count, c->dtype, c->op);
        in = out;
    }
    if (c->g->shm != NULL)
        return dl__coll_shm_allreduce(c->g->shm, in, out, count, c->dtype, c->op, 1);
    if (in != out)
        memcpy(out, in, count * es);
    return 0;
}

static size_t chain_piece(const dl_coll_group_t *g, size_t count, size_t es)
{
    size_t bytes = count * es, chunk = g->opts.tcp_chunk_bytes;
    size_t piece = bytes / 8 > MIN_PIECE ? bytes / 8 : MIN_PIECE;
    if (piece > chunk)
        piece = chunk;
    return piece / es > 0 ? piece / es : 1;
}

static int chain(dl_coll_group_t *g, const char *src, char *dst, size_t count,
                 dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype), piece = chain_piece(g, count, es);
    fold_ctx_t c = {g, src, dtype, op};
    int r = 0;
    if (g->local_rank == 0) {
        r = dl__coll_tcp_chain(g->tcp, dst, count, dtype, piece, fold_host, &c);
    } else {
        /* The leader folds a piece at a time, as the chain brings it; so do we. */
        for (size_t first = 0; r == 0 && first < count; first += piece) {
            size_t m = count - first < piece ? count - first : piece;
            r = dl__coll_shm_allreduce(g->shm, src + first * es, dst + first * es, m, dtype, op, 1);
        }
    }
    if (r == 0 && g->shm != NULL)
        r = dl__coll_shm_broadcast(g->shm, dst, count * es, 0);
    return r;
}

static int gather(dl_coll_group_t *g, const char *src, char *dst, size_t count,
                  dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t es = dl_coll_dtype_size(dtype);
    size_t cap = g->opts.tcp_small_bytes > g->opts.tcp_chunk_bytes ? g->opts.tcp_small_bytes
                                                                   : g->opts.tcp_chunk_bytes;
    size_t per = cap / es > 0 ? cap / es : 1;
    if (per > count)
        per = count;
    char *buf = NULL;
    int r = grow(g, (size_t)g->size * per * es, &buf);
    for (size_t first = 0; r == 0 && first < count; first += per) {
        size_t m = count - first < per ? count - first : per, pb = m * es;
        /* Host-major: each host's ranks side by side, so that a leader sends one block. */
        char *hostblk = buf + (size_t)g->host_start[g->host] * pb;
        if (g->shm != NULL)
            r = dl__coll_shm_allgather(g->shm, src + first * es, hostblk, pb, 1);
        else
            memcpy(hostblk, src + first * es, pb);
        if (r < 0 || g->local_rank != 0)
            continue;
        size_t *offs = g->order_offs, *lens = offs + g->nhosts;
        for (int h = 0; h < g->nhosts; h++) {
            offs[h] = (size_t)g->host_start[h] * pb;
            lens[h] = (size_t)g->host_sizes[h] * pb;
        }
        r = dl__coll_tcp_allgatherv_rd(g->tcp, hostblk, buf, offs, lens);
        for (int q = 0; r == 0 && q < g->size; q++)
            g->order_ptrs[q] = buf + (size_t)(g->host_start[g->host_of[q]] + g->local_of[q]) * pb;
        if (r == 0)
            dl__coll_fold(dst + first * es, (const void *const *)g->order_ptrs, g->size, m, dtype,
                          op);
    }
    if (r == 0 && g->shm != NULL)
        r = dl__coll_shm_broadcast(g->shm, dst, count * es, 0);
    return r;
}

int dl__coll_allreduce_hosts(dl_coll_group_t *g, const void *src, void *dst, size_t count,
                             dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t bytes = count * dl_coll_dtype_size(dtype);
    /* The chain takes 2(H-1) hops, the gather log2(H) exchanges but moves every rank's input.
     * Measured on 2 and 4 hosts (docs/performance.md): the chain is as fast as the gather even
     * at 4 KiB, and faster from 16 KiB; the gather is kept for tiny messages on more than two
     * hosts, where the hops would add up. */
    int small = g->opts.algo == DL_COLL_ALGO_LATENCY ||
                (g->opts.algo == DL_COLL_ALGO_AUTO && g->nhosts > 2 &&
                 (size_t)(g->size - 1) * bytes <= g->opts.tcp_small_bytes / GATHER_SHARE);
    /* Two ranks, one a host: recursive doubling and the ring both compute x0 op x1 already. */
    if (g->size == 2)
        return dl__coll_tcp_allreduce(g->tcp, src, dst, count, dtype, op);
    if (small || !g->hosts_in_rank_order)
        return gather(g, src, dst, count, dtype, op);
    return chain(g, src, dst, count, dtype, op);
}
