/* The rendezvous state machine: jobs keyed by run id, rounds of members, rank assignment, health
 * and control. One event in, a list of actions out; the clock is an argument.
 *
 * A job alternates between GATHERING (the current round takes JOINs) and RUNNING (the round
 * closed and every member got its ASSIGNMENT) until it ends in SUCCEEDED, FAILED, STOPPED or
 * TIMED_OUT. A finished job lingers for opts.linger seconds so that late agents learn its fate,
 * then it is forgotten. docs/rendezvous.md has the full table. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"
#include "rdzv-policy.h"

static const char *const job_state_names[] = {
    [DL_RDZV_JOB_GATHERING] = "gathering", [DL_RDZV_JOB_RUNNING] = "running",
    [DL_RDZV_JOB_SUCCEEDED] = "succeeded", [DL_RDZV_JOB_FAILED] = "failed",
    [DL_RDZV_JOB_STOPPED] = "stopped",     [DL_RDZV_JOB_TIMED_OUT] = "timed-out",
};

static const char *const msg_kind_names[] = {
    [DL_RDZV_MSG_OK] = "ok",
    [DL_RDZV_MSG_ERROR] = "error",
    [DL_RDZV_MSG_JOINED] = "joined",
    [DL_RDZV_MSG_ASSIGNMENT] = "assignment",
    [DL_RDZV_MSG_TIMEOUT] = "timeout",
    [DL_RDZV_MSG_ROUND_CHANGED] = "round-changed",
    [DL_RDZV_MSG_FAILED] = "failed",
    [DL_RDZV_MSG_STOP] = "stop",
    [DL_RDZV_MSG_SUCCEEDED] = "succeeded",
    [DL_RDZV_MSG_VALUE] = "value",
    [DL_RDZV_MSG_COUNTER] = "counter",
    [DL_RDZV_MSG_CAS] = "cas",
    [DL_RDZV_MSG_DELETED] = "deleted",
    [DL_RDZV_MSG_WAIT_DONE] = "wait-done",
    [DL_RDZV_MSG_STATUS] = "status",
};

const char *dl_rdzv_job_state_name(dl_rdzv_job_state_t state)
{
    if ((size_t)state < sizeof(job_state_names) / sizeof(job_state_names[0]))
        return job_state_names[state];
    return "unknown";
}

const char *dl_rdzv_msg_kind_name(dl_rdzv_msg_kind_t kind)
{
    if ((size_t)kind < sizeof(msg_kind_names) / sizeof(msg_kind_names[0]))
        return msg_kind_names[kind];
    return "unknown";
}

const char *dl_rdzv_cause_name(dl_rdzv_cause_t cause)
{
    static const char *const names[DL_RDZV_CAUSE_COUNT] = {
        [DL_RDZV_CAUSE_WORKER_FAILED] = "worker_failed", [DL_RDZV_CAUSE_NODE_LOST] = "node_lost",
        [DL_RDZV_CAUSE_NODE_JOINED] = "node_joined",     [DL_RDZV_CAUSE_REQUESTED] = "requested",
        [DL_RDZV_CAUSE_NODE_LEFT] = "node_left",
    };
    if ((size_t)cause < DL_RDZV_CAUSE_COUNT)
        return names[cause];
    return "unknown";
}

void dl_rdzv_job_opts_init(dl_rdzv_job_opts_t *opts)
{
    *opts = (dl_rdzv_job_opts_t){
        .min_nodes = 1,
        .max_nodes = 1,
        .last_call = 30,
        .join_timeout = 600,
        .dead_after = 30,
        .max_restarts = 3,
        .master_port = 29500,
        .linger = 60,
    };
}

void dl_rdzv_core_opts_init(dl_rdzv_core_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    dl_rdzv_job_opts_init(&opts->job_defaults);
    opts->max_jobs = 4096;
    opts->max_key_len = 4096;
    opts->max_value_len = 1 << 20;
    opts->max_keys = 1 << 20;
    opts->max_wait_keys = 4096;
    opts->max_store_bytes = (size_t)256 << 20;
    opts->max_waits = 1 << 20;
    opts->max_memory = (size_t)1 << 30;
    opts->max_waits_per_conn = 256;
    opts->max_jobs_per_creator = 512;
    opts->max_timeout = 3600;
    opts->log_level = DL_RDZV_LOG_INFO;
}

static int bad_opt(char *err, size_t errlen, const char *field, const char *why, double v)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %g %s", field, v, why);
    return -EINVAL;
}

static bool duration_ok(double v, bool zero_ok)
{
    return isfinite(v) && (v > 0 || (zero_ok && v == 0));
}

int dl_rdzv_job_opts_check(const dl_rdzv_job_opts_t *o, char *err, size_t errlen)
{
    if (o->min_nodes < 1)
        return bad_opt(err, errlen, "min_nodes", "is below 1", o->min_nodes);
    if (o->max_nodes < o->min_nodes)
        return bad_opt(err, errlen, "max_nodes", "is below min_nodes", o->max_nodes);
    if (o->max_nodes > DL_RDZV_MAX_NODES)
        return bad_opt(err, errlen, "max_nodes", "is above the limit of 1048576", o->max_nodes);
    if (!duration_ok(o->last_call, true))
        return bad_opt(err, errlen, "last_call", "is not a duration >= 0", o->last_call);
    if (!duration_ok(o->join_timeout, false))
        return bad_opt(err, errlen, "join_timeout", "is not a duration > 0", o->join_timeout);
    if (!duration_ok(o->dead_after, false))
        return bad_opt(err, errlen, "dead_after", "is not a duration > 0", o->dead_after);
    if (o->max_restarts < 0)
        return bad_opt(err, errlen, "max_restarts", "is below 0", o->max_restarts);
    if (o->max_same_failures < 0)
        return bad_opt(err, errlen, "max_same_failures", "is below 0", o->max_same_failures);
    if (o->master_port < 1 || o->master_port > 65535)
        return bad_opt(err, errlen, "master_port", "is outside 1..65535", o->master_port);
    if (!duration_ok(o->linger, true))
        return bad_opt(err, errlen, "linger", "is not a duration >= 0", o->linger);
    return 0;
}

static bool name_ok(const char *s)
{
    return s && s[0] && strnlen(s, DL_RDZV_MAX_NAME + 1) <= DL_RDZV_MAX_NAME;
}

static bool is_over(const dl__rdzv_job_t *job)
{
    return job->state >= DL_RDZV_JOB_SUCCEEDED;
}

static dl__rdzv_job_t *job_find(dl_rdzv_core_t *core, const char *run_id)
{
    size_t len = strlen(run_id);
    uint64_t h = dl__rdzv_hash(core->opts.hash_key, run_id, len);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&core->jobs, h); n; n = n->next) {
        dl__rdzv_job_t *job = dl__rdzv_container_of(n, dl__rdzv_job_t, node);
        if (n->hash == h && strcmp(job->run_id, run_id) == 0)
            return job;
    }
    return NULL;
}

int dl_rdzv_core_store_count(dl_rdzv_core_t *core, const char *run_id, size_t *ret_keys)
{
    dl__rdzv_job_t *job = job_find(core, run_id);
    if (job == NULL)
        return -ENOENT;
    *ret_keys = job->store.npresent;
    return 0;
}

/* How many live jobs a creator made: one map entry while it has any. */
typedef struct {
    dl__rdzv_hnode_t node;
    uint64_t creator;
    size_t njobs;
} creator_t;

static creator_t *creator_find(dl_rdzv_core_t *core, uint64_t creator)
{
    uint64_t h = dl__rdzv_hash_u64(core->opts.hash_key, creator);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&core->creators, h); n; n = n->next) {
        creator_t *c = dl__rdzv_container_of(n, creator_t, node);
        if (n->hash == h && c->creator == creator)
            return c;
    }
    return NULL;
}

/* Counts a new job against its creator. Returns 0, -ENOSPC (its limit) or -ENOMEM. */
static int creator_charge(dl_rdzv_core_t *core, uint64_t creator)
{
    if (creator == 0)
        return 0;
    creator_t *c = creator_find(core, creator);
    if (c && c->njobs >= core->opts.max_jobs_per_creator)
        return -ENOSPC;
    if (c) {
        c->njobs++;
        return 0;
    }
    if (dl__rdzv_map_reserve(&core->creators, 1) < 0 || !(c = calloc(1, sizeof(*c))))
        return -ENOMEM;
    c->creator = creator;
    c->njobs = 1;
    dl__rdzv_map_insert(&core->creators, &c->node, dl__rdzv_hash_u64(core->opts.hash_key, creator));
    return 0;
}

static void creator_release(dl_rdzv_core_t *core, uint64_t creator)
{
    creator_t *c = creator ? creator_find(core, creator) : NULL;
    if (!c || --c->njobs > 0)
        return;
    dl__rdzv_map_remove(&core->creators, &c->node);
    free(c);
}

/* The journal's first line, however the job came to be (a JOIN, or the embedded server's
 * dl_rdzv_core_add_job). */
static void log_created(dl_rdzv_core_t *core, const dl__rdzv_job_t *job)
{
    const dl_rdzv_job_opts_t *o = &job->opts;
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id,
                 "job created: nodes %d:%d, at most %d restart%s after failures", o->min_nodes,
                 o->max_nodes, o->max_restarts, o->max_restarts == 1 ? "" : "s");
}

static int job_new(dl_rdzv_core_t *core, const char *run_id, const dl_rdzv_job_opts_t *opts,
                   uint64_t creator, dl__rdzv_job_t **ret_job)
{
    if (core->njobs >= core->opts.max_jobs)
        return -ENOSPC;
    if (dl__rdzv_map_reserve(&core->jobs, 1) < 0)
        return -ENOMEM;
    int r = creator_charge(core, creator);
    if (r < 0)
        return r == -ENOSPC ? -EDQUOT : r;
    size_t len = strlen(run_id);
    dl__rdzv_job_t *job = calloc(1, sizeof(*job) + len + 1);
    if (!job) {
        creator_release(core, creator);
        return -ENOMEM;
    }
    job->creator = creator;
    char *id = (char *)(job + 1);
    memcpy(id, run_id, len + 1);
    job->run_id = id;
    job->opts = *opts;
    job->state = DL_RDZV_JOB_GATHERING;
    dl__rdzv_timer_init(&job->last_call, DL__RDZV_T_LAST_CALL);
    dl__rdzv_timer_init(&job->join, DL__RDZV_T_JOIN);
    dl__rdzv_timer_init(&job->linger, DL__RDZV_T_LINGER);
    dl__rdzv_store_init(&job->store);
    dl__rdzv_map_insert(&core->jobs, &job->node, dl__rdzv_hash(core->opts.hash_key, id, len));
    job->prev = core->last_job;
    if (core->last_job)
        core->last_job->next = job;
    else
        core->first_job = job;
    core->last_job = job;
    core->njobs++;
    *ret_job = job;
    return 0;
}

static dl__rdzv_member_t *member_find(dl_rdzv_core_t *core, dl__rdzv_job_t *job,
                                      const char *agent_id)
{
    uint64_t h = dl__rdzv_hash(core->opts.hash_key, agent_id, strlen(agent_id));
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&job->by_agent, h); n; n = n->next) {
        dl__rdzv_member_t *m = dl__rdzv_container_of(n, dl__rdzv_member_t, node);
        if (n->hash == h && strcmp(m->agent_id, agent_id) == 0)
            return m;
    }
    return NULL;
}

static void member_detach(dl_rdzv_core_t *core, dl__rdzv_member_t *m)
{
    dl__rdzv_conn_t *conn = m->conn;
    if (!conn)
        return;
    m->conn = NULL;
    conn->member = NULL;
    dl__rdzv_conn_gc(core, conn);
}

static void member_attach(dl__rdzv_member_t *m, dl__rdzv_conn_t *conn)
{
    m->conn = conn;
    conn->member = m;
}

static uint64_t member_conn(const dl__rdzv_member_t *m)
{
    return m->conn ? m->conn->id : DL_RDZV_CONN_NONE;
}

/* Takes m out of the current round and frees it. */
static void member_drop(dl_rdzv_core_t *core, dl__rdzv_job_t *job, dl__rdzv_member_t *m)
{
    dl__rdzv_timer_disarm(&core->heap, &m->heartbeat);
    dl__rdzv_map_remove(&job->by_agent, &m->node);
    job->nmembers--;
    if (m->idx != job->nmembers) {
        job->members[m->idx] = job->members[job->nmembers];
        job->members[m->idx]->idx = m->idx;
    }
    if (m->hint >= 0 && job->hint_owner && job->hint_owner[m->hint] == m) {
        job->hint_owner[m->hint] = NULL;
        job->nhints--;
    }
    job->slots_sum -= m->slots;
    if (m->left)
        job->nleft--;
    member_detach(core, m);
    free(m);
}

/* Frees every member of the current round: O(members), never O(max_nodes). */
static void members_clear(dl_rdzv_core_t *core, dl__rdzv_job_t *job)
{
    dl__rdzv_map_take_all(&job->by_agent);
    for (size_t i = 0; i < job->nmembers; i++) {
        dl__rdzv_member_t *m = job->members[i];
        dl__rdzv_timer_disarm(&core->heap, &m->heartbeat);
        if (m->hint >= 0 && job->hint_owner)
            job->hint_owner[m->hint] = NULL;
        member_detach(core, m);
        free(m);
    }
    job->nmembers = 0;
    job->nhints = 0;
    job->slots_sum = 0;
    job->nleft = 0;
    job->world_size = 0;
}

/* Forgets a finished job. Its struct (and run id, which messages of this step point to) is freed
 * at the next step. */
static void job_remove(dl_rdzv_core_t *core, dl__rdzv_job_t *job)
{
    members_clear(core, job);
    dl__rdzv_store_clear(core, job, 0, NULL);
    dl__rdzv_timer_disarm(&core->heap, &job->last_call);
    dl__rdzv_timer_disarm(&core->heap, &job->join);
    dl__rdzv_timer_disarm(&core->heap, &job->linger);
    dl__rdzv_map_remove(&core->jobs, &job->node);
    if (job->prev)
        job->prev->next = job->next;
    else
        core->first_job = job->next;
    if (job->next)
        job->next->prev = job->prev;
    else
        core->last_job = job->prev;
    core->njobs--;
    creator_release(core, job->creator);
    job->grave_next = core->graveyard;
    core->graveyard = job;
    dl_rdzv_action_t *a = dl__rdzv_push(core, DL_RDZV_ACT_FORGET);
    a->run_id = job->run_id;
}

static void round_culprit_clear(dl__rdzv_job_t *job);

static void job_free(dl__rdzv_job_t *job)
{
    dl__rdzv_map_free(&job->by_agent);
    dl__rdzv_map_free(&job->store.keys);
    free(job->members);
    free(job->rank_nodes);
    free(job->rank_order);
    free(job->rank_taken);
    free(job->hint_owner);
    free(job->failure);
    free(job->end_why);
    free((char *)job->first_culprit.node);
    free((char *)job->first_culprit.host);
    round_culprit_clear(job);
    free(job);
}

static void bury_graveyard(dl_rdzv_core_t *core)
{
    while (core->graveyard) {
        dl__rdzv_job_t *job = core->graveyard;
        core->graveyard = job->grave_next;
        job_free(job);
    }
}

/* Room for everything one event about job can produce, so that state changes never stop halfway
 * for want of memory: a message per member twice over (new round, then close), the replies of
 * every WAIT, a few logs, and the job's timers. */
static int prepare(dl_rdzv_core_t *core, const dl__rdzv_job_t *job)
{
    size_t n = job ? job->nmembers : 0;
    size_t w = job ? job->store.nwaiters : 0;
    if (dl__rdzv_reserve(core, 2 * n + w + 16) < 0)
        return -ENOMEM;
    return dl__rdzv_heap_reserve(&core->heap, 4);
}

static void finish(dl_rdzv_core_t *core, dl__rdzv_job_t *job, dl_rdzv_job_state_t state, double now)
{
    job->state = state;
    dl__rdzv_timer_disarm(&core->heap, &job->last_call);
    dl__rdzv_timer_disarm(&core->heap, &job->join);
    for (size_t i = 0; i < job->nmembers; i++)
        dl__rdzv_timer_disarm(&core->heap, &job->members[i]->heartbeat);
    dl__rdzv_store_clear(
        core, job, -ESHUTDOWN,
        dl__rdzv_printf(core, "job '%s' is over (%s)", job->run_id, dl_rdzv_job_state_name(state)));
    if (job->opts.linger > 0 && dl__rdzv_heap_reserve(&core->heap, 1) == 0)
        dl__rdzv_timer_arm(&core->heap, &job->linger, now + job->opts.linger);
    else
        job_remove(core, job);
}

/* Puts job->members in node-rank order, by the policy's rule (rdzv-policy.h). */
static void assign_node_ranks(dl__rdzv_job_t *job)
{
    size_t n = job->nmembers;
    for (size_t i = 0; i < n; i++) {
        dl__rdzv_member_t *m = job->members[i];
        job->rank_nodes[i] = (dl_rdzv_policy_node_t){.slurm_node_id = m->slurm_node_id,
                                                     .hint = m->hint,
                                                     .host = m->host,
                                                     .id = m->agent_id,
                                                     .ctx = m};
        job->rank_order[i] = &job->rank_nodes[i];
    }
    dl_rdzv_policy_node_ranks(job->rank_order, n, job->rank_taken);
    for (size_t i = 0; i < n; i++) {
        dl__rdzv_member_t *m = job->rank_order[i]->ctx;
        m->node_rank = (int)i;
        job->members[i] = m;
    }
}

static void send_assignment(dl_rdzv_core_t *core, dl__rdzv_job_t *job, dl__rdzv_member_t *m,
                            uint64_t req_id)
{
    if (!m->conn)
        return;
    dl_rdzv_msg_t *msg =
        dl__rdzv_send(core, m->conn->id, DL_RDZV_MSG_ASSIGNMENT, req_id, job->run_id);
    msg->assignment.round = job->round;
    msg->assignment.node_rank = m->node_rank;
    msg->assignment.nnodes = (int)job->nmembers;
    msg->assignment.world_size = job->world_size;
    msg->assignment.first_rank = m->first_rank;
    msg->assignment.local_world_size = m->slots;
    /* Every round is an attempt of its own (its log folder, TORCHELASTIC_RESTART_COUNT), while
     * only failures spend the restart budget (job->restarts). */
    msg->assignment.restarts = job->round;
    msg->assignment.failures = job->restarts;
    msg->assignment.max_restarts = job->opts.max_restarts;
    msg->assignment.master_addr = job->master_addr;
    msg->assignment.master_port = job->master_port;
    msg->assignment.store_host = core->store_host;
    msg->assignment.store_port = core->opts.store_port;
    msg->assignment.host_node_rank = job->host_node_rank;
    msg->assignment.culprit = job->has_round_culprit ? &job->round_culprit : NULL;
    if (!core->opts.successors)
        return;
    /* The members are in node-rank order once the round closed. */
    size_t n = job->nmembers < DL_RDZV_SUCCESSORS_MAX ? job->nmembers : DL_RDZV_SUCCESSORS_MAX;
    const char **v = dl__rdzv_arena_alloc(&core->arena, n * sizeof(*v));
    if (!v)
        return; /* the agents then know no successor: the job is as before, not wrong */
    for (size_t i = 0; i < n; i++) {
        const dl__rdzv_member_t *s = job->members[i];
        v[i] = dl__rdzv_printf(core, "%s", s->master_addr ? s->master_addr : s->host);
    }
    msg->assignment.successors = v;
    msg->assignment.nsuccessors = n;
}

static void close_round(dl_rdzv_core_t *core, dl__rdzv_job_t *job)
{
    assign_node_ranks(job);
    int first = 0;
    for (size_t i = 0; i < job->nmembers; i++) {
        dl__rdzv_member_t *m = job->members[i];
        m->idx = i;
        m->first_rank = first;
        first += m->slots;
    }
    job->world_size = first;
    job->host_node_rank = -1;
    for (size_t i = 0; core->host_agent_id && i < job->nmembers; i++)
        if (strcmp(job->members[i]->agent_id, core->host_agent_id) == 0)
            job->host_node_rank = job->members[i]->node_rank;
    /* MASTER_ADDR:MASTER_PORT is where the workers' torch store is: with the agent that hosts
     * this rendezvous, which serves it there (docs/store.md); else node rank 0's address. */
    dl__rdzv_member_t *m0 = job->members[0];
    for (size_t i = 0; core->host_agent_id && i < job->nmembers; i++)
        if (job->members[i]->node_rank == job->host_node_rank)
            m0 = job->members[i];
    snprintf(job->master_addr, sizeof(job->master_addr), "%s",
             m0->master_addr ? m0->master_addr : m0->host);
    job->master_port = m0->master_port ? m0->master_port : job->opts.master_port;
    dl__rdzv_timer_disarm(&core->heap, &job->last_call);
    dl__rdzv_timer_disarm(&core->heap, &job->join);
    job->state = DL_RDZV_JOB_RUNNING;
    for (size_t i = 0; i < job->nmembers; i++)
        send_assignment(core, job, job->members[i], 0);
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id,
                 "round %d closed: %zu node%s, world size %d, master %s:%d", job->round,
                 job->nmembers, job->nmembers == 1 ? "" : "s", job->world_size, job->master_addr,
                 job->master_port);
}

static void time_out(dl_rdzv_core_t *core, dl__rdzv_job_t *job, double now)
{
    for (size_t i = 0; i < job->nmembers; i++) {
        dl__rdzv_member_t *m = job->members[i];
        dl__rdzv_send(core, member_conn(m), DL_RDZV_MSG_TIMEOUT, 0, job->run_id)->timeout.round =
            job->round;
    }
    dl__rdzv_log(core, DL_RDZV_LOG_ERROR, job->run_id,
                 "round %d timed out: %zu of %d nodes joined within %g s", job->round,
                 job->nmembers, job->opts.min_nodes, job->opts.join_timeout);
    finish(core, job, DL_RDZV_JOB_TIMED_OUT, now);
}

/* Ends the running round for reason: every member but dead hears of round R+1 and must JOIN
 * again; dead's connection is closed. A failure (a worker's, a lost node) spends one of the
 * max_restarts, and past them the job fails instead; an operator's restart, a node joining an
 * elastic job or one departing from it is no failure and spends none, as torchrun counts only
 * failures against its budget. */
static void keep_first_failure(dl__rdzv_job_t *job, const char *reason,
                               const dl_rdzv_culprit_t *culprit)
{
    if (job->failure)
        return;
    job->failure = strdup(reason);
    if (!culprit || !job->failure)
        return;
    dl_rdzv_culprit_t *f = &job->first_culprit;
    *f = *culprit;
    f->node = strdup(culprit->node);
    f->host = strdup(culprit->host);
    f->text = job->failure;
    job->has_culprit = f->node && f->host;
}

static void round_culprit_clear(dl__rdzv_job_t *job)
{
    free((char *)job->round_culprit.node);
    free((char *)job->round_culprit.host);
    free((char *)job->round_culprit.text);
    job->round_culprit = (dl_rdzv_culprit_t){0};
    job->has_round_culprit = false;
}

static void round_culprit_keep(dl__rdzv_job_t *job, const dl_rdzv_culprit_t *c)
{
    round_culprit_clear(job);
    if (!c)
        return;
    job->round_culprit = *c;
    job->round_culprit.node = strdup(c->node);
    job->round_culprit.host = strdup(c->host);
    job->round_culprit.text = c->text ? strdup(c->text) : NULL;
    job->has_round_culprit = job->round_culprit.node && job->round_culprit.host;
}

/* The culprit of a failure on member m, its strings copied into the step's arena: the round
 * change frees m before the message is sent. */
static dl_rdzv_culprit_t culprit_of(dl_rdzv_core_t *core, const dl__rdzv_member_t *m,
                                    dl_rdzv_cause_t cause)
{
    return (dl_rdzv_culprit_t){.cause = dl_rdzv_cause_name(cause),
                               .node = dl__rdzv_printf(core, "%s", m->agent_id),
                               .host = dl__rdzv_printf(core, "%s", m->host),
                               .node_rank = m->node_rank,
                               .rank = -1,
                               .exit_code = -1,
                               .step = -1};
}

/* The job fails for why: every member but dead (whose connection is closed) hears it, and so
 * does the connection also, when it is not a member's. same > 0: the same failure (culprit)
 * ended that many rounds in a row, which is what the members hear of. */
static void fail_job(dl_rdzv_core_t *core, dl__rdzv_job_t *job, double now, const char *why,
                     dl_rdzv_cause_t cause, dl__rdzv_member_t *dead, uint64_t also, int same,
                     const dl_rdzv_culprit_t *culprit)
{
    for (size_t i = 0; i <= job->nmembers; i++) {
        dl__rdzv_member_t *m = i < job->nmembers ? job->members[i] : NULL;
        if (m != NULL && m == dead) {
            dl__rdzv_close(core, member_conn(m));
            continue;
        }
        uint64_t to = m != NULL ? member_conn(m) : also;
        if (to == DL_RDZV_CONN_NONE)
            continue;
        dl_rdzv_msg_t *msg = dl__rdzv_send(core, to, DL_RDZV_MSG_FAILED, 0, job->run_id);
        msg->failed.round = job->round;
        msg->failed.restarts = job->restarts;
        msg->failed.failure = why;
        msg->failed.cause = cause;
        msg->failed.culprit = same > 0 && culprit ? culprit
                              : job->has_culprit  ? &job->first_culprit
                                                  : NULL;
        msg->failed.same_failures = same;
    }
    dl__rdzv_log(core, DL_RDZV_LOG_ERROR, job->run_id, "job failed after %d restart%s: %s",
                 job->restarts, job->restarts == 1 ? "" : "s", why);
    free(job->end_why);
    job->end_why = strdup(why); /* NULL (no memory): a late member hears the first failure */
    job->end_cause = cause;
    job->end_same = same;
    finish(core, job, DL_RDZV_JOB_FAILED, now);
}

/* Counts the rounds in a row that the same worker failure ended (c: this round's culprit, NULL
 * when no failure ended it). Anything else (a lost node, which a requeue elsewhere may well
 * cure, an operator's restart, a node joining) breaks the row. Returns the count. */
static int count_same(dl__rdzv_job_t *job, dl_rdzv_cause_t cause, const dl_rdzv_culprit_t *c)
{
    bool worker = c && cause == DL_RDZV_CAUSE_WORKER_FAILED && c->rank >= 0;
    if (worker && job->same_failures > 0 && dl_rdzv_policy_same_failure(&job->same_culprit, c))
        job->same_failures++;
    else
        job->same_failures = worker ? 1 : 0;
    if (worker) {
        job->same_culprit = *c;
        job->same_culprit.node = job->same_culprit.host = job->same_culprit.text = NULL;
    }
    return job->same_failures;
}

static void new_round(dl_rdzv_core_t *core, dl__rdzv_job_t *job, double now, const char *reason,
                      dl_rdzv_cause_t cause, dl__rdzv_member_t *dead, dl_rdzv_culprit_t *culprit)
{
    bool failure = dl_rdzv_policy_is_failure(cause);
    bool departure = cause == DL_RDZV_CAUSE_NODE_LEFT;
    if (culprit) {
        culprit->cause = dl_rdzv_cause_name(cause);
        culprit->text = reason;
    }
    if (failure)
        keep_first_failure(job, reason, culprit);
    int same = count_same(job, cause, failure ? culprit : NULL);
    dl_rdzv_budget_t cost = dl_rdzv_policy_round_end(cause, job->restarts, job->opts.max_restarts,
                                                     same, job->opts.max_same_failures);
    if (cost == DL_RDZV_BUDGET_SAME) {
        /* Another restart would fail alike: the budget is not spent on it, and the exit code
         * (5) tells a scheduler not to requeue the job either. */
        fail_job(core, job, now,
                 dl__rdzv_printf(core,
                                 "the same failure ended %d rounds in a row (the same rank and "
                                 "cause, no step further; restarting will not help): %.1100s",
                                 same, reason),
                 cause, dead, DL_RDZV_CONN_NONE, same, culprit);
        return;
    }
    if (cost == DL_RDZV_BUDGET_SPENT) {
        fail_job(core, job, now, job->failure ? job->failure : reason, cause, dead,
                 DL_RDZV_CONN_NONE, 0, NULL);
        return;
    }
    int next = job->round + 1;
    if (cost == DL_RDZV_BUDGET_SPEND)
        job->restarts++;
    for (size_t i = 0; i < job->nmembers; i++) {
        dl__rdzv_member_t *m = job->members[i];
        if (m == dead) {
            dl__rdzv_close(core, member_conn(m));
            continue;
        }
        dl_rdzv_msg_t *msg =
            dl__rdzv_send(core, member_conn(m), DL_RDZV_MSG_ROUND_CHANGED, 0, job->run_id);
        msg->round_changed.round = next;
        msg->round_changed.reason = reason;
        msg->round_changed.cause = cause;
        msg->round_changed.culprit = failure || departure ? culprit : NULL;
    }
    round_culprit_keep(job, failure || departure ? culprit : NULL);
    if (failure)
        dl__rdzv_log(core, DL_RDZV_LOG_WARN, job->run_id, "round %d -> %d (restart %d of %d): %s",
                     job->round, next, job->restarts, job->opts.max_restarts, reason);
    else
        dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id,
                     "round %d -> %d (no failure: the restart budget stays %d of %d): %s",
                     job->round, next, job->restarts, job->opts.max_restarts, reason);
    members_clear(core, job);
    dl__rdzv_store_clear(core, job, -ESTALE, dl__rdzv_printf(core, "round %d is over", job->round));
    job->round = next;
    job->state = DL_RDZV_JOB_GATHERING;
    dl__rdzv_timer_disarm(&core->heap, &job->last_call);
    dl__rdzv_timer_arm(&core->heap, &job->join, now + job->opts.join_timeout);
}

/* After a JOIN: close at max_nodes, or start the last call at min_nodes. */
static void check_round(dl_rdzv_core_t *core, dl__rdzv_job_t *job, double now)
{
    switch (dl_rdzv_policy_round_step(job->nmembers, job->opts.min_nodes, job->opts.max_nodes,
                                      job->opts.last_call, false)) {
    case DL_RDZV_ROUND_CLOSE: close_round(core, job); break;
    case DL_RDZV_ROUND_LAST_CALL:
        if (!dl__rdzv_timer_armed(&job->last_call))
            dl__rdzv_timer_arm(&core->heap, &job->last_call, now + job->opts.last_call);
        break;
    case DL_RDZV_ROUND_GATHER: break;
    }
}

/* A member left a gathering round: the last call waits for min_nodes again. */
static void gathering_lost(dl_rdzv_core_t *core, dl__rdzv_job_t *job, dl__rdzv_member_t *m,
                           const char *why)
{
    dl__rdzv_log(core, DL_RDZV_LOG_WARN, job->run_id, "agent '%s' (%s) left round %d: %s",
                 m->agent_id, m->host, job->round, why);
    member_drop(core, job, m);
    if (job->nmembers < (size_t)job->opts.min_nodes)
        dl__rdzv_timer_disarm(&core->heap, &job->last_call);
}

static dl__rdzv_member_t *member_new(const dl_rdzv_event_t *ev)
{
    size_t id_len = strlen(ev->join.agent_id);
    size_t host_len = strlen(ev->join.host);
    size_t addr_len = ev->join.master_addr ? strlen(ev->join.master_addr) : 0;
    dl__rdzv_member_t *m = calloc(1, sizeof(*m) + id_len + host_len + addr_len + 3);
    if (!m)
        return NULL;
    char *p = (char *)(m + 1);
    memcpy(p, ev->join.agent_id, id_len + 1);
    m->agent_id = p;
    p += id_len + 1;
    memcpy(p, ev->join.host, host_len + 1);
    m->host = p;
    p += host_len + 1;
    if (ev->join.master_addr) {
        memcpy(p, ev->join.master_addr, addr_len + 1);
        m->master_addr = p;
    }
    m->master_port = ev->join.master_port;
    m->slots = ev->join.slots;
    m->hint = ev->join.node_rank;
    m->slurm_node_id = ev->join.slurm_node_id;
    m->node_rank = -1;
    m->first_rank = -1;
    dl__rdzv_timer_init(&m->heartbeat, DL__RDZV_T_HEARTBEAT);
    return m;
}

static dl__rdzv_member_t *conn_member(dl_rdzv_core_t *core, uint64_t conn)
{
    dl__rdzv_conn_t *c = dl__rdzv_conn_find(core, conn);
    return c ? c->member : NULL;
}

static int check_join(const dl_rdzv_event_t *ev, const char **ret_why)
{
    const char *why = NULL;
    if (!name_ok(ev->run_id))
        why = "run_id must be 1 to 255 bytes";
    else if (!name_ok(ev->join.agent_id))
        why = "agent_id must be 1 to 255 bytes";
    else if (!name_ok(ev->join.host))
        why = "host must be 1 to 255 bytes";
    else if (ev->join.master_addr && !name_ok(ev->join.master_addr))
        why = "master_addr must be 1 to 255 bytes";
    else if (ev->join.slots < 1 || ev->join.slots > DL_RDZV_MAX_SLOTS)
        why = "slots must be within 1..4096";
    else if (ev->join.node_rank < -1)
        why = "node_rank must be -1 or a rank";
    else if (ev->join.slurm_node_id < -1)
        why = "slurm_node_id must be -1 or an id";
    else if (ev->join.master_port < 0 || ev->join.master_port > 65535)
        why = "master_port must be within 0..65535";
    if (!why)
        return 0;
    *ret_why = why;
    return -EINVAL;
}

/* The end of a job that is over, told to an agent that ran rounds of it and comes back after
 * its end (cut off from the rendezvous when it ended: declared dead, or its connection lost):
 * it ends with the job's outcome, as its members did, where a newcomer with the finished job's
 * run id is refused. Returns false for an end that has no such message (a timed-out job). */
static bool tell_end(dl_rdzv_core_t *core, const dl__rdzv_job_t *job, uint64_t conn)
{
    dl_rdzv_msg_t *msg;
    switch (job->state) {
    case DL_RDZV_JOB_SUCCEEDED:
        dl__rdzv_send(core, conn, DL_RDZV_MSG_SUCCEEDED, 0, job->run_id)->succeeded.round =
            job->round;
        return true;
    case DL_RDZV_JOB_STOPPED:
        dl__rdzv_send(core, conn, DL_RDZV_MSG_STOP, 0, job->run_id)->stop.round = job->round;
        return true;
    case DL_RDZV_JOB_FAILED:
        msg = dl__rdzv_send(core, conn, DL_RDZV_MSG_FAILED, 0, job->run_id);
        msg->failed.round = job->round;
        msg->failed.restarts = job->restarts;
        msg->failed.failure = job->end_why ? job->end_why : job->failure;
        msg->failed.cause = job->end_cause;
        msg->failed.culprit = job->has_culprit ? &job->first_culprit : NULL;
        msg->failed.same_failures = job->end_same;
        return true;
    default: return false;
    }
}

/* The job a JOIN goes to, created by it if need be; NULL when the JOIN was answered already. */
static dl__rdzv_job_t *join_job(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    const dl_rdzv_job_opts_t *o = ev->join.opts;
    dl__rdzv_job_t *job = job_find(core, ev->run_id);
    if (job && is_over(job) && ev->join.resume_round >= 0 && tell_end(core, job, ev->conn))
        return NULL;
    if (job && is_over(job)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESHUTDOWN,
                       "join: job '%s' is over (%s)", job->run_id,
                       dl_rdzv_job_state_name(job->state));
        return NULL;
    }
    if (job && o && (o->min_nodes != job->opts.min_nodes || o->max_nodes != job->opts.max_nodes)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EINVAL,
                       "join: job '%s' has nodes %d:%d, this agent asked for %d:%d", job->run_id,
                       job->opts.min_nodes, job->opts.max_nodes, o->min_nodes, o->max_nodes);
        return NULL;
    }
    if (job)
        return job;
    if (!o)
        o = &core->opts.job_defaults;
    char err[128];
    if (dl_rdzv_job_opts_check(o, err, sizeof(err)) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -EINVAL, "join: opts: %s", err);
        return NULL;
    }
    const char *over = o->join_timeout > core->opts.max_timeout ? "join_timeout"
                       : o->last_call > core->opts.max_timeout  ? "last_call"
                       : o->dead_after > core->opts.max_timeout ? "dead_after"
                                                                : NULL;
    if (over) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -EINVAL,
                       "join: %s is over this server's limit of %g s", over,
                       core->opts.max_timeout);
        return NULL;
    }
    int r = job_new(core, ev->run_id, o, ev->join.creator, &job);
    if (r == -ENOSPC) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, r, "join: too many jobs (limit %zu)",
                       core->opts.max_jobs);
        return NULL;
    }
    if (r == -EDQUOT) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -ENOSPC,
                       "join: this peer created %zu live jobs already, the limit",
                       core->opts.max_jobs_per_creator);
        return NULL;
    }
    if (r < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, r, "join: out of memory");
        return NULL;
    }
    /* Armed now, not at the first member, so that a job whose first JOIN fails is not kept
     * forever. */
    if (dl__rdzv_heap_reserve(&core->heap, 1) == 0)
        dl__rdzv_timer_arm(&core->heap, &job->join, now + job->opts.join_timeout);
    log_created(core, job);
    return job;
}

/* An agent that still runs workers of the current round came back on a new connection. */
static void resume(dl_rdzv_core_t *core, dl__rdzv_job_t *job, dl__rdzv_member_t *m,
                   const dl_rdzv_event_t *ev, double now)
{
    if (m->conn && m->conn->id != ev->conn) {
        dl__rdzv_close(core, m->conn->id);
        member_detach(core, m);
    }
    if (!m->conn) {
        dl__rdzv_conn_t *conn;
        if (dl__rdzv_conn_get(core, ev->conn, &conn) < 0) {
            dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "join: out of memory");
            return;
        }
        member_attach(m, conn);
    }
    m->last_seen = now;
    send_assignment(core, job, m, ev->req_id);
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id, "agent '%s' (%s) resumed round %d",
                 m->agent_id, m->host, job->round);
}

/* Adds the joiner to the gathering round. */
static void add_member(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev,
                       double now)
{
    int hint = ev->join.node_rank;
    if (hint >= 0 && job->hint_owner && job->hint_owner[hint]) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EEXIST,
                       "join: node_rank %d is taken by agent '%s'", hint,
                       job->hint_owner[hint]->agent_id);
        return;
    }
    if (job->slots_sum + ev->join.slots > INT_MAX) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EOVERFLOW,
                       "join: the world size would pass %d", INT_MAX);
        return;
    }
    if (hint >= 0 && !job->hint_owner)
        job->hint_owner = calloc((size_t)job->opts.max_nodes, sizeof(*job->hint_owner));
    dl__rdzv_conn_t *conn = NULL;
    dl__rdzv_member_t *m = NULL;
    if ((hint >= 0 && !job->hint_owner) || dl__rdzv_map_reserve(&job->by_agent, 1) < 0 ||
        dl__rdzv_conn_get(core, ev->conn, &conn) < 0 || !(m = member_new(ev)))
        goto fail;
    if (job->nmembers == job->members_cap) {
        size_t cap = job->members_cap ? 2 * job->members_cap : 8;
        dl__rdzv_member_t **v = realloc(job->members, cap * sizeof(*v));
        if (v)
            job->members = v;
        dl_rdzv_policy_node_t *nodes = v ? realloc(job->rank_nodes, cap * sizeof(*nodes)) : NULL;
        if (nodes)
            job->rank_nodes = nodes;
        dl_rdzv_policy_node_t **order =
            nodes ? realloc(job->rank_order, cap * sizeof(*order)) : NULL;
        if (order)
            job->rank_order = order;
        bool *taken = order ? realloc(job->rank_taken, cap * sizeof(*taken)) : NULL;
        if (!taken)
            goto fail; /* what did grow is kept, for the next join */
        job->rank_taken = taken;
        job->members_cap = cap;
    }
    m->job = job;
    m->idx = job->nmembers;
    job->members[job->nmembers++] = m;
    dl__rdzv_map_insert(&job->by_agent, &m->node,
                        dl__rdzv_hash(core->opts.hash_key, m->agent_id, strlen(m->agent_id)));
    if (hint >= 0) {
        job->hint_owner[hint] = m;
        job->nhints++;
    }
    job->slots_sum += m->slots;
    member_attach(m, conn);
    m->last_seen = now;
    dl__rdzv_timer_arm(&core->heap, &m->heartbeat, now + job->opts.dead_after);
    if (!dl__rdzv_timer_armed(&job->join))
        dl__rdzv_timer_arm(&core->heap, &job->join, now + job->opts.join_timeout);
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_JOINED, ev->req_id, job->run_id)->joined.round =
        job->round;
    dl__rdzv_log(core, DL_RDZV_LOG_DEBUG, job->run_id,
                 "agent '%s' (%s, %d slot%s) joined round %d: %zu of %d:%d nodes", m->agent_id,
                 m->host, m->slots, m->slots == 1 ? "" : "s", job->round, job->nmembers,
                 job->opts.min_nodes, job->opts.max_nodes);
    check_round(core, job, now);
    return;
fail:
    free(m);
    dl__rdzv_conn_gc(core, conn);
    dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "join: out of memory");
}

/* A job meets an agent that ran round R of it: this rendezvous restarted (or is a new host) and
 * its count began again. It goes on from R + 1, so that no attempt is numbered, and no attempt
 * folder written, twice, and the restart budget stays spent; the highest any agent brings wins.
 * Agents of this rendezvous's own rounds bring an older round, which changes nothing. The
 * restarts spent are adopted in any live state (a running round's members are told if that
 * ends the job); the round here only while gathering (a running round's next one is numbered
 * after it by on_join). */
static void adopt_history(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev)
{
    if (job->state == DL_RDZV_JOB_GATHERING && ev->join.resume_round >= job->round &&
        ev->join.resume_round < INT_MAX - 1) {
        dl__rdzv_log(core, DL_RDZV_LOG_WARN, job->run_id,
                     "agent '%s' (%s) ran round %d of this job: going on from round %d",
                     ev->join.agent_id, ev->join.host, ev->join.resume_round,
                     ev->join.resume_round + 1);
        job->round = ev->join.resume_round + 1;
    }
    if (ev->join.failures > job->restarts) {
        dl__rdzv_log(core, DL_RDZV_LOG_WARN, job->run_id,
                     "agent '%s' (%s) says %d restart%s of this job %s spent: %d of %d left",
                     ev->join.agent_id, ev->join.host, ev->join.failures,
                     ev->join.failures == 1 ? "" : "s", ev->join.failures == 1 ? "was" : "were",
                     job->opts.max_restarts > ev->join.failures
                         ? job->opts.max_restarts - ev->join.failures
                         : 0,
                     job->opts.max_restarts);
        job->restarts = ev->join.failures;
    }
}

static void on_join(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    const char *why;
    if (ev->conn == DL_RDZV_CONN_NONE)
        return;
    if (check_join(ev, &why) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -EINVAL, "join: %s", why);
        return;
    }
    const dl__rdzv_member_t *bound = conn_member(core, ev->conn);
    if (bound && (strcmp(bound->job->run_id, ev->run_id) != 0 ||
                  strcmp(bound->agent_id, ev->join.agent_id) != 0)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -EBUSY,
                       "join: this connection joined job '%s' as agent '%s' already",
                       bound->job->run_id, bound->agent_id);
        return;
    }
    dl__rdzv_job_t *job = join_job(core, ev, now);
    if (!job)
        return;
    if (ev->join.node_rank >= job->opts.max_nodes) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EINVAL,
                       "join: node_rank %d is out of range 0..%d", ev->join.node_rank,
                       job->opts.max_nodes - 1);
        return;
    }
    if (prepare(core, job) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "join: out of memory");
        return;
    }
    dl__rdzv_member_t *m = member_find(core, job, ev->join.agent_id);
    if (!m)
        adopt_history(core, job, ev);
    /* More restarts spent than the budget allows: the rendezvous that counted them failed the
     * job (or would have, had it lived), and an agent cut off from it when it did never heard.
     * Ending the job here says so at once, where a new round would wait for nodes that are gone
     * until the join timeout, or a running one would go on until its next failure. */
    if (dl_rdzv_policy_overspent(job->restarts, job->opts.max_restarts)) {
        const char *spent = dl__rdzv_printf(
            core,
            "the restart budget was spent (agent '%s' (%s) counts %d restart%s, of %d) "
            "before this rendezvous took the job over%s%s",
            ev->join.agent_id, ev->join.host, ev->join.failures, ev->join.failures == 1 ? "" : "s",
            job->opts.max_restarts, job->failure ? ": " : "", job->failure ? job->failure : "");
        keep_first_failure(job, spent, NULL);
        fail_job(core, job, now, spent, DL_RDZV_CAUSE_NODE_LOST, NULL, ev->conn, 0, NULL);
        return;
    }
    if (m && job->state == DL_RDZV_JOB_GATHERING) {
        if (m->conn && m->conn->id == ev->conn) {
            dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_JOINED, ev->req_id, job->run_id)
                ->joined.round = job->round;
            return;
        }
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EEXIST,
                       "join: agent id '%s' joined round %d from another connection already",
                       m->agent_id, job->round);
        return;
    }
    if (m && ev->join.resume_round == job->round) {
        resume(core, job, m, ev, now);
        return;
    }
    if (job->state == DL_RDZV_JOB_RUNNING) {
        if (!m && job->nmembers >= (size_t)job->opts.max_nodes) {
            dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -EUSERS,
                           "join: job '%s' runs round %d with the maximum of %d nodes", job->run_id,
                           job->round, job->opts.max_nodes);
            return;
        }
        const char *reason =
            m ? dl__rdzv_printf(core, "agent '%s' (%s) joined again, leaving round %d", m->agent_id,
                                m->host, job->round)
              : dl__rdzv_printf(core, "agent '%s' (%s) asked to join", ev->join.agent_id,
                                ev->join.host);
        /* A newcomer that ran a later round (this rendezvous restarted meanwhile): the next
         * round comes after it, so that no attempt is numbered twice. */
        if (!m && ev->join.resume_round >= job->round && ev->join.resume_round < INT_MAX - 1)
            job->round = ev->join.resume_round;
        new_round(core, job, now, reason, DL_RDZV_CAUSE_NODE_JOINED, NULL, NULL);
        if (is_over(job)) {
            dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESHUTDOWN,
                           "join: job '%s' is over (%s)", job->run_id,
                           dl_rdzv_job_state_name(job->state));
            return;
        }
    }
    add_member(core, job, ev, now);
}

/* The member a LEAVE or WORKER_FAILED report speaks for, if it speaks of the running round. */
static dl__rdzv_member_t *report_member(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev,
                                        const char *what)
{
    dl__rdzv_member_t *m = conn_member(core, ev->conn);
    if (!m) {
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -ESTALE,
                       "%s: this connection is not a member of any round", what);
        return NULL;
    }
    dl__rdzv_job_t *job = m->job;
    if (is_over(job)) {
        /* The job ended meanwhile; the agent hears of it from the message already sent. */
        dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
        return NULL;
    }
    if (job->state != DL_RDZV_JOB_RUNNING || ev->report.round != job->round) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESTALE,
                       "%s: round %d is not running; the current round is %d (%s)", what,
                       ev->report.round, job->round, dl_rdzv_job_state_name(job->state));
        return NULL;
    }
    if (prepare(core, job) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "%s: out of memory", what);
        return NULL;
    }
    return m;
}

static void on_leave(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_member_t *m = conn_member(core, ev->conn);
    if (m && m->job->state == DL_RDZV_JOB_GATHERING) {
        /* An agent that gives up waiting: it simply is not part of the round any more. */
        dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, m->job->run_id);
        gathering_lost(core, m->job, m, "it left");
        return;
    }
    m = report_member(core, ev, "leave");
    if (!m)
        return;
    dl__rdzv_job_t *job = m->job;
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
    if (m->left)
        return;
    m->left = true;
    job->nleft++;
    dl__rdzv_timer_disarm(&core->heap, &m->heartbeat);
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id, "agent '%s' (%s) finished: %zu of %zu done",
                 m->agent_id, m->host, job->nleft, job->nmembers);
    if (job->nleft < job->nmembers)
        return;
    for (size_t i = 0; i < job->nmembers; i++)
        dl__rdzv_send(core, member_conn(job->members[i]), DL_RDZV_MSG_SUCCEEDED, 0, job->run_id)
            ->succeeded.round = job->round;
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id, "job succeeded in round %d, %d restart%s",
                 job->round, job->restarts, job->restarts == 1 ? "" : "s");
    finish(core, job, DL_RDZV_JOB_SUCCEEDED, now);
}

/* An agent that goes away on purpose before the job's end, as an operator's SIGTERM makes it: a
 * departure, never a failure. With min_nodes or more left the others go on at once in a new
 * round without it, as when a node joins, and no restart is spent; waiting for its connection to
 * close and then for dead_after would lose it as a failed node. With fewer left the job cannot go
 * on, and waiting for a round that cannot close would hold every other node for --join-timeout:
 * it stops on every node, as `dlaunch stop` stops it. */
static void on_quit(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_member_t *m = conn_member(core, ev->conn);
    if (!m || is_over(m->job))
        return;
    dl__rdzv_job_t *job = m->job;
    const char *why = ev->report.description ? ev->report.description : "no reason given";
    if (job->state == DL_RDZV_JOB_GATHERING) {
        gathering_lost(core, job, m, dl__rdzv_printf(core, "it left (%s)", why));
        return;
    }
    size_t left = 0;
    for (size_t i = 0; i < job->nmembers; i++)
        if (job->members[i] != m && job->members[i]->conn && !job->members[i]->left)
            left++;
    if (prepare(core, job) < 0)
        return;
    if (dl_rdzv_policy_departure_goes_on(left > INT_MAX ? INT_MAX : (int)left,
                                         job->opts.min_nodes)) {
        dl_rdzv_culprit_t *c = dl__rdzv_culprit(core, culprit_of(core, m, DL_RDZV_CAUSE_NODE_LEFT));
        new_round(core, job, now,
                  dl__rdzv_printf(core,
                                  "agent '%s' (%s) departed from round %d (%s); %zu node%s "
                                  "go on",
                                  m->agent_id, m->host, job->round, why, left,
                                  left == 1 ? "" : "s"),
                  DL_RDZV_CAUSE_NODE_LEFT, m, c);
        return;
    }
    for (size_t i = 0; i < job->nmembers; i++)
        if (job->members[i] != m && member_conn(job->members[i]))
            dl__rdzv_send(core, member_conn(job->members[i]), DL_RDZV_MSG_STOP, 0, job->run_id)
                ->stop.round = job->round;
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id,
                 "job stopped in round %d: agent '%s' (%s) departed (%s), and %zu node%s cannot "
                 "go on (at least %d)",
                 job->round, m->agent_id, m->host, why, left, left == 1 ? "" : "s",
                 job->opts.min_nodes);
    finish(core, job, DL_RDZV_JOB_STOPPED, now);
}

/* The running member with that node rank, or NULL. */
static const dl__rdzv_member_t *member_of_node(const dl__rdzv_job_t *job, int node_rank)
{
    for (size_t i = 0; node_rank >= 0 && i < job->nmembers; i++)
        if (job->members[i]->node_rank == node_rank && !job->members[i]->left)
            return job->members[i];
    return NULL;
}

static void on_worker_failed(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_member_t *m = report_member(core, ev, "worker_failed");
    if (!m)
        return;
    dl__rdzv_job_t *job = m->job;
    const char *what = ev->report.description ? ev->report.description : "a worker failed";
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
    /* A member that lost its connection and has not come back most likely died, and the
     * failure here followed from it (its peers' collectives broke): the dead node is the
     * culprit, not this collateral failure. */
    for (size_t i = 0; i < job->nmembers; i++) {
        dl__rdzv_member_t *gone = job->members[i];
        if (gone == m || gone->conn || gone->left)
            continue;
        dl_rdzv_culprit_t *c =
            dl__rdzv_culprit(core, culprit_of(core, gone, DL_RDZV_CAUSE_NODE_LOST));
        new_round(core, job, now,
                  dl__rdzv_printf(core,
                                  "agent '%s' (%s) lost its connection in round %d; then agent "
                                  "'%s' (%s) reported: %.512s",
                                  gone->agent_id, gone->host, job->round, m->agent_id, m->host,
                                  what),
                  DL_RDZV_CAUSE_NODE_LOST, gone, c);
        return;
    }
    /* A victim's report (its rank gave up waiting in a collective) names the rank it waited
     * for, as that rank's own node would have: whichever node reports first, the same culprit
     * (the policy's first-failure rule, which the etcd backend applies too). */
    int w = dl_rdzv_policy_waited_for(ev->report.ranks, ev->report.nranks, ev->report.rank,
                                      ev->report.hung);
    const dl__rdzv_member_t *held =
        w >= 0 ? member_of_node(job, ev->report.ranks[w].node_rank) : NULL;
    dl_rdzv_culprit_t *c =
        dl__rdzv_culprit(core, culprit_of(core, held ? held : m, DL_RDZV_CAUSE_WORKER_FAILED));
    if (c && held) {
        c->rank = ev->report.ranks[w].rank;
        c->hung = true; /* it held the others up: the watchdog's word for it */
        c->step = ev->report.ranks[w].step;
    } else if (c) {
        c->rank = ev->report.rank;
        c->exit_code = ev->report.signal > 0 || ev->report.hung ? -1 : ev->report.exit_code;
        c->signal = ev->report.hung ? 0 : ev->report.signal;
        c->hung = ev->report.hung;
        c->oom = ev->report.oom && !ev->report.hung;
        c->step = ev->report.step;
    }
    const char *why =
        held ? dl__rdzv_printf(core,
                               "rank %d on node %d held up rank %d in a collective; agent '%s' "
                               "(%s) in round %d: %.1024s",
                               ev->report.ranks[w].rank, held->node_rank, ev->report.rank,
                               m->agent_id, m->host, job->round, what)
             : dl__rdzv_printf(core, "agent '%s' (%s) in round %d: %.1024s", m->agent_id, m->host,
                               job->round, what);
    new_round(core, job, now, why, DL_RDZV_CAUSE_WORKER_FAILED, NULL, c);
}

static void on_disconnect(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev)
{
    dl__rdzv_conn_t *conn = dl__rdzv_conn_find(core, ev->conn);
    if (!conn)
        return;
    dl__rdzv_store_drop_conn(core, conn);
    dl__rdzv_member_t *m = conn->member;
    if (!m) {
        dl__rdzv_conn_gc(core, conn);
        return;
    }
    dl__rdzv_job_t *job = m->job;
    if (job->state == DL_RDZV_JOB_GATHERING) {
        gathering_lost(core, job, m, "its connection closed");
        return;
    }
    member_detach(core, m);
    if (job->state == DL_RDZV_JOB_RUNNING && !m->left)
        dl__rdzv_log(core, DL_RDZV_LOG_WARN, job->run_id,
                     "agent '%s' (%s) disconnected; it is declared dead without a heartbeat "
                     "or a JOIN resuming round %d within %g s",
                     m->agent_id, m->host, job->round, job->opts.dead_after);
}

static dl__rdzv_job_t *request_job(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev,
                                   const char *what)
{
    dl__rdzv_job_t *job = ev->run_id ? job_find(core, ev->run_id) : NULL;
    if (!job)
        dl__rdzv_error(core, ev->conn, ev->req_id, NULL, -ENOENT, "%s: no job '%s'", what,
                       ev->run_id ? ev->run_id : "(none)");
    return job;
}

static void on_restart(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_job_t *job = request_job(core, ev, "restart");
    if (!job)
        return;
    if (job->state != DL_RDZV_JOB_RUNNING) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, is_over(job) ? -ESHUTDOWN : -EAGAIN,
                       "restart: job '%s' is %s in round %d", job->run_id,
                       dl_rdzv_job_state_name(job->state), job->round);
        return;
    }
    if (prepare(core, job) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "restart: out of memory");
        return;
    }
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
    new_round(core, job, now, "restart requested", DL_RDZV_CAUSE_REQUESTED, NULL, NULL);
}

static void on_stop(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_job_t *job = request_job(core, ev, "stop");
    if (!job)
        return;
    if (is_over(job)) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ESHUTDOWN,
                       "stop: job '%s' is over (%s)", job->run_id,
                       dl_rdzv_job_state_name(job->state));
        return;
    }
    if (prepare(core, job) < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, job->run_id, -ENOMEM, "stop: out of memory");
        return;
    }
    for (size_t i = 0; i < job->nmembers; i++)
        dl__rdzv_send(core, member_conn(job->members[i]), DL_RDZV_MSG_STOP, 0, job->run_id)
            ->stop.round = job->round;
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_OK, ev->req_id, job->run_id);
    dl__rdzv_log(core, DL_RDZV_LOG_INFO, job->run_id, "job stopped on request in round %d",
                 job->round);
    finish(core, job, DL_RDZV_JOB_STOPPED, now);
}

static int fill_job_status(dl_rdzv_core_t *core, dl__rdzv_job_t *job, double now,
                           dl_rdzv_job_status_t *js)
{
    dl_rdzv_member_status_t *ms = NULL;
    if (job->nmembers) {
        ms = dl__rdzv_arena_alloc(&core->arena, job->nmembers * sizeof(*ms));
        if (!ms)
            return -ENOMEM;
    }
    for (size_t i = 0; i < job->nmembers; i++) {
        const dl__rdzv_member_t *m = job->members[i];
        ms[i] = (dl_rdzv_member_status_t){
            .agent_id = m->agent_id,
            .host = m->host,
            .slots = m->slots,
            .node_rank = job->state == DL_RDZV_JOB_GATHERING ? -1 : m->node_rank,
            .heartbeat_age = now - m->last_seen,
            .connected = m->conn != NULL,
            .left = m->left,
        };
    }
    *js = (dl_rdzv_job_status_t){
        .run_id = job->run_id,
        .state = job->state,
        .round = job->round,
        .restarts = job->restarts,
        .max_restarts = job->opts.max_restarts,
        .min_nodes = job->opts.min_nodes,
        .max_nodes = job->opts.max_nodes,
        .world_size = job->state == DL_RDZV_JOB_GATHERING ? 0 : job->world_size,
        .failure = job->failure,
        .members = ms,
        .nmembers = job->nmembers,
        .nkeys = job->store.keys.count,
        .store_bytes = job->store.bytes,
        .store_waits = job->store.nwaiters,
    };
    return 0;
}

static void on_status(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_job_t *one = NULL;
    if (ev->run_id && !(one = request_job(core, ev, "status")))
        return;
    size_t n = one ? 1 : core->njobs;
    dl_rdzv_status_t *st = dl__rdzv_arena_alloc(&core->arena, sizeof(*st));
    dl_rdzv_job_status_t *js = n ? dl__rdzv_arena_alloc(&core->arena, n * sizeof(*js)) : NULL;
    int r = st && (js || n == 0) ? 0 : -ENOMEM;
    size_t i = 0;
    for (dl__rdzv_job_t *job = one ? one : core->first_job; job && r == 0 && i < n; job = job->next)
        r = fill_job_status(core, job, now, &js[i++]);
    if (r < 0) {
        dl__rdzv_error(core, ev->conn, ev->req_id, ev->run_id, r, "status: out of memory");
        return;
    }
    st->jobs = js;
    st->njobs = n;
    dl__rdzv_send(core, ev->conn, DL_RDZV_MSG_STATUS, ev->req_id, one ? one->run_id : NULL)
        ->status = st;
}

static void on_store(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now)
{
    dl__rdzv_job_t *job = request_job(core, ev, "store");
    if (job)
        dl__rdzv_store_request(core, job, ev, now);
}

static void heartbeat_expired(dl_rdzv_core_t *core, dl__rdzv_member_t *m, double now)
{
    dl__rdzv_job_t *job = m->job;
    double due = m->last_seen + job->opts.dead_after;
    if (due > now) {
        /* Heartbeats only stamp last_seen; the timer catches up here, once per period. */
        dl__rdzv_timer_arm(&core->heap, &m->heartbeat, due);
        return;
    }
    dl__rdzv_timer_disarm(&core->heap, &m->heartbeat);
    const char *why = dl__rdzv_printf(core, "agent '%s' (%s) sent no heartbeat for %g s",
                                      m->agent_id, m->host, now - m->last_seen);
    if (job->state == DL_RDZV_JOB_GATHERING) {
        dl__rdzv_close(core, member_conn(m));
        gathering_lost(core, job, m, why);
        return;
    }
    dl_rdzv_culprit_t *c = dl__rdzv_culprit(core, culprit_of(core, m, DL_RDZV_CAUSE_NODE_LOST));
    new_round(core, job, now, why, DL_RDZV_CAUSE_NODE_LOST, m, c);
}

/* Runs one due timer. Returns -ENOMEM, leaving it armed to be retried, when the room for what it
 * does cannot be had. */
static int fire(dl_rdzv_core_t *core, dl__rdzv_timer_t *t, double now)
{
    if (t->kind == DL__RDZV_T_WAIT) {
        if (dl__rdzv_reserve(core, 2) < 0)
            return -ENOMEM;
        dl__rdzv_store_wait_expired(core, t, now);
        return 0;
    }
    dl__rdzv_member_t *m = NULL;
    dl__rdzv_job_t *job;
    if (t->kind == DL__RDZV_T_HEARTBEAT) {
        m = dl__rdzv_container_of(t, dl__rdzv_member_t, heartbeat);
        job = m->job;
    } else if (t->kind == DL__RDZV_T_LAST_CALL) {
        job = dl__rdzv_container_of(t, dl__rdzv_job_t, last_call);
    } else if (t->kind == DL__RDZV_T_JOIN) {
        job = dl__rdzv_container_of(t, dl__rdzv_job_t, join);
    } else {
        job = dl__rdzv_container_of(t, dl__rdzv_job_t, linger);
    }
    if (prepare(core, job) < 0)
        return -ENOMEM;
    if (m) {
        heartbeat_expired(core, m, now);
        return 0;
    }
    dl__rdzv_timer_disarm(&core->heap, t);
    if (t->kind == DL__RDZV_T_LINGER) {
        job_remove(core, job);
        return 0;
    }
    if (job->state != DL_RDZV_JOB_GATHERING)
        return 0;
    /* The last call is over, or the join timeout came first. */
    if (dl_rdzv_policy_round_step(job->nmembers, job->opts.min_nodes, job->opts.max_nodes,
                                  job->opts.last_call, true) == DL_RDZV_ROUND_CLOSE)
        close_round(core, job);
    else if (t->kind == DL__RDZV_T_JOIN)
        time_out(core, job, now);
    return 0;
}

static int run_timers(dl_rdzv_core_t *core, double now)
{
    for (;;) {
        dl__rdzv_timer_t *t = dl__rdzv_heap_top(&core->heap);
        if (!t || t->at > now)
            return 0;
        int r = fire(core, t, now);
        if (r < 0)
            return r;
    }
}

/* Tells the shell about a change of the earliest deadline. After a TICK the shell's one-shot
 * timer has fired, so the deadline is told again even when unchanged. */
static void arm_shell_timer(dl_rdzv_core_t *core, bool tick)
{
    dl__rdzv_timer_t *t = dl__rdzv_heap_top(&core->heap);
    if (!t) {
        if (core->armed)
            dl__rdzv_push(core, DL_RDZV_ACT_DISARM_TIMER);
        core->armed = false;
        return;
    }
    if (tick || !core->armed || core->armed_at != t->at)
        dl__rdzv_push(core, DL_RDZV_ACT_ARM_TIMER)->at = t->at;
    core->armed = true;
    core->armed_at = t->at;
}

void dl_rdzv_core_held_up(dl_rdzv_core_t *core, double now)
{
    for (dl__rdzv_job_t *job = core->first_job; job; job = job->next)
        for (size_t i = 0; i < job->nmembers; i++)
            if (job->members[i]->last_seen < now)
                job->members[i]->last_seen = now;
}

int dl_rdzv_core_step(dl_rdzv_core_t *core, const dl_rdzv_event_t *ev, double now,
                      dl_rdzv_actions_t *acts)
{
    if (!ev)
        return -EINVAL;
    core->nacts = 0;
    core->oom = false;
    dl__rdzv_arena_reset(&core->arena);
    bury_graveyard(core);
    if (now >= core->now)
        core->now = now;
    else
        now = core->now;
    int r = run_timers(core, now);
    int bad = 0;
    switch (ev->kind) {
    case DL_RDZV_EV_TICK: break;
    case DL_RDZV_EV_JOIN: on_join(core, ev, now); break;
    case DL_RDZV_EV_HEARTBEAT: {
        dl__rdzv_member_t *m = conn_member(core, ev->conn);
        if (m && !is_over(m->job))
            m->last_seen = now;
        break;
    }
    case DL_RDZV_EV_LEAVE: on_leave(core, ev, now); break;
    case DL_RDZV_EV_QUIT: on_quit(core, ev, now); break;
    case DL_RDZV_EV_WORKER_FAILED: on_worker_failed(core, ev, now); break;
    case DL_RDZV_EV_DISCONNECT: on_disconnect(core, ev); break;
    case DL_RDZV_EV_RESTART: on_restart(core, ev, now); break;
    case DL_RDZV_EV_STOP: on_stop(core, ev, now); break;
    case DL_RDZV_EV_STATUS: on_status(core, ev, now); break;
    case DL_RDZV_EV_STORE_RESET: {
        dl__rdzv_job_t *job = ev->run_id ? job_find(core, ev->run_id) : NULL;
        if (job)
            dl__rdzv_store_clear(core, job, -ESTALE, "the job restarted");
        break;
    }
    case DL_RDZV_EV_STORE_SET:
    case DL_RDZV_EV_STORE_GET:
    case DL_RDZV_EV_STORE_ADD:
    case DL_RDZV_EV_STORE_CAS:
    case DL_RDZV_EV_STORE_DELETE:
    case DL_RDZV_EV_STORE_WAIT: on_store(core, ev, now); break;
    default: bad = -EINVAL; break;
    }
    arm_shell_timer(core, ev->kind == DL_RDZV_EV_TICK);
    acts->v = core->acts;
    acts->n = core->nacts;
    if (bad < 0)
        return bad;
    return r < 0 || core->oom ? -ENOMEM : 0;
}

int dl_rdzv_core_next_deadline(const dl_rdzv_core_t *core, double *ret_at)
{
    const dl__rdzv_timer_t *t = dl__rdzv_heap_top(&core->heap);
    if (!t)
        return -ENOENT;
    *ret_at = t->at;
    return 0;
}

int dl_rdzv_core_add_job(dl_rdzv_core_t *core, const char *run_id, const dl_rdzv_job_opts_t *opts,
                         dl_rdzv_actions_t *acts)
{
    /* A step of its own: what creating the job does (its log line, its join timer) is handed
     * out as a step's actions are. */
    core->nacts = 0;
    core->oom = false;
    dl__rdzv_arena_reset(&core->arena);
    int r;
    dl__rdzv_job_t *job;
    if (!opts)
        opts = &core->opts.job_defaults;
    if (!name_ok(run_id) || dl_rdzv_job_opts_check(opts, NULL, 0) < 0)
        r = -EINVAL;
    else if (job_find(core, run_id))
        r = -EEXIST;
    else if ((r = job_new(core, run_id, opts, 0, &job)) == 0)
        log_created(core, job);
    arm_shell_timer(core, false);
    if (acts != NULL) {
        acts->v = core->acts;
        acts->n = core->nacts;
    }
    return r;
}

int dl_rdzv_core_new(const dl_rdzv_core_opts_t *opts, dl_rdzv_core_t **ret_core)
{
    dl_rdzv_core_opts_t def;
    if (!opts) {
        dl_rdzv_core_opts_init(&def);
        opts = &def;
    }
    if (dl_rdzv_job_opts_check(&opts->job_defaults, NULL, 0) < 0 || opts->max_jobs < 1 ||
        opts->max_key_len < 1 || opts->max_keys < 1 || opts->max_wait_keys < 1 ||
        opts->max_waits < 1 || opts->max_memory < 1 || opts->max_waits_per_conn < 1 ||
        opts->max_jobs_per_creator < 1 || !(opts->max_timeout > 0) ||
        (opts->store_host && !name_ok(opts->store_host)) || opts->store_port < 0 ||
        opts->store_port > 65535)
        return -EINVAL;
    dl_rdzv_core_t *core = calloc(1, sizeof(*core));
    if (!core)
        return -ENOMEM;
    core->opts = *opts;
    if (opts->store_host && !(core->store_host = strdup(opts->store_host))) {
        free(core);
        return -ENOMEM;
    }
    core->opts.store_host = core->store_host;
    if (opts->host_agent_id && !(core->host_agent_id = strdup(opts->host_agent_id))) {
        free(core->store_host);
        free(core);
        return -ENOMEM;
    }
    core->opts.host_agent_id = core->host_agent_id;
    *ret_core = core;
    return 0;
}

void dl_rdzv_core_free(dl_rdzv_core_t *core)
{
    if (!core)
        return;
    bury_graveyard(core);
    while (core->first_job)
        job_remove(core, core->first_job);
    bury_graveyard(core);
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&core->conns);
    while (n) {
        dl__rdzv_hnode_t *next = n->next;
        free(dl__rdzv_container_of(n, dl__rdzv_conn_t, node));
        n = next;
    }
    dl__rdzv_map_free(&core->conns);
    n = dl__rdzv_map_take_all(&core->creators);
    while (n) {
        dl__rdzv_hnode_t *next = n->next;
        free(dl__rdzv_container_of(n, creator_t, node));
        n = next;
    }
    dl__rdzv_map_free(&core->creators);
    dl__rdzv_map_free(&core->jobs);
    dl__rdzv_heap_free(&core->heap);
    dl__rdzv_arena_free(&core->arena);
    free(core->acts);
    free(core->store_host);
    free(core->host_agent_id);
    free(core);
}
