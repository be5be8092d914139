/* The assignment's field table (assignment.h), in the order our server writes them. */
#include "assignment.h"
#include "proto.h"
#include "record-rows.h"

#define T dl_proto_assignment_t
static const dl_proto_rec_field_t fields[] = {
    OPT(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_INT, restart_count),
    OPT(DL_PROTO_REC_INT, nodes),
    HAS(DL_PROTO_REC_INT, world_size),
    OPT(DL_PROTO_REC_INT, max_restarts),
    OPT(DL_PROTO_REC_INT, failures),
    HAS(DL_PROTO_REC_INT, master_port),
    OPT(DL_PROTO_REC_STR, master_addr),
    OPT(DL_PROTO_REC_STR, store_addr),
    OPT(DL_PROTO_REC_INT, node_rank),
    OPT(DL_PROTO_REC_INT, first_rank),
    OPT(DL_PROTO_REC_INT, local_world_size),
    END,
};
#undef T

const dl_proto_rec_type_t dl_proto_assignment_type = {sizeof(dl_proto_assignment_t), fields};

json_t *dl_proto_assignment_msg(const dl_proto_assignment_t *a)
{
    /* A reply carries an id: that of a join never sent, 0. */
    json_t *msg = dl_proto_msg_new(DL_PROTO_ASSIGNMENT, 0);
    json_t *body = dl_proto_rec_encode(&dl_proto_assignment_type, a);
    if (msg == NULL || body == NULL || json_object_update(msg, body) < 0) {
        json_decref(msg);
        msg = NULL;
    }
    json_decref(body);
    return msg;
}
