/* etcd's answers declared once, as data: the JSON gateway's replies (range, txn, watch message,
 * lease grant and keepalive) as C structs over proto/record.h tables, so that a reader takes
 * typed fields and a malformed answer is one line naming the field. Only the fields dlaunch reads
 * are declared; the member names are the gateway's. */
#ifndef DL_ETCD_REPLY_H
#define DL_ETCD_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "record.h"

typedef struct {
    int64_t revision;
} dl_etcd_header_t;

/* /v3/kv/range's answer, and a txn's response_range. */
typedef struct {
    dl_etcd_header_t *header;
    dl_etcd_kv_t *kvs; /* value NULL where etcd left it out (empty) */
    size_t nkvs;
    int64_t count;
} dl_etcd_range_t;

typedef struct {
    dl_etcd_range_t *response_range; /* NULL: the response of a put or a delete */
} dl_etcd_response_t;

/* /v3/kv/txn's answer. */
typedef struct {
    dl_etcd_header_t *header;
    bool succeeded;
    dl_etcd_response_t *responses;
    size_t nresponses;
} dl_etcd_txn_t;

typedef struct {
    char *type;       /* "DELETE", or NULL: a put */
    dl_etcd_kv_t *kv; /* NULL when absent */
} dl_etcd_event_t;

/* One message of a /v3/watch stream (its "result"). */
typedef struct {
    dl_etcd_header_t *header;
    bool canceled;
    int64_t compact_revision;
    char *cancel_reason;
    dl_etcd_event_t *events;
    size_t nevents;
} dl_etcd_watch_t;

/* /v3/lease/grant's answer; /v3/lease/keepalive's comes inside result. */
typedef struct dl_etcd_lease_s {
    int64_t ID;
    int64_t TTL;
    struct dl_etcd_lease_s *result;
} dl_etcd_lease_t;

extern const dl_proto_rec_type_t dl_etcd_kv_type, dl_etcd_range_type, dl_etcd_txn_type,
    dl_etcd_watch_type, dl_etcd_lease_type;

/* Reads an answer (body) into rec, a struct of t's: 0, or -EPROTO with one line in err ("etcd's
 * answer: field 'kvs[0].key' must be base64, got a string") and rec cleared. Free rec with
 * dl_proto_rec_free(t, rec). */
int dl_etcd_reply(const dl_proto_rec_type_t *t, const json_t *body, void *rec, char *err,
                  size_t errlen);

/* The header's revision, 0 without one. */
int64_t dl_etcd_rev(const dl_etcd_header_t *h);
/* A txn answer's response i as a range, or NULL (none, or not a range). */
const dl_etcd_range_t *dl_etcd_txn_range(const dl_etcd_txn_t *t, size_t i);
/* Whether a watch message is an event of a key deleted. */
bool dl_etcd_deleted(const dl_etcd_event_t *ev);
/* The TTL a keepalive's answer grants (0: the lease is gone). */
int64_t dl_etcd_lease_ttl(const dl_etcd_lease_t *l);

#endif
