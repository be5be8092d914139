/* The file-timer request's field table (timer-request.h), in torch's order. */
#include "timer-request.h"
#include "record-rows.h"

#define T dl_proto_timer_request_t
static const dl_proto_rec_field_t fields[] = {
    REQ(DL_PROTO_REC_INT, pid),
    REQ(DL_PROTO_REC_STR, scope_id),
    REQ(DL_PROTO_REC_REAL, expiration_time),
    REQ(DL_PROTO_REC_INT, signal),
    END,
};
#undef T

const dl_proto_rec_type_t dl_proto_timer_request_type = {sizeof(dl_proto_timer_request_t), fields};
