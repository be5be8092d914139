/* Shared between the files of proto/: the message table and the error helpers. */
#ifndef DL_PROTO_INTERNAL_H
#define DL_PROTO_INTERNAL_H

#include "proto.h"

/* The JSON shape a field must have. */
typedef enum {
    DL__F_STR,         /* string of [min, max] bytes */
    DL__F_STR_OR_NULL, /* the same, or null */
    DL__F_INT,         /* integer in [min, max] */
    DL__F_NUM,         /* integer or real */
    DL__F_BOOL,        /* true or false */
    DL__F_OBJ,         /* object; its own fields in sub (NULL: anything) */
    DL__F_STRV,        /* array of [min, max] strings, each 1..DL_PROTO_KEY_MAX bytes */
    DL__F_HEX,         /* exactly min lowercase hex digits */
    DL__F_ROLE,        /* "agent", "worker" or "control" */
    DL__F_RUN_ID,      /* see dl_proto_run_id_valid() */
    DL__F_NAME,        /* [min, max] bytes of printable ASCII without space: node ids */
    DL__F_ADDR,        /* [min, max] bytes of [A-Za-z0-9._:%-] and brackets: hosts, addresses */
} dl__field_kind_t;

typedef struct dl__field_s {
    const char *name; /* NULL ends a list */
    dl__field_kind_t kind;
    bool required;
    json_int_t min, max;
    const struct dl__field_s *sub;
} dl__field_t;

typedef struct dl__msgdef_s {
    const char *name;
    dl_proto_kind_t kind;
    unsigned senders;          /* dl_proto_role_t bits */
    const dl__field_t *fields; /* never NULL; may be empty */
    /* For requests answered by a generic reply: the fields of its "result". */
    const dl__field_t *result;
    /* Rules between fields, run after the fields passed; NULL when there are none. */
    int (*check)(const json_t *msg, dl_proto_error_t *err);
} dl__msgdef_t;

extern const dl__msgdef_t dl__proto_messages[DL_PROTO_TYPE_COUNT];

/* Clears err (code NONE, id -1, type NONE, empty message); accepts NULL. */
void dl__proto_error_reset(dl_proto_error_t *err);

/* Sets code and a formatted message; bytes outside printable ASCII become '?', so the message
 * is always valid UTF-8 for the error reply and safe in a log line. Accepts NULL err.
 * Returns -EBADMSG, the usual return of a validation failure, for tail calls. */
int dl__proto_error_set(dl_proto_error_t *err, dl_proto_errcode_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Checks obj's fields against the list; where prefixes messages ("join", "kv_get reply"). */
int dl__proto_check_fields(const char *where, const char *prefix, const json_t *obj,
                           const dl__field_t *fields, dl_proto_error_t *err);

/* HMAC-SHA256 through libcrypto, loaded on first use (hmac.c). Returns 0, -ELIBACC when
 * libcrypto cannot be loaded, or -EIO. */
int dl__proto_hmac_raw(const void *key, int key_len, const void *data, size_t data_len,
                       unsigned char *mac, unsigned int *mac_len);

#endif
