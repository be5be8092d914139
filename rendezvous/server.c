/* The rendezvous server: libuv TCP around the pure core. Each connection says hello (and proves
 * the job token) before anything else; then its messages become core events, and the core's
 * actions become frames, closes and one timer. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "jobview.h"
#include "rendezvous.h"
#include "stats.h"

#define READBUF_SIZE (64 * 1024)

typedef enum {
    SC_HELLO = 0, /* waiting for hello */
    SC_AUTH,      /* challenge sent, waiting for auth */
    SC_READY,
} sconn_state_t;

typedef struct sconn_s sconn_t;

struct sconn_s {
    dl__conn_t c; /* first: libuv's handle pointer is the connection's */
    dl_rdzv_server_t *s;
    uint32_t slot;
    sconn_state_t state;
    dl_proto_role_t role;
    double accepted;         /* for the authentication deadline */
    sconn_t *prev, *next;    /* in the list of unauthenticated connections, oldest first */
    bool in_preauth;
    json_int_t join_id; /* the join waiting for its assignment (the core answers it later) */
    bool status_ranks;  /* the status request being answered asked for every rank */
    char run_id[DL_PROTO_RUN_ID_MAX + 1];
    char nonce[DL_PROTO_NONCE_HEX_LEN + 1];
};

struct dl_rdzv_server_s {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t core_timer;
    uv_timer_t auth_timer;
    dl_rdzv_core_t *core;
    const dl_proto_token_t *token;
    double heartbeat;
    double auth_timeout;
    dl_rdzv_log_cb log;
    void *log_ctx;
    char store_host[DL_PROTO_NAME_MAX + 1];
    int port;

    /* Connection ids are (generation << 32 | slot): O(1) lookup, and an id never names a later
     * connection that reuses the slot. */
    sconn_t **slots;
    uint32_t *gens;
    uint32_t *free_slots;
    size_t nslots, nfree, cap;
    sconn_t *preauth_head, *preauth_tail;
    size_t nconns, peak;

    /* Per job: {"seq": n, "assigned": r, "changed": r, "ended": b, "events": [...],
     * "followers": [conn ids]}, the rounds being the last journaled assignment and round change.
     * What `dlaunch events RUN_ID` replays and follows. */
    json_t *journals;
    dl__jobview_t *view; /* every job's ranks as their agents report them (jobview.c) */

    dl__rdzv_stats_t stats;
    json_t *snapshot; /* what the last STATUS to DL__RDZV_STATS_CONN made */

    bool closing;
    int open_handles;
    void (*done)(void *ctx);
    void *done_ctx;
    char readbuf[READBUF_SIZE];
};

static double now_s(void)
{
    return (double)uv_hrtime() / 1e9;
}

static void slog(dl_rdzv_server_t *s, dl_rdzv_log_level_t level, const char *run_id,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void slog(dl_rdzv_server_t *s, dl_rdzv_log_level_t level, const char *run_id,
                 const char *fmt, ...)
{
    char text[512];
    va_list ap;
    if (s->log == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    s->log(s->log_ctx, level, run_id, text);
}

/* ---- connection table ---- */

static uint64_t conn_id(const sconn_t *sc)
{
    return ((uint64_t)sc->s->gens[sc->slot] << 32) | sc->slot;
}

static sconn_t *conn_by_id(dl_rdzv_server_t *s, uint64_t id)
{
    uint32_t slot = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (slot >= s->nslots || s->gens[slot] != gen)
        return NULL;
    return s->slots[slot];
}

static int slot_take(dl_rdzv_server_t *s, sconn_t *sc)
{
    if (s->nfree > 0) {
        sc->slot = s->free_slots[--s->nfree];
    } else {
        if (s->nslots == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 256;
            sconn_t **sl = realloc(s->slots, cap * sizeof(*sl));
            if (sl == NULL)
                return -ENOMEM;
            s->slots = sl;
            uint32_t *g = realloc(s->gens, cap * sizeof(*g));
            if (g == NULL)
                return -ENOMEM;
            s->gens = g;
            uint32_t *f = realloc(s->free_slots, cap * sizeof(*f));
            if (f == NULL)
                return -ENOMEM;
            s->free_slots = f;
            s->cap = cap;
        }
        sc->slot = (uint32_t)s->nslots++;
        s->gens[sc->slot] = 1;
    }
    s->slots[sc->slot] = sc;
    return 0;
}

static void slot_release(dl_rdzv_server_t *s, sconn_t *sc)
{
    s->slots[sc->slot] = NULL;
    /* Generation 0 is never handed out, so id 0 (DL_RDZV_CONN_NONE) names nobody. */
    if (++s->gens[sc->slot] == 0)
        s->gens[sc->slot] = 1;
    s->free_slots[s->nfree++] = sc->slot;
}

/* ---- the authentication deadline: one timer for the oldest unauthenticated connection ---- */

static void on_auth_timer(uv_timer_t *t);

static void preauth_arm(dl_rdzv_server_t *s)
{
    if (s->preauth_head == NULL || s->closing) {
        uv_timer_stop(&s->auth_timer);
        return;
    }
    double wait = s->preauth_head->accepted + s->auth_timeout - now_s();
    uv_timer_start(&s->auth_timer, on_auth_timer, wait > 0 ? (uint64_t)(wait * 1000) + 1 : 0, 0);
}

static void preauth_remove(sconn_t *sc)
{
    dl_rdzv_server_t *s = sc->s;
    if (!sc->in_preauth)
        return;
    sc->in_preauth = false;
    if (sc->prev != NULL)
        sc->prev->next = sc->next;
    else
        s->preauth_head = sc->next;
    if (sc->next != NULL)
        sc->next->prev = sc->prev;
    else
        s->preauth_tail = sc->prev;
    sc->prev = sc->next = NULL;
}

static void send_error(sconn_t *sc, json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void send_error(sconn_t *sc, json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
{
    char text[DL_PROTO_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    json_auto_t *m = dl_proto_error_new(id, code, "%s", text);
    if (m != NULL)
        dl__conn_send(&sc->c, m);
}

static void on_auth_timer(uv_timer_t *t)
{
    dl_rdzv_server_t *s = t->data;
    double now = now_s();
    while (s->preauth_head != NULL && s->preauth_head->accepted + s->auth_timeout <= now) {
        sconn_t *sc = s->preauth_head;
        preauth_remove(sc);
        s->stats.auth_timeouts++;
        send_error(sc, -1, DL_PROTO_E_NOT_AUTHENTICATED,
                   "no hello and auth within %g s; closing", s->auth_timeout);
        dl__conn_close(&sc->c, UV_ETIMEDOUT);
    }
    preauth_arm(s);
}

/* ---- core actions ---- */

static void run_core(dl_rdzv_server_t *s, const dl_rdzv_event_t *ev);

static void on_core_timer(uv_timer_t *t)
{
    dl_rdzv_server_t *s = t->data;
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_TICK};
    run_core(s, &ev);
}

static dl_proto_errcode_t errcode_of(int code)
{
    switch (-code) {
    case ENOENT:
        return DL_PROTO_E_NOT_FOUND;
    case ETIMEDOUT:
        return DL_PROTO_E_TIMEOUT;
    case ESTALE:
        return DL_PROTO_E_STALE_ROUND;
    case EEXIST:
    case EADDRINUSE:
    case EBUSY:
        return DL_PROTO_E_CONFLICT;
    case ESHUTDOWN:
    case ECANCELED:
        return DL_PROTO_E_SHUTTING_DOWN;
    case EINVAL:
    case ERANGE:
    case E2BIG:
    case ENAMETOOLONG:
        return DL_PROTO_E_BAD_FIELD;
    case EOVERFLOW:
    case EBADMSG:
        return DL_PROTO_E_BAD_VALUE;
    default:
        return DL_PROTO_E_INTERNAL;
    }
}

static json_t *buf_string(dl_rdzv_buf_t b)
{
    return json_stringn(b.data != NULL ? b.data : "", b.len);
}

static json_t *status_json(const dl_rdzv_job_status_t *j)
{
    json_t *members = json_array();
    for (size_t i = 0; i < j->nmembers; i++) {
        const dl_rdzv_member_status_t *m = &j->members[i];
        json_array_append_new(
            members, json_pack("{s:s, s:s, s:i, s:i, s:f, s:b, s:b}", "node_id", m->agent_id,
                               "host", m->host, "slots", m->slots, "node_rank", m->node_rank,
                               "heartbeat_age", m->heartbeat_age, "connected", m->connected,
                               "left", m->left));
    }
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:o}", "run_id",
                          j->run_id, "state", dl_rdzv_job_state_name(j->state), "round", j->round,
                          "restarts", j->restarts, "max_restarts", j->max_restarts, "min_nodes",
                          j->min_nodes, "max_nodes", j->max_nodes, "world_size", j->world_size,
                          "keys", (json_int_t)j->nkeys, "nodes", members);
    if (o != NULL && j->failure != NULL)
        json_object_set_new(o, "failure", json_string(j->failure));
    return o;
}

/* Turns a core message into a frame for its connection; NULL when nothing is to be sent. */
static json_t *encode_msg(dl_rdzv_server_t *s, sconn_t *sc, const dl_rdzv_msg_t *m)
{
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
    json_t *o = NULL;
    char store[DL_PROTO_NAME_MAX + 16];

    switch (m->kind) {
    case DL_RDZV_MSG_OK:
        return id >= 0 ? dl_proto_reply_new(id, NULL) : NULL;
    case DL_RDZV_MSG_ERROR:
        return dl_proto_error_new(id, errcode_of(m->error.code), "%s",
                                  m->error.message ? m->error.message : strerror(-m->error.code));
    case DL_RDZV_MSG_JOINED:
        return NULL; /* the join's answer is the assignment, once the round closes */
    case DL_RDZV_MSG_ASSIGNMENT:
        o = dl_proto_msg_new(DL_PROTO_ASSIGNMENT, id);
        snprintf(store, sizeof(store), "%s:%d",
                 m->assignment.store_host ? m->assignment.store_host : s->store_host,
                 m->assignment.store_host ? m->assignment.store_port : s->port);
        json_object_update_new(
            o, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:i, s:i}", "round",
                         m->assignment.round, "node_rank", m->assignment.node_rank, "nodes",
                         m->assignment.nnodes, "world_size", m->assignment.world_size,
                         "first_rank", m->assignment.first_rank, "local_world_size",
                         m->assignment.local_world_size, "master_addr",
                         m->assignment.master_addr, "master_port", m->assignment.master_port,
                         "store_addr", store, "restart_count", m->assignment.restarts,
                         "max_restarts", m->assignment.max_restarts));
        return o;
    case DL_RDZV_MSG_TIMEOUT:
        return dl_proto_error_new(id, DL_PROTO_E_TIMEOUT,
                                  "rendezvous timed out: round %d did not gather enough nodes",
                                  m->timeout.round);
    case DL_RDZV_MSG_ROUND_CHANGED:
        o = dl_proto_msg_new(DL_PROTO_ROUND_CHANGED, -1);
        json_object_set_new(o, "round", json_integer(m->round_changed.round));
        json_object_set_new(o, "reason", json_string(m->round_changed.reason != NULL &&
                                                             *m->round_changed.reason
                                                         ? m->round_changed.reason
                                                         : "new round"));
        return o;
    case DL_RDZV_MSG_FAILED:
        o = dl_proto_msg_new(DL_PROTO_SHUTDOWN, -1);
        json_object_set_new(o, "reason", json_string("failed"));
        json_object_set_new(o, "exit_code", json_integer(1));
        json_object_set_new(o, "failure",
                            json_pack("{s:s, s:i, s:i}", "description",
                                      m->failed.failure ? m->failed.failure : "unknown",
                                      "round", m->failed.round, "restarts", m->failed.restarts));
        return o;
    case DL_RDZV_MSG_STOP:
        o = dl_proto_msg_new(DL_PROTO_SHUTDOWN, -1);
        json_object_set_new(o, "reason", json_string("stopped"));
        json_object_set_new(o, "exit_code", json_integer(0));
        return o;
    case DL_RDZV_MSG_SUCCEEDED:
        o = dl_proto_msg_new(DL_PROTO_SHUTDOWN, -1);
        json_object_set_new(o, "reason", json_string("succeeded"));
        json_object_set_new(o, "exit_code", json_integer(0));
        return o;
    case DL_RDZV_MSG_VALUE:
        if (!m->value.found)
            return dl_proto_error_new(id, DL_PROTO_E_NOT_FOUND, "no such key");
        return dl_proto_reply_new(id, json_pack("{s:o}", "value", buf_string(m->value.value)));
    case DL_RDZV_MSG_COUNTER:
        return dl_proto_reply_new(id, json_pack("{s:I}", "value", (json_int_t)m->counter.value));
    case DL_RDZV_MSG_CAS:
        return dl_proto_reply_new(id, json_pack("{s:b, s:o}", "swapped", m->cas.swapped, "value",
                                                m->cas.found ? buf_string(m->cas.value)
                                                             : json_null()));
    case DL_RDZV_MSG_DELETED:
        return dl_proto_reply_new(id, json_pack("{s:b}", "deleted", m->deleted.deleted));
    case DL_RDZV_MSG_WAIT_DONE:
        return dl_proto_reply_new(id, NULL);
    case DL_RDZV_MSG_STATUS: {
        const dl_rdzv_status_t *st = m->status;
        if (st->njobs == 1) {
            o = status_json(&st->jobs[0]);
            json_object_update_new(o, dl__jobview_status(s->view, st->jobs[0].run_id,
                                                         sc->status_ranks, now_s()));
        } else {
            json_t *jobs = json_array();
            for (size_t i = 0; i < st->njobs; i++) {
                json_t *j = status_json(&st->jobs[i]);
                json_object_update_new(j, dl__jobview_status(s->view, st->jobs[i].run_id,
                                                             false, now_s()));
                json_array_append_new(jobs, j);
            }
            o = json_pack("{s:s, s:i, s:o}", "state", "serving", "round", 0, "jobs", jobs);
        }
        return dl_proto_reply_new(id, o);
    }
    }
    return NULL;
}

#define JOURNAL_MAX 1000

static double unix_now(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static json_t *journal_of(dl_rdzv_server_t *s, const char *run_id)
{
    json_t *j = json_object_get(s->journals, run_id);
    if (j == NULL) {
        j = json_pack("{s:I, s:i, s:i, s:b, s:[], s:[]}", "seq", (json_int_t)0, "assigned", -1,
                      "changed", -1, "ended", 0, "events", "followers");
        if (j == NULL || json_object_set_new(s->journals, run_id, j) < 0)
            return NULL;
    }
    return j;
}

static void send_event(dl_rdzv_server_t *s, sconn_t *sc, json_int_t seq, json_t *event)
{
    json_auto_t *m = dl_proto_msg_new(DL_PROTO_EVENT, -1);
    json_object_set_new(m, "seq", json_integer(seq));
    json_object_set(m, "event", event);
    dl__conn_send(&sc->c, m);
}

/* Appends {event: name, time, ...fields} to the job's journal and tells its followers. Steals
 * fields. */
static void journal(dl_rdzv_server_t *s, const char *run_id, const char *name, json_t *fields)
{
    json_t *j = run_id != NULL ? journal_of(s, run_id) : NULL;
    json_t *ev = json_pack("{s:s, s:f}", "event", name, "time", unix_now());
    if (j == NULL || ev == NULL) {
        json_decref(fields);
        json_decref(ev);
        return;
    }
    if (fields != NULL)
        json_object_update_new(ev, fields);
    json_int_t seq = json_integer_value(json_object_get(j, "seq")) + 1;
    json_object_set_new(j, "seq", json_integer(seq));
    json_object_set_new(ev, "seq", json_integer(seq));
    dl__rdzv_stats_event(&s->stats, run_id, ev, now_s());
    json_t *events = json_object_get(j, "events");
    if (json_array_size(events) >= JOURNAL_MAX)
        json_array_remove(events, 0);
    json_array_append(events, ev);
    json_t *followers = json_object_get(j, "followers");
    for (size_t i = 0; i < json_array_size(followers);) {
        sconn_t *sc = conn_by_id(s, (uint64_t)json_integer_value(json_array_get(followers, i)));
        if (sc == NULL || sc->c.closing) {
            json_array_remove(followers, i);
            continue;
        }
        send_event(s, sc, seq, ev);
        i++;
    }
    json_decref(ev);
}

/* Turns what the core tells agents into the job's story, once per round or job. */
static void journal_msg(dl_rdzv_server_t *s, const dl_rdzv_msg_t *m)
{
    json_t *j = m->run_id != NULL ? journal_of(s, m->run_id) : NULL;
    if (j == NULL)
        return;
    /* Every agent gets the message; the journal tells each round's story once. */
    int assigned = (int)json_integer_value(json_object_get(j, "assigned"));
    int changed = (int)json_integer_value(json_object_get(j, "changed"));
    switch (m->kind) {
    case DL_RDZV_MSG_ASSIGNMENT:
        if (m->assignment.round == assigned)
            return;
        json_object_set_new(j, "assigned", json_integer(m->assignment.round));
        journal(s, m->run_id, "rendezvous",
                json_pack("{s:i, s:i, s:i, s:i, s:s, s:i}", "round", m->assignment.round,
                          "nodes", m->assignment.nnodes, "world_size", m->assignment.world_size,
                          "restarts", m->assignment.restarts, "master_addr",
                          m->assignment.master_addr, "master_port", m->assignment.master_port));
        return;
    case DL_RDZV_MSG_ROUND_CHANGED:
        if (m->round_changed.round == changed)
            return;
        json_object_set_new(j, "changed", json_integer(m->round_changed.round));
        journal(s, m->run_id, "round_changed",
                json_pack("{s:i, s:s, s:s}", "round", m->round_changed.round, "reason",
                          m->round_changed.reason ? m->round_changed.reason : "", "cause",
                          dl_rdzv_cause_name(m->round_changed.cause)));
        return;
    case DL_RDZV_MSG_FAILED:
    case DL_RDZV_MSG_STOP:
    case DL_RDZV_MSG_SUCCEEDED:
        if (json_is_true(json_object_get(j, "ended")))
            return;
        json_object_set_new(j, "ended", json_true());
        dl__jobview_forget(s->view, m->run_id);
        journal(s, m->run_id, "job_end",
                json_pack("{s:s, s:i}", "status",
                          m->kind == DL_RDZV_MSG_FAILED   ? "failed"
                          : m->kind == DL_RDZV_MSG_STOP ? "stopped"
                                                        : "succeeded",
                          "exit_code", m->kind == DL_RDZV_MSG_FAILED ? 1 : 0));
        if (m->kind == DL_RDZV_MSG_FAILED && m->failed.failure != NULL)
            json_object_set_new(json_array_get(json_object_get(j, "events"),
                                               json_array_size(json_object_get(j, "events")) - 1),
                                "failure", json_string(m->failed.failure));
        return;
    default:
        return;
    }
}

static void follow(sconn_t *sc, json_int_t id, json_int_t since)
{
    dl_rdzv_server_t *s = sc->s;
    json_t *j = journal_of(s, sc->run_id);
    json_auto_t *ok = dl_proto_reply_new(id, NULL);
    if (j == NULL || ok == NULL) {
        send_error(sc, id, DL_PROTO_E_INTERNAL, "out of memory");
        return;
    }
    dl__conn_send(&sc->c, ok);
    size_t i;
    json_t *ev;
    json_array_foreach(json_object_get(j, "events"), i, ev)
    {
        json_int_t seq = json_integer_value(json_object_get(ev, "seq"));
        if (seq > since)
            send_event(s, sc, seq, ev);
    }
    json_array_append_new(json_object_get(j, "followers"), json_integer((json_int_t)conn_id(sc)));
}

static void take_snapshot(dl_rdzv_server_t *s, const dl_rdzv_status_t *st)
{
    json_t *jobs = json_array();
    for (size_t i = 0; jobs != NULL && i < st->njobs; i++)
        if (json_array_append_new(jobs, status_json(&st->jobs[i])) < 0) {
            json_decref(jobs);
            jobs = NULL;
        }
    json_decref(s->snapshot);
    s->snapshot =
        dl__rdzv_stats_snapshot(&s->stats, st, jobs, unix_now(), s->nconns, s->peak);
}

static void apply_actions(dl_rdzv_server_t *s, const dl_rdzv_actions_t *acts)
{
    for (size_t i = 0; i < acts->n; i++) {
        const dl_rdzv_action_t *a = &acts->v[i];
        sconn_t *sc;
        switch (a->kind) {
        case DL_RDZV_ACT_SEND: {
            journal_msg(s, &a->msg);
            if (a->conn == DL__RDZV_STATS_CONN) {
                if (a->msg.kind == DL_RDZV_MSG_STATUS)
                    take_snapshot(s, a->msg.status);
                break;
            }
            sc = conn_by_id(s, a->conn);
            if (sc == NULL)
                break;
            json_t *m = encode_msg(s, sc, &a->msg);
            if (m != NULL) {
                int r = dl__conn_send(&sc->c, m);
                if (r == -EBADMSG) {
                    dl_proto_error_t perr;
                    dl_proto_type_t t;
                    dl_proto_validate(m, &t, &perr);
                    slog(s, DL_RDZV_LOG_ERROR, a->msg.run_id, "cannot send %s: %s",
                         dl_rdzv_msg_kind_name(a->msg.kind), perr.message);
                } else if (r < 0 && r != -EPIPE) {
                    slog(s, DL_RDZV_LOG_ERROR, a->msg.run_id, "cannot send %s: %s",
                         dl_rdzv_msg_kind_name(a->msg.kind), strerror(-r));
                }
                json_decref(m);
            }
            break;
        }
        case DL_RDZV_ACT_CLOSE:
            sc = conn_by_id(s, a->conn);
            if (sc != NULL)
                dl__conn_close(&sc->c, 0);
            break;
        case DL_RDZV_ACT_ARM_TIMER: {
            double wait = a->at - now_s();
            if (!s->closing)
                uv_timer_start(&s->core_timer, on_core_timer,
                               wait > 0 ? (uint64_t)(wait * 1000) + 1 : 0, 0);
            break;
        }
        case DL_RDZV_ACT_DISARM_TIMER:
            uv_timer_stop(&s->core_timer);
            break;
        case DL_RDZV_ACT_LOG:
            if (s->log != NULL)
                s->log(s->log_ctx, a->log.level, a->log.run_id, a->log.text);
            if (a->log.run_id != NULL && a->log.level >= DL_RDZV_LOG_INFO)
                journal(s, a->log.run_id, "log",
                        json_pack("{s:s, s:s}", "level",
                                  a->log.level >= DL_RDZV_LOG_ERROR  ? "error"
                                  : a->log.level >= DL_RDZV_LOG_WARN ? "warning"
                                                                     : "info",
                                  "text", a->log.text));
            break;
        }
    }
}

static void run_core(dl_rdzv_server_t *s, const dl_rdzv_event_t *ev)
{
    dl_rdzv_actions_t acts = {0};
    double t0 = now_s();
    int r = dl_rdzv_core_step(s->core, ev, t0, &acts);
    apply_actions(s, &acts);
    if (r < 0)
        slog(s, DL_RDZV_LOG_ERROR, ev->run_id, "rendezvous step failed: %s", strerror(-r));
    /* The server's own STATUS requests change nothing unless timers ran on the way. */
    if (ev->conn != DL__RDZV_STATS_CONN || acts.n > 1) {
        dl__rdzv_hist_add(&s->stats.step_seconds, now_s() - t0);
        s->stats.generation++;
    }
}

/* ---- requests ---- */

static double ms_field(const json_t *msg, const char *name, double dflt)
{
    json_int_t v = dl_proto_get_int(msg, name, -1);
    return v >= 0 ? (double)v / 1000.0 : dflt;
}

static void handle_join(sconn_t *sc, json_t *msg, uint64_t req)
{
    dl_rdzv_server_t *s = sc->s;
    dl_rdzv_job_opts_t opts;
    char err[256];

    dl_rdzv_job_opts_init(&opts);
    opts.min_nodes = (int)dl_proto_get_int(msg, "min_nodes", opts.min_nodes);
    opts.max_nodes = (int)dl_proto_get_int(msg, "max_nodes", opts.max_nodes);
    opts.last_call = ms_field(msg, "last_call_ms", opts.last_call);
    opts.join_timeout = ms_field(msg, "join_timeout_ms", opts.join_timeout);
    opts.dead_after = ms_field(msg, "dead_after_ms", opts.dead_after);
    opts.max_restarts = (int)dl_proto_get_int(msg, "max_restarts", opts.max_restarts);
    bool has_opts = json_object_get(msg, "min_nodes") != NULL;
    if (has_opts && dl_rdzv_job_opts_check(&opts, err, sizeof(err)) < 0) {
        send_error(sc, (json_int_t)req - 1, DL_PROTO_E_BAD_FIELD, "join: %s", err);
        return;
    }
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = conn_id(sc), .req_id = req,
                          .run_id = sc->run_id};
    sc->join_id = (json_int_t)req - 1;
    dl__rdzv_stats_join(&s->stats, sc->run_id, now_s());
    ev.join.agent_id = dl_proto_get_str(msg, "node_id");
    ev.join.host = dl_proto_get_str(msg, "host");
    ev.join.slots = (int)dl_proto_get_int(msg, "slots", 1);
    ev.join.node_rank = (int)dl_proto_get_int(msg, "node_rank", -1);
    ev.join.slurm_node_id = (int)dl_proto_get_int(msg, "slurm_node_id", -1);
    ev.join.master_addr = dl_proto_get_str(msg, "master_addr");
    ev.join.master_port = (int)dl_proto_get_int(msg, "master_port", 0);
    ev.join.resume_round = (int)dl_proto_get_int(msg, "round", -1);
    ev.join.opts = has_opts ? &opts : NULL;
    run_core(s, &ev);
}

/* Keeps the "diag" report a heartbeat or failure report carries; returns the job-wide view
 * (new reference) or NULL. A bad report is the sender's problem, not the heartbeat's. */
static json_t *take_report(sconn_t *sc, const json_t *msg)
{
    const json_t *rep = json_object_get(msg, "diag");
    char err[256];
    if (rep == NULL)
        return NULL;
    int r = dl__jobview_report(sc->s->view, sc->run_id, (int)dl_proto_get_int(msg, "round", 0),
                               conn_id(sc), rep, now_s(), err, sizeof(err));
    if (r == -EBADMSG)
        slog(sc->s, DL_RDZV_LOG_WARN, sc->run_id, "ignoring a node report: %s", err);
    return dl__jobview_view(sc->s->view, sc->run_id);
}

static void handle_ready(sconn_t *sc, json_t *msg, dl_proto_type_t type)
{
    dl_rdzv_server_t *s = sc->s;
    json_int_t id = dl_proto_get_int(msg, "id", -1);
    uint64_t req = (uint64_t)id + 1; /* the core's 0 means "nobody asked" */
    dl_rdzv_event_t ev = {.conn = conn_id(sc), .req_id = req, .run_id = sc->run_id};
    dl_rdzv_buf_t keys[DL_PROTO_WAIT_KEYS_MAX];
    char desc[900]; /* a round change's reason is 1024 bytes at most, with the agent named */
    const char *key;

    if (!dl_proto_may_send(type, sc->role)) {
        s->stats.rejected[DL_PROTO_E_FORBIDDEN]++;
        send_error(sc, id, DL_PROTO_E_FORBIDDEN, "a %s may not send %s",
                   dl_proto_role_name(sc->role), dl_proto_type_name(type));
        return;
    }
    s->stats.messages[type]++;
    switch (type) {
    case DL_PROTO_JOIN:
        handle_join(sc, msg, req);
        return;
    case DL_PROTO_HEARTBEAT: {
        json_t *progress = json_object_get(msg, "progress");
        if (progress != NULL)
            dl__rdzv_stats_progress(&s->stats, sc->run_id, progress, unix_now());
        ev.kind = DL_RDZV_EV_HEARTBEAT;
        run_core(s, &ev);
        json_t *result = json_pack("{s:I}", "round", dl_proto_get_int(msg, "round", 0));
        /* The node's report in, the job-wide view out (docs/diagnostics.md). */
        json_t *diag = take_report(sc, msg);
        if (diag != NULL && result != NULL)
            json_object_set_new(result, "diag", diag);
        json_auto_t *r = dl_proto_reply_new(id, result);
        if (r != NULL)
            dl__conn_send(&sc->c, r);
        return;
    }
    case DL_PROTO_NODE_DONE:
        ev.kind = DL_RDZV_EV_LEAVE;
        ev.report.round = (int)dl_proto_get_int(msg, "round", 0);
        break;
    case DL_PROTO_LEAVE: {
        json_auto_t *r = dl_proto_reply_new(id, NULL);
        if (r != NULL)
            dl__conn_send(&sc->c, r);
        dl__conn_close(&sc->c, 0);
        return;
    }
    case DL_PROTO_WORKER_FAILED: {
        json_int_t code = dl_proto_get_int(msg, "exit_code", -1);
        const char *reason = dl_proto_get_str(msg, "reason");
        if (reason != NULL)
            snprintf(desc, sizeof(desc), "%s", reason);
        else if (code >= 0)
            snprintf(desc, sizeof(desc), "rank %lld exited with code %lld",
                     (long long)dl_proto_get_int(msg, "rank", -1), (long long)code);
        else
            snprintf(desc, sizeof(desc), "rank %lld was killed by signal %lld",
                     (long long)dl_proto_get_int(msg, "rank", -1),
                     (long long)dl_proto_get_int(msg, "signal", 0));
        ev.kind = DL_RDZV_EV_WORKER_FAILED;
        ev.report.round = (int)dl_proto_get_int(msg, "round", 0);
        ev.report.description = desc;
        char peer[80];
        dl__conn_peer(&sc->c, peer, sizeof(peer));
        dl__rdzv_stats_failure(&s->stats, sc->run_id, msg, peer, unix_now());
        /* Where every rank of the job is, from this report and the others' latest. */
        json_decref(take_report(sc, msg));
        if (!json_is_true(json_object_get(msg, "excluded"))) {
            size_t l = strlen(desc);
            if (l + 32 < sizeof(desc) &&
                dl__jobview_explain(s->view, sc->run_id, now_s(), 0, desc + l + 2,
                                    sizeof(desc) - l - 2) > 0)
                memcpy(desc + l, "; ", 2);
        }
        break;
    }
    case DL_PROTO_KV_SET:
    case DL_PROTO_KV_GET:
    case DL_PROTO_KV_ADD:
    case DL_PROTO_KV_CAS:
    case DL_PROTO_KV_DEL: {
        json_t *v;
        key = dl_proto_get_str(msg, "key");
        ev.store.round = -1;
        ev.store.key = (dl_rdzv_buf_t){key, strlen(key)};
        if ((v = json_object_get(msg, "value")) != NULL && json_is_string(v))
            ev.store.value = (dl_rdzv_buf_t){json_string_value(v), json_string_length(v)};
        ev.kind = type == DL_PROTO_KV_SET   ? DL_RDZV_EV_STORE_SET
                  : type == DL_PROTO_KV_GET ? DL_RDZV_EV_STORE_GET
                  : type == DL_PROTO_KV_ADD ? DL_RDZV_EV_STORE_ADD
                  : type == DL_PROTO_KV_CAS ? DL_RDZV_EV_STORE_CAS
                                            : DL_RDZV_EV_STORE_DELETE;
        ev.store.delta = (int64_t)dl_proto_get_int(msg, "delta", 0);
        if (type == DL_PROTO_KV_CAS) {
            v = json_object_get(msg, "expected");
            ev.store.expect_absent = json_is_null(v);
            if (json_is_string(v))
                ev.store.expected = (dl_rdzv_buf_t){json_string_value(v), json_string_length(v)};
        }
        break;
    }
    case DL_PROTO_KV_WAIT: {
        json_t *arr = json_object_get(msg, "keys"), *k;
        size_t i;
        json_array_foreach(arr, i, k)
        {
            keys[i] = (dl_rdzv_buf_t){json_string_value(k), json_string_length(k)};
        }
        ev.kind = DL_RDZV_EV_STORE_WAIT;
        ev.wait.round = -1;
        ev.wait.keys = keys;
        ev.wait.nkeys = json_array_size(arr);
        ev.wait.timeout = (double)dl_proto_get_int(msg, "timeout_ms", 0) / 1000.0;
        break;
    }
    case DL_PROTO_STATUS:
        sc->status_ranks = json_is_true(json_object_get(msg, "ranks"));
        ev.kind = DL_RDZV_EV_STATUS;
        if (json_is_true(json_object_get(msg, "all")))
            ev.run_id = NULL;
        break;
    case DL_PROTO_STOP:
        ev.kind = DL_RDZV_EV_STOP;
        break;
    case DL_PROTO_RESTART:
        ev.kind = DL_RDZV_EV_RESTART;
        break;
    case DL_PROTO_EVENTS_FOLLOW:
        follow(sc, id, dl_proto_get_int(msg, "since", 0));
        return;
    default:
        send_error(sc, id, DL_PROTO_E_UNEXPECTED, "%s is not served here",
                   dl_proto_type_name(type));
        return;
    }
    run_core(s, &ev);
}

static void become_ready(sconn_t *sc, json_int_t id)
{
    json_auto_t *ok = dl_proto_msg_new(DL_PROTO_AUTH_OK, id);
    if (ok == NULL)
        return;
    json_object_set_new(ok, "heartbeat_ms", json_integer((json_int_t)(sc->s->heartbeat * 1000)));
    preauth_remove(sc);
    sc->state = SC_READY;
    dl_proto_decoder_set_limit(&sc->c.dec, DL_PROTO_LIMIT);
    dl__conn_send(&sc->c, ok);
}

static void on_message(dl__conn_t *c, json_t *msg, dl_proto_type_t type)
{
    sconn_t *sc = (sconn_t *)c;
    dl_rdzv_server_t *s = sc->s;
    json_int_t id = dl_proto_get_int(msg, "id", -1);

    switch (sc->state) {
    case SC_HELLO:
        if (type != DL_PROTO_HELLO)
            break;
        if (dl_proto_role_parse(dl_proto_get_str(msg, "role"), &sc->role) < 0) {
            send_error(sc, id, DL_PROTO_E_BAD_FIELD, "hello: unknown role");
            dl__conn_close(c, 0);
            return;
        }
        if (dl_proto_get_int(msg, "proto", 0) != DL_PROTO_VERSION) {
            send_error(sc, id, DL_PROTO_E_UNSUPPORTED_VERSION, "this server speaks protocol %d",
                       DL_PROTO_VERSION);
            dl__conn_close(c, 0);
            return;
        }
        snprintf(sc->run_id, sizeof(sc->run_id), "%s", dl_proto_get_str(msg, "run_id"));
        if (s->token == NULL) {
            become_ready(sc, id);
            return;
        }
        if (dl_proto_nonce_new(sc->nonce) < 0) {
            send_error(sc, id, DL_PROTO_E_INTERNAL, "no randomness for a challenge");
            dl__conn_close(c, 0);
            return;
        }
        {
            json_auto_t *ch = dl_proto_msg_new(DL_PROTO_CHALLENGE, id);
            json_object_set_new(ch, "nonce", json_string(sc->nonce));
            sc->state = SC_AUTH;
            dl__conn_send(c, ch);
        }
        return;
    case SC_AUTH:
        if (type != DL_PROTO_AUTH)
            break;
        if (dl_proto_auth_verify(s->token, sc->nonce, sc->run_id, sc->role,
                                 dl_proto_get_str(msg, "proof")) != 0) {
            char peer[80];
            dl__conn_peer(c, peer, sizeof(peer));
            slog(s, DL_RDZV_LOG_WARN, sc->run_id, "refused %s from %s: wrong job token",
                 dl_proto_role_name(sc->role), peer);
            s->stats.auth_failures++;
            send_error(sc, id, DL_PROTO_E_AUTH_FAILED, "wrong job token");
            dl__conn_close(c, 0);
            return;
        }
        become_ready(sc, id);
        return;
    case SC_READY:
        if (type == DL_PROTO_HELLO || type == DL_PROTO_AUTH) {
            send_error(sc, id, DL_PROTO_E_UNEXPECTED, "already authenticated");
            return;
        }
        handle_ready(sc, msg, type);
        return;
    }
    send_error(sc, id, DL_PROTO_E_NOT_AUTHENTICATED, "%s before hello and auth; closing",
               dl_proto_type_name(type));
    dl__conn_close(c, 0);
}

static void on_invalid(dl__conn_t *c, const dl_proto_error_t *err, bool fatal)
{
    sconn_t *sc = (sconn_t *)c;
    json_auto_t *m = dl_proto_error_from(err);
    if ((size_t)err->code < DL_PROTO_E_COUNT)
        sc->s->stats.rejected[err->code]++;
    if (m != NULL)
        dl__conn_send(c, m);
    /* Before authentication nothing a stranger sends deserves a second chance. */
    if (!fatal && sc->state != SC_READY)
        dl__conn_close(c, UV_EPROTO);
}

static void maybe_done(dl_rdzv_server_t *s);

static void on_conn_closed(dl__conn_t *c, int status)
{
    sconn_t *sc = (sconn_t *)c;
    dl_rdzv_server_t *s = sc->s;
    preauth_remove(sc);
    if (sc->state == SC_READY && s->core != NULL) {
        dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_DISCONNECT, .conn = conn_id(sc),
                              .run_id = sc->run_id};
        run_core(s, &ev);
        dl__jobview_drop_conn(s->view, sc->run_id, conn_id(sc));
    }
    slot_release(s, sc);
    s->nconns--;
    free(sc);
    s->open_handles--;
    maybe_done(s);
}

static void on_connection(uv_stream_t *server, int status)
{
    dl_rdzv_server_t *s = server->data;
    sconn_t *sc;

    if (status < 0) {
        slog(s, DL_RDZV_LOG_WARN, NULL, "accept failed: %s", uv_strerror(status));
        return;
    }
    sc = calloc(1, sizeof(*sc));
    if (sc == NULL || slot_take(s, sc) < 0) {
        /* Take it off the backlog and drop it, or libuv would call us for it again. */
        uv_tcp_t tmp;
        uv_tcp_init(s->loop, &tmp);
        if (uv_accept(server, (uv_stream_t *)&tmp) == 0)
            slog(s, DL_RDZV_LOG_ERROR, NULL, "out of memory: dropping a connection");
        uv_close((uv_handle_t *)&tmp, NULL);
        free(sc);
        return;
    }
    sc->s = s;
    sc->join_id = -1;
    dl__conn_init(s->loop, &sc->c, DL_PROTO_LIMIT_PREAUTH, s->readbuf, sizeof(s->readbuf));
    sc->c.on_message = on_message;
    sc->c.on_invalid = on_invalid;
    sc->c.on_closed = on_conn_closed;
    s->open_handles++;
    s->nconns++;
    s->stats.accepted++;
    if (s->nconns > s->peak)
        s->peak = s->nconns;
    sc->accepted = now_s();
    sc->in_preauth = true;
    sc->prev = s->preauth_tail;
    if (s->preauth_tail != NULL)
        s->preauth_tail->next = sc;
    else
        s->preauth_head = sc;
    s->preauth_tail = sc;
    if (sc->prev == NULL)
        preauth_arm(s);
    int r = uv_accept(server, (uv_stream_t *)&sc->c.tcp);
    if (r == 0)
        r = dl__conn_start(&sc->c);
    if (r < 0)
        dl__conn_close(&sc->c, r);
}

/* ---- life cycle ---- */

void dl_rdzv_server_opts_init(dl_rdzv_server_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->host = "127.0.0.1";
    dl_rdzv_core_opts_init(&opts->core);
    opts->heartbeat = 1.0;
    opts->auth_timeout = 10.0;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, &in6addr_loopback,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

static void handle_closed(uv_handle_t *h)
{
    dl_rdzv_server_t *s = h->data;
    s->open_handles--;
    maybe_done(s);
}

static void maybe_done(dl_rdzv_server_t *s)
{
    if (!s->closing || s->open_handles > 0)
        return;
    void (*done)(void *) = s->done;
    void *ctx = s->done_ctx;
    dl_rdzv_core_free(s->core);
    json_decref(s->journals);
    json_decref(s->snapshot);
    dl__rdzv_stats_free(&s->stats);
    dl__jobview_free(s->view);
    free(s->slots);
    free(s->gens);
    free(s->free_slots);
    free(s);
    if (done != NULL)
        done(ctx);
}

int dl_rdzv_server_start(uv_loop_t *loop, const dl_rdzv_server_opts_t *opts,
                         dl_rdzv_server_t **ret_server, char *err, size_t errlen)
{
    struct sockaddr_storage sa;
    dl_rdzv_server_t *s;
    int r;

    if (uv_ip4_addr(opts->host, opts->port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(opts->host, opts->port, (struct sockaddr_in6 *)&sa) != 0) {
        snprintf(err, errlen, "'%s' is not an IP address", opts->host);
        return -EINVAL;
    }
    if (opts->token == NULL && !is_loopback((struct sockaddr *)&sa)) {
        snprintf(err, errlen,
                 "refusing to serve %s:%d without a job token: give --token-file or "
                 "DLAUNCH_TOKEN, or bind a loopback address",
                 opts->host, opts->port);
        return -EPERM;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    s->loop = loop;
    s->token = opts->token;
    s->heartbeat = opts->heartbeat;
    s->auth_timeout = opts->auth_timeout;
    s->log = opts->log;
    s->log_ctx = opts->log_ctx;
    snprintf(s->store_host, sizeof(s->store_host), "%s", opts->host);
    s->journals = json_object();
    r = s->journals != NULL ? dl__rdzv_stats_init(&s->stats, unix_now()) : -ENOMEM;
    if (r == 0)
        r = dl__jobview_new(&s->view);
    if (r == 0)
        r = dl_rdzv_core_new(&opts->core, &s->core);
    if (r < 0) {
        snprintf(err, errlen, "bad rendezvous settings: %s", strerror(-r));
        json_decref(s->journals);
        dl__rdzv_stats_free(&s->stats);
        dl__jobview_free(s->view);
        free(s);
        return r;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    uv_timer_init(loop, &s->core_timer);
    s->core_timer.data = s;
    uv_timer_init(loop, &s->auth_timer);
    s->auth_timer.data = s;
    s->open_handles = 3;
    r = uv_tcp_bind(&s->listener, (struct sockaddr *)&sa, 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&s->listener, 4096, on_connection);
    if (r < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", opts->host, opts->port,
                 uv_strerror(r));
        dl_rdzv_server_close(s, NULL, NULL);
        return r;
    }
    int len = sizeof(sa);
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&sa, &len);
    s->port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                            : ((struct sockaddr_in6 *)&sa)->sin6_port);
    *ret_server = s;
    return 0;
}

int dl_rdzv_server_port(const dl_rdzv_server_t *s)
{
    return s->port;
}

int dl_rdzv_server_add_job(dl_rdzv_server_t *s, const char *run_id,
                           const dl_rdzv_job_opts_t *opts)
{
    return dl_rdzv_core_add_job(s->core, run_id, opts);
}

void dl_rdzv_server_reset_store(dl_rdzv_server_t *s, const char *run_id)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_RESET, .run_id = run_id};
    run_core(s, &ev);
}

void dl_rdzv_server_stats(const dl_rdzv_server_t *s, dl_rdzv_server_stats_t *ret)
{
    ret->connections = s->nconns;
    ret->peak_connections = s->peak;
    ret->conn_bytes = sizeof(sconn_t);
}

int dl_rdzv_server_snapshot(dl_rdzv_server_t *s, json_t **ret_snapshot)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STATUS, .conn = DL__RDZV_STATS_CONN};
    json_decref(s->snapshot);
    s->snapshot = NULL;
    run_core(s, &ev);
    if (s->snapshot == NULL)
        return -ENOMEM;
    *ret_snapshot = s->snapshot;
    s->snapshot = NULL;
    return 0;
}

uint64_t dl_rdzv_server_generation(const dl_rdzv_server_t *s)
{
    return s->stats.generation;
}

void dl_rdzv_server_close(dl_rdzv_server_t *s, void (*done)(void *ctx), void *ctx)
{
    if (s == NULL || s->closing)
        return;
    s->closing = true;
    s->done = done;
    s->done_ctx = ctx;
    uv_close((uv_handle_t *)&s->listener, handle_closed);
    uv_close((uv_handle_t *)&s->core_timer, handle_closed);
    uv_close((uv_handle_t *)&s->auth_timer, handle_closed);
    for (size_t i = 0; i < s->nslots; i++)
        if (s->slots[i] != NULL)
            dl__conn_close(&s->slots[i]->c, 0);
}
