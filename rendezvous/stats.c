/* The server's statistics and the snapshot built from them and the core's status. What is kept
 * per job (kept_t) is the status reply's own structs (proto/status-reply.h), so that the snapshot
 * borrows them for its one encoder:
 *
 *   opened             mono seconds the current round opened, or -1 once it closed
 *   ended              mono seconds the job ended (has_ended while it runs: false)
 *   restarts_by_cause  {"worker_failed": n, ...} in the order the causes came
 *   history            the last HISTORY_MAX restarts {time, round, cause, reason}
 *   last_failure       the last worker_failed {time, peer, round, rank, ..., log_tail}
 *   progress           the last PROGRESS_MAX points {time, step, loss, samples_per_s}
 *   log                the last LOG_MAX log lines {time, level, text}
 *   recovery           the in-job recoveries of the agent that counted most
 *
 * Every list is bounded, and so is the number of jobs kept (JOBS_MAX): the memory a client can
 * make the server hold here is small and fixed per job. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "journal-event.h"
#include "stats.h"
#include "status-reply.h"

#define HISTORY_MAX 10
#define PROGRESS_MAX 240 /* four minutes of one point a second */
#define LOG_MAX 20
#define LOG_TAIL_MAX 4096
#define JOBS_MAX 4096
/* An ended job's entry is dropped when another job starts this long after, whether or not a
 * snapshot saw it go: a daemon nobody watches must not grow. */
#define ENDED_KEEP 3600.0

typedef struct {
    dl__rdzv_hnode_t node;
    char *run_id;
    double opened;
    double ended;
    bool has_ended;
    uint64_t seen; /* the last snapshot that had the job */
    /* Names are static (dl_rdzv_cause_name, or "unknown"): one count each at most. */
    dl_proto_rec_count_t by_cause[DL_RDZV_CAUSE_COUNT + 1];
    size_t nby_cause;
    dl_proto_status_restart_t history[HISTORY_MAX]; /* oldest first; reason is ours */
    size_t nhistory;
    dl_proto_status_failure_t last_failure; /* peer, reason and log_tail are ours */
    bool has_last_failure;
    dl_proto_status_point_t *progress; /* oldest first, grown up to PROGRESS_MAX */
    size_t nprogress, progress_cap;
    dl_proto_status_log_t log[LOG_MAX]; /* oldest first; level is static, text ours */
    size_t nlog;
    dl_proto_status_recovery_t recovery;
    bool has_recovery;
} kept_t;

const double dl__rdzv_hist_bounds[DL__RDZV_HIST_BUCKETS] = {
    0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
};

int dl__rdzv_stats_init(dl__rdzv_stats_t *st, double unix_now)
{
    memset(st, 0, sizeof(*st));
    st->started = unix_now;
    /* Run ids are the clients': a key of our own keeps them from choosing the chains. */
    if (dl_proto_random(st->hash_key, sizeof(st->hash_key)) < 0) {
        st->hash_key[0] = (uint64_t)(uintptr_t)st;
        st->hash_key[1] = 0x9e3779b97f4a7c15ull;
    }
    return 0;
}

static void failure_clear(dl_proto_status_failure_t *f)
{
    free(f->peer);
    free(f->reason);
    free(f->log_tail);
    memset(f, 0, sizeof(*f));
}

static void kept_free(kept_t *k)
{
    if (k == NULL)
        return;
    for (size_t i = 0; i < k->nhistory; i++)
        free(k->history[i].reason);
    failure_clear(&k->last_failure);
    free(k->progress);
    for (size_t i = 0; i < k->nlog; i++)
        free(k->log[i].text);
    free(k->run_id);
    free(k);
}

static uint64_t hash_of(const dl__rdzv_stats_t *st, const char *run_id)
{
    return dl__rdzv_hash(st->hash_key, run_id, strlen(run_id));
}

static kept_t *kept_of(const dl__rdzv_stats_t *st, const char *run_id)
{
    uint64_t h = hash_of(st, run_id);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&st->jobs, h); n != NULL; n = n->next) {
        kept_t *k = dl__rdzv_container_of(n, kept_t, node);
        if (n->hash == h && strcmp(k->run_id, run_id) == 0)
            return k;
    }
    return NULL;
}

bool dl__rdzv_stats_kept(const dl__rdzv_stats_t *st, const char *run_id)
{
    return kept_of(st, run_id) != NULL;
}

/* Drops every entry that drop() says goes (all, with NULL). */
static void forget_if(dl__rdzv_stats_t *st, bool (*drop)(const kept_t *k, const void *arg),
                      const void *arg)
{
    /* The map has no iterator: its nodes are taken out and the ones that stay put back, which
     * needs no memory (the buckets are kept). */
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&st->jobs);
    while (n != NULL) {
        dl__rdzv_hnode_t *next = n->next;
        kept_t *k = dl__rdzv_container_of(n, kept_t, node);
        if (drop == NULL || drop(k, arg))
            kept_free(k);
        else
            dl__rdzv_map_insert(&st->jobs, n, n->hash);
        n = next;
    }
}

void dl__rdzv_stats_free(dl__rdzv_stats_t *st)
{
    if (st == NULL)
        return;
    forget_if(st, NULL, NULL);
    dl__rdzv_map_free(&st->jobs);
    for (size_t i = 0; i < st->nended; i++)
        free(st->ended[i].name);
    free(st->ended);
    st->ended = NULL;
    st->nended = 0;
}

void dl__rdzv_hist_add(dl__rdzv_hist_t *h, double seconds)
{
    size_t i = 0;
    while (i < DL__RDZV_HIST_BUCKETS && seconds > dl__rdzv_hist_bounds[i])
        i++;
    h->count[i]++;
    h->n++;
    h->sum += seconds;
}

static void count_ended(dl__rdzv_stats_t *st, const char *status)
{
    for (size_t i = 0; i < st->nended; i++)
        if (strcmp(st->ended[i].name, status) == 0) {
            st->ended[i].n++;
            return;
        }
    dl_proto_rec_count_t *e = realloc(st->ended, (st->nended + 1) * sizeof(*e));
    if (e == NULL)
        return;
    st->ended = e;
    if ((e[st->nended].name = strdup(status)) != NULL)
        e[st->nended++].n = 1;
}

static bool gone_long_ago(const kept_t *k, const void *arg)
{
    return k->has_ended && *(const double *)arg - k->ended > ENDED_KEEP;
}

/* Ended jobs long gone make room for new ones; past JOBS_MAX even a running job's entry is not
 * made (its counters still count, only the per-job detail is missing). */
static bool room_for_a_job(dl__rdzv_stats_t *st, double mono)
{
    forget_if(st, gone_long_ago, &mono);
    return st->jobs.count < JOBS_MAX;
}

static kept_t *job_entry(dl__rdzv_stats_t *st, const char *run_id, bool create, double mono)
{
    kept_t *k = run_id != NULL ? kept_of(st, run_id) : NULL;
    if (k != NULL || !create || run_id == NULL || !room_for_a_job(st, mono))
        return k;
    if ((k = calloc(1, sizeof(*k))) == NULL)
        return NULL;
    k->opened = mono;
    if ((k->run_id = strdup(run_id)) == NULL || dl__rdzv_map_reserve(&st->jobs, 1) < 0) {
        kept_free(k);
        return NULL;
    }
    dl__rdzv_map_insert(&st->jobs, &k->node, hash_of(st, run_id));
    return k;
}

void dl__rdzv_stats_join(dl__rdzv_stats_t *st, const char *run_id, double mono)
{
    job_entry(st, run_id, true, mono);
}

static int cause_of(const char *name)
{
    for (int c = 0; c < DL_RDZV_CAUSE_COUNT; c++)
        if (name != NULL && strcmp(name, dl_rdzv_cause_name((dl_rdzv_cause_t)c)) == 0)
            return c;
    return -1;
}

static void count_cause(kept_t *k, const char *name)
{
    size_t i = 0;
    while (i < k->nby_cause && strcmp(k->by_cause[i].name, name) != 0)
        i++;
    if (i == k->nby_cause) {
        if (i == sizeof(k->by_cause) / sizeof(k->by_cause[0]))
            return;
        k->by_cause[k->nby_cause++] = (dl_proto_rec_count_t){(char *)name, 0};
    }
    k->by_cause[i].n++;
}

/* A restart as the history keeps it; its reason copied. An event without its time, round and
 * reason is not one the server journals: left out. */
static void add_history(kept_t *k, const dl_proto_journal_event_t *ev, const char *cause)
{
    char *copy = ev->reason != NULL ? strdup(ev->reason) : NULL;
    if (!ev->has_time || !ev->has_round || copy == NULL) {
        free(copy);
        return;
    }
    if (k->nhistory == HISTORY_MAX) {
        free(k->history[0].reason);
        memmove(k->history, k->history + 1, (HISTORY_MAX - 1) * sizeof(k->history[0]));
        k->nhistory--;
    }
    k->history[k->nhistory++] =
        (dl_proto_status_restart_t){ev->time, ev->round, (char *)cause, copy};
}

/* A log line as the job keeps it; the level one of the journal's three, static. */
static void add_log(kept_t *k, const dl_proto_journal_event_t *ev)
{
    static const char *const levels[] = {"error", "warning", "info"};
    const char *known = NULL;
    for (size_t i = 0; ev->level != NULL && i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcmp(ev->level, levels[i]) == 0)
            known = levels[i];
    char *copy = ev->text != NULL ? strdup(ev->text) : NULL;
    if (!ev->has_time || known == NULL || copy == NULL) {
        free(copy);
        return;
    }
    if (k->nlog == LOG_MAX) {
        free(k->log[0].text);
        memmove(k->log, k->log + 1, (LOG_MAX - 1) * sizeof(k->log[0]));
        k->nlog--;
    }
    k->log[k->nlog++] = (dl_proto_status_log_t){ev->time, (char *)known, copy};
}

static void take_event(dl__rdzv_stats_t *st, kept_t *k, const dl_proto_journal_event_t *ev,
                       double mono)
{
    const char *name = ev->event;
    if (name == NULL)
        return;
    if (strcmp(name, "rendezvous") == 0) {
        st->rounds++;
        if (k != NULL && k->opened >= 0) {
            dl__rdzv_hist_add(&st->round_seconds, mono - k->opened);
            k->opened = -1;
        }
    } else if (strcmp(name, "round_changed") == 0) {
        int c = cause_of(ev->cause);
        const char *cause = c >= 0 ? dl_rdzv_cause_name((dl_rdzv_cause_t)c) : "unknown";
        if (c >= 0)
            st->restarts[c]++;
        if (k == NULL)
            return;
        k->opened = mono;
        count_cause(k, cause);
        add_history(k, ev, cause);
    } else if (strcmp(name, "job_end") == 0) {
        count_ended(st, ev->status != NULL ? ev->status : "unknown");
        if (k != NULL) {
            k->ended = mono;
            k->has_ended = true;
        }
    } else if (strcmp(name, "log") == 0 && k != NULL) {
        add_log(k, ev);
    }
}

void dl__rdzv_stats_event(dl__rdzv_stats_t *st, const char *run_id, const json_t *ev, double mono)
{
    kept_t *k = job_entry(st, run_id, true, mono);
    dl_proto_journal_event_t e;
    char err[160];

    st->generation++;
    /* The server's own events (rdzv-codec.h): one that does not read is not one of them. */
    if (dl_proto_rec_decode(&dl_proto_journal_event_type, ev, &e, "event", err, sizeof(err)) < 0)
        return;
    take_event(st, k, &e, mono);
    dl_proto_rec_free(&dl_proto_journal_event_type, &e);
}

void dl__rdzv_stats_failure(dl__rdzv_stats_t *st, const char *run_id,
                            const dl_rdzv_failure_msg_t *m, const char *peer, double unix_now)
{
    kept_t *k = job_entry(st, run_id, false, 0);
    dl_proto_status_failure_t f = {.time = isnan(m->time) ? unix_now : m->time,
                                   .round = m->round,
                                   .has_round = true,
                                   .rank = m->rank,
                                   .has_rank = true,
                                   .local_rank = m->local_rank,
                                   .has_local_rank = m->local_rank >= 0,
                                   .exit_code = m->exit_code,
                                   .has_exit_code = m->exit_code >= 0,
                                   .signal = m->signal,
                                   .has_signal = m->signal > 0};

    st->generation++;
    if (k == NULL || (f.peer = strdup(peer)) == NULL)
        return;
    if (m->reason != NULL && (f.reason = strdup(m->reason)) == NULL) {
        failure_clear(&f);
        return;
    }
    /* The protocol allows 64 KiB of tail; the page shows the end of it. A cut inside a UTF-8
     * sequence is not a string: it starts at the next whole character. */
    if (m->log_tail != NULL) {
        size_t len = strlen(m->log_tail), from = len > LOG_TAIL_MAX ? len - LOG_TAIL_MAX : 0;
        while (from < len && ((unsigned char)m->log_tail[from] & 0xc0) == 0x80)
            from++;
        if ((f.log_tail = strdup(m->log_tail + from)) == NULL) {
            failure_clear(&f);
            return;
        }
    }
    failure_clear(&k->last_failure);
    k->last_failure = f;
    k->has_last_failure = true;
}

void dl__rdzv_stats_progress(dl__rdzv_stats_t *st, const char *run_id, const dl_rdzv_beat_msg_t *b,
                             double unix_now)
{
    kept_t *k = job_entry(st, run_id, false, 0);

    if (k == NULL || !b->has_progress)
        return;
    /* Every agent may report, and each reports every heartbeat: one point per step is enough. */
    if (k->nprogress > 0 && k->progress[k->nprogress - 1].step == b->step)
        return;
    if (k->nprogress == PROGRESS_MAX) {
        memmove(k->progress, k->progress + 1, (PROGRESS_MAX - 1) * sizeof(k->progress[0]));
        k->nprogress--;
    } else if (k->nprogress == k->progress_cap) {
        size_t cap = k->progress_cap ? k->progress_cap * 2 : 16;
        cap = cap > PROGRESS_MAX ? PROGRESS_MAX : cap;
        dl_proto_status_point_t *p = realloc(k->progress, cap * sizeof(*p));
        if (p == NULL)
            return;
        k->progress = p;
        k->progress_cap = cap;
    }
    k->progress[k->nprogress++] =
        (dl_proto_status_point_t){.time = unix_now,
                                  .step = b->step,
                                  .loss = b->loss,
                                  .has_loss = !isnan(b->loss),
                                  .samples_per_s = b->samples_per_s,
                                  .has_samples_per_s = !isnan(b->samples_per_s)};
    st->generation++;
}

void dl__rdzv_stats_recovery(dl__rdzv_stats_t *st, const char *run_id, const json_t *rec)
{
    kept_t *k = job_entry(st, run_id, false, 0);
    dl_proto_status_recovery_t r;
    char err[160];
    /* An agent's figures: one that makes no sense is left out, the job's are kept. */
    if (k == NULL ||
        dl_proto_rec_decode(&dl_proto_beat_recovery_type, rec, &r, "recovery", err, sizeof(err)) <
            0 ||
        r.recoveries < 0 || r.recoveries > 1000000000)
        return;
    /* Every agent reports; the one that counted most is the newest. */
    if (k->has_recovery && k->recovery.recoveries > r.recoveries)
        return;
    r.has_step = r.has_step && r.step >= 0;
    r.has_duration_ms = r.has_duration_ms && r.duration_ms >= 0 && r.duration_ms < 1e9;
    k->recovery = r;
    k->has_recovery = true;
}

bool dl__rdzv_stats_recovery_get(dl__rdzv_stats_t *st, const char *run_id,
                                 dl_proto_status_recovery_t *ret)
{
    const kept_t *k = job_entry(st, run_id, false, 0);
    if (k == NULL || !k->has_recovery)
        return false;
    *ret = k->recovery;
    return true;
}

/* The counters v[0..n) by name into out: every one (all), or only those above 0. Names are
 * static strings, borrowed for the encoder. */
static size_t counts_of(const uint64_t *v, size_t n, const char *(*name)(int), bool all,
                        dl_proto_rec_count_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (all || v[i] > 0)
            out[k++] = (dl_proto_rec_count_t){(char *)name((int)i), (long long)v[i]};
    return k;
}

static const char *errcode_name(int i)
{
    return dl_proto_errcode_name((dl_proto_errcode_t)i);
}

static const char *type_name(int i)
{
    return dl_proto_type_name((dl_proto_type_t)i);
}

static const char *cause_name(int i)
{
    return dl_rdzv_cause_name((dl_rdzv_cause_t)i);
}

/* A histogram as the snapshot has it: counts cumulative, one per bound, then +Inf. */
static void hist_of(const dl__rdzv_hist_t *h, long long counts[DL__RDZV_HIST_BUCKETS + 1],
                    dl_proto_status_hist_t *out)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= DL__RDZV_HIST_BUCKETS; i++)
        counts[i] = (long long)(cum += h->count[i]);
    *out = (dl_proto_status_hist_t){.bounds = (double *)dl__rdzv_hist_bounds,
                                    .nbounds = DL__RDZV_HIST_BUCKETS,
                                    .counts = counts,
                                    .ncounts = DL__RDZV_HIST_BUCKETS + 1,
                                    .sum = h->sum,
                                    .count = (long long)h->n};
}

/* The server's figures in the status reply's struct, its arrays in figs (names borrowed). */
typedef struct {
    dl_proto_rec_count_t rejected[DL_PROTO_E_COUNT], messages[DL_PROTO_TYPE_COUNT],
        restarts[DL_RDZV_CAUSE_COUNT];
    long long round_counts[DL__RDZV_HIST_BUCKETS + 1], step_counts[DL__RDZV_HIST_BUCKETS + 1];
    dl_proto_status_hist_t round_h, step_h;
    dl_proto_status_hists_t hists;
} server_figs_t;

static int server_of(dl__rdzv_stats_t *st, size_t connections, size_t peak, server_figs_t *figs,
                     dl_proto_status_server_t *srv)
{
    hist_of(&st->round_seconds, figs->round_counts, &figs->round_h);
    hist_of(&st->step_seconds, figs->step_counts, &figs->step_h);
    figs->hists = (dl_proto_status_hists_t){&figs->round_h, &figs->step_h};
    *srv = (dl_proto_status_server_t){
        .started = st->started,
        .connections = (long long)connections,
        .peak_connections = (long long)peak,
        .accepted = (long long)st->accepted,
        .auth_failures = (long long)st->auth_failures,
        .auth_timeouts = (long long)st->auth_timeouts,
        .rounds = (long long)st->rounds,
        .rejected = figs->rejected,
        .nrejected = counts_of(st->rejected, DL_PROTO_E_COUNT, errcode_name, false, figs->rejected),
        .messages = figs->messages,
        .nmessages = counts_of(st->messages, DL_PROTO_TYPE_COUNT, type_name, false, figs->messages),
        .restarts = figs->restarts,
        .nrestarts = counts_of(st->restarts, DL_RDZV_CAUSE_COUNT, cause_name, true, figs->restarts),
        .ended = st->ended,
        .nended = st->nended,
        .histograms = &figs->hists,
    };
    return 0;
}

/* Puts on the job's status what is kept of it here (k, or NULL: nothing), borrowed. */
static void add_extras(dl_proto_status_job_t *o, const dl_rdzv_job_status_t *js, kept_t *k,
                       double unix_now)
{
    o->store_bytes = (long long)js->store_bytes;
    o->has_store_bytes = true;
    o->store_waits = (long long)js->store_waits;
    o->has_store_waits = true;
    /* Ages go stale as soon as the snapshot is made; a time does not. */
    for (size_t i = 0; i < o->nnodes; i++) {
        o->nodes[i].last_heartbeat = unix_now - o->nodes[i].heartbeat_age;
        o->nodes[i].has_last_heartbeat = true;
    }
    if (k == NULL)
        return;
    o->restarts_by_cause = k->by_cause;
    o->nrestarts_by_cause = k->nby_cause;
    o->has_restarts_by_cause = true;
    o->history = k->history;
    o->nhistory = k->nhistory;
    o->has_history = true;
    o->last_failure = k->has_last_failure ? &k->last_failure : NULL;
    o->progress = k->progress;
    o->nprogress = k->nprogress;
    o->has_progress = true;
    o->log = k->log;
    o->nlog = k->nlog;
    o->has_log = true;
}

static bool unseen(const kept_t *k, const void *arg)
{
    return k->seen != *(const uint64_t *)arg;
}

json_t *dl__rdzv_stats_snapshot(dl__rdzv_stats_t *st, const dl_rdzv_status_t *status,
                                dl_proto_status_job_t *jobs, double unix_now, size_t connections,
                                size_t peak_connections)
{
    uint64_t mark = ++st->snapshots;
    for (size_t i = 0; i < status->njobs; i++) {
        kept_t *k = job_entry(st, status->jobs[i].run_id, false, 0);
        add_extras(&jobs[i], &status->jobs[i], k, unix_now);
        if (k != NULL)
            k->seen = mark;
    }
    forget_if(st, unseen, &mark);
    server_figs_t figs;
    dl_proto_status_server_t srv;
    if (server_of(st, connections, peak_connections, &figs, &srv) < 0)
        return NULL;
    dl_proto_status_snapshot_t snap = {.version = (char *)DL_VERSION,
                                       .time = unix_now,
                                       .server = &srv,
                                       .jobs = jobs,
                                       .njobs = status->njobs};
    return dl_proto_rec_encode(&dl_proto_status_snapshot_type, &snap);
}
