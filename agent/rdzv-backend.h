/* The agent's rendezvous backends: one function table with typed calls, in the manner of MPICH
 * Hydra's bootstrap (a table of join, heartbeat, report failure, node done, leave; what the
 * rendezvous decides comes back as callbacks). rdzv.c drives a backend for the agent and turns
 * its callbacks into supervisor events; the backends know nothing of the agent.
 *
 *   tcp   (rdzv-tcp.c):  our protocol, to an agent's embedded rendezvous or a dlaunchd;
 *                        hosts the rendezvous (and --http) when this node should
 *   etcd  (rdzv-etcd.c): an etcd v3 cluster through its JSON gateway (docs/etcd.md)
 *
 * Every call is made on the agent's loop; a backend calls back only from that loop, never from
 * inside a call the agent made into it. docs/rendezvous.md, "Agent backends", tells the shape. */
#ifndef DL_AGENT_RDZV_BACKEND_H
#define DL_AGENT_RDZV_BACKEND_H

#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#include "config.h"
#include "proto.h"
#include "rdzv-codec.h"
#include "rendezvous.h"

typedef struct dl_rdzv_impl_s dl_rdzv_impl_t; /* each implementation's own state */
struct dl_http_s;                             /* http.h: --http, when this agent serves it */

/* What the agent tells a backend once, at start. Everything is borrowed for the backend's
 * life. */
typedef struct {
    uv_loop_t *loop;
    const dl_job_spec_t *spec; /* timings, --http, --local-addr, --rdzv-conf, --verbose */
    const char *run_id;
    const char *endpoint;          /* --rdzv-endpoint (static: node 0's address) */
    const dl_proto_token_t *token; /* the agent's token or job key, or NULL */
    const char *hostname;          /* this machine's name */
    const char *node_id;           /* unique in the job: host-pid */
    int nodes_min, nodes_max;
    int want_node_rank; /* the node rank asked for, or -1 */
    int master_port;    /* MASTER_PORT this node offers as node 0 */
} dl_rdzv_backend_conf_t;

/* A join: this node's offer for the current round. */
typedef struct {
    int slots;      /* workers on this node */
    int last_round; /* the last round this node took part in (0 before any) */
    /* Whether it took part in one, and the restarts spent as its assignment said: a rendezvous
     * that restarted (or a successor) goes on counting from the highest it hears. */
    bool assigned;
    int failures;
} dl_rdzv_join_t;

/* Who ended a round, as the rendezvous names it (docs/events.md, `restart`'s reason): the one
 * culprit type (rdzv-core.h), read by the codec's one reader whichever backend it came from. */
typedef dl_rdzv_culprit_t dl_rdzv_culprit_info_t;

/* A heartbeat: the node is alive, running round `round`. */
typedef struct {
    int round;
    bool has_progress; /* the job's training progress, when this node's workers report it */
    long long step;
    double loss;          /* NaN: not known */
    double samples_per_s; /* NaN: not known */
    json_t *recovery;     /* in-job recoveries of this node (recovery.c), borrowed, or NULL */
    json_t *diag;         /* the node's report (diag/), borrowed, or NULL */
} dl_rdzv_beat_t;

/* What a heartbeat carries on the wire (our rendezvous) or in the node's report (etcd), for
 * round `round`. */
static inline dl_rdzv_beat_msg_t dl__rdzv_beat_msg(const dl_rdzv_beat_t *beat, int round)
{
    return (dl_rdzv_beat_msg_t){.round = round,
                                .has_progress = beat->has_progress,
                                .step = beat->step,
                                .loss = beat->loss,
                                .samples_per_s = beat->samples_per_s,
                                .diag = beat->diag,
                                .recovery = beat->recovery};
}

/* A worker failed in round `round` (or, excluded, the node steps out as a straggler). */
typedef struct {
    int round;
    int rank;
    int local_rank;
    int exit_code; /* when signal is 0 */
    int signal;    /* > 0: killed by it */
    bool hung;     /* killed by the hang watchdog */
    bool oom;      /* killed by the kernel's OOM killer */
    bool excluded;
    long long step;       /* the furthest step this node's workers reported in the round; -1 none */
    const char *reason;   /* one line: "rank 3 on gpu1 exited with code 4" */
    double time;          /* Unix time */
    const char *log_tail; /* the end of its output, or NULL */
    json_t *diag;         /* where this node's ranks were (diag/), borrowed, or NULL */
} dl_rdzv_failure_t;

/* The job is over for this node. */
typedef struct {
    int exit_code;       /* docs/exit-codes.md */
    bool stopped;        /* ended by a stop request (exit 0) */
    const char *status;  /* succeeded, failed, stopped, timed_out, refused */
    const char *failure; /* the job's first failure, printable (escaped), or NULL */
} dl_rdzv_end_t;

/* What a backend tells the agent. ctx is the agent's. */
typedef struct {
    /* The backend can take a join now: the first time, the agent starts its supervisor. */
    void (*ready)(void *ctx);
    /* This node's place in a round, checked against what it offered (dl_rdzv_assignment_check),
     * and who ended the round before when a failure did (NULL otherwise, or not said). */
    void (*assigned)(void *ctx, const dl_rdzv_assignment_t *as,
                     const dl_rdzv_culprit_info_t *culprit);
    /* A new round opened (round, why, and who was to blame when the rendezvous says: NULL
     * otherwise): stop the workers, then join again. */
    void (*round_changed)(void *ctx, int round, const char *reason,
                          const dl_rdzv_culprit_info_t *culprit);
    /* The backend lost its place in the job (it has said why, in one line): join again. With a
     * culprit, the rendezvous was lost with its node and goes on at a successor: the next round
     * is that node's loss, which in-job recovery takes with the workers kept; without, the
     * workers stop. */
    void (*lost)(void *ctx, const char *why, const dl_rdzv_culprit_info_t *culprit);
    /* The rendezvous was lost and found again elsewhere (docs/rendezvous.md, "Failover"), at
     * host:port, hosted here or not, took_s after its loss. May be left NULL by a backend. */
    void (*moved)(void *ctx, const char *host, int port, bool hosting, double took_s);
    /* The job-wide diagnostics view, answered to a heartbeat (borrowed). */
    void (*view)(void *ctx, const json_t *view);
    /* The job is over, or this node cannot take part (refused: exit 4, timed out: exit 3). */
    void (*ended)(void *ctx, const dl_rdzv_end_t *end);
    /* One line for the agent's log ("[agent node=N] text"). */
    void (*log)(void *ctx, const char *text);
    /* The key the job's store is guarded by, when the agent has no token of its own (etcd: one
     * the job's first agent drew and keeps with the job): the workers get its worker key. The
     * token is the backend's, borrowed for the call. May be left NULL by a backend. */
    void (*store_token)(void *ctx, const dl_proto_token_t *token);
} dl_rdzv_backend_cbs_t;

typedef struct {
    const char *name;
    /* Starts on conf->loop: hosts what this node should host, connects. Returns 0 with *ret
     * (ready comes later), or an exit code (2: usage, 1: setup) having said why on stderr. */
    int (*start)(const dl_rdzv_backend_conf_t *conf, const dl_rdzv_backend_cbs_t *cbs, void *ctx,
                 dl_rdzv_impl_t **ret);
    /* Joins the current round; assigned (or ended) answers. */
    void (*join)(dl_rdzv_impl_t *b, const dl_rdzv_join_t *join);
    /* Called every --heartbeat once ready. */
    void (*heartbeat)(dl_rdzv_impl_t *b, const dl_rdzv_beat_t *beat);
    /* A worker of the round failed (or the node steps out: f->excluded). */
    void (*report_failure)(dl_rdzv_impl_t *b, const dl_rdzv_failure_t *f);
    /* Every local worker of the round exited 0. */
    void (*node_done)(dl_rdzv_impl_t *b, int round);
    /* While this node sits out as a straggler it is no member: it must still hear of the job's
     * end (ended). */
    void (*sit_out)(dl_rdzv_impl_t *b);
    /* The agent goes away before the job's end (reason: the signal's name): give up the place
     * now rather than be found dead later. */
    void (*leave)(dl_rdzv_impl_t *b, const char *reason);
    /* Lets go of every handle and frees once libuv has; no callback after. Accepts NULL. */
    void (*close)(dl_rdzv_impl_t *b);
} dl_rdzv_backend_ops_t;

/* Serves --http (conf->spec->http, ADDR:PORT) for `server`, the page titled with the job's id,
 * for whichever backend holds the job's state here. Returns 0 with *http (owned) and url
 * ("http://ADDR:PORT/", the port bound) filled, or a negative errno with one line in err
 * (starting "--http: "). */
int dl__rdzv_http_start(const dl_rdzv_backend_conf_t *conf, dl_rdzv_server_t *server,
                        struct dl_http_s **http, char *url, size_t url_len, char *err,
                        size_t err_len);

extern const dl_rdzv_backend_ops_t dl__rdzv_backend_tcp;
extern const dl_rdzv_backend_ops_t dl__rdzv_backend_etcd;

#endif
