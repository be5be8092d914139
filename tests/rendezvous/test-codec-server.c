/* The server's half of the typed messages (rdzv-codec.h): it reads what the client's half
 * writes, field for field, and what it writes passes the protocol's own checks and reads back
 * with the client's readers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "rdzv-codec.h"

static json_t *valid(json_t *m, dl_proto_type_t want)
{
    dl_proto_type_t type;
    dl_proto_error_t err;
    ck_assert_ptr_nonnull(m);
    int r = dl_proto_validate(m, &type, &err);
    ck_assert_msg(r == 0, "%s", err.message);
    ck_assert_int_eq(type, want);
    return m;
}

DL_TEST(join_read_as_written)
{
    dl_rdzv_join_msg_t j = {.node_id = "gpu1-42",
                            .host = "gpu1",
                            .master_addr = "10.0.0.1",
                            .master_port = 29500,
                            .slots = 8,
                            .node_rank = 3,
                            .min_nodes = 2,
                            .max_nodes = 4,
                            .max_restarts = 5,
                            .max_same_failures = 2,
                            .last_call = 5,
                            .join_timeout = 600,
                            .dead_after = 30,
                            .assigned = true,
                            .round = 2,
                            .failures = 1,
                            .torch_store = true};
    json_t *m = valid(dl_rdzv_enc_join(7, &j), DL_PROTO_JOIN);
    dl_rdzv_job_opts_t opts;
    dl_rdzv_event_t ev = {0};
    bool torch = false;
    dl_rdzv_job_opts_init(&opts);
    dl_rdzv_dec_join(m, &opts, &ev, &torch);
    ck_assert_ptr_eq(ev.join.opts, &opts);
    ck_assert_str_eq(ev.join.agent_id, "gpu1-42");
    ck_assert_str_eq(ev.join.host, "gpu1");
    ck_assert_str_eq(ev.join.master_addr, "10.0.0.1");
    ck_assert_int_eq(ev.join.master_port, 29500);
    ck_assert_int_eq(ev.join.slots, 8);
    ck_assert_int_eq(ev.join.node_rank, 3);
    ck_assert_int_eq(ev.join.slurm_node_id, -1);
    ck_assert_int_eq(ev.join.resume_round, 2);
    ck_assert_int_eq(ev.join.failures, 1);
    ck_assert(torch);
    ck_assert_int_eq(opts.min_nodes, 2);
    ck_assert_int_eq(opts.max_nodes, 4);
    ck_assert_int_eq(opts.max_restarts, 5);
    ck_assert_int_eq(opts.max_same_failures, 2);
    ck_assert(opts.last_call == 5 && opts.join_timeout == 600 && opts.dead_after == 30);
    json_decref(m);

    /* A join without the job's parameters leaves the server's defaults and creates nothing. */
    m = json_pack("{s:i, s:s, s:i, s:s, s:s, s:i}", "v", 1, "type", "join", "id", 1, "node_id", "n",
                  "host", "h", "slots", 1);
    dl_rdzv_job_opts_t dflt;
    dl_rdzv_job_opts_init(&dflt);
    dl_rdzv_job_opts_init(&opts);
    dl_rdzv_dec_join(valid(m, DL_PROTO_JOIN), &opts, &ev, &torch);
    ck_assert_ptr_null(ev.join.opts);
    ck_assert(!torch);
    ck_assert_int_eq(ev.join.resume_round, -1);
    ck_assert_int_eq(ev.join.failures, -1);
    ck_assert_int_eq(ev.join.node_rank, -1);
    ck_assert_int_eq(ev.join.master_port, 0);
    ck_assert_int_eq(opts.min_nodes, dflt.min_nodes);
    ck_assert(opts.last_call == dflt.last_call);
    json_decref(m);
}

DL_TEST(heartbeat_and_failure_read_as_written)
{
    json_t *diag = json_pack("{s:i, s:s, s:[]}", "node_rank", 0, "host", "h", "ranks");
    dl_rdzv_beat_msg_t b = {
        .round = 4, .has_progress = true, .step = 120, .loss = 0.5, .samples_per_s = NAN};
    b.diag = diag;
    json_t *m = valid(dl_rdzv_enc_heartbeat(3, &b), DL_PROTO_HEARTBEAT);
    dl_rdzv_beat_msg_t got;
    dl_rdzv_dec_heartbeat(m, &got);
    ck_assert_int_eq(got.round, 4);
    ck_assert(got.has_progress);
    ck_assert_int_eq(got.step, 120);
    ck_assert(got.loss == 0.5);
    ck_assert(isnan(got.samples_per_s));
    ck_assert(json_equal(got.diag, diag));
    ck_assert_ptr_null(got.recovery);
    json_decref(m);
    b.has_progress = false;
    m = dl_rdzv_enc_heartbeat(3, &b);
    dl_rdzv_dec_heartbeat(m, &got);
    ck_assert(!got.has_progress);
    json_decref(m);

    dl_rdzv_failure_msg_t f = {.round = 1,
                               .rank = 6,
                               .local_rank = 2,
                               .signal = 9,
                               .hung = true,
                               .step = 77,
                               .reason = "rank 6 hung",
                               .time = 1234.5,
                               .log_tail = "last words\n",
                               .diag = diag};
    m = valid(dl_rdzv_enc_worker_failed(5, &f), DL_PROTO_WORKER_FAILED);
    dl_rdzv_failure_msg_t g;
    dl_rdzv_dec_worker_failed(m, &g);
    ck_assert_int_eq(g.round, 1);
    ck_assert_int_eq(g.rank, 6);
    ck_assert_int_eq(g.local_rank, 2);
    ck_assert_int_eq(g.signal, 9);
    ck_assert_int_eq(g.exit_code, -1); /* a signal, no exit code */
    ck_assert(g.hung && !g.oom && !g.excluded);
    ck_assert_int_eq(g.step, 77);
    ck_assert_str_eq(g.reason, "rank 6 hung");
    ck_assert(g.time == 1234.5);
    ck_assert_str_eq(g.log_tail, "last words\n");
    ck_assert(json_equal(g.diag, diag));
    json_decref(m);
    /* A straggler stepping out: exit code 0, no local rank, no step. */
    f = (dl_rdzv_failure_msg_t){.round = 1, .rank = 6, .excluded = true, .step = 9, .time = 1};
    m = valid(dl_rdzv_enc_worker_failed(5, &f), DL_PROTO_WORKER_FAILED);
    dl_rdzv_dec_worker_failed(m, &g);
    ck_assert(g.excluded);
    ck_assert_int_eq(g.exit_code, 0);
    ck_assert_int_eq(g.local_rank, -1);
    ck_assert_int_eq(g.signal, 0);
    ck_assert_int_eq(g.step, -1);
    ck_assert_ptr_null(g.reason);
    ck_assert_ptr_null(g.diag);
    json_decref(m);
    json_decref(diag);
}

DL_TEST(store_and_control_read_as_written)
{
    dl_rdzv_buf_t keys[DL_PROTO_WAIT_KEYS_MAX];
    dl_rdzv_event_t ev = {0};
    dl_rdzv_kv_req_t cas = {.op = DL_PROTO_KV_CAS, .key = "k", .expected = NULL, .value = "v"};
    json_t *m = valid(dl_rdzv_enc_kv(1, &cas), DL_PROTO_KV_CAS);
    dl_rdzv_dec_kv_req(m, DL_PROTO_KV_CAS, &ev, keys);
    ck_assert_int_eq(ev.kind, DL_RDZV_EV_STORE_CAS);
    ck_assert(ev.store.expect_absent);
    ck_assert_int_eq(ev.store.round, -1);
    ck_assert(ev.store.key.len == 1 && memcmp(ev.store.key.data, "k", 1) == 0);
    ck_assert(ev.store.value.len == 1 && memcmp(ev.store.value.data, "v", 1) == 0);
    json_decref(m);

    dl_rdzv_kv_req_t add = {.op = DL_PROTO_KV_ADD, .key = "n", .delta = -3};
    m = valid(dl_rdzv_enc_kv(2, &add), DL_PROTO_KV_ADD);
    memset(&ev, 0, sizeof(ev));
    dl_rdzv_dec_kv_req(m, DL_PROTO_KV_ADD, &ev, keys);
    ck_assert_int_eq(ev.kind, DL_RDZV_EV_STORE_ADD);
    ck_assert_int_eq(ev.store.delta, -3);
    json_decref(m);

    const char *const names[] = {"a", "bb"};
    dl_rdzv_kv_req_t wait = {.op = DL_PROTO_KV_WAIT, .keys = names, .nkeys = 2, .timeout_ms = 1500};
    m = valid(dl_rdzv_enc_kv(3, &wait), DL_PROTO_KV_WAIT);
    dl_rdzv_dec_kv_req(m, DL_PROTO_KV_WAIT, &ev, keys);
    ck_assert_int_eq(ev.kind, DL_RDZV_EV_STORE_WAIT);
    ck_assert_uint_eq(ev.wait.nkeys, 2);
    ck_assert(ev.wait.keys == keys && keys[1].len == 2 && memcmp(keys[1].data, "bb", 2) == 0);
    ck_assert(ev.wait.timeout == 1.5);
    json_decref(m);

    dl_rdzv_control_msg_t c;
    m = valid(dl_rdzv_enc_control(DL_PROTO_STATUS, true, true, NULL), DL_PROTO_STATUS);
    dl_rdzv_dec_control(m, &c);
    ck_assert(c.all && c.ranks);
    json_decref(m);
    m = valid(dl_rdzv_enc_control(DL_PROTO_RESTART, false, false, "operator"), DL_PROTO_RESTART);
    dl_rdzv_dec_control(m, &c);
    ck_assert(!c.all && !c.ranks);
    ck_assert_str_eq(c.reason, "operator");
    json_decref(m);
}

DL_TEST(core_messages_valid_and_read_back)
{
    dl_rdzv_culprit_t who = DL_RDZV_CULPRIT_NONE;
    who.cause = "worker_failed";
    who.node = "gpu2";
    who.rank = 5;
    who.exit_code = 3;
    dl_rdzv_server_where_t w = {.store_host = "10.0.0.9", .store_port = 29400};
    dl_rdzv_msg_t a = {.kind = DL_RDZV_MSG_ASSIGNMENT};
    a.assignment.round = 2;
    a.assignment.nnodes = 2;
    a.assignment.world_size = 16;
    a.assignment.local_world_size = 8;
    a.assignment.master_addr = "10.0.0.1";
    a.assignment.master_port = 29500;
    a.assignment.host_node_rank = -1;
    a.assignment.culprit = &who;
    json_t *m = valid(dl_rdzv_enc_core_msg(4, &a, &w), DL_PROTO_ASSIGNMENT);
    ck_assert_str_eq(dl_proto_get_str(m, "store_addr"), "10.0.0.9:29400");
    ck_assert_ptr_null(json_object_get(m, "torch_store"));
    dl_rdzv_culprit_t got;
    dl_rdzv_dec_culprit(json_object_get(m, "failure"), &got);
    ck_assert_str_eq(got.node, "gpu2");
    ck_assert_int_eq(got.exit_code, 3);
    json_decref(m);
    /* A job's own torch store among many: MASTER is where it listens. */
    w.torch_addr = "127.0.0.1";
    w.torch_port = 41000;
    m = valid(dl_rdzv_enc_core_msg(4, &a, &w), DL_PROTO_ASSIGNMENT);
    ck_assert_str_eq(dl_proto_get_str(m, "master_addr"), "127.0.0.1");
    ck_assert_int_eq(dl_proto_get_int(m, "master_port", 0), 41000);
    ck_assert(json_is_true(json_object_get(m, "torch_store")));
    json_decref(m);

    dl_rdzv_msg_t rc = {.kind = DL_RDZV_MSG_ROUND_CHANGED};
    rc.round_changed.round = 3;
    rc.round_changed.reason = "rank 5 failed";
    rc.round_changed.cause = DL_RDZV_CAUSE_WORKER_FAILED;
    rc.round_changed.culprit = &who;
    m = valid(dl_rdzv_enc_core_msg(-1, &rc, &w), DL_PROTO_ROUND_CHANGED);
    int round;
    const char *reason;
    dl_rdzv_dec_round_changed(m, &round, &reason, &got);
    ck_assert_int_eq(round, 3);
    ck_assert_str_eq(reason, "rank 5 failed");
    ck_assert_int_eq(got.rank, 5);
    json_decref(m);

    dl_rdzv_msg_t failed = {.kind = DL_RDZV_MSG_FAILED};
    failed.failed.failure = "gpu2 rank 5 exited with code 3";
    failed.failed.culprit = &who;
    failed.failed.same_failures = 3;
    m = valid(dl_rdzv_enc_core_msg(-1, &failed, &w), DL_PROTO_SHUTDOWN);
    dl_rdzv_shutdown_msg_t sd;
    dl_rdzv_dec_shutdown(m, &sd);
    ck_assert_str_eq(sd.reason, "failed");
    ck_assert_int_eq(sd.exit_code, 5); /* the same failure ended it (docs/exit-codes.md) */
    ck_assert_str_eq(sd.failure, "gpu2 rank 5 exited with code 3");
    json_decref(m);

    json_t *ev = dl_rdzv_enc_journal_msg(&failed, 10.5, NULL, 0);
    ck_assert_str_eq(dl_proto_get_str(ev, "event"), "job_end");
    ck_assert_str_eq(dl_proto_get_str(ev, "status"), "failed");
    ck_assert_int_eq(dl_proto_get_int(ev, "exit_code", 0), 5);
    m = valid(dl_rdzv_enc_event(7, ev), DL_PROTO_EVENT);
    const char *name, *status;
    dl_rdzv_dec_event(m, &name, &status);
    ck_assert_str_eq(name, "job_end");
    ck_assert_str_eq(status, "failed");
    json_decref(m);
    json_decref(ev);
}
