/* The operators' window on a rendezvous server: Prometheus metrics at /metrics, a status page at
 * /, and JSON at /api/jobs and /api/jobs/RUN_ID (docs/operations.md). libmicrohttpd serves them
 * from a thread of its own, out of a snapshot of the server that the loop builds on request, at
 * most once every interval seconds: the rendezvous loop never waits for HTTP, and a server
 * nobody watches does no work for it. */
#ifndef DL_HTTP_H
#define DL_HTTP_H

#include <stddef.h>
#include <uv.h>

#include "rendezvous.h"

typedef struct dl_http_s dl_http_t;

typedef struct {
    const char *host; /* address to bind: an IPv4 or IPv6 literal */
    int port;         /* 0: any free port (see dl_http_port) */
    /* NULL: no authentication, and then host must be a loopback address. Else every request must
     * carry "Authorization: Bearer <the token>". Borrowed: it must outlive the server. */
    const dl_proto_token_t *token;
    double interval;   /* seconds a snapshot serves before a request asks for a new one */
    const char *title; /* the page's heading, e.g. "dlaunchd" */
} dl_http_opts_t;

/* Defaults: 127.0.0.1, any port, no token, interval 0.5 s, title "dlaunch". */
void dl_http_opts_init(dl_http_opts_t *opts);

/* Binds, listens and starts serving server's state; server must outlive the HTTP side (close
 * this first). Returns 0 with *ret (owned; dl_http_close) or a negative errno with one line in
 * err: -EINVAL (not an address), -EPERM (a token-less non-loopback address), -EADDRINUSE... */
int dl_http_start(uv_loop_t *loop, dl_rdzv_server_t *server, const dl_http_opts_t *opts,
                  dl_http_t **ret, char *err, size_t errlen);

/* The port it listens on. */
int dl_http_port(const dl_http_t *h);

/* Stops serving: the HTTP thread finishes the request it is on (a request waiting for the loop
 * is let go at once) and ends; memory is freed once libuv lets go of the handle. Accepts NULL. */
void dl_http_close(dl_http_t *h);

#endif
