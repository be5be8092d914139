/* The real Fashion-MNIST files (Debian's dataset-fashion-mnist). Skipped (exit 77) when they are
 * not installed. */
#include <stdio.h>
#include <stdlib.h>

#include "dl-test.h"
#include "trainer.h"
#include "util.h"

DL_TEST(train_and_test_splits)
{
    const char *dir = tu_fashion_dir();
    char err[DL_TRAIN_ERRLEN];
    dl_train_dataset_t train = {0}, test = {0};

    ck_assert_msg(dl_train_dataset_load(&train, dir, "train", err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(dl_train_dataset_load(&test, dir, "t10k", err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(train.n, 60000);
    ck_assert_uint_eq(train.rows, 28);
    ck_assert_uint_eq(train.cols, 28);
    ck_assert_uint_eq(test.n, 10000);
    ck_assert_uint_eq(test.dim, 784);
    ck_assert_uint_eq(train.n_classes, 10);
    ck_assert_uint_eq(test.n_classes, 10);

    /* Both splits are balanced: 6000 and 1000 of each class. */
    size_t tr[10] = {0}, te[10] = {0};
    for (size_t i = 0; i < train.n; i++)
        tr[train.labels[i]]++;
    for (size_t i = 0; i < test.n; i++)
        te[test.labels[i]]++;
    for (int c = 0; c < 10; c++) {
        ck_assert_uint_eq(tr[c], 6000);
        ck_assert_uint_eq(te[c], 1000);
    }
    /* Real images, not a blank payload: pixels use the whole range. */
    unsigned lo = 255, hi = 0;
    for (size_t i = 0; i < 784 * 100; i++) {
        lo = train.pixels[i] < lo ? train.pixels[i] : lo;
        hi = train.pixels[i] > hi ? train.pixels[i] : hi;
    }
    ck_assert_uint_eq(lo, 0);
    ck_assert_uint_eq(hi, 255);
    dl_train_dataset_free(&train);
    dl_train_dataset_free(&test);
}

/* The data set is a system package; without it the test says so and skips. */
static int need_fashion_mnist(int argc, char **argv)
{
    if (tu_fashion_dir() == NULL) {
        fprintf(stderr, "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        return 77;
    }
    return 0;
}

DL_TEST_SUITE(.init = need_fashion_mnist);
