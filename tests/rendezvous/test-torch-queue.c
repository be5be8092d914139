/* The torch store's FIFO queues (torch-queue.h): order, lengths, empty strings, the caps in
 * items and bytes, and a clear that leaves nothing behind. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"
#include "torch-queue.h"

static void pop_is(dl__tqueues_t *q, const char *name, const char *want)
{
    uint8_t *v = NULL;
    size_t len = 99;
    ck_assert_int_eq(dl__tqueues_pop(q, name, strlen(name), &v, &len), 1);
    ck_assert_uint_eq(len, strlen(want));
    if (len > 0)
        ck_assert(memcmp(v, want, len) == 0);
    else
        ck_assert_ptr_null(v);
    free(v);
}

DL_TEST(items_come_out_in_the_order_they_went_in_per_queue)
{
    dl__tqueues_t *q = dl__tqueues_new(100, 1000);
    ck_assert_ptr_nonnull(q);
    DL_CHECK_ERRNO(dl__tqueues_push(q, "a", 1, "one", 3), 0);
    DL_CHECK_ERRNO(dl__tqueues_push(q, "b", 1, "x", 1), 0);
    DL_CHECK_ERRNO(dl__tqueues_push(q, "a", 1, "", 0), 0);
    DL_CHECK_ERRNO(dl__tqueues_push(q, "a", 1, "three", 5), 0);
    ck_assert_uint_eq(dl__tqueues_len(q, "a", 1), 3);
    ck_assert_uint_eq(dl__tqueues_len(q, "b", 1), 1);
    ck_assert_uint_eq(dl__tqueues_len(q, "c", 1), 0);
    pop_is(q, "a", "one");
    pop_is(q, "a", "");
    pop_is(q, "b", "x");
    pop_is(q, "a", "three");
    uint8_t *v;
    size_t len;
    DL_CHECK_ERRNO(dl__tqueues_pop(q, "a", 1, &v, &len), 0);
    DL_CHECK_ERRNO(dl__tqueues_pop(q, "zz", 2, &v, &len), 0);
    size_t items, bytes;
    dl__tqueues_usage(q, &items, &bytes);
    ck_assert_uint_eq(items, 0);
    ck_assert_uint_eq(bytes, 0);
    dl__tqueues_free(q);
}

DL_TEST(caps_refuse_a_push_and_change_nothing)
{
    /* 3 items, 10 bytes: a queue's name counts once, its values each time. */
    dl__tqueues_t *q = dl__tqueues_new(3, 10);
    ck_assert_int_eq(dl__tqueues_push(q, "qq", 2, "abcd", 4), 0); /* 6 bytes */
    DL_CHECK_ERRNO(dl__tqueues_push(q, "qq", 2, "abcde", 5), -ENOSPC);
    ck_assert_int_eq(dl__tqueues_push(q, "qq", 2, "abcd", 4), 0);  /* 10 bytes */
    ck_assert_int_eq(dl__tqueues_push(q, "r", 1, "", 0), -ENOSPC); /* its name: 11 */
    ck_assert_int_eq(dl__tqueues_push(q, "qq", 2, "", 0), 0);      /* 3 items */
    DL_CHECK_ERRNO(dl__tqueues_push(q, "qq", 2, "", 0), -ENOSPC);
    ck_assert_uint_eq(dl__tqueues_len(q, "qq", 2), 3);
    pop_is(q, "qq", "abcd");
    DL_CHECK_ERRNO(dl__tqueues_push(q, "qq", 2, "wxyz", 4), 0);
    size_t items, bytes;
    dl__tqueues_usage(q, &items, &bytes);
    ck_assert_uint_eq(items, 3);
    ck_assert_uint_eq(bytes, 10);
    dl__tqueues_free(q);
}

DL_TEST(clear_drops_every_queue)
{
    dl__tqueues_t *q = dl__tqueues_new(100000, 1 << 24);
    char name[16];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(name, sizeof(name), "q%d", i % 1500);
        DL_CHECK_ERRNO(dl__tqueues_push(q, name, (size_t)n, name, (size_t)n), 0);
    }
    ck_assert_uint_eq(dl__tqueues_len(q, "q7", 2), 4); /* 7, 1507, 3007, 4507 */
    dl__tqueues_clear(q);
    ck_assert_uint_eq(dl__tqueues_len(q, "q7", 2), 0);
    size_t items, bytes;
    dl__tqueues_usage(q, &items, &bytes);
    ck_assert_uint_eq(items + bytes, 0);
    DL_CHECK_ERRNO(dl__tqueues_push(q, "q7", 2, "again", 5), 0);
    pop_is(q, "q7", "again");
    dl__tqueues_free(q);
    dl__tqueues_free(NULL);
}
