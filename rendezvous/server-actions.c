/* What a step of the core says to do, done: frames to connections and torch stores, closes,
 * the core's timer, the jobs' journals and status replies. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv-codec.h"
#include "server-internal.h"
#include "status-reply.h"

/* Events of journals replayed per turn of the loop, all followers together: the slice. */
#define REPLAY_BUDGET 256
/* A step this long after the core's deadline means the loop was held up, not merely busy. */
#define HELD_UP_S 0.5

static void on_core_timer(uv_timer_t *t)
{
    dl_rdzv_server_t *s = t->data;
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_TICK};
    dl__rdzv_server_feed(s, &ev);
}

/* The torch store of job run_id: the embedded server's one, or a job's among many. */
static dl__torch_store_t *torch_of_job(const dl_rdzv_server_t *s, const char *run_id)
{
    if (s->torch != NULL)
        return strcmp(run_id, s->only_run_id) == 0 ? s->torch : NULL;
    return s->torch_jobs != NULL ? dl__torch_jobs_find(s->torch_jobs, run_id) : NULL;
}

/* The torch store a torch connection id belongs to. */
static dl__torch_store_t *torch_of_conn(const dl_rdzv_server_t *s, uint64_t conn)
{
    if (DL__TORCH_STORE_INDEX(conn) == 0)
        return s->torch;
    return s->torch_jobs != NULL ? dl__torch_jobs_of_conn(s->torch_jobs, conn) : NULL;
}

/* The job's status (proto/status-reply.h) as the core has it, into st. Its strings are the
 * core's, borrowed for the call; what st owns (its nodes, what the job view adds) goes with
 * job_status_clear. Returns 0 or -ENOMEM. */
static int job_status(const dl_rdzv_server_t *s, const dl_rdzv_job_status_t *j,
                      dl_proto_status_job_t *st)
{
    dl_proto_status_node_t *nodes = calloc(j->nmembers + 1, sizeof(*nodes));
    memset(st, 0, sizeof(*st));
    if (nodes == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < j->nmembers; i++) {
        const dl_rdzv_member_status_t *m = &j->members[i];
        nodes[i] = (dl_proto_status_node_t){.node_id = (char *)m->agent_id,
                                            .host = (char *)m->host,
                                            .slots = m->slots,
                                            .node_rank = m->node_rank,
                                            .heartbeat_age = m->heartbeat_age,
                                            .connected = m->connected,
                                            .left = m->left};
    }
    *st = (dl_proto_status_job_t){.run_id = (char *)j->run_id,
                                  .state = (char *)dl_rdzv_job_state_name(j->state),
                                  .round = j->round,
                                  .restarts = j->restarts,
                                  .max_restarts = j->max_restarts,
                                  .min_nodes = j->min_nodes,
                                  .max_nodes = j->max_nodes,
                                  .world_size = j->world_size,
                                  .keys = (long long)j->nkeys,
                                  .has_keys = true,
                                  .nodes = nodes,
                                  .nnodes = j->nmembers,
                                  .failure = (char *)j->failure,
                                  .store_bytes = (long long)j->store_bytes,
                                  .has_store_bytes = true,
                                  .store_waits = (long long)j->store_waits,
                                  .has_store_waits = true};
    /* Torch clients of a job whose store this server also serves in torch's protocol. */
    const dl__torch_store_t *ts = torch_of_job(s, j->run_id);
    if (ts != NULL) {
        size_t now, peak, bytes;
        dl__torch_store_clients(ts, &now, &peak, &bytes);
        st->store_clients = (long long)now;
        st->has_store_clients = true;
    }
    return 0;
}

static void job_status_clear(dl_proto_status_job_t *st)
{
    free(st->nodes);
    st->nodes = NULL;
    dl__jobview_status_clear(st);
}

/* status: one job's, with its ranks' account and in-job recoveries, or every job's; written by
 * the status reply's one encoder. */
static json_t *status_reply(dl_rdzv_server_t *s, dl__sconn_t *sc, json_int_t id,
                            const dl_rdzv_status_t *st)
{
    size_t n = st->njobs;
    dl_proto_status_job_t *jobs = calloc(n + 1, sizeof(*jobs));
    dl_proto_status_recovery_t *recs = calloc(n + 1, sizeof(*recs));
    int r = jobs != NULL && recs != NULL ? 0 : -ENOMEM;
    for (size_t i = 0; r == 0 && i < n; i++) {
        const char *run_id = st->jobs[i].run_id;
        r = job_status(s, &st->jobs[i], &jobs[i]);
        if (r == 0)
            r = dl__jobview_status(s->view, run_id, n == 1 && sc->status_ranks, dl__server_now(),
                                   &jobs[i]);
        if (dl__rdzv_stats_recovery_get(&s->stats, run_id, &recs[i]))
            jobs[i].recovery = &recs[i];
    }
    json_t *o = NULL;
    if (r == 0 && n == 1) {
        o = dl_proto_rec_encode(&dl_proto_status_job_type, &jobs[0]);
    } else if (r == 0) {
        dl_proto_status_list_t all = {
            .state = "serving", .has_round = true, .jobs = jobs, .njobs = n};
        o = dl_proto_rec_encode(&dl_proto_status_list_type, &all);
    }
    for (size_t i = 0; jobs != NULL && i < n; i++)
        job_status_clear(&jobs[i]);
    free(jobs);
    free(recs);
    if (o == NULL)
        return dl_proto_error_new(id, DL_PROTO_E_INTERNAL, "status: out of memory");
    return dl_proto_reply_new(id, o);
}

/* An assignment names MASTER_ADDR:MASTER_PORT as a torch store when this server serves the
 * job's: the embedded server's is where the core put MASTER already; a job's among many is on
 * its own port, at the address the agent reached this server on (which reaches it from there,
 * whatever address the server listens on). */
static bool job_torch_master(const dl_rdzv_server_t *s, const dl__sconn_t *sc, const char *run_id,
                             char ip[INET6_ADDRSTRLEN], int *ret_port)
{
    dl__torch_store_t *ts = s->torch == NULL && sc != NULL && sc->wants_torch && run_id != NULL
                                ? torch_of_job(s, run_id)
                                : NULL;
    struct sockaddr_storage sa;
    int len = sizeof(sa);
    if (ts == NULL || uv_tcp_getsockname(&sc->c.tcp, (struct sockaddr *)&sa, &len) != 0 ||
        uv_ip_name((struct sockaddr *)&sa, ip, INET6_ADDRSTRLEN) != 0)
        return false;
    *ret_port = dl__torch_store_port(ts);
    return true;
}

/* Turns a core message into a frame for its connection; NULL when nothing is to be sent. */
static json_t *encode_msg(dl_rdzv_server_t *s, dl__sconn_t *sc, const dl_rdzv_msg_t *m)
{
    /* req_id is the request's id + 1 (0 means nobody asked): undone in unsigned arithmetic, as
     * an id may be as large as INT64_MAX. */
    json_int_t id = m->req_id > 0 ? (json_int_t)(m->req_id - 1) : -1;
    /* The core answers a join with JOINED at once and the assignment (or a timeout) when the
     * round closes; on the wire the join's one answer is that later message. */
    if (m->kind == DL_RDZV_MSG_ASSIGNMENT || m->kind == DL_RDZV_MSG_TIMEOUT) {
        if (id < 0)
            id = sc->join_id;
        sc->join_id = -1;
        if (id < 0)
            return NULL;
    }
    if (m->kind == DL_RDZV_MSG_STATUS)
        return status_reply(s, sc, id, m->status);
    char ip[INET6_ADDRSTRLEN];
    dl_rdzv_server_where_t w = {
        .store_host = s->store_host, .store_port = s->port, .torch_embedded = s->torch != NULL};
    if (m->kind == DL_RDZV_MSG_ASSIGNMENT && !w.torch_embedded &&
        job_torch_master(s, sc, m->run_id, ip, &w.torch_port))
        w.torch_addr = ip;
    return dl_rdzv_enc_core_msg(id, m, &w);
}

static void on_replay(uv_idle_t *h)
{
    dl_rdzv_server_t *s = h->data;
    if (!dl__journals_pump(s->journals, REPLAY_BUDGET)) {
        uv_idle_stop(&s->replay_idle);
        s->replaying = false;
    }
}

/* Replays go a slice per turn of the loop, between everything else the loop has to do. */
void dl__server_replay_start(dl_rdzv_server_t *s)
{
    if (s->replaying || s->closing || !dl__journals_pending(s->journals))
        return;
    s->replaying = true;
    uv_idle_start(&s->replay_idle, on_replay);
}

/* Appends an event (stolen; rdzv-codec.h's dl_rdzv_enc_journal_*) to the job's journal and
 * tells its followers. */
static void journal(dl_rdzv_server_t *s, const char *run_id, json_t *ev)
{
    if (run_id == NULL || ev == NULL) {
        json_decref(ev);
        return;
    }
    json_incref(ev);
    if (dl__journals_append(s->journals, run_id, ev) > 0)
        dl__rdzv_stats_event(&s->stats, run_id, ev, dl__server_now());
    json_decref(ev);
}

/* Turns what the core tells agents into the job's story, once per round or job. */
static void journal_msg(dl_rdzv_server_t *s, const dl_rdzv_msg_t *m, const dl__sconn_t *sc)
{
    /* Any message of a job makes its journal, which `dlaunch events` follows from then on. */
    if (m->run_id == NULL || dl__journals_get(s->journals, m->run_id, true) == NULL)
        return;
    /* Every agent gets the message; the journal tells each round's story once. */
    switch (m->kind) {
    case DL_RDZV_MSG_ASSIGNMENT:
        if (!dl__journals_mark(s->journals, m->run_id, "assigned", m->assignment.round))
            return;
        /* MASTER as the workers have it: a job's torch store here, as its first agent was
         * told, else the core's. */
        char ip[INET6_ADDRSTRLEN];
        int port;
        bool here = job_torch_master(s, sc, m->run_id, ip, &port);
        journal(s, m->run_id,
                dl_rdzv_enc_journal_msg(m, dl__server_unix_now(),
                                        here ? ip : m->assignment.master_addr,
                                        here ? port : m->assignment.master_port));
        return;
    case DL_RDZV_MSG_ROUND_CHANGED:
        if (dl__journals_mark(s->journals, m->run_id, "changed", m->round_changed.round))
            journal(s, m->run_id, dl_rdzv_enc_journal_msg(m, dl__server_unix_now(), NULL, 0));
        return;
    case DL_RDZV_MSG_FAILED:
    case DL_RDZV_MSG_STOP:
    case DL_RDZV_MSG_SUCCEEDED:
        if (!dl__journals_mark(s->journals, m->run_id, "ended", 1))
            return;
        dl__jobview_forget(s->view, m->run_id);
        journal(s, m->run_id, dl_rdzv_enc_journal_msg(m, dl__server_unix_now(), NULL, 0));
        return;
    default: return;
    }
}

static void take_snapshot(dl_rdzv_server_t *s, const dl_rdzv_status_t *st)
{
    dl_proto_status_job_t *jobs = calloc(st->njobs + 1, sizeof(*jobs));
    int r = jobs != NULL ? 0 : -ENOMEM;
    for (size_t i = 0; r == 0 && i < st->njobs; i++)
        r = job_status(s, &st->jobs[i], &jobs[i]);
    json_decref(s->snapshot);
    s->snapshot = r == 0 ? dl__rdzv_stats_snapshot(&s->stats, st, jobs, dl__server_unix_now(),
                                                   s->nconns, s->peak)
                         : NULL;
    for (size_t i = 0; jobs != NULL && i < st->njobs; i++)
        job_status_clear(&jobs[i]);
    free(jobs);
}

/* The torch store's queues and watches live beside the core's keys: they go when a round
 * of its job opens, as the keys do. A job's own store (serving many) goes with the job; one
 * whose end no agent heard goes in a sweep (on_sweep). */
static void torch_round(dl_rdzv_server_t *s, const dl_rdzv_msg_t *m)
{
    dl__torch_store_t *ts = m->run_id != NULL ? torch_of_job(s, m->run_id) : NULL;
    if (ts == NULL)
        return;
    if (m->kind == DL_RDZV_MSG_ROUND_CHANGED)
        dl__torch_store_new_round(ts, m->round_changed.round);
    else if (m->kind == DL_RDZV_MSG_ASSIGNMENT)
        dl__torch_store_new_round(ts, m->assignment.round);
    else if (s->torch_jobs != NULL &&
             (m->kind == DL_RDZV_MSG_FAILED || m->kind == DL_RDZV_MSG_STOP ||
              m->kind == DL_RDZV_MSG_SUCCEEDED))
        dl__torch_jobs_close(s->torch_jobs, m->run_id);
}

/* Serving many jobs, the first assignment of a job to an agent that asked for a torch store
 * opens one. One that cannot be opened is said, and the assignment names node rank 0's
 * MASTER_PORT as before: its agent tells its workers that rank 0 hosts the store. */
static void torch_job_open(dl_rdzv_server_t *s, dl__sconn_t *sc, const dl_rdzv_msg_t *m)
{
    dl__torch_store_t *ts;
    char err[256];
    if (s->torch_jobs == NULL || !sc->wants_torch || m->kind != DL_RDZV_MSG_ASSIGNMENT ||
        m->run_id == NULL || dl__torch_jobs_find(s->torch_jobs, m->run_id) != NULL)
        return;
    int r = dl__torch_jobs_open(s->torch_jobs, s, s->loop, s->torch_host, m->run_id, &ts, err,
                                sizeof(err));
    if (r < 0) {
        dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, m->run_id,
                            "torch store not served, rank 0 hosts it: %s", err);
        return;
    }
    dl__rdzv_server_log(s, DL_RDZV_LOG_INFO, m->run_id,
                        "serving the job's torch store on %s:%d (its workers' MASTER_PORT)",
                        s->torch_host, dl__torch_store_port(ts));
    /* The round it opens in is the one it keeps queues and watches for, as torch_round does
     * for the rounds after. */
    dl__torch_store_new_round(ts, m->assignment.round);
}

void dl__server_apply(dl_rdzv_server_t *s, const dl_rdzv_actions_t *acts)
{
    for (size_t i = 0; i < acts->n; i++) {
        const dl_rdzv_action_t *a = &acts->v[i];
        dl__sconn_t *sc;
        switch (a->kind) {
        case DL_RDZV_ACT_SEND: {
            /* A job's torch store opens before its first assignment is journaled or sent. */
            sc = (a->conn & DL__TORCH_CONN_BIT) ? NULL : dl__sconn_by_id(s, a->conn);
            if (sc != NULL)
                torch_job_open(s, sc, &a->msg);
            journal_msg(s, &a->msg, sc);
            torch_round(s, &a->msg);
            if (a->conn == DL__RDZV_STATS_CONN) {
                if (a->msg.kind == DL_RDZV_MSG_STATUS)
                    take_snapshot(s, a->msg.status);
                break;
            }
            if (a->conn & DL__TORCH_CONN_BIT) {
                dl__torch_store_t *ts = torch_of_conn(s, a->conn);
                if (ts != NULL)
                    dl__torch_store_reply(ts, a->conn, &a->msg);
                break;
            }
            sc = dl__sconn_by_id(s, a->conn);
            if (sc == NULL)
                break;
            json_t *m = encode_msg(s, sc, &a->msg);
            if (m != NULL) {
                int r = dl__sconn_send(sc, m);
                if (r == -EBADMSG) {
                    dl_proto_error_t perr;
                    dl_proto_type_t t;
                    dl_proto_validate(m, &t, &perr);
                    dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, a->msg.run_id, "cannot send %s: %s",
                                        dl_rdzv_msg_kind_name(a->msg.kind), perr.message);
                } else if (r < 0 && r != -EPIPE) {
                    dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, a->msg.run_id, "cannot send %s: %s",
                                        dl_rdzv_msg_kind_name(a->msg.kind), strerror(-r));
                }
                json_decref(m);
            }
            break;
        }
        case DL_RDZV_ACT_CLOSE:
            if ((a->conn & DL__TORCH_CONN_BIT) && torch_of_conn(s, a->conn) != NULL)
                dl__torch_store_reply(torch_of_conn(s, a->conn), a->conn, NULL);
            sc = dl__sconn_by_id(s, a->conn);
            if (sc != NULL)
                dl__conn_close(&sc->c, 0);
            break;
        case DL_RDZV_ACT_ARM_TIMER: {
            double wait = a->at - dl__server_now();
            if (!s->closing)
                uv_timer_start(&s->core_timer, on_core_timer,
                               wait > 0 ? (uint64_t)(wait * 1000) + 1 : 0, 0);
            break;
        }
        case DL_RDZV_ACT_DISARM_TIMER: uv_timer_stop(&s->core_timer); break;
        case DL_RDZV_ACT_FORGET: dl__journals_forget(s->journals, a->run_id); break;
        case DL_RDZV_ACT_LOG:
            if (!s->adding_job)
                dl__rdzv_server_log(s, a->log.level, a->log.run_id, "%s", a->log.text);
            if (a->log.run_id != NULL && a->log.level >= DL_RDZV_LOG_INFO)
                journal(s, a->log.run_id,
                        dl_rdzv_enc_journal_log(dl__server_unix_now(), a->log.level, a->log.text));
            break;
        }
    }
}

void dl__rdzv_server_feed(dl_rdzv_server_t *s, const dl_rdzv_event_t *ev)
{
    dl_rdzv_actions_t acts = {0};
    double t0 = dl__server_now(), due;
    /* The core's timer was due long before this step (a busy loop is late by milliseconds): the
     * loop was held up, and the heartbeats it could not read are nobody's fault. */
    if (dl_rdzv_core_next_deadline(s->core, &due) == 0 && t0 - due > HELD_UP_S)
        dl_rdzv_core_held_up(s->core, t0);
    int r = dl_rdzv_core_step(s->core, ev, t0, &acts);
    dl__server_apply(s, &acts);
    if (r < 0)
        dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, ev->run_id, "rendezvous step failed: %s",
                            strerror(-r));
    /* The server's own STATUS requests change nothing unless timers ran on the way. */
    if (ev->conn != DL__RDZV_STATS_CONN || acts.n > 1) {
        dl__rdzv_hist_add(&s->stats.step_seconds, dl__server_now() - t0);
        s->stats.generation++;
    }
}
