/* How long the pure rendezvous core takes to gather N simulated nodes, assign their ranks, notice
 * one of them dying, and gather the survivors again. No sockets: this is the control plane's own
 * cost, the floor under any server built on it.
 *
 *   rdzv-core [N...]    (default: 10000 100000)
 *
 * Prints one line per phase and N, and exits 1 if any node was told something wrong. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdzv-core.h"

#define SLOTS 8

typedef struct {
    dl_rdzv_core_t *core;
    dl_rdzv_actions_t acts;
    long events;
    int bad;
} sim_t;

typedef struct {
    double wall;
    double cpu; /* this process only: steadier than wall time on a shared machine */
} stamp_t;

static stamp_t now_stamp(void)
{
    struct timespec w, c;
    clock_gettime(CLOCK_MONOTONIC, &w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    return (stamp_t){(double)w.tv_sec + (double)w.tv_nsec * 1e-9,
                     (double)c.tv_sec + (double)c.tv_nsec * 1e-9};
}

static stamp_t since(stamp_t t0)
{
    stamp_t t = now_stamp();
    return (stamp_t){t.wall - t0.wall, t.cpu - t0.cpu};
}

static void add_to(stamp_t *sum, stamp_t t)
{
    sum->wall += t.wall;
    sum->cpu += t.cpu;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void step(sim_t *sim, const dl_rdzv_event_t *ev, double now)
{
    sim->events++;
    if (dl_rdzv_core_step(sim->core, ev, now, &sim->acts) < 0)
        sim->bad++;
}

static void join(sim_t *sim, int n, int i, double now)
{
    char agent[32], host[32];
    snprintf(agent, sizeof(agent), "agent-%07d", i);
    snprintf(host, sizeof(host), "node%07d", i);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = (uint64_t)i + 1, .run_id = "bench"};
    ev.join.agent_id = agent;
    ev.join.host = host;
    ev.join.slots = SLOTS;
    ev.join.node_rank = -1;
    ev.join.slurm_node_id = n - 1 - i;
    ev.join.resume_round = -1;
    step(sim, &ev, now);
}

static size_t count(const sim_t *sim, dl_rdzv_msg_kind_t kind)
{
    size_t c = 0;
    for (size_t k = 0; k < sim->acts.n; k++)
        c += sim->acts.v[k].kind == DL_RDZV_ACT_SEND && sim->acts.v[k].msg.kind == kind;
    return c;
}

static void check_ranks(sim_t *sim, int n, int nnodes, int skip)
{
    if (count(sim, DL_RDZV_MSG_ASSIGNMENT) != (size_t)nnodes)
        sim->bad++;
    for (size_t k = 0; k < sim->acts.n; k++) {
        const dl_rdzv_action_t *a = &sim->acts.v[k];
        if (a->kind != DL_RDZV_ACT_SEND || a->msg.kind != DL_RDZV_MSG_ASSIGNMENT)
            continue;
        int slurm = n - 1 - ((int)a->conn - 1);
        int want = skip >= 0 && slurm > n - 1 - skip ? slurm - 1 : slurm;
        if (a->msg.assignment.node_rank != want || a->msg.assignment.first_rank != want * SLOTS ||
            a->msg.assignment.world_size != nnodes * SLOTS)
            sim->bad++;
    }
}

static void report(const char *phase, int n, long events, stamp_t t)
{
    printf("rdzv-core n=%-7d %-30s %8.1f ms wall %8.1f ms cpu %7ld events %6.0f ns/event cpu\n", n,
           phase, t.wall * 1e3, t.cpu * 1e3, events, events ? t.cpu * 1e9 / (double)events : 0.0);
}

static int run(int n)
{
    sim_t sim = {0};
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.job_defaults.min_nodes = n / 2 > 0 ? n / 2 : 1;
    o.job_defaults.max_nodes = n;
    o.job_defaults.last_call = 30;
    o.job_defaults.dead_after = 60;
    if (dl_rdzv_core_new(&o, &sim.core) < 0)
        return 1;
    int *order = malloc((size_t)n * sizeof(*order));
    if (!order)
        return 1;
    for (int i = 0; i < n; i++)
        order[i] = i;
    uint64_t s = 7;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(lcg(&s) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int victim = n / 3;

    stamp_t total = {0, 0};
    stamp_t t0 = now_stamp();
    for (int k = 0; k < n - 1; k++)
        join(&sim, n, order[k], 0);
    stamp_t t = since(t0);
    add_to(&total, t);
    report("join (round 0)", n, n - 1, t);

    t0 = now_stamp();
    join(&sim, n, order[n - 1], 0);
    t = since(t0);
    add_to(&total, t);
    report("last join: sort + assign", n, 1, t);
    check_ranks(&sim, n, n, -1);

    t0 = now_stamp();
    for (int i = 0; i < n; i++) {
        if (i == victim)
            continue;
        dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_HEARTBEAT, .conn = (uint64_t)i + 1};
        step(&sim, &ev, 30);
    }
    t = since(t0);
    add_to(&total, t);
    report("heartbeats", n, n - 1, t);

    t0 = now_stamp();
    dl_rdzv_event_t tick = {.kind = DL_RDZV_EV_TICK};
    step(&sim, &tick, 60);
    t = since(t0);
    add_to(&total, t);
    report("tick: one dead, round 1", n, 1, t);
    if (count(&sim, DL_RDZV_MSG_ROUND_CHANGED) != (size_t)n - 1)
        sim.bad++;

    t0 = now_stamp();
    for (int k = 0; k < n; k++)
        if (order[k] != victim)
            join(&sim, n, order[k], 61);
    t = since(t0);
    add_to(&total, t);
    report("rejoin (round 1)", n, n - 1, t);

    t0 = now_stamp();
    step(&sim, &tick, 91);
    t = since(t0);
    add_to(&total, t);
    report("tick: last call, assign", n, 1, t);
    check_ranks(&sim, n, n - 1, victim);
    report("total", n, sim.events, total);

    free(order);
    dl_rdzv_core_free(sim.core);
    if (sim.bad)
        fprintf(stderr, "rdzv-core n=%d: %d wrong answers\n", n, sim.bad);
    return sim.bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    static const int defaults[] = {10000, 100000};
    int rc = 0;
    if (argc < 2) {
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
            rc |= run(defaults[i]);
        return rc;
    }
    for (int i = 1; i < argc; i++) {
        char *end;
        long n = strtol(argv[i], &end, 10);
        if (*end || end == argv[i] || n < 1 || n > DL_RDZV_MAX_NODES) {
            fprintf(stderr, "rdzv-core: '%s' is not a node count within 1..%d\n", argv[i],
                    DL_RDZV_MAX_NODES);
            return 2;
        }
        rc |= run((int)n);
    }
    return rc;
}
