/* The HTTP server: libmicrohttpd on a thread of its own, and the hand-over of snapshots from the
 * rendezvous loop to that thread.
 *
 * Snapshots travel one way. A request that finds the snapshot it has older than the interval
 * asks the loop for a new one (uv_async_send) and waits for it, at most WAIT_S; the loop builds
 * it (only when something changed since the last one), puts it in `pending` under the lock and
 * never touches it again. The HTTP thread takes it from there and owns it alone: it renders it,
 * updates its heartbeat ages and frees it. The lock is held for pointer swaps only, so the loop
 * can never wait on a request being rendered. libmicrohttpd runs every request on that one
 * thread (no thread per connection), which is what makes the snapshot the thread's own. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "internal.h"

#define WAIT_S 1.0  /* how long a request waits for the loop before using what it has */
#define REFRESH_S 2 /* the status page reloads itself this often */
#define MAX_CONNECTIONS 256
#define CONN_TIMEOUT_S 10 /* an idle or slow client is dropped after this */
/* Connections at once of one local user other than ours (or root): slow clients of one user
 * (a request trickling in, a byte every few seconds) cannot take every connection. */
#define MAX_PER_USER 16

struct dl_http_s {
    uv_loop_t *loop;
    dl_rdzv_server_t *server;
    uv_async_t wake; /* a request asks the loop for a snapshot */
    struct MHD_Daemon *daemon;
    const dl_proto_token_t *token;
    double interval;
    int port;
    char title[128];
    uint64_t built_gen; /* loop only: the server generation of the last snapshot built */
    bool built_any;

    pthread_mutex_t lock;
    pthread_cond_t fresh;
    json_t *pending;     /* under lock: the newest snapshot, not yet taken */
    double published_at; /* under lock: monotonic time the loop last answered */
    uint64_t answers;    /* under lock: how many times the loop answered */
    bool asked;          /* under lock: an ask is on its way to the loop */
    bool closing;        /* under lock */

    /* The HTTP thread's own. */
    json_t *current;
    double current_at;
    dl__http_counters_t counters;
    int nlfd; /* the netlink socket that tells a loopback peer's user */
    struct {
        uid_t uid;
        unsigned n;
    } users[MAX_CONNECTIONS]; /* connections of users other than ours, by user */
};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double unix_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the loop's side ---- */

static void on_wake(uv_async_t *a)
{
    dl_http_t *h = a->data;
    json_t *snap = NULL, *old = NULL;

    /* Nothing changed: the snapshot the HTTP thread has is still right (its ages are computed
     * at each request), so answering is enough. */
    if (!h->built_any || dl_rdzv_server_generation(h->server) != h->built_gen) {
        if (dl_rdzv_server_snapshot(h->server, &snap) == 0) {
            h->built_gen = dl_rdzv_server_generation(h->server);
            h->built_any = true;
        }
    }
    pthread_mutex_lock(&h->lock);
    if (snap != NULL) {
        old = h->pending;
        h->pending = snap;
    }
    h->published_at = mono();
    h->answers++;
    h->asked = false;
    pthread_cond_broadcast(&h->fresh);
    pthread_mutex_unlock(&h->lock);
    json_decref(old); /* one the HTTP thread never took: freed outside the lock */
}

/* ---- the HTTP thread's side ---- */

/* The snapshot to answer from: fresh enough, or the newest the loop gave within WAIT_S. NULL
 * only before the loop ever answered. */
static json_t *snapshot(dl_http_t *h)
{
    double now = mono();
    json_t *taken, *old = NULL;

    pthread_mutex_lock(&h->lock);
    if (h->current == NULL || now - h->current_at >= h->interval) {
        uint64_t seen = h->answers;
        if (!h->asked && !h->closing) {
            h->asked = true;
            uv_async_send(&h->wake);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)WAIT_S;
        while (h->answers == seen && !h->closing &&
               pthread_cond_timedwait(&h->fresh, &h->lock, &until) != ETIMEDOUT)
            ;
    }
    taken = h->pending;
    h->pending = NULL;
    if (h->answers > 0)
        h->current_at = h->published_at;
    pthread_mutex_unlock(&h->lock);
    if (taken != NULL) {
        old = h->current;
        h->current = taken;
    }
    json_decref(old);
    return h->current;
}

/* Without a token, the server's own user (or root) on loopback may read, as on the rendezvous
 * port, through a loopback host name. */
static bool own_user(dl_http_t *h, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL || dl_rdzv_peer_trusted(&h->nlfd, ci->connect_fd) != 1)
        return false;
    return dl__http_host_is_loopback(
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST));
}

/* What the request's credential reaches: DL_PROTO_REACH_ALL for the server's own token (or,
 * without one, its own user), DL_PROTO_REACH_READ for the token's read-only credential, else
 * -EACCES. Compared in constant time. */
static int reach(dl_http_t *h, struct MHD_Connection *c)
{
    char err[128];
    dl_proto_token_t *given = NULL;
    const char *v;

    if (h->token == NULL)
        return own_user(h, c) ? DL_PROTO_REACH_ALL : -EACCES;
    v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (v == NULL || strncmp(v, "Bearer ", 7) != 0)
        return -EACCES;
    int r = dl_proto_token_from_string(v + 7, "Authorization", &given, err, sizeof(err));
    if (r == 0)
        r = dl_proto_token_reach(h->token, given);
    dl_proto_token_free(given);
    return r < 0 ? -EACCES : r;
}

static bool authorized(dl_http_t *h, struct MHD_Connection *c)
{
    return reach(h, c) > 0;
}

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type,
                               char *body, size_t len)
{
    struct MHD_Response *r;
    enum MHD_Result ret;

    if (body == NULL) {
        static const char oom[] = "out of memory\n";
        r = MHD_create_response_from_buffer(sizeof(oom) - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        type = "text/plain; charset=utf-8";
    } else {
        r = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    }
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    /* The page runs no script and loads nothing: say so, so that nothing injected could. */
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; style-src 'unsafe-inline'");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *c, unsigned status, const char *text)
{
    char *body = strdup(text);
    return respond(c, status, "text/plain; charset=utf-8", body, body ? strlen(body) : 0);
}

static enum MHD_Result respond_json(struct MHD_Connection *c, unsigned status, json_t *v)
{
    char *body = v != NULL ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(v);
    if (body == NULL)
        return respond(c, status, NULL, NULL, 0);
    /* The body is a length, not a C string: its NUL becomes the closing newline. */
    size_t len = strlen(body);
    body[len] = '\n';
    return respond(c, status, "application/json", body, len + 1);
}

static enum MHD_Result api(struct MHD_Connection *c, const char *path, const json_t *snap,
                           double now)
{
    const json_t *jobs = json_object_get(snap, "jobs");
    size_t i;
    json_t *j;

    if (strcmp(path, "/api/jobs") == 0 || strcmp(path, "/api/jobs/") == 0)
        return respond_json(c, MHD_HTTP_OK,
                            json_pack("{s:f, s:O}", "time", now, "jobs", (json_t *)jobs));
    const char *id = path + strlen("/api/jobs/");
    json_array_foreach (jobs, i, j) {
        if (strcmp(json_string_value(json_object_get(j, "run_id")), id) == 0)
            return respond_json(c, MHD_HTTP_OK, json_incref(j));
    }
    return respond_json(
        c, MHD_HTTP_NOT_FOUND,
        json_pack("{s:{s:s, s:s}}", "error", "code", "not_found", "message", "no such job"));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    dl_http_t *h = cls;
    dl__http_buf_t b = {0};
    size_t len;

    int route = dl__http_route(method, url);
    if (route == DL__HTTP_ROUTE_METHOD) {
        /* Nothing here acts today; a read-only credential is told it never may, so that a
         * method served some day does not become open to it by accident. */
        if (reach(h, c) == DL_PROTO_REACH_READ)
            return respond_text(c, MHD_HTTP_FORBIDDEN,
                                "a read-only credential may only read (GET, HEAD)\n");
        return respond_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD are served\n");
    }
    if (!authorized(h, c)) {
        h->counters.unauthorized++;
        if (h->token == NULL)
            return respond_text(c, MHD_HTTP_FORBIDDEN,
                                "without a token only the server's own user may read it, on "
                                "loopback, through a loopback host name\n");
        return respond_text(c, MHD_HTTP_UNAUTHORIZED, "a bearer token is required\n");
    }
    bool metrics = route == DL__HTTP_METRICS, api_path = route == DL__HTTP_API;
    h->counters.requests[route]++;
    if (route == DL__HTTP_OTHER)
        return respond_text(c, MHD_HTTP_NOT_FOUND,
                            "not found: try /, /metrics, /api/jobs or /api/jobs/RUN_ID\n");
    json_t *snap = snapshot(h);
    double now = unix_time();
    if (snap != NULL)
        dl__http_refresh_ages(snap, now);
    h->counters.snapshot_time = json_number_value(json_object_get(snap, "time"));
    if (api_path) {
        if (snap == NULL)
            return respond_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "no snapshot yet\n");
        return api(c, url, snap, now);
    }
    if (metrics) {
        dl__http_metrics(&b, snap, &h->counters, now);
        char *text = dl__http_buf_take(&b, &len);
        return respond(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
    }
    dl__http_page(&b, snap, h->title, now, REFRESH_S);
    char *html = dl__http_buf_take(&b, &len);
    return respond(c, MHD_HTTP_OK, "text/html; charset=utf-8", html, len);
}

/* Counts connections by their peer's user; one over MAX_PER_USER (users other than ours and
 * root) is shut down at once. Its context says which slot it counts in (0: none). */
static void on_connection(void *cls, struct MHD_Connection *c, void **ctx,
                          enum MHD_ConnectionNotificationCode what)
{
    dl_http_t *h = cls;
    uintptr_t slot = (uintptr_t)*ctx;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (slot > 0)
            h->users[slot - 1].n--;
        return;
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    uid_t uid;
    if (ci == NULL || dl_rdzv_peer_uid(&h->nlfd, ci->connect_fd, &uid) < 0 || uid == geteuid() ||
        uid == 0)
        return;
    size_t i, free_slot = MAX_CONNECTIONS;
    for (i = 0; i < MAX_CONNECTIONS; i++) {
        if (h->users[i].n > 0 && h->users[i].uid == uid)
            break;
        if (h->users[i].n == 0 && free_slot == MAX_CONNECTIONS)
            free_slot = i;
    }
    if (i == MAX_CONNECTIONS)
        i = free_slot;
    if (i == MAX_CONNECTIONS || h->users[i].n >= MAX_PER_USER) {
        shutdown(ci->connect_fd, SHUT_RDWR);
        return;
    }
    h->users[i].uid = uid;
    h->users[i].n++;
    *ctx = (void *)(i + 1);
}

/* ---- life cycle ---- */

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, &in6addr_loopback,
                  sizeof(struct in6_addr)) == 0;
}

/* The listening socket is ours, not libmicrohttpd's, so that a failure says which call failed
 * and why, and port 0 can be read back. */
static int listen_on(const dl_http_opts_t *o, int *ret_fd, int *ret_port, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    int one = 1, fd, r;

    if (uv_ip4_addr(o->host, o->port, (struct sockaddr_in *)&sa) == 0) {
        salen = sizeof(struct sockaddr_in);
    } else if (uv_ip6_addr(o->host, o->port, (struct sockaddr_in6 *)&sa) == 0) {
        salen = sizeof(struct sockaddr_in6);
    } else {
        snprintf(err, errlen, "'%s' is not an IP address", o->host);
        return -EINVAL;
    }
    /* Plain HTTP: off loopback the bearer token would cross the network in clear with every
     * scrape. A TLS reverse proxy on the same host is the supported way to serve others. */
    if (!is_loopback((struct sockaddr *)&sa)) {
        snprintf(err, errlen,
                 "refusing to serve HTTP on %s:%d: only loopback is served (plain HTTP would "
                 "send the token in clear); bind 127.0.0.1 and put a TLS reverse proxy in front "
                 "for other hosts (docs/operations.md)",
                 o->host, o->port);
        return -EPERM;
    }
    fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        r = -errno;
        snprintf(err, errlen, "cannot make a socket for HTTP: %s", strerror(-r));
        return r;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, salen) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) < 0) {
        r = -errno;
        snprintf(err, errlen, "cannot serve HTTP on %s:%d: %s", o->host, o->port, strerror(-r));
        close(fd);
        return r;
    }
    *ret_port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                              : ((struct sockaddr_in6 *)&sa)->sin6_port);
    *ret_fd = fd;
    return sa.ss_family == AF_INET6;
}

static void free_http(dl_http_t *h)
{
    if (h->nlfd >= 0)
        close(h->nlfd);
    json_decref(h->current);
    json_decref(h->pending);
    pthread_cond_destroy(&h->fresh);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

static void on_wake_closed(uv_handle_t *handle)
{
    free_http(handle->data);
}

int dl_http_start(uv_loop_t *loop, dl_rdzv_server_t *server, const dl_http_opts_t *opts,
                  dl_http_t **ret, char *err, size_t errlen)
{
    pthread_condattr_t ca;
    int fd = -1, r;
    dl_http_t *h = calloc(1, sizeof(*h));

    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    r = listen_on(opts, &fd, &h->port, err, errlen);
    if (r < 0) {
        free(h);
        return r;
    }
    bool ipv6 = r == 1;
    h->loop = loop;
    h->server = server;
    h->nlfd = -1;
    h->token = opts->token;
    h->interval = opts->interval;
    snprintf(h->title, sizeof(h->title), "%s", opts->title != NULL ? opts->title : "dlaunch");
    pthread_mutex_init(&h->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->fresh, &ca);
    pthread_condattr_destroy(&ca);
    r = uv_async_init(loop, &h->wake, on_wake);
    if (r < 0) {
        snprintf(err, errlen, "cannot set up HTTP: %s", uv_strerror(r));
        close(fd);
        free_http(h);
        return r;
    }
    h->wake.data = h;
    h->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | (ipv6 ? MHD_USE_IPv6 : 0), 0, NULL, NULL,
        on_request, h, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    if (h->daemon == NULL) {
        r = errno > 0 ? -errno : -EIO;
        snprintf(err, errlen, "libmicrohttpd could not start on %s:%d: %s", opts->host, h->port,
                 strerror(-r));
        close(fd);
        uv_close((uv_handle_t *)&h->wake, on_wake_closed);
        return r;
    }
    *ret = h;
    return 0;
}

int dl_http_port(const dl_http_t *h)
{
    return h->port;
}

void dl_http_close(dl_http_t *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->lock);
    h->closing = true;
    pthread_cond_broadcast(&h->fresh);
    pthread_mutex_unlock(&h->lock);
    /* Joins the HTTP thread, which now never waits on the loop; it closes the socket too. */
    MHD_stop_daemon(h->daemon);
    h->daemon = NULL;
    uv_close((uv_handle_t *)&h->wake, on_wake_closed);
}
