/* The agent's side of a job over several nodes, whatever the backend (rdzv-backend.h): picks the
 * backend, heartbeats through it, holds this node's join while it sits out as a straggler, and
 * turns what the backend says into supervisor events. One node alone: the store its workers
 * use. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "internal.h"
#include "rdzv-backend.h"
#include "rendezvous.h"
#include "summary.h"
#include "workercred.h"

typedef struct dl__rdzv_s {
    dl_agent_t *agent;
    const dl_rdzv_backend_ops_t *ops;
    dl_rdzv_impl_t *backend;
    dl_rdzv_server_t *server; /* one node alone: its workers' store */
    dl_proto_token_t *token;
    /* The master the workers' key was made from (the agent's token, or the store key an etcd
     * job keeps), to make a fresh one at each restart: a key made from a master ends, and a job
     * run with the master must not. NULL when the agent holds a job key. */
    dl_proto_token_t *worker_key_from;
    uv_timer_t heartbeat;
    bool heartbeat_open;
    bool quit;  /* said leave at the agent's stop signal */
    bool ready; /* the backend said ready once: the supervisor has been started */
    char node_id[300];
    char hostname[256];
    /* Diagnostics (inspect.c): the last round change's reason for the restart event, and while
     * this node sits out as a straggler, the join it holds back. */
    char last_reason[1024];
    json_t *last_failure; /* its culprit, as the restart event's reason; NULL when none */
    bool join_held;
    /* Whether a round was assigned yet, and the restarts it said were spent: joins carry them, so
     * that a restarted rendezvous goes on counting. */
    bool assigned;
    int spent;
} rdzv_t;

static void server_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    dl_agent_t *a = ctx;
    if (level >= DL_RDZV_LOG_INFO || a->spec->verbose)
        fprintf(stderr, "[rdzv%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

void dl__rdzv_join(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    double wait;

    if (dl__diag_excluded(a, &wait)) {
        if (!z->join_held) {
            dl__agent_log(a,
                          "this node sits out as a straggler: joining again in %.0f s, unless "
                          "the job ends first",
                          wait);
            /* No longer a member, it would not hear of the job's end: the backend tells it. */
            z->ops->sit_out(z->backend);
        }
        z->join_held = true;
        return;
    }
    z->join_held = false;
    dl_rdzv_join_t j = {.slots = a->nworkers,
                        .last_round = a->round,
                        .assigned = z->assigned,
                        .failures = z->spent};
    z->ops->join(z->backend, &j);
}

void dl__rdzv_report(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    const dl_sup_failure_t *f = &a->sup.first_failure;
    char reason[400];
    int local = f->rank - (a->nworkers > 0 ? a->workers[0].rank : 0);

    if (a->report_reason[0] != '\0')
        snprintf(reason, sizeof(reason), "%.300s on %.90s", a->report_reason, z->hostname);
    else if (f->hung)
        snprintf(reason, sizeof(reason), "rank %d on %s hung (no health beat in time)", f->rank,
                 z->hostname);
    else if (f->oom) {
        char what[200];
        dl_oom_text(f->mem_peak, f->mem_limit, what, sizeof(what));
        snprintf(reason, sizeof(reason), "rank %d on %.90s was killed by the OOM killer (%.200s)",
                 f->rank, z->hostname, what);
    } else if (f->signal > 0)
        snprintf(reason, sizeof(reason), "rank %d on %s was killed by %s", f->rank, z->hostname,
                 dl_signal_name(f->signal));
    else if (f->spawn_errno > 0)
        snprintf(reason, sizeof(reason), "rank %d on %s could not be started: %s", f->rank,
                 z->hostname, strerror(f->spawn_errno));
    else
        snprintf(reason, sizeof(reason), "rank %d on %s exited with code %d", f->rank, z->hostname,
                 f->exit_code);
    dl_rdzv_failure_t rep = {.round = a->round,
                             .rank = f->rank,
                             .local_rank = local,
                             .exit_code = f->exit_code,
                             .signal = f->signal,
                             .hung = f->hung,
                             .oom = f->oom,
                             .step = dl__agent_attempt_step(a),
                             .reason = reason,
                             .time = f->time};
    /* The end of its stderr (else of its stdout), for the status page; the agent's summary
     * shows the same lines. */
    char path[sizeof(a->attempt_dir) + 32], tail[4096];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/rank_%d.%s", a->attempt_dir, f->rank, i ? "out" : "err");
        if (dl_summary_tail(path, 20, tail, sizeof(tail)) > 0) {
            rep.log_tail = tail;
            break;
        }
    }
    /* Where this node's ranks were: the rendezvous makes the job-wide account of it. */
    rep.diag = dl__diag_failure_report(a);
    z->ops->report_failure(z->backend, &rep);
    json_decref(rep.diag);
    a->report_reason[0] = '\0';
}

void dl__rdzv_exclude(dl_agent_t *a, int rank, const char *reason)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL || z->backend == NULL)
        return;
    dl_rdzv_failure_t rep = {.round = a->round,
                             .rank = rank,
                             .excluded = true,
                             .step = -1,
                             .reason = reason,
                             .time = dl__now_unix()};
    z->ops->report_failure(z->backend, &rep);
}

void dl__rdzv_node_done(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    z->ops->node_done(z->backend, a->round);
}

static void on_heartbeat(uv_timer_t *t)
{
    rdzv_t *z = t->data;
    dl_agent_t *a = z->agent;
    double wait;
    if (z->join_held) {
        /* Sitting out: join once the cool-down is over. */
        if (!dl__diag_excluded(a, &wait))
            dl__rdzv_join(a);
        return;
    }
    dl_rdzv_beat_t beat = {.round = a->round, .loss = NAN, .samples_per_s = NAN};
    /* The progress hook: whatever fills a->progress, the rendezvous gets it with the beat. */
    dl__agent_progress_poll(a);
    if (a->progress_valid) {
        beat.has_progress = true;
        beat.step = a->progress.step;
        beat.loss = a->progress.loss;
        beat.samples_per_s = a->progress.samples_per_s;
    }
    /* In-job recovery: how many, whether one is under way (`dlaunch status`). */
    beat.recovery = dl__rec_status(a);
    /* This node's figures and its ranks' last operations: the job-wide view is made of them. */
    if (a->sup.phase == DL_SUP_RUNNING)
        beat.diag = dl__diag_report(a);
    z->ops->heartbeat(z->backend, &beat);
    json_decref(beat.diag);
    json_decref(beat.recovery);
}

/* ---- What the backend says ------------------------------------------------------------------ */

static void cb_ready(void *ctx)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    if (z->ready)
        return;
    z->ready = true;
    uint64_t every = (uint64_t)(a->spec->heartbeat * 1000);
    uv_timer_start(&z->heartbeat, on_heartbeat, every, every);
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_START});
}

/* The restart event's reason on several nodes, in the one-node event's terms
 * ({rank, attempt, exit_code | signal | hung}) plus where: the culprit's node, its node rank and
 * the cause. */
static json_t *culprit_reason(const json_t *c, int attempt)
{
    json_t *o = c != NULL ? json_deep_copy(c) : json_pack("{s:s}", "cause", "requested");
    if (o != NULL)
        json_object_set_new(o, "attempt", json_integer(attempt));
    return o;
}

/* The culprit in the restart event's terms (docs/events.md): the one encoder's object, with the
 * signal named as the one-node event names it, and without the account, step or OOM mark (the
 * event says those apart). */
static json_t *culprit_json(const dl_rdzv_culprit_t *c)
{
    dl_rdzv_culprit_t e = *c;
    if (e.cause == NULL)
        e.cause = "requested";
    e.text = NULL;
    e.step = -1;
    e.oom = false;
    json_t *o = dl_rdzv_enc_culprit(&e);
    if (o != NULL && !e.hung && e.signal > 0)
        json_object_set_new(o, "signal", json_string(dl_signal_name(e.signal)));
    return o;
}

static void cb_assigned(void *ctx, const dl_rdzv_assignment_t *as, const dl_rdzv_culprit_t *culprit)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    /* A node cut off from the rendezvous when the round ended heard no round change, only that
     * it lost the rendezvous: the round's own culprit (the cut-off node itself, as often as
     * not) is the one its restart event names, as every other node's does. */
    const char *seen = json_string_value(json_object_get(z->last_failure, "cause"));
    if (culprit != NULL && (seen == NULL || strcmp(seen, "rendezvous_lost") == 0)) {
        json_decref(z->last_failure);
        z->last_failure = culprit_json(culprit);
    }
    int first = as->first_rank, local = as->local_world_size, restarts = as->restart_count;

    a->round = as->round;
    z->assigned = true;
    z->spent = as->failures;
    a->restarts_spent = as->failures;
    a->node_rank = as->node_rank;
    a->nnodes = as->nodes;
    a->world_size = as->world_size;
    a->master_port = as->master_port;
    /* The rendezvous serves torch's store at MASTER: the agent hosting it (rdzv-tcp.c), dlaunchd
     * when it says so, and with etcd node 0's agent (rdzv-etcd.c). */
    a->agent_store = !a->spec->store_worker && (as->torch_store || as->host_node_rank >= 0);
    if (!a->spec->store_worker && !a->agent_store && !a->spec->quiet)
        dl__agent_log(a,
                      "round %d: the rendezvous serves no torch store for this job: the "
                      "workers' rank 0 hosts it at %s:%d",
                      as->round, as->master_addr, as->master_port);
    snprintf(a->store_addr, sizeof(a->store_addr), "%s", as->store_addr);
    snprintf(a->master_addr, sizeof(a->master_addr), "%s", as->master_addr);
    if (dl__agent_set_ranks(a, first, local) < 0) {
        dl__agent_log(a, "out of memory");
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = 1});
        return;
    }
    a->sup.nworkers = local;
    if (!a->spec->quiet)
        dl__agent_log(a, "round %d: node rank %d of %d on %s, ranks %d..%d of %d", a->round,
                      a->node_rank, a->nnodes, z->hostname, first, first + local - 1,
                      a->world_size);
    /* Workers kept into this round (in-job recovery): a recovery event says it, not this. */
    if (restarts > 0 && !a->sup.awaiting) {
        /* The round change's text: the failure and, for a hang, where the ranks were. */
        dl_ev_restart(
            a->events, dl__now_unix(),
            &(dl_ev_restart_t){.attempt = restarts,
                               .round = a->round,
                               .has_round = true,
                               .reason = culprit_reason(z->last_failure, restarts - 1),
                               .diagnosis = z->last_reason[0] != '\0' ? z->last_reason : NULL});
    }
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ASSIGNED, .attempt = restarts});
}

static void cb_round_changed(void *ctx, int round, const char *reason,
                             const dl_rdzv_culprit_t *culprit)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    char safe[1200];
    snprintf(z->last_reason, sizeof(z->last_reason), "%s", reason);
    json_decref(z->last_failure);
    z->last_failure = culprit != NULL ? culprit_json(culprit) : NULL;
    bool keep = dl__rec_keepable(a);
    dl_proto_escape(reason, safe, sizeof(safe));
    snprintf(a->rec_reason, sizeof(a->rec_reason), "%.590s", safe);
    dl__agent_log(a, "round %d: %s; %s", round, safe,
                  keep ? "this node's workers stay (in-job recovery)"
                       : "restarting this node's workers");
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED, .recoverable = keep});
}

static void cb_lost(void *ctx, const char *why, const dl_rdzv_culprit_t *culprit)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    /* The next attempt's restart event says why, as a round change would have. */
    snprintf(z->last_reason, sizeof(z->last_reason), "%s", why);
    json_decref(z->last_failure);
    z->last_failure =
        culprit != NULL ? culprit_json(culprit) : json_pack("{s:s}", "cause", "rendezvous_lost");
    /* A rendezvous lost with its node (named) is a lost node: the next round, at a successor
     * that adopts the job's round and restarts, is a round change like any other, and the
     * living workers stay through it in-job (docs/recovery.md). Any other loss (a handover, a
     * rendezvous that misbehaved, dlaunchd) restarts them. */
    bool keep = culprit != NULL && dl__rec_keepable(a);
    char safe[1200];
    dl_proto_escape(why, safe, sizeof(safe));
    if (culprit != NULL)
        snprintf(a->rec_reason, sizeof(a->rec_reason),
                 "node rank %d (%.200s), the rendezvous's host, %s: %.300s", culprit->node_rank,
                 culprit->host != NULL ? culprit->host : "?",
                 culprit->cause != NULL && strcmp(culprit->cause, "node_left") == 0 ? "departed"
                                                                                    : "was lost",
                 safe);
    else
        snprintf(a->rec_reason, sizeof(a->rec_reason), "%.590s", safe);
    if (a->sup.phase == DL_SUP_RUNNING)
        dl__agent_log(a, "%s",
                      keep ? "this node's workers stay (in-job recovery)"
                           : "restarting this node's workers");
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_ROUND_CHANGED, .recoverable = keep});
}

static void cb_moved(void *ctx, const char *host, int port, bool hosting, double took_s)
{
    dl_agent_t *a = ctx;
    dl_ev_failover(
        a->events, dl__now_unix(),
        &(dl_ev_failover_t){.host = host, .port = port, .hosting = hosting, .took_s = took_s});
}

static void cb_view(void *ctx, const json_t *view)
{
    dl_agent_t *a = ctx;
    if (a->sup.phase == DL_SUP_RUNNING)
        dl__diag_on_view(a, view);
}

static void cb_ended(void *ctx, const dl_rdzv_end_t *e)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    if (z->join_held) {
        dl__agent_log(a, "the job ended (%s) while this node sat out as a straggler", e->status);
        z->join_held = false;
    }
    if (e->failure != NULL)
        snprintf(a->failure_text, sizeof(a->failure_text), "%s", e->failure);
    if (e->stopped)
        a->stopped_by_request = true;
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_JOB_END, .exit_code = e->exit_code});
    /* After the supervisor's SIGTERM, so that the workers exit as stopped, not as failed. */
    if (e->exit_code != 0 && !e->stopped)
        dl__rec_job_failed(a);
}

static void cb_log(void *ctx, const char *text)
{
    dl__agent_log(ctx, "%s", text);
}

static void cb_store_token(void *ctx, const dl_proto_token_t *token)
{
    dl_agent_t *a = ctx;
    rdzv_t *z = a->rdzv;
    char err[512], note[1100];
    if (a->token_path != NULL)
        return; /* the agent's own token made it already */
    if (dl__worker_cred_write(token, a->run_id, &a->token_path, note, sizeof(note), err,
                              sizeof(err)) < 0)
        dl__agent_log(a, "the workers get no key to the store: %s", err);
    else if (note[0] != '\0')
        dl__agent_log(a, "%s", note);
    if (a->token_path != NULL && dl_proto_token_kind(token) == DL_PROTO_TOKEN_MASTER &&
        z->worker_key_from == NULL && dl_proto_token_copy(token, &z->worker_key_from) < 0)
        dl__agent_log(a, "out of memory: the workers' key is not renewed at restarts");
}

/* The agent's token: a master, or this job's key. Its workers get the job's worker key in a
 * file of their own (DLAUNCH_TOKEN_FILE), never the token itself. */
static int load_token(dl_agent_t *a, rdzv_t *z)
{
    char err[512];
    const char *env = dl_env_get(a->environ_list, "DLAUNCH_TOKEN");
    int r = dl_proto_token_load(a->spec->token_file, env, &z->token, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return r;
    }
    if (z->token == NULL)
        return 0;
    const char *where = a->spec->token_file != NULL ? a->spec->token_file : "DLAUNCH_TOKEN";
    if (dl_proto_token_kind(z->token) == DL_PROTO_TOKEN_WORKER) {
        fprintf(stderr,
                "dlaunch: %s: a worker key reaches a job's store only; an agent needs "
                "the job's key or the rendezvous' token\n",
                where);
        return -EPERM;
    }
    if (!dl_proto_token_may(z->token, a->run_id, DL_PROTO_ROLE_AGENT)) {
        fprintf(stderr, "dlaunch: %s: the key of job '%s' cannot run job '%s' (--run-id)\n", where,
                dl_proto_token_run_id(z->token), a->run_id);
        return -EPERM;
    }
    char note[1100];
    r = dl__worker_cred_write(z->token, a->run_id, &a->token_path, note, sizeof(note), err,
                              sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return r;
    }
    if (note[0] != '\0')
        fprintf(stderr, "dlaunch: warning: %s\n", note);
    if (dl_proto_token_kind(z->token) == DL_PROTO_TOKEN_MASTER)
        z->worker_key_from = z->token; /* freed with z->token */
    /* The token stays in our memory and maybe in our environment: a worker of ours (same
     * user) must not read it from /proc/PPID/environ or /proc/PPID/mem. Not dumpable makes
     * those files root's; workers are dumpable again after their execve. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        fprintf(stderr,
                "dlaunch: warning: cannot hide the token from our workers "
                "(PR_SET_DUMPABLE): %s\n",
                strerror(errno));
    return 0;
}

static rdzv_t *rdzv_new(dl_agent_t *a)
{
    rdzv_t *z = calloc(1, sizeof(*z));
    if (z == NULL)
        return NULL;
    a->rdzv = z;
    z->agent = a;
    if (gethostname(z->hostname, sizeof(z->hostname)) < 0)
        snprintf(z->hostname, sizeof(z->hostname), "localhost");
    snprintf(z->node_id, sizeof(z->node_id), "%s-%d", z->hostname, (int)getpid());
    return z;
}

int dl__rdzv_start(dl_agent_t *a)
{
    static const dl_rdzv_backend_cbs_t cbs = {
        .ready = cb_ready,
        .assigned = cb_assigned,
        .round_changed = cb_round_changed,
        .lost = cb_lost,
        .moved = cb_moved,
        .view = cb_view,
        .ended = cb_ended,
        .log = cb_log,
        .store_token = cb_store_token,
    };
    rdzv_t *z = rdzv_new(a);

    if (z == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 1;
    }
    z->ops = a->spec->rdzv_backend == DL_RDZV_ETCD ? &dl__rdzv_backend_etcd : &dl__rdzv_backend_tcp;
    if (load_token(a, z) < 0)
        return 2;
    uv_timer_init(&a->loop, &z->heartbeat);
    z->heartbeat.data = z;
    z->heartbeat_open = true;
    dl_rdzv_backend_conf_t conf = {
        .loop = &a->loop,
        .spec = a->spec,
        .run_id = a->run_id,
        .endpoint = a->endpoint,
        .token = z->token,
        .hostname = z->hostname,
        .node_id = z->node_id,
        .nodes_min = a->nodes_min,
        .nodes_max = a->nodes_max,
        .want_node_rank = a->want_node_rank,
        .master_port = a->master_port,
    };
    return z->ops->start(&conf, &cbs, a, &z->backend);
}

int dl__rdzv_local_store(dl_agent_t *a)
{
    rdzv_t *z = rdzv_new(a);
    dl_rdzv_server_opts_t so;
    char err[256];
    int r;

    if (z == NULL)
        return 1;
    /* The job's token guards its store as it would its rendezvous; without one, the store
     * serves this user only. */
    if (load_token(a, z) < 0)
        return 2;
    dl_rdzv_server_opts_init(&so);
    so.token = z->token;
    so.only_run_id = a->run_id;
    so.store_only = true;
    so.torch_store = !a->spec->store_worker;
    /* --master-port when given; else the kernel's pick, held from the bind on (a port found
     * free earlier may be taken by now). */
    so.torch_port = a->spec->master_port > 0 ? a->master_port : 0;
    so.log = server_log;
    so.log_ctx = a;
    r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, sizeof(err));
    if (r < 0 && so.torch_store) {
        /* MASTER_PORT taken (--master-port names a busy one): the workers keep DLAUNCH_STORE
         * and rank 0 hosts torch's store, as with store=worker, saying so. */
        dl__agent_log(a, "torch store not served, rank 0 hosts it: %s", err);
        so.torch_store = false;
        r = dl_rdzv_server_start(&a->loop, &so, &z->server, err, sizeof(err));
    }
    if (r == 0) {
        dl_rdzv_job_opts_t jo;
        dl_rdzv_job_opts_init(&jo);
        jo.max_restarts = a->spec->max_restarts;
        r = dl_rdzv_server_add_job(z->server, a->run_id, &jo);
    }
    if (r < 0) {
        dl__agent_log(a, "no key-value store for the workers (DLAUNCH_STORE unset): %s",
                      z->server == NULL ? err : strerror(-r));
        return 0;
    }
    snprintf(a->store_addr, sizeof(a->store_addr), "127.0.0.1:%d", dl_rdzv_server_port(z->server));
    int torch_port = dl_rdzv_server_torch_port(z->server);
    a->agent_store = torch_port > 0;
    if (a->agent_store)
        a->master_port = torch_port;
    return 0;
}

void dl__rdzv_renew_worker_key(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    char err[512], note[1100];
    if (z == NULL || z->worker_key_from == NULL || a->token_path == NULL)
        return;
    /* The workers already running keep what they read; those about to start read the new one. */
    if (dl__worker_cred_write(z->worker_key_from, a->run_id, &a->token_path, note, sizeof(note),
                              err, sizeof(err)) < 0)
        dl__agent_log(a, "the workers' key is not renewed (the old one serves until it ends): %s",
                      err);
}

void dl__rdzv_local_store_reset(dl_agent_t *a)
{
    if (a->rdzv != NULL && a->rdzv->server != NULL)
        dl_rdzv_server_reset_store(a->rdzv->server, a->run_id);
}

void dl__rdzv_quit(dl_agent_t *a, int signum)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL || z->backend == NULL || z->quit)
        return;
    z->quit = true;
    z->ops->leave(z->backend, dl_signal_name(signum));
}

void dl__rdzv_finish(dl_agent_t *a, int exit_code)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL)
        return;
    if (z->backend != NULL && exit_code >= 128 && !z->quit)
        z->ops->leave(z->backend, dl_signal_name(exit_code - 128));
    if (z->heartbeat_open) {
        uv_close((uv_handle_t *)&z->heartbeat, NULL);
        z->heartbeat_open = false;
    }
    if (z->backend != NULL)
        z->ops->close(z->backend);
    z->backend = NULL;
    dl_rdzv_server_close(z->server, NULL, NULL);
    z->server = NULL;
}

void dl__rdzv_free(dl_agent_t *a)
{
    rdzv_t *z = a->rdzv;
    if (z == NULL)
        return;
    dl__worker_cred_remove(a->token_path);
    if (z->worker_key_from != z->token)
        dl_proto_token_free(z->worker_key_from);
    dl_proto_token_free(z->token);
    json_decref(z->last_failure);
    free(z);
    a->rdzv = NULL;
}
