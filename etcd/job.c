/* A dlaunch job kept in etcd (etcd-job.h): keys, documents, the view, the transactions. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd-job.h"
#include "etcd.h"
#include "rdzv-codec.h"
#include "rdzv-policy.h"

#define DEFAULT_MASTER_PORT 29500

/* ---- Keys ------------------------------------------------------------------------------------- */

int dl_ejob_prefix(const char *conf_prefix, const char *run_id, char *buf, size_t len)
{
    int n;
    if (conf_prefix != NULL && *conf_prefix != '\0') {
        size_t cl = strlen(conf_prefix);
        n = snprintf(buf, len, "%s%s", conf_prefix, conf_prefix[cl - 1] == '/' ? "" : "/");
    } else {
        n = snprintf(buf, len, "/dlaunch/%s/", run_id);
    }
    return n < 0 || (size_t)n >= len ? -EINVAL : 0;
}

json_t *dl__ejob_key(const char *prefix, const char *fmt, ...)
{
    char buf[DL_EJOB_MAX_PREFIX + 600];
    size_t n = (size_t)snprintf(buf, sizeof(buf), "%s", prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
    va_end(ap);
    return dl_etcd_b64_str(buf);
}

json_t *dl__ejob_range_end(const char *prefix, const char *sub)
{
    char buf[DL_EJOB_MAX_PREFIX + 64];
    snprintf(buf, sizeof(buf), "%s%s", prefix, sub);
    return dl_etcd_prefix_end(buf);
}

/* ---- The view --------------------------------------------------------------------------------- */

void dl_ejob_view_init(dl_ejob_view_t *v, const char *prefix)
{
    memset(v, 0, sizeof(*v));
    snprintf(v->prefix, sizeof(v->prefix), "%s", prefix);
    dl_ejob_table_init(&v->members, &dl_ejob_member_type);
    dl_ejob_table_init(&v->done, &dl_ejob_done_type);
    dl_ejob_table_init(&v->assign, &dl_ejob_assign_type);
    dl_ejob_table_init(&v->reports, &dl_ejob_report_type);
    v->events = json_object();
}

/* Frees a record the view holds alone (job, state, verdict) and clears its pointer. */
static void rec_drop(const dl_proto_rec_type_t *t, void *pp)
{
    void **p = pp;
    dl_proto_rec_free(t, *p);
    free(*p);
    *p = NULL;
}

void dl_ejob_view_clear(dl_ejob_view_t *v)
{
    rec_drop(&dl_ejob_job_type, &v->job);
    rec_drop(&dl_ejob_state_type, &v->state);
    rec_drop(&dl_ejob_verdict_type, &v->verdict);
    dl_ejob_table_clear(&v->members);
    dl_ejob_table_clear(&v->done);
    dl_ejob_table_clear(&v->assign);
    dl_ejob_table_clear(&v->reports);
    json_decref(v->events);
    v->events = NULL;
}

/* Replaces *pp (a record of t, or NULL) with the value of kv decoded, or NULL (deleted). */
static int replace(dl_ejob_view_t *v, const dl_proto_rec_type_t *t, void *pp,
                   const dl_etcd_kv_t *kv, bool deleted)
{
    void *rec = NULL;
    if (!deleted) {
        if ((rec = calloc(1, t->size)) == NULL)
            return -ENOMEM;
        int r = dl_ejob_rec_read(t, kv->key, kv->value, kv->value_len, rec, v->err, sizeof(v->err));
        if (r < 0) {
            free(rec);
            return r;
        }
    }
    rec_drop(t, pp);
    *(void **)pp = rec;
    return 0;
}

/* Puts kv's value decoded at key in table t, or deletes it. */
static int table_apply(dl_ejob_view_t *v, dl_ejob_table_t *t, const char *key,
                       const dl_etcd_kv_t *kv, bool deleted)
{
    if (deleted) {
        dl_ejob_table_del(t, key);
        return 0;
    }
    void *rec = calloc(1, t->type->size);
    if (rec == NULL)
        return -ENOMEM;
    int r =
        dl_ejob_rec_read(t->type, kv->key, kv->value, kv->value_len, rec, v->err, sizeof(v->err));
    if (r == 0)
        r = dl_ejob_table_put(t, key, rec, kv->lease, kv->mod_revision);
    dl_proto_rec_free(t->type, rec);
    free(rec);
    return r;
}

/* The events stay documents (job-records.h); a value that is none is not ours. */
static int event_apply(json_t *docs, const char *key, const dl_etcd_kv_t *kv, bool deleted)
{
    if (deleted) {
        json_object_del(docs, key);
        return 0;
    }
    json_t *doc = json_loadb(kv->value, kv->value_len, 0, NULL);
    if (json_is_object(doc))
        json_object_set(docs, key, doc);
    json_decref(doc);
    return 0;
}

/* One key's change. Returns DL_EJOB_CH_*, 0 for a key of no interest, or -EBADMSG (v->err
 * names the key and the field) or -ENOMEM. */
static int apply(dl_ejob_view_t *v, const dl_etcd_kv_t *kv, bool deleted)
{
    size_t pl = strlen(v->prefix);
    if (strncmp(kv->key, v->prefix, pl) != 0)
        return 0;
    const char *k = kv->key + pl;
    int r, ch = 0;
    if (strcmp(k, "job") == 0) {
        r = replace(v, &dl_ejob_job_type, &v->job, kv, deleted);
        ch = DL_EJOB_CH_JOB;
    } else if (strcmp(k, "state") == 0) {
        r = replace(v, &dl_ejob_state_type, &v->state, kv, deleted);
        if (r == 0)
            v->state_rev = deleted ? 0 : kv->mod_revision;
        ch = DL_EJOB_CH_STATE;
    } else if (strcmp(k, "verdict") == 0) {
        r = replace(v, &dl_ejob_verdict_type, &v->verdict, kv, deleted);
        ch = DL_EJOB_CH_REPORTS;
    } else if (strncmp(k, "m/", 2) == 0) {
        r = table_apply(v, &v->members, k + 2, kv, deleted);
        ch = DL_EJOB_CH_MEMBERS;
    } else if (strncmp(k, "done/", 5) == 0) {
        r = table_apply(v, &v->done, k + 5, kv, deleted);
        ch = DL_EJOB_CH_DONE;
    } else if (strncmp(k, "a/", 2) == 0) {
        r = table_apply(v, &v->assign, k + 2, kv, deleted);
        ch = DL_EJOB_CH_ASSIGN;
    } else if (strncmp(k, "n/", 2) == 0) {
        r = table_apply(v, &v->reports, k + 2, kv, deleted);
        ch = DL_EJOB_CH_REPORTS;
    } else if (strncmp(k, "ev/", 3) == 0) {
        r = event_apply(v->events, kv->key, kv, deleted);
        ch = DL_EJOB_CH_EVENTS;
    } else {
        return 0;
    }
    if (r == -ENOMEM)
        snprintf(v->err, sizeof(v->err), "etcd key %s: out of memory", kv->key);
    return r < 0 ? r : ch;
}

/* Replaces the view with the keys of ranges (n of them) at revision rev. */
static int load(dl_ejob_view_t *v, int64_t rev, const dl_etcd_range_t *const *ranges, size_t n)
{
    char prefix[DL_EJOB_MAX_PREFIX];
    int ch = DL_EJOB_CH_JOB | DL_EJOB_CH_STATE | DL_EJOB_CH_MEMBERS | DL_EJOB_CH_DONE |
             DL_EJOB_CH_EVENTS | DL_EJOB_CH_ASSIGN;

    snprintf(prefix, sizeof(prefix), "%s", v->prefix);
    dl_ejob_view_clear(v);
    dl_ejob_view_init(v, prefix);
    v->rev = rev;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; ranges[i] != NULL && j < ranges[i]->nkvs; j++) {
            int r = apply(v, &ranges[i]->kvs[j], false);
            if (r < 0)
                return r;
        }
    }
    return ch;
}

int dl_ejob_view_load(dl_ejob_view_t *v, const dl_etcd_range_t *range)
{
    return load(v, dl_etcd_rev(range->header), &range, 1);
}

int dl_ejob_view_load_read(dl_ejob_view_t *v, const dl_etcd_txn_t *answer)
{
    const dl_etcd_range_t **ranges = calloc(answer->nresponses + 1, sizeof(*ranges));
    if (ranges == NULL) {
        snprintf(v->err, sizeof(v->err), "etcd's answer: out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < answer->nresponses; i++)
        ranges[i] = answer->responses[i].response_range;
    int r = load(v, dl_etcd_rev(answer->header), ranges, answer->nresponses);
    free(ranges);
    return r;
}

int dl_ejob_view_watch(dl_ejob_view_t *v, const dl_etcd_watch_t *msg)
{
    int ch = 0;
    for (size_t i = 0; i < msg->nevents; i++) {
        const dl_etcd_kv_t *kv = msg->events[i].kv;
        if (kv == NULL) {
            snprintf(v->err, sizeof(v->err), "a key in etcd's watch message that is not one");
            return -EPROTO;
        }
        int r = apply(v, kv, dl_etcd_deleted(&msg->events[i]));
        if (r < 0)
            return r;
        if (kv->mod_revision > v->rev)
            v->rev = kv->mod_revision;
        ch |= r;
    }
    int64_t rev = dl_etcd_rev(msg->header);
    if (rev > v->rev && msg->nevents > 0)
        v->rev = rev;
    return ch;
}

const dl_ejob_member_rec_t *dl_ejob_member(const dl_ejob_view_t *v, const char *node_id)
{
    return dl_ejob_table_get(&v->members, node_id);
}

int64_t dl_ejob_done_round(const dl_ejob_view_t *v, const char *node_id)
{
    const dl_ejob_done_rec_t *d = dl_ejob_table_get(&v->done, node_id);
    return d != NULL ? d->round : -1;
}

int dl_ejob_view_note_member(dl_ejob_view_t *v, const char *node_id, int round, int node_rank)
{
    dl_ejob_member_rec_t m = {
        .round = round, .node_rank = node_rank, .has_node_rank = true, .has_slots = false};
    return dl_ejob_table_put(&v->members, node_id, &m, 0, 0);
}

int dl_ejob_view_note_done(dl_ejob_view_t *v, const char *node_id, int64_t round)
{
    dl_ejob_done_rec_t d = {.round = round};
    return dl_ejob_table_put(&v->done, node_id, &d, 0, 0);
}

int dl_ejob_round(const dl_ejob_view_t *v)
{
    long long r = v->state != NULL ? v->state->round : 0;
    return r < INT_MIN ? INT_MIN : r > INT_MAX ? INT_MAX : (int)r;
}

const char *dl_ejob_state_name(const dl_ejob_view_t *v)
{
    return v->state != NULL ? v->state->state : "";
}

bool dl_ejob_over(const dl_ejob_view_t *v)
{
    const char *s = dl_ejob_state_name(v);
    return v->state != NULL && strcmp(s, "gathering") != 0 && strcmp(s, "running") != 0;
}

int dl_ejob_count(const dl_ejob_view_t *v, int round)
{
    int n = 0;
    for (size_t i = 0; i < v->members.n; i++)
        n += ((const dl_ejob_member_rec_t *)v->members.items[i].rec)->round == round;
    return n;
}

int64_t dl_ejob_assignment(const dl_ejob_view_t *v)
{
    const dl_ejob_state_rec_t *s = v->state;
    return s != NULL && s->has_assignment && s->assignment > 0 ? (int64_t)s->assignment : 0;
}

int dl_ejob_node_count(const dl_ejob_view_t *v)
{
    long long n = v->state != NULL ? v->state->node_count : 0;
    return n < 0 ? 0 : n > INT_MAX ? INT_MAX : (int)n;
}

const dl_ejob_assign_rec_t *dl_ejob_assigned(const dl_ejob_view_t *v, const char *node_id)
{
    char key[600];
    int64_t tag = dl_ejob_assignment(v);
    if (tag == 0 || strcmp(dl_ejob_state_name(v), "running") != 0)
        return NULL;
    int n = snprintf(key, sizeof(key), "%d/%lld/%s", dl_ejob_round(v), (long long)tag, node_id);
    if (n < 0 || (size_t)n >= sizeof(key))
        return NULL;
    return dl_ejob_table_get(&v->assign, key);
}

static int by_node_rank(const void *a, const void *b)
{
    long long x = (*(const dl_ejob_assign_rec_t *const *)a)->node_rank;
    long long y = (*(const dl_ejob_assign_rec_t *const *)b)->node_rank;
    return x < y ? -1 : x > y;
}

const dl_ejob_assign_rec_t **dl_ejob_assigned_nodes(const dl_ejob_view_t *v, size_t *ret_n)
{
    char tag[64];
    int64_t rev = dl_ejob_assignment(v);
    const dl_ejob_assign_rec_t **out = calloc(v->assign.n + 1, sizeof(*out));
    size_t n = 0;
    *ret_n = 0;
    if (out == NULL || rev == 0 || strcmp(dl_ejob_state_name(v), "running") != 0)
        return out;
    size_t tl = (size_t)snprintf(tag, sizeof(tag), "%d/%lld/", dl_ejob_round(v), (long long)rev);
    for (size_t i = 0; i < v->assign.n; i++)
        if (strncmp(v->assign.items[i].key, tag, tl) == 0)
            out[n++] = v->assign.items[i].rec;
    qsort(out, n, sizeof(*out), by_node_rank);
    *ret_n = n;
    return out;
}

/* ---- Documents -------------------------------------------------------------------------------- */

/* The settings' record; its strings borrowed from s. */
static dl_ejob_job_rec_t settings_rec(const dl_ejob_settings_t *s)
{
    return (dl_ejob_job_rec_t){.min_nodes = s->min_nodes,
                               .max_nodes = s->max_nodes,
                               .max_restarts = s->max_restarts,
                               .max_same_failures = s->max_same_failures,
                               .last_call_ms = (long long)(s->last_call * 1000),
                               .join_timeout_ms = (long long)(s->join_timeout * 1000),
                               .dead_after_ms = (long long)(s->dead_after * 1000),
                               .master_port = s->master_port,
                               .has_master_port = true,
                               .store_key = (char *)s->store_key};
}

int dl_ejob_settings_check(const dl_ejob_job_rec_t *job, const dl_ejob_settings_t *s, char *err,
                           size_t errlen)
{
    if (job->min_nodes != s->min_nodes || job->max_nodes != s->max_nodes) {
        snprintf(err, errlen, "join: the job has %lld:%lld nodes, this agent asks for %d:%d",
                 job->min_nodes, job->max_nodes, s->min_nodes, s->max_nodes);
        return -EINVAL;
    }
    return 0;
}

/* A member's record; its strings borrowed from m. */
static dl_ejob_member_rec_t member_rec(const dl_ejob_member_t *m)
{
    return (dl_ejob_member_rec_t){.round = m->round,
                                  .node_id = (char *)m->node_id,
                                  .host = (char *)m->host,
                                  .addr = (char *)m->addr,
                                  .store = (char *)m->store,
                                  .slots = m->slots,
                                  .has_slots = true,
                                  .node_rank = m->node_rank,
                                  .has_node_rank = true,
                                  .master_port = m->master_port};
}

json_t *dl_ejob_member_doc(const dl_ejob_member_t *m)
{
    dl_ejob_member_rec_t rec = member_rec(m);
    return dl_proto_rec_encode(&dl_ejob_member_type, &rec);
}

static char *dumps(const json_t *doc)
{
    return json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
}

/* {"request_put": {key, value[, lease]}}; steals k and text. */
static json_t *put_text(json_t *k, char *text, int64_t lease)
{
    if (text == NULL) {
        json_decref(k);
        return NULL;
    }
    json_t *p = json_pack("{s:o, s:o}", "key", k, "value", dl_etcd_b64_str(text));
    free(text);
    if (p != NULL && lease != 0)
        json_object_set_new(p, "lease", dl_etcd_num(lease));
    return json_pack("{s:o}", "request_put", p);
}

/* The put of a document (an event); steals doc. */
static json_t *put(json_t *k, json_t *doc, int64_t lease)
{
    char *text = doc != NULL ? dumps(doc) : NULL;
    json_decref(doc);
    return put_text(k, text, lease);
}

/* The put of a record of t, encoded once here. */
static json_t *put_rec(json_t *k, const dl_proto_rec_type_t *t, const void *rec, int64_t lease)
{
    return put_text(k, dl_ejob_rec_text(t, rec), lease);
}

static json_t *del_range(json_t *k, json_t *end)
{
    return json_pack("{s:{s:o, s:o}}", "request_delete_range", "key", k, "range_end", end);
}

static json_t *cmp_state(const dl_ejob_view_t *v)
{
    return json_pack("{s:o, s:s, s:s, s:o}", "key", dl__ejob_key(v->prefix, "state"), "target",
                     "MOD", "result", "EQUAL", "mod_revision", dl_etcd_num(v->state_rev));
}

static json_t *event_key(const dl_ejob_view_t *v, int round, int kind)
{
    return dl__ejob_key(v->prefix, "ev/%08d-%d", round, kind);
}

static json_t *event(const char *name, double now)
{
    return json_pack("{s:s, s:f}", "event", name, "time", now);
}

/* The log event our rendezvous journals where the same thing happens (docs/control.md: level,
 * text), put by the transaction that puts the event of kind K of round R, at ev/RRRRRRRR-K-1:
 * its seq (dl_ejob_event_seq) is that event's plus one, a seq of its own. */
static json_t *log_put(const char *prefix, int round, int kind, const char *level, const char *text,
                       double now, int64_t lease)
{
    json_t *ev = event("log", now);
    if (ev != NULL)
        json_object_update_new(ev, json_pack("{s:s, s:s}", "level", level, "text", text));
    return put(dl__ejob_key(prefix, "ev/%08d-%d-1", round, kind), ev, lease);
}

int64_t dl_ejob_event_seq(const char *prefix, const char *key, int64_t create_revision)
{
    size_t n = strlen(prefix);
    int64_t slot = 0;
    /* PREFIX ev/RRRRRRRR-K[-S]: S, one digit, orders the events one transaction puts. */
    if (strncmp(key, prefix, n) == 0 && strncmp(key + n, "ev/", 3) == 0 &&
        strlen(key + n) > 3 + 10) {
        const char *rest = key + n + 3 + 10;
        if (rest[0] == '-' && rest[1] >= '1' && rest[1] <= '9' && rest[2] == '\0')
            slot = rest[1] - '0';
    }
    return create_revision * DL_EJOB_SEQ_SLOTS + slot;
}

json_t *dl_ejob_put_done_log(const dl_ejob_view_t *v, const char *node_id, const char *host,
                             int64_t done, int64_t lease, double now)
{
    int n = dl_ejob_node_count(v);
    char text[600];
    snprintf(text, sizeof(text), "agent '%s' (%s) finished: %lld of %d done", node_id, host,
             (long long)done, n);
    json_t *ev = event("log", now);
    if (ev != NULL)
        json_object_update_new(ev, json_pack("{s:s, s:s}", "level", "info", "text", text));
    json_t *p =
        put(dl__ejob_key(v->prefix, "ev/%08d-1-d-%s", dl_ejob_round(v), node_id), ev, lease);
    json_t *body = json_incref(json_object_get(p, "request_put"));
    json_decref(p);
    return body;
}

json_t *dl_ejob_txn_create(const char *prefix, const dl_ejob_settings_t *s, double now)
{
    dl_ejob_state_rec_t state = {.round = 0,
                                 .state = "gathering",
                                 .restarts = 0,
                                 .max_restarts = s->max_restarts,
                                 .max_same_failures = s->max_same_failures,
                                 .min_nodes = s->min_nodes,
                                 .has_min_nodes = true,
                                 .max_nodes = s->max_nodes,
                                 .has_max_nodes = true,
                                 .reason = "the job started",
                                 .time = now,
                                 .has_time = true};
    dl_ejob_job_rec_t job = settings_rec(s);
    char text[200];
    snprintf(text, sizeof(text), "job created: nodes %d:%d, at most %d restart%s after failures",
             s->min_nodes, s->max_nodes, s->max_restarts, s->max_restarts == 1 ? "" : "s");
    json_t *t = json_pack(
        "{s:[{s:o, s:s, s:s, s:s}], s:[o, o, o], s:[{s:{s:o}}, {s:{s:o}}]}", "compare", "key",
        dl__ejob_key(prefix, "job"), "target", "CREATE", "result", "EQUAL", "create_revision", "0",
        "success", put_rec(dl__ejob_key(prefix, "job"), &dl_ejob_job_type, &job, 0),
        put_rec(dl__ejob_key(prefix, "state"), &dl_ejob_state_type, &state, 0),
        log_put(prefix, 0, 0, "info", text, now, 0), "failure", "request_range", "key",
        dl__ejob_key(prefix, "job"), "request_range", "key", dl__ejob_key(prefix, "state"));
    return t;
}

static json_t *put_member(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int round,
                          int64_t lease)
{
    dl_ejob_member_rec_t rec = member_rec(m);
    rec.round = round;
    return put_rec(dl__ejob_key(v->prefix, "m/%s", m->node_id), &dl_ejob_member_type, &rec, lease);
}

json_t *dl_ejob_txn_join(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int64_t lease)
{
    return json_pack("{s:[o], s:[o]}", "compare", cmp_state(v), "success",
                     put_member(v, m, dl_ejob_round(v), lease));
}

typedef struct {
    const char *id;
    const dl_ejob_member_rec_t *m;
    int64_t rev; /* its key's: the order they joined */
} cand_t;

static int by_join(const void *a, const void *b)
{
    int64_t x = ((const cand_t *)a)->rev, y = ((const cand_t *)b)->rev;
    return x < y ? -1 : x > y;
}

static const char *str_or(const char *s, const char *dflt)
{
    return s != NULL ? s : dflt;
}

json_t *dl_ejob_txn_close(const dl_ejob_view_t *v, double now)
{
    int round = dl_ejob_round(v);
    long long max = v->state != NULL && v->state->has_max_nodes ? v->state->max_nodes : 1;
    size_t n = 0, cap = v->members.n;
    /* Any etcd client may have written the state: a round of no node has nothing to close. */
    if (max < 1 || v->state == NULL)
        return NULL;
    cand_t *c = calloc(cap > 0 ? cap : 1, sizeof(*c));
    if (c == NULL)
        return NULL;
    for (size_t i = 0; i < v->members.n; i++) {
        const dl_ejob_entry_t *e = &v->members.items[i];
        const dl_ejob_member_rec_t *m = e->rec;
        if (m->round == round)
            c[n++] = (cand_t){e->key, m, e->rev};
    }
    if (n == 0) {
        free(c);
        return NULL;
    }
    /* The first max_nodes to join take part; the others find the round closed without them. */
    qsort(c, n, sizeof(*c), by_join);
    if ((long long)n > max)
        n = (size_t)max;
    /* The node-rank rule is the policy's (rdzv-policy.h), as our rendezvous's: etcd knows no
     * Slurm node ids. */
    dl_rdzv_policy_node_t *nodes = calloc(n, sizeof(*nodes));
    dl_rdzv_policy_node_t **order = calloc(n, sizeof(*order));
    bool *taken = calloc(n, sizeof(*taken));
    cand_t *by = calloc(n, sizeof(*by));
    if (nodes == NULL || order == NULL || taken == NULL || by == NULL) {
        free(c);
        free(nodes);
        free(order);
        free(taken);
        free(by);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const dl_ejob_member_rec_t *m = c[i].m;
        nodes[i] = (dl_rdzv_policy_node_t){.slurm_node_id = -1,
                                           .hint = m->has_node_rank ? (int)m->node_rank : -1,
                                           .host = str_or(m->host, ""),
                                           .id = c[i].id,
                                           .ctx = &c[i]};
        order[i] = &nodes[i];
    }
    dl_rdzv_policy_node_ranks(order, n, taken);
    for (size_t r = 0; r < n; r++)
        by[r] = *(const cand_t *)order[r]->ctx;
    free(nodes);
    free(order);
    free(taken);
    /* Every node's assignment is a key of its own, a/ROUND/REV/NODE_ID (REV: the revision of
     * the members it was made from, so that a close that lost the race leaves keys no state
     * names); the state carries only the round's summary, so that the watch brings every agent
     * a small document and each reads its own entry: O(N) bytes for the round, not N^2. */
    const dl_ejob_member_rec_t *zero = by[0].m;
    long long port = zero->master_port;
    if (port <= 0)
        port =
            v->job != NULL && v->job->has_master_port ? v->job->master_port : DEFAULT_MASTER_PORT;
    json_t *puts = json_array();
    bool complete = puts != NULL; /* every operation made (else ENOMEM) */
    long long world = 0;
    for (size_t r = 0; r < n; r++) {
        const dl_ejob_member_rec_t *x = by[r].m;
        long long slots = x->has_slots ? x->slots : 1;
        dl_ejob_assign_rec_t a = {.node_id = (char *)by[r].id,
                                  .host = (char *)str_or(x->host, ""),
                                  .addr = (char *)str_or(x->addr, ""),
                                  .store = (char *)str_or(x->store, ""),
                                  .slots = slots,
                                  .node_rank = (long long)r,
                                  .first_rank = world,
                                  .master_port = x->master_port,
                                  .next = n > 1 ? (char *)by[(r + 1) % n].id : NULL};
        if (json_array_append_new(puts, put_rec(dl__ejob_key(v->prefix, "a/%d/%lld/%s", round,
                                                             (long long)v->rev, by[r].id),
                                                &dl_ejob_assign_type, &a, 0)) < 0)
            complete = false;
        world += slots;
    }
    /* The state's own fields as they were, the summary added (borrowed: encoded, never freed). */
    dl_ejob_state_rec_t state = *v->state;
    state.state = "running";
    state.assignment = v->rev;
    state.has_assignment = true;
    state.node_count = (long long)n;
    state.has_node_count = true;
    state.node0 = (char *)by[0].id;
    state.world_size = world;
    state.has_world_size = true;
    state.master_addr = (char *)str_or(zero->addr, "");
    state.master_port = port;
    state.has_master_port = true;
    state.store_addr = (char *)str_or(zero->store, "");
    state.time = now;
    state.has_time = true;
    json_t *ev = event("rendezvous", now);
    json_object_update_new(ev, json_pack("{s:i, s:i, s:I, s:I, s:s, s:I}", "round", round, "nodes",
                                         (int)n, "world_size", (json_int_t)world, "restarts",
                                         (json_int_t)v->state->restarts, "master_addr",
                                         str_or(zero->addr, ""), "master_port", (json_int_t)port));
    char closed[700];
    snprintf(closed, sizeof(closed), "round %d closed: %zu node%s, world size %lld, master %s:%lld",
             round, n, n == 1 ? "" : "s", world, str_or(zero->addr, ""), port);
    json_t *state_put = put_rec(dl__ejob_key(v->prefix, "state"), &dl_ejob_state_type, &state, 0);
    free(c);
    free(by);
    /* The last transaction closes: no member joined since the view (every member key is older
     * than it). The assignments go before it in batches within etcd's limit of operations in a
     * transaction, each only while the round is still the view's; with few nodes, all in one. */
    json_t *txns = json_array();
    json_t *last_ops = json_array();
    if (json_array_append_new(last_ops, state_put) < 0 ||
        json_array_append_new(last_ops, put(event_key(v, round, 1), ev, 0)) < 0 ||
        json_array_append_new(last_ops, log_put(v->prefix, round, 1, "info", closed, now, 0)) < 0)
        complete = false;
    size_t total = json_array_size(puts);
    if (total + 3 <= DL_EJOB_MAX_TXN_OPS) {
        if (json_array_extend(last_ops, puts) < 0)
            complete = false;
    } else {
        for (size_t i = 0; i < total; i += DL_EJOB_MAX_TXN_OPS) {
            json_t *ops = json_array();
            for (size_t j = i; j < total && j < i + DL_EJOB_MAX_TXN_OPS; j++)
                if (json_array_append(ops, json_array_get(puts, j)) < 0)
                    complete = false;
            if (json_array_append_new(
                    txns, json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops)) < 0)
                complete = false;
        }
    }
    json_decref(puts);
    if (json_array_append_new(txns, json_pack("{s:[o, {s:o, s:o, s:s, s:s, s:o}], s:o}", "compare",
                                              cmp_state(v), "key", dl__ejob_key(v->prefix, "m/"),
                                              "range_end", dl__ejob_range_end(v->prefix, "m/"),
                                              "target", "MOD", "result", "LESS", "mod_revision",
                                              dl_etcd_num(v->rev + 1), "success", last_ops)) < 0 ||
        !complete) {
        json_decref(txns);
        return NULL;
    }
    return txns;
}

static const char *cause_name(dl_ejob_cause_t c)
{
    switch (c) {
    case DL_EJOB_CAUSE_WORKER_FAILED: return "worker_failed";
    case DL_EJOB_CAUSE_NODE_LOST: return "node_lost";
    case DL_EJOB_CAUSE_NODE_JOINED: return "node_joined";
    case DL_EJOB_CAUSE_REQUESTED: return "requested";
    case DL_EJOB_CAUSE_EXCLUDED: return "straggler";
    case DL_EJOB_CAUSE_NODE_LEFT: return "node_left";
    }
    return "unknown";
}

/* The ops that end the job: the state and the job_end event; every other key deleted; the
 * settings, state and events kept on linger (0: none). Appends to ops. */
static void end_ops(const dl_ejob_view_t *v, json_t *ops, const dl_ejob_state_rec_t *state,
                    json_t *ev, const char *level, const char *text, int64_t linger, double now)
{
    int round = dl_ejob_round(v);
    const char *k;
    json_t *e;
    json_array_append_new(
        ops, put_rec(dl__ejob_key(v->prefix, "state"), &dl_ejob_state_type, state, linger));
    if (v->job != NULL)
        json_array_append_new(
            ops, put_rec(dl__ejob_key(v->prefix, "job"), &dl_ejob_job_type, v->job, linger));
    if (linger != 0)
        json_object_foreach (v->events, k, e) {
            json_array_append_new(ops, put(dl_etcd_b64_str(k), json_incref(e), linger));
        }
    json_array_append_new(ops, put(event_key(v, round, 2), ev, linger));
    json_array_append_new(ops, log_put(v->prefix, round, 2, level, text, now, linger));
    json_array_append_new(
        ops, del_range(dl__ejob_key(v->prefix, "m/"), dl__ejob_range_end(v->prefix, "m/")));
    json_array_append_new(
        ops, del_range(dl__ejob_key(v->prefix, "done/"), dl__ejob_range_end(v->prefix, "done/")));
    json_array_append_new(
        ops, del_range(dl__ejob_key(v->prefix, "a/"), dl__ejob_range_end(v->prefix, "a/")));
}

/* A culprit object as the policy compares it: read by the one reader (rdzv-codec.h). */
static dl_rdzv_culprit_t read_culprit(const json_t *obj, const char **ret_cause)
{
    dl_rdzv_culprit_msg_t m;
    dl_rdzv_dec_culprit(obj, &m);
    *ret_cause = m.cause != NULL ? m.cause : "";
    return (dl_rdzv_culprit_t){.rank = m.rank,
                               .exit_code = m.exit_code,
                               .signal = m.signal,
                               .hung = m.hung,
                               .oom = m.oom,
                               .step = m.step};
}

int dl_ejob_same_failures(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const json_t *culprit)
{
    const char *prev_cause, *ignored;
    dl_rdzv_culprit_t next = read_culprit(culprit, &ignored);
    if (cause != DL_EJOB_CAUSE_WORKER_FAILED || next.rank < 0)
        return 0;
    dl_rdzv_culprit_t prev = read_culprit(v->state != NULL ? v->state->culprit : NULL, &prev_cause);
    long long count = v->state != NULL ? v->state->same_failures : 0;
    bool same =
        strcmp(prev_cause, cause_name(cause)) == 0 && dl_rdzv_policy_same_failure(&prev, &next);
    return same && count > 0 && count < INT_MAX ? (int)count + 1 : 1;
}

/* The cause as the rendezvous core names it, for the policy; a straggler stepping out is no
 * cause of the core's, and no failure. */
static dl_rdzv_cause_t core_cause(dl_ejob_cause_t c)
{
    switch (c) {
    case DL_EJOB_CAUSE_WORKER_FAILED: return DL_RDZV_CAUSE_WORKER_FAILED;
    case DL_EJOB_CAUSE_NODE_LOST: return DL_RDZV_CAUSE_NODE_LOST;
    case DL_EJOB_CAUSE_NODE_JOINED: return DL_RDZV_CAUSE_NODE_JOINED;
    case DL_EJOB_CAUSE_REQUESTED: return DL_RDZV_CAUSE_REQUESTED;
    case DL_EJOB_CAUSE_NODE_LEFT: return DL_RDZV_CAUSE_NODE_LEFT;
    case DL_EJOB_CAUSE_EXCLUDED: break;
    }
    return DL_RDZV_CAUSE_COUNT;
}

static int clamp_int(long long x)
{
    return x < INT_MIN ? INT_MIN : x > INT_MAX ? INT_MAX : (int)x;
}

/* What ending the view's round for cause costs, by the one policy (rdzv-policy.h). */
static dl_rdzv_budget_t round_end_cost(const dl_ejob_view_t *v, dl_ejob_cause_t cause,
                                       const json_t *culprit)
{
    return dl_rdzv_policy_round_end(core_cause(cause),
                                    clamp_int(v->state != NULL ? v->state->restarts : 0),
                                    clamp_int(v->state != NULL ? v->state->max_restarts : 0),
                                    dl_ejob_same_failures(v, cause, culprit),
                                    clamp_int(v->state != NULL ? v->state->max_same_failures : 0));
}

bool dl_ejob_next_fails(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const json_t *culprit)
{
    dl_rdzv_budget_t cost = round_end_cost(v, cause, culprit);
    return cost == DL_RDZV_BUDGET_SPENT || cost == DL_RDZV_BUDGET_SAME;
}

/* The state as the view holds it, to be changed and encoded (its strings borrowed); a view of
 * no state (another etcd client deleted it) starts from nothing. */
static dl_ejob_state_rec_t state_copy(const dl_ejob_view_t *v)
{
    return v->state != NULL ? *v->state : (dl_ejob_state_rec_t){.state = ""};
}

json_t *dl_ejob_txn_next(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const char *reason,
                         const json_t *culprit, const dl_ejob_member_t *join, int64_t join_lease,
                         int64_t linger_lease, double now)
{
    json_t *who = culprit != NULL ? json_deep_copy(culprit) : json_object();
    bool failure = dl_rdzv_policy_is_failure(core_cause(cause));
    dl_rdzv_budget_t cost = round_end_cost(v, cause, culprit);
    int round = dl_ejob_round(v);
    dl_ejob_state_rec_t state = state_copy(v);
    long long restarts = state.restarts;
    json_t *ops = json_array();
    int same = cost == DL_RDZV_BUDGET_SAME ? dl_ejob_same_failures(v, cause, culprit) : 0;

    state.same_failures = dl_ejob_same_failures(v, cause, culprit);
    state.has_same_failures = true;
    json_object_set_new(who, "cause", json_string(cause_name(cause)));
    state.culprit = who;
    if (failure && state.failure == NULL)
        state.failure = (char *)reason;
    if (cost == DL_RDZV_BUDGET_SAME || cost == DL_RDZV_BUDGET_SPENT) {
        /* No restart left, or another would fail alike: the job fails with its first failure,
         * or with the one that repeats (exit 5: a scheduler should not requeue it). */
        const char *why = same > 0 ? reason : str_or(state.failure, "");
        char text[1400];
        if (same > 0)
            snprintf(text, sizeof(text),
                     "the same failure ended %d rounds in a row (the same rank and cause, no "
                     "step further; restarting will not help): %.1100s",
                     same, why);
        else
            snprintf(text, sizeof(text), "failed after %lld restart%s: %s", restarts,
                     restarts == 1 ? "" : "s", why);
        state.state = "failed";
        state.reason = text;
        state.cause = (char *)cause_name(cause);
        state.time = now;
        state.has_time = true;
        if (same > 0) {
            state.exit_code = 5;
            state.has_exit_code = true;
        }
        json_t *ev = event("job_end", now);
        json_object_update_new(ev, json_pack("{s:s, s:i, s:s}", "status", "failed", "exit_code",
                                             same > 0 ? 5 : 1, "failure", same > 0 ? text : why));
        char line[1500];
        if (same > 0)
            snprintf(line, sizeof(line), "job failed after %lld restart%s: %s", restarts,
                     restarts == 1 ? "" : "s", text);
        else
            snprintf(line, sizeof(line), "job failed after %s", text + strlen("failed after "));
        end_ops(v, ops, &state, ev, "error", line, linger_lease, now);
        json_decref(who);
        return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
    }
    if (cost == DL_RDZV_BUDGET_SPEND)
        restarts++;
    char line[1500];
    if (failure)
        snprintf(line, sizeof(line), "round %d -> %d (restart %lld of %lld): %s", round, round + 1,
                 restarts, state.max_restarts, reason);
    else
        snprintf(line, sizeof(line),
                 "round %d -> %d (no failure: the restart budget stays %lld of %lld): %s", round,
                 round + 1, restarts, state.max_restarts, reason);
    state.round = round + 1;
    state.state = "gathering";
    state.restarts = restarts;
    state.reason = (char *)reason;
    state.cause = (char *)cause_name(cause);
    state.time = now;
    state.has_time = true;
    /* The closed round's summary goes with it. */
    state.has_assignment = state.has_node_count = state.has_world_size = false;
    state.has_master_port = false;
    state.node0 = state.master_addr = state.store_addr = NULL;
    json_t *ev = event("round_changed", now);
    /* The journal's fields as every backend writes them (docs/control.md); the culprit is the
     * state's, where the agents read it. */
    json_object_update_new(ev, json_pack("{s:i, s:s, s:s}", "round", round + 1, "reason", reason,
                                         "cause", cause_name(cause)));
    json_array_append_new(
        ops, put_rec(dl__ejob_key(v->prefix, "state"), &dl_ejob_state_type, &state, 0));
    json_decref(who);
    json_array_append_new(ops, put(event_key(v, round + 1, 0), ev, 0));
    json_array_append_new(
        ops, log_put(v->prefix, round + 1, 0, failure ? "warning" : "info", line, now, 0));
    json_array_append_new(
        ops, del_range(dl__ejob_key(v->prefix, "a/"), dl__ejob_range_end(v->prefix, "a/")));
    if (join != NULL)
        json_array_append_new(ops, put_member(v, join, round + 1, join_lease));
    return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
}

json_t *dl_ejob_txn_end(const dl_ejob_view_t *v, const char *status, const char *reason,
                        int64_t linger_lease, double now)
{
    dl_ejob_state_rec_t state = state_copy(v);
    json_t *ops = json_array();
    int code = strcmp(status, "timed-out") == 0 ? 3 : strcmp(status, "failed") == 0 ? 1 : 0;
    long long restarts = state.restarts;
    state.state = (char *)status;
    state.reason = (char *)reason;
    state.time = now;
    state.has_time = true;
    json_t *ev = event("job_end", now);
    json_object_update_new(ev, json_pack("{s:s, s:i}", "status",
                                         strcmp(status, "timed-out") == 0 ? "timed_out" : status,
                                         "exit_code", code));
    /* The line our rendezvous logs as the job ends this way. */
    int round = dl_ejob_round(v);
    char line[1500];
    if (code == 0 && strcmp(status, "succeeded") == 0)
        snprintf(line, sizeof(line), "job succeeded in round %d, %lld restart%s", round, restarts,
                 restarts == 1 ? "" : "s");
    else if (code == 3)
        snprintf(line, sizeof(line), "%s", reason);
    else
        snprintf(line, sizeof(line), "job %s in round %d: %s", status, round, reason);
    end_ops(v, ops, &state, ev, code == 0 ? "info" : "error", line, linger_lease, now);
    return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
}

json_t *dl_ejob_txn_done(const dl_ejob_view_t *v, const char *node_id)
{
    dl_ejob_done_rec_t done = {.round = dl_ejob_round(v)};
    return json_pack(
        "{s:[o], s:[o]}", "compare", cmp_state(v), "success",
        put_rec(dl__ejob_key(v->prefix, "done/%s", node_id), &dl_ejob_done_type, &done, 0));
}

/* ---- Reading ---------------------------------------------------------------------------------- */

/* A string of the status record's own. */
static int own(char **dst, const char *s)
{
    *dst = strdup(s != NULL ? s : "");
    return *dst != NULL ? 0 : -ENOMEM;
}

int dl_ejob_status_base(const dl_ejob_view_t *v, const char *run_id, dl_proto_status_job_t *st)
{
    const dl_ejob_state_rec_t *s = v->state;
    dl_ejob_state_rec_t none = {.state = ""};
    int round = dl_ejob_round(v);
    if (s == NULL)
        s = &none;
    memset(st, 0, sizeof(*st));
    st->round = s->round;
    st->restarts = s->restarts;
    st->max_restarts = s->max_restarts;
    st->min_nodes = s->has_min_nodes ? s->min_nodes : 1;
    st->max_nodes = s->has_max_nodes ? s->max_nodes : 1;
    st->world_size = s->has_world_size ? s->world_size : 0;
    if (own(&st->run_id, run_id) < 0 || own(&st->state, s->state) < 0 ||
        (s->failure != NULL && own(&st->failure, s->failure) < 0))
        goto nomem;
    if (strcmp(s->state, "running") == 0) {
        size_t n;
        const dl_ejob_assign_rec_t **assigned = dl_ejob_assigned_nodes(v, &n);
        if (assigned == NULL || (st->nodes = calloc(n + 1, sizeof(*st->nodes))) == NULL) {
            free(assigned);
            goto nomem;
        }
        for (size_t i = 0; i < n; i++) {
            const dl_ejob_assign_rec_t *a = assigned[i];
            dl_proto_status_node_t *node = &st->nodes[st->nnodes++];
            node->node_rank = a->node_rank;
            node->slots = a->slots;
            node->connected = dl_ejob_member(v, a->node_id) != NULL;
            node->left = dl_ejob_done_round(v, a->node_id) == round;
            if (own(&node->node_id, a->node_id) < 0 || own(&node->host, a->host) < 0) {
                free(assigned);
                goto nomem;
            }
        }
        free(assigned);
    } else {
        /* Gathering: the members so far, without ranks. */
        if ((st->nodes = calloc(v->members.n + 1, sizeof(*st->nodes))) == NULL)
            goto nomem;
        for (size_t i = 0; i < v->members.n; i++) {
            const dl_ejob_member_rec_t *m = v->members.items[i].rec;
            if (m->round != round)
                continue;
            dl_proto_status_node_t *node = &st->nodes[st->nnodes++];
            node->node_rank = -1;
            node->slots = m->has_slots ? m->slots : 1;
            node->connected = true;
            if (own(&node->node_id, v->members.items[i].key) < 0 || own(&node->host, m->host) < 0)
                goto nomem;
        }
    }
    return 0;
nomem:
    dl_proto_rec_free(&dl_proto_status_job_type, st);
    return -ENOMEM;
}

json_t *dl_ejob_status(const dl_ejob_view_t *v, const char *run_id)
{
    dl_proto_status_job_t st;
    if (dl_ejob_status_base(v, run_id, &st) < 0)
        return NULL;
    json_t *o = dl_proto_rec_encode(&dl_proto_status_job_type, &st);
    dl_proto_rec_free(&dl_proto_status_job_type, &st);
    return o;
}

int dl_ejob_exit_code(const dl_ejob_view_t *v)
{
    const char *s = dl_ejob_state_name(v);
    if (strcmp(s, "failed") == 0)
        return v->state->has_exit_code && v->state->exit_code == 5 ? 5 : 1;
    return strcmp(s, "timed-out") == 0 ? 3 : 0;
}
