/* The rendezvous server's job-wide view of the ranks (docs/diagnostics.md): each agent's latest
 * report (its ranks' figures and last operations, sent with its heartbeats and failure reports),
 * the straggler rule over all of them, and the account of where the ranks are. Internal to the
 * rendezvous layer; the server (server*.c) is its one user. */
#ifndef DL_RDZV_JOBVIEW_H
#define DL_RDZV_JOBVIEW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status-reply.h"

typedef struct dl__jobview_s dl__jobview_t;

int dl__jobview_new(dl__jobview_t **ret);
void dl__jobview_free(dl__jobview_t *v); /* accepts NULL */

/* Keeps report (borrowed; a reference is taken) as connection conn's latest for run_id's round,
 * at time now (monotonic seconds). A report of a newer round than the job's starts the job's
 * view afresh; one of an older round is ignored (-ESTALE). Returns 0, -EBADMSG with one line in
 * err, -ESTALE or -ENOMEM. */
int dl__jobview_report(dl__jobview_t *v, const char *run_id, int round, uint64_t conn,
                       const json_t *report, double now, char *err, size_t errlen);

/* The job-wide figures and the stragglers named, for a heartbeat's reply: a new reference, or
 * NULL when the job has no figures. */
json_t *dl__jobview_view(dl__jobview_t *v, const char *run_id);

/* Where the ranks of run_id are, in one line (diag.h's account over every node's latest report,
 * its age added), when some rank has been inside an operation for min_stuck seconds or more.
 * Returns its length; 0 when nothing is known (or nothing stuck). */
size_t dl__jobview_explain(dl__jobview_t *v, const char *run_id, double now, double min_stuck,
                           char *buf, size_t len);

/* Every rank of run_id as the first-failure rule reads it (rdzv-policy.h), from every node's
 * latest report: a new array in *ret (free()) and its length, 0 (*ret NULL) when nothing is
 * known or out of memory. */
struct dl_rdzv_policy_rank_s;
size_t dl__jobview_policy_ranks(dl__jobview_t *v, const char *run_id, double now,
                                struct dl_rdzv_policy_rank_s **ret);

/* For a status reply (proto/status-reply.h), into st: diag, the view, and with ranks also where,
 * the account, and ranks, every rank's figures and last operations with its node_rank, host and
 * report_age_s. What it sets is st's own (dl__jobview_status_clear frees it, and no more);
 * nothing when the view has no such job. Returns 0 or -ENOMEM (st then holds what was made). */
int dl__jobview_status(dl__jobview_t *v, const char *run_id, bool ranks, double now,
                       dl_proto_status_job_t *st);
void dl__jobview_status_clear(dl_proto_status_job_t *st);

/* The connection closed: its report goes. */
void dl__jobview_drop_conn(dl__jobview_t *v, const char *run_id, uint64_t conn);

/* The job ended. */
void dl__jobview_forget(dl__jobview_t *v, const char *run_id);

#endif
