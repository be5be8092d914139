/* The job's store in PyTorch's TCPStore protocol (torch-store.c), served by the rendezvous
 * server next to its own protocol, on the same core: one store, two protocols. Internal to the
 * rendezvous layer; the server starts it when dl_rdzv_server_opts_t.torch_store asks. */
#ifndef DL_TORCH_STORE_H
#define DL_TORCH_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rendezvous.h"

/* Connection ids of torch clients, as the core sees them: this bit set, never an sconn's; then
 * the slot's generation (23 bits), the store's index in its server (16 bits: a server serving
 * many jobs has a store for each, and the core's connection ids must differ across them), and
 * the slot (24 bits). */
#define DL__TORCH_CONN_BIT ((uint64_t)1 << 63)
#define DL__TORCH_MAX_STORES 65536
#define DL__TORCH_STORE_INDEX(id) ((uint32_t)((id) >> 24) & 0xffffu)

typedef struct dl__torch_store_s dl__torch_store_t;

/* Binds host:port (0: any) and serves run_id's store in torch's protocol, as store number index
 * of s (below DL__TORCH_MAX_STORES; its connections' ids carry it). Returns 0 with *ret, or a
 * libuv code with one line in err. The store holds a handle of s (dl__rdzv_server_hold) for
 * each of its own until they are closed. */
int dl__torch_store_start(dl_rdzv_server_t *s, uv_loop_t *loop, const char *host, int port,
                          const char *run_id, uint32_t index, dl__torch_store_t **ret, char *err,
                          size_t errlen);

const char *dl__torch_store_run_id(const dl__torch_store_t *ts);

/* The core's answer to one of our connections (msg NULL: the core closes it). */
void dl__torch_store_reply(dl__torch_store_t *ts, uint64_t conn, const dl_rdzv_msg_t *msg);

/* Stops listening and closes every connection; frees itself once libuv let go. */
void dl__torch_store_close(dl__torch_store_t *ts);

/* Round round of the job opened (or, with -1, its store was emptied): the queues and the
 * watches of the rounds before go, as the keys do in the core. An older round is ignored. */
void dl__torch_store_new_round(dl__torch_store_t *ts, int round);

int dl__torch_store_port(const dl__torch_store_t *ts);

/* Clients connected now, the most at once, and the bytes a connection costs us when idle. */
void dl__torch_store_clients(const dl__torch_store_t *ts, size_t *ret_now, size_t *ret_peak,
                             size_t *ret_conn_bytes);

/* What the server lends the torch store (server.c; the feed is server-actions.c's). */
void dl__rdzv_server_feed(dl_rdzv_server_t *s, const dl_rdzv_event_t *ev);
dl_rdzv_core_t *dl__rdzv_server_core(dl_rdzv_server_t *s);
const dl_rdzv_core_opts_t *dl__rdzv_server_core_opts(const dl_rdzv_server_t *s);
/* Whether addr is the address of a node of job run_id: an agent joined to this server for it,
 * or one the server was told of (dl_rdzv_server_set_job_hosts). */
bool dl__rdzv_server_knows_host(dl_rdzv_server_t *s, const char *run_id,
                                const struct sockaddr *addr);
void dl__rdzv_server_hold(dl_rdzv_server_t *s);
void dl__rdzv_server_release(dl_rdzv_server_t *s);
void dl__rdzv_server_log(dl_rdzv_server_t *s, dl_rdzv_log_level_t level, const char *run_id,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
