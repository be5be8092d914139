/* The assignment message (docs/protocol.md) as a typed record, for a backend that makes one from
 * elsewhere than our server's frame (etcd's keys): it fills the struct, and the message made of it
 * goes through the same validator as a frame (message.c's table: types, ranges, address
 * characters), so that both meet the same checks and say the same line. */
#ifndef DL_PROTO_ASSIGNMENT_H
#define DL_PROTO_ASSIGNMENT_H

#include <stdbool.h>

#include "record.h"

typedef struct {
    long long round;
    long long restart_count;
    long long nodes;
    long long world_size;
    bool has_world_size;
    long long max_restarts;
    long long failures;
    long long master_port;
    bool has_master_port;
    char *master_addr; /* NULL: absent */
    char *store_addr;  /* NULL: absent */
    long long node_rank;
    long long first_rank;
    long long local_world_size;
} dl_proto_assignment_t;

extern const dl_proto_rec_type_t dl_proto_assignment_type;

/* {"v":1,"type":"assignment","id":0, and a's fields in the table's order}: a new reference, or NULL
 * (no memory). */
json_t *dl_proto_assignment_msg(const dl_proto_assignment_t *a);

#endif
