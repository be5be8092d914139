/* PyTorch's TCPStore framing (torch-codec.h): the bytes torch 1.13's client sends (captured from
 * Debian's python3-torch), the validated dialect of newer clients, cut at every byte, and what
 * must be refused. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"
#include "torch-codec.h"

static const dl_torch_limits_t lim = {
    .max_key_len = 16, .max_value_len = 32, .max_keys = 4, .max_query_len = 1024};

/* Appends a u64 little-endian length and the bytes. */
static size_t str(uint8_t *p, size_t at, const char *s, size_t n)
{
    for (int i = 0; i < 8; i++)
        p[at + i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(p + at + 8, s, n);
    return at + 8 + n;
}

/* Every prefix of a whole query asks for more, and the whole takes exactly its length. */
static void whole_only(const uint8_t *q, size_t n, dl_torch_dialect_t d, dl_torch_query_t *ret)
{
    char err[128];
    for (size_t cut = 0; cut < n; cut++) {
        dl_torch_dialect_t dd = d;
        DL_CHECK_ERRNO(dl_torch_parse(q, cut, &dd, &lim, ret, err, sizeof(err)), 0);
    }
    ck_assert_int_eq(dl_torch_parse(q, n, &d, &lim, ret, err, sizeof(err)), (int)n);
}

DL_TEST(torch_113_set_and_add_as_captured)
{
    /* What torch 1.13's TCPStore sent for set("ab", "xyz") and add("c", 5): it puts "/" in
     * front of every key and sends no handshake. */
    static const uint8_t wire[] = {0x00, 3, 0, 0, 0,   0,   0,   0,   0,   '/',  'a', 'b', 3, 0,
                                   0,    0, 0, 0, 0,   0,   'x', 'y', 'z', 0x03, 2,   0,   0, 0,
                                   0,    0, 0, 0, '/', 'c', 5,   0,   0,   0,    0,   0,   0, 0};
    dl_torch_dialect_t d = DL_TORCH_DIALECT_UNKNOWN;
    dl_torch_query_t q;
    char err[128];
    int n = dl_torch_parse(wire, sizeof(wire), &d, &lim, &q, err, sizeof(err));
    ck_assert_int_eq(n, 23);
    ck_assert_int_eq(d, DL_TORCH_DIALECT_V1);
    ck_assert_int_eq(q.op, DL_TORCH_Q_SET);
    ck_assert_uint_eq(q.key.len, 3);
    ck_assert(memcmp(q.key.data, "/ab", 3) == 0);
    ck_assert_uint_eq(q.value.len, 3);
    ck_assert(memcmp(q.value.data, "xyz", 3) == 0);
    ck_assert_int_eq(dl_torch_parse(wire + n, sizeof(wire) - n, &d, &lim, &q, err, sizeof(err)),
                     (int)sizeof(wire) - n);
    ck_assert_int_eq(q.op, DL_TORCH_Q_ADD);
    ck_assert_int_eq(q.delta, 5);
    whole_only(wire, 23, DL_TORCH_DIALECT_UNKNOWN, &q);
}

DL_TEST(v1_numbering)
{
    static const struct {
        uint8_t type;
        dl_torch_op_t op;
    } table[] = {{1, DL_TORCH_Q_COMPARE_SET}, {2, DL_TORCH_Q_GET},        {4, DL_TORCH_Q_CHECK},
                 {5, DL_TORCH_Q_WAIT},        {6, DL_TORCH_Q_GETNUMKEYS}, {7, DL_TORCH_Q_WATCH_KEY},
                 {8, DL_TORCH_Q_DELETE_KEY},  {9, DL_TORCH_Q_APPEND}};
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        uint8_t q[128] = {table[i].type};
        size_t n = 1;
        switch (table[i].op) {
        case DL_TORCH_Q_COMPARE_SET: n = str(q, str(q, str(q, 1, "k", 1), "a", 1), "b", 1); break;
        case DL_TORCH_Q_CHECK:
        case DL_TORCH_Q_WAIT:
            q[1] = 2;
            memset(q + 2, 0, 7);
            n = str(q, str(q, 9, "k1", 2), "k2", 2);
            break;
        case DL_TORCH_Q_APPEND: n = str(q, str(q, 1, "k", 1), "v", 1); break;
        case DL_TORCH_Q_GETNUMKEYS: break;
        default: n = str(q, 1, "k", 1);
        }
        dl_torch_query_t got;
        whole_only(q, n, DL_TORCH_DIALECT_V1, &got);
        ck_assert_int_eq(got.op, table[i].op);
        if (table[i].op == DL_TORCH_Q_WAIT) {
            size_t pos = 0;
            dl_torch_bytes_t k;
            ck_assert(dl_torch_items_next(&got, &pos, &k, NULL));
            ck_assert(k.len == 2 && memcmp(k.data, "k1", 2) == 0);
            ck_assert(dl_torch_items_next(&got, &pos, &k, NULL));
            ck_assert(k.len == 2 && memcmp(k.data, "k2", 2) == 0);
            ck_assert(!dl_torch_items_next(&got, &pos, &k, NULL));
        }
    }
    /* GETNUMKEYS alone is a whole first query: it must not wait for a handshake's bytes. */
    dl_torch_dialect_t d = DL_TORCH_DIALECT_UNKNOWN;
    dl_torch_query_t got;
    ck_assert_int_eq(dl_torch_parse((const uint8_t *)"\x06", 1, &d, &lim, &got, NULL, 0), 1);
    ck_assert_int_eq(got.op, DL_TORCH_Q_GETNUMKEYS);
}

DL_TEST(v2_validates_first_then_numbers_one_higher)
{
    uint8_t q[256] = {0, 0xCE, 0xF7, 0x85, 0x3C};
    dl_torch_dialect_t d = DL_TORCH_DIALECT_UNKNOWN;
    dl_torch_query_t got;
    char err[128];
    for (size_t cut = 0; cut < 5; cut++) {
        dl_torch_dialect_t dd = d;
        DL_CHECK_ERRNO(dl_torch_parse(q, cut, &dd, &lim, &got, err, sizeof(err)), 0);
    }
    ck_assert_int_eq(dl_torch_parse(q, 5, &d, &lim, &got, err, sizeof(err)), 5);
    ck_assert_int_eq(d, DL_TORCH_DIALECT_V2);
    ck_assert_int_eq(got.op, DL_TORCH_Q_VALIDATE);
    /* SET is 1 here; 0 again is a second validation, refused. */
    q[0] = 1;
    size_t n = str(q, str(q, 1, "k", 1), "v", 1);
    whole_only(q, n, d, &got);
    ck_assert_int_eq(got.op, DL_TORCH_Q_SET);
    static const uint8_t again[] = {0, 0xCE, 0xF7, 0x85, 0x3C};
    DL_CHECK_ERRNO(dl_torch_parse(again, 5, &d, &lim, &got, err, sizeof(err)), -EPROTO);
    ck_assert_str_eq(err, "validation repeated after the first query");
    /* MULTI_SET: pairs. */
    q[0] = 11;
    q[1] = 2;
    memset(q + 2, 0, 7);
    n = str(q, str(q, str(q, str(q, 9, "a", 1), "1", 1), "b", 1), "22", 2);
    whole_only(q, n, d, &got);
    size_t pos = 0;
    dl_torch_bytes_t k, v;
    ck_assert(dl_torch_items_next(&got, &pos, &k, &v));
    ck_assert(k.len == 1 && k.data[0] == 'a' && v.len == 1 && v.data[0] == '1');
    ck_assert(dl_torch_items_next(&got, &pos, &k, &v));
    ck_assert(k.len == 1 && k.data[0] == 'b' && v.len == 2);
    ck_assert(!dl_torch_items_next(&got, &pos, &k, &v));
    /* PING carries a u32. */
    static const uint8_t ping[] = {13, 1, 2, 3, 4};
    whole_only(ping, sizeof(ping), d, &got);
    ck_assert_uint_eq(got.nonce, 0x04030201u);
    ck_assert_str_eq(dl_torch_op_name(DL_TORCH_Q_CANCEL_WAIT), "cancel_wait");
}

DL_TEST(bad_queries_are_refused_before_their_bytes_arrive)
{
    dl_torch_dialect_t d = DL_TORCH_DIALECT_V1;
    dl_torch_query_t got;
    char err[128];
    uint8_t q[64] = {0};
    /* A key longer than the limit: refused at its length, the 16 bytes never needed. */
    q[0] = 2;
    q[1] = 17;
    DL_CHECK_ERRNO(dl_torch_parse(q, 9, &d, &lim, &got, err, sizeof(err)), -EMSGSIZE);
    ck_assert_str_eq(err, "key of 17 bytes is outside 1..16");
    q[1] = 0;
    DL_CHECK_ERRNO(dl_torch_parse(q, 9, &d, &lim, &got, err, sizeof(err)), -EMSGSIZE);
    /* A value over the limit, a list too long or empty. */
    q[0] = 0;
    size_t n = str(q, 1, "k", 1);
    q[n] = 33;
    DL_CHECK_ERRNO(dl_torch_parse(q, n + 8, &d, &lim, &got, err, sizeof(err)), -EMSGSIZE);
    ck_assert_str_eq(err, "value of 33 bytes is outside 0..32");
    memset(q, 0, sizeof(q));
    q[0] = 5;
    q[1] = 5;
    DL_CHECK_ERRNO(dl_torch_parse(q, 9, &d, &lim, &got, err, sizeof(err)), -EMSGSIZE);
    q[1] = 0;
    DL_CHECK_ERRNO(dl_torch_parse(q, 9, &d, &lim, &got, err, sizeof(err)), -EMSGSIZE);
    /* Types neither dialect has. */
    q[0] = 10;
    DL_CHECK_ERRNO(dl_torch_parse(q, 1, &d, &lim, &got, err, sizeof(err)), -EPROTO);
    ck_assert_str_eq(err, "unknown query type 10 (torch <= 2.0 numbering)");
    d = DL_TORCH_DIALECT_V2;
    q[0] = 17;
    DL_CHECK_ERRNO(dl_torch_parse(q, 1, &d, &lim, &got, err, sizeof(err)), -EPROTO);
    q[0] = 0;
    q[1] = 1;
    DL_CHECK_ERRNO(dl_torch_parse(q, 5, &d, &lim, &got, err, sizeof(err)), -EPROTO);
    ck_assert_str_eq(err, "validation with a wrong magic after the first query");
}

DL_TEST(encoders_write_little_endian_and_refuse_overflow)
{
    uint8_t out[20];
    size_t len = 0;
    DL_CHECK_ERRNO(dl_torch_put_u8(out, sizeof(out), &len, 1), 0);
    DL_CHECK_ERRNO(dl_torch_put_i64(out, sizeof(out), &len, -2), 0);
    DL_CHECK_ERRNO(dl_torch_put_u32(out, sizeof(out), &len, 0x01020304), 0);
    ck_assert_uint_eq(len, 13);
    static const uint8_t want[] = {1, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 4, 3, 2, 1};
    ck_assert(memcmp(out, want, sizeof(want)) == 0);
    DL_CHECK_ERRNO(dl_torch_put_bytes(out, sizeof(out), &len, "ab", 2), -ENOBUFS);
    ck_assert_uint_eq(len, 13);
    len = 0;
    DL_CHECK_ERRNO(dl_torch_put_bytes(out, sizeof(out), &len, "ab", 2), 0);
    ck_assert_uint_eq(len, DL_TORCH_BYTES_SIZE(2));
    ck_assert(out[0] == 2 && out[8] == 'a' && out[9] == 'b');
}
