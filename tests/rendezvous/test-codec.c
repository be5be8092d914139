/* The typed messages (rdzv-codec.h): everything they build passes the protocol's own checks
 * (dl_proto_validate, the table docs/protocol.md describes), and the readers read what the
 * server sends. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "rdzv-codec.h"

static void valid(json_t *m, dl_proto_type_t want)
{
    dl_proto_type_t type;
    dl_proto_error_t err;
    ck_assert_ptr_nonnull(m);
    int r = dl_proto_validate(m, &type, &err);
    char *text = json_dumps(m, JSON_COMPACT);
    ck_assert_msg(r == 0, "%s: %s", text, err.message);
    ck_assert_int_eq(type, want);
    free(text);
    json_decref(m);
}

DL_TEST(agent_messages)
{
    dl_rdzv_join_msg_t j = {.node_id = "gpu1-42",
                            .host = "gpu1",
                            .master_addr = "10.0.0.1",
                            .master_port = 29500,
                            .slots = 8,
                            .node_rank = -1,
                            .min_nodes = 1,
                            .max_nodes = 4,
                            .max_restarts = 3,
                            .last_call = 5,
                            .join_timeout = 600,
                            .dead_after = 30,
                            .assigned = true,
                            .round = 2,
                            .failures = 1};
    json_t *m = dl_rdzv_enc_join(7, &j);
    ck_assert_int_eq(dl_proto_get_int(m, "round", -1), 2);
    ck_assert_int_eq(dl_proto_get_int(m, "failures", -1), 1);
    ck_assert_int_eq(dl_proto_get_int(m, "dead_after_ms", -1), 30000);
    valid(m, DL_PROTO_JOIN);
    j.assigned = false;
    m = dl_rdzv_enc_join(8, &j);
    ck_assert_ptr_null(json_object_get(m, "round"));
    valid(m, DL_PROTO_JOIN);
    /* Asking dlaunchd for the job's torch store (docs/store.md): a bool, sent only when asked. */
    m = dl_rdzv_enc_join(8, &j);
    ck_assert_ptr_null(json_object_get(m, "torch_store"));
    json_decref(m);
    j.torch_store = true;
    m = dl_rdzv_enc_join(9, &j);
    ck_assert(json_is_true(json_object_get(m, "torch_store")));
    valid(m, DL_PROTO_JOIN);
    m = dl_rdzv_enc_join(9, &j);
    json_object_set_new(m, "torch_store", json_string("yes"));
    dl_proto_type_t type;
    dl_proto_error_t perr;
    ck_assert_int_ne(dl_proto_validate(m, &type, &perr), 0);
    json_decref(m);

    dl_rdzv_beat_msg_t b = {.round = 1, .loss = NAN, .samples_per_s = NAN};
    valid(dl_rdzv_enc_heartbeat(9, &b), DL_PROTO_HEARTBEAT);
    b.has_progress = true;
    b.step = 120;
    b.loss = 0.5;
    m = dl_rdzv_enc_heartbeat(10, &b);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(m, "progress"), "step")),
                     120);
    ck_assert_ptr_null(json_object_get(json_object_get(m, "progress"), "samples_per_s"));
    valid(m, DL_PROTO_HEARTBEAT);

    dl_rdzv_failure_msg_t f = {.round = 1,
                               .rank = 3,
                               .local_rank = 1,
                               .exit_code = 4,
                               .reason = "rank 3 on gpu1 exited with code 4",
                               .time = 1.5,
                               .log_tail = "boom\n"};
    valid(dl_rdzv_enc_worker_failed(11, &f), DL_PROTO_WORKER_FAILED);
    f.signal = 9;
    f.hung = true;
    m = dl_rdzv_enc_worker_failed(12, &f);
    ck_assert(json_is_true(json_object_get(m, "hung")));
    ck_assert_ptr_null(json_object_get(m, "exit_code"));
    valid(m, DL_PROTO_WORKER_FAILED);
    f.signal = 0;
    f.exit_code = -1; /* could not be started: 127 */
    m = dl_rdzv_enc_worker_failed(13, &f);
    ck_assert_int_eq(dl_proto_get_int(m, "exit_code", 0), 127);
    valid(m, DL_PROTO_WORKER_FAILED);
    dl_rdzv_failure_msg_t x = {
        .round = 1, .rank = 2, .excluded = true, .reason = "slow", .time = 2};
    m = dl_rdzv_enc_worker_failed(14, &x);
    ck_assert(json_is_true(json_object_get(m, "excluded")));
    valid(m, DL_PROTO_WORKER_FAILED);

    valid(dl_rdzv_enc_node_done(15, 1), DL_PROTO_NODE_DONE);
    valid(dl_rdzv_enc_leave(16, "SIGTERM"), DL_PROTO_LEAVE);
    valid(dl_rdzv_enc_events_follow(17), DL_PROTO_EVENTS_FOLLOW);
}

DL_TEST(control_and_store_messages)
{
    valid(dl_rdzv_enc_control(DL_PROTO_STATUS, true, true, NULL), DL_PROTO_STATUS);
    valid(dl_rdzv_enc_control(DL_PROTO_STOP, false, false, "requested"), DL_PROTO_STOP);
    valid(dl_rdzv_enc_control(DL_PROTO_RESTART, false, false, "requested"), DL_PROTO_RESTART);
    const char *keys[] = {"a", "b"};
    dl_rdzv_kv_req_t reqs[] = {
        {.op = DL_PROTO_KV_SET, .key = "k", .value = "v"},
        {.op = DL_PROTO_KV_GET, .key = "k"},
        {.op = DL_PROTO_KV_ADD, .key = "n", .delta = -3},
        {.op = DL_PROTO_KV_WAIT, .keys = keys, .nkeys = 2, .timeout_ms = 1000},
        {.op = DL_PROTO_KV_CAS, .key = "k", .expected = NULL, .value = "v"},
        {.op = DL_PROTO_KV_CAS, .key = "k", .expected = "v", .value = "w"},
        {.op = DL_PROTO_KV_DEL, .key = "k"},
    };
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++)
        valid(dl_rdzv_enc_kv((json_int_t)i, &reqs[i]), reqs[i].op);
}

/* One culprit object for every backend: what the encoder writes, the reader reads back, and
 * what is unknown is left out. */
DL_TEST(the_culprit_encoder_and_reader_agree)
{
    dl_rdzv_culprit_msg_t c = DL_RDZV_CULPRIT_NONE, back;
    c.cause = "worker_failed";
    c.node = "gpu1-42";
    c.host = "gpu1";
    c.node_rank = 1;
    c.rank = 5;
    c.signal = 9;
    c.oom = true;
    c.step = 0;
    c.text = "rank 5 on gpu1 was killed by the OOM killer";
    json_t *o = dl_rdzv_enc_culprit(&c);
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_null(json_object_get(o, "exit_code"));
    dl_rdzv_dec_culprit(o, &back);
    ck_assert_str_eq(back.cause, "worker_failed");
    ck_assert_str_eq(back.node, "gpu1-42");
    ck_assert_str_eq(back.host, "gpu1");
    ck_assert_int_eq(back.node_rank, 1);
    ck_assert_int_eq(back.rank, 5);
    ck_assert_int_eq(back.signal, 9);
    ck_assert_int_eq(back.exit_code, -1);
    ck_assert(back.oom && !back.hung);
    ck_assert_int_eq(back.step, 0);
    ck_assert_str_eq(back.text, c.text);
    json_decref(o);

    /* A lost node: no rank, no exit, no step; a hang names no signal. */
    c = DL_RDZV_CULPRIT_NONE;
    c.cause = "node_lost";
    c.node = "gpu2-7";
    o = dl_rdzv_enc_culprit(&c);
    ck_assert_uint_eq(json_object_size(o), 2);
    json_decref(o);
    c.hung = true;
    c.signal = 6;
    o = dl_rdzv_enc_culprit(&c);
    ck_assert(json_is_true(json_object_get(o, "hung")));
    ck_assert_ptr_null(json_object_get(o, "signal"));
    json_decref(o);
    dl_rdzv_dec_culprit(NULL, &back);
    ck_assert_ptr_null(back.cause);
    ck_assert_int_eq(back.step, -1);
}

DL_TEST(readers)
{
    json_t *m =
        json_pack("{s:i, s:s, s:i, s:s, s:{s:s, s:s, s:i, s:s}}", "v", 1, "type", "round_changed",
                  "round", 4, "reason", "a node was lost", "failure", "cause", "node_lost", "node",
                  "gpu1-42", "node_rank", 1, "rank", "not a number");
    int round;
    const char *reason;
    dl_rdzv_culprit_msg_t c;
    dl_rdzv_dec_round_changed(m, &round, &reason, &c);
    ck_assert_int_eq(round, 4);
    ck_assert_str_eq(reason, "a node was lost");
    ck_assert_str_eq(c.cause, "node_lost");
    ck_assert_str_eq(c.node, "gpu1-42");
    ck_assert_int_eq(c.node_rank, 1);
    ck_assert_int_eq(c.rank, -1); /* not an integer: not believed */
    ck_assert_ptr_null(c.host);
    json_decref(m);

    m = json_pack("{s:i, s:s, s:s, s:i, s:{s:s}}", "v", 1, "type", "shutdown", "reason", "failed",
                  "exit_code", 1, "failure", "description", "rank 0 exited");
    dl_rdzv_shutdown_msg_t sd;
    dl_rdzv_dec_shutdown(m, &sd);
    ck_assert_str_eq(sd.reason, "failed");
    ck_assert_int_eq(sd.exit_code, 1);
    ck_assert_str_eq(sd.failure, "rank 0 exited");
    json_decref(m);

    m = json_pack("{s:{s:s, s:s}}", "event", "event", "job_end", "status", "succeeded");
    const char *name, *status;
    dl_rdzv_dec_event(m, &name, &status);
    ck_assert_str_eq(name, "job_end");
    ck_assert_str_eq(status, "succeeded");
    json_decref(m);

    dl_rdzv_kv_result_t r;
    m = json_pack("{s:{s:s}}", "result", "value", "hello");
    dl_rdzv_dec_kv(m, &r);
    ck_assert(r.has_value);
    ck_assert_str_eq(r.value, "hello");
    json_decref(m);
    m = json_pack("{s:{s:I}}", "result", "value", (json_int_t)-7);
    dl_rdzv_dec_kv(m, &r);
    ck_assert(r.has_value && r.value == NULL && r.number == -7);
    json_decref(m);
    m = json_pack("{s:{s:b, s:n}}", "result", "swapped", 0, "value");
    dl_rdzv_dec_kv(m, &r);
    ck_assert(!r.has_value && !r.swapped);
    json_decref(m);
}
