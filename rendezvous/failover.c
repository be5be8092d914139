/* The agent's way back to its rendezvous (rdzv-failover.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rdzv-failover.h"

static dl_rdzv_fo_action_t *act(dl_rdzv_fo_actions_t *out, dl_rdzv_fo_action_kind_t kind)
{
    /* No step emits more than a handful: running out would be a bug here, not bad input. */
    if (out->n >= DL_RDZV_FO_ACTIONS_MAX)
        out->n = DL_RDZV_FO_ACTIONS_MAX - 1;
    dl_rdzv_fo_action_t *a = &out->v[out->n++];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->node_rank = -1;
    return a;
}

static void text(dl_rdzv_fo_actions_t *out, dl_rdzv_fo_action_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void text(dl_rdzv_fo_actions_t *out, dl_rdzv_fo_action_kind_t kind, const char *fmt, ...)
{
    dl_rdzv_fo_action_t *a = act(out, kind);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->text, sizeof(a->text), fmt, ap);
    va_end(ap);
}

static void copy(char *dst, const char *src)
{
    snprintf(dst, DL_RDZV_FO_ADDR_MAX, "%s", src != NULL ? src : "");
}

static void end(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out, int code, const char *status)
{
    (void)fo;
    dl_rdzv_fo_action_t *a = act(out, DL_RDZV_FO_END);
    a->code = code;
    a->status = status;
}

static void timer_start(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out, dl_rdzv_fo_timer_t t,
                        unsigned ms)
{
    fo->timer_armed[t] = true;
    dl_rdzv_fo_action_t *a = act(out, DL_RDZV_FO_TIMER_START);
    a->timer = t;
    a->ms = ms;
}

static void timer_stop(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out, dl_rdzv_fo_timer_t t)
{
    fo->timer_armed[t] = false;
    act(out, DL_RDZV_FO_TIMER_STOP)->timer = t;
}

void dl_rdzv_failover_init(dl_rdzv_failover_t *fo, const dl_rdzv_fo_opts_t *opts)
{
    memset(fo, 0, sizeof(*fo));
    fo->o = *opts;
    copy(fo->host, opts->host);
    fo->host_node_rank = -1;
    fo->connect_status = "timed_out";
}

const char *dl_rdzv_failover_host(const dl_rdzv_failover_t *fo)
{
    return fo->host;
}

bool dl_rdzv_failover_ready(const dl_rdzv_failover_t *fo)
{
    return fo->conn == DL_RDZV_FO_READY;
}

int dl_rdzv_failover_extra_failures(const dl_rdzv_failover_t *fo)
{
    return fo->host_lost ? 1 : 0;
}

void dl_rdzv_failover_set_my_addr(dl_rdzv_failover_t *fo, const char *addr)
{
    copy(fo->my_addr, addr);
}

bool dl_rdzv_failover_name_wait(dl_rdzv_failover_t *fo, double now, bool *first)
{
    *first = fo->unresolved_since == 0;
    if (*first)
        fo->unresolved_since = now;
    return now - fo->unresolved_since < fo->o.join_timeout;
}

/* ---- Connecting ------------------------------------------------------------------------------
 * While failing over, the candidate in turn: at our own address we host it ourselves first;
 * where it was, a refusal says nobody serves there any more (no wait); a successor needs a
 * moment to notice the loss and start serving, and one that takes longer than a dead node is
 * declared dead takes the next one's turn. */

static void connect_now(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out, double timeout)
{
    if (fo->failing_over && !fo->hosting)
        timer_start(fo, out, DL_RDZV_FO_TIMER_CANDIDATE, (unsigned)(fo->o.dead_after * 1000) + 1);
    dl_rdzv_fo_action_t *a = act(out, DL_RDZV_FO_CONNECT);
    copy(a->host, fo->host);
    a->timeout = timeout;
    a->code = fo->connect_code;
    a->status = fo->connect_status;
    fo->conn = DL_RDZV_FO_CONNECTING;
}

static void connect_to(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out, int code,
                       const char *status)
{
    fo->connect_code = code;
    fo->connect_status = status;
    if (!fo->failing_over) {
        connect_now(fo, out, fo->o.join_timeout);
        return;
    }
    const char *c = fo->cands[fo->cand];
    copy(fo->host, c);
    if (strcmp(c, fo->my_addr) == 0 && fo->o.may_host) {
        fo->conn = DL_RDZV_FO_SERVING;
        copy(act(out, DL_RDZV_FO_SERVE)->host, c);
        return; /* SERVED goes on */
    }
    connect_now(fo, out, fo->cand == 0 ? 0 : fo->o.dead_after);
}

static void served(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev, dl_rdzv_fo_actions_t *out)
{
    if (ev->serve == DL_RDZV_FO_SERVED)
        fo->hosting = true;
    if (fo->conn != DL_RDZV_FO_SERVING)
        return; /* the first host's own server, before its first connection */
    fo->serve_in_use = ev->serve == DL_RDZV_FO_SERVE_IN_USE && fo->failing_over;
    if (ev->serve == DL_RDZV_FO_SERVED) {
        fo->host_index = fo->cand;
        text(out, DL_RDZV_FO_SAY, "hosting the rendezvous on %s:%d: its host was lost", fo->host,
             fo->o.port);
    } else if (ev->serve == DL_RDZV_FO_SERVE_FAILED) {
        text(out, DL_RDZV_FO_SAY, "cannot host the rendezvous on %s:%d (%s)", fo->host, fo->o.port,
             ev->why != NULL ? ev->why : "?");
    }
    connect_now(fo, out, fo->o.join_timeout);
}

/* Asked to join or follow while not connected: connect, unless a connection or its backoff is
 * under way (the backoff connects). */
static void reconnect(dl_rdzv_failover_t *fo, dl_rdzv_fo_actions_t *out)
{
    if (fo->conn == DL_RDZV_FO_CONNECTING || fo->conn == DL_RDZV_FO_SERVING)
        return;
    if (fo->timer_armed[DL_RDZV_FO_TIMER_RETRY])
        return;
    connect_to(fo, out, 3, "timed_out");
}

/* ---- Failover (docs/rendezvous.md, "Failover") ---------------------------------------------
 * The rendezvous is looked for where it was, then at the last round's successors in node-rank
 * order. silent: it answered nothing for --dead-after, so where it was is not worth another
 * wait. */
static void failover_begin(dl_rdzv_failover_t *fo, double now, bool silent)
{
    fo->ncands = 0;
    copy(fo->cands[fo->ncands++], fo->host);
    for (int i = 0; i < fo->nsuccessors; i++) {
        bool seen = false;
        for (int j = 0; j < fo->ncands && !seen; j++)
            seen = strcmp(fo->cands[j], fo->successors[i]) == 0;
        if (!seen)
            copy(fo->cands[fo->ncands++], fo->successors[i]);
    }
    fo->cand = silent && fo->ncands > 1 && strcmp(fo->cands[0], fo->my_addr) != 0 ? 1 : 0;
    fo->failing_over = true;
    fo->host_lost = !fo->handing_over && !fo->host_departed && fo->host_node_rank >= 0;
    fo->handing_over = false;
    fo->failover_since = now;
    fo->serve_in_use = fo->serve_retried = false;
}

static void failover_next(dl_rdzv_failover_t *fo, double now, const char *why,
                          dl_rdzv_fo_actions_t *out)
{
    act(out, DL_RDZV_FO_CLOSE_CLIENT);
    fo->conn = DL_RDZV_FO_IDLE;
    bool in_time = now - fo->failover_since < fo->o.join_timeout;
    /* Our turn, and our address was in use, yet nobody serves there: the lost host shares our
     * address (agents on one machine) and its server was not gone yet, frozen or still dying.
     * The turn stays ours: serve again once it lets go. */
    if (fo->serve_in_use && in_time) {
        fo->serve_in_use = false;
        if (!fo->serve_retried)
            text(out, DL_RDZV_FO_SAY,
                 "no rendezvous at %s:%d (%s), though the address is in use here: the lost "
                 "host's server may not be gone yet; hosting it again every %d ms until "
                 "--join-timeout",
                 fo->host, fo->o.port, why, DL_RDZV_FO_SERVE_RETRY_MS);
        fo->serve_retried = true;
        fo->retry = DL_RDZV_FO_RETRY_SERVE;
        timer_start(fo, out, DL_RDZV_FO_TIMER_RETRY, DL_RDZV_FO_SERVE_RETRY_MS);
        return;
    }
    fo->serve_in_use = false;
    if (++fo->cand < fo->ncands && in_time) {
        text(out, DL_RDZV_FO_SAY, "no rendezvous at %s:%d (%s): trying %s, the next successor",
             fo->host, fo->o.port, why, fo->cands[fo->cand]);
        connect_to(fo, out, 3, "timed_out");
        return;
    }
    text(out, DL_RDZV_FO_ERROR,
         "the rendezvous is lost, and none of its %d successor%s serves it (last: %s:%d, %s)",
         fo->ncands, fo->ncands == 1 ? "" : "s", fo->host, fo->o.port, why);
    end(fo, out, 3, "timed_out");
}

/* ---- Events ------------------------------------------------------------------------------- */

static void connected(dl_rdzv_failover_t *fo, double now, dl_rdzv_fo_actions_t *out)
{
    fo->conn = DL_RDZV_FO_READY;
    fo->ready_at = fo->heard_at = fo->ticked_at = now;
    if (fo->failing_over) {
        fo->failing_over = false;
        text(out, DL_RDZV_FO_SAY,
             "the rendezvous is at %s:%d now, found %.2f s after the last "
             "was lost",
             fo->host, fo->o.port, now - fo->failover_since);
        dl_rdzv_fo_action_t *a = act(out, DL_RDZV_FO_MOVED);
        copy(a->host, fo->host);
        a->hosting = fo->hosting;
        a->seconds = now - fo->failover_since;
    }
    if (!fo->started) {
        fo->started = true;
        act(out, DL_RDZV_FO_READY_FIRST);
        return;
    }
    dl_rdzv_fo_want_t want = fo->want;
    fo->want = DL_RDZV_FO_WANT_NONE;
    if (want == DL_RDZV_FO_WANT_FOLLOW)
        act(out, DL_RDZV_FO_SEND_FOLLOW);
    else if (want == DL_RDZV_FO_WANT_JOIN)
        act(out, DL_RDZV_FO_SEND_JOIN);
}

static void connect_failed(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev,
                           dl_rdzv_fo_actions_t *out)
{
    const char *why = ev->why != NULL ? ev->why : "?";
    fo->conn = DL_RDZV_FO_IDLE;
    if (fo->failing_over && ev->fail != DL_RDZV_FO_FAIL_DENIED) {
        failover_next(fo, ev->now, why, out);
        return;
    }
    /* The first connection found no address for the rendezvous's name: one that appears once
     * node 0's pod is up (a Kubernetes headless service) is worth looking up again. */
    if (ev->fail == DL_RDZV_FO_FAIL_NO_NAME && !fo->started) {
        bool first;
        bool wait = dl_rdzv_failover_name_wait(fo, ev->now, &first);
        if (first)
            text(out, DL_RDZV_FO_SAY,
                 "the rendezvous endpoint '%s' does not resolve yet (%s): trying again until "
                 "--join-timeout %g s",
                 fo->host, ev->name_error != NULL ? ev->name_error : "?", fo->o.join_timeout);
        if (wait) {
            fo->retry = DL_RDZV_FO_RETRY_NAME;
            timer_start(fo, out, DL_RDZV_FO_TIMER_RETRY, DL_RDZV_FO_NAME_RETRY_MS);
            return;
        }
    }
    text(out, DL_RDZV_FO_ERROR, "%s", why);
    if (ev->fail == DL_RDZV_FO_FAIL_DENIED)
        end(fo, out, 4, "refused");
    else
        end(fo, out, 3, "timed_out");
}

/* The connection is gone, or we dropped it (misbehaving): stop the workers and join again, at
 * once after a connection that served a while, else after a backoff that doubles each time, and
 * not past the join timeout of trouble in a row. */
static void lost(dl_rdzv_failover_t *fo, double now, bool misbehaving, bool silent,
                 const char *what, dl_rdzv_fo_actions_t *out)
{
    if (fo->leaving) {
        fo->conn = DL_RDZV_FO_IDLE;
        act(out, DL_RDZV_FO_CLOSE_CLIENT);
        return;
    }
    bool stable =
        !misbehaving && fo->conn == DL_RDZV_FO_READY && now - fo->ready_at >= DL_RDZV_FO_STABLE_S;
    fo->conn = DL_RDZV_FO_IDLE;
    act(out, DL_RDZV_FO_DROP);
    if (stable) {
        fo->failures = 0;
        fo->trouble_since = 0;
    } else {
        if (fo->failures++ == 0)
            fo->trouble_since = now;
        if (now - fo->trouble_since > fo->o.join_timeout) {
            text(out, DL_RDZV_FO_SAY,
                 "the rendezvous at %s:%d failed %d times in %.0f s (last: %s): giving up",
                 fo->host, fo->o.port, fo->failures, now - fo->trouble_since, what);
            end(fo, out, 4, "refused");
            return;
        }
        unsigned ms = DL_RDZV_FO_BACKOFF_MIN_MS;
        for (int i = 1; i < fo->failures && ms < DL_RDZV_FO_BACKOFF_MAX_MS; i++)
            ms *= 2;
        fo->retry = DL_RDZV_FO_RETRY_BACKOFF;
        timer_start(fo, out, DL_RDZV_FO_TIMER_RETRY,
                    ms < DL_RDZV_FO_BACKOFF_MAX_MS ? ms : DL_RDZV_FO_BACKOFF_MAX_MS);
    }
    char line[900];
    snprintf(line, sizeof(line), "%s the rendezvous at %s:%d (%s)",
             misbehaving ? "dropped" : "lost", fo->host, fo->o.port, what);
    text(out, DL_RDZV_FO_SAY, "%s: joining again", line);
    /* An embedded rendezvous (the one that names successors) is lost with its node: look for
     * it at the successors, and name the lost host's node as for any lost node; not when we
     * handed the job over. */
    bool embedded = !misbehaving && !fo->hosting && fo->nsuccessors > 0;
    dl_rdzv_fo_action_t *a = act(out, DL_RDZV_FO_LOST);
    snprintf(a->text, sizeof(a->text), "%s", line);
    a->blame = embedded && !fo->failing_over && !fo->handing_over && fo->host_node_rank >= 0;
    a->cause = fo->host_departed ? "node_left" : "node_lost";
    copy(a->host, fo->host);
    a->node_rank = fo->host_node_rank;
    if (embedded && !fo->failing_over)
        failover_begin(fo, now, silent);
}

/* Every heartbeat is answered. A rendezvous that has not answered for --dead-after is as dead to
 * us as we would be to it: a host that lost power sends no FIN or RST, and TCP would wait for
 * many minutes. A loop that was itself held up has not looked: the rendezvous gets a fair
 * period from now. While we host as a successor, the candidates before ours are asked in turn
 * whether they serve the job again (a partition healed); a probe unanswered for --dead-after is
 * replaced, as its SYNs into a link that drops them back off to 30 s and more. */
static void tick(dl_rdzv_failover_t *fo, double now, dl_rdzv_fo_actions_t *out)
{
    if (fo->conn != DL_RDZV_FO_READY)
        return;
    double silent = now - fo->heard_at;
    if (now - fo->ticked_at > 2 * fo->o.heartbeat + 0.5) {
        fo->heard_at = now;
        silent = 0;
    }
    fo->ticked_at = now;
    if (fo->hosting && fo->host_index > 0 &&
        !(fo->probing && now - fo->probe_since < fo->o.dead_after)) {
        fo->probing = true;
        fo->probe_since = now;
        fo->probe_index = (fo->probe_index + 1) % fo->host_index;
        copy(act(out, DL_RDZV_FO_PROBE)->host, fo->cands[fo->probe_index]);
    }
    if (silent > fo->o.dead_after) {
        char why[128];
        snprintf(why, sizeof(why), "no answer for %.1f s, over --dead-after %g s", silent,
                 fo->o.dead_after);
        lost(fo, now, false, true, why, out);
    }
}

/* An earlier candidate serves the job again: it goes first. Our server goes, our members
 * (ourselves included) lose it and look again, starting there. */
static void probed(dl_rdzv_failover_t *fo, bool ok, dl_rdzv_fo_actions_t *out)
{
    fo->probing = false;
    if (!ok || !fo->hosting || fo->host_index == 0)
        return;
    text(out, DL_RDZV_FO_SAY, "the rendezvous at %s:%d answers again: handing the job over to it",
         fo->cands[fo->probe_index], fo->o.port);
    copy(fo->host, fo->cands[fo->probe_index]);
    fo->host_index = 0;
    fo->handing_over = true;
    fo->hosting = false;
    act(out, DL_RDZV_FO_HAND_OVER);
}

static void join_full(dl_rdzv_failover_t *fo, double now, const char *why,
                      dl_rdzv_fo_actions_t *out)
{
    if (fo->full_since == 0) {
        fo->full_since = now;
        text(out, DL_RDZV_FO_SAY, "%s: joining again every %d ms until --join-timeout (%.0f s)",
             why, DL_RDZV_FO_FULL_RETRY_MS, fo->o.join_timeout);
    }
    if (now - fo->full_since >= fo->o.join_timeout) {
        text(out, DL_RDZV_FO_ERROR, "%s", why);
        end(fo, out, 4, "refused");
        return;
    }
    timer_start(fo, out, DL_RDZV_FO_TIMER_FULL, DL_RDZV_FO_FULL_RETRY_MS);
}

static void assigned(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev)
{
    fo->full_since = 0;
    fo->host_lost = false;
    fo->host_departed = false;
    fo->host_node_rank = ev->node_rank;
    fo->nsuccessors = 0;
    for (int i = 0; i < ev->nsuccessors && i < DL_RDZV_SUCCESSORS_MAX; i++)
        copy(fo->successors[fo->nsuccessors++], ev->successors[i]);
}

static void timer_fired(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev,
                        dl_rdzv_fo_actions_t *out)
{
    fo->timer_armed[ev->timer] = false;
    switch (ev->timer) {
    case DL_RDZV_FO_TIMER_RETRY:
        if (fo->retry == DL_RDZV_FO_RETRY_HOST) {
            act(out, DL_RDZV_FO_HOST_AGAIN);
        } else if (fo->retry == DL_RDZV_FO_RETRY_NAME) {
            connect_to(fo, out, 1, "refused");
        } else if (fo->retry == DL_RDZV_FO_RETRY_SERVE) {
            if (fo->failing_over && fo->conn == DL_RDZV_FO_IDLE)
                connect_to(fo, out, 3, "timed_out");
        } else if (fo->want != DL_RDZV_FO_WANT_NONE && fo->conn == DL_RDZV_FO_IDLE) {
            /* Only once the agent asked to join or follow (its workers are stopped by then). */
            connect_to(fo, out, 3, "timed_out");
        }
        return;
    case DL_RDZV_FO_TIMER_CANDIDATE:
        if (fo->conn == DL_RDZV_FO_CONNECTING && fo->failing_over) {
            char why[64];
            snprintf(why, sizeof(why), "no answer within --dead-after %g s", fo->o.dead_after);
            failover_next(fo, ev->now, why, out);
        }
        return;
    case DL_RDZV_FO_TIMER_FULL:
        if (!fo->leaving)
            act(out, DL_RDZV_FO_JOIN_AGAIN);
        return;
    case DL_RDZV_FO_TIMER_COUNT: return;
    }
}

void dl_rdzv_failover_step(dl_rdzv_failover_t *fo, const dl_rdzv_fo_event_t *ev,
                           dl_rdzv_fo_actions_t *out)
{
    out->n = 0;
    if (fo->conn == DL_RDZV_FO_CLOSED)
        return;
    switch (ev->kind) {
    case DL_RDZV_FO_EV_START: connect_to(fo, out, 0, "refused"); return;
    case DL_RDZV_FO_EV_HOST_WAIT:
        fo->retry = DL_RDZV_FO_RETRY_HOST;
        timer_start(fo, out, DL_RDZV_FO_TIMER_RETRY, DL_RDZV_FO_NAME_RETRY_MS);
        return;
    case DL_RDZV_FO_EV_JOIN:
        if (fo->conn == DL_RDZV_FO_READY) {
            act(out, ev->follow ? DL_RDZV_FO_SEND_FOLLOW : DL_RDZV_FO_SEND_JOIN);
            return;
        }
        fo->want = ev->follow ? DL_RDZV_FO_WANT_FOLLOW : DL_RDZV_FO_WANT_JOIN;
        reconnect(fo, out);
        return;
    case DL_RDZV_FO_EV_CONNECTED:
        if (fo->timer_armed[DL_RDZV_FO_TIMER_CANDIDATE])
            timer_stop(fo, out, DL_RDZV_FO_TIMER_CANDIDATE);
        connected(fo, ev->now, out);
        return;
    case DL_RDZV_FO_EV_CONNECT_FAILED:
        if (fo->timer_armed[DL_RDZV_FO_TIMER_CANDIDATE])
            timer_stop(fo, out, DL_RDZV_FO_TIMER_CANDIDATE);
        connect_failed(fo, ev, out);
        return;
    case DL_RDZV_FO_EV_HEARD: fo->heard_at = ev->now; return;
    case DL_RDZV_FO_EV_TICK: tick(fo, ev->now, out); return;
    case DL_RDZV_FO_EV_LOST:
        lost(fo, ev->now, ev->misbehaving, false, ev->why != NULL ? ev->why : "?", out);
        return;
    case DL_RDZV_FO_EV_ASSIGNED: assigned(fo, ev); return;
    case DL_RDZV_FO_EV_NODE_LEFT:
        if (fo->host_node_rank >= 0 && ev->node_rank == fo->host_node_rank)
            fo->host_departed = true;
        return;
    case DL_RDZV_FO_EV_JOIN_FULL:
        join_full(fo, ev->now, ev->why != NULL ? ev->why : "the job is full", out);
        return;
    case DL_RDZV_FO_EV_SERVED: served(fo, ev, out); return;
    case DL_RDZV_FO_EV_PROBED: probed(fo, ev->ok, out); return;
    case DL_RDZV_FO_EV_TIMER:
        if (ev->timer >= 0 && ev->timer < DL_RDZV_FO_TIMER_COUNT)
            timer_fired(fo, ev, out);
        return;
    case DL_RDZV_FO_EV_LEAVE:
        if (fo->conn == DL_RDZV_FO_READY)
            fo->leaving = true;
        return;
    case DL_RDZV_FO_EV_CLOSE: fo->conn = DL_RDZV_FO_CLOSED; return;
    }
}
