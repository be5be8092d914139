/* etcd's JSON gateway over libcurl's multi interface on a libuv loop (etcd.h). curl tells which
 * sockets to watch (on_socket: one uv_poll each) and when to call it back (on_timer: one
 * uv_timer); the loop hands readiness back with curl_multi_socket_action. Finished transfers and
 * streamed messages are collected while curl runs and handed to their callbacks only after it
 * returns, so a callback may start, cancel or close anything. */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "etcd.h"

/* A stream's buffered bytes may not grow past this without a line break (a watch message is
 * one line; etcd bounds a request at 1.5 MiB and its answers likewise). */
#define MAX_LINE (16u << 20)
/* Connecting to one endpoint may take this long before the next is tried. */
#define CONNECT_MAX_MS 2000

typedef struct msg_s {
    struct msg_s *next;
    json_t *body;
} msg_t;

struct dl_etcd_req_s {
    dl_etcd_t *e;
    struct dl_etcd_req_s *prev, *next; /* every live request of the client */
    char *path;
    char *body;      /* serialized */
    dl_etcd_cb cb;   /* a call's answer; a stream's messages */
    dl_etcd_cb done; /* a stream's end */
    void *ctx;
    bool stream;
    bool is_auth;      /* the authenticate request itself */
    bool auth_retried; /* it was sent again once with a fresh token */
    bool waiting;      /* queued until the client has a token */
    bool running;      /* its easy handle is in the multi */
    bool finished;     /* its transfer ended: finish() will deliver */
    bool cancelled;
    bool delivered;          /* a stream delivered at least one message */
    dl_etcd_status_t forced; /* not OK: deliver this (the authentication failed) */
    int refs;                /* callbacks running for it */
    CURL *easy;
    struct curl_slist *headers;
    size_t ep;    /* the endpoint in use */
    size_t tried; /* endpoints tried for it */
    CURLcode code;
    char *buf; /* the answer so far (a stream: the unfinished line) */
    size_t len, cap;
    msg_t *msgs, *msgs_tail; /* a stream's messages not yet delivered */
    char curl_err[CURL_ERROR_SIZE];
    char error[1024];
    char endpoint[300];
    char quorum_error[1024]; /* an endpoint that answered without a quorum, tried past */
};

struct dl_etcd_s {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer;
    int handles; /* open uv handles (timer, polls) */
    char **eps;
    size_t neps;
    size_t cur; /* the endpoint new requests go to */
    char *endpoints;
    bool https;
    char *cacert, *cert, *key, *user, *password;
    double timeout;
    char *token; /* etcd's auth token, once authenticated */
    bool authenticating;
    dl_etcd_req_t *reqs;  /* every live request */
    struct sock_s *socks; /* every poll handle not yet closing */
    bool closing;
    int refs; /* dispatches running */
};

typedef struct sock_s {
    uv_poll_t poll;
    curl_socket_t fd;
    dl_etcd_t *e;
    struct sock_s *prev, *next;
    bool closing;
} sock_t;

static void start_req(dl_etcd_req_t *r);
static void dispatch(dl_etcd_t *e);
static void maybe_free_client(dl_etcd_t *e);

static char *xstrdup(const char *s)
{
    return s != NULL ? strdup(s) : NULL;
}

/* ---- Requests --------------------------------------------------------------------------------- */

static void req_unlink(dl_etcd_req_t *r)
{
    dl_etcd_t *e = r->e;
    if (r->prev != NULL)
        r->prev->next = r->next;
    else if (e->reqs == r)
        e->reqs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void stop_transfer(dl_etcd_req_t *r)
{
    if (r->running) {
        curl_multi_remove_handle(r->e->multi, r->easy);
        r->running = false;
    }
}

static void req_free(dl_etcd_req_t *r)
{
    stop_transfer(r);
    req_unlink(r);
    if (r->easy != NULL)
        curl_easy_cleanup(r->easy);
    curl_slist_free_all(r->headers);
    for (msg_t *m = r->msgs; m != NULL;) {
        msg_t *next = m->next;
        json_decref(m->body);
        free(m);
        m = next;
    }
    free(r->path);
    free(r->body);
    free(r->buf);
    free(r);
}

static void req_release(dl_etcd_req_t *r)
{
    if (--r->refs == 0 && r->cancelled)
        req_free(r);
}

void dl_etcd_cancel(dl_etcd_req_t *r)
{
    if (r == NULL || r->cancelled)
        return;
    r->cancelled = true;
    stop_transfer(r);
    if (r->refs == 0)
        req_free(r);
}

static void set_error(dl_etcd_req_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_error(dl_etcd_req_t *r, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* One printable line. */
    for (char *p = msg; *p != '\0'; p++)
        if (!isprint((unsigned char)*p))
            *p = ' ';
    snprintf(r->error, sizeof(r->error), "etcd at %s: %s", r->endpoint, msg);
}

/* Hands one outcome to a callback; dispatch holds the request (and the client) meanwhile. */
static void deliver(dl_etcd_req_t *r, dl_etcd_cb cb, dl_etcd_status_t st, json_t *body)
{
    dl_etcd_result_t res = {.status = st,
                            .endpoint = r->endpoint,
                            .error = st == DL_ETCD_OK ? "" : r->error,
                            .body = body};
    if (cb == NULL || r->cancelled)
        return;
    cb(r->ctx, &res);
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *userp)
{
    dl_etcd_req_t *r = userp;
    size_t n = size * nmemb;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1)
            cap *= 2;
        if (cap > MAX_LINE + 4096)
            return 0; /* curl ends the transfer: CURLE_WRITE_ERROR */
        char *b = realloc(r->buf, cap);
        if (b == NULL)
            return 0;
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    r->buf[r->len] = '\0';
    if (!r->stream)
        return n;
    /* A stream: every whole line is one message, kept for dispatch (after curl returns). */
    char *nl;
    while ((nl = memchr(r->buf, '\n', r->len)) != NULL) {
        size_t line = (size_t)(nl - r->buf);
        json_t *j = line > 0 ? json_loadb(r->buf, line, 0, NULL) : NULL;
        memmove(r->buf, nl + 1, r->len - line - 1);
        r->len -= line + 1;
        r->buf[r->len] = '\0';
        if (j == NULL)
            continue;
        msg_t *m = malloc(sizeof(*m));
        if (m == NULL) {
            json_decref(j);
            return 0;
        }
        m->next = NULL;
        m->body = j;
        if (r->msgs_tail != NULL)
            r->msgs_tail->next = m;
        else
            r->msgs = m;
        r->msgs_tail = m;
    }
    return n;
}

/* etcd's gRPC code and message in an error answer ({"error","message","code"}), if it is one. */
static bool grpc_error(const json_t *body, int *ret_code, const char **ret_msg)
{
    const json_t *err = json_object_get(body, "error");
    if (err == NULL)
        return false;
    const char *msg = json_string_value(json_object_get(body, "message"));
    if (msg == NULL)
        msg = json_string_value(err);
    if (msg == NULL)
        msg = json_string_value(json_object_get(err, "message"));
    *ret_msg = msg != NULL ? msg : "?";
    *ret_code = (int)json_integer_value(json_object_get(body, "code"));
    if (*ret_code == 0 && json_is_object(err))
        *ret_code = (int)json_integer_value(json_object_get(err, "grpc_code"));
    return true;
}

/* What an error answer means to us. */
static dl_etcd_status_t classify(int code, const char *msg)
{
    if (code == 16 || code == 7 || strstr(msg, "authentication failed") != NULL ||
        strstr(msg, "user name is empty") != NULL || strstr(msg, "permission denied") != NULL ||
        strstr(msg, "invalid auth token") != NULL || strstr(msg, "auth: ") != NULL)
        return DL_ETCD_AUTH;
    if (code == 14 || code == 4 || strstr(msg, "no leader") != NULL ||
        strstr(msg, "timed out") != NULL || strstr(msg, "deadline exceeded") != NULL ||
        strstr(msg, "leader changed") != NULL || strstr(msg, "not capable") != NULL ||
        strstr(msg, "too many requests") != NULL)
        return DL_ETCD_NO_QUORUM;
    return DL_ETCD_ERROR;
}

static bool transport_error(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: return true;
    default: return false;
    }
}

static bool tls_error(CURLcode c)
{
    switch (c) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_USE_SSL_FAILED: return true;
    default: return false;
    }
}

static void authenticate(dl_etcd_t *e);

static bool connected(dl_etcd_req_t *r)
{
    curl_off_t t = 0;
    return curl_easy_getinfo(r->easy, CURLINFO_CONNECT_TIME_T, &t) == CURLE_OK && t > 0;
}

/* Sends r again on the next endpoint it has not tried, if any. */
static bool try_next(dl_etcd_req_t *r)
{
    dl_etcd_t *e = r->e;
    if (r->tried >= e->neps || r->delivered)
        return false;
    r->ep = (r->ep + 1) % e->neps;
    e->cur = r->ep; /* later requests start where this one got through, or last tried */
    start_req(r);
    return true;
}

/* The transfer of r ended (code); decide: deliver, retry elsewhere, or re-authenticate. */
static void finish(dl_etcd_req_t *r)
{
    dl_etcd_t *e = r->e;
    CURLcode c = r->code;
    long http = 0;
    json_t *body = NULL;
    dl_etcd_status_t st;

    if (r->forced != DL_ETCD_OK) {
        deliver(r, r->stream ? r->done : r->cb, r->forced, NULL);
        r->cancelled = true;
        return;
    }
    if (r->easy != NULL)
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
    if (c != CURLE_OK) {
        const char *why = r->curl_err[0] != '\0' ? r->curl_err : curl_easy_strerror(c);
        if (tls_error(c)) {
            set_error(r, "TLS: %s", why);
            st = DL_ETCD_AUTH;
        } else if (c == CURLE_OPERATION_TIMEDOUT && !r->stream && connected(r)) {
            /* Connected, and no answer in time: a member that waits for a leader. */
            set_error(r, "no answer within %.0f s (%s)", e->timeout, why);
            snprintf(r->quorum_error, sizeof(r->quorum_error), "%s", r->error);
            st = DL_ETCD_NO_QUORUM;
            if (try_next(r))
                return;
        } else if (transport_error(c)) {
            set_error(r, "%s", why);
            st = DL_ETCD_UNREACHABLE;
            if (!r->stream || !r->delivered) {
                if (try_next(r))
                    return;
            }
        } else {
            set_error(r, "%s", why);
            st = DL_ETCD_ERROR;
        }
    } else {
        int code = 0;
        const char *msg = NULL;
        body = r->len > 0 && !r->stream ? json_loadb(r->buf, r->len, 0, NULL) : NULL;
        if (r->stream && r->len > 0) /* a last line without its break */
            body = json_loadb(r->buf, r->len, 0, NULL);
        if (body != NULL && grpc_error(body, &code, &msg)) {
            st = classify(code, msg);
            set_error(r, "%s", msg);
            if (st == DL_ETCD_AUTH && e->user != NULL && !r->is_auth && !r->auth_retried &&
                (code == 16 || strstr(msg, "invalid auth token") != NULL)) {
                /* The token expired (or the member forgot it): get another, send again. */
                json_decref(body);
                r->auth_retried = true;
                r->waiting = true;
                free(e->token);
                e->token = NULL;
                authenticate(e);
                return;
            }
            if (st == DL_ETCD_NO_QUORUM) {
                snprintf(r->quorum_error, sizeof(r->quorum_error), "%s", r->error);
                if (try_next(r)) {
                    json_decref(body);
                    return;
                }
            }
        } else if (r->stream) {
            set_error(r, "the watch stream ended");
            st = DL_ETCD_UNREACHABLE;
        } else if (http == 200 && json_is_object(body)) {
            st = DL_ETCD_OK;
        } else if (http == 401 || http == 403) {
            set_error(r, "HTTP %ld: not allowed", http);
            st = DL_ETCD_AUTH;
        } else if (http == 503 || http == 504) {
            set_error(r, "HTTP %ld: unavailable", http);
            st = DL_ETCD_NO_QUORUM;
            snprintf(r->quorum_error, sizeof(r->quorum_error), "%s", r->error);
            if (try_next(r)) {
                json_decref(body);
                return;
            }
        } else {
            set_error(r, "HTTP %ld: an answer that is not etcd's (%.80s)", http,
                      r->buf != NULL ? r->buf : "");
            st = DL_ETCD_ERROR;
        }
    }
    if (st == DL_ETCD_OK)
        e->cur = r->ep;
    /* Some member answered, without a quorum behind it: that says more than the others'
     * silence. */
    if (st == DL_ETCD_UNREACHABLE && r->quorum_error[0] != '\0') {
        st = DL_ETCD_NO_QUORUM;
        snprintf(r->error, sizeof(r->error), "%s", r->quorum_error);
    }
    if (r->stream)
        deliver(r, r->done, st, NULL);
    else
        deliver(r, r->cb, st, st == DL_ETCD_OK ? body : NULL);
    json_decref(body);
    /* Delivered: the request is over; dispatch frees it when it lets go. */
    r->cancelled = true;
}

static void start_req(dl_etcd_req_t *r)
{
    dl_etcd_t *e = r->e;
    char url[1024];

    stop_transfer(r);
    if (r->easy == NULL)
        r->easy = curl_easy_init();
    else
        curl_easy_reset(r->easy);
    r->tried++;
    r->len = 0;
    r->curl_err[0] = '\0';
    snprintf(r->endpoint, sizeof(r->endpoint), "%s", e->eps[r->ep]);
    if (r->easy == NULL) {
        set_error(r, "out of memory");
        r->code = CURLE_OUT_OF_MEMORY;
        r->finished = true;
        return;
    }
    curl_slist_free_all(r->headers);
    r->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (e->token != NULL && !r->is_auth) {
        char h[1024];
        snprintf(h, sizeof(h), "Authorization: %s", e->token);
        r->headers = curl_slist_append(r->headers, h);
    }
    snprintf(url, sizeof(url), "%s://%s%s", e->https ? "https" : "http", e->eps[r->ep], r->path);
    CURL *c = r->easy;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, e->https ? "https" : "http");
    long connect_ms = (long)(e->timeout * 1000);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     connect_ms < CONNECT_MAX_MS ? connect_ms : (long)CONNECT_MAX_MS);
    /* A dead peer of a quiet stream is found by TCP's keepalive. */
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 2L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 2L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    if (!r->stream)
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(e->timeout * 1000));
    if (e->https) {
        if (e->cacert != NULL)
            curl_easy_setopt(c, CURLOPT_CAINFO, e->cacert);
        if (e->cert != NULL)
            curl_easy_setopt(c, CURLOPT_SSLCERT, e->cert);
        if (e->key != NULL)
            curl_easy_setopt(c, CURLOPT_SSLKEY, e->key);
    }
    if (curl_multi_add_handle(e->multi, c) != CURLM_OK) {
        set_error(r, "cannot start a transfer");
        r->code = CURLE_FAILED_INIT;
        r->finished = true;
        return;
    }
    r->running = true;
}

/* Collects what curl finished, delivers stream messages and outcomes. Runs outside curl. */
static void dispatch(dl_etcd_t *e)
{
    CURLMsg *m;
    int left;
    if (e->closing)
        return;
    while ((m = curl_multi_info_read(e->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        dl_etcd_req_t *r = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        CURLcode code = m->data.result;
        if (r == NULL)
            continue;
        stop_transfer(r); /* m is invalid from here */
        r->code = code;
        r->finished = true;
    }
    e->refs++;
    /* One pass over the requests; a callback may add (at the head) or cancel any: walk with
     * holds, and start over when the list changed under us. */
    bool again = true;
    while (again && !e->closing) {
        again = false;
        for (dl_etcd_req_t *r = e->reqs; r != NULL; r = r->next) {
            if (r->cancelled || r->refs > 0 || (r->msgs == NULL && !r->finished))
                continue;
            r->refs++;
            if (r->msgs != NULL) {
                msg_t *msg = r->msgs;
                r->msgs = msg->next;
                if (r->msgs == NULL)
                    r->msgs_tail = NULL;
                /* A message of the stream: an error one ends it as the server meant. */
                int code;
                const char *text;
                json_t *result = json_object_get(msg->body, "result");
                r->delivered = true;
                if (result == NULL && grpc_error(msg->body, &code, &text)) {
                    set_error(r, "%s", text);
                    stop_transfer(r);
                    deliver(r, r->done, classify(code, text), NULL);
                    r->cancelled = true;
                } else {
                    e->cur = r->ep;
                    deliver(r, r->cb, DL_ETCD_OK, result != NULL ? result : msg->body);
                }
                json_decref(msg->body);
                free(msg);
            } else {
                r->finished = false;
                finish(r);
            }
            req_release(r);
            again = true;
            break;
        }
    }
    e->refs--;
    maybe_free_client(e);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    sock_t *k = p->data;
    dl_etcd_t *e = k->e;
    int flags = 0, running;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    curl_multi_socket_action(e->multi, k->fd, flags, &running);
    dispatch(e);
}

static void sock_closed(uv_handle_t *h)
{
    sock_t *k = h->data;
    dl_etcd_t *e = k->e;
    free(k);
    e->handles--;
    maybe_free_client(e);
}

static void sock_close(sock_t *k)
{
    dl_etcd_t *e = k->e;
    if (k->closing)
        return;
    k->closing = true;
    if (k->prev != NULL)
        k->prev->next = k->next;
    else
        e->socks = k->next;
    if (k->next != NULL)
        k->next->prev = k->prev;
    uv_poll_stop(&k->poll);
    uv_close((uv_handle_t *)&k->poll, sock_closed);
}

static int on_socket(CURL *easy, curl_socket_t s, int action, void *userp, void *socketp)
{
    dl_etcd_t *e = userp;
    sock_t *k = socketp;
    if (action == CURL_POLL_REMOVE) {
        if (k != NULL) {
            sock_close(k);
            if (!e->closing)
                curl_multi_assign(e->multi, s, NULL);
        }
        return 0;
    }
    if (k == NULL) {
        k = calloc(1, sizeof(*k));
        if (k == NULL)
            return -1;
        k->fd = s;
        k->e = e;
        if (uv_poll_init_socket(e->loop, &k->poll, s) < 0) {
            free(k);
            return -1;
        }
        k->poll.data = k;
        e->handles++;
        k->next = e->socks;
        if (e->socks != NULL)
            e->socks->prev = k;
        e->socks = k;
        curl_multi_assign(e->multi, s, k);
    }
    int ev = 0;
    if (action & CURL_POLL_IN)
        ev |= UV_READABLE;
    if (action & CURL_POLL_OUT)
        ev |= UV_WRITABLE;
    uv_poll_start(&k->poll, ev, on_poll);
    return 0;
}

static void on_timeout(uv_timer_t *t)
{
    dl_etcd_t *e = t->data;
    int running;
    curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    dispatch(e);
}

static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    dl_etcd_t *e = userp;
    if (timeout_ms < 0)
        uv_timer_stop(&e->timer);
    else
        uv_timer_start(&e->timer, on_timeout, (uint64_t)timeout_ms, 0);
    return 0;
}

/* ---- Authentication --------------------------------------------------------------------------- */

static void on_authenticated(void *ctx, const dl_etcd_result_t *res)
{
    dl_etcd_t *e = ctx;
    const char *token = json_string_value(json_object_get(res->body, "token"));
    char err[sizeof(((dl_etcd_req_t *)0)->error)];

    e->authenticating = false;
    if (res->status == DL_ETCD_OK && token != NULL) {
        free(e->token);
        e->token = strdup(token);
    }
    if (res->status == DL_ETCD_OK && token == NULL)
        snprintf(err, sizeof(err),
                 "etcd at %s: authentication is not enabled there, but a user "
                 "was given",
                 res->endpoint);
    else
        snprintf(err, sizeof(err), "%s", res->error);
    /* Every request that waited for the token goes now, or fails as the authentication did
     * (from dispatch, which runs once this callback returns). */
    for (dl_etcd_req_t *r = e->reqs; r != NULL; r = r->next) {
        if (!r->waiting || r->cancelled)
            continue;
        r->waiting = false;
        if (e->token != NULL) {
            r->tried = 0;
            start_req(r);
            continue;
        }
        snprintf(r->error, sizeof(r->error), "%s", err);
        snprintf(r->endpoint, sizeof(r->endpoint), "%s", res->endpoint);
        r->forced = res->status == DL_ETCD_OK ? DL_ETCD_AUTH : res->status;
        r->finished = true;
    }
}

static dl_etcd_req_t *req_new(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb,
                              dl_etcd_cb done, void *ctx, bool stream)
{
    dl_etcd_req_t *r = calloc(1, sizeof(*r));
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (r == NULL || text == NULL || (r->path = strdup(path)) == NULL) {
        free(text);
        if (r != NULL)
            free(r->path);
        free(r);
        return NULL;
    }
    r->e = e;
    r->body = text;
    r->cb = cb;
    r->done = done;
    r->ctx = ctx;
    r->stream = stream;
    r->ep = e->cur;
    snprintf(r->endpoint, sizeof(r->endpoint), "%s", e->eps[r->ep]);
    r->next = e->reqs;
    if (e->reqs != NULL)
        e->reqs->prev = r;
    e->reqs = r;
    return r;
}

static void authenticate(dl_etcd_t *e)
{
    if (e->authenticating)
        return;
    json_t *b = json_pack("{s:s, s:s}", "name", e->user, "password", e->password);
    dl_etcd_req_t *r = req_new(e, "/v3/auth/authenticate", b, on_authenticated, NULL, e, false);
    if (r == NULL)
        return;
    r->is_auth = true;
    e->authenticating = true;
    start_req(r);
}

static int submit(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb, dl_etcd_cb done,
                  void *ctx, bool stream, dl_etcd_req_t **ret)
{
    if (ret != NULL)
        *ret = NULL;
    if (e == NULL || e->closing) {
        json_decref(body);
        return -ECANCELED;
    }
    dl_etcd_req_t *r = req_new(e, path, body, cb, done, ctx, stream);
    if (r == NULL)
        return -ENOMEM;
    if (e->user != NULL && e->token == NULL) {
        r->waiting = true;
        authenticate(e);
    } else {
        start_req(r);
    }
    /* A request that could not even start is delivered from the loop, never from here. */
    if (r->finished)
        uv_timer_start(&e->timer, on_timeout, 0, 0);
    if (ret != NULL)
        *ret = r;
    return 0;
}

int dl_etcd_call(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb, void *ctx,
                 dl_etcd_req_t **ret)
{
    return submit(e, path, body, cb, NULL, ctx, false, ret);
}

int dl_etcd_stream(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb on_msg, dl_etcd_cb done,
                   void *ctx, dl_etcd_req_t **ret)
{
    return submit(e, path, body, on_msg, done, ctx, true, ret);
}

/* ---- The client ------------------------------------------------------------------------------- */

static void free_client(dl_etcd_t *e)
{
    for (size_t i = 0; i < e->neps; i++)
        free(e->eps[i]);
    free(e->eps);
    free(e->endpoints);
    free(e->cacert);
    free(e->cert);
    free(e->key);
    free(e->user);
    if (e->password != NULL)
        memset(e->password, 0, strlen(e->password));
    free(e->password);
    free(e->token);
    free(e);
}

static void maybe_free_client(dl_etcd_t *e)
{
    if (!e->closing || e->refs > 0 || e->handles > 0)
        return;
    if (e->multi != NULL) {
        curl_multi_cleanup(e->multi);
        e->multi = NULL;
    }
    free_client(e);
}

static void timer_closed(uv_handle_t *h)
{
    dl_etcd_t *e = h->data;
    e->handles--;
    maybe_free_client(e);
}

void dl_etcd_close(dl_etcd_t *e)
{
    if (e == NULL || e->closing)
        return;
    e->closing = true;
    while (e->reqs != NULL) {
        dl_etcd_req_t *r = e->reqs;
        r->cancelled = true;
        stop_transfer(r);
        req_unlink(r); /* one held by a callback is freed when it returns */
        if (r->refs == 0)
            req_free(r);
    }
    /* curl closes its connections (and may tell on_socket); what it did not tell goes too. */
    if (e->multi != NULL) {
        curl_multi_cleanup(e->multi);
        e->multi = NULL;
    }
    while (e->socks != NULL)
        sock_close(e->socks);
    uv_close((uv_handle_t *)&e->timer, timer_closed);
}

const char *dl_etcd_endpoints(const dl_etcd_t *e)
{
    return e->endpoints;
}

static int parse_endpoints(dl_etcd_t *e, const char *text, char *err, size_t errlen)
{
    char *copy = strdup(text), *save = NULL;
    if (copy == NULL)
        return -ENOMEM;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (strncmp(tok, "http://", 7) == 0)
            tok += 7;
        else if (strncmp(tok, "https://", 8) == 0)
            tok += 8;
        size_t n = strlen(tok);
        while (n > 0 && (tok[n - 1] == '/' || tok[n - 1] == ' '))
            tok[--n] = '\0';
        char *colon = strrchr(tok, ':');
        char *end = NULL;
        long port = colon != NULL ? strtol(colon + 1, &end, 10) : 0;
        if (n == 0 || colon == NULL || colon == tok || end == NULL || *end != '\0' || port < 1 ||
            port > 65535 || strpbrk(tok, " /?#@") != NULL) {
            snprintf(err, errlen, "'%s' is not HOST:PORT", tok);
            free(copy);
            return -EINVAL;
        }
        char **eps = realloc(e->eps, (e->neps + 1) * sizeof(*eps));
        if (eps == NULL || (eps[e->neps] = strdup(tok)) == NULL) {
            if (eps != NULL)
                e->eps = eps;
            free(copy);
            return -ENOMEM;
        }
        e->eps = eps;
        e->neps++;
    }
    free(copy);
    if (e->neps == 0) {
        snprintf(err, errlen, "no endpoint given");
        return -EINVAL;
    }
    return 0;
}

int dl_etcd_new(uv_loop_t *loop, const dl_etcd_opts_t *opts, dl_etcd_t **ret, char *err,
                size_t errlen)
{
    static bool curl_ready;
    dl_etcd_t *e;
    int r;

    *ret = NULL;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            snprintf(err, errlen, "libcurl cannot start");
            return -EIO;
        }
        curl_ready = true;
    }
    if (opts->protocol != NULL && strcmp(opts->protocol, "http") != 0 &&
        strcmp(opts->protocol, "https") != 0) {
        snprintf(err, errlen, "protocol '%s' is neither http nor https", opts->protocol);
        return -EINVAL;
    }
    if ((opts->user == NULL) != (opts->password == NULL)) {
        snprintf(err, errlen, "a user needs a password and a password a user");
        return -EINVAL;
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -ENOMEM;
    e->loop = loop;
    e->timeout = opts->timeout > 0 ? opts->timeout : 5;
    e->https = opts->protocol != NULL && strcmp(opts->protocol, "https") == 0;
    r = parse_endpoints(e, opts->endpoints != NULL ? opts->endpoints : "", err, errlen);
    if (r == 0 && ((e->endpoints = strdup(opts->endpoints)) == NULL ||
                   (opts->cacert && !(e->cacert = xstrdup(opts->cacert))) ||
                   (opts->cert && !(e->cert = xstrdup(opts->cert))) ||
                   (opts->key && !(e->key = xstrdup(opts->key))) ||
                   (opts->user && !(e->user = xstrdup(opts->user))) ||
                   (opts->password && !(e->password = xstrdup(opts->password)))))
        r = -ENOMEM;
    if (r == 0 && (e->multi = curl_multi_init()) == NULL)
        r = -ENOMEM;
    /* Clients start at an endpoint of their own: the members share the work of many. */
    if (r == 0 && e->neps > 1) {
        unsigned seed = (unsigned)uv_hrtime() ^ (unsigned)(uintptr_t)e;
        e->cur = (size_t)rand_r(&seed) % e->neps;
    }
    if (r < 0) {
        if (r == -ENOMEM)
            snprintf(err, errlen, "out of memory");
        free_client(e);
        return r;
    }
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETDATA, e);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERDATA, e);
    uv_timer_init(loop, &e->timer);
    e->timer.data = e;
    e->handles = 1;
    *ret = e;
    return 0;
}

/* ---- Blocking --------------------------------------------------------------------------------- */

typedef struct {
    bool done;
    dl_etcd_status_t status;
    json_t *body;
    char error[1024];
} sync_t;

static void on_sync(void *ctx, const dl_etcd_result_t *res)
{
    sync_t *s = ctx;
    s->done = true;
    s->status = res->status;
    if (res->status == DL_ETCD_OK)
        s->body = json_incref(res->body);
    else
        snprintf(s->error, sizeof(s->error), "%s", res->error);
}

dl_etcd_status_t dl_etcd_call_sync(dl_etcd_t *e, const char *path, json_t *body, json_t **ret_body,
                                   char *err, size_t errlen)
{
    sync_t s = {0};
    *ret_body = NULL;
    if (dl_etcd_call(e, path, body, on_sync, &s, NULL) < 0) {
        snprintf(err, errlen, "out of memory");
        return DL_ETCD_ERROR;
    }
    while (!s.done)
        uv_run(e->loop, UV_RUN_ONCE);
    *ret_body = s.body;
    if (s.status != DL_ETCD_OK)
        snprintf(err, errlen, "%s", s.error);
    return s.status;
}
