/* The rendezvous server: libuv TCP around the pure core. Each connection says hello (and proves
 * the job token) before anything else (server-handshake.c); then its messages become core events
 * (server-requests.c), and the core's actions become frames, closes and one timer
 * (server-actions.c). Here: the server's life, its connections and what it lends. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigzero.h"
#include "peer.h"
#include "rdzv-codec.h"
#include "server-internal.h"

#define JOURNAL_MAX 1000

void dl__rdzv_server_log(dl_rdzv_server_t *s, dl_rdzv_log_level_t level, const char *run_id,
                         const char *fmt, ...)
{
    char text[512];
    va_list ap;
    if (s->log == NULL)
        return;
    char safe[4 * sizeof(text)];
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    /* Log lines quote what peers sent (reasons, failures): one line, no terminal escapes. */
    s->log(s->log_ctx, level, run_id, dl_proto_escape(text, safe, sizeof(safe)));
}

/* ---- connection table ---- */

uint64_t dl__sconn_id(const dl__sconn_t *sc)
{
    return ((uint64_t)sc->s->gens[sc->slot] << 32) | sc->slot;
}

dl__sconn_t *dl__sconn_by_id(dl_rdzv_server_t *s, uint64_t id)
{
    uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if ((id & DL__TORCH_CONN_BIT) || slot >= s->nslots || s->gens[slot] != gen)
        return NULL;
    return s->slots[slot];
}

static int slot_take(dl_rdzv_server_t *s, dl__sconn_t *sc)
{
    if (s->nfree > 0) {
        sc->slot = s->free_slots[--s->nfree];
    } else {
        if (s->nslots == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 256;
            dl__sconn_t **sl = realloc(s->slots, cap * sizeof(*sl));
            if (sl == NULL)
                return -ENOMEM;
            s->slots = sl;
            uint32_t *g = realloc(s->gens, cap * sizeof(*g));
            if (g == NULL)
                return -ENOMEM;
            s->gens = g;
            uint32_t *f = realloc(s->free_slots, cap * sizeof(*f));
            if (f == NULL)
                return -ENOMEM;
            s->free_slots = f;
            s->cap = cap;
        }
        sc->slot = (uint32_t)s->nslots++;
        s->gens[sc->slot] = 1;
    }
    s->slots[sc->slot] = sc;
    return 0;
}

static void slot_release(dl_rdzv_server_t *s, dl__sconn_t *sc)
{
    s->slots[sc->slot] = NULL;
    /* Generation 0 is never handed out, so id 0 (DL_RDZV_CONN_NONE) names nobody. */
    if (++s->gens[sc->slot] == 0)
        s->gens[sc->slot] = 1;
    s->free_slots[s->nfree++] = sc->slot;
}

/* Every frame to a connection goes here. After the handshake a frame with an id answers one of
 * the connection's requests, which are counted (dl__sconn_request) to bound how many it may have
 * pending; frames that answer no counted request (errors about unreadable frames) go straight to
 * dl__conn_send. */
int dl__sconn_send(dl__sconn_t *sc, const json_t *m)
{
    if (sc->state == DL__SCONN_READY && sc->outstanding > 0 && json_object_get(m, "id") != NULL)
        sc->outstanding--;
    return dl__conn_send(&sc->c, m);
}

void dl__sconn_error(dl__sconn_t *sc, json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
{
    char text[DL_PROTO_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (code == DL_PROTO_E_FORBIDDEN || code == DL_PROTO_E_LIMIT_EXCEEDED)
        sc->s->stats.rejected[code]++;
    json_auto_t *m = dl_proto_error_new(id, code, "%s", text);
    if (m != NULL)
        dl__sconn_send(sc, m);
}

/* Counts the connection's unfinished frames for its job too, from now on. Without memory for the
 * count it is counted in the server's pool only. */
void dl__sconn_held_job_attach(dl__sconn_t *sc)
{
    dl_rdzv_server_t *s = sc->s;
    dl__job_held_t *e = s->held_jobs;
    while (e != NULL && strcmp(e->run_id, sc->run_id) != 0)
        e = e->next;
    if (e == NULL) {
        e = calloc(1, sizeof(*e));
        if (e == NULL)
            return;
        snprintf(e->run_id, sizeof(e->run_id), "%s", sc->run_id);
        e->next = s->held_jobs;
        s->held_jobs = e;
    }
    e->users++;
    e->bytes += sc->c.held;
    sc->held_job = e;
    sc->c.held_job = &e->bytes;
    sc->c.held_job_limit = s->max_held / 4;
}

static void held_job_detach(dl__sconn_t *sc)
{
    dl__job_held_t *e = sc->held_job, **pp = &sc->s->held_jobs;
    if (e == NULL || --e->users > 0)
        return;
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    free(e);
}

static void on_message(dl__conn_t *c, json_t *msg, dl_proto_type_t type)
{
    dl__sconn_t *sc = (dl__sconn_t *)c;
    json_int_t id = dl_proto_get_int(msg, "id", -1);

    switch (sc->state) {
    case DL__SCONN_HELLO:
        if (type != DL_PROTO_HELLO)
            break;
        dl__sconn_hello(sc, msg, id);
        return;
    case DL__SCONN_AUTH:
        if (type != DL_PROTO_AUTH)
            break;
        dl__sconn_auth(sc, msg, id);
        return;
    case DL__SCONN_READY:
        /* Counted until answered (dl__sconn_send), so that a connection's pending requests are bounded. */
        if (dl_proto_type_kind(type) == DL_PROTO_KIND_REQUEST)
            sc->outstanding++;
        if (type == DL_PROTO_HELLO || type == DL_PROTO_AUTH) {
            dl__sconn_error(sc, id, DL_PROTO_E_UNEXPECTED, "already authenticated");
            return;
        }
        dl__sconn_request(sc, msg, type);
        return;
    }
    dl__sconn_error(sc, id, DL_PROTO_E_NOT_AUTHENTICATED, "%s before hello and auth; closing",
                    dl_proto_type_name(type));
    dl__conn_close(c, 0);
}

static void on_invalid(dl__conn_t *c, const dl_proto_error_t *err, bool fatal)
{
    dl__sconn_t *sc = (dl__sconn_t *)c;
    json_auto_t *m = dl_proto_error_from(err);
    if ((size_t)err->code < DL_PROTO_E_COUNT)
        sc->s->stats.rejected[err->code]++;
    if (m != NULL)
        dl__conn_send(c, m);
    /* Before authentication nothing a stranger sends deserves a second chance. */
    if (!fatal && sc->state != DL__SCONN_READY)
        dl__conn_close(c, UV_EPROTO);
}

static void maybe_done(dl_rdzv_server_t *s);

/* ---- connections that hold resources and do nothing ---- */

/* Whether a connection's silence is expected: it waits for answers (a join, a kv_wait), follows
 * events, or is an agent the core watches by its heartbeats. */
static bool busy(const dl__sconn_t *sc)
{
    /* A follow ends with its job's journal. */
    return sc->outstanding > 0 || sc->joined ||
           (sc->following && dl__journals_get(sc->s->journals, sc->run_id, false) != NULL);
}

/* A job the core no longer has (it lingered and went): its torch store goes too. */
static int job_gone(void *ctx, const char *run_id)
{
    dl_rdzv_server_t *s = ctx;
    size_t n;
    return dl_rdzv_core_store_count(s->core, run_id, &n) == -ENOENT;
}

/* Closes connections whose frame has been arriving for longer than frame_timeout (a slow sender
 * holding a buffer) and idle ones that are not busy. One pass over the connections per sweep,
 * a few times per timeout: O(connections) now and then, nothing per message. */
static void on_sweep(uv_timer_t *t)
{
    dl_rdzv_server_t *s = t->data;
    uint64_t now = uv_now(s->loop);
    uint64_t frame_ms = (uint64_t)(s->frame_timeout * 1000),
             idle_ms = (uint64_t)(s->idle_timeout * 1000);
    size_t ready = 0;

    for (size_t i = 0; i < s->nslots; i++) {
        dl__sconn_t *sc = s->slots[i];
        if (sc == NULL || sc->state != DL__SCONN_READY || sc->c.closing)
            continue;
        ready++;
        if (sc->c.pending_since != 0 && now - sc->c.pending_since >= frame_ms) {
            dl__sconn_error(sc, -1, DL_PROTO_E_LIMIT_EXCEEDED,
                            "a frame took longer than %g s to arrive; closing", s->frame_timeout);
            dl__conn_close(&sc->c, UV_ETIMEDOUT);
        } else if (!busy(sc) && now - sc->c.last_frame >= idle_ms) {
            dl__sconn_error(sc, -1, DL_PROTO_E_LIMIT_EXCEEDED,
                            "nothing for %g s and nothing pending; closing", s->idle_timeout);
            dl__conn_close(&sc->c, UV_ETIMEDOUT);
        }
    }
    if (s->torch_jobs != NULL)
        dl__torch_jobs_close_if(s->torch_jobs, job_gone, s);
    if (ready == 0 && (s->torch_jobs == NULL || dl__torch_jobs_count(s->torch_jobs) == 0)) {
        uv_timer_stop(&s->sweep_timer);
        s->sweeping = false;
    }
}

void dl__server_sweep_start(dl_rdzv_server_t *s)
{
    if (s->sweeping || s->closing)
        return;
    double shortest = s->frame_timeout < s->idle_timeout ? s->frame_timeout : s->idle_timeout;
    uint64_t every = (uint64_t)(shortest * 1000 / 4);
    every = every < 50 ? 50 : every > 5000 ? 5000 : every;
    s->sweeping = true;
    uv_timer_start(&s->sweep_timer, on_sweep, every, every);
}

/* The peer's address as the core counts the jobs it creates (never 0). */
static uint64_t creator_of(const uv_tcp_t *tcp)
{
    struct sockaddr_storage sa;
    int n = sizeof(sa);
    uint64_t h = 1469598103934665603ULL;
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&sa, &n) != 0)
        return 1;
    const unsigned char *p;
    size_t len;
    if (sa.ss_family == AF_INET) {
        p = (const unsigned char *)&((struct sockaddr_in *)&sa)->sin_addr;
        len = 4;
    } else {
        p = (const unsigned char *)&((struct sockaddr_in6 *)&sa)->sin6_addr;
        len = 16;
    }
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h | 1;
}

/* Replies nobody reads take from the same budget as the stores (--max-memory). */
static size_t queue_room(const dl__conn_t *c)
{
    const dl_rdzv_server_t *s = ((const dl__sconn_t *)c)->s;
    return s->core != NULL ? dl_rdzv_core_memory_room(s->core) : SIZE_MAX;
}

static void on_conn_closed(dl__conn_t *c, int status)
{
    dl__sconn_t *sc = (dl__sconn_t *)c;
    dl_rdzv_server_t *s = sc->s;
    dl__sconn_preauth_remove(sc);
    if (sc->state == DL__SCONN_READY && s->core != NULL) {
        dl_rdzv_event_t ev = {
            .kind = DL_RDZV_EV_DISCONNECT, .conn = dl__sconn_id(sc), .run_id = sc->run_id};
        dl__rdzv_server_feed(s, &ev);
        dl__jobview_drop_conn(s->view, sc->run_id, dl__sconn_id(sc));
    }
    held_job_detach(sc);
    slot_release(s, sc);
    s->nconns--;
    free(sc);
    s->open_handles--;
    maybe_done(s);
}

static void on_connection(uv_stream_t *server, int status)
{
    dl_rdzv_server_t *s = server->data;
    dl__sconn_t *sc;

    if (status < 0) {
        dl__rdzv_server_log(s, DL_RDZV_LOG_WARN, NULL, "accept failed: %s", uv_strerror(status));
        return;
    }
    sc = calloc(1, sizeof(*sc));
    if (sc == NULL || slot_take(s, sc) < 0) {
        /* Take it off the backlog and drop it, or libuv would call us for it again. */
        uv_tcp_t tmp;
        uv_tcp_init(s->loop, &tmp);
        if (uv_accept(server, (uv_stream_t *)&tmp) == 0)
            dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, NULL, "out of memory: dropping a connection");
        uv_close((uv_handle_t *)&tmp, NULL);
        free(sc);
        return;
    }
    sc->s = s;
    sc->join_id = -1;
    dl__conn_init(s->loop, &sc->c, DL_PROTO_LIMIT_PREAUTH, s->readbuf, sizeof(s->readbuf));
    sc->c.held_total = &s->held;
    sc->c.held_limit = s->max_held;
    sc->c.queued_total = &s->queued;
    sc->c.queue_room = queue_room;
    sc->c.on_message = on_message;
    sc->c.on_invalid = on_invalid;
    sc->c.on_closed = on_conn_closed;
    s->open_handles++;
    s->nconns++;
    s->stats.accepted++;
    if (s->nconns > s->peak)
        s->peak = s->nconns;
    sc->accepted = dl__server_now();
    sc->in_preauth = true;
    sc->prev = s->preauth_tail;
    if (s->preauth_tail != NULL)
        s->preauth_tail->next = sc;
    else
        s->preauth_head = sc;
    s->preauth_tail = sc;
    if (sc->prev == NULL)
        dl__server_preauth_arm(s);
    int r = uv_accept(server, (uv_stream_t *)&sc->c.tcp);
    if (r == 0)
        r = dl__conn_start(&sc->c);
    if (r < 0) {
        dl__conn_close(&sc->c, r);
        return;
    }
    sc->creator = creator_of(&sc->c.tcp);
}

/* The journal's callbacks: followers are connections. */
static void send_event(void *ctx, uint64_t conn, json_int_t seq, const json_t *event)
{
    dl__sconn_t *sc = dl__sconn_by_id(ctx, conn);
    json_auto_t *m = sc != NULL ? dl_rdzv_enc_event(seq, event) : NULL;
    if (m != NULL)
        dl__sconn_send(sc, m);
}

static bool follower_alive(void *ctx, uint64_t conn)
{
    dl__sconn_t *sc = dl__sconn_by_id(ctx, conn);
    return sc != NULL && !sc->c.closing;
}

/* ---- life cycle ---- */

void dl_rdzv_server_opts_init(dl_rdzv_server_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->host = "127.0.0.1";
    dl_rdzv_core_opts_init(&opts->core);
    opts->heartbeat = 1.0;
    opts->auth_timeout = 10.0;
    opts->idle_timeout = 300.0;
    opts->frame_timeout = 30.0;
    opts->max_outstanding = 1024;
    opts->max_held = (size_t)256 << 20;
}

static void handle_closed(uv_handle_t *h)
{
    dl_rdzv_server_t *s = h->data;
    s->open_handles--;
    maybe_done(s);
}

static void maybe_done(dl_rdzv_server_t *s)
{
    if (!s->closing || s->open_handles > 0)
        return;
    void (*done)(void *) = s->done;
    void *ctx = s->done_ctx;
    dl_rdzv_core_free(s->core);
    if (s->diag_fd >= 0)
        close(s->diag_fd);
    dl__journals_free(s->journals);
    json_decref(s->snapshot);
    dl__rdzv_stats_free(&s->stats);
    dl__jobview_free(s->view);
    dl__revoked_free(s->revoked);
    free(s->slots);
    free(s->gens);
    free(s->free_slots);
    dl__bigzero_free(s, sizeof(*s));
    if (done != NULL)
        done(ctx);
}

int dl_rdzv_server_start(uv_loop_t *loop, const dl_rdzv_server_opts_t *opts,
                         dl_rdzv_server_t **ret_server, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    dl_rdzv_server_t *s;
    int r;

    if (uv_ip4_addr(opts->host, opts->port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(opts->host, opts->port, (struct sockaddr_in6 *)&sa) != 0) {
        snprintf(err, errlen, "'%s' is not an IP address", opts->host);
        return -EINVAL;
    }
    if (opts->token == NULL && !dl__peer_is_loopback((struct sockaddr *)&sa)) {
        snprintf(err, errlen,
                 "refusing to serve %s:%d without a job token: give --token-file or "
                 "DLAUNCH_TOKEN, or bind a loopback address",
                 opts->host, opts->port);
        return -EPERM;
    }
    s = dl__bigzero_alloc(sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    s->loop = loop;
    s->diag_fd = -1;
    s->token = opts->token;
    s->heartbeat = opts->heartbeat;
    s->auth_timeout = opts->auth_timeout;
    s->log = opts->log;
    s->log_ctx = opts->log_ctx;
    s->idle_timeout = opts->idle_timeout > 0 ? opts->idle_timeout : 300;
    s->frame_timeout = opts->frame_timeout > 0 ? opts->frame_timeout : 30;
    s->linger = opts->core.job_defaults.linger;
    s->max_outstanding = opts->max_outstanding > 0 ? opts->max_outstanding : 1;
    s->max_held = opts->max_held > 0 ? opts->max_held : DL_PROTO_LIMIT;
    if (opts->only_run_id != NULL)
        snprintf(s->only_run_id, sizeof(s->only_run_id), "%s", opts->only_run_id);
    s->store_only = opts->store_only;
    snprintf(s->store_host, sizeof(s->store_host), "%s", opts->host);
    dl__journal_cbs_t jcbs = {send_event, follower_alive};
    dl_rdzv_core_opts_t core_opts = opts->core;
    s->core_opts = opts->core;
    s->core_opts.store_host = NULL;
    s->core_opts.host_agent_id = NULL;
    /* A hash key nobody outside knows, unless the caller chose one (tests). */
    r = dl__journals_new(JOURNAL_MAX, DL__SERVER_FOLLOWERS_MAX, &jcbs, s, &s->journals);
    if (r == 0 && core_opts.hash_key[0] == 0 && core_opts.hash_key[1] == 0)
        r = dl_proto_random(core_opts.hash_key, sizeof(core_opts.hash_key));
    if (r == 0)
        r = dl__rdzv_stats_init(&s->stats, dl__server_unix_now());
    if (r == 0)
        r = dl__jobview_new(&s->view);
    if (r == 0) {
        r = dl__revoked_new(opts->revocations_file, &s->revoked, err, errlen);
        if (r < 0) {
            dl__journals_free(s->journals);
            dl__rdzv_stats_free(&s->stats);
            dl__jobview_free(s->view);
            explicit_bzero(core_opts.hash_key, sizeof(core_opts.hash_key));
            dl__bigzero_free(s, sizeof(*s));
            return r;
        }
    }
    if (r == 0)
        r = dl_rdzv_core_new(&core_opts, &s->core);
    if (r == 0)
        dl_rdzv_core_count_replies(s->core, &s->queued);
    explicit_bzero(core_opts.hash_key, sizeof(core_opts.hash_key));
    if (r < 0) {
        snprintf(err, errlen, "bad rendezvous settings: %s", strerror(-r));
        dl__journals_free(s->journals);
        dl__rdzv_stats_free(&s->stats);
        dl__jobview_free(s->view);
        dl__revoked_free(s->revoked);
        dl__bigzero_free(s, sizeof(*s));
        return r;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    uv_timer_init(loop, &s->core_timer);
    s->core_timer.data = s;
    uv_timer_init(loop, &s->auth_timer);
    s->auth_timer.data = s;
    uv_timer_init(loop, &s->sweep_timer);
    s->sweep_timer.data = s;
    uv_idle_init(loop, &s->replay_idle);
    s->replay_idle.data = s;
    s->open_handles = 5;
    r = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&s->listener, 4096, on_connection);
    if (r < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", opts->host, opts->port, uv_strerror(r));
        dl_rdzv_server_close(s, NULL, NULL);
        return r;
    }
    int len = sizeof(sa);
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&sa, &len);
    s->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                            : ((struct sockaddr_in6 *)&sa)->sin6_port);
    if (opts->torch_store) {
        r = s->only_run_id[0] == '\0' ? -EINVAL : 0;
        if (r < 0)
            snprintf(err, errlen, "a torch store needs the one run id the server serves");
        else
            r = dl__torch_store_start(s, loop, opts->torch_host ? opts->torch_host : opts->host,
                                      opts->torch_port, s->only_run_id, 0, &s->torch, err, errlen);
        if (r < 0) {
            dl_rdzv_server_close(s, NULL, NULL);
            /* -EADDRINUSE says someone serves host:port already (an agent then joins them):
             * a torch store's port in use is not that. */
            return r == UV_EADDRINUSE ? -EBUSY : r;
        }
    }
    if (opts->torch_jobs && s->torch == NULL) {
        snprintf(s->torch_host, sizeof(s->torch_host), "%s",
                 opts->torch_host ? opts->torch_host : opts->host);
        r = dl__torch_jobs_new(&s->torch_jobs);
        if (r < 0) {
            snprintf(err, errlen, "cannot keep torch stores: %s", strerror(-r));
            dl_rdzv_server_close(s, NULL, NULL);
            return r;
        }
    }
    *ret_server = s;
    return 0;
}

int dl_rdzv_server_torch_port(const dl_rdzv_server_t *s)
{
    return s->torch != NULL ? dl__torch_store_port(s->torch) : -1;
}

/* ---- what the torch store borrows (torch-store.h) ---- */

dl_rdzv_core_t *dl__rdzv_server_core(dl_rdzv_server_t *s)
{
    return s->core;
}

const dl_rdzv_core_opts_t *dl__rdzv_server_core_opts(const dl_rdzv_server_t *s)
{
    return &s->core_opts;
}

static bool same_ip(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a->sa_family != b->sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                      &((const struct sockaddr_in *)b)->sin_addr, 4) == 0;
    return a->sa_family == AF_INET6 &&
           memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

/* O(connections): asked once per torch connection from another host, never per query. */
bool dl__rdzv_server_knows_host(dl_rdzv_server_t *s, const char *run_id,
                                const struct sockaddr *addr)
{
    for (size_t i = 0; i < s->njob_hosts; i++)
        if (same_ip((const struct sockaddr *)&s->job_hosts[i], addr))
            return true;
    for (size_t i = 0; i < s->nslots; i++) {
        dl__sconn_t *sc = s->slots[i];
        struct sockaddr_storage sa;
        int n = sizeof(sa);
        if (sc == NULL || sc->state != DL__SCONN_READY || !sc->joined ||
            strcmp(sc->run_id, run_id) != 0 ||
            uv_tcp_getpeername(&sc->c.tcp, (struct sockaddr *)&sa, &n) != 0)
            continue;
        if (same_ip((struct sockaddr *)&sa, addr))
            return true;
    }
    return false;
}

int dl_rdzv_server_set_job_hosts(dl_rdzv_server_t *s, const char *const *addrs, size_t n, char *err,
                                 size_t errlen)
{
    struct sockaddr_storage *v = n > 0 ? calloc(n, sizeof(*v)) : NULL;
    if (n > 0 && v == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        if (uv_ip4_addr(addrs[i], 0, (struct sockaddr_in *)&v[i]) != 0 &&
            uv_ip6_addr(addrs[i], 0, (struct sockaddr_in6 *)&v[i]) != 0) {
            snprintf(err, errlen, "node address '%.200s' is not an IP address", addrs[i]);
            free(v);
            return -EINVAL;
        }
    free(s->job_hosts);
    s->job_hosts = v;
    s->njob_hosts = n;
    return 0;
}

void dl__rdzv_server_hold(dl_rdzv_server_t *s)
{
    s->open_handles++;
}

void dl__rdzv_server_release(dl_rdzv_server_t *s)
{
    s->open_handles--;
    maybe_done(s);
}

int dl_rdzv_server_port(const dl_rdzv_server_t *s)
{
    return s->port;
}

int dl_rdzv_server_add_job(dl_rdzv_server_t *s, const char *run_id, const dl_rdzv_job_opts_t *opts)
{
    /* Its journal exists from now, so that `dlaunch events` can follow it before anything
     * happened, and holds the core's "job created" line as dlaunchd's journals do. */
    bool had_journal = dl__journals_get(s->journals, run_id, false) != NULL;
    if (!had_journal && dl__journals_get(s->journals, run_id, true) == NULL)
        return -ENOMEM;
    dl_rdzv_actions_t acts = {0};
    int r = dl_rdzv_core_add_job(s->core, run_id, opts, &acts);
    s->adding_job = true;
    dl__server_apply(s, &acts);
    s->adding_job = false;
    if (r < 0 && !had_journal)
        dl__journals_forget(s->journals, run_id);
    return r;
}

void dl_rdzv_server_reset_store(dl_rdzv_server_t *s, const char *run_id)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_RESET, .run_id = run_id};
    dl__rdzv_server_feed(s, &ev);
    if (s->torch != NULL && strcmp(run_id, s->only_run_id) == 0)
        dl__torch_store_new_round(s->torch, -1);
}

void dl_rdzv_server_stats(const dl_rdzv_server_t *s, dl_rdzv_server_stats_t *ret)
{
    ret->connections = s->nconns;
    ret->peak_connections = s->peak;
    ret->conn_bytes = sizeof(dl__sconn_t);
    ret->torch_clients = ret->torch_peak = ret->torch_conn_bytes = 0;
    if (s->torch != NULL)
        dl__torch_store_clients(s->torch, &ret->torch_clients, &ret->torch_peak,
                                &ret->torch_conn_bytes);
}

int dl_rdzv_server_snapshot(dl_rdzv_server_t *s, json_t **ret_snapshot)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STATUS, .conn = DL__RDZV_STATS_CONN};
    json_decref(s->snapshot);
    s->snapshot = NULL;
    dl__rdzv_server_feed(s, &ev);
    if (s->snapshot == NULL)
        return -ENOMEM;
    /* A store-only server whose job's rendezvous is kept elsewhere: its owner's account, over
     * everything the server added. */
    size_t i;
    json_t *j;
    json_array_foreach (s->status_fn != NULL ? json_object_get(s->snapshot, "jobs") : NULL, i, j) {
        const char *run_id = json_string_value(json_object_get(j, "run_id"));
        if (run_id != NULL)
            json_object_update_new(j, s->status_fn(s->status_ctx, run_id, j));
    }
    *ret_snapshot = s->snapshot;
    s->snapshot = NULL;
    return 0;
}

void dl_rdzv_server_set_status(dl_rdzv_server_t *s, dl_rdzv_status_fn fn, void *ctx)
{
    s->status_fn = fn;
    s->status_ctx = ctx;
}

void dl_rdzv_server_progress(dl_rdzv_server_t *s, const char *run_id, const json_t *progress)
{
    dl_rdzv_beat_msg_t b;
    dl_rdzv_dec_progress(progress, &b);
    dl__rdzv_stats_join(&s->stats, run_id, dl__server_now());
    dl__rdzv_stats_progress(&s->stats, run_id, &b, dl__server_unix_now());
}

uint64_t dl_rdzv_server_generation(const dl_rdzv_server_t *s)
{
    return s->stats.generation;
}

void dl_rdzv_server_close(dl_rdzv_server_t *s, void (*done)(void *ctx), void *ctx)
{
    if (s == NULL || s->closing)
        return;
    s->closing = true;
    s->done = done;
    s->done_ctx = ctx;
    uv_close((uv_handle_t *)&s->listener, handle_closed);
    uv_close((uv_handle_t *)&s->core_timer, handle_closed);
    uv_close((uv_handle_t *)&s->auth_timer, handle_closed);
    uv_close((uv_handle_t *)&s->sweep_timer, handle_closed);
    uv_close((uv_handle_t *)&s->replay_idle, handle_closed);
    dl__torch_store_close(s->torch);
    s->torch = NULL;
    dl__torch_jobs_free(s->torch_jobs);
    s->torch_jobs = NULL;
    free(s->job_hosts);
    s->job_hosts = NULL;
    s->njob_hosts = 0;
    for (size_t i = 0; i < s->nslots; i++)
        if (s->slots[i] != NULL)
            dl__conn_close(&s->slots[i]->c, 0);
}
