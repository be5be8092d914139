/* The job's rules, apart from any state machine or I/O: when a gathering round closes, which
 * node gets which node rank, whether a round change spends a restart, whether the budget is gone
 * and whether the same failure ends the job. The rendezvous core, the etcd job code and the
 * agent's supervisor all ask here, so that every backend decides alike (docs/rendezvous.md). */
#ifndef DL_RDZV_POLICY_H
#define DL_RDZV_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* A rank as the culprit rule reads it: its newest collective operation, from its node's latest
 * report (diag.h's flight recorder; docs/diagnostics.md). */
typedef struct dl_rdzv_policy_rank_s {
    int rank;
    int node_rank;
    long long step; /* the furthest step it reported, -1 unknown: carried for the culprit */
    bool known;     /* it keeps a recorder and has begun an operation */
    uint64_t seq;   /* that operation's number: every rank numbers its operations alike */
    bool inside;    /* still inside it (queued or running) */
    bool failed;    /* it failed under it: a peer went away, or the wait timed out */
    bool stopped;   /* its process is stopped */
} dl_rdzv_policy_rank_t;

/* The first-failure rule: who a worker failure of failed_rank (hung: its watchdog named it) is
 * put on, over every node's latest report v[0..n). A rank whose collective failed under it, or
 * that was named hung while inside one, is a victim when another rank never entered that
 * collective (its newest operation is an earlier one) or is stopped: the failure is put on that
 * rank, the one it waited for; of several, a stopped one, then the furthest behind, then the
 * lowest rank. Returns its index in v, or -1: the failure is the failed rank's own (it crashed,
 * or its own report says nothing of a wait). Every backend asks here, whichever node's report
 * comes first, so the same rank is named. */
int dl_rdzv_policy_waited_for(const dl_rdzv_policy_rank_t *v, size_t n, int failed_rank, bool hung);

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

/* What a gathering round of `joined` nodes does now. */
typedef enum {
    DL_RDZV_ROUND_GATHER = 0, /* fewer than min_nodes: wait for joins (no last call running) */
    DL_RDZV_ROUND_LAST_CALL,  /* min_nodes are in: the last call runs, more may join */
    DL_RDZV_ROUND_CLOSE,      /* close it now */
} dl_rdzv_round_step_t;

/* A round closes when max_nodes have joined, or when min_nodes have and the last call is over
 * (last_call_over: its time passed, or the join timeout found enough nodes) or there is none
 * (last_call <= 0). */
dl_rdzv_round_step_t dl_rdzv_policy_round_step(size_t joined, int min_nodes, int max_nodes,
                                               double last_call, bool last_call_over);

/* A node of a closing round, as the node-rank rule sees it. */
typedef struct {
    int slurm_node_id; /* -1: not known */
    int hint;          /* the node rank it asked for; -1: none */
    const char *host;
    const char *id; /* the agent's id: unique within the round */
    void *ctx;      /* the caller's */
    int node_rank;  /* out */
} dl_rdzv_policy_node_t;

/* The node-rank rule: sorts v[0..n) by Slurm node id, then hint, then host, then id (an unknown
 * id or hint after the known ones), a total order whatever the order of joins; a hint below n
 * is the rank of the first node in that order that asks for it, the others take the free ranks
 * in that order. Leaves v in node-rank order. taken: n entries of scratch. */
void dl_rdzv_policy_node_ranks(dl_rdzv_policy_node_t **v, size_t n, bool *taken);

#endif
