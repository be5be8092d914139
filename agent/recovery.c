/* In-job recovery, the agent's side (docs/recovery.md): each worker gets a control channel
 * (DLAUNCH_CONTROL_FD, a socket pair) beside its health pipe. A worker that speaks the protocol
 * says `hello` on it; when one of them fails, the supervisor keeps the others running, this file
 * starts a replacement for that rank alone and tells the others `recover` (the group broke; form
 * it again as generation G with this membership); each worker answers `recovered` once it
 * trains again, and the recovery is over when all of them have. A failure while a recovery is
 * under way, a worker's `failed`, or no answer in time falls back to a restart of the job from
 * its last checkpoint: every worker gets `stop` and the supervisor's usual stop. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "ownfile.h"
#include "rdzv-policy.h"
#include "recline.h"
#include "spawn.h"
#include "summary.h"

/* How long the workers have to form the group again and take the state, before the agent
 * gives up on the recovery and restarts the job: past the collective's default timeout (30 s),
 * which bounds each of their waits. */
#define RECOVERY_TIMEOUT_MS 60000

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool dl__rec_in_job(const dl_agent_t *a)
{
    return a->spec->recovery != NULL && strcmp(a->spec->recovery, "in-job") == 0;
}

/* ---- the channel ----------------------------------------------------------------------------- */

static void poll_closed(uv_handle_t *h)
{
    free(h);
}

static void channel_close(dl__worker_t *w)
{
    if (w->ctl_poll != NULL) {
        uv_poll_stop(w->ctl_poll);
        uv_close((uv_handle_t *)w->ctl_poll, poll_closed);
        w->ctl_poll = NULL;
    }
    if (w->ctl_fd >= 0)
        close(w->ctl_fd);
    w->ctl_fd = -1;
    w->ctl_len = 0;
}

/* One line to a worker; a full socket (a worker that reads nothing) drops it. */
static void tell(dl__worker_t *w, const char *line)
{
    if (w->ctl_fd < 0)
        return;
    size_t n = strlen(line);
    ssize_t r = send(w->ctl_fd, line, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)r;
}

static void recovery_done(dl_agent_t *a);
static void recovery_failed(dl_agent_t *a, const char *why);

/* How long an agent whose workers' group broke waits for the rendezvous to hear why from the
 * node that knows, before it reports the breakage itself. */
#define BROKEN_GRACE_MS 150

static void on_broken(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    if (a->recovering || a->sup.phase != DL_SUP_RUNNING || a->sup.stop != DL_SUP_STOP_NONE)
        return;
    dl__agent_log(a, "%s; nobody said why within %d ms: reporting it", a->broken_reason,
                  BROKEN_GRACE_MS);
    snprintf(a->report_reason, sizeof(a->report_reason), "%.390s", a->broken_reason);
    if (a->nworkers > 0)
        a->sup.first_failure = (dl_sup_failure_t){.rank = a->workers[0].rank,
                                                  .attempt = a->sup.attempt,
                                                  .exit_code = 1,
                                                  .time = dl__now_unix()};
    dl__rdzv_report(a);
}

static void on_line(dl_agent_t *a, dl__worker_t *w, const char *line)
{
    dl_recline_t m;
    switch (dl_recline_parse(line, &m)) {
    case DL_RECLINE_HELLO:
        w->ctl_hello = true;
        dl__spares_fill(a);
        return;
    case DL_RECLINE_RECOVERED:
        if (m.gen != a->gen || !a->recovering)
            return;
        w->ctl_gen = m.gen;
        if (m.has_step)
            a->rec_step = m.step;
        if (m.has_source)
            a->rec_source = m.source;
        if (m.has_was && m.was > a->rec_was)
            a->rec_was = m.was;
        for (int i = 0; i < a->nworkers; i++)
            if (a->workers[i].pid > 0 && a->workers[i].ctl_gen != a->gen)
                return;
        recovery_done(a);
        return;
    case DL_RECLINE_BROKEN:
        /* Over several nodes: a worker's group broke and the rendezvous may not know why yet
         * (a node died with its agent): tell it after a moment, unless the node that knows
         * does first (its round change cancels this). */
        if (!a->remote || a->recovering || m.gen != a->gen || a->sup.phase != DL_SUP_RUNNING ||
            uv_is_active((uv_handle_t *)&a->broken_timer))
            return;
        snprintf(a->broken_reason, sizeof(a->broken_reason), "the group of rank %d broke: %.300s",
                 w->rank, m.has_reason ? m.reason : "?");
        uv_timer_start(&a->broken_timer, on_broken, BROKEN_GRACE_MS, 0);
        return;
    case DL_RECLINE_FAILED: {
        if (m.gen != a->gen || !a->recovering)
            return;
        char why[600];
        snprintf(why, sizeof(why), "rank %d: %s", w->rank,
                 m.has_reason ? m.reason : "it could not form the group again");
        recovery_failed(a, why);
        return;
    }
    case DL_RECLINE_OTHER: return;
    }
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    dl__worker_t *w = h->data;
    dl_agent_t *a = w->agent;
    (void)events;
    if (status < 0) {
        channel_close(w);
        return;
    }
    for (;;) {
        ssize_t n = recv(w->ctl_fd, w->ctl_buf + w->ctl_len, sizeof(w->ctl_buf) - 1 - w->ctl_len,
                         MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            /* The worker closed it, or is gone: nothing more will come. */
            channel_close(w);
            return;
        }
        w->ctl_len += (size_t)n;
        w->ctl_buf[w->ctl_len] = '\0';
        char *line = w->ctl_buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            on_line(a, w, line);
            if (w->ctl_fd < 0)
                return;
            line = nl + 1;
        }
        w->ctl_len -= (size_t)(line - w->ctl_buf);
        memmove(w->ctl_buf, line, w->ctl_len);
        if (w->ctl_len == sizeof(w->ctl_buf) - 1)
            w->ctl_len = 0; /* no line of ours is this long */
    }
}

int dl__rec_channel_open(dl_agent_t *a, dl__worker_t *w, int *ret_child_fd)
{
    int sv[2];
    *ret_child_fd = -1;
    w->ctl_hello = false;
    w->ctl_gen = -1;
    if (!dl__rec_in_job(a))
        return 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    int fl = fcntl(sv[0], F_GETFL);
    if (fl >= 0)
        fcntl(sv[0], F_SETFL, fl | O_NONBLOCK);
    w->ctl_poll = malloc(sizeof(*w->ctl_poll));
    if (w->ctl_poll == NULL || uv_poll_init(&a->loop, w->ctl_poll, sv[0]) < 0) {
        free(w->ctl_poll);
        w->ctl_poll = NULL;
        close(sv[0]);
        close(sv[1]);
        return -ENOMEM;
    }
    w->ctl_poll->data = w;
    uv_poll_start(w->ctl_poll, UV_READABLE, on_readable);
    w->ctl_fd = sv[0];
    w->ctl_len = 0;
    *ret_child_fd = sv[1];
    return 0;
}

void dl__rec_channel_close(dl__worker_t *w)
{
    channel_close(w);
}

bool dl__rec_recoverable(const dl_agent_t *a, const dl__worker_t *failed)
{
    if (!dl__rec_in_job(a) || a->world_size < 2)
        return false;
    /* Every worker must speak the protocol: the one that failed (its replacement will) and
     * every one that lives on. */
    if (!failed->ctl_hello)
        return false;
    for (int i = 0; i < a->nworkers; i++) {
        const dl__worker_t *w = &a->workers[i];
        if (w != failed && w->pid > 0 && !w->ctl_hello)
            return false;
    }
    return true;
}

json_t *dl__rec_status(const dl_agent_t *a)
{
    if (!dl__rec_in_job(a))
        return NULL;
    json_t *o =
        json_pack("{s:i, s:b}", "recoveries", a->sup.recoveries, "recovering", a->recovering);
    if (o != NULL && a->rec_last_step >= 0 && a->sup.recoveries > 0) {
        json_object_set_new(o, "step", json_integer(a->rec_last_step));
        json_object_set_new(o, "duration_ms", json_real(a->rec_last_ms));
    }
    return o;
}

bool dl__rec_keepable(const dl_agent_t *a)
{
    if (!dl__rec_in_job(a) || !a->remote || a->sup.phase != DL_SUP_RUNNING)
        return false;
    for (int i = 0; i < a->nworkers; i++) {
        const dl__worker_t *w = &a->workers[i];
        if (w->pid > 0 && !w->ctl_hello)
            return false;
    }
    return true;
}

/* ---- a recovery ------------------------------------------------------------------------------ */

/* A failure in the recovery event's terms: {rank, attempt, hung, exit_code | signal}. */
static json_t *failure_reason(const dl_sup_failure_t *f, int attempt)
{
    return dl_ev_failure_json(
        &(dl_ev_failure_t){.rank = f->rank,
                           .attempt = attempt,
                           .hung = f->hung,
                           .signal = f->signal > 0 ? dl_signal_name(f->signal) : NULL,
                           .exit_code = f->exit_code,
                           .has_exit_code = f->signal <= 0});
}

/* The recovery event's fields every status has. */
static dl_ev_recovery_t recovery_event(dl_agent_t *a, const char *status)
{
    dl_ev_recovery_t e = {.status = status,
                          .attempt = a->sup.attempt,
                          .recovery = a->sup.recoveries,
                          .max_restarts = a->spec->max_restarts};
    if (a->remote) {
        /* Over several nodes each is a round change: its reason, and what this node replaced. */
        e.round = a->round;
        e.has_round = true;
        e.reason = json_string(a->rec_reason);
        e.replaced = a->rec_replaced;
        e.replaced_count = a->nrec_replaced;
        return e;
    }
    e.generation = a->gen;
    e.has_generation = true;
    e.replaced = &a->rec_rank;
    e.replaced_count = 1;
    e.reason = failure_reason(&a->rec_failure, a->rec_failure.attempt);
    return e;
}

/* A recovery that failed: why, and what the job falls back on. */
static void emit_failed(dl_agent_t *a, const char *why, const char *fallback)
{
    dl_ev_recovery_t e = recovery_event(a, "failed");
    e.error = why;
    e.fallback = fallback;
    dl_ev_recovery(a->events, dl__now_unix(), &e);
}

static void on_timeout(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    char why[128];
    snprintf(why, sizeof(why), "the workers did not all train again within %d s",
             RECOVERY_TIMEOUT_MS / 1000);
    recovery_failed(a, why);
}

static void recovery_done(dl_agent_t *a)
{
    double ms = (mono() - a->rec_started) * 1e3;
    a->rec_last_step = a->rec_step;
    a->rec_last_ms = dl_diag_round(ms * 10) / 10;
    uv_timer_stop(&a->rec_timer);
    a->rec_timer_armed = false;
    a->recovering = false;
    /* Waiting for the group to form is no hang: everyone's silence starts now. */
    double now = mono();
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].beating)
            a->workers[i].last_beat = now;
    if (a->remote)
        dl__agent_log(a,
                      "in-job recovery %d: this node's ranks train again at step %lld, %.0f ms "
                      "after the round changed (the state from the living ranks, rank %d's "
                      "first; no checkpoint read)",
                      a->sup.recoveries, a->rec_step, ms, a->rec_source);
    else
        dl__agent_log(a,
                      "in-job recovery %d: training again at step %lld, %.0f ms after rank %d "
                      "failed (its state from rank %d's replica; no checkpoint read)",
                      a->sup.recoveries, a->rec_step, ms, a->rec_rank, a->rec_source);
    dl_ev_recovery_t e = recovery_event(a, "done");
    e.step = a->rec_step;
    e.has_step = true;
    /* Steps some rank had completed and does again: at most the one that was in progress. */
    e.steps_redone = a->rec_was > a->rec_step ? a->rec_was - a->rec_step : 0;
    e.has_steps_redone = true;
    e.source = "replica";
    e.source_rank = a->rec_source;
    e.has_source_rank = true;
    e.duration_ms = dl_diag_round(ms * 10) / 10;
    e.has_duration_ms = true;
    dl_ev_recovery(a->events, dl__now_unix(), &e);
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_RECOVERED});
    dl__spares_fill(a); /* behind the one that took a place, if one did */
}

/* What a recovery that fails falls back on: the job's budget (rdzv-policy.h), or the
 * rendezvous's when it keeps it (remote). */
static int restarts_left(const dl_agent_t *a, bool rendezvous_decides)
{
    return dl_rdzv_policy_recovery_restarts_left(dl_sup_restarts_used(&a->sup),
                                                 a->spec->max_restarts, rendezvous_decides);
}

/* Said plainly, then the supervisor stops the attempt and restarts from the last checkpoint. */
static void recovery_failed(dl_agent_t *a, const char *why)
{
    if (!a->recovering)
        return;
    if (a->remote) {
        /* The rendezvous decides: the report says it plainly, every node restarts. */
        dl__agent_log(a,
                      "in-job recovery %d failed: %s; reporting it: the job restarts from "
                      "its last checkpoint if a restart is left",
                      a->sup.recoveries, why);
        emit_failed(a, why, "restart");
        snprintf(a->report_reason, sizeof(a->report_reason), "in-job recovery failed: %.300s", why);
        if (a->nworkers > 0)
            a->sup.first_failure = (dl_sup_failure_t){.rank = a->workers[0].rank,
                                                      .attempt = a->sup.attempt,
                                                      .exit_code = 1,
                                                      .time = dl__now_unix()};
        dl__rec_off(a);
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_RECOVERY_FAILED});
        return;
    }
    bool left = restarts_left(a, false) > 0;
    dl__agent_log(a, "in-job recovery %d failed: %s; %s", a->sup.recoveries, why,
                  left ? "falling back to a restart of the job from its last checkpoint"
                       : "no restart left: the job fails");
    emit_failed(a, why, left ? "restart" : "none");
    dl__rec_off(a);
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_RECOVERY_FAILED});
}

void dl__rec_off(dl_agent_t *a)
{
    if (!a->recovering && !a->rec_timer_armed)
        return;
    uv_timer_stop(&a->rec_timer);
    a->rec_timer_armed = false;
    a->recovering = false;
    for (int i = 0; i < a->nworkers; i++)
        tell(&a->workers[i], "stop\n");
}

void dl__rec_job_failed(dl_agent_t *a)
{
    dl__rec_off(a);
    for (int i = 0; i < a->nworkers; i++)
        tell(&a->workers[i], "stop\n");
}

/* A second failure while a recovery was under way: the supervisor already falls back. */
void dl__rec_interrupted(dl_agent_t *a, const dl_sup_failure_t *f)
{
    if (!a->recovering)
        return;
    char why[200];
    snprintf(why, sizeof(why), "rank %d %s during it", f->rank,
             f->hung         ? "hung"
             : f->signal > 0 ? "was killed"
                             : "exited");
    if (a->remote && a->sup.awaiting)
        return; /* not yet told anything: the slot is refilled with the others' */
    bool left = restarts_left(a, a->remote) > 0;
    dl__agent_log(a, "in-job recovery %d failed: %s; %s", a->sup.recoveries, why,
                  left ? "falling back to a restart of the job from its last checkpoint"
                       : "no restart left: the job fails");
    emit_failed(a, why, left ? "restart" : "none");
    dl__rec_off(a);
}

int dl__rec_start(dl_agent_t *a, int rank, int attempt)
{
    dl__worker_t *w = NULL;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].rank == rank)
            w = &a->workers[i];
    if (w == NULL)
        return -ENOENT;
    a->gen++;
    a->recovering = true;
    a->rec_rank = rank;
    a->rec_failure = a->sup.first_failure;
    a->rec_started = mono();
    a->rec_step = -1;
    a->rec_was = -1;
    a->rec_source = -1;
    int left = restarts_left(a, false);
    char others[256] = "";
    size_t off = 0;
    for (int i = 0; i < a->nworkers && off < sizeof(others); i++)
        if (a->workers[i].pid > 0)
            off += (size_t)snprintf(others + off, sizeof(others) - off, "%s%d", off ? "," : "",
                                    a->workers[i].rank);
    dl__agent_log(a,
                  "in-job recovery %d (%d restart%s left): a replacement for rank %d joins "
                  "rank%s %s, which keep training state",
                  a->sup.recoveries, left, left == 1 ? "" : "s", rank,
                  strchr(others, ',') ? "s" : "", others);
    dl_ev_recovery_t started = recovery_event(a, "started");
    dl_ev_recovery(a->events, dl__now_unix(), &started);
    /* The others first: they abort the broken group at once, the replacement takes longer. */
    char reason[200];
    const dl_sup_failure_t *f = &a->rec_failure;
    if (f->hung)
        snprintf(reason, sizeof(reason), "rank %d hung", f->rank);
    else if (f->signal > 0)
        snprintf(reason, sizeof(reason), "rank %d was killed by %s", f->rank,
                 dl_signal_name(f->signal));
    else
        snprintf(reason, sizeof(reason), "rank %d exited with code %d", f->rank, f->exit_code);
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *o = &a->workers[i];
        if (o == w || o->pid <= 0)
            continue;
        char line[1024];
        snprintf(line, sizeof(line),
                 "recover gen=%d rank=%d world=%d local_rank=%d local_world=%d store=%s "
                 "master_addr=%s master_port=%d replaced=%d reason=%s\n",
                 a->gen, o->rank, a->world_size, o->local_rank, a->nworkers,
                 a->store_addr[0] != '\0' ? a->store_addr : "-", a->master_addr, a->master_port,
                 rank, reason);
        tell(o, line);
    }
    uv_timer_start(&a->rec_timer, on_timeout, RECOVERY_TIMEOUT_MS, 0);
    a->rec_timer_armed = true;
    return dl__agent_respawn(a, w, attempt, dl_sup_restarts_used(&a->sup));
}

void dl__rec_keep(dl_agent_t *a)
{
    uv_timer_stop(&a->broken_timer);
    a->nrec_replaced = 0;
    /* The workers get the gist: the reason's first words. */
    snprintf(a->rec_reason_short, sizeof(a->rec_reason_short), "%.200s", a->rec_reason);
    for (char *p = a->rec_reason_short; *p != '\0'; p++)
        if (*p == '\n')
            *p = ' ';
    a->recovering = true;
    a->rec_rank = -1;
    a->rec_started = mono();
    a->rec_step = -1;
    a->rec_was = -1;
    a->rec_source = -1;
    int alive = 0;
    for (int i = 0; i < a->nworkers; i++)
        alive += a->workers[i].pid > 0;
    dl__agent_log(a,
                  "in-job recovery %d: %d of this node's %d workers stay; joining the next "
                  "round",
                  a->sup.recoveries, alive, a->nworkers);
    dl_ev_recovery_t started = recovery_event(a, "started");
    dl_ev_recovery(a->events, dl__now_unix(), &started);
}

void dl__rec_resume(dl_agent_t *a, int attempt)
{
    char dir[sizeof(a->attempt_dir)];
    int r;
    a->gen = a->round;
    /* Replacements log into this round's attempt folder; kept workers go on in theirs. */
    snprintf(dir, sizeof(dir), "%s", a->attempt_dir);
    snprintf(a->attempt_dir, sizeof(a->attempt_dir), "%s/attempt_%d", a->run_dir_abs, attempt);
    if (mkdir(a->attempt_dir, 0750) < 0 && errno != EEXIST)
        dl__agent_log(a, "cannot create the log folder '%s': %s", a->attempt_dir, strerror(errno));
    else if ((r = dl_ownfile_check_dir(a->attempt_dir)) < 0)
        dl__agent_log(a, "the log folder '%s' is not safe to write: %s", a->attempt_dir,
                      dl_ownfile_strerror(r));
    bool kept = false;
    for (int i = 0; i < a->nworkers; i++)
        kept |= a->workers[i].pid > 0;
    /* The same fields as any round's (agent.c, start_attempt); kept: some worker lives on. */
    dl__agent_rendezvous_event(a, a->round, true, kept);
    char replaced[256] = "";
    size_t off = 0;
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid > 0) {
            char line[1024];
            snprintf(line, sizeof(line),
                     "recover gen=%d rank=%d world=%d local_rank=%d local_world=%d store=%s "
                     "master_addr=%s master_port=%d reason=%s\n",
                     a->gen, w->rank, a->world_size, w->local_rank, a->nworkers,
                     a->store_addr[0] != '\0' ? a->store_addr : "-", a->master_addr, a->master_port,
                     a->rec_reason_short);
            tell(w, line);
            continue;
        }
        off += (size_t)snprintf(replaced + off, sizeof(replaced) - off, "%s%d", off ? "," : "",
                                w->rank);
        a->rec_rank = w->rank;
        if (a->nrec_replaced < (int)(sizeof(a->rec_replaced) / sizeof(a->rec_replaced[0])))
            a->rec_replaced[a->nrec_replaced++] = w->rank;
        dl__agent_respawn(a, w, attempt, dl__agent_restart_count(a, attempt));
    }
    dl__agent_log(
        a, "round %d: ranks %d..%d of %d; %s%s", a->round, a->nworkers > 0 ? a->workers[0].rank : 0,
        a->nworkers > 0 ? a->workers[a->nworkers - 1].rank : -1, a->world_size,
        replaced[0] ? "replacements join for ranks " : "every worker of this node kept", replaced);
    (void)dir;
    uv_timer_start(&a->rec_timer, on_timeout, RECOVERY_TIMEOUT_MS, 0);
    a->rec_timer_armed = true;
}

void dl__rec_unspoken(dl_agent_t *a, const dl__worker_t *failed, const dl_sup_failure_t *f)
{
    /* Only where in-job recovery would otherwise have been tried (dl__rec_recoverable). */
    if (!dl__rec_in_job(a) || a->world_size < 2 || a->recovering || a->sup.succeeded > 0 ||
        a->sup.stop != DL_SUP_STOP_NONE || (a->remote && a->sup.awaiting))
        return;
    const dl__worker_t *silent = failed->ctl_hello ? NULL : failed;
    for (int i = 0; i < a->nworkers && silent == NULL; i++)
        if (a->workers[i].pid > 0 && !a->workers[i].ctl_hello)
            silent = &a->workers[i];
    if (silent == NULL)
        return;
    char why[200];
    snprintf(why, sizeof(why),
             "rank %d never said hello on its control channel (it does not "
             "speak the recovery protocol)",
             silent->rank);
    bool left = restarts_left(a, a->remote) > 0;
    dl__agent_log(a, "in-job recovery impossible: %s; %s", why,
                  left ? "falling back to a restart of the job from its last checkpoint"
                       : "no restart left: the job fails");
    /* The event of a recovery that never started: none counted, nobody replaced. */
    dl_ev_recovery_t e = {.status = "failed",
                          .attempt = a->sup.attempt,
                          .recovery = a->sup.recoveries,
                          .max_restarts = a->spec->max_restarts,
                          .error = why,
                          .fallback = left ? "restart" : "none"};
    if (a->remote) {
        /* No round change yet to quote: the failure in words, as the report will give it. */
        char text[200];
        if (f->hung)
            snprintf(text, sizeof(text), "rank %d hung", f->rank);
        else if (f->signal > 0)
            snprintf(text, sizeof(text), "rank %d was killed by %s", f->rank,
                     dl_signal_name(f->signal));
        else
            snprintf(text, sizeof(text), "rank %d exited with code %d", f->rank, f->exit_code);
        e.reason = json_string(text);
        e.round = a->round;
        e.has_round = true;
    } else {
        e.reason = failure_reason(f, a->sup.attempt);
        e.generation = a->gen;
        e.has_generation = true;
    }
    dl_ev_recovery(a->events, dl__now_unix(), &e);
}

void dl__rec_init(dl_agent_t *a)
{
    uv_timer_init(&a->loop, &a->rec_timer);
    a->rec_timer.data = a;
    uv_timer_init(&a->loop, &a->broken_timer);
    a->broken_timer.data = a;
}

void dl__rec_close(dl_agent_t *a)
{
    uv_close((uv_handle_t *)&a->rec_timer, NULL);
    uv_close((uv_handle_t *)&a->broken_timer, NULL);
    for (int i = 0; i < a->nworkers; i++)
        channel_close(&a->workers[i]);
}
