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

static void print_diag(const json_t *job);
/* A field of the server's answer, made safe for a terminal: names and failures come from peers. */
static const char *field(const json_t *o, const char *name, char *buf, size_t len)
{
    return dl_proto_escape(json_string_value(json_object_get(o, name)), buf, len);
}

static void print_status(const json_t *job)
{
    char run_id[600], state[600], text[4200], node_id[1100], host[1100];
    printf("%s: %s, round %lld, restarts %lld of %lld, nodes %lld..%lld, world size %lld\n",
           field(job, "run_id", run_id, sizeof(run_id)), field(job, "state", state, sizeof(state)),
           (long long)json_integer_value(json_object_get(job, "round")),
           (long long)json_integer_value(json_object_get(job, "restarts")),
           (long long)json_integer_value(json_object_get(job, "max_restarts")),
           (long long)json_integer_value(json_object_get(job, "min_nodes")),
           (long long)json_integer_value(json_object_get(job, "max_nodes")),
           (long long)json_integer_value(json_object_get(job, "world_size")));
    if (json_object_get(job, "failure") != NULL)
        printf("  failure: %s\n", field(job, "failure", text, sizeof(text)));
    /* An etcd job's store is in node 0's agent, and its answer has no figures: no line of
     * zeros that would read as an empty store. */
    if (json_object_get(job, "keys") != NULL) {
        long long keys = json_integer_value(json_object_get(job, "keys"));
        long long bytes = json_integer_value(json_object_get(job, "store_bytes"));
        long long waits = json_integer_value(json_object_get(job, "store_waits"));
        printf("  store: %lld key%s, %lld byte%s, %lld wait%s", keys, keys == 1 ? "" : "s", bytes,
               bytes == 1 ? "" : "s", waits, waits == 1 ? "" : "s");
        if (json_object_get(job, "store_clients") != NULL) {
            long long clients = json_integer_value(json_object_get(job, "store_clients"));
            printf(", %lld torch client%s", clients, clients == 1 ? "" : "s");
        }
        printf("\n");
    }
    /* In-job recovery (docs/recovery.md): each is one of the restarts above. */
    const json_t *rec = json_object_get(job, "recovery");
    if (rec != NULL) {
        printf("  in-job recoveries: %lld",
               (long long)json_integer_value(json_object_get(rec, "recoveries")));
        if (json_is_true(json_object_get(rec, "recovering")))
            printf(", one under way");
        else if (json_object_get(rec, "step") != NULL)
            printf("; the last went on at step %lld, %.0f ms after the round changed, with no "
                   "checkpoint read",
                   (long long)json_integer_value(json_object_get(rec, "step")),
                   json_number_value(json_object_get(rec, "duration_ms")));
        printf("\n");
    }
    size_t i;
    json_t *n;
    json_array_foreach (json_object_get(job, "nodes"), i, n) {
        printf("  node %lld  %-20s %-16s slots %lld  heartbeat %.1fs ago%s%s\n",
               (long long)json_integer_value(json_object_get(n, "node_rank")),
               field(n, "node_id", node_id, sizeof(node_id)), field(n, "host", host, sizeof(host)),
               (long long)json_integer_value(json_object_get(n, "slots")),
               json_real_value(json_object_get(n, "heartbeat_age")),
               json_is_true(json_object_get(n, "connected")) ? "" : "  (disconnected)",
               json_is_true(json_object_get(n, "left")) ? "  (done)" : "");
    }
    print_diag(job);
}

/* The job-wide figures, the stragglers and (status --ranks) every rank: docs/diagnostics.md. */
static void print_diag(const json_t *job)
{
    const json_t *d = json_object_get(job, "diag"), *x;
    size_t i;
    if (d != NULL) {
        const json_t *slow = json_object_get(d, "slowest");
        printf("  compute a step: median %.3f ms",
               json_number_value(json_object_get(d, "median_compute_ms")));
        if (slow != NULL)
            printf(", slowest rank %lld %.3f ms",
                   (long long)json_integer_value(json_object_get(slow, "rank")),
                   json_number_value(json_object_get(slow, "compute_ms")));
        printf("; step %.3f ms, %.0f samples/s\n", json_number_value(json_object_get(d, "step_ms")),
               json_number_value(json_object_get(d, "samples_per_s")));
        json_array_foreach (json_object_get(d, "stragglers"), i, x) {
            printf("  straggler: rank %lld on node %lld (%s): %.3f ms a step against the median "
                   "%.3f ms (+%.0f%%) for %lld steps; costs about %.0f samples/s\n",
                   (long long)json_integer_value(json_object_get(x, "rank")),
                   (long long)json_integer_value(json_object_get(x, "node_rank")),
                   json_string_value(json_object_get(x, "host")),
                   json_number_value(json_object_get(x, "compute_ms")),
                   json_number_value(json_object_get(x, "median_ms")),
                   json_number_value(json_object_get(x, "slower_pct")),
                   (long long)json_integer_value(json_object_get(x, "steps")),
                   json_number_value(json_object_get(x, "cost_samples_per_s")));
        }
    }
    const char *where = json_string_value(json_object_get(job, "where"));
    if (where != NULL)
        printf("  where: %s\n", where);
    json_array_foreach (json_object_get(job, "ranks"), i, x) {
        double steps = json_number_value(json_object_get(x, "steps"));
        printf("  rank %lld  node %lld %-12s",
               (long long)json_integer_value(json_object_get(x, "rank")),
               (long long)json_integer_value(json_object_get(x, "node_rank")),
               json_string_value(json_object_get(x, "host")));
        if (json_object_get(x, "step") != NULL)
            printf(" step %lld", (long long)json_integer_value(json_object_get(x, "step")));
        if (steps > 0)
            printf(" compute %.3f ms wait %.3f ms",
                   json_number_value(json_object_get(x, "compute_ms")) / steps,
                   json_number_value(json_object_get(x, "wait_ms")) / steps);
        if (json_object_get(x, "silent_s") != NULL)
            printf(" last beat %.1f s ago", json_number_value(json_object_get(x, "silent_s")));
        if (json_string_value(json_object_get(x, "proc")) != NULL)
            printf(" process %s", json_string_value(json_object_get(x, "proc")));
        const json_t *ops = json_object_get(x, "ops"), *op;
        size_t k = json_array_size(ops);
        if (!json_is_true(json_object_get(x, "recorder")))
            printf(" (no flight recorder)");
        while (k-- > 0) {
            op = json_array_get(ops, k);
            printf("%s %s #%lld %s", k + 1 == json_array_size(ops) ? " |" : ";",
                   json_string_value(json_object_get(op, "op")),
                   (long long)json_integer_value(json_object_get(op, "seq")),
                   json_string_value(json_object_get(op, "state")));
            if (json_object_get(op, "age_s") != NULL)
                printf(" %.1f s", json_number_value(json_object_get(op, "age_s")));
        }
        printf("\n");
    }
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
        json_t *jobs = json_object_get(result, "jobs");
        size_t i;
        json_t *j;
        if (jobs == NULL)
            print_status(result);
        else if (json_array_size(jobs) == 0)
            printf("no jobs\n");
        json_array_foreach (jobs, i, j) {
            print_status(j);
        }
    } else {
        printf("%s: %s\n", run_id, type == DL_PROTO_STOP ? "stopping" : "restarting");
    }
    json_decref(reply);
    return 0;
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
    int64_t now = (int64_t)time(NULL);
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
    int64_t before = (int64_t)time(NULL);
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
