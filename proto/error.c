/* Error codes and error replies. The code strings are a stable API: clients branch on them, so
 * one is never renamed or reused, only added. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static const char *const errcode_names[DL_PROTO_E_COUNT] = {
    [DL_PROTO_E_NONE] = "none",
    [DL_PROTO_E_FRAME_TOO_LARGE] = "frame_too_large",
    [DL_PROTO_E_EMPTY_FRAME] = "empty_frame",
    [DL_PROTO_E_BAD_JSON] = "bad_json",
    [DL_PROTO_E_NOT_OBJECT] = "not_object",
    [DL_PROTO_E_BAD_VERSION] = "bad_version",
    [DL_PROTO_E_UNSUPPORTED_VERSION] = "unsupported_version",
    [DL_PROTO_E_UNKNOWN_TYPE] = "unknown_type",
    [DL_PROTO_E_MISSING_FIELD] = "missing_field",
    [DL_PROTO_E_BAD_FIELD] = "bad_field",
    [DL_PROTO_E_AUTH_FAILED] = "auth_failed",
    [DL_PROTO_E_NOT_AUTHENTICATED] = "not_authenticated",
    [DL_PROTO_E_FORBIDDEN] = "forbidden",
    [DL_PROTO_E_UNEXPECTED] = "unexpected_message",
    [DL_PROTO_E_STALE_ROUND] = "stale_round",
    [DL_PROTO_E_NOT_FOUND] = "not_found",
    [DL_PROTO_E_TIMEOUT] = "timeout",
    [DL_PROTO_E_BAD_VALUE] = "bad_value",
    [DL_PROTO_E_CONFLICT] = "conflict",
    [DL_PROTO_E_SHUTTING_DOWN] = "shutting_down",
    [DL_PROTO_E_INTERNAL] = "internal",
    [DL_PROTO_E_LIMIT_EXCEEDED] = "limit_exceeded",
    [DL_PROTO_E_JOB_FULL] = "job_full",
    [DL_PROTO_E_OTHER] = "other",
};

const char *dl_proto_errcode_name(dl_proto_errcode_t code)
{
    if ((int)code < 0 || code >= DL_PROTO_E_COUNT)
        return NULL;
    return errcode_names[code];
}

dl_proto_errcode_t dl_proto_errcode_parse(const char *name)
{
    /* "none" and "other" are this library's own placeholders, not codes a peer may send. */
    for (int c = DL_PROTO_E_NONE + 1; c < DL_PROTO_E_OTHER; c++) {
        if (strcmp(errcode_names[c], name) == 0)
            return (dl_proto_errcode_t)c;
    }
    return DL_PROTO_E_OTHER;
}

void dl__proto_error_reset(dl_proto_error_t *err)
{
    if (err == NULL)
        return;
    err->code = DL_PROTO_E_NONE;
    err->id = -1;
    err->type = DL_PROTO_TYPE_NONE;
    err->message[0] = '\0';
}

/* Messages quote what the peer sent; keeping them printable ASCII means json_string() never
 * refuses them (a truncated UTF-8 sequence would) and a log line cannot be forged with a
 * newline. */
static void make_printable(char *s)
{
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c > 0x7e)
            *s = '?';
    }
}

int dl__proto_error_set(dl_proto_error_t *err, dl_proto_errcode_t code, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL)
        return -EBADMSG;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    make_printable(err->message);
    return -EBADMSG;
}

static json_t *error_build(json_int_t id, dl_proto_errcode_t code, const char *message)
{
    const char *name = dl_proto_errcode_name(code);
    json_t *msg;

    if (name == NULL || code == DL_PROTO_E_NONE)
        return NULL;
    msg = dl_proto_msg_new(DL_PROTO_ERROR, id);
    if (msg == NULL)
        return NULL;
    if (json_object_set_new(msg, "error",
                            json_pack("{s:s, s:s}", "code", name, "message", message)) < 0) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

json_t *dl_proto_error_new(json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
{
    char message[DL_PROTO_ERRMSG_LEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    make_printable(message);
    return error_build(id, code, message);
}

json_t *dl_proto_error_from(const dl_proto_error_t *err)
{
    char message[DL_PROTO_ERRMSG_LEN];

    snprintf(message, sizeof(message), "%s", err->message);
    make_printable(message);
    return error_build(err->id, err->code == DL_PROTO_E_NONE ? DL_PROTO_E_INTERNAL : err->code,
                       message);
}

dl_proto_errcode_t dl_proto_reply_error(const json_t *msg, const char **ret_message)
{
    const json_t *type = json_object_get(msg, "type");
    const json_t *error = json_object_get(msg, "error");
    const char *code = json_string_value(json_object_get(error, "code"));

    if (!json_is_string(type) || strcmp(json_string_value(type), "error") != 0 || code == NULL)
        return DL_PROTO_E_NONE;
    if (ret_message != NULL) {
        const char *text = json_string_value(json_object_get(error, "message"));
        *ret_message = text != NULL ? text : "";
    }
    return dl_proto_errcode_parse(code);
}

char *dl_proto_escape(const char *src, char *dst, size_t dstlen)
{
    static const char digits[] = "0123456789abcdef";
    size_t o = 0;

    for (const unsigned char *p = (const unsigned char *)(src != NULL ? src : ""); *p != '\0';
         p++) {
        bool plain = *p >= 0x20 && *p <= 0x7e && *p != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need >= dstlen)
            break;
        if (plain) {
            dst[o++] = (char)*p;
            continue;
        }
        dst[o++] = '\\';
        dst[o++] = 'x';
        dst[o++] = digits[*p >> 4];
        dst[o++] = digits[*p & 15];
    }
    dst[o] = '\0';
    return dst;
}
