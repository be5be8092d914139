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
    v->members = json_object();
    v->done = json_object();
    v->events = json_object();
    v->assign = json_object();
    v->reports = json_object();
}

void dl_ejob_view_clear(dl_ejob_view_t *v)
{
    json_decref(v->job);
    json_decref(v->state);
    json_decref(v->members);
    json_decref(v->done);
    json_decref(v->events);
    json_decref(v->assign);
    json_decref(v->reports);
    json_decref(v->verdict);
    v->job = v->state = v->members = v->done = v->events = v->assign = v->reports = NULL;
    v->verdict = NULL;
}

/* One key's change. Returns DL_EJOB_CH_*, 0 for a key of no interest. */
static int apply(dl_ejob_view_t *v, const dl_etcd_kv_t *kv, bool deleted)
{
    size_t pl = strlen(v->prefix);
    if (strncmp(kv->key, v->prefix, pl) != 0)
        return 0;
    const char *k = kv->key + pl;
    json_t *doc = NULL;
    if (!deleted) {
        doc = json_loadb(kv->value, kv->value_len, 0, NULL);
        if (!json_is_object(doc)) {
            json_decref(doc);
            return 0; /* not ours: ignored */
        }
    }
    if (strcmp(k, "job") == 0) {
        json_decref(v->job);
        v->job = doc;
        return DL_EJOB_CH_JOB;
    }
    if (strcmp(k, "state") == 0) {
        json_decref(v->state);
        v->state = doc;
        v->state_rev = deleted ? 0 : kv->mod_revision;
        return DL_EJOB_CH_STATE;
    }
    if (strcmp(k, "verdict") == 0) {
        json_decref(v->verdict);
        v->verdict = doc;
        return DL_EJOB_CH_REPORTS;
    }
    if (strncmp(k, "m/", 2) == 0) {
        if (deleted) {
            json_object_del(v->members, k + 2);
        } else {
            json_object_set_new(doc, "lease", json_integer(kv->lease));
            json_object_set_new(doc, "rev", json_integer(kv->mod_revision));
            json_object_set(v->members, k + 2, doc);
        }
        json_decref(doc);
        return DL_EJOB_CH_MEMBERS;
    }
    if (strncmp(k, "done/", 5) == 0) {
        if (deleted)
            json_object_del(v->done, k + 5);
        else
            json_object_set_new(v->done, k + 5,
                                json_integer(json_integer_value(json_object_get(doc, "round"))));
        json_decref(doc);
        return DL_EJOB_CH_DONE;
    }
    if (strncmp(k, "a/", 2) == 0) {
        if (deleted)
            json_object_del(v->assign, k + 2);
        else
            json_object_set(v->assign, k + 2, doc);
        json_decref(doc);
        return DL_EJOB_CH_ASSIGN;
    }
    if (strncmp(k, "n/", 2) == 0) {
        if (deleted) {
            json_object_del(v->reports, k + 2);
        } else {
            json_object_set_new(doc, "rev", json_integer(kv->mod_revision));
            json_object_set(v->reports, k + 2, doc);
        }
        json_decref(doc);
        return DL_EJOB_CH_REPORTS;
    }
    if (strncmp(k, "ev/", 3) == 0) {
        if (deleted)
            json_object_del(v->events, kv->key);
        else
            json_object_set(v->events, kv->key, doc);
        json_decref(doc);
        return DL_EJOB_CH_EVENTS;
    }
    json_decref(doc);
    return 0;
}

int dl_ejob_view_load(dl_ejob_view_t *v, const json_t *range)
{
    char prefix[DL_EJOB_MAX_PREFIX];
    size_t i;
    json_t *kvj;
    int ch = DL_EJOB_CH_JOB | DL_EJOB_CH_STATE | DL_EJOB_CH_MEMBERS | DL_EJOB_CH_DONE |
             DL_EJOB_CH_EVENTS | DL_EJOB_CH_ASSIGN;

    snprintf(prefix, sizeof(prefix), "%s", v->prefix);
    dl_ejob_view_clear(v);
    dl_ejob_view_init(v, prefix);
    v->rev = dl_etcd_int(json_object_get(json_object_get(range, "header"), "revision"));
    json_array_foreach (json_object_get(range, "kvs"), i, kvj) {
        dl_etcd_kv_t kv;
        if (dl_etcd_kv_read(kvj, &kv) < 0)
            return -EPROTO;
        apply(v, &kv, false);
        dl_etcd_kv_clear(&kv);
    }
    return ch;
}

int dl_ejob_view_watch(dl_ejob_view_t *v, const json_t *result)
{
    size_t i;
    json_t *ev;
    int ch = 0;
    json_array_foreach (json_object_get(result, "events"), i, ev) {
        dl_etcd_kv_t kv;
        if (dl_etcd_kv_read(json_object_get(ev, "kv"), &kv) < 0)
            return -EPROTO;
        const char *type = json_string_value(json_object_get(ev, "type"));
        ch |= apply(v, &kv, type != NULL && strcmp(type, "DELETE") == 0);
        if (kv.mod_revision > v->rev)
            v->rev = kv.mod_revision;
        dl_etcd_kv_clear(&kv);
    }
    int64_t rev = dl_etcd_int(json_object_get(json_object_get(result, "header"), "revision"));
    if (rev > v->rev && json_array_size(json_object_get(result, "events")) > 0)
        v->rev = rev;
    return ch;
}

static json_int_t sint(const json_t *o, const char *name, json_int_t dflt)
{
    const json_t *x = json_object_get(o, name);
    return json_is_integer(x) ? json_integer_value(x) : dflt;
}

static const char *sstr(const json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    return s != NULL ? s : "";
}

int dl_ejob_round(const dl_ejob_view_t *v)
{
    return (int)sint(v->state, "round", 0);
}

const char *dl_ejob_state_name(const dl_ejob_view_t *v)
{
    return sstr(v->state, "state");
}

bool dl_ejob_over(const dl_ejob_view_t *v)
{
    const char *s = dl_ejob_state_name(v);
    return v->state != NULL && strcmp(s, "gathering") != 0 && strcmp(s, "running") != 0;
}

int dl_ejob_count(const dl_ejob_view_t *v, int round)
{
    const char *id;
    json_t *m;
    int n = 0;
    json_object_foreach (v->members, id, m) {
        if (sint(m, "round", -1) == round)
            n++;
    }
    return n;
}

int64_t dl_ejob_assignment(const dl_ejob_view_t *v)
{
    json_int_t tag = sint(v->state, "assignment", 0);
    return tag > 0 ? (int64_t)tag : 0;
}

int dl_ejob_node_count(const dl_ejob_view_t *v)
{
    json_int_t n = sint(v->state, "node_count", 0);
    return n < 0 ? 0 : n > INT_MAX ? INT_MAX : (int)n;
}

const json_t *dl_ejob_assigned(const dl_ejob_view_t *v, const char *node_id)
{
    char key[600];
    int64_t tag = dl_ejob_assignment(v);
    if (tag == 0 || strcmp(dl_ejob_state_name(v), "running") != 0)
        return NULL;
    int n = snprintf(key, sizeof(key), "%d/%lld/%s", dl_ejob_round(v), (long long)tag, node_id);
    if (n < 0 || (size_t)n >= sizeof(key))
        return NULL;
    return json_object_get(v->assign, key);
}

static int by_node_rank(const void *a, const void *b)
{
    json_int_t x = sint(*(json_t *const *)a, "node_rank", 0);
    json_int_t y = sint(*(json_t *const *)b, "node_rank", 0);
    return x < y ? -1 : x > y;
}

json_t *dl_ejob_assigned_nodes(const dl_ejob_view_t *v)
{
    char tag[64];
    json_t *out = json_array();
    int64_t rev = dl_ejob_assignment(v);
    const char *k;
    json_t *doc;
    if (out == NULL || rev == 0 || strcmp(dl_ejob_state_name(v), "running") != 0)
        return out;
    size_t tl = (size_t)snprintf(tag, sizeof(tag), "%d/%lld/", dl_ejob_round(v), (long long)rev);
    json_object_foreach (v->assign, k, doc) {
        if (strncmp(k, tag, tl) == 0)
            json_array_append(out, doc);
    }
    size_t n = json_array_size(out);
    json_t **sorted = calloc(n > 0 ? n : 1, sizeof(*sorted));
    if (sorted == NULL) {
        json_decref(out);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        sorted[i] = json_incref(json_array_get(out, i));
    qsort(sorted, n, sizeof(*sorted), by_node_rank);
    json_array_clear(out);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(out, sorted[i]);
    free(sorted);
    return out;
}

/* ---- Documents -------------------------------------------------------------------------------- */

json_t *dl_ejob_settings_doc(const dl_ejob_settings_t *s)
{
    json_t *d =
        json_pack("{s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:i}", "min_nodes", s->min_nodes,
                  "max_nodes", s->max_nodes, "max_restarts", s->max_restarts, "max_same_failures",
                  s->max_same_failures, "last_call_ms", (json_int_t)(s->last_call * 1000),
                  "join_timeout_ms", (json_int_t)(s->join_timeout * 1000), "dead_after_ms",
                  (json_int_t)(s->dead_after * 1000), "master_port", s->master_port);
    if (d != NULL && s->store_key != NULL)
        json_object_set_new(d, "store_key", json_string(s->store_key));
    return d;
}

int dl_ejob_settings_check(const json_t *doc, const dl_ejob_settings_t *s, char *err, size_t errlen)
{
    int lo = (int)sint(doc, "min_nodes", -1), hi = (int)sint(doc, "max_nodes", -1);
    if (lo != s->min_nodes || hi != s->max_nodes) {
        snprintf(err, errlen, "join: the job has %d:%d nodes, this agent asks for %d:%d", lo, hi,
                 s->min_nodes, s->max_nodes);
        return -EINVAL;
    }
    return 0;
}

json_t *dl_ejob_member_doc(const dl_ejob_member_t *m)
{
    return json_pack("{s:i, s:s, s:s, s:s, s:s, s:i, s:i, s:i}", "round", m->round, "node_id",
                     m->node_id, "host", m->host, "addr", m->addr, "store", m->store, "slots",
                     m->slots, "node_rank", m->node_rank, "master_port", m->master_port);
}

static char *dumps(const json_t *doc)
{
    return json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
}

/* {"request_put": {key, value[, lease]}}; steals doc. */
static json_t *put(json_t *k, json_t *doc, int64_t lease)
{
    char *text = doc != NULL ? dumps(doc) : NULL;
    json_decref(doc);
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
    json_t *state = json_pack("{s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:f}", "round", 0, "state",
                              "gathering", "restarts", 0, "max_restarts", s->max_restarts,
                              "max_same_failures", s->max_same_failures, "min_nodes", s->min_nodes,
                              "max_nodes", s->max_nodes, "reason", "the job started", "time", now);
    char text[200];
    snprintf(text, sizeof(text), "job created: nodes %d:%d, at most %d restart%s after failures",
             s->min_nodes, s->max_nodes, s->max_restarts, s->max_restarts == 1 ? "" : "s");
    json_t *t = json_pack(
        "{s:[{s:o, s:s, s:s, s:s}], s:[o, o, o], s:[{s:{s:o}}, {s:{s:o}}]}", "compare", "key",
        dl__ejob_key(prefix, "job"), "target", "CREATE", "result", "EQUAL", "create_revision", "0",
        "success", put(dl__ejob_key(prefix, "job"), dl_ejob_settings_doc(s), 0),
        put(dl__ejob_key(prefix, "state"), state, 0), log_put(prefix, 0, 0, "info", text, now, 0),
        "failure", "request_range", "key", dl__ejob_key(prefix, "job"), "request_range", "key",
        dl__ejob_key(prefix, "state"));
    return t;
}

json_t *dl_ejob_txn_join(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int64_t lease)
{
    dl_ejob_member_t mm = *m;
    mm.round = dl_ejob_round(v);
    return json_pack(
        "{s:[o], s:[o]}", "compare", cmp_state(v), "success",
        put(dl__ejob_key(v->prefix, "m/%s", m->node_id), dl_ejob_member_doc(&mm), lease));
}

typedef struct {
    const char *id;
    const json_t *m;
} cand_t;

static int by_join(const void *a, const void *b)
{
    json_int_t x = sint(((const cand_t *)a)->m, "rev", 0),
               y = sint(((const cand_t *)b)->m, "rev", 0);
    return x < y ? -1 : x > y;
}

json_t *dl_ejob_txn_close(const dl_ejob_view_t *v, double now)
{
    int round = dl_ejob_round(v);
    json_int_t max = sint(v->state, "max_nodes", 1);
    size_t n = 0, cap = json_object_size(v->members);
    const char *id;
    json_t *m;
    /* Any etcd client may have written the state: a round of no node has nothing to close. */
    if (max < 1 || !json_is_object(v->state))
        return NULL;
    cand_t *c = calloc(cap > 0 ? cap : 1, sizeof(*c));
    if (c == NULL)
        return NULL;
    json_object_foreach (v->members, id, m) {
        if (sint(m, "round", -1) == round)
            c[n++] = (cand_t){id, m};
    }
    if (n == 0) {
        free(c);
        return NULL;
    }
    /* The first max_nodes to join take part; the others find the round closed without them. */
    qsort(c, n, sizeof(*c), by_join);
    if ((json_int_t)n > max)
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
        nodes[i] = (dl_rdzv_policy_node_t){.slurm_node_id = -1,
                                           .hint = (int)sint(c[i].m, "node_rank", -1),
                                           .host = sstr(c[i].m, "host"),
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
    const json_t *zero = by[0].m;
    json_int_t port = sint(zero, "master_port", 0);
    if (port <= 0)
        port = sint(v->job, "master_port", DEFAULT_MASTER_PORT);
    json_t *puts = json_array();
    bool complete = puts != NULL; /* every operation made (else ENOMEM) */
    long long world = 0;
    for (size_t r = 0; r < n; r++) {
        const json_t *x = by[r].m;
        json_t *doc =
            json_pack("{s:s, s:s, s:s, s:s, s:I, s:i, s:I, s:I}", "node_id", by[r].id, "host",
                      sstr(x, "host"), "addr", sstr(x, "addr"), "store", sstr(x, "store"), "slots",
                      sint(x, "slots", 1), "node_rank", (int)r, "first_rank", (json_int_t)world,
                      "master_port", sint(x, "master_port", 0));
        if (doc != NULL && n > 1)
            json_object_set_new(doc, "next", json_string(by[(r + 1) % n].id));
        if (json_array_append_new(puts, put(dl__ejob_key(v->prefix, "a/%d/%lld/%s", round,
                                                         (long long)v->rev, by[r].id),
                                            doc, 0)) < 0)
            complete = false;
        world += sint(x, "slots", 1);
    }
    json_t *state = json_deep_copy(v->state);
    json_object_del(state, "nodes"); /* written by a dlaunch before assignment keys */
    json_object_set_new(state, "state", json_string("running"));
    json_object_set_new(state, "assignment", json_integer(v->rev));
    json_object_set_new(state, "node_count", json_integer((json_int_t)n));
    json_object_set_new(state, "node0", json_string(by[0].id));
    json_object_set_new(state, "world_size", json_integer(world));
    json_object_set_new(state, "master_addr", json_string(sstr(zero, "addr")));
    json_object_set_new(state, "master_port", json_integer(port));
    json_object_set_new(state, "store_addr", json_string(sstr(zero, "store")));
    json_object_set_new(state, "time", json_real(now));
    json_t *ev = event("rendezvous", now);
    json_object_update_new(ev, json_pack("{s:i, s:i, s:I, s:I, s:s, s:I}", "round", round, "nodes",
                                         (int)n, "world_size", (json_int_t)world, "restarts",
                                         sint(v->state, "restarts", 0), "master_addr",
                                         sstr(zero, "addr"), "master_port", port));
    char closed[700];
    snprintf(closed, sizeof(closed), "round %d closed: %zu node%s, world size %lld, master %s:%lld",
             round, n, n == 1 ? "" : "s", world, sstr(zero, "addr"), (long long)port);
    free(c);
    free(by);
    /* The last transaction closes: no member joined since the view (every member key is older
     * than it). The assignments go before it in batches within etcd's limit of operations in a
     * transaction, each only while the round is still the view's; with few nodes, all in one. */
    json_t *txns = json_array();
    json_t *last_ops = json_array();
    if (json_array_append_new(last_ops, put(dl__ejob_key(v->prefix, "state"), state, 0)) < 0 ||
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
static void end_ops(const dl_ejob_view_t *v, json_t *ops, json_t *state, json_t *ev,
                    const char *level, const char *text, int64_t linger, double now)
{
    int round = dl_ejob_round(v);
    const char *k;
    json_t *e;
    json_array_append_new(ops, put(dl__ejob_key(v->prefix, "state"), state, linger));
    if (v->job != NULL)
        json_array_append_new(ops,
                              put(dl__ejob_key(v->prefix, "job"), json_incref(v->job), linger));
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
    dl_rdzv_culprit_t prev = read_culprit(json_object_get(v->state, "culprit"), &prev_cause);
    json_int_t count = sint(v->state, "same_failures", 0);
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

static int state_int(const dl_ejob_view_t *v, const char *key, json_int_t dflt)
{
    json_int_t x = sint(v->state, key, dflt);
    return x < INT_MIN ? INT_MIN : x > INT_MAX ? INT_MAX : (int)x;
}

/* What ending the view's round for cause costs, by the one policy (rdzv-policy.h). */
static dl_rdzv_budget_t round_end_cost(const dl_ejob_view_t *v, dl_ejob_cause_t cause,
                                       const json_t *culprit)
{
    return dl_rdzv_policy_round_end(
        core_cause(cause), state_int(v, "restarts", 0), state_int(v, "max_restarts", 0),
        dl_ejob_same_failures(v, cause, culprit), state_int(v, "max_same_failures", 0));
}

bool dl_ejob_next_fails(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const json_t *culprit)
{
    dl_rdzv_budget_t cost = round_end_cost(v, cause, culprit);
    return cost == DL_RDZV_BUDGET_SPENT || cost == DL_RDZV_BUDGET_SAME;
}

json_t *dl_ejob_txn_next(const dl_ejob_view_t *v, dl_ejob_cause_t cause, const char *reason,
                         const json_t *culprit, const dl_ejob_member_t *join, int64_t join_lease,
                         int64_t linger_lease, double now)
{
    json_t *who = culprit != NULL ? json_deep_copy(culprit) : json_object();
    bool failure = dl_rdzv_policy_is_failure(core_cause(cause));
    dl_rdzv_budget_t cost = round_end_cost(v, cause, culprit);
    int round = dl_ejob_round(v);
    json_int_t restarts = sint(v->state, "restarts", 0);
    json_t *state = json_deep_copy(v->state);
    json_t *ops = json_array();
    int same = cost == DL_RDZV_BUDGET_SAME ? dl_ejob_same_failures(v, cause, culprit) : 0;

    json_object_set_new(state, "same_failures",
                        json_integer(dl_ejob_same_failures(v, cause, culprit)));
    json_object_set_new(who, "cause", json_string(cause_name(cause)));
    json_object_set_new(state, "culprit", who);
    if (failure && json_object_get(state, "failure") == NULL)
        json_object_set_new(state, "failure", json_string(reason));
    if (cost == DL_RDZV_BUDGET_SAME || cost == DL_RDZV_BUDGET_SPENT) {
        /* No restart left, or another would fail alike: the job fails with its first failure,
         * or with the one that repeats (exit 5: a scheduler should not requeue it). */
        const char *why = same > 0 ? reason : sstr(state, "failure");
        char text[1400];
        if (same > 0)
            snprintf(text, sizeof(text),
                     "the same failure ended %d rounds in a row (the same rank and cause, no "
                     "step further; restarting will not help): %.1100s",
                     same, why);
        else
            snprintf(text, sizeof(text), "failed after %lld restart%s: %s", (long long)restarts,
                     restarts == 1 ? "" : "s", why);
        json_object_set_new(state, "state", json_string("failed"));
        json_object_set_new(state, "reason", json_string(text));
        json_object_set_new(state, "cause", json_string(cause_name(cause)));
        json_object_set_new(state, "time", json_real(now));
        if (same > 0)
            json_object_set_new(state, "exit_code", json_integer(5));
        json_t *ev = event("job_end", now);
        json_object_update_new(ev, json_pack("{s:s, s:i, s:s}", "status", "failed", "exit_code",
                                             same > 0 ? 5 : 1, "failure", same > 0 ? text : why));
        char line[1500];
        if (same > 0)
            snprintf(line, sizeof(line), "job failed after %lld restart%s: %s", (long long)restarts,
                     restarts == 1 ? "" : "s", text);
        else
            snprintf(line, sizeof(line), "job failed after %s", text + strlen("failed after "));
        end_ops(v, ops, state, ev, "error", line, linger_lease, now);
        return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
    }
    if (cost == DL_RDZV_BUDGET_SPEND)
        restarts++;
    char line[1500];
    if (failure)
        snprintf(line, sizeof(line), "round %d -> %d (restart %lld of %lld): %s", round, round + 1,
                 (long long)restarts, (long long)sint(v->state, "max_restarts", 0), reason);
    else
        snprintf(line, sizeof(line),
                 "round %d -> %d (no failure: the restart budget stays %lld of %lld): %s", round,
                 round + 1, (long long)restarts, (long long)sint(v->state, "max_restarts", 0),
                 reason);
    json_object_set_new(state, "round", json_integer(round + 1));
    json_object_set_new(state, "state", json_string("gathering"));
    json_object_set_new(state, "restarts", json_integer(restarts));
    json_object_set_new(state, "reason", json_string(reason));
    json_object_set_new(state, "cause", json_string(cause_name(cause)));
    json_object_set_new(state, "time", json_real(now));
    json_object_del(state, "nodes");
    json_object_del(state, "assignment");
    json_object_del(state, "node_count");
    json_object_del(state, "node0");
    json_object_del(state, "world_size");
    json_object_del(state, "master_addr");
    json_object_del(state, "master_port");
    json_object_del(state, "store_addr");
    json_t *ev = event("round_changed", now);
    /* The journal's fields as every backend writes them (docs/control.md); the culprit is the
     * state's, where the agents read it. */
    json_object_update_new(ev, json_pack("{s:i, s:s, s:s}", "round", round + 1, "reason", reason,
                                         "cause", cause_name(cause)));
    json_array_append_new(ops, put(dl__ejob_key(v->prefix, "state"), state, 0));
    json_array_append_new(ops, put(event_key(v, round + 1, 0), ev, 0));
    json_array_append_new(
        ops, log_put(v->prefix, round + 1, 0, failure ? "warning" : "info", line, now, 0));
    json_array_append_new(
        ops, del_range(dl__ejob_key(v->prefix, "a/"), dl__ejob_range_end(v->prefix, "a/")));
    if (join != NULL) {
        dl_ejob_member_t mm = *join;
        mm.round = round + 1;
        json_array_append_new(ops, put(dl__ejob_key(v->prefix, "m/%s", join->node_id),
                                       dl_ejob_member_doc(&mm), join_lease));
    }
    return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
}

json_t *dl_ejob_txn_end(const dl_ejob_view_t *v, const char *status, const char *reason,
                        int64_t linger_lease, double now)
{
    json_t *state = json_deep_copy(v->state);
    json_t *ops = json_array();
    int code = strcmp(status, "timed-out") == 0 ? 3 : strcmp(status, "failed") == 0 ? 1 : 0;
    json_object_set_new(state, "state", json_string(status));
    json_object_set_new(state, "reason", json_string(reason));
    json_object_set_new(state, "time", json_real(now));
    json_t *ev = event("job_end", now);
    json_object_update_new(ev, json_pack("{s:s, s:i}", "status",
                                         strcmp(status, "timed-out") == 0 ? "timed_out" : status,
                                         "exit_code", code));
    /* The line our rendezvous logs as the job ends this way. */
    int round = dl_ejob_round(v);
    json_int_t restarts = sint(v->state, "restarts", 0);
    char line[1500];
    if (code == 0 && strcmp(status, "succeeded") == 0)
        snprintf(line, sizeof(line), "job succeeded in round %d, %lld restart%s", round,
                 (long long)restarts, restarts == 1 ? "" : "s");
    else if (code == 3)
        snprintf(line, sizeof(line), "%s", reason);
    else
        snprintf(line, sizeof(line), "job %s in round %d: %s", status, round, reason);
    end_ops(v, ops, state, ev, code == 0 ? "info" : "error", line, linger_lease, now);
    return json_pack("{s:[o], s:o}", "compare", cmp_state(v), "success", ops);
}

json_t *dl_ejob_txn_done(const dl_ejob_view_t *v, const char *node_id)
{
    return json_pack("{s:[o], s:[o]}", "compare", cmp_state(v), "success",
                     put(dl__ejob_key(v->prefix, "done/%s", node_id),
                         json_pack("{s:i}", "round", dl_ejob_round(v)), 0));
}

bool dl_ejob_txn_ok(const json_t *answer)
{
    return json_is_true(json_object_get(answer, "succeeded"));
}

/* ---- Reading ---------------------------------------------------------------------------------- */

json_t *dl_ejob_status(const dl_ejob_view_t *v, const char *run_id)
{
    const json_t *s = v->state;
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "run_id", run_id, "state",
                          sstr(s, "state"), "round", sint(s, "round", 0), "restarts",
                          sint(s, "restarts", 0), "max_restarts", sint(s, "max_restarts", 0),
                          "min_nodes", sint(s, "min_nodes", 1), "max_nodes",
                          sint(s, "max_nodes", 1), "world_size", sint(s, "world_size", 0));
    if (json_object_get(s, "failure") != NULL)
        json_object_set_new(o, "failure", json_string(sstr(s, "failure")));
    json_t *nodes = json_array();
    size_t i;
    json_t *n;
    int round = dl_ejob_round(v);
    if (strcmp(sstr(s, "state"), "running") == 0) {
        json_t *assigned = dl_ejob_assigned_nodes(v);
        json_array_foreach (assigned, i, n) {
            const char *id = sstr(n, "node_id");
            json_t *done = json_object_get(v->done, id);
            json_array_append_new(
                nodes, json_pack("{s:I, s:s, s:s, s:I, s:f, s:b, s:b}", "node_rank",
                                 sint(n, "node_rank", 0), "node_id", id, "host", sstr(n, "host"),
                                 "slots", sint(n, "slots", 1), "heartbeat_age", 0.0, "connected",
                                 json_object_get(v->members, id) != NULL, "left",
                                 done != NULL && json_integer_value(done) == round));
        }
        json_decref(assigned);
    } else {
        /* Gathering: the members so far, without ranks. */
        const char *id;
        json_object_foreach (v->members, id, n) {
            if (sint(n, "round", -1) != round)
                continue;
            json_array_append_new(
                nodes, json_pack("{s:i, s:s, s:s, s:I, s:f, s:b, s:b}", "node_rank", -1, "node_id",
                                 id, "host", sstr(n, "host"), "slots", sint(n, "slots", 1),
                                 "heartbeat_age", 0.0, "connected", 1, "left", 0));
        }
    }
    json_object_set_new(o, "nodes", nodes);
    return o;
}

int dl_ejob_exit_code(const dl_ejob_view_t *v)
{
    const char *s = dl_ejob_state_name(v);
    if (strcmp(s, "failed") == 0)
        return sint(v->state, "exit_code", 1) == 5 ? 5 : 1;
    return strcmp(s, "timed-out") == 0 ? 3 : 0;
}
