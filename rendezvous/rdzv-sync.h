/* The blocking client of the rendezvous and its store: control commands, dlaunch kv and worker
 * programs (the collective library's bootstrap), one request at a time over a plain socket, no
 * event loop. A library of its own (dlrdzv_sync) that needs proto (and jansson) alone; the
 * messages are built and read by rdzv-codec.h. */
#ifndef DL_RDZV_SYNC_H
#define DL_RDZV_SYNC_H

#include <stdbool.h>
#include <stddef.h>

#include "proto.h"
#include "rdzv-codec.h"

/* Whether to believe the server that answered our hello with auth_ok, the last step of every
 * client's handshake. With a token: it must have challenged us (challenged) and proved the same
 * key back (proof, from auth_ok, over client_nonce and server_nonce). Without one: the socket
 * fd must lead to a server of our own user (or root) on this machine. Returns 0, or -EACCES with
 * one line in err. */
int dl_rdzv_check_server(const dl_proto_token_t *token, bool challenged, const char *client_nonce,
                         const char *server_nonce, const char *run_id, dl_proto_role_t role,
                         const char *proof, int fd, char *err, size_t errlen);

/* ---- Endpoints --------------------------------------------------------------------------- */

/* Parses "HOST:PORT" or "[V6]:PORT" (port 1-65535); host copied into host (hostlen bytes).
 * Returns 0 or -EINVAL. */
int dl_rdzv_endpoint_parse(const char *text, char *host, size_t hostlen, int *ret_port);

/* The same for where to listen, where port 0 means one the kernel picks. */
int dl_rdzv_listen_parse(const char *text, char *host, size_t hostlen, int *ret_port);

/* ---- Blocking client: control commands, dlaunch kv, worker programs ------------------------ */

typedef struct dl_rdzv_sync_s dl_rdzv_sync_t;

/* Connects to host:port, says hello as role for run_id and authenticates with token (may be
 * NULL when the server has none). timeout: seconds for the whole handshake, retrying refused
 * connections until then. Returns 0 with *ret (owned; dl_rdzv_sync_close) or -errno with one
 * line in err (-ECONNREFUSED, -ETIMEDOUT, -EACCES for a refused token, -EPROTO). */
int dl_rdzv_sync_connect(const char *host, int port, dl_proto_role_t role, const char *run_id,
                         const dl_proto_token_t *token, double timeout, dl_rdzv_sync_t **ret,
                         char *err, size_t errlen);

/* Sends a request (its "id" is set here) and waits for its answer, up to timeout seconds
 * (< 0: forever). Notifications that arrive meanwhile are dropped unless on_notify is set with
 * dl_rdzv_sync_set_notify. Returns 0 with *ret_reply (new reference: a reply, a typed answer, or
 * an error message; see dl_proto_reply_error) or -errno with err filled. Steals msg. */
int dl_rdzv_sync_call(dl_rdzv_sync_t *c, json_t *msg, double timeout, json_t **ret_reply, char *err,
                      size_t errlen);

/* Waits for the next notification (event, round_changed, shutdown), up to timeout seconds.
 * Returns 0 with *ret_msg, -ETIMEDOUT, or -errno (connection lost). */
int dl_rdzv_sync_next(dl_rdzv_sync_t *c, double timeout, json_t **ret_msg, char *err,
                      size_t errlen);

void dl_rdzv_sync_close(dl_rdzv_sync_t *c);

/* One store request, typed: 0 with *ret read from *ret_reply (new reference; *ret borrows from
 * it: decref it when done); -EPROTO when the store answered an error (*ret_code, its message in
 * err); or -errno when no answer came (err says why). timeout: seconds (< 0: forever). */
int dl_rdzv_sync_kv(dl_rdzv_sync_t *c, const dl_rdzv_kv_req_t *req, double timeout,
                    json_t **ret_reply, dl_rdzv_kv_result_t *ret, dl_proto_errcode_t *ret_code,
                    char *err, size_t errlen);

#endif
