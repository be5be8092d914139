/* Internals shared by the files of the libuv rendezvous server: the server and its connections
 * (server.c), the handshake (server-handshake.c), a ready connection's requests
 * (server-requests.c) and what the core's steps make of them (server-actions.c). */
#ifndef DL_RDZV_SERVER_INTERNAL_H
#define DL_RDZV_SERVER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "conn.h"
#include "jobview.h"
#include "journal.h"
#include "rendezvous.h"
#include "revoked.h"
#include "stats.h"
#include "torch-jobs.h"
#include "torch-store.h"

#define DL__SERVER_READBUF_SIZE (64 * 1024)
/* Followers of one job's events at once (`dlaunch events`). */
#define DL__SERVER_FOLLOWERS_MAX 64

typedef enum {
    DL__SCONN_HELLO = 0, /* waiting for hello */
    DL__SCONN_AUTH,      /* challenge sent, waiting for auth */
    DL__SCONN_READY,
} dl__sconn_state_t;

typedef struct dl__sconn_s dl__sconn_t;

/* One job's bytes of unfinished frames, shared by its authenticated connections. */
typedef struct dl__job_held_s {
    struct dl__job_held_s *next;
    size_t bytes;
    unsigned users;
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
} dl__job_held_t;

struct dl__sconn_s {
    dl__conn_t c; /* first: libuv's handle pointer is the connection's */
    dl_rdzv_server_t *s;
    uint32_t slot;
    dl__sconn_state_t state;
    dl_proto_role_t role;
    double accepted;          /* for the authentication deadline */
    dl__sconn_t *prev, *next; /* in the list of unauthenticated connections, oldest first */
    bool in_preauth;
    json_int_t join_id; /* the join waiting for its assignment (the core answers it later) */
    bool status_ranks;  /* the status request being answered asked for every rank */
    dl_proto_token_kind_t level; /* what its credential reaches (a master without a token) */
    dl_proto_key_life_t life;    /* the span of its job or worker key; {0, 0} for a master */
    uint32_t outstanding;        /* requests not answered yet */
    bool joined;                 /* sent a join: the core watches it from then on */
    bool following;              /* follows its job's events */
    bool has_client_nonce;       /* hello asked us to prove the token back */
    bool wants_torch;            /* its join asked for the job's store in torch's protocol */
    uint64_t creator;            /* its address, as the core counts jobs per creator */
    dl__job_held_t *held_job;    /* its job's count of unfinished frames, once authenticated */
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    char nonce[DL_PROTO_NONCE_HEX_LEN + 1];
    char client_nonce[DL_PROTO_NONCE_HEX_LEN + 1];
};

struct dl_rdzv_server_s {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t core_timer;
    uv_timer_t auth_timer;
    dl_rdzv_core_t *core;
    const dl_proto_token_t *token;
    double heartbeat;
    double auth_timeout;
    dl_rdzv_log_cb log;
    void *log_ctx;
    char store_host[DL_PROTO_NAME_MAX + 1];
    int port;

    /* Connection ids are (generation << 32 | slot): O(1) lookup, and an id never names a later
     * connection that reuses the slot. */
    dl__sconn_t **slots;
    uint32_t *gens;
    uint32_t *free_slots;
    size_t nslots, nfree, cap;
    dl__sconn_t *preauth_head, *preauth_tail;
    size_t nconns, peak;

    /* Per job: the events `dlaunch events RUN_ID` replays and follows, with our marks
     * (dl__journals_mark) "assigned" and "changed": the last journaled assignment and round
     * change. */
    dl__journals_t *journals;
    uv_idle_t replay_idle; /* runs while some journal replay has events to send */
    bool replaying;

    char only_run_id[DL_PROTO_RUN_ID_MAX + 1]; /* "" when any job is served */
    bool store_only;                           /* a one-node job's store: workers only */
    double idle_timeout;
    double frame_timeout;
    double linger; /* for jobs that JOINs create */
    uint32_t max_outstanding;
    size_t held; /* bytes of unfinished frames, every connection together */
    size_t max_held;
    size_t queued; /* bytes of replies written, not yet sent: counted in the core's max_memory */
    dl__job_held_t *held_jobs; /* the same per job with a connection; a quarter of max_held each */
    uv_timer_t sweep_timer;    /* closes idle connections and stalled frames */
    bool sweeping;
    int diag_fd; /* the netlink socket that tells peers' uids, without a token; -1 until used */
    dl__jobview_t *view;    /* every job's ranks as their agents report them (jobview.c) */
    dl__revoked_t *revoked; /* runs whose keys issued before some time are refused */

    dl__torch_store_t *torch; /* the job's store in torch's protocol, or NULL */
    /* Serving many jobs (torch_jobs): each job's torch store, opened at the first assignment
     * that goes to an agent asking for one; NULL otherwise. */
    dl__torch_jobs_t *torch_jobs;
    char torch_host[DL_PROTO_NAME_MAX + 1];
    /* Node addresses of the one job a store-only server serves, as its backend knows them
     * (dl_rdzv_server_set_job_hosts): they may reach its torch store. */
    struct sockaddr_storage *job_hosts;
    size_t njob_hosts;
    dl_rdzv_core_opts_t core_opts; /* its limits, for the torch store (no hash key, no names) */
    dl__rdzv_stats_t stats;
    json_t *snapshot;            /* what the last STATUS to DL__RDZV_STATS_CONN made */
    dl_rdzv_status_fn status_fn; /* a job's status kept elsewhere (etcd), or NULL */
    void *status_ctx;

    bool closing;
    /* Within dl_rdzv_server_add_job: its owner made the job, so the core's lines about that go
     * to the journal only, not back to the owner's log (a one-node job would print them). */
    bool adding_job;
    int open_handles;
    void (*done)(void *ctx);
    void *done_ctx;
    char readbuf[DL__SERVER_READBUF_SIZE];
};

/* The clock of deadlines and durations. */
static inline double dl__server_now(void)
{
    return (double)uv_hrtime() / 1e9;
}

/* The clock of journal and log times, as a user reads them. */
static inline double dl__server_unix_now(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

/* ---- server.c: the connection table, and every frame out ---- */

uint64_t dl__sconn_id(const dl__sconn_t *sc);
/* NULL for a connection that is gone, and for a torch store's. */
dl__sconn_t *dl__sconn_by_id(dl_rdzv_server_t *s, uint64_t id);
int dl__sconn_send(dl__sconn_t *sc, const json_t *m);
void dl__sconn_error(dl__sconn_t *sc, json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dl__sconn_held_job_attach(dl__sconn_t *sc);
/* Starts the sweep of idle connections and stalled frames, unless it runs. */
void dl__server_sweep_start(dl_rdzv_server_t *s);

/* ---- server-handshake.c: hello, auth and the deadline for both ---- */

void dl__server_preauth_arm(dl_rdzv_server_t *s);
void dl__sconn_preauth_remove(dl__sconn_t *sc);
void dl__sconn_hello(dl__sconn_t *sc, json_t *msg, json_int_t id);
void dl__sconn_auth(dl__sconn_t *sc, json_t *msg, json_int_t id);

/* ---- server-requests.c ---- */

/* A request or notification of an authenticated connection; msg is borrowed. */
void dl__sconn_request(dl__sconn_t *sc, json_t *msg, dl_proto_type_t type);

/* ---- server-actions.c (and dl__rdzv_server_feed, torch-store.h) ---- */

/* Carries out the core's actions: frames, closes, its timer, journals, torch stores. */
void dl__server_apply(dl_rdzv_server_t *s, const dl_rdzv_actions_t *acts);
void dl__server_replay_start(dl_rdzv_server_t *s);

#endif
