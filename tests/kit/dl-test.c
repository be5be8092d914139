/* The one main() of the unit tests: builds libcheck's suite from the tests that registered
 * (dl-test.h), runs it, and turns the outcome into the exit status meson reads. */
#include "dl-test.h"

#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Filled by constructors before main(); a test program is the one place this kit runs. */
static dl_test_t *tests_head, **tests_tail = &tests_head;
static const dl_test_suite_t *the_suite;

void dl_test_register(dl_test_t *test)
{
    test->next = NULL;
    *tests_tail = test;
    tests_tail = &test->next;
}

void dl_test_register_suite(const dl_test_suite_t *suite)
{
    if (the_suite != NULL) {
        fprintf(stderr, "dl-test: two DL_TEST_SUITE declarations in one program\n");
        abort();
    }
    the_suite = suite;
}

const char *dl_test_errno_text(intmax_t result)
{
    const char *name;

    if (result >= 0)
        return "ok";
    if (result < -4095 || (name = strerrorname_np((int)-result)) == NULL)
        return "not an errno";
    return name;
}

void dl_test_put_file(const char *dir, const char *rel, const char *text)
{
    char path[4096];
    FILE *f;

    while (*rel == '/')
        rel++;
    ck_assert_msg((size_t)snprintf(path, sizeof(path), "%s/%s", dir, rel) < sizeof(path),
                  "%s/%s: path too long", dir, rel);
    for (char *p = path + strlen(dir) + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        ck_assert_msg(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path,
                      strerror(errno));
        *p = '/';
    }
    f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    int failed = fputs(text, f) < 0;
    failed |= fclose(f) != 0;
    ck_assert_msg(!failed, "%s: write failed: %s", path, strerror(errno));
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (remove(path) != 0) {
        fprintf(stderr, "dl-test: cannot remove %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int remove_tree(const char *dir)
{
    return nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : 1;
}

static bool selected(const char *name, char **only, int nonly)
{
    if (nonly == 0)
        return true;
    for (int i = 0; i < nonly; i++)
        if (strcmp(only[i], name) == 0)
            return true;
    return false;
}

static TCase *make_case(const dl_test_case_t *c)
{
    TCase *tc = tcase_create(c->name);

    if (c->timeout > 0)
        tcase_set_timeout(tc, c->timeout);
    if (c->setup != NULL || c->teardown != NULL)
        tcase_add_checked_fixture(tc, c->setup, c->teardown);
    if (c->setup_once != NULL || c->teardown_once != NULL)
        tcase_add_unchecked_fixture(tc, c->setup_once, c->teardown_once);
    return tc;
}

/* Adds the selected tests of one case, in the order they were written; returns how many. */
static int add_case(Suite *s, const dl_test_case_t *key, const dl_test_case_t *c, char **only,
                    int nonly)
{
    TCase *tc = NULL;
    int n = 0;

    for (dl_test_t *t = tests_head; t != NULL; t = t->next) {
        if (t->tcase != key || !selected(t->ttest->name, only, nonly))
            continue;
        if (tc == NULL)
            tc = make_case(c);
        _tcase_add_test(tc, t->ttest, 0, 0, t->first, t->end);
        n++;
    }
    if (tc != NULL)
        suite_add_tcase(s, tc);
    return n;
}

/* True when an earlier test already named this case, so that each case is added once. */
static bool case_seen_before(const dl_test_t *upto)
{
    for (const dl_test_t *t = tests_head; t != upto; t = t->next)
        if (t->tcase == upto->tcase)
            return true;
    return false;
}

static int usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-l] [-t TEST]...%s\n", prog,
            the_suite != NULL && the_suite->init != NULL ? " ARGS..." : "");
    return 2;
}

int main(int argc, char **argv)
{
    static const dl_test_suite_t none;
    const dl_test_suite_t *suite = the_suite != NULL ? the_suite : &none;
    const dl_test_case_t core = {.name = "core",
                                 .timeout = suite->timeout,
                                 .setup = suite->setup,
                                 .teardown = suite->teardown,
                                 .setup_once = suite->setup_once,
                                 .teardown_once = suite->teardown_once};
    char *prog = basename(argv[0]);
    char **only = calloc((size_t)argc, sizeof(*only));
    int nonly = 0, nrest = 1, added = 0, failed, status;

    if (only == NULL) {
        perror(prog);
        return 1;
    }
    /* The kit's options come out of argv; what is left (and argv[0]) goes to init. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-l") == 0) {
            for (dl_test_t *t = tests_head; t != NULL; t = t->next)
                printf("%s\n", t->ttest->name);
            free(only);
            return 0;
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            only[nonly++] = argv[++i];
        } else if (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "-h") == 0) {
            free(only);
            return usage(prog);
        } else {
            argv[nrest++] = argv[i];
        }
    }
    argv[nrest] = NULL;
    if (nrest > 1 && suite->init == NULL) {
        free(only);
        return usage(prog);
    }
    for (int i = 0; i < nonly; i++) {
        dl_test_t *t = tests_head;
        while (t != NULL && strcmp(t->ttest->name, only[i]) != 0)
            t = t->next;
        if (t == NULL) {
            fprintf(stderr, "%s: no test named '%s' (-l lists them)\n", prog, only[i]);
            free(only);
            return 2;
        }
    }
    if (suite->init != NULL && (status = suite->init(nrest, argv)) != 0) {
        free(only);
        return status;
    }

    Suite *s = suite_create(prog);
    for (dl_test_t *t = tests_head; t != NULL; t = t->next)
        if (!case_seen_before(t))
            added += add_case(s, t->tcase, t->tcase != NULL ? t->tcase : &core, only, nonly);
    free(only);
    SRunner *sr = srunner_create(s);
    if (suite->no_fork)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    status = suite->fini != NULL ? suite->fini(failed) : 0;
    if (failed == 0 && suite->scratch_dir != NULL && suite->scratch_dir[0] != '\0')
        status |= remove_tree(suite->scratch_dir);
    if (added == 0) {
        fprintf(stderr, "%s: no tests registered\n", prog);
        return 1;
    }
    return failed == 0 && status == 0 ? 0 : 1;
}
