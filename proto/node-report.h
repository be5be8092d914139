/* A node's report declared once (docs/protocol.md, "diag" of a heartbeat or failure report;
 * docs/diagnostics.md): its ranks' figures and last operations, which the agent makes from its
 * workers' beats and flight recorders, and the rendezvous reads for the straggler rule, the
 * account of a hang and `status --ranks`. A rank is the status reply's rank (status-reply.h):
 * `status --ranks` shows what the node reported, with where and when added; the report's own
 * table reads it more strictly (rank, and an operation's seq, op and state, are required).
 *
 * The agent fills the struct and encodes it once; the rendezvous decodes it once, checked with
 * bounds (a report comes from the network), and reads C fields from then on. */
#ifndef DL_PROTO_NODE_REPORT_H
#define DL_PROTO_NODE_REPORT_H

#include "record.h"
#include "status-reply.h"

/* A report's bounds: ranks, operations a rank (diag.h's DL_DIAG_OPS_MAX), bytes of a name. */
#define DL_PROTO_REPORT_RANKS_MAX 65536
#define DL_PROTO_REPORT_OPS_MAX 8
#define DL_PROTO_REPORT_NAME_MAX 64

typedef struct {
    long long node_rank;
    bool has_node_rank;
    char *host;
    dl_proto_status_rank_t *ranks; /* node_rank, host and report_age_s unset */
    size_t nranks;
    /* The straggler rule's settings, from the agents' job spec; absent when the rule is off. */
    double threshold;
    bool has_threshold;
    long long window;
    bool has_window;
} dl_proto_node_report_t;

extern const dl_proto_rec_type_t dl_proto_node_report_type;

/* Reads a report (JSON from the wire) into rep, and checks its bounds: numbers that are counts
 * or times not below 0, node_rank and rank below 2^31, threshold above 0, at most the bounds
 * above. Returns 0, or -EBADMSG / -ENOMEM with one line in err naming the field ("diag: field
 * 'ranks[2].ops[0].algo' must be a string of at most 64 bytes"); rep then holds nothing. Free with
 * dl_proto_rec_free(&dl_proto_node_report_type, rep). */
int dl_proto_node_report_decode(const json_t *obj, dl_proto_node_report_t *rep, char *err,
                                size_t errlen);

#endif
