/* The rows of a field table (record.h), as the tables of proto/ write them. Internal to proto/. */
#ifndef DL_PROTO_RECORD_ROWS_H
#define DL_PROTO_RECORD_ROWS_H

#include <stddef.h>

#include "record.h"

/* Rows of the table of struct T (defined before each table), a field named as its member.
 * REQ: the reply is malformed without it: the names a reader goes by. OPT: may be absent, then
 * zero or NULL, as the readers always took a missing figure. HAS: may be absent, its presence in
 * has_<member>. A field of the wrong type is malformed whatever its row. LIST, VEC, COUNTS: the length in n<member>; REQ_LIST is required, LIST_HAS and
 * COUNTS_HAS are optional as HAS is. */
#define REQ(k, m)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = (k), .required = true, .offset = offsetof(T, m)                        \
    }
#define OPT(k, m)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = (k), .offset = offsetof(T, m)                                          \
    }
#define HAS(k, m)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = (k), .offset = offsetof(T, m), .has = offsetof(T, has_##m) + 1         \
    }
#define OBJ(m, t)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_OBJ, .offset = offsetof(T, m), .sub = &(t)                \
    }
#define VEC(k, m)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = (k), .offset = offsetof(T, m), .count = offsetof(T, n##m)              \
    }
#define LIST(m, t)                                                                                 \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_LIST, .offset = offsetof(T, m),                           \
        .count = offsetof(T, n##m), .sub = &(t)                                                    \
    }
#define REQ_LIST(m, t)                                                                             \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_LIST, .required = true, .offset = offsetof(T, m),         \
        .count = offsetof(T, n##m), .sub = &(t)                                                    \
    }
#define LIST_HAS(m, t)                                                                             \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_LIST, .offset = offsetof(T, m),                           \
        .count = offsetof(T, n##m), .has = offsetof(T, has_##m) + 1, .sub = &(t)                   \
    }
#define COUNTS(m)                                                                                  \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_COUNTS, .offset = offsetof(T, m),                         \
        .count = offsetof(T, n##m)                                                                 \
    }
#define COUNTS_HAS(m)                                                                              \
    {                                                                                              \
        .name = #m, .kind = DL_PROTO_REC_COUNTS, .offset = offsetof(T, m),                         \
        .count = offsetof(T, n##m), .has = offsetof(T, has_##m) + 1                                \
    }
#define END                                                                                        \
    {                                                                                              \
        .name = NULL                                                                               \
    }

#endif
