/* A node's report read from its JSON (the etcd backend's reader): checked, read back with its age
 * added; refused shapes. */
#include <math.h>
#include <string.h>

#include "diag.h"
#include "dl-test.h"

DL_TEST(a_report_goes_there_and_back)
{
    /* As an agent writes it (rendezvous/rdzv-report.c, the test rdzv-report). */
    json_error_t je;
    json_t *rep = json_loads(
        "{\"node_rank\":1,\"host\":\"gpu1\",\"ranks\":[{\"rank\":4,\"recorder\":true,"
        "\"step\":10,\"steps\":1.0,\"compute_ms\":2.0,\"wait_ms\":0.5,\"samples\":64.0,"
        "\"loss\":0.25,\"silent_s\":0.5,\"proc\":\"S\",\"ops\":[{\"seq\":21,"
        "\"op\":\"all-reduce\",\"state\":\"running\",\"bytes\":4096,\"algo\":\"shm-small\","
        "\"transport\":\"shm\",\"age_s\":3.0}]},{\"rank\":5,\"recorder\":false}]}",
        0, &je);
    ck_assert_msg(rep != NULL, "%s", je.text);
    char err[256] = "";
    DL_CHECK_ERRNO(dl_diag_report_check(rep, err, sizeof(err)), 0);

    dl_diag_totals_t t[4];
    dl_diag_rank_t back[4];
    ck_assert_uint_eq(dl_diag_report_read(rep, 1.5, t, back, 4), 2);
    ck_assert_int_eq(t[0].rank, 4);
    ck_assert_int_eq(t[0].node_rank, 1);
    ck_assert_str_eq(t[0].host, "gpu1");
    ck_assert_double_eq_tol(t[0].steps, 1, 1e-9);
    ck_assert_double_eq_tol(t[0].compute_ms, 2, 1e-9);
    ck_assert_double_eq_tol(t[0].wait_ms, 0.5, 1e-9);
    ck_assert_double_eq_tol(t[0].samples, 64, 1e-9);
    ck_assert_int_eq(back[0].rank, 4);
    ck_assert(back[0].recorder);
    ck_assert_int_eq(back[0].proc, 'S');
    ck_assert_uint_eq(back[0].step, 10);
    ck_assert_double_eq_tol(back[0].silent_s, 2.0, 1e-9); /* 0.5 + the report's 1.5 s */
    ck_assert_uint_eq(back[0].nops, 1);
    ck_assert_uint_eq(back[0].ops[0].seq, 21);
    ck_assert_str_eq(back[0].ops[0].op, "all-reduce");
    ck_assert_int_eq(back[0].ops[0].state, DL_DIAG_OP_RUNNING);
    ck_assert_uint_eq(back[0].ops[0].bytes, 4096);
    ck_assert_str_eq(back[0].ops[0].algo, "shm-small");
    ck_assert_str_eq(back[0].ops[0].transport, "shm");
    ck_assert_double_eq_tol(back[0].ops[0].age_s, 4.5, 1e-9);
    ck_assert(!back[1].recorder);
    ck_assert_double_eq_tol(back[1].silent_s, -1, 1e-9);
    ck_assert_double_eq_tol(t[1].steps, 0, 1e-9);
    json_decref(rep);
}

static void refused(const char *text, const char *want)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", text, je.text);
    char err[256] = "";
    ck_assert_int_lt(dl_diag_report_check(j, err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, want) != NULL, "%s: got '%s', wanted '%s'", text, err, want);
    json_decref(j);
}

DL_TEST(bad_reports_are_refused)
{
    refused("[]", "must be an object");
    refused("{\"ranks\":3}", "'ranks' must be an array");
    refused("{\"node_rank\":-1,\"ranks\":[]}", "field 'node_rank'");
    refused("{\"ranks\":[{}]}", "rank 0 must be an object with a 'rank'");
    refused("{\"ranks\":[{\"rank\":-2}]}", "field 'rank'");
    refused("{\"ranks\":[{\"rank\":1,\"compute_ms\":\"x\"}]}", "field 'compute_ms'");
    refused("{\"ranks\":[{\"rank\":1,\"proc\":\"" /* 65 bytes */
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}]}",
            "at most 64 bytes");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[{\"seq\":1}]}]}", "needs 'seq', 'op' and 'state'");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[1,2,3,4,5,6,7,8,9]}]}", "at most 8");
    refused("{\"ranks\":[{\"rank\":1,\"ops\":[{\"seq\":1,\"op\":\"x\",\"state\":\"done\","
            "\"age_s\":-1}]}]}",
            "field 'age_s'");
}

/* dl_diag_round and dl_diag_ceil give libm's round and ceil, halves, signed zeros and the ends of the
 * doubles included. */
DL_TEST(round_and_ceil_without_libm_agree_with_libm)
{
    const double xs[] = {0.0,
                         -0.0,
                         0.3,
                         -0.3,
                         0.5,
                         -0.5,
                         0.49999999999999994,
                         -0.49999999999999994,
                         1.5,
                         -1.5,
                         2.5,
                         -2.5,
                         12.345,
                         -12.345,
                         99.95 * 10,
                         4503599627370495.5,
                         -4503599627370495.5,
                         4503599627370496.0,
                         9007199254740993.0,
                         1e300,
                         -1e300,
                         __builtin_inf(),
                         -__builtin_inf()};
    for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++) {
        double x = xs[i];
        ck_assert_msg(memcmp(&(double){dl_diag_round(x)}, &(double){round(x)}, sizeof(double)) == 0,
                      "dl_diag_round(%.17g) = %.17g, round: %.17g", x, dl_diag_round(x), round(x));
        ck_assert_msg(memcmp(&(double){dl_diag_ceil(x)}, &(double){ceil(x)}, sizeof(double)) == 0,
                      "dl_diag_ceil(%.17g) = %.17g, ceil: %.17g", x, dl_diag_ceil(x), ceil(x));
    }
    ck_assert(isnan(dl_diag_round(__builtin_nan(""))) && isnan(dl_diag_ceil(__builtin_nan(""))));
    for (int i = -100000; i <= 100000; i++) {
        double x = i / 1000.0;
        ck_assert_double_eq(dl_diag_round(x), round(x));
        ck_assert_double_eq(dl_diag_ceil(x), ceil(x));
    }
}
