/* The agent's side of a job over several nodes: host the rendezvous when this node should,
 * join it, heartbeat, report, and turn what it says into supervisor events. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http.h"
#include "internal.h"
#include "rendezvous.h"
#include "summary.h"

typedef struct dl__rdzv_s {
    dl_agent_t *agent;
    dl_rdzv_server_t *server; /* when this agent hosts the rendezvous */
    dl_http_t *http;          /* --http, when it hosts it */
    dl_rdzv_client_t *client;
    dl_proto_token_t *token;
    uv_timer_t heartbeat;
    bool heartbeat_open;
    char host[256]; /* the endpoint's */
    int port;
    char node_id[300];
    char hostname[256];
    json_int_t next_id;
    json_int_t join_id; /* the join waiting for its assignment, or -1 */
    bool ready;
    bool started;       /* the supervisor has been started (first connection) */
    bool connecting;
    /* Diagnostics (diag.c): the last round change's reason for the restart event, and while
     * this node sits out as a straggler, the join it holds back and its status polls. */
    char last_reason[1024];
    bool join_held;
    bool following; /* the job's events come to us: its end, while we sit out */
} rdzv_t;

static int connect_client(dl_agent_t *a);

static void server_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    dl_agent_t *a = ctx;
    if (level >= DL_RDZV_LOG_INFO || a->spec->verbose)
        fprintf(stderr, "[rdzv%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

static json_int_t next_id(rdzv_t *z)
{
    return z->next_id++;
}

static void send_or_log(rdzv_t *z, json_t *m)
{
    if (m == NULL)
        return;
    int r = dl_rdzv_client_send(z->client, m);
    if (r < 0)
        dl__agent_log(z->agent, "cannot send %s to the rendezvous: %s",
                      dl_proto_get_str(m, "type"), strerror(-r));
    json_decref(m);
}

/* Where the other nodes can reach this one: --local-addr, else the address our rendezvous
 * connection leaves from. */
static void local_address(rdzv_t *z, char *buf, size_t len)
{
    snprintf(buf, len, "%s", z->host);
    if (z->agent->spec->local_addr != NULL) {
        snprintf(buf, len, "%s", z->agent->spec->local_addr);
        return;
    }
    if (dl_rdzv_client_local_addr(z->client, buf, len) < 0)
        snprintf(buf, len, "%s", z->host);
}

void dl__rdzv_join(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    const dl_job_spec_t *spec = a->spec;

    if (!z->ready) {
        /* Lost the rendezvous (it declared us dead, or restarted): connect again and join as a
         * new member once the handshake is done. */
        if (!z->connecting && connect_client(a) < 0)
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 3});
        return;
    }
    char addr[sizeof(z->host)];
    double wait;

    if (dl__diag_excluded(a, &wait)) {
        if (!z->join_held)
            dl__agent_log(a, "this node sits out as a straggler: joining again in %.0f s, unless "
                             "the job ends first",
                          wait);
        z->join_held = true;
        /* No longer a member, it would not hear of the job's end: its event stream says. */
        if (!z->following) {
            z->following = true;
            send_or_log(z, dl_proto_msg_new(DL_PROTO_EVENTS_FOLLOW, next_id(z)));
        }
        return;
    }
    z->join_held = false;
    local_address(z, addr, sizeof(addr));
    z->join_id = next_id(z);
    json_t *m = dl_proto_msg_new(DL_PROTO_JOIN, z->join_id);
    json_object_update_new(
        m, json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:i, s:s, s:i}", "node_id",
                     z->node_id, "host", z->hostname, "slots", a->nworkers, "node_rank",
                     a->want_node_rank, "min_nodes", a->nodes_min, "max_nodes", a->nodes_max,
                     "last_call_ms", (json_int_t)(spec->last_call * 1000), "join_timeout_ms",
                     (json_int_t)(spec->join_timeout * 1000), "dead_after_ms",
                     (json_int_t)(spec->dead_after * 1000), "max_restarts", spec->max_restarts,
                     "master_addr", addr, "master_port", a->master_port));
    if (a->round > 0)
        json_object_set_new(m, "round", json_integer(a->round));
    send_or_log(z, m);
}

void dl__rdzv_report(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    const dl_sup_failure_t *f = &a->sup.first_failure;
    char reason[400];
    int local = f->rank - (a->nworkers > 0 ? a->workers[0].rank : 0);

    if (f->hung)
        snprintf(reason, sizeof(reason), "rank %d on %s hung (no health beat in time)", f->rank,
                 z->hostname);
    else if (f->signal > 0)
        snprintf(reason, sizeof(reason), "rank %d on %s was killed by %s", f->rank,
                 z->hostname, dl_signal_name(f->signal));
    else if (f->spawn_errno > 0)
        snprintf(reason, sizeof(reason), "rank %d on %s could not be started: %s", f->rank,
                 z->hostname, strerror(f->spawn_errno));
    else
        snprintf(reason, sizeof(reason), "rank %d on %s exited with code %d", f->rank,
                 z->hostname, f->exit_code);
    json_t *m = dl_proto_msg_new(DL_PROTO_WORKER_FAILED, next_id(z));
    json_object_set_new(m, "round", json_integer(a->round));
    json_object_set_new(m, "rank", json_integer(f->rank));
    json_object_set_new(m, "local_rank", json_integer(local));
    if (f->signal > 0)
        json_object_set_new(m, "signal", json_integer(f->signal));
    else
        json_object_set_new(m, "exit_code", json_integer(f->exit_code >= 0 ? f->exit_code : 127));
    json_object_set_new(m, "reason", json_string(reason));
    json_object_set_new(m, "time", json_real(f->time));
    /* The end of its stderr (else of its stdout), for the status page; the agent's summary
     * shows the same lines. */
    char path[sizeof(a->attempt_dir) + 32], tail[4096];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/rank_%d.%s", a->attempt_dir, f->rank, i ? "out" : "err");
        if (dl_summary_tail(path, 20, tail, sizeof(tail)) > 0) {
            json_object_set_new(m, "log_tail", json_string(tail));
            break;
        }
    }
    /* Where this node's ranks were: the rendezvous makes the job-wide account of it. */
    json_t *rep = dl__diag_failure_report(a);
    if (rep != NULL)
        json_object_set_new(m, "diag", rep);
    send_or_log(z, m);
}

void dl__rdzv_exclude(dl_agent_t *a, int rank, const char *reason)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL || !z->ready)
        return;
    json_t *m = dl_proto_msg_new(DL_PROTO_WORKER_FAILED, next_id(z));
    json_object_set_new(m, "round", json_integer(a->round));
    json_object_set_new(m, "rank", json_integer(rank));
    json_object_set_new(m, "exit_code", json_integer(0));
    json_object_set_new(m, "excluded", json_true());
    json_object_set_new(m, "reason", json_string(reason));
    json_object_set_new(m, "time", json_real(dl__now_unix()));
    send_or_log(z, m);
}

void dl__rdzv_node_done(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    json_t *m = dl_proto_msg_new(DL_PROTO_NODE_DONE, next_id(z));
    json_object_set_new(m, "round", json_integer(a->round));
    send_or_log(z, m);
}

static void on_heartbeat(uv_timer_t *t)
{
    rdzv_t *z = t->data;
    dl_agent_t *a = z->agent;
    double wait;
    if (z->join_held) {
        /* Sitting out: join once the cool-down is over. */
        if (!dl__diag_excluded(a, &wait))
            dl__rdzv_join(a);
        return;
    }
    json_t *m = dl_proto_msg_new(DL_PROTO_HEARTBEAT, next_id(z));
    json_object_set_new(m, "round", json_integer(a->round));
    /* The progress hook: whatever fills a->progress, the rendezvous gets it with the beat. */
    dl__agent_progress_poll(a);
    if (a->progress_valid) {
        json_t *p = json_pack("{s:I}", "step", (json_int_t)a->progress.step);
        if (p != NULL && !isnan(a->progress.loss))
            json_object_set_new(p, "loss", json_real(a->progress.loss));
        if (p != NULL && !isnan(a->progress.samples_per_s))
            json_object_set_new(p, "samples_per_s", json_real(a->progress.samples_per_s));
        json_object_set_new(m, "progress", p);
    }
    /* This node's figures and its ranks' last operations: the job-wide view is made of them. */
    if (a->sup.phase == DL_SUP_RUNNING) {
        json_t *rep = dl__diag_report(a);
        if (rep != NULL)
            json_object_set_new(m, "diag", rep);
    }
    send_or_log(z, m);
}

static void on_assignment(dl_agent_t *a, json_t *m)
{
    rdzv_t *z = a->rdzv;
    int first = (int)dl_proto_get_int(m, "first_rank", 0);
    int local = (int)dl_proto_get_int(m, "local_world_size", a->nworkers);
    int restarts = (int)dl_proto_get_int(m, "restart_count", 0);

    z->join_id = -1;
    a->round = (int)dl_proto_get_int(m, "round", 0);
    a->node_rank = (int)dl_proto_get_int(m, "node_rank", 0);
    a->nnodes = (int)dl_proto_get_int(m, "nodes", 1);
    a->world_size = (int)dl_proto_get_int(m, "world_size", local);
    a->master_port = (int)dl_proto_get_int(m, "master_port", a->master_port);
    snprintf(a->store_addr, sizeof(a->store_addr), "%s", dl_proto_get_str(m, "store_addr"));
    snprintf(a->master_addr, sizeof(a->master_addr), "%s", dl_proto_get_str(m, "master_addr"));
    if (dl__agent_set_ranks(a, first, local) < 0) {
        dl__agent_log(a, "out of memory");
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 1});
        return;
    }
    a->sup.nworkers = local;
    if (!a->spec->quiet)
        dl__agent_log(a, "round %d: node rank %d of %d on %s, ranks %d..%d of %d", a->round,
                      a->node_rank, a->nnodes, z->hostname, first, first + local - 1,
                      a->world_size);
    if (restarts > 0) {
        json_t *f = json_pack("{s:i, s:i}", "attempt", restarts, "round", a->round);
        /* The round change's reason: the failure and, for a hang, where the ranks were. */
        if (z->last_reason[0] != '\0')
            json_object_set_new(f, "reason", json_string(z->last_reason));
        dl_events_emit(a->events, "restart", dl__now_unix(), f);
    }
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ASSIGNED, .attempt = restarts});
}

static void on_message(void *ctx, json_t *m, dl_proto_type_t type)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    json_int_t id = dl_proto_get_int(m, "id", -1);
    const char *why = NULL;

    switch (type) {
    case DL_PROTO_ASSIGNMENT:
        if (id == z->join_id)
            on_assignment(a, m);
        return;
    case DL_PROTO_ROUND_CHANGED:
        snprintf(z->last_reason, sizeof(z->last_reason), "%s", dl_proto_get_str(m, "reason"));
        dl__agent_log(a, "round %lld: %s; restarting this node's workers",
                      (long long)dl_proto_get_int(m, "round", 0), dl_proto_get_str(m, "reason"));
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED});
        return;
    case DL_PROTO_SHUTDOWN: {
        const char *reason = dl_proto_get_str(m, "reason");
        json_t *failure = json_object_get(m, "failure");
        const char *desc = json_string_value(json_object_get(failure, "description"));
        if (desc != NULL)
            snprintf(a->failure_text, sizeof(a->failure_text), "%s", desc);
        /* The job's own ending, as the rendezvous says it (a stopped job ends in exit 0 too). */
        if (strcmp(reason, "stopped") == 0)
            a->stopped_by_request = true;
        if (strcmp(reason, "succeeded") != 0)
            dl__agent_log(a, "the rendezvous ended the job: %s%s%s", reason,
                          desc ? ": " : "", desc ? desc : "");
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                           .exit_code = (int)dl_proto_get_int(m, "exit_code", 1)});
        return;
    }
    case DL_PROTO_ERROR: {
        dl_proto_errcode_t code = dl_proto_reply_error(m, &why);
        if (id == z->join_id) {
            z->join_id = -1;
            fprintf(stderr, "dlaunch: %s\n", why ? why : "the rendezvous refused to join");
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                               .exit_code = code == DL_PROTO_E_TIMEOUT ? 3 : 4});
        } else {
            dl__agent_log(a, "the rendezvous answered an error: %s", why ? why : "?");
        }
        return;
    }
    case DL_PROTO_EVENT: {
        /* Followed while sitting out: the job ended without this node. */
        json_t *ev = json_object_get(m, "event");
        const char *name = json_string_value(json_object_get(ev, "event"));
        if (z->join_held && name != NULL && strcmp(name, "job_end") == 0) {
            const char *status = json_string_value(json_object_get(ev, "status"));
            dl__agent_log(a, "the job ended (%s) while this node sat out as a straggler",
                          status ? status : "?");
            z->join_held = false;
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                               .exit_code = status != NULL &&
                                                                    strcmp(status, "failed") == 0
                                                                ? 1
                                                                : 0});
        }
        return;
    }
    case DL_PROTO_REPLY: {
        json_t *result = json_object_get(m, "result");
        /* A heartbeat's answer: the job-wide figures and the stragglers named. */
        json_t *view = json_object_get(result, "diag");
        if (view != NULL && a->sup.phase == DL_SUP_RUNNING)
            dl__diag_on_view(a, view);
        return;
    }
    default:
        return; /* replies to reports carry nothing we need */
    }
}

static void on_ready(void *ctx, int status, const char *err)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    z->connecting = false;
    if (status < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                           .exit_code = status == -ETIMEDOUT      ? 3
                                                        : status == -EACCES ||
                                                                  status == -EPROTO
                                                            ? 4
                                                            : 3});
        return;
    }
    z->ready = true;
    z->connecting = false;
    uint64_t every = (uint64_t)(a->spec->heartbeat * 1000);
    uv_timer_start(&z->heartbeat, on_heartbeat, every, every);
    if (z->started) {
        dl__rdzv_join(a);
        return;
    }
    z->started = true;
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_START});
}

static void on_lost(void *ctx, int status)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    z->ready = false;
    z->join_id = -1;
    z->following = false;
    uv_timer_stop(&z->heartbeat);
    dl_rdzv_client_close(z->client); /* freed once libuv lets go; a new one takes its place */
    z->client = NULL;
    dl__agent_log(a, "lost the rendezvous at %s:%d (%s): stopping this node's workers and "
                     "joining again",
                  z->host, z->port, uv_strerror(status));
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED});
}

static int connect_client(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    dl_rdzv_client_cbs_t cbs = {on_ready, on_message, on_lost};
    int r = dl_rdzv_client_start(&a->loop, z->host, z->port, DL_PROTO_ROLE_AGENT, a->run_id,
                                 z->token, a->spec->join_timeout, &cbs, a, &z->client);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot start the rendezvous client: %s\n", uv_strerror(r));
        return r;
    }
    z->connecting = true;
    return 0;
}

static int load_token(dl_agent_t *a, rdzv_t *z)
{
    char err[512];
    const char *env = dl_env_get(a->environ_list, "DLAUNCH_TOKEN");
    int r = dl_proto_token_load(a->spec->token_file, env, &z->token, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return r;
    }
    /* Workers may run elsewhere in the tree: hand them a path that does not depend on it. */
    if (a->spec->token_file != NULL &&
        (a->token_path = realpath(a->spec->token_file, NULL)) == NULL) {
        r = -errno;
        fprintf(stderr, "dlaunch: %s: %s\n", a->spec->token_file, strerror(-r));
        return r;
    }
    return 0;
}

/* --http beside the rendezvous this agent hosts. Returns 0, or -errno having said why. */
static int start_http(dl_agent_t *a, rdzv_t *z)
{
    dl_http_opts_t ho;
    char host[256], err[512], title[300];
    int port, r;

    if (dl_rdzv_listen_parse(a->spec->http, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "dlaunch: --http: '%s' is not ADDR:PORT\n", a->spec->http);
        return -EINVAL;
    }
    snprintf(title, sizeof(title), "dlaunch %s", a->run_id);
    dl_http_opts_init(&ho);
    ho.host = host;
    ho.port = port;
    ho.token = z->token;
    ho.title = title;
    r = dl_http_start(&a->loop, z->server, &ho, &z->http, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: --http: %s\n", err);
        return r;
    }
    dl__agent_log(a, "status page and metrics on http://%s%s%s:%d/", strchr(host, ':') ? "[" : "",
                  host, strchr(host, ':') ? "]" : "", dl_http_port(z->http));
    return 0;
}

/* Host the rendezvous if this node should: --node-rank 0, or (no rank given) the endpoint is one
 * of our addresses and nobody serves it yet. Returns 0 or an exit code. */
static int maybe_host(dl_agent_t *a, rdzv_t *z)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    char ip[INET6_ADDRSTRLEN], err[512];
    dl_rdzv_server_opts_t so;
    int r;

    int rank = a->want_node_rank;

    /* --rdzv-conf is_host decides when given; else node rank 0 hosts, or the first to bind. */
    if (a->spec->is_host == 0 || (a->spec->is_host < 0 && rank > 0))
        return 0;
    if (a->spec->is_host == 1)
        rank = 0;
    if (getaddrinfo(z->host, NULL, &hints, &res) != 0) {
        if (rank == 0) {
            fprintf(stderr, "dlaunch: --rdzv-endpoint: cannot resolve '%s'\n", z->host);
            return 2;
        }
        return 0;
    }
    if (res->ai_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof(ip));
    else
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, ip, sizeof(ip));
    freeaddrinfo(res);

    dl_rdzv_server_opts_init(&so);
    so.host = ip;
    so.port = z->port;
    so.token = z->token;
    so.heartbeat = a->spec->heartbeat;
    so.log = server_log;
    so.log_ctx = a;
    r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, sizeof(err));
    if (r == 0) {
        dl_rdzv_job_opts_t jo;
        dl_rdzv_job_opts_init(&jo);
        jo.min_nodes = a->nodes_min;
        jo.max_nodes = a->nodes_max;
        jo.last_call = a->spec->last_call;
        jo.join_timeout = a->spec->join_timeout;
        jo.dead_after = a->spec->dead_after;
        jo.max_restarts = a->spec->max_restarts;
        jo.master_port = a->master_port;
        r = dl_rdzv_server_add_job(z->server, a->run_id, &jo);
        if (r < 0 && r != -EEXIST) {
            fprintf(stderr, "dlaunch: cannot set up the job's rendezvous: %s\n", strerror(-r));
            return 2;
        }
        if (a->spec->http != NULL && start_http(a, z) < 0)
            return 2;
        if (a->spec->verbose)
            dl__agent_log(a, "hosting the rendezvous on %s:%d", ip, z->port);
        return 0;
    }
    /* Someone else serves it already (dlaunchd, or an agent that bound it first), or it is not
     * our address: join as a client. */
    if (r == UV_EADDRINUSE || (r == UV_EADDRNOTAVAIL && rank != 0)) {
        if (a->spec->http != NULL && a->spec->verbose)
            dl__agent_log(a, "--http: the rendezvous is served elsewhere, so is its status");
        if (rank == 0)
            dl__agent_log(a, "%s:%d is already served: joining it as node rank 0", z->host,
                          z->port);
        return 0;
    }
    fprintf(stderr, "dlaunch: cannot host the rendezvous: %s\n", err);
    return 2;
}

int dl__rdzv_start(dl_agent_t *a)
{
    rdzv_t *z = calloc(1, sizeof(*z));
    int r;

    if (z == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 1;
    }
    a->rdzv = z;
    z->agent = a;
    z->join_id = -1;
    if (dl_rdzv_endpoint_parse(a->endpoint, z->host, sizeof(z->host), &z->port) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-endpoint: '%s' is not HOST:PORT\n", a->endpoint);
        return 2;
    }
    if (load_token(a, z) < 0)
        return 2;
    if (gethostname(z->hostname, sizeof(z->hostname)) < 0)
        snprintf(z->hostname, sizeof(z->hostname), "localhost");
    snprintf(z->node_id, sizeof(z->node_id), "%s-%d", z->hostname, (int)getpid());
    r = maybe_host(a, z);
    if (r != 0)
        return r;
    uv_timer_init(&a->loop, &z->heartbeat);
    z->heartbeat.data = z;
    z->heartbeat_open = true;
    return connect_client(a) < 0 ? 1 : 0;
}

int dl__rdzv_local_store(dl_agent_t *a)
{
    rdzv_t *z = calloc(1, sizeof(*z));
    dl_rdzv_server_opts_t so;
    char err[256];
    int r;

    if (z == NULL)
        return -ENOMEM;
    a->rdzv = z;
    z->agent = a;
    dl_rdzv_server_opts_init(&so);
    so.log = server_log;
    so.log_ctx = a;
    r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, sizeof(err));
    if (r < 0)
        return r;
    dl_rdzv_job_opts_t jo;
    dl_rdzv_job_opts_init(&jo);
    jo.max_restarts = a->spec->max_restarts;
    r = dl_rdzv_server_add_job(z->server, a->run_id, &jo);
    if (r < 0)
        return r;
    snprintf(a->store_addr, sizeof(a->store_addr), "127.0.0.1:%d",
             dl_rdzv_server_port(z->server));
    return 0;
}

void dl__rdzv_local_store_reset(dl_agent_t *a)
{
    if (a->rdzv != NULL && a->rdzv->server != NULL)
        dl_rdzv_server_reset_store(a->rdzv->server, a->run_id);
}

static void server_closed(void *ctx)
{
    (void)ctx;
}

void dl__rdzv_finish(dl_agent_t *a, int exit_code)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL)
        return;
    if (z->ready && exit_code >= 128) {
        json_t *m = dl_proto_msg_new(DL_PROTO_LEAVE, next_id(z));
        json_object_set_new(m, "reason", json_string(dl_signal_name(exit_code - 128)));
        send_or_log(z, m);
    }
    if (z->heartbeat_open) {
        uv_close((uv_handle_t *)&z->heartbeat, NULL);
        z->heartbeat_open = false;
    }
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    z->ready = false;
    dl_http_close(z->http);
    z->http = NULL;
    dl_rdzv_server_close(z->server, server_closed, NULL);
    z->server = NULL;
}

void dl__rdzv_free(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL)
        return;
    dl_proto_token_free(z->token);
    free(z);
    a->rdzv = NULL;
}
