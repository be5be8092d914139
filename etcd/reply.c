/* The tables of etcd's answers (reply.h), one row a field the gateway sends and dlaunch reads. */
#include <errno.h>
#include <string.h>

#include "record-rows.h"
#include "reply.h"

#define T dl_etcd_kv_t
static const dl_proto_rec_field_t kv_fields[] = {
    {.name = "key",
     .kind = DL_PROTO_REC_BYTES,
     .required = true,
     .offset = offsetof(T, key),
     .count = offsetof(T, key_len)},
    {.name = "value",
     .kind = DL_PROTO_REC_BYTES,
     .offset = offsetof(T, value),
     .count = offsetof(T, value_len)},
    OPT(DL_PROTO_REC_I64, create_revision),
    OPT(DL_PROTO_REC_I64, mod_revision),
    OPT(DL_PROTO_REC_I64, version),
    OPT(DL_PROTO_REC_I64, lease),
    END,
};
#undef T
const dl_proto_rec_type_t dl_etcd_kv_type = {sizeof(dl_etcd_kv_t), kv_fields};

#define T dl_etcd_header_t
static const dl_proto_rec_field_t header_fields[] = {OPT(DL_PROTO_REC_I64, revision), END};
#undef T
static const dl_proto_rec_type_t header_type = {sizeof(dl_etcd_header_t), header_fields};

#define T dl_etcd_range_t
static const dl_proto_rec_field_t range_fields[] = {
    OBJ(header, header_type),
    LIST(kvs, dl_etcd_kv_type),
    OPT(DL_PROTO_REC_I64, count),
    END,
};
#undef T
const dl_proto_rec_type_t dl_etcd_range_type = {sizeof(dl_etcd_range_t), range_fields};

#define T dl_etcd_response_t
static const dl_proto_rec_field_t response_fields[] = {OBJ(response_range, dl_etcd_range_type),
                                                       END};
#undef T
static const dl_proto_rec_type_t response_type = {sizeof(dl_etcd_response_t), response_fields};

#define T dl_etcd_txn_t
static const dl_proto_rec_field_t txn_fields[] = {
    OBJ(header, header_type),
    OPT(DL_PROTO_REC_BOOL, succeeded),
    LIST(responses, response_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_etcd_txn_type = {sizeof(dl_etcd_txn_t), txn_fields};

#define T dl_etcd_event_t
static const dl_proto_rec_field_t event_fields[] = {
    OPT(DL_PROTO_REC_STR, type),
    OBJ(kv, dl_etcd_kv_type),
    END,
};
#undef T
static const dl_proto_rec_type_t event_type = {sizeof(dl_etcd_event_t), event_fields};

#define T dl_etcd_watch_t
static const dl_proto_rec_field_t watch_fields[] = {
    OBJ(header, header_type),
    OPT(DL_PROTO_REC_BOOL, canceled),
    OPT(DL_PROTO_REC_I64, compact_revision),
    OPT(DL_PROTO_REC_STR, cancel_reason),
    LIST(events, event_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_etcd_watch_type = {sizeof(dl_etcd_watch_t), watch_fields};

#define T dl_etcd_lease_t
static const dl_proto_rec_field_t lease_fields[] = {
    OPT(DL_PROTO_REC_I64, ID),
    OPT(DL_PROTO_REC_I64, TTL),
    OBJ(result, dl_etcd_lease_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_etcd_lease_type = {sizeof(dl_etcd_lease_t), lease_fields};

int dl_etcd_reply(const dl_proto_rec_type_t *t, const json_t *body, void *rec, char *err,
                  size_t errlen)
{
    int r = dl_proto_rec_decode(t, body, rec, "etcd's answer", err, errlen);
    return r == -EBADMSG ? -EPROTO : r;
}

int64_t dl_etcd_rev(const dl_etcd_header_t *h)
{
    return h != NULL ? h->revision : 0;
}

const dl_etcd_range_t *dl_etcd_txn_range(const dl_etcd_txn_t *t, size_t i)
{
    return i < t->nresponses ? t->responses[i].response_range : NULL;
}

bool dl_etcd_deleted(const dl_etcd_event_t *ev)
{
    return ev->type != NULL && strcmp(ev->type, "DELETE") == 0;
}

int64_t dl_etcd_lease_ttl(const dl_etcd_lease_t *l)
{
    return l->result != NULL ? l->result->TTL : l->TTL;
}
