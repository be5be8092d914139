/* The generic reader and writer of records declared as field tables (record.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* Deeper than any message nests; a path longer than this is cut in the error, nothing else. */
#define PATH_MAX_BYTES 256

typedef struct {
    const char *where;
    char *err;
    size_t errlen;
    char path[PATH_MAX_BYTES];
} ctx_t;

#define AT(rec, off) ((char *)(rec) + (off))

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The bytes of a base64 text (padding optional, nothing after it), NUL-terminated, or NULL: not
 * base64 (*ret_len 0), or no memory (*ret_len 1). */
static char *unb64(const char *s, size_t n, size_t *ret_len)
{
    char *out = malloc(n / 4 * 3 + 4);
    size_t o = 0, i = 0;
    unsigned acc = 0;
    int bits = 0;
    *ret_len = 1;
    if (out == NULL)
        return NULL;
    for (; i < n && s[i] != '='; i++) {
        const char *p = s[i] != '\0' ? strchr(b64chars, s[i]) : NULL;
        if (p == NULL)
            break;
        acc = (acc << 6) | (unsigned)(p - b64chars);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    while (i < n && s[i] == '=')
        i++;
    if (i < n) {
        free(out);
        *ret_len = 0;
        return NULL;
    }
    out[o] = '\0';
    *ret_len = o;
    return out;
}

static json_t *b64(const unsigned char *p, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    size_t o = 0;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[o++] = b64chars[(v >> 18) & 63];
        out[o++] = b64chars[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64chars[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64chars[v & 63] : '=';
    }
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

static const char *type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "something else";
}

static int bad(ctx_t *c, size_t plen, const char *name, const char *want, const json_t *v)
{
    snprintf(c->err, c->errlen, "%s: field '%.*s%s' must be %s, got %s", c->where, (int)plen,
             c->path, name, want, type_word(v));
    return -EBADMSG;
}

/* Appends to the path: "name." or "name[i]."; returns the new length. */
static size_t path_push(ctx_t *c, size_t plen, const char *name, long long index)
{
    int n = index < 0 ? snprintf(c->path + plen, sizeof(c->path) - plen, "%s.", name)
                      : snprintf(c->path + plen, sizeof(c->path) - plen, "%s[%lld].", name, index);
    size_t end = plen + (n > 0 ? (size_t)n : 0);
    return end < sizeof(c->path) ? end : sizeof(c->path) - 1;
}

static int decode_obj(ctx_t *c, size_t plen, const dl_proto_rec_type_t *t, const json_t *obj,
                      void *rec);

static int decode_field(ctx_t *c, size_t plen, const dl_proto_rec_field_t *f, const json_t *v,
                        void *rec)
{
    void *m = AT(rec, f->offset);
    size_t i;
    const json_t *x;

    switch (f->kind) {
    case DL_PROTO_REC_STR:
        if (!json_is_string(v))
            return bad(c, plen, f->name, "a string", v);
        /* A NUL inside would cut the copy short without a word: the message is malformed. */
        if (strlen(json_string_value(v)) != json_string_length(v))
            return bad(c, plen, f->name, "a string without NUL bytes", v);
        *(char **)m = strdup(json_string_value(v));
        return *(char **)m != NULL ? 0 : -ENOMEM;
    case DL_PROTO_REC_INT:
        if (!json_is_integer(v))
            return bad(c, plen, f->name, "an integer", v);
        *(long long *)m = (long long)json_integer_value(v);
        return 0;
    case DL_PROTO_REC_I64: {
        const char *s = json_string_value(v);
        char *end = NULL;
        if (json_is_integer(v)) {
            *(int64_t *)m = (int64_t)json_integer_value(v);
            return 0;
        }
        errno = 0;
        long long n = s != NULL ? strtoll(s, &end, 10) : 0;
        if (s == NULL || s[0] == '\0' || *end != '\0' || errno != 0)
            return bad(c, plen, f->name, "a 64-bit integer (a number or a decimal string)", v);
        *(int64_t *)m = (int64_t)n;
        return 0;
    }
    case DL_PROTO_REC_BYTES: {
        size_t n = 0;
        if (!json_is_string(v))
            return bad(c, plen, f->name, "a base64 string", v);
        if ((*(char **)m = unb64(json_string_value(v), json_string_length(v), &n)) == NULL)
            return n == 0 ? bad(c, plen, f->name, "base64", v) : -ENOMEM;
        *(size_t *)AT(rec, f->count) = n;
        return 0;
    }
    case DL_PROTO_REC_REAL:
        if (!json_is_number(v))
            return bad(c, plen, f->name, "a number", v);
        *(double *)m = json_number_value(v);
        return 0;
    case DL_PROTO_REC_BOOL:
        if (!json_is_boolean(v))
            return bad(c, plen, f->name, "true or false", v);
        *(bool *)m = json_is_true(v);
        return 0;
    case DL_PROTO_REC_OBJ:
        if (!json_is_object(v))
            return bad(c, plen, f->name, "an object", v);
        if ((*(void **)m = calloc(1, f->sub->size)) == NULL)
            return -ENOMEM;
        return decode_obj(c, path_push(c, plen, f->name, -1), f->sub, v, *(void **)m);
    case DL_PROTO_REC_JSON:
        if (!json_is_object(v))
            return bad(c, plen, f->name, "an object", v);
        *(json_t **)m = json_incref((json_t *)v);
        return 0;
    case DL_PROTO_REC_LIST: {
        if (!json_is_array(v))
            return bad(c, plen, f->name, "an array of objects", v);
        char *items = calloc(json_array_size(v) + 1, f->sub->size);
        if (items == NULL)
            return -ENOMEM;
        /* Counted before it is filled: a failure half way frees every item, each whole or zero. */
        *(void **)m = items;
        *(size_t *)AT(rec, f->count) = json_array_size(v);
        json_array_foreach (v, i, x) {
            size_t ilen = path_push(c, plen, f->name, (long long)i);
            if (!json_is_object(x))
                return bad(c, ilen - 1, "", "an object", x);
            int r = decode_obj(c, ilen, f->sub, x, items + i * f->sub->size);
            if (r < 0)
                return r;
        }
        return 0;
    }
    case DL_PROTO_REC_INTV:
    case DL_PROTO_REC_REALV: {
        bool ints = f->kind == DL_PROTO_REC_INTV;
        if (!json_is_array(v))
            return bad(c, plen, f->name, ints ? "an array of integers" : "an array of numbers", v);
        void *arr = calloc(json_array_size(v) + 1, ints ? sizeof(long long) : sizeof(double));
        if (arr == NULL)
            return -ENOMEM;
        *(void **)m = arr;
        *(size_t *)AT(rec, f->count) = json_array_size(v);
        json_array_foreach (v, i, x) {
            if (ints ? !json_is_integer(x) : !json_is_number(x))
                return bad(c, path_push(c, plen, f->name, (long long)i) - 1, "",
                           ints ? "an integer" : "a number", x);
            if (ints)
                ((long long *)arr)[i] = (long long)json_integer_value(x);
            else
                ((double *)arr)[i] = json_number_value(x);
        }
        return 0;
    }
    case DL_PROTO_REC_COUNTS: {
        if (!json_is_object(v))
            return bad(c, plen, f->name, "an object of counts", v);
        dl_proto_rec_count_t *counts = calloc(json_object_size(v) + 1, sizeof(*counts));
        const char *key;
        size_t n = 0;
        if (counts == NULL)
            return -ENOMEM;
        *(dl_proto_rec_count_t **)m = counts;
        json_object_foreach ((json_t *)v, key, x) {
            if (!json_is_integer(x)) {
                size_t klen = path_push(c, plen, f->name, -1);
                return bad(c, klen, key, "an integer", x);
            }
            if ((counts[n].name = strdup(key)) == NULL)
                return -ENOMEM;
            counts[n++].n = (long long)json_integer_value(x);
            *(size_t *)AT(rec, f->count) = n;
        }
        return 0;
    }
    }
    snprintf(c->err, c->errlen, "%s: field '%.*s%s' has no reader", c->where, (int)plen, c->path,
             f->name);
    return -EINVAL;
}

static int decode_obj(ctx_t *c, size_t plen, const dl_proto_rec_type_t *t, const json_t *obj,
                      void *rec)
{
    for (const dl_proto_rec_field_t *f = t->fields; f->name != NULL; f++) {
        const json_t *v = json_object_get(obj, f->name);
        if (v == NULL || json_is_null(v)) {
            if (!f->required)
                continue;
            snprintf(c->err, c->errlen, "%s: missing field '%.*s%s'", c->where, (int)plen, c->path,
                     f->name);
            return -EBADMSG;
        }
        int r = decode_field(c, plen, f, v, rec);
        if (r < 0)
            return r;
        if (f->has != 0)
            *(bool *)AT(rec, f->has - 1) = true;
    }
    return 0;
}

int dl_proto_rec_decode(const dl_proto_rec_type_t *t, const json_t *obj, void *rec,
                        const char *where, char *err, size_t errlen)
{
    ctx_t c = {.where = where != NULL ? where : "reply", .err = err, .errlen = errlen};
    memset(rec, 0, t->size);
    if (errlen > 0)
        err[0] = '\0';
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s: must be an object, got %s", c.where,
                 obj != NULL ? type_word(obj) : "nothing");
        return -EBADMSG;
    }
    int r = decode_obj(&c, 0, t, obj, rec);
    if (r == -ENOMEM)
        snprintf(err, errlen, "%s: out of memory", c.where);
    if (r < 0)
        dl_proto_rec_free(t, rec);
    return r;
}

static json_t *encode_field(const dl_proto_rec_field_t *f, const void *rec)
{
    const void *m = AT(rec, f->offset);
    size_t n = f->kind >= DL_PROTO_REC_LIST ? *(const size_t *)AT(rec, f->count) : 0;
    json_t *v = NULL;

    switch (f->kind) {
    case DL_PROTO_REC_STR: return json_string(*(char *const *)m);
    case DL_PROTO_REC_INT: return json_integer((json_int_t) * (const long long *)m);
    case DL_PROTO_REC_REAL: return json_real(*(const double *)m);
    case DL_PROTO_REC_I64: {
        char buf[32];
        snprintf(buf, sizeof(buf), "%lld", (long long)*(const int64_t *)m);
        return json_string(buf);
    }
    case DL_PROTO_REC_BYTES: return b64(*(const unsigned char *const *)m, n);
    case DL_PROTO_REC_BOOL: return json_boolean(*(const bool *)m);
    case DL_PROTO_REC_OBJ: return dl_proto_rec_encode(f->sub, *(void *const *)m);
    case DL_PROTO_REC_JSON: return json_incref(*(json_t *const *)m);
    case DL_PROTO_REC_LIST:
        v = json_array();
        for (size_t i = 0; v != NULL && i < n; i++)
            if (json_array_append_new(
                    v, dl_proto_rec_encode(f->sub, *(char *const *)m + i * f->sub->size)) < 0) {
                json_decref(v);
                v = NULL;
            }
        return v;
    case DL_PROTO_REC_INTV:
    case DL_PROTO_REC_REALV:
        v = json_array();
        for (size_t i = 0; v != NULL && i < n; i++) {
            json_t *x = f->kind == DL_PROTO_REC_INTV
                            ? json_integer((json_int_t)(*(long long *const *)m)[i])
                            : json_real((*(double *const *)m)[i]);
            if (json_array_append_new(v, x) < 0) {
                json_decref(v);
                v = NULL;
            }
        }
        return v;
    case DL_PROTO_REC_COUNTS:
        v = json_object();
        for (size_t i = 0; v != NULL && i < n; i++) {
            const dl_proto_rec_count_t *k = &(*(dl_proto_rec_count_t *const *)m)[i];
            if (json_object_set_new(v, k->name, json_integer((json_int_t)k->n)) < 0) {
                json_decref(v);
                v = NULL;
            }
        }
        return v;
    }
    return NULL;
}

json_t *dl_proto_rec_encode(const dl_proto_rec_type_t *t, const void *rec)
{
    json_t *o = json_object();
    for (const dl_proto_rec_field_t *f = t->fields; o != NULL && f->name != NULL; f++) {
        const void *m = AT(rec, f->offset);
        if (f->has != 0 && !*(const bool *)AT(rec, f->has - 1))
            continue;
        /* A pointer member without a presence flag is present when set. */
        if ((f->kind == DL_PROTO_REC_STR || f->kind == DL_PROTO_REC_OBJ ||
             f->kind == DL_PROTO_REC_JSON || f->kind == DL_PROTO_REC_BYTES) &&
            *(void *const *)m == NULL)
            continue;
        json_t *v = encode_field(f, rec);
        if (v == NULL || json_object_set_new(o, f->name, v) < 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

void dl_proto_rec_free(const dl_proto_rec_type_t *t, void *rec)
{
    if (rec == NULL)
        return;
    for (const dl_proto_rec_field_t *f = t->fields; f->name != NULL; f++) {
        void *m = AT(rec, f->offset);
        size_t n = f->kind >= DL_PROTO_REC_LIST ? *(size_t *)AT(rec, f->count) : 0;
        switch (f->kind) {
        case DL_PROTO_REC_OBJ: dl_proto_rec_free(f->sub, *(void **)m); break;
        case DL_PROTO_REC_JSON:
            json_decref(*(json_t **)m);
            *(json_t **)m = NULL;
            break;
        case DL_PROTO_REC_LIST:
            for (size_t i = 0; *(char **)m != NULL && i < n; i++)
                dl_proto_rec_free(f->sub, *(char **)m + i * f->sub->size);
            break;
        case DL_PROTO_REC_COUNTS:
            for (size_t i = 0; *(void **)m != NULL && i < n; i++)
                free((*(dl_proto_rec_count_t **)m)[i].name);
            break;
        default: break;
        }
        if (f->kind == DL_PROTO_REC_STR || f->kind == DL_PROTO_REC_OBJ ||
            f->kind >= DL_PROTO_REC_LIST)
            free(*(void **)m);
    }
    memset(rec, 0, t->size);
}
