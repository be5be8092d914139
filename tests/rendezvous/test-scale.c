/* 100,000 simulated nodes through the rendezvous core: join in a shuffled order, run, lose one
 * node to missed heartbeats, join again. Asserts what every agent is told, not how fast (the
 * timing lives in bench/rdzv-core-bench.c). */
#include <stdio.h>
#include <stdlib.h>

#include "dl-test.h"
#include "harness.h"

enum { N = 100000, SLOTS = 8, VICTIM = 31337 };

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Checks that every node but skip got the assignment that its Slurm id calls for. The loops
 * count mismatches and assert once: check records every assertion it passes, which would cost
 * more than the core itself. */
static void check_assignments(const harness_t *h, int round, int nnodes, int skip)
{
    ck_assert_uint_eq(h_count(h, DL_RDZV_MSG_ASSIGNMENT), (size_t)nnodes);
    size_t bad = 0;
    for (size_t k = 0; k < h->acts.n; k++) {
        const dl_rdzv_action_t *a = &h->acts.v[k];
        if (a->kind != DL_RDZV_ACT_SEND || a->msg.kind != DL_RDZV_MSG_ASSIGNMENT)
            continue;
        int i = (int)a->conn - 1;
        int slurm = N - 1 - i;
        int want = skip >= 0 && slurm > N - 1 - skip ? slurm - 1 : slurm;
        bad += i == skip || a->msg.assignment.round != round ||
               a->msg.assignment.nnodes != nnodes || a->msg.assignment.node_rank != want ||
               a->msg.assignment.first_rank != want * SLOTS ||
               a->msg.assignment.world_size != nnodes * SLOTS;
    }
    ck_assert_uint_eq(bad, 0);
}

static void step(harness_t *h, const dl_rdzv_event_t *ev, double now, size_t *bad)
{
    *bad += dl_rdzv_core_step(h->core, ev, now, &h->acts) != 0;
}

static void join_node(harness_t *h, int i, double now, size_t *bad)
{
    char agent[32], host[32];
    snprintf(agent, sizeof(agent), "agent-%06d", i);
    snprintf(host, sizeof(host), "node%06d", i);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = (uint64_t)i + 1, .run_id = "big"};
    ev.join.agent_id = agent;
    ev.join.host = host;
    ev.join.slots = SLOTS;
    ev.join.node_rank = -1;
    /* Slurm ids run backwards so that the rank order is not the host-name order. */
    ev.join.slurm_node_id = N - 1 - i;
    ev.join.resume_round = -1;
    step(h, &ev, now, bad);
}

DL_TEST(hundred_thousand_nodes_join_and_survive_a_failure)
{
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.job_defaults.min_nodes = N / 2;
    o.job_defaults.max_nodes = N;
    o.job_defaults.last_call = 30;
    o.job_defaults.dead_after = 60;
    h_init_opts(&h, &o);

    int *order = malloc(N * sizeof(*order));
    ck_assert_ptr_nonnull(order);
    for (int i = 0; i < N; i++)
        order[i] = i;
    uint64_t s = 7;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(lcg(&s) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    size_t bad = 0, early = 0;
    for (int k = 0; k < N - 1; k++) {
        join_node(&h, order[k], 0, &bad);
        early += h_count(&h, DL_RDZV_MSG_ASSIGNMENT);
    }
    ck_assert_uint_eq(early, 0);
    join_node(&h, order[N - 1], 0, &bad);
    check_assignments(&h, 0, N, -1);

    for (int i = 0; i < N; i++) {
        dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_HEARTBEAT, .conn = (uint64_t)i + 1};
        if (i != VICTIM)
            step(&h, &ev, 30, &bad);
    }
    h_tick(&h, 59.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_tick(&h, 60);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), N - 1);
    ck_assert(h_closed(&h, VICTIM + 1));

    for (int k = 0; k < N; k++) {
        if (order[k] == VICTIM)
            continue;
        join_node(&h, order[k], 61, &bad);
        early += h_count(&h, DL_RDZV_MSG_ASSIGNMENT);
    }
    ck_assert_uint_eq(early, 0);
    ck_assert_uint_eq(bad, 0);
    h_tick(&h, 91);
    check_assignments(&h, 1, N - 1, VICTIM);

    const dl_rdzv_job_status_t *js = h_status(&h, "big", 92);
    ck_assert_int_eq(js->restarts, 1);
    ck_assert_uint_eq(js->nmembers, N - 1);
    free(order);
    h_fini(&h);
}

DL_TEST_SUITE(.timeout = 120);
