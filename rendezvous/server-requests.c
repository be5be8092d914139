/* A ready connection's requests, read into the core's events; the ones the core has no part in
 * (events_follow, revoke) answered here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv-codec.h"
#include "rdzv-policy.h"
#include "server-internal.h"

/* One follow per connection, a bounded number per job; the journal so far is replayed a slice
 * at a time (dl__server_replay_start), so following never holds the loop. */
static void follow(dl__sconn_t *sc, json_int_t id, json_int_t since)
{
    dl_rdzv_server_t *s = sc->s;
    if (sc->following) {
        dl__sconn_error(sc, id, DL_PROTO_E_LIMIT_EXCEEDED,
                        "events_follow: this connection follows job '%s' already", sc->run_id);
        return;
    }
    json_auto_t *ok = dl_proto_reply_new(id, NULL);
    if (ok == NULL) {
        dl__sconn_error(sc, id, DL_PROTO_E_INTERNAL, "out of memory");
        return;
    }
    int r = dl__journals_follow(s->journals, sc->run_id, dl__sconn_id(sc), since);
    if (r == -ENOENT) {
        dl__sconn_error(sc, id, DL_PROTO_E_NOT_FOUND, "events_follow: no job '%s'", sc->run_id);
        return;
    }
    if (r == -ENOSPC) {
        dl__sconn_error(sc, id, DL_PROTO_E_LIMIT_EXCEEDED,
                        "events_follow: job '%s' has %d followers, the limit", sc->run_id,
                        DL__SERVER_FOLLOWERS_MAX);
        return;
    }
    if (r < 0) {
        dl__sconn_error(sc, id, DL_PROTO_E_INTERNAL, "out of memory");
        return;
    }
    sc->following = true;
    dl__sconn_send(sc, ok);
    dl__server_replay_start(s);
}

static void handle_join(dl__sconn_t *sc, json_t *msg, uint64_t req)
{
    dl_rdzv_server_t *s = sc->s;
    dl_rdzv_job_opts_t opts;
    char err[256];
    dl_rdzv_event_t ev = {
        .kind = DL_RDZV_EV_JOIN, .conn = dl__sconn_id(sc), .req_id = req, .run_id = sc->run_id};

    dl_rdzv_job_opts_init(&opts);
    /* How long a finished job lingers is the server's to say, not the agent's. */
    opts.linger = s->linger;
    dl_rdzv_dec_join(msg, &opts, &ev, &sc->wants_torch);
    if (ev.join.opts != NULL && dl_rdzv_job_opts_check(&opts, err, sizeof(err)) < 0) {
        dl__sconn_error(sc, (json_int_t)(req - 1), DL_PROTO_E_BAD_FIELD, "join: %s", err);
        return;
    }
    sc->join_id = (json_int_t)(req - 1);
    sc->joined = true;
    dl__rdzv_stats_join(&s->stats, sc->run_id, dl__server_now());
    ev.join.creator = sc->creator;
    dl__rdzv_server_feed(s, &ev);
}

/* Keeps the "diag" report a heartbeat or failure report carries (rep, of round); returns the
 * job-wide view (new reference) or NULL. A bad report is the sender's problem, not the
 * heartbeat's. */
static json_t *take_report(dl__sconn_t *sc, int round, const json_t *rep)
{
    char err[256];
    if (rep == NULL)
        return NULL;
    int r = dl__jobview_report(sc->s->view, sc->run_id, round, dl__sconn_id(sc), rep,
                               dl__server_now(), err, sizeof(err));
    if (r == -EBADMSG)
        dl__rdzv_server_log(sc->s, DL_RDZV_LOG_WARN, sc->run_id, "ignoring a node report: %s", err);
    return dl__jobview_view(sc->s->view, sc->run_id);
}

/* Closes the connections of run_id that hold a key issued before `before`: a revoked key keeps
 * nothing it opened. */
static void close_revoked(dl_rdzv_server_t *s, const char *run_id, int64_t before)
{
    for (size_t i = 0; i < s->nslots; i++) {
        dl__sconn_t *sc = s->slots[i];
        if (sc == NULL || sc->state != DL__SCONN_READY || sc->c.closing ||
            sc->level == DL_PROTO_TOKEN_MASTER || strcmp(sc->run_id, run_id) != 0 ||
            sc->life.issued >= before)
            continue;
        char peer[80];
        dl__conn_peer(&sc->c, peer, sizeof(peer));
        dl__rdzv_server_log(s, DL_RDZV_LOG_WARN, run_id,
                            "closed the %s connection from %s: its key is revoked",
                            dl_proto_role_name(sc->role), peer);
        dl__sconn_error(sc, -1, DL_PROTO_E_AUTH_FAILED,
                        "the keys of job '%s' issued before this moment are revoked; closing",
                        run_id);
        dl__conn_close(&sc->c, 0);
    }
}

/* revoke: from now on, every key of this run issued before `before` is refused, and the
 * connections that hold one are closed. Only the server's own token may, as it made the keys. */
static void handle_revoke(dl__sconn_t *sc, int64_t before, json_int_t id)
{
    dl_rdzv_server_t *s = sc->s;
    char err[512], when[32];
    int64_t now_before;

    if (sc->level != DL_PROTO_TOKEN_MASTER) {
        dl__sconn_error(sc, id, DL_PROTO_E_FORBIDDEN,
                        "revoke needs the server's own token; a %s key cannot withdraw keys",
                        dl_proto_token_kind_name(sc->level));
        return;
    }
    int r = dl__revoked_add(s->revoked, sc->run_id, before, &now_before, err, sizeof(err));
    if (r == -ENOSPC || r == -ENOMEM) {
        dl__sconn_error(sc, id, r == -ENOSPC ? DL_PROTO_E_LIMIT_EXCEEDED : DL_PROTO_E_INTERNAL,
                        "%s", err);
        return;
    }
    if (r < 0) {
        /* Kept in memory all the same: it holds until this server restarts. */
        dl__rdzv_server_log(s, DL_RDZV_LOG_ERROR, sc->run_id, "%s", err);
        dl__sconn_error(sc, id, DL_PROTO_E_INTERNAL, "revoked until this server restarts only: %s",
                        err);
    }
    dl__rdzv_server_log(s, DL_RDZV_LOG_INFO, sc->run_id, "keys issued before %s are revoked",
                        dl_proto_time_text(now_before, when, sizeof(when)));
    close_revoked(s, sc->run_id, now_before);
    if (r == 0) {
        json_auto_t *reply = dl_rdzv_enc_revoke_reply(id, now_before);
        if (reply != NULL)
            dl__sconn_send(sc, reply);
    }
}

/* worker_failed: the job's last failure, every rank's whereabouts, the core's event. */
static void handle_failure(dl__sconn_t *sc, const json_t *msg, dl_rdzv_event_t *ev, char *desc,
                           size_t room, dl_rdzv_policy_rank_t **ranks)
{
    dl_rdzv_server_t *s = sc->s;
    dl_rdzv_failure_msg_t f;
    char peer[80];

    dl_rdzv_dec_worker_failed(msg, &f);
    if (f.reason != NULL)
        snprintf(desc, room, "%s", f.reason);
    else if (f.exit_code >= 0)
        snprintf(desc, room, "rank %d exited with code %d", f.rank, f.exit_code);
    else
        snprintf(desc, room, "rank %d was killed by signal %d", f.rank, f.signal);
    ev->kind = DL_RDZV_EV_WORKER_FAILED;
    ev->report.round = f.round;
    ev->report.description = desc;
    ev->report.rank = f.rank;
    ev->report.exit_code = f.exit_code;
    ev->report.signal = f.signal;
    ev->report.hung = f.hung;
    ev->report.oom = f.oom;
    ev->report.step = f.step;
    dl__conn_peer(&sc->c, peer, sizeof(peer));
    dl__rdzv_stats_failure(&s->stats, sc->run_id, &f, peer, dl__server_unix_now());
    /* Where every rank of the job is, from this report and the others' latest. */
    json_decref(take_report(sc, f.round, f.diag));
    ev->report.nranks = dl__jobview_policy_ranks(s->view, sc->run_id, dl__server_now(), ranks);
    ev->report.ranks = *ranks;
    if (!f.excluded) {
        size_t l = strlen(desc);
        if (l + 32 < room && dl__jobview_explain(s->view, sc->run_id, dl__server_now(), 0,
                                                 desc + l + 2, room - l - 2) > 0)
            memcpy(desc + l, "; ", 2);
    }
}

static void handle_heartbeat(dl__sconn_t *sc, const json_t *msg, dl_rdzv_event_t *ev, json_int_t id)
{
    dl_rdzv_server_t *s = sc->s;
    dl_rdzv_beat_msg_t b;
    dl_rdzv_dec_heartbeat(msg, &b);
    if (b.has_progress)
        dl__rdzv_stats_progress(&s->stats, sc->run_id, &b, dl__server_unix_now());
    if (b.recovery != NULL)
        dl__rdzv_stats_recovery(&s->stats, sc->run_id, b.recovery);
    ev->kind = DL_RDZV_EV_HEARTBEAT;
    dl__rdzv_server_feed(s, ev);
    /* The node's report in, the job-wide view out (docs/diagnostics.md). */
    json_auto_t *r = dl_rdzv_enc_beat_reply(id, b.round, take_report(sc, b.round, b.diag));
    if (r != NULL)
        dl__sconn_send(sc, r);
}

void dl__sconn_request(dl__sconn_t *sc, json_t *msg, dl_proto_type_t type)
{
    dl_rdzv_server_t *s = sc->s;
    json_int_t id = dl_proto_get_int(msg, "id", -1);
    uint64_t req = (uint64_t)id + 1; /* the core's 0 means "nobody asked" */
    dl_rdzv_event_t ev = {.conn = dl__sconn_id(sc), .req_id = req, .run_id = sc->run_id};
    dl_rdzv_buf_t keys[DL_PROTO_WAIT_KEYS_MAX];
    dl_rdzv_control_msg_t ctl;
    char desc[900]; /* a round change's reason is 1024 bytes at most, with the agent named */
    dl_rdzv_policy_rank_t *ranks = NULL; /* WORKER_FAILED: for the first-failure rule */

    if (!dl_proto_may_send(type, sc->role)) {
        /* A reply or notification from a client answers nothing: no id to echo. */
        dl__sconn_error(sc, dl_proto_type_kind(type) == DL_PROTO_KIND_REQUEST ? id : -1,
                        DL_PROTO_E_FORBIDDEN, "a %s may not send %s", dl_proto_role_name(sc->role),
                        dl_proto_type_name(type));
        return;
    }
    if (sc->outstanding > s->max_outstanding) {
        dl__sconn_error(sc, id, DL_PROTO_E_LIMIT_EXCEEDED,
                        "%s: this connection has %u requests waiting for an answer, the limit",
                        dl_proto_type_name(type), s->max_outstanding);
        return;
    }
    s->stats.messages[type]++;
    /* The store's requests, the most frequent, are read into the core's event alone. */
    if (type == DL_PROTO_NODE_DONE || type == DL_PROTO_LEAVE || type == DL_PROTO_STATUS ||
        type == DL_PROTO_EVENTS_FOLLOW || type == DL_PROTO_REVOKE)
        dl_rdzv_dec_control(msg, &ctl);
    switch (type) {
    case DL_PROTO_JOIN: handle_join(sc, msg, req); return;
    case DL_PROTO_HEARTBEAT: handle_heartbeat(sc, msg, &ev, id); return;
    case DL_PROTO_NODE_DONE:
        ev.kind = DL_RDZV_EV_LEAVE;
        ev.report.round = ctl.round;
        break;
    case DL_PROTO_LEAVE: {
        if (ctl.reason != NULL)
            snprintf(desc, sizeof(desc), "%s", ctl.reason);
        ev.kind = DL_RDZV_EV_QUIT;
        ev.report.description = ctl.reason != NULL ? desc : NULL;
        dl__rdzv_server_feed(s, &ev);
        json_auto_t *r = dl_proto_reply_new(id, NULL);
        if (r != NULL)
            dl__sconn_send(sc, r);
        dl__conn_close(&sc->c, 0);
        return;
    }
    case DL_PROTO_WORKER_FAILED: handle_failure(sc, msg, &ev, desc, sizeof(desc), &ranks); break;
    case DL_PROTO_KV_SET:
    case DL_PROTO_KV_GET:
    case DL_PROTO_KV_ADD:
    case DL_PROTO_KV_CAS:
    case DL_PROTO_KV_DEL:
    case DL_PROTO_KV_WAIT: dl_rdzv_dec_kv_req(msg, type, &ev, keys); break;
    case DL_PROTO_STATUS:
        sc->status_ranks = ctl.ranks;
        ev.kind = DL_RDZV_EV_STATUS;
        if (ctl.all) {
            /* Every job's names, hosts and failures: for whoever holds the server's secret. */
            if (sc->level != DL_PROTO_TOKEN_MASTER) {
                dl__sconn_error(sc, id, DL_PROTO_E_FORBIDDEN,
                                "status of every job needs the server's own token; a %s key "
                                "reaches job '%s' only",
                                dl_proto_token_kind_name(sc->level), sc->run_id);
                return;
            }
            ev.run_id = NULL;
        }
        break;
    case DL_PROTO_STOP: ev.kind = DL_RDZV_EV_STOP; break;
    case DL_PROTO_RESTART: ev.kind = DL_RDZV_EV_RESTART; break;
    case DL_PROTO_EVENTS_FOLLOW: follow(sc, id, ctl.since); return;
    case DL_PROTO_REVOKE: handle_revoke(sc, ctl.before, id); return;
    default:
        dl__sconn_error(sc, id, DL_PROTO_E_UNEXPECTED, "%s is not served here",
                        dl_proto_type_name(type));
        return;
    }
    dl__rdzv_server_feed(s, &ev);
    free(ranks);
}
