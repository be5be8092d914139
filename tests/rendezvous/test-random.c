/* Random event storms through the rendezvous core: joins, heartbeats, disconnects, failures,
 * leaves, control requests, store operations and ticks in any order. Run under the sanitizers
 * this finds use-after-free and leaks; everywhere it checks what agents would rely on: every
 * round hands out each node rank once, with consistent first ranks, and no deadline is left
 * behind in the past. */
#include <stdio.h>
#include <stdlib.h>

#include "dl-test.h"
#include "harness.h"

enum { NCONN = 40, NJOBS = 3, STEPS = 20000 };

static const char *const jobs[NJOBS] = {"j0", "j1", "j2"};

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Counts what is wrong with the assignments of one step. */
static size_t check_step(const harness_t *h, double now)
{
    size_t bad = 0;
    int seen[NJOBS][NCONN + 1] = {{0}};
    int nnodes[NJOBS] = {0};
    int slots_sum[NJOBS] = {0}, world[NJOBS] = {0};
    for (size_t i = 0; i < h->acts.n; i++) {
        const dl_rdzv_action_t *a = &h->acts.v[i];
        if (a->kind == DL_RDZV_ACT_SEND && a->conn == DL_RDZV_CONN_NONE)
            bad++;
        if (a->kind != DL_RDZV_ACT_SEND || a->msg.kind != DL_RDZV_MSG_ASSIGNMENT ||
            a->msg.req_id != 0)
            continue;
        int j = a->msg.run_id[1] - '0';
        int r = a->msg.assignment.node_rank;
        nnodes[j] = a->msg.assignment.nnodes;
        world[j] = a->msg.assignment.world_size;
        slots_sum[j] += a->msg.assignment.local_world_size;
        if (r < 0 || r >= nnodes[j] || r > NCONN || seen[j][r]++)
            bad++;
        if (a->msg.assignment.first_rank < 0 ||
            a->msg.assignment.first_rank + a->msg.assignment.local_world_size > world[j])
            bad++;
    }
    for (int j = 0; j < NJOBS; j++) {
        int count = 0;
        for (int r = 0; r <= NCONN; r++)
            count += seen[j][r];
        if (count && (count != nnodes[j] || slots_sum[j] != world[j]))
            bad++;
    }
    double at;
    if (dl_rdzv_core_next_deadline(h->core, &at) == 0 && at <= now)
        bad++;
    return bad;
}

static void storm(uint64_t seed)
{
    harness_t h;
    dl_rdzv_core_opts_t co;
    dl_rdzv_core_opts_init(&co);
    co.max_keys = 16;
    co.log_level = DL_RDZV_LOG_DEBUG;
    h_init_opts(&h, &co);
    dl_rdzv_job_opts_t o = h_opts(2, 5);
    o.max_restarts = 1000;
    o.linger = 5;
    uint64_t s = seed;
    double now = 0;
    size_t bad = 0, assignments = 0, fails = 0;
    static const char *const keys[] = {"a", "b", "c", "d"};
    for (int n = 0; n < STEPS; n++) {
        now += (double)(lcg(&s) % 1000) / 400.0;
        uint64_t conn = 1 + lcg(&s) % NCONN;
        const char *job = jobs[lcg(&s) % NJOBS];
        int round = (int)(lcg(&s) % 4) - 1;
        unsigned what = (unsigned)(lcg(&s) % 16);
        dl_rdzv_event_t ev = {.conn = conn, .req_id = (uint64_t)n + 1, .run_id = job};
        char agent[16], host[16];
        snprintf(agent, sizeof(agent), "a%llu", (unsigned long long)(conn % 25));
        snprintf(host, sizeof(host), "h%llu", (unsigned long long)(lcg(&s) % 7));
        dl_rdzv_buf_t wk[2] = {{keys[lcg(&s) % 4], 1}, {keys[lcg(&s) % 4], 1}};
        switch (what) {
        case 0:
        case 1:
        case 2:
            ev.kind = DL_RDZV_EV_JOIN;
            ev.join.agent_id = agent;
            ev.join.host = host;
            ev.join.slots = 1 + (int)(lcg(&s) % 4);
            ev.join.node_rank = lcg(&s) % 4 == 0 ? (int)(lcg(&s) % 6) : -1;
            ev.join.slurm_node_id = lcg(&s) % 3 == 0 ? (int)(lcg(&s) % 50) : -1;
            ev.join.resume_round = round;
            ev.join.opts = &o;
            break;
        case 3:
        case 4:
        case 5: ev.kind = DL_RDZV_EV_HEARTBEAT; break;
        case 6: ev.kind = DL_RDZV_EV_DISCONNECT; break;
        case 7:
            ev.kind = lcg(&s) % 4 ? DL_RDZV_EV_LEAVE : DL_RDZV_EV_WORKER_FAILED;
            ev.report.round = round;
            ev.report.description = "boom";
            break;
        case 8:
            ev.kind = lcg(&s) % 8 == 0 ? DL_RDZV_EV_STOP : DL_RDZV_EV_RESTART;
            if (lcg(&s) % 2)
                ev.kind = DL_RDZV_EV_STATUS;
            break;
        case 9:
        case 10:
            ev.kind = DL_RDZV_EV_STORE_WAIT;
            ev.wait.round = round;
            ev.wait.keys = wk;
            ev.wait.nkeys = 1 + lcg(&s) % 2;
            ev.wait.timeout = (double)(lcg(&s) % 5) - 1;
            break;
        case 11:
        case 12:
            ev.kind = DL_RDZV_EV_STORE_SET + (dl_rdzv_event_kind_t)(lcg(&s) % 5);
            ev.store.round = round;
            ev.store.key = wk[0];
            ev.store.value = wk[1];
            ev.store.expected = wk[1];
            ev.store.expect_absent = lcg(&s) % 2;
            ev.store.delta = 1;
            break;
        default: ev.kind = DL_RDZV_EV_TICK; break;
        }
        fails += dl_rdzv_core_step(h.core, &ev, now, &h.acts) != 0;
        bad += check_step(&h, now);
        assignments += h_count(&h, DL_RDZV_MSG_ASSIGNMENT);
    }
    ck_assert_uint_eq(fails, 0);
    ck_assert_uint_eq(bad, 0);
    ck_assert_uint_gt(assignments, 0); /* the storm did reach running rounds */
    h_fini(&h);
}

DL_TEST_LOOP(random_storms_keep_the_promises, 0, 4)
{
    storm(1 + (uint64_t)_i * 7919);
}
