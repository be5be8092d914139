/* The status reply's one decoder and encoder (status-reply.h over record.h): what the server
 * sends comes back field for field and out again unchanged, a malformed reply is one line naming
 * the field, and optional fields may be missing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "status-reply.h"

/* A job as our server writes it with every optional part, in its order (rendezvous/server-actions.c,
 * jobview.c, stats.c). */
static const char job_text[] =
    "{\"run_id\":\"job\",\"state\":\"running\",\"round\":1,\"restarts\":1,\"max_restarts\":3,"
    "\"min_nodes\":2,\"max_nodes\":2,\"world_size\":4,\"keys\":5,"
    "\"nodes\":[{\"node_id\":\"vm-1\",\"host\":\"vm\",\"slots\":2,\"node_rank\":0,"
    "\"heartbeat_age\":0.25,\"connected\":true,\"left\":false,\"last_heartbeat\":1000.5},"
    "{\"node_id\":\"vm-2\",\"host\":\"vm\",\"slots\":2,\"node_rank\":1,\"heartbeat_age\":1.5,"
    "\"connected\":false,\"left\":true}],"
    "\"failure\":\"rank 1 exited with 3\",\"store_bytes\":42,\"store_waits\":1,"
    "\"store_clients\":4,"
    "\"diag\":{\"ranks\":4,\"median_compute_ms\":4.5,\"step_ms\":9.5,\"samples_per_s\":1000.0,"
    "\"stragglers\":[{\"rank\":1,\"node_rank\":0,\"host\":\"vm\",\"compute_ms\":9.0,"
    "\"median_ms\":4.5,\"slower_pct\":100.0,\"steps\":20,\"cost_samples_per_s\":300.0}],"
    "\"slowest\":{\"rank\":1,\"compute_ms\":9.0}},"
    "\"where\":\"rank 1 never entered all-reduce #3\","
    "\"ranks\":[{\"rank\":0,\"recorder\":true,\"step\":43,\"steps\":43.0,\"compute_ms\":200.0,"
    "\"wait_ms\":10.0,\"samples\":430.0,\"loss\":0.5,\"silent_s\":11.0,\"proc\":\"S\","
    "\"ops\":[{\"seq\":3,\"op\":\"all-reduce\",\"state\":\"running\",\"bytes\":64,\"algo\":"
    "\"ring\","
    "\"transport\":\"tcp\",\"age_s\":11.0}],\"node_rank\":0,\"host\":\"vm\",\"report_age_s\":0.5},"
    "{\"rank\":1,\"recorder\":false,\"node_rank\":1,\"host\":\"vm\",\"report_age_s\":0.0}],"
    "\"recovery\":{\"recoveries\":2,\"recovering\":false,\"step\":40,\"duration_ms\":120.0},"
    "\"restarts_by_cause\":{\"worker_failed\":1},"
    "\"history\":[{\"time\":990.0,\"round\":1,\"cause\":\"worker_failed\",\"reason\":\"rank 1\"}],"
    "\"last_failure\":{\"time\":989.0,\"peer\":\"127.0.0.1\",\"round\":0,\"rank\":1,"
    "\"local_rank\":1,\"exit_code\":3,\"reason\":\"exited\",\"log_tail\":\"boom\\n\"},"
    "\"progress\":[{\"time\":999.0,\"step\":42,\"loss\":0.5,\"samples_per_s\":1000.0},"
    "{\"time\":1000.0,\"step\":43}],"
    "\"log\":[{\"time\":990.0,\"level\":\"warning\",\"text\":\"round 1\"}]}";

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    ck_assert_msg(o != NULL, "%s", e.text);
    return o;
}

static char *dump(const json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ck_assert_ptr_nonnull(s);
    return s;
}

DL_TEST(a_job_round_trips_field_for_field)
{
    json_t *in = parse(job_text);
    dl_proto_status_job_t job;
    char err[256];
    DL_CHECK_ERRNO(
        dl_proto_rec_decode(&dl_proto_status_job_type, in, &job, "status", err, sizeof(err)), 0);
    ck_assert_str_eq(job.run_id, "job");
    ck_assert_int_eq(job.world_size, 4);
    ck_assert(job.has_keys && job.keys == 5);
    ck_assert_uint_eq(job.nnodes, 2);
    ck_assert_str_eq(job.nodes[1].node_id, "vm-2");
    ck_assert(job.nodes[0].has_last_heartbeat && !job.nodes[1].has_last_heartbeat);
    ck_assert(!job.nodes[1].connected && job.nodes[1].left);
    ck_assert_ptr_nonnull(job.diag);
    ck_assert_int_eq(job.diag->slowest->rank, 1);
    ck_assert_int_eq(job.diag->stragglers[0].steps, 20);
    ck_assert_uint_eq(job.nranks, 2);
    ck_assert_str_eq(job.ranks[0].ops[0].op, "all-reduce");
    ck_assert(job.ranks[0].has_step && !job.ranks[1].has_step && !job.ranks[1].has_ops);
    ck_assert(job.recovery->has_step && job.recovery->step == 40);
    ck_assert_str_eq(job.restarts_by_cause[0].name, "worker_failed");
    ck_assert(job.last_failure->has_exit_code && !job.last_failure->has_signal);
    ck_assert(job.progress[0].has_loss && !job.progress[1].has_loss);
    ck_assert_str_eq(job.log[0].level, "warning");

    /* Out again: the same text, in the same order. */
    json_t *out = dl_proto_rec_encode(&dl_proto_status_job_type, &job);
    char *a = dump(in), *b = dump(out);
    ck_assert_str_eq(b, a);
    free(a);
    free(b);
    json_decref(out);
    dl_proto_rec_free(&dl_proto_status_job_type, &job);
    ck_assert_ptr_null(job.nodes);
    json_decref(in);
}

DL_TEST(missing_optional_fields_are_absent)
{
    /* An etcd job's status: no store figures, no diag, no recovery, no snapshot additions. */
    json_t *in = parse("{\"run_id\":\"e\",\"state\":\"gathering\",\"round\":0,\"restarts\":0,"
                       "\"max_restarts\":0,\"min_nodes\":1,\"max_nodes\":1,\"world_size\":0,"
                       "\"nodes\":[],\"failure\":null}");
    dl_proto_status_list_t list;
    char err[256];
    DL_CHECK_ERRNO(dl_proto_status_decode_reply(in, &list, err, sizeof(err)), 0);
    ck_assert_uint_eq(list.njobs, 1);
    const dl_proto_status_job_t *j = &list.jobs[0];
    ck_assert(!j->has_keys && !j->has_store_clients && !j->has_ranks && !j->has_progress);
    ck_assert_ptr_null(j->failure);
    ck_assert_ptr_null(j->diag);
    ck_assert_ptr_null(j->recovery);
    ck_assert_ptr_null(j->last_failure);
    ck_assert_uint_eq(j->nnodes, 0);
    /* Written back, nothing appears that was not there (null is absent). */
    json_t *out = dl_proto_rec_encode(&dl_proto_status_job_type, j);
    char *b = dump(out);
    ck_assert_str_eq(b, "{\"run_id\":\"e\",\"state\":\"gathering\",\"round\":0,\"restarts\":0,"
                        "\"max_restarts\":0,\"min_nodes\":1,\"max_nodes\":1,\"world_size\":0,"
                        "\"nodes\":[]}");
    free(b);
    json_decref(out);
    dl_proto_rec_free(&dl_proto_status_list_type, &list);
    json_decref(in);
}

DL_TEST(every_job_reply_is_a_list)
{
    json_t *job = parse(job_text);
    json_t *in =
        json_pack("{s:s, s:i, s:[O, O]}", "state", "serving", "round", 0, "jobs", job, job);
    dl_proto_status_list_t list;
    char err[256];
    DL_CHECK_ERRNO(dl_proto_status_decode_reply(in, &list, err, sizeof(err)), 0);
    ck_assert_str_eq(list.state, "serving");
    ck_assert_uint_eq(list.njobs, 2);
    ck_assert_str_eq(list.jobs[1].nodes[0].host, "vm");
    dl_proto_rec_free(&dl_proto_status_list_type, &list);
    json_decref(in);
    json_decref(job);
}

/* Replaces the value at a path of the job ("nodes", 1, "slots") and decodes: the error. */
static int decode_bad(json_t *in, char *err, size_t len)
{
    dl_proto_status_list_t list;
    int r = dl_proto_status_decode_reply(in, &list, err, len);
    if (r == 0)
        dl_proto_rec_free(&dl_proto_status_list_type, &list);
    json_decref(in);
    return r;
}

DL_TEST(a_malformed_reply_names_the_field)
{
    char err[256];
    json_t *in = parse(job_text);
    json_object_set_new(json_array_get(json_object_get(in, "nodes"), 1), "slots",
                        json_string("two"));
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "status reply: field 'nodes[1].slots' must be an integer, got a string");

    in = parse(job_text);
    json_object_del(in, "run_id");
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "status reply: missing field 'run_id'");

    in = parse(job_text);
    json_object_set_new(json_object_get(json_object_get(in, "diag"), "slowest"), "compute_ms",
                        json_true());
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err,
                     "status reply: field 'diag.slowest.compute_ms' must be a number, got true");

    in = parse(job_text);
    json_array_set_new(json_object_get(in, "nodes"), 0, json_integer(7));
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "status reply: field 'nodes[0]' must be an object, got an integer");

    in = parse(job_text);
    json_object_set_new(json_object_get(in, "restarts_by_cause"), "node_lost", json_real(1.5));
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(
        err, "status reply: field 'restarts_by_cause.node_lost' must be an integer, got a real");

    in = json_pack("{s:s, s:i, s:[{}]}", "state", "serving", "round", 0, "jobs");
    DL_CHECK_ERRNO(decode_bad(in, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "status reply: missing field 'jobs[0].run_id'");

    DL_CHECK_ERRNO(decode_bad(json_string("x"), err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "status reply: must be an object, got a string");
}

DL_TEST(a_snapshot_round_trips)
{
    char text[8192];
    snprintf(text, sizeof(text),
             "{\"version\":\"0.1.0\",\"time\":1000.0,\"server\":{\"started\":900.0,"
             "\"connections\":3,\"peak_connections\":7,\"accepted\":9,\"auth_failures\":1,"
             "\"auth_timeouts\":0,\"rejected\":{\"bad_field\":2},\"messages\":{\"join\":2,"
             "\"heartbeat\":40},\"restarts\":{\"worker_failed\":1,\"node_lost\":0},\"rounds\":2,"
             "\"ended\":{},\"histograms\":{\"round_seconds\":{\"bounds\":[0.001,0.5],"
             "\"counts\":[0,1,2],\"sum\":0.75,\"count\":2},\"step_seconds\":{\"bounds\":[0.001],"
             "\"counts\":[5,5],\"sum\":0.001,\"count\":5}}},\"jobs\":[%s]}",
             job_text);
    json_t *in = parse(text);
    dl_proto_status_snapshot_t s;
    char err[256];
    DL_CHECK_ERRNO(
        dl_proto_rec_decode(&dl_proto_status_snapshot_type, in, &s, "snapshot", err, sizeof(err)),
        0);
    ck_assert_uint_eq(s.server->nmessages, 2);
    ck_assert_int_eq(s.server->messages[1].n, 40);
    ck_assert_uint_eq(s.server->nended, 0);
    ck_assert_uint_eq(s.server->histograms->round_seconds->ncounts, 3);
    ck_assert_int_eq(s.server->histograms->round_seconds->counts[2], 2);
    json_t *out = dl_proto_rec_encode(&dl_proto_status_snapshot_type, &s);
    char *a = dump(in), *b = dump(out);
    ck_assert_str_eq(b, a);
    free(a);
    free(b);
    json_decref(out);
    dl_proto_rec_free(&dl_proto_status_snapshot_type, &s);

    /* A histogram's count that is no integer, deep inside. */
    json_array_set_new(
        json_object_get(
            json_object_get(json_object_get(json_object_get(in, "server"), "histograms"),
                            "step_seconds"),
            "counts"),
        1, json_string("5"));
    DL_CHECK_ERRNO(
        dl_proto_rec_decode(&dl_proto_status_snapshot_type, in, &s, "snapshot", err, sizeof(err)),
        -EBADMSG);
    ck_assert_str_eq(err, "snapshot: field 'server.histograms.step_seconds.counts[1]' must be an "
                          "integer, got a string");
    ck_assert_ptr_null(s.server);
    json_decref(in);
}
