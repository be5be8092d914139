/* libFuzzer target for PyTorch's TCPStore framing (rendezvous/torch-codec.h).
 *
 * The input is the byte stream one torch client's connection delivers. It is decoded several
 * ways, and the ways must agree, so the fuzzer finds wrong answers as well as crashes:
 *   - all at once, and fed as the server is fed (pieces whose size the input picks, an
 *     unfinished query kept and extended): the same queries, the same end;
 *   - every query, written out again from its fields, is exactly the bytes it was read from;
 *   - keys, values and lists within the limits; a list's walk ends exactly at its end;
 *   - a refusal has a one-line reason.
 * A broken rule calls abort(). The ordinary build replays fuzz/corpus/torch/ through this entry
 * point (fuzz/replay.c, the unit test torch-replay).
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-torch
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "torch-codec.h"

#define MAX_QUERIES 4096

static const dl_torch_limits_t lim = {
    .max_key_len = 64, .max_value_len = 256, .max_keys = 8, .max_query_len = 4096};

typedef struct {
    dl_torch_op_t op;
    size_t len;
} seen_t;

typedef struct {
    seen_t q[MAX_QUERIES];
    size_t n;
    int end; /* 0: ran out of bytes, else the error */
    size_t leftover;
} outcome_t;

static void put(uint8_t *out, size_t cap, size_t *len, const dl_torch_bytes_t *b)
{
    DL_FUZZ_REQUIRE(dl_torch_put_bytes(out, cap, len, b->data, b->len) == 0);
}

static uint8_t type_byte(dl_torch_dialect_t d, dl_torch_op_t op)
{
    static const dl_torch_op_t v1[] = {
        DL_TORCH_Q_SET,        DL_TORCH_Q_COMPARE_SET, DL_TORCH_Q_GET,        DL_TORCH_Q_ADD,
        DL_TORCH_Q_CHECK,      DL_TORCH_Q_WAIT,        DL_TORCH_Q_GETNUMKEYS, DL_TORCH_Q_WATCH_KEY,
        DL_TORCH_Q_DELETE_KEY, DL_TORCH_Q_APPEND,
    };
    if (d == DL_TORCH_DIALECT_V2) {
        DL_FUZZ_REQUIRE(op != DL_TORCH_Q_WATCH_KEY);
        return (uint8_t)op;
    }
    for (uint8_t i = 0; i < sizeof(v1) / sizeof(v1[0]); i++)
        if (v1[i] == op)
            return i;
    abort();
}

static void check_key(const dl_torch_bytes_t *k)
{
    DL_FUZZ_REQUIRE(k->len >= 1 && k->len <= lim.max_key_len && k->data != NULL);
}

/* Writes q out again, as its client would have, and compares with what it was read from. */
static void reencode(dl_torch_dialect_t d, const dl_torch_query_t *q, const uint8_t *orig,
                     size_t len)
{
    static uint8_t out[8192];
    size_t n = 0, cap = sizeof(out);
    if (q->op == DL_TORCH_Q_VALIDATE) {
        DL_FUZZ_REQUIRE(len == 5 && d == DL_TORCH_DIALECT_V2);
        DL_FUZZ_REQUIRE(dl_torch_put_u8(out, cap, &n, 0) == 0);
        DL_FUZZ_REQUIRE(dl_torch_put_u32(out, cap, &n, q->nonce) == 0);
        DL_FUZZ_REQUIRE(memcmp(out, orig, n) == 0);
        return;
    }
    DL_FUZZ_REQUIRE(dl_torch_put_u8(out, cap, &n, type_byte(d, q->op)) == 0);
    switch (q->op) {
    case DL_TORCH_Q_SET:
    case DL_TORCH_Q_APPEND:
    case DL_TORCH_Q_QUEUE_PUSH:
        check_key(&q->key);
        DL_FUZZ_REQUIRE(q->value.len <= lim.max_value_len);
        put(out, cap, &n, &q->key);
        put(out, cap, &n, &q->value);
        break;
    case DL_TORCH_Q_COMPARE_SET:
        check_key(&q->key);
        DL_FUZZ_REQUIRE(q->value.len <= lim.max_value_len && q->desired.len <= lim.max_value_len);
        put(out, cap, &n, &q->key);
        put(out, cap, &n, &q->value);
        put(out, cap, &n, &q->desired);
        break;
    case DL_TORCH_Q_GET:
    case DL_TORCH_Q_DELETE_KEY:
    case DL_TORCH_Q_QUEUE_POP:
    case DL_TORCH_Q_QUEUE_LEN:
    case DL_TORCH_Q_WATCH_KEY:
        check_key(&q->key);
        put(out, cap, &n, &q->key);
        break;
    case DL_TORCH_Q_ADD:
        check_key(&q->key);
        put(out, cap, &n, &q->key);
        DL_FUZZ_REQUIRE(dl_torch_put_i64(out, cap, &n, q->delta) == 0);
        break;
    case DL_TORCH_Q_CHECK:
    case DL_TORCH_Q_WAIT:
    case DL_TORCH_Q_MULTI_GET:
    case DL_TORCH_Q_MULTI_SET: {
        DL_FUZZ_REQUIRE(q->nitems >= 1 && q->nitems <= lim.max_keys);
        DL_FUZZ_REQUIRE(dl_torch_put_i64(out, cap, &n, (int64_t)q->nitems) == 0);
        size_t pos = 0, count = 0;
        dl_torch_bytes_t k, v = {NULL, 0};
        while (dl_torch_items_next(q, &pos, &k, &v)) {
            check_key(&k);
            put(out, cap, &n, &k);
            if (q->op == DL_TORCH_Q_MULTI_SET) {
                DL_FUZZ_REQUIRE(v.len <= lim.max_value_len);
                put(out, cap, &n, &v);
            }
            count++;
        }
        DL_FUZZ_REQUIRE(count == q->nitems && pos == q->items.len);
        break;
    }
    case DL_TORCH_Q_PING: DL_FUZZ_REQUIRE(dl_torch_put_u32(out, cap, &n, q->nonce) == 0); break;
    case DL_TORCH_Q_GETNUMKEYS:
    case DL_TORCH_Q_CANCEL_WAIT: break;
    default: abort();
    }
    DL_FUZZ_REQUIRE(n == len && memcmp(out, orig, len) == 0);
}

/* Parses what p[0..len) holds whole; returns the bytes used, or -1 with o->end set. */
static long parse_all(const uint8_t *p, size_t len, dl_torch_dialect_t *d, outcome_t *o)
{
    size_t used = 0;
    char err[256];
    while (used < len) {
        dl_torch_query_t q;
        dl_torch_dialect_t before = *d;
        err[0] = '\0';
        int r = dl_torch_parse(p + used, len - used, d, &lim, &q, err, sizeof(err));
        if (r == 0) {
            DL_FUZZ_REQUIRE(*d == before);
            break;
        }
        if (r < 0) {
            DL_FUZZ_REQUIRE(r == -EPROTO || r == -EMSGSIZE);
            DL_FUZZ_REQUIRE(err[0] != '\0' && strchr(err, '\n') == NULL);
            o->end = r;
            return -1;
        }
        DL_FUZZ_REQUIRE((size_t)r <= len - used && (size_t)r <= lim.max_query_len + 16);
        DL_FUZZ_REQUIRE(*d != DL_TORCH_DIALECT_UNKNOWN);
        reencode(*d, &q, p + used, (size_t)r);
        if (o->n < MAX_QUERIES)
            o->q[o->n++] = (seen_t){q.op, (size_t)r};
        used += (size_t)r;
    }
    return (long)used;
}

static outcome_t whole, pieces;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    /* The first byte picks the piece sizes; the rest is the stream. */
    unsigned step = data[0] % 16 + 1;
    const uint8_t *stream = data + 1;
    size_t len = size - 1;

    memset(&whole, 0, sizeof(whole));
    dl_torch_dialect_t d = DL_TORCH_DIALECT_UNKNOWN;
    long used = parse_all(stream, len, &d, &whole);
    if (used >= 0)
        whole.leftover = len - (size_t)used;

    /* As the server reads: pieces appended to what is left of an unfinished query. */
    memset(&pieces, 0, sizeof(pieces));
    d = DL_TORCH_DIALECT_UNKNOWN;
    uint8_t *held = malloc(len ? len : 1);
    DL_FUZZ_REQUIRE(held != NULL);
    size_t nheld = 0;
    for (size_t off = 0; off < len && pieces.end == 0;) {
        size_t n = len - off < step ? len - off : step;
        memcpy(held + nheld, stream + off, n);
        nheld += n;
        off += n;
        long u = parse_all(held, nheld, &d, &pieces);
        if (u < 0)
            break;
        memmove(held, held + u, nheld - (size_t)u);
        nheld -= (size_t)u;
    }
    if (pieces.end == 0)
        pieces.leftover = nheld;
    free(held);

    DL_FUZZ_REQUIRE(whole.end == pieces.end && whole.n == pieces.n);
    for (size_t i = 0; i < whole.n; i++)
        DL_FUZZ_REQUIRE(whole.q[i].op == pieces.q[i].op && whole.q[i].len == pieces.q[i].len);
    if (whole.end == 0)
        DL_FUZZ_REQUIRE(whole.leftover == pieces.leftover);
    return 0;
}
