/* A client of etcd's v3 API through its JSON gateway (POST /v3/kv/range, /v3/kv/txn,
 * /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/watch streamed), on libcurl's
 * multi interface driven by a libuv loop (curl_multi_socket_action, uv_poll, uv_timer), bodies in
 * jansson. Keys and values travel base64-encoded; 64-bit numbers as decimal strings.
 *
 * Several endpoints: requests go to the current one; one that cannot be reached, or answers that
 * it has no leader, passes the request to the next, each endpoint once per request. User and
 * password (etcd's authentication): the client gets a token first and again when etcd says it
 * expired. TLS: https with a CA, and a client certificate and key when given.
 *
 * Not thread-safe: everything runs on the loop's thread. docs/etcd.md tells how dlaunch uses it. */
#ifndef DL_ETCD_H
#define DL_ETCD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct dl_etcd_s dl_etcd_t;
typedef struct dl_etcd_req_s dl_etcd_req_t;

typedef struct {
    const char *endpoints; /* "HOST:PORT[,HOST:PORT...]" (a scheme in front is allowed) */
    const char *protocol;  /* "http" (NULL: the default) or "https" */
    const char *cacert;    /* https: the CA to trust (NULL: the system's) */
    const char *cert;      /* https: client certificate and key, or NULL */
    const char *key;
    const char *user;     /* etcd authentication, or NULL */
    const char *password; /* with user */
    double timeout;       /* seconds a request may take on one endpoint (watches: to connect) */
} dl_etcd_opts_t;

/* How a request ended. */
typedef enum {
    DL_ETCD_OK = 0,
    DL_ETCD_UNREACHABLE, /* no endpoint could be connected to (refused, no route, timed out) */
    DL_ETCD_NO_QUORUM,   /* reached, but no leader / the request timed out inside etcd */
    DL_ETCD_AUTH,        /* authentication failed, permission denied, TLS refused */
    DL_ETCD_ERROR,       /* etcd refused the request (bad request, ...) or answered nonsense */
    DL_ETCD_CANCELLED,   /* the client or the request was closed */
} dl_etcd_status_t;

typedef struct {
    dl_etcd_status_t status;
    const char *endpoint; /* the last endpoint tried: "127.0.0.1:2379" */
    const char *error;    /* one line naming the endpoint and the cause ("" when OK) */
    json_t *body;         /* the answer (OK), borrowed for the call; watches: one message */
} dl_etcd_result_t;

/* Called once per request with its outcome. */
typedef void (*dl_etcd_cb)(void *ctx, const dl_etcd_result_t *res);

/* Checks the options and makes the client (nothing is sent yet). Returns 0, or -EINVAL with one
 * line in err (an endpoint that is not HOST:PORT, a protocol other than http/https, a file that
 * cannot be read). */
int dl_etcd_new(uv_loop_t *loop, const dl_etcd_opts_t *opts, dl_etcd_t **ret, char *err,
                size_t errlen);

/* Cancels every request (their callbacks do not run) and frees the client once libuv has let go
 * of its handles. Accepts NULL. */
void dl_etcd_close(dl_etcd_t *e);

/* The endpoints, as given, for messages. */
const char *dl_etcd_endpoints(const dl_etcd_t *e);

/* POSTs body (stolen) to path ("/v3/kv/txn"); cb gets the answer. Returns 0 with *ret (may be
 * NULL: the caller does not want to cancel it), or -ENOMEM. The callback never runs inside this
 * call. */
int dl_etcd_call(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb, void *ctx,
                 dl_etcd_req_t **ret);

/* A watch: POST /v3/watch with body (stolen), streamed: on_msg gets every message's "result"
 * (status OK), then done gets how the stream ended (never OK: the server closed it, the endpoint
 * died, cancelled is not reported). Returns 0 with *ret, or -ENOMEM. */
int dl_etcd_stream(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb on_msg, dl_etcd_cb done,
                   void *ctx, dl_etcd_req_t **ret);

/* Cancels a request or a stream: no callback runs for it after this. Accepts NULL. */
void dl_etcd_cancel(dl_etcd_req_t *r);

/* Blocking: runs the request on a loop of its own, for control commands. *ret_body gets the
 * answer (new reference) when the status is OK. err gets the error line otherwise. */
dl_etcd_status_t dl_etcd_call_sync(dl_etcd_t *e, const char *path, json_t *body, json_t **ret_body,
                                   char *err, size_t errlen);

/* Reads a password file as token files are read: a regular file that neither group nor others
 * may read or write, one trailing newline dropped, not empty. Returns 0 with *ret (malloc'd), or
 * -errno with one line in err. */
int dl_etcd_read_password(const char *path, char **ret, char *err, size_t errlen);

/* ---- Bodies ----------------------------------------------------------------------------------- */

/* base64 of n bytes, as a new JSON string (NULL: out of memory). */
json_t *dl_etcd_b64(const void *data, size_t n);
json_t *dl_etcd_b64_str(const char *s);
/* Decodes a base64 JSON string into a NUL-terminated malloc'd buffer (*ret_len without the NUL).
 * Returns NULL for a value that is not base64 (or NULL). */
char *dl_etcd_unb64(const json_t *v, size_t *ret_len);
/* etcd's 64-bit numbers come as decimal strings ("12"), sometimes as numbers; absent is 0. */
int64_t dl_etcd_int(const json_t *v);
/* A number to send: a decimal string. */
json_t *dl_etcd_num(int64_t n);
/* The end of the range of every key that starts with prefix (prefix with its last byte + 1), as
 * a new base64 JSON string. */
json_t *dl_etcd_prefix_end(const char *prefix);

/* One key-value of an answer (a kvs entry or an event's kv), as reply.h reads it. */
typedef struct {
    char *key; /* malloc'd, NUL-terminated */
    size_t key_len;
    char *value; /* malloc'd, NUL-terminated; NULL where etcd left it out (empty, a deletion) */
    size_t value_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
} dl_etcd_kv_t;

#endif
