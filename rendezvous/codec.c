/* The rendezvous protocol's messages as typed calls (rdzv-codec.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv-codec.h"

json_t *dl_rdzv_enc_join(json_int_t id, const dl_rdzv_join_msg_t *j)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_JOIN, id);
    if (m == NULL)
        return NULL;
    json_object_update_new(
        m, json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:i, s:s, s:i}", "node_id",
                     j->node_id, "host", j->host, "slots", j->slots, "node_rank", j->node_rank,
                     "min_nodes", j->min_nodes, "max_nodes", j->max_nodes, "last_call_ms",
                     (json_int_t)(j->last_call * 1000), "join_timeout_ms",
                     (json_int_t)(j->join_timeout * 1000), "dead_after_ms",
                     (json_int_t)(j->dead_after * 1000), "max_restarts", j->max_restarts,
                     "master_addr", j->master_addr, "master_port", j->master_port));
    json_object_set_new(m, "max_same_failures", json_integer(j->max_same_failures));
    if (j->torch_store)
        json_object_set_new(m, "torch_store", json_true());
    if (j->assigned) {
        json_object_set_new(m, "round", json_integer(j->round));
        json_object_set_new(m, "failures", json_integer(j->failures));
    }
    return m;
}

json_t *dl_rdzv_enc_heartbeat(json_int_t id, const dl_rdzv_beat_msg_t *b)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_HEARTBEAT, id);
    if (m == NULL)
        return NULL;
    json_object_set_new(m, "round", json_integer(b->round));
    if (b->has_progress) {
        json_t *p = json_pack("{s:I}", "step", (json_int_t)b->step);
        if (p != NULL && !isnan(b->loss))
            json_object_set_new(p, "loss", json_real(b->loss));
        if (p != NULL && !isnan(b->samples_per_s))
            json_object_set_new(p, "samples_per_s", json_real(b->samples_per_s));
        json_object_set_new(m, "progress", p);
    }
    if (b->diag != NULL)
        json_object_set(m, "diag", b->diag);
    if (b->recovery != NULL)
        json_object_set(m, "recovery", b->recovery);
    return m;
}

json_t *dl_rdzv_enc_worker_failed(json_int_t id, const dl_rdzv_failure_msg_t *f)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_WORKER_FAILED, id);
    if (m == NULL)
        return NULL;
    json_object_set_new(m, "round", json_integer(f->round));
    json_object_set_new(m, "rank", json_integer(f->rank));
    if (f->excluded) {
        json_object_set_new(m, "exit_code", json_integer(0));
        json_object_set_new(m, "excluded", json_true());
    } else {
        json_object_set_new(m, "local_rank", json_integer(f->local_rank));
        if (f->signal > 0)
            json_object_set_new(m, "signal", json_integer(f->signal));
        else
            json_object_set_new(m, "exit_code",
                                json_integer(f->exit_code >= 0 ? f->exit_code : 127));
    }
    json_object_set_new(m, "reason", json_string(f->reason));
    if (f->hung)
        json_object_set_new(m, "hung", json_true());
    if (f->oom)
        json_object_set_new(m, "oom", json_true());
    if (f->step >= 0 && !f->excluded)
        json_object_set_new(m, "step", json_integer(f->step));
    json_object_set_new(m, "time", json_real(f->time));
    if (f->log_tail != NULL)
        json_object_set_new(m, "log_tail", json_string(f->log_tail));
    if (f->diag != NULL)
        json_object_set(m, "diag", f->diag);
    return m;
}

json_t *dl_rdzv_enc_node_done(json_int_t id, int round)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_NODE_DONE, id);
    if (m != NULL)
        json_object_set_new(m, "round", json_integer(round));
    return m;
}

json_t *dl_rdzv_enc_leave(json_int_t id, const char *reason)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_LEAVE, id);
    if (m != NULL && reason != NULL)
        json_object_set_new(m, "reason", json_string(reason));
    return m;
}

json_t *dl_rdzv_enc_events_follow(json_int_t id)
{
    return dl_proto_msg_new(DL_PROTO_EVENTS_FOLLOW, id);
}

json_t *dl_rdzv_enc_culprit(const dl_rdzv_culprit_t *c)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    if (c->cause != NULL)
        json_object_set_new(o, "cause", json_string(c->cause));
    if (c->node != NULL)
        json_object_set_new(o, "node", json_string(c->node));
    if (c->host != NULL)
        json_object_set_new(o, "host", json_string(c->host));
    if (c->node_rank >= 0)
        json_object_set_new(o, "node_rank", json_integer(c->node_rank));
    if (c->rank >= 0)
        json_object_set_new(o, "rank", json_integer(c->rank));
    if (c->hung)
        json_object_set_new(o, "hung", json_true());
    else if (c->signal > 0)
        json_object_set_new(o, "signal", json_integer(c->signal));
    else if (c->exit_code >= 0)
        json_object_set_new(o, "exit_code", json_integer(c->exit_code));
    /* What tells the same failure again from one after progress (docs/exit-codes.md). */
    if (c->oom)
        json_object_set_new(o, "oom", json_true());
    if (c->step >= 0)
        json_object_set_new(o, "step", json_integer(c->step));
    if (c->text != NULL)
        json_object_set_new(o, "text", json_string(c->text));
    return o;
}

void dl_rdzv_dec_culprit(const json_t *f, dl_rdzv_culprit_t *c)
{
    const json_t *v;
    *c = DL_RDZV_CULPRIT_NONE;
    c->cause = json_string_value(json_object_get(f, "cause"));
    c->node = json_string_value(json_object_get(f, "node"));
    c->host = json_string_value(json_object_get(f, "host"));
    if (json_is_integer(v = json_object_get(f, "node_rank")))
        c->node_rank = (int)json_integer_value(v);
    if (json_is_integer(v = json_object_get(f, "rank")))
        c->rank = (int)json_integer_value(v);
    if (json_is_integer(v = json_object_get(f, "exit_code")))
        c->exit_code = (int)json_integer_value(v);
    if (json_is_integer(v = json_object_get(f, "signal")))
        c->signal = (int)json_integer_value(v);
    c->hung = json_is_true(json_object_get(f, "hung"));
    c->oom = json_is_true(json_object_get(f, "oom"));
    if (json_is_integer(v = json_object_get(f, "step")) && json_integer_value(v) >= 0)
        c->step = json_integer_value(v);
    c->text = json_string_value(json_object_get(f, "text"));
}

void dl_rdzv_dec_round_changed(const json_t *msg, int *ret_round, const char **ret_reason,
                               dl_rdzv_culprit_t *c)
{
    *ret_round = (int)dl_proto_get_int(msg, "round", 0);
    *ret_reason = dl_proto_get_str(msg, "reason");
    dl_rdzv_dec_culprit(json_object_get(msg, "failure"), c);
    if (json_object_get(msg, "failure") == NULL)
        c->cause = json_string_value(json_object_get(msg, "cause"));
}

void dl_rdzv_dec_shutdown(const json_t *msg, dl_rdzv_shutdown_msg_t *ret)
{
    ret->reason = dl_proto_get_str(msg, "reason");
    ret->exit_code = (int)dl_proto_get_int(msg, "exit_code", 1);
    ret->failure =
        json_string_value(json_object_get(json_object_get(msg, "failure"), "description"));
}

void dl_rdzv_dec_event(const json_t *msg, const char **ret_name, const char **ret_status)
{
    const json_t *ev = json_object_get(msg, "event");
    *ret_name = json_string_value(json_object_get(ev, "event"));
    *ret_status = json_string_value(json_object_get(ev, "status"));
}

const json_t *dl_rdzv_dec_beat_view(const json_t *reply)
{
    return json_object_get(json_object_get(reply, "result"), "diag");
}

json_t *dl_rdzv_enc_control(dl_proto_type_t type, bool all, bool ranks, const char *reason)
{
    json_t *m = dl_proto_msg_new(type, 0);
    if (m == NULL)
        return NULL;
    if (type == DL_PROTO_STATUS && all)
        json_object_set_new(m, "all", json_true());
    if (type == DL_PROTO_STATUS && ranks)
        json_object_set_new(m, "ranks", json_true());
    if (type != DL_PROTO_STATUS && reason != NULL)
        json_object_set_new(m, "reason", json_string(reason));
    return m;
}

json_t *dl_rdzv_enc_kv(json_int_t id, const dl_rdzv_kv_req_t *req)
{
    json_t *m = dl_proto_msg_new(req->op, id);
    if (m == NULL)
        return NULL;
    switch (req->op) {
    case DL_PROTO_KV_WAIT: {
        json_t *keys = json_array();
        for (size_t i = 0; i < req->nkeys; i++)
            json_array_append_new(keys, json_string(req->keys[i]));
        json_object_set_new(m, "keys", keys);
        json_object_set_new(m, "timeout_ms", json_integer((json_int_t)req->timeout_ms));
        break;
    }
    case DL_PROTO_KV_ADD:
        json_object_set_new(m, "key", json_string(req->key));
        json_object_set_new(m, "delta", json_integer((json_int_t)req->delta));
        break;
    case DL_PROTO_KV_CAS:
        json_object_set_new(m, "key", json_string(req->key));
        json_object_set_new(m, "expected",
                            req->expected != NULL ? json_string(req->expected) : json_null());
        json_object_set_new(m, "value", json_string(req->value));
        break;
    case DL_PROTO_KV_SET:
        json_object_set_new(m, "key", json_string(req->key));
        json_object_set_new(m, "value", json_string(req->value));
        break;
    default: /* GET, DEL */ json_object_set_new(m, "key", json_string(req->key)); break;
    }
    return m;
}

void dl_rdzv_dec_kv(const json_t *reply, dl_rdzv_kv_result_t *ret)
{
    const json_t *result = json_object_get(reply, "result");
    const json_t *v = json_object_get(result, "value");
    memset(ret, 0, sizeof(*ret));
    ret->has_value = json_is_string(v) || json_is_integer(v);
    ret->value = json_string_value(v);
    ret->number = json_is_integer(v) ? (long long)json_integer_value(v) : 0;
    ret->swapped = json_is_true(json_object_get(result, "swapped"));
    ret->deleted = json_is_true(json_object_get(result, "deleted"));
}
