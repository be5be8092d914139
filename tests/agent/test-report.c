/* The event stream's lines, the failure summary's log tail, and GPU counting. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dl-test.h"
#include "errorfile.h"
#include "events.h"
#include "gpu.h"
#include "summary.h"

static char tmpdir[] = "/tmp/dl-test-report-XXXXXX";

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

DL_TEST(events_are_json_lines)
{
    char path[256];
    dl_events_t *ev;
    snprintf(path, sizeof(path), "%s/events.jsonl", tmpdir);
    DL_CHECK_ERRNO(dl_events_open(path, &ev), 0);
    ck_assert_int_eq(dl_events_emit(ev, "worker_start", 1700000000.25,
                                    json_pack("{s:i, s:i}", "rank", 3, "pid", 42)),
                     0);
    DL_CHECK_ERRNO(dl_events_emit(ev, "job_end", 1700000001.5, NULL), 0);
    dl_events_close(ev);

    FILE *f = fopen(path, "r");
    char line[512];
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(json_string_value(json_object_get(o, "event")), "worker_start");
    ck_assert(json_real_value(json_object_get(o, "time")) == 1700000000.25);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "rank")), 3);
    json_decref(o);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_ptr_nonnull(strstr(line, "\"event\":\"job_end\""));
    ck_assert_ptr_null(fgets(line, sizeof(line), f));
    fclose(f);
}

DL_TEST(events_to_missing_folder_fail_with_errno)
{
    dl_events_t *ev = NULL;
    ck_assert_int_eq(dl_events_open("/nonexistent-dir/x/events", &ev), -2 /* ENOENT */);
    ck_assert_ptr_null(ev);
}

DL_TEST(tail_takes_last_lines)
{
    char path[256], buf[4096];
    snprintf(path, sizeof(path), "%s/rank_0.err", tmpdir);
    write_file(path, "1\n2\n3\n4\n5\n");
    ck_assert_int_eq(dl_summary_tail(path, 2, buf, sizeof(buf)), 4);
    ck_assert_str_eq(buf, "4\n5\n");
    write_file(path, "no newline at the end");
    ck_assert_int_gt(dl_summary_tail(path, 2, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "no newline at the end");
    ck_assert_int_lt(dl_summary_tail("/nonexistent", 2, buf, sizeof(buf)), 0);
}

DL_TEST(tail_of_a_big_file_is_bounded)
{
    char path[256], buf[64];
    snprintf(path, sizeof(path), "%s/big.err", tmpdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 10000; i++)
        fprintf(f, "line %d\n", i);
    fclose(f);
    ck_assert_int_gt(dl_summary_tail(path, 3, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "line 9997\nline 9998\nline 9999\n");
}

DL_TEST(gpu_count)
{
    char dir[512];
    DL_CHECK_ERRNO(dl_gpu_count(tmpdir, NULL), 0);
    snprintf(dir, sizeof(dir), "%s/driver", tmpdir);
    mkdir(dir, 0755);
    strcat(dir, "/nvidia");
    mkdir(dir, 0755);
    strcat(dir, "/gpus");
    mkdir(dir, 0755);
    for (int i = 0; i < 3; i++) {
        char g[600];
        snprintf(g, sizeof(g), "%s/0000:0%d:00.0", dir, i);
        mkdir(g, 0755);
    }
    ck_assert_int_eq(dl_gpu_count(tmpdir, NULL), 3);
    ck_assert_int_eq(dl_gpu_count(tmpdir, "0,1"), 2);
    DL_CHECK_ERRNO(dl_gpu_count(tmpdir, ""), 0);
    DL_CHECK_ERRNO(dl_gpu_count(tmpdir, "-1"), 0);
    ck_assert_int_eq(dl_gpu_count(tmpdir, "GPU-5d3c1a2b"), 1);
}

/* A traceback longer than the buffer keeps its end (the innermost frame and the exception),
 * cut at a character, not inside a UTF-8 sequence. */
DL_TEST(error_file_keeps_the_end_of_a_long_traceback)
{
    char path[256], msg[64], trace[27]; /* its end: 9 bytes of the 10 of "ééééé", then 17 */
    snprintf(path, sizeof(path), "%s/rank_0.error.json", tmpdir);
    write_file(path, "{\"message\": {\"message\": \"ValueError: bad\", \"extraInfo\": "
                     "{\"py_callstack\": \"Traceback: frame 1\\nframe 2 \u00e9\u00e9\u00e9\u00e9"
                     "\u00e9\\nValueError: bad\\n\"}}}");
    ck_assert_int_eq(dl_error_file_read(path, msg, sizeof(msg), trace, sizeof(trace)), 1);
    ck_assert_str_eq(msg, "ValueError: bad");
    ck_assert_str_eq(trace, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\nValueError: bad\n");
    ck_assert_int_eq(dl_error_file_read(path, msg, sizeof(msg), trace, 8), 1);
    ck_assert_str_eq(trace, "r: bad\n");
    write_file(path, "{\"message\": \"plain\"}");
    ck_assert_int_eq(dl_error_file_read(path, msg, sizeof(msg), trace, sizeof(trace)), 1);
    ck_assert_str_eq(trace, "");
}

DL_TEST(signal_names)
{
    ck_assert_str_eq(dl_signal_name(9), "SIGKILL");
    ck_assert_str_eq(dl_signal_name(15), "SIGTERM");
    ck_assert_str_eq(dl_signal_name(200), "signal 200");
}

DL_TEST_SUITE(.setup_once = setup, .scratch_dir = tmpdir);
