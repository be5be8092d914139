/* The bootstrap over MASTER_ADDR:MASTER_PORT. Rank 0 listens there; every other rank connects
 * (retrying until the timeout, since rank 0 may start last) and keeps its connection for the
 * group's setup. Each all-gather round, a rank sends a header and its blob, and rank 0 answers
 * with the table of every rank's blob once all have arrived.
 *
 * Header, big-endian: magic "DLCB", version, job key (run id, world size and port hashed, so a
 * stray client of another job on a reused port is turned away), rank, world size, round, length. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define MAGIC 0x444c4342u /* "DLCB" */
#define VERSION 1
#define HDR_BYTES 32
/* A connection that says nothing this long is not one of ours. */
#define STRANGER_MS 5000

typedef struct {
    dl__coll_boot_t base;
    int timeout_ms;
    uint64_t job_key;
    uint32_t round;
    int lfd;
    int *fds; /* rank 0: one per rank (its own slot -1); others: fds[0] leads to rank 0 */
    int joined;
    char master[DL_COLL_ADDR_MAX + 16];
} tcp_boot_t;

typedef struct {
    uint32_t magic, version;
    uint64_t job_key;
    uint32_t rank, world, round, len;
} hdr_t;

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void hdr_pack(const hdr_t *h, unsigned char *p)
{
    put32(p, h->magic);
    put32(p + 4, h->version);
    put32(p + 8, (uint32_t)(h->job_key >> 32));
    put32(p + 12, (uint32_t)h->job_key);
    put32(p + 16, h->rank);
    put32(p + 20, h->world);
    put32(p + 24, h->round);
    put32(p + 28, h->len);
}

static void hdr_unpack(const unsigned char *p, hdr_t *h)
{
    h->magic = get32(p);
    h->version = get32(p + 4);
    h->job_key = (uint64_t)get32(p + 8) << 32 | get32(p + 12);
    h->rank = get32(p + 16);
    h->world = get32(p + 20);
    h->round = get32(p + 24);
    h->len = get32(p + 28);
}

/* Sends a header for this round and len bytes of data. */
static int send_msg(tcp_boot_t *b, int fd, const void *data, size_t len, int64_t deadline)
{
    unsigned char raw[HDR_BYTES];
    hdr_t h = {MAGIC,    VERSION,      b->job_key, (uint32_t)b->base.rank, (uint32_t)b->base.size,
               b->round, (uint32_t)len};
    hdr_pack(&h, raw);
    int r = dl__coll_send_all(fd, raw, sizeof(raw), deadline);
    if (r == 0 && len > 0)
        r = dl__coll_send_all(fd, data, len, deadline);
    return r;
}

/* Reads a header and checks it belongs to this job and round; the sender's rank goes to
 * *ret_rank. -EPROTO for anything else. */
static int recv_hdr(tcp_boot_t *b, int fd, size_t len, int64_t deadline, int *ret_rank)
{
    unsigned char raw[HDR_BYTES];
    hdr_t h;
    int r = dl__coll_recv_all(fd, raw, sizeof(raw), deadline);
    if (r < 0)
        return r;
    hdr_unpack(raw, &h);
    if (h.magic != MAGIC || h.version != VERSION || h.job_key != b->job_key ||
        h.world != (uint32_t)b->base.size || h.round != b->round || h.len != len ||
        h.rank >= h.world)
        return -EPROTO;
    *ret_rank = (int)h.rank;
    return 0;
}

static void tcp_close(dl__coll_boot_t *base)
{
    tcp_boot_t *b = (tcp_boot_t *)base;
    if (b == NULL)
        return;
    if (b->fds != NULL)
        for (int i = 0; i < b->base.size; i++)
            if (b->fds[i] >= 0)
                close(b->fds[i]);
    if (b->lfd >= 0)
        close(b->lfd);
    free(b->fds);
    free(b);
}

/* Rank 0, first round: accepts until every other rank has said who it is and sent its blob. */
static int accept_all(tcp_boot_t *b, size_t len, char *all, int64_t deadline, char *err,
                      size_t errlen)
{
    while (b->joined < b->base.size - 1) {
        int fd = -1, rank = -1;
        int r = dl__coll_accept(b->lfd, deadline, &fd);
        if (r == -ETIMEDOUT) {
            snprintf(err, errlen, "bootstrap at %s: %d of %d ranks connected within %d ms",
                     b->master, b->joined + 1, b->base.size, b->timeout_ms);
            return r;
        }
        if (r < 0) {
            snprintf(err, errlen, "bootstrap at %s: accept: %s", b->master, strerror(-r));
            return r;
        }
        int64_t quick = dl__coll_now_ms() + STRANGER_MS;
        r = recv_hdr(b, fd, len, quick < deadline ? quick : deadline, &rank);
        if (r == 0 && (rank == 0 || b->fds[rank] >= 0)) {
            close(fd);
            snprintf(err, errlen, "bootstrap at %s: two processes claim rank %d", b->master, rank);
            return -EEXIST;
        }
        if (r == 0)
            r = dl__coll_recv_all(fd, all + (size_t)rank * len, len, deadline);
        if (r < 0) {
            /* Not one of this job's ranks, or one that died on the way in: the real one
             * (or a restarted one) can still connect. */
            close(fd);
            continue;
        }
        b->fds[rank] = fd;
        b->joined++;
    }
    return 0;
}

static int tcp_allgather(dl__coll_boot_t *base, const void *mine, size_t len, void *all_v,
                         char *err, size_t errlen)
{
    tcp_boot_t *b = (tcp_boot_t *)base;
    char *all = all_v;
    int n = base->size, me = base->rank;
    int64_t deadline = dl__coll_now_ms() + b->timeout_ms;
    int r = 0, who = 0;

    if (len > DL__COLL_BOOT_BLOB_MAX)
        return -EMSGSIZE;
    b->round++;
    memcpy(all + (size_t)me * len, mine, len);
    if (n == 1)
        return 0;
    if (me != 0) {
        int from = -1;
        r = send_msg(b, b->fds[0], mine, len, deadline);
        if (r == 0)
            r = recv_hdr(b, b->fds[0], (size_t)n * len, deadline, &from);
        if (r == 0 && from != 0)
            r = -EPROTO;
        if (r == 0)
            r = dl__coll_recv_all(b->fds[0], all, (size_t)n * len, deadline);
        if (r < 0)
            snprintf(err, errlen, "bootstrap at %s, round %u: %s", b->master, b->round,
                     r == -ECONNRESET ? "rank 0 closed the connection" : strerror(-r));
        return r;
    }
    if (b->round == 1) {
        r = accept_all(b, len, all, deadline, err, errlen);
        if (r < 0)
            return r;
    } else {
        for (who = 1; who < n && r == 0; who++) {
            int from = -1;
            r = recv_hdr(b, b->fds[who], len, deadline, &from);
            if (r == 0 && from != who)
                r = -EPROTO;
            if (r == 0)
                r = dl__coll_recv_all(b->fds[who], all + (size_t)who * len, len, deadline);
        }
        if (r < 0) {
            snprintf(err, errlen, "bootstrap at %s, round %u, rank %d: %s", b->master, b->round,
                     who - 1, r == -ECONNRESET ? "closed the connection" : strerror(-r));
            return r;
        }
    }
    /* The answer goes to every rank; one that died in between fails here and only here. */
    for (who = 1; who < n; who++) {
        r = send_msg(b, b->fds[who], all, (size_t)n * len, deadline);
        if (r < 0) {
            snprintf(err, errlen, "bootstrap at %s, round %u, answer to rank %d: %s", b->master,
                     b->round, who, strerror(-r));
            return r;
        }
    }
    return 0;
}

static int listen_master(tcp_boot_t *b, const dl__coll_addr_t *addr, char *err, size_t errlen)
{
    int backlog = b->base.size < 4096 ? b->base.size + 16 : 4096;
    int r = dl__coll_listen(addr, backlog, &b->lfd, NULL);
    if (r == -EADDRNOTAVAIL) {
        /* MASTER_ADDR names this host by an address it cannot bind (NAT, a load balancer):
         * listen on every interface of the family instead, as torch's store does. */
        dl__coll_addr_t any = *addr;
        if (any.ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&any.ss)->sin_addr.s_addr = htonl(INADDR_ANY);
        else
            ((struct sockaddr_in6 *)&any.ss)->sin6_addr = in6addr_any;
        r = dl__coll_listen(&any, backlog, &b->lfd, NULL);
    }
    if (r < 0)
        snprintf(err, errlen, "bootstrap: listen on MASTER_ADDR:MASTER_PORT %s: %s", b->master,
                 strerror(-r));
    return r;
}

int dl__coll_boot_tcp_open(const dl_coll_options_t *o, dl__coll_boot_t **ret_boot, char *err,
                           size_t errlen)
{
    tcp_boot_t *b = calloc(1, sizeof(*b));
    int r = -ENOMEM;
    if (b == NULL || (b->fds = malloc(sizeof(int) * (size_t)o->world_size)) == NULL)
        goto fail;
    b->base.rank = o->rank;
    b->base.size = o->world_size;
    b->base.allgather = tcp_allgather;
    b->base.close = tcp_close;
    b->timeout_ms = o->timeout_ms;
    b->lfd = -1;
    for (int i = 0; i < o->world_size; i++)
        b->fds[i] = -1;
    char key[DL_COLL_RUN_ID_MAX + 64];
    int klen = snprintf(key, sizeof(key), "%s|%d|%d", o->run_id, o->world_size, o->master_port);
    b->job_key = dl__coll_hash64(key, (size_t)klen, 0);
    snprintf(b->master, sizeof(b->master), "%s:%d", o->master_addr, o->master_port);

    if (o->world_size > 1) {
        dl__coll_addr_t addr;
        if (o->master_addr[0] == '\0' || o->master_port <= 0) {
            snprintf(err, errlen,
                     "bootstrap: MASTER_ADDR and MASTER_PORT must be set when "
                     "WORLD_SIZE is above 1");
            r = -EINVAL;
            goto fail;
        }
        r = dl__coll_resolve(o->master_addr, o->master_port, &addr);
        if (r < 0) {
            snprintf(err, errlen, "bootstrap: cannot resolve MASTER_ADDR '%s'", o->master_addr);
            goto fail;
        }
        if (o->rank == 0) {
            r = listen_master(b, &addr, err, errlen);
        } else {
            r = dl__coll_connect(&addr, dl__coll_now_ms() + o->timeout_ms, &b->fds[0]);
            if (r < 0)
                snprintf(err, errlen, "bootstrap: connect to rank 0 at %s: %s%s", b->master,
                         strerror(-r), r == -ETIMEDOUT ? " (is rank 0 running?)" : "");
        }
        if (r < 0)
            goto fail;
    }
    *ret_boot = &b->base;
    return 0;
fail:
    if (r == -ENOMEM)
        snprintf(err, errlen, "bootstrap: out of memory");
    tcp_close(b != NULL ? &b->base : NULL);
    return r;
}
