/* What the control subcommands of dlaunch do: status, stop, restart (against dlaunchd or an
 * embedded rendezvous), events, kv (the job's key-value store, for shell workers), token (a job's
 * key, made from the rendezvous' token) and revoke (withdraw a run's keys issued so far). Each is
 * one blocking request; exit codes follow docs/exit-codes.md. Their options and help are the
 * table in ctl-commands.c. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "ctl-etcd.h"
#include "ctl-internal.h"
#include "ctl.h"
#include "rendezvous.h"
#include "status-reply.h"

typedef struct dl_ctl_opts_s ctl_opts_t;

int dl__ctl_usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "dlaunch: %s\n", msg);
    return 2;
}

/* Exit code for a failed connection or call. */
static int code_of(int r)
{
    if (r == -EACCES || r == -EPROTO)
        return 4;
    if (r == -ETIMEDOUT || r == -ECONNREFUSED || r == -EHOSTUNREACH || r == -ENETUNREACH)
        return 3;
    return 1;
}

static int load_token(const char *file, const char *file_env, dl_proto_token_t **ret)
{
    char err[512];
    int r = dl_proto_token_load(file != NULL ? file : file_env, getenv("DLAUNCH_TOKEN"), ret, err,
                                sizeof(err));
    if (r < 0)
        fprintf(stderr, "dlaunch: %s\n", err);
    return r;
}

static int connect_as(const char *endpoint, const char *where, dl_proto_role_t role,
                      const char *run_id, const char *token_file, double timeout,
                      dl_rdzv_sync_t **ret)
{
    char host[256], err[512];
    int port;
    dl_proto_token_t *token;

    if (dl_rdzv_endpoint_parse(endpoint, host, sizeof(host), &port) < 0)
        return dl__ctl_usage_error("%s is not HOST:PORT", where);
    if (!dl_proto_run_id_valid(run_id))
        return dl__ctl_usage_error("'%s' is not a run id (letters, digits, '.', '_', ':', '-')",
                                   run_id);
    if (load_token(token_file, getenv("DLAUNCH_TOKEN_FILE"), &token) < 0)
        return 2;
    int r = dl_rdzv_sync_connect(host, port, role, run_id, token, timeout, ret, err, sizeof(err));
    dl_proto_token_free(token);
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return code_of(r);
    }
    return 0;
}

/* Sends msg and checks the answer; *ret_result gets the reply (new reference). */
static int call(dl_rdzv_sync_t *c, json_t *msg, double timeout, json_t **ret_reply)
{
    char err[512];
    const char *why = NULL;
    /* A kv wait that timed out was answered: its keys are missing (exit 1), which is no failure
     * to reach the rendezvous (exit 3). The call takes msg, so look first. */
    bool waited = strcmp(dl_proto_get_str(msg, "type"), "kv_wait") == 0;
    int r = dl_rdzv_sync_call(c, msg, timeout, ret_reply, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return code_of(r);
    }
    dl_proto_errcode_t code = dl_proto_reply_error(*ret_reply, &why);
    if (code != DL_PROTO_E_NONE) {
        char safe[1200];
        fprintf(stderr, "dlaunch: %s\n",
                dl_proto_escape(why ? why : dl_proto_errcode_name(code), safe, sizeof(safe)));
        json_decref(*ret_reply);
        *ret_reply = NULL;
        return code == DL_PROTO_E_AUTH_FAILED || code == DL_PROTO_E_FORBIDDEN ? 4
               : code == DL_PROTO_E_TIMEOUT && !waited                        ? 3
                                                                              : 1;
    }
    return 0;
}

static const char *control_endpoint(const ctl_opts_t *o, const char **where)
{
    const char *e = o->endpoint;
    *where = "--endpoint";
    if (e == NULL && (e = getenv("DLAUNCH_ENDPOINT")) != NULL && *e != '\0')
        *where = "DLAUNCH_ENDPOINT";
    if (e == NULL || *e == '\0') {
        e = "127.0.0.1:29400";
        *where = "the default endpoint";
    }
    return e;
}

static void print_diag(const dl_proto_status_job_t *job);
/* A name, host or failure from the server, made safe for a terminal: they come from peers. */
static const char *safe(const char *s, char *buf, size_t len)
{
    return dl_proto_escape(s, buf, len);
}

static void print_job(const dl_proto_status_job_t *job)
{
    char run_id[600], state[600], text[4200], node_id[1100], host[1100];
    printf("%s: %s, round %lld, restarts %lld of %lld, nodes %lld..%lld, world size %lld\n",
           safe(job->run_id, run_id, sizeof(run_id)), safe(job->state, state, sizeof(state)),
           job->round, job->restarts, job->max_restarts, job->min_nodes, job->max_nodes,
           job->world_size);
    if (job->failure != NULL)
        printf("  failure: %s\n", safe(job->failure, text, sizeof(text)));
    /* An etcd job's store is in node 0's agent, and its answer has no figures: no line of
     * zeros that would read as an empty store. */
    if (job->has_keys) {
        long long keys = job->keys, bytes = job->store_bytes, waits = job->store_waits;
        printf("  store: %lld key%s, %lld byte%s, %lld wait%s", keys, keys == 1 ? "" : "s", bytes,
               bytes == 1 ? "" : "s", waits, waits == 1 ? "" : "s");
        if (job->has_store_clients)
            printf(", %lld torch client%s", job->store_clients, job->store_clients == 1 ? "" : "s");
        printf("\n");
    }
    /* In-job recovery (docs/recovery.md): each is one of the restarts above. */
    const dl_proto_status_recovery_t *rec = job->recovery;
    if (rec != NULL) {
        printf("  in-job recoveries: %lld", rec->recoveries);
        if (rec->recovering)
            printf(", one under way");
        else if (rec->has_step)
            printf("; the last went on at step %lld, %.0f ms after the round changed, with no "
                   "checkpoint read",
                   rec->step, rec->duration_ms);
        printf("\n");
    }
    for (size_t i = 0; i < job->nnodes; i++) {
        const dl_proto_status_node_t *n = &job->nodes[i];
        printf("  node %lld  %-20s %-16s slots %lld  heartbeat %.1fs ago%s%s\n", n->node_rank,
               safe(n->node_id, node_id, sizeof(node_id)), safe(n->host, host, sizeof(host)),
               n->slots, n->heartbeat_age, n->connected ? "" : "  (disconnected)",
               n->left ? "  (done)" : "");
    }
    print_diag(job);
}

/* The job-wide figures, the stragglers and (status --ranks) every rank: docs/diagnostics.md. */
static void print_diag(const dl_proto_status_job_t *job)
{
    const dl_proto_status_diag_t *d = job->diag;
    if (d != NULL) {
        printf("  compute a step: median %.3f ms", d->median_compute_ms);
        if (d->slowest != NULL)
            printf(", slowest rank %lld %.3f ms", d->slowest->rank, d->slowest->compute_ms);
        printf("; step %.3f ms, %.0f samples/s\n", d->step_ms, d->samples_per_s);
        for (size_t i = 0; i < d->nstragglers; i++) {
            const dl_proto_status_straggler_t *x = &d->stragglers[i];
            printf("  straggler: rank %lld on node %lld (%s): %.3f ms a step against the median "
                   "%.3f ms (+%.0f%%) for %lld steps; costs about %.0f samples/s\n",
                   x->rank, x->node_rank, x->host, x->compute_ms, x->median_ms, x->slower_pct,
                   x->steps, x->cost_samples_per_s);
        }
    }
    if (job->where != NULL)
        printf("  where: %s\n", job->where);
    for (size_t i = 0; i < job->nranks; i++) {
        const dl_proto_status_rank_t *x = &job->ranks[i];
        printf("  rank %lld  node %lld %-12s", x->rank, x->node_rank, x->host);
        if (x->has_step)
            printf(" step %lld", x->step);
        if (x->steps > 0)
            printf(" compute %.3f ms wait %.3f ms", x->compute_ms / x->steps,
                   x->wait_ms / x->steps);
        if (x->has_silent_s)
            printf(" last beat %.1f s ago", x->silent_s);
        if (x->proc != NULL)
            printf(" process %s", x->proc);
        if (!x->recorder)
            printf(" (no flight recorder)");
        for (size_t k = x->nops; k-- > 0;) {
            const dl_proto_status_op_t *op = &x->ops[k];
            printf("%s %s #%lld %s", k + 1 == x->nops ? " |" : ";", op->op, op->seq, op->state);
            if (op->has_age_s)
                printf(" %.1f s", op->age_s);
        }
        printf("\n");
    }
}

/* Decodes a status reply's result (one job or every job) once, and prints it; a reply that is
 * not what the protocol says is one line naming its field (exit 1). */
static int print_status_reply(const json_t *result)
{
    dl_proto_status_list_t list;
    char err[512];
    if (dl_proto_status_decode_reply(result, &list, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return 1;
    }
    if (list.state != NULL && list.njobs == 0)
        printf("no jobs\n");
    for (size_t i = 0; i < list.njobs; i++)
        print_job(&list.jobs[i]);
    dl_proto_rec_free(&dl_proto_status_list_type, &list);
    return 0;
}

/* One job's status as the etcd commands read it (ctl-etcd.c). */
static int print_status(const json_t *job)
{
    dl_proto_status_job_t j;
    char err[512];
    if (dl_proto_rec_decode(&dl_proto_status_job_type, job, &j, "status", err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return 1;
    }
    print_job(&j);
    dl_proto_rec_free(&dl_proto_status_job_type, &j);
    return 0;
}

/* --rdzv-backend etcd: the endpoints are etcd's (no default: they must be named). */
static int etcd_opts(const ctl_opts_t *o, const char *run_id, dl_ctl_etcd_opts_t *ret)
{
    const char *e = o->endpoint;
    if (e == NULL || *e == '\0')
        e = getenv("DLAUNCH_ENDPOINT");
    if (e == NULL || *e == '\0')
        return dl__ctl_usage_error("--rdzv-backend etcd: give the cluster's --endpoint "
                                   "HOST:PORT[,HOST:PORT...]");
    if (run_id != NULL && !dl_proto_run_id_valid(run_id))
        return dl__ctl_usage_error("'%s' is not a run id (letters, digits, '.', '_', ':', '-')",
                                   run_id);
    *ret = (dl_ctl_etcd_opts_t){.endpoints = e,
                                .rdzv_conf = o->rdzv_conf,
                                .json = o->json,
                                .ranks = o->ranks,
                                .timeout = o->timeout,
                                .follow_timeout = o->follow_timeout,
                                .print_status = print_status};
    return 0;
}

int dl__ctl_control(const char *cmd, const ctl_opts_t *o)
{
    const char *where;
    const char *endpoint = control_endpoint(o, &where);
    const char *run_id = o->nargs > 0 ? o->args[0] : NULL;
    dl_rdzv_sync_t *c;
    json_t *reply = NULL;
    int r;

    if (o->nargs > 1)
        return dl__ctl_usage_error("%s takes one RUN_ID", cmd);
    if (run_id == NULL && strcmp(cmd, "status") != 0)
        return dl__ctl_usage_error("%s needs the RUN_ID of the job", cmd);
    if (o->etcd) {
        dl_ctl_etcd_opts_t eo;
        r = etcd_opts(o, run_id, &eo);
        return r != 0 ? r : dl_ctl_etcd_control(cmd, run_id, &eo);
    }
    r = connect_as(endpoint, where, DL_PROTO_ROLE_CONTROL, run_id ? run_id : "status",
                   o->token_file, o->timeout, &c);
    if (r != 0)
        return r;
    dl_proto_type_t type = strcmp(cmd, "status") == 0 ? DL_PROTO_STATUS
                           : strcmp(cmd, "stop") == 0 ? DL_PROTO_STOP
                                                      : DL_PROTO_RESTART;
    r = call(c, dl_rdzv_enc_control(type, run_id == NULL, o->ranks, "requested with dlaunch"),
             o->timeout, &reply);
    dl_rdzv_sync_close(c);
    if (r != 0)
        return r;
    json_t *result = json_object_get(reply, "result");
    if (o->json) {
        char *s = json_dumps(result, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else if (type == DL_PROTO_STATUS) {
        r = print_status_reply(result);
    } else {
        printf("%s: %s\n", run_id, type == DL_PROTO_STOP ? "stopping" : "restarting");
    }
    json_decref(reply);
    return r;
}

/* Prints the job's events as JSON lines, from the start of the journal, until the job ends
 * (or, with --timeout, until nothing came for that long). */
int dl__ctl_events(const char *cmd, const ctl_opts_t *o)
{
    const char *where;
    const char *endpoint = control_endpoint(o, &where);
    dl_rdzv_sync_t *c;
    json_t *reply = NULL;
    char err[512];

    if (o->nargs != 1)
        return dl__ctl_usage_error("%s needs the RUN_ID of the job", cmd);
    if (o->etcd) {
        dl_ctl_etcd_opts_t eo;
        int r = etcd_opts(o, o->args[0], &eo);
        return r != 0 ? r : dl_ctl_etcd_events(o->args[0], &eo);
    }
    int r = connect_as(endpoint, where, DL_PROTO_ROLE_CONTROL, o->args[0], o->token_file,
                       o->timeout, &c);
    if (r != 0)
        return r;
    r = call(c, dl_rdzv_enc_events_follow(0), o->timeout, &reply);
    json_decref(reply);
    while (r == 0) {
        json_t *m = NULL;
        int e = dl_rdzv_sync_next(c, o->follow_timeout, &m, err, sizeof(err));
        if (e < 0) {
            if (e != -ETIMEDOUT) {
                fprintf(stderr, "dlaunch: %s\n", err);
                r = code_of(e);
            }
            break;
        }
        json_t *ev = json_object_get(m, "event");
        char *line = ev != NULL ? json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (line != NULL) {
            printf("%s\n", line);
            fflush(stdout);
            free(line);
        }
        const char *name, *status;
        dl_rdzv_dec_event(m, &name, &status);
        bool end = name != NULL && strcmp(name, "job_end") == 0;
        json_decref(m);
        if (end)
            break;
    }
    dl_rdzv_sync_close(c);
    return r;
}

int dl__ctl_kv(const char *cmd, const ctl_opts_t *o)
{
    (void)cmd;
    const char *endpoint = o->endpoint ? o->endpoint : getenv("DLAUNCH_STORE");
    const char *run_id = getenv("TORCHELASTIC_RUN_ID");
    const char *op = o->nargs > 0 ? o->args[0] : "";
    static const struct {
        const char *name;
        int nargs; /* after the op; -1: one or more */
        dl_proto_type_t type;
    } ops[] = {{"get", 1, DL_PROTO_KV_GET}, {"set", 2, DL_PROTO_KV_SET},
               {"add", 2, DL_PROTO_KV_ADD}, {"wait", -1, DL_PROTO_KV_WAIT},
               {"del", 1, DL_PROTO_KV_DEL}, {"cas", 3, DL_PROTO_KV_CAS}};
    int which = -1;
    for (int i = 0; i < 6; i++)
        if (strcmp(op, ops[i].name) == 0)
            which = i;
    if (which < 0)
        return dl__ctl_usage_error("kv: '%s' is not get, set, add, wait, del or cas", op);
    int n = o->nargs - 1;
    if ((ops[which].nargs >= 0 && n != ops[which].nargs) || (ops[which].nargs < 0 && n < 1))
        return dl__ctl_usage_error("kv %s: wrong number of arguments (see docs/control.md)", op);
    if (endpoint == NULL || *endpoint == '\0')
        return dl__ctl_usage_error(
            "kv: no store: run under dlaunch (DLAUNCH_STORE) or give --endpoint");
    if (run_id == NULL || *run_id == '\0')
        return dl__ctl_usage_error("kv: no run id: run under dlaunch (TORCHELASTIC_RUN_ID)");

    dl_rdzv_sync_t *c;
    int r = connect_as(endpoint, o->endpoint ? "--endpoint" : "DLAUNCH_STORE", DL_PROTO_ROLE_WORKER,
                       run_id, o->token_file, o->timeout, &c);
    if (r != 0)
        return r;
    const char *const *a = o->args + 1;
    dl_rdzv_kv_req_t req = {.op = ops[which].type, .key = a[0]};
    long delta = 0;
    switch (ops[which].type) {
    case DL_PROTO_KV_WAIT:
        req.key = NULL;
        req.keys = a;
        req.nkeys = (size_t)n;
        req.timeout_ms = (long long)(o->timeout * 1000);
        break;
    case DL_PROTO_KV_ADD:
        if (dl_parse_int(a[1], LONG_MIN, LONG_MAX, &delta) < 0) {
            dl_rdzv_sync_close(c);
            return dl__ctl_usage_error("kv add: '%s' is not a whole number", a[1]);
        }
        req.delta = delta;
        break;
    case DL_PROTO_KV_CAS:
        req.expected = *a[1] ? a[1] : NULL;
        req.value = a[2];
        break;
    default:
        if (n > 1)
            req.value = a[1];
        break;
    }
    json_t *reply = NULL;
    dl_rdzv_kv_result_t res;
    dl_proto_errcode_t code;
    char err[1200], safe[1200];
    /* A wait answers when its keys exist or its own timeout passes: give the call a margin. */
    r = dl_rdzv_sync_kv(c, &req, o->timeout + 5, &reply, &res, &code, err, sizeof(err));
    dl_rdzv_sync_close(c);
    if (r == -EPROTO) {
        /* A kv wait that timed out was answered: its keys are missing (exit 1), which is no
         * failure to reach the rendezvous (exit 3). */
        fprintf(stderr, "dlaunch: %s\n", dl_proto_escape(err, safe, sizeof(safe)));
        return code == DL_PROTO_E_AUTH_FAILED || code == DL_PROTO_E_FORBIDDEN ? 4
               : code == DL_PROTO_E_TIMEOUT && req.op != DL_PROTO_KV_WAIT     ? 3
                                                                              : 1;
    }
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return code_of(r);
    }
    if (res.value != NULL)
        printf("%s\n", res.value);
    else if (res.has_value)
        printf("%lld\n", res.number);
    if (req.op == DL_PROTO_KV_CAS && !res.swapped)
        r = 1;
    if (req.op == DL_PROTO_KV_DEL && !res.deleted)
        r = 1;
    json_decref(reply);
    return r;
}

/* Prints the key of job RUN_ID (or with --worker its workers' key) made from the token given:
 * what a site gives the user of one job, so that the job's agents, control commands and workers
 * hold nothing that reaches another job. */
int dl__ctl_token(const char *cmd, const ctl_opts_t *o)
{
    (void)cmd;
    dl_proto_token_t *from = NULL, *key = NULL;
    char *text = NULL;
    int r;

    if (o->read_only) {
        if (o->nargs != 0 || o->worker || o->expires != NULL)
            return dl__ctl_usage_error(
                "token --read-only takes no RUN_ID, --worker or --expires: it "
                "reads every job of the server, acts on none, and ends when the "
                "token changes");
        if (load_token(o->token_file, getenv("DLAUNCH_TOKEN_FILE"), &from) < 0)
            return 2;
        if (from == NULL)
            return dl__ctl_usage_error(
                "token: no token to make the credential from (--token-file or "
                "DLAUNCH_TOKEN: the server's own)");
        r = dl_proto_token_scrape(from, &key);
        if (r == 0)
            r = dl_proto_token_text(key, &text);
        if (r < 0)
            fprintf(stderr,
                    "dlaunch: token: a %s key cannot make the read-only credential; "
                    "it needs the server's own token\n",
                    dl_proto_token_kind_name(dl_proto_token_kind(from)));
        else
            printf("%s\n", text);
        free(text);
        dl_proto_token_free(key);
        dl_proto_token_free(from);
        return r < 0 ? 4 : 0;
    }
    if (o->nargs != 1)
        return dl__ctl_usage_error("token needs the RUN_ID of the job");
    int64_t lifetime = DL_PROTO_KEY_LIFETIME_S;
    if (o->expires != NULL && dl_proto_lifetime_parse(o->expires, &lifetime) < 0)
        return dl__ctl_usage_error(
            "--expires: '%s' is not a lifetime from 1s to %lldd (N, or N with s, "
            "m, h or d)",
            o->expires, DL_PROTO_KEY_LIFETIME_MAX_S / 86400);
    if (!dl_proto_run_id_valid(o->args[0]))
        return dl__ctl_usage_error("'%s' is not a run id (letters, digits, '.', '_', ':', '-')",
                                   o->args[0]);
    if (load_token(o->token_file, getenv("DLAUNCH_TOKEN_FILE"), &from) < 0)
        return 2;
    if (from == NULL)
        return dl__ctl_usage_error("token: no token to make the key from (--token-file or "
                                   "DLAUNCH_TOKEN: the rendezvous' own)");
    if (o->expires != NULL && dl_proto_token_kind(from) != DL_PROTO_TOKEN_MASTER) {
        const char *kind = dl_proto_token_kind_name(dl_proto_token_kind(from));
        dl_proto_token_free(from);
        return dl__ctl_usage_error("token --expires: a %s key keeps its own expiry; only the "
                                   "rendezvous' token makes keys of a new lifetime",
                                   kind);
    }
    /* Issued now: a revocation of this run withdraws it with the keys made before it. */
    int64_t now = dl_proto_unix_now();
    dl_proto_key_life_t life = {now, now + lifetime};
    r = dl_proto_token_derive(from, o->worker ? DL_PROTO_TOKEN_WORKER : DL_PROTO_TOKEN_JOB,
                              o->args[0], &life, &key);
    if (r == 0)
        r = dl_proto_token_text(key, &text);
    if (r < 0)
        fprintf(stderr, "dlaunch: token: a %s key cannot make the %s key of job '%s'\n",
                dl_proto_token_kind_name(dl_proto_token_kind(from)), o->worker ? "worker" : "job",
                o->args[0]);
    else
        printf("%s\n", text);
    free(text);
    dl_proto_token_free(key);
    dl_proto_token_free(from);
    return r < 0 ? 4 : 0;
}

/* Makes the rendezvous refuse every key of RUN_ID issued before --before (now by default), and
 * close the connections that hold one: the way to withdraw a key handed out, short of its
 * expiry. Needs the server's own token. */
int dl__ctl_revoke(const char *cmd, const ctl_opts_t *o)
{
    (void)cmd;
    const char *where;
    const char *endpoint = control_endpoint(o, &where);
    dl_rdzv_sync_t *c;
    json_t *reply = NULL;
    int64_t before = dl_proto_unix_now();
    char when[32];

    if (o->nargs != 1)
        return dl__ctl_usage_error("revoke needs the RUN_ID whose keys to withdraw");
    if (o->etcd)
        return dl__ctl_usage_error(
            "revoke: an etcd job's keys are its etcd credentials; withdraw them "
            "in etcd (docs/etcd.md)");
    int64_t now = before;
    if (o->before != NULL && (dl_proto_time_parse(o->before, &before) < 0 || before < 1))
        return dl__ctl_usage_error("--before: '%s' is not a moment (Unix seconds, or "
                                   "YYYY-MM-DDTHH:MM:SSZ)",
                                   o->before);
    /* A moment ahead would refuse the keys made from now until then too: not a withdrawal. */
    if (before > now + DL_PROTO_KEY_LEEWAY_S)
        return dl__ctl_usage_error(
            "--before: '%s' is ahead of this machine's clock; revoke withdraws "
            "keys already made",
            o->before);
    int r = connect_as(endpoint, where, DL_PROTO_ROLE_CONTROL, o->args[0], o->token_file,
                       o->timeout, &c);
    if (r != 0)
        return r;
    json_t *msg = dl_proto_msg_new(DL_PROTO_REVOKE, 0);
    if (msg != NULL)
        json_object_set_new(msg, "before", json_integer((json_int_t)before));
    r = call(c, msg, o->timeout, &reply);
    dl_rdzv_sync_close(c);
    if (r != 0)
        return r;
    json_t *result = json_object_get(reply, "result");
    before = json_integer_value(json_object_get(result, "before"));
    if (o->json)
        printf("{\"run_id\":\"%s\",\"before\":%lld}\n", o->args[0], (long long)before);
    else
        printf("%s: keys issued before %s are refused\n", o->args[0],
               dl_proto_time_text(before, when, sizeof(when)));
    json_decref(reply);
    return 0;
}
