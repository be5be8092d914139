/* The etcd backend (rdzv-backend.h): the job's rendezvous kept in an etcd v3 cluster
 * (docs/etcd.md), through etcd.h's client on the agent's loop and etcd-job.h's keys and
 * transactions.
 *
 * Every agent holds a lease (TTL --dead-after, kept alive every --heartbeat) and a member key on
 * it; it keeps a view of the job's settings and state, loaded once and then followed with a
 * watch on the state key alone (never polled), and after every change decides what the job
 * needs next. No agent follows the other members' keys, so that a round of N agents costs O(N)
 * messages, not N^2 (docs/etcd.md): each join is counted in its own transaction (count_only),
 * and the member that makes the count max_nodes closes the round (reading the members once),
 * the one that makes it min_nodes keeps the last call; in a running round each node watches the
 * member key of the node ranked after it (deletions only), and opens a new round when that key
 * goes (its lease expired) before the node was done; the node whose done makes the count the
 * round's node count ends the job. Each such step is a transaction on the state's revision, so
 * whichever agent gets there first decides and the others see it through their watch. The node
 * ranked 0 in a round serves its workers' key-value store, as the embedded rendezvous does. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "diag.h"
#include "etcd-job.h"
#include "etcd.h"
#include "http.h"
#include "netif.h"
#include "rdzv-backend.h"
#include "rdzv-policy.h"
#include "rdzv-report.h"
#include "rendezvous.h"

/* How long a finished job's settings, state and events stay (dlaunch status answers). */
#define LINGER_S 10
/* How often an agent puts its report (n/NODE_ID) at most, and an agent serving --http reads the
 * job's keys at most, in seconds (or every --heartbeat when that is longer). */
#define REPORT_S 2.0
#define REPORT_NODES_S 250.0
#define PAGE_S 2.0
/* A request that failed for want of etcd is tried again after this, doubling up to the max. */
#define RETRY_MIN_MS 200
#define RETRY_MAX_MS 2000

typedef enum { PH_LEASE, PH_CREATE, PH_LOAD, PH_RUN } phase_t;

struct dl_rdzv_impl_s {
    dl_rdzv_backend_conf_t conf;
    const dl_job_spec_t *spec;
    dl_rdzv_backend_cbs_t cbs;
    void *ctx;
    dl_etcd_t *etcd;
    dl_ejob_view_t view;
    dl_ejob_settings_t settings;
    char prefix[DL_EJOB_MAX_PREFIX];
    phase_t phase;
    int64_t lease; /* 0: none (being granted) */
    bool granting;
    dl_etcd_req_t *watch; /* on the state key */
    bool watch_wanted;    /* the watch ended: start it again */
    /* Running: the watch on the member key of the node after this one in the round (ring_id),
     * deletions only; ring_check asks etcd whether it is gone and whether it was done. */
    dl_etcd_req_t *ring;
    char ring_id[256];
    int ring_round;
    bool ring_wanted, ring_checking;
    int lost_round; /* ring_id's node was lost in this round (-1: none) */
    char lost_host[256];
    int lost_rank;
    /* This node's assignment (a/ROUND/REV/NODE_ID, or every node's for node 0) was read for
     * round assign_round, REV assign_rev (0: not yet), or is being read. */
    int assign_round;
    int64_t assign_rev;
    bool assign_reading;
    bool assign_linear; /* the next read of it is linearizable (the member asked was behind) */
    /* The read found no key of ours: checked once more against the state (assign_check). */
    bool assign_checked;
    /* Counts of this node's last join and done transactions (the round's members and done
     * nodes after them), for the round they were made in (-1: none). */
    int joined_round, done_count_round;
    int64_t joined_count, done_count;
    int members_round; /* every member's key was read for this round (-1: not since) */
    bool reading;      /* that read, or the join timeout's count, in flight */
    int64_t linger_lease;
    bool keepalive_busy;
    bool txn_busy; /* one transition at a time */
    int txn_kind;  /* the one in flight: a txn_kind_t */
    int txn_round;
    /* A close in flight: its transactions (the assignments in batches, then the state) and the
     * next one to send. */
    json_t *close_txns;
    size_t close_next;
    int txn_round_read; /* the round and assignment of the read in flight */
    int64_t assign_rev_read;
    int64_t txn_view_rev; /* the view's revision it was made from */
    /* No new transition until the view holds what the last one did (its revision), or, when
     * its comparison failed, until the view changed at all: acting again on a view that is
     * behind would only send the same transaction again. */
    int64_t wait_rev; /* 0: none */
    bool wait_change; /* wait_rev is the view's revision to move past */
    double wait_since;
    int linger_what; /* a lease being granted for the job's end: 0 succeeded, 1 failed,
                           * 2 timed out, 3 stopped (a departure left too few nodes) */
    dl_ejob_cause_t linger_cause;
    char linger_reason[1400];
    json_t *linger_culprit;
    /* What the agent asked for and has not been done yet. */
    bool join_wanted;
    dl_rdzv_join_t join;
    int report_round; /* a failure to report (round), or -1 */
    char report_reason[1400];
    json_t *report_culprit; /* who: this node and its rank */
    int node_rank;          /* this node's in the round it was assigned */
    dl_ejob_cause_t report_cause;
    /* A failure waiting for the others' reports (n/ keys) before it is reported: its round
     * (-1: none), this node's report (diag/), and the text's end so far. */
    int explain_round;
    json_t *explain_diag;
    size_t explain_at;
    int explain_rank; /* the failed worker's, and whether its watchdog named it hung */
    bool explain_hung;
    int done_round; /* node done to mark (round), or -1 */
    /* Where this node stands. */
    int workers_round; /* the round this node was assigned (its workers'), or -1 */
    int seen_round;    /* the highest round seen */
    bool ready_said;
    bool ended;
    /* The agent goes before the job's end (its operator's signal): the departure is written to
     * the job's state before the lease goes, so that the others read no lost node (a new round
     * without it, no restart spent; or, too few left, the job stopped). Once written, or with
     * nothing to write, this node makes no transition and hears nothing more. */
    bool depart_wanted, departed;
    bool revoke_after_depart; /* close() came while the departure was in flight */
    char depart_reason[64];
    /* This node's store for its workers' job, served when it is node 0 of a round, guarded by
     * the agent's token, else by the key the job keeps (store_token). */
    dl_rdzv_server_t *store;
    int torch_port; /* its torch store's (MASTER_PORT as node 0), or 0: store=worker */
    dl_proto_token_t *store_token;
    char store_key[80];
    char addr[256]; /* where other nodes reach this one */
    char store_addr[320];
    /* Timers of the gathering round (armed for round *_round), and retries. */
    uv_timer_t last_call, join_timer, retry;
    int last_call_round, join_timer_round;
    int close_due_round; /* the last call or join timeout passed for this round */
    /* Whose turn it is to make a change every agent sees is due (close a round, open the next
     * one for a lost node, end the job): the live member that joined first at once, the others
     * each a little later in join order, should it not have (turn_timer). */
    uv_timer_t turn_timer;
    int turn_round, turn_what;
    /* The job's end (succeeded) reads the events again (linger_timer) while a node's journal
     * line "finished: K of N done", put by that node after its done mark, is not in yet:
     * the end moves the events onto the linger lease, and a line put after that read stays on
     * its node's lease, which goes with that node. */
    uv_timer_t linger_timer;
    int linger_reads;
    bool turn_due;
    unsigned retry_ms;
    /* Since when (monotonic s, 0: not) the job has had its maximum of nodes, none of them this
     * one: it waits for a place until --join-timeout, as with our rendezvous's job_full. */
    double full_since;
    /* Trouble reaching etcd: since when (monotonic s, 0: none), and whether it was said. */
    double trouble_since;
    double last_ok; /* monotonic s of etcd's last good answer */
    bool trouble_said;
    dl_etcd_status_t trouble_status; /* the cause last said */
    bool watch_ok;                   /* the watch in place was set up (created) */
    char trouble[1100];
    /* What this node would tell a rendezvous server with its heartbeats, put at n/NODE_ID on
     * its lease every REPORT_S at most (docs/etcd.md, "Control"). */
    bool report_busy, report_cut_said;
    double report_last; /* monotonic s of the last put (0: none) */
    /* The job-wide straggler rule, run by the round's node 0 over every node's report (read as
     * often as this node puts its own), its verdict put at PREFIX verdict when it changes. */
    dl_rdzv_judge_t *judge;
    json_t *judged; /* node id -> the revision of its report last fed */
    char *verdict;  /* the verdict last put, as text */
    int verdict_round;
    bool judge_busy;
    /* --http: the status page, served from the store's server with the job as a read of every
     * key under the prefix (page) every PAGE_S shows it, as `dlaunch status` does. */
    dl_http_t *http;
    dl_ejob_view_t page;
    bool page_busy;
    double page_last;
    bool raw_snapshot; /* the store's own figures are being read: no overlay */
    int handles;
    bool closing;
    bool leaving; /* close() waits for the lease's revocation */
};

typedef struct dl_rdzv_impl_s etcd_t;

/* The transitions, by what their answer means for this node. */
typedef enum {
    TXN_PLAIN,    /* changes the state: wait for the watch to bring it */
    TXN_JOIN,     /* joins the round, counted; the state stays */
    TXN_REPORT,   /* a failure of this node: opens the next round */
    TXN_DONE,     /* this node's workers are done, counted; the state stays */
    TXN_CLOSE,    /* closes the round from the members just read */
    TXN_NEWCOMER, /* opens the next round and joins it, counted */
    TXN_DEPART,   /* this node departs: the next round without it, or the job stopped */
} txn_kind_t;

static void react(etcd_t *z);
static void assign_check(etcd_t *z);
static void connect_step(etcd_t *z);
static void revoke_lease(etcd_t *z);
static void start_store(etcd_t *z);
static bool send_txn(etcd_t *z, json_t *body, txn_kind_t kind, int round);
static int start_http(etcd_t *z);
static void put_report(etcd_t *z, const dl_rdzv_beat_t *beat);
static void read_page(etcd_t *z);

static double mono(void)
{
    return (double)uv_hrtime() / 1e9;
}

static double now_unix(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static void say(etcd_t *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(etcd_t *z, const char *fmt, ...)
{
    char msg[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!z->closing)
        z->cbs.log(z->ctx, msg);
}

/* The job is over for this node (once). */
static void end(etcd_t *z, int code, const char *status, bool stopped, const char *failure)
{
    if (z->ended || z->closing)
        return;
    z->ended = true;
    dl_rdzv_end_t e = {.exit_code = code, .stopped = stopped, .status = status, .failure = failure};
    z->cbs.ended(z->ctx, &e);
}

/* A fatal error: one line on stderr, then the end (exit 3 or 4). */
static void fail(etcd_t *z, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void fail(etcd_t *z, int code, const char *fmt, ...)
{
    char msg[1400];
    va_list ap;
    if (z->ended || z->closing)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "dlaunch: %s\n", msg);
    end(z, code, code == 3 ? "timed_out" : code == 4 ? "refused" : "failed", false, NULL);
}

/* ---- Trouble with etcd ------------------------------------------------------------------------ */

static const char *cause_text(dl_etcd_status_t st)
{
    switch (st) {
    case DL_ETCD_UNREACHABLE: return "unreachable";
    case DL_ETCD_NO_QUORUM: return "lost quorum";
    case DL_ETCD_AUTH: return "refused";
    default: return "error";
    }
}

/* A request failed for want of etcd. Auth failures end the job at once (exit 4); otherwise the
 * job goes on while etcd comes back within --join-timeout, and then gives up (exit 3). Returns
 * true when the caller should try again later. */
static bool trouble(etcd_t *z, const dl_etcd_result_t *res)
{
    if (res->status == DL_ETCD_CANCELLED || z->ended || z->closing)
        return false;
    if (res->status == DL_ETCD_AUTH) {
        fail(z, 4, "%s (%s)", res->error, cause_text(res->status));
        return false;
    }
    double now = mono();
    snprintf(z->trouble, sizeof(z->trouble), "%s", res->error);
    /* Trouble counts from etcd's last good answer (a request may take seconds to fail). */
    if (z->trouble_since == 0)
        z->trouble_since = z->last_ok > 0 ? z->last_ok : now;
    if (now - z->trouble_since > z->spec->join_timeout) {
        fail(z, 3, "%s (%s) for %.0f s, past --join-timeout: giving up", res->error,
             cause_text(res->status), now - z->trouble_since);
        return false;
    }
    /* Said once, and again when the cause changes (unreachable, then lost quorum). */
    if (!z->trouble_said || z->trouble_status != res->status) {
        z->trouble_said = true;
        z->trouble_status = res->status;
        if (z->ready_said)
            say(z, "%s (%s); the job goes on, waiting up to %.0f s (--join-timeout) for etcd",
                res->error, cause_text(res->status), z->spec->join_timeout);
        else
            say(z, "%s (%s); trying again until %.0f s (--join-timeout) have passed", res->error,
                cause_text(res->status), z->spec->join_timeout);
    }
    return true;
}

static void untroubled(etcd_t *z)
{
    z->last_ok = mono();
    if (z->trouble_since != 0 && z->trouble_said)
        say(z, "etcd answers again after %.1f s", mono() - z->trouble_since);
    z->trouble_since = 0;
    z->trouble_said = false;
    z->retry_ms = 0;
}

/* A range answer (res, OK) put into v by how (dl_ejob_view_load, dl_ejob_view_reports): what how
 * returns, or -EPROTO (not OK, or not a range answer: v->err says why). */
static int with_range(const dl_etcd_result_t *res, dl_ejob_view_t *v,
                      int (*how)(dl_ejob_view_t *, const dl_etcd_range_t *))
{
    dl_etcd_range_t range;
    if (res->status != DL_ETCD_OK ||
        dl_etcd_reply(&dl_etcd_range_type, res->body, &range, v->err, sizeof(v->err)) < 0)
        return -EPROTO;
    int r = how(v, &range);
    dl_proto_rec_free(&dl_etcd_range_type, &range);
    return r;
}

/* etcd's answer read by its table (reply.h): false, the job failed, when it is not as declared
 * (etcd answered nonsense). */
static bool reply(etcd_t *z, const dl_etcd_result_t *res, const dl_proto_rec_type_t *t, void *rec)
{
    char err[512];
    if (dl_etcd_reply(t, res->body, rec, err, sizeof(err)) == 0)
        return true;
    fail(z, 4, "etcd at %s: %s", res->endpoint, err);
    return false;
}

static void on_retry(uv_timer_t *t)
{
    etcd_t *z = t->data;
    if (z->phase != PH_RUN) {
        connect_step(z);
        return;
    }
    react(z);
}

static void retry_later(etcd_t *z)
{
    z->retry_ms = z->retry_ms == 0 ? RETRY_MIN_MS : z->retry_ms * 2;
    if (z->retry_ms > RETRY_MAX_MS)
        z->retry_ms = RETRY_MAX_MS;
    if (!uv_is_active((uv_handle_t *)&z->retry))
        uv_timer_start(&z->retry, on_retry, z->retry_ms, 0);
}

/* Whether an etcd error says our lease is gone (it expired while we sat out or were cut off). */
static bool lease_gone(const dl_etcd_result_t *res)
{
    return res->error != NULL && strstr(res->error, "lease not found") != NULL;
}

/* ---- The lease -------------------------------------------------------------------------------- */

static void on_granted(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->granting = false;
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    dl_etcd_lease_t granted;
    if (!reply(z, res, &dl_etcd_lease_type, &granted))
        return;
    z->lease = granted.ID;
    dl_proto_rec_free(&dl_etcd_lease_type, &granted);
    if (z->lease == 0) {
        fail(z, 4, "etcd at %s: granted no lease", res->endpoint);
        return;
    }
    untroubled(z);
    if (z->phase == PH_LEASE) {
        z->phase = PH_CREATE;
        connect_step(z);
    } else {
        react(z);
    }
}

static void grant(etcd_t *z)
{
    if (z->granting)
        return;
    z->granting = true;
    long long ttl = (long long)dl_diag_ceil(z->spec->dead_after);
    if (ttl < 1)
        ttl = 1;
    if (dl_etcd_call(z->etcd, "/v3/lease/grant", json_pack("{s:o}", "TTL", dl_etcd_num(ttl)),
                     on_granted, z, NULL) < 0)
        z->granting = false;
}

static void on_keepalive(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->keepalive_busy = false;
    if (res->status != DL_ETCD_OK) {
        trouble(z, res);
        return;
    }
    dl_etcd_lease_t kept;
    if (!reply(z, res, &dl_etcd_lease_type, &kept))
        return;
    int64_t ttl = dl_etcd_lease_ttl(&kept);
    dl_proto_rec_free(&dl_etcd_lease_type, &kept);
    if (ttl <= 0) {
        /* Expired: our member key is gone with it; the others (or we) open a new round. */
        if (z->lease != 0)
            say(z, "this node's etcd lease expired (no keepalive within %g s): getting another",
                z->spec->dead_after);
        z->lease = 0;
        grant(z);
        return;
    }
    untroubled(z);
}

/* ---- The watch -------------------------------------------------------------------------------- */

static void start_watch(etcd_t *z);

/* Whether a watch message brings only what the view holds already: a read since the watch
 * started (the members before a close) loaded a later state. */
static bool stale(const dl_ejob_view_t *v, const dl_etcd_watch_t *msg)
{
    for (size_t i = 0; i < msg->nevents; i++) {
        if (msg->events[i].kv == NULL || msg->events[i].kv->mod_revision > v->rev)
            return false;
    }
    return msg->nevents > 0;
}

static void watch_msg(etcd_t *z, const dl_etcd_result_t *res, const dl_etcd_watch_t *r)
{
    if (r->canceled && r->compact_revision == 0) {
        fail(z, 4, "etcd at %s: the watch of %sstate was refused: %s", res->endpoint, z->prefix,
             r->cancel_reason != NULL ? r->cancel_reason : "canceled");
        return;
    }
    if (r->canceled || r->compact_revision > 0) {
        /* Compacted past our view: load it again. */
        dl_etcd_cancel(z->watch);
        z->watch = NULL;
        z->phase = PH_LOAD;
        connect_step(z);
        return;
    }
    z->watch_ok = true;
    if (stale(&z->view, r))
        return;
    int ch = dl_ejob_view_watch(&z->view, r);
    if (ch < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint, z->view.err);
        return;
    }
    if (ch != 0)
        react(z);
}

static void on_watch_msg(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    dl_etcd_watch_t msg;
    if (!reply(z, res, &dl_etcd_watch_type, &msg))
        return;
    watch_msg(z, res, &msg);
    dl_proto_rec_free(&dl_etcd_watch_type, &msg);
}

static void on_watch_done(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    bool was_ok = z->watch_ok;
    z->watch = NULL;
    z->watch_ok = false;
    if (z->closing || z->ended)
        return;
    /* The member we watched on went away: watch again from where the view is, on the next
     * endpoint, at once; only a watch that cannot be set up again is trouble. */
    z->watch_wanted = true;
    if (was_ok && res->status == DL_ETCD_UNREACHABLE) {
        start_watch(z);
        return;
    }
    if (trouble(z, res))
        retry_later(z);
}

static void start_watch(etcd_t *z)
{
    z->watch_wanted = false;
    if (dl_etcd_stream(z->etcd, "/v3/watch", dl_ejob_watch_state(&z->view), on_watch_msg,
                       on_watch_done, z, &z->watch) < 0) {
        z->watch_wanted = true;
        retry_later(z);
    }
}

/* ---- Connecting: lease, the job, its view, the watch ------------------------------------------ */

static void on_created(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    char err[512];
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    dl_etcd_txn_t t;
    dl_ejob_job_rec_t job;
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    bool created = t.succeeded;
    int r = created ? 0 : dl_ejob_txn_rec(&t, 0, &dl_ejob_job_type, &job, err, sizeof(err));
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    if (!created) {
        /* The job exists: its settings must agree with ours. */
        if (r > 0) {
            r = dl_ejob_settings_check(&job, &z->settings, err, sizeof(err));
            dl_proto_rec_free(&dl_ejob_job_type, &job);
        }
        if (r < 0) {
            fail(z, 4, "etcd at %s: %s (job '%s')", res->endpoint, err, z->conf.run_id);
            return;
        }
    } else if (z->spec->verbose) {
        say(z, "created job '%s' in etcd under %s", z->conf.run_id, z->prefix);
    }
    z->phase = PH_LOAD;
    connect_step(z);
}

static void on_loaded(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    dl_etcd_txn_t t;
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    int lr = dl_ejob_view_load_read(&z->view, &t);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    if (lr < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint, z->view.err);
        return;
    }
    untroubled(z);
    z->phase = PH_RUN;
    start_watch(z);
    if (!z->ready_said && dl_ejob_over(&z->view)) {
        /* A job of this run id ended a moment ago; its keys are going (as our rendezvous keeps
         * a finished job for a while, and refuses to join it). */
        fail(z, 4,
             "etcd at %s: join: job '%s' is over (%s); its keys under %s go within %d s, "
             "or give another --run-id",
             res->endpoint, z->conf.run_id, dl_ejob_state_name(&z->view), z->prefix, LINGER_S);
        return;
    }
    if (!z->ready_said) {
        /* The store, before this node can join a round: guarded by the agent's token, else by
         * the key the job keeps (drawn by its first agent). */
        const char *key = z->view.job != NULL ? z->view.job->store_key : NULL;
        char err[512];
        if (z->conf.token == NULL && key != NULL &&
            dl_proto_token_from_string(key, "the job's store key in etcd", &z->store_token, err,
                                       sizeof(err)) < 0) {
            fail(z, 4, "etcd at %s: %s", res->endpoint, err);
            return;
        }
        start_store(z);
        if (z->store == NULL) {
            fail(z, 1, "no key-value store for the workers: a job needs one on its node 0");
            return;
        }
        if (z->spec->http != NULL && start_http(z) < 0)
            return;
        if (z->store_token != NULL && z->cbs.store_token != NULL)
            z->cbs.store_token(z->ctx, z->store_token);
        z->ready_said = true;
        if (z->spec->verbose)
            say(z, "etcd at %s: job '%s' under %s, revision %lld", res->endpoint, z->conf.run_id,
                z->prefix, (long long)z->view.rev);
        z->cbs.ready(z->ctx);
        return;
    }
    react(z);
}

static void connect_step(etcd_t *z)
{
    int r = 0;
    if (z->closing || z->ended)
        return;
    switch (z->phase) {
    case PH_LEASE:
        if (z->lease != 0) {
            z->phase = PH_CREATE;
            connect_step(z);
            return;
        }
        grant(z);
        return;
    case PH_CREATE:
        r = dl_etcd_call(z->etcd, "/v3/kv/txn",
                         dl_ejob_txn_create(z->prefix, &z->settings, now_unix()), on_created, z,
                         NULL);
        break;
    case PH_LOAD:
        /* The settings, the state and this node's own member key: nobody else's. */
        r = dl_etcd_call(z->etcd, "/v3/kv/txn", dl_ejob_txn_read(z->prefix, z->conf.node_id),
                         on_loaded, z, NULL);
        break;
    case PH_RUN:
        if (z->watch_wanted)
            start_watch(z);
        react(z);
        return;
    }
    if (r < 0)
        retry_later(z);
}

/* ---- Transitions ------------------------------------------------------------------------------ */

/* After a transaction that changes the state: decide again once the view holds what it did (or
 * why it failed); until then the watch will bring it, and react runs then. */
static void react_after(etcd_t *z, const dl_etcd_txn_t *answer)
{
    if (answer->succeeded) {
        z->wait_rev = dl_etcd_rev(answer->header);
        z->wait_change = false;
    } else {
        z->wait_rev = z->txn_view_rev;
        z->wait_change = true;
    }
    z->wait_since = mono();
    react(z);
}

/* Whether the view is behind the last transition (see wait_rev). A watch that went quiet does
 * not hold us for more than a few seconds. */
static bool view_behind(etcd_t *z)
{
    if (z->wait_rev == 0)
        return false;
    bool behind = z->wait_change ? z->view.rev <= z->wait_rev : z->view.rev < z->wait_rev;
    if (!behind || mono() - z->wait_since > 5) {
        z->wait_rev = 0;
        return false;
    }
    return true;
}

/* This node's own member document in the view, as its join put it (the view follows no member
 * keys, so it records its own). */
static void note_joined(etcd_t *z, int round)
{
    dl_ejob_view_note_member(&z->view, z->conf.node_id, round, z->conf.want_node_rank);
}

static void on_done_log(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (z->closing)
        return;
    /* A line that did not go in is only a line: the job goes on without it (trouble says
     * etcd's state). */
    if (res->status != DL_ETCD_OK)
        trouble(z, res);
    react(z);
}

static void txn_answered(etcd_t *z, int kind, int round, const dl_etcd_txn_t *t);

static void on_txn(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    int kind = z->txn_kind, round = z->txn_round;
    z->txn_busy = false;
    if (z->closing) {
        if (kind == TXN_DEPART && z->revoke_after_depart)
            revoke_lease(z);
        return;
    }
    if (res->status != DL_ETCD_OK) {
        if (lease_gone(res)) {
            z->lease = 0;
            grant(z);
            return;
        }
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    untroubled(z);
    dl_etcd_txn_t t;
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    txn_answered(z, kind, round, &t);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
}

/* What a transition's answer (t) does. */
static void txn_answered(etcd_t *z, int kind, int round, const dl_etcd_txn_t *t)
{
    bool ok = t->succeeded;
    if (ok && kind == TXN_DEPART) {
        z->departed = true; /* the watch brings the round without us: nothing more for us */
        return;
    }
    /* Done or not (the state moved first: the watch brings it), this report is over. */
    if (kind == TXN_REPORT && z->report_round == round)
        z->report_round = -1;
    if (kind == TXN_DONE && z->done_round == round)
        z->done_round = -1;
    if (ok && (kind == TXN_JOIN || kind == TXN_NEWCOMER)) {
        int joined = kind == TXN_NEWCOMER ? round + 1 : round;
        z->joined_round = joined;
        z->joined_count = dl_ejob_txn_count(t);
        note_joined(z, joined);
    }
    if (ok && kind == TXN_DONE) {
        dl_ejob_view_note_done(&z->view, z->conf.node_id, round);
        z->done_count_round = round;
        z->done_count = dl_ejob_txn_count(t);
        /* The journal's line for it (our rendezvous' "finished: K of N done"), before this
         * node can end the job: react runs on its answer. */
        if (dl_etcd_call(z->etcd, "/v3/kv/put",
                         dl_ejob_put_done_log(&z->view, z->conf.node_id, z->conf.hostname,
                                              z->done_count, z->lease, now_unix()),
                         on_done_log, z, NULL) == 0)
            return;
    }
    if (kind == TXN_CLOSE && ok && z->close_next < json_array_size(z->close_txns)) {
        /* A batch of assignments went in: the next one, or the state that closes the round. */
        json_t *next = json_incref(json_array_get(z->close_txns, z->close_next++));
        if (send_txn(z, next, TXN_CLOSE, round))
            return;
        retry_later(z);
    }
    if (kind == TXN_CLOSE) {
        json_decref(z->close_txns);
        z->close_txns = NULL;
    }
    /* A join or a done leaves the state as it is: nothing to wait for. So does a close that
     * failed: a member joined since the members were read (read them again), or the state
     * moved (the read brings it too). */
    if ((ok && (kind == TXN_JOIN || kind == TXN_DONE)) || (!ok && kind == TXN_CLOSE)) {
        react(z);
        return;
    }
    /* A compare that failed: our view is behind; the watch catches up and react runs again. */
    react_after(z, t);
}

/* Sends a transition (stolen body); at most one is in flight. Returns whether it went. */
static bool send_txn(etcd_t *z, json_t *body, txn_kind_t kind, int round)
{
    if (body == NULL)
        return false;
    z->txn_kind = kind;
    z->txn_round = round;
    z->txn_view_rev = z->view.rev;
    z->txn_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/txn", body, on_txn, z, NULL) < 0) {
        z->txn_busy = false;
        return false;
    }
    return true;
}

static void on_linger_events(void *ctx, const dl_etcd_result_t *res);

static void read_linger_events(etcd_t *z)
{
    z->txn_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/range", dl_ejob_range_events(&z->view), on_linger_events, z,
                     NULL) < 0) {
        z->txn_busy = false;
        if (z->closing)
            revoke_lease(z);
    }
}

static void on_linger_reread(uv_timer_t *t)
{
    etcd_t *z = t->data;
    if (!z->closing && !z->ended)
        read_linger_events(z);
}

/* Ending the job keeps its settings, state and events for LINGER_S on a lease of their own:
 * granted first, the events read (the view does not follow them), then the transition is made
 * from the view as it is then. */
static void on_linger_events(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->txn_busy = false;
    if (z->closing && !z->revoke_after_depart)
        return;
    if (z->closing && res->status != DL_ETCD_OK) {
        revoke_lease(z); /* the departure could not be said: the lease goes anyway */
        return;
    }
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    dl_etcd_range_t evs;
    char err[512];
    int er = dl_etcd_reply(&dl_etcd_range_type, res->body, &evs, err, sizeof(err));
    if (er == 0) {
        er = dl_ejob_view_events(&z->view, &evs);
        dl_proto_rec_free(&dl_etcd_range_type, &evs);
    }
    if (er < 0) {
        if (z->closing) {
            revoke_lease(z);
            return;
        }
        fail(z, 4, "etcd at %s: events under %sev/ this node cannot read", res->endpoint,
             z->prefix);
        return;
    }
    /* A job that succeeded: every node's "finished" line in first (each node puts it just
     * after its done mark, which the end counted), for at most about 2 s. */
    if (z->linger_what == 0 && !z->closing && z->linger_reads < 40 &&
        dl_ejob_done_logs(&z->view, z->txn_round) < dl_ejob_node_count(&z->view)) {
        z->linger_reads++;
        z->txn_busy = true; /* the end is under way: nothing else starts meanwhile */
        uv_timer_start(&z->linger_timer, on_linger_reread, 50, 0);
        return;
    }
    int64_t lease = z->linger_lease;
    json_t *body = z->linger_what == 0
                       ? dl_ejob_txn_end(&z->view, "succeeded", "succeeded", lease, now_unix())
                   : z->linger_what == 2
                       ? dl_ejob_txn_end(&z->view, "timed-out", z->linger_reason, lease, now_unix())
                   : z->linger_what == 3
                       ? dl_ejob_txn_end(&z->view, "stopped", z->linger_reason, lease, now_unix())
                       : dl_ejob_txn_next(&z->view, z->linger_cause, z->linger_reason,
                                          z->linger_culprit, NULL, 0, lease, now_unix());
    if (!send_txn(z, body,
                  z->linger_what == 0   ? TXN_PLAIN
                  : z->linger_what == 3 ? TXN_DEPART
                                        : TXN_REPORT,
                  z->txn_round) &&
        z->closing)
        revoke_lease(z);
}

static void on_linger(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->txn_busy = false;
    if (z->closing && !z->revoke_after_depart)
        return;
    if (z->closing && res->status != DL_ETCD_OK) {
        revoke_lease(z);
        return;
    }
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    dl_etcd_lease_t granted;
    char err[512];
    if (dl_etcd_reply(&dl_etcd_lease_type, res->body, &granted, err, sizeof(err)) < 0) {
        if (z->closing)
            revoke_lease(z);
        else
            fail(z, 4, "etcd at %s: %s", res->endpoint, err);
        return;
    }
    z->linger_lease = granted.ID;
    dl_proto_rec_free(&dl_etcd_lease_type, &granted);
    z->linger_reads = 0;
    read_linger_events(z);
}

static void with_linger(etcd_t *z, int what, dl_ejob_cause_t cause, const char *reason)
{
    z->linger_what = what;
    z->linger_cause = cause;
    snprintf(z->linger_reason, sizeof(z->linger_reason), "%s", reason != NULL ? reason : "");
    z->txn_round = dl_ejob_round(&z->view);
    /* The transition is the departure's (what 3) from the lease's grant on: close() waits. */
    z->txn_kind = what == 3 ? TXN_DEPART : TXN_PLAIN;
    z->txn_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/lease/grant", json_pack("{s:o}", "TTL", dl_etcd_num(LINGER_S)),
                     on_linger, z, NULL) < 0)
        z->txn_busy = false;
}

/* Opens the next round (or fails the job, past its restarts). */
static void next_round(etcd_t *z, dl_ejob_cause_t cause, const char *reason, const json_t *culprit,
                       txn_kind_t kind)
{
    if (dl_ejob_next_fails(&z->view, cause, culprit)) {
        json_decref(z->linger_culprit);
        z->linger_culprit = culprit != NULL ? json_deep_copy(culprit) : NULL;
        with_linger(z, 1, cause, reason);
        return;
    }
    send_txn(z, dl_ejob_txn_next(&z->view, cause, reason, culprit, NULL, 0, 0, now_unix()), kind,
             dl_ejob_round(&z->view));
}

static dl_ejob_member_t my_offer(etcd_t *z)
{
    return (dl_ejob_member_t){.node_id = z->conf.node_id,
                              .host = z->conf.hostname,
                              .addr = z->addr,
                              .store = z->store_addr,
                              .slots = z->join.slots,
                              .node_rank = z->conf.want_node_rank,
                              .master_port =
                                  z->torch_port > 0 ? z->torch_port : z->conf.master_port};
}

/* ---- Timers of the gathering round ------------------------------------------------------------ */

/* What an agent may have to do that every agent sees is due. */
enum { TURN_CLOSE = 1, TURN_TIMEOUT };

static void on_turn(uv_timer_t *t)
{
    etcd_t *z = t->data;
    z->turn_due = true;
    react(z);
}

/* Whether this node should make change `what` of round `round` now, being pos-th in line for it
 * (0: the one whose join made it due): the first in line does at once; the others wait 2 s,
 * and 100 ms more for each one before them (up to 6 s), so that hundreds of agents do not all
 * send the same transaction when one suffices (they see it done through their watch long
 * before; they act only when the first in line does not). */
static bool my_turn(etcd_t *z, int round, int what, int64_t pos)
{
    if (pos <= 0)
        return true;
    if (z->turn_round == round && z->turn_what == what)
        return z->turn_due;
    z->turn_round = round;
    z->turn_what = what;
    z->turn_due = false;
    uv_timer_start(&z->turn_timer, on_turn, 2000 + 100 * (uint64_t)(pos < 40 ? pos : 40), 0);
    return false;
}

static void on_last_call(uv_timer_t *t)
{
    etcd_t *z = t->data;
    z->close_due_round = z->last_call_round;
    react(z);
}

static void on_join_timeout(uv_timer_t *t);

/* The join timeout passed with n members counted in the round. */
static void join_timeout_with(etcd_t *z, int round, int64_t n)
{
    if (n >= z->settings.min_nodes) {
        z->close_due_round = round;
        react(z);
        return;
    }
    char reason[300];
    snprintf(reason, sizeof(reason), "round %d timed out: %lld of %d nodes joined within %g s",
             round, (long long)n, z->settings.min_nodes, z->spec->join_timeout);
    int64_t pos = z->joined_round == round ? z->joined_count - 1 : 40;
    if (z->txn_busy || !my_turn(z, round, TURN_TIMEOUT, pos)) {
        uv_timer_start(&z->join_timer, on_join_timeout, 200, 0);
        return;
    }
    say(z, "%s", reason);
    with_linger(z, 2, DL_EJOB_CAUSE_REQUESTED, reason);
}

static void on_join_count(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    int round = z->join_timer_round;
    z->reading = false;
    if (z->closing || z->ended || dl_ejob_round(&z->view) != round ||
        strcmp(dl_ejob_state_name(&z->view), "gathering") != 0)
        return;
    if (res->status != DL_ETCD_OK) {
        trouble(z, res);
        uv_timer_start(&z->join_timer, on_join_timeout, 200, 0);
        return;
    }
    dl_etcd_range_t joined;
    if (!reply(z, res, &dl_etcd_range_type, &joined))
        return;
    int64_t count = joined.count;
    dl_proto_rec_free(&dl_etcd_range_type, &joined);
    join_timeout_with(z, round, count);
}

static void on_join_timeout(uv_timer_t *t)
{
    etcd_t *z = t->data;
    int round = z->join_timer_round;
    if (z->closing || z->ended || dl_ejob_round(&z->view) != round ||
        strcmp(dl_ejob_state_name(&z->view), "gathering") != 0)
        return;
    if (z->reading) {
        uv_timer_start(&z->join_timer, on_join_timeout, 200, 0);
        return;
    }
    /* The view counts no members: ask etcd how many joined. */
    z->reading = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/range", dl_ejob_range_joined(&z->view, round), on_join_count,
                     z, NULL) < 0) {
        z->reading = false;
        uv_timer_start(&z->join_timer, on_join_timeout, 200, 0);
    }
}

/* ---- Deciding --------------------------------------------------------------------------------- */

static void reset_store(etcd_t *z)
{
    if (z->store != NULL)
        dl_rdzv_server_reset_store(z->store, z->conf.run_id);
}

/* Every member's key, with the settings and the state, into the view: before closing a round,
 * and before asking for a node rank that another member may hold. */
static void on_members(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    int round = dl_ejob_round(&z->view);
    z->reading = false;
    if (z->closing || z->ended)
        return;
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return;
    }
    untroubled(z);
    dl_etcd_txn_t t;
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    /* This node's own done mark, which the read does not bring (the view follows no done key). */
    int64_t done = dl_ejob_done_round(&z->view, z->conf.node_id);
    int lr = dl_ejob_view_load_read(&z->view, &t);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    if (lr >= 0) {
        if (done >= 0)
            dl_ejob_view_note_done(&z->view, z->conf.node_id, done);
        if (dl_ejob_round(&z->view) == round)
            z->members_round = round;
    }
    if (lr < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint, z->view.err);
        return;
    }
    react(z);
}

static void read_members(etcd_t *z)
{
    if (z->reading)
        return;
    z->reading = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/txn", dl_ejob_txn_read(z->prefix, ""), on_members, z, NULL) <
        0) {
        z->reading = false;
        retry_later(z);
    }
}

static void gathering(etcd_t *z, int round)
{
    const dl_ejob_member_rec_t *mine = dl_ejob_member(&z->view, z->conf.node_id);
    int64_t n = z->joined_round == round ? z->joined_count : 0;

    if (z->join_timer_round != round) {
        z->join_timer_round = round;
        uv_timer_start(&z->join_timer, on_join_timeout, (uint64_t)(z->spec->join_timeout * 1000),
                       0);
    }
    if (z->join_wanted && z->lease != 0 &&
        (mine == NULL || mine->round != round || z->joined_round != round)) {
        /* A node rank asked for that another member of the round holds is refused: only then
         * are the other members read before joining. */
        if (z->conf.want_node_rank >= 0 && z->members_round != round) {
            read_members(z);
            return;
        }
        for (size_t i = 0; i < z->view.members.n; i++) {
            const char *id = z->view.members.items[i].key;
            const dl_ejob_member_rec_t *m = z->view.members.items[i].rec;
            if (z->conf.want_node_rank >= 0 && strcmp(id, z->conf.node_id) != 0 &&
                m->round == round && m->has_node_rank && m->node_rank == z->conf.want_node_rank) {
                fail(z, 4, "join: node_rank %d is taken by agent '%s' in round %d",
                     z->conf.want_node_rank, id, round);
                return;
            }
        }
        if (!z->txn_busy) {
            dl_ejob_member_t me = my_offer(z);
            send_txn(z, dl_ejob_txn_join_counted(&z->view, &me, z->lease), TXN_JOIN, round);
        }
        return; /* the answer counts the round's members; then decide on the round */
    }
    /* The rule is the policy's (rdzv-policy.h); n counts the members as this node joined, so
     * one whose last call came due closes the round even where it counted fewer. */
    bool due = z->close_due_round == round;
    dl_rdzv_round_step_t step =
        dl_rdzv_policy_round_step(n > 0 ? (size_t)n : 0, z->settings.min_nodes,
                                  z->settings.max_nodes, z->spec->last_call, due);
    if (step == DL_RDZV_ROUND_GATHER && !due) {
        if (z->last_call_round == round) {
            uv_timer_stop(&z->last_call);
            z->last_call_round = -1;
        }
        return;
    }
    if (step == DL_RDZV_ROUND_LAST_CALL) {
        if (z->last_call_round != round) {
            z->last_call_round = round;
            uv_timer_start(&z->last_call, on_last_call, (uint64_t)(z->spec->last_call * 1000), 0);
        }
        return;
    }
    /* The join that made the count max_nodes closes at once, the one that made it min_nodes at
     * the last call (or the join timeout), the first to join when the join timeout found enough
     * members; the others only if the round is still gathering a while later. */
    int64_t pos = n >= z->settings.max_nodes   ? n - z->settings.max_nodes
                  : n >= z->settings.min_nodes ? n - z->settings.min_nodes
                  : z->joined_round == round   ? z->joined_count - 1
                                               : 40;
    if (z->txn_busy || !my_turn(z, round, TURN_CLOSE, pos))
        return;
    if (z->members_round != round) {
        read_members(z);
        return;
    }
    z->members_round = -1; /* a close that fails reads them again */
    json_decref(z->close_txns);
    z->close_txns = dl_ejob_txn_close(&z->view, now_unix());
    z->close_next = 1;
    if (z->close_txns != NULL &&
        !send_txn(z, json_incref(json_array_get(z->close_txns, 0)), TXN_CLOSE, round)) {
        json_decref(z->close_txns);
        z->close_txns = NULL;
    }
}

/* ---- The ring: who notices a lost node -------------------------------------------------------- */

static void ring_stop(etcd_t *z)
{
    dl_etcd_cancel(z->ring);
    z->ring = NULL;
    z->ring_id[0] = '\0';
    z->ring_round = -1;
    z->ring_wanted = false;
}

static void ring_watch(etcd_t *z);
static void ring_check(etcd_t *z);

/* Watches next_id's member key from the round's start. */
static void ring_follow(etcd_t *z, int round, const char *next_id)
{
    dl_etcd_cancel(z->ring);
    z->ring = NULL;
    z->ring_round = round;
    snprintf(z->ring_id, sizeof(z->ring_id), "%s", next_id);
    ring_watch(z);
    ring_check(z); /* it may be gone already */
}

/* A check's answer (t) about the node this one watches, in round. */
static void ring_checked(etcd_t *z, int round, const dl_etcd_result_t *res, const dl_etcd_txn_t *t)
{
    const dl_etcd_range_t *member = dl_etcd_txn_range(t, 0);
    if (!t->succeeded)
        return; /* the state moved on: the watch brings it */
    if (member != NULL && member->nkvs > 0)
        return; /* alive */
    /* Its assignment: its host and rank (for the culprit), and who comes after it. */
    dl_ejob_assign_rec_t its;
    dl_ejob_done_rec_t d;
    char err[768];
    int dr = 0;
    if (dl_ejob_txn_rec(t, 2, &dl_ejob_assign_type, &its, err, sizeof(err)) < 0 ||
        (dr = dl_ejob_txn_rec(t, 1, &dl_ejob_done_type, &d, err, sizeof(err))) < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint, err);
        dl_proto_rec_free(&dl_ejob_assign_type, &its);
        return;
    }
    snprintf(z->lost_host, sizeof(z->lost_host), "%s", its.host != NULL ? its.host : "");
    z->lost_rank = (int)its.node_rank;
    bool was_done = dr > 0 && d.round == round;
    if (!was_done) {
        dl_proto_rec_free(&dl_ejob_assign_type, &its);
        z->lost_round = round;
        react(z);
        return;
    }
    /* It finished and left: count the done nodes; watch the one after it instead. */
    int64_t count = dl_ejob_txn_count(t);
    if (count > z->done_count || z->done_count_round != round) {
        z->done_count_round = round;
        z->done_count = count;
    }
    const char *next = its.next;
    if (next == NULL || strcmp(next, z->conf.node_id) == 0) {
        dl_etcd_cancel(z->ring);
        z->ring = NULL;
    } else {
        char id[256];
        snprintf(id, sizeof(id), "%s", next);
        ring_follow(z, round, id);
    }
    dl_proto_rec_free(&dl_ejob_assign_type, &its);
    react(z);
}

static void on_ring_check(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    int round = dl_ejob_round(&z->view);
    dl_etcd_txn_t t;
    z->ring_checking = false;
    if (z->closing || z->ended || z->ring_round != round)
        return;
    if (res->status != DL_ETCD_OK) {
        trouble(z, res);
        z->ring_wanted = true; /* checked again with the watch, on the next heartbeat */
        return;
    }
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    ring_checked(z, round, res, &t);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
}

static void ring_check(etcd_t *z)
{
    if (z->ring_checking || z->ring_id[0] == '\0')
        return;
    z->ring_checking = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/txn", dl_ejob_txn_check_member(&z->view, z->ring_id),
                     on_ring_check, z, NULL) < 0) {
        z->ring_checking = false;
        z->ring_wanted = true;
    }
}

static void on_ring_msg(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    dl_etcd_watch_t msg;
    if (!reply(z, res, &dl_etcd_watch_type, &msg))
        return;
    if (msg.nevents > 0)
        ring_check(z);
    else if (msg.canceled) {
        dl_etcd_cancel(z->ring);
        z->ring = NULL;
        z->ring_wanted = true;
    }
    dl_proto_rec_free(&dl_etcd_watch_type, &msg);
}

static void on_ring_done(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->ring = NULL;
    if (z->closing || z->ended || z->ring_id[0] == '\0')
        return;
    /* Watched again (and checked: a deletion may have come in between) at once. */
    ring_watch(z);
    ring_check(z);
}

static void ring_watch(etcd_t *z)
{
    z->ring_wanted = false;
    if (dl_etcd_stream(z->etcd, "/v3/watch",
                       dl_ejob_watch_gone(&z->view, z->ring_id, z->view.state_rev + 1), on_ring_msg,
                       on_ring_done, z, &z->ring) < 0)
        z->ring_wanted = true;
}

/* The assignment of node `me` in the etcd job state, as the frame our own server would send
 * (the state's summary and the node's own key, both read by their tables). */
static dl_proto_assignment_t assignment_of(const dl_ejob_state_rec_t *st,
                                           const dl_ejob_assign_rec_t *me, int round, int nodes)
{
    return (dl_proto_assignment_t){
        .round = round,
        .restart_count = round,
        .nodes = nodes,
        .world_size = st->world_size,
        .has_world_size = st->has_world_size,
        .max_restarts = st->max_restarts,
        .failures = st->restarts,
        .master_port = st->master_port,
        .has_master_port = st->has_master_port,
        .master_addr = st->master_addr,
        .store_addr = st->store_addr,
        .node_rank = me->node_rank,
        .first_rank = me->first_rank,
        .local_world_size = me->slots,
    };
}

/* The round's nodes may reach this node's torch store when it is node 0's: their addresses,
 * as they offered them (every node's assignment, which node 0's agent reads), are the only ones
 * besides loopback let in; any other node's lets in loopback alone. */
static void torch_hosts(etcd_t *z, bool node0)
{
    char err[300] = "out of memory";
    if (z->torch_port <= 0)
        return;
    size_t n = 0, count = 0;
    const dl_ejob_assign_rec_t **nodes =
        node0 ? dl_ejob_assigned_nodes(&z->view, &count) : calloc(1, sizeof(*nodes));
    const char **addrs = nodes != NULL ? calloc(count ? count : 1, sizeof(*addrs)) : NULL;
    for (size_t i = 0; addrs != NULL && i < count; i++) {
        if (nodes[i]->addr != NULL)
            addrs[n++] = nodes[i]->addr;
    }
    if (addrs == NULL || dl_rdzv_server_set_job_hosts(z->store, addrs, n, err, sizeof(err)) < 0)
        say(z, "torch store: other nodes' workers may not reach it: %s", err);
    free(addrs);
    free(nodes);
}

/* The end of an assignment read or check: false when there is nothing more to do with its answer
 * (the agent is going, or etcd failed and the read is tried again later). */
static bool assign_answered(etcd_t *z, const dl_etcd_result_t *res)
{
    z->assign_reading = false;
    if (z->closing || z->ended)
        return false;
    if (res->status != DL_ETCD_OK) {
        if (trouble(z, res))
            retry_later(z);
        return false;
    }
    untroubled(z);
    return true;
}

static void on_assignment(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (!assign_answered(z, res))
        return;
    dl_etcd_range_t range;
    if (!reply(z, res, &dl_etcd_range_type, &range))
        return;
    if (!z->assign_linear && dl_etcd_rev(range.header) < z->view.state_rev) {
        /* The member asked has not applied the round's close yet (another endpoint than the
         * watch's): ask the leader. */
        dl_proto_rec_free(&dl_etcd_range_type, &range);
        z->assign_linear = true;
        react(z);
        return;
    }
    z->assign_linear = false;
    int mr = dl_ejob_view_merge(&z->view, &range);
    dl_proto_rec_free(&dl_etcd_range_type, &range);
    if (mr < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint, z->view.err);
        return;
    }
    if (dl_ejob_assigned(&z->view, z->conf.node_id) == NULL && !z->assign_checked) {
        assign_check(z);
        return;
    }
    z->assign_round = z->txn_round_read;
    z->assign_rev = z->assign_rev_read;
    react(z);
}

static void on_assign_check(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (!assign_answered(z, res))
        return;
    dl_etcd_txn_t t;
    if (!reply(z, res, &dl_etcd_txn_type, &t))
        return;
    const dl_etcd_range_t *range = dl_etcd_txn_range(&t, 0);
    bool ok = t.succeeded;
    int mr = range != NULL ? dl_ejob_view_merge(&z->view, range) : -EPROTO;
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    if (mr < 0) {
        fail(z, 4, "etcd at %s: %s", res->endpoint,
             range == NULL ? "an answer about this node's assignment it cannot read" : z->view.err);
        return;
    }
    z->assign_checked = true;
    if (ok) {
        /* The round is still the view's: no key of ours is the round's word (a newcomer). */
        z->assign_round = z->txn_round_read;
        z->assign_rev = z->assign_rev_read;
    }
    react(z);
}

/* A read found no assignment of ours: before this node takes itself for a newcomer to a full
 * job, ask again in one transaction whether the state is still the one read (a failure that
 * ends the round at once deletes its keys, and the watch may not have brought that yet). */
static void assign_check(etcd_t *z)
{
    z->assign_reading = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/txn", dl_ejob_txn_assignment_check(&z->view, z->conf.node_id),
                     on_assign_check, z, NULL) < 0) {
        z->assign_reading = false;
        retry_later(z);
    }
}

/* Reads this node's assignment in the running round; node 0's agent reads every node's (the
 * addresses its torch store lets in). */
static void read_assignment(etcd_t *z, int round, int64_t rev)
{
    if (z->assign_reading)
        return;
    const char *zero = z->view.state != NULL ? z->view.state->node0 : NULL;
    bool all = z->torch_port > 0 && zero != NULL && strcmp(zero, z->conf.node_id) == 0;
    z->assign_reading = true;
    if (z->txn_round_read != round || z->assign_rev_read != rev)
        z->assign_checked = false;
    z->txn_round_read = round;
    z->assign_rev_read = rev;
    if (dl_etcd_call(
            z->etcd, "/v3/kv/range",
            dl_ejob_range_assignment(&z->view, all ? NULL : z->conf.node_id, !z->assign_linear),
            on_assignment, z, NULL) < 0) {
        z->assign_reading = false;
        retry_later(z);
    }
}

/* The job has its maximum of nodes: a node made again to replace a lost one (a pod with the
 * same index) gets in once the lost one's lease runs out and the round changes (the watch
 * brings that); until then, and at least every second, it looks again, up to --join-timeout. */
static void wait_for_a_place(etcd_t *z, int round)
{
    double now = mono();
    if (z->full_since == 0) {
        z->full_since = now;
        say(z,
            "job '%s' runs round %d with the maximum of %d nodes: waiting for a place (a lost "
            "node's) until --join-timeout (%.0f s)",
            z->conf.run_id, round, z->settings.max_nodes, z->spec->join_timeout);
    }
    if (now - z->full_since >= z->spec->join_timeout) {
        fail(z, 4,
             "join: job '%s' runs round %d with the maximum of %d nodes, not one free within "
             "--join-timeout %g s",
             z->conf.run_id, round, z->settings.max_nodes, z->spec->join_timeout);
        return;
    }
    if (!uv_is_active((uv_handle_t *)&z->retry))
        uv_timer_start(&z->retry, on_retry, 1000, 0);
}

static void running(etcd_t *z, int round)
{
    const dl_ejob_assign_rec_t *me = dl_ejob_assigned(&z->view, z->conf.node_id);
    const dl_ejob_member_rec_t *mine = dl_ejob_member(&z->view, z->conf.node_id);
    int node_count = dl_ejob_node_count(&z->view);
    int64_t assignment = dl_ejob_assignment(&z->view);
    char reason[1400], err[300];

    if (z->join_wanted && me == NULL && assignment > 0 &&
        (z->assign_round != round || z->assign_rev != assignment)) {
        read_assignment(z, round, assignment);
        return;
    }

    if (z->join_wanted && me != NULL && mine != NULL && mine->round == round) {
        dl_rdzv_assignment_t as;
        dl_rdzv_assignment_want_t want = {.slots = z->join.slots,
                                          .min_nodes = z->settings.min_nodes,
                                          .max_nodes = z->settings.max_nodes,
                                          .min_round = z->join.last_round};
        /* Anyone who can write the prefix wrote this: it goes through the same validator as an
         * assignment frame (addresses of address characters only, every number in range), so
         * that such a writer can disturb the job but never put text of its own into the
         * workers' environment. */
        dl_proto_assignment_t rec = assignment_of(z->view.state, me, round, node_count);
        int r = dl_rdzv_assignment_read_rec(&rec, &want, &as, err, sizeof(err));
        if (r < 0) {
            fail(z, 4, "etcd at %s: an assignment this node cannot take: %s",
                 dl_etcd_endpoints(z->etcd), err);
            return;
        }
        z->join_wanted = false;
        z->workers_round = round;
        z->node_rank = as.node_rank;
        torch_hosts(z, as.node_rank == 0);
        /* Node 0's agent serves torch's store at MASTER, as every agent of the job does when
         * it is node 0 (start_store), unless the job keeps the old way (store=worker). */
        as.torch_store = z->torch_port > 0;
        /* Who ended the last round, for a node that took no part in it (its workers' round
         * ended before it read its assignment): its restart event names the culprit too. */
        dl_rdzv_culprit_info_t who;
        dl_rdzv_dec_culprit(z->view.state->culprit, &who);
        z->cbs.assigned(z->ctx, &as, who.cause != NULL ? &who : NULL);
        if (z->closing || z->ended)
            return;
    } else if (z->join_wanted && me == NULL && !z->txn_busy && z->lease != 0) {
        /* A newcomer (or one the round closed without): a new round, with it, if there is room. */
        if (node_count >= z->settings.max_nodes) {
            wait_for_a_place(z, round);
            return;
        }
        z->full_since = 0;
        dl_ejob_member_t off = my_offer(z);
        snprintf(reason, sizeof(reason), "agent '%s' (%s) asked to join", z->conf.node_id,
                 z->conf.hostname);
        send_txn(z,
                 dl_ejob_txn_next_join_counted(&z->view, DL_EJOB_CAUSE_NODE_JOINED, reason, &off,
                                               z->lease, now_unix()),
                 TXN_NEWCOMER, round);
        return;
    }
    /* A member of the round watches the next one's key (see ring_check). */
    if (me != NULL && z->ring_round != round) {
        const char *next = me->next;
        if (next != NULL && strcmp(next, z->conf.node_id) != 0) {
            char id[256];
            snprintf(id, sizeof(id), "%s", next);
            ring_follow(z, round, id);
        }
    } else if (z->ring_wanted && z->ring == NULL && z->ring_id[0] != '\0') {
        ring_watch(z);
        ring_check(z);
    }
    if (z->txn_busy)
        return;
    /* Reports of this node. */
    if (z->report_round == round) {
        next_round(z, z->report_cause, z->report_reason, z->report_culprit, TXN_REPORT);
        return;
    }
    z->report_round = -1;
    if (z->done_round == round && z->lease != 0) {
        if (dl_ejob_done_round(&z->view, z->conf.node_id) != round) {
            send_txn(z, dl_ejob_txn_done_counted(&z->view, z->conf.node_id, z->lease), TXN_DONE,
                     round);
            return;
        }
        z->done_round = -1;
    }
    /* The node this one watches lost its key (its lease expired, or it left) before it was
     * done: lost. */
    if (z->lost_round == round) {
        z->lost_round = -1;
        if (z->ring_id[0] != '\0') {
            snprintf(reason, sizeof(reason),
                     "agent '%s' (%s) was lost: its etcd lease ended (no keepalive within %g s, "
                     "or it left)",
                     z->ring_id, z->lost_host, z->spec->dead_after);
            dl_rdzv_culprit_msg_t lost = DL_RDZV_CULPRIT_NONE;
            lost.node = z->ring_id;
            lost.host = z->lost_host;
            lost.node_rank = z->lost_rank;
            json_t *who = dl_rdzv_enc_culprit(&lost);
            next_round(z, DL_EJOB_CAUSE_NODE_LOST, reason, who, TXN_PLAIN);
            json_decref(who);
            return;
        }
    }
    /* Every node of the round is done (counted by the last one's transaction): the job ends. */
    if (z->done_count_round == round && node_count > 0 && z->done_count >= node_count)
        with_linger(z, 0, DL_EJOB_CAUSE_REQUESTED, NULL);
}

/* This node departs (etcd_leave): from a running round it is a member of, a new round without it
 * when min_nodes others are left that are not done, else the job stopped, as our rendezvous
 * does on QUIT (docs/rendezvous.md); from anywhere else its key going with its lease is all. */
static void depart(etcd_t *z)
{
    const dl_ejob_view_t *v = &z->view;
    if (z->departed || z->txn_busy)
        return; /* a transition in flight: its answer runs react again */
    int round = dl_ejob_round(v);
    if (v->state == NULL || dl_ejob_over(v) || strcmp(dl_ejob_state_name(v), "running") != 0 ||
        z->workers_round != round) {
        z->departed = true;
        return;
    }
    /* The others of the round, less those this node knows are done (the last done count). */
    int left = dl_ejob_node_count(v) - 1;
    bool self_done = dl_ejob_done_round(v, z->conf.node_id) == round;
    if (z->done_count_round == round && z->done_count > 0)
        left -= (int)(z->done_count - (self_done ? 1 : 0));
    if (left < 0)
        left = 0;
    char reason[600];
    if (dl_rdzv_policy_departure_goes_on(left, z->settings.min_nodes)) {
        snprintf(reason, sizeof(reason),
                 "agent '%s' (%s) departed from round %d (%s); %d node%s go on", z->conf.node_id,
                 z->conf.hostname, round, z->depart_reason, left, left == 1 ? "" : "s");
        dl_rdzv_culprit_msg_t gone = DL_RDZV_CULPRIT_NONE;
        gone.node = z->conf.node_id;
        gone.host = z->conf.hostname;
        gone.node_rank = z->node_rank;
        json_t *who = dl_rdzv_enc_culprit(&gone);
        send_txn(z,
                 dl_ejob_txn_next(v, DL_EJOB_CAUSE_NODE_LEFT, reason, who, NULL, 0, 0, now_unix()),
                 TXN_DEPART, round);
        json_decref(who);
        return;
    }
    snprintf(reason, sizeof(reason),
             "agent '%s' (%s) departed from round %d (%s), and %d node%s cannot go on (at least "
             "%d)",
             z->conf.node_id, z->conf.hostname, round, z->depart_reason, left, left == 1 ? "" : "s",
             z->settings.min_nodes);
    say(z, "stopping the job: %s", reason);
    with_linger(z, 3, DL_EJOB_CAUSE_REQUESTED, reason);
}

static void react(etcd_t *z)
{
    if (z->closing || z->ended || z->phase != PH_RUN)
        return;
    if (z->depart_wanted) {
        depart(z);
        return;
    }
    if (z->watch_wanted && z->watch == NULL)
        start_watch(z);
    if (z->lease == 0 && !z->granting)
        grant(z);
    const dl_ejob_view_t *v = &z->view;
    if (v->state == NULL) {
        fail(z, 1, "etcd at %s: the job's keys under %s are gone (deleted by hand?)",
             dl_etcd_endpoints(z->etcd), z->prefix);
        return;
    }
    int round = dl_ejob_round(v);
    const char *state = dl_ejob_state_name(v);
    if (z->ring_round >= 0 && (round != z->ring_round || strcmp(state, "running") != 0))
        ring_stop(z);
    if (dl_ejob_over(v)) {
        const char *reason = v->state->reason;
        const char *failure = v->state->failure;
        char safe_reason[1200], safe_failure[512];
        dl_proto_escape(reason ? reason : state, safe_reason, sizeof(safe_reason));
        if (failure != NULL)
            dl_proto_escape(failure, safe_failure, sizeof(safe_failure));
        int code = dl_ejob_exit_code(v);
        bool stopped = strcmp(state, "stopped") == 0;
        bool failed = strcmp(state, "failed") == 0;
        if (strcmp(state, "succeeded") != 0)
            say(z, "the rendezvous ended the job: %s", safe_reason);
        if (code == 3)
            fprintf(stderr, "dlaunch: %s\n", safe_reason);
        end(z, code,
            stopped     ? "stopped"
            : failed    ? "failed"
            : code == 3 ? "timed_out"
                        : state,
            stopped, failed && failure != NULL ? safe_failure : NULL);
        return;
    }
    if (round > z->seen_round) {
        /* A new round: this node's store starts empty for it (before this node can be in it). */
        z->seen_round = round;
        reset_store(z);
    }
    if (z->workers_round >= 0 && round > z->workers_round) {
        /* Our workers belong to a round that is over. */
        z->workers_round = -1;
        z->done_round = -1;
        z->report_round = -1;
        const char *reason = v->state->reason;
        dl_rdzv_culprit_info_t who;
        dl_rdzv_dec_culprit(v->state->culprit, &who);
        z->cbs.round_changed(z->ctx, round, reason != NULL ? reason : "a new round",
                             who.cause != NULL ? &who : NULL);
        return;
    }
    if (view_behind(z))
        return; /* the watch brings what the last transition did, and react runs again */
    if (strcmp(state, "gathering") == 0)
        gathering(z, round);
    else if (strcmp(state, "running") == 0)
        running(z, round);
}

/* ---- The agent's calls ------------------------------------------------------------------------ */

static void etcd_join(etcd_t *z, const dl_rdzv_join_t *join)
{
    z->join = *join;
    z->join_wanted = true;
    react(z);
}

static void etcd_heartbeat(etcd_t *z, const dl_rdzv_beat_t *beat)
{
    if (z->closing)
        return;
    /* Apart from the keepalive: one slower than --heartbeat must not hold them back. */
    put_report(z, beat);
    read_page(z);
    if (z->lease == 0 || z->keepalive_busy)
        return;
    z->keepalive_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/lease/keepalive",
                     json_pack("{s:o}", "ID", dl_etcd_num(z->lease)), on_keepalive, z, NULL) < 0)
        z->keepalive_busy = false;
    /* A watch that ended and could not start again: try now. */
    if (z->watch == NULL && z->phase == PH_RUN)
        start_watch(z);
    /* The ring's watch or check that failed: again now. */
    if (z->ring_wanted && z->ring_id[0] != '\0' && z->phase == PH_RUN) {
        z->ring_wanted = false;
        if (z->ring == NULL)
            ring_watch(z);
        ring_check(z);
    }
}

/* Where the ranks of a node's report (proto/node-report.h) were, in one line; its length, 0
 * when the report has none or is not one. */
static size_t where_text(const json_t *report, char *buf, size_t len)
{
    char err[256];
    dl_proto_node_report_t rep;
    size_t w = 0;
    if (report == NULL || dl_proto_node_report_decode(report, &rep, err, sizeof(err)) < 0)
        return 0;
    dl_diag_rank_t *ranks = rep.nranks > 0 ? calloc(rep.nranks, sizeof(*ranks)) : NULL;
    if (ranks != NULL) {
        for (size_t i = 0; i < rep.nranks; i++)
            dl_rdzv_report_rank(&rep, i, 0, &ranks[i]);
        w = dl_diag_explain(ranks, rep.nranks, buf, len);
    }
    free(ranks);
    dl_proto_rec_free(&dl_proto_node_report_type, &rep);
    return w;
}

static void on_report_put(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->report_busy = false;
    if (z->closing)
        return;
    /* A put that failed is made again with the next report; trouble says etcd's state. */
    if (res->status != DL_ETCD_OK) {
        trouble(z, res);
        return;
    }
    /* The straggler rule's verdict comes with it, as our server's with a heartbeat's answer. */
    dl_etcd_txn_t t;
    char err[512];
    if (dl_etcd_reply(&dl_etcd_txn_type, res->body, &t, err, sizeof(err)) < 0)
        return; /* no verdict read: the round goes on without one, as without a put */
    json_t *view = dl_ejob_verdict_of(&t, z->workers_round);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    if (view != NULL && z->cbs.view != NULL)
        z->cbs.view(z->ctx, view);
    json_decref(view);
}

static void on_verdict_put(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (res->status != DL_ETCD_OK && !z->closing) {
        trouble(z, res);
        free(z->verdict); /* put again with the next reading */
        z->verdict = NULL;
    }
}

/* Node 0: the reports read, every one new since the last reading is fed to the rule; its
 * verdict is put when it changed. */
static void on_judge_read(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->judge_busy = false;
    if (z->closing || with_range(res, &z->view, dl_ejob_view_reports) < 0)
        return;
    if (z->judge == NULL && dl_rdzv_judge_new(z->conf.run_id, &z->judge) < 0)
        return;
    if (z->judged == NULL && (z->judged = json_object()) == NULL)
        return;
    double now = now_unix();
    for (size_t i = 0; i < z->view.reports.n; i++) {
        const char *id = z->view.reports.items[i].key;
        const dl_ejob_report_rec_t *rep = z->view.reports.items[i].rec;
        int64_t rev = z->view.reports.items[i].rev;
        if (rep->round != z->workers_round ||
            json_integer_value(json_object_get(z->judged, id)) == rev)
            continue;
        char err[256];
        json_t *beat = dl_ejob_report_beat(rep);
        /* A report the rule cannot read is its sender's to say; the others still count. */
        if (beat != NULL)
            (void)dl_rdzv_judge_feed(z->judge, id, beat, now - rep->time, err, sizeof(err));
        json_decref(beat);
        json_object_set_new(z->judged, id, json_integer(rev));
    }
    if (z->verdict_round != z->workers_round) {
        free(z->verdict);
        z->verdict = NULL;
        z->verdict_round = z->workers_round;
    }
    json_t *view = dl_rdzv_judge_view(z->judge);
    char *text = view != NULL ? json_dumps(view, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (text != NULL && (z->verdict == NULL || strcmp(text, z->verdict) != 0)) {
        json_t *body = dl_ejob_put_verdict(&z->view, z->workers_round, view, z->lease);
        if (body != NULL &&
            dl_etcd_call(z->etcd, "/v3/kv/put", body, on_verdict_put, z, NULL) == 0) {
            free(z->verdict);
            z->verdict = text;
            text = NULL;
        }
    }
    free(text);
    json_decref(view);
}

static void judge_read(etcd_t *z)
{
    if (z->node_rank != 0 || z->judge_busy)
        return;
    z->judge_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/range", dl_ejob_range_reports(&z->view), on_judge_read, z,
                     NULL) < 0)
        z->judge_busy = false;
}

/* Node 0's store figures as its server counts them (its snapshot's job, read by the status
 * reply's table): false when this node serves no round's store. */
static bool store_figures(etcd_t *z, dl_ejob_store_rec_t *out)
{
    json_t *snap = NULL;
    dl_proto_status_snapshot_t st;
    char err[256];
    memset(out, 0, sizeof(*out));
    if (z->store == NULL || z->node_rank != 0 || z->workers_round < 0)
        return false;
    z->raw_snapshot = true;
    int r = dl_rdzv_server_snapshot(z->store, &snap);
    z->raw_snapshot = false;
    if (r < 0)
        return false;
    r = dl_proto_rec_decode(&dl_proto_status_snapshot_type, snap, &st, "store snapshot", err,
                            sizeof(err));
    json_decref(snap);
    if (r < 0)
        return false;
    if (st.njobs > 0) {
        const dl_proto_status_job_t *j = &st.jobs[0];
        *out = (dl_ejob_store_rec_t){.keys = j->keys,
                                     .has_keys = j->has_keys,
                                     .store_bytes = j->store_bytes,
                                     .has_store_bytes = j->has_store_bytes,
                                     .store_waits = j->store_waits,
                                     .has_store_waits = j->has_store_waits,
                                     .store_clients = j->store_clients,
                                     .has_store_clients = j->has_store_clients};
    }
    dl_proto_rec_free(&dl_proto_status_snapshot_type, &st);
    return true;
}

/* The heartbeat a server would get, put at n/NODE_ID on this node's lease: what `dlaunch status`
 * and the status page read of this node (its ranks, progress, recoveries, the store). At most
 * every REPORT_S; a report over DL_EJOB_REPORT_MAX goes without its ranks' operations. */
static void put_report(etcd_t *z, const dl_rdzv_beat_t *beat)
{
    /* A job of N nodes puts at most REPORT_NODES_S of them a second. */
    double now = mono(), every = z->spec->heartbeat > REPORT_S ? z->spec->heartbeat : REPORT_S;
    double share = (double)dl_ejob_node_count(&z->view) / REPORT_NODES_S;
    if (share > every)
        every = share;
    if (z->report_busy || z->lease == 0 || z->phase != PH_RUN || z->workers_round < 0 || z->ended ||
        z->departed || z->depart_wanted || (z->report_last > 0 && now - z->report_last < every))
        return;
    dl_rdzv_beat_msg_t m = dl__rdzv_beat_msg(beat, z->workers_round);
    json_t *msg = dl_rdzv_enc_heartbeat(-1, &m), *body = NULL;
    dl_ejob_store_rec_t figures;
    const dl_ejob_store_rec_t *store = store_figures(z, &figures) ? &figures : NULL;
    int r = msg != NULL ? dl_ejob_put_report(&z->view, z->conf.node_id, msg, store, now_unix(),
                                             z->lease, &body)
                        : -ENOMEM;
    if (r == -EMSGSIZE) {
        if (!z->report_cut_said)
            say(z,
                "this node's diagnostics report is over %d bytes: etcd gets it without its "
                "ranks' figures (dlaunch status --ranks lists none of them)",
                DL_EJOB_REPORT_MAX);
        z->report_cut_said = true;
        json_object_del(msg, "diag");
        r = dl_ejob_put_report(&z->view, z->conf.node_id, msg, store, now_unix(), z->lease, &body);
    }
    json_decref(msg);
    if (r < 0)
        return;
    z->report_last = now;
    z->report_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/txn", dl_ejob_txn_report(&z->view, body), on_report_put, z,
                     NULL) < 0)
        z->report_busy = false;
    judge_read(z);
}

static void on_page_read(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    z->page_busy = false;
    if (res->status != DL_ETCD_OK || z->closing)
        return;
    if (with_range(res, &z->page, dl_ejob_view_load) < 0)
        return;
    /* The chart's points: the furthest step any node of the round reports. */
    const dl_ejob_progress_rec_t *best = NULL;
    for (size_t i = 0; i < z->page.reports.n; i++) {
        const dl_ejob_report_rec_t *rep = z->page.reports.items[i].rec;
        const dl_ejob_progress_rec_t *p = rep->progress;
        if (rep->round == dl_ejob_round(&z->page) && p != NULL &&
            (best == NULL || p->step > best->step))
            best = p;
    }
    json_t *progress = best != NULL ? dl_proto_rec_encode(&dl_ejob_progress_type, best) : NULL;
    if (progress != NULL && z->store != NULL)
        dl_rdzv_server_progress(z->store, z->conf.run_id, progress);
    json_decref(progress);
}

/* --http: every key of the job, as `dlaunch status` reads them, at most every PAGE_S. */
static void read_page(etcd_t *z)
{
    /* The reports of a big job are many: as seldom as they are put. */
    double now = mono(), every = (double)dl_ejob_node_count(&z->view) / REPORT_NODES_S;
    if (every < PAGE_S)
        every = PAGE_S;
    if (z->http == NULL || z->page_busy || (z->page_last > 0 && now - z->page_last < every))
        return;
    z->page_last = now;
    z->page_busy = true;
    if (dl_etcd_call(z->etcd, "/v3/kv/range",
                     json_pack("{s:o, s:o}", "key", dl_etcd_b64_str(z->prefix), "range_end",
                               dl_etcd_prefix_end(z->prefix)),
                     on_page_read, z, NULL) < 0)
        z->page_busy = false;
}

/* The status page's job: what `dlaunch status` shows of it (etcd-job.h), over what the store's
 * server knows (its figures, when this node serves the round's store). */
static json_t *page_status(void *ctx, const char *run_id, const json_t *own)
{
    etcd_t *z = ctx;
    double now = now_unix();
    dl_proto_status_job_t st;
    dl_proto_status_failure_t f;
    char err[256];
    json_t *o = NULL;
    (void)own;
    if (z->raw_snapshot || z->page.state == NULL)
        return NULL;
    if (dl_ejob_status_rec(&z->page, run_id, true, now, &st, err, sizeof(err)) < 0)
        return NULL;
    /* What a server's snapshot adds (rendezvous/stats.c): the nodes' last heartbeats as times,
     * the last failure. */
    for (size_t i = 0; i < st.nnodes; i++) {
        st.nodes[i].last_heartbeat = now - st.nodes[i].heartbeat_age;
        st.nodes[i].has_last_heartbeat = true;
    }
    if (dl_ejob_last_failure(&z->page, &f) > 0 &&
        (st.last_failure = malloc(sizeof(*st.last_failure))) != NULL)
        *st.last_failure = f;
    else {
        free(f.peer);
        free(f.reason);
    }
    o = dl_proto_rec_encode(&dl_proto_status_job_type, &st);
    dl_proto_rec_free(&dl_proto_status_job_type, &st);
    return o;
}

/* A victim's failure (its rank gave up waiting in a collective) is put on the rank it waited
 * for, as our rendezvous puts it (rdzv-policy.h's first-failure rule over the same reports):
 * whichever node's failure reaches etcd first, the same culprit. */
static void blame_waited_for(etcd_t *z, int round)
{
    dl_ejob_waited_t w;
    if (dl_ejob_waited_for(&z->view, z->conf.run_id, z->conf.node_id, round, z->explain_diag,
                           now_unix(), z->explain_rank, z->explain_hung, &w) < 0)
        return;
    dl_rdzv_culprit_msg_t who = DL_RDZV_CULPRIT_NONE;
    who.node = w.node;
    who.host = w.host != NULL ? w.host : "";
    who.node_rank = w.node_rank;
    who.rank = w.rank;
    who.hung = true; /* it held the others up: the watchdog's word for it */
    who.step = w.step;
    json_t *c = dl_rdzv_enc_culprit(&who);
    if (c == NULL)
        return;
    json_decref(z->report_culprit);
    z->report_culprit = c;
    char text[sizeof(z->report_reason)];
    snprintf(text, sizeof(text), "rank %d on node %d held up rank %d in a collective; %.1300s",
             w.rank, w.node_rank, z->explain_rank, z->report_reason);
    memcpy(z->report_reason, text, sizeof(text));
}

/* The failure of round waits no more for the others' reports: its text ends with where the
 * ranks were (every node's when read, else this node's alone), and it is reported. */
static void explained(etcd_t *z, int round, bool read)
{
    if (z->explain_round != round)
        return; /* a later failure took its place */
    size_t n = z->explain_at, room = sizeof(z->report_reason) - n - 2;
    char *at = z->report_reason + n + 2;
    size_t w = read ? dl_ejob_explain(&z->view, z->conf.run_id, z->conf.node_id, round,
                                      z->explain_diag, now_unix(), at, room)
                    : where_text(z->explain_diag, at, room);
    if (w > 0)
        memcpy(z->report_reason + n, "; ", 2);
    else
        z->report_reason[n] = '\0';
    if (read)
        blame_waited_for(z, round);
    json_decref(z->explain_diag);
    z->explain_diag = NULL;
    z->explain_round = -1;
    z->report_round = round;
    react(z);
}

static void on_explained(void *ctx, const dl_etcd_result_t *res)
{
    etcd_t *z = ctx;
    if (z->closing)
        return;
    int round = z->explain_round;
    /* Unread (etcd in trouble: it says so), the failure still goes, with this node's ranks. */
    bool read = with_range(res, &z->view, dl_ejob_view_reports) == 0;
    if (res->status != DL_ETCD_OK)
        trouble(z, res);
    explained(z, round, read);
}

static void etcd_report_failure(etcd_t *z, const dl_rdzv_failure_t *f)
{
    z->report_round = f->round;
    z->report_cause = f->excluded ? DL_EJOB_CAUSE_EXCLUDED : DL_EJOB_CAUSE_WORKER_FAILED;
    json_decref(z->report_culprit);
    dl_rdzv_culprit_msg_t who = DL_RDZV_CULPRIT_NONE;
    who.node = z->conf.node_id;
    who.host = z->conf.hostname;
    who.node_rank = z->node_rank;
    who.rank = f->rank;
    if (!f->excluded) {
        who.step = f->step >= 0 ? f->step : -1;
        who.oom = f->oom;
        who.hung = f->hung;
        who.signal = f->hung ? 0 : f->signal;
        who.exit_code = f->exit_code >= 0 ? f->exit_code : 127;
    }
    z->report_culprit = dl_rdzv_enc_culprit(&who);
    int n = snprintf(z->report_reason, sizeof(z->report_reason), "agent '%s' (%s) in round %d: %s",
                     z->conf.node_id, z->conf.hostname, f->round, f->reason);
    /* The round change's text ends with where the ranks were, as the server's does
     * (rendezvous/server.c): every node's, from this node's report and the others' latest
     * (their n/ keys, read now); the failure is reported once they are read. */
    if (!f->excluded && n > 0 && (size_t)n + 32 < sizeof(z->report_reason)) {
        json_decref(z->explain_diag);
        z->explain_diag = f->diag != NULL ? json_deep_copy(f->diag) : NULL;
        z->explain_at = (size_t)n;
        z->explain_round = f->round;
        z->explain_rank = f->rank;
        z->explain_hung = f->hung;
        z->report_round = -1;
        /* Serializable: the member asked answers from what it has (the reports are up to 2 s
         * old anyway), without a round trip to the leader before the failure goes in. */
        json_t *body = dl_ejob_range_reports(&z->view);
        if (body != NULL)
            json_object_set_new(body, "serializable", json_true());
        if (dl_etcd_call(z->etcd, "/v3/kv/range", body, on_explained, z, NULL) == 0)
            return;
        explained(z, f->round, false); /* out of memory: this node's report alone */
        return;
    }
    react(z);
}

static void etcd_node_done(etcd_t *z, int round)
{
    z->done_round = round;
    react(z);
}

static void etcd_sit_out(etcd_t *z)
{
    /* The watch tells this node of the job's end whether it is a member or not. */
    (void)z;
}

static void etcd_leave(etcd_t *z, const char *reason)
{
    /* The departure goes into the job's state now; close() gives the lease back after it. */
    if (z->spec->verbose)
        say(z, "leaving the job (%s): a departure, then this node's etcd lease goes", reason);
    snprintf(z->depart_reason, sizeof(z->depart_reason), "%s", reason != NULL ? reason : "left");
    z->depart_wanted = true;
    react(z);
}

/* ---- Start and close -------------------------------------------------------------------------- */

static void maybe_free(etcd_t *z)
{
    if (z->handles > 0 || z->leaving)
        return;
    dl_ejob_view_clear(&z->view);
    dl_ejob_view_clear(&z->page);
    dl_proto_token_free(z->store_token);
    json_decref(z->report_culprit);
    json_decref(z->explain_diag);
    dl_rdzv_judge_free(z->judge);
    json_decref(z->judged);
    free(z->verdict);
    json_decref(z->linger_culprit);
    json_decref(z->close_txns);
    free(z);
}

static void handle_closed(uv_handle_t *h)
{
    etcd_t *z = h->data;
    z->handles--;
    maybe_free(z);
}

static void close_now(etcd_t *z)
{
    dl_etcd_close(z->etcd);
    z->etcd = NULL;
    z->leaving = false;
    maybe_free(z);
}

static void on_revoked(void *ctx, const dl_etcd_result_t *res)
{
    close_now(ctx);
}

static void revoke_lease(etcd_t *z)
{
    if (dl_etcd_call(z->etcd, "/v3/lease/revoke", json_pack("{s:o}", "ID", dl_etcd_num(z->lease)),
                     on_revoked, z, NULL) < 0)
        close_now(z);
}

static void etcd_close(etcd_t *z)
{
    if (z == NULL)
        return;
    z->closing = true;
    dl_etcd_cancel(z->watch);
    z->watch = NULL;
    ring_stop(z);
    dl_http_close(z->http);
    z->http = NULL;
    dl_rdzv_server_close(z->store, NULL, NULL);
    z->store = NULL;
    uv_handle_t *hs[] = {(uv_handle_t *)&z->last_call, (uv_handle_t *)&z->join_timer,
                         (uv_handle_t *)&z->retry, (uv_handle_t *)&z->turn_timer,
                         (uv_handle_t *)&z->linger_timer};
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
        if (!uv_is_closing(hs[i]))
            uv_close(hs[i], handle_closed);
    /* Give the lease back (its member key goes with it), then let go of etcd; after the
     * departure in flight, if any, so that its key's going reads as no lost node. */
    if (z->etcd != NULL && z->lease != 0) {
        z->leaving = true;
        if (z->txn_busy && z->txn_kind == TXN_DEPART) {
            z->revoke_after_depart = true;
            return;
        }
        revoke_lease(z);
        return;
    }
    close_now(z);
}

/* Where other nodes reach this one: --local-addr, else the address that reaches the first etcd
 * endpoint. */
static void local_address(etcd_t *z)
{
    char host[256];
    const char *ep = z->conf.endpoint;
    if (z->spec->local_addr != NULL) {
        snprintf(z->addr, sizeof(z->addr), "%s", z->spec->local_addr);
        return;
    }
    if (strncmp(ep, "http://", 7) == 0)
        ep += 7;
    else if (strncmp(ep, "https://", 8) == 0)
        ep += 8;
    snprintf(host, sizeof(host), "%.*s", (int)strcspn(ep, ","), ep);
    char *colon = strrchr(host, ':');
    if (colon != NULL)
        *colon = '\0';
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    if (dl_netif_source(host, z->addr, sizeof(z->addr)) < 0)
        snprintf(z->addr, sizeof(z->addr), "127.0.0.1");
}

static void store_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    etcd_t *z = ctx;
    if (level >= DL_RDZV_LOG_INFO || z->spec->verbose)
        fprintf(stderr, "[store%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

/* The store this node serves its job's workers when it is node 0 of a round. */
static void start_store(etcd_t *z)
{
    dl_rdzv_server_opts_t so;
    char err[512], host[300];
    int r;

    snprintf(host, sizeof(host), "%s", z->addr);
    dl_rdzv_server_opts_init(&so);
    so.host = host;
    so.port = 0;
    so.token = z->conf.token != NULL ? z->conf.token : z->store_token;
    so.only_run_id = z->conf.run_id;
    /* torch's store too, on a port of its own: MASTER_PORT when this node is node 0. */
    so.torch_store = !z->spec->store_worker;
    so.torch_host = host;
    so.log = store_log;
    so.log_ctx = z;
    r = dl_rdzv_server_start(z->conf.loop, &so, &z->store, err, sizeof(err));
    if (r == 0) {
        dl_rdzv_job_opts_t jo;
        dl_rdzv_job_opts_init(&jo);
        jo.max_restarts = z->spec->max_restarts;
        r = dl_rdzv_server_add_job(z->store, z->conf.run_id, &jo);
    }
    if (r < 0) {
        say(z, "cannot serve the workers' key-value store on %s: %s", host,
            z->store == NULL ? err : strerror(-r));
        dl_rdzv_server_close(z->store, NULL, NULL);
        z->store = NULL;
        return;
    }
    z->torch_port = so.torch_store ? dl_rdzv_server_torch_port(z->store) : 0;
    snprintf(z->store_addr, sizeof(z->store_addr), "%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", dl_rdzv_server_port(z->store));
}

/* --http: the status page and /metrics of the job as `dlaunch status` shows it, served by this
 * agent beside its store (docs/etcd.md, "Control"). Returns 0, or -errno having ended the job
 * (exit 2) with one line. */
static int start_http(etcd_t *z)
{
    char url[300], err[600];
    dl_rdzv_server_set_status(z->store, page_status, z);
    int r = dl__rdzv_http_start(&z->conf, z->store, &z->http, url, sizeof(url), err, sizeof(err));
    if (r < 0) {
        fail(z, 2, "%s", err);
        return r;
    }
    say(z, "status page and metrics on %s (the job as etcd holds it)", url);
    return 0;
}

static int etcd_start(const dl_rdzv_backend_conf_t *conf, const dl_rdzv_backend_cbs_t *cbs,
                      void *ctx, dl_rdzv_impl_t **ret)
{
    const dl_job_spec_t *spec = conf->spec;
    etcd_t *z = calloc(1, sizeof(*z));
    char err[512], *password = NULL;
    int r;

    *ret = NULL;
    if (z == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 1;
    }
    z->conf = *conf;
    z->spec = spec;
    z->cbs = *cbs;
    z->ctx = ctx;
    z->workers_round = z->report_round = z->done_round = z->explain_round = -1;
    z->node_rank = -1;
    z->seen_round = -1;
    z->last_call_round = z->join_timer_round = z->close_due_round = -1;
    z->settings = (dl_ejob_settings_t){.min_nodes = conf->nodes_min,
                                       .max_nodes = conf->nodes_max,
                                       .max_restarts = spec->max_restarts,
                                       .max_same_failures = spec->max_same_failures,
                                       .last_call = spec->last_call,
                                       .join_timeout = spec->join_timeout,
                                       .dead_after = spec->dead_after,
                                       .master_port = conf->master_port};
    if (dl_ejob_prefix(spec->etcd_prefix, conf->run_id, z->prefix, sizeof(z->prefix)) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-conf prefix: too long\n");
        free(z);
        return 2;
    }
    dl_ejob_view_init(&z->view, z->prefix);
    dl_ejob_view_init(&z->page, z->prefix);
    if ((spec->etcd_user != NULL) != (spec->etcd_password_file != NULL)) {
        fprintf(stderr, "dlaunch: --rdzv-conf: etcd's user and password_file go together\n");
        dl_ejob_view_clear(&z->view);
        dl_ejob_view_clear(&z->page);
        free(z);
        return 2;
    }
    if (spec->etcd_password_file != NULL &&
        dl_etcd_read_password(spec->etcd_password_file, &password, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-conf password_file: %s\n", err);
        dl_ejob_view_clear(&z->view);
        dl_ejob_view_clear(&z->page);
        free(z);
        return 2;
    }
    dl_etcd_opts_t eo = {.endpoints = conf->endpoint,
                         .protocol = spec->etcd_protocol,
                         .cacert = spec->etcd_cacert,
                         .cert = spec->etcd_cert,
                         .key = spec->etcd_key,
                         .user = spec->etcd_user,
                         .password = password,
                         /* etcd answers a request that cannot reach its leader in about 7 s. */
                         .timeout = 8};
    r = dl_etcd_new(conf->loop, &eo, &z->etcd, err, sizeof(err));
    if (password != NULL) {
        memset(password, 0, strlen(password));
        free(password);
    }
    if (r < 0) {
        fprintf(stderr, "dlaunch: --rdzv-endpoint/--rdzv-conf (etcd): %s\n", err);
        dl_ejob_view_clear(&z->view);
        dl_ejob_view_clear(&z->page);
        free(z);
        return 2;
    }
    uv_timer_init(conf->loop, &z->last_call);
    uv_timer_init(conf->loop, &z->join_timer);
    uv_timer_init(conf->loop, &z->retry);
    z->last_call.data = z->join_timer.data = z->retry.data = z;
    uv_timer_init(conf->loop, &z->turn_timer);
    z->turn_timer.data = z;
    uv_timer_init(conf->loop, &z->linger_timer);
    z->linger_timer.data = z;
    z->turn_round = -1;
    z->ring_round = z->lost_round = z->assign_round = -1;
    z->joined_round = z->done_count_round = z->members_round = -1;
    z->handles = 5;
    *ret = z;
    local_address(z);
    /* Without a token of its own, the job's first agent draws the store's key. */
    if (conf->token == NULL) {
        unsigned char rnd[32];
        if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
            fprintf(stderr, "dlaunch: getrandom: %s\n", strerror(errno));
            etcd_close(z);
            *ret = NULL;
            return 1;
        }
        for (size_t i = 0; i < sizeof(rnd); i++)
            snprintf(z->store_key + 2 * i, 3, "%02x", rnd[i]);
        z->settings.store_key = z->store_key;
    }
    if (spec->verbose)
        say(z, "rendezvous in etcd at %s (%s), job keys under %s, this node at %s", conf->endpoint,
            spec->etcd_protocol ? spec->etcd_protocol : "http", z->prefix, z->addr);
    z->phase = PH_LEASE;
    connect_step(z);
    return 0;
}

const dl_rdzv_backend_ops_t dl__rdzv_backend_etcd = {
    .name = "etcd",
    .start = etcd_start,
    .join = etcd_join,
    .heartbeat = etcd_heartbeat,
    .report_failure = etcd_report_failure,
    .node_done = etcd_node_done,
    .sit_out = etcd_sit_out,
    .leave = etcd_leave,
    .close = etcd_close,
};
