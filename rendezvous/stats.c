/* The server's statistics and the snapshot built from them and the core's status. What is kept
 * per job is a JSON object, since all of it ends up as JSON anyway:
 *
 *   {"opened": mono seconds the current round opened, or -1 once it closed,
 *    "ended": mono seconds the job ended (absent while it runs),
 *    "restarts_by_cause": {"worker_failed": n, ...},
 *    "history": [{"time", "round", "cause", "reason"}, ...]       the last HISTORY_MAX restarts
 *    "last_failure": {"time", "round", "rank", ..., "log_tail"}   the last worker_failed
 *    "progress": [{"time", "step", "loss", "samples_per_s"}, ...] the last PROGRESS_MAX points
 *    "log": [{"time", "level", "text"}, ...]}                     the last LOG_MAX log lines
 *
 * Every list is bounded, and so is the number of jobs kept (JOBS_MAX): the memory a client can
 * make the server hold here is small and fixed per job. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

const double dl__rdzv_hist_bounds[DL__RDZV_HIST_BUCKETS] = {
    0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
};

int dl__rdzv_stats_init(dl__rdzv_stats_t *st, double unix_now)
{
    memset(st, 0, sizeof(*st));
    st->started = unix_now;
    st->ended = json_object();
    st->jobs = json_object();
    return st->ended != NULL && st->jobs != NULL ? 0 : -ENOMEM;
}

void dl__rdzv_stats_free(dl__rdzv_stats_t *st)
{
    if (st == NULL)
        return;
    json_decref(st->ended);
    json_decref(st->jobs);
    st->ended = st->jobs = NULL;
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

static void count_in(json_t *obj, const char *key)
{
    json_object_set_new(obj, key, json_integer(json_integer_value(json_object_get(obj, key)) + 1));
}

/* Appends item (stolen) to the array, dropping the oldest beyond max. */
static void bounded_append(json_t *arr, json_t *item, size_t max)
{
    if (item == NULL)
        return;
    while (json_array_size(arr) >= max)
        json_array_remove(arr, 0);
    json_array_append_new(arr, item);
}

/* Ended jobs long gone make room for new ones; past JOBS_MAX even a running job's entry is not
 * made (its counters still count, only the per-job detail is missing). */
static bool room_for_a_job(dl__rdzv_stats_t *st, double mono)
{
    const char *key;
    json_t *v;
    void *tmp;
    json_object_foreach_safe (st->jobs, tmp, key, v) {
        json_t *ended = json_object_get(v, "ended");
        if (ended != NULL && mono - json_real_value(ended) > ENDED_KEEP)
            json_object_del(st->jobs, key);
    }
    return json_object_size(st->jobs) < JOBS_MAX;
}

static json_t *job_entry(dl__rdzv_stats_t *st, const char *run_id, bool create, double mono)
{
    json_t *j = run_id != NULL ? json_object_get(st->jobs, run_id) : NULL;
    if (j != NULL || !create || run_id == NULL || !room_for_a_job(st, mono))
        return j;
    j = json_pack("{s:f, s:{}, s:[], s:[], s:[]}", "opened", mono, "restarts_by_cause", "history",
                  "progress", "log");
    if (j == NULL || json_object_set_new(st->jobs, run_id, j) < 0)
        return NULL;
    return j;
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

void dl__rdzv_stats_event(dl__rdzv_stats_t *st, const char *run_id, const json_t *ev, double mono)
{
    const char *name = json_string_value(json_object_get(ev, "event"));
    json_t *j = job_entry(st, run_id, true, mono);
    json_t *time = json_object_get(ev, "time");

    st->generation++;
    if (name == NULL)
        return;
    if (strcmp(name, "rendezvous") == 0) {
        st->rounds++;
        double opened = json_real_value(json_object_get(j, "opened"));
        if (j != NULL && opened >= 0) {
            dl__rdzv_hist_add(&st->round_seconds, mono - opened);
            json_object_set_new(j, "opened", json_real(-1));
        }
    } else if (strcmp(name, "round_changed") == 0) {
        const char *cause = json_string_value(json_object_get(ev, "cause"));
        int c = cause_of(cause);
        if (c >= 0)
            st->restarts[c]++;
        if (j == NULL)
            return;
        json_object_set_new(j, "opened", json_real(mono));
        count_in(json_object_get(j, "restarts_by_cause"), c >= 0 ? cause : "unknown");
        bounded_append(json_object_get(j, "history"),
                       json_pack("{s:O, s:O, s:s, s:O}", "time", time, "round",
                                 json_object_get(ev, "round"), "cause", c >= 0 ? cause : "unknown",
                                 "reason", json_object_get(ev, "reason")),
                       HISTORY_MAX);
    } else if (strcmp(name, "job_end") == 0) {
        const char *status = json_string_value(json_object_get(ev, "status"));
        count_in(st->ended, status != NULL ? status : "unknown");
        if (j != NULL)
            json_object_set_new(j, "ended", json_real(mono));
    } else if (strcmp(name, "log") == 0 && j != NULL) {
        bounded_append(json_object_get(j, "log"),
                       json_pack("{s:O, s:O, s:O}", "time", time, "level",
                                 json_object_get(ev, "level"), "text", json_object_get(ev, "text")),
                       LOG_MAX);
    }
}

void dl__rdzv_stats_failure(dl__rdzv_stats_t *st, const char *run_id,
                            const dl_rdzv_failure_msg_t *m, const char *peer, double unix_now)
{
    json_t *j = job_entry(st, run_id, false, 0);
    json_t *f = json_pack("{s:f, s:s, s:i, s:i}", "time", isnan(m->time) ? unix_now : m->time,
                          "peer", peer, "round", m->round, "rank", m->rank);

    st->generation++;
    if (j == NULL || f == NULL) {
        json_decref(f);
        return;
    }
    if (m->local_rank >= 0)
        json_object_set_new(f, "local_rank", json_integer(m->local_rank));
    if (m->exit_code >= 0)
        json_object_set_new(f, "exit_code", json_integer(m->exit_code));
    if (m->signal > 0)
        json_object_set_new(f, "signal", json_integer(m->signal));
    if (m->reason != NULL)
        json_object_set_new(f, "reason", json_string(m->reason));
    /* The protocol allows 64 KiB of tail; the page shows the end of it. */
    if (m->log_tail != NULL) {
        size_t len = strlen(m->log_tail);
        size_t from = len > LOG_TAIL_MAX ? len - LOG_TAIL_MAX : 0;
        json_t *cut = NULL;
        /* A cut inside a UTF-8 sequence is not a string: start at the next whole character. */
        for (size_t skip = 0; cut == NULL && skip < 4 && from + skip <= len; skip++)
            cut = json_stringn(m->log_tail + from + skip, len - from - skip);
        if (cut != NULL)
            json_object_set_new(f, "log_tail", cut);
    }
    json_object_set_new(j, "last_failure", f);
}

void dl__rdzv_stats_progress(dl__rdzv_stats_t *st, const char *run_id, const dl_rdzv_beat_msg_t *b,
                             double unix_now)
{
    json_t *j = job_entry(st, run_id, false, 0);
    json_t *ring = json_object_get(j, "progress");
    json_t *last = json_array_get(ring, json_array_size(ring) - 1);

    if (ring == NULL || !b->has_progress)
        return;
    /* Every agent may report, and each reports every heartbeat: one point per step is enough. */
    if (last != NULL && json_integer_value(json_object_get(last, "step")) == b->step)
        return;
    json_t *p = json_pack("{s:f, s:I}", "time", unix_now, "step", (json_int_t)b->step);
    if (p != NULL && !isnan(b->loss))
        json_object_set_new(p, "loss", json_real(b->loss));
    if (p != NULL && !isnan(b->samples_per_s))
        json_object_set_new(p, "samples_per_s", json_real(b->samples_per_s));
    bounded_append(ring, p, PROGRESS_MAX);
    st->generation++;
}

void dl__rdzv_stats_recovery(dl__rdzv_stats_t *st, const char *run_id, const json_t *rec)
{
    json_t *j = job_entry(st, run_id, false, 0);
    json_t *n = json_object_get(rec, "recoveries"), *on = json_object_get(rec, "recovering");
    json_t *step = json_object_get(rec, "step"), *ms = json_object_get(rec, "duration_ms");
    if (j == NULL || !json_is_integer(n) || json_integer_value(n) < 0 ||
        json_integer_value(n) > 1000000000 || !json_is_boolean(on))
        return;
    json_t *o = json_pack("{s:I, s:b}", "recoveries", json_integer_value(n), "recovering",
                          json_is_true(on));
    if (o != NULL && json_is_integer(step) && json_integer_value(step) >= 0)
        json_object_set_new(o, "step", json_integer(json_integer_value(step)));
    if (o != NULL && json_is_number(ms) && json_number_value(ms) >= 0 &&
        json_number_value(ms) < 1e9)
        json_object_set_new(o, "duration_ms", json_real(json_number_value(ms)));
    /* Every agent reports; the one that counted most is the newest. */
    json_t *was = json_object_get(j, "recovery");
    if (o != NULL && was != NULL &&
        json_integer_value(json_object_get(was, "recoveries")) > json_integer_value(n)) {
        json_decref(o);
        return;
    }
    if (o != NULL)
        json_object_set_new(j, "recovery", o);
}

bool dl__rdzv_stats_recovery_get(dl__rdzv_stats_t *st, const char *run_id,
                                 dl_proto_status_recovery_t *ret)
{
    const json_t *r = json_object_get(job_entry(st, run_id, false, 0), "recovery");
    const json_t *step = json_object_get(r, "step"), *ms = json_object_get(r, "duration_ms");
    if (r == NULL)
        return false;
    *ret = (dl_proto_status_recovery_t){
        .recoveries = (long long)json_integer_value(json_object_get(r, "recoveries")),
        .recovering = json_is_true(json_object_get(r, "recovering")),
        .step = (long long)json_integer_value(step),
        .has_step = step != NULL,
        .duration_ms = json_real_value(ms),
        .has_duration_ms = ms != NULL};
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

/* The server's figures, filled into the status reply's struct and written by its encoder; every
 * array here is borrowed for the call. */
static json_t *server_json(dl__rdzv_stats_t *st, size_t connections, size_t peak)
{
    dl_proto_rec_count_t rejected[DL_PROTO_E_COUNT], messages[DL_PROTO_TYPE_COUNT],
        restarts[DL_RDZV_CAUSE_COUNT];
    dl_proto_rec_count_t *ended = calloc(json_object_size(st->ended) + 1, sizeof(*ended));
    long long round_counts[DL__RDZV_HIST_BUCKETS + 1], step_counts[DL__RDZV_HIST_BUCKETS + 1];
    dl_proto_status_hist_t round_h, step_h;
    dl_proto_status_hists_t hists = {&round_h, &step_h};
    size_t nended = 0;
    const char *key;
    json_t *v;

    if (ended == NULL)
        return NULL;
    json_object_foreach (st->ended, key, v) {
        ended[nended++] = (dl_proto_rec_count_t){(char *)key, (long long)json_integer_value(v)};
    }
    hist_of(&st->round_seconds, round_counts, &round_h);
    hist_of(&st->step_seconds, step_counts, &step_h);
    dl_proto_status_server_t srv = {
        .started = st->started,
        .connections = (long long)connections,
        .peak_connections = (long long)peak,
        .accepted = (long long)st->accepted,
        .auth_failures = (long long)st->auth_failures,
        .auth_timeouts = (long long)st->auth_timeouts,
        .rounds = (long long)st->rounds,
        .rejected = rejected,
        .nrejected = counts_of(st->rejected, DL_PROTO_E_COUNT, errcode_name, false, rejected),
        .messages = messages,
        .nmessages = counts_of(st->messages, DL_PROTO_TYPE_COUNT, type_name, false, messages),
        .restarts = restarts,
        .nrestarts = counts_of(st->restarts, DL_RDZV_CAUSE_COUNT, cause_name, true, restarts),
        .ended = ended,
        .nended = nended,
        .histograms = &hists,
    };
    json_t *o = dl_proto_rec_encode(&dl_proto_status_server_type, &srv);
    free(ended);
    return o;
}

/* Adds to the job's status object what is kept of it here, as deep copies. */
static int add_extras(json_t *o, const dl_rdzv_job_status_t *js, const json_t *kept,
                      double unix_now)
{
    static const char *const lists[] = {"restarts_by_cause", "history", "last_failure", "progress",
                                        "log"};
    int r = 0;
    r |= json_object_set_new(o, "store_bytes", json_integer((json_int_t)js->store_bytes));
    r |= json_object_set_new(o, "store_waits", json_integer((json_int_t)js->store_waits));
    /* Ages go stale as soon as the snapshot is made; a time does not. */
    size_t i;
    json_t *node;
    json_array_foreach (json_object_get(o, "nodes"), i, node) {
        double age = json_number_value(json_object_get(node, "heartbeat_age"));
        r |= json_object_set_new(node, "last_heartbeat", json_real(unix_now - age));
    }
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++) {
        json_t *v = json_object_get(kept, lists[k]);
        if (v != NULL)
            r |= json_object_set_new(o, lists[k], json_deep_copy(v));
    }
    return r < 0 ? -ENOMEM : 0;
}

json_t *dl__rdzv_stats_snapshot(dl__rdzv_stats_t *st, const dl_rdzv_status_t *status, json_t *jobs,
                                double unix_now, size_t connections, size_t peak_connections)
{
    json_t *snap = NULL, *live = json_object();
    int r = jobs != NULL && live != NULL && json_array_size(jobs) == status->njobs ? 0 : -ENOMEM;

    for (size_t i = 0; r == 0 && i < status->njobs; i++) {
        const char *run_id = status->jobs[i].run_id;
        r = add_extras(json_array_get(jobs, i), &status->jobs[i], json_object_get(st->jobs, run_id),
                       unix_now);
        if (r == 0)
            r = json_object_set(live, run_id, json_true());
    }
    if (r == 0) {
        const char *key;
        json_t *v;
        void *tmp;
        json_object_foreach_safe (st->jobs, tmp, key, v) {
            if (json_object_get(live, key) == NULL)
                json_object_del(st->jobs, key);
        }
        snap = json_pack("{s:s, s:f, s:o, s:O}", "version", DL_VERSION, "time", unix_now, "server",
                         server_json(st, connections, peak_connections), "jobs", jobs);
    }
    json_decref(live);
    json_decref(jobs);
    return snap;
}
