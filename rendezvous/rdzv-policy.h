/* The job's rules on what a round change costs, apart from any state machine or I/O: the one
 * place that decides whether a restart is spent, whether the budget is gone and whether the same
 * failure ends the job. The rendezvous core, the etcd job code and the agent's supervisor all
 * ask here, so that every backend decides alike (docs/rendezvous.md). */
#ifndef DL_RDZV_POLICY_H
#define DL_RDZV_POLICY_H

#include <stdbool.h>

#include "rdzv-core.h"

/* What ending a round costs the job. */
typedef enum {
    DL_RDZV_BUDGET_FREE = 0, /* a new round, no restart spent: no failure ended it */
    DL_RDZV_BUDGET_SPEND,    /* a new round, one restart spent */
    DL_RDZV_BUDGET_SPENT,    /* a failure with no restart left: the job fails (exit 1) */
    DL_RDZV_BUDGET_SAME,     /* the same failure ended max_same rounds in a row: the job fails
                              * with exit 5, restarts left or not */
} dl_rdzv_budget_t;

/* Whether a round change for cause is a failure, which spends a restart: a worker's failure or
 * a lost node. A node joining or departing and an operator's restart are none, as torchrun
 * counts only failures; so is any value that names no cause (a straggler stepping out). */
bool dl_rdzv_policy_is_failure(dl_rdzv_cause_t cause);

/* The cost of ending a round for cause when `restarts` of max_restarts are spent and the same
 * worker failure has now ended `same` rounds in a row (max_same: the limit, 0 for none). */
dl_rdzv_budget_t dl_rdzv_policy_round_end(dl_rdzv_cause_t cause, int restarts, int max_restarts,
                                          int same, int max_same);

/* Whether the worker failure next is the one prev was again, as far as restarting can tell:
 * the same global rank, the same exit code, signal, hang or OOM kill, and no step further
 * (next's step unknown, or not past prev's). Lost nodes (rank -1) are never the same. Only
 * the failure's fields count, not who reported it. */
bool dl_rdzv_policy_same_failure(const dl_rdzv_culprit_t *prev, const dl_rdzv_culprit_t *next);

/* Whether a job goes on without a node that departs (its agent's stop signal) from a running
 * round, `left` of the round's other nodes still working: with min_nodes of them, in a new
 * round and no restart spent; else it stops on every node, as nothing could close a round. */
bool dl_rdzv_policy_departure_goes_on(int left, int min_nodes);

/* Whether one more restart may be spent with `restarts` of max_restarts spent. */
bool dl_rdzv_policy_restart_left(int restarts, int max_restarts);

/* Whether a count of restarts spent (one a rendezvous adopted from an agent) passes the
 * budget: the job failed already, or should have; it fails at once. */
bool dl_rdzv_policy_overspent(int restarts, int max_restarts);

/* The restarts an in-job recovery that fails (or cannot start) has left to fall back on, with
 * `restarts` of max_restarts spent: 0, the job fails. When the rendezvous keeps the budget
 * (rendezvous_decides: an agent of a multi-node job), this node cannot tell and falls back to
 * a restart, at least 1: the rendezvous fails the job if none is left. */
int dl_rdzv_policy_recovery_restarts_left(int restarts, int max_restarts, bool rendezvous_decides);

#endif
