/* A fake shell for the rendezvous core tests: feeds events at made-up times and looks through the
 * actions of the last step. Connection ids are chosen by the tests. */
#ifndef DL_TEST_RDZV_HARNESS_H
#define DL_TEST_RDZV_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rdzv-core.h"

typedef struct {
    dl_rdzv_core_t *core;
    dl_rdzv_actions_t acts;
} harness_t;

static inline void h_init_opts(harness_t *h, const dl_rdzv_core_opts_t *o)
{
    h->acts.v = NULL;
    h->acts.n = 0;
    ck_assert_int_eq(dl_rdzv_core_new(o, &h->core), 0);
}

static inline void h_init(harness_t *h)
{
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.store_host = "10.0.0.1";
    o.store_port = 29400;
    o.hash_key[0] = 0x1234;
    o.hash_key[1] = 0x5678;
    h_init_opts(h, &o);
}

static inline void h_fini(harness_t *h)
{
    dl_rdzv_core_free(h->core);
    h->core = NULL;
}

/* Small windows so tests read easily: last call 10 s, join timeout 100 s, dead after 20 s. */
static inline dl_rdzv_job_opts_t h_opts(int min, int max)
{
    dl_rdzv_job_opts_t o;
    dl_rdzv_job_opts_init(&o);
    o.min_nodes = min;
    o.max_nodes = max;
    o.last_call = 10;
    o.join_timeout = 100;
    o.dead_after = 20;
    o.max_restarts = 3;
    o.linger = 50;
    return o;
}

static inline void h_step(harness_t *h, const dl_rdzv_event_t *ev, double now)
{
    ck_assert_int_eq(dl_rdzv_core_step(h->core, ev, now, &h->acts), 0);
}

static inline void h_tick(harness_t *h, double now)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_TICK};
    h_step(h, &ev, now);
}

typedef struct {
    const char *agent;
    const char *host;
    int slots;
    int hint;
    int slurm;
} h_node_t;

static inline void h_join_full(harness_t *h, uint64_t conn, const char *run_id, h_node_t n,
                               const dl_rdzv_job_opts_t *opts, int resume, double now)
{
    dl_rdzv_event_t ev = {
        .kind = DL_RDZV_EV_JOIN, .conn = conn, .req_id = 1000 + conn, .run_id = run_id};
    ev.join.agent_id = n.agent;
    ev.join.host = n.host;
    ev.join.slots = n.slots ? n.slots : 1;
    ev.join.node_rank = n.hint;
    ev.join.slurm_node_id = n.slurm;
    ev.join.resume_round = resume;
    ev.join.opts = opts;
    h_step(h, &ev, now);
}

/* Joins agent "a<conn>" on host "h<conn>" with the given slots and no hints. */
static inline void h_join(harness_t *h, uint64_t conn, const char *run_id, int slots,
                          const dl_rdzv_job_opts_t *opts, double now)
{
    char agent[32], host[32];
    snprintf(agent, sizeof(agent), "a%llu", (unsigned long long)conn);
    snprintf(host, sizeof(host), "h%llu", (unsigned long long)conn);
    h_node_t n = {agent, host, slots, -1, -1};
    h_join_full(h, conn, run_id, n, opts, -1, now);
}

static inline void h_conn_event(harness_t *h, dl_rdzv_event_kind_t kind, uint64_t conn, int round,
                                double now)
{
    dl_rdzv_event_t ev = {.kind = kind, .conn = conn, .req_id = 2000 + conn};
    ev.report.round = round;
    ev.report.description = "worker 3 exited with code 1";
    h_step(h, &ev, now);
}

static inline void h_control(harness_t *h, dl_rdzv_event_kind_t kind, uint64_t conn,
                             const char *run_id, double now)
{
    dl_rdzv_event_t ev = {.kind = kind, .conn = conn, .req_id = 3000 + conn, .run_id = run_id};
    h_step(h, &ev, now);
}

/* The first message of the given kind sent to conn in the last step, or NULL. */
static inline const dl_rdzv_msg_t *h_msg(const harness_t *h, uint64_t conn, dl_rdzv_msg_kind_t kind)
{
    for (size_t i = 0; i < h->acts.n; i++) {
        const dl_rdzv_action_t *a = &h->acts.v[i];
        if (a->kind == DL_RDZV_ACT_SEND && a->conn == conn && a->msg.kind == kind)
            return &a->msg;
    }
    return NULL;
}

/* Messages of a kind sent in the last step, to anyone. */
static inline size_t h_count(const harness_t *h, dl_rdzv_msg_kind_t kind)
{
    size_t n = 0;
    for (size_t i = 0; i < h->acts.n; i++)
        n += h->acts.v[i].kind == DL_RDZV_ACT_SEND && h->acts.v[i].msg.kind == kind;
    return n;
}

static inline size_t h_sends_to(const harness_t *h, uint64_t conn)
{
    size_t n = 0;
    for (size_t i = 0; i < h->acts.n; i++)
        n += h->acts.v[i].kind == DL_RDZV_ACT_SEND && h->acts.v[i].conn == conn;
    return n;
}

static inline bool h_closed(const harness_t *h, uint64_t conn)
{
    for (size_t i = 0; i < h->acts.n; i++)
        if (h->acts.v[i].kind == DL_RDZV_ACT_CLOSE && h->acts.v[i].conn == conn)
            return true;
    return false;
}

/* The error code sent to conn in the last step, or 0. */
static inline int h_error(const harness_t *h, uint64_t conn)
{
    const dl_rdzv_msg_t *m = h_msg(h, conn, DL_RDZV_MSG_ERROR);
    return m ? m->error.code : 0;
}

/* The deadline of the last ARM_TIMER action, or -1 when none was given in the last step. */
static inline double h_armed(const harness_t *h)
{
    double at = -1;
    for (size_t i = 0; i < h->acts.n; i++)
        if (h->acts.v[i].kind == DL_RDZV_ACT_ARM_TIMER)
            at = h->acts.v[i].at;
    return at;
}

static inline const dl_rdzv_job_status_t *h_status(harness_t *h, const char *run_id, double now)
{
    h_control(h, DL_RDZV_EV_STATUS, 999, run_id, now);
    const dl_rdzv_msg_t *m = h_msg(h, 999, DL_RDZV_MSG_STATUS);
    if (!m || m->status->njobs != 1)
        return NULL;
    return &m->status->jobs[0];
}

static inline const dl_rdzv_member_status_t *h_member(const dl_rdzv_job_status_t *js,
                                                      const char *agent)
{
    for (size_t i = 0; i < js->nmembers; i++)
        if (strcmp(js->members[i].agent_id, agent) == 0)
            return &js->members[i];
    return NULL;
}

#endif
