/* Hostlist expansion: against what the real `scontrol show hostnames` printed for a corpus of
 * forms (hostlist-corpus.txt), and the errors and limits that Slurm does not share. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "slurm.h"

static char err[512];

/* Expands list, which must succeed, and returns the names joined by spaces (static buffer). */
static const char *joined(const char *list)
{
    static char out[8192];
    char **hosts;
    size_t n, len = 0;
    int r = dl_hostlist_expand(list, &hosts, &n, err, sizeof(err));

    ck_assert_msg(r == 0, "'%s' failed: %d %s", list, r, err);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        ck_assert_ptr_nonnull(hosts[i]);
        len += (size_t)snprintf(out + len, sizeof(out) - len, "%s%s", i ? " " : "", hosts[i]);
        ck_assert_uint_lt(len, sizeof(out));
    }
    ck_assert_ptr_null(hosts[n]);
    dl_hostlist_free(hosts);
    return out;
}

/* Expands list, which must fail with code, and returns the message. */
static const char *failure(const char *list, int code)
{
    char **hosts = (char **)&err; /* any value: it must come back untouched */
    char **before = hosts;
    size_t n = 77;
    int r = dl_hostlist_expand(list, &hosts, &n, err, sizeof(err));

    ck_assert_msg(r == code, "'%s': expected %d, got %d (%s)", list, code, r, r ? err : "");
    ck_assert_ptr_eq(hosts, before);
    ck_assert_uint_eq(n, 77);
    return err;
}

/* ---- the scontrol corpus */

static char *unescape(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;

    ck_assert_ptr_nonnull(out);
    for (; *s; s++) {
        if (*s != '\\') {
            *o++ = *s;
            continue;
        }
        s++;
        ck_assert_msg(*s == 't' || *s == 'n' || *s == '\\', "bad escape in corpus");
        *o++ = *s == 't' ? '\t' : *s == 'n' ? '\n' : '\\';
    }
    *o = '\0';
    return out;
}

static uint64_t fnv1a64(char **hosts, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    for (size_t i = 0; i < n; i++) {
        for (const unsigned char *p = (const unsigned char *)hosts[i]; *p; p++)
            h = (h ^ *p) * 0x100000001b3ULL;
        h = (h ^ '\n') * 0x100000001b3ULL;
    }
    return h;
}

typedef struct {
    char *list;
    int strict, invalid;
    char **hosts; /* expected, when listed */
    size_t nhosts;
    unsigned long long count, hash; /* expected, when hashed */
    int hashed;
} entry_t;

static void entry_reset(entry_t *e)
{
    free(e->list);
    for (size_t i = 0; i < e->nhosts; i++)
        free(e->hosts[i]);
    free(e->hosts);
    memset(e, 0, sizeof(*e));
}

/* Our expansion of e->list must be what scontrol printed; forms that scontrol rejects, or that it
 * repairs ("strict"), must be errors that name the list. */
static void check_entry(const entry_t *e)
{
    char **hosts;
    size_t n, counted;
    int r = dl_hostlist_expand(e->list, &hosts, &n, err, sizeof(err));

    if (e->invalid || e->strict) {
        ck_assert_msg(r < 0, "'%s': scontrol %s it, we accepted it", e->list,
                      e->invalid ? "rejects" : "repairs");
        ck_assert_msg(strncmp(err, "hostlist '", 10) == 0 && strstr(err, " at offset ") != NULL,
                      "'%s': message '%s'", e->list, err);
        ck_assert_int_eq(dl_hostlist_count(e->list, &counted, err, sizeof(err)), r);
        return;
    }
    ck_assert_msg(r == 0, "'%s': %s", e->list, err);
    DL_CHECK_ERRNO(dl_hostlist_count(e->list, &counted, err, sizeof(err)), 0);
    ck_assert_uint_eq(counted, n);
    if (e->hashed) {
        ck_assert_msg(n == e->count, "'%s': %zu hosts, scontrol %llu", e->list, n, e->count);
        ck_assert_msg(fnv1a64(hosts, n) == e->hash, "'%s': names differ from scontrol's", e->list);
    } else {
        ck_assert_msg(n == e->nhosts, "'%s': %zu hosts, scontrol %zu", e->list, n, e->nhosts);
        for (size_t i = 0; i < n; i++)
            if (strcmp(hosts[i], e->hosts[i]) != 0)
                ck_abort_msg("'%s' host %zu: '%s', scontrol '%s'", e->list, i, hosts[i],
                             e->hosts[i]);
    }
    ck_assert_ptr_null(hosts[n]);
    dl_hostlist_free(hosts);
}

DL_TEST(corpus_matches_scontrol)
{
    const char *root = getenv("SOURCE_ROOT");
    char path[4096], line[8192];
    entry_t e = {0};
    int entries = 0, expanded = 0;
    FILE *f;

    ck_assert_msg(root != NULL, "SOURCE_ROOT is not set");
    snprintf(path, sizeof(path), "%s/tests/config/hostlist-corpus.txt", root);
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#')
            continue;
        if (strncmp(line, "list ", 5) == 0 || strcmp(line, "list") == 0) {
            entry_reset(&e);
            e.list = unescape(line[4] ? line + 5 : "");
        } else if (strcmp(line, "strict") == 0) {
            e.strict = 1;
        } else if (strcmp(line, "invalid") == 0) {
            e.invalid = 1;
        } else if (strncmp(line, "host ", 5) == 0) {
            e.hosts = realloc(e.hosts, (e.nhosts + 1) * sizeof(char *));
            ck_assert_ptr_nonnull(e.hosts);
            e.hosts[e.nhosts++] = unescape(line + 5);
        } else if (sscanf(line, "count %llu %llx", &e.count, &e.hash) == 2) {
            e.hashed = 1;
        } else if (strcmp(line, "end") == 0) {
            ck_assert_ptr_nonnull(e.list);
            check_entry(&e);
            entries++;
            expanded += !e.invalid && !e.strict;
        } else {
            ck_abort_msg("corpus line '%s' not understood", line);
        }
    }
    fclose(f);
    entry_reset(&e);
    /* The corpus must not shrink unnoticed. */
    ck_assert_int_ge(entries, 80);
    ck_assert_int_ge(expanded, 45);
}

/* ---- the forms the issue names, spelt out */

DL_TEST(basic_forms)
{
    ck_assert_str_eq(joined("node[01-04,07]"), "node01 node02 node03 node04 node07");
    ck_assert_str_eq(joined("n1,n[3-5],x"), "n1 n3 n4 n5 x");
    ck_assert_str_eq(joined("login1"), "login1");
    ck_assert_str_eq(joined("rack1-node[001-003]"), "rack1-node001 rack1-node002 rack1-node003");
    ck_assert_str_eq(joined(""), "");
    ck_assert_str_eq(joined(" , ,"), "");
}

DL_TEST(padding_is_the_width_of_the_lower_bound)
{
    ck_assert_str_eq(joined("n[9-11]"), "n9 n10 n11");
    ck_assert_str_eq(joined("n[09-11]"), "n09 n10 n11");
    ck_assert_str_eq(joined("n[1-010]"), "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
    ck_assert_str_eq(joined("n[098-101]"), "n098 n099 n100 n101");
    ck_assert_str_eq(joined("n[1,01,001]"), "n1 n01 n001");
}

DL_TEST(several_groups_in_slurm_order)
{
    ck_assert_str_eq(joined("a[1-2]b[3-4]"), "a1b3 a1b4 a2b3 a2b4");
    /* Slurm loops the second-to-last group slowest, then leftwards, the last group fastest. */
    ck_assert_str_eq(joined("a[1-2]b[3-4]c[5-6]"),
                     "a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 a1b4c6 a2b4c5 a2b4c6");
    ck_assert_str_eq(joined("n[1-2][7]"), "n17 n27");
}

DL_TEST(separators_outside_brackets_only)
{
    ck_assert_str_eq(joined("a b\tc\nd,e"), "a b c d e");
    ck_assert_str_eq(joined("n[1,3],m[2]"), "n1 n3 m2");
    ck_assert_str_eq(joined("a;b"), "a;b");
    ck_assert_str_eq(joined("n[1-2],n1"), "n1 n2 n1");
}

/* ---- errors */

DL_TEST(errors_name_the_list_and_the_offset)
{
    static const struct {
        const char *list;
        int code;
        const char *message;
    } cases[] = {
        {"node[5-3]", -EINVAL, "hostlist 'node[5-3]': range '5-3' runs backwards at offset 5"},
        {"node[1-3", -EINVAL, "hostlist 'node[1-3': '[' is never closed at offset 4"},
        {"node1]", -EINVAL, "hostlist 'node1]': ']' without '[' at offset 5"},
        {"node[]", -EINVAL, "hostlist 'node[]': empty range at offset 5"},
        {"n[1,]", -EINVAL, "hostlist 'n[1,]': empty range at offset 4"},
        {"n[a-b]", -EINVAL, "hostlist 'n[a-b]': 'a' where a digit was expected at offset 2"},
        {"n[1-b]", -EINVAL, "hostlist 'n[1-b]': 'b' where a digit was expected at offset 4"},
        {"n[1x2]", -EINVAL,
         "hostlist 'n[1x2]': 'x' where ',', '-' or ']' was expected at offset 3"},
        {"node[[1]]", -EINVAL, "hostlist 'node[[1]]': '[' inside brackets at offset 5"},
        {"n[1-2]-ib", -EINVAL,
         "hostlist 'n[1-2]-ib': text after the last ']' (Slurm allows none) at offset 6"},
        {"a,b,n[1-]", -EINVAL, "hostlist 'a,b,n[1-]': range '1-' has no upper bound at offset 6"},
        {"n[ 1]", -EINVAL, "hostlist 'n[ 1]': whitespace inside brackets at offset 2"},
        {"n[\x01]", -EINVAL,
         "hostlist 'n[?]': control character 0x01 where a digit was expected at offset 2"},
        {"n[99999999999999999999]", -ERANGE,
         "hostlist 'n[99999999999999999999]': number '99999999999999999999' is too large at "
         "offset 2"},
        {"x,n[0-65536]", -E2BIG,
         "hostlist 'x,n[0-65536]': range '0-65536' has more than 65536 hosts at offset 4"},
        {"a[0-999]b[0-1000]", -E2BIG,
         "hostlist 'a[0-999]b[0-1000]': more than 1000000 hosts at offset 0"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_str_eq(failure(cases[i].list, cases[i].code), cases[i].message);
}

DL_TEST(long_lists_are_shortened_in_messages)
{
    char list[300];

    memset(list, 'a', 200);
    strcpy(list + 200, "[1-]");
    const char *m = failure(list, -EINVAL);
    ck_assert_msg(strstr(m, "aaaa...': range '1-' has no upper bound at offset 201") != NULL, "%s",
                  m);
    ck_assert_uint_lt(strlen(m), 160);
}

DL_TEST(small_or_missing_error_buffers)
{
    char small[12];
    char **hosts;
    size_t n;

    DL_CHECK_ERRNO(dl_hostlist_expand("n[5-3]", &hosts, &n, small, sizeof(small)), -EINVAL);
    ck_assert_str_eq(small, "hostlist 'n");
    DL_CHECK_ERRNO(dl_hostlist_expand("n[5-3]", &hosts, &n, NULL, 0), -EINVAL);
    DL_CHECK_ERRNO(dl_hostlist_expand(NULL, &hosts, &n, err, sizeof(err)), -EINVAL);
    DL_CHECK_ERRNO(dl_hostlist_count(NULL, &n, err, sizeof(err)), -EINVAL);
    dl_hostlist_free(NULL);
}

/* ---- limits */

DL_TEST(host_count_limit_over_the_whole_list)
{
    char list[512] = "";
    size_t n;

    /* 15 full ranges are 983,040 hosts: allowed; the 16th goes past 1,000,000. */
    for (int i = 0; i < 15; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%sg%d[0-65535]", i ? "," : "",
                 i);
    DL_CHECK_ERRNO(dl_hostlist_count(list, &n, err, sizeof(err)), 0);
    ck_assert_uint_eq(n, 15 * 65536);
    size_t off = strlen(list) + 1;
    strcat(list, ",z[0-65535]");
    DL_CHECK_ERRNO(dl_hostlist_count(list, &n, err, sizeof(err)), -E2BIG);
    char want[64];
    snprintf(want, sizeof(want), "more than 1000000 hosts at offset %zu", off);
    ck_assert_msg(strstr(err, want) != NULL, "%s", err);
}

DL_TEST(a_million_hosts_expand)
{
    char **hosts;
    size_t n;

    DL_CHECK_ERRNO(dl_hostlist_expand("a[0-999]b[0-999]", &hosts, &n, err, sizeof(err)), 0);
    ck_assert_uint_eq(n, 1000000);
    ck_assert_str_eq(hosts[0], "a0b0");
    ck_assert_str_eq(hosts[1000], "a1b0");
    ck_assert_str_eq(hosts[n - 1], "a999b999");
    ck_assert_ptr_null(hosts[n]);
    dl_hostlist_free(hosts);
}

DL_TEST(name_length_limit)
{
    char list[400];

    memset(list, 'x', 255);
    list[255] = '\0';
    ck_assert_uint_eq(strlen(joined(list)), 255);

    memset(list, 'x', 256);
    list[256] = '\0';
    const char *m = failure(list, -ENAMETOOLONG);
    ck_assert_msg(strstr(m, "...': host name of 256 characters (limit 255) at offset 0") != NULL,
                  "%s", m);

    /* The longest name of a range counts, not the first. */
    memset(list, 'x', 253);
    strcpy(list + 253, "[1-99]");
    DL_CHECK_ERRNO(dl_hostlist_count(list, &(size_t){0}, err, sizeof(err)), 0);
    strcpy(list + 253, "[1-100]");
    failure(list, -ENAMETOOLONG);
    /* So do leading zeros. */
    strcpy(list + 253, "[001]");
    failure(list, -ENAMETOOLONG);
}

DL_TEST(byte_limit)
{
    char list[200];

    /* 1,000,000 names of 107 characters: over 64 MiB. */
    memset(list, 'x', 100);
    strcpy(list + 100, "[0-999]y[0-999]");
    const char *m = failure(list, -E2BIG);
    ck_assert_msg(strstr(m, "more than 67108864 bytes of host names at offset 0") != NULL, "%s", m);
}

DL_TEST(largest_numbers)
{
    ck_assert_str_eq(joined("n[18446744073709551614-18446744073709551615]"),
                     "n18446744073709551614 n18446744073709551615");
    ck_assert_str_eq(joined("n[9999999999999999999-10000000000000000000]"),
                     "n9999999999999999999 n10000000000000000000");
    failure("n[18446744073709551616]", -ERANGE);
}

DL_TEST_SUITE(.timeout = 30);
