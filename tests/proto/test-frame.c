/* Frames: encoding, the incremental decoder fed in every possible way, the limits, and each
 * frame-level error with its code. */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "proto.h"

/* A frame around raw bytes, so tests can send what no encoder would produce. */
static char *raw_frame(const char *body, size_t len, size_t *ret_len)
{
    char *f = malloc(len + 4);

    ck_assert_ptr_nonnull(f);
    f[0] = (char)(len >> 24);
    f[1] = (char)(len >> 16);
    f[2] = (char)(len >> 8);
    f[3] = (char)len;
    memcpy(f + 4, body, len);
    *ret_len = len + 4;
    return f;
}

static char *text_frame(const char *body, size_t *ret_len)
{
    return raw_frame(body, strlen(body), ret_len);
}

static json_t *sample_join(json_int_t id)
{
    json_t *m = dl_proto_msg_new(DL_PROTO_JOIN, id);

    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(json_object_set_new(m, "node_id", json_string("node-3")), 0);
    ck_assert_int_eq(json_object_set_new(m, "host", json_string("gpu3.example.org")), 0);
    ck_assert_int_eq(json_object_set_new(m, "slots", json_integer(8)), 0);
    ck_assert_int_eq(json_object_set_new(m, "node_rank", json_integer(-1)), 0);
    return m;
}

static json_t *sample_kv_set(json_int_t id, size_t value_len)
{
    char *value = malloc(value_len + 1);
    json_t *m = dl_proto_msg_new(DL_PROTO_KV_SET, id);

    ck_assert_ptr_nonnull(value);
    memset(value, 'x', value_len);
    value[value_len] = '\0';
    json_object_set_new(m, "key", json_string("rank/0/addr"));
    json_object_set_new(m, "value", json_string(value));
    free(value);
    return m;
}

/* Feeds the whole buffer in pieces of at most piece bytes (0: all at once) and collects what
 * comes out: messages as themselves, anything else as {"code": name}. */
static json_t *feed_all(dl_proto_decoder_t *dec, const char *data, size_t len, size_t piece)
{
    json_t *out = json_array();
    size_t off = 0;

    while (off < len) {
        size_t n = piece == 0 || piece > len - off ? len - off : piece;
        size_t used;
        json_t *msg = NULL;
        dl_proto_type_t type;
        dl_proto_error_t err;
        int r = dl_proto_decoder_feed(dec, data + off, n, &used, &msg, &type, &err);

        ck_assert_uint_le(used, n);
        off += used;
        if (r == DL_PROTO_NEED_MORE) {
            ck_assert_uint_eq(used, n);
        } else if (r == DL_PROTO_MESSAGE) {
            ck_assert_str_eq(dl_proto_type_name(type), dl_proto_get_str(msg, "type"));
            json_array_append_new(out, msg);
        } else {
            json_array_append_new(out, json_pack("{s:s}", "code", dl_proto_errcode_name(err.code)));
            if (r < 0)
                break;
        }
    }
    return out;
}

DL_TEST(test_encode_layout)
{
    json_auto_t *m = sample_join(7);
    char *frame, *text;
    size_t len;

    DL_CHECK_ERRNO(dl_proto_encode(m, &frame, &len, NULL), 0);
    text = json_dumps(m, JSON_COMPACT);
    /* Four bytes of big-endian length, then exactly the compact JSON. */
    ck_assert_uint_eq(len, strlen(text) + 4);
    ck_assert_uint_eq((unsigned char)frame[0], (strlen(text) >> 24) & 0xff);
    ck_assert_uint_eq((unsigned char)frame[1], (strlen(text) >> 16) & 0xff);
    ck_assert_uint_eq((unsigned char)frame[2], (strlen(text) >> 8) & 0xff);
    ck_assert_uint_eq((unsigned char)frame[3], strlen(text) & 0xff);
    ck_assert_mem_eq(frame + 4, text, strlen(text));
    free(text);
    free(frame);
}

DL_TEST(test_round_trip)
{
    json_auto_t *m = sample_join(7);
    json_auto_t *back = NULL;
    dl_proto_decoder_t dec;
    dl_proto_type_t type;
    dl_proto_error_t err;
    char *frame;
    size_t len, used;

    DL_CHECK_ERRNO(dl_proto_encode(m, &frame, &len, NULL), 0);
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, frame, len, &used, &back, &type, &err),
                     DL_PROTO_MESSAGE);
    ck_assert_uint_eq(used, len);
    ck_assert_int_eq(type, DL_PROTO_JOIN);
    ck_assert(json_equal(m, back));
    ck_assert_int_eq(dl_proto_get_int(back, "id", -1), 7);
    ck_assert(!dl_proto_decoder_pending(&dec));
    dl_proto_decoder_cleanup(&dec);
    free(frame);
}

/* Three frames back to back, the second one large enough to need the buffered path. */
static char *three_frames(json_t **ret_msgs, size_t *ret_len)
{
    json_t *msgs = json_array();
    char *stream = NULL;
    size_t total = 0;

    json_array_append_new(msgs, sample_join(1));
    json_array_append_new(msgs, sample_kv_set(2, 300));
    json_array_append_new(
        msgs, json_pack("{s:i, s:s, s:i, s:i}", "v", 1, "type", "heartbeat", "id", 3, "round", 0));
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        char *frame;
        size_t len;
        DL_CHECK_ERRNO(dl_proto_encode(json_array_get(msgs, i), &frame, &len, NULL), 0);
        stream = realloc(stream, total + len);
        memcpy(stream + total, frame, len);
        total += len;
        free(frame);
    }
    *ret_msgs = msgs;
    *ret_len = total;
    return stream;
}

DL_TEST(test_split_every_boundary)
{
    json_auto_t *msgs = NULL;
    size_t len;
    char *stream = three_frames(&msgs, &len);

    /* Two pieces, cut at every byte: the decoder must not care where reads end. */
    for (size_t cut = 0; cut <= len; cut++) {
        dl_proto_decoder_t dec;
        json_auto_t *got = json_array();
        json_auto_t *a = NULL, *b = NULL;

        dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
        a = feed_all(&dec, stream, cut, 0);
        b = feed_all(&dec, stream + cut, len - cut, 0);
        json_array_extend(got, a);
        json_array_extend(got, b);
        ck_assert_msg(json_equal(got, msgs), "cut at byte %zu of %zu", cut, len);
        ck_assert(!dl_proto_decoder_pending(&dec));
        dl_proto_decoder_cleanup(&dec);
    }
    free(stream);
}

DL_TEST(test_one_byte_at_a_time)
{
    json_auto_t *msgs = NULL;
    json_auto_t *got = NULL;
    dl_proto_decoder_t dec;
    size_t len;
    char *stream = three_frames(&msgs, &len);

    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    got = feed_all(&dec, stream, len, 1);
    ck_assert(json_equal(got, msgs));
    dl_proto_decoder_cleanup(&dec);
    free(stream);
}

DL_TEST(test_pending_after_partial_frame)
{
    json_auto_t *msgs = NULL;
    json_auto_t *got = NULL;
    dl_proto_decoder_t dec;
    size_t len;
    char *stream = three_frames(&msgs, &len);

    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    got = feed_all(&dec, stream, len - 1, 0);
    ck_assert_uint_eq(json_array_size(got), 2);
    ck_assert(dl_proto_decoder_pending(&dec));
    dl_proto_decoder_cleanup(&dec);
    free(stream);
}

/* Feeds one frame to a fresh decoder and expects it to be refused but skipped. */
static void expect_invalid(const char *body, size_t body_len, dl_proto_errcode_t code,
                           const char *needle)
{
    dl_proto_decoder_t dec;
    json_t *msg = NULL;
    json_auto_t *ok = sample_join(9);
    json_auto_t *back = NULL;
    dl_proto_type_t type;
    dl_proto_error_t err;
    char *frame, *good;
    size_t len, good_len, used;
    int r;

    frame = raw_frame(body, body_len, &len);
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    r = dl_proto_decoder_feed(&dec, frame, len, &used, &msg, &type, &err);
    ck_assert_int_eq(r, DL_PROTO_INVALID);
    ck_assert_ptr_null(msg);
    ck_assert_uint_eq(used, len);
    ck_assert_msg(err.code == code, "expected %s, got %s: %s", dl_proto_errcode_name(code),
                  dl_proto_errcode_name(err.code), err.message);
    ck_assert_msg(strstr(err.message, needle) != NULL, "'%s' not in '%s'", needle, err.message);
    ck_assert_msg(strstr(err.message, "frame at byte 0") != NULL, "%s", err.message);
    /* The stream goes on: a good frame after the bad one still decodes. */
    DL_CHECK_ERRNO(dl_proto_encode(ok, &good, &good_len, NULL), 0);
    r = dl_proto_decoder_feed(&dec, good, good_len, &used, &back, &type, &err);
    ck_assert_int_eq(r, DL_PROTO_MESSAGE);
    ck_assert(json_equal(ok, back));
    dl_proto_decoder_cleanup(&dec);
    free(good);
    free(frame);
}

static void expect_invalid_text(const char *body, dl_proto_errcode_t code, const char *needle)
{
    expect_invalid(body, strlen(body), code, needle);
}

DL_TEST(test_empty_frame)
{
    expect_invalid("", 0, DL_PROTO_E_EMPTY_FRAME, "empty frame");
}

DL_TEST(test_bad_json_position)
{
    /* The error names where jansson stopped: line 2, and the byte offset. */
    expect_invalid_text("{\"v\":1,\n \"type\" \"hello\"}", DL_PROTO_E_BAD_JSON,
                        "bad JSON at line 2, column");
    expect_invalid_text("{\"v\":1,\"type\":\"hello\",}", DL_PROTO_E_BAD_JSON, "(byte ");
    expect_invalid_text("{\"v\":1} trailing", DL_PROTO_E_BAD_JSON, "bad JSON");
    expect_invalid_text("{\"v\":1", DL_PROTO_E_BAD_JSON, "bad JSON");
    expect_invalid("{\"v\":1\0}", 8, DL_PROTO_E_BAD_JSON, "bad JSON");
    /* Two "type" keys could be read two ways by two parsers. */
    expect_invalid_text("{\"v\":1,\"type\":\"status\",\"type\":\"stop\",\"id\":1}",
                        DL_PROTO_E_BAD_JSON, "duplicate");
    expect_invalid_text("{\"v\":1,\"s\":\"\\u0000\"}", DL_PROTO_E_BAD_JSON, "bad JSON");
}

DL_TEST(test_not_object)
{
    expect_invalid_text("[1,2,3]", DL_PROTO_E_NOT_OBJECT, "an array");
    expect_invalid_text("\"hello\"", DL_PROTO_E_NOT_OBJECT, "a string");
    expect_invalid_text("42", DL_PROTO_E_NOT_OBJECT, "an integer");
    expect_invalid_text("null", DL_PROTO_E_NOT_OBJECT, "null");
}

DL_TEST(test_version)
{
    expect_invalid_text("{\"type\":\"status\",\"id\":1}", DL_PROTO_E_BAD_VERSION, "'v'");
    expect_invalid_text("{\"v\":\"1\",\"type\":\"status\",\"id\":1}", DL_PROTO_E_BAD_VERSION,
                        "must be an integer");
    expect_invalid_text("{\"v\":1.0,\"type\":\"status\",\"id\":1}", DL_PROTO_E_BAD_VERSION,
                        "a real number");
    expect_invalid_text("{\"v\":2,\"type\":\"status\",\"id\":1}", DL_PROTO_E_UNSUPPORTED_VERSION,
                        "version 2");
    expect_invalid_text("{\"v\":0,\"type\":\"status\",\"id\":1}", DL_PROTO_E_UNSUPPORTED_VERSION,
                        "version 0");
}

DL_TEST(test_type)
{
    expect_invalid_text("{\"v\":1,\"id\":1}", DL_PROTO_E_MISSING_FIELD, "'type'");
    expect_invalid_text("{\"v\":1,\"type\":7,\"id\":1}", DL_PROTO_E_BAD_FIELD,
                        "'type' must be a string");
    expect_invalid_text("{\"v\":1,\"type\":\"frobnicate\",\"id\":1}", DL_PROTO_E_UNKNOWN_TYPE,
                        "'frobnicate'");
    expect_invalid_text("{\"v\":1,\"type\":\"JOIN\",\"id\":1}", DL_PROTO_E_UNKNOWN_TYPE, "'JOIN'");
}

DL_TEST(test_invalid_keeps_id)
{
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    json_auto_t *reply = NULL;
    dl_proto_type_t type;
    size_t len, used;
    char *frame =
        text_frame("{\"v\":1,\"type\":\"join\",\"id\":42,\"host\":\"h\",\"slots\":1}", &len);

    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, frame, len, &used, &msg, &type, &err),
                     DL_PROTO_INVALID);
    ck_assert_int_eq(err.code, DL_PROTO_E_MISSING_FIELD);
    ck_assert_int_eq(err.id, 42);
    ck_assert_int_eq(err.type, DL_PROTO_JOIN);
    ck_assert_ptr_nonnull(strstr(err.message, "'node_id'"));
    /* The error reply a server sends back echoes the id and is itself a valid message. */
    reply = dl_proto_error_from(&err);
    DL_CHECK_ERRNO(dl_proto_validate(reply, &type, NULL), 0);
    ck_assert_int_eq(type, DL_PROTO_ERROR);
    ck_assert_int_eq(dl_proto_get_int(reply, "id", -1), 42);
    ck_assert_int_eq(dl_proto_reply_error(reply, NULL), DL_PROTO_E_MISSING_FIELD);
    dl_proto_decoder_cleanup(&dec);
    free(frame);
}

DL_TEST(test_too_large_before_auth)
{
    json_auto_t *m = sample_kv_set(5, 5000);
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    dl_proto_type_t type;
    char *frame;
    size_t len, used;

    DL_CHECK_ERRNO(dl_proto_encode(m, &frame, &len, NULL), 0);
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    /* Refused as soon as the header is in, without waiting for the body. */
    DL_CHECK_ERRNO(dl_proto_decoder_feed(&dec, frame, 4, &used, &msg, &type, &err), -EMSGSIZE);
    ck_assert_uint_eq(used, 4);
    ck_assert_int_eq(err.code, DL_PROTO_E_FRAME_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(err.message, "exceeds the limit of 4096 bytes"));
    ck_assert_ptr_null(dec.buf);
    /* The stream cannot be trusted past a refused length: every later feed fails the same way. */
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, frame + 4, len - 4, &used, &msg, &type, &err),
                     -EMSGSIZE);
    ck_assert_int_eq(err.code, DL_PROTO_E_FRAME_TOO_LARGE);
    ck_assert_uint_eq(used, 0);
    dl_proto_decoder_cleanup(&dec);

    /* The same frame once the peer has authenticated. */
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    dl_proto_decoder_set_limit(&dec, DL_PROTO_LIMIT);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, frame, len, &used, &msg, &type, &err),
                     DL_PROTO_MESSAGE);
    ck_assert(json_equal(msg, m));
    json_decref(msg);
    dl_proto_decoder_cleanup(&dec);
    free(frame);
}

DL_TEST(test_limit_edges)
{
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    dl_proto_type_t type;
    char *frame;
    size_t used, body;

    /* A body of exactly the pre-auth limit passes it; the limit counts the body only. */
    body = DL_PROTO_LIMIT_PREAUTH;
    frame = malloc(body + 4);
    {
        json_auto_t *m = sample_kv_set(1, 0);
        char *small;
        size_t small_len;
        DL_CHECK_ERRNO(dl_proto_encode(m, &small, &small_len, NULL), 0);
        /* Pad with spaces after the object: whitespace is valid JSON. */
        memcpy(frame, small, small_len);
        memset(frame + small_len, ' ', body + 4 - small_len);
        frame[0] = 0;
        frame[1] = 0;
        frame[2] = (char)(body >> 8);
        frame[3] = (char)body;
        free(small);
    }
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, frame, body + 4, &used, &msg, &type, &err),
                     DL_PROTO_MESSAGE);
    json_decref(msg);
    /* One byte more is refused. */
    frame[2] = (char)((body + 1) >> 8);
    frame[3] = (char)(body + 1);
    DL_CHECK_ERRNO(dl_proto_decoder_feed(&dec, frame, 4, &used, &msg, &type, &err), -EMSGSIZE);
    dl_proto_decoder_cleanup(&dec);
    free(frame);

    /* After auth: 1 MiB passes the header check, 1 MiB + 1 does not; set_limit cannot go higher. */
    {
        unsigned char hdr_ok[4] = {0x00, 0x10, 0x00, 0x00};
        unsigned char hdr_big[4] = {0x00, 0x10, 0x00, 0x01};
        dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
        dl_proto_decoder_set_limit(&dec, UINT32_MAX);
        ck_assert_int_eq(dl_proto_decoder_feed(&dec, hdr_ok, 4, &used, &msg, &type, &err),
                         DL_PROTO_NEED_MORE);
        ck_assert(dl_proto_decoder_pending(&dec));
        dl_proto_decoder_cleanup(&dec);
        dl_proto_decoder_init(&dec, DL_PROTO_LIMIT);
        ck_assert_int_eq(dl_proto_decoder_feed(&dec, hdr_big, 4, &used, &msg, &type, &err),
                         -EMSGSIZE);
        ck_assert_ptr_nonnull(strstr(err.message, "1048577"));
        dl_proto_decoder_cleanup(&dec);
    }
}

DL_TEST(test_huge_length_no_allocation)
{
    unsigned char hdr[4] = {0xff, 0xff, 0xff, 0xff};
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    dl_proto_type_t type;
    size_t used;

    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT);
    /* A byte at a time: the first three only fill the header. */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(dl_proto_decoder_feed(&dec, hdr + i, 1, &used, &msg, &type, &err),
                         DL_PROTO_NEED_MORE);
    {
        /* The heap is exactly as big after the refusal as before it (ASan's allocator reports
         * zeros here, which proves nothing but does no harm). */
        struct mallinfo2 before = mallinfo2();
        int r = dl_proto_decoder_feed(&dec, hdr + 3, 1, &used, &msg, &type, &err);
        struct mallinfo2 after = mallinfo2();
        DL_CHECK_ERRNO(r, -EMSGSIZE);
        ck_assert_uint_eq(after.uordblks, before.uordblks);
        ck_assert_uint_eq(after.hblkhd, before.hblkhd);
    }
    ck_assert_int_eq(err.code, DL_PROTO_E_FRAME_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(err.message, "4294967295"));
    ck_assert_ptr_null(dec.buf);
    ck_assert_uint_eq(dec.buf_cap, 0);
    dl_proto_decoder_cleanup(&dec);
}

DL_TEST(test_limit_switch_mid_stream)
{
    /* hello and auth under the small limit, then a large kv_set that only fits after the
     * server raised the limit; all three arrive in one read, as a pipelining client sends. */
    json_auto_t *big = sample_kv_set(3, 200000);
    json_auto_t *auth = json_pack("{s:i, s:s, s:i, s:s}", "v", 1, "type", "auth", "id", 2, "proof",
                                  "00112233445566778899aabbccddeeff"
                                  "00112233445566778899aabbccddeeff");
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    dl_proto_type_t type;
    char *f1, *f2, *stream;
    size_t l1, l2, used, off = 0;

    DL_CHECK_ERRNO(dl_proto_encode(auth, &f1, &l1, NULL), 0);
    DL_CHECK_ERRNO(dl_proto_encode(big, &f2, &l2, NULL), 0);
    stream = malloc(l1 + l2);
    memcpy(stream, f1, l1);
    memcpy(stream + l1, f2, l2);
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, stream, l1 + l2, &used, &msg, &type, &err),
                     DL_PROTO_MESSAGE);
    ck_assert_int_eq(type, DL_PROTO_AUTH);
    ck_assert_uint_eq(used, l1);
    json_decref(msg);
    off = used;
    dl_proto_decoder_set_limit(&dec, DL_PROTO_LIMIT);
    /* And the big one in 4 KiB reads, through the buffered path. */
    for (;;) {
        size_t n = l1 + l2 - off < 4096 ? l1 + l2 - off : 4096;
        int r = dl_proto_decoder_feed(&dec, stream + off, n, &used, &msg, &type, &err);
        off += used;
        if (r == DL_PROTO_MESSAGE)
            break;
        ck_assert_int_eq(r, DL_PROTO_NEED_MORE);
    }
    ck_assert_uint_eq(off, l1 + l2);
    ck_assert(json_equal(msg, big));
    json_decref(msg);
    dl_proto_decoder_cleanup(&dec);
    free(stream);
    free(f1);
    free(f2);
}

DL_TEST(test_encode_refuses)
{
    json_auto_t *bad = json_pack("{s:i, s:s}", "v", 1, "type", "join");
    json_auto_t *huge = sample_kv_set(1, DL_PROTO_LIMIT);
    dl_proto_error_t err;
    char *frame = NULL;
    size_t len = 0;

    DL_CHECK_ERRNO(dl_proto_encode(bad, &frame, &len, &err), -EBADMSG);
    ck_assert_int_eq(err.code, DL_PROTO_E_MISSING_FIELD);
    ck_assert_ptr_null(frame);
    DL_CHECK_ERRNO(dl_proto_encode(huge, &frame, &len, &err), -EMSGSIZE);
    ck_assert_int_eq(err.code, DL_PROTO_E_FRAME_TOO_LARGE);
    ck_assert_ptr_null(frame);
    ck_assert_uint_eq(len, 0);
}

DL_TEST(test_error_offsets)
{
    /* A bad frame after a good one is reported at its own stream offset. */
    json_auto_t *m = sample_join(1);
    dl_proto_decoder_t dec;
    dl_proto_error_t err;
    json_t *msg = NULL;
    dl_proto_type_t type;
    char *good, *bad, *stream;
    size_t gl, bl, used;
    char want[64];

    DL_CHECK_ERRNO(dl_proto_encode(m, &good, &gl, NULL), 0);
    bad = text_frame("{]", &bl);
    stream = malloc(gl + bl);
    memcpy(stream, good, gl);
    memcpy(stream + gl, bad, bl);
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT_PREAUTH);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, stream, gl + bl, &used, &msg, &type, &err),
                     DL_PROTO_MESSAGE);
    json_decref(msg);
    ck_assert_int_eq(
        dl_proto_decoder_feed(&dec, stream + used, gl + bl - used, &used, &msg, &type, &err),
        DL_PROTO_INVALID);
    snprintf(want, sizeof(want), "frame at byte %zu:", gl);
    ck_assert_msg(strstr(err.message, want) != NULL, "%s", err.message);
    dl_proto_decoder_cleanup(&dec);
    free(stream);
    free(good);
    free(bad);
}

DL_TEST(test_partial_frame_costs_what_arrived)
{
    /* A peer announcing a large frame and sending a little of it makes the decoder hold a
     * little: memory follows the bytes received, doubling, never the length announced. */
    const char *msg = "{\"v\":1,\"type\":\"status\",\"id\":1}";
    size_t body = 200000, used;
    char *stream = malloc(4 + body);
    dl_proto_decoder_t dec;
    json_t *m = NULL;
    dl_proto_type_t type;
    dl_proto_error_t err;

    ck_assert_ptr_nonnull(stream);
    stream[0] = 0;
    stream[1] = (char)(body >> 16);
    stream[2] = (char)(body >> 8);
    stream[3] = (char)body;
    memset(stream + 4, ' ', body);
    memcpy(stream + 4, msg, strlen(msg));
    dl_proto_decoder_init(&dec, DL_PROTO_LIMIT);
    /* The header alone: nothing held yet (the fuzzer found this one pointing into nothing). */
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, stream, 4, &used, &m, &type, &err),
                     DL_PROTO_NEED_MORE);
    ck_assert_uint_eq(dl_proto_decoder_buffered(&dec), 0);
    ck_assert(dl_proto_decoder_pending(&dec));
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, stream + 4, 10, &used, &m, &type, &err),
                     DL_PROTO_NEED_MORE);
    ck_assert_uint_le(dl_proto_decoder_buffered(&dec), 4096);
    ck_assert_int_eq(dl_proto_decoder_feed(&dec, stream + 14, 50000, &used, &m, &type, &err),
                     DL_PROTO_NEED_MORE);
    ck_assert_uint_le(dl_proto_decoder_buffered(&dec), 2 * 50010);
    ck_assert_int_eq(
        dl_proto_decoder_feed(&dec, stream + 50014, body - 50010, &used, &m, &type, &err),
        DL_PROTO_MESSAGE);
    ck_assert_int_eq(type, DL_PROTO_STATUS);
    json_decref(m);
    dl_proto_decoder_cleanup(&dec);
    ck_assert_uint_eq(dl_proto_decoder_buffered(&dec), 0);
    free(stream);
}
