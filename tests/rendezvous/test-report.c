/* A node's report as a record (proto/node-report.h, rendezvous/rdzv-report.h): what an agent
 * fills from its ranks goes out in the wire's field order and comes back field for field at the
 * rendezvous; a malformed report is one line naming the field; the rule's view as the wire's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "rdzv-report.h"

/* What the agent wrote before the record, key for key: the wire stays as it was. */
static const char report_text[] =
    "{\"node_rank\":1,\"host\":\"gpu1\",\"ranks\":[{\"rank\":4,\"recorder\":true,\"step\":10,"
    "\"steps\":1.0,\"compute_ms\":2.0,\"wait_ms\":0.5,\"samples\":64.0,\"loss\":0.25,"
    "\"silent_s\":0.5,\"proc\":\"S\",\"ops\":[{\"seq\":21,\"op\":\"all-reduce\",\"state\":"
    "\"running\",\"bytes\":4096,\"algo\":\"shm-small\",\"transport\":\"shm\",\"age_s\":3.0}]},"
    "{\"rank\":5,\"recorder\":false}],\"threshold\":0.3,\"window\":100}";

static dl_proto_node_report_t filled(void)
{
    dl_diag_beats_t b0, b1;
    dl_diag_beats_init(&b0);
    dl_diag_beats_init(&b1);
    const char *l0 = "step=10 compute_ms=2 wait_ms=0.5 samples=64 loss=0.25\n";
    dl_diag_beats_feed(&b0, l0, strlen(l0), 1);
    dl_diag_rank_t r[2];
    memset(r, 0, sizeof(r));
    r[0] = (dl_diag_rank_t){.rank = 4, .recorder = true, .proc = 'S', .silent_s = 0.5};
    r[0].ops[r[0].nops++] = (dl_diag_op_t){.seq = 21,
                                           .op = "all-reduce",
                                           .state = DL_DIAG_OP_RUNNING,
                                           .bytes = 4096,
                                           .algo = "shm-small",
                                           .transport = "shm",
                                           .age_s = 3};
    r[1] = (dl_diag_rank_t){.rank = 5, .recorder = false, .silent_s = -1};
    const dl_diag_beats_t *beats[2] = {&b0, &b1};
    dl_proto_node_report_t rep;
    DL_CHECK_ERRNO(dl_rdzv_report_fill(&rep, 1, "gpu1", r, beats, 2), 0);
    rep.threshold = 0.3;
    rep.window = 100;
    rep.has_threshold = rep.has_window = true;
    return rep;
}

DL_TEST(a_report_goes_out_as_it_always_did)
{
    dl_proto_node_report_t rep = filled();
    json_t *o = dl_proto_rec_encode(&dl_proto_node_report_type, &rep);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    ck_assert_str_eq(text, report_text);
    free(text);
    json_decref(o);
    dl_proto_rec_free(&dl_proto_node_report_type, &rep);
}

DL_TEST(a_report_comes_back_with_its_age)
{
    json_error_t je;
    json_t *o = json_loads(report_text, 0, &je);
    ck_assert_ptr_nonnull(o);
    dl_proto_node_report_t rep;
    char err[256] = "";
    DL_CHECK_ERRNO(dl_proto_node_report_decode(o, &rep, err, sizeof(err)), 0);
    json_decref(o);
    ck_assert_uint_eq(rep.nranks, 2);
    ck_assert(rep.has_threshold && rep.threshold == 0.3 && rep.window == 100);

    dl_diag_totals_t t;
    ck_assert(dl_rdzv_report_totals(&rep, 0, &t));
    ck_assert_int_eq(t.rank, 4);
    ck_assert_int_eq(t.node_rank, 1);
    ck_assert_str_eq(t.host, "gpu1");
    ck_assert_double_eq_tol(t.steps, 1, 1e-9);
    ck_assert_double_eq_tol(t.compute_ms, 2, 1e-9);
    ck_assert_double_eq_tol(t.samples, 64, 1e-9);
    ck_assert(!dl_rdzv_report_totals(&rep, 1, &t)); /* no beats: no figures */

    dl_diag_rank_t r;
    dl_rdzv_report_rank(&rep, 0, 1.5, &r);
    ck_assert(r.recorder);
    ck_assert_int_eq(r.proc, 'S');
    ck_assert_uint_eq(r.step, 10);
    ck_assert_double_eq_tol(r.silent_s, 2.0, 1e-9); /* 0.5 + the report's 1.5 s */
    ck_assert_uint_eq(r.nops, 1);
    ck_assert_str_eq(r.ops[0].op, "all-reduce");
    ck_assert_int_eq(r.ops[0].state, DL_DIAG_OP_RUNNING);
    ck_assert_str_eq(r.ops[0].transport, "shm");
    ck_assert_double_eq_tol(r.ops[0].age_s, 4.5, 1e-9);
    dl_rdzv_report_rank(&rep, 1, 1.5, &r);
    ck_assert(!r.recorder);
    ck_assert_double_eq_tol(r.silent_s, -1, 1e-9);
    dl_proto_rec_free(&dl_proto_node_report_type, &rep);
}

static void refused(const char *text, const char *want)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_ALLOW_NUL, &je);
    ck_assert_msg(j != NULL, "%s: %s", text, je.text);
    dl_proto_node_report_t rep;
    char err[256] = "";
    DL_CHECK_ERRNO(dl_proto_node_report_decode(j, &rep, err, sizeof(err)), -EBADMSG);
    ck_assert_msg(strstr(err, want) != NULL, "%s: got '%s', wanted '%s'", text, err, want);
    ck_assert_msg(strchr(err, '\n') == NULL, "%s: more than a line", err);
    json_decref(j);
}

DL_TEST(bad_reports_are_one_line_naming_the_field)
{
    refused("[]", "diag: must be an object");
    refused("{}", "missing field 'ranks'");
    refused("{\"ranks\":3}", "field 'ranks' must be an array");
    refused("{\"node_rank\":-1,\"ranks\":[]}", "field 'node_rank'");
    refused("{\"ranks\":[{}]}", "missing field 'ranks[0].rank'");
    refused("{\"ranks\":[{\"rank\":-2}]}", "field 'ranks[0].rank'");
    refused("{\"ranks\":[{\"rank\":1},{\"rank\":2,\"compute_ms\":\"x\"}]}",
            "field 'ranks[1].compute_ms' must be a number, got a string");
    refused("{\"ranks\":[{\"rank\":1,\"steps\":-1}]}",
            "field 'ranks[0].steps' must be a number >= 0");
    refused("{\"ranks\":[{\"rank\":1,\"proc\":\"" /* 65 bytes */
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}]}",
            "field 'ranks[0].proc' must be a string of at most 64 bytes");
    refused("{\"ranks\":[{\"rank\":1,\"proc\":\"S\\u0000x\"}]}", "without NUL bytes");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[{\"seq\":1}]}]}",
            "missing field 'ranks[0].ops[0].op'");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[1]}]}", "field 'ranks[0].ops[0]' must be an object");
    refused(
        "{\"ranks\":[{\"rank\":1,\"ops\":[{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},"
        "{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},"
        "{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},"
        "{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},"
        "{\"seq\":1,\"op\":\"x\",\"state\":\"done\"},{\"seq\":1,\"op\":\"x\",\"state\":\"done\"}"
        "]}]}",
        "field 'ranks[0].ops' must be an array of at most 8");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[{\"seq\":1,\"op\":\"x\",\"state\":\"done\","
            "\"age_s\":-1}]}]}",
            "field 'ranks[0].ops[0].age_s'");
    refused("{\"ranks\":[],\"threshold\":0}", "field 'threshold' must be a number above 0");
}

DL_TEST(the_view_as_the_wire_has_it)
{
    dl_diag_straggler_t s = {.rank = 3,
                             .node_rank = 1,
                             .compute_ms = 3,
                             .median_ms = 2,
                             .slower = 0.5,
                             .steps = 120,
                             .cost = 1000.5};
    snprintf(s.host, sizeof(s.host), "gpu1");
    dl_diag_view_t v = {.ranks = 4,
                        .median_ms = 2,
                        .step_ms = 3.1,
                        .slowest_rank = 3,
                        .slowest_ms = 3,
                        .samples_per_s = 5000,
                        .stragglers = &s,
                        .nstragglers = 1};
    dl_proto_status_diag_t d;
    DL_CHECK_ERRNO(dl_rdzv_report_view(&v, &d), 0);
    json_t *j = dl_proto_rec_encode(&dl_proto_status_diag_type, &d);
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    ck_assert_str_eq(text, "{\"ranks\":4,\"median_compute_ms\":2.0,\"step_ms\":3.1,"
                           "\"samples_per_s\":5000.0,\"stragglers\":[{\"rank\":3,\"node_rank\":1,"
                           "\"host\":\"gpu1\",\"compute_ms\":3.0,\"median_ms\":2.0,"
                           "\"slower_pct\":50.0,\"steps\":120,\"cost_samples_per_s\":1000.5}],"
                           "\"slowest\":{\"rank\":3,\"compute_ms\":3.0}}");
    free(text);
    json_decref(j);
    dl_proto_rec_free(&dl_proto_status_diag_type, &d);
}
