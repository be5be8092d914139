/* The frame fuzzer's seeds (fuzz/corpus/frame/, the directory given as argv[1]) promise an
 * outcome in their name, checked here through the public decoder:
 *   ok--*      every frame is a valid message and no partial frame is left;
 *   more--*    the stream ends inside a frame;
 *   CODE--*    the first frame that is not a valid message fails with error code CODE.
 * The stream is read as a server reads it: the pre-auth limit until an auth message, the full
 * limit after. Files the fuzzer added (named by hash) promise nothing. That every file also
 * passes the fuzz target's own rules is the test frame-replay (fuzz/replay.c). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "proto.h"

#define MAX_FILES 4096

/* Filled once by list_corpus(), before the tests. */
static const char *corpus_dir;
static char *files[MAX_FILES];
static int nfiles;

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

/* Every seed that names an outcome gets it; each mismatch is named before the test fails. */
DL_TEST(seeds_decode_as_their_names_say)
{
    int checked = 0, wrong = 0;

    for (int i = 0; i < nfiles; i++) {
        const char *name = files[i];
        const char *sep = strstr(name, "--");
        char path[4096];
        uint8_t *data;
        size_t len;

        if (sep == NULL)
            continue;
        snprintf(path, sizeof(path), "%s/%s", corpus_dir, name);
        data = read_file(path, &len);
        const char *got = outcome(data, len);
        if (strncmp(name, got, (size_t)(sep - name)) != 0 || strlen(got) != (size_t)(sep - name)) {
            fprintf(stderr, "%s: decoded as '%s'\n", name, got);
            wrong++;
        }
        free(data);
        checked++;
    }
    ck_assert_msg(wrong == 0, "%d of %d seeds decode otherwise than their names say", wrong,
                  checked);
}

DL_TEST(test_corpus_has_seeds)
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

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_corpus(int argc, char **argv)
{
    struct dirent *e;
    DIR *d;

    if (argc != 2) {
        fprintf(stderr, "usage: %s [-t TEST] CORPUS_DIR\n", argv[0]);
        return 2;
    }
    corpus_dir = argv[1];
    d = opendir(corpus_dir);
    if (d == NULL) {
        fprintf(stderr, "test-corpus: %s: %s\n", corpus_dir, strerror(errno));
        return 1;
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

static int free_list(int failed)
{
    for (int i = 0; i < nfiles; i++)
        free(files[i]);
    return 0;
}

DL_TEST_SUITE(.init = list_corpus, .fini = free_list);
