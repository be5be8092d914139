/* PyTorch's TCPStore wire protocol, as a pure decoder and encoder: no sockets, no allocation.
 *
 * Two dialects exist. Torch up to 2.0 (Debian's 1.13) sends queries straight away, numbered
 * SET=0, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY, APPEND. Newer
 * clients open with VALIDATE (0) and a 32-bit magic, and number the rest one higher (SET=1 ...
 * GETNUMKEYS=7), then DELETE_KEY=8, APPEND=9, MULTI_GET, MULTI_SET, CANCEL_WAIT, PING,
 * QUEUE_PUSH, QUEUE_POP, QUEUE_LEN. A connection's first query tells which: a 0 followed by the
 * magic cannot be an old SET, whose key length would be over any limit. Integers are
 * little-endian (the host order of every machine torch runs on); strings and byte vectors are a
 * u64 length and the bytes; key lists are a u64 count and that many strings. See docs/store.md. */
#ifndef DL_TORCH_CODEC_H
#define DL_TORCH_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DL_TORCH_VALIDATE_MAGIC 0x3C85F7CEu

typedef enum {
    DL_TORCH_DIALECT_UNKNOWN = 0, /* no query seen yet */
    DL_TORCH_DIALECT_V1,          /* torch <= 2.0: no handshake */
    DL_TORCH_DIALECT_V2,          /* torch >= 2.1: VALIDATE first */
} dl_torch_dialect_t;

typedef enum {
    DL_TORCH_Q_VALIDATE = 0,
    DL_TORCH_Q_SET,
    DL_TORCH_Q_COMPARE_SET,
    DL_TORCH_Q_GET,
    DL_TORCH_Q_ADD,
    DL_TORCH_Q_CHECK,
    DL_TORCH_Q_WAIT,
    DL_TORCH_Q_GETNUMKEYS,
    DL_TORCH_Q_DELETE_KEY,
    DL_TORCH_Q_APPEND,
    DL_TORCH_Q_MULTI_GET,
    DL_TORCH_Q_MULTI_SET,
    DL_TORCH_Q_CANCEL_WAIT,
    DL_TORCH_Q_PING,
    DL_TORCH_Q_QUEUE_PUSH,
    DL_TORCH_Q_QUEUE_POP,
    DL_TORCH_Q_QUEUE_LEN,
    DL_TORCH_Q_WATCH_KEY, /* v1 only */
} dl_torch_op_t;

/* The answers of CHECK and WAIT, one byte each. */
#define DL_TORCH_CHECK_READY 0
#define DL_TORCH_CHECK_NOT_READY 1
#define DL_TORCH_WAIT_STOP_WAITING 0
#define DL_TORCH_WAIT_CANCELED 1

typedef struct {
    size_t max_key_len;   /* bytes of a key; 0 is refused too */
    size_t max_value_len; /* bytes of a value */
    size_t max_keys;      /* keys in one CHECK, WAIT, MULTI_GET, MULTI_SET */
    size_t max_query_len; /* bytes of one query, at most INT_MAX */
} dl_torch_limits_t;

typedef struct {
    const uint8_t *data;
    size_t len;
} dl_torch_bytes_t;

/* One query. Pointers point into the buffer given to dl_torch_parse. */
typedef struct {
    dl_torch_op_t op;
    dl_torch_bytes_t key;     /* SET, COMPARE_SET, GET, ADD, DELETE_KEY, APPEND, QUEUE_*, WATCH */
    dl_torch_bytes_t value;   /* SET, APPEND, QUEUE_PUSH; COMPARE_SET: the expected value */
    dl_torch_bytes_t desired; /* COMPARE_SET */
    int64_t delta;            /* ADD */
    uint32_t nonce;           /* VALIDATE: the magic; PING: echoed */
    uint64_t nitems;          /* CHECK, WAIT, MULTI_GET: keys; MULTI_SET: key-value pairs */
    dl_torch_bytes_t items;   /* those items as sent: read them with dl_torch_items_next */
} dl_torch_query_t;

/* Decodes the query at the start of buf[0..len). *dialect is the connection's (set here by its
 * first query). Returns the bytes the query took (> 0) with *ret filled; 0 when more bytes are
 * needed; -EMSGSIZE for a key, value or list over lim; -EPROTO for anything else torch would not
 * send (an unknown query type, a VALIDATE with another magic, a VALIDATE after the first query,
 * an empty key). On error err gets one line. Never reads past buf + len. */
int dl_torch_parse(const uint8_t *buf, size_t len, dl_torch_dialect_t *dialect,
                   const dl_torch_limits_t *lim, dl_torch_query_t *ret, char *err, size_t errlen);

/* Walks q->items: the next key (and, for MULTI_SET, its value; value may be NULL otherwise).
 * *pos starts at 0. Returns true while there is one. Only for queries dl_torch_parse returned. */
bool dl_torch_items_next(const dl_torch_query_t *q, size_t *pos, dl_torch_bytes_t *key,
                         dl_torch_bytes_t *value);

/* Name of a query type for logs: "set", "compare_set", ... */
const char *dl_torch_op_name(dl_torch_op_t op);

/* Encoders: append to out[*len..cap). Return 0, or -ENOBUFS (nothing written) when it does not
 * fit. */
int dl_torch_put_u8(uint8_t *out, size_t cap, size_t *len, uint8_t v);
int dl_torch_put_u32(uint8_t *out, size_t cap, size_t *len, uint32_t v);
int dl_torch_put_i64(uint8_t *out, size_t cap, size_t *len, int64_t v);
int dl_torch_put_bytes(uint8_t *out, size_t cap, size_t *len, const void *data, size_t n);

/* The size dl_torch_put_bytes needs for n bytes. */
#define DL_TORCH_BYTES_SIZE(n) (8 + (size_t)(n))

#endif
