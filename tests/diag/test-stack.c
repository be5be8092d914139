/* Python stacks as faulthandler writes them: the newest dump's main thread, innermost first. */
#include <string.h>

#include "diag.h"
#include "dl-test.h"

/* Two dumps, as a stacks file holds them after two requests: a helper thread, then the main
 * thread (faulthandler lists threads newest first). */
static const char DUMPS[] = "dlaunch-stacks 1 signal=40 pid=12345\n"
                            "Thread 0x00007fd00e49d6c0 (most recent call first):\n"
                            "  File \"/tmp/fh.py\", line 3 in worker\n"
                            "  File \"/usr/lib/python3.11/threading.py\", line 982 in run\n"
                            "\n"
                            "Current thread 0x00007fd00f1fab80 (most recent call first):\n"
                            "  File \"/tmp/old.py\", line 1 in before\n"
                            "\n"
                            "Thread 0x00007fd00e49d6c0 (most recent call first):\n"
                            "  File \"/tmp/fh.py\", line 3 in worker\n"
                            "\n"
                            "Current thread 0x00007fd00f1fab80 (most recent call first):\n"
                            "  File \"/work/job/train.py\", line 6 in inner\n"
                            "  File \"/work/job/train.py\", line 8 in outer\n"
                            "  File \"/work/job/train.py\", line 10 in <module>\n"
                            "\n";

DL_TEST(the_newest_dumps_main_thread_innermost_first)
{
    char buf[256];
    size_t n = dl_diag_stack_top(DUMPS, strlen(DUMPS), 2, buf, sizeof(buf));
    ck_assert_str_eq(buf, "train.py:6 inner < train.py:8 outer");
    ck_assert_uint_eq(n, strlen(buf));
    dl_diag_stack_top(DUMPS, strlen(DUMPS), 9, buf, sizeof(buf));
    ck_assert_str_eq(buf, "train.py:6 inner < train.py:8 outer < train.py:10 <module>");
    /* Cut short: still NUL-terminated within the buffer. */
    char small[12];
    dl_diag_stack_top(DUMPS, strlen(DUMPS), 3, small, sizeof(small));
    ck_assert_uint_lt(strlen(small), sizeof(small));
    ck_assert(strncmp(small, "train.py:6", 10) == 0);
}

DL_TEST(no_dump_or_a_torn_one)
{
    char buf[64];
    const char *header = "dlaunch-stacks 1 signal=40 pid=1\n";
    ck_assert_uint_eq(dl_diag_stack_top(header, strlen(header), 3, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "");
    /* A dump still being written: its frames so far; a junk line ends the block. */
    const char *torn = "Current thread 0x1 (most recent call first):\n"
                       "  File \"a.py\", line 4 in f\n"
                       "  File \"b.py\", li";
    dl_diag_stack_top(torn, strlen(torn), 3, buf, sizeof(buf));
    ck_assert_str_eq(buf, "a.py:4 f");
    const char *junk = "Thread 0x1 (most recent call first):\n  <no Python frame>\n";
    ck_assert_uint_eq(dl_diag_stack_top(junk, strlen(junk), 3, buf, sizeof(buf)), 0);
    ck_assert_uint_eq(dl_diag_stack_top(junk, strlen(junk), 3, buf, 0), 0);
}
