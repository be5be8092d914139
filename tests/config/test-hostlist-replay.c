/* Replays the hostlist fuzzer's corpus (fuzz/corpus/hostlist) through the fuzz target in the
 * ordinary build: every input must pass the target's checks (no crash, consistent counts, well-
 * formed names and errors), so the corpus keeps guarding the parser without clang. */
#include <check.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

START_TEST(corpus_replays_cleanly)
{
    const char *root = getenv("SOURCE_ROOT");
    char dir[4096], path[8192];
    struct dirent *de;
    int files = 0;
    DIR *d;

    ck_assert_msg(root != NULL, "SOURCE_ROOT is not set");
    snprintf(dir, sizeof(dir), "%s/fuzz/corpus/hostlist", root);
    d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    while ((de = readdir(d)) != NULL) {
        static uint8_t buf[1 << 16];
        size_t n;
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        f = fopen(path, "rb");
        ck_assert_msg(f != NULL, "cannot open %s", path);
        n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, 80);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hostlist-replay");
    TCase *tc = tcase_create("corpus");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, corpus_replays_cleanly);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
