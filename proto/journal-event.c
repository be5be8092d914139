/* The journal event's field table (journal-event.h), in the order the server writes them. */
#include "journal-event.h"
#include "record-rows.h"

#define T dl_proto_journal_event_t
static const dl_proto_rec_field_t fields[] = {
    OPT(DL_PROTO_REC_STR, event),  HAS(DL_PROTO_REC_REAL, time), HAS(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_STR, reason), OPT(DL_PROTO_REC_STR, cause), OPT(DL_PROTO_REC_STR, status),
    OPT(DL_PROTO_REC_STR, level),  OPT(DL_PROTO_REC_STR, text),  END,
};
#undef T

const dl_proto_rec_type_t dl_proto_journal_event_type = {sizeof(dl_proto_journal_event_t), fields};
