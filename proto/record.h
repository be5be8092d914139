/* A JSON object's fields declared once, as data: a table of rows over a C struct (after systemd's
 * sd_json_dispatch tables), read by one generic decoder (JSON -> struct) and written by one
 * generic encoder (struct -> JSON, in the table's order). A message is its struct and its table,
 * so adding a field is one row; the decoder names the first field that is not as its row says,
 * so a malformed message is one clear line, never a crash. status-reply.h is the first user. */
#ifndef DL_PROTO_RECORD_H
#define DL_PROTO_RECORD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum {
    DL_PROTO_REC_STR,  /* char *, a copy the record owns */
    DL_PROTO_REC_INT,  /* long long, from an integer */
    DL_PROTO_REC_REAL, /* double, from any number */
    DL_PROTO_REC_BOOL, /* bool, from true or false */
    DL_PROTO_REC_OBJ,  /* a pointer to a record of sub, NULL when absent */
    DL_PROTO_REC_JSON, /* json_t *, an object kept whole (a part whose one codec is another's:
                        * a culprit, a heartbeat); a reference the record owns, NULL when absent */
    /* int64_t, from an integer or a decimal string: protobuf's JSON form of a 64-bit number,
     * which etcd's gateway answers in; written as a decimal string */
    DL_PROTO_REC_I64,
    DL_PROTO_REC_LIST,  /* a pointer to an array of records of sub; its length at count */
    DL_PROTO_REC_INTV,  /* long long *, an array of integers; its length at count */
    DL_PROTO_REC_REALV, /* double *, an array of numbers; its length at count */
    DL_PROTO_REC_COUNTS, /* dl_proto_rec_count_t *, an object of name -> integer in its order; length at count */
    /* char *, from a base64 string (protobuf's JSON form of bytes: etcd's keys and values),
     * NUL-terminated, its length (without the NUL) at count; NULL when absent */
    DL_PROTO_REC_BYTES,
} dl_proto_rec_kind_t;

typedef struct {
    char *name;
    long long n;
} dl_proto_rec_count_t;

typedef struct dl_proto_rec_type_s dl_proto_rec_type_t;

typedef struct dl_proto_rec_field_s {
    const char *name; /* NULL ends a table */
    dl_proto_rec_kind_t kind;
    bool required; /* absent (or null) is an error; else absent leaves the member zero */
    size_t offset; /* of the member */
    /* 1 + the offset of a bool member set when the field is there, and which the encoder
     * reads to write the field or not; 0: none (written always, or when not NULL). */
    size_t has;
    size_t count; /* LIST, INTV, REALV, COUNTS, BYTES: the offset of the size_t length */
    const dl_proto_rec_type_t *sub;
} dl_proto_rec_field_t;

struct dl_proto_rec_type_s {
    size_t size; /* of the struct */
    const dl_proto_rec_field_t *fields;
};

/* Reads obj into rec (a struct of t->size, cleared first). A field that is absent or null is
 * absent; fields the table does not name are ignored. Returns 0, or -EBADMSG with one line in
 * err naming the field (path "where: field 'jobs[0].nodes[1].slots' must be an integer, got a
 * string"), or -ENOMEM; rec is then cleared again, holding nothing. */
int dl_proto_rec_decode(const dl_proto_rec_type_t *t, const json_t *obj, void *rec,
                        const char *where, char *err, size_t errlen);

/* The JSON object of rec, fields in the table's order: a new reference, or NULL (no memory). */
json_t *dl_proto_rec_encode(const dl_proto_rec_type_t *t, const void *rec);

/* Frees what rec holds (not rec itself) and clears it; accepts NULL. */
void dl_proto_rec_free(const dl_proto_rec_type_t *t, void *rec);

#endif
