/* dlaunch status|stop|restart|events --rdzv-backend etcd: the same commands, reading and writing
 * the job's keys in etcd (etcd-job.h) instead of asking a rendezvous server. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "config.h"
#include "ctl-etcd.h"
#include "etcd-job.h"
#include "etcd.h"

/* How long a stopped job's keys stay (as the agents keep them: docs/etcd.md). */
#define LINGER "10"

static double now_unix(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

typedef struct {
    uv_loop_t loop;
    dl_etcd_t *etcd;
    dl_ejob_view_t view;
    char prefix[DL_EJOB_MAX_PREFIX];
    const dl_ctl_etcd_opts_t *o;
} ectl_t;

static int exit_of(dl_etcd_status_t st)
{
    return st == DL_ETCD_AUTH ? 4 : st == DL_ETCD_UNREACHABLE || st == DL_ETCD_NO_QUORUM ? 3 : 1;
}

static const char *cause_of(dl_etcd_status_t st)
{
    return st == DL_ETCD_AUTH          ? " (refused)"
           : st == DL_ETCD_NO_QUORUM   ? " (lost quorum)"
           : st == DL_ETCD_UNREACHABLE ? " (unreachable)"
                                       : "";
}

/* --rdzv-conf read by the option engine, as the agent reads it. */
static int open_etcd(ectl_t *c, const dl_ctl_etcd_opts_t *o, const char *run_id)
{
    dl_job_spec_t spec;
    dl_config_action_t action;
    char err[1024], *password = NULL;
    char *argv[] = {"dlaunch",
                    "--rdzv-backend",
                    "etcd",
                    "--rdzv-conf",
                    (char *)(o->rdzv_conf != NULL ? o->rdzv_conf : "timeout=600"),
                    "--",
                    "true",
                    NULL};
    char *envp[] = {NULL};
    int r;

    c->o = o;
    dl_job_spec_init(&spec);
    if (dl_config_load(&spec, 7, argv, envp, &action, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        dl_job_spec_free(&spec);
        return 2;
    }
    if ((spec.etcd_user != NULL) != (spec.etcd_password_file != NULL)) {
        fprintf(stderr, "dlaunch: --rdzv-conf: etcd's user and password_file go together\n");
        dl_job_spec_free(&spec);
        return 2;
    }
    if (spec.etcd_password_file != NULL &&
        dl_etcd_read_password(spec.etcd_password_file, &password, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-conf password_file: %s\n", err);
        dl_job_spec_free(&spec);
        return 2;
    }
    if (dl_ejob_prefix(spec.etcd_prefix, run_id != NULL ? run_id : "", c->prefix,
                       sizeof(c->prefix)) < 0) {
        fprintf(stderr, "dlaunch: --rdzv-conf prefix: too long\n");
        free(password);
        dl_job_spec_free(&spec);
        return 2;
    }
    dl_etcd_opts_t eo = {.endpoints = o->endpoints,
                         .protocol = spec.etcd_protocol,
                         .cacert = spec.etcd_cacert,
                         .cert = spec.etcd_cert,
                         .key = spec.etcd_key,
                         .user = spec.etcd_user,
                         .password = password,
                         .timeout = o->timeout};
    uv_loop_init(&c->loop);
    r = dl_etcd_new(&c->loop, &eo, &c->etcd, err, sizeof(err));
    if (password != NULL) {
        memset(password, 0, strlen(password));
        free(password);
    }
    dl_job_spec_free(&spec);
    if (r < 0) {
        fprintf(stderr, "dlaunch: --endpoint/--rdzv-conf (etcd): %s\n", err);
        uv_loop_close(&c->loop);
        return 2;
    }
    dl_ejob_view_init(&c->view, c->prefix);
    return 0;
}

static void close_etcd(ectl_t *c)
{
    dl_etcd_close(c->etcd);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    dl_ejob_view_clear(&c->view);
}

/* One request, its answer read into rec (a struct of t's, reply.h); prints the error line and
 * returns an exit code, or 0. */
static int call(ectl_t *c, const char *path, json_t *body, const dl_proto_rec_type_t *t, void *rec)
{
    char err[1200];
    json_t *ans = NULL;
    dl_etcd_status_t st = dl_etcd_call_sync(c->etcd, path, body, &ans, err, sizeof(err));
    if (st != DL_ETCD_OK) {
        fprintf(stderr, "dlaunch: %s%s\n", err, cause_of(st));
        return exit_of(st);
    }
    int r = dl_etcd_reply(t, ans, rec, err, sizeof(err));
    json_decref(ans);
    if (r < 0) {
        fprintf(stderr, "dlaunch: etcd at %s: %s\n", dl_etcd_endpoints(c->etcd), err);
        return 4;
    }
    return 0;
}

static json_t *range_body(const char *prefix)
{
    return json_pack("{s:o, s:o}", "key", dl_etcd_b64_str(prefix), "range_end",
                     dl_etcd_prefix_end(prefix));
}

/* Loads the job's view; 1 with a message when there is no such job. */
static int load(ectl_t *c, const char *run_id)
{
    dl_etcd_range_t ans;
    int r = call(c, "/v3/kv/range", range_body(c->prefix), &dl_etcd_range_type, &ans);
    if (r != 0)
        return r;
    r = dl_ejob_view_load(&c->view, &ans);
    dl_proto_rec_free(&dl_etcd_range_type, &ans);
    if (r < 0) {
        fprintf(stderr, "dlaunch: etcd at %s: %s\n", dl_etcd_endpoints(c->etcd), c->view.err);
        return 4;
    }
    if (c->view.state == NULL) {
        fprintf(stderr, "dlaunch: no job '%s' in etcd at %s (nothing under %s)\n", run_id,
                dl_etcd_endpoints(c->etcd), c->prefix);
        return 1;
    }
    return 0;
}

static void print_result(const ectl_t *c, const json_t *result)
{
    if (c->o->json) {
        char *s = json_dumps(result, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", s ? s : "{}");
        free(s);
    }
}

/* Every job under /dlaunch/ (the default prefix): their status side by side, written by the
 * status reply's one encoder (proto/status-reply.h) as a list with neither state nor round. */
static int status_all(ectl_t *c)
{
    dl_etcd_range_t ans;
    int r = call(c, "/v3/kv/range", range_body("/dlaunch/"), &dl_etcd_range_type, &ans);
    if (r != 0)
        return r;
    dl_proto_status_list_t all = {0};
    /* The view of each job from the same answer: its keys. */
    dl_etcd_range_t sub = {.header = ans.header};
    char err[256];
    all.jobs = calloc(ans.nkvs + 1, sizeof(*all.jobs));
    sub.kvs = calloc(ans.nkvs + 1, sizeof(*sub.kvs));
    if (all.jobs == NULL || sub.kvs == NULL) {
        free(all.jobs);
        free(sub.kvs);
        dl_proto_rec_free(&dl_etcd_range_type, &ans);
        fprintf(stderr, "dlaunch: status: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < ans.nkvs; i++) {
        const dl_etcd_kv_t *kv = &ans.kvs[i];
        size_t len = strlen(kv->key);
        if (len > 15 && strcmp(kv->key + len - 6, "/state") == 0) {
            char run_id[300], prefix[DL_EJOB_MAX_PREFIX];
            snprintf(run_id, sizeof(run_id), "%.*s", (int)(len - 6 - 9), kv->key + 9);
            snprintf(prefix, sizeof(prefix), "/dlaunch/%s/", run_id);
            dl_ejob_view_t v;
            dl_ejob_view_init(&v, prefix);
            sub.nkvs = 0;
            for (size_t k = 0; k < ans.nkvs; k++)
                if (strncmp(ans.kvs[k].key, prefix, strlen(prefix)) == 0)
                    sub.kvs[sub.nkvs++] = ans.kvs[k]; /* borrowed */
            int lr = dl_ejob_view_load(&v, &sub);
            dl_proto_status_job_t *job = &all.jobs[all.njobs];
            /* One job whose keys cannot be read is said, and the others listed. */
            if (lr < 0)
                fprintf(stderr, "dlaunch: etcd at %s: %s\n", dl_etcd_endpoints(c->etcd), v.err);
            else if (dl_ejob_status_rec(&v, run_id, false, now_unix(), job, err, sizeof(err)) == 0)
                all.njobs++;
            else
                dl_proto_rec_free(&dl_proto_status_job_type, job);
            dl_ejob_view_clear(&v);
        }
    }
    free(sub.kvs);
    dl_proto_rec_free(&dl_etcd_range_type, &ans);
    json_t *result = dl_proto_rec_encode(&dl_proto_status_list_type, &all);
    dl_proto_rec_free(&dl_proto_status_list_type, &all);
    if (result == NULL) {
        fprintf(stderr, "dlaunch: status: out of memory\n");
        return 1;
    }
    if (c->o->json)
        print_result(c, result);
    else if (json_array_size(json_object_get(result, "jobs")) == 0)
        printf("no jobs\n");
    else {
        size_t i;
        json_t *job;
        json_array_foreach (json_object_get(result, "jobs"), i, job)
            if (c->o->print_status(job) != 0)
                r = 1;
    }
    json_decref(result);
    return r;
}

/* Sends a transition made from the view, again from a fresh view while another change got
 * there first (a few times). build returns NULL when there is nothing to do (then *why says). */
typedef json_t *(*build_fn)(ectl_t *c, int64_t linger, const char **why);

static json_t *build_stop(ectl_t *c, int64_t linger, const char **why)
{
    if (dl_ejob_over(&c->view)) {
        *why = "is over";
        return NULL;
    }
    return dl_ejob_txn_end(&c->view, "stopped", "stopped by user (dlaunch stop)", linger,
                           now_unix());
}

static json_t *build_restart(ectl_t *c, int64_t linger, const char **why)
{
    if (dl_ejob_over(&c->view)) {
        *why = "is over";
        return NULL;
    }
    if (strcmp(dl_ejob_state_name(&c->view), "running") != 0) {
        *why = "is still gathering its round: there is nothing to restart";
        return NULL;
    }
    return dl_ejob_txn_next(&c->view, DL_EJOB_CAUSE_REQUESTED, "restart requested with dlaunch",
                            NULL, NULL, 0, 0, now_unix());
}

static int transition(ectl_t *c, const char *run_id, build_fn build, bool linger)
{
    int64_t lease = 0;
    int r;
    if (linger) {
        dl_etcd_lease_t granted;
        r = call(c, "/v3/lease/grant", json_pack("{s:s}", "TTL", LINGER), &dl_etcd_lease_type,
                 &granted);
        if (r != 0)
            return r;
        lease = granted.ID;
        dl_proto_rec_free(&dl_etcd_lease_type, &granted);
    }
    for (int tries = 0; tries < 10; tries++) {
        const char *why = NULL;
        if (tries > 0 && (r = load(c, run_id)) != 0)
            return r;
        json_t *body = build(c, lease, &why);
        if (body == NULL) {
            fprintf(stderr, "dlaunch: job '%s' %s\n", run_id, why ? why : "cannot change");
            return 1;
        }
        dl_etcd_txn_t ans;
        r = call(c, "/v3/kv/txn", body, &dl_etcd_txn_type, &ans);
        if (r != 0)
            return r;
        bool ok = ans.succeeded;
        dl_proto_rec_free(&dl_etcd_txn_type, &ans);
        if (ok)
            return 0;
    }
    fprintf(stderr, "dlaunch: job '%s' keeps changing under us; try again\n", run_id);
    return 1;
}

int dl_ctl_etcd_control(const char *cmd, const char *run_id, const dl_ctl_etcd_opts_t *o)
{
    ectl_t c;
    int r = open_etcd(&c, o, run_id);
    if (r != 0)
        return r;
    if (run_id == NULL) {
        r = status_all(&c);
        close_etcd(&c);
        return r;
    }
    r = load(&c, run_id);
    if (r == 0 && strcmp(cmd, "status") == 0) {
        json_t *st = dl_ejob_status_full(&c.view, run_id, o->ranks, now_unix());
        if (o->json)
            print_result(&c, st);
        else
            r = o->print_status(st);
        json_decref(st);
    } else if (r == 0 && strcmp(cmd, "stop") == 0) {
        r = transition(&c, run_id, build_stop, true);
        if (r == 0 && o->json)
            printf("{}\n");
        else if (r == 0)
            printf("%s: stopping\n", run_id);
    } else if (r == 0) {
        r = transition(&c, run_id, build_restart, false);
        if (r == 0 && o->json)
            printf("{\"round\":%d}\n", dl_ejob_round(&c.view) + 1);
        else if (r == 0)
            printf("%s: restarting\n", run_id);
    }
    close_etcd(&c);
    return r;
}

/* ---- events ----------------------------------------------------------------------------------- */

typedef struct {
    ectl_t *c;
    uv_timer_t idle;
    bool over;
    int code;
    dl_etcd_req_t *watch;
} follow_t;

static json_int_t seq_of(const json_t *events, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(events, key), "seq"));
}

/* Prints the events of a range answer (kvs) or a watch message (evs), count of them, in seq order
 * (which is their order); stops at job_end. */
static void print_events(follow_t *f, const dl_etcd_kv_t *kvs, const dl_etcd_event_t *evs,
                         size_t count)
{
    json_t *sorted = json_object();
    char evprefix[DL_EJOB_MAX_PREFIX + 4];
    snprintf(evprefix, sizeof(evprefix), "%sev/", f->c->prefix);
    for (size_t i = 0; i < count; i++) {
        const dl_etcd_kv_t *kv = evs != NULL ? evs[i].kv : &kvs[i];
        if (kv == NULL || (evs != NULL && evs[i].type != NULL))
            continue; /* deletes: the job's keys going */
        if (evs != NULL && kv->version > 1)
            continue; /* an event put again at the end, onto its linger lease */
        if (strncmp(kv->key, evprefix, strlen(evprefix)) == 0 && kv->value != NULL) {
            json_t *ev = json_loadb(kv->value, kv->value_len, 0, NULL);
            /* seq (docs/control.md): from the revision that made the event, which every reader
             * sees alike and which grows in the events' order (etcd-job.h). */
            if (json_is_object(ev))
                json_object_set_new(
                    ev, "seq",
                    json_integer(dl_ejob_event_seq(f->c->prefix, kv->key, kv->create_revision)));
            if (ev != NULL)
                json_object_set_new(sorted, kv->key, ev);
        }
    }
    const char *k;
    json_t *ev;
    /* jansson keeps insertion order; sort by seq by hand (a node's log line put on its own
     * has a key out of the revisions' order). */
    size_t n = json_object_size(sorted), m = 0;
    const char **keys = calloc(n > 0 ? n : 1, sizeof(*keys));
    json_object_foreach (sorted, k, ev)
        keys[m++] = k;
    for (size_t a = 1; a < m; a++)
        for (size_t b = a; b > 0 && seq_of(sorted, keys[b - 1]) > seq_of(sorted, keys[b]); b--) {
            const char *t = keys[b];
            keys[b] = keys[b - 1];
            keys[b - 1] = t;
        }
    for (size_t a = 0; a < m && !f->over; a++) {
        ev = json_object_get(sorted, keys[a]);
        char *line = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (line != NULL) {
            printf("%s\n", line);
            fflush(stdout);
            free(line);
        }
        const char *name = json_string_value(json_object_get(ev, "event"));
        if (name != NULL && strcmp(name, "job_end") == 0)
            f->over = true;
    }
    free(keys);
    json_decref(sorted);
}

static void stop_follow(follow_t *f)
{
    dl_etcd_cancel(f->watch);
    f->watch = NULL;
    uv_timer_stop(&f->idle);
}

static void on_event_msg(void *ctx, const dl_etcd_result_t *res)
{
    follow_t *f = ctx;
    dl_etcd_watch_t msg;
    char err[512];
    if (dl_etcd_reply(&dl_etcd_watch_type, res->body, &msg, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: etcd at %s: %s\n", res->endpoint, err);
        f->code = 4;
        stop_follow(f);
        return;
    }
    print_events(f, NULL, msg.events, msg.nevents);
    dl_proto_rec_free(&dl_etcd_watch_type, &msg);
    if (f->over) {
        stop_follow(f);
        return;
    }
    if (f->c->o->follow_timeout >= 0)
        uv_timer_again(&f->idle);
}

static void on_event_done(void *ctx, const dl_etcd_result_t *res)
{
    follow_t *f = ctx;
    f->watch = NULL;
    fprintf(stderr, "dlaunch: %s%s\n", res->error, cause_of(res->status));
    f->code = exit_of(res->status);
    stop_follow(f);
}

static void on_idle(uv_timer_t *t)
{
    stop_follow(t->data);
}

int dl_ctl_etcd_events(const char *run_id, const dl_ctl_etcd_opts_t *o)
{
    ectl_t c;
    dl_etcd_range_t ans;
    char evprefix[DL_EJOB_MAX_PREFIX + 4];
    int r = open_etcd(&c, o, run_id);
    if (r != 0)
        return r;
    r = load(&c, run_id);
    if (r != 0) {
        close_etcd(&c);
        return r;
    }
    snprintf(evprefix, sizeof(evprefix), "%sev/", c.prefix);
    r = call(&c, "/v3/kv/range", range_body(evprefix), &dl_etcd_range_type, &ans);
    if (r != 0) {
        close_etcd(&c);
        return r;
    }
    follow_t f = {.c = &c};
    print_events(&f, ans.kvs, NULL, ans.nkvs);
    int64_t rev = dl_etcd_rev(ans.header);
    dl_proto_rec_free(&dl_etcd_range_type, &ans);
    if (!f.over) {
        uv_timer_init(&c.loop, &f.idle);
        f.idle.data = &f;
        if (o->follow_timeout >= 0) {
            uint64_t ms = (uint64_t)(o->follow_timeout * 1000);
            uv_timer_start(&f.idle, on_idle, ms, ms);
        }
        json_t *b = json_pack("{s:{s:o, s:o, s:o}}", "create_request", "key",
                              dl_etcd_b64_str(evprefix), "range_end", dl_etcd_prefix_end(evprefix),
                              "start_revision", dl_etcd_num(rev + 1));
        if (dl_etcd_stream(c.etcd, "/v3/watch", b, on_event_msg, on_event_done, &f, &f.watch) < 0) {
            fprintf(stderr, "dlaunch: out of memory\n");
            f.code = 1;
        } else {
            while (f.watch != NULL)
                uv_run(&c.loop, UV_RUN_ONCE);
        }
        uv_close((uv_handle_t *)&f.idle, NULL);
    }
    close_etcd(&c);
    return f.code;
}
