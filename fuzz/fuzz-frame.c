/* libFuzzer target for the frame decoder, message validation and the handshake's credentials.
 *
 * The input is the byte stream one connection delivers. It is decoded several ways, and the
 * ways must agree, so the fuzzer finds wrong answers as well as crashes:
 *   - all at once, one byte at a time, and in pieces whose size the input picks: same outcomes;
 *   - under the pre-auth limit and under the full limit: same outcomes up to a frame that only
 *     the larger limit admits;
 *   - every message that decodes re-encodes and decodes to an equal message;
 *   - every error turns into a valid error reply carrying the same code;
 *   - every string of a message, read as a credential (dlaunch-job-v2:RUN:ISSUED:EXPIRES:HEX,
 *     ...), either is
 *     refused or writes back as itself, and derives only down the chain (master -> job ->
 *     worker), never up or sideways;
 *   - a hello's nonce and an auth_ok's proof go through the server's and the client's proof
 *     checks, which refuse what they must and accept what a real key made;
 *   - every string escapes into printable ASCII.
 * A broken rule calls abort(). The ordinary build replays every file of fuzz/corpus/frame/
 * through this entry point (fuzz/replay.c, the unit test frame-replay); tests/proto/test-corpus.c
 * checks the outcome each seed's name promises.
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-frame
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "proto.h"

static void check_error(const dl_proto_error_t *err)
{
    json_auto_t *reply = dl_proto_error_from(err);
    dl_proto_type_t type;
    char *frame = NULL;
    size_t len;

    DL_FUZZ_REQUIRE(err->code != DL_PROTO_E_NONE && dl_proto_errcode_name(err->code) != NULL);
    DL_FUZZ_REQUIRE(err->message[0] != '\0');
    for (const char *p = err->message; *p != '\0'; p++)
        DL_FUZZ_REQUIRE(*p >= 0x20 && *p <= 0x7e);
    DL_FUZZ_REQUIRE(reply != NULL);
    DL_FUZZ_REQUIRE(dl_proto_validate(reply, &type, NULL) == 0 && type == DL_PROTO_ERROR);
    DL_FUZZ_REQUIRE(dl_proto_reply_error(reply, NULL) == err->code);
    DL_FUZZ_REQUIRE(dl_proto_get_int(reply, "id", -1) == err->id);
    DL_FUZZ_REQUIRE(dl_proto_encode(reply, &frame, &len, NULL) == 0);
    free(frame);
}

/* A fixed master for the handshake checks: what a server of the fuzzer's would hold. */
static dl_proto_token_t *master(void)
{
    static dl_proto_token_t *t;
    char err[64];
    if (t == NULL)
        DL_FUZZ_REQUIRE(dl_proto_token_from_string("fuzz master", "fuzz", &t, err, sizeof(err)) ==
                        0);
    return t;
}

static void check_escape(const char *s)
{
    char out[256];
    dl_proto_escape(s, out, sizeof(out));
    for (const char *p = out; *p != '\0'; p++)
        DL_FUZZ_REQUIRE(*p >= 0x20 && *p <= 0x7e);
}

static const dl_proto_key_life_t LIFE = {1700000000, 1700604800};

/* text read as a credential: refused, or a master, or a typed key that writes back as text
 * and reaches only its own job. */
static void check_credential(const char *text)
{
    dl_proto_token_t *t = NULL, *back = NULL, *d = NULL;
    char err[256], *out = NULL;
    int r = dl_proto_token_from_string(text, "fuzz", &t, err, sizeof(err));

    DL_FUZZ_REQUIRE(r == 0 || r == -EINVAL);
    if (r < 0)
        return;
    dl_proto_token_kind_t kind = dl_proto_token_kind(t);
    if (kind == DL_PROTO_TOKEN_MASTER) {
        DL_FUZZ_REQUIRE(dl_proto_token_text(t, &out) == -EPERM);
        DL_FUZZ_REQUIRE(dl_proto_token_derive(t, DL_PROTO_TOKEN_JOB, "job", &LIFE, &d) == 0);
        DL_FUZZ_REQUIRE(dl_proto_token_may(t, "other", DL_PROTO_ROLE_CONTROL));
        dl_proto_token_free(d);
        dl_proto_token_free(t);
        return;
    }
    if (kind == DL_PROTO_TOKEN_SCRAPE) {
        /* Writes back as itself, derives nothing, may act nowhere. */
        DL_FUZZ_REQUIRE(dl_proto_token_run_id(t) == NULL);
        DL_FUZZ_REQUIRE(dl_proto_token_text(t, &out) == 0 && strcmp(out, text) == 0);
        DL_FUZZ_REQUIRE(dl_proto_token_derive(t, DL_PROTO_TOKEN_JOB, "x", &LIFE, &d) == -EPERM);
        DL_FUZZ_REQUIRE(!dl_proto_token_may(t, "x", DL_PROTO_ROLE_WORKER));
        free(out);
        dl_proto_token_free(t);
        return;
    }
    const char *run_id = dl_proto_token_run_id(t);
    DL_FUZZ_REQUIRE(run_id != NULL && dl_proto_run_id_valid(run_id));
    DL_FUZZ_REQUIRE(dl_proto_token_text(t, &out) == 0 && strcmp(out, text) == 0);
    DL_FUZZ_REQUIRE(dl_proto_token_from_string(out, "fuzz", &back, err, sizeof(err)) == 0);
    DL_FUZZ_REQUIRE(dl_proto_token_equal(back, t));
    dl_proto_key_life_t life = dl_proto_token_life(t);
    DL_FUZZ_REQUIRE(dl_proto_key_life_valid(&life));
    /* Never up, never to another job. */
    DL_FUZZ_REQUIRE(dl_proto_token_derive(t, DL_PROTO_TOKEN_MASTER, run_id, &LIFE, &d) == -EPERM);
    DL_FUZZ_REQUIRE(strcmp(run_id, "x") == 0 ||
                    dl_proto_token_derive(t, kind, "x", &LIFE, &d) == -EPERM);
    DL_FUZZ_REQUIRE(
        !dl_proto_token_may(t, strcmp(run_id, "x") == 0 ? "y" : "x", DL_PROTO_ROLE_WORKER));
    if (kind == DL_PROTO_TOKEN_WORKER) {
        DL_FUZZ_REQUIRE(dl_proto_token_derive(t, DL_PROTO_TOKEN_JOB, run_id, &LIFE, &d) == -EPERM);
        DL_FUZZ_REQUIRE(!dl_proto_token_may(t, run_id, DL_PROTO_ROLE_CONTROL));
        DL_FUZZ_REQUIRE(!dl_proto_token_may(t, run_id, DL_PROTO_ROLE_AGENT));
    }
    DL_FUZZ_REQUIRE(dl_proto_token_may(t, run_id, DL_PROTO_ROLE_WORKER));
    free(out);
    dl_proto_token_free(back);
    dl_proto_token_free(t);
}

/* Every string in v, to the depth the validator allows. */
static void check_strings(const json_t *v, int depth)
{
    const char *k;
    const json_t *item;
    size_t i;

    if (depth > 4)
        return;
    if (json_is_string(v)) {
        check_escape(json_string_value(v));
        check_credential(json_string_value(v));
    } else if (json_is_object(v)) {
        json_object_foreach ((json_t *)v, k, item) {
            check_escape(k);
            check_strings(item, depth + 1);
        }
    } else if (json_is_array(v)) {
        json_array_foreach (v, i, item)
            check_strings(item, depth + 1);
    }
}

/* The handshake's proof checks on what a message offers as a nonce or a proof: a proof made by
 * no key is refused, one made by the right key accepted, whichever level it was made at. */
static void check_handshake(const json_t *msg, dl_proto_type_t type)
{
    static const char nonce[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const char *hex = dl_proto_get_str(msg, type == DL_PROTO_HELLO ? "nonce" : "proof");
    const char *run_id = type == DL_PROTO_HELLO ? dl_proto_get_str(msg, "run_id") : "job";
    char proof[DL_PROTO_PROOF_HEX_LEN + 1], sproof[DL_PROTO_PROOF_HEX_LEN + 1];
    dl_proto_token_kind_t level;
    dl_proto_key_life_t life, claimed = dl_proto_auth_claimed_life(msg);
    dl_proto_token_t *worker = NULL;

    if (hex == NULL || run_id == NULL)
        return;
    if (type == DL_PROTO_AUTH_OK || type == DL_PROTO_AUTH) {
        /* A proof nobody computed: refused by both sides (a collision is beyond the fuzzer). */
        DL_FUZZ_REQUIRE(dl_proto_auth_accept(master(), nonce, NULL, "job", DL_PROTO_ROLE_AGENT, hex,
                                             &claimed, &level, &life, NULL) == -EACCES);
        DL_FUZZ_REQUIRE(dl_proto_auth_check_server(master(), nonce, nonce, "job",
                                                   DL_PROTO_ROLE_AGENT, hex) == -EACCES);
        return;
    }
    /* hello: the client's nonce, and a worker key made from the server's master. */
    DL_FUZZ_REQUIRE(
        dl_proto_token_derive(master(), DL_PROTO_TOKEN_WORKER, run_id, &LIFE, &worker) == 0);
    DL_FUZZ_REQUIRE(dl_proto_auth_proof(worker, nonce, run_id, DL_PROTO_ROLE_WORKER, proof) == 0);
    DL_FUZZ_REQUIRE(dl_proto_auth_accept(master(), nonce, hex, run_id, DL_PROTO_ROLE_WORKER, proof,
                                         &LIFE, &level, &life, sproof) == 0);
    DL_FUZZ_REQUIRE(level == DL_PROTO_TOKEN_WORKER && life.issued == LIFE.issued &&
                    life.expires == LIFE.expires);
    DL_FUZZ_REQUIRE(
        dl_proto_auth_check_server(worker, hex, nonce, run_id, DL_PROTO_ROLE_WORKER, sproof) == 0);
    /* The same proof is no control's. */
    DL_FUZZ_REQUIRE(dl_proto_auth_accept(master(), nonce, hex, run_id, DL_PROTO_ROLE_CONTROL, proof,
                                         &LIFE, &level, &life, sproof) == -EACCES);
    dl_proto_token_free(worker);
}

static void check_message(const json_t *msg, dl_proto_type_t type)
{
    json_auto_t *back = NULL;
    dl_proto_type_t back_type;
    char *frame = NULL;
    size_t len;
    int r;

    DL_FUZZ_REQUIRE(strcmp(dl_proto_type_name(type), dl_proto_get_str(msg, "type")) == 0);
    /* Compact output can be longer than clever input ("1e300"), so only a size refusal is
     * allowed besides success. */
    r = dl_proto_encode(msg, &frame, &len, NULL);
    DL_FUZZ_REQUIRE(r == 0 || r == -EMSGSIZE);
    if (r == 0) {
        DL_FUZZ_REQUIRE(dl_proto_decode(frame + DL_PROTO_HEADER_LEN, len - DL_PROTO_HEADER_LEN,
                                        &back, &back_type, NULL) == 0);
        DL_FUZZ_REQUIRE(back_type == type && json_equal(back, msg));
        free(frame);
    }
    if (dl_proto_type_kind(type) == DL_PROTO_KIND_REQUEST) {
        json_int_t id = dl_proto_get_int(msg, "id", -1);
        json_auto_t *reply = dl_proto_error_new(id, DL_PROTO_E_FORBIDDEN, "%s", "no");
        dl_proto_type_t t;
        /* Whatever a request is, an error echoing its id answers it. */
        DL_FUZZ_REQUIRE(id >= 0 && reply != NULL);
        DL_FUZZ_REQUIRE(dl_proto_validate(reply, &t, NULL) == 0 && dl_proto_is_reply_to(type, t));
        DL_FUZZ_REQUIRE(dl_proto_get_int(reply, "id", -1) == id);
    }
    check_strings(msg, 0);
    if (type == DL_PROTO_HELLO || type == DL_PROTO_AUTH_OK || type == DL_PROTO_AUTH)
        check_handshake(msg, type);
    if (type == DL_PROTO_REPLY) {
        const json_t *result = json_object_get(msg, "result");
        for (int t = 0; t < DL_PROTO_TYPE_COUNT; t++)
            if (dl_proto_type_kind((dl_proto_type_t)t) == DL_PROTO_KIND_REQUEST)
                (void)dl_proto_validate_result((dl_proto_type_t)t, result, NULL);
    }
}

/* Decodes the stream feeding at most piece bytes a call (0: all that is left) and returns the
 * outcomes in order: each message, {"invalid": code, "id", "message"} for a skipped frame,
 * {"fatal": code} for the end of the stream, and {"pending": bool} when the input ran out. */
static json_t *decode_stream(const uint8_t *data, size_t size, size_t piece, uint32_t limit)
{
    json_t *log = json_array();
    dl_proto_decoder_t dec;
    size_t off = 0;
    bool fatal = false;

    DL_FUZZ_REQUIRE(log != NULL);
    dl_proto_decoder_init(&dec, limit);
    while (off < size && !fatal) {
        size_t n = piece == 0 || piece > size - off ? size - off : piece;
        size_t used = SIZE_MAX;
        json_t *msg = NULL;
        dl_proto_type_t type = DL_PROTO_TYPE_NONE;
        dl_proto_error_t err;
        int r = dl_proto_decoder_feed(&dec, data + off, n, &used, &msg, &type, &err);

        DL_FUZZ_REQUIRE(used <= n);
        off += used;
        switch (r) {
        case DL_PROTO_NEED_MORE: DL_FUZZ_REQUIRE(used == n && msg == NULL); break;
        case DL_PROTO_MESSAGE:
            DL_FUZZ_REQUIRE(used > 0 && msg != NULL);
            check_message(msg, type);
            json_array_append_new(log, msg);
            break;
        case DL_PROTO_INVALID:
            DL_FUZZ_REQUIRE(used > 0 && msg == NULL);
            check_error(&err);
            json_array_append_new(log, json_pack("{s:s, s:I, s:s}", "invalid",
                                                 dl_proto_errcode_name(err.code), "id",
                                                 (json_int_t)err.id, "message", err.message));
            break;
        default:
            DL_FUZZ_REQUIRE(r == -EMSGSIZE && err.code == DL_PROTO_E_FRAME_TOO_LARGE);
            check_error(&err);
            json_array_append_new(log,
                                  json_pack("{s:s}", "fatal", dl_proto_errcode_name(err.code)));
            fatal = true;
            break;
        }
    }
    if (!fatal)
        json_array_append_new(log, json_pack("{s:b}", "pending", dl_proto_decoder_pending(&dec)));
    dl_proto_decoder_cleanup(&dec);
    return log;
}

/* Outcomes under the full limit match those under the pre-auth limit until the first frame
 * the smaller limit refused. */
static void check_limits_agree(const json_t *small, const json_t *large)
{
    size_t i;
    const json_t *entry;

    json_array_foreach (small, i, entry) {
        if (json_object_get(entry, "fatal") != NULL)
            return;
        DL_FUZZ_REQUIRE(json_equal(entry, json_array_get(large, i)));
    }
    DL_FUZZ_REQUIRE(json_array_size(small) == json_array_size(large));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_auto_t *whole = decode_stream(data, size, 0, DL_PROTO_LIMIT_PREAUTH);
    json_auto_t *bytes = decode_stream(data, size, 1, DL_PROTO_LIMIT_PREAUTH);
    json_auto_t *pieces =
        decode_stream(data, size, size > 0 ? 1 + data[size - 1] % 61 : 1, DL_PROTO_LIMIT_PREAUTH);
    json_auto_t *large = decode_stream(data, size, 0, DL_PROTO_LIMIT);

    DL_FUZZ_REQUIRE(json_equal(whole, bytes));
    DL_FUZZ_REQUIRE(json_equal(whole, pieces));
    check_limits_agree(whole, large);
    return 0;
}
