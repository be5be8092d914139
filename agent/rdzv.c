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
#include "workercred.h"

/* Reconnecting to a rendezvous that misbehaves: the first retry after this, doubling up to
 * BACKOFF_MAX_MS; a connection that lasted STABLE_S resets the count. */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STABLE_S 10.0

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
    json_t *last_failure; /* its culprit, as the restart event's reason; NULL when none */
    /* Whether a round was assigned yet, and the restarts it said were spent: joins carry them, so
     * that a restarted rendezvous goes on counting. */
    bool assigned;
    int spent;
    bool join_held;
    bool following; /* the job's events come to us: its end, while we sit out */
    uv_timer_t backoff; /* the next connection, when the last one went wrong */
    bool backoff_open;
    int failures;         /* connections in a row that went wrong */
    double ready_at;      /* monotonic seconds the connection became ready */
    double heard_at;      /* monotonic seconds of the rendezvous's last message */
    /* Failover (docs/rendezvous.md): the last round's successors, our own address as they know
     * it, and while the rendezvous is being looked for, the candidates left to try. */
    char successors[DL_RDZV_SUCCESSORS_MAX][DL_PROTO_NAME_MAX + 1];
    int nsuccessors;
    char my_addr[DL_PROTO_NAME_MAX + 1];
    char cands[DL_RDZV_SUCCESSORS_MAX + 1][DL_PROTO_NAME_MAX + 1];
    int ncands, cand;
    bool failing_over;
    bool lost_silently; /* while drop_connection runs for a rendezvous gone silent */
    /* Hosting as a successor: the candidates before ours are asked now and then whether they
     * serve the job again (a partition healed); the first that does is handed the job. */
    int host_index; /* ours among the candidates when we host as a successor, else 0 */
    dl_rdzv_client_t *probe;
    int probe_index;
    double failover_since;
    uv_timer_t cand_timer; /* a candidate that neither answers nor refuses */
    bool cand_timer_open;
    double ticked_at;     /* of the last heartbeat tick */
    bool join_wanted;     /* the supervisor asked to join while the backoff ran */
    double trouble_since; /* monotonic seconds of the first of those failures, or 0 */
} rdzv_t;

static int connect_client(dl_agent_t *a);

static double mono(void)
{
    return (double)uv_hrtime() / 1e9;
}

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
         * new member once the handshake is done; after a failure, only once the backoff ran. */
        if (z->connecting)
            return;
        if (uv_is_active((uv_handle_t *)&z->backoff)) {
            z->join_wanted = true;
            return;
        }
        if (connect_client(a) < 0)
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
    snprintf(z->my_addr, sizeof(z->my_addr), "%s", addr);
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
    if (z->assigned) {
        json_object_set_new(m, "round", json_integer(a->round));
        json_object_set_new(m, "failures", json_integer(z->spent));
    }
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
    if (f->hung)
        json_object_set_new(m, "hung", json_true());
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

static void drop_connection(dl_agent_t *a, bool misbehaving, const char *what);
static void probe_earlier(dl_agent_t *a);

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
    /* Every heartbeat is answered. A rendezvous that has not answered for --dead-after is as
     * dead to us as we would be to it: a host that lost power sends no FIN or RST, and TCP
     * would wait for many minutes. */
    double now = mono(), silent = now - z->heard_at;
    /* A loop that was itself held up (timers run before pending reads) has not looked: the
     * rendezvous gets a fair period from now. */
    if (now - z->ticked_at > 2 * a->spec->heartbeat + 0.5) {
        z->heard_at = now;
        silent = 0;
    }
    z->ticked_at = now;
    probe_earlier(a);
    if (silent > a->spec->dead_after) {
        char why[128];
        snprintf(why, sizeof(why), "no answer for %.1f s, over --dead-after %g s", silent,
                 a->spec->dead_after);
        z->lost_silently = true;
        drop_connection(a, false, why);
        z->lost_silently = false;
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

static void misbehaved(dl_agent_t *a, const char *why);

/* The restart event's reason on several nodes, in the one-node event's terms
 * ({rank, attempt, exit_code | signal | hung}) plus where: the culprit's node, its node rank and
 * the cause. Read field by field: the server's object is not trusted to hold what it should. */
static json_t *culprit_reason(const json_t *c, int attempt)
{
    json_t *o = json_pack("{s:i}", "attempt", attempt);
    if (c == NULL) {
        json_object_set_new(o, "cause", json_string("requested"));
        return o;
    }
    static const char *const names[] = {"cause", "node", "host"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const json_t *v = json_object_get(c, names[i]);
        if (json_is_string(v))
            json_object_set(o, names[i], (json_t *)v);
    }
    static const char *const ints[] = {"node_rank", "rank", "exit_code"};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        const json_t *v = json_object_get(c, ints[i]);
        if (json_is_integer(v))
            json_object_set(o, ints[i], (json_t *)v);
    }
    const json_t *sig = json_object_get(c, "signal");
    if (json_is_integer(sig))
        json_object_set_new(o, "signal", json_string(dl_signal_name((int)json_integer_value(sig))));
    if (json_is_true(json_object_get(c, "hung")))
        json_object_set_new(o, "hung", json_true());
    return o;
}

static void on_assignment(dl_agent_t *a, json_t *m)
{
    rdzv_t *z = a->rdzv;
    dl_rdzv_assignment_t as;
    dl_rdzv_assignment_want_t want = {.slots = a->nworkers, .min_nodes = a->nodes_min,
                                      .max_nodes = a->nodes_max, .min_round = a->round};
    char err[256], why[300];

    z->join_id = -1;
    /* Ranks, sizes and addresses go into workers' environments: nothing we did not ask for. */
    if (dl_rdzv_assignment_read(m, &want, &as, err, sizeof(err)) < 0) {
        snprintf(why, sizeof(why), "an assignment this node cannot take: %s", err);
        misbehaved(a, why);
        return;
    }
    int first = as.first_rank, local = as.local_world_size, restarts = as.restart_count;
    a->round = as.round;
    z->assigned = true;
    z->nsuccessors = as.nsuccessors;
    for (int i = 0; i < as.nsuccessors; i++)
        snprintf(z->successors[i], sizeof(z->successors[i]), "%s", as.successors[i]);
    z->spent = as.failures;
    a->node_rank = as.node_rank;
    a->nnodes = as.nodes;
    a->world_size = as.world_size;
    a->master_port = as.master_port;
    snprintf(a->store_addr, sizeof(a->store_addr), "%s", as.store_addr);
    snprintf(a->master_addr, sizeof(a->master_addr), "%s", as.master_addr);
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
        json_t *f = json_pack("{s:i, s:i, s:o}", "attempt", restarts, "round", a->round,
                              "reason", culprit_reason(z->last_failure, restarts - 1));
        /* The round change's text: the failure and, for a hang, where the ranks were. */
        if (z->last_reason[0] != '\0')
            json_object_set_new(f, "diagnosis", json_string(z->last_reason));
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

    z->heard_at = mono();
    switch (type) {
    case DL_PROTO_ASSIGNMENT:
        if (id == z->join_id)
            on_assignment(a, m);
        return;
    case DL_PROTO_ROUND_CHANGED: {
        char reason[1200];
        snprintf(z->last_reason, sizeof(z->last_reason), "%s", dl_proto_get_str(m, "reason"));
        json_decref(z->last_failure);
        z->last_failure = json_incref(json_object_get(m, "failure"));
        if (z->last_failure == NULL) {
            /* No failure: an operator's restart or a node joining; the cause says which. */
            const char *cause = dl_proto_get_str(m, "cause");
            z->last_failure = json_pack("{s:s}", "cause", cause != NULL ? cause : "requested");
        }
        dl__agent_log(a, "round %lld: %s; restarting this node's workers",
                      (long long)dl_proto_get_int(m, "round", 0),
                      dl_proto_escape(dl_proto_get_str(m, "reason"), reason, sizeof(reason)));
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED});
        return;
    }
    case DL_PROTO_SHUTDOWN: {
        const char *reason = dl_proto_get_str(m, "reason");
        json_t *failure = json_object_get(m, "failure");
        const char *desc = json_string_value(json_object_get(failure, "description"));
        char safe_reason[1200];
        dl_proto_escape(reason, safe_reason, sizeof(safe_reason));
        if (desc != NULL)
            dl_proto_escape(desc, a->failure_text, sizeof(a->failure_text));
        /* The job's own ending, as the rendezvous says it (a stopped job ends in exit 0 too). */
        if (strcmp(reason, "stopped") == 0)
            a->stopped_by_request = true;
        if (strcmp(reason, "succeeded") != 0)
            dl__agent_log(a, "the rendezvous ended the job: %s%s%s", safe_reason,
                          desc ? ": " : "", desc ? a->failure_text : "");
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                           .exit_code = (int)dl_proto_get_int(m, "exit_code", 1)});
        return;
    }
    case DL_PROTO_ERROR: {
        dl_proto_errcode_t code = dl_proto_reply_error(m, &why);
        if (id == z->join_id) {
            char safe[1200];
            z->join_id = -1;
            fprintf(stderr, "dlaunch: %s\n",
                    dl_proto_escape(why ? why : "the rendezvous refused to join", safe,
                                    sizeof(safe)));
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END,
                                               .exit_code = code == DL_PROTO_E_TIMEOUT ? 3 : 4});
        } else {
            char safe[1200];
            dl__agent_log(a, "the rendezvous answered an error: %s",
                          dl_proto_escape(why ? why : "?", safe, sizeof(safe)));
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

/* ---- Failover (docs/rendezvous.md, "Failover") ------------------------------------------
 * The rendezvous is looked for where it was, then at the last round's successors in node-rank
 * order. At our own address we host it ourselves; elsewhere a candidate gets --dead-after to
 * answer, as a dead node gets from the rendezvous, before the next one's turn. */

static int connect_client(dl_agent_t *a);
static int serve(dl_agent_t *a, rdzv_t *z, const char *ip, char *err, size_t errlen);
static void server_closed(void *ctx);

/* silent: the rendezvous answered nothing for --dead-after, so its address is not worth another
 * wait of that long. */
static void failover_begin(dl_agent_t *a, bool silent)
{
    rdzv_t *z = a->rdzv;
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
    z->failover_since = mono();
}

static void failover_next(dl_agent_t *a, const char *why)
{
    rdzv_t *z = a->rdzv;
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    z->connecting = false;
    if (++z->cand < z->ncands && mono() - z->failover_since < a->spec->join_timeout) {
        dl__agent_log(a, "no rendezvous at %s:%d (%s): trying %s, the next successor", z->host,
                      z->port, why, z->cands[z->cand]);
        if (connect_client(a) < 0)
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 3});
        return;
    }
    fprintf(stderr, "dlaunch: the rendezvous is lost, and none of its %d successor%s serves it "
                    "(last: %s:%d, %s)\n",
            z->ncands, z->ncands == 1 ? "" : "s", z->host, z->port, why);
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 3});
}

static void on_cand_timeout(uv_timer_t *t)
{
    rdzv_t *z = t->data;
    if (z->connecting && z->failing_over) {
        char why[64];
        snprintf(why, sizeof(why), "no answer within --dead-after %g s", z->agent->spec->dead_after);
        failover_next(z->agent, why);
    }
}

static void probe_ready(void *ctx, int status, const char *err)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    (void)err;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
    if (status < 0 || z->server == NULL || z->host_index == 0)
        return;
    /* An earlier candidate serves the job again: it goes first. Our server goes, our members
     * (ourselves included) lose it and look again, starting there. */
    dl__agent_log(a, "the rendezvous at %s:%d answers again: handing the job over to it",
                  z->cands[z->probe_index], z->port);
    snprintf(z->host, sizeof(z->host), "%s", z->cands[z->probe_index]);
    z->host_index = 0;
    dl_rdzv_server_close(z->server, server_closed, NULL);
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

/* At each heartbeat while we host as a successor: ask the next earlier candidate. */
static void probe_earlier(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    if (z->server == NULL || z->host_index == 0 || z->probe != NULL)
        return;
    z->probe_index = (z->probe_index + 1) % z->host_index;
    dl_rdzv_client_cbs_t cbs = {probe_ready, probe_message, probe_lost};
    if (dl_rdzv_client_start(&a->loop, z->cands[z->probe_index], z->port, DL_PROTO_ROLE_AGENT,
                             a->run_id, z->token, a->spec->heartbeat, &cbs, a, &z->probe) < 0)
        z->probe = NULL;
}

static void on_ready(void *ctx, int status, const char *err)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    z->connecting = false;
    if (z->cand_timer_open)
        uv_timer_stop(&z->cand_timer);
    if (status < 0 && z->failing_over && status != -EACCES && status != -EPROTO) {
        failover_next(a, err);
        return;
    }
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
    z->ready_at = mono();
    z->heard_at = z->ticked_at = z->ready_at;
    if (z->failing_over) {
        z->failing_over = false;
        dl__agent_log(a, "the rendezvous is at %s:%d now, found %.2f s after the last was lost",
                      z->host, z->port, z->ready_at - z->failover_since);
        dl_events_emit(a->events, "failover", dl__now_unix(),
                       json_pack("{s:s, s:i, s:b, s:f}", "host", z->host, "port", z->port,
                                 "hosting", z->server != NULL, "took_s",
                                 z->ready_at - z->failover_since));
    }
    uint64_t every = (uint64_t)(a->spec->heartbeat * 1000);
    uv_timer_start(&z->heartbeat, on_heartbeat, every, every);
    if (z->started) {
        dl__rdzv_join(a);
        return;
    }
    z->started = true;
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_START});
}

static void on_backoff(uv_timer_t *t)
{
    rdzv_t *z = t->data;
    dl_agent_t *a = z->agent;
    /* Only if the supervisor asked to join meanwhile (its workers are stopped by then). */
    if (z->join_wanted && !z->ready && !z->connecting) {
        z->join_wanted = false;
        if (connect_client(a) < 0)
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 3});
    }
}

/* The connection is gone, or we dropped it (misbehaving): stop the workers and join again, at
 * once after a connection that served a while, else after a backoff that doubles each time, and
 * not past the join timeout of trouble in a row. */
static void drop_connection(dl_agent_t *a, bool misbehaving, const char *what)
{
    rdzv_t *z = a->rdzv;
    double now = mono();
    bool stable = !misbehaving && z->ready && now - z->ready_at >= STABLE_S;

    z->ready = false;
    z->join_id = -1;
    z->following = false;
    uv_timer_stop(&z->heartbeat);
    dl_rdzv_client_close(z->client); /* freed once libuv lets go; a new one takes its place */
    z->client = NULL;
    if (stable) {
        z->failures = 0;
        z->trouble_since = 0;
    } else {
        if (z->failures++ == 0)
            z->trouble_since = now;
        if (now - z->trouble_since > a->spec->join_timeout) {
            dl__agent_log(a, "the rendezvous at %s:%d failed %d times in %.0f s (last: %s): "
                             "giving up",
                          z->host, z->port, z->failures, now - z->trouble_since, what);
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 4});
            return;
        }
        uint64_t ms = BACKOFF_MIN_MS;
        for (int i = 1; i < z->failures && ms < BACKOFF_MAX_MS; i++)
            ms *= 2;
        uv_timer_start(&z->backoff, on_backoff, ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS, 0);
    }
    dl__agent_log(a, "%s the rendezvous at %s:%d (%s): stopping this node's workers and "
                     "joining again",
                  misbehaving ? "dropped" : "lost", z->host, z->port, what);
    /* The next attempt's restart event says why, as a round change would have. */
    snprintf(z->last_reason, sizeof(z->last_reason), "lost the rendezvous at %s:%d: %s", z->host,
             z->port, what);
    json_decref(z->last_failure);
    z->last_failure = json_pack("{s:s, s:s}", "cause", "rendezvous_lost", "host", z->host);
    /* An embedded rendezvous (the one that names successors) is lost with its node, a failure
     * like any node's: the successor learns that one more restart is spent. dlaunchd going away
     * is no failure of the job's. */
    if (!misbehaving && z->server == NULL && z->nsuccessors > 0 && !z->failing_over) {
        z->spent++;
        failover_begin(a, z->lost_silently);
    }
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED});
}

static void misbehaved(dl_agent_t *a, const char *why)
{
    drop_connection(a, true, why);
}

static void on_lost(void *ctx, int status)
{
    dl_agent_t *a = ctx;
    char why[600];
    const char *text = dl_rdzv_client_error(a->rdzv->client);
    snprintf(why, sizeof(why), "%s", text[0] != '\0' ? text : uv_strerror(status));
    drop_connection(a, false, why);
}

static int connect_client(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    dl_rdzv_client_cbs_t cbs = {on_ready, on_message, on_lost};
    double timeout = a->spec->join_timeout;
    if (z->failing_over) {
        const char *c = z->cands[z->cand];
        snprintf(z->host, sizeof(z->host), "%s", c);
        if (strcmp(c, z->my_addr) == 0 && a->spec->is_host != 0) {
            /* Our turn: host it here, unless someone at this address was quicker. */
            char err[256];
            int r = serve(a, z, c, err, sizeof(err));
            if (r == 0) {
                z->host_index = z->cand;
                dl__agent_log(a, "hosting the rendezvous on %s:%d: its host was lost", c,
                              z->port);
            }
            else if (r != UV_EADDRINUSE)
                dl__agent_log(a, "cannot host the rendezvous on %s:%d (%s)", c, z->port, err);
        } else if (z->cand == 0) {
            /* Where it was: a refusal says nobody serves there any more. */
            timeout = 0;
        } else {
            /* A successor needs a moment to notice the loss and start serving; one that takes
             * longer than a dead node is declared dead takes the next one's turn. */
            timeout = a->spec->dead_after;
        }
        if (z->server == NULL) {
            uv_timer_start(&z->cand_timer, on_cand_timeout,
                           (uint64_t)(a->spec->dead_after * 1000) + 1, 0);
        }
    }
    int r = dl_rdzv_client_start(&a->loop, z->host, z->port, DL_PROTO_ROLE_AGENT, a->run_id,
                                 z->token, timeout, &cbs, a, &z->client);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot start the rendezvous client: %s\n", uv_strerror(r));
        return r;
    }
    z->connecting = true;
    return 0;
}

/* The agent's token: a master, or this job's key. Its workers get the job's worker key in a
 * file of their own (DLAUNCH_TOKEN_FILE), never the token itself. */
static int load_token(dl_agent_t *a, rdzv_t *z)
{
    char err[512];
    const char *env = dl_env_get(a->environ_list, "DLAUNCH_TOKEN");
    int r = dl_proto_token_load(a->spec->token_file, env, &z->token, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return r;
    }
    if (z->token == NULL)
        return 0;
    const char *where = a->spec->token_file != NULL ? a->spec->token_file : "DLAUNCH_TOKEN";
    if (dl_proto_token_kind(z->token) == DL_PROTO_TOKEN_WORKER) {
        fprintf(stderr, "dlaunch: %s: a worker key reaches a job's store only; an agent needs "
                        "the job's key or the rendezvous' token\n",
                where);
        return -EPERM;
    }
    if (!dl_proto_token_may(z->token, a->run_id, DL_PROTO_ROLE_AGENT)) {
        fprintf(stderr, "dlaunch: %s: the key of job '%s' cannot run job '%s' (--run-id)\n",
                where, dl_proto_token_run_id(z->token), a->run_id);
        return -EPERM;
    }
    r = dl__worker_cred_write(z->token, a->run_id, &a->token_path, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
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

/* Starts serving the job's rendezvous at ip:port. Returns 0, or the server's error (libuv's
 * UV_EADDRINUSE when someone serves it already) with one line in err. */
static int serve(dl_agent_t *a, rdzv_t *z, const char *ip, char *err, size_t errlen)
{
    dl_rdzv_server_opts_t so;
    dl_rdzv_server_opts_init(&so);
    so.host = ip;
    so.port = z->port;
    so.token = z->token;
    so.only_run_id = a->run_id;
    so.heartbeat = a->spec->heartbeat;
    so.core.successors = true;
    so.log = server_log;
    so.log_ctx = a;
    int r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, errlen);
    if (r < 0)
        return r;
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
        snprintf(err, errlen, "%s", strerror(-r));
        dl_rdzv_server_close(z->server, server_closed, NULL);
        z->server = NULL;
        return -ENOMEM;
    }
    return 0;
}

/* Host the rendezvous if this node should: --node-rank 0, or (no rank given) the endpoint is one
 * of our addresses and nobody serves it yet. Returns 0 or an exit code. */
static int maybe_host(dl_agent_t *a, rdzv_t *z)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    char ip[INET6_ADDRSTRLEN], err[512];
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

    r = serve(a, z, ip, err, sizeof(err));
    if (r == -ENOMEM) {
        fprintf(stderr, "dlaunch: cannot set up the job's rendezvous: %s\n", err);
        return 2;
    }
    if (r == 0) {
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
    uv_timer_init(&a->loop, &z->backoff);
    z->backoff.data = z;
    uv_timer_init(&a->loop, &z->cand_timer);
    z->cand_timer.data = z;
    z->cand_timer_open = true;
    z->backoff_open = true;
    return connect_client(a) < 0 ? 1 : 0;
}

int dl__rdzv_local_store(dl_agent_t *a)
{
    rdzv_t *z = calloc(1, sizeof(*z));
    dl_rdzv_server_opts_t so;
    char err[256];
    int r;

    if (z == NULL)
        return 1;
    a->rdzv = z;
    z->agent = a;
    /* The job's token guards its store as it would its rendezvous; without one, the store
     * serves this user only. */
    if (load_token(a, z) < 0)
        return 2;
    dl_rdzv_server_opts_init(&so);
    so.token = z->token;
    so.only_run_id = a->run_id;
    so.store_only = true;
    so.log = server_log;
    so.log_ctx = a;
    r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, sizeof(err));
    if (r == 0) {
        dl_rdzv_job_opts_t jo;
        dl_rdzv_job_opts_init(&jo);
        jo.max_restarts = a->spec->max_restarts;
        r = dl_rdzv_server_add_job(z->server, a->run_id, &jo);
    }
    if (r < 0) {
        dl__agent_log(a, "no key-value store for the workers (DLAUNCH_STORE unset): %s",
                      z->server == NULL ? err : strerror(-r));
        return 0;
    }
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
    if (z->backoff_open) {
        uv_close((uv_handle_t *)&z->backoff, NULL);
        z->backoff_open = false;
    }
    if (z->cand_timer_open) {
        uv_close((uv_handle_t *)&z->cand_timer, NULL);
        z->cand_timer_open = false;
    }
    dl_rdzv_client_close(z->client);
    z->client = NULL;
    dl_rdzv_client_close(z->probe);
    z->probe = NULL;
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
    dl__worker_cred_remove(a->token_path);
    dl_proto_token_free(z->token);
    json_decref(z->last_failure);
    free(z);
    a->rdzv = NULL;
}
