/* What the agent sees inside its workers: their health beats and figures, their flight recorders
 * (collective.h) and process states. With them it names stragglers (the rule runs here when the
 * job has no rendezvous, at the rendezvous otherwise), says in one line where the ranks are when
 * one hangs or fails, and prints everything on SIGUSR1. The rule and the account are pure
 * (diag/); this file reads files and /proc and talks to the log and the event stream. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective.h"
#include "diag.h"
#include "internal.h"
#include "opt.h"
#include "rdzv-policy.h"
#include "rdzv-report.h"

#define REPORT_OPS 4

typedef enum { ACTION_WARN = 0, ACTION_EXCLUDE, ACTION_OFF } action_t;

/* Per worker: its recorder, and since when its newest operation has been as it is now (for
 * operations too small for the recorder to time). */
typedef struct {
    int rank;
    dl_coll_rec_reader_t *rec;
    bool rec_in_memory; /* rec is the rank's memfd (a full disk): a new group makes a new one */
    char path[4200];
    char transport[16];
    uint64_t seen_seq;
    int seen_state;
    double seen_at;
} wdiag_t;

struct dl__diag_s {
    dl_agent_t *agent;
    action_t action;
    dl_diag_straggler_opts_t opts;
    dl_diag_judge_t *judge; /* one node without a rendezvous */
    uv_signal_t usr1;
    bool usr1_open;
    wdiag_t *w;
    size_t nw;
    char host[256];
    char diagnosis[1024];   /* this attempt's account of its hang or failure, or "" */
    json_t *failure_report; /* the node's report when the account was made */
    int *announced;         /* stragglers named in this attempt */
    size_t nannounced, announced_cap;
    double excluded_until;    /* > 0: this node stepped out until then (monotonic seconds) */
    bool told_ring_in_memory; /* said once that a rank's recorder file could not be written */
};

static double mono_now(void)
{
    return (double)uv_hrtime() / 1e9;
}

bool dl__diag_beats_wanted(const dl_agent_t *a)
{
    const char *act = a->spec->straggler_action;
    return a->spec->health_timeout > 0 || act == NULL || strcmp(act, "off") != 0;
}

static void on_usr1(uv_signal_t *h, int signum);

int dl__diag_start(dl_agent_t *a)
{
    dl__diag_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return -ENOMEM;
    const char *act = a->spec->straggler_action;
    d->agent = a;
    d->action = act == NULL || strcmp(act, "warn") == 0 ? ACTION_WARN
                : strcmp(act, "exclude") == 0           ? ACTION_EXCLUDE
                                                        : ACTION_OFF;
    dl_diag_straggler_opts_init(&d->opts);
    d->opts.threshold = a->spec->straggler_threshold;
    d->opts.window = (uint64_t)a->spec->straggler_window;
    int r = dl_diag_judge_new(&d->opts, &d->judge);
    if (r < 0) {
        free(d);
        return r;
    }
    if (gethostname(d->host, sizeof(d->host) - 1) < 0)
        snprintf(d->host, sizeof(d->host), "localhost");
    a->diag = d;
    /* SIGUSR1 passed on to the workers is theirs (a checkpoint before preemption); the report
     * is then `dlaunch status --ranks`'s alone. */
    if (dl__agent_forwards(a, SIGUSR1))
        return 0;
    uv_signal_init(&a->loop, &d->usr1);
    d->usr1.data = a;
    d->usr1_open = true;
    r = uv_signal_start(&d->usr1, on_usr1, SIGUSR1);
    return r < 0 ? r : 0;
}

void dl__diag_close(dl_agent_t *a)
{
    dl__diag_t *d = a->diag;
    if (d != NULL && d->usr1_open) {
        uv_close((uv_handle_t *)&d->usr1, NULL);
        d->usr1_open = false;
    }
}

void dl__diag_free(dl_agent_t *a)
{
    dl__diag_t *d = a->diag;
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->nw; i++)
        dl_coll_rec_close(d->w[i].rec);
    free(d->w);
    free(d->announced);
    json_decref(d->failure_report);
    dl_diag_judge_free(d->judge);
    free(d);
    a->diag = NULL;
}

const char *dl__diag_text(const dl_agent_t *a)
{
    return a->diag != NULL ? a->diag->diagnosis : "";
}

/* ---- workers --------------------------------------------------------------------------------- */

static wdiag_t *wdiag(dl__diag_t *d, const dl__worker_t *w)
{
    int i = w->local_rank;
    if (i < 0)
        return NULL;
    if ((size_t)i >= d->nw) {
        /* All of the node's workers at once: growing by one copied the array per worker. */
        size_t n = (size_t)(i < d->agent->nworkers ? d->agent->nworkers : i + 1);
        wdiag_t *v = realloc(d->w, n * sizeof(*v));
        if (v == NULL)
            return NULL;
        memset(v + d->nw, 0, (n - d->nw) * sizeof(*v));
        d->w = v;
        d->nw = n;
    }
    return &d->w[i];
}

void dl__diag_worker_spawning(dl_agent_t *a, dl__worker_t *w)
{
    dl__diag_t *d = a->diag;
    dl_diag_beats_init(&w->beats);
    wdiag_t *x = d != NULL ? wdiag(d, w) : NULL;
    if (x == NULL)
        return;
    dl_coll_rec_close(x->rec);
    memset(x, 0, sizeof(*x));
    x->rank = w->rank;
    snprintf(x->path, sizeof(x->path), "%s/rank_%d.rec", a->attempt_dir, w->rank);
    /* A run id used before leaves its attempt folders: never show that run's operations. A
     * folder made for this attempt has none, nor this rank's from an earlier start in it. */
    bool first_here = a->made_dir != NULL && strcmp(a->made_dir, a->attempt_dir) == 0 &&
                      w->dir_serial != a->attempt_serial;
    w->dir_serial = a->attempt_serial;
    if (first_here)
        return;
    if (unlink(x->path) < 0 && errno != ENOENT && a->spec->verbose)
        dl__agent_log(a, "cannot remove the old flight recorder %s: %s", x->path, strerror(errno));
    char stacks[4300];
    snprintf(stacks, sizeof(stacks), "%s/rank_%d.stacks", a->attempt_dir, w->rank);
    if (unlink(stacks) < 0 && errno != ENOENT && a->spec->verbose)
        dl__agent_log(a, "cannot remove the old stacks file %s: %s", stacks, strerror(errno));
}

void dl__diag_beats(dl__worker_t *w, const char *data, size_t len, double now)
{
    dl_diag_beats_feed(&w->beats, data, len, now);
}

/* The state letter of pid in /proc, or 0. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    if (pid <= 0)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p != NULL && p[1] == ' ' ? p[2] : 0;
}

static dl_diag_op_state_t op_state(dl_coll_rec_state_t s)
{
    switch (s) {
    case DL_COLL_REC_QUEUED: return DL_DIAG_OP_QUEUED;
    case DL_COLL_REC_RUNNING: return DL_DIAG_OP_RUNNING;
    case DL_COLL_REC_DONE: return DL_DIAG_OP_DONE;
    case DL_COLL_REC_FAILED: return DL_DIAG_OP_FAILED;
    }
    return DL_DIAG_OP_NONE;
}

/* The rank could not reserve its recorder's file (a full disk) and keeps the ring in memory,
 * which is what the agent reads: said once on the console, and for every such file as a
 * log_write_failed event, like a log file that stops taking bytes. */
static void ring_in_memory(dl_agent_t *a, const dl__worker_t *w, const wdiag_t *x)
{
    int err = dl_coll_rec_file_error(x->rec);
    const char *why = strerror(err > 0 ? err : EIO);
    if (!a->diag->told_ring_in_memory)
        dl__agent_log(a,
                      "cannot write the flight recorder '%s': %s; rank %d keeps it in memory "
                      "(the agent still reads it, but it is not kept after the rank exits)",
                      x->path, why, w->rank);
    a->diag->told_ring_in_memory = true;
    dl_ev_log_write_failed(
        a->events, dl__now_unix(),
        &(dl_ev_log_write_failed_t){
            .rank = w->rank, .attempt = w->attempt, .path = x->path, .error = why});
}

/* What the agent knows of worker w now: out's strings point into static tables and x. */
static void snapshot(dl_agent_t *a, dl__worker_t *w, wdiag_t *x, double now, dl_diag_rank_t *out)
{
    memset(out, 0, sizeof(*out));
    out->rank = w->rank;
    out->node_rank = a->node_rank;
    out->host = a->diag->host;
    out->proc = proc_state(w->pid);
    out->silent_s = w->beats.last_beat > 0 ? now - w->beats.last_beat : -1;
    out->step = w->beats.step;
    if (x == NULL)
        return;
    /* A ring in memory is looked for again at each tick: a group formed again (in-job
     * recovery) keeps its ring in a memfd of its own, and the old one stays mapped here. Once
     * the rank is gone, the last one read is kept. */
    if ((x->rec == NULL || x->rec_in_memory) && x->path[0] != '\0') {
        dl_coll_rec_reader_t *rec = NULL;
        int r = dl_coll_rec_open_pid(x->path, (int)w->pid, &rec);
        if (r >= 0) {
            bool first = x->rec == NULL;
            dl_coll_rec_close(x->rec);
            x->rec = rec;
            x->rec_in_memory = r == 1;
            if (r == 1 && first)
                ring_in_memory(a, w, x);
        }
    }
    if (x->rec == NULL)
        return;
    dl_coll_rec_info_t info;
    dl_coll_rec_entry_t e[REPORT_OPS];
    size_t n = dl_coll_rec_read(x->rec, &info, e, REPORT_OPS);
    out->recorder = true;
    memcpy(x->transport, info.transport, sizeof(x->transport));
    if (n == 0)
        return;
    /* The recorder times large operations itself; for the others, the agent's first sight of
     * the newest one as it is now bounds how long it has been so. */
    const dl_coll_rec_entry_t *last = &e[n - 1];
    if (last->seq != x->seen_seq || (int)last->state != x->seen_state) {
        x->seen_seq = last->seq;
        x->seen_state = (int)last->state;
        x->seen_at = now;
    }
    for (size_t i = 0; i < n; i++) {
        dl_diag_op_t *op = &out->ops[out->nops++];
        double age = -1;
        if (e[i].state == DL_COLL_REC_RUNNING && e[i].start > 0)
            age = now - e[i].start;
        else if ((e[i].state == DL_COLL_REC_DONE || e[i].state == DL_COLL_REC_FAILED) &&
                 e[i].end > 0)
            age = now - e[i].end;
        else if (i == n - 1)
            age = now - x->seen_at;
        *op = (dl_diag_op_t){
            .seq = e[i].seq,
            .op = dl_coll_rec_op_name(e[i].op),
            .state = op_state(e[i].state),
            .bytes = e[i].bytes,
            .algo = dl_coll_rec_algo_name(e[i].algo),
            .transport = x->transport,
            .age_s = age < 0 ? -1 : age,
        };
    }
}

void dl__diag_snapshot(dl_agent_t *a, dl__worker_t *w, double now, dl_diag_rank_t *out)
{
    snapshot(a, w, a->diag != NULL ? wdiag(a->diag, w) : NULL, now, out);
}

/* Every worker of this node; returns how many went into v (nworkers at most). */
static size_t snapshot_all(dl_agent_t *a, double now, dl_diag_rank_t *v,
                           const dl_diag_beats_t **beats)
{
    size_t n = 0;
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        snapshot(a, w, wdiag(a->diag, w), now, &v[n]);
        beats[n] = &w->beats;
        n++;
    }
    return n;
}

/* The node's report of v[0..n) and their beats, as the wire has it: a new reference or NULL. */
static json_t *report_json(dl_agent_t *a, const dl_diag_rank_t *v, const dl_diag_beats_t **b,
                           size_t n)
{
    dl__diag_t *d = a->diag;
    dl_proto_node_report_t rep;
    if (dl_rdzv_report_fill(&rep, a->node_rank, d->host, v, b, n) < 0)
        return NULL;
    if (d->action != ACTION_OFF) {
        rep.threshold = d->opts.threshold;
        rep.window = (long long)d->opts.window;
        rep.has_threshold = rep.has_window = true;
    }
    json_t *o = dl_proto_rec_encode(&dl_proto_node_report_type, &rep);
    dl_proto_rec_free(&dl_proto_node_report_type, &rep);
    return o;
}

json_t *dl__diag_report(dl_agent_t *a)
{
    dl__diag_t *d = a->diag;
    if (d == NULL || a->nworkers <= 0)
        return NULL;
    dl_diag_rank_t *v = calloc((size_t)a->nworkers, sizeof(*v));
    const dl_diag_beats_t **b = calloc((size_t)a->nworkers, sizeof(*b));
    json_t *rep = NULL;
    if (v != NULL && b != NULL)
        rep = report_json(a, v, b, snapshot_all(a, mono_now(), v, b));
    free(v);
    free(b);
    return rep;
}

json_t *dl__diag_failure_report(dl_agent_t *a)
{
    dl__diag_t *d = a->diag;
    if (d != NULL && d->failure_report != NULL)
        return json_incref(d->failure_report);
    return dl__diag_report(a);
}

/* ---- the account of a hang or failure -------------------------------------------------------- */

static void print_ranks(dl_agent_t *a, const dl_diag_rank_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const dl_diag_rank_t *r = &v[i];
        char line[1024];
        int off = snprintf(line, sizeof(line), "  rank %d:", r->rank);
        if (r->step > 0)
            off += snprintf(line + off, sizeof(line) - (size_t)off, " step %llu,",
                            (unsigned long long)r->step);
        if (r->silent_s >= 0)
            off += snprintf(line + off, sizeof(line) - (size_t)off, " last beat %.1f s ago,",
                            r->silent_s);
        if (r->proc != 0)
            off += snprintf(line + off, sizeof(line) - (size_t)off, " process %c,", r->proc);
        if (!r->recorder)
            snprintf(line + off, sizeof(line) - (size_t)off, " no flight recorder");
        for (size_t k = r->nops; k-- > 0 && off < (int)sizeof(line);) {
            const dl_diag_op_t *op = &r->ops[k];
            off += snprintf(line + off, sizeof(line) - (size_t)off, " %s #%llu %s", op->op,
                            (unsigned long long)op->seq, dl_diag_op_state_name(op->state));
            if (op->age_s >= 0 && off < (int)sizeof(line))
                off += snprintf(line + off, sizeof(line) - (size_t)off, " %.1f s", op->age_s);
            if (k + 1 == r->nops && off < (int)sizeof(line))
                off += snprintf(line + off, sizeof(line) - (size_t)off, " (%llu bytes, %s%s%s)",
                                (unsigned long long)op->bytes, op->algo,
                                op->algo[0] ? " over " : "", op->transport);
            if (k > 0 && off < (int)sizeof(line))
                off += snprintf(line + off, sizeof(line) - (size_t)off, ";");
        }
        dl__agent_log(a, "%s", line);
    }
}

void dl__diag_explain(dl_agent_t *a, const char *why, bool keep)
{
    dl__diag_t *d = a->diag;
    if (d == NULL || a->nworkers <= 0)
        return;
    dl_diag_rank_t *v = calloc((size_t)a->nworkers, sizeof(*v));
    const dl_diag_beats_t **b = calloc((size_t)a->nworkers, sizeof(*b));
    if (v == NULL || b == NULL) {
        free(v);
        free(b);
        return;
    }
    size_t n = snapshot_all(a, mono_now(), v, b);
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any = any || v[i].recorder;
    /* Workers that do not use the collective library: nothing to say about a hang or failure
     * that the exit status does not say better (asked, the agent still shows the ranks). */
    if (!any && strcmp(why, "request") != 0) {
        free(v);
        free(b);
        return;
    }
    char line[1024];
    dl_diag_explain(v, n, line, sizeof(line));
    json_t *rep = report_json(a, v, b, n);
    if (keep) {
        snprintf(d->diagnosis, sizeof(d->diagnosis), "%s", line);
        json_decref(d->failure_report);
        d->failure_report = json_incref(rep);
    }
    dl__agent_log(a, "%s%s", a->remote ? "on this node: " : "", line);
    if (strcmp(why, "request") == 0) {
        print_ranks(a, v, n);
        for (int i = 0; i < a->nworkers; i++) {
            char st[512];
            if (dl__stacks_read(a, &a->workers[i], 3, st, sizeof(st)) == 0)
                dl__agent_log(a, "  rank %d's Python stack, innermost first: %s",
                              a->workers[i].rank, st);
        }
    }
    dl_ev_ranks(a->events, dl__now_unix(),
                &(dl_ev_ranks_t){.reason = why,
                                 .diagnosis = line,
                                 .ranks = json_incref(json_object_get(rep, "ranks"))});
    json_decref(rep);
    free(v);
    free(b);
}

void dl__diag_append(dl_agent_t *a, const char *text)
{
    dl__diag_t *d = a->diag;
    size_t n = d != NULL ? strlen(d->diagnosis) : 0;
    if (d != NULL && n > 0)
        snprintf(d->diagnosis + n, sizeof(d->diagnosis) - n, "%s", text);
}

int dl__diag_culprits(dl_agent_t *a, bool *culprit)
{
    dl__diag_t *d = a->diag;
    int found = 0;
    if (d == NULL || a->nworkers <= 0)
        return 0;
    dl_diag_rank_t *v = calloc((size_t)a->nworkers, sizeof(*v));
    const dl_diag_beats_t **b = calloc((size_t)a->nworkers, sizeof(*b));
    if (v == NULL || b == NULL) {
        free(v);
        free(b);
        return 0;
    }
    size_t n = snapshot_all(a, mono_now(), v, b);
    /* The operation the job waits in: the newest one some rank is inside. */
    uint64_t waited = 0;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_rank_t *r = &v[i];
        if (r->nops > 0 && r->ops[r->nops - 1].state == DL_DIAG_OP_RUNNING &&
            r->ops[r->nops - 1].seq > waited)
            waited = r->ops[r->nops - 1].seq;
    }
    for (size_t i = 0; i < n; i++) {
        const dl_diag_rank_t *r = &v[i];
        uint64_t newest = r->nops > 0 ? r->ops[r->nops - 1].seq : 0;
        bool behind = waited > 0 && r->recorder && newest < waited;
        if (behind || r->proc == 'T' || r->proc == 't') {
            culprit[i] = true;
            found++;
        }
    }
    free(v);
    free(b);
    return found;
}

static void on_usr1(uv_signal_t *h, int signum)
{
    (void)signum;
    dl_agent_t *a = h->data;
    dl__agent_log(a, "SIGUSR1: where this node's ranks are");
    dl__diag_explain(a, "request", false);
}

void dl__diag_attempt(dl_agent_t *a)
{
    dl__diag_t *d = a->diag;
    if (d == NULL)
        return;
    d->diagnosis[0] = '\0';
    json_decref(d->failure_report);
    d->failure_report = NULL;
    d->nannounced = 0;
    dl_diag_judge_reset(d->judge);
}

/* ---- stragglers ------------------------------------------------------------------------------ */

static bool announced(dl__diag_t *d, int rank)
{
    for (size_t i = 0; i < d->nannounced; i++)
        if (d->announced[i] == rank)
            return true;
    return false;
}

static void announce(dl_agent_t *a, const dl_diag_straggler_t *s, const char *action)
{
    dl__diag_t *d = a->diag;
    if (announced(d, s->rank))
        return;
    if (d->nannounced == d->announced_cap) {
        size_t cap = d->announced_cap ? 2 * d->announced_cap : 8;
        int *v = realloc(d->announced, cap * sizeof(*v));
        if (v == NULL)
            return;
        d->announced = v;
        d->announced_cap = cap;
    }
    d->announced[d->nannounced++] = s->rank;
    char line[512];
    dl_diag_straggler_text(s, line, sizeof(line));
    dl__agent_log(a, "straggler: %s", line);
    dl_ev_straggler(a->events, dl__now_unix(),
                    &(dl_ev_straggler_t){.rank = s->rank,
                                         .node_rank = s->node_rank,
                                         .host = s->host,
                                         .compute_ms = s->compute_ms,
                                         .median_ms = s->median_ms,
                                         .slower_pct = dl_diag_round(s->slower * 1000) / 10,
                                         .steps = (long long)s->steps,
                                         .cost_samples_per_s = dl_diag_round(s->cost),
                                         .action = action});
}

static void forget(dl__diag_t *d, int rank)
{
    for (size_t i = 0; i < d->nannounced; i++)
        if (d->announced[i] == rank) {
            d->announced[i] = d->announced[--d->nannounced];
            return;
        }
}

void dl__diag_tick(dl_agent_t *a, double now)
{
    dl__diag_t *d = a->diag;
    if (d == NULL || a->nworkers <= 0)
        return;
    /* Keeps each worker's "seen since" current for untimed operations. */
    dl_diag_rank_t r;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].pid > 0)
            snapshot(a, &a->workers[i], wdiag(d, &a->workers[i]), now, &r);
    if (a->remote || d->action == ACTION_OFF)
        return; /* several nodes: the rendezvous runs the rule over all of them */
    dl_diag_totals_t *t = calloc((size_t)a->nworkers, sizeof(*t));
    size_t n = 0;
    if (t == NULL)
        return;
    for (int i = 0; i < a->nworkers; i++) {
        const dl__worker_t *w = &a->workers[i];
        if (w->pid <= 0 || !w->beats.figures)
            continue;
        t[n++] = (dl_diag_totals_t){.rank = w->rank,
                                    .node_rank = a->node_rank,
                                    .host = d->host,
                                    .steps = w->beats.total_steps,
                                    .compute_ms = w->beats.total_compute_ms,
                                    .wait_ms = w->beats.total_wait_ms,
                                    .samples = w->beats.total_samples};
    }
    dl_diag_view_t v;
    int rc = n == 0 ? -ENODATA : dl_diag_judge_feed(d->judge, t, n);
    free(t);
    if (rc < 0 || dl_diag_judge_eval(d->judge, &v) < 0)
        return;
    for (size_t i = 0; i < v.nstragglers; i++)
        announce(a, &v.stragglers[i], "warn");
    for (size_t i = 0; i < v.ncleared; i++) {
        dl__agent_log(a, "rank %d is no longer a straggler", v.cleared[i]);
        forget(d, v.cleared[i]);
    }
}

bool dl__diag_excluded(dl_agent_t *a, double *ret_wait)
{
    dl__diag_t *d = a->diag;
    if (d == NULL || d->excluded_until <= 0)
        return false;
    double left = d->excluded_until - mono_now();
    if (left <= 0) {
        d->excluded_until = 0;
        return false;
    }
    *ret_wait = left;
    return true;
}

void dl__diag_on_view(dl_agent_t *a, const json_t *view)
{
    dl__diag_t *d = a->diag;
    dl_proto_status_diag_t v;
    char err[256];
    if (d == NULL || d->action == ACTION_OFF)
        return;
    if (dl_proto_rec_decode(&dl_proto_status_diag_type, view, &v, "view", err, sizeof(err)) < 0) {
        dl__agent_log(a, "the rendezvous' view of the job is not readable: %s", err);
        return;
    }
    /* The slowest straggler's node steps out, if the job can do without it: one node at most,
     * and every agent sees the same list. */
    const dl_proto_status_straggler_t *worst = NULL;
    for (size_t i = 0; i < v.nstragglers; i++)
        if (worst == NULL || v.stragglers[i].compute_ms > worst->compute_ms)
            worst = &v.stragglers[i];
    bool can_exclude = d->action == ACTION_EXCLUDE && a->nnodes - 1 >= a->spec->nodes_min &&
                       dl_rdzv_policy_restart_left(a->sup.attempt, a->spec->max_restarts) &&
                       d->excluded_until <= 0 && a->sup.stop == DL_SUP_STOP_NONE;
    for (size_t i = 0; i < v.nstragglers; i++) {
        const dl_proto_status_straggler_t *s = &v.stragglers[i];
        dl_diag_straggler_t x = {
            .rank = (int)s->rank,
            .node_rank = (int)s->node_rank,
            .compute_ms = s->compute_ms,
            .median_ms = s->median_ms,
            .slower = s->slower_pct / 100.0,
            .steps = (uint64_t)s->steps,
            .cost = s->cost_samples_per_s,
        };
        snprintf(x.host, sizeof(x.host), "%s", s->host ?: "?");
        bool mine = x.node_rank == a->node_rank && s == worst && can_exclude;
        if (announced(d, x.rank))
            continue;
        announce(a, &x,
                 d->action == ACTION_EXCLUDE && s == worst && can_exclude ? "exclude" : "warn");
        if (!mine)
            continue;
        char reason[700], line[512], cooldown[32];
        dl_diag_straggler_text(&x, line, sizeof(line));
        dl_opt_num_text(a->spec->straggler_cooldown, cooldown, sizeof(cooldown));
        snprintf(reason, sizeof(reason),
                 "straggler: %s; node %d leaves the job for %s s (--straggler-action exclude)",
                 line, a->node_rank, cooldown);
        dl__agent_log(a, "excluding this node from the job for %s s: it is the slowest", cooldown);
        d->excluded_until = mono_now() + a->spec->straggler_cooldown;
        dl__rdzv_exclude(a, x.rank, reason);
    }
    dl_proto_rec_free(&dl_proto_status_diag_type, &v);
}
