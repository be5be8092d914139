#include "util.h"

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

char *tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *path = NULL;

    ck_assert_int_ge(asprintf(&path, "%s/dltrain-XXXXXX", base ? base : "/tmp"), 0);
    ck_assert_ptr_nonnull(mkdtemp(path));
    return path;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void tu_rmtree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void tu_write_idx(const char *path, bool gz, const uint8_t magic[4], const uint32_t *dims,
                  unsigned ndims, const uint8_t *data, size_t data_len)
{
    size_t len = 4 + 4 * (size_t)ndims + data_len;
    uint8_t *buf = malloc(len);

    ck_assert_ptr_nonnull(buf);
    memcpy(buf, magic, 4);
    for (unsigned i = 0; i < ndims; i++) {
        buf[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        buf[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        buf[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        buf[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (data_len > 0)
        memcpy(buf + 4 + 4 * ndims, data, data_len);
    if (gz) {
        gzFile f = gzopen(path, "wb1");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, buf, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        tu_write_file(path, buf, len);
    }
    free(buf);
}

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void write_split(const char *dir, const char *prefix, size_t n, size_t side, size_t classes,
                        const uint8_t *templates, uint64_t *rng)
{
    static const uint8_t img_magic[4] = {0, 0, 8, 3}, lab_magic[4] = {0, 0, 8, 1};
    size_t dim = side * side;
    uint8_t *pixels = malloc(n * dim), *labels = malloc(n);
    char path[4096];

    ck_assert_ptr_nonnull(pixels);
    ck_assert_ptr_nonnull(labels);
    for (size_t i = 0; i < n; i++) {
        size_t c = (size_t)next(rng) % classes;
        labels[i] = (uint8_t)c;
        for (size_t j = 0; j < dim; j++) {
            unsigned v = templates[c * dim + j] * 3u / 5u + (unsigned)(next(rng) % 103);
            pixels[i * dim + j] = (uint8_t)(v > 255 ? 255 : v);
        }
    }
    uint32_t idims[3] = {(uint32_t)n, (uint32_t)side, (uint32_t)side}, ldims[1] = {(uint32_t)n};
    snprintf(path, sizeof(path), "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    tu_write_idx(path, true, img_magic, idims, 3, pixels, n * dim);
    snprintf(path, sizeof(path), "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    tu_write_idx(path, true, lab_magic, ldims, 1, labels, n);
    free(pixels);
    free(labels);
}

void tu_make_dataset(const char *dir, size_t n_train, size_t n_test, size_t side, size_t classes,
                     uint64_t seed)
{
    size_t dim = side * side;
    uint8_t *templates = malloc(classes * dim);
    uint64_t rng = seed;

    ck_assert_ptr_nonnull(templates);
    for (size_t i = 0; i < classes * dim; i++)
        templates[i] = (uint8_t)(next(&rng) % 256);
    write_split(dir, "train", n_train, side, classes, templates, &rng);
    write_split(dir, "t10k", n_test, side, classes, templates, &rng);
    free(templates);
}

uint8_t *tu_read_file(const char *path, size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    ck_assert_int_ge(len, 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *ret_len = (size_t)len;
    return buf;
}

void tu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

const char *tu_fashion_dir(void)
{
    const char *dir = getenv("DL_FASHION_MNIST_DIR");
    char path[4096];

    if (dir == NULL)
        dir = "/usr/share/datasets/fashion-mnist";
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", dir);
    return access(path, R_OK) == 0 ? dir : NULL;
}
