/* The rendezvous state machine, driven event by event with an injected clock: rounds, rank
 * assignment, health, restarts and control. */
#include <errno.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"
#include "rdzv-policy.h"

DL_TEST(max_nodes_close_the_round_at_once)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(3, 3);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = 1, .req_id = 77, .run_id = "job"};
    ev.join.agent_id = "a1";
    ev.join.host = "h1";
    ev.join.slots = 2;
    ev.join.node_rank = -1;
    ev.join.slurm_node_id = -1;
    ev.join.master_addr = "10.1.1.1";
    ev.join.master_port = 40000;
    ev.join.resume_round = -1;
    ev.join.opts = &o;
    h_step(&h, &ev, 0);
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_JOINED);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->req_id, 77);
    ck_assert_int_eq(m->joined.round, 0);
    ck_assert_str_eq(m->run_id, "job");

    h_join(&h, 2, "job", 4, &o, 1);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_JOINED));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);

    h_join(&h, 3, "job", 1, &o, 2);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 3);
    static const int rank[] = {0, 1, 2}, first[] = {0, 2, 6}, slots[] = {2, 4, 1};
    for (uint64_t c = 1; c <= 3; c++) {
        m = h_msg(&h, c, DL_RDZV_MSG_ASSIGNMENT);
        ck_assert_ptr_nonnull(m);
        ck_assert_int_eq(m->assignment.round, 0);
        ck_assert_int_eq(m->assignment.node_rank, rank[c - 1]);
        ck_assert_int_eq(m->assignment.first_rank, first[c - 1]);
        ck_assert_int_eq(m->assignment.local_world_size, slots[c - 1]);
        ck_assert_int_eq(m->assignment.world_size, 7);
        ck_assert_int_eq(m->assignment.nnodes, 3);
        ck_assert_int_eq(m->assignment.restarts, 0);
        ck_assert_int_eq(m->assignment.max_restarts, 3);
        ck_assert_str_eq(m->assignment.master_addr, "10.1.1.1");
        ck_assert_int_eq(m->assignment.master_port, 40000);
        ck_assert_str_eq(m->assignment.store_host, "10.0.0.1");
        ck_assert_int_eq(m->assignment.store_port, 29400);
    }
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 3);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_RUNNING);
    ck_assert_int_eq(js->world_size, 7);
    h_fini(&h);
}

DL_TEST(master_defaults_to_node_zero_host_and_job_port)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.master_port = 31000;
    h_join(&h, 5, "job", 1, &o, 0);
    h_join(&h, 4, "job", 1, &o, 0);
    const dl_rdzv_msg_t *m = h_msg(&h, 5, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(m);
    /* "h4" sorts before "h5": node rank 0 is conn 4's agent, whatever the JOIN order. */
    ck_assert_int_eq(m->assignment.node_rank, 1);
    ck_assert_str_eq(m->assignment.master_addr, "h4");
    ck_assert_int_eq(m->assignment.master_port, 31000);
    h_fini(&h);
}

DL_TEST(master_is_the_hosting_agent_which_serves_the_torch_store)
{
    /* The agent hosting the rendezvous serves torch's store at MASTER_ADDR:MASTER_PORT: the
     * assignment names its address, even when it is not node rank 0. */
    harness_t h;
    dl_rdzv_core_opts_t co;
    dl_rdzv_core_opts_init(&co);
    co.host_agent_id = "a5";
    h_init_opts(&h, &co);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.master_port = 31000;
    h_join(&h, 5, "job", 1, &o, 0);
    h_join(&h, 4, "job", 1, &o, 0);
    const dl_rdzv_msg_t *m = h_msg(&h, 4, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->assignment.node_rank, 0);
    ck_assert_int_eq(m->assignment.host_node_rank, 1);
    ck_assert_str_eq(m->assignment.master_addr, "h5");
    h_fini(&h);
}

DL_TEST(min_nodes_start_the_last_call)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 4);
    h_join(&h, 1, "job", 1, &o, 0);
    ck_assert(h_armed(&h) == 20); /* a1's heartbeat deadline comes first */
    h_join(&h, 2, "job", 1, &o, 1);
    ck_assert(h_armed(&h) == 11); /* min reached: last call ends at 1 + 10 */
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), 0);
    ck_assert(at == 11);
    h_join(&h, 3, "job", 1, &o, 5);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);
    ck_assert(h_armed(&h) == -1); /* the deadline did not move */
    h_tick(&h, 10.5);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);
    ck_assert(h_armed(&h) == 11); /* told again after every TICK */
    h_tick(&h, 11);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 3);
    ck_assert_int_eq(h_msg(&h, 3, DL_RDZV_MSG_ASSIGNMENT)->assignment.nnodes, 3);
    ck_assert(h_armed(&h) == 20);
    h_fini(&h);
}

DL_TEST(losing_a_node_below_min_cancels_the_last_call)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 4);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 1);
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 2, 0, 3);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ERROR), 0);
    h_tick(&h, 12);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);
    ck_assert_uint_eq(h_status(&h, "job", 12)->nmembers, 1);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 14);
    ck_assert_uint_eq(h.acts.n, 0);
    h_join(&h, 3, "job", 1, &o, 15);
    h_tick(&h, 24.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);
    h_tick(&h, 25);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 2);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.nnodes, 2);
    ck_assert_ptr_null(h_msg(&h, 2, DL_RDZV_MSG_ASSIGNMENT));
    h_fini(&h);
}

DL_TEST(join_timeout_fails_the_round)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(3, 4);
    o.dead_after = 1000;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 50);
    h_tick(&h, 99.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_TIMEOUT), 0);
    h_tick(&h, 100);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_TIMEOUT), 2);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_TIMEOUT)->timeout.round, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_TIMEOUT));
    ck_assert_int_eq(h_status(&h, "job", 101)->state, DL_RDZV_JOB_TIMED_OUT);
    h_join(&h, 3, "job", 1, &o, 102);
    DL_CHECK_ERRNO(h_error(&h, 3), -ESHUTDOWN);
    h_fini(&h);
}

DL_TEST(join_timeout_closes_when_min_is_there)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 4);
    o.last_call = 50;
    o.join_timeout = 20;
    o.dead_after = 1000;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 1);
    h_tick(&h, 20);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_TIMEOUT), 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 2);
    h_fini(&h);
}

DL_TEST(missed_heartbeats_open_a_new_round)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 3);
    for (uint64_t c = 1; c <= 3; c++)
        h_join(&h, c, "job", 1, &o, 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 3);
    for (uint64_t c = 1; c <= 2; c++) {
        h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, c, 0, 10);
        ck_assert_uint_eq(h.acts.n, 0); /* a heartbeat costs nothing to answer */
    }
    h_tick(&h, 19.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_tick(&h, 20);
    ck_assert(h_closed(&h, 3));
    ck_assert_ptr_null(h_msg(&h, 3, DL_RDZV_MSG_ROUND_CHANGED));
    for (uint64_t c = 1; c <= 2; c++) {
        const dl_rdzv_msg_t *m = h_msg(&h, c, DL_RDZV_MSG_ROUND_CHANGED);
        ck_assert_ptr_nonnull(m);
        ck_assert_int_eq(m->round_changed.round, 1);
        ck_assert_ptr_nonnull(strstr(m->round_changed.reason, "a3"));
        ck_assert_int_eq(m->round_changed.cause, DL_RDZV_CAUSE_NODE_LOST);
        ck_assert_str_eq(dl_rdzv_cause_name(m->round_changed.cause), "node_lost");
    }
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 21);
    ck_assert_int_eq(js->round, 1);
    ck_assert_int_eq(js->restarts, 1);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_GATHERING);
    ck_assert_ptr_nonnull(strstr(js->failure, "heartbeat"));
    /* The survivors join again and go on without the dead node. */
    h_join(&h, 1, "job", 1, &o, 22);
    h_join(&h, 2, "job", 1, &o, 23);
    h_tick(&h, 33);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 2);
    const dl_rdzv_msg_t *m = h_msg(&h, 2, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_int_eq(m->assignment.round, 1);
    ck_assert_int_eq(m->assignment.nnodes, 2);
    ck_assert_int_eq(m->assignment.restarts, 1);
    h_fini(&h);
}

DL_TEST(a_silent_gathering_member_is_dropped)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(3, 3);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 5);
    h_tick(&h, 20);
    ck_assert(h_closed(&h, 1));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 20);
    ck_assert_uint_eq(js->nmembers, 1);
    ck_assert_int_eq(js->restarts, 0);
    ck_assert_int_eq(js->round, 0);
    h_fini(&h);
}

DL_TEST(worker_failure_restarts_the_round)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 1, 0, 5);
    const dl_rdzv_msg_t *ok = h_msg(&h, 1, DL_RDZV_MSG_OK);
    ck_assert_ptr_nonnull(ok);
    ck_assert_uint_eq(ok->req_id, 2001);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    ck_assert_int_eq(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 1);
    ck_assert_int_eq(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.cause,
                     DL_RDZV_CAUSE_WORKER_FAILED);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 6);
    ck_assert_int_eq(js->restarts, 1);
    ck_assert_ptr_nonnull(strstr(js->failure, "worker 3 exited with code 1"));
    ck_assert_ptr_nonnull(strstr(js->failure, "a1"));
    /* conn 2 raced the round change: its report is stale, not a second restart. */
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 2, 0, 6);
    DL_CHECK_ERRNO(h_error(&h, 2), -ESTALE);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_join(&h, 1, "job", 1, &o, 7);
    h_join(&h, 2, "job", 1, &o, 7);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.round, 1);
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 1, 0, 8);
    DL_CHECK_ERRNO(h_error(&h, 1), -ESTALE);
    ck_assert_int_eq(h_status(&h, "job", 8)->restarts, 1);
    h_fini(&h);
}

DL_TEST(a_new_node_joins_a_running_job)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 3);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 1);
    h_tick(&h, 11);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.nnodes, 2);
    h_join(&h, 3, "job", 2, &o, 12);
    ck_assert_int_eq(h_msg(&h, 3, DL_RDZV_MSG_JOINED)->joined.round, 1);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 1);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.cause,
                     DL_RDZV_CAUSE_NODE_JOINED);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED));
    ck_assert_ptr_null(h_msg(&h, 3, DL_RDZV_MSG_ROUND_CHANGED));
    h_join(&h, 1, "job", 1, &o, 13);
    h_join(&h, 2, "job", 1, &o, 14);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 3);
    const dl_rdzv_msg_t *m = h_msg(&h, 3, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_int_eq(m->assignment.round, 1);
    ck_assert_int_eq(m->assignment.nnodes, 3);
    ck_assert_int_eq(m->assignment.world_size, 4);
    ck_assert_int_eq(m->assignment.restarts, 1);
    /* Full: a fourth node is turned away instead of restarting everyone. */
    h_join(&h, 4, "job", 1, &o, 15);
    DL_CHECK_ERRNO(h_error(&h, 4), -EUSERS);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_fini(&h);
}

static const h_node_t rank_nodes[] = {
    {"a", "h2", 1, -1, -1}, {"b", "h1", 2, -1, -1}, {"c", "h1", 1, -1, 5},
    {"d", "h0", 3, -1, 2},  {"e", "h9", 1, 4, -1},
};

DL_TEST(rank_rule_is_slurm_then_hint_then_host_then_id)
{
    /* Every order of the five JOINs gives: d (slurm 2), c (slurm 5), b (h1), a (h2), and e at
     * its hinted rank 4. */
    static const int perms[][5] = {{0, 1, 2, 3, 4}, {4, 3, 2, 1, 0}, {2, 0, 4, 1, 3},
                                   {1, 4, 0, 3, 2}, {3, 2, 1, 4, 0}, {4, 0, 3, 2, 1}};
    static const int want_rank[] = {3, 2, 1, 0, 4}; /* a..e */
    static const int want_first[] = {6, 4, 3, 0, 7};
    dl_rdzv_job_opts_t o = h_opts(5, 5);
    for (size_t p = 0; p < sizeof(perms) / sizeof(perms[0]); p++) {
        harness_t h;
        h_init(&h);
        for (int i = 0; i < 5; i++)
            h_join_full(&h, (uint64_t)(10 + perms[p][i]), "job", rank_nodes[perms[p][i]], &o, -1,
                        i);
        ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 5);
        for (int k = 0; k < 5; k++) {
            const dl_rdzv_msg_t *m = h_msg(&h, (uint64_t)(10 + k), DL_RDZV_MSG_ASSIGNMENT);
            ck_assert_int_eq(m->assignment.node_rank, want_rank[k]);
            ck_assert_int_eq(m->assignment.first_rank, want_first[k]);
            ck_assert_int_eq(m->assignment.world_size, 8);
            ck_assert_str_eq(m->assignment.master_addr, "h0");
        }
        h_fini(&h);
    }
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

DL_TEST(ranks_do_not_depend_on_join_order)
{
    enum { N = 64 };
    static char agents[N][16], hosts[N][16];
    h_node_t nodes[N];
    uint64_t s = 42;
    for (int i = 0; i < N; i++) {
        snprintf(agents[i], sizeof(agents[i]), "agent-%02d", i);
        snprintf(hosts[i], sizeof(hosts[i]), "host-%llu", (unsigned long long)(lcg(&s) % 20));
        nodes[i] = (h_node_t){agents[i], hosts[i], 1 + (int)(lcg(&s) % 8), -1, -1};
        if (i % 3 == 0)
            nodes[i].slurm = 100 - i;
        if (i % 7 == 1)
            nodes[i].hint = i; /* unique, and placed exactly */
    }
    int ranks[3][N];
    dl_rdzv_job_opts_t o = h_opts(N, N);
    for (int run = 0; run < 3; run++) {
        int order[N];
        for (int i = 0; i < N; i++)
            order[i] = i;
        for (int i = N - 1; i > 0 && run > 0; i--) {
            int j = (int)(lcg(&s) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        harness_t h;
        h_init(&h);
        for (int i = 0; i < N; i++)
            h_join_full(&h, (uint64_t)(1 + order[i]), "job", nodes[order[i]], &o, -1, 0);
        ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), N);
        int seen[N] = {0};
        for (int i = 0; i < N; i++) {
            ranks[run][i] =
                h_msg(&h, (uint64_t)(1 + i), DL_RDZV_MSG_ASSIGNMENT)->assignment.node_rank;
            seen[ranks[run][i]]++;
            if (nodes[i].hint >= 0)
                ck_assert_int_eq(ranks[run][i], nodes[i].hint);
        }
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(seen[i], 1);
        h_fini(&h);
    }
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(ranks[1][i], ranks[0][i]);
        ck_assert_int_eq(ranks[2][i], ranks[0][i]);
    }
}

DL_TEST(bad_hints_are_refused)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(4, 4);
    h_join_full(&h, 1, "job", (h_node_t){"a", "h", 1, 4, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 1, DL_RDZV_MSG_ERROR)->error.message, "out of range"));
    h_join_full(&h, 1, "job", (h_node_t){"a", "h", 1, -2, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    h_join_full(&h, 1, "job", (h_node_t){"a", "h", 1, 1, -1}, &o, -1, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_JOINED));
    h_join_full(&h, 2, "job", (h_node_t){"b", "h", 1, 1, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -EEXIST);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 2, DL_RDZV_MSG_ERROR)->error.message, "'a'"));
    h_join_full(&h, 2, "job", (h_node_t){"b", "h", 1, 2, -1}, &o, -1, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_JOINED));
    ck_assert_uint_eq(h_status(&h, "job", 1)->nmembers, 2);
    h_fini(&h);
}

DL_TEST(a_hint_beyond_the_node_count_falls_back_to_the_order)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(3, 4);
    h_join_full(&h, 1, "job", (h_node_t){"x", "hx", 1, 3, -1}, &o, -1, 0);
    h_join_full(&h, 2, "job", (h_node_t){"y", "hy", 1, 0, -1}, &o, -1, 0);
    h_join_full(&h, 3, "job", (h_node_t){"z", "ha", 1, -1, -1}, &o, -1, 0);
    h_tick(&h, 10);
    ck_assert_int_eq(h_msg(&h, 2, DL_RDZV_MSG_ASSIGNMENT)->assignment.node_rank, 0);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.node_rank, 1);
    ck_assert_int_eq(h_msg(&h, 3, DL_RDZV_MSG_ASSIGNMENT)->assignment.node_rank, 2);
    h_fini(&h);
}

static void fail_with(harness_t *h, uint64_t conn, int round, const char *what, double now)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_WORKER_FAILED, .conn = conn, .req_id = 5};
    ev.report.round = round;
    ev.report.description = what;
    h_step(h, &ev, now);
}

DL_TEST(restarts_run_out)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 2;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    fail_with(&h, 1, 0, "first: rank 0 exited with code 7", 1);
    ck_assert_int_eq(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 1);
    h_join(&h, 1, "job", 1, &o, 2);
    h_join(&h, 2, "job", 1, &o, 2);
    fail_with(&h, 2, 1, "second", 3);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 2);
    h_join(&h, 1, "job", 1, &o, 4);
    h_join(&h, 2, "job", 1, &o, 4);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.restarts, 2);
    fail_with(&h, 1, 2, "third", 5);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 2);
    const dl_rdzv_msg_t *m = h_msg(&h, 2, DL_RDZV_MSG_FAILED);
    ck_assert_int_eq(m->failed.restarts, 2);
    ck_assert_ptr_nonnull(strstr(m->failed.failure, "first: rank 0 exited with code 7"));
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 6);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_FAILED);
    ck_assert_ptr_nonnull(strstr(js->failure, "first"));
    h_join(&h, 3, "job", 1, &o, 7);
    DL_CHECK_ERRNO(h_error(&h, 3), -ESHUTDOWN);
    h_fini(&h);
}

DL_TEST(zero_restarts_fail_at_the_first_failure)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 0;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 15);
    h_tick(&h, 20); /* a2 is dead */
    ck_assert(h_closed(&h, 2));
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_FAILED));
    ck_assert_ptr_null(h_msg(&h, 2, DL_RDZV_MSG_FAILED));
    h_fini(&h);
}

DL_TEST(stop_ends_the_job_and_it_is_forgotten_later)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_control(&h, DL_RDZV_EV_STOP, 50, "job", 5);
    ck_assert_ptr_nonnull(h_msg(&h, 50, DL_RDZV_MSG_OK));
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_STOP)->stop.round, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_STOP));
    ck_assert(h_armed(&h) == 55); /* heartbeats are off; only the linger is left */
    ck_assert_int_eq(h_status(&h, "job", 6)->state, DL_RDZV_JOB_STOPPED);
    h_control(&h, DL_RDZV_EV_STOP, 50, "job", 7);
    DL_CHECK_ERRNO(h_error(&h, 50), -ESHUTDOWN);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 8);
    ck_assert_uint_eq(h.acts.n, 0);
    h_tick(&h, 55);
    bool disarmed = false;
    for (size_t i = 0; i < h.acts.n; i++)
        disarmed |= h.acts.v[i].kind == DL_RDZV_ACT_DISARM_TIMER;
    ck_assert(disarmed);
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), -ENOENT);
    h_control(&h, DL_RDZV_EV_STATUS, 50, "job", 56);
    DL_CHECK_ERRNO(h_error(&h, 50), -ENOENT);
    /* A fresh job may reuse the run id. */
    h_join(&h, 3, "job", 1, &o, 57);
    ck_assert_ptr_nonnull(h_msg(&h, 3, DL_RDZV_MSG_JOINED));
    h_fini(&h);
}

DL_TEST(an_agent_quitting_stops_a_job_that_cannot_go_on)
{
    /* Two nodes of two: one quits (its operator's SIGTERM), the other is stopped at once rather
     * than left to wait for a round that cannot close; no restart is spent. */
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_QUIT, 2, 0, 1);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_STOP)->stop.round, 0);
    ck_assert_uint_eq(h_sends_to(&h, 2), 0);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 2);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_STOPPED);
    ck_assert_int_eq(js->restarts, 0);
    h_fini(&h);
}

/* Elastic, with min_nodes left: the quitter departs, the others go on at once in a new round
 * without it, and no restart is spent, not even with none left (a departure is no failure):
 * before, its connection's close lost it as a dead node dead_after later, a restart spent. */
DL_TEST(an_agent_quitting_an_elastic_job_departs_and_spends_no_restart)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(1, 2);
    o.max_restarts = 0;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_QUIT, 2, 0, 1);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_STOP), 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 0);
    ck_assert(h_closed(&h, 2));
    const dl_rdzv_msg_t *rc = h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED);
    ck_assert_ptr_nonnull(rc);
    ck_assert_int_eq(rc->round_changed.round, 1);
    ck_assert_int_eq(rc->round_changed.cause, DL_RDZV_CAUSE_NODE_LEFT);
    ck_assert_str_eq(dl_rdzv_cause_name(rc->round_changed.cause), "node_left");
    ck_assert_ptr_nonnull(strstr(rc->round_changed.reason, "departed"));
    ck_assert_ptr_nonnull(rc->round_changed.culprit);
    ck_assert_str_eq(rc->round_changed.culprit->node, "a2");
    ck_assert_str_eq(rc->round_changed.culprit->cause, "node_left");
    ck_assert_int_eq(rc->round_changed.culprit->rank, -1);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 2);
    ck_assert_int_eq(js->restarts, 0);
    ck_assert_ptr_null(js->failure);
    /* The one left goes on alone after the last call. */
    h_join(&h, 1, "job", 1, &o, 3);
    h_tick(&h, 14);
    const dl_rdzv_msg_t *as = h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->assignment.nnodes, 1);
    ck_assert_int_eq(as->assignment.failures, 0);
    js = h_status(&h, "job", 15);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_RUNNING);
    ck_assert_int_eq(js->restarts, 0);
    h_fini(&h);
}

DL_TEST(restart_request_opens_a_round)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_control(&h, DL_RDZV_EV_RESTART, 50, "job", 1);
    DL_CHECK_ERRNO(h_error(&h, 50), -EAGAIN);
    h_join(&h, 2, "job", 1, &o, 1);
    h_control(&h, DL_RDZV_EV_RESTART, 50, "job", 2);
    ck_assert_ptr_nonnull(h_msg(&h, 50, DL_RDZV_MSG_OK));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.cause,
                     DL_RDZV_CAUSE_REQUESTED);
    /* An operator's restart is no failure: it spends none of the budget. */
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 3);
    ck_assert_int_eq(js->restarts, 0);
    ck_assert_ptr_null(js->failure);
    /* Nor do the next round's assignments name a culprit. */
    h_join(&h, 1, "job", 1, &o, 3);
    h_join(&h, 2, "job", 1, &o, 3);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT));
    ck_assert_ptr_null(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.culprit);
    h_control(&h, DL_RDZV_EV_RESTART, 50, "nope", 4);
    DL_CHECK_ERRNO(h_error(&h, 50), -ENOENT);
    h_fini(&h);
}

/* The round change names its culprit: node, node rank, rank, and how it failed (a hang here). */
DL_TEST(the_round_change_names_the_culprit)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 1;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_WORKER_FAILED, .conn = 2, .req_id = 5};
    ev.report.description = "rank 1 on b hung";
    ev.report.rank = 1;
    ev.report.exit_code = -1;
    ev.report.signal = 9;
    ev.report.hung = true;
    h_step(&h, &ev, 5);
    const dl_rdzv_msg_t *rc = h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED);
    ck_assert_ptr_nonnull(rc);
    const dl_rdzv_culprit_t *c = rc->round_changed.culprit;
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->cause, "worker_failed");
    ck_assert_str_eq(c->node, "a2");
    ck_assert_int_eq(c->node_rank, 1);
    ck_assert_int_eq(c->rank, 1);
    ck_assert(c->hung);
    ck_assert_int_eq(c->signal, 0);
    ck_assert_ptr_nonnull(strstr(c->text, "rank 1 on b hung"));
    /* The next round's assignments name it too: a node cut off when the round changed heard
     * only that it lost the rendezvous. */
    h_join(&h, 1, "job", 1, &o, 6);
    h_join(&h, 2, "job", 1, &o, 6);
    const dl_rdzv_msg_t *as = h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(as);
    ck_assert_ptr_nonnull(as->assignment.culprit);
    ck_assert_str_eq(as->assignment.culprit->node, "a2");
    ck_assert_int_eq(as->assignment.culprit->rank, 1);
    ck_assert(as->assignment.culprit->hung);
    /* The job's end carries the first failure's culprit, not the last. */
    fail_with(&h, 1, 1, "worker 0 exited with code 1", 7);
    const dl_rdzv_msg_t *f = h_msg(&h, 2, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(f->failed.culprit);
    ck_assert_str_eq(f->failed.culprit->node, "a2");
    ck_assert(f->failed.culprit->hung);
    h_fini(&h);
}

/* Rank 1 (node 1, agent a2) stopped; rank 0's collective failed when it was killed, and node 0's
 * report came first: the round change names rank 1, as node 1's own report would have
 * (rdzv-policy.h's first-failure rule, which the etcd backend applies too). */
DL_TEST(a_victims_report_names_the_rank_it_waited_for)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    dl_rdzv_policy_rank_t ranks[] = {
        {.rank = 0, .node_rank = 0, .step = 20, .known = true, .seq = 41, .failed = true},
        {.rank = 1, .node_rank = 1, .step = 19, .known = true, .seq = 40, .stopped = true}};
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_WORKER_FAILED, .conn = 1, .req_id = 5};
    ev.report.description = "rank 0 on a exited with code 1";
    ev.report.rank = 0;
    ev.report.exit_code = 1;
    ev.report.step = 20;
    ev.report.ranks = ranks;
    ev.report.nranks = 2;
    h_step(&h, &ev, 5);
    const dl_rdzv_msg_t *rc = h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED);
    ck_assert_ptr_nonnull(rc);
    const dl_rdzv_culprit_t *c = rc->round_changed.culprit;
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->cause, "worker_failed");
    ck_assert_str_eq(c->node, "a2");
    ck_assert_int_eq(c->node_rank, 1);
    ck_assert_int_eq(c->rank, 1);
    ck_assert(c->hung);
    ck_assert_int_eq(c->exit_code, -1);
    ck_assert_int_eq(c->step, 19);
    ck_assert_ptr_nonnull(strstr(c->text, "rank 1 on node 1 held up rank 0 in a collective"));
    ck_assert_ptr_nonnull(strstr(c->text, "rank 0 on a exited with code 1"));
    /* Its own failure, with the same reports, is its own. */
    h_join(&h, 1, "job", 1, &o, 6);
    h_join(&h, 2, "job", 1, &o, 6);
    ranks[0].failed = false;
    ev.req_id = 6;
    ev.report.round = 1;
    h_step(&h, &ev, 7);
    rc = h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED);
    ck_assert_ptr_nonnull(rc);
    ck_assert_str_eq(rc->round_changed.culprit->node, "a1");
    ck_assert_int_eq(rc->round_changed.culprit->rank, 0);
    ck_assert_int_eq(rc->round_changed.culprit->exit_code, 1);
    h_fini(&h);
}

/* A node whose connection closed, and then a worker failure on another node (its collectives
 * broke when the first died): the round change blames the dead node. */
DL_TEST(a_failure_after_a_node_vanished_blames_the_node)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 2, 0, 5);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    fail_with(&h, 1, 0, "rank 0 on a exited with code 1", 5.01);
    const dl_rdzv_msg_t *rc = h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED);
    ck_assert_ptr_nonnull(rc);
    ck_assert_int_eq(rc->round_changed.cause, DL_RDZV_CAUSE_NODE_LOST);
    ck_assert_ptr_nonnull(rc->round_changed.culprit);
    ck_assert_str_eq(rc->round_changed.culprit->node, "a2");
    ck_assert_int_eq(rc->round_changed.culprit->rank, -1);
    ck_assert_int_eq(rc->round_changed.culprit->node_rank, 1);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 6);
    ck_assert_ptr_nonnull(strstr(js->failure, "agent 'a2'"));
    ck_assert_ptr_nonnull(strstr(js->failure, "lost its connection"));
    h_fini(&h);
}

/* A rendezvous that restarted meets agents that ran round 3 with 2 restarts spent: it goes on
 * from round 4 with 2 spent, so attempt 3 is never written twice and the budget is not reset. */
DL_TEST(a_restarted_rendezvous_adopts_the_agents_history)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 3;
    for (uint64_t conn = 1; conn <= 2; conn++) {
        dl_rdzv_event_t ev = {
            .kind = DL_RDZV_EV_JOIN, .conn = conn, .req_id = 1000 + conn, .run_id = "job"};
        ev.join.agent_id = conn == 1 ? "a1" : "a2";
        ev.join.host = "h";
        ev.join.slots = 1;
        ev.join.node_rank = -1;
        ev.join.slurm_node_id = -1;
        ev.join.resume_round = conn == 1 ? 3 : 2; /* the higher one wins */
        ev.join.failures = conn == 1 ? 1 : 2;
        ev.join.opts = &o;
        h_step(&h, &ev, 0);
    }
    const dl_rdzv_msg_t *as = h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->assignment.round, 4);
    ck_assert_int_eq(as->assignment.restarts, 4);
    ck_assert_int_eq(as->assignment.failures, 2);
    ck_assert_int_eq(h_status(&h, "job", 1)->restarts, 2);
    /* One restart is left: the next failure restarts, the one after fails the job. */
    fail_with(&h, 1, 4, "rank 0 exited with code 1", 2);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    h_join(&h, 1, "job", 1, &o, 3);
    h_join(&h, 2, "job", 1, &o, 3);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT)->assignment.round, 5);
    fail_with(&h, 1, 5, "rank 0 exited with code 1", 4);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 2);
    h_fini(&h);
}

/* The host of a 1:2 job was lost with its node: node 1 hosts the rendezvous as the successor
 * and is its only member. Its first round is the round after the last one it ran, with the lost
 * host's restart spent, node 1 as node rank 0 of 1 (its hint 1 is beyond a round of one) and
 * itself as master: the round change of a lost node, which its workers, kept in-job, take as
 * generation 4 after their 3 (docs/recovery.md). */
DL_TEST(a_successors_first_round_goes_on_from_the_lost_hosts)
{
    harness_t h;
    dl_rdzv_core_opts_t co;
    dl_rdzv_core_opts_init(&co);
    co.host_agent_id = "a2";
    co.successors = true;
    h_init_opts(&h, &co);
    dl_rdzv_job_opts_t o = h_opts(1, 2);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = 2, .req_id = 1002, .run_id = "job"};
    ev.join.agent_id = "a2";
    ev.join.host = "h2";
    ev.join.master_addr = "10.0.0.2";
    ev.join.slots = 2;
    ev.join.node_rank = 1;
    ev.join.slurm_node_id = -1;
    ev.join.resume_round = 3;
    ev.join.failures = 2; /* one before, one for the lost host */
    ev.join.opts = &o;
    h_step(&h, &ev, 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0); /* the last call for node 0 */
    h_tick(&h, 10);
    const dl_rdzv_msg_t *m = h_msg(&h, 2, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->assignment.round, 4);
    ck_assert_int_eq(m->assignment.restarts, 4);
    ck_assert_int_eq(m->assignment.failures, 2);
    ck_assert_int_eq(m->assignment.node_rank, 0);
    ck_assert_int_eq(m->assignment.nnodes, 1);
    ck_assert_int_eq(m->assignment.world_size, 2);
    ck_assert_int_eq(m->assignment.first_rank, 0);
    ck_assert_int_eq(m->assignment.host_node_rank, 0);
    ck_assert_str_eq(m->assignment.master_addr, "10.0.0.2");
    ck_assert_int_eq(m->assignment.nsuccessors, 1);
    ck_assert_str_eq(m->assignment.successors[0], "10.0.0.2");
    h_fini(&h);
}

/* A node cut off from the host when the host failed the job (its last restart spent) becomes
 * the host itself and joins with one restart more than the budget: the job ends failed there
 * and then, the joiner told, instead of a round that waits for the gone node until the join
 * timeout (its agent stayed for minutes). */
DL_TEST(a_successor_told_of_a_spent_budget_fails_the_job_at_once)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 1;
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .conn = 1, .req_id = 1001, .run_id = "job"};
    ev.join.agent_id = "a2";
    ev.join.host = "h";
    ev.join.slots = 1;
    ev.join.node_rank = -1;
    ev.join.slurm_node_id = -1;
    ev.join.resume_round = 1;
    ev.join.failures = 2;
    ev.join.opts = &o;
    h_step(&h, &ev, 0);
    const dl_rdzv_msg_t *f = h_msg(&h, 1, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(strstr(f->failed.failure, "restart budget was spent"));
    ck_assert_ptr_nonnull(strstr(f->failed.failure, "counts 2 restarts, of 1"));
    ck_assert_int_eq(h_status(&h, "job", 1)->state, DL_RDZV_JOB_FAILED);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 0);
    h_fini(&h);
}

/* A late joiner to a running round brings more restarts spent than the budget allows (it was cut
 * off from a host that failed the job): the job fails at once, its members and the joiner told,
 * rather than at its next failure. One that brings fewer has them adopted, and its round too. */
static void join_with_history(harness_t *h, uint64_t conn, const dl_rdzv_job_opts_t *o,
                              int resume_round, int failures, double now)
{
    dl_rdzv_event_t ev = {
        .kind = DL_RDZV_EV_JOIN, .conn = conn, .req_id = 1000 + conn, .run_id = "job"};
    ev.join.agent_id = conn == 1 ? "a1" : conn == 2 ? "a2" : "a3";
    ev.join.host = "h";
    ev.join.slots = 1;
    ev.join.node_rank = -1;
    ev.join.slurm_node_id = -1;
    ev.join.resume_round = resume_round;
    ev.join.failures = failures;
    ev.join.opts = o;
    h_step(h, &ev, now);
}

DL_TEST(a_late_joiner_told_of_a_spent_budget_fails_a_running_job_at_once)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(1, 3);
    o.max_restarts = 2;
    join_with_history(&h, 1, &o, -1, -1, 0);
    h_tick(&h, 11);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT));
    join_with_history(&h, 2, &o, 4, 3, 12);
    const dl_rdzv_msg_t *f = h_msg(&h, 1, DL_RDZV_MSG_FAILED);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(strstr(f->failed.failure, "counts 3 restarts, of 2"));
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_FAILED));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 12);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_FAILED);
    ck_assert_int_eq(js->restarts, 3);
    h_fini(&h);

    /* Within the budget: the round changes for it, and the count and round are adopted. */
    h_init(&h);
    join_with_history(&h, 1, &o, -1, -1, 0);
    h_tick(&h, 11);
    join_with_history(&h, 2, &o, 4, 2, 12);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 0);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 5);
    js = h_status(&h, "job", 12);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_GATHERING);
    ck_assert_int_eq(js->round, 5);
    ck_assert_int_eq(js->restarts, 2);
    h_fini(&h);
}

DL_TEST(restart_request_without_budget_still_restarts)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    o.max_restarts = 0;
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 1);
    h_control(&h, DL_RDZV_EV_RESTART, 50, "job", 2);
    ck_assert_ptr_nonnull(h_msg(&h, 50, DL_RDZV_MSG_OK));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_FAILED), 0);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    /* Round 1 forms and its assignment counts the attempt, for TORCHELASTIC_RESTART_COUNT. */
    h_join(&h, 1, "job", 1, &o, 3);
    h_join(&h, 2, "job", 1, &o, 3);
    const dl_rdzv_msg_t *as = h_msg(&h, 1, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->assignment.restarts, 1);
    h_fini(&h);
}

DL_TEST(status_shows_members_and_heartbeat_ages)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 3);
    h_join(&h, 1, "job", 4, &o, 0);
    h_join(&h, 2, "job", 2, &o, 1);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 2);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_GATHERING);
    ck_assert_int_eq(js->members[0].node_rank, -1);
    ck_assert_int_eq(js->world_size, 0);
    h_tick(&h, 11);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 15);
    js = h_status(&h, "job", 16);
    ck_assert_str_eq(js->run_id, "job");
    ck_assert_int_eq(js->state, DL_RDZV_JOB_RUNNING);
    ck_assert_int_eq(js->round, 0);
    ck_assert_int_eq(js->restarts, 0);
    ck_assert_int_eq(js->max_restarts, 3);
    ck_assert_int_eq(js->min_nodes, 2);
    ck_assert_int_eq(js->max_nodes, 3);
    ck_assert_int_eq(js->world_size, 6);
    ck_assert_uint_eq(js->nmembers, 2);
    const dl_rdzv_member_status_t *a1 = h_member(js, "a1"), *a2 = h_member(js, "a2");
    ck_assert_str_eq(a1->host, "h1");
    ck_assert_int_eq(a1->node_rank, 0);
    ck_assert_int_eq(a1->slots, 4);
    ck_assert(a1->heartbeat_age == 1);
    ck_assert(a1->connected);
    ck_assert_int_eq(a2->node_rank, 1);
    ck_assert(a2->heartbeat_age == 15);
    h_join(&h, 9, "other", 1, NULL, 17);
    h_control(&h, DL_RDZV_EV_STATUS, 50, NULL, 18);
    const dl_rdzv_msg_t *m = h_msg(&h, 50, DL_RDZV_MSG_STATUS);
    ck_assert_uint_eq(m->status->njobs, 2);
    ck_assert_str_eq(m->status->jobs[0].run_id, "job");
    ck_assert_str_eq(m->status->jobs[1].run_id, "other");
    h_fini(&h);
}

DL_TEST(every_member_leaving_ok_succeeds)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_LEAVE, 1, 0, 5);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_SUCCEEDED), 0);
    /* A member that left needs no heartbeat; the other one still does. */
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 2, 0, 15);
    h_tick(&h, 30);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_conn_event(&h, DL_RDZV_EV_LEAVE, 2, 4, 31);
    DL_CHECK_ERRNO(h_error(&h, 2), -ESTALE);
    h_conn_event(&h, DL_RDZV_EV_LEAVE, 2, 0, 32);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_OK));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_SUCCEEDED), 2);
    ck_assert_int_eq(h_status(&h, "job", 33)->state, DL_RDZV_JOB_SUCCEEDED);
    h_fini(&h);
}

DL_TEST(a_failure_after_a_leave_still_restarts_everyone)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_LEAVE, 1, 0, 5);
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 2, 0, 6);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED));
    h_fini(&h);
}

DL_TEST(an_agent_resumes_on_a_new_connection)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 3, &o, 1);
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 2, 0, 5);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    ck_assert(!h_member(h_status(&h, "job", 5), "a2")->connected);
    h_join_full(&h, 7, "job", (h_node_t){"a2", "h2", 3, -1, -1}, &o, 0, 6);
    const dl_rdzv_msg_t *m = h_msg(&h, 7, DL_RDZV_MSG_ASSIGNMENT);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->req_id, 1007);
    ck_assert_int_eq(m->assignment.node_rank, 1);
    ck_assert_int_eq(m->assignment.first_rank, 1);
    ck_assert_int_eq(m->assignment.world_size, 4);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 15);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 7, 0, 15);
    h_tick(&h, 25);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    /* Gone for good: declared dead once its heartbeats stop. */
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 7, 0, 26);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 1, 0, 30);
    h_tick(&h, 35);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED));
    h_fini(&h);
}

DL_TEST(a_join_without_resume_restarts_the_round)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 0);
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 2, 0, 5);
    h_join(&h, 8, "job", 1, &o, 6); /* agent "a8" is new, but the job is full */
    DL_CHECK_ERRNO(h_error(&h, 8), -EUSERS);
    h_join_full(&h, 8, "job", (h_node_t){"a2", "h2", 1, -1, -1}, &o, -1, 7);
    ck_assert_int_eq(h_msg(&h, 8, DL_RDZV_MSG_JOINED)->joined.round, 1);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 1);
    h_fini(&h);
}

DL_TEST(agent_ids_and_connections_do_not_mix)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(3, 3);
    h_join_full(&h, 1, "job", (h_node_t){"n1", "h", 1, -1, -1}, &o, -1, 0);
    h_join_full(&h, 2, "job", (h_node_t){"n1", "h", 1, -1, -1}, &o, -1, 1);
    DL_CHECK_ERRNO(h_error(&h, 2), -EEXIST);
    h_join_full(&h, 1, "job", (h_node_t){"n1", "h", 1, -1, -1}, &o, -1, 2);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_JOINED)->joined.round, 0);
    h_join_full(&h, 1, "job", (h_node_t){"n2", "h", 1, -1, -1}, &o, -1, 3);
    DL_CHECK_ERRNO(h_error(&h, 1), -EBUSY);
    h_join_full(&h, 1, "other", (h_node_t){"n1", "h", 1, -1, -1}, NULL, -1, 4);
    DL_CHECK_ERRNO(h_error(&h, 1), -EBUSY);
    ck_assert_uint_eq(h_status(&h, "job", 5)->nmembers, 1);
    h_fini(&h);
}

DL_TEST(bad_joins_are_refused)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 3);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join_full(&h, 2, "job", (h_node_t){"x", "h", -1, -1, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -EINVAL);
    h_join_full(&h, 2, "job", (h_node_t){"", "h", 1, -1, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -EINVAL);
    char host[300];
    memset(host, 'h', sizeof(host) - 1);
    host[sizeof(host) - 1] = 0;
    h_join_full(&h, 2, "job", (h_node_t){"x", host, 1, -1, -1}, &o, -1, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -EINVAL);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 2, DL_RDZV_MSG_ERROR)->error.message, "host"));
    dl_rdzv_job_opts_t other = h_opts(1, 3);
    h_join(&h, 2, "job", 1, &other, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -EINVAL);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 2, DL_RDZV_MSG_ERROR)->error.message, "2:3"));
    dl_rdzv_job_opts_t bad = h_opts(0, 3);
    h_join(&h, 3, "new", 1, &bad, 0);
    DL_CHECK_ERRNO(h_error(&h, 3), -EINVAL);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 3, DL_RDZV_MSG_ERROR)->error.message, "min_nodes"));
    /* No opts: the core's defaults, one node, so the round closes at once. */
    h_join(&h, 4, "solo", 2, NULL, 0);
    ck_assert_int_eq(h_msg(&h, 4, DL_RDZV_MSG_ASSIGNMENT)->assignment.world_size, 2);
    h_fini(&h);
}

DL_TEST(jobs_are_isolated)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t oa = h_opts(2, 2), ob = h_opts(1, 1);
    h_join(&h, 1, "A", 1, &oa, 0);
    h_join(&h, 3, "B", 5, &ob, 0);
    ck_assert_int_eq(h_msg(&h, 3, DL_RDZV_MSG_ASSIGNMENT)->assignment.world_size, 5);
    h_join(&h, 2, "A", 1, &oa, 1);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 2);
    ck_assert_ptr_null(h_msg(&h, 3, DL_RDZV_MSG_ASSIGNMENT));
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 1, 0, 2);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    ck_assert_uint_eq(h_sends_to(&h, 3), 0);
    h_control(&h, DL_RDZV_EV_STOP, 50, "A", 3);
    ck_assert_uint_eq(h_sends_to(&h, 3), 0);
    const dl_rdzv_job_status_t *js = h_status(&h, "B", 4);
    ck_assert_int_eq(js->state, DL_RDZV_JOB_RUNNING);
    ck_assert_int_eq(js->restarts, 0);
    h_fini(&h);
}

DL_TEST(add_job_ahead_of_joins)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(1, 2), bad = h_opts(3, 2);
    dl_rdzv_actions_t acts;
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "j", &o, &acts), 0);
    /* Its creation is logged as a JOIN's is (the embedded server's journal holds the line). */
    size_t logged = 0;
    for (size_t i = 0; i < acts.n; i++)
        if (acts.v[i].kind == DL_RDZV_ACT_LOG && strcmp(acts.v[i].log.run_id, "j") == 0 &&
            strncmp(acts.v[i].log.text, "job created: nodes 1:2", 22) == 0)
            logged++;
    ck_assert_uint_eq(logged, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "j", &o, NULL), -EEXIST);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "k", &bad, NULL), -EINVAL);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "", &o, NULL), -EINVAL);
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), -ENOENT);
    h_join(&h, 1, "j", 1, NULL, 0);
    ck_assert_int_eq(h_msg(&h, 1, DL_RDZV_MSG_JOINED)->joined.round, 0);
    ck_assert(h_armed(&h) == 10); /* min 1 reached: the last call */
    h_fini(&h);
}

DL_TEST(opts_are_checked)
{
    dl_rdzv_job_opts_t o;
    dl_rdzv_job_opts_init(&o);
    char err[128];
    DL_CHECK_ERRNO(dl_rdzv_job_opts_check(&o, err, sizeof(err)), 0);
    o.dead_after = 0;
    DL_CHECK_ERRNO(dl_rdzv_job_opts_check(&o, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "dead_after"));
    dl_rdzv_job_opts_init(&o);
    o.max_nodes = DL_RDZV_MAX_NODES + 1;
    DL_CHECK_ERRNO(dl_rdzv_job_opts_check(&o, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "max_nodes"));
    dl_rdzv_core_opts_t co;
    dl_rdzv_core_opts_init(&co);
    co.max_keys = 0;
    dl_rdzv_core_t *core = (dl_rdzv_core_t *)&co;
    DL_CHECK_ERRNO(dl_rdzv_core_new(&co, &core), -EINVAL);
    ck_assert_ptr_eq(core, (dl_rdzv_core_t *)&co);
    dl_rdzv_core_free(NULL);
    dl_rdzv_event_t ev = {.kind = (dl_rdzv_event_kind_t)99};
    DL_CHECK_ERRNO(dl_rdzv_core_new(NULL, &core), 0);
    dl_rdzv_actions_t acts;
    DL_CHECK_ERRNO(dl_rdzv_core_step(core, &ev, 0, &acts), -EINVAL);
    dl_rdzv_core_free(core);
    ck_assert_str_eq(dl_rdzv_job_state_name(DL_RDZV_JOB_TIMED_OUT), "timed-out");
    ck_assert_str_eq(dl_rdzv_msg_kind_name(DL_RDZV_MSG_ROUND_CHANGED), "round-changed");
}

DL_TEST(time_going_back_counts_as_the_last_time)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 100);
    h_join(&h, 2, "job", 1, &o, 50);
    const dl_rdzv_job_status_t *js = h_status(&h, "job", 10);
    ck_assert(h_member(js, "a2")->heartbeat_age == 0);
    h_tick(&h, 119.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_tick(&h, 120);
    /* Both are due at 120: the first one found dead opens round 1 and tells the other. */
    ck_assert(h_closed(&h, 1));
    ck_assert_int_eq(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.round, 1);
    ck_assert_int_eq(h_status(&h, "job", 121)->round, 1);
    h_fini(&h);
}

static size_t logs(const harness_t *h, dl_rdzv_log_level_t level, const char *needle)
{
    size_t n = 0;
    for (size_t i = 0; i < h->acts.n; i++) {
        const dl_rdzv_action_t *a = &h->acts.v[i];
        n += a->kind == DL_RDZV_ACT_LOG && a->log.level == level &&
             strstr(a->log.text, needle) != NULL;
    }
    return n;
}

DL_TEST(logs_follow_the_level)
{
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(1, 1);
    h_join(&h, 1, "job", 1, &o, 0);
    ck_assert_uint_eq(logs(&h, DL_RDZV_LOG_INFO, "round 0 closed: 1 node,"), 1);
    ck_assert_uint_eq(logs(&h, DL_RDZV_LOG_DEBUG, "joined"), 0);
    h_fini(&h);

    dl_rdzv_core_opts_t co;
    dl_rdzv_core_opts_init(&co);
    co.log_level = DL_RDZV_LOG_DEBUG;
    h_init_opts(&h, &co);
    h_join(&h, 1, "job", 1, &o, 0);
    ck_assert_uint_eq(logs(&h, DL_RDZV_LOG_DEBUG, "agent 'a1' (h1, 1 slot) joined round 0"), 1);
    for (size_t i = 0; i < h.acts.n; i++)
        if (h.acts.v[i].kind == DL_RDZV_ACT_LOG)
            ck_assert_str_eq(h.acts.v[i].log.run_id, "job");
    h_fini(&h);

    co.log_level = DL_RDZV_LOG_ERROR;
    h_init_opts(&h, &co);
    h_join(&h, 1, "job", 1, &o, 0);
    ck_assert_uint_eq(logs(&h, DL_RDZV_LOG_INFO, ""), 0);
    h_fini(&h);
}

DL_TEST(jobs_per_creator_and_timeouts_are_capped)
{
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.max_jobs_per_creator = 3;
    o.max_timeout = 100;
    h_init_opts(&h, &o);
    dl_rdzv_job_opts_t jo = h_opts(2, 2);
    char run[16];
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_JOIN, .run_id = run};
    ev.join.agent_id = "a";
    ev.join.host = "h";
    ev.join.slots = 1;
    ev.join.node_rank = -1;
    ev.join.slurm_node_id = -1;
    ev.join.resume_round = -1;
    ev.join.opts = &jo;
    ev.join.creator = 77;
    for (uint64_t i = 1; i <= 4; i++) {
        snprintf(run, sizeof(run), "squat%d", (int)i);
        ev.conn = ev.req_id = i;
        h_step(&h, &ev, 0);
        ck_assert_int_eq(h_error(&h, i), i <= 3 ? 0 : -ENOSPC);
    }
    /* A JOIN of another creator, or of none, still gets in. */
    h_join(&h, 10, "other", 1, &jo, 0);
    ck_assert_int_eq(h_error(&h, 10), 0);
    /* A join timeout over the server's limit is refused, as are last call and dead after. */
    jo.join_timeout = 1e9;
    h_join(&h, 11, "long", 1, &jo, 0);
    DL_CHECK_ERRNO(h_error(&h, 11), -EINVAL);
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 11, DL_RDZV_MSG_ERROR)->error.message, "join_timeout"));
    jo.join_timeout = 100;
    jo.dead_after = 101;
    h_join(&h, 12, "long", 1, &jo, 0);
    DL_CHECK_ERRNO(h_error(&h, 12), -EINVAL);
    /* A squatter's job times out, lingers, is forgotten (the shell hears it), and frees its
     * creator's place. */
    jo.dead_after = 20;
    h_tick(&h, 100);
    h_tick(&h, 100 + 50);
    bool forgot = false;
    for (size_t i = 0; i < h.acts.n; i++)
        forgot |=
            h.acts.v[i].kind == DL_RDZV_ACT_FORGET && strcmp(h.acts.v[i].run_id, "squat1") == 0;
    ck_assert(forgot);
    snprintf(run, sizeof(run), "squat9");
    ev.conn = ev.req_id = 20;
    h_step(&h, &ev, 151);
    ck_assert_int_eq(h_error(&h, 20), 0);
    h_fini(&h);
}

DL_TEST(a_held_up_loop_blames_nobody_for_the_silence_it_could_not_hear)
{
    /* The loop that runs an embedded rendezvous stops with its agent (SIGSTOP, a starved CPU):
     * back 5 s after the heartbeat deadline, the shell says so before the late step, and
     * neither a1 (that agent itself) nor a2, whose heartbeat waits unread in its socket, is
     * lost; a1 is once silent for --dead-after (20 s) from then. */
    harness_t h;
    h_init(&h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(&h, 1, "job", 1, &o, 0);
    h_join(&h, 2, "job", 1, &o, 1);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ASSIGNMENT), 2);
    double due;
    ck_assert_int_eq(dl_rdzv_core_next_deadline(h.core, &due), 0);
    ck_assert(due == 20);
    dl_rdzv_core_held_up(h.core, 25);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 2, 0, 25);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_conn_event(&h, DL_RDZV_EV_HEARTBEAT, 2, 0, 40);
    h_tick(&h, 44.9);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 0);
    h_tick(&h, 45);
    ck_assert_ptr_nonnull(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED));
    ck_assert_ptr_nonnull(
        strstr(h_msg(&h, 2, DL_RDZV_MSG_ROUND_CHANGED)->round_changed.reason, "a1"));
    h_fini(&h);
}
