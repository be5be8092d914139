/* The TCP backend (rdzv-backend.h): our own protocol, to the rendezvous embedded in an agent or
 * to a dlaunchd. Hosts the rendezvous (and --http beside it) when this node should, joins it,
 * heartbeats, reports, reconnects with a backoff when the connection goes wrong, hosts it again
 * at a successor when its host is lost (docs/rendezvous.md, "Failover"), and turns what the
 * server says into the backend's callbacks. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http.h"
#include "rdzv-backend.h"
#include "rendezvous.h"

/* Reconnecting to a rendezvous that misbehaves: the first retry after this, doubling up to
 * BACKOFF_MAX_MS; a connection that lasted STABLE_S resets the count. */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STABLE_S 10.0
/* Node 0 whose own name does not resolve yet (a Kubernetes headless-service name appears once
 * the pod is up) looks again this often, until --join-timeout. */
#define NAME_RETRY_MS 250
/* A job that has its most nodes may lose one soon (a pod made again while the rendezvous has not
 * yet declared the old one dead): a join it turns away is tried again this often, as torchrun
 * keeps surplus nodes waiting, until --join-timeout. */
#define FULL_RETRY_MS 1000

struct dl_rdzv_impl_s {
    dl_rdzv_backend_conf_t conf;
    const dl_job_spec_t *spec;
    dl_rdzv_backend_cbs_t cbs;
    void *ctx;
    dl_rdzv_server_t *server; /* when this agent hosts the rendezvous */
    dl_http_t *http;          /* --http, when it hosts it */
    dl_rdzv_client_t *client;
    char host[256]; /* the endpoint's */
    int port;
    json_int_t next_id;
    json_int_t join_id; /* the join waiting for its assignment, or -1 */
    dl_rdzv_join_t join; /* the last join asked for */
    bool ready;
    bool leaving; /* said leave: the connection the server closes next is no loss */
    bool started;       /* ready was called back once (first connection) */
    bool connecting;
    bool sitting_out;   /* sit_out: no member until the next join */
    bool following;     /* the job's events come to us: its end, while we sit out */
    bool follow_wanted; /* sit_out while not connected: follow once ready */
    uv_timer_t backoff; /* the next connection, when the last one went wrong */
    bool backoff_open;
    int failures;         /* connections in a row that went wrong */
    double ready_at;      /* monotonic seconds the connection became ready */
    bool join_wanted;     /* a join was asked for while not connected */
    double trouble_since; /* monotonic seconds of the first of those failures, or 0 */
    double heard_at;      /* monotonic seconds of the rendezvous's last message */
    double ticked_at;     /* of the last heartbeat */
    bool closed;          /* close() ran: no more callbacks */
    int open_handles;     /* timers still to close before the struct goes */
    /* Failover: the last round's successors, our own address as they know it, and while the
     * rendezvous is being looked for, the candidates in order and the one being tried. */
    char successors[DL_RDZV_SUCCESSORS_MAX][DL_PROTO_NAME_MAX + 1];
    int nsuccessors;
    char my_addr[DL_PROTO_NAME_MAX + 1];
    char cands[DL_RDZV_SUCCESSORS_MAX + 1][DL_PROTO_NAME_MAX + 1];
    int ncands, cand;
    bool failing_over;
    /* The lost host is a failure like any node's: joins count one restart more than the last
     * assignment said, until the next assignment. Not when the host departed (its operator's
     * signal: the round change said so) or was no member of the round: no node failed. */
    bool host_lost;
    bool host_departed;
    bool lost_silently; /* while drop_connection runs for a rendezvous gone silent */
    double failover_since;
    uv_timer_t cand_timer; /* a candidate that neither answers nor refuses */
    uv_timer_t full_timer; /* the next join, after one turned away from a full job */
    double full_since;     /* monotonic seconds of the first of those, or 0 */
    /* Hosting as a successor: the candidates before ours are asked, one a heartbeat, whether
     * they serve the job again (a partition healed); the first that does gets the job back. */
    int host_index; /* ours among the candidates when we host as a successor, else 0 */
    bool handing_over; /* we closed our server for an earlier candidate: no failure */
    int host_node_rank; /* of the agent hosting the rendezvous in the last round, or -1 */
    dl_rdzv_client_t *probe;
    int probe_index;
    double probe_since;
    double unresolved_since; /* node 0: monotonic seconds its endpoint first failed to resolve */
};

typedef struct dl_rdzv_impl_s tcp_t;

static int connect_client(tcp_t *z);
static void drop_connection(tcp_t *z, bool misbehaving, const char *what);
static int serve(tcp_t *z, const char *ip, char *err, size_t errlen);

static double mono(void)
{
    return (double)uv_hrtime() / 1e9;
}

static void say(tcp_t *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(tcp_t *z, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    z->cbs.log(z->ctx, msg);
}

static void end(tcp_t *z, int exit_code, const char *status)
{
    dl_rdzv_end_t e = {.exit_code = exit_code, .status = status};
    z->cbs.ended(z->ctx, &e);
}

static void server_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    tcp_t *z = ctx;
    if (level >= DL_RDZV_LOG_INFO || z->spec->verbose)
        fprintf(stderr, "[rdzv%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

static json_int_t next_id(tcp_t *z)
{
    return z->next_id++;
}

static void send_or_log(tcp_t *z, json_t *m)
{
    if (m == NULL)
        return;
    int r = dl_rdzv_client_send(z->client, m);
    if (r < 0)
        say(z, "cannot send %s to the rendezvous: %s", dl_proto_get_str(m, "type"), strerror(-r));
    json_decref(m);
}

/* Where the other nodes can reach this one: --local-addr, else the address our rendezvous
 * connection leaves from. */
static void local_address(tcp_t *z, char *buf, size_t len)
{
    snprintf(buf, len, "%s", z->host);
    if (z->spec->local_addr != NULL) {
        snprintf(buf, len, "%s", z->spec->local_addr);
        return;
    }
    if (dl_rdzv_client_local_addr(z->client, buf, len) < 0)
        snprintf(buf, len, "%s", z->host);
}

static void follow(tcp_t *z)
{
    if (z->following)
        return;
    z->following = true;
    send_or_log(z, dl_rdzv_enc_events_follow(next_id(z)));
}

/* Lost the rendezvous (it declared us dead, or restarted): connect again, and join or follow as
 * asked once the handshake is done; after a failure, only once the backoff ran. */
static void reconnect(tcp_t *z)
{
    if (z->connecting)
        return;
    if (uv_is_active((uv_handle_t *)&z->backoff))
        return; /* on_backoff connects */
    if (connect_client(z) < 0)
        end(z, 3, "timed_out");
}

static void tcp_join(tcp_t *z, const dl_rdzv_join_t *join)
{
    const dl_job_spec_t *spec = z->spec;
    char addr[sizeof(z->host)];

    z->join = *join;
    z->sitting_out = false;
    if (!z->ready) {
        z->join_wanted = true;
        z->follow_wanted = false;
        reconnect(z);
        return;
    }
    local_address(z, addr, sizeof(addr));
    snprintf(z->my_addr, sizeof(z->my_addr), "%s", addr);
    z->join_id = next_id(z);
    dl_rdzv_join_msg_t j = {.node_id = z->conf.node_id,
                            .host = z->conf.hostname,
                            .master_addr = addr,
                            .master_port = z->conf.master_port,
                            .slots = join->slots,
                            .node_rank = z->conf.want_node_rank,
                            .min_nodes = z->conf.nodes_min,
                            .max_nodes = z->conf.nodes_max,
                            .max_restarts = spec->max_restarts,
                            .max_same_failures = spec->max_same_failures,
                            .last_call = spec->last_call,
                            .join_timeout = spec->join_timeout,
                            .dead_after = spec->dead_after,
                            .assigned = join->assigned,
                            .round = join->last_round,
                            .failures = join->failures + z->host_lost,
                            .torch_store = !spec->store_worker};
    send_or_log(z, dl_rdzv_enc_join(z->join_id, &j));
}

static void tcp_sit_out(tcp_t *z)
{
    z->sitting_out = true;
    if (!z->ready) {
        z->follow_wanted = true;
        z->join_wanted = false;
        reconnect(z);
        return;
    }
    /* No longer a member, it would not hear of the job's end: its event stream says. */
    follow(z);
}

static void tcp_report_failure(tcp_t *z, const dl_rdzv_failure_t *f)
{
    if (f->excluded && !z->ready)
        return;
    dl_rdzv_failure_msg_t m = {.round = f->round,
                               .rank = f->rank,
                               .local_rank = f->local_rank,
                               .exit_code = f->exit_code,
                               .signal = f->signal,
                               .hung = f->hung,
                               .oom = f->oom,
                               .excluded = f->excluded,
                               .step = f->step,
                               .reason = f->reason,
                               .time = f->time,
                               /* the end of its stderr (else stdout), for the status page */
                               .log_tail = f->log_tail,
                               /* where this node's ranks were: the job-wide account of it */
                               .diag = f->diag};
    send_or_log(z, dl_rdzv_enc_worker_failed(next_id(z), &m));
}

static void tcp_node_done(tcp_t *z, int round)
{
    send_or_log(z, dl_rdzv_enc_node_done(next_id(z), round));
}

static void probe_earlier(tcp_t *z);

static void tcp_heartbeat(tcp_t *z, const dl_rdzv_beat_t *beat)
{
    if (!z->ready)
        return;
    /* Every heartbeat is answered. A rendezvous that has not answered for --dead-after is as
     * dead to us as we would be to it: a host that lost power sends no FIN or RST, and TCP
     * would wait for many minutes. A loop that was itself held up (timers run before pending
     * reads) has not looked: the rendezvous gets a fair period from now. */
    double now = mono(), silent = now - z->heard_at;
    if (now - z->ticked_at > 2 * z->spec->heartbeat + 0.5) {
        z->heard_at = now;
        silent = 0;
    }
    z->ticked_at = now;
    probe_earlier(z);
    if (silent > z->spec->dead_after) {
        char why[128];
        snprintf(why, sizeof(why), "no answer for %.1f s, over --dead-after %g s", silent,
                 z->spec->dead_after);
        z->lost_silently = true;
        drop_connection(z, false, why);
        z->lost_silently = false;
        return;
    }
    /* The progress and this node's figures and its ranks' last operations: the job-wide view
     * is made of them. */
    dl_rdzv_beat_msg_t m = {.round = beat->round,
                            .has_progress = beat->has_progress,
                            .step = beat->step,
                            .loss = beat->loss,
                            .samples_per_s = beat->samples_per_s,
                            .diag = beat->diag,
                            .recovery = beat->recovery};
    send_or_log(z, dl_rdzv_enc_heartbeat(next_id(z), &m));
}

static void misbehaved(tcp_t *z, const char *why);

static void on_full_retry(uv_timer_t *t)
{
    tcp_t *z = t->data;
    if (!z->closed && !z->leaving)
        tcp_join(z, &z->join);
}

/* Whether a join turned away from a full job is tried again (false once --join-timeout ran out
 * since the first refusal). */
static bool retry_full_job(tcp_t *z, const char *why)
{
    double now = mono();
    if (z->full_since == 0) {
        z->full_since = now;
        say(z, "%s: joining again every %d ms until --join-timeout (%.0f s)", why,
            FULL_RETRY_MS, z->spec->join_timeout);
    }
    if (now - z->full_since >= z->spec->join_timeout)
        return false;
    uv_timer_start(&z->full_timer, on_full_retry, FULL_RETRY_MS, 0);
    return true;
}

static void on_assignment(tcp_t *z, json_t *m)
{
    dl_rdzv_assignment_t as;
    dl_rdzv_assignment_want_t want = {.slots = z->join.slots, .min_nodes = z->conf.nodes_min,
                                      .max_nodes = z->conf.nodes_max,
                                      .min_round = z->join.last_round};
    char err[256], why[300];

    z->join_id = -1;
    /* Ranks, sizes and addresses go into workers' environments: nothing we did not ask for. */
    if (dl_rdzv_assignment_read(m, &want, &as, err, sizeof(err)) < 0) {
        snprintf(why, sizeof(why), "an assignment this node cannot take: %s", err);
        misbehaved(z, why);
        return;
    }
    dl_rdzv_culprit_info_t c;
    dl_rdzv_dec_culprit(json_object_get(m, "failure"), &c);
    z->full_since = 0;
    z->host_lost = false;
    z->host_departed = false;
    z->host_node_rank = as.host_node_rank;
    z->nsuccessors = as.nsuccessors;
    for (int i = 0; i < as.nsuccessors; i++)
        snprintf(z->successors[i], sizeof(z->successors[i]), "%s", as.successors[i]);
    z->cbs.assigned(z->ctx, &as, c.cause != NULL ? &c : NULL);
}

static void on_message(void *ctx, json_t *m, dl_proto_type_t type)
{
    tcp_t *z = ctx;
    json_int_t id = dl_proto_get_int(m, "id", -1);
    const char *why = NULL;

    z->heard_at = mono();
    switch (type) {
    case DL_PROTO_ASSIGNMENT:
        if (id == z->join_id)
            on_assignment(z, m);
        return;
    case DL_PROTO_ROUND_CHANGED: {
        int round;
        const char *reason;
        dl_rdzv_culprit_info_t c;
        dl_rdzv_dec_round_changed(m, &round, &reason, &c);
        if (c.cause != NULL && strcmp(c.cause, "node_left") == 0 && z->host_node_rank >= 0 &&
            c.node_rank == z->host_node_rank)
            z->host_departed = true;
        z->cbs.round_changed(z->ctx, round, reason, c.cause != NULL ? &c : NULL);
        return;
    }
    case DL_PROTO_SHUTDOWN: {
        dl_rdzv_shutdown_msg_t sd;
        dl_rdzv_dec_shutdown(m, &sd);
        const char *reason = sd.reason, *desc = sd.failure;
        char safe_reason[1200], safe_desc[512];
        dl_proto_escape(reason, safe_reason, sizeof(safe_reason));
        if (desc != NULL)
            dl_proto_escape(desc, safe_desc, sizeof(safe_desc));
        /* The job's own ending, as the rendezvous says it (a stopped job ends in exit 0 too). */
        bool stopped = strcmp(reason, "stopped") == 0;
        if (strcmp(reason, "succeeded") != 0)
            say(z, "the rendezvous ended the job: %s%s%s", safe_reason, desc ? ": " : "",
                desc ? safe_desc : "");
        int code = sd.exit_code;
        dl_rdzv_end_t e = {.exit_code = code,
                           .stopped = stopped,
                           .status = stopped ? "stopped" : code == 0 ? "succeeded" : "failed",
                           .failure = desc != NULL ? safe_desc : NULL};
        z->cbs.ended(z->ctx, &e);
        return;
    }
    case DL_PROTO_ERROR: {
        dl_proto_errcode_t code = dl_proto_reply_error(m, &why);
        char safe[1200];
        if (id == z->join_id) {
            z->join_id = -1;
            dl_proto_escape(why ? why : "the rendezvous refused to join", safe, sizeof(safe));
            if (code == DL_PROTO_E_JOB_FULL && retry_full_job(z, safe))
                return;
            fprintf(stderr, "dlaunch: %s\n", safe);
            if (code == DL_PROTO_E_TIMEOUT)
                end(z, 3, "timed_out");
            else
                end(z, 4, "refused");
        } else {
            say(z, "the rendezvous answered an error: %s",
                dl_proto_escape(why ? why : "?", safe, sizeof(safe)));
        }
        return;
    }
    case DL_PROTO_EVENT: {
        /* Followed while sitting out: the job ended without this node. */
        const char *name, *status;
        dl_rdzv_dec_event(m, &name, &status);
        if (z->sitting_out && name != NULL && strcmp(name, "job_end") == 0) {
            bool failed = status != NULL && strcmp(status, "failed") == 0;
            char safe[64];
            z->sitting_out = false;
            dl_rdzv_end_t e = {.exit_code = failed ? 1 : 0,
                               .status = dl_proto_escape(status ? status : "?", safe,
                                                         sizeof(safe))};
            z->cbs.ended(z->ctx, &e);
        }
        return;
    }
    case DL_PROTO_REPLY: {
        /* A heartbeat's answer: the job-wide figures and the stragglers named. */
        const json_t *view = dl_rdzv_dec_beat_view(m);
        if (view != NULL)
            z->cbs.view(z->ctx, view);
        return;
    }
    default:
        return; /* replies to reports carry nothing we need */
    }
}

/* ---- Failover (docs/rendezvous.md, "Failover") ----------------------------------------------
 * The rendezvous is looked for where it was, then at the last round's successors in node-rank
 * order. At our own address we host it ourselves; elsewhere a candidate gets --dead-after to
 * answer, as a dead node gets from the rendezvous, before the next one's turn. */

/* silent: it answered nothing for --dead-after, so where it was is not worth another wait. */
static void failover_begin(tcp_t *z, bool silent)
{
    z->ncands = 0;
    snprintf(z->cands[z->ncands++], sizeof(z->cands[0]), "%s", z->host);
    for (int i = 0; i < z->nsuccessors; i++) {
        bool seen = false;
        for (int j = 0; j < z->ncands && !seen; j++)
            seen = strcmp(z->cands[j], z->successors[i]) == 0;
        if (!seen)
            snprintf(z->cands[z->ncands++], sizeof(z->cands[0]), "%s", z->successors[i]);
    }
    z->cand = silent && z->ncands > 1 && strcmp(z->cands[0], z->my_addr) != 0 ? 1 : 0;
    z->failing_over = true;
    z->host_lost = !z->handing_over && !z->host_departed && z->host_node_rank >= 0;
    z->handing_over = false;
    z->failover_since = mono();
}

static void failover_next(tcp_t *z, const char *why)
{
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    z->connecting = false;
    if (++z->cand < z->ncands && mono() - z->failover_since < z->spec->join_timeout) {
        say(z, "no rendezvous at %s:%d (%s): trying %s, the next successor", z->host, z->port,
            why, z->cands[z->cand]);
        if (connect_client(z) < 0)
            end(z, 3, "timed_out");
        return;
    }
    fprintf(stderr, "dlaunch: the rendezvous is lost, and none of its %d successor%s serves it "
                    "(last: %s:%d, %s)\n",
            z->ncands, z->ncands == 1 ? "" : "s", z->host, z->port, why);
    end(z, 3, "timed_out");
}

static void on_cand_timeout(uv_timer_t *t)
{
    tcp_t *z = t->data;
    if (z->connecting && z->failing_over) {
        char why[64];
        snprintf(why, sizeof(why), "no answer within --dead-after %g s", z->spec->dead_after);
        failover_next(z, why);
    }
}

static void probe_ready(void *ctx, int status, const char *err)
{
    tcp_t *z = ctx;
    (void)err;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    if (status < 0 || z->server == NULL || z->host_index == 0)
        return;
    /* An earlier candidate serves the job again: it goes first. Our server goes, our members
     * (ourselves included) lose it and look again, starting there. */
    say(z, "the rendezvous at %s:%d answers again: handing the job over to it",
        z->cands[z->probe_index], z->port);
    snprintf(z->host, sizeof(z->host), "%s", z->cands[z->probe_index]);
    z->host_index = 0;
    z->handing_over = true;
    dl_http_close(z->http);
    z->http = NULL;
    dl_rdzv_server_close(z->server, NULL, NULL);
    z->server = NULL;
}

static void probe_message(void *ctx, json_t *m, dl_proto_type_t type)
{
    (void)ctx, (void)m, (void)type;
}

static void probe_lost(void *ctx, int status)
{
    (void)ctx, (void)status;
}

/* At each heartbeat while we host as a successor: ask the next earlier candidate. A probe
 * unanswered for --dead-after goes: its SYNs into a link that drops them silently back off to
 * 30 s and more, so once the link heals the candidate would be heard of only that much later
 * (70 s after a 40 s drop); a fresh one asks at once. */
static void probe_earlier(tcp_t *z)
{
    if (z->server == NULL || z->host_index == 0)
        return;
    if (z->probe != NULL && mono() - z->probe_since < z->spec->dead_after)
        return;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    z->probe_since = mono();
    z->probe_index = (z->probe_index + 1) % z->host_index;
    dl_rdzv_client_cbs_t cbs = {probe_ready, probe_message, probe_lost};
    if (dl_rdzv_client_start(z->conf.loop, z->cands[z->probe_index], z->port,
                             DL_PROTO_ROLE_AGENT, z->conf.run_id, z->conf.token,
                             z->spec->heartbeat, &cbs, z, &z->probe) < 0)
        z->probe = NULL;
}

static void on_connect_retry(uv_timer_t *t)
{
    tcp_t *z = t->data;
    if (!z->closed && connect_client(z) < 0)
        end(z, 1, "refused");
}

/* The first connection found no address for the rendezvous's name: one that appears once node
 * 0's pod is up (a Kubernetes headless service) is worth looking up again until --join-timeout. */
static bool name_not_yet(tcp_t *z, int status)
{
    if (status != UV_EAI_NONAME && status != UV_EAI_AGAIN && status != UV_EAI_FAIL &&
        status != UV_EAI_NODATA)
        return false;
    double now = mono();
    if (z->unresolved_since == 0) {
        z->unresolved_since = now;
        say(z, "the rendezvous endpoint '%s' does not resolve yet (%s): trying again until "
               "--join-timeout %g s",
            z->host, uv_strerror(status), z->spec->join_timeout);
    }
    return now - z->unresolved_since < z->spec->join_timeout;
}

static void on_ready(void *ctx, int status, const char *err)
{
    tcp_t *z = ctx;
    z->connecting = false;
    uv_timer_stop(&z->cand_timer);
    if (status < 0 && z->failing_over && status != -EACCES && status != -EPROTO) {
        failover_next(z, err);
        return;
    }
    if (status < 0 && !z->started && name_not_yet(z, status)) {
        uv_timer_start(&z->backoff, on_connect_retry, NAME_RETRY_MS, 0);
        return;
    }
    if (status < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        if (status == -EACCES || status == -EPROTO)
            end(z, 4, "refused");
        else
            end(z, 3, "timed_out");
        return;
    }
    z->ready = true;
    z->ready_at = mono();
    z->heard_at = z->ticked_at = z->ready_at;
    if (z->failing_over) {
        z->failing_over = false;
        say(z, "the rendezvous is at %s:%d now, found %.2f s after the last was lost", z->host,
            z->port, z->ready_at - z->failover_since);
        if (z->cbs.moved != NULL)
            z->cbs.moved(z->ctx, z->host, z->port, z->server != NULL,
                         z->ready_at - z->failover_since);
    }
    if (!z->started) {
        z->started = true;
        z->cbs.ready(z->ctx);
        return;
    }
    if (z->follow_wanted) {
        z->follow_wanted = false;
        follow(z);
    } else if (z->join_wanted) {
        z->join_wanted = false;
        tcp_join(z, &z->join);
    }
}

static void on_backoff(uv_timer_t *t)
{
    tcp_t *z = t->data;
    /* Only if the agent asked to join (or follow) meanwhile (its workers are stopped by then). */
    if ((z->join_wanted || z->follow_wanted) && !z->ready && !z->connecting) {
        if (connect_client(z) < 0)
            end(z, 3, "timed_out");
    }
}

/* The connection is gone, or we dropped it (misbehaving): stop the workers and join again, at
 * once after a connection that served a while, else after a backoff that doubles each time, and
 * not past the join timeout of trouble in a row. */
static void drop_connection(tcp_t *z, bool misbehaving, const char *what)
{
    if (z->leaving) {
        z->ready = false;
        dl_rdzv_client_close(z->client);
        z->client = NULL;
        return;
    }
    double now = mono();
    bool stable = !misbehaving && z->ready && now - z->ready_at >= STABLE_S;

    z->ready = false;
    z->join_id = -1;
    z->following = false;
    dl_rdzv_client_close(z->client); /* freed once libuv lets go; a new one takes its place */
    z->client = NULL;
    if (stable) {
        z->failures = 0;
        z->trouble_since = 0;
    } else {
        if (z->failures++ == 0)
            z->trouble_since = now;
        if (now - z->trouble_since > z->spec->join_timeout) {
            say(z, "the rendezvous at %s:%d failed %d times in %.0f s (last: %s): giving up",
                z->host, z->port, z->failures, now - z->trouble_since, what);
            end(z, 4, "refused");
            return;
        }
        uint64_t ms = BACKOFF_MIN_MS;
        for (int i = 1; i < z->failures && ms < BACKOFF_MAX_MS; i++)
            ms *= 2;
        uv_timer_start(&z->backoff, on_backoff, ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS, 0);
    }
    char line[900];
    snprintf(line, sizeof(line), "%s the rendezvous at %s:%d (%s)",
             misbehaving ? "dropped" : "lost", z->host, z->port, what);
    say(z, "%s: stopping this node's workers and joining again", line);
    /* An embedded rendezvous (the one that names successors) is lost with its node: look for
     * it at the successors. */
    bool embedded = !misbehaving && z->server == NULL && z->nsuccessors > 0;
    /* Name the lost host's node, as for any lost node; not when we handed the job over. */
    dl_rdzv_culprit_info_t c = DL_RDZV_CULPRIT_NONE;
    c.cause = z->host_departed ? "node_left" : "node_lost";
    c.host = z->host;
    c.node_rank = z->host_node_rank;
    bool blame = embedded && !z->failing_over && !z->handing_over && z->host_node_rank >= 0;
    if (embedded && !z->failing_over)
        failover_begin(z, z->lost_silently);
    z->cbs.lost(z->ctx, line, blame ? &c : NULL);
}

static void misbehaved(tcp_t *z, const char *why)
{
    drop_connection(z, true, why);
}

static void on_lost(void *ctx, int status)
{
    tcp_t *z = ctx;
    char why[600];
    const char *text = dl_rdzv_client_error(z->client);
    snprintf(why, sizeof(why), "%s", text[0] != '\0' ? text : uv_strerror(status));
    drop_connection(z, false, why);
}

static int connect_client(tcp_t *z)
{
    dl_rdzv_client_cbs_t cbs = {on_ready, on_message, on_lost};
    double timeout = z->spec->join_timeout;
    if (z->failing_over) {
        const char *c = z->cands[z->cand];
        snprintf(z->host, sizeof(z->host), "%s", c);
        if (strcmp(c, z->my_addr) == 0 && z->spec->is_host != 0) {
            /* Our turn: host it here, unless someone at this address was quicker. */
            char err[256];
            int r = serve(z, c, err, sizeof(err));
            if (r == 0) {
                z->host_index = z->cand;
                say(z, "hosting the rendezvous on %s:%d: its host was lost", c, z->port);
            } else if (r != UV_EADDRINUSE) {
                say(z, "cannot host the rendezvous on %s:%d (%s)", c, z->port, err);
            }
        } else if (z->cand == 0) {
            /* Where it was: a refusal says nobody serves there any more. */
            timeout = 0;
        } else {
            /* A successor needs a moment to notice the loss and start serving; one that takes
             * longer than a dead node is declared dead takes the next one's turn. */
            timeout = z->spec->dead_after;
        }
        if (z->server == NULL)
            uv_timer_start(&z->cand_timer, on_cand_timeout,
                           (uint64_t)(z->spec->dead_after * 1000) + 1, 0);
    }
    int r = dl_rdzv_client_start(z->conf.loop, z->host, z->port, DL_PROTO_ROLE_AGENT,
                                 z->conf.run_id, z->conf.token, timeout, &cbs, z, &z->client);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot start the rendezvous client: %s\n", uv_strerror(r));
        return r;
    }
    z->connecting = true;
    return 0;
}

/* --http beside the rendezvous this agent hosts. Returns 0, or -errno having said why. */
static int start_http(tcp_t *z)
{
    dl_http_opts_t ho;
    char host[256], err[512], title[300];
    int port, r;

    if (dl_rdzv_listen_parse(z->spec->http, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "dlaunch: --http: '%s' is not ADDR:PORT\n", z->spec->http);
        return -EINVAL;
    }
    snprintf(title, sizeof(title), "dlaunch %s", z->conf.run_id);
    dl_http_opts_init(&ho);
    ho.host = host;
    ho.port = port;
    ho.token = z->conf.token;
    ho.title = title;
    r = dl_http_start(z->conf.loop, z->server, &ho, &z->http, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: --http: %s\n", err);
        return r;
    }
    say(z, "status page and metrics on http://%s%s%s:%d/", strchr(host, ':') ? "[" : "", host,
        strchr(host, ':') ? "]" : "", dl_http_port(z->http));
    return 0;
}

/* Starts serving the job's rendezvous at ip:port. Returns 0, or the server's error (libuv's
 * UV_EADDRINUSE when someone serves it already; -ENOMEM when the job could not be set up) with
 * one line in err. */
static int serve(tcp_t *z, const char *ip, char *err, size_t errlen)
{
    dl_rdzv_server_opts_t so;
    dl_rdzv_server_opts_init(&so);
    so.host = ip;
    so.port = z->port;
    so.token = z->conf.token;
    so.only_run_id = z->conf.run_id;
    so.heartbeat = z->spec->heartbeat;
    so.core.successors = true;
    so.core.host_agent_id = z->conf.node_id;
    so.torch_store = !z->spec->store_worker;
    so.torch_port = z->conf.master_port;
    so.log = server_log;
    so.log_ctx = z;
    int r = dl_rdzv_server_start(z->conf.loop, &so, &z->server, err, errlen);
    if (r < 0)
        return r;
    dl_rdzv_job_opts_t jo;
    dl_rdzv_job_opts_init(&jo);
    jo.min_nodes = z->conf.nodes_min;
    jo.max_nodes = z->conf.nodes_max;
    jo.last_call = z->spec->last_call;
    jo.join_timeout = z->spec->join_timeout;
    jo.dead_after = z->spec->dead_after;
    jo.max_restarts = z->spec->max_restarts;
    jo.max_same_failures = z->spec->max_same_failures;
    jo.master_port = z->conf.master_port;
    r = dl_rdzv_server_add_job(z->server, z->conf.run_id, &jo);
    if (r < 0 && r != -EEXIST) {
        snprintf(err, errlen, "%s", strerror(-r));
        dl_rdzv_server_close(z->server, NULL, NULL);
        z->server = NULL;
        return -ENOMEM;
    }
    return 0;
}

/* Host the rendezvous if this node should: --node-rank 0, or (no rank given) the endpoint is one
 * of our addresses and nobody serves it yet. Returns 0 or an exit code. */
static int maybe_host(tcp_t *z)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    char ip[INET6_ADDRSTRLEN], err[512];
    int r;

    int rank = z->conf.want_node_rank;

    /* --rdzv-conf is_host decides when given; else node rank 0 hosts, or the first to bind. */
    if (z->spec->is_host == 0 || (z->spec->is_host < 0 && rank > 0))
        return 0;
    if (z->spec->is_host == 1)
        rank = 0;
    int g = getaddrinfo(z->host, NULL, &hints, &res);
    if (g != 0) {
        if (rank != 0)
            return 0;
        /* Only what a name not (yet) published gives is worth waiting for. */
        bool not_yet = g == EAI_NONAME || g == EAI_AGAIN || g == EAI_FAIL
#ifdef EAI_NODATA
                       || g == EAI_NODATA
#endif
            ;
        double now = mono();
        if (z->unresolved_since == 0) {
            z->unresolved_since = now;
            if (not_yet)
                say(z, "the rendezvous endpoint '%s' does not resolve yet (%s): trying again "
                       "until --join-timeout %g s",
                    z->host, gai_strerror(g), z->spec->join_timeout);
        }
        if (not_yet && now - z->unresolved_since < z->spec->join_timeout)
            return -EAGAIN;
        fprintf(stderr, "dlaunch: --rdzv-endpoint: cannot resolve '%s' (%s)%s\n", z->host,
                gai_strerror(g), not_yet ? ", not within --join-timeout" : "");
        return 2;
    }
    if (res->ai_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof(ip));
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, ip, sizeof(ip));
    freeaddrinfo(res);

    r = serve(z, ip, err, sizeof(err));
    if (r == -ENOMEM) {
        fprintf(stderr, "dlaunch: cannot set up the job's rendezvous: %s\n", err);
        return 2;
    }
    if (r == 0) {
        if (z->spec->http != NULL && start_http(z) < 0)
            return 2;
        if (z->spec->verbose)
            say(z, "hosting the rendezvous on %s:%d", ip, z->port);
        return 0;
    }
    /* Someone else serves it already (dlaunchd, or an agent that bound it first), or it is not
     * our address: join as a client. */
    if (r == UV_EADDRINUSE || (r == UV_EADDRNOTAVAIL && rank != 0)) {
        if (z->spec->http != NULL && z->spec->verbose)
            say(z, "--http: the rendezvous is served elsewhere, so is its status");
        if (rank == 0)
            say(z, "%s:%d is already served: joining it as node rank 0", z->host, z->port);
        return 0;
    }
    fprintf(stderr, "dlaunch: cannot host the rendezvous: %s\n", err);
    return 2;
}

static void tcp_free(tcp_t *z)
{
    free(z);
}

static void timer_closed(uv_handle_t *h)
{
    tcp_t *z = h->data;
    if (--z->open_handles == 0)
        tcp_free(z);
}

static void tcp_close(tcp_t *z)
{
    if (z == NULL)
        return;
    z->closed = true;
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    z->ready = false;
    dl_http_close(z->http);
    z->http = NULL;
    dl_rdzv_server_close(z->server, NULL, NULL);
    z->server = NULL;
    if (z->backoff_open) {
        uv_close((uv_handle_t *)&z->backoff, timer_closed);
        uv_close((uv_handle_t *)&z->cand_timer, timer_closed);
        uv_close((uv_handle_t *)&z->full_timer, timer_closed);
    } else {
        tcp_free(z);
    }
}

static void on_name_retry(uv_timer_t *t);

/* Hosts the rendezvous if this node should, then connects to it. Returns 0 (also while node 0
 * waits for its name to resolve) or an exit code. */
static int host_and_connect(tcp_t *z)
{
    int r = maybe_host(z);
    if (r == -EAGAIN) {
        uv_timer_start(&z->backoff, on_name_retry, NAME_RETRY_MS, 0);
        return 0;
    }
    if (r != 0)
        return r;
    return connect_client(z) < 0 ? 1 : 0;
}

static void on_name_retry(uv_timer_t *t)
{
    tcp_t *z = t->data;
    if (z->closed)
        return;
    int r = host_and_connect(z);
    if (r != 0)
        end(z, r, "refused");
}

static int tcp_start(const dl_rdzv_backend_conf_t *conf, const dl_rdzv_backend_cbs_t *cbs,
                     void *ctx, dl_rdzv_impl_t **ret)
{
    tcp_t *z = calloc(1, sizeof(*z));

    *ret = NULL;
    if (z == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 1;
    }
    z->conf = *conf;
    z->spec = conf->spec;
    z->cbs = *cbs;
    z->ctx = ctx;
    z->join_id = -1;
    z->host_node_rank = -1;
    if (dl_rdzv_endpoint_parse(conf->endpoint, z->host, sizeof(z->host), &z->port) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-endpoint: '%s' is not HOST:PORT\n", conf->endpoint);
        free(z);
        return 2;
    }
    *ret = z;
    uv_timer_init(conf->loop, &z->backoff);
    z->backoff.data = z;
    uv_timer_init(conf->loop, &z->cand_timer);
    z->cand_timer.data = z;
    uv_timer_init(conf->loop, &z->full_timer);
    z->full_timer.data = z;
    z->backoff_open = true;
    z->open_handles = 3;
    return host_and_connect(z); /* on failure the agent closes it */
}

static void tcp_leave(tcp_t *z, const char *reason)
{
    if (!z->ready)
        return;
    send_or_log(z, dl_rdzv_enc_leave(next_id(z), reason));
    z->leaving = true;
}

const dl_rdzv_backend_ops_t dl__rdzv_backend_tcp = {
    .name = "c10d",
    .start = tcp_start,
    .join = tcp_join,
    .heartbeat = tcp_heartbeat,
    .report_failure = tcp_report_failure,
    .node_done = tcp_node_done,
    .sit_out = tcp_sit_out,
    .leave = tcp_leave,
    .close = tcp_close,
};
