/* A node's report (proto/node-report.h) to and from diag.h's types, on both sides of the wire:
 * the agent fills the record from its ranks' snapshots and beats; the rendezvous reads the
 * ranks for the straggler rule and the account of a hang, and writes the rule's verdict as the
 * status reply's diag (proto/status-reply.h), which is also a heartbeat reply's "view". */
#ifndef DL_RDZV_REPORT_H
#define DL_RDZV_REPORT_H

#include <stddef.h>

#include "diag.h"
#include "node-report.h"

/* Fills rep (cleared first) with n ranks' snapshots and beats (beats may be NULL, or hold NULL
 * entries), figures cut to four decimals. Returns 0 or -ENOMEM (rep then holds nothing). Free
 * with dl_proto_rec_free(&dl_proto_node_report_type, rep). */
int dl_rdzv_report_fill(dl_proto_node_report_t *rep, int node_rank, const char *host,
                        const dl_diag_rank_t *ranks, const dl_diag_beats_t *const *beats, size_t n);

/* Rank i of a decoded report as diag.h reads it (its strings rep's), older_s (the report's age)
 * added to every age and silence. */
void dl_rdzv_report_rank(const dl_proto_node_report_t *rep, size_t i, double older_s,
                         dl_diag_rank_t *ret);

/* Rank i's sums, for the straggler rule; false when the rank reported none. */
bool dl_rdzv_report_totals(const dl_proto_node_report_t *rep, size_t i, dl_diag_totals_t *ret);

/* The rule's view as the wire has it, into d (cleared first, its own). Returns 0 or -ENOMEM (d
 * then holds what was made: free it with dl_proto_rec_free(&dl_proto_status_diag_type, d)). */
int dl_rdzv_report_view(const dl_diag_view_t *v, dl_proto_status_diag_t *d);

#endif
