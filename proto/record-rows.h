/* Shorthands for the rows of a field table (record.h), over the struct named T at the place of
 * use: a field is named as its member. Included by the .c files that hold tables only.
 *
 * REQ: malformed without it (the names a reader goes by). OPT: may be absent, then zero or NULL.
 * HAS: may be absent, its presence in has_<member> (which the encoder reads). A field of the
 * wrong type is malformed whatever its row. VEC, LIST, COUNTS: the length in n<member>;
 * REQ_LIST is required, LIST_HAS and COUNTS_HAS are optional as HAS is. */
#ifndef DL_PROTO_RECORD_ROWS_H
#define DL_PROTO_RECORD_ROWS_H

#include <stddef.h>

#include "record.h"

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
