/* The rendezvous server's statistics (rendezvous/stats.c): histograms, restarts by cause, the
 * last failure, the progress ring, and snapshots that share nothing with the server. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "stats.h"
#include "status-reply.h"

static json_t *ev(const char *name, const char *fields)
{
    json_error_t e;
    json_t *o = json_loads(fields, 0, &e);
    ck_assert_msg(o != NULL, "%s", e.text);
    json_object_set_new(o, "event", json_string(name));
    json_object_set_new(o, "time", json_real(1000.0));
    return o;
}

static void feed(dl__rdzv_stats_t *st, const char *run_id, const char *name, const char *fields,
                 double mono)
{
    json_t *o = ev(name, fields);
    dl__rdzv_stats_event(st, run_id, o, mono);
    json_decref(o);
}

/* A status of one job "j" with nodes n0 and n1, as the core would give it. */
static json_t *snapshot_of(dl__rdzv_stats_t *st, const char *run_id)
{
    static const dl_rdzv_member_status_t members[] = {
        {.agent_id = "n0",
         .host = "h",
         .slots = 1,
         .node_rank = 0,
         .heartbeat_age = 0.5,
         .connected = true},
        {.agent_id = "n1",
         .host = "h",
         .slots = 1,
         .node_rank = 1,
         .heartbeat_age = 2.0,
         .connected = true},
    };
    dl_rdzv_job_status_t js = {.run_id = run_id,
                               .state = DL_RDZV_JOB_RUNNING,
                               .members = members,
                               .nmembers = 2,
                               .store_bytes = 42,
                               .store_waits = 1};
    dl_rdzv_status_t status = {.jobs = &js, .njobs = 1};
    /* The job's status as the server fills it (server-actions.c), which the snapshot adds to. */
    dl_proto_status_node_t nodes[] = {
        {.node_id = "n0",
         .host = "h",
         .slots = 1,
         .node_rank = 0,
         .heartbeat_age = 0.5,
         .connected = true},
        {.node_id = "n1",
         .host = "h",
         .slots = 1,
         .node_rank = 1,
         .heartbeat_age = 2.0,
         .connected = true},
    };
    dl_proto_status_job_t job = {.run_id = (char *)run_id,
                                 .state = "running",
                                 .round = 1,
                                 .restarts = 1,
                                 .max_restarts = 3,
                                 .min_nodes = 2,
                                 .max_nodes = 2,
                                 .world_size = 2,
                                 .has_keys = true,
                                 .nodes = nodes,
                                 .nnodes = 2};
    return dl__rdzv_stats_snapshot(st, &status, &job, 5000.0, 3, 7);
}

/* What the snapshot shows of job "j" (the one job of snapshot_of): a new reference. */
static json_t *job_in_snapshot(dl__rdzv_stats_t *st)
{
    json_t *snap = snapshot_of(st, "j");
    ck_assert_ptr_nonnull(snap);
    json_t *job = json_incref(json_array_get(json_object_get(snap, "jobs"), 0));
    json_decref(snap);
    return job;
}

DL_TEST(histogram_buckets_are_upper_bounds)
{
    dl__rdzv_hist_t h = {0};
    dl__rdzv_hist_add(&h, 0.001);  /* on a bound: that bucket */
    dl__rdzv_hist_add(&h, 0.0011); /* just above: the next */
    dl__rdzv_hist_add(&h, 1e9);    /* above every bound: the last */
    ck_assert_uint_eq(h.count[3], 1);
    ck_assert_uint_eq(h.count[4], 1);
    ck_assert_uint_eq(h.count[DL__RDZV_HIST_BUCKETS], 1);
    ck_assert_uint_eq(h.n, 3);
    ck_assert(fabs(h.sum - (0.0021 + 1e9)) < 1e-3);
}

DL_TEST(rounds_restarts_and_endings_are_counted)
{
    dl__rdzv_stats_t st;
    DL_CHECK_ERRNO(dl__rdzv_stats_init(&st, 100.0), 0);
    dl__rdzv_stats_join(&st, "j", 10.0);
    feed(&st, "j", "rendezvous", "{\"round\": 0}", 10.25);
    feed(&st, "j", "round_changed",
         "{\"round\": 1, \"reason\": \"rank 1 exited\", "
         "\"cause\": \"worker_failed\"}",
         20.0);
    feed(&st, "j", "rendezvous", "{\"round\": 1}", 22.0);
    feed(&st, "j", "log", "{\"level\": \"warning\", \"text\": \"round 0 -> 1\"}", 20.0);
    feed(&st, "j", "job_end", "{\"status\": \"succeeded\"}", 30.0);
    ck_assert_uint_eq(st.rounds, 2);
    ck_assert_uint_eq(st.restarts[DL_RDZV_CAUSE_WORKER_FAILED], 1);
    ck_assert_uint_eq(st.round_seconds.n, 2);
    ck_assert(fabs(st.round_seconds.sum - 2.25) < 1e-9);

    json_t *snap = snapshot_of(&st, "j");
    ck_assert_ptr_nonnull(snap);
    json_t *job = json_array_get(json_object_get(snap, "jobs"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(job, "restarts_by_cause"),
                                                        "worker_failed")),
                     1);
    json_t *h0 = json_array_get(json_object_get(job, "history"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(h0, "cause")), "worker_failed");
    ck_assert_str_eq(json_string_value(json_object_get(h0, "reason")), "rank 1 exited");
    ck_assert_int_eq(json_array_size(json_object_get(job, "log")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(job, "store_bytes")), 42);
    ck_assert_int_eq(json_integer_value(json_object_get(job, "store_waits")), 1);
    json_t *n1 = json_array_get(json_object_get(job, "nodes"), 1);
    ck_assert(fabs(json_real_value(json_object_get(n1, "last_heartbeat")) - 4998.0) < 1e-9);
    json_t *srv = json_object_get(snap, "server");
    ck_assert_int_eq(json_integer_value(json_object_get(srv, "connections")), 3);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(srv, "ended"), "succeeded")), 1);
    json_t *rs = json_object_get(json_object_get(srv, "histograms"), "round_seconds");
    ck_assert_int_eq(json_integer_value(json_object_get(rs, "count")), 2);
    ck_assert_int_eq(json_array_size(json_object_get(rs, "counts")), DL__RDZV_HIST_BUCKETS + 1);
    /* The snapshot is what the status reply's table says (proto/status-reply.h): read by its
     * one decoder and written again, the same text, key for key in the same order. */
    dl_proto_status_snapshot_t typed;
    char err[256];
    int r = dl_proto_rec_decode(&dl_proto_status_snapshot_type, snap, &typed, "snapshot", err,
                                sizeof(err));
    ck_assert_msg(r == 0, "%s", err);
    json_t *again = dl_proto_rec_encode(&dl_proto_status_snapshot_type, &typed);
    char *was = json_dumps(snap, JSON_COMPACT | JSON_PRESERVE_ORDER);
    char *now = json_dumps(again, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ck_assert_str_eq(now, was);
    free(was);
    free(now);
    json_decref(again);
    dl_proto_rec_free(&dl_proto_status_snapshot_type, &typed);
    /* Nothing is shared: the server's state can change under a snapshot held elsewhere. */
    ck_assert_int_eq(json_object_get(snap, "server")->refcount, 1);
    ck_assert_int_eq(json_object_get(job, "history")->refcount, 1);
    feed(&st, "j", "round_changed", "{\"round\": 2, \"reason\": \"x\", \"cause\": \"requested\"}",
         40.0);
    ck_assert_int_eq(json_array_size(json_object_get(job, "history")), 1);
    json_decref(snap);
    dl__rdzv_stats_free(&st);
}

DL_TEST(the_last_failure_keeps_the_end_of_the_tail)
{
    dl__rdzv_stats_t st;
    DL_CHECK_ERRNO(dl__rdzv_stats_init(&st, 0), 0);
    dl__rdzv_stats_join(&st, "j", 0);
    /* 5000 bytes ending in a two-byte character: the cut at 4096 from the end must not split
     * one. */
    char tail[5001];
    memset(tail, 'a', sizeof(tail));
    for (size_t i = 0; i + 1 < 5000; i += 2) {
        tail[i] = (char)0xc3;
        tail[i + 1] = (char)0xa9; /* é */
    }
    tail[5000] = '\0';
    json_t *msg = json_pack("{s:i, s:i, s:i, s:s, s:s}", "round", 0, "rank", 3, "exit_code", 1,
                            "reason", "rank 3 exited with code 1", "log_tail", tail);
    ck_assert_ptr_nonnull(msg);
    dl_rdzv_failure_msg_t fm;
    dl_rdzv_dec_worker_failed(msg, &fm);
    dl__rdzv_stats_failure(&st, "j", &fm, "10.0.0.7:4242", 77.0);
    dl__rdzv_stats_failure(&st, "unknown", &fm, "10.0.0.7:4242", 77.0); /* no entry: ignored */
    json_decref(msg);
    ck_assert(!dl__rdzv_stats_kept(&st, "unknown"));
    json_t *job = job_in_snapshot(&st);
    json_t *f = json_object_get(job, "last_failure");
    ck_assert_int_eq(json_integer_value(json_object_get(f, "rank")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(f, "exit_code")), 1);
    ck_assert_ptr_null(json_object_get(f, "signal"));
    ck_assert(json_real_value(json_object_get(f, "time")) == 77.0); /* no time of its own */
    ck_assert_str_eq(json_string_value(json_object_get(f, "peer")), "10.0.0.7:4242");
    const char *kept = json_string_value(json_object_get(f, "log_tail"));
    size_t len = strlen(kept);
    ck_assert(len >= 4092 && len <= 4096);
    ck_assert_int_eq(memcmp(kept, "\xc3\xa9", 2), 0); /* a whole character first */
    json_decref(job);
    dl__rdzv_stats_free(&st);
}

DL_TEST(progress_is_one_point_a_step_and_bounded)
{
    dl__rdzv_stats_t st;
    DL_CHECK_ERRNO(dl__rdzv_stats_init(&st, 0), 0);
    dl__rdzv_stats_join(&st, "j", 0);
    for (int i = 0; i < 1000; i++) {
        json_t *p = json_pack("{s:i, s:f, s:f}", "step", i / 2, "loss", 1.0 / (i + 1),
                              "samples_per_s", 100.0);
        dl_rdzv_beat_msg_t b;
        dl_rdzv_dec_progress(p, &b);
        dl__rdzv_stats_progress(&st, "j", &b, (double)i);
        json_decref(p);
    }
    json_t *job = job_in_snapshot(&st);
    json_t *ring = json_object_get(job, "progress");
    ck_assert_uint_eq(json_array_size(ring), 240);
    json_t *last = json_array_get(ring, 239);
    ck_assert_int_eq(json_integer_value(json_object_get(last, "step")), 499);
    ck_assert(json_real_value(json_object_get(last, "time")) == 998.0);
    ck_assert(json_real_value(json_object_get(last, "samples_per_s")) == 100.0);
    json_t *first = json_array_get(ring, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(first, "step")), 260);
    json_decref(job);
    dl__rdzv_stats_free(&st);
}

DL_TEST(forgotten_jobs_are_dropped)
{
    dl__rdzv_stats_t st;
    DL_CHECK_ERRNO(dl__rdzv_stats_init(&st, 0), 0);
    dl__rdzv_stats_join(&st, "gone", 0);
    dl__rdzv_stats_join(&st, "j", 0);
    json_decref(snapshot_of(&st, "j"));
    ck_assert(!dl__rdzv_stats_kept(&st, "gone"));
    ck_assert(dl__rdzv_stats_kept(&st, "j"));
    /* An ended job's entry also goes once a job starts an hour later, watched or not. */
    feed(&st, "j", "job_end", "{\"status\": \"failed\"}", 10.0);
    dl__rdzv_stats_join(&st, "next", 3611.0);
    ck_assert(!dl__rdzv_stats_kept(&st, "j"));
    ck_assert(dl__rdzv_stats_kept(&st, "next"));
    dl__rdzv_stats_free(&st);
}
