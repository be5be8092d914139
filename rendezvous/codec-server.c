/* The rendezvous protocol's messages as the server reads and writes them (rdzv-codec.h, "The
 * server's half"): requests into typed structs and the core's events, the core's messages and
 * the job's journal into frames. server.c works on what comes out. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rdzv-codec.h"

/* ---- requests ---- */

static dl_rdzv_buf_t buf_of(const json_t *v)
{
    return (dl_rdzv_buf_t){json_string_value(v), json_string_length(v)};
}

void dl_rdzv_dec_hello(const json_t *msg, dl_rdzv_hello_msg_t *ret)
{
    ret->role = dl_proto_get_str(msg, "role");
    ret->run_id = dl_proto_get_str(msg, "run_id");
    ret->proto = dl_proto_get_int(msg, "proto", 0);
    ret->nonce = dl_proto_get_str(msg, "nonce");
}

void dl_rdzv_dec_auth(const json_t *msg, dl_rdzv_auth_msg_t *ret)
{
    ret->proof = dl_proto_get_str(msg, "proof");
    ret->claimed = dl_proto_auth_claimed_life(msg);
}

static double ms_field(const json_t *msg, const char *name, double dflt)
{
    json_int_t v = dl_proto_get_int(msg, name, -1);
    return v >= 0 ? (double)v / 1000.0 : dflt;
}

void dl_rdzv_dec_join(const json_t *msg, dl_rdzv_job_opts_t *opts, dl_rdzv_event_t *ev,
                      bool *ret_torch)
{
    opts->min_nodes = (int)dl_proto_get_int(msg, "min_nodes", opts->min_nodes);
    opts->max_nodes = (int)dl_proto_get_int(msg, "max_nodes", opts->max_nodes);
    opts->last_call = ms_field(msg, "last_call_ms", opts->last_call);
    opts->join_timeout = ms_field(msg, "join_timeout_ms", opts->join_timeout);
    opts->dead_after = ms_field(msg, "dead_after_ms", opts->dead_after);
    opts->max_restarts = (int)dl_proto_get_int(msg, "max_restarts", opts->max_restarts);
    opts->max_same_failures =
        (int)dl_proto_get_int(msg, "max_same_failures", opts->max_same_failures);
    ev->join.agent_id = dl_proto_get_str(msg, "node_id");
    ev->join.host = dl_proto_get_str(msg, "host");
    ev->join.slots = (int)dl_proto_get_int(msg, "slots", 1);
    ev->join.node_rank = (int)dl_proto_get_int(msg, "node_rank", -1);
    ev->join.slurm_node_id = (int)dl_proto_get_int(msg, "slurm_node_id", -1);
    ev->join.master_addr = dl_proto_get_str(msg, "master_addr");
    ev->join.master_port = (int)dl_proto_get_int(msg, "master_port", 0);
    ev->join.resume_round = (int)dl_proto_get_int(msg, "round", -1);
    ev->join.failures = (int)dl_proto_get_int(msg, "failures", -1);
    ev->join.opts = json_object_get(msg, "min_nodes") != NULL ? opts : NULL;
    *ret_torch = json_is_true(json_object_get(msg, "torch_store"));
}

void dl_rdzv_dec_progress(const json_t *p, dl_rdzv_beat_msg_t *ret)
{
    const json_t *step = json_object_get(p, "step"), *loss = json_object_get(p, "loss"),
                 *rate = json_object_get(p, "samples_per_s");
    ret->has_progress = json_is_integer(step);
    ret->step = ret->has_progress ? (long long)json_integer_value(step) : 0;
    ret->loss = json_is_number(loss) ? json_number_value(loss) : NAN;
    ret->samples_per_s = json_is_number(rate) ? json_number_value(rate) : NAN;
}

void dl_rdzv_dec_heartbeat(const json_t *msg, dl_rdzv_beat_msg_t *ret)
{
    ret->round = (int)dl_proto_get_int(msg, "round", 0);
    dl_rdzv_dec_progress(json_object_get(msg, "progress"), ret);
    ret->diag = json_object_get(msg, "diag");
    ret->recovery = json_object_get(msg, "recovery");
}

void dl_rdzv_dec_worker_failed(const json_t *msg, dl_rdzv_failure_msg_t *ret)
{
    const json_t *time = json_object_get(msg, "time");
    memset(ret, 0, sizeof(*ret));
    ret->round = (int)dl_proto_get_int(msg, "round", 0);
    ret->rank = (int)dl_proto_get_int(msg, "rank", -1);
    ret->local_rank = (int)dl_proto_get_int(msg, "local_rank", -1);
    ret->exit_code = (int)dl_proto_get_int(msg, "exit_code", -1);
    ret->signal = (int)dl_proto_get_int(msg, "signal", 0);
    ret->hung = json_is_true(json_object_get(msg, "hung"));
    ret->oom = json_is_true(json_object_get(msg, "oom"));
    ret->excluded = json_is_true(json_object_get(msg, "excluded"));
    ret->step = dl_proto_get_int(msg, "step", -1);
    ret->reason = dl_proto_get_str(msg, "reason");
    ret->time = json_is_number(time) ? json_number_value(time) : NAN;
    ret->log_tail = dl_proto_get_str(msg, "log_tail");
    ret->diag = json_object_get(msg, "diag");
}

void dl_rdzv_dec_kv_req(const json_t *msg, dl_proto_type_t type, dl_rdzv_event_t *ev,
                        dl_rdzv_buf_t *keys)
{
    const json_t *v;
    if (type == DL_PROTO_KV_WAIT) {
        const json_t *arr = json_object_get(msg, "keys");
        size_t i;
        json_array_foreach (arr, i, v) {
            keys[i] = buf_of(v);
        }
        ev->kind = DL_RDZV_EV_STORE_WAIT;
        ev->wait.round = -1;
        ev->wait.keys = keys;
        ev->wait.nkeys = json_array_size(arr);
        ev->wait.timeout = (double)dl_proto_get_int(msg, "timeout_ms", 0) / 1000.0;
        return;
    }
    ev->kind = type == DL_PROTO_KV_SET   ? DL_RDZV_EV_STORE_SET
               : type == DL_PROTO_KV_GET ? DL_RDZV_EV_STORE_GET
               : type == DL_PROTO_KV_ADD ? DL_RDZV_EV_STORE_ADD
               : type == DL_PROTO_KV_CAS ? DL_RDZV_EV_STORE_CAS
                                         : DL_RDZV_EV_STORE_DELETE;
    ev->store.round = -1;
    ev->store.key = buf_of(json_object_get(msg, "key"));
    if (json_is_string(v = json_object_get(msg, "value")))
        ev->store.value = buf_of(v);
    ev->store.delta = (int64_t)dl_proto_get_int(msg, "delta", 0);
    if (type == DL_PROTO_KV_CAS) {
        v = json_object_get(msg, "expected");
        ev->store.expect_absent = json_is_null(v);
        if (json_is_string(v))
            ev->store.expected = buf_of(v);
    }
}

void dl_rdzv_dec_control(const json_t *msg, dl_rdzv_control_msg_t *ret)
{
    ret->all = json_is_true(json_object_get(msg, "all"));
    ret->ranks = json_is_true(json_object_get(msg, "ranks"));
    ret->reason = dl_proto_get_str(msg, "reason");
    ret->since = dl_proto_get_int(msg, "since", 0);
    ret->before = dl_proto_get_int(msg, "before", 0);
    ret->round = (int)dl_proto_get_int(msg, "round", 0);
}

/* ---- replies ---- */

json_t *dl_rdzv_enc_challenge(json_int_t id, const char *nonce)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_CHALLENGE, id);
    if (m != NULL && json_object_set_new(m, "nonce", json_string(nonce)) < 0) {
        json_decref(m);
        return NULL;
    }
    return m;
}

json_t *dl_rdzv_enc_auth_ok(json_int_t id, double heartbeat, const char *proof)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_AUTH_OK, id);
    if (m == NULL)
        return NULL;
    json_object_set_new(m, "heartbeat_ms", json_integer((json_int_t)(heartbeat * 1000)));
    if (proof != NULL)
        json_object_set_new(m, "proof", json_string(proof));
    return m;
}

json_t *dl_rdzv_enc_beat_reply(json_int_t id, int round, json_t *view)
{
    json_t *result = json_pack("{s:i}", "round", round);
    if (view != NULL && result != NULL)
        json_object_set_new(result, "diag", view);
    else
        json_decref(view);
    return dl_proto_reply_new(id, result);
}

json_t *dl_rdzv_enc_revoke_reply(json_int_t id, long long before)
{
    return dl_proto_reply_new(id, json_pack("{s:I}", "before", (json_int_t)before));
}

json_t *dl_rdzv_enc_event(json_int_t seq, const json_t *event)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_EVENT, -1);
    if (m == NULL)
        return NULL;
    json_object_set_new(m, "seq", json_integer(seq));
    json_object_set(m, "event", (json_t *)event);
    return m;
}

dl_proto_errcode_t dl_rdzv_errcode_of(int code)
{
    switch (-code) {
    case ENOENT: return DL_PROTO_E_NOT_FOUND;
    case ETIMEDOUT: return DL_PROTO_E_TIMEOUT;
    case ESTALE: return DL_PROTO_E_STALE_ROUND;
    case EEXIST:
    case EADDRINUSE:
    case EBUSY: return DL_PROTO_E_CONFLICT;
    case EUSERS: return DL_PROTO_E_JOB_FULL;
    case ESHUTDOWN:
    case ECANCELED: return DL_PROTO_E_SHUTTING_DOWN;
    case EINVAL:
    case ERANGE:
    case E2BIG:
    case ENAMETOOLONG: return DL_PROTO_E_BAD_FIELD;
    case EOVERFLOW:
    case EBADMSG: return DL_PROTO_E_BAD_VALUE;
    case ENOSPC:
    case ENOBUFS:
    case EMSGSIZE:
    case EDQUOT: return DL_PROTO_E_LIMIT_EXCEEDED;
    case EAGAIN: return DL_PROTO_E_UNEXPECTED;
    default: return DL_PROTO_E_INTERNAL;
    }
}

int dl_rdzv_failed_exit_code(const dl_rdzv_msg_t *m)
{
    return m->failed.same_failures > 0 ? 5 : 1;
}

static json_t *buf_string(dl_rdzv_buf_t b)
{
    return json_stringn(b.data != NULL ? b.data : "", b.len);
}

static json_t *enc_assignment(json_int_t id, const dl_rdzv_msg_t *m,
                              const dl_rdzv_server_where_t *w)
{
    char store[DL_PROTO_NAME_MAX + 16];
    json_t *o = dl_proto_msg_new(DL_PROTO_ASSIGNMENT, id);
    if (o == NULL)
        return NULL;
    snprintf(store, sizeof(store), "%s:%d",
             m->assignment.store_host ? m->assignment.store_host : w->store_host,
             m->assignment.store_host ? m->assignment.store_port : w->store_port);
    json_object_update_new(
        o, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:s, s:i, s:i, s:i}", "round",
                     m->assignment.round, "node_rank", m->assignment.node_rank, "nodes",
                     m->assignment.nnodes, "world_size", m->assignment.world_size, "first_rank",
                     m->assignment.first_rank, "local_world_size", m->assignment.local_world_size,
                     "master_addr", m->assignment.master_addr, "master_port",
                     m->assignment.master_port, "store_addr", store, "restart_count",
                     m->assignment.restarts, "failures", m->assignment.failures, "max_restarts",
                     m->assignment.max_restarts));
    if (m->assignment.host_node_rank >= 0)
        json_object_set_new(o, "host_node_rank", json_integer(m->assignment.host_node_rank));
    if (m->assignment.nsuccessors > 0) {
        json_t *v = json_array();
        for (size_t i = 0; i < m->assignment.nsuccessors; i++)
            json_array_append_new(v, json_string(m->assignment.successors[i]));
        json_object_set_new(o, "successors", v);
    }
    if (m->assignment.culprit != NULL)
        json_object_set_new(o, "failure", dl_rdzv_enc_culprit(m->assignment.culprit));
    if (!w->torch_embedded && w->torch_addr != NULL) {
        json_object_set_new(o, "master_addr", json_string(w->torch_addr));
        json_object_set_new(o, "master_port", json_integer(w->torch_port));
    }
    if (w->torch_embedded || w->torch_addr != NULL)
        json_object_set_new(o, "torch_store", json_true());
    return o;
}

static json_t *enc_round_changed(const dl_rdzv_msg_t *m)
{
    json_t *o = dl_proto_msg_new(DL_PROTO_ROUND_CHANGED, -1);
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "round", json_integer(m->round_changed.round));
    json_object_set_new(o, "reason",
                        json_string(m->round_changed.reason != NULL && *m->round_changed.reason
                                        ? m->round_changed.reason
                                        : "new round"));
    json_object_set_new(o, "cause", json_string(dl_rdzv_cause_name(m->round_changed.cause)));
    if (m->round_changed.culprit != NULL) {
        const dl_rdzv_culprit_t *c = m->round_changed.culprit;
        if (c->rank >= 0)
            json_object_set_new(o, "failed_rank", json_integer(c->rank));
        json_object_set_new(o, "failed_node", json_string(c->node));
        json_object_set_new(o, "failure", dl_rdzv_enc_culprit(c));
    }
    return o;
}

static json_t *enc_shutdown(const dl_rdzv_msg_t *m)
{
    json_t *o = dl_proto_msg_new(DL_PROTO_SHUTDOWN, -1);
    if (o == NULL)
        return NULL;
    if (m->kind != DL_RDZV_MSG_FAILED) {
        json_object_set_new(o, "reason",
                            json_string(m->kind == DL_RDZV_MSG_STOP ? "stopped" : "succeeded"));
        json_object_set_new(o, "exit_code", json_integer(0));
        return o;
    }
    json_object_set_new(o, "reason", json_string("failed"));
    json_object_set_new(o, "exit_code", json_integer(dl_rdzv_failed_exit_code(m)));
    json_t *f = m->failed.culprit != NULL ? dl_rdzv_enc_culprit(m->failed.culprit) : json_object();
    json_object_set_new(f, "description",
                        json_string(m->failed.failure ? m->failed.failure : "unknown"));
    json_object_set_new(f, "round", json_integer(m->failed.round));
    json_object_set_new(f, "restarts", json_integer(m->failed.restarts));
    json_object_set_new(o, "failure", f);
    return o;
}

json_t *dl_rdzv_enc_core_msg(json_int_t id, const dl_rdzv_msg_t *m, const dl_rdzv_server_where_t *w)
{
    switch (m->kind) {
    case DL_RDZV_MSG_OK:
    case DL_RDZV_MSG_WAIT_DONE: return id >= 0 ? dl_proto_reply_new(id, NULL) : NULL;
    case DL_RDZV_MSG_ERROR:
        return dl_proto_error_new(id, dl_rdzv_errcode_of(m->error.code), "%s",
                                  m->error.message ? m->error.message : strerror(-m->error.code));
    case DL_RDZV_MSG_JOINED: return NULL;
    case DL_RDZV_MSG_ASSIGNMENT: return enc_assignment(id, m, w);
    case DL_RDZV_MSG_TIMEOUT:
        return dl_proto_error_new(id, DL_PROTO_E_TIMEOUT,
                                  "rendezvous timed out: round %d did not gather enough nodes",
                                  m->timeout.round);
    case DL_RDZV_MSG_ROUND_CHANGED: return enc_round_changed(m);
    case DL_RDZV_MSG_FAILED:
    case DL_RDZV_MSG_STOP:
    case DL_RDZV_MSG_SUCCEEDED: return enc_shutdown(m);
    case DL_RDZV_MSG_VALUE:
        if (!m->value.found)
            return dl_proto_error_new(id, DL_PROTO_E_NOT_FOUND, "no such key");
        return dl_proto_reply_new(id, json_pack("{s:o}", "value", buf_string(m->value.value)));
    case DL_RDZV_MSG_COUNTER:
        return dl_proto_reply_new(id, json_pack("{s:I}", "value", (json_int_t)m->counter.value));
    case DL_RDZV_MSG_CAS:
        return dl_proto_reply_new(id,
                                  json_pack("{s:b, s:o}", "swapped", m->cas.swapped, "value",
                                            m->cas.found ? buf_string(m->cas.value) : json_null()));
    case DL_RDZV_MSG_DELETED:
        return dl_proto_reply_new(id, json_pack("{s:b}", "deleted", m->deleted.deleted));
    case DL_RDZV_MSG_STATUS: return NULL;
    }
    return NULL;
}

/* ---- the journal ---- */

static json_t *event_new(const char *name, double time)
{
    return json_pack("{s:s, s:f}", "event", name, "time", time);
}

json_t *dl_rdzv_enc_journal_msg(const dl_rdzv_msg_t *m, double time, const char *master_addr,
                                int master_port)
{
    json_t *ev = NULL, *f = NULL;
    switch (m->kind) {
    case DL_RDZV_MSG_ASSIGNMENT:
        ev = event_new("rendezvous", time);
        f = json_pack("{s:i, s:i, s:i, s:i, s:s, s:i}", "round", m->assignment.round, "nodes",
                      m->assignment.nnodes, "world_size", m->assignment.world_size, "restarts",
                      m->assignment.restarts, "master_addr", master_addr, "master_port",
                      master_port);
        break;
    case DL_RDZV_MSG_ROUND_CHANGED:
        ev = event_new("round_changed", time);
        f = json_pack("{s:i, s:s, s:s}", "round", m->round_changed.round, "reason",
                      m->round_changed.reason ? m->round_changed.reason : "", "cause",
                      dl_rdzv_cause_name(m->round_changed.cause));
        break;
    case DL_RDZV_MSG_FAILED:
    case DL_RDZV_MSG_STOP:
    case DL_RDZV_MSG_SUCCEEDED:
        ev = event_new("job_end", time);
        f = json_pack("{s:s, s:i}", "status",
                      m->kind == DL_RDZV_MSG_FAILED ? "failed"
                      : m->kind == DL_RDZV_MSG_STOP ? "stopped"
                                                    : "succeeded",
                      "exit_code", m->kind == DL_RDZV_MSG_FAILED ? dl_rdzv_failed_exit_code(m) : 0);
        if (f != NULL && m->kind == DL_RDZV_MSG_FAILED && m->failed.failure != NULL)
            json_object_set_new(f, "failure", json_string(m->failed.failure));
        break;
    default: return NULL;
    }
    if (ev == NULL || f == NULL || json_object_update_new(ev, f) < 0) {
        json_decref(ev);
        return NULL;
    }
    return ev;
}

json_t *dl_rdzv_enc_journal_log(double time, dl_rdzv_log_level_t level, const char *text)
{
    json_t *ev = event_new("log", time);
    json_t *f = json_pack("{s:s, s:s}", "level",
                          level >= DL_RDZV_LOG_ERROR  ? "error"
                          : level >= DL_RDZV_LOG_WARN ? "warning"
                                                      : "info",
                          "text", text);
    if (ev == NULL || f == NULL || json_object_update_new(ev, f) < 0) {
        json_decref(ev);
        return NULL;
    }
    return ev;
}
