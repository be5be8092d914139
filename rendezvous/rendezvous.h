/* The rendezvous over TCP: the server (embedded in node 0's agent, or in dlaunchd) and the
 * event-loop client agents use. The pure state machine underneath is rdzv-core.h; the wire
 * format is proto.h; the blocking client (control commands, dlaunch kv, workers) and the
 * typed messages are rdzv-sync.h and rdzv-codec.h, which need no libuv. */
#ifndef DL_RENDEZVOUS_H
#define DL_RENDEZVOUS_H

#include <stdbool.h>
#include <uv.h>

#include "assignment.h"
#include "proto.h"
#include "rdzv-core.h"
#include "rdzv-sync.h"
#include "status-reply.h"

/* ---- Server ------------------------------------------------------------------------------ */

typedef struct dl_rdzv_server_s dl_rdzv_server_t;

typedef void (*dl_rdzv_log_cb)(void *ctx, dl_rdzv_log_level_t level, const char *run_id,
                               const char *text);

typedef struct {
    const char *host; /* address to bind, e.g. "0.0.0.0" or "127.0.0.1" */
    int port;         /* 0: any free port (see dl_rdzv_server_port) */
    /* The job token. NULL: no authentication, and then host must be a loopback address. */
    const dl_proto_token_t *token;
    /* NULL: every job. Else the one run id this server serves (an agent's embedded server):
     * a hello for another gets auth_failed. */
    const char *only_run_id;
    /* A one-node job's key-value store (with only_run_id), not a rendezvous: its workers get
     * in; an agent or a control command (status, stop, restart, events) is refused, saying
     * so, for no round runs there to join, report or stop. */
    bool store_only;
    /* The core's settings and limits (docs/rendezvous.md). Its hash key, when left 0, is drawn
     * at random. */
    dl_rdzv_core_opts_t core;
    double heartbeat;    /* seconds, advertised to agents */
    double auth_timeout; /* seconds a new connection has to authenticate */
    /* seconds an authenticated connection may stay silent with nothing pending (no answer due,
     * no follow, not a joined agent) before it is closed */
    double idle_timeout;
    double frame_timeout;     /* seconds a frame may take to arrive once it began */
    uint32_t max_outstanding; /* requests one connection may have waiting for an answer */
    size_t max_held;          /* bytes of unfinished frames, every connection together; a job's
                      * connections together hold a quarter of it at most */
    dl_rdzv_log_cb log;       /* may be NULL; texts are one line of printable ASCII */
    void *log_ctx;
    /* Also serve the job's store (with only_run_id) in PyTorch's TCPStore protocol on
     * torch_host (NULL: host):torch_port (0: any free port), for torch's env:// and tcp:// with
     * TORCHELASTIC_USE_AGENT_STORE=True. Torch clients carry no token: only loopback and the
     * addresses of agents joined to this server get in (docs/store.md). */
    bool torch_store;
    const char *torch_host;
    int torch_port;
    /* Serving many jobs (dlaunchd): serve each job whose agents ask (their join's torch_store)
     * its store in torch's protocol too, on a port of its own on torch_host (NULL: host), opened
     * at the job's first assignment and closed when the job ends; assignments then name it as
     * MASTER_ADDR:MASTER_PORT. Who may connect: loopback and that job's joined agents'
     * addresses. */
    bool torch_jobs;
    /* Where the revocations (`dlaunch revoke`) are kept across restarts: a JSON file this server
     * reads at start and rewrites at each revocation. NULL: in memory only. */
    const char *revocations_file;
} dl_rdzv_server_opts_t;

/* Defaults: 127.0.0.1, any port, no token, every job, core defaults, heartbeat 1 s, auth timeout
 * 10 s, idle timeout 300 s, frame timeout 30 s, 1024 requests a connection, 256 MiB of
 * unfinished frames (64 MiB a job).
 *
 * Without a token the server serves its own user only: a peer whose socket another uid owns
 * (root excepted) gets auth_failed, and it binds loopback only, where the kernel can tell. */
void dl_rdzv_server_opts_init(dl_rdzv_server_opts_t *opts);

/* Binds, listens and starts serving on loop. Returns 0 with *ret_server (owned; free with
 * dl_rdzv_server_close) or a negative errno / libuv code (-EADDRINUSE: host:port is in use;
 * -EBUSY: the torch store's port is; -EPERM for a token-less non-loopback address); err gets
 * one line. */
int dl_rdzv_server_start(uv_loop_t *loop, const dl_rdzv_server_opts_t *opts,
                         dl_rdzv_server_t **ret_server, char *err, size_t errlen);

/* The port it listens on. */
int dl_rdzv_server_port(const dl_rdzv_server_t *s);

/* The port of its torch store, or -1 when it serves none. */
int dl_rdzv_server_torch_port(const dl_rdzv_server_t *s);

/* A store-only server (with only_run_id) knows no agent of its job: its backend tells it the
 * job's nodes' addresses (IP addresses), each round, so that their workers may reach its torch
 * store; the list replaces the one before. Returns 0, or -EINVAL / -ENOMEM with one line in
 * err (the list before stays then). */
int dl_rdzv_server_set_job_hosts(dl_rdzv_server_t *s, const char *const *addrs, size_t n, char *err,
                                 size_t errlen);

/* Creates a job before any agent joins (the embedded server knows its job spec). */
int dl_rdzv_server_add_job(dl_rdzv_server_t *s, const char *run_id, const dl_rdzv_job_opts_t *opts);

/* Empties the job's store and fails its pending waits, as a new round does: for the one-node
 * job, whose agent restarts its workers without rounds, so every attempt starts clean. */
void dl_rdzv_server_reset_store(dl_rdzv_server_t *s, const char *run_id);

/* Stops listening, closes every connection, and frees the server once libuv has let go of every
 * handle; done (may be NULL) is called then. Accepts NULL. */
void dl_rdzv_server_close(dl_rdzv_server_t *s, void (*done)(void *ctx), void *ctx);

/* Peak connections, current connections, bytes of server state a connection costs. */
typedef struct {
    size_t connections;
    size_t peak_connections;
    size_t conn_bytes;
    size_t torch_clients; /* connections to the torch store now */
    size_t torch_peak;
    size_t torch_conn_bytes; /* what an idle one costs */
} dl_rdzv_server_stats_t;
void dl_rdzv_server_stats(const dl_rdzv_server_t *s, dl_rdzv_server_stats_t *ret);

/* Everything the server knows, for /metrics, /api and the status page (docs/operations.md, "The
 * snapshot"): its counters and latency histograms, and every job's status (as `dlaunch status
 * --json` shows it) with its restarts by cause, last failure, training progress and log. Built on
 * the loop's thread in O(jobs + nodes); due timers run first, as with any event. The result is a
 * new reference that shares nothing with the server, so it may be handed to another thread.
 * Returns 0 or -ENOMEM. */
int dl_rdzv_server_snapshot(dl_rdzv_server_t *s, json_t **ret_snapshot);

/* Changes whenever something a snapshot shows may have changed: lets a publisher skip work. */
uint64_t dl_rdzv_server_generation(const dl_rdzv_server_t *s);

/* A store-only server whose job's rendezvous is kept elsewhere (etcd: docs/etcd.md, "Control")
 * shows its owner's account of the job in snapshots (the status page): fn gets the job's status
 * as the server has it (own: its store's figures; borrowed) and returns the fields to put over
 * it (a new reference, or NULL for none). Called on the loop's thread. */
typedef json_t *(*dl_rdzv_status_fn)(void *ctx, const char *run_id, const json_t *own);
void dl_rdzv_server_set_status(dl_rdzv_server_t *s, dl_rdzv_status_fn fn, void *ctx);

/* The job's training progress heard by the owner of such a server (a heartbeat's "progress"
 * object, borrowed): a point of the status page's chart when the step moved. */
void dl_rdzv_server_progress(dl_rdzv_server_t *s, const char *run_id, const json_t *progress);

/* What a status shows of the job's ranks, made from each node's latest heartbeat message (as
 * rdzv-codec.h encodes it) rather than from a server's connections: for a rendezvous kept
 * elsewhere (etcd), by the same rules as the server's own status. beats: an array of {"beat":
 * message, "age_s": seconds since it was sent}. Fills st's diag, with ranks also where and
 * ranks, and recovery (the node that counted most; proto/status-reply.h), each st's own, as
 * dl_proto_rec_free of the job frees them. Returns 0 or -ENOMEM. */
int dl_rdzv_beats_status(const char *run_id, const json_t *beats, bool ranks,
                         dl_proto_status_job_t *st);
/* Where every rank of the job was, from the same beats, in the one line our server adds to a
 * round change's text (a worker's failure: every node's latest report, the failing node's
 * with it). Returns its length, 0 when the reports say nothing (buf ""). */
size_t dl_rdzv_beats_explain(const char *run_id, const json_t *beats, char *buf, size_t len);
/* Every rank in the same beats as the first-failure rule reads them (rdzv-policy.h,
 * dl_rdzv_policy_waited_for), as our server reads its own reports when a failure comes: a new
 * array in *ret (free()) and its length; 0 (*ret NULL) when none or out of memory. */
struct dl_rdzv_policy_rank_s;
size_t dl_rdzv_beats_policy_ranks(const char *run_id, const json_t *beats,
                                  struct dl_rdzv_policy_rank_s **ret);

/* The job-wide straggler rule over nodes' heartbeats fed as they come, as our server runs it
 * over the heartbeats it gets (rendezvous/jobview.c): for a rendezvous kept elsewhere (etcd),
 * where one agent feeds every node's published heartbeat. */
typedef struct dl_rdzv_judge_s dl_rdzv_judge_t;
int dl_rdzv_judge_new(const char *run_id, dl_rdzv_judge_t **ret); /* 0 or -ENOMEM */
void dl_rdzv_judge_free(dl_rdzv_judge_t *j);                      /* accepts NULL */
/* Feeds node_id's heartbeat message (borrowed; its "round" and "diag"), made age_s ago. A
 * heartbeat of an older round than one fed before is -ESTALE; a newer round starts the rule
 * over. Returns 0 or a negative errno (a bad report: -EBADMSG, with one line in err). */
int dl_rdzv_judge_feed(dl_rdzv_judge_t *j, const char *node_id, const json_t *beat, double age_s,
                       char *err, size_t errlen);
/* The view our server answers a heartbeat with (the job-wide figures, the stragglers named),
 * new reference, or NULL when there is none yet. */
json_t *dl_rdzv_judge_view(dl_rdzv_judge_t *j);

/* ---- Event-loop client: the agent ---------------------------------------------------------- */

typedef struct dl_rdzv_client_s dl_rdzv_client_t;

typedef struct {
    /* The handshake finished (status 0) or failed for good (status -errno, err one line:
     * -ETIMEDOUT when nobody answered in time, -EACCES for a refused token). */
    void (*ready)(void *ctx, int status, const char *err);
    /* Any message after the handshake: replies (match their "id") and notifications. msg is
     * borrowed for the call. */
    void (*message)(void *ctx, json_t *msg, dl_proto_type_t type);
    /* The connection is gone after being ready (status: a libuv code, UV_EOF when the server
     * hung up). Not called after dl_rdzv_client_close. */
    void (*lost)(void *ctx, int status);
} dl_rdzv_client_cbs_t;

/* Resolves host, connects (retrying refusals for up to timeout seconds, as the server may not be
 * up yet), says hello as role for run_id and authenticates with token (may be NULL). Fails at once
 * (returns -errno, no callback) or later through cbs->ready exactly once. */
int dl_rdzv_client_start(uv_loop_t *loop, const char *host, int port, dl_proto_role_t role,
                         const char *run_id, const dl_proto_token_t *token, double timeout,
                         const dl_rdzv_client_cbs_t *cbs, void *ctx, dl_rdzv_client_t **ret);

/* Sends msg (borrowed). A request needs its "id" set by the caller. Returns 0 or -errno. */
int dl_rdzv_client_send(dl_rdzv_client_t *c, const json_t *msg);

/* The local address of the connection ("10.0.0.5"): where the server sees us come from, which
 * is where other nodes can reach this one. Returns 0 or -ENOTCONN. */
int dl_rdzv_client_local_addr(const dl_rdzv_client_t *c, char *buf, size_t len);

/* Closes and frees (once libuv lets go). No callback runs after this. Accepts NULL. */
void dl_rdzv_client_close(dl_rdzv_client_t *c);

/* Why the connection failed or was lost, one line ("" while it is fine): for the lost callback,
 * whose status alone cannot say that the server sent something we refused. Valid until the
 * client is closed. */
const char *dl_rdzv_client_error(const dl_rdzv_client_t *c);

/* An assignment, read and checked. */
typedef struct {
    int round;
    int node_rank;
    int nodes;
    int world_size;
    int first_rank;
    int local_world_size;
    int restart_count;
    int failures; /* restarts spent on failures */
    int max_restarts;
    int master_port;
    char master_addr[DL_PROTO_NAME_MAX + 1];
    char store_addr[DL_PROTO_NAME_MAX + 1];
    /* The addresses of node ranks 0, 1, ..., where an embedded rendezvous is hosted again if
     * its host dies; nsuccessors 0 when the server names none (dlaunchd). */
    char successors[8][DL_PROTO_NAME_MAX + 1];
    int nsuccessors;
    int host_node_rank; /* the node rank of the agent hosting the rendezvous, or -1 */
    bool torch_store;   /* MASTER_ADDR:MASTER_PORT is a torch store the rendezvous serves */
} dl_rdzv_assignment_t;

/* What the agent asked for, which an assignment must agree with. */
typedef struct {
    int slots;     /* local_world_size must be exactly this */
    int min_nodes; /* nodes must be within these */
    int max_nodes;
    int min_round; /* the round must not go back */
} dl_rdzv_assignment_want_t;

/* Reads an assignment message and checks it: the protocol's own rules (ranks within the world,
 * addresses without spaces or control characters), then what want says (NULL: nothing more),
 * and a store address of HOST:PORT. A server that says otherwise is not to be believed.
 * Returns 0 with *ret, or -EPROTO with one line in err. */
int dl_rdzv_assignment_read(const json_t *msg, const dl_rdzv_assignment_want_t *want,
                            dl_rdzv_assignment_t *ret, char *err, size_t errlen);

/* dl_rdzv_assignment_read of the message made of a (a backend that reads the assignment from
 * elsewhere than our protocol: etcd), with the same checks and the same lines: 0 with *ret,
 * -EPROTO with one line in err, or -ENOMEM. */
int dl_rdzv_assignment_read_rec(const dl_proto_assignment_t *a,
                                const dl_rdzv_assignment_want_t *want, dl_rdzv_assignment_t *ret,
                                char *err, size_t errlen);

/* The checks of dl_rdzv_assignment_read on an assignment made otherwise (a backend that reads
 * it from elsewhere than our protocol: etcd): ranks within the world, what want says (NULL:
 * nothing more), MASTER_* set, a store address of HOST:PORT. Returns 0, or -EPROTO with one
 * line in err. */
int dl_rdzv_assignment_check(const dl_rdzv_assignment_t *a, const dl_rdzv_assignment_want_t *want,
                             char *err, size_t errlen);

/* Whether the peer of fd (a connected TCP socket) is on loopback and runs as this process's
 * user or root: what stands in for a token where there is none (the HTTP side does as the
 * rendezvous port). *nlfd: a netlink socket kept between calls, -1 at first; the caller closes
 * it. Returns 1, 0 (another user's, or not on loopback), or -errno when the owner cannot be
 * told. */
int dl_rdzv_peer_trusted(int *nlfd, int fd);

/* The user owning the socket at the other end of fd, a connected TCP socket on loopback
 * (nlfd as above). Returns 0, -EPERM when the peer is not on loopback, or another -errno. */
int dl_rdzv_peer_uid(int *nlfd, int fd, uid_t *ret_uid);

#endif
