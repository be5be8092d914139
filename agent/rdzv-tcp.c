/* The TCP backend (rdzv-backend.h): our own protocol, to the rendezvous embedded in an agent or
 * to a dlaunchd. Hosts the rendezvous (and --http beside it) when this node should, joins it,
 * heartbeats, reports, reconnects with a backoff when the connection goes wrong, hosts it again
 * at a successor when its host is lost (docs/rendezvous.md, "Failover"), and turns what the
 * server says into the backend's callbacks. When to connect where, and what a lost connection
 * costs, is the pure machine of rdzv-failover.h: this file feeds it events and performs its
 * actions. */
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
#include "rdzv-failover.h"
#include "rendezvous.h"

struct dl_rdzv_impl_s {
    dl_rdzv_backend_conf_t conf;
    const dl_job_spec_t *spec;
    dl_rdzv_backend_cbs_t cbs;
    void *ctx;
    dl_rdzv_server_t *server; /* when this agent hosts the rendezvous */
    dl_http_t *http;          /* --http, when it hosts it */
    dl_rdzv_client_t *client;
    dl_rdzv_failover_t fo; /* where the rendezvous is, and what to do when it goes */
    int port;
    json_int_t next_id;
    json_int_t join_id;  /* the join waiting for its assignment, or -1 */
    dl_rdzv_join_t join; /* the last join asked for */
    bool sitting_out;    /* sit_out: no member until the next join */
    bool following;      /* the job's events come to us: its end, while we sit out */
    uv_timer_t timers[DL_RDZV_FO_TIMER_COUNT];
    bool timers_open;
    bool closed;             /* close() ran: no more callbacks */
    int open_handles;        /* timers still to close before the struct goes */
    dl_rdzv_client_t *probe; /* asks an earlier candidate whether it serves the job again */
};

typedef struct dl_rdzv_impl_s tcp_t;

static int serve(tcp_t *z, const char *ip, char *err, size_t errlen);
static int run(tcp_t *z, const dl_rdzv_fo_actions_t *acts);
static int host_and_connect(tcp_t *z);

static double mono(void)
{
    return (double)uv_hrtime() / 1e9;
}

static const char *host_of(const tcp_t *z)
{
    return dl_rdzv_failover_host(&z->fo);
}

/* Runs one event of the failover machine and performs its actions. Returns as run() does. */
static int step(tcp_t *z, dl_rdzv_fo_event_t ev)
{
    dl_rdzv_fo_actions_t acts;
    ev.now = mono();
    dl_rdzv_failover_step(&z->fo, &ev, &acts);
    return run(z, &acts);
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
    snprintf(buf, len, "%s", host_of(z));
    if (z->spec->local_addr != NULL) {
        snprintf(buf, len, "%s", z->spec->local_addr);
        return;
    }
    if (dl_rdzv_client_local_addr(z->client, buf, len) < 0)
        snprintf(buf, len, "%s", host_of(z));
}

static void follow(tcp_t *z)
{
    if (z->following)
        return;
    z->following = true;
    send_or_log(z, dl_rdzv_enc_events_follow(next_id(z)));
}

/* Joins the round now: we are connected. */
static void send_join(tcp_t *z)
{
    const dl_job_spec_t *spec = z->spec;
    const dl_rdzv_join_t *join = &z->join;
    char addr[DL_RDZV_FO_ADDR_MAX];

    z->sitting_out = false;
    local_address(z, addr, sizeof(addr));
    dl_rdzv_failover_set_my_addr(&z->fo, addr);
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
                            .failures = join->failures + dl_rdzv_failover_extra_failures(&z->fo),
                            .torch_store = !spec->store_worker};
    send_or_log(z, dl_rdzv_enc_join(z->join_id, &j));
}

/* Joins now, or, while not connected (the rendezvous declared us dead, restarted or was lost),
 * once the failover machine has connected again. */
static void tcp_join(tcp_t *z, const dl_rdzv_join_t *join)
{
    z->join = *join;
    z->sitting_out = false;
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN});
}

static void tcp_sit_out(tcp_t *z)
{
    z->sitting_out = true;
    /* No longer a member, it would not hear of the job's end: its event stream says. */
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN, .follow = true});
}

static void tcp_report_failure(tcp_t *z, const dl_rdzv_failure_t *f)
{
    if (f->excluded && !dl_rdzv_failover_ready(&z->fo))
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

static void tcp_heartbeat(tcp_t *z, const dl_rdzv_beat_t *beat)
{
    if (!dl_rdzv_failover_ready(&z->fo))
        return;
    /* The machine drops a rendezvous silent for --dead-after, and asks earlier candidates
     * whether they serve the job again while we host it as a successor. */
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK});
    if (!dl_rdzv_failover_ready(&z->fo))
        return;
    /* The progress and this node's figures and its ranks' last operations: the job-wide view
     * is made of them. */
    dl_rdzv_beat_msg_t m = dl__rdzv_beat_msg(beat, beat->round);
    send_or_log(z, dl_rdzv_enc_heartbeat(next_id(z), &m));
}

static void misbehaved(tcp_t *z, const char *why)
{
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = why});
}

static void on_assignment(tcp_t *z, json_t *m)
{
    dl_rdzv_assignment_t as;
    dl_rdzv_assignment_want_t want = {.slots = z->join.slots,
                                      .min_nodes = z->conf.nodes_min,
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
    dl_rdzv_culprit_t c;
    dl_rdzv_dec_culprit(json_object_get(m, "failure"), &c);
    const char *successors[DL_RDZV_SUCCESSORS_MAX];
    int n = 0;
    for (; n < as.nsuccessors && n < DL_RDZV_SUCCESSORS_MAX; n++)
        successors[n] = as.successors[n];
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_ASSIGNED,
                                 .node_rank = as.host_node_rank,
                                 .successors = successors,
                                 .nsuccessors = n});
    z->cbs.assigned(z->ctx, &as, c.cause != NULL ? &c : NULL);
}

static void on_message(void *ctx, json_t *m, dl_proto_type_t type)
{
    tcp_t *z = ctx;
    json_int_t id = dl_proto_get_int(m, "id", -1);
    const char *why = NULL;

    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD});
    switch (type) {
    case DL_PROTO_ASSIGNMENT:
        if (id == z->join_id)
            on_assignment(z, m);
        return;
    case DL_PROTO_ROUND_CHANGED: {
        int round;
        const char *reason;
        dl_rdzv_culprit_t c;
        dl_rdzv_dec_round_changed(m, &round, &reason, &c);
        if (c.cause != NULL && strcmp(c.cause, "node_left") == 0)
            step(z,
                 (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_NODE_LEFT, .node_rank = c.node_rank});
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
                           .status = stopped     ? "stopped"
                                     : code == 0 ? "succeeded"
                                                 : "failed",
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
            if (code == DL_PROTO_E_JOB_FULL) {
                /* Tried again until --join-timeout, then the machine gives up. */
                step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN_FULL, .why = safe});
                return;
            }
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
                               .status =
                                   dl_proto_escape(status ? status : "?", safe, sizeof(safe))};
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
    default: return; /* replies to reports carry nothing we need */
    }
}

/* ---- The failover machine's I/O (rdzv-failover.h) ------------------------------------------ */

static void on_ready(void *ctx, int status, const char *err)
{
    tcp_t *z = ctx;
    if (status >= 0) {
        step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED});
        return;
    }
    dl_rdzv_fo_fail_t fail = DL_RDZV_FO_FAIL_OTHER;
    if (status == -EACCES || status == -EPROTO)
        fail = DL_RDZV_FO_FAIL_DENIED;
    else if (status == UV_EAI_NONAME || status == UV_EAI_AGAIN || status == UV_EAI_FAIL ||
             status == UV_EAI_NODATA)
        fail = DL_RDZV_FO_FAIL_NO_NAME;
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECT_FAILED,
                                 .fail = fail,
                                 .why = err,
                                 .name_error = uv_strerror(status)});
}

static void on_lost(void *ctx, int status)
{
    tcp_t *z = ctx;
    char why[600];
    const char *text = dl_rdzv_client_error(z->client);
    snprintf(why, sizeof(why), "%s", text[0] != '\0' ? text : uv_strerror(status));
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .why = why});
}

static void on_timer(uv_timer_t *t)
{
    tcp_t *z = t->data;
    if (z->closed)
        return;
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TIMER,
                                 .timer = (dl_rdzv_fo_timer_t)(t - z->timers)});
}

static void probe_ready(void *ctx, int status, const char *err)
{
    tcp_t *z = ctx;
    (void)err;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_PROBED, .ok = status >= 0});
}

static void probe_message(void *ctx, json_t *m, dl_proto_type_t type)
{
    (void)ctx, (void)m, (void)type;
}

static void probe_lost(void *ctx, int status)
{
    (void)ctx, (void)status;
}

/* Asks host whether it serves the job again, in place of any earlier probe. */
static void start_probe(tcp_t *z, const char *host)
{
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    dl_rdzv_client_cbs_t cbs = {probe_ready, probe_message, probe_lost};
    if (dl_rdzv_client_start(z->conf.loop, host, z->port, DL_PROTO_ROLE_AGENT, z->conf.run_id,
                             z->conf.token, z->spec->heartbeat, &cbs, z, &z->probe) < 0) {
        z->probe = NULL;
        step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_PROBED, .ok = false});
    }
}

/* Returns 0, or -1 when a connection could not even start. */
static int connect_client(tcp_t *z, const dl_rdzv_fo_action_t *a)
{
    dl_rdzv_client_cbs_t cbs = {on_ready, on_message, on_lost};
    int r = dl_rdzv_client_start(z->conf.loop, a->host, z->port, DL_PROTO_ROLE_AGENT,
                                 z->conf.run_id, z->conf.token, a->timeout, &cbs, z, &z->client);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot start the rendezvous client: %s\n", uv_strerror(r));
        if (a->code != 0)
            end(z, a->code, a->status);
        return -1;
    }
    return 0;
}

/* Our turn as a successor: host the rendezvous here, unless someone at this address was
 * quicker, and tell the machine how it went. */
static int serve_as_successor(tcp_t *z, const char *ip)
{
    char err[256] = "";
    int r = serve(z, ip, err, sizeof(err));
    dl_rdzv_fo_serve_t how = r == 0               ? DL_RDZV_FO_SERVED
                             : r == UV_EADDRINUSE ? DL_RDZV_FO_SERVE_IN_USE
                                                  : DL_RDZV_FO_SERVE_FAILED;
    return step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = how, .why = err});
}

static void lost_rendezvous(tcp_t *z, const dl_rdzv_fo_action_t *a)
{
    /* Name the lost host's node, as for any lost node. */
    dl_rdzv_culprit_t c = DL_RDZV_CULPRIT_NONE;
    c.cause = a->cause;
    c.host = a->host;
    c.node_rank = a->node_rank;
    z->cbs.lost(z->ctx, a->text, a->blame ? &c : NULL);
}

/* Performs the machine's actions in order. Returns 0, or -1 when a connection that the caller
 * reports could not start. */
static int run(tcp_t *z, const dl_rdzv_fo_actions_t *acts)
{
    int ret = 0;
    for (int i = 0; i < acts->n; i++) {
        const dl_rdzv_fo_action_t *a = &acts->v[i];
        switch (a->kind) {
        case DL_RDZV_FO_SAY: say(z, "%s", a->text); break;
        case DL_RDZV_FO_ERROR: fprintf(stderr, "dlaunch: %s\n", a->text); break;
        case DL_RDZV_FO_CONNECT:
            if (connect_client(z, a) < 0)
                ret = -1;
            break;
        case DL_RDZV_FO_SERVE: ret = serve_as_successor(z, a->host); break;
        case DL_RDZV_FO_DROP:
            z->join_id = -1;
            z->following = false;
            /* fallthrough */
        case DL_RDZV_FO_CLOSE_CLIENT:
            dl_rdzv_client_close(z->client); /* freed once libuv lets go */
            z->client = NULL;
            break;
        case DL_RDZV_FO_TIMER_START:
            uv_timer_start(&z->timers[a->timer], on_timer, a->ms, 0);
            break;
        case DL_RDZV_FO_TIMER_STOP: uv_timer_stop(&z->timers[a->timer]); break;
        case DL_RDZV_FO_READY_FIRST: z->cbs.ready(z->ctx); break;
        case DL_RDZV_FO_SEND_JOIN: send_join(z); break;
        case DL_RDZV_FO_SEND_FOLLOW: follow(z); break;
        case DL_RDZV_FO_JOIN_AGAIN: tcp_join(z, &z->join); break;
        case DL_RDZV_FO_MOVED:
            if (z->cbs.moved != NULL)
                z->cbs.moved(z->ctx, a->host, z->port, a->hosting, a->seconds);
            break;
        case DL_RDZV_FO_LOST: lost_rendezvous(z, a); break;
        case DL_RDZV_FO_PROBE: start_probe(z, a->host); break;
        case DL_RDZV_FO_HAND_OVER:
            /* Our server goes, our members (ourselves included) lose it and look again. */
            dl_http_close(z->http);
            z->http = NULL;
            dl_rdzv_server_close(z->server, NULL, NULL);
            z->server = NULL;
            break;
        case DL_RDZV_FO_HOST_AGAIN: {
            int r = host_and_connect(z);
            if (r != 0)
                end(z, r, "refused");
            break;
        }
        case DL_RDZV_FO_END: end(z, a->code, a->status); break;
        }
    }
    return ret;
}

/* --http beside the rendezvous this agent hosts. Returns 0, or -errno having said why. */
static int start_http(tcp_t *z)
{
    char url[300], err[600];
    int r = dl__rdzv_http_start(&z->conf, z->server, &z->http, url, sizeof(url), err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return r;
    }
    say(z, "status page and metrics on %s", url);
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
    /* The kernel's pick, held from the bind on: the port this agent found free at its start
     * may have been taken since (another program's connection), and was, under load. */
    so.torch_port = 0;
    so.log = server_log;
    so.log_ctx = z;
    int r = dl_rdzv_server_start(z->conf.loop, &so, &z->server, err, errlen);
    if (r < 0)
        return r;
    /* Our join offers the store's port as MASTER_PORT: the core names node rank 0's offer. */
    int torch_port = dl_rdzv_server_torch_port(z->server);
    if (torch_port > 0)
        z->conf.master_port = torch_port;
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
    const char *endpoint = host_of(z);
    int g = getaddrinfo(endpoint, NULL, &hints, &res);
    if (g != 0) {
        if (rank != 0)
            return 0;
        /* Only what a name not (yet) published gives is worth waiting for. */
        bool not_yet = g == EAI_NONAME || g == EAI_AGAIN || g == EAI_FAIL
#ifdef EAI_NODATA
                       || g == EAI_NODATA
#endif
            ;
        bool first;
        bool wait = dl_rdzv_failover_name_wait(&z->fo, mono(), &first);
        if (first && not_yet)
            say(z,
                "the rendezvous endpoint '%s' does not resolve yet (%s): trying again "
                "until --join-timeout %g s",
                endpoint, gai_strerror(g), z->spec->join_timeout);
        if (not_yet && wait)
            return -EAGAIN;
        fprintf(stderr, "dlaunch: --rdzv-endpoint: cannot resolve '%s' (%s)%s\n", endpoint,
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
        step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVED});
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
            say(z, "%s:%d is already served: joining it as node rank 0", endpoint, z->port);
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
    dl_rdzv_fo_actions_t none;
    dl_rdzv_failover_step(&z->fo, &(dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CLOSE}, &none);
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    dl_http_close(z->http);
    z->http = NULL;
    dl_rdzv_server_close(z->server, NULL, NULL);
    z->server = NULL;
    if (!z->timers_open) {
        tcp_free(z);
        return;
    }
    for (int i = 0; i < DL_RDZV_FO_TIMER_COUNT; i++)
        uv_close((uv_handle_t *)&z->timers[i], timer_closed);
}

/* Hosts the rendezvous if this node should, then connects to it. Returns 0 (also while node 0
 * waits for its name to resolve) or an exit code. */
static int host_and_connect(tcp_t *z)
{
    int r = maybe_host(z);
    if (r == -EAGAIN)
        return step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HOST_WAIT}) < 0 ? 1 : 0;
    if (r != 0)
        return r;
    return step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_START}) < 0 ? 1 : 0;
}

static int tcp_start(const dl_rdzv_backend_conf_t *conf, const dl_rdzv_backend_cbs_t *cbs,
                     void *ctx, dl_rdzv_impl_t **ret)
{
    tcp_t *z = calloc(1, sizeof(*z));
    dl_rdzv_fo_opts_t fo = {.join_timeout = conf->spec->join_timeout,
                            .dead_after = conf->spec->dead_after,
                            .heartbeat = conf->spec->heartbeat,
                            .may_host = conf->spec->is_host != 0};

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
    if (dl_rdzv_endpoint_parse(conf->endpoint, fo.host, sizeof(fo.host), &fo.port) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-endpoint: '%s' is not HOST:PORT\n", conf->endpoint);
        free(z);
        return 2;
    }
    z->port = fo.port;
    dl_rdzv_failover_init(&z->fo, &fo);
    *ret = z;
    for (int i = 0; i < DL_RDZV_FO_TIMER_COUNT; i++) {
        uv_timer_init(conf->loop, &z->timers[i]);
        z->timers[i].data = z;
    }
    z->timers_open = true;
    z->open_handles = DL_RDZV_FO_TIMER_COUNT;
    return host_and_connect(z); /* on failure the agent closes it */
}

static void tcp_leave(tcp_t *z, const char *reason)
{
    if (!dl_rdzv_failover_ready(&z->fo))
        return;
    send_or_log(z, dl_rdzv_enc_leave(next_id(z), reason));
    step(z, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LEAVE});
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
