/* The file-timer watchdog's pure part (filetimer.h): the lines torch's FileTimerClient writes,
 * what a broken client can write, and which worker the agent kills and when. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "filetimer.h"

static dl_filetimer_req_t req(int pid, const char *scope, double exp, int sig)
{
    dl_filetimer_req_t r = {.pid = pid, .expiration_time = exp, .signal = sig};
    strcpy(r.scope_id, scope);
    return r;
}

DL_TEST(torchs_lines_read_their_fields)
{
    /* Byte for byte what FileTimerRequest.to_json() writes for acquire and release. */
    const char *acq = "{\"version\": 1, \"pid\": 4242, \"scope_id\": \"step\", "
                      "\"expiration_time\": 1733340000.25, \"signal\": 9}";
    const char *rel = "{\"version\": 1, \"pid\": 4242, \"scope_id\": \"step\", "
                      "\"expiration_time\": -1, \"signal\": 0}";
    dl_filetimer_req_t r;
    DL_CHECK_ERRNO(dl_filetimer_parse(acq, strlen(acq), &r), 0);
    ck_assert_int_eq(r.pid, 4242);
    ck_assert_str_eq(r.scope_id, "step");
    ck_assert(r.expiration_time == 1733340000.25);
    ck_assert_int_eq(r.signal, 9);
    DL_CHECK_ERRNO(dl_filetimer_parse(rel, strlen(rel), &r), 0);
    ck_assert(r.expiration_time < 0);
    ck_assert_int_eq(r.signal, 0);
}

DL_TEST(bad_lines_are_refused_and_leave_the_output_alone)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[1,2]",
        "{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1}",
        "{\"pid\": \"1\", \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": 0, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": -5, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": 99999999999, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": 1, \"scope_id\": 7, \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": \"x\", \"signal\": 9}",
        "{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 65}",
        "{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": -9}",
        "{\"pid\": 1, \"scope_id\": \"a\\u0000b\", \"expiration_time\": 1, \"signal\": 9}",
        "{\"pid\": 1, \"pid\": 2, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dl_filetimer_req_t r = req(77, "kept", 5, 3);
        ck_assert_msg(dl_filetimer_parse(bad[i], strlen(bad[i]), &r) == -EINVAL, "%s", bad[i]);
        ck_assert_int_eq(r.pid, 77);
        ck_assert_str_eq(r.scope_id, "kept");
    }
    char big[400];
    memset(big, 'x', 300);
    big[300] = '\0';
    char line[600];
    snprintf(line, sizeof(line),
             "{\"pid\": 1, \"scope_id\": \"%s\", \"expiration_time\": 1, \"signal\": 9}", big);
    dl_filetimer_req_t r;
    DL_CHECK_ERRNO(dl_filetimer_parse(line, strlen(line), &r), -EINVAL);
}

DL_TEST(an_overrun_worker_is_due_once_its_timer_expires)
{
    dl_filetimer_table_t tab;
    dl_filetimer_init(&tab);
    dl_filetimer_req_t a = req(10, "step", 100.0, 9);
    DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &a), 0);
    ck_assert(dl_filetimer_next(&tab) == 100.0);
    dl_filetimer_req_t due;
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 99.9, &due), 0);
    ck_assert_int_eq(dl_filetimer_due(&tab, 100.0, &due), 1);
    ck_assert_int_eq(due.pid, 10);
    ck_assert_str_eq(due.scope_id, "step");
    ck_assert_int_eq(due.signal, 9);
    dl_filetimer_forget_pid(&tab, 10);
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 1e12, &due), 0);
    ck_assert(dl_filetimer_next(&tab) < 0);
    dl_filetimer_free(&tab);
}

DL_TEST(a_release_or_a_new_expiry_replaces_the_timer)
{
    dl_filetimer_table_t tab;
    dl_filetimer_init(&tab);
    dl_filetimer_req_t r = req(10, "step", 100.0, 9);
    dl_filetimer_apply(&tab, &r);
    r.expiration_time = 200.0;
    dl_filetimer_apply(&tab, &r);
    dl_filetimer_req_t due;
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 150, &due), 0);
    r.expiration_time = -1;
    r.signal = 0;
    DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &r), 0);
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 1e12, &due), 0);
    /* Releasing what was never set is fine, as in torch. */
    DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &r), 0);
    ck_assert_int_eq((int)tab.n, 0);
    dl_filetimer_free(&tab);
}

DL_TEST(the_earliest_expired_timer_with_a_signal_decides)
{
    dl_filetimer_table_t tab;
    dl_filetimer_init(&tab);
    dl_filetimer_req_t rs[] = {req(10, "a", 50, 0), req(10, "b", 60, 15), req(11, "a", 55, 9),
                               req(12, "a", 40, 0)};
    for (size_t i = 0; i < 4; i++)
        DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &rs[i]), 0);
    dl_filetimer_req_t due;
    /* pid 12 expired first but asked for no signal: never reaped, its timer stays. */
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 54, &due), 0);
    ck_assert_int_eq(dl_filetimer_due(&tab, 100, &due), 1);
    ck_assert_int_eq(due.pid, 11);
    dl_filetimer_forget_pid(&tab, 11);
    ck_assert_int_eq(dl_filetimer_due(&tab, 100, &due), 1);
    ck_assert_int_eq(due.pid, 10);
    ck_assert_str_eq(due.scope_id, "b");
    ck_assert_int_eq(due.signal, 15);
    dl_filetimer_forget_pid(&tab, 10);
    ck_assert_int_eq((int)tab.n, 1);
    DL_CHECK_ERRNO(dl_filetimer_due(&tab, 1e12, &due), 0);
    dl_filetimer_free(&tab);
}

DL_TEST(the_table_is_bounded)
{
    dl_filetimer_table_t tab;
    dl_filetimer_init(&tab);
    char scope[32];
    for (int i = 0; i < DL_FILETIMER_MAX_TIMERS; i++) {
        snprintf(scope, sizeof(scope), "s%d", i);
        dl_filetimer_req_t r = req(1, scope, 10, 9);
        DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &r), 0);
    }
    dl_filetimer_req_t r = req(1, "one too many", 10, 9);
    DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &r), -E2BIG);
    /* Replacing a live one still works when full. */
    r = req(1, "s0", 20, 9);
    DL_CHECK_ERRNO(dl_filetimer_apply(&tab, &r), 0);
    dl_filetimer_free(&tab);
    dl_filetimer_free(NULL);
}
