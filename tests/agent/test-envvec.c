/* The name index under a worker's environment: one entry a name, a later one replacing an
 * earlier in its place, the order of first appearance kept, across the index's rebuilds. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "envvec.h"

static void drop(dl_envvec_t *ev)
{
    dl_envvec_drop_index(ev);
    for (size_t i = 0; i < ev->len; i++)
        free(ev->v[i]);
    free(ev->v);
}

static long find(const dl_envvec_t *ev, const char *name)
{
    return dl_envvec_find(ev, name, strlen(name));
}

DL_TEST(a_name_is_what_comes_before_the_first_equals_sign)
{
    dl_envvec_t ev = {0};
    ck_assert_int_eq(find(&ev, "A"), -1); /* nothing put yet */
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("A=1")), 0);
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("AB=2")), 0);
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("B=x=y")), 0);
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("BARE")), 0); /* no '=': all of it names it */
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("=odd")), 0); /* an empty name is one too */
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("A=3")), 0);  /* replaces A=1 where it was */
    DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup("BARE=now")), 0);
    ck_assert_uint_eq(ev.len, 5);
    ck_assert_str_eq(ev.v[0], "A=3");
    ck_assert_str_eq(ev.v[1], "AB=2");
    ck_assert_str_eq(ev.v[2], "B=x=y");
    ck_assert_str_eq(ev.v[3], "BARE=now");
    ck_assert_str_eq(ev.v[4], "=odd");
    ck_assert_ptr_null(ev.v[5]);
    ck_assert_int_eq(find(&ev, "AB"), 1);
    ck_assert_int_eq(find(&ev, "B"), 2);
    ck_assert_int_eq(find(&ev, ""), 4);
    ck_assert_int_eq(find(&ev, "B=x"), -1);
    ck_assert_int_eq(find(&ev, "ABC"), -1);
    DL_CHECK_ERRNO(dl_envvec_put(&ev, NULL), -ENOMEM); /* a failed strdup is told */
    drop(&ev);
}

/* Thousands of names, put twice in another order, against a plain list of what was put. */
DL_TEST(many_names_across_rebuilds_match_a_linear_scan)
{
    enum { N = 3000 };
    dl_envvec_t ev = {0};
    char entry[64];
    for (int i = 0; i < N; i++) {
        snprintf(entry, sizeof(entry), "V%d=%d", i * 7919 % N, i);
        DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup(entry)), 0);
    }
    for (int i = N - 1; i >= 0; i -= 2) {
        snprintf(entry, sizeof(entry), "V%d=again", i);
        DL_CHECK_ERRNO(dl_envvec_put(&ev, strdup(entry)), 0);
    }
    ck_assert_uint_eq(ev.len, N);
    ck_assert_ptr_null(ev.v[N]);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "V%d", i);
        size_t n = strlen(name);
        long scan = -1;
        for (size_t j = 0; j < ev.len; j++)
            if (strncmp(ev.v[j], name, n) == 0 && ev.v[j][n] == '=')
                scan = scan < 0 ? (long)j : -2; /* -2: two entries for one name */
        ck_assert_int_ge(scan, 0);
        ck_assert_int_eq(find(&ev, name), scan);
        /* The odd names were put again, in their first place. */
        if (i % 2 == 1)
            ck_assert_str_eq(ev.v[scan] + n + 1, "again");
        else
            ck_assert_str_ne(ev.v[scan] + n + 1, "again");
    }
    snprintf(entry, sizeof(entry), "V%d=", 7919 % N);
    ck_assert_int_eq(strncmp(ev.v[1], entry, strlen(entry)), 0); /* order of first puts */
    drop(&ev);
}
