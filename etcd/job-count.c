/* What lets an agent of a large job watch the job's state alone (etcd-job.h, "Counting"): the
 * round's members and done nodes as keys of their own, counted by range (count_only) inside the
 * transaction that adds one, and the reads an agent makes instead of following every key. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd-job.h"
#include "etcd.h"

/* A marker key (value "{}") on lease. */
static json_t *mark(json_t *k, int64_t lease)
{
    json_t *p = json_pack("{s:o, s:o}", "key", k, "value", dl_etcd_b64_str("{}"));
    if (p != NULL && lease != 0)
        json_object_set_new(p, "lease", dl_etcd_num(lease));
    return json_pack("{s:o}", "request_put", p);
}

/* Counts the keys under PREFIX WHAT/ROUND/ (what: "j" or "d"). */
static json_t *count_range(const char *prefix, const char *what, int round)
{
    char sub[64];
    snprintf(sub, sizeof(sub), "%s/%d/", what, round);
    return json_pack("{s:{s:o, s:o, s:b}}", "request_range", "key", dl__ejob_key(prefix, "%s", sub),
                     "range_end", dl__ejob_range_end(prefix, sub), "count_only", 1);
}

/* Appends ops to a transaction's success branch (body stolen); NULL stays NULL. */
static json_t *append(json_t *txn, json_t *op1, json_t *op2)
{
    json_t *ops = json_object_get(txn, "success");
    if (txn == NULL || !json_is_array(ops) || op1 == NULL || op2 == NULL) {
        json_decref(txn);
        json_decref(op1);
        json_decref(op2);
        return NULL;
    }
    json_array_append_new(ops, op1);
    json_array_append_new(ops, op2);
    return txn;
}

json_t *dl_ejob_txn_join_counted(const dl_ejob_view_t *v, const dl_ejob_member_t *m, int64_t lease)
{
    int round = dl_ejob_round(v);
    return append(dl_ejob_txn_join(v, m, lease),
                  mark(dl__ejob_key(v->prefix, "j/%d/%s", round, m->node_id), lease),
                  count_range(v->prefix, "j", round));
}

json_t *dl_ejob_txn_next_join_counted(const dl_ejob_view_t *v, dl_ejob_cause_t cause,
                                      const char *reason, const dl_ejob_member_t *join,
                                      int64_t lease, double now)
{
    int round = dl_ejob_round(v) + 1;
    return append(dl_ejob_txn_next(v, cause, reason, NULL, join, lease, 0, now),
                  mark(dl__ejob_key(v->prefix, "j/%d/%s", round, join->node_id), lease),
                  count_range(v->prefix, "j", round));
}

json_t *dl_ejob_txn_done_counted(const dl_ejob_view_t *v, const char *node_id, int64_t lease)
{
    int round = dl_ejob_round(v);
    return append(dl_ejob_txn_done(v, node_id),
                  mark(dl__ejob_key(v->prefix, "d/%d/%s", round, node_id), lease),
                  count_range(v->prefix, "d", round));
}

int64_t dl_ejob_txn_count(const dl_etcd_txn_t *answer)
{
    for (size_t i = answer->nresponses; i-- > 0;) {
        const dl_etcd_range_t *r = dl_etcd_txn_range(answer, i);
        if (r != NULL)
            return r->count;
    }
    return -1;
}

json_t *dl_ejob_range_joined(const dl_ejob_view_t *v, int round)
{
    json_t *op = count_range(v->prefix, "j", round);
    json_t *r = json_incref(json_object_get(op, "request_range"));
    json_decref(op);
    return r;
}

json_t *dl_ejob_txn_read(const char *prefix, const char *member)
{
    json_t *ops =
        json_pack("[{s:{s:o}}, {s:{s:o}}]", "request_range", "key", dl__ejob_key(prefix, "job"),
                  "request_range", "key", dl__ejob_key(prefix, "state"));
    if (ops != NULL && member != NULL && member[0] != '\0')
        json_array_append_new(ops, json_pack("{s:{s:o}}", "request_range", "key",
                                             dl__ejob_key(prefix, "m/%s", member)));
    else if (ops != NULL && member != NULL)
        json_array_append_new(ops, json_pack("{s:{s:o, s:o}}", "request_range", "key",
                                             dl__ejob_key(prefix, "m/"), "range_end",
                                             dl__ejob_range_end(prefix, "m/")));
    return ops != NULL ? json_pack("{s:o}", "success", ops) : NULL;
}

json_t *dl_ejob_txn_check_member(const dl_ejob_view_t *v, const char *node_id)
{
    int round = dl_ejob_round(v);
    return json_pack(
        "{s:[{s:o, s:s, s:s, s:o}], s:[{s:{s:o}}, {s:{s:o}}, {s:{s:o}}, o]}", "compare", "key",
        dl__ejob_key(v->prefix, "state"), "target", "MOD", "result", "EQUAL", "mod_revision",
        dl_etcd_num(v->state_rev), "success", "request_range", "key",
        dl__ejob_key(v->prefix, "m/%s", node_id), "request_range", "key",
        dl__ejob_key(v->prefix, "done/%s", node_id), "request_range", "key",
        dl__ejob_key(v->prefix, "a/%d/%lld/%s", round, (long long)dl_ejob_assignment(v), node_id),
        count_range(v->prefix, "d", round));
}

json_t *dl_ejob_watch_state(const dl_ejob_view_t *v)
{
    return json_pack("{s:{s:o, s:o}}", "create_request", "key", dl__ejob_key(v->prefix, "state"),
                     "start_revision", dl_etcd_num(v->rev + 1));
}

json_t *dl_ejob_watch_gone(const dl_ejob_view_t *v, const char *node_id, int64_t start_rev)
{
    return json_pack("{s:{s:o, s:o, s:[s]}}", "create_request", "key",
                     dl__ejob_key(v->prefix, "m/%s", node_id), "start_revision",
                     dl_etcd_num(start_rev), "filters", "NOPUT");
}

json_t *dl_ejob_range_events(const dl_ejob_view_t *v)
{
    return json_pack("{s:o, s:o}", "key", dl__ejob_key(v->prefix, "ev/"), "range_end",
                     dl__ejob_range_end(v->prefix, "ev/"));
}

int dl_ejob_view_events(dl_ejob_view_t *v, const dl_etcd_range_t *range)
{
    for (size_t i = 0; i < range->nkvs; i++) {
        const dl_etcd_kv_t *kv = &range->kvs[i];
        json_t *doc = kv->value != NULL ? json_loadb(kv->value, kv->value_len, 0, NULL) : NULL;
        if (json_is_object(doc))
            json_object_set(v->events, kv->key, doc);
        json_decref(doc);
    }
    return 0;
}

int dl_ejob_done_logs(const dl_ejob_view_t *v, int round)
{
    char head[32];
    const char *key;
    json_t *ev;
    int n = 0;
    size_t plen = strlen(v->prefix);
    int hlen = snprintf(head, sizeof(head), "ev/%08d-1-d-", round);
    json_object_foreach (v->events, key, ev) {
        if (strncmp(key, v->prefix, plen) == 0 && strncmp(key + plen, head, (size_t)hlen) == 0)
            n++;
    }
    return n;
}

json_t *dl_ejob_range_assignment(const dl_ejob_view_t *v, const char *node_id, bool serializable)
{
    char sub[64];
    snprintf(sub, sizeof(sub), "a/%d/%lld/", dl_ejob_round(v), (long long)dl_ejob_assignment(v));
    json_t *r = node_id != NULL
                    ? json_pack("{s:o}", "key", dl__ejob_key(v->prefix, "%s%s", sub, node_id))
                    : json_pack("{s:o, s:o}", "key", dl__ejob_key(v->prefix, "%s", sub),
                                "range_end", dl__ejob_range_end(v->prefix, sub));
    if (r != NULL && serializable)
        json_object_set_new(r, "serializable", json_true());
    return r;
}

json_t *dl_ejob_txn_assignment_check(const dl_ejob_view_t *v, const char *node_id)
{
    json_t *mine = dl_ejob_range_assignment(v, node_id, false);
    if (mine == NULL)
        return NULL;
    return json_pack("{s:[{s:o, s:s, s:s, s:o}], s:[{s:o}], s:[{s:{s:o}}]}", "compare", "key",
                     dl__ejob_key(v->prefix, "state"), "target", "MOD", "result", "EQUAL",
                     "mod_revision", dl_etcd_num(v->state_rev), "success", "request_range", mine,
                     "failure", "request_range", "key", dl__ejob_key(v->prefix, "state"));
}

int dl_ejob_view_merge(dl_ejob_view_t *v, const dl_etcd_range_t *range)
{
    /* The view's own apply, as a watch would bring the keys; what the watch has brought is
     * unchanged. */
    dl_etcd_watch_t msg = {.nevents = range->nkvs};
    int64_t rev = v->rev;
    int r = 0;
    if ((msg.events = calloc(range->nkvs + 1, sizeof(*msg.events))) == NULL) {
        snprintf(v->err, sizeof(v->err), "etcd's answer: out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < range->nkvs; i++)
        msg.events[i].kv = &range->kvs[i];
    r = dl_ejob_view_watch(v, &msg);
    free(msg.events);
    v->rev = rev;
    return r < 0 ? r : 0;
}

int dl_ejob_txn_rec(const dl_etcd_txn_t *answer, size_t i, const dl_proto_rec_type_t *t, void *rec,
                    char *err, size_t errlen)
{
    const dl_etcd_range_t *r = dl_etcd_txn_range(answer, i);
    memset(rec, 0, t->size);
    if (r == NULL || r->nkvs == 0)
        return 0;
    int ret =
        dl_ejob_rec_read(t, r->kvs[0].key, r->kvs[0].value, r->kvs[0].value_len, rec, err, errlen);
    return ret < 0 ? ret : 1;
}
