/* The blocking client: one request at a time over a plain socket, for programs without an event
 * loop (control commands, dlaunch kv, worker programs bootstrapping a process group). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rdzv-sync.h"

struct dl_rdzv_sync_s {
    int fd;
    dl_proto_decoder_t dec;
    json_int_t next_id;
    /* Notifications that arrived while waiting for a reply, oldest at head: a ring. */
    json_t **queue;
    size_t head, queued, cap;
    char buf[64 * 1024];
    size_t have, off; /* bytes read but not yet fed to the decoder */
};

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse_host_port(const char *text, long min_port, char *host, size_t hostlen,
                           int *ret_port)
{
    const char *colon;
    size_t hlen;
    long port;
    char *end;

    if (text == NULL || *text == '\0')
        return -EINVAL;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':')
            return -EINVAL;
        hlen = (size_t)(close - text - 1);
        text++;
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            return -EINVAL;
        hlen = (size_t)(colon - text);
    }
    if (hlen == 0 || hlen >= hostlen)
        return -EINVAL;
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || errno != 0 || port < min_port || port > 65535)
        return -EINVAL;
    memcpy(host, text, hlen);
    host[hlen] = '\0';
    *ret_port = (int)port;
    return 0;
}

int dl_rdzv_endpoint_parse(const char *text, char *host, size_t hostlen, int *ret_port)
{
    return parse_host_port(text, 1, host, hostlen, ret_port);
}

int dl_rdzv_listen_parse(const char *text, char *host, size_t hostlen, int *ret_port)
{
    return parse_host_port(text, 0, host, hostlen, ret_port);
}

static int send_msg(dl_rdzv_sync_t *c, const json_t *msg, char *err, size_t errlen)
{
    char *frame;
    size_t len, off = 0;
    dl_proto_error_t perr;
    int r = dl_proto_encode(msg, &frame, &len, &perr);
    if (r < 0) {
        snprintf(err, errlen, "cannot encode a request: %s", perr.message);
        return r;
    }
    while (off < len) {
        ssize_t w = send(c->fd, frame + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            r = -errno;
            snprintf(err, errlen, "lost the rendezvous: %s", strerror(errno));
            free(frame);
            return r;
        }
        off += (size_t)w;
    }
    free(frame);
    return 0;
}

/* Reads the next message of any kind, waiting until deadline (monotonic seconds; < 0 forever). */
static int recv_msg(dl_rdzv_sync_t *c, double deadline, json_t **ret, char *err, size_t errlen)
{
    for (;;) {
        while (c->off < c->have) {
            json_t *msg = NULL;
            dl_proto_type_t type;
            dl_proto_error_t perr;
            size_t used = 0;
            int r = dl_proto_decoder_feed(&c->dec, c->buf + c->off, c->have - c->off, &used, &msg,
                                          &type, &perr);
            c->off += used;
            if (r == DL_PROTO_MESSAGE) {
                *ret = msg;
                return 0;
            }
            if (r == DL_PROTO_INVALID || r < 0) {
                snprintf(err, errlen, "bad message from the rendezvous: %s", perr.message);
                return -EPROTO;
            }
        }
        c->off = c->have = 0;
        int wait_ms = -1;
        if (deadline >= 0) {
            double left = deadline - mono();
            if (left <= 0) {
                snprintf(err, errlen, "no answer from the rendezvous in time");
                return -ETIMEDOUT;
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int n = poll(&p, 1, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -errno;
        }
        if (n == 0)
            continue;
        ssize_t got = recv(c->fd, c->buf, sizeof(c->buf), 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = got == 0 ? ECONNRESET : errno;
            snprintf(err, errlen, "lost the rendezvous: %s",
                     got == 0 ? "connection closed" : strerror(e));
            return -e;
        }
        c->have = (size_t)got;
    }
}

/* Keeps m (a reference taken) for dl_rdzv_sync_next; one that finds no memory is dropped, as a
 * notification the server may send again. */
static void enqueue(dl_rdzv_sync_t *c, json_t *m)
{
    if (c->queued == c->cap) {
        size_t cap = c->cap == 0 ? 8 : c->cap * 2;
        json_t **q = malloc(cap * sizeof(*q));
        if (q == NULL)
            return;
        for (size_t i = 0; i < c->queued; i++)
            q[i] = c->queue[(c->head + i) % c->cap];
        free(c->queue);
        c->queue = q;
        c->cap = cap;
        c->head = 0;
    }
    c->queue[(c->head + c->queued++) % c->cap] = json_incref(m);
}

static int call_until(dl_rdzv_sync_t *c, json_t *msg, double deadline, json_t **ret_reply,
                      char *err, size_t errlen)
{
    json_int_t id = c->next_id++;
    json_object_set_new(msg, "id", json_integer(id));
    int r = send_msg(c, msg, err, errlen);
    json_decref(msg);
    if (r < 0)
        return r;
    for (;;) {
        json_t *m;
        r = recv_msg(c, deadline, &m, err, errlen);
        if (r < 0)
            return r;
        if (dl_proto_get_int(m, "id", -1) == id) {
            *ret_reply = m;
            return 0;
        }
        const char *why = NULL;
        if (dl_proto_reply_error(m, &why) == DL_PROTO_E_NOT_AUTHENTICATED) {
            /* Unasked, before auth_ok: the server's handshake deadline passed (this process
             * was held up: a loaded machine), and it closes the connection. */
            snprintf(err, errlen, "the rendezvous gave up on our handshake: %s", why ? why : "?");
            json_decref(m);
            return -EAGAIN;
        }
        if (dl_proto_type_kind(dl_proto_type_parse(dl_proto_get_str(m, "type"))) ==
            DL_PROTO_KIND_NOTIFY)
            enqueue(c, m);
        json_decref(m);
    }
}

int dl_rdzv_sync_call(dl_rdzv_sync_t *c, json_t *msg, double timeout, json_t **ret_reply, char *err,
                      size_t errlen)
{
    return call_until(c, msg, timeout < 0 ? -1 : mono() + timeout, ret_reply, err, errlen);
}

int dl_rdzv_sync_next(dl_rdzv_sync_t *c, double timeout, json_t **ret_msg, char *err, size_t errlen)
{
    if (c->queued > 0) {
        *ret_msg = c->queue[c->head]; /* the queue's reference, handed over */
        c->head = (c->head + 1) % c->cap;
        c->queued--;
        return 0;
    }
    return recv_msg(c, timeout < 0 ? -1 : mono() + timeout, ret_msg, err, errlen);
}

static int connect_once(const char *host, int port, int *ret_fd)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res, *ai;
    char service[16];
    int r = -ECONNREFUSED;

    snprintf(service, sizeof(service), "%d", port);
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0)
        return g == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            r = -errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *ret_fd = fd;
            freeaddrinfo(res);
            return 0;
        }
        r = -errno;
        close(fd);
    }
    freeaddrinfo(res);
    return r;
}

void dl_rdzv_sync_close(dl_rdzv_sync_t *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    dl_proto_decoder_cleanup(&c->dec);
    for (size_t i = 0; i < c->queued; i++)
        json_decref(c->queue[(c->head + i) % c->cap]);
    free(c->queue);
    free(c);
}

/* Connects c (no connection yet) to host:port: the server may not be up yet (agents start in
 * any order): refusals are tried again until the deadline, at a pace that costs nothing. */
static int connect_until(dl_rdzv_sync_t *c, const char *host, int port, double deadline, char *err,
                         size_t errlen)
{
    for (;;) {
        int r = connect_once(host, port, &c->fd);
        if (r == 0)
            return 0;
        if ((r != -ECONNREFUSED && r != -EHOSTUNREACH && r != -ENETUNREACH) ||
            mono() + 0.05 > deadline) {
            snprintf(err, errlen, "cannot reach the rendezvous at %s:%d: %s", host, port,
                     strerror(-r));
            return r;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int handshake(dl_rdzv_sync_t *c, const char *host, int port, dl_proto_role_t role,
                     const char *run_id, const dl_proto_token_t *token, double deadline, char *err,
                     size_t errlen);

int dl_rdzv_sync_connect(const char *host, int port, dl_proto_role_t role, const char *run_id,
                         const dl_proto_token_t *token, double timeout, dl_rdzv_sync_t **ret,
                         char *err, size_t errlen)
{
    double deadline = mono() + timeout;
    dl_rdzv_sync_t *c = calloc(1, sizeof(*c));
    int r;

    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    c->fd = -1;
    dl_proto_decoder_init(&c->dec, DL_PROTO_LIMIT);
    for (;;) {
        r = connect_until(c, host, port, deadline, err, errlen);
        if (r == 0)
            r = handshake(c, host, port, role, run_id, token, deadline, err, errlen);
        /* Held up past the server's handshake deadline is not refused: a new connection, while
         * the caller's own deadline lasts, as the agent's client does. */
        if (r != -EAGAIN || mono() + 0.05 > deadline)
            break;
        close(c->fd);
        c->fd = -1;
        dl_proto_decoder_cleanup(&c->dec);
        dl_proto_decoder_init(&c->dec, DL_PROTO_LIMIT);
    }
    if (r == -EAGAIN) {
        char why[256];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "%s:%d: %s", host, port, why);
        r = -ETIMEDOUT;
    }
    if (r < 0) {
        dl_rdzv_sync_close(c);
        return r;
    }
    *ret = c;
    return 0;
}

/* Hello, the challenge's answer and the server's proof, on c's new connection; -EAGAIN when the
 * server gave up on it (its handshake deadline). */
static int handshake(dl_rdzv_sync_t *c, const char *host, int port, dl_proto_role_t role,
                     const char *run_id, const dl_proto_token_t *token, double deadline, char *err,
                     size_t errlen)
{
    json_t *reply = NULL;
    int r;
    char client_nonce[DL_PROTO_NONCE_HEX_LEN + 1], server_nonce[DL_PROTO_NONCE_HEX_LEN + 1] = "";
    bool challenged = false;
    if (dl_proto_nonce_new(client_nonce) < 0) {
        snprintf(err, errlen, "no randomness for a nonce");
        r = -EIO;
        goto fail;
    }
    json_t *hello = dl_proto_msg_new(DL_PROTO_HELLO, 0);
    json_object_set_new(hello, "role", json_string(dl_proto_role_name(role)));
    json_object_set_new(hello, "run_id", json_string(run_id));
    json_object_set_new(hello, "proto", json_integer(DL_PROTO_VERSION));
    json_object_set_new(hello, "nonce", json_string(client_nonce));
    r = call_until(c, hello, deadline, &reply, err, errlen);
    if (r < 0)
        goto fail;
    const char *type = dl_proto_get_str(reply, "type");
    if (strcmp(type, "challenge") == 0) {
        char proof[DL_PROTO_PROOF_HEX_LEN + 1];
        if (token == NULL) {
            snprintf(err, errlen,
                     "the rendezvous at %s:%d wants a job token (--token-file or "
                     "DLAUNCH_TOKEN)",
                     host, port);
            r = -EACCES;
            goto fail;
        }
        snprintf(server_nonce, sizeof(server_nonce), "%s", dl_proto_get_str(reply, "nonce"));
        challenged = true;
        r = dl_proto_auth_proof(token, server_nonce, run_id, role, proof);
        if (r == -EPERM) {
            snprintf(err, errlen,
                     "the token is a %s key for job '%s': it cannot act as %s for "
                     "job '%s'",
                     dl_proto_token_kind_name(dl_proto_token_kind(token)),
                     dl_proto_token_run_id(token), dl_proto_role_name(role), run_id);
            r = -EACCES;
            goto fail;
        }
        if (r < 0) {
            snprintf(err, errlen, "cannot answer the challenge: %s", strerror(-r));
            goto fail;
        }
        json_decref(reply);
        reply = NULL;
        json_t *auth = dl_proto_msg_new(DL_PROTO_AUTH, 0);
        json_object_set_new(auth, "proof", json_string(proof));
        dl_proto_auth_add_life(auth, token);
        r = call_until(c, auth, deadline, &reply, err, errlen);
        if (r < 0)
            goto fail;
        type = dl_proto_get_str(reply, "type");
    }
    if (strcmp(type, "auth_ok") != 0) {
        const char *why = NULL;
        dl_proto_errcode_t code = dl_proto_reply_error(reply, &why);
        /* Forbidden: not this kind of server (a one-node job's store); its words suffice. */
        if (code == DL_PROTO_E_FORBIDDEN)
            snprintf(err, errlen, "%s:%d: %s", host, port, why ? why : type);
        else
            snprintf(err, errlen, "the rendezvous at %s:%d refused us: %s", host, port,
                     why ? why : type);
        r = code == DL_PROTO_E_AUTH_FAILED ? -EACCES : -EPROTO;
        goto fail;
    }
    char why[256];
    r = dl_rdzv_check_server(token, challenged, client_nonce, server_nonce, run_id, role,
                             dl_proto_get_str(reply, "proof"), c->fd, why, sizeof(why));
    if (r < 0) {
        snprintf(err, errlen, "refusing the rendezvous at %s:%d: %s", host, port, why);
        goto fail;
    }
    r = 0;
fail:
    json_decref(reply);
    return r;
}

int dl_rdzv_sync_kv(dl_rdzv_sync_t *c, const dl_rdzv_kv_req_t *req, double timeout,
                    json_t **ret_reply, dl_rdzv_kv_result_t *ret, dl_proto_errcode_t *ret_code,
                    char *err, size_t errlen)
{
    const char *why = NULL;
    json_t *m = dl_rdzv_enc_kv(0, req);
    *ret_reply = NULL;
    *ret_code = DL_PROTO_E_NONE;
    memset(ret, 0, sizeof(*ret));
    if (m == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int r = dl_rdzv_sync_call(c, m, timeout, ret_reply, err, errlen);
    if (r < 0)
        return r;
    *ret_code = dl_proto_reply_error(*ret_reply, &why);
    if (*ret_code != DL_PROTO_E_NONE) {
        snprintf(err, errlen, "%s", why != NULL ? why : dl_proto_errcode_name(*ret_code));
        json_decref(*ret_reply);
        *ret_reply = NULL;
        return -EPROTO;
    }
    dl_rdzv_dec_kv(*ret_reply, ret);
    return 0;
}
