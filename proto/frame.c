/* Frames: a 4-byte big-endian length, then that many bytes of JSON. The decoder is a pure state
 * machine fed whatever the socket delivered; it never reads, writes or waits. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A connection keeps a body buffer between frames only while it is this small, so a burst of
 * large frames does not pin a megabyte on every idle connection. */
#define KEEP_BUF_MAX 65536
/* The first allocation for a frame that arrives in pieces; it doubles from there. */
#define GROW_MIN 4096

/* ---- Encoding ---- */

typedef struct {
    char *buf;
    size_t len, cap;
    bool too_large;
} outbuf_t;

static int outbuf_append(const char *data, size_t size, void *opaque)
{
    outbuf_t *out = opaque;

    if (out->len - DL_PROTO_HEADER_LEN + size > DL_PROTO_LIMIT) {
        out->too_large = true;
        return -1;
    }
    if (out->len + size > out->cap) {
        size_t cap = out->cap * 2;
        char *p;
        while (cap < out->len + size)
            cap *= 2;
        p = realloc(out->buf, cap);
        if (p == NULL)
            return -1;
        out->buf = p;
        out->cap = cap;
    }
    memcpy(out->buf + out->len, data, size);
    out->len += size;
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

int dl_proto_encode(const json_t *msg, char **ret_frame, size_t *ret_len, dl_proto_error_t *err)
{
    outbuf_t out = {.len = DL_PROTO_HEADER_LEN, .cap = 256};
    dl_proto_type_t type;
    int r;

    r = dl_proto_validate(msg, &type, err);
    if (r < 0)
        return r;
    out.buf = malloc(out.cap);
    if (out.buf == NULL) {
        dl__proto_error_set(err, DL_PROTO_E_INTERNAL, "out of memory");
        return -ENOMEM;
    }
    /* Compact output keeps insertion order, so frames are as the sender built them. */
    if (json_dump_callback(msg, outbuf_append, &out, JSON_COMPACT) < 0) {
        free(out.buf);
        if (out.too_large) {
            dl__proto_error_set(err, DL_PROTO_E_FRAME_TOO_LARGE,
                                "%s: message is over the frame limit of %u bytes",
                                dl_proto_type_name(type), DL_PROTO_LIMIT);
            return -EMSGSIZE;
        }
        dl__proto_error_set(err, DL_PROTO_E_INTERNAL, "%s: out of memory while encoding",
                            dl_proto_type_name(type));
        return -ENOMEM;
    }
    put_be32((uint8_t *)out.buf, (uint32_t)(out.len - DL_PROTO_HEADER_LEN));
    *ret_frame = out.buf;
    *ret_len = out.len;
    return 0;
}

/* ---- Decoding one body ---- */

int dl_proto_decode(const void *body, size_t len, json_t **ret_msg, dl_proto_type_t *ret_type,
                    dl_proto_error_t *err)
{
    json_error_t jerr;
    json_auto_t *msg = NULL;
    const char *nul;
    dl_proto_type_t type;
    int r;

    dl__proto_error_reset(err);
    if (len == 0)
        return dl__proto_error_set(err, DL_PROTO_E_EMPTY_FRAME, "empty frame (length 0)");
    /* Jansson skips a raw NUL between tokens as if it were whitespace; JSON text never holds
     * one, and two parsers must not disagree on what a frame says, so refuse it outright. */
    nul = memchr(body, '\0', len);
    if (nul != NULL)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_JSON, "bad JSON: NUL byte at byte %zu",
                                   (size_t)(nul - (const char *)body));
    /* DECODE_ANY so that a bare string or number is reported as "not an object" rather than as a
     * syntax error; duplicate keys are refused so that no two readers can disagree on which
     * "type" or "id" a message has. */
    msg = json_loadb(body, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (msg == NULL) {
        if (json_error_code(&jerr) == json_error_out_of_memory) {
            dl__proto_error_set(err, DL_PROTO_E_INTERNAL, "out of memory parsing a frame");
            return -ENOMEM;
        }
        return dl__proto_error_set(err, DL_PROTO_E_BAD_JSON,
                                   "bad JSON at line %d, column %d (byte %d): %s", jerr.line,
                                   jerr.column, jerr.position, jerr.text);
    }
    r = dl_proto_validate(msg, &type, err);
    if (r < 0)
        return r;
    *ret_msg = json_incref(msg);
    *ret_type = type;
    return 0;
}

/* ---- The incremental decoder ---- */

void dl_proto_decoder_init(dl_proto_decoder_t *dec, uint32_t limit)
{
    memset(dec, 0, sizeof(*dec));
    dl_proto_decoder_set_limit(dec, limit);
}

void dl_proto_decoder_set_limit(dl_proto_decoder_t *dec, uint32_t limit)
{
    dec->limit = limit < DL_PROTO_LIMIT ? limit : DL_PROTO_LIMIT;
}

void dl_proto_decoder_cleanup(dl_proto_decoder_t *dec)
{
    if (dec == NULL)
        return;
    free(dec->buf);
    dec->buf = NULL;
    dec->buf_cap = 0;
    dec->buf_have = 0;
    dec->header_have = 0;
}

bool dl_proto_decoder_pending(const dl_proto_decoder_t *dec)
{
    return dec->header_have > 0 || dec->buf_have > 0;
}

size_t dl_proto_decoder_buffered(const dl_proto_decoder_t *dec)
{
    return dec->buf_cap;
}

static int fail(dl_proto_decoder_t *dec, int r, dl_proto_errcode_t code)
{
    dec->failed = r;
    dec->failed_code = code;
    return r;
}

/* Ends the frame in progress: the next byte starts a header. */
static void frame_done(dl_proto_decoder_t *dec)
{
    dec->offset += DL_PROTO_HEADER_LEN + (uint64_t)dec->body_len;
    dec->header_have = 0;
    dec->buf_have = 0;
    dec->body_len = 0;
    if (dec->buf_cap > KEEP_BUF_MAX) {
        free(dec->buf);
        dec->buf = NULL;
        dec->buf_cap = 0;
    }
}

/* Parses a complete body and turns the outcome into the decoder's return value. */
static int finish(dl_proto_decoder_t *dec, const void *body, size_t len, json_t **ret_msg,
                  dl_proto_type_t *ret_type, dl_proto_error_t *err)
{
    uint64_t offset = dec->offset;
    json_t *msg;
    dl_proto_type_t type;
    int r;

    r = dl_proto_decode(body, len, &msg, &type, err);
    frame_done(dec);
    if (r == -ENOMEM)
        return fail(dec, r, DL_PROTO_E_INTERNAL);
    if (r < 0) {
        if (err != NULL) {
            /* Say which frame; the body's own message names the field. */
            char inner[DL_PROTO_ERRMSG_LEN];
            memcpy(inner, err->message, sizeof(inner));
            dl__proto_error_set(err, err->code, "frame at byte %" PRIu64 ": %s", offset, inner);
        }
        return DL_PROTO_INVALID;
    }
    *ret_msg = msg;
    *ret_type = type;
    return DL_PROTO_MESSAGE;
}

int dl_proto_decoder_feed(dl_proto_decoder_t *dec, const void *data, size_t len,
                          size_t *ret_consumed, json_t **ret_msg, dl_proto_type_t *ret_type,
                          dl_proto_error_t *err)
{
    const uint8_t *p = data;
    size_t used = 0, n;

    dl__proto_error_reset(err);
    *ret_consumed = 0;
    if (dec->failed < 0) {
        dl__proto_error_set(err, dec->failed_code, "the stream already failed at byte %" PRIu64,
                            dec->offset);
        return dec->failed;
    }
    if (len == 0)
        return DL_PROTO_NEED_MORE;

    if (dec->header_have < DL_PROTO_HEADER_LEN) {
        n = DL_PROTO_HEADER_LEN - dec->header_have;
        n = n < len ? n : len;
        memcpy(dec->header + dec->header_have, p, n);
        dec->header_have += (uint8_t)n;
        used += n;
        *ret_consumed = used;
        if (dec->header_have < DL_PROTO_HEADER_LEN)
            return DL_PROTO_NEED_MORE;

        /* Checked here, before any allocation: 0xFFFFFFFF costs us four bytes and no more. */
        dec->body_len = get_be32(dec->header);
        if (dec->body_len > dec->limit) {
            dl__proto_error_set(err, DL_PROTO_E_FRAME_TOO_LARGE,
                                "frame at byte %" PRIu64 ": length %" PRIu32
                                " exceeds the limit of %" PRIu32 " bytes",
                                dec->offset, dec->body_len, dec->limit);
            return fail(dec, -EMSGSIZE, DL_PROTO_E_FRAME_TOO_LARGE);
        }
        if (dec->body_len == 0)
            return finish(dec, p, 0, ret_msg, ret_type, err);
    }

    /* The usual case: the whole body is in this read, so parse it where it lies. */
    if (dec->buf_have == 0 && len - used >= dec->body_len) {
        n = dec->body_len;
        *ret_consumed = used + n;
        return finish(dec, p + used, n, ret_msg, ret_type, err);
    }

    n = dec->body_len - dec->buf_have;
    n = n < len - used ? n : len - used;
    /* A read that ended right after the header: nothing to keep yet (and no buffer to keep it
     * in). */
    if (n == 0)
        return DL_PROTO_NEED_MORE;
    /* Grown with what arrived, doubling, not sized by the length announced: a peer that
     * announces 1 MiB and sends a byte costs a few KiB. */
    if (dec->buf_cap < dec->buf_have + n) {
        size_t cap = dec->buf_cap > 0 ? dec->buf_cap : GROW_MIN;
        while (cap < dec->buf_have + n)
            cap *= 2;
        if (cap > dec->body_len)
            cap = dec->body_len;
        char *buf = realloc(dec->buf, cap);
        if (buf == NULL) {
            dl__proto_error_set(err, DL_PROTO_E_INTERNAL,
                                "frame at byte %" PRIu64 ": out of memory for %zu bytes",
                                dec->offset, cap);
            return fail(dec, -ENOMEM, DL_PROTO_E_INTERNAL);
        }
        dec->buf = buf;
        dec->buf_cap = cap;
    }
    memcpy(dec->buf + dec->buf_have, p + used, n);
    dec->buf_have += n;
    used += n;
    *ret_consumed = used;
    if (dec->buf_have < dec->body_len)
        return DL_PROTO_NEED_MORE;
    return finish(dec, dec->buf, dec->body_len, ret_msg, ret_type, err);
}
