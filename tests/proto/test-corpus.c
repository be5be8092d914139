/* Replays the frame fuzzer's corpus (fuzz/corpus/frame/, the directory given as argv[1]) through
 * the fuzz target's own entry point, so an input that once crashed it or broke one of its rules
 * keeps being tried in every ordinary build.
 *
 * Seeds also promise an outcome in their name, checked here through the public decoder:
 *   ok--*      every frame is a valid message and no partial frame is left;
 *   more--*    the stream ends inside a frame;
 *   CODE--*    the first frame that is not a valid message fails with error code CODE.
 * The stream is read as a server reads it: the pre-auth limit until an auth message, the full
 * limit after. Files the fuzzer added (named by hash) only have to pass its rules. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FILES 4096

/* Filled once by main(). */
static const char *corpus_dir;
static char *files[MAX_FILES];
static int nfiles;
/* The file being replayed, for the abort handler. */
static const char *volatile current;

/* The fuzz target reports a broken rule with abort(). The files run without a fork each (a fork
 * per file costs a leak check per file under ASan, minutes for the whole corpus), so say which
 * file it was before dying. */
static void on_abort(int sig)
{
    static const char head[] = "test-corpus: aborted while replaying ";
    const char *name = current != NULL ? current : "(none)";

    (void)!write(STDERR_FILENO, head, sizeof(head) - 1);
    (void)!write(STDERR_FILENO, name, strlen(name));
    (void)!write(STDERR_FILENO, "\n", 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

static uint8_t *read_file(const char *path, size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;

    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    do {
        if (len == cap) {
            cap = cap == 0 ? 4096 : cap * 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n > 0);
    ck_assert_msg(!ferror(f), "%s: read error", path);
    fclose(f);
    *ret_len = len;
    return buf;
}

/* "ok", "more", or the code of the first failure. */
static const char *outcome(const uint8_t *data, size_t size)
{
    dl_proto_decoder_t dec;
    const char *result = NULL;
    size_t off = 0;

    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    while (off < size && result == NULL) {
        json_t *msg = NULL;
        dl_proto_type_t type;
        dl_proto_error_t err;
        size_t used;
        int r = dl_proto_decoder_feed(&dec, data + off, size - off, &used, &msg, &type, &err);

        off += used;
        if (r == DL_PROTO_MESSAGE) {
            if (type == DL_PROTO_AUTH)
                dl_proto_decoder_set_limit(&dec, DL_PROTO_LIMIT);
            json_decref(msg);
        } else if (r != DL_PROTO_NEED_MORE) {
            result = dl_proto_errcode_name(err.code);
        }
    }
    if (result == NULL)
        result = dl_proto_decoder_pending(&dec) ? "more" : "ok";
    dl_proto_decoder_cleanup(&dec);
    return result;
}

START_TEST(test_corpus_file)
{
    const char *name = files[_i];
    const char *sep = strstr(name, "--");
    char path[4096];
    uint8_t *data;
    size_t len;

    snprintf(path, sizeof(path), "%s/%s", corpus_dir, name);
    data = read_file(path, &len);
    /* Aborts (and so fails this test) when one of the fuzzer's rules breaks. */
    current = name;
    ck_assert_int_eq(LLVMFuzzerTestOneInput(data, len), 0);
    current = NULL;
    if (sep != NULL) {
        const char *got = outcome(data, len);
        ck_assert_msg(strncmp(name, got, (size_t)(sep - name)) == 0 &&
                          strlen(got) == (size_t)(sep - name),
                      "%s: decoded as '%s'", name, got);
    }
    free(data);
}
END_TEST

START_TEST(test_corpus_has_seeds)
{
    /* A missing or emptied corpus would make the replay pass by testing nothing. */
    int ok = 0, errors = 0;

    for (int i = 0; i < nfiles; i++) {
        if (strncmp(files[i], "ok--", 4) == 0)
            ok++;
        else if (strstr(files[i], "--") != NULL)
            errors++;
    }
    ck_assert_msg(ok >= 5 && errors >= 10, "%s: %d ok seeds, %d error seeds", corpus_dir, ok,
                  errors);
}
END_TEST

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_corpus(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (d == NULL) {
        fprintf(stderr, "test-corpus: %s: %s\n", dir, strerror(errno));
        return -errno;
    }
    while ((e = readdir(d)) != NULL && nfiles < MAX_FILES) {
        if (e->d_name[0] == '.')
            continue;
        files[nfiles] = strdup(e->d_name);
        if (files[nfiles] == NULL)
            break;
        nfiles++;
    }
    closedir(d);
    qsort(files, (size_t)nfiles, sizeof(files[0]), by_name);
    return 0;
}

int main(int argc, char **argv)
{
    Suite *s = suite_create("corpus");
    TCase *tc = tcase_create("frame");
    SRunner *sr;
    int failed;

    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    corpus_dir = argv[1];
    if (list_corpus(corpus_dir) < 0)
        return EXIT_FAILURE;
    tcase_add_test(tc, test_corpus_has_seeds);
    tcase_add_loop_test(tc, test_corpus_file, 0, nfiles);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    signal(SIGABRT, on_abort);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    for (int i = 0; i < nfiles; i++)
        free(files[i]);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
