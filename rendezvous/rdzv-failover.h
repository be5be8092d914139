/* How an agent finds its rendezvous again, apart from any I/O (docs/rendezvous.md, "Failover"):
 * the connection's life (connecting, ready, lost), the reconnect backoff, the joins a full job
 * turns away, and, when the rendezvous embedded in another agent is lost with its node, the
 * search through the last round's successors: where it was, then node rank 1, 2, ..., hosting
 * it here when our own address comes up, and handing it back to an earlier candidate that
 * serves it again. The TCP backend (agent/rdzv-tcp.c) feeds it events with the time and
 * performs the actions it returns; it reads no clock and does no I/O. */
#ifndef DL_RDZV_FAILOVER_H
#define DL_RDZV_FAILOVER_H

#include <stdbool.h>

#include "rdzv-core.h"

/* Addresses: host names and IPs as the protocol carries them (DL_PROTO_NAME_MAX + 1). */
#define DL_RDZV_FO_ADDR_MAX 256
/* Node 0 whose endpoint does not resolve yet looks again this often, until --join-timeout. */
#define DL_RDZV_FO_NAME_RETRY_MS 250
/* Reconnecting to a rendezvous that misbehaves: the first retry after this, doubling up to
 * the most; a connection that lasted DL_RDZV_FO_STABLE_S resets the count. */
#define DL_RDZV_FO_BACKOFF_MIN_MS 100
#define DL_RDZV_FO_BACKOFF_MAX_MS 5000
#define DL_RDZV_FO_STABLE_S 10.0
/* A join a full job turns away is tried again this often, until --join-timeout. */
#define DL_RDZV_FO_FULL_RETRY_MS 1000
/* Hosting as a successor at an address the lost host's server still holds (it shares our
 * address and is not gone yet): tried again this often, until --join-timeout. */
#define DL_RDZV_FO_SERVE_RETRY_MS 250
#define DL_RDZV_FO_ACTIONS_MAX 8
#define DL_RDZV_FO_TEXT_MAX 1200

typedef struct {
    char host[DL_RDZV_FO_ADDR_MAX]; /* the endpoint's host */
    int port;
    double join_timeout;
    double dead_after;
    double heartbeat;
    bool may_host; /* this node may host the rendezvous as a successor (is_host not 0) */
} dl_rdzv_fo_opts_t;

/* The connection to the rendezvous. */
typedef enum {
    DL_RDZV_FO_IDLE = 0,   /* none, and none under way: before the first, or after one ended */
    DL_RDZV_FO_SERVING,    /* our turn as a successor: the shell is starting our own server */
    DL_RDZV_FO_CONNECTING, /* one under way, to `host` */
    DL_RDZV_FO_READY,      /* connected and greeted */
    DL_RDZV_FO_CLOSED,     /* the backend closed: every event is ignored */
} dl_rdzv_fo_conn_t;

/* What is wanted once connected again. */
typedef enum {
    DL_RDZV_FO_WANT_NONE = 0,
    DL_RDZV_FO_WANT_JOIN,
    DL_RDZV_FO_WANT_FOLLOW, /* the job's events, while this node sits out */
} dl_rdzv_fo_want_t;

/* The shell's three timers. */
typedef enum {
    DL_RDZV_FO_TIMER_RETRY = 0, /* the next connection: backoff, or a name not resolved yet */
    DL_RDZV_FO_TIMER_CANDIDATE, /* a successor that neither answers nor refuses */
    DL_RDZV_FO_TIMER_FULL,      /* the next join after a full job turned one away */
    DL_RDZV_FO_TIMER_COUNT
} dl_rdzv_fo_timer_t;

/* What the retry timer is for. */
typedef enum {
    DL_RDZV_FO_RETRY_BACKOFF = 0, /* the next connection after one went wrong, once wanted */
    DL_RDZV_FO_RETRY_NAME,        /* the first connection again: its name did not resolve */
    DL_RDZV_FO_RETRY_HOST,        /* node 0 hosts and connects again: its name did not resolve */
    DL_RDZV_FO_RETRY_SERVE,       /* host as a successor again: our address was in use */
} dl_rdzv_fo_retry_t;

/* What a failed connection attempt says of the rendezvous. */
typedef enum {
    DL_RDZV_FO_FAIL_OTHER = 0, /* refused, reset, timed out: nobody serves there now */
    DL_RDZV_FO_FAIL_DENIED,    /* the token or the protocol refused: no other place will do */
    DL_RDZV_FO_FAIL_NO_NAME,   /* the name does not resolve (yet) */
} dl_rdzv_fo_fail_t;

/* What a try at serving the rendezvous ourselves came to. */
typedef enum {
    DL_RDZV_FO_SERVED = 0,
    DL_RDZV_FO_SERVE_IN_USE, /* someone at this address was quicker */
    DL_RDZV_FO_SERVE_FAILED,
} dl_rdzv_fo_serve_t;

typedef enum {
    DL_RDZV_FO_EV_START = 0,      /* connect for the first time (after hosting, if we do) */
    DL_RDZV_FO_EV_HOST_WAIT,      /* node 0's endpoint does not resolve yet: host it later */
    DL_RDZV_FO_EV_JOIN,           /* the agent asks to join (follow: to sit out and follow) */
    DL_RDZV_FO_EV_CONNECTED,      /* the handshake is done */
    DL_RDZV_FO_EV_CONNECT_FAILED, /* fail, why; name_error: the resolver's words */
    DL_RDZV_FO_EV_HEARD,          /* any message from the rendezvous */
    DL_RDZV_FO_EV_TICK,           /* a heartbeat is due */
    DL_RDZV_FO_EV_LOST,           /* the connection went (why), or we drop it (misbehaving) */
    DL_RDZV_FO_EV_ASSIGNED,       /* a round closed: its host's node rank, its successors */
    DL_RDZV_FO_EV_NODE_LEFT,      /* a round change: node_rank departed (its operator's signal) */
    DL_RDZV_FO_EV_JOIN_FULL,      /* a join turned away from a full job (why) */
    DL_RDZV_FO_EV_SERVED,         /* our own server: serve, why */
    DL_RDZV_FO_EV_PROBED,         /* the earlier candidate we asked answered (ok) or not */
    DL_RDZV_FO_EV_TIMER,          /* timer fired */
    DL_RDZV_FO_EV_LEAVE,          /* the agent said leave: the connection's end is no loss */
    DL_RDZV_FO_EV_CLOSE,          /* the backend goes */
} dl_rdzv_fo_event_kind_t;

typedef struct {
    dl_rdzv_fo_event_kind_t kind;
    double now;                    /* monotonic seconds */
    bool follow;                   /* JOIN */
    bool misbehaving;              /* LOST: dropped for what it said (no failover, backoff) */
    bool ok;                       /* PROBED */
    dl_rdzv_fo_fail_t fail;        /* CONNECT_FAILED */
    dl_rdzv_fo_serve_t serve;      /* SERVED */
    dl_rdzv_fo_timer_t timer;      /* TIMER */
    const char *why;               /* CONNECT_FAILED, LOST, JOIN_FULL, SERVED */
    const char *name_error;        /* CONNECT_FAILED with NO_NAME */
    int node_rank;                 /* ASSIGNED: the host's, or -1; NODE_LEFT */
    const char *const *successors; /* ASSIGNED */
    int nsuccessors;
} dl_rdzv_fo_event_t;

typedef enum {
    DL_RDZV_FO_SAY = 0,      /* text: a line for the agent's log */
    DL_RDZV_FO_ERROR,        /* text: a line on stderr */
    DL_RDZV_FO_CONNECT,      /* to host, with timeout seconds; if the client cannot even start,
                              * end with code and status (code 0: the caller reports it) */
    DL_RDZV_FO_SERVE,        /* host the rendezvous at host, then say SERVED */
    DL_RDZV_FO_DROP,         /* close the connection; what was asked on it is gone */
    DL_RDZV_FO_CLOSE_CLIENT, /* close the connection attempt or the connection, nothing else */
    DL_RDZV_FO_TIMER_START,  /* timer, in ms */
    DL_RDZV_FO_TIMER_STOP,   /* timer */
    DL_RDZV_FO_READY_FIRST,  /* the first connection is ready: the agent may join */
    DL_RDZV_FO_SEND_JOIN,    /* join now (asked now, or while not connected) */
    DL_RDZV_FO_SEND_FOLLOW,  /* follow the job's events now */
    DL_RDZV_FO_JOIN_AGAIN,   /* ask the agent's last join again (a full job turned it away) */
    DL_RDZV_FO_MOVED,        /* the rendezvous was found at host after seconds; hosting: ours */
    DL_RDZV_FO_LOST,         /* text: the rendezvous is lost; blame: its node (cause, host,
                              * node_rank) is the culprit, and the next round, at a successor,
                              * is that node's loss (in-job, the workers stay) */
    DL_RDZV_FO_PROBE,        /* ask host (dropping any earlier probe) whether it serves the job */
    DL_RDZV_FO_HAND_OVER,    /* close our server: host serves the job again */
    DL_RDZV_FO_HOST_AGAIN,   /* try hosting and connecting again (node 0's name resolves?) */
    DL_RDZV_FO_END,          /* the backend gives up: end the job with code and status */
} dl_rdzv_fo_action_kind_t;

typedef struct {
    dl_rdzv_fo_action_kind_t kind;
    char text[DL_RDZV_FO_TEXT_MAX];
    char host[DL_RDZV_FO_ADDR_MAX];
    double timeout;           /* CONNECT */
    double seconds;           /* MOVED */
    bool hosting;             /* MOVED */
    dl_rdzv_fo_timer_t timer; /* TIMER_START, TIMER_STOP */
    unsigned ms;              /* TIMER_START */
    int code;                 /* END, CONNECT */
    const char *status;       /* END, CONNECT: "refused", "timed_out" (static) */
    bool blame;               /* LOST */
    const char *cause;        /* LOST: "node_lost", or "node_left" when the host departed */
    int node_rank;            /* LOST */
} dl_rdzv_fo_action_t;

/* Filled by each step, in the order the shell performs them. The shell owns one per step, so
 * a step that its actions' callbacks cause meanwhile writes elsewhere. */
typedef struct {
    dl_rdzv_fo_action_t v[DL_RDZV_FO_ACTIONS_MAX];
    int n;
} dl_rdzv_fo_actions_t;

/* The machine. Fields are its own: the shell reads them through the calls below. */
typedef struct {
    dl_rdzv_fo_opts_t o;
    dl_rdzv_fo_conn_t conn;
    dl_rdzv_fo_want_t want;
    bool started;                   /* the first connection was ready once */
    bool leaving;                   /* said leave: the connection's end is no loss */
    bool hosting;                   /* our own server runs */
    char host[DL_RDZV_FO_ADDR_MAX]; /* where the rendezvous is, or is looked for */
    bool timer_armed[DL_RDZV_FO_TIMER_COUNT];
    dl_rdzv_fo_retry_t retry; /* what the retry timer is for */
    int connect_code;         /* the exit code if the next connection cannot start */
    const char *connect_status;
    /* The connection's health: failures in a row since trouble_since, and its times. */
    int failures;
    double trouble_since;
    double ready_at, heard_at, ticked_at;
    double full_since;       /* the first join a full job turned away, or 0 */
    double unresolved_since; /* the endpoint's name first did not resolve, or 0 */
    /* The last round's host and successors, and our own address as they know it. */
    int host_node_rank;
    char successors[DL_RDZV_SUCCESSORS_MAX][DL_RDZV_FO_ADDR_MAX];
    int nsuccessors;
    char my_addr[DL_RDZV_FO_ADDR_MAX];
    /* While the rendezvous is looked for: the candidates in order and the one being tried. */
    bool failing_over;
    double failover_since;
    char cands[DL_RDZV_SUCCESSORS_MAX + 1][DL_RDZV_FO_ADDR_MAX];
    int ncands, cand;
    /* The lost host is a failure like any node's: joins count one restart more than the last
     * assignment said, until the next one. Not when the host departed (its operator's signal)
     * or was no member of the round, or when we handed the job over: no node failed. */
    bool host_lost;
    bool host_departed;
    bool handing_over;
    /* Hosting as a successor: ours among the candidates (else 0), and the earlier one asked. */
    int host_index;
    /* Our turn found our address in use: whoever holds it is asked first, then we serve again
     * (said once a failover). */
    bool serve_in_use;
    bool serve_retried;
    bool probing;
    int probe_index;
    double probe_since;
} dl_rdzv_failover_t;

void dl_rdzv_failover_init(dl_rdzv_failover_t *fo, const dl_rdzv_fo_opts_t *opts);

/* Runs one event; out gets the actions (out->n 0: none). */
void dl_rdzv_failover_step(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev,
                           dl_rdzv_fo_actions_t *out);

/* Where the rendezvous is (or is being looked for). */
const char *dl_rdzv_failover_host(const dl_rdzv_failover_t *fo);
bool dl_rdzv_failover_ready(const dl_rdzv_failover_t *fo);
/* The failures a join reports beyond the last assignment's: 1 while a lost host counts. */
int dl_rdzv_failover_extra_failures(const dl_rdzv_failover_t *fo);
/* Our own address as the other nodes know it (the join's). */
void dl_rdzv_failover_set_my_addr(dl_rdzv_failover_t *fo, const char *addr);
/* Node 0's endpoint did not resolve at now: whether it is still worth waiting for (within
 * --join-timeout of the first time); *first: this was the first time. */
bool dl_rdzv_failover_name_wait(dl_rdzv_failover_t *fo, double now, bool *first);

#endif
