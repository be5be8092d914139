/* What the rendezvous server counts and remembers beyond the core's state, for /metrics, /api and
 * the status page (docs/operations.md): counters, latency histograms and, per job, its restarts
 * by cause, its last failure and its training progress. It lives inside the server and is only
 * ever touched from the server's loop thread; dl_rdzv_server_snapshot copies it out. */
#ifndef DL_RDZV_STATS_H
#define DL_RDZV_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core-internal.h"
#include "proto.h"
#include "rdzv-codec.h"
#include "rdzv-core.h"
#include "status-reply.h"

/* The connection id of the server's own STATUS requests: generation 0, which no real connection
 * ever has, so replies to it can be told apart and never reach a socket. */
#define DL__RDZV_STATS_CONN ((uint64_t)UINT32_MAX)

/* Upper bounds of the latency histograms' buckets, seconds; one more bucket holds the rest. */
#define DL__RDZV_HIST_BUCKETS 16
extern const double dl__rdzv_hist_bounds[DL__RDZV_HIST_BUCKETS];

typedef struct {
    uint64_t count[DL__RDZV_HIST_BUCKETS + 1]; /* per bucket, not cumulative */
    uint64_t n;
    double sum;
} dl__rdzv_hist_t;

typedef struct {
    uint64_t generation; /* changes with everything a snapshot would show */
    double started;      /* Unix time the server started */
    uint64_t accepted;
    uint64_t auth_failures;                 /* a wrong job token */
    uint64_t auth_timeouts;                 /* no hello and auth within the deadline */
    uint64_t rejected[DL_PROTO_E_COUNT];    /* frames and messages refused, by error code */
    uint64_t messages[DL_PROTO_TYPE_COUNT]; /* accepted after the handshake, by type */
    uint64_t restarts[DL_RDZV_CAUSE_COUNT];
    uint64_t rounds;               /* rounds closed with an assignment */
    dl__rdzv_hist_t round_seconds; /* a round's opening (its first join) -> its assignment */
    dl__rdzv_hist_t step_seconds;  /* one event through the core and its actions */
    dl_proto_rec_count_t *ended;   /* "succeeded": n, "failed": n, ... in the order they came */
    size_t nended;
    uint64_t hash_key[2];
    dl__rdzv_map_t jobs; /* run id -> what is kept of it (stats.c) */
    uint64_t snapshots;  /* made so far */
} dl__rdzv_stats_t;

/* Returns 0 or -ENOMEM; dl__rdzv_stats_free undoes either. */
int dl__rdzv_stats_init(dl__rdzv_stats_t *st, double unix_now);
void dl__rdzv_stats_free(dl__rdzv_stats_t *st);

/* Whether the per-job detail of run_id is kept (bounded by JOBS_MAX, dropped with the job). */
bool dl__rdzv_stats_kept(const dl__rdzv_stats_t *st, const char *run_id);

void dl__rdzv_hist_add(dl__rdzv_hist_t *h, double seconds);

/* A JOIN for run_id arrived (mono: the server's monotonic clock): opens round 0's clock. */
void dl__rdzv_stats_join(dl__rdzv_stats_t *st, const char *run_id, double mono);

/* An event the server journals for run_id ({"event": "rendezvous" | "round_changed" |
 * "job_end" | "log", ...}; borrowed): counts rounds, restarts by cause and endings. */
void dl__rdzv_stats_event(dl__rdzv_stats_t *st, const char *run_id, const json_t *ev, double mono);

/* A worker_failed message (as rdzv-codec.h reads it) from the agent at peer: the job's last
 * failure, at its own time or else unix_now. */
void dl__rdzv_stats_failure(dl__rdzv_stats_t *st, const char *run_id,
                            const dl_rdzv_failure_msg_t *f, const char *peer, double unix_now);

/* A heartbeat's progress (b->has_progress; rdzv-codec.h): a new point when the step moved. */
void dl__rdzv_stats_progress(dl__rdzv_stats_t *st, const char *run_id, const dl_rdzv_beat_msg_t *b,
                             double unix_now);

/* A heartbeat's recovery object (borrowed; in-job recovery, docs/recovery.md): {"recoveries",
 * "recovering", "step", "duration_ms"}, checked and bounded, kept as the job's newest. */
void dl__rdzv_stats_recovery(dl__rdzv_stats_t *st, const char *run_id, const json_t *rec);
/* What dl__rdzv_stats_recovery kept of the job into ret; false when nothing. */
bool dl__rdzv_stats_recovery_get(dl__rdzv_stats_t *st, const char *run_id,
                                 dl_proto_status_recovery_t *ret);

/* The snapshot (docs/operations.md): server counters, histograms, and the jobs of status, jobs[i]
 * the status reply's struct of status->jobs[i] (as the server fills it), to which what is kept
 * of it here is put (borrowed: the caller's jobs hold it until st changes); written by the status
 * reply's one encoder, so it shares nothing with st and may go to another thread. Forgets what is
 * kept of jobs the core no longer has. Returns a new reference, or NULL when out of memory. */
json_t *dl__rdzv_stats_snapshot(dl__rdzv_stats_t *st, const dl_rdzv_status_t *status,
                                dl_proto_status_job_t *jobs, double unix_now, size_t connections,
                                size_t peak_connections);

#endif
