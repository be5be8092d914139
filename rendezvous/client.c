/* The agent's client: connect (retrying while the server starts), hello, token proof, then a
 * framed connection whose messages go to the owner. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conn.h"
#include "peer.h"
#include "rendezvous.h"

#define RETRY_MS 50

typedef enum {
    CL_RESOLVING = 0,
    CL_CONNECTING,
    CL_HELLO,
    CL_AUTH,
    CL_READY,
    CL_DONE, /* failed or closed: no more callbacks */
} client_state_t;

struct dl_rdzv_client_s {
    dl__conn_t conn; /* first */
    uv_loop_t *loop;
    uv_getaddrinfo_t resolve;
    uv_connect_t connect;
    uv_timer_t retry;
    client_state_t state;
    bool conn_open; /* conn.tcp initialized and not yet closed */
    int pending;    /* handles and requests whose callbacks have not run */
    bool freed;     /* the owner closed us: free once pending reaches 0 */
    bool again;     /* the server gave up on our handshake: a fresh connection once closed */
    double deadline;
    struct sockaddr_storage addr;
    char host[256];
    int port;
    dl_proto_role_t role;
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    const dl_proto_token_t *token;
    char client_nonce[DL_PROTO_NONCE_HEX_LEN + 1]; /* ours, for the server's proof */
    char server_nonce[DL_PROTO_NONCE_HEX_LEN + 1]; /* the challenge's */
    dl_rdzv_client_cbs_t cbs;
    void *ctx;
    char error[512]; /* why it failed */
    char readbuf[64 * 1024];
};

static double mono(void)
{
    return (double)uv_hrtime() / 1e9;
}

static void release(dl_rdzv_client_t *c)
{
    if (--c->pending == 0 && c->freed)
        free(c);
}

static void fail(dl_rdzv_client_t *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(dl_rdzv_client_t *c, int status, const char *fmt, ...)
{
    char *err = c->error;
    va_list ap;
    if (c->state == CL_DONE)
        return;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof(c->error), fmt, ap);
    va_end(ap);
    bool was_ready = c->state == CL_READY;
    c->state = CL_DONE;
    if (c->conn_open)
        dl__conn_close(&c->conn, status);
    if (was_ready) {
        if (c->cbs.lost != NULL)
            c->cbs.lost(c->ctx, status);
    } else if (c->cbs.ready != NULL) {
        c->cbs.ready(c->ctx, status, err);
    }
}

static void send_hello(dl_rdzv_client_t *c)
{
    json_auto_t *m = dl_proto_msg_new(DL_PROTO_HELLO, 0);
    json_object_set_new(m, "role", json_string(dl_proto_role_name(c->role)));
    json_object_set_new(m, "run_id", json_string(c->run_id));
    json_object_set_new(m, "proto", json_integer(DL_PROTO_VERSION));
    json_object_set_new(m, "client", json_string("dlaunch " DL_VERSION));
    if (dl_proto_nonce_new(c->client_nonce) < 0) {
        fail(c, -EIO, "no randomness for a nonce");
        return;
    }
    json_object_set_new(m, "nonce", json_string(c->client_nonce));
    c->state = CL_HELLO;
    if (dl__conn_send(&c->conn, m) < 0)
        fail(c, -EPIPE, "cannot send hello to %s:%d", c->host, c->port);
}

static void on_message(dl__conn_t *conn, json_t *msg, dl_proto_type_t type)
{
    dl_rdzv_client_t *c = (dl_rdzv_client_t *)conn;
    const char *why = NULL;

    if (c->state == CL_READY) {
        c->cbs.message(c->ctx, msg, type);
        return;
    }
    if (type == DL_PROTO_ERROR) {
        dl_proto_errcode_t code = dl_proto_reply_error(msg, &why);
        /* We send nothing but hello and auth before auth_ok, so this is the server's handshake
         * deadline: this process was held up (a loaded machine), not refused. */
        if (code == DL_PROTO_E_NOT_AUTHENTICATED) {
            if (mono() + RETRY_MS / 1000.0 < c->deadline) {
                c->again = true;
                c->state = CL_CONNECTING;
                dl__conn_close(&c->conn, UV_ETIMEDOUT);
                return;
            }
            fail(c, -ETIMEDOUT, "the rendezvous at %s:%d gave up on our handshake: %s", c->host,
                 c->port, why ? why : "?");
            return;
        }
        /* Forbidden: not this kind of server (a one-node job's store); its words suffice. */
        if (code == DL_PROTO_E_FORBIDDEN)
            fail(c, -EPROTO, "%s:%d: %s", c->host, c->port, why ? why : "?");
        else
            fail(c, code == DL_PROTO_E_AUTH_FAILED ? -EACCES : -EPROTO,
                 "the rendezvous at %s:%d refused us: %s", c->host, c->port, why ? why : "?");
        return;
    }
    if (c->state == CL_HELLO && type == DL_PROTO_CHALLENGE) {
        char proof[DL_PROTO_PROOF_HEX_LEN + 1];
        if (c->token == NULL) {
            fail(c, -EACCES,
                 "the rendezvous at %s:%d wants a job token (--token-file or "
                 "DLAUNCH_TOKEN)",
                 c->host, c->port);
            return;
        }
        int r = dl_proto_auth_proof(c->token, dl_proto_get_str(msg, "nonce"), c->run_id, c->role,
                                    proof);
        if (r == -EPERM) {
            fail(c, -EACCES,
                 "the job token is a %s key for job '%s': it cannot act as %s for "
                 "job '%s'",
                 dl_proto_token_kind_name(dl_proto_token_kind(c->token)),
                 dl_proto_token_run_id(c->token), dl_proto_role_name(c->role), c->run_id);
            return;
        }
        if (r < 0) {
            fail(c, -EPROTO, "cannot answer the challenge of %s:%d", c->host, c->port);
            return;
        }
        snprintf(c->server_nonce, sizeof(c->server_nonce), "%s", dl_proto_get_str(msg, "nonce"));
        json_auto_t *m = dl_proto_msg_new(DL_PROTO_AUTH, 1);
        json_object_set_new(m, "proof", json_string(proof));
        dl_proto_auth_add_life(m, c->token);
        c->state = CL_AUTH;
        dl__conn_send(&c->conn, m);
        return;
    }
    if ((c->state == CL_HELLO || c->state == CL_AUTH) && type == DL_PROTO_AUTH_OK) {
        char doubt[256];
        uv_os_fd_t fd = -1;
        uv_fileno((uv_handle_t *)&c->conn.tcp, &fd);
        int r = dl_rdzv_check_server(c->token, c->state == CL_AUTH, c->client_nonce,
                                     c->server_nonce, c->run_id, c->role,
                                     dl_proto_get_str(msg, "proof"), fd, doubt, sizeof(doubt));
        if (r < 0) {
            fail(c, r, "refusing the rendezvous at %s:%d: %s", c->host, c->port, doubt);
            return;
        }
        c->state = CL_READY;
        c->cbs.ready(c->ctx, 0, NULL);
        return;
    }
    fail(c, -EPROTO, "unexpected %s from %s:%d during the handshake", dl_proto_type_name(type),
         c->host, c->port);
}

static void on_invalid(dl__conn_t *conn, const dl_proto_error_t *err, bool fatal)
{
    dl_rdzv_client_t *c = (dl_rdzv_client_t *)conn;
    fail(c, -EPROTO, "bad message from the rendezvous at %s:%d: %s", c->host, c->port,
         err->message);
}

static void on_retry(uv_timer_t *t);

static void on_conn_closed(dl__conn_t *conn, int status)
{
    dl_rdzv_client_t *c = (dl_rdzv_client_t *)conn;
    c->conn_open = false;
    if (c->state == CL_CONNECTING && (status == UV_ECONNREFUSED || c->again)) {
        c->again = false;
        uv_timer_start(&c->retry, on_retry, RETRY_MS, 0);
        release(c);
        return;
    }
    if (c->state != CL_DONE)
        fail(c, status, "the rendezvous at %s:%d closed the connection: %s", c->host, c->port,
             uv_strerror(status));
    release(c);
}

static void try_connect(dl_rdzv_client_t *c);

static void on_retry(uv_timer_t *t)
{
    try_connect(t->data);
}

static void on_connected(uv_connect_t *req, int status)
{
    dl_rdzv_client_t *c = req->data;
    release(c);
    if (c->state == CL_DONE)
        return;
    if (status == UV_ECONNREFUSED && mono() + RETRY_MS / 1000.0 < c->deadline) {
        /* Nobody listens yet: start over with a fresh socket a moment later (from the close
         * callback, once libuv has let go of this one). */
        dl__conn_close(&c->conn, UV_ECONNREFUSED);
        return;
    }
    if (status < 0) {
        fail(c, status, "cannot reach the rendezvous at %s:%d: %s", c->host, c->port,
             uv_strerror(status));
        return;
    }
    int r = dl__conn_start(&c->conn);
    if (r < 0) {
        fail(c, r, "cannot read from %s:%d: %s", c->host, c->port, uv_strerror(r));
        return;
    }
    send_hello(c);
}

static void try_connect(dl_rdzv_client_t *c)
{
    dl__conn_init(c->loop, &c->conn, DL_PROTO_LIMIT, c->readbuf, sizeof(c->readbuf));
    c->conn.on_message = on_message;
    c->conn.on_invalid = on_invalid;
    c->conn.on_closed = on_conn_closed;
    c->conn_open = true;
    c->pending++; /* the connection's close callback */
    c->state = CL_CONNECTING;
    c->connect.data = c;
    int r = uv_tcp_connect(&c->connect, &c->conn.tcp, (struct sockaddr *)&c->addr, on_connected);
    if (r < 0) {
        fail(c, r, "cannot connect to %s:%d: %s", c->host, c->port, uv_strerror(r));
        return;
    }
    c->pending++;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    dl_rdzv_client_t *c = req->data;
    release(c);
    if (c->state == CL_DONE) {
        uv_freeaddrinfo(res);
        return;
    }
    if (status < 0 || res == NULL) {
        fail(c, status < 0 ? status : UV_EAI_NONAME, "cannot resolve the rendezvous host '%s': %s",
             c->host, uv_strerror(status));
        uv_freeaddrinfo(res);
        return;
    }
    memcpy(&c->addr, res->ai_addr, res->ai_addrlen);
    if (c->addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&c->addr)->sin_port = htons((uint16_t)c->port);
    else
        ((struct sockaddr_in6 *)&c->addr)->sin6_port = htons((uint16_t)c->port);
    uv_freeaddrinfo(res);
    try_connect(c);
}

static void timer_closed(uv_handle_t *h)
{
    release(h->data);
}

int dl_rdzv_client_start(uv_loop_t *loop, const char *host, int port, dl_proto_role_t role,
                         const char *run_id, const dl_proto_token_t *token, double timeout,
                         const dl_rdzv_client_cbs_t *cbs, void *ctx, dl_rdzv_client_t **ret)
{
    dl_rdzv_client_t *c = calloc(1, sizeof(*c));
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int r;

    if (c == NULL)
        return -ENOMEM;
    c->loop = loop;
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = port;
    c->role = role;
    snprintf(c->run_id, sizeof(c->run_id), "%s", run_id);
    c->token = token;
    c->cbs = *cbs;
    c->ctx = ctx;
    c->deadline = mono() + timeout;
    uv_timer_init(loop, &c->retry);
    c->retry.data = c;
    c->pending = 1; /* the timer's close */
    c->resolve.data = c;
    r = uv_getaddrinfo(loop, &c->resolve, on_resolved, host, NULL, &hints);
    if (r < 0) {
        c->freed = true;
        uv_close((uv_handle_t *)&c->retry, timer_closed);
        return r;
    }
    c->pending++;
    *ret = c;
    return 0;
}

int dl_rdzv_client_send(dl_rdzv_client_t *c, const json_t *msg)
{
    if (c->state != CL_READY)
        return -ENOTCONN;
    return dl__conn_send(&c->conn, msg);
}

void dl_rdzv_client_close(dl_rdzv_client_t *c)
{
    if (c == NULL)
        return;
    c->state = CL_DONE;
    c->freed = true;
    uv_cancel((uv_req_t *)&c->resolve);
    if (c->conn_open)
        dl__conn_close(&c->conn, 0);
    uv_close((uv_handle_t *)&c->retry, timer_closed);
}

int dl_rdzv_client_local_addr(const dl_rdzv_client_t *c, char *buf, size_t len)
{
    struct sockaddr_storage sa;
    int n = sizeof(sa);
    if (c == NULL || c->state != CL_READY ||
        uv_tcp_getsockname(&c->conn.tcp, (struct sockaddr *)&sa, &n) != 0)
        return -ENOTCONN;
    if (sa.ss_family == AF_INET)
        return uv_ip4_name((struct sockaddr_in *)&sa, buf, len) == 0 ? 0 : -ENOTCONN;
    return uv_ip6_name((struct sockaddr_in6 *)&sa, buf, len) == 0 ? 0 : -ENOTCONN;
}

int dl_rdzv_assignment_read(const json_t *msg, const dl_rdzv_assignment_want_t *want,
                            dl_rdzv_assignment_t *ret, char *err, size_t errlen)
{
    dl_rdzv_assignment_t a;
    dl_proto_type_t type;
    dl_proto_error_t perr;

    if (dl_proto_validate(msg, &type, &perr) < 0 || type != DL_PROTO_ASSIGNMENT) {
        snprintf(err, errlen, "not an assignment: %s", perr.message);
        return -EPROTO;
    }
    memset(&a, 0, sizeof(a));
    /* The table bounds every field within an int (docs/protocol.md). */
    a.round = (int)dl_proto_get_int(msg, "round", 0);
    a.node_rank = (int)dl_proto_get_int(msg, "node_rank", 0);
    a.nodes = (int)dl_proto_get_int(msg, "nodes", 1);
    a.world_size = (int)dl_proto_get_int(msg, "world_size", 1);
    a.first_rank = (int)dl_proto_get_int(msg, "first_rank", 0);
    a.local_world_size = (int)dl_proto_get_int(msg, "local_world_size", 1);
    a.restart_count = (int)dl_proto_get_int(msg, "restart_count", 0);
    a.failures = (int)dl_proto_get_int(msg, "failures", 0);
    a.host_node_rank = (int)dl_proto_get_int(msg, "host_node_rank", -1);
    a.torch_store = json_is_true(json_object_get(msg, "torch_store"));
    a.max_restarts = (int)dl_proto_get_int(msg, "max_restarts", 0);
    a.master_port = (int)dl_proto_get_int(msg, "master_port", 0);
    snprintf(a.master_addr, sizeof(a.master_addr), "%s", dl_proto_get_str(msg, "master_addr"));
    snprintf(a.store_addr, sizeof(a.store_addr), "%s", dl_proto_get_str(msg, "store_addr"));
    /* Addresses we may connect to, or bind, one day: nothing but what addresses are made of. */
    const json_t *succ = json_object_get(msg, "successors");
    for (size_t i = 0; i < json_array_size(succ); i++) {
        const char *s = json_string_value(json_array_get(succ, i));
        size_t len = strlen(s);
        if (len > DL_PROTO_NAME_MAX ||
            strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.:-_%[]") !=
                len) {
            snprintf(err, errlen, "successor %zu is not an address", i);
            return -EPROTO;
        }
        snprintf(a.successors[a.nsuccessors++], sizeof(a.successors[0]), "%s", s);
    }
    int r = dl_rdzv_assignment_check(&a, want, err, errlen);
    if (r == 0)
        *ret = a;
    return r;
}

int dl_rdzv_assignment_read_rec(const dl_proto_assignment_t *a,
                                const dl_rdzv_assignment_want_t *want, dl_rdzv_assignment_t *ret,
                                char *err, size_t errlen)
{
    json_t *msg = dl_proto_assignment_msg(a);
    if (msg == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int r = dl_rdzv_assignment_read(msg, want, ret, err, errlen);
    json_decref(msg);
    return r;
}

int dl_rdzv_assignment_check(const dl_rdzv_assignment_t *a, const dl_rdzv_assignment_want_t *want,
                             char *err, size_t errlen)
{
    char host[DL_PROTO_NAME_MAX + 1];
    int port;

    if (want != NULL) {
        if (a->local_world_size != want->slots) {
            snprintf(err, errlen, "%d worker%s on this node, which offered %d", a->local_world_size,
                     a->local_world_size == 1 ? "" : "s", want->slots);
            return -EPROTO;
        }
        if (a->nodes < want->min_nodes || a->nodes > want->max_nodes) {
            snprintf(err, errlen, "%d node%s, where the job has %d to %d", a->nodes,
                     a->nodes == 1 ? "" : "s", want->min_nodes, want->max_nodes);
            return -EPROTO;
        }
        if ((long long)a->world_size > (long long)a->nodes * DL_RDZV_MAX_SLOTS) {
            snprintf(err, errlen, "world size %d for %d node%s", a->world_size, a->nodes,
                     a->nodes == 1 ? "" : "s");
            return -EPROTO;
        }
        if (a->round < want->min_round) {
            snprintf(err, errlen, "round %d, after round %d", a->round, want->min_round);
            return -EPROTO;
        }
    }
    if (a->node_rank < 0 || a->node_rank >= a->nodes || a->first_rank < 0 ||
        a->local_world_size < 1 ||
        (long long)a->first_rank + a->local_world_size > (long long)a->world_size) {
        snprintf(err, errlen, "node rank %d of %d, ranks %d..%d of %d", a->node_rank, a->nodes,
                 a->first_rank, a->first_rank + a->local_world_size - 1, a->world_size);
        return -EPROTO;
    }
    if (a->master_port < 1 || a->master_port > 65535 || a->master_addr[0] == '\0') {
        snprintf(err, errlen, "MASTER_ADDR '%s', MASTER_PORT %d", a->master_addr, a->master_port);
        return -EPROTO;
    }
    if (dl_rdzv_endpoint_parse(a->store_addr, host, sizeof(host), &port) < 0) {
        snprintf(err, errlen, "store address '%s' is not HOST:PORT", a->store_addr);
        return -EPROTO;
    }
    return 0;
}

const char *dl_rdzv_client_error(const dl_rdzv_client_t *c)
{
    return c != NULL ? c->error : "";
}
