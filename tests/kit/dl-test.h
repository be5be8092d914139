/* The unit tests' one scaffold: a test registers itself where it is written, and the kit's main()
 * (dl-test.c, linked into every test) builds libcheck's suite from what registered and runs it.
 *
 *     DL_TEST(a_bad_frame_is_refused)
 *     {
 *         ck_assert_int_eq(decode("\x00"), -EINVAL);
 *     }
 *
 * Assertions are libcheck's ck_assert_*: each failure prints one line with file:line, the
 * expression and the values, and the summary line counts checks, failures and errors. A result
 * in the house convention (>= 0, or -errno) is checked with DL_CHECK_ERRNO, which names the
 * errnos: "'decode(buf) == 0' failed: -22 (EINVAL), expected 0 (ok)". Every test runs in a forked
 * process of its own (unless the suite says no_fork), so a crash fails that test only.
 *
 * The tests of a file form one case, "core". A file that needs more declares it once:
 *     DL_TEST_SUITE(.timeout = 120, .setup = setup, .teardown = teardown);
 * and tests that need another timeout or fixture go into a case of their own:
 *     DL_TEST_CASE(matrix, .timeout = 120);
 *     DL_TEST_LOOP_IN(matrix, allreduce, 0, NSETUPS) { ... uses _i ... }
 *
 * Running: `test-foo` runs every test; `test-foo -t NAME` (repeatable) only those; `test-foo -l`
 * lists them. Other arguments go to the suite's init (a corpus directory, a helper program). The
 * exit status is 0 when every test passed, 1 when one failed, what init returned when it refused
 * to start (77 skips under meson). libcheck's own variables (CK_FORK, CK_RUN_CASE,
 * CK_DEFAULT_TIMEOUT, CK_VERBOSITY) still apply. */
#ifndef DL_TEST_H
#define DL_TEST_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

/* A libcheck test case: tests that share a timeout and fixtures. */
typedef struct dl_test_case_s {
    const char *name;
    /* Seconds a test may run; 0 keeps libcheck's default (CK_DEFAULT_TIMEOUT). */
    double timeout;
    /* Around every test, inside its process: a failure there fails the test. */
    SFun setup, teardown;
    /* Once for the case, in the runner's process. */
    SFun setup_once, teardown_once;
} dl_test_case_t;

/* What a whole file needs besides its tests; at most one DL_TEST_SUITE a program. */
typedef struct dl_test_suite_s {
    /* The fields of the default case, "core". */
    double timeout;
    SFun setup, teardown, setup_once, teardown_once;
    /* A directory the tests made (say with mkdtemp in setup_once): removed after a run where
     * every test passed, kept for a look when one failed. */
    const char *scratch_dir;
    /* Run the tests in the runner's process (tests that share state set up once). */
    bool no_fork;
    /* Before any test, with the arguments the kit did not take: 0 goes on, anything else is the
     * exit status (2 for a usage error, 77 to skip). NULL: extra arguments are an error. */
    int (*init)(int argc, char **argv);
    /* After the run, with the number of tests that failed; returns 0, or nonzero to fail the
     * program (a temporary directory that could not be removed). */
    int (*fini)(int failed);
} dl_test_suite_t;

/* One registered test; the kit links them in the order the file defines them. */
typedef struct dl_test_s {
    const TTest *ttest;
    const dl_test_case_t *tcase; /* NULL: the file's default case */
    int first, end;              /* _i runs over [first, end) */
    struct dl_test_s *next;
} dl_test_t;

/* Called by the constructors DL_TEST and DL_TEST_SUITE define, before main(). */
void dl_test_register(dl_test_t *test);
void dl_test_register_suite(const dl_test_suite_t *suite);

/* Writes text to dir/rel, making the folders on the way; a failure fails the test, naming the
 * path and errno. For the fake /proc and /sys trees the agent's tests build. */
void dl_test_put_file(const char *dir, const char *rel, const char *text);
/* "EINVAL" for -EINVAL, "ok" for 0 and above; a constant string. */
const char *dl_test_errno_text(intmax_t result);

#define DL__TEST(tcase_ptr, name, first, end)                                                      \
    static void name##_fn(int _i);                                                                 \
    static const TTest name##_ttest = {#name, name##_fn, __FILE__, __LINE__};                      \
    static dl_test_t name##_entry = {&name##_ttest, tcase_ptr, first, end, NULL};                  \
    __attribute__((constructor)) static void name##_register(void)                                 \
    {                                                                                              \
        dl_test_register(&name##_entry);                                                           \
    }                                                                                              \
    static void name##_fn(int _i CK_ATTRIBUTE_UNUSED)

/* A test, run once; its body follows in braces. */
#define DL_TEST(name) DL__TEST(NULL, name, 0, 1)
/* A test run once for each _i in [first, end), each run reported on its own. */
#define DL_TEST_LOOP(name, first, end) DL__TEST(NULL, name, first, end)
/* The same in a case of DL_TEST_CASE's. */
#define DL_TEST_IN(tcase, name) DL__TEST(&tcase, name, 0, 1)
#define DL_TEST_LOOP_IN(tcase, name, first, end) DL__TEST(&tcase, name, first, end)

/* expr, a result >= 0 or -errno, equals expected; evaluates each once. */
#define DL_CHECK_ERRNO(expr, expected)                                                             \
    do {                                                                                           \
        intmax_t dl__got = (expr), dl__want = (expected);                                          \
        ck_assert_msg(dl__got == dl__want, "'%s == %s' failed: %jd (%s), expected %jd (%s)",       \
                      #expr, #expected, dl__got, dl_test_errno_text(dl__got), dl__want,            \
                      dl_test_errno_text(dl__want));                                               \
    } while (0)

/* A case of its own: DL_TEST_CASE(matrix, .timeout = 120); then DL_TEST_IN(matrix, name). */
#define DL_TEST_CASE(var, ...) static const dl_test_case_t var = {.name = #var, __VA_ARGS__}

#define DL_TEST_SUITE(...)                                                                         \
    static const dl_test_suite_t dl__test_suite;                                                   \
    __attribute__((constructor)) static void dl__test_suite_register(void)                         \
    {                                                                                              \
        dl_test_register_suite(&dl__test_suite);                                                   \
    }                                                                                              \
    static const dl_test_suite_t dl__test_suite = {__VA_ARGS__}

#endif
