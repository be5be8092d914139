/* The process group: setup through the bootstrap, the host topology, and each operation
 * dispatched to shared memory, TCP, or both.
 *
 * Ranks with the same host identity (hostname and boot id, or DLAUNCH_COLL_HOST_ID) form a host
 * group over shared memory; the lowest rank of each host is its leader, and the leaders form a TCP
 * group. A job on one host uses shared memory only; a job with one rank per host uses TCP only;
 * anything else is hierarchical: within the host, across leaders, back out within the host.
 * Whatever the path, a result is computed once and copied, so ranks agree bit for bit; by
 * default across hosts in rank order too (order.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define BLOB_BYTES 48

const char *dl_coll_dtype_name(dl_coll_dtype_t d)
{
    static const char *names[] = {"float32", "float64", "int32", "int64"};
    return (unsigned)d < 4 ? names[d] : "?";
}

const char *dl_coll_op_name(dl_coll_op_t op)
{
    static const char *names[] = {"sum", "avg", "min", "max"};
    return (unsigned)op < 4 ? names[op] : "?";
}

size_t dl_coll_dtype_size(dl_coll_dtype_t d)
{
    return d == DL_COLL_FLOAT64 || d == DL_COLL_INT64 ? 8 : 4;
}

int dl_coll_rank(const dl_coll_group_t *g)
{
    return g->rank;
}

int dl_coll_world_size(const dl_coll_group_t *g)
{
    return g->size;
}

int dl_coll_local_rank(const dl_coll_group_t *g)
{
    return g->local_rank;
}

int dl_coll_local_size(const dl_coll_group_t *g)
{
    return g->local_size;
}

int dl_coll_num_hosts(const dl_coll_group_t *g)
{
    return g->nhosts;
}

const char *dl_coll_transport_name(const dl_coll_group_t *g)
{
    if (g->size == 1)
        return "self";
    if (g->nhosts == 1)
        return "shm";
    return g->nhosts == g->size ? "tcp" : "shm+tcp";
}

const char *dl_coll_group_error(const dl_coll_group_t *g)
{
    return g->err.code != 0 ? g->err.msg : "";
}

/* ---- setup ----------------------------------------------------------------------------------- */

static void put_be(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * (bytes - 1 - i)));
}

static uint64_t get_be(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | p[i];
    return v;
}

typedef struct {
    uint64_t host_a, host_b; /* the host as far as sharing memory goes */
    uint64_t machine;        /* the real machine, whatever the options say */
    int pid;
    dl__coll_addr_t addr;
} blob_t;

static void blob_pack(const blob_t *b, unsigned char *p)
{
    memset(p, 0, BLOB_BYTES);
    put_be(p, b->host_a, 8);
    put_be(p + 8, b->host_b, 8);
    put_be(p + 16, (uint64_t)(uint32_t)b->pid, 4);
    if (b->addr.ss.ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&b->addr.ss;
        put_be(p + 20, 4, 2);
        put_be(p + 22, ntohs(s4->sin_port), 2);
        memcpy(p + 24, &s4->sin_addr, 4);
    } else if (b->addr.ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&b->addr.ss;
        put_be(p + 20, 6, 2);
        put_be(p + 22, ntohs(s6->sin6_port), 2);
        memcpy(p + 24, &s6->sin6_addr, 16);
    }
    put_be(p + 40, b->machine, 8);
}

static void blob_unpack(const unsigned char *p, blob_t *b)
{
    memset(b, 0, sizeof(*b));
    b->host_a = get_be(p, 8);
    b->host_b = get_be(p + 8, 8);
    b->pid = (int)(uint32_t)get_be(p + 16, 4);
    int fam = (int)get_be(p + 20, 2), port = (int)get_be(p + 22, 2);
    if (fam == 4) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&b->addr.ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        memcpy(&s4->sin_addr, p + 24, 4);
        b->addr.len = sizeof(*s4);
    } else if (fam == 6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&b->addr.ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        memcpy(&s6->sin6_addr, p + 24, 16);
        b->addr.len = sizeof(*s6);
    }
    b->machine = get_be(p + 40, 8);
}

/* hostname + boot id tells hosts apart even when containers share a hostname; two boots of one
 * machine never meet in a job. */
static void host_identity(const dl_coll_options_t *o, uint64_t *a, uint64_t *b, uint64_t *machine)
{
    char id[DL_COLL_HOST_ID_MAX + 128] = "", host[65] = "", boot[64] = "";
    gethostname(host, sizeof(host) - 1);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, boot, sizeof(boot) - 1);
        boot[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    snprintf(id, sizeof(id), "host:%s/%s", host, boot);
    *machine = dl__coll_hash64(id, strlen(id), 3);
    if (o->host_id[0] != '\0')
        snprintf(id, sizeof(id), "id:%s", o->host_id);
    /* Forced TCP: every rank is a host of its own. */
    if (o->transport == DL_COLL_TRANSPORT_TCP) {
        size_t l = strlen(id);
        snprintf(id + l, sizeof(id) - l, "#rank%d", o->rank);
    }
    *a = dl__coll_hash64(id, strlen(id), 1);
    *b = dl__coll_hash64(id, strlen(id), 2);
}

static int online_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

/* Every rank says whether its last setup step worked; all fail together instead of some
 * waiting out the timeout for a peer that already gave up. */
static int agree(dl_coll_group_t *g, dl__coll_boot_t *boot, int status, const char *step, char *err,
                 size_t errlen)
{
    unsigned char mine = status < 0 ? 1 : 0;
    unsigned char *all = malloc((size_t)g->size);
    if (all == NULL)
        return -ENOMEM;
    char berr[256] = "";
    int r = boot->allgather(boot, &mine, 1, all, berr, sizeof(berr));
    if (r < 0) {
        snprintf(err, errlen, "%s", status < 0 ? g->err.msg : berr);
        free(all);
        return status < 0 ? status : r;
    }
    for (int i = 0; i < g->size && r == 0; i++) {
        if (all[i] == 0)
            continue;
        if (status < 0)
            snprintf(err, errlen, "%s", g->err.msg);
        else
            snprintf(err, errlen, "%s failed on rank %d", step, i);
        r = status < 0 ? status : -ECONNABORTED;
    }
    free(all);
    return r;
}

static int build_topology(dl_coll_group_t *g, const blob_t *blobs, char *err, size_t errlen)
{
    int n = g->size;
    g->host_of = malloc(sizeof(int) * (size_t)n);
    g->local_of = malloc(sizeof(int) * (size_t)n);
    g->host_leader = malloc(sizeof(int) * (size_t)n);
    g->host_sizes = calloc((size_t)n, sizeof(int));
    g->host_start = calloc((size_t)n + 1, sizeof(int));
    g->host_order = malloc(sizeof(int) * (size_t)n);
    if (g->host_of == NULL || g->local_of == NULL || g->host_leader == NULL ||
        g->host_sizes == NULL || g->host_start == NULL || g->host_order == NULL)
        return -ENOMEM;
    g->nhosts = 0;
    /* Hosts are numbered by their lowest rank, so every rank derives the same numbering. */
    for (int r = 0; r < n; r++) {
        int h = -1;
        for (int q = 0; q < g->nhosts && h < 0; q++) {
            const blob_t *l = &blobs[g->host_leader[q]];
            if (l->host_a == blobs[r].host_a && l->host_b == blobs[r].host_b)
                h = q;
        }
        if (h < 0) {
            h = g->nhosts++;
            g->host_leader[h] = r;
        }
        g->host_of[r] = h;
        g->local_of[r] = g->host_sizes[h]++;
    }
    for (int h = 0; h < g->nhosts; h++)
        g->host_start[h + 1] = g->host_start[h] + g->host_sizes[h];
    g->hosts_in_rank_order = 1;
    for (int r = 0; r < n; r++) {
        g->host_order[g->host_start[g->host_of[r]] + g->local_of[r]] = r;
        if (g->host_start[g->host_of[r]] + g->local_of[r] != r)
            g->hosts_in_rank_order = 0;
    }
    g->host = g->host_of[g->rank];
    g->local_rank = g->local_of[g->rank];
    g->local_size = g->host_sizes[g->host];
    /* With more ranks than cores on the machine, a spinning wait only keeps the rank it waits
     * for off the core. */
    int here = 0;
    for (int r = 0; r < n; r++)
        here += blobs[r].machine == blobs[g->rank].machine;
    g->busy = here <= online_cpus();
    if (g->opts.transport == DL_COLL_TRANSPORT_SHM && g->nhosts > 1) {
        snprintf(err, errlen, "DLAUNCH_COLL_TRANSPORT=shm, but the %d ranks are on %d hosts", n,
                 g->nhosts);
        return -EINVAL;
    }
    return 0;
}

static int setup_shm(dl_coll_group_t *g, dl__coll_boot_t *boot, const blob_t *blobs, char *err,
                     size_t errlen)
{
    int ln = g->local_size, *pids = NULL, *ranks = NULL;
    const int *members = &g->host_order[g->host_start[g->host]];
    /* Slots hold whole cache pages, and at least a few elements of every member. */
    size_t chunk = g->opts.shm_chunk_bytes;
    if (chunk < (size_t)ln * 64)
        chunk = (size_t)ln * 64;
    chunk = (chunk + 4095) / 4096 * 4096;
    const blob_t *lead = &blobs[members[0]];
    char name[96];
    /* Port and leader pid keep concurrent jobs apart; the host hash keeps fake hosts (tests) on
     * one machine apart. */
    snprintf(name, sizeof(name), "/dlcoll-%d-%d-%08" PRIx32 "-%d", g->opts.master_port, lead->pid,
             (uint32_t)lead->host_a, g->opts.generation);
    void *map = NULL;
    int r = 0;
    if (ln > 1 && g->local_rank == 0)
        r = dl__coll_shm_create(name, ln, chunk, &map, &g->err);
    r = agree(g, boot, r, "creating shared memory", err, errlen);
    if (r == 0 && ln > 1 && g->local_rank != 0)
        r = dl__coll_shm_attach(name, ln, chunk, &map, &g->err);
    int r2 = agree(g, boot, r, "mapping shared memory", err, errlen);
    /* Every member has it mapped (or failed): the name goes now, so nothing outlives the job. */
    if (ln > 1 && g->local_rank == 0)
        shm_unlink(name);
    if (r2 < 0) {
        if (map != NULL)
            munmap(map, dl__coll_shm_segment_size(ln, chunk));
        return r2;
    }
    if (ln == 1)
        return 0;
    pids = malloc(sizeof(int) * (size_t)ln);
    ranks = malloc(sizeof(int) * (size_t)ln);
    if (pids == NULL || ranks == NULL) {
        free(pids);
        free(ranks);
        munmap(map, dl__coll_shm_segment_size(ln, chunk));
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < ln; i++) {
        pids[i] = blobs[members[i]].pid;
        ranks[i] = members[i];
    }
    r = dl__coll_shm_open(map, chunk, g->local_rank, ln, pids, ranks, &g->opts, g->busy, &g->err,
                          &g->shm);
    if (r < 0) {
        snprintf(err, errlen, "%s", g->err.msg);
    } else {
        g->mem.members = ln;
        dl__coll_shm_use_mem(g->shm, &g->mem);
    }
    free(pids);
    free(ranks);
    return r;
}

static int setup_tcp(dl_coll_group_t *g, dl__coll_boot_t *boot, const blob_t *blobs, int lfd,
                     uint64_t job_key, char *err, size_t errlen)
{
    int r = 0;
    if (g->nhosts > 1 && g->local_rank == 0) {
        dl__coll_addr_t *addrs = malloc(sizeof(*addrs) * (size_t)g->nhosts);
        if (addrs == NULL) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        for (int h = 0; h < g->nhosts; h++)
            addrs[h] = blobs[g->host_leader[h]].addr;
        r = dl__coll_tcp_open(g->host, g->nhosts, addrs, g->host_leader, lfd, job_key, &g->opts,
                              g->busy, &g->err, &g->tcp);
        free(addrs);
    }
    return agree(g, boot, r, "connecting TCP peers", err, errlen);
}

/* Listens on the interface that leads to rank 0, the one peers can reach us on, or on the one
 * the launcher names (it told Gloo and NCCL the same). Failures go to g->err. */
static int listen_near_master(dl_coll_group_t *g, int *ret_fd, dl__coll_addr_t *ret_bound)
{
    const dl_coll_options_t *o = &g->opts;
    dl__coll_addr_t master, local;
    int r = dl__coll_resolve(o->master_addr, o->master_port, &master);
    if (r == 0)
        r = dl__coll_route_addr(&master, &local);
    if (r == 0 && o->ifname[0] != '\0') {
        r = dl__coll_iface_addr(o->ifname, &local, &local);
        if (r < 0)
            return dl__coll_fail(&g->err, r, "DLAUNCH_SOCKET_IFNAME=%s: %s", o->ifname,
                                 r == -ENODEV          ? "no such interface"
                                 : r == -EADDRNOTAVAIL ? "the interface has no address to listen on"
                                                       : strerror(-r));
    }
    if (r == 0)
        r = dl__coll_listen(&local, 128, ret_fd, ret_bound);
    if (r < 0)
        return dl__coll_fail(&g->err, r, "listen for TCP peers near MASTER_ADDR %s: %s",
                             o->master_addr, strerror(-r));
    return 0;
}

/* Everything between the bootstrap and a ready group; blobs[] ends up with every rank's. */
static int setup(dl_coll_group_t *g, dl__coll_boot_t *boot, char *err, size_t errlen)
{
    const dl_coll_options_t *o = &g->opts;
    int lfd = -1, r = 0;
    blob_t mine = {.pid = getpid()};
    unsigned char raw[BLOB_BYTES], *table = NULL;
    blob_t *blobs = NULL;
    char key[DL_COLL_RUN_ID_MAX + 64];
    int klen = snprintf(key, sizeof(key), "%s|%d|%d|%d", o->run_id, o->world_size, o->master_port,
                        o->generation);
    uint64_t job_key = dl__coll_hash64(key, (size_t)klen, 7);

    host_identity(o, &mine.host_a, &mine.host_b, &mine.machine);
    /* A rank that cannot listen still takes part in the first all-gather, and then everyone
     * fails together, naming it, instead of the others waiting out their timeout. */
    int lr = g->size > 1 ? listen_near_master(g, &lfd, &mine.addr) : 0;
    blob_pack(&mine, raw);
    table = malloc((size_t)g->size * BLOB_BYTES);
    blobs = malloc(sizeof(*blobs) * (size_t)g->size);
    if (table == NULL || blobs == NULL) {
        r = -ENOMEM;
        snprintf(err, errlen, "out of memory");
    }
    if (r == 0)
        r = boot->allgather(boot, raw, BLOB_BYTES, table, err, errlen);
    if (r == 0)
        r = agree(g, boot, lr, "listening for TCP peers", err, errlen);
    for (int i = 0; r == 0 && i < g->size; i++)
        blob_unpack(table + (size_t)i * BLOB_BYTES, &blobs[i]);
    if (r == 0) {
        r = build_topology(g, blobs, err, errlen);
        if (r == -ENOMEM)
            snprintf(err, errlen, "out of memory");
        /* A topology error is the same on every rank: no need to agree on it. */
    }
    if (r == 0)
        r = setup_shm(g, boot, blobs, err, errlen);
    if (r == 0)
        r = setup_tcp(g, boot, blobs, lfd, job_key, err, errlen);
    if (lfd >= 0)
        close(lfd);
    free(table);
    free(blobs);
    return r;
}

int dl_coll_group_create(const dl_coll_options_t *opts, dl_coll_group_t **ret_group, char *err,
                         size_t errlen)
{
    if (opts->world_size < 1 || opts->rank < 0 || opts->rank >= opts->world_size ||
        opts->timeout_ms <= 0 || opts->shm_chunk_bytes < 4096 || opts->tcp_chunk_bytes < 4096) {
        snprintf(err, errlen, "bad group options: rank %d, world size %d, timeout %d ms",
                 opts->rank, opts->world_size, opts->timeout_ms);
        return -EINVAL;
    }
    dl_coll_group_t *g = calloc(1, sizeof(*g));
    dl__coll_boot_t *boot = NULL;
    if (g == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    g->opts = *opts;
    g->rank = opts->rank;
    g->size = opts->world_size;
    g->nhosts = 1;
    g->local_size = 1;
    g->mem.members = 1; /* setup_shm raises it to the host's ranks */
    g->rec.fd = -1;
    g->rec.mem_fd = -1;
    int r = dl__coll_async_init(g);
    if (r < 0)
        snprintf(err, errlen, "async state: %s", strerror(-r));
    if (r == 0)
        r = opts->store[0] != '\0' && opts->world_size > 1
                ? dl__coll_boot_store_open(opts, &boot, err, errlen)
                : dl__coll_boot_tcp_open(opts, &boot, err, errlen);
    if (r == 0)
        r = setup(g, boot, err, errlen);
    if (boot != NULL)
        boot->close(boot);
    if (r < 0) {
        dl_coll_group_destroy(g);
        return r;
    }
    dl__coll_rec_open(&g->rec, &g->opts, g->rank, g->size, dl_coll_transport_name(g));
    *ret_group = g;
    return 0;
}

int dl_coll_group_from_env(dl_coll_group_t **ret_group, char *err, size_t errlen)
{
    dl_coll_options_t o;
    dl_coll_options_init(&o);
    int r = dl_coll_options_from_env(&o, NULL, err, errlen);
    if (r < 0)
        return r;
    return dl_coll_group_create(&o, ret_group, err, errlen);
}

void dl_coll_group_destroy(dl_coll_group_t *g)
{
    if (g == NULL)
        return;
    dl__coll_async_shutdown(g);
    dl__coll_rec_close(&g->rec);
    dl__coll_mem_release(&g->mem);
    dl__coll_shm_close(g->shm);
    dl__coll_tcp_close(g->tcp);
    free(g->host_of);
    free(g->local_of);
    free(g->host_leader);
    free(g->host_sizes);
    free(g->host_start);
    free(g->host_order);
    free(g->scratch);
    free(g->order_buf);
    free(g->order_ptrs);
    free(g->order_offs);
    free(g);
}

void dl_coll_group_abort(dl_coll_group_t *g, const char *why)
{
    if (g == NULL)
        return;
    /* The text first, then the flag that publishes it; one abort wins. */
    int expected = 0;
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE))
        goto raise;
    snprintf(g->abort_why, sizeof(g->abort_why), "%s",
             why != NULL && why[0] != '\0' ? why : "the group was aborted");
    __atomic_compare_exchange_n(&g->aborted, &expected, 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
raise:
    dl__coll_shm_abort(g->shm);
    dl__coll_tcp_abort(g->tcp);
}

/* ---- operations ------------------------------------------------------------------------------ */

/* A failure anywhere takes the whole group down, and the peers with it: their waits on this rank
 * end at once instead of at their timeout. */
int dl__coll_broken(dl_coll_group_t *g, int r)
{
    if (r >= 0)
        return r;
    /* Aborted on purpose: say so, not what the transport made of it ("another rank failed"). */
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE) == 1) {
        g->aborted = 2;
        /* What shut sockets and a raised flag look like from here: our own doing. */
        if (g->err.code == 0 || g->err.code == -ECONNABORTED || g->err.code == -ECONNRESET ||
            g->err.code == -EPIPE) {
            g->err.code = -ECANCELED;
            snprintf(g->err.msg, sizeof(g->err.msg), "%s", g->abort_why);
        }
    }
    if (g->err.code == 0)
        dl__coll_fail(&g->err, r, "%s", strerror(-r));
    dl__coll_shm_abort(g->shm);
    dl__coll_tcp_abort(g->tcp);
    return g->err.code;
}

static int scratch(dl_coll_group_t *g, size_t need, char **ret)
{
    if (g->scratch_cap < need) {
        char *p = NULL;
        if (posix_memalign((void **)&p, 64, need) != 0)
            return dl__coll_fail(&g->err, -ENOMEM, "out of memory for %zu bytes", need);
        memset(p, 0, need); /* touched once, here, not inside the next operation */
        free(g->scratch);
        g->scratch = p;
        g->scratch_cap = need;
    }
    *ret = g->scratch;
    return 0;
}

/* All-reduce with AVG left as a sum: the callers divide once, at the very end. */
static int allreduce_sum(dl_coll_group_t *g, const void *src, void *dst, size_t count,
                         dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    size_t bytes = count * dl_coll_dtype_size(dtype);
    int r = 0;
    if (g->size == 1 || count == 0) {
        if (src != dst && bytes > 0)
            memcpy(dst, src, bytes);
        return 0;
    }
    if (g->nhosts == 1)
        return dl__coll_shm_allreduce(g->shm, src, dst, count, dtype, op, 0);
    if (g->opts.order == DL_COLL_ORDER_RANK)
        return dl__coll_allreduce_hosts(g, src, dst, count, dtype, op);
    /* Any order: each host's sum, then the leaders' fastest all-reduce of those. */
    if (g->shm != NULL)
        r = dl__coll_shm_allreduce(g->shm, src, dst, count, dtype, op, 1);
    else if (src != dst)
        memcpy(dst, src, bytes);
    if (r == 0 && g->tcp != NULL)
        r = dl__coll_tcp_allreduce(g->tcp, dst, dst, count, dtype, op);
    if (r == 0 && g->shm != NULL)
        r = dl__coll_shm_broadcast(g->shm, dst, bytes, 0);
    return r;
}

int dl__coll_run_allreduce(dl_coll_group_t *g, const void *src, void *dst, size_t count,
                           dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    if (g->err.code != 0)
        return g->err.code;
    int r = allreduce_sum(g, src, dst, count, dtype, op);
    if (r == 0 && op == DL_COLL_AVG)
        dl__coll_scale(dst, count, dtype, g->size);
    return dl__coll_broken(g, r);
}

dl_coll_rec_algo_t dl__coll_allreduce_algo(const dl_coll_group_t *g, size_t count,
                                           dl_coll_dtype_t dtype)
{
    if (g->size == 1 || count == 0)
        return DL_COLL_REC_ALGO_LOCAL;
    if (g->nhosts == 1)
        return dl__coll_shm_allreduce_algo(g->shm, count * dl_coll_dtype_size(dtype), 0);
    if (g->nhosts != g->size)
        return DL_COLL_REC_ALGO_HIER;
    return dl__coll_tcp_allreduce_algo(g->tcp, count, dl_coll_dtype_size(dtype));
}

static int valid(dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    return (unsigned)dtype <= DL_COLL_INT64 && (unsigned)op <= DL_COLL_MAX;
}

int dl_coll_allreduce(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                      dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    if (!valid(dtype, op) || (count > 0 && (sendbuf == NULL || recvbuf == NULL)))
        return -EINVAL;
    dl__coll_drain(g);
    uint64_t seq =
        dl__coll_rec_begin(&g->rec, DL_COLL_REC_ALLREDUCE, count * dl_coll_dtype_size(dtype),
                           dl__coll_allreduce_algo(g, count, dtype), dtype, -1);
    int r = dl__coll_run_allreduce(g, sendbuf, recvbuf, count, dtype, op);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

static int broadcast(dl_coll_group_t *g, void *buf, size_t bytes, int root)
{
    if (g->err.code != 0)
        return g->err.code;
    int r = 0, rh = g->host_of != NULL ? g->host_of[root] : 0;
    if (g->size == 1 || bytes == 0)
        return 0;
    if (g->shm != NULL && g->host == rh)
        r = dl__coll_shm_broadcast(g->shm, buf, bytes, g->local_of[root]);
    if (r == 0 && g->tcp != NULL)
        r = dl__coll_tcp_broadcast(g->tcp, buf, bytes, rh);
    if (r == 0 && g->shm != NULL && g->host != rh)
        r = dl__coll_shm_broadcast(g->shm, buf, bytes, 0);
    return dl__coll_broken(g, r);
}

int dl_coll_broadcast(dl_coll_group_t *g, void *buf, size_t count, dl_coll_dtype_t dtype, int root)
{
    if (!valid(dtype, DL_COLL_SUM) || root < 0 || root >= g->size || (count > 0 && buf == NULL))
        return -EINVAL;
    dl__coll_drain(g);
    size_t bytes = count * dl_coll_dtype_size(dtype);
    uint64_t seq = dl__coll_rec_begin(
        &g->rec, DL_COLL_REC_BROADCAST, bytes,
        g->size == 1 || bytes == 0 ? DL_COLL_REC_ALGO_LOCAL : DL_COLL_REC_ALGO_NONE, dtype, root);
    int r = broadcast(g, buf, bytes, root);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

/* Host-major layout: each host's blocks side by side, so that leaders exchange one piece each. */
static int allgather_hier(dl_coll_group_t *g, const char *src, char *dst, size_t bytes)
{
    char *tmp;
    size_t total = bytes * (size_t)g->size;
    int r = scratch(g, total, &tmp);
    if (r < 0)
        return r;
    char *hostblk = tmp + (size_t)g->host_start[g->host] * bytes;
    if (g->shm != NULL)
        r = dl__coll_shm_allgather(g->shm, src, hostblk, bytes, 1);
    else
        memcpy(hostblk, src, bytes);
    if (r == 0 && g->tcp != NULL) {
        size_t *offs = malloc(sizeof(size_t) * 2 * (size_t)g->nhosts);
        if (offs == NULL)
            return dl__coll_fail(&g->err, -ENOMEM, "out of memory");
        size_t *lens = offs + g->nhosts;
        for (int h = 0; h < g->nhosts; h++) {
            offs[h] = (size_t)g->host_start[h] * bytes;
            lens[h] = (size_t)g->host_sizes[h] * bytes;
        }
        r = dl__coll_tcp_allgatherv(g->tcp, hostblk, tmp, offs, lens);
        free(offs);
        for (int pos = 0; r == 0 && pos < g->size; pos++)
            memcpy(dst + (size_t)g->host_order[pos] * bytes, tmp + (size_t)pos * bytes, bytes);
    }
    if (r == 0 && g->shm != NULL)
        r = dl__coll_shm_broadcast(g->shm, dst, total, 0);
    return r;
}

static int allgather(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                     dl_coll_dtype_t dtype)
{
    if (g->err.code != 0)
        return g->err.code;
    size_t bytes = count * dl_coll_dtype_size(dtype);
    char *dst = recvbuf;
    int r = 0;
    if (bytes == 0)
        return 0;
    if (g->size == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, bytes);
        return 0;
    }
    if (g->nhosts == 1) {
        r = dl__coll_shm_allgather(g->shm, sendbuf, recvbuf, bytes, 0);
    } else if (g->nhosts == g->size) {
        size_t *offs = malloc(sizeof(size_t) * 2 * (size_t)g->size);
        if (offs == NULL)
            return dl__coll_broken(g, dl__coll_fail(&g->err, -ENOMEM, "out of memory"));
        for (int i = 0; i < g->size; i++) {
            offs[i] = (size_t)i * bytes;
            offs[g->size + i] = bytes;
        }
        r = dl__coll_tcp_allgatherv(g->tcp, sendbuf, dst, offs, offs + g->size);
        free(offs);
    } else {
        /* In place, my block is already in dst; copy it out before dst is overwritten. */
        const char *src = sendbuf;
        char *own = NULL;
        if (src == dst + (size_t)g->rank * bytes) {
            own = malloc(bytes);
            if (own == NULL)
                return dl__coll_broken(g, dl__coll_fail(&g->err, -ENOMEM, "out of memory"));
            memcpy(own, src, bytes);
            src = own;
        }
        r = allgather_hier(g, src, dst, bytes);
        free(own);
    }
    return dl__coll_broken(g, r);
}

int dl_coll_allgather(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                      dl_coll_dtype_t dtype)
{
    if (!valid(dtype, DL_COLL_SUM) || (count > 0 && (sendbuf == NULL || recvbuf == NULL)))
        return -EINVAL;
    dl__coll_drain(g);
    size_t bytes = count * dl_coll_dtype_size(dtype);
    uint64_t seq =
        dl__coll_rec_begin(&g->rec, DL_COLL_REC_ALLGATHER, bytes,
                           g->size == 1 || bytes == 0             ? DL_COLL_REC_ALGO_LOCAL
                           : g->nhosts > 1 && g->nhosts < g->size ? DL_COLL_REC_ALGO_HIER
                                                                  : DL_COLL_REC_ALGO_NONE,
                           dtype, -1);
    int r = allgather(g, sendbuf, recvbuf, count, dtype);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

int dl_coll_host_of(const dl_coll_group_t *g, int rank)
{
    if (rank < 0 || rank >= g->size)
        return -1;
    return g->host_of != NULL ? g->host_of[rank] : 0;
}

static int reduce_scatter(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t recvcount,
                          dl_coll_dtype_t dtype, dl_coll_op_t op, int extra_block, void *extra_recv)
{
    if (g->err.code != 0)
        return g->err.code;
    size_t esize = dl_coll_dtype_size(dtype), block = recvcount * esize;
    int r = 0;
    if (recvcount == 0)
        return 0;
    if (extra_block >= g->size || extra_block == g->rank)
        extra_block = -1;
    if (g->size == 1) {
        memcpy(recvbuf, sendbuf, block);
    } else if (g->nhosts == 1 && extra_block >= 0) {
        /* My block, then the other's through a second pass: each reduction is the same left
         * fold over the ranks, so the extra block has its owner's bits. */
        r = dl__coll_shm_reduce_scatter(g->shm, sendbuf, recvbuf, recvcount, dtype, op);
        char *tmp;
        if (r == 0)
            r = scratch(g, block * (size_t)g->size, &tmp);
        if (r == 0)
            r = allreduce_sum(g, sendbuf, tmp, recvcount * (size_t)g->size, dtype, op);
        if (r == 0)
            memcpy(extra_recv, tmp + (size_t)extra_block * block, block);
        extra_block = -1;
    } else if (g->nhosts == 1) {
        r = dl__coll_shm_reduce_scatter(g->shm, sendbuf, recvbuf, recvcount, dtype, op);
    } else if (extra_block < 0 && g->nhosts == g->size &&
               (g->opts.order == DL_COLL_ORDER_ANY || g->size == 2)) {
        /* The ring; with two ranks its sums are in rank order (tcp.c). */
        r = dl__coll_tcp_reduce_scatter(g->tcp, sendbuf, recvbuf, recvcount, dtype, op);
    } else {
        /* Across hosts: a full all-reduce (in rank order unless told otherwise), then my block.
         * Twice the traffic of a true reduce-scatter; fine until a trainer needs it faster. */
        char *tmp;
        r = scratch(g, block * (size_t)g->size, &tmp);
        if (r == 0)
            r = allreduce_sum(g, sendbuf, tmp, recvcount * (size_t)g->size, dtype, op);
        if (r == 0)
            memcpy(recvbuf, tmp + (size_t)g->rank * block, block);
        if (r == 0 && extra_block >= 0)
            memcpy(extra_recv, tmp + (size_t)extra_block * block, block);
    }
    if (r == 0 && op == DL_COLL_AVG)
        dl__coll_scale(recvbuf, recvcount, dtype, g->size);
    if (r == 0 && op == DL_COLL_AVG && extra_block >= 0)
        dl__coll_scale(extra_recv, recvcount, dtype, g->size);
    return dl__coll_broken(g, r);
}

int dl_coll_reduce_scatter(dl_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t recvcount,
                           dl_coll_dtype_t dtype, dl_coll_op_t op)
{
    if (!valid(dtype, op) || (recvcount > 0 && (sendbuf == NULL || recvbuf == NULL)))
        return -EINVAL;
    dl__coll_drain(g);
    size_t bytes = recvcount * dl_coll_dtype_size(dtype) * (size_t)g->size;
    uint64_t seq =
        dl__coll_rec_begin(&g->rec, DL_COLL_REC_REDUCE_SCATTER, bytes,
                           g->size == 1 || bytes == 0             ? DL_COLL_REC_ALGO_LOCAL
                           : g->nhosts > 1 && g->nhosts < g->size ? DL_COLL_REC_ALGO_HIER
                                                                  : DL_COLL_REC_ALGO_NONE,
                           dtype, -1);
    int r = reduce_scatter(g, sendbuf, recvbuf, recvcount, dtype, op, -1, NULL);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

int dl_coll_reduce_scatter_extra(dl_coll_group_t *g, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, dl_coll_dtype_t dtype, dl_coll_op_t op,
                                 int extra_block, void *extra_recv)
{
    if (!valid(dtype, op) || (recvcount > 0 && (sendbuf == NULL || recvbuf == NULL)) ||
        (extra_block >= 0 && recvcount > 0 && extra_recv == NULL))
        return -EINVAL;
    dl__coll_drain(g);
    size_t bytes = recvcount * dl_coll_dtype_size(dtype) * (size_t)g->size;
    uint64_t seq =
        dl__coll_rec_begin(&g->rec, DL_COLL_REC_REDUCE_SCATTER, bytes,
                           g->size == 1 || bytes == 0             ? DL_COLL_REC_ALGO_LOCAL
                           : g->nhosts > 1 && g->nhosts < g->size ? DL_COLL_REC_ALGO_HIER
                                                                  : DL_COLL_REC_ALGO_NONE,
                           dtype, -1);
    int r = reduce_scatter(g, sendbuf, recvbuf, recvcount, dtype, op, extra_block, extra_recv);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}

static int barrier(dl_coll_group_t *g)
{
    if (g->err.code != 0)
        return g->err.code;
    int r = 0;
    if (g->size == 1)
        return 0;
    if (g->shm != NULL)
        r = dl__coll_shm_barrier(g->shm);
    if (r == 0 && g->tcp != NULL)
        r = dl__coll_tcp_barrier(g->tcp);
    /* Everyone on this host waits for its leader, which waited for every other host. */
    if (r == 0 && g->shm != NULL && g->nhosts > 1)
        r = dl__coll_shm_barrier(g->shm);
    return dl__coll_broken(g, r);
}

int dl_coll_barrier(dl_coll_group_t *g)
{
    dl__coll_drain(g);
    uint64_t seq = dl__coll_rec_begin(&g->rec, DL_COLL_REC_BARRIER, 0,
                                      g->size == 1 ? DL_COLL_REC_ALGO_LOCAL : DL_COLL_REC_ALGO_NONE,
                                      DL_COLL_INT32, -1);
    int r = barrier(g);
    dl__coll_rec_end(&g->rec, seq, r);
    return r;
}
