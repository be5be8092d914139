/* The agent's failover machine (rdzv-failover.h): fed events at made-up times, its actions read
 * back. The job: the rendezvous embedded in node 0 (10.0.0.1), successors node 1 (10.0.0.2)
 * and us, node 2 (10.0.0.3); join timeout 100 s, dead after 20 s, heartbeat every 5 s. */
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "rdzv-failover.h"

static const char *const SUCCESSORS[] = {"10.0.0.1", "10.0.0.2", "10.0.0.3"};

typedef struct {
    dl_rdzv_failover_t fo;
    dl_rdzv_fo_actions_t acts;
} fx_t;

static void step(fx_t *f, dl_rdzv_fo_event_t ev, double now)
{
    ev.now = now;
    dl_rdzv_failover_step(&f->fo, &ev, &f->acts);
}

/* The action of that kind the last step returned, or NULL. */
static const dl_rdzv_fo_action_t *find(const fx_t *f, dl_rdzv_fo_action_kind_t kind)
{
    for (int i = 0; i < f->acts.n; i++)
        if (f->acts.v[i].kind == kind)
            return &f->acts.v[i];
    return NULL;
}

static const dl_rdzv_fo_action_t *must(const fx_t *f, dl_rdzv_fo_action_kind_t kind)
{
    const dl_rdzv_fo_action_t *a = find(f, kind);
    ck_assert_msg(a != NULL, "no action %d among %d", (int)kind, f->acts.n);
    return a;
}

static bool said(const fx_t *f, dl_rdzv_fo_action_kind_t kind, const char *part)
{
    for (int i = 0; i < f->acts.n; i++)
        if (f->acts.v[i].kind == kind && strstr(f->acts.v[i].text, part) != NULL)
            return true;
    return false;
}

/* Connected at t=1, assigned a place with node 0 hosting; our address as the join said. */
static void fx_running(fx_t *f, bool may_host)
{
    dl_rdzv_fo_opts_t o = {.host = "10.0.0.1",
                           .port = 29400,
                           .join_timeout = 100,
                           .dead_after = 20,
                           .heartbeat = 5,
                           .may_host = may_host};
    dl_rdzv_failover_init(&f->fo, &o);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_START}, 0);
    const dl_rdzv_fo_action_t *c = must(f, DL_RDZV_FO_CONNECT);
    ck_assert_str_eq(c->host, "10.0.0.1");
    ck_assert(c->timeout == 100);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 1);
    must(f, DL_RDZV_FO_READY_FIRST);
    ck_assert(dl_rdzv_failover_ready(&f->fo));
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN}, 1);
    must(f, DL_RDZV_FO_SEND_JOIN);
    dl_rdzv_failover_set_my_addr(&f->fo, "10.0.0.3");
    step(f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_ASSIGNED,
                              .node_rank = 0,
                              .successors = SUCCESSORS,
                              .nsuccessors = 3},
         2);
    ck_assert_int_eq(f->acts.n, 0);
}

static void lose(fx_t *f, double now, const char *why)
{
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .why = why}, now);
}

static void join(fx_t *f, double now)
{
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN}, now);
}

static void refused(fx_t *f, double now)
{
    step(f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECT_FAILED,
                              .fail = DL_RDZV_FO_FAIL_OTHER,
                              .why = "connection refused"},
         now);
}

static void fire(fx_t *f, dl_rdzv_fo_timer_t t, double now)
{
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TIMER, .timer = t}, now);
}

DL_TEST(a_lost_host_is_looked_for_at_its_successors_then_hosted_here)
{
    fx_t f;
    fx_running(&f, true);
    lose(&f, 100, "connection reset by peer");
    must(&f, DL_RDZV_FO_DROP);
    const dl_rdzv_fo_action_t *l = must(&f, DL_RDZV_FO_LOST);
    ck_assert(l->blame);
    ck_assert_str_eq(l->cause, "node_lost");
    ck_assert_str_eq(l->host, "10.0.0.1");
    ck_assert_int_eq(l->node_rank, 0);
    /* A lost node's round change: whether the workers stay is the agent's to say (in-job they
     * do), not the machine's. */
    ck_assert(said(&f, DL_RDZV_FO_SAY, "lost the rendezvous at 10.0.0.1:29400"));
    ck_assert(!said(&f, DL_RDZV_FO_SAY, "workers"));
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_TIMER_START)); /* a stable connection: at once */
    /* The lost host counts as a failure in the next join, as any lost node would. */
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 1);

    /* Where it was first, with no wait: a refusal says nobody serves there. */
    join(&f, 100);
    const dl_rdzv_fo_action_t *c = must(&f, DL_RDZV_FO_CONNECT);
    ck_assert_str_eq(c->host, "10.0.0.1");
    ck_assert(c->timeout == 0);
    ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, 20001);
    refused(&f, 100.1);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "trying 10.0.0.2, the next successor"));
    c = must(&f, DL_RDZV_FO_CONNECT);
    ck_assert_str_eq(c->host, "10.0.0.2");
    ck_assert(c->timeout == 20);

    /* Node 1 neither answers nor refuses: its turn passes to us, who host it. */
    fire(&f, DL_RDZV_FO_TIMER_CANDIDATE, 120.2);
    must(&f, DL_RDZV_FO_CLOSE_CLIENT);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_SERVE)->host, "10.0.0.3");
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_CONNECT));
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVED}, 120.2);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "hosting the rendezvous on 10.0.0.3:29400"));
    c = must(&f, DL_RDZV_FO_CONNECT);
    ck_assert_str_eq(c->host, "10.0.0.3");
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_TIMER_START)); /* our own: no candidate's wait */

    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 120.5);
    const dl_rdzv_fo_action_t *m = must(&f, DL_RDZV_FO_MOVED);
    ck_assert_str_eq(m->host, "10.0.0.3");
    ck_assert(m->hosting);
    ck_assert_double_eq_tol(m->seconds, 20.5, 1e-9);
    must(&f, DL_RDZV_FO_SEND_JOIN); /* the join asked while it was looked for */
    ck_assert_str_eq(dl_rdzv_failover_host(&f.fo), "10.0.0.3");
    /* The next assignment has counted the loss: no longer ours to add. */
    step(&f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_ASSIGNED,
                              .node_rank = 2,
                              .successors = SUCCESSORS + 1,
                              .nsuccessors = 2},
         121);
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 0);
}

DL_TEST(a_successor_that_may_not_host_goes_on_to_the_next)
{
    fx_t f;
    fx_running(&f, false); /* is_host=0: never hosts, not even as a successor */
    lose(&f, 100, "reset");
    join(&f, 100);
    refused(&f, 100);
    refused(&f, 101); /* 10.0.0.2 refuses: 10.0.0.3 is ours but we may not host */
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_SERVE));
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "10.0.0.3");
}

DL_TEST(a_silent_host_is_not_waited_for_where_it_was)
{
    fx_t f;
    fx_running(&f, true);
    /* Heartbeats every 5 s and nothing heard since t=1: lost once silent past 20 s. */
    double t = 1;
    for (; t < 26; t += 5) {
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, t);
        ck_assert_ptr_null(find(&f, DL_RDZV_FO_LOST));
    }
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, t);
    const dl_rdzv_fo_action_t *l = must(&f, DL_RDZV_FO_LOST);
    ck_assert(strstr(l->text, "lost the rendezvous at 10.0.0.1:29400 (no answer for 25.0 s") !=
              NULL);
    ck_assert(l->blame);
    /* Silent: where it was is skipped, the first successor is asked at once. */
    join(&f, t);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "10.0.0.2");
}

DL_TEST(a_closed_connection_asks_where_it_was_first)
{
    fx_t f;
    fx_running(&f, true);
    lose(&f, 50, "end of file");
    join(&f, 50);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "10.0.0.1");
}

DL_TEST(a_held_up_loop_gives_the_rendezvous_a_fair_period)
{
    fx_t f;
    fx_running(&f, true);
    /* Our own loop stalled for 60 s: the rendezvous was not listened to meanwhile. */
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 61);
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_LOST));
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD}, 62);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 66);
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_LOST));
    ck_assert(dl_rdzv_failover_ready(&f.fo));
}

DL_TEST(a_misbehaving_rendezvous_is_dropped_not_failed_over)
{
    fx_t f;
    fx_running(&f, true);
    step(&f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST,
                              .misbehaving = true,
                              .why = "an assignment this node cannot take"},
         50);
    const dl_rdzv_fo_action_t *l = must(&f, DL_RDZV_FO_LOST);
    ck_assert(strncmp(l->text, "dropped the rendezvous at 10.0.0.1:29400", 40) == 0);
    ck_assert(!l->blame); /* its node did not fail */
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 0);
    /* Backoff even after a long connection, and the same place again. */
    const dl_rdzv_fo_action_t *t = must(&f, DL_RDZV_FO_TIMER_START);
    ck_assert_int_eq(t->timer, DL_RDZV_FO_TIMER_RETRY);
    ck_assert_uint_eq(t->ms, 100);
    join(&f, 50);
    ck_assert_int_eq(f.acts.n, 0); /* the backoff connects */
    fire(&f, DL_RDZV_FO_TIMER_RETRY, 50.1);
    const dl_rdzv_fo_action_t *c = must(&f, DL_RDZV_FO_CONNECT);
    ck_assert_str_eq(c->host, "10.0.0.1");
    ck_assert(c->timeout == 100);
}

DL_TEST(reconnects_back_off_doubling_to_five_seconds)
{
    fx_t f;
    fx_running(&f, true);
    const unsigned want[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000};
    double t = 10;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++, t += 1) {
        step(&f,
             (dl_rdzv_fo_event_t){
                 .kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
             t);
        ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, want[i]);
        join(&f, t);
        fire(&f, DL_RDZV_FO_TIMER_RETRY, t + 0.1);
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, t + 0.2);
        must(&f, DL_RDZV_FO_SEND_JOIN);
    }
}

DL_TEST(a_stable_connection_resets_the_backoff)
{
    fx_t f;
    fx_running(&f, true);
    for (int i = 0; i < 3; i++) {
        step(&f,
             (dl_rdzv_fo_event_t){
                 .kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
             10 + i);
        join(&f, 10 + i);
        fire(&f, DL_RDZV_FO_TIMER_RETRY, 10.5 + i);
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 10.6 + i);
    }
    /* Connected for 10 s, but dropped for what it said: never a stable connection. */
    step(&f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
         22.6);
    ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, 800);
    join(&f, 22.5);
    fire(&f, DL_RDZV_FO_TIMER_RETRY, 23.3);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 23.4);
    /* Lost after 10 s that served: joined again at once, and the count starts over. */
    lose(&f, 33.4, "server restarted");
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_TIMER_START));
    join(&f, 33.4);
    must(&f, DL_RDZV_FO_CONNECT);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 33.5);
    step(&f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
         34);
    ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, 100);
}

DL_TEST(join_timeout_of_trouble_in_a_row_gives_up)
{
    fx_t f;
    fx_running(&f, true);
    double t = 10;
    for (; t <= 110; t += 10) {
        step(&f,
             (dl_rdzv_fo_event_t){
                 .kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
             t);
        ck_assert_ptr_null(find(&f, DL_RDZV_FO_END));
        join(&f, t);
        fire(&f, DL_RDZV_FO_TIMER_RETRY, t + 1);
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, t + 2);
    }
    step(&f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LOST, .misbehaving = true, .why = "bad frame"},
         t);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "failed 12 times in 110 s (last: bad frame): giving up"));
    const dl_rdzv_fo_action_t *e = must(&f, DL_RDZV_FO_END);
    ck_assert_int_eq(e->code, 4);
    ck_assert_str_eq(e->status, "refused");
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_LOST));
}

DL_TEST(no_successor_serving_within_join_timeout_gives_up)
{
    fx_t f;
    fx_running(&f, false);
    lose(&f, 100, "reset");
    join(&f, 100);
    refused(&f, 100.5); /* 10.0.0.1 */
    refused(&f, 101);   /* 10.0.0.2 */
    refused(&f, 101.5); /* 10.0.0.3: not ours to host, and nobody else does */
    ck_assert(said(&f, DL_RDZV_FO_ERROR,
                   "the rendezvous is lost, and none of its 3 successors serves it (last: "
                   "10.0.0.3:29400, connection refused)"));
    const dl_rdzv_fo_action_t *e = must(&f, DL_RDZV_FO_END);
    ck_assert_int_eq(e->code, 3);
    ck_assert_str_eq(e->status, "timed_out");

    /* Candidates left, but --join-timeout since the loss ran out. */
    fx_running(&f, false);
    lose(&f, 100, "reset");
    join(&f, 100);
    refused(&f, 200.5);
    must(&f, DL_RDZV_FO_END);
}

/* Two agents on one machine: the lost host's address is ours, and its server may hold it a
 * while after the loss (frozen, or a large process still dying when its peers see it gone). */
static const char *const ONE_MACHINE[] = {"127.0.0.1", "127.0.0.1"};

static void fx_one_machine(fx_t *f)
{
    dl_rdzv_fo_opts_t o = {.host = "127.0.0.1",
                           .port = 29400,
                           .join_timeout = 100,
                           .dead_after = 1,
                           .heartbeat = 0.2,
                           .may_host = true};
    dl_rdzv_failover_init(&f->fo, &o);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_START}, 0);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 1);
    join(f, 1);
    dl_rdzv_failover_set_my_addr(&f->fo, "127.0.0.1");
    step(f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_ASSIGNED,
                              .node_rank = 0,
                              .successors = ONE_MACHINE,
                              .nsuccessors = 2},
         2);
    lose(f, 50, "no answer for 1.0 s");
    join(f, 50);
    ck_assert_str_eq(must(f, DL_RDZV_FO_SERVE)->host, "127.0.0.1");
}

DL_TEST(a_lost_host_still_holding_our_address_is_outwaited_not_given_up_on)
{
    fx_t f;
    fx_one_machine(&f);
    /* The lost host's server still listens: ours cannot, so it is asked there first. */
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVE_IN_USE},
         50);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "127.0.0.1");
    /* It never answers (frozen), or resets (dying): our turn again shortly, not the end. */
    fire(&f, DL_RDZV_FO_TIMER_CANDIDATE, 51);
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_END));
    ck_assert(said(&f, DL_RDZV_FO_SAY, "the lost host's server may not be gone yet"));
    const dl_rdzv_fo_action_t *t = must(&f, DL_RDZV_FO_TIMER_START);
    ck_assert_int_eq(t->timer, DL_RDZV_FO_TIMER_RETRY);
    ck_assert_uint_eq(t->ms, DL_RDZV_FO_SERVE_RETRY_MS);
    fire(&f, DL_RDZV_FO_TIMER_RETRY, 51.25);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_SERVE)->host, "127.0.0.1");
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVE_IN_USE},
         51.25);
    refused(&f, 51.3);
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_END));
    ck_assert(!said(&f, DL_RDZV_FO_SAY, "may not be gone yet")); /* said once */
    fire(&f, DL_RDZV_FO_TIMER_RETRY, 51.55);
    /* Gone now: we host, and the job is found here. */
    must(&f, DL_RDZV_FO_SERVE);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVED}, 51.55);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "hosting the rendezvous on 127.0.0.1:29400"));
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 51.6);
    ck_assert(must(&f, DL_RDZV_FO_MOVED)->hosting);
    must(&f, DL_RDZV_FO_SEND_JOIN);
}

DL_TEST(a_held_address_is_outwaited_only_until_join_timeout)
{
    fx_t f;
    fx_one_machine(&f);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVE_IN_USE},
         50);
    refused(&f, 150.5);
    ck_assert(said(&f, DL_RDZV_FO_ERROR, "the rendezvous is lost, and none of its"));
    ck_assert_int_eq(must(&f, DL_RDZV_FO_END)->code, 3);
    /* Someone else on this machine serves it (another successor was quicker): joined there. */
    fx_one_machine(&f);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVE_IN_USE},
         50);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 50.1);
    ck_assert(!must(&f, DL_RDZV_FO_MOVED)->hosting);
}

DL_TEST(a_full_job_is_joined_again_until_join_timeout)
{
    fx_t f;
    fx_running(&f, true);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN_FULL, .why = "the job is full"}, 10);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "joining again every 1000 ms"));
    ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, 1000);
    fire(&f, DL_RDZV_FO_TIMER_FULL, 11);
    must(&f, DL_RDZV_FO_JOIN_AGAIN);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN_FULL, .why = "the job is full"}, 60);
    ck_assert(!said(&f, DL_RDZV_FO_SAY, "joining again")); /* said once */
    must(&f, DL_RDZV_FO_TIMER_START);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_JOIN_FULL, .why = "the job is full"}, 110);
    ck_assert(said(&f, DL_RDZV_FO_ERROR, "the job is full"));
    ck_assert_int_eq(must(&f, DL_RDZV_FO_END)->code, 4);
}

DL_TEST(a_departed_host_is_named_but_costs_no_restart)
{
    fx_t f;
    fx_running(&f, true);
    /* Node 0's operator stopped it: the round change says it departed, then its rendezvous
     * goes with it. */
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_NODE_LEFT, .node_rank = 0}, 50);
    lose(&f, 50.5, "end of file");
    const dl_rdzv_fo_action_t *l = must(&f, DL_RDZV_FO_LOST);
    ck_assert_str_eq(l->cause, "node_left");
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 0);
    join(&f, 51);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "10.0.0.1");

    /* Another node's departure changes nothing for the host. */
    fx_running(&f, true);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_NODE_LEFT, .node_rank = 1}, 50);
    lose(&f, 50.5, "end of file");
    ck_assert_str_eq(must(&f, DL_RDZV_FO_LOST)->cause, "node_lost");
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 1);
}

/* We host as the successor at 10.0.0.3 (the first two refused). */
static void fx_hosting(fx_t *f)
{
    fx_running(f, true);
    lose(f, 100, "reset");
    join(f, 100);
    refused(f, 100);
    refused(f, 100);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_SERVED, .serve = DL_RDZV_FO_SERVED}, 100);
    step(f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 100);
    step(f,
         (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_ASSIGNED,
                              .node_rank = 2,
                              .successors = SUCCESSORS + 1,
                              .nsuccessors = 2},
         101);
}

DL_TEST(the_job_is_handed_back_to_an_earlier_candidate)
{
    fx_t f;
    fx_hosting(&f);
    /* Each heartbeat asks the candidates before ours in turn. */
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 105);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_PROBE)->host, "10.0.0.2");
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD}, 106);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 110);
    ck_assert_ptr_null(find(&f, DL_RDZV_FO_PROBE)); /* still waiting for that answer */
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_PROBED, .ok = false}, 111);
    ck_assert_int_eq(f.acts.n, 0);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD}, 112);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 115);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_PROBE)->host, "10.0.0.1");
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_PROBED, .ok = true}, 116);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "10.0.0.1:29400 answers again: handing the job over"));
    must(&f, DL_RDZV_FO_HAND_OVER);
    /* Our own connection goes with our server: no failure, no blame, asked there first. */
    lose(&f, 116.1, "end of file");
    ck_assert(!must(&f, DL_RDZV_FO_LOST)->blame);
    ck_assert_int_eq(dl_rdzv_failover_extra_failures(&f.fo), 0);
    join(&f, 116.2);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_CONNECT)->host, "10.0.0.1");
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CONNECTED}, 116.3);
    ck_assert(!must(&f, DL_RDZV_FO_MOVED)->hosting);
}

DL_TEST(an_unanswered_probe_is_replaced_after_dead_after)
{
    fx_t f;
    fx_hosting(&f);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 105);
    must(&f, DL_RDZV_FO_PROBE);
    for (double t = 110; t < 125; t += 5) {
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD}, t);
        step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, t);
        ck_assert_ptr_null(find(&f, DL_RDZV_FO_PROBE));
    }
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_HEARD}, 125);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_TICK}, 125);
    ck_assert_str_eq(must(&f, DL_RDZV_FO_PROBE)->host, "10.0.0.1");
}

DL_TEST(an_endpoint_name_not_yet_published_is_looked_up_again)
{
    fx_t f;
    dl_rdzv_fo_opts_t o = {.host = "rdzv.svc",
                           .port = 29400,
                           .join_timeout = 100,
                           .dead_after = 20,
                           .heartbeat = 5,
                           .may_host = true};
    dl_rdzv_failover_init(&f.fo, &o);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_START}, 1000);
    dl_rdzv_fo_event_t nx = {.kind = DL_RDZV_FO_EV_CONNECT_FAILED,
                             .fail = DL_RDZV_FO_FAIL_NO_NAME,
                             .why = "cannot resolve",
                             .name_error = "unknown node"};
    step(&f, nx, 1000);
    ck_assert(said(&f, DL_RDZV_FO_SAY, "'rdzv.svc' does not resolve yet (unknown node)"));
    ck_assert_uint_eq(must(&f, DL_RDZV_FO_TIMER_START)->ms, DL_RDZV_FO_NAME_RETRY_MS);
    fire(&f, DL_RDZV_FO_TIMER_RETRY, 1000.25);
    ck_assert_int_eq(must(&f, DL_RDZV_FO_CONNECT)->code, 1);
    step(&f, nx, 1050);
    must(&f, DL_RDZV_FO_TIMER_START); /* said once, looked up again */
    ck_assert_int_eq(f.acts.n, 1);
    step(&f, nx, 1100);
    ck_assert(said(&f, DL_RDZV_FO_ERROR, "cannot resolve"));
    ck_assert_int_eq(must(&f, DL_RDZV_FO_END)->code, 3);
}

DL_TEST(after_leave_a_closed_connection_is_no_loss)
{
    fx_t f;
    fx_running(&f, true);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_LEAVE}, 50);
    lose(&f, 50.1, "end of file");
    ck_assert_int_eq(f.acts.n, 1);
    must(&f, DL_RDZV_FO_CLOSE_CLIENT);
    step(&f, (dl_rdzv_fo_event_t){.kind = DL_RDZV_FO_EV_CLOSE}, 51);
    join(&f, 52);
    ck_assert_int_eq(f.acts.n, 0); /* closed: nothing more */
}
