/* The trainer's gradient hooks on the collective library: with overlap every bucket becomes an
 * asynchronous all-reduce on the group's communication thread, so it travels while backward goes
 * on; without, the caller's thread sums the whole gradient in blocking calls (reduce-scatter and
 * all-gather around the sharded update). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "collective.h"
#include "comm-coll.h"

#define MAX_INFLIGHT 4096

/* What the launcher said of the next group (docs/recovery.md, the control channel). */
typedef struct {
    int gen;
    int rank, world, local_rank, local_world;
    char store[DL_COLL_ADDR_MAX + 8];
    char master_addr[DL_COLL_ADDR_MAX];
    int master_port;
    char reason[256];
} membership_t;

struct dl_train_coll_s {
    dl_coll_group_t *group;
    dl_coll_request_t *reqs[MAX_INFLIGHT];
    size_t n;
    /* In-job recovery: the control channel and what forming the group again needs. */
    dl_train_comm_t *comm;
    dl_coll_options_t opts;
    int ctl_fd; /* DLAUNCH_CONTROL_FD, or -1 */
    pthread_t ctl_thread;
    bool ctl_started;
    pthread_mutex_t mu; /* guards group (against the reader's abort), next, stop, eof */
    pthread_cond_t cv;
    pthread_mutex_t wmu; /* one writer at a time on ctl_fd */
    int gen;             /* the generation of the group in use */
    membership_t next;   /* the newest word on the next group; next.gen > gen when news */
    bool stop, eof;
    bool (*stopped)(void); /* the program's stop signal, or NULL */
    char err[512];         /* rejoin's own failures (no group to ask) */
};

void dl_train_coll_set_stop_check(dl_train_coll_t *c, bool (*stopped)(void))
{
    c->stopped = stopped;
}

static int start(void *ctx, size_t bucket, float *buf, size_t n)
{
    dl_train_coll_t *c = ctx;
    if (c->n == MAX_INFLIGHT)
        return -E2BIG;
    int r = dl_coll_allreduce_async(c->group, buf, buf, n, DL_COLL_FLOAT32, DL_COLL_SUM,
                                    &c->reqs[c->n]);
    if (r < 0)
        return r;
    c->n++;
    return 0;
}

static int allreduce(void *ctx, float *buf, size_t n)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_allreduce(c->group, buf, buf, n, DL_COLL_FLOAT32, DL_COLL_SUM);
}

static int reduce_scatter(void *ctx, const float *send, float *recv, size_t count)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_reduce_scatter(c->group, send, recv, count, DL_COLL_FLOAT32, DL_COLL_SUM);
}

static int allgather(void *ctx, float *buf, size_t count)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_allgather(c->group, buf + (size_t)dl_coll_rank(c->group) * count, buf, count,
                             DL_COLL_FLOAT32);
}

static int wait_all(void *ctx)
{
    dl_train_coll_t *c = ctx;
    int first = 0;
    /* Every request is waited on, even after a failure, so none is left behind. */
    for (size_t i = 0; i < c->n; i++) {
        int r = dl_coll_wait(c->reqs[i]);
        if (r < 0 && first == 0)
            first = r;
    }
    c->n = 0;
    return first;
}

/* Bytes travel as int32 words; a ragged tail goes through a padded copy. */
static int broadcast(void *ctx, void *buf, size_t len, int root)
{
    dl_train_coll_t *c = ctx;
    size_t words = len / 4, tail = len % 4;
    int r = words > 0 ? dl_coll_broadcast(c->group, buf, words, DL_COLL_INT32, root) : 0;
    if (r < 0 || tail == 0)
        return r;
    int32_t last = 0;
    memcpy(&last, (char *)buf + words * 4, tail);
    r = dl_coll_broadcast(c->group, &last, 1, DL_COLL_INT32, root);
    if (r == 0)
        memcpy((char *)buf + words * 4, &last, tail);
    return r;
}

static const char *error(void *ctx)
{
    dl_train_coll_t *c = ctx;
    if (c->err[0] != '\0' || c->group == NULL)
        return c->err;
    return dl_coll_group_error(c->group);
}

/* ---- In-job recovery (docs/recovery.md) --------------------------------------------------- */

static int allgather_bytes(void *ctx, void *buf, size_t len)
{
    dl_train_coll_t *c = ctx;
    if (len % 4 != 0)
        return -EINVAL;
    return dl_coll_allgather(c->group, (char *)buf + (size_t)dl_coll_rank(c->group) * len, buf,
                             len / 4, DL_COLL_INT32);
}

static int mem_alloc(void *ctx, size_t bytes, void **ret_ptr)
{
    dl_train_coll_t *c = ctx;
    char why[256];
    int r = dl_coll_mem_alloc(c->group, bytes, ret_ptr, why, sizeof(why));
    if (r < 0 && dl_coll_group_error(c->group)[0] == '\0')
        snprintf(c->err, sizeof(c->err), "%s", why);
    return r;
}

static int mem_peer_rw(void *ctx, const void *mine, int rank, void **ret_ptr, size_t *ret_len)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_mem_peer_rw(c->group, mine, rank, ret_ptr, ret_len);
}

static int mem_peer(void *ctx, const void *mine, int rank, const void **ret_ptr, size_t *ret_len)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_mem_peer(c->group, mine, rank, ret_ptr, ret_len);
}

static int host_of(void *ctx, int rank)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_host_of(c->group, rank);
}

static int reduce_scatter_extra(void *ctx, const float *send, float *recv, size_t count,
                                int extra_block, float *extra_recv)
{
    dl_train_coll_t *c = ctx;
    return dl_coll_reduce_scatter_extra(c->group, send, recv, count, DL_COLL_FLOAT32, DL_COLL_SUM,
                                        extra_block, extra_recv);
}

/* One line to the launcher, in one write. */
static void ctl_say(dl_train_coll_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void ctl_say(dl_train_coll_t *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    if (c->ctl_fd < 0)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&c->wmu);
    ssize_t w = write(c->ctl_fd, line, (size_t)n);
    (void)w; /* a launcher that went away: nobody to tell */
    pthread_mutex_unlock(&c->wmu);
}

static void recovered(void *ctx, uint64_t step, int source, double ms, int64_t was)
{
    dl_train_coll_t *c = ctx;
    ctl_say(c, "recovered gen=%d rank=%d step=%llu was=%lld source=%d ms=%.1f", c->gen,
            dl_coll_rank(c->group), (unsigned long long)step, (long long)was, source, ms);
}

static bool word_int(const char *v, int lo, int *ret)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < lo || x > INT_MAX)
        return false;
    *ret = (int)x;
    return true;
}

/* "recover gen=2 rank=1 world=2 local_rank=1 local_world=2 store=H:P master_addr=A
 * master_port=P reason=TEXT..." (reason last: the rest of the line). Returns 0 or -EINVAL. */
static int parse_recover(char *line, membership_t *m)
{
    memset(m, 0, sizeof(*m));
    m->gen = m->rank = m->world = -1;
    m->local_rank = 0;
    m->local_world = 1;
    m->master_port = -1;
    char *p = line;
    while (*p != '\0') {
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        if (strncmp(p, "reason=", 7) == 0) {
            snprintf(m->reason, sizeof(m->reason), "%s", p + 7);
            break;
        }
        char *end = strchr(p, ' ');
        if (end != NULL)
            *end = '\0';
        char *eq = strchr(p, '=');
        if (eq != NULL) {
            *eq = '\0';
            const char *k = p, *v = eq + 1;
            bool ok = true;
            if (strcmp(k, "gen") == 0)
                ok = word_int(v, 1, &m->gen);
            else if (strcmp(k, "rank") == 0)
                ok = word_int(v, 0, &m->rank);
            else if (strcmp(k, "world") == 0)
                ok = word_int(v, 1, &m->world);
            else if (strcmp(k, "local_rank") == 0)
                ok = word_int(v, 0, &m->local_rank);
            else if (strcmp(k, "local_world") == 0)
                ok = word_int(v, 1, &m->local_world);
            else if (strcmp(k, "master_port") == 0)
                ok = word_int(v, 1, &m->master_port);
            else if (strcmp(k, "store") == 0)
                ok = (size_t)snprintf(m->store, sizeof(m->store), "%s", v) < sizeof(m->store);
            else if (strcmp(k, "master_addr") == 0)
                ok = (size_t)snprintf(m->master_addr, sizeof(m->master_addr), "%s", v) <
                     sizeof(m->master_addr);
            if (!ok)
                return -EINVAL;
        }
        if (end == NULL)
            break;
        p = end + 1;
    }
    return m->gen > 0 && m->rank >= 0 && m->world > m->rank ? 0 : -EINVAL;
}

/* The control channel's reader: the launcher's word comes whenever it comes, also while the
 * trainer waits inside a collective; the group it breaks is aborted at once, so that wait ends
 * within a few milliseconds instead of at the collective's timeout. */
static void *ctl_main(void *arg)
{
    dl_train_coll_t *c = arg;
    char buf[4096];
    size_t have = 0;

    for (;;) {
        ssize_t n = read(c->ctl_fd, buf + have, sizeof(buf) - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            membership_t m;
            pthread_mutex_lock(&c->mu);
            if (strncmp(line, "recover ", 8) == 0 && parse_recover(line + 8, &m) == 0 &&
                m.gen > c->next.gen) {
                c->next = m;
                if (c->group != NULL && c->gen < m.gen) {
                    char why[320];
                    snprintf(why, sizeof(why), "the launcher broke the group for generation %d%s%s",
                             m.gen, m.reason[0] ? ": " : "", m.reason);
                    dl_coll_group_abort(c->group, why);
                }
                pthread_cond_broadcast(&c->cv);
            } else if (strncmp(line, "stop", 4) == 0 && (line[4] == '\0' || line[4] == ' ')) {
                c->stop = true;
                if (c->group != NULL)
                    dl_coll_group_abort(c->group, "the launcher stopped the job's in-job recovery");
                pthread_cond_broadcast(&c->cv);
            }
            pthread_mutex_unlock(&c->mu);
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
        if (have == sizeof(buf) - 1)
            have = 0; /* a line this long is no message of ours */
    }
    pthread_mutex_lock(&c->mu);
    c->eof = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int wait_all(void *ctx);

/* Leaves the broken group for the one the launcher names (docs/recovery.md). */
static int rejoin(void *ctx)
{
    dl_train_coll_t *c = ctx;
    membership_t m;
    struct timespec until;
    int r = 0;

    wait_all(c);
    /* The launcher may not know yet (a rank on another node died with its node): say what
     * broke, unless it is the launcher's own doing. */
    pthread_mutex_lock(&c->mu);
    bool told = c->next.gen > c->gen;
    pthread_mutex_unlock(&c->mu);
    if (!told && c->group != NULL) {
        char why[300];
        snprintf(why, sizeof(why), "%s", dl_coll_group_error(c->group));
        for (char *p = why; *p != '\0'; p++)
            if (*p == '\n')
                *p = ' ';
        ctl_say(c, "broken gen=%d rank=%d reason=%s", c->gen, dl_coll_rank(c->group), why);
    }
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += c->opts.timeout_ms / 1000;
    until.tv_nsec += (long)(c->opts.timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    bool signalled = false;
    while (c->next.gen <= c->gen && !c->stop && !c->eof && r == 0 && !signalled) {
        /* In slices: a stop signal (the agent stopping its workers, its rendezvous lost) wakes
         * no condition variable, and the agent's SIGKILL would come only after its grace. */
        struct timespec slice;
        clock_gettime(CLOCK_REALTIME, &slice);
        slice.tv_nsec += 50 * 1000000L;
        if (slice.tv_nsec >= 1000000000L) {
            slice.tv_sec++;
            slice.tv_nsec -= 1000000000L;
        }
        bool last = slice.tv_sec > until.tv_sec ||
                    (slice.tv_sec == until.tv_sec && slice.tv_nsec >= until.tv_nsec);
        r = pthread_cond_timedwait(&c->cv, &c->mu, last ? &until : &slice);
        if (r == ETIMEDOUT && !last)
            r = 0;
        signalled = c->stopped != NULL && c->stopped();
    }
    m = c->next;
    dl_coll_group_t *old = c->group;
    bool stop = c->stop || signalled, eof = c->eof;
    if (m.gen > c->gen && !stop)
        c->group = NULL; /* nothing left for the reader to abort until the next one is made */
    pthread_mutex_unlock(&c->mu);
    if (stop) {
        snprintf(c->err, sizeof(c->err), "%s",
                 signalled ? "stopped by a signal while waiting for the next group"
                           : "the launcher stopped the recovery");
        return -ECANCELED;
    }
    if (m.gen <= c->gen) {
        snprintf(c->err, sizeof(c->err), "%s",
                 eof ? "the launcher closed the control channel"
                     : "no word from the launcher on the next group in time");
        return eof ? -EPIPE : -ETIMEDOUT;
    }
    dl_coll_group_destroy(old);
    dl_coll_options_t o = c->opts;
    o.generation = m.gen;
    o.rank = m.rank;
    o.world_size = m.world;
    o.local_rank = m.local_rank;
    o.local_world_size = m.local_world;
    if (m.store[0] != '\0' && strcmp(m.store, "-") != 0)
        snprintf(o.store, sizeof(o.store), "%s", m.store);
    if (m.master_addr[0] != '\0')
        snprintf(o.master_addr, sizeof(o.master_addr), "%s", m.master_addr);
    if (m.master_port > 0)
        o.master_port = m.master_port;
    dl_coll_group_t *g = NULL;
    char why[512];
    r = dl_coll_group_create(&o, &g, why, sizeof(why));
    if (r < 0) {
        snprintf(c->err, sizeof(c->err), "forming the group of generation %d: %.450s", m.gen, why);
        ctl_say(c, "failed gen=%d reason=%.400s", m.gen, c->err);
        return r;
    }
    c->err[0] = '\0';
    pthread_mutex_lock(&c->mu);
    c->group = g;
    c->gen = m.gen;
    c->opts = o;
    /* Superseded while it formed: it is broken already. */
    if (c->next.gen > c->gen)
        dl_coll_group_abort(g, "the launcher named a newer group while this one formed");
    pthread_mutex_unlock(&c->mu);
    c->comm->rank = dl_coll_rank(g);
    c->comm->world_size = dl_coll_world_size(g);
    return 0;
}

/* DLAUNCH_RECOVERY=in-job and a control channel: the hooks of in-job recovery. */
static int recovery_open(dl_train_coll_t *c, dl_train_comm_t *comm, char *err, size_t errlen)
{
    const char *mode = getenv("DLAUNCH_RECOVERY"), *fd = getenv("DLAUNCH_CONTROL_FD");
    int v;
    if (mode == NULL || strcmp(mode, "in-job") != 0 || fd == NULL)
        return 0;
    if (!word_int(fd, 0, &v)) {
        snprintf(err, errlen, "DLAUNCH_CONTROL_FD: '%s' is not a descriptor", fd);
        return -EINVAL;
    }
    c->ctl_fd = v;
    if (pthread_create(&c->ctl_thread, NULL, ctl_main, c) != 0) {
        snprintf(err, errlen, "cannot start the control channel's reader");
        return -EAGAIN;
    }
    c->ctl_started = true;
    comm->rejoin = rejoin;
    comm->allgather_bytes = allgather_bytes;
    comm->mem_alloc = mem_alloc;
    comm->mem_peer = mem_peer;
    comm->mem_peer_rw = mem_peer_rw;
    comm->host_of = host_of;
    comm->reduce_scatter_extra = reduce_scatter_extra;
    comm->recovered = recovered;
    comm->joining = c->gen > 0;
    /* The launcher learns that this worker speaks the protocol: it may then keep it alive when
     * another rank fails. */
    ctl_say(c, "hello gen=%d rank=%d pid=%d", c->gen, dl_coll_rank(c->group), (int)getpid());
    return 0;
}

/* The CPUs this process may run on. */
static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Shared memory moves a message in rounds of one chunk per rank, each with its own waits for the
 * other ranks. A chunk that holds the whole gradient makes a step's sum one round: fewer points
 * where a rank that the scheduler has set aside holds up the others. The segment holds two
 * chunks a rank; this keeps it within 32 MiB. The sum's bits do not depend on the chunk (every
 * element is added in rank order). */
static size_t shm_chunk_for(size_t grad_bytes, int local_ranks, size_t dflt)
{
    size_t cap = ((size_t)32 << 20) / (2 * (size_t)(local_ranks > 0 ? local_ranks : 1));
    size_t want = (grad_bytes + 65535) & ~(size_t)65535;
    if (want > cap)
        want = cap & ~(size_t)65535;
    return want > dflt ? want : dflt;
}

int dl_train_coll_open(dl_train_comm_t *comm, size_t grad_bytes, dl_train_coll_t **ret, char *err,
                       size_t errlen)
{
    dl_coll_options_t opts;
    dl_coll_options_init(&opts);
    int r = dl_coll_options_from_env(&opts, NULL, err, errlen);
    if (r < 0)
        return r;
    if (getenv("DLAUNCH_COLL_SHM_CHUNK") == NULL)
        opts.shm_chunk_bytes =
            shm_chunk_for(grad_bytes, opts.local_world_size, opts.shm_chunk_bytes);

    dl_train_coll_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return -ENOMEM;
    c->ctl_fd = -1;
    c->comm = comm;
    c->opts = opts;
    c->gen = c->next.gen = opts.generation;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_init(&c->wmu, NULL);
    r = dl_coll_group_create(&opts, &c->group, err, errlen);
    if (r < 0) {
        free(c);
        return r;
    }
    comm->rank = dl_coll_rank(c->group);
    comm->world_size = dl_coll_world_size(c->group);
    comm->ctx = c;
    comm->allreduce_start = start;
    comm->allreduce_wait_all = wait_all;
    comm->broadcast = broadcast;
    comm->allreduce = allreduce;
    comm->reduce_scatter = reduce_scatter;
    comm->allgather = allgather;
    /* A communication thread is worth its hand-offs only with a core to run on that backward
     * does not already use. */
    comm->overlap_pays = dl_coll_local_size(c->group) < usable_cpus();
    comm->error = error;
    r = recovery_open(c, comm, err, errlen);
    if (r < 0) {
        dl_train_coll_close(c);
        return r;
    }
    *ret = c;
    return 0;
}

const char *dl_train_coll_describe(const dl_train_coll_t *c)
{
    return dl_coll_transport_name(c->group);
}

void dl_train_coll_close(dl_train_coll_t *c)
{
    if (c == NULL)
        return;
    wait_all(c);
    if (c->ctl_started) {
        /* The reader blocks in read(). The channel is a socket pair: shutting its reading side
         * ends that read with 0 and the thread returns on its own. Cancelling it instead
         * unwinds its stack behind AddressSanitizer's back (a false stack-buffer-overflow as
         * the thread exits), so that is kept for a channel that is no socket (read is a
         * cancellation point). */
        if (shutdown(c->ctl_fd, SHUT_RD) < 0)
            pthread_cancel(c->ctl_thread);
        pthread_join(c->ctl_thread, NULL);
    }
    dl_coll_group_destroy(c->group);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->wmu);
    free(c);
}
