/* IDX files through zlib: good files read back exactly, every kind of broken file is one clear
 * error that names the file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "trainer.h"
#include "util.h"

static const uint8_t IMG_MAGIC[4] = {0, 0, 8, 3};
static const uint8_t LAB_MAGIC[4] = {0, 0, 8, 1};

static char *dir;
static char path[4096];
static char err[DL_TRAIN_ERRLEN];

static void setup(void)
{
    dir = tu_tmpdir();
    snprintf(path, sizeof(path), "%s/data-idx3-ubyte.gz", dir);
    err[0] = '\0';
}

static void teardown(void)
{
    tu_rmtree(dir);
    free(dir);
}

/* A 5 x 3 x 4 image file whose bytes count up. */
static void write_images(bool gz, const uint8_t magic[4], size_t data_len)
{
    uint8_t data[80];
    uint32_t dims[3] = {5, 3, 4};
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    tu_write_idx(path, gz, magic, dims, 3, data, data_len);
}

/* The read fails with rc, its message names the file and contains `what`. */
static void expect_error(int rc, const char *what)
{
    uint8_t *data = (uint8_t *)0x1;
    size_t dims[3] = {0};
    int r = dl_train_idx_read(path, 3, &data, dims, err, sizeof(err));

    ck_assert_int_eq(r, rc);
    ck_assert_ptr_eq(data, (uint8_t *)0x1); /* untouched */
    ck_assert_msg(strstr(err, path) != NULL, "error does not name the file: %s", err);
    ck_assert_msg(strstr(err, what) != NULL, "error lacks '%s': %s", what, err);
    ck_assert_ptr_null(strchr(err, '\n'));
}

DL_TEST(reads_gzip_and_plain)
{
    for (int gz = 0; gz < 2; gz++) {
        uint8_t *data = NULL;
        size_t dims[3];
        write_images(gz, IMG_MAGIC, 60);
        DL_CHECK_ERRNO(dl_train_idx_read(path, 3, &data, dims, err, sizeof(err)), 0);
        ck_assert_uint_eq(dims[0], 5);
        ck_assert_uint_eq(dims[1], 3);
        ck_assert_uint_eq(dims[2], 4);
        for (size_t i = 0; i < 60; i++)
            ck_assert_uint_eq(data[i], (uint8_t)(i * 7));
        free(data);
    }
}

DL_TEST(missing_file)
{
    snprintf(path, sizeof(path), "%s/absent-idx3-ubyte.gz", dir);
    expect_error(-ENOENT, "No such file");
}

DL_TEST(bad_magic)
{
    static const uint8_t magic[4] = {0x1f, 0x00, 8, 3};
    write_images(true, magic, 60);
    expect_error(-EBADMSG, "bad magic");
}

DL_TEST(wrong_element_type)
{
    static const uint8_t magic[4] = {0, 0, 0x0d, 3}; /* float */
    write_images(true, magic, 60);
    expect_error(-EBADMSG, "element type");
}

DL_TEST(wrong_dimension_count)
{
    write_images(true, LAB_MAGIC, 60); /* says 1 dimension, images need 3 */
    expect_error(-EBADMSG, "1 dimensions, expected 3");
}

DL_TEST(zero_dimension)
{
    uint32_t dims[3] = {5, 0, 4};
    tu_write_idx(path, true, IMG_MAGIC, dims, 3, NULL, 0);
    expect_error(-EBADMSG, "dimension 1 is zero");
}

DL_TEST(huge_dimensions)
{
    uint32_t dims[3] = {0xffffffffu, 0xffffffffu, 2};
    tu_write_idx(path, true, IMG_MAGIC, dims, 3, NULL, 0);
    expect_error(-EBADMSG, "too large");
}

DL_TEST(short_data)
{
    write_images(true, IMG_MAGIC, 59);
    expect_error(-EBADMSG, "truncated: 59 bytes of data, the header promises 60");
}

DL_TEST(short_header)
{
    static const uint8_t two[2] = {0, 0};
    tu_write_file(path, two, 2);
    expect_error(-EBADMSG, "truncated");
}

DL_TEST(trailing_data)
{
    write_images(true, IMG_MAGIC, 61);
    expect_error(-EBADMSG, "trailing bytes");
}

DL_TEST(truncated_gzip_stream)
{
    write_images(true, IMG_MAGIC, 60);
    size_t len;
    uint8_t *raw = tu_read_file(path, &len);
    tu_write_file(path, raw, len - 6); /* cut into the deflate data and trailer */
    free(raw);
    expect_error(-EBADMSG, "truncated gzip stream");
}

DL_TEST(corrupted_gzip_stream)
{
    /* Damage inside the compressed data: zlib must report it (bad data or a CRC mismatch in the
     * trailer), never hand back wrong pixels. */
    uint8_t data[4000];
    uint32_t dims[3] = {10, 20, 20};
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)((i * 2654435761u) >> 13);
    tu_write_idx(path, true, IMG_MAGIC, dims, 3, data, sizeof(data));
    size_t len;
    uint8_t *raw = tu_read_file(path, &len);
    for (size_t i = len / 2; i < len / 2 + 8; i++)
        raw[i] ^= 0x5a;
    tu_write_file(path, raw, len);
    free(raw);
    expect_error(-EBADMSG, "bad gzip stream");
}

DL_TEST(dataset_count_mismatch)
{
    uint8_t px[4 * 9] = {0}, labels[3] = {0, 1, 2};
    uint32_t idims[3] = {4, 3, 3}, ldims[1] = {3};
    char p[4096];
    snprintf(p, sizeof(p), "%s/train-images-idx3-ubyte.gz", dir);
    tu_write_idx(p, true, IMG_MAGIC, idims, 3, px, sizeof(px));
    snprintf(p, sizeof(p), "%s/train-labels-idx1-ubyte.gz", dir);
    tu_write_idx(p, true, LAB_MAGIC, ldims, 1, labels, sizeof(labels));

    dl_train_dataset_t ds = {0};
    DL_CHECK_ERRNO(dl_train_dataset_load(&ds, dir, "train", err, sizeof(err)), -EBADMSG);
    ck_assert_ptr_null(ds.pixels);
    ck_assert_msg(strstr(err, "3 labels") && strstr(err, "4 images") && strstr(err, p), "%s", err);
}

DL_TEST(dataset_gather_normalizes)
{
    uint8_t px[3 * 4] = {0, 255, 51, 102, 1, 2, 3, 4, 255, 0, 0, 255}, labels[3] = {7, 2, 9};
    uint32_t idims[3] = {3, 2, 2}, ldims[1] = {3};
    char p[4096];
    snprintf(p, sizeof(p), "%s/t10k-images-idx3-ubyte", dir); /* plain, no .gz */
    tu_write_idx(p, false, IMG_MAGIC, idims, 3, px, sizeof(px));
    snprintf(p, sizeof(p), "%s/t10k-labels-idx1-ubyte.gz", dir);
    tu_write_idx(p, true, LAB_MAGIC, ldims, 1, labels, sizeof(labels));

    dl_train_dataset_t ds = {0};
    DL_CHECK_ERRNO(dl_train_dataset_load(&ds, dir, "t10k", err, sizeof(err)), 0);
    ck_assert_uint_eq(ds.n, 3);
    ck_assert_uint_eq(ds.dim, 4);
    ck_assert_uint_eq(ds.n_classes, 10);

    uint32_t idx[2] = {2, 0};
    float x[8];
    uint8_t y[2];
    dl_train_dataset_gather(&ds, idx, 2, x, y);
    ck_assert_uint_eq(y[0], 9);
    ck_assert_uint_eq(y[1], 7);
    ck_assert_float_eq(x[0], 1.0f);
    ck_assert_float_eq(x[1], 0.0f);
    ck_assert_float_eq(x[4], 0.0f);
    ck_assert_float_eq_tol(x[6], 0.2f, 1e-7f);
    ck_assert_float_eq_tol(x[7], 0.4f, 1e-7f);
    dl_train_dataset_free(&ds);
    dl_train_dataset_free(NULL);
}

DL_TEST_SUITE(.setup = setup, .teardown = teardown);
