/* The record kinds of protobuf's JSON form (record.h): 64-bit numbers as decimal strings and
 * bytes as base64, as etcd's gateway answers, read into C fields and written back the same way;
 * a value of neither form is one line naming the field. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "record-rows.h"

typedef struct {
    char *key;
    size_t nkey;
    char *value;
    size_t nvalue;
    int64_t mod_revision;
    int64_t lease;
} kv_t;

#define T kv_t
static const dl_proto_rec_field_t kv_rows[] = {
    {.name = "key",
     .kind = DL_PROTO_REC_BYTES,
     .required = true,
     .offset = offsetof(T, key),
     .count = offsetof(T, nkey)},
    VEC(DL_PROTO_REC_BYTES, value),
    OPT(DL_PROTO_REC_I64, mod_revision),
    OPT(DL_PROTO_REC_I64, lease),
    END,
};
#undef T
static const dl_proto_rec_type_t kv_type = {sizeof(kv_t), kv_rows};

static int decode(const char *text, kv_t *kv, char *err, size_t errlen)
{
    json_t *in = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(in);
    int r = dl_proto_rec_decode(&kv_type, in, kv, "etcd's answer", err, errlen);
    json_decref(in);
    return r;
}

DL_TEST(numbers_and_bytes_read_as_etcd_writes_them_and_back)
{
    kv_t kv;
    char err[256];
    /* "/a" and three bytes with a NUL inside; a revision past 2^53 as a string. */
    DL_CHECK_ERRNO(decode("{\"key\":\"L2E=\",\"value\":\"eABa\",\"mod_revision\":"
                          "\"9007199254740993\",\"lease\":7}",
                          &kv, err, sizeof(err)),
                   0);
    ck_assert_str_eq(kv.key, "/a");
    ck_assert_uint_eq(kv.nkey, 2);
    ck_assert_uint_eq(kv.nvalue, 3);
    ck_assert_mem_eq(kv.value, "x\0Z", 4);
    ck_assert(kv.mod_revision == INT64_C(9007199254740993));
    ck_assert(kv.lease == 7);
    json_t *out = dl_proto_rec_encode(&kv_type, &kv);
    char *s = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ck_assert_str_eq(s,
                     "{\"key\":\"L2E=\",\"value\":\"eABa\",\"mod_revision\":\"9007199254740993\","
                     "\"lease\":\"7\"}");
    free(s);
    json_decref(out);
    dl_proto_rec_free(&kv_type, &kv);

    /* Absent: no bytes, and zero; padding may be left out. */
    DL_CHECK_ERRNO(decode("{\"key\":\"L2FiYw\"}", &kv, err, sizeof(err)), 0);
    ck_assert_str_eq(kv.key, "/abc");
    ck_assert_ptr_null(kv.value);
    ck_assert_uint_eq(kv.nvalue, 0);
    ck_assert(kv.mod_revision == 0);
    dl_proto_rec_free(&kv_type, &kv);
}

DL_TEST(a_value_of_neither_form_names_its_field)
{
    kv_t kv;
    char err[256];
    DL_CHECK_ERRNO(decode("{\"key\":\"L2E=\",\"value\":\"not base64!\"}", &kv, err, sizeof(err)),
                   -EBADMSG);
    ck_assert_str_eq(err, "etcd's answer: field 'value' must be base64, got a string");
    ck_assert_ptr_null(kv.key);
    DL_CHECK_ERRNO(decode("{\"key\":\"L2E=\",\"lease\":\"12x\"}", &kv, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "etcd's answer: field 'lease' must be a 64-bit integer (a number or a "
                          "decimal string), got a string");
    DL_CHECK_ERRNO(
        decode("{\"key\":\"L2E=\",\"lease\":\"99999999999999999999\"}", &kv, err, sizeof(err)),
        -EBADMSG);
    DL_CHECK_ERRNO(decode("{\"key\":\"L2E=\",\"mod_revision\":1.5}", &kv, err, sizeof(err)),
                   -EBADMSG);
    DL_CHECK_ERRNO(decode("{\"key\":7}", &kv, err, sizeof(err)), -EBADMSG);
    ck_assert_str_eq(err, "etcd's answer: field 'key' must be a base64 string, got an integer");
}
