/* PyTorch's TCPStore framing (torch-codec.h): a query is checked against the limits as soon as
 * its lengths arrive, before the bytes they announce, so an oversized one is refused without
 * waiting for (or buffering) what it promises. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "torch-codec.h"

typedef struct {
    const uint8_t *p;
    size_t len, off;
} cursor_t;

/* What a read step found: the bytes are there, more are needed, or the query is bad. */
enum { GOT = 0, MORE = 1, BAD = 2 };

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int take_u64(cursor_t *c, uint64_t *v)
{
    if (c->len - c->off < 8)
        return MORE;
    *v = le64(c->p + c->off);
    c->off += 8;
    return GOT;
}

static void say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A length-prefixed string of at most max bytes (and at least min). */
static int take_bytes(cursor_t *c, size_t min, size_t max, const char *what, dl_torch_bytes_t *b,
                      char *err, size_t errlen)
{
    uint64_t n;
    if (take_u64(c, &n) == MORE)
        return MORE;
    if (n > max || n < min) {
        say(err, errlen, "%s of %llu bytes is outside %zu..%zu", what, (unsigned long long)n, min,
            max);
        return BAD;
    }
    if (c->len - c->off < n)
        return MORE;
    b->data = c->p + c->off;
    b->len = (size_t)n;
    c->off += (size_t)n;
    return GOT;
}

static int take_key(cursor_t *c, const dl_torch_limits_t *lim, dl_torch_bytes_t *b, char *err,
                    size_t errlen)
{
    return take_bytes(c, 1, lim->max_key_len, "key", b, err, errlen);
}

static int take_value(cursor_t *c, const dl_torch_limits_t *lim, dl_torch_bytes_t *b, char *err,
                      size_t errlen)
{
    return take_bytes(c, 0, lim->max_value_len, "value", b, err, errlen);
}

/* A u64 count and that many keys (with a value each when pairs). */
static int take_items(cursor_t *c, const dl_torch_limits_t *lim, bool pairs, dl_torch_query_t *q,
                      char *err, size_t errlen)
{
    if (take_u64(c, &q->nitems) == MORE)
        return MORE;
    if (q->nitems < 1 || q->nitems > lim->max_keys) {
        say(err, errlen, "%llu keys is outside 1..%zu", (unsigned long long)q->nitems,
            lim->max_keys);
        return BAD;
    }
    size_t start = c->off;
    for (uint64_t i = 0; i < q->nitems; i++) {
        dl_torch_bytes_t k, v;
        int r = take_key(c, lim, &k, err, errlen);
        if (r == GOT && pairs)
            r = take_value(c, lim, &v, err, errlen);
        if (r != GOT)
            return r;
        if (c->off > lim->max_query_len) {
            say(err, errlen, "query of more than %zu bytes", lim->max_query_len);
            return BAD;
        }
    }
    q->items.data = c->p + start;
    q->items.len = c->off - start;
    return GOT;
}

/* The v1 numbering, mapped onto ours (which is v2's). */
static const int v1_ops[] = {
    DL_TORCH_Q_SET,        DL_TORCH_Q_COMPARE_SET, DL_TORCH_Q_GET,        DL_TORCH_Q_ADD,
    DL_TORCH_Q_CHECK,      DL_TORCH_Q_WAIT,        DL_TORCH_Q_GETNUMKEYS, DL_TORCH_Q_WATCH_KEY,
    DL_TORCH_Q_DELETE_KEY, DL_TORCH_Q_APPEND,
};

int dl_torch_parse(const uint8_t *buf, size_t len, dl_torch_dialect_t *dialect,
                   const dl_torch_limits_t *lim, dl_torch_query_t *ret, char *err, size_t errlen)
{
    cursor_t c = {buf, len, 1};
    dl_torch_query_t q;
    dl_torch_dialect_t d = *dialect;
    int r = GOT;

    if (len < 1)
        return 0;
    memset(&q, 0, sizeof(q));
    /* The dialect is the connection's from its first whole query on. */
    if (d == DL_TORCH_DIALECT_UNKNOWN) {
        /* An old client's first query is not 0 + magic; an old SET (0) is 9 bytes or more. */
        if (buf[0] == 0 && len < 5)
            return 0;
        bool v2 = buf[0] == 0 && le32(buf + 1) == DL_TORCH_VALIDATE_MAGIC;
        d = v2 ? DL_TORCH_DIALECT_V2 : DL_TORCH_DIALECT_V1;
        if (v2) {
            *dialect = d;
            memset(ret, 0, sizeof(*ret));
            ret->op = DL_TORCH_Q_VALIDATE;
            ret->nonce = DL_TORCH_VALIDATE_MAGIC;
            return 5;
        }
    }
    if (d == DL_TORCH_DIALECT_V1) {
        if (buf[0] >= sizeof(v1_ops) / sizeof(v1_ops[0])) {
            say(err, errlen, "unknown query type %u (torch <= 2.0 numbering)", buf[0]);
            return -EPROTO;
        }
        q.op = (dl_torch_op_t)v1_ops[buf[0]];
    } else {
        if (buf[0] > DL_TORCH_Q_QUEUE_LEN) {
            say(err, errlen, "unknown query type %u", buf[0]);
            return -EPROTO;
        }
        q.op = (dl_torch_op_t)buf[0];
    }
    switch (q.op) {
    case DL_TORCH_Q_VALIDATE:
        if (len < 5)
            return 0;
        say(err, errlen, "validation %s after the first query",
            le32(buf + 1) == DL_TORCH_VALIDATE_MAGIC ? "repeated" : "with a wrong magic");
        return -EPROTO;
    case DL_TORCH_Q_SET:
    case DL_TORCH_Q_APPEND:
    case DL_TORCH_Q_QUEUE_PUSH:
        r = take_key(&c, lim, &q.key, err, errlen);
        if (r == GOT)
            r = take_value(&c, lim, &q.value, err, errlen);
        break;
    case DL_TORCH_Q_COMPARE_SET:
        r = take_key(&c, lim, &q.key, err, errlen);
        if (r == GOT)
            r = take_value(&c, lim, &q.value, err, errlen);
        if (r == GOT)
            r = take_value(&c, lim, &q.desired, err, errlen);
        break;
    case DL_TORCH_Q_GET:
    case DL_TORCH_Q_DELETE_KEY:
    case DL_TORCH_Q_QUEUE_POP:
    case DL_TORCH_Q_QUEUE_LEN:
    case DL_TORCH_Q_WATCH_KEY: r = take_key(&c, lim, &q.key, err, errlen); break;
    case DL_TORCH_Q_ADD: {
        uint64_t delta;
        r = take_key(&c, lim, &q.key, err, errlen);
        if (r == GOT && take_u64(&c, &delta) == MORE)
            r = MORE;
        if (r == GOT)
            q.delta = (int64_t)delta;
        break;
    }
    case DL_TORCH_Q_CHECK:
    case DL_TORCH_Q_WAIT:
    case DL_TORCH_Q_MULTI_GET: r = take_items(&c, lim, false, &q, err, errlen); break;
    case DL_TORCH_Q_MULTI_SET: r = take_items(&c, lim, true, &q, err, errlen); break;
    case DL_TORCH_Q_PING:
        if (len - c.off < 4)
            return 0;
        q.nonce = le32(buf + c.off);
        c.off += 4;
        break;
    case DL_TORCH_Q_GETNUMKEYS:
    case DL_TORCH_Q_CANCEL_WAIT: break;
    }
    if (r == MORE)
        return 0;
    if (r == BAD)
        return -EMSGSIZE;
    *dialect = d;
    *ret = q;
    return (int)c.off;
}

bool dl_torch_items_next(const dl_torch_query_t *q, size_t *pos, dl_torch_bytes_t *key,
                         dl_torch_bytes_t *value)
{
    const uint8_t *p = q->items.data;
    size_t end = q->items.len;
    if (*pos + 8 > end)
        return false;
    key->len = (size_t)le64(p + *pos);
    key->data = p + *pos + 8;
    *pos += 8 + key->len;
    if (q->op == DL_TORCH_Q_MULTI_SET) {
        dl_torch_bytes_t v;
        v.len = (size_t)le64(p + *pos);
        v.data = p + *pos + 8;
        *pos += 8 + v.len;
        if (value != NULL)
            *value = v;
    }
    return true;
}

const char *dl_torch_op_name(dl_torch_op_t op)
{
    static const char *const names[] = {
        "validate",    "set",        "compare_set", "get",       "add",       "check",
        "wait",        "getnumkeys", "delete_key",  "append",    "multi_get", "multi_set",
        "cancel_wait", "ping",       "queue_push",  "queue_pop", "queue_len", "watch_key",
    };
    return (unsigned)op < sizeof(names) / sizeof(names[0]) ? names[op] : "unknown";
}

int dl_torch_put_u8(uint8_t *out, size_t cap, size_t *len, uint8_t v)
{
    if (cap - *len < 1)
        return -ENOBUFS;
    out[(*len)++] = v;
    return 0;
}

int dl_torch_put_u32(uint8_t *out, size_t cap, size_t *len, uint32_t v)
{
    if (cap - *len < 4)
        return -ENOBUFS;
    for (int i = 0; i < 4; i++)
        out[(*len)++] = (uint8_t)(v >> (8 * i));
    return 0;
}

int dl_torch_put_i64(uint8_t *out, size_t cap, size_t *len, int64_t v)
{
    uint64_t u = (uint64_t)v;
    if (cap - *len < 8)
        return -ENOBUFS;
    for (int i = 0; i < 8; i++)
        out[(*len)++] = (uint8_t)(u >> (8 * i));
    return 0;
}

int dl_torch_put_bytes(uint8_t *out, size_t cap, size_t *len, const void *data, size_t n)
{
    if (cap - *len < 8 || cap - *len - 8 < n)
        return -ENOBUFS;
    dl_torch_put_i64(out, cap, len, (int64_t)n);
    if (n > 0)
        memcpy(out + *len, data, n);
    *len += n;
    return 0;
}
