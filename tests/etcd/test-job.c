/* The job's keys and transactions in etcd (etcd/etcd-job.h), without etcd: views made from
 * answers as the gateway writes them, the transactions read back. The ranks must be those of
 * our own rendezvous (docs/rendezvous.md, "Rank assignment rule"). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "etcd-job.h"
#include "etcd.h"

#define P "/dlaunch/j/"

/* A kv as the gateway answers it. */
static json_t *kv(const char *key, json_t *doc, int rev, int lease)
{
    char *text = json_dumps(doc, JSON_COMPACT);
    json_t *k =
        json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "key", dl_etcd_b64_str(key), "value",
                  dl_etcd_b64_str(text), "create_revision", dl_etcd_num(rev), "mod_revision",
                  dl_etcd_num(rev), "version", dl_etcd_num(1), "lease", dl_etcd_num(lease));
    free(text);
    json_decref(doc);
    return k;
}

static json_t *member(const char *id, const char *host, int slots, int hint, int round)
{
    dl_ejob_member_t m = {.node_id = id,
                          .host = host,
                          .addr = host,
                          .store = "h:1",
                          .slots = slots,
                          .node_rank = hint,
                          .master_port = 0,
                          .round = round};
    return dl_ejob_member_doc(&m);
}

/* etcd's answer (body) read by its table into rec, as the agent reads it. */
static void reply_of(const dl_proto_rec_type_t *t, const json_t *body, void *rec)
{
    char err[256];
    ck_assert_msg(dl_etcd_reply(t, body, rec, err, sizeof(err)) == 0, "%s", err);
}

static int load_json(dl_ejob_view_t *v, const json_t *body)
{
    dl_etcd_range_t range;
    reply_of(&dl_etcd_range_type, body, &range);
    int r = dl_ejob_view_load(v, &range);
    dl_proto_rec_free(&dl_etcd_range_type, &range);
    return r;
}

static int watch_json(dl_ejob_view_t *v, const json_t *body)
{
    dl_etcd_watch_t msg;
    reply_of(&dl_etcd_watch_type, body, &msg);
    int r = dl_ejob_view_watch(v, &msg);
    dl_proto_rec_free(&dl_etcd_watch_type, &msg);
    return r;
}

static int64_t count_json(const json_t *body)
{
    dl_etcd_txn_t t;
    reply_of(&dl_etcd_txn_type, body, &t);
    int64_t n = dl_ejob_txn_count(&t);
    dl_proto_rec_free(&dl_etcd_txn_type, &t);
    return n;
}

static void load(dl_ejob_view_t *v, json_t *kvs, int rev)
{
    json_t *range = json_pack("{s:{s:o}, s:o}", "header", "revision", dl_etcd_num(rev), "kvs", kvs);
    dl_ejob_view_init(v, P);
    ck_assert_int_ge(load_json(v, range), 0);
    json_decref(range);
}

static json_t *state_doc(const char *state, int round, int restarts, int max_restarts, int lo,
                         int hi)
{
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "state", state, "round", round, "restarts",
                     restarts, "max_restarts", max_restarts, "min_nodes", lo, "max_nodes", hi);
}

/* The document a txn's success branch puts at key (suffix), decoded. */
static json_t *put_of(const json_t *txn, const char *suffix)
{
    size_t i;
    json_t *op;
    json_array_foreach (json_object_get(txn, "success"), i, op) {
        json_t *p = json_object_get(op, "request_put");
        if (p == NULL)
            continue;
        char *k = dl_etcd_unb64(json_object_get(p, "key"), NULL);
        int hit = k != NULL && strcmp(k + strlen(P), suffix) == 0;
        free(k);
        if (hit) {
            char *v = dl_etcd_unb64(json_object_get(p, "value"), NULL);
            json_t *doc = json_loads(v, 0, NULL);
            free(v);
            return doc;
        }
    }
    return NULL;
}

/* A close's transactions: the last one puts the state. */
static json_t *close_state(const json_t *txns)
{
    return put_of(json_array_get(txns, json_array_size(txns) - 1), "state");
}

/* The assignment a close puts for rank (under a/ROUND/REV/), decoded, and how many it puts. */
static json_t *assigned_at(const json_t *txns, int rank, size_t *count)
{
    size_t i, j, n = 0;
    json_t *t, *op, *found = NULL;
    json_array_foreach (txns, i, t) {
        json_array_foreach (json_object_get(t, "success"), j, op) {
            json_t *p = json_object_get(op, "request_put");
            char *k = p != NULL ? dl_etcd_unb64(json_object_get(p, "key"), NULL) : NULL;
            if (k != NULL && strncmp(k + strlen(P), "a/", 2) == 0) {
                char *v = dl_etcd_unb64(json_object_get(p, "value"), NULL);
                json_t *doc = json_loads(v, 0, NULL);
                free(v);
                n++;
                if (found == NULL && json_integer_value(json_object_get(doc, "node_rank")) == rank)
                    found = doc;
                else
                    json_decref(doc);
            }
            free(k);
        }
    }
    if (count != NULL)
        *count = n;
    return found;
}

static char id_buf[8][64];

static const char *id_at(const json_t *txns, int rank)
{
    json_t *doc = assigned_at(txns, rank, NULL);
    snprintf(id_buf[rank % 8], sizeof(id_buf[0]), "%s",
             json_string_value(json_object_get(doc, "node_id")) ?: "(none)");
    json_decref(doc);
    return id_buf[rank % 8];
}

DL_TEST(prefixes)
{
    char buf[DL_EJOB_MAX_PREFIX];
    DL_CHECK_ERRNO(dl_ejob_prefix(NULL, "exp7", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/dlaunch/exp7/");
    DL_CHECK_ERRNO(dl_ejob_prefix("/site/jobs/a", "exp7", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/site/jobs/a/");
    DL_CHECK_ERRNO(dl_ejob_prefix("/x/", "exp7", buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/x/");
    char tiny[8];
    DL_CHECK_ERRNO(dl_ejob_prefix(NULL, "exp7", tiny, sizeof(tiny)), -EINVAL);
}

DL_TEST(ranks_follow_the_rule)
{
    /* Hints first (b asks for 2), then host name, then node id; slots make first ranks. */
    dl_ejob_view_t v;
    json_t *kvs =
        json_pack("[o, o, o, o, o]", kv(P "state", state_doc("gathering", 0, 0, 3, 1, 4), 2, 0),
                  kv(P "m/a-1", member("a-1", "hostc", 2, -1, 0), 3, 7),
                  kv(P "m/b-1", member("b-1", "hostz", 1, 2, 0), 4, 8),
                  kv(P "m/c-1", member("c-1", "hosta", 4, -1, 0), 5, 9),
                  kv(P "m/d-1", member("d-1", "hostc", 1, -1, 0), 6, 10));
    load(&v, kvs, 6);
    ck_assert_int_eq(dl_ejob_count(&v, 0), 4);
    json_t *t = dl_ejob_txn_close(&v, 1.0);
    json_t *s = close_state(t);
    ck_assert_str_eq(json_string_value(json_object_get(s, "state")), "running");
    ck_assert_str_eq(id_at(t, 0), "c-1"); /* hosta */
    ck_assert_str_eq(id_at(t, 1), "a-1"); /* hostc, a before d */
    ck_assert_str_eq(id_at(t, 2), "b-1"); /* its hint */
    ck_assert_str_eq(id_at(t, 3), "d-1");
    ck_assert_int_eq(json_integer_value(json_object_get(s, "world_size")), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "node_count")), 4);
    ck_assert_str_eq(json_string_value(json_object_get(s, "node0")), "c-1");
    /* The state names the assignment (the view's revision), and lists no node. */
    ck_assert_int_eq(json_integer_value(json_object_get(s, "assignment")), 6);
    ck_assert_ptr_null(json_object_get(s, "nodes"));
    json_t *n3 = assigned_at(t, 3, NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(n3, "first_rank")), 7);
    /* The ring: each node names the one ranked after it, the last the first. */
    ck_assert_str_eq(json_string_value(json_object_get(n3, "next")), "c-1");
    json_decref(n3);
    ck_assert_str_eq(json_string_value(json_object_get(s, "master_addr")), "hosta");
    /* No MASTER_PORT offered: the job's default. */
    ck_assert_int_eq(json_integer_value(json_object_get(s, "master_port")), 29500);
    /* The close compares the state's revision and that no member key changed since the view. */
    ck_assert_int_eq(json_array_size(t), 1);
    ck_assert_int_eq(json_array_size(json_object_get(json_array_get(t, 0), "compare")), 2);
    json_decref(s);
    json_decref(t);
    /* The same members in another order of keys: the same ranks. */
    dl_ejob_view_t w;
    kvs = json_pack("[o, o, o, o, o]", kv(P "m/d-1", member("d-1", "hostc", 1, -1, 0), 6, 10),
                    kv(P "m/c-1", member("c-1", "hosta", 4, -1, 0), 5, 9),
                    kv(P "state", state_doc("gathering", 0, 0, 3, 1, 4), 2, 0),
                    kv(P "m/b-1", member("b-1", "hostz", 1, 2, 0), 4, 8),
                    kv(P "m/a-1", member("a-1", "hostc", 2, -1, 0), 3, 7));
    load(&w, kvs, 6);
    t = dl_ejob_txn_close(&w, 1.0);
    s = close_state(t);
    ck_assert_str_eq(id_at(t, 0), "c-1");
    ck_assert_str_eq(id_at(t, 2), "b-1");
    json_decref(s);
    json_decref(t);
    dl_ejob_view_clear(&v);
    dl_ejob_view_clear(&w);
}

DL_TEST(the_first_max_nodes_to_join_take_part)
{
    dl_ejob_view_t v;
    json_t *kvs =
        json_pack("[o, o, o, o, o]", kv(P "state", state_doc("gathering", 1, 0, 3, 1, 2), 2, 0),
                  kv(P "m/late", member("late", "aaa", 1, -1, 1), 9, 7),
                  kv(P "m/x", member("x", "zzz", 1, -1, 1), 4, 8),
                  kv(P "m/y", member("y", "yyy", 1, -1, 1), 5, 9),
                  /* a member of an older round is not counted */
                  kv(P "m/old", member("old", "bbb", 1, -1, 0), 3, 10));
    load(&v, kvs, 9);
    ck_assert_int_eq(dl_ejob_count(&v, 1), 3);
    json_t *t = dl_ejob_txn_close(&v, 1.0);
    json_t *s = close_state(t);
    size_t count;
    json_decref(assigned_at(t, 0, &count));
    ck_assert_int_eq(count, 2);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "node_count")), 2);
    ck_assert_str_eq(id_at(t, 0), "y");
    ck_assert_str_eq(id_at(t, 1), "x");
    ck_assert_ptr_null(dl_ejob_assigned(&v, "late"));
    json_decref(s);
    json_decref(t);
    dl_ejob_view_clear(&v);
}

/* A round of many nodes (issue #27): the state the watch brings every agent stays small, each
 * node's assignment is a key of its own, and the close fits etcd's limit of operations in a
 * transaction (batches first, each only while the round is the view's; the state last). */
DL_TEST(a_large_round_puts_one_assignment_key_per_node_in_batches)
{
    enum { N = 300 };
    dl_ejob_view_t v;
    json_t *kvs = json_array();
    json_array_append_new(kvs, kv(P "state", state_doc("gathering", 4, 0, 3, N, N), 2, 0));
    for (int i = 0; i < N; i++) {
        char id[32], key[64];
        snprintf(id, sizeof(id), "n%03d", i);
        snprintf(key, sizeof(key), P "m/%s", id);
        json_array_append_new(kvs, kv(key, member(id, "h", 1, -1, 4), 10 + i, 7));
    }
    load(&v, kvs, 10 + N);
    json_t *t = dl_ejob_txn_close(&v, 1.0);
    ck_assert_int_eq(json_array_size(t), 4); /* 128 + 128 + 44 assignments, then the state */
    size_t i;
    json_t *txn;
    json_t *puts = json_array(); /* every key put, as etcd would hold them after the close */
    json_array_foreach (t, i, txn) {
        const json_t *ops = json_object_get(txn, "success");
        ck_assert_int_le(json_array_size(ops), DL_EJOB_MAX_TXN_OPS);
        const json_t *cmp = json_array_get(json_object_get(txn, "compare"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(cmp, "result")), "EQUAL");
        size_t j;
        json_t *op;
        json_array_foreach (ops, j, op) {
            json_t *p = json_object_get(op, "request_put");
            json_array_append_new(
                puts, json_pack("{s:O, s:O, s:o, s:o}", "key", json_object_get(p, "key"), "value",
                                json_object_get(p, "value"), "mod_revision",
                                dl_etcd_num(400 + (int)i), "lease", dl_etcd_num(0)));
        }
    }
    /* The last one closes, and fails if a member joined since the view. */
    ck_assert_int_eq(json_array_size(json_object_get(json_array_get(t, 3), "compare")), 2);
    json_t *s = close_state(t);
    char *text = json_dumps(s, JSON_COMPACT);
    ck_assert_int_lt(strlen(text), 600);
    free(text);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "node_count")), N);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "world_size")), N);
    size_t count;
    json_t *last = assigned_at(t, N - 1, &count);
    ck_assert_int_eq(count, N);
    ck_assert_str_eq(json_string_value(json_object_get(last, "node_id")), "n299");
    ck_assert_int_eq(json_integer_value(json_object_get(last, "first_rank")), N - 1);
    ck_assert_str_eq(json_string_value(json_object_get(last, "next")), "n000");
    json_decref(last);
    json_decref(s);
    /* What etcd then holds reads back: each node finds its own, status lists all in order. */
    dl_ejob_view_t w;
    load(&w, puts, 500);
    ck_assert_int_eq(dl_ejob_node_count(&w), N);
    const dl_ejob_assign_rec_t *me = dl_ejob_assigned(&w, "n123");
    ck_assert_ptr_nonnull(me);
    ck_assert_int_eq(me->node_rank, 123);
    ck_assert_ptr_null(dl_ejob_assigned(&w, "n300"));
    json_t *st = dl_ejob_status(&w, "j");
    const json_t *nodes = json_object_get(st, "nodes");
    ck_assert_int_eq(json_array_size(nodes), N);
    for (int r = 0; r < N; r += 37)
        ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(nodes, r), "node_rank")),
                         r);
    json_decref(st);
    /* The next round takes the assignment keys away, and the state names none. */
    json_t *next = dl_ejob_txn_next(&w, DL_EJOB_CAUSE_REQUESTED, "asked", NULL, NULL, 0, 0, 2.0);
    json_t *ns = put_of(next, "state");
    ck_assert_ptr_null(json_object_get(ns, "assignment"));
    ck_assert_ptr_null(json_object_get(ns, "node_count"));
    int deletes_a = 0;
    json_array_foreach (json_object_get(next, "success"), i, txn) {
        json_t *d = json_object_get(txn, "request_delete_range");
        char *k = d != NULL ? dl_etcd_unb64(json_object_get(d, "key"), NULL) : NULL;
        deletes_a += k != NULL && strcmp(k, P "a/") == 0;
        free(k);
    }
    ck_assert_int_eq(deletes_a, 1);
    json_decref(ns);
    json_decref(next);
    json_decref(t);
    dl_ejob_view_clear(&v);
    dl_ejob_view_clear(&w);
}

DL_TEST(a_state_of_no_nodes_closes_nothing)
{
    /* Another etcd client wrote max_nodes 0 (or a value past int): no round of no node, and no
     * read past the members. */
    static const json_int_t bad[] = {0, -3, (json_int_t)1 << 32};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dl_ejob_view_t v;
        json_t *st = state_doc("gathering", 0, 0, 3, 1, 2);
        json_object_set_new(st, "max_nodes", json_integer(bad[i]));
        json_t *kvs = json_pack("[o, o]", kv(P "state", st, 2, 0),
                                kv(P "m/a", member("a", "h", 1, -1, 0), 3, 7));
        load(&v, kvs, 3);
        if (bad[i] > 0) {
            /* Past int: as many as there are, not a wrapped 0. */
            json_t *t = dl_ejob_txn_close(&v, 1.0);
            json_t *s = close_state(t);
            ck_assert_int_eq(json_integer_value(json_object_get(s, "node_count")), 1);
            json_decref(s);
            json_decref(t);
        } else {
            ck_assert_ptr_null(dl_ejob_txn_close(&v, 1.0));
        }
        dl_ejob_view_clear(&v);
    }
}

DL_TEST(rounds_spend_restarts_on_failures_only)
{
    dl_ejob_view_t v;
    json_t *kvs = json_pack("[o, o]", kv(P "state", state_doc("running", 2, 1, 2, 1, 2), 2, 0),
                            kv(P "ev/00000002-1", json_pack("{s:s}", "event", "rendezvous"), 3, 0));
    load(&v, kvs, 3);
    json_t *t =
        dl_ejob_txn_next(&v, DL_EJOB_CAUSE_WORKER_FAILED, "rank 0 exited", NULL, NULL, 0, 0, 1);
    json_t *s = put_of(t, "state");
    ck_assert_str_eq(json_string_value(json_object_get(s, "state")), "gathering");
    ck_assert_int_eq(json_integer_value(json_object_get(s, "round")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "restarts")), 2);
    ck_assert_str_eq(json_string_value(json_object_get(s, "failure")), "rank 0 exited");
    json_t *ev = put_of(t, "ev/00000003-0");
    ck_assert_str_eq(json_string_value(json_object_get(ev, "event")), "round_changed");
    ck_assert_str_eq(json_string_value(json_object_get(ev, "cause")), "worker_failed");
    ck_assert_ptr_null(json_object_get(ev, "failure")); /* the journal's fields alone */
    json_decref(ev);
    json_decref(s);
    json_decref(t);
    /* An operator's restart or a newcomer spends none. */
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_REQUESTED, "restart requested", NULL, NULL, 0, 0, 1);
    s = put_of(t, "state");
    ck_assert_int_eq(json_integer_value(json_object_get(s, "restarts")), 1);
    json_decref(s);
    json_decref(t);
    dl_ejob_member_t me = {
        .node_id = "n", .host = "h", .addr = "h", .store = "h:1", .slots = 1, .node_rank = -1};
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_NODE_JOINED, "asked to join", NULL, &me, 77, 0, 1);
    json_t *m = put_of(t, "m/n");
    ck_assert_int_eq(json_integer_value(json_object_get(m, "round")), 3);
    json_decref(m);
    json_decref(t);
    dl_ejob_view_clear(&v);

    /* Past max_restarts: the job fails with its first failure; every key but the settings,
     * the state and the events goes, and those go on the linger lease. */
    kvs = json_pack("[o, o]", kv(P "state", state_doc("running", 2, 2, 2, 1, 2), 2, 0),
                    kv(P "ev/00000002-1", json_pack("{s:s}", "event", "rendezvous"), 3, 0));
    load(&v, kvs, 3);
    json_t *who = json_pack("{s:s, s:s, s:i}", "node", "x-1", "host", "x", "node_rank", 1);
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_NODE_LOST, "agent x was lost", who, NULL, 0, 99, 1);
    json_decref(who);
    s = put_of(t, "state");
    ck_assert_str_eq(json_string_value(json_object_get(s, "state")), "failed");
    const json_t *c = json_object_get(s, "culprit");
    ck_assert_str_eq(json_string_value(json_object_get(c, "cause")), "node_lost");
    ck_assert_str_eq(json_string_value(json_object_get(c, "node")), "x-1");
    ev = put_of(t, "ev/00000002-2");
    ck_assert_str_eq(json_string_value(json_object_get(ev, "status")), "failed");
    ck_assert_int_eq(json_integer_value(json_object_get(ev, "exit_code")), 1);
    size_t i, deletes = 0, leased = 0;
    json_t *op;
    json_array_foreach (json_object_get(t, "success"), i, op) {
        deletes += json_object_get(op, "request_delete_range") != NULL;
        leased += dl_etcd_int(json_object_get(json_object_get(op, "request_put"), "lease")) == 99;
    }
    ck_assert_int_eq(deletes, 3); /* the members, the done marks, the assignments */
    ck_assert_int_eq(leased, 4);  /* the state, the old event, the new one and its log line */
    json_decref(ev);
    json_decref(s);
    json_decref(t);
    dl_ejob_view_clear(&v);
}

/* The log line a transaction puts at key, as "LEVEL: TEXT" (static buffer), or "" when none. */
static const char *log_of(const json_t *txn, const char *key)
{
    static char buf[2000];
    json_t *ev = put_of(txn, key);
    if (ev == NULL || strcmp(json_string_value(json_object_get(ev, "event")), "log") != 0) {
        json_decref(ev);
        return "";
    }
    snprintf(buf, sizeof(buf), "%s: %s", json_string_value(json_object_get(ev, "level")),
             json_string_value(json_object_get(ev, "text")));
    json_decref(ev);
    return buf;
}

DL_TEST(the_journal_has_our_rendezvous_log_lines_each_with_a_seq_of_its_own)
{
    /* Where our rendezvous journals a log line, the transaction that does the same puts it
     * next to its event (ev/RRRRRRRR-K-1), with the same text. */
    dl_ejob_settings_t set = {.min_nodes = 1, .max_nodes = 2, .max_restarts = 2};
    json_t *t = dl_ejob_txn_create(P, &set, 1);
    ck_assert_str_eq(log_of(t, "ev/00000000-0-1"),
                     "info: job created: nodes 1:2, at most 2 restarts after failures");
    json_decref(t);

    dl_ejob_view_t v;
    json_t *kvs = json_pack("[o, o, o]", kv(P "state", state_doc("gathering", 1, 0, 3, 1, 2), 2, 0),
                            kv(P "m/x", member("x", "hx", 2, -1, 1), 4, 8),
                            kv(P "m/y", member("y", "hy", 1, -1, 1), 5, 9));
    load(&v, kvs, 5);
    t = dl_ejob_txn_close(&v, 1);
    ck_assert_str_eq(log_of(json_array_get(t, 0), "ev/00000001-1-1"),
                     "info: round 1 closed: 2 nodes, world size 3, master hx:29500");
    json_decref(t);
    dl_ejob_view_clear(&v);

    kvs = json_pack("[o]", kv(P "state", state_doc("running", 2, 1, 2, 1, 2), 2, 0));
    load(&v, kvs, 3);
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_WORKER_FAILED, "rank 0 exited", NULL, NULL, 0, 0, 1);
    ck_assert_str_eq(log_of(t, "ev/00000003-0-1"),
                     "warning: round 2 -> 3 (restart 2 of 2): rank 0 exited");
    json_decref(t);
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_REQUESTED, "restart requested", NULL, NULL, 0, 0, 1);
    ck_assert_str_eq(
        log_of(t, "ev/00000003-0-1"),
        "info: round 2 -> 3 (no failure: the restart budget stays 1 of 2): restart requested");
    json_decref(t);
    t = dl_ejob_txn_end(&v, "succeeded", "succeeded", 99, 1);
    ck_assert_str_eq(log_of(t, "ev/00000002-2-1"), "info: job succeeded in round 2, 1 restart");
    json_decref(t);
    t = dl_ejob_txn_end(&v, "timed-out", "round 2 timed out: 0 of 1 nodes joined within 5 s", 99,
                        1);
    ck_assert_str_eq(log_of(t, "ev/00000002-2-1"),
                     "error: round 2 timed out: 0 of 1 nodes joined within 5 s");
    json_decref(t);
    dl_ejob_view_clear(&v);
    kvs = json_pack("[o]", kv(P "state", state_doc("running", 2, 2, 2, 1, 2), 2, 0));
    load(&v, kvs, 3);
    t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_WORKER_FAILED, "rank 1 exited", NULL, NULL, 0, 99, 1);
    ck_assert_str_eq(log_of(t, "ev/00000002-2-1"),
                     "error: job failed after 2 restarts: rank 1 exited");
    json_decref(t);
    /* A node's workers all done: its own put, on its lease, the round's count in the text. */
    json_t *p = dl_ejob_put_done_log(&v, "x", "hx", 1, 42, 1);
    ck_assert_int_eq(dl_etcd_int(json_object_get(p, "lease")), 42);
    char *k = dl_etcd_unb64(json_object_get(p, "key"), NULL);
    ck_assert_str_eq(k, P "ev/00000002-1-d-x");
    free(k);
    json_decref(p);
    dl_ejob_view_clear(&v);

    /* Every event its own seq, in the order they happened: a transaction's log line after its
     * event, the next revision after both, a line put on its own by its revision alone. */
    int64_t changed = dl_ejob_event_seq(P, P "ev/00000003-0", 10),
            line = dl_ejob_event_seq(P, P "ev/00000003-0-1", 10),
            closed = dl_ejob_event_seq(P, P "ev/00000003-1", 11),
            done = dl_ejob_event_seq(P, P "ev/00000003-1-d-x-1", 12);
    ck_assert_int_lt(changed, line);
    ck_assert_int_lt(line, closed);
    ck_assert_int_lt(closed, done);
    ck_assert_int_eq(done, 12 * DL_EJOB_SEQ_SLOTS);
}

DL_TEST(watch_events_update_the_view)
{
    dl_ejob_view_t v;
    json_t *kvs = json_pack("[o, o]", kv(P "state", state_doc("gathering", 0, 0, 0, 1, 2), 2, 0),
                            kv(P "m/a", member("a", "h", 1, -1, 0), 3, 5));
    load(&v, kvs, 3);
    json_t *put = kv(P "m/b", member("b", "h", 1, -1, 0), 4, 6);
    json_t *del = json_pack("{s:s, s:{s:o, s:o}}", "type", "DELETE", "kv", "key",
                            dl_etcd_b64_str(P "m/a"), "mod_revision", dl_etcd_num(5));
    json_t *msg = json_pack("{s:{s:o}, s:[{s:o}, o]}", "header", "revision", dl_etcd_num(5),
                            "events", "kv", put, del);
    int ch = watch_json(&v, msg);
    ck_assert(ch & DL_EJOB_CH_MEMBERS);
    ck_assert_int_eq(v.rev, 5);
    ck_assert_ptr_null(dl_ejob_member(&v, "a"));
    ck_assert_ptr_nonnull(dl_ejob_member(&v, "b"));
    ck_assert_int_eq(v.members.items[0].lease, 6);
    ck_assert_str_eq(v.members.items[0].key, "b");
    json_decref(msg);
    dl_ejob_view_clear(&v);
}

DL_TEST(base64_and_ranges)
{
    json_t *b = dl_etcd_b64_str("/dlaunch/j/");
    ck_assert_str_eq(json_string_value(b), "L2RsYXVuY2gvai8=");
    size_t n;
    char *back = dl_etcd_unb64(b, &n);
    ck_assert_str_eq(back, "/dlaunch/j/");
    ck_assert_uint_eq(n, 11);
    free(back);
    json_decref(b);
    json_t *end = dl_etcd_prefix_end("/dlaunch/j/");
    back = dl_etcd_unb64(end, NULL);
    ck_assert_str_eq(back, "/dlaunch/j0");
    free(back);
    json_decref(end);
    json_t *bad = json_string("not*base64");
    ck_assert_ptr_null(dl_etcd_unb64(bad, NULL));
    json_decref(bad);
    json_t *num = json_string("9007199254740993");
    ck_assert(dl_etcd_int(num) == 9007199254740993LL);
    json_decref(num);
}

/* The counted join: the member's key and its round's mark on the agent's lease, then a count of
 * that round's marks alone (not the earlier rounds'); the answer's count is read back. */
DL_TEST(joins_and_dones_are_counted_per_round)
{
    dl_ejob_view_t v;
    load(&v, json_pack("[o]", kv(P "state", state_doc("gathering", 3, 0, 1, 2, 4), 7, 0)), 9);
    dl_ejob_member_t m = {
        .node_id = "a", .host = "h", .addr = "h", .store = "h:1", .slots = 1, .node_rank = -1};
    json_t *t = dl_ejob_txn_join_counted(&v, &m, 42);
    json_t *ops = json_object_get(t, "success");
    ck_assert_uint_eq(json_array_size(ops), 3);
    json_t *doc = put_of(t, "m/a");
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "round")), 3);
    json_decref(doc);
    json_t *mark = json_object_get(json_array_get(ops, 1), "request_put");
    char *k = dl_etcd_unb64(json_object_get(mark, "key"), NULL);
    ck_assert_str_eq(k, P "j/3/a");
    free(k);
    ck_assert_int_eq(dl_etcd_int(json_object_get(mark, "lease")), 42);
    json_t *range = json_object_get(json_array_get(ops, 2), "request_range");
    ck_assert(json_is_true(json_object_get(range, "count_only")));
    k = dl_etcd_unb64(json_object_get(range, "key"), NULL);
    char *end = dl_etcd_unb64(json_object_get(range, "range_end"), NULL);
    ck_assert_str_eq(k, P "j/3/");
    ck_assert_str_eq(end, P "j/30"); /* "j/3/" and nothing after: not j/30/... */
    free(k);
    free(end);
    json_decref(t);

    t = dl_ejob_txn_done_counted(&v, "a", 42);
    mark = json_object_get(json_array_get(json_object_get(t, "success"), 1), "request_put");
    k = dl_etcd_unb64(json_object_get(mark, "key"), NULL);
    ck_assert_str_eq(k, P "d/3/a");
    free(k);
    json_decref(t);

    json_t *answer = json_pack("{s:b, s:[{s:{}}, {s:{}}, {s:{s:s}}]}", "succeeded", 1, "responses",
                               "response_put", "response_put", "response_range", "count", "4");
    ck_assert_int_eq(count_json(answer), 4);
    json_decref(answer);
    answer = json_pack("{s:b, s:[{s:{}}]}", "succeeded", 0, "responses", "response_put");
    ck_assert_int_eq(count_json(answer), -1);
    json_decref(answer);
    dl_ejob_view_clear(&v);
}

/* The text a txn's success branch puts at key (suffix), as etcd stores it (malloc'd). */
static char *text_of(const json_t *txn, const char *suffix)
{
    size_t i;
    json_t *op;
    json_array_foreach (json_object_get(txn, "success"), i, op) {
        json_t *p = json_object_get(op, "request_put");
        char *k = p != NULL ? dl_etcd_unb64(json_object_get(p, "key"), NULL) : NULL;
        int hit = k != NULL && strcmp(k + strlen(P), suffix) == 0;
        free(k);
        if (hit)
            return dl_etcd_unb64(json_object_get(p, "value"), NULL);
    }
    return NULL;
}

/* The values are put as the agents of before the field tables put them (docs/etcd.md): compact,
 * keys sorted, the same fields and types, so that agents of either build read each other's. */
DL_TEST(the_values_are_stored_as_before_byte_for_byte)
{
    dl_ejob_settings_t set = {.min_nodes = 1,
                              .max_nodes = 2,
                              .max_restarts = 3,
                              .last_call = 0.5,
                              .join_timeout = 30,
                              .dead_after = 5,
                              .master_port = 29500,
                              .store_key = "k"};
    json_t *t = dl_ejob_txn_create(P, &set, 5.5);
    char *job = text_of(t, "job"), *state = text_of(t, "state");
    ck_assert_str_eq(job, "{\"dead_after_ms\":5000,\"join_timeout_ms\":30000,\"last_call_ms\":500,"
                          "\"master_port\":29500,\"max_nodes\":2,\"max_restarts\":3,"
                          "\"max_same_failures\":0,\"min_nodes\":1,\"store_key\":\"k\"}");
    ck_assert_str_eq(state, "{\"max_nodes\":2,\"max_restarts\":3,\"max_same_failures\":0,"
                            "\"min_nodes\":1,\"reason\":\"the job started\",\"restarts\":0,"
                            "\"round\":0,\"state\":\"gathering\",\"time\":5.5}");
    free(job);
    free(state);
    json_decref(t);
    dl_ejob_view_t v;
    load(&v, json_pack("[o]", kv(P "state", state_doc("gathering", 2, 0, 1, 1, 2), 5, 0)), 6);
    dl_ejob_member_t m = {.node_id = "a",
                          .host = "h",
                          .addr = "10.0.0.1",
                          .store = "10.0.0.1:7",
                          .slots = 4,
                          .node_rank = -1,
                          .master_port = 0};
    t = dl_ejob_txn_join(&v, &m, 9);
    char *member = text_of(t, "m/a");
    ck_assert_str_eq(member, "{\"addr\":\"10.0.0.1\",\"host\":\"h\",\"master_port\":0,"
                             "\"node_id\":\"a\",\"node_rank\":-1,\"round\":2,\"slots\":4,"
                             "\"store\":\"10.0.0.1:7\"}");
    free(member);
    json_decref(t);
    t = dl_ejob_txn_done(&v, "a");
    char *done = text_of(t, "done/a");
    ck_assert_str_eq(done, "{\"round\":2}");
    free(done);
    json_decref(t);
    dl_ejob_view_clear(&v);
}

/* A value under the job's prefix that is not as its table declares it (anyone who can write
 * the prefix may have put it) is refused with one line naming the key and the field; the agent
 * and `dlaunch status` print it. */
DL_TEST(a_malformed_value_names_its_key_and_field)
{
    static const struct {
        const char *key, *doc, *err;
    } cases[] = {
        {P "state", "{\"round\": \"1\", \"state\": \"running\"}",
         "etcd key " P "state: field 'round' must be an integer, got a string"},
        {P "state", "{\"round\": 1}", "etcd key " P "state: missing field 'state'"},
        {P "m/a", "{\"round\": 0, \"slots\": [1]}",
         "etcd key " P "m/a: field 'slots' must be an integer, got an array"},
        {P "a/0/5/a", "{\"node_id\": \"a\", \"slots\": 1, \"node_rank\": 0}",
         "etcd key " P "a/0/5/a: missing field 'first_rank'"},
        {P "job", "{\"min_nodes\": 1, \"max_nodes\": 2, \"store_key\": 7}",
         "etcd key " P "job: field 'store_key' must be a string, got an integer"},
        {P "done/a", "[1]", "etcd key " P "done/a: must be an object, got an array"},
        {P "n/a", "{\"round\": 1, \"time\": 2.5, \"progress\": {\"step\": \"9\"}}",
         "etcd key " P "n/a: field 'progress.step' must be an integer, got a string"},
        {P "verdict", "{\"round\": 1, \"view\": 3}",
         "etcd key " P "verdict: field 'view' must be an object, got an integer"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *k = json_pack("{s:o, s:o, s:o, s:o}", "key", dl_etcd_b64_str(cases[i].key), "value",
                              dl_etcd_b64_str(cases[i].doc), "mod_revision", dl_etcd_num(4),
                              "create_revision", dl_etcd_num(4));
        json_t *range =
            json_pack("{s:{s:o}, s:[o]}", "header", "revision", dl_etcd_num(4), "kvs", k);
        dl_ejob_view_t v;
        dl_ejob_view_init(&v, P);
        ck_assert_int_eq(load_json(&v, range), -EBADMSG);
        ck_assert_str_eq(v.err, cases[i].err);
        /* The same through a watch, on a view that holds a state. */
        json_t *msg = json_pack("{s:[{s:s, s:O}]}", "events", "type", "PUT", "kv", k);
        ck_assert_int_eq(watch_json(&v, msg), -EBADMSG);
        ck_assert_str_eq(v.err, cases[i].err);
        json_decref(msg);
        json_decref(range);
        dl_ejob_view_clear(&v);
    }
}

/* A read of the settings, the state and members comes back as one range the view loads. */
DL_TEST(a_read_loads_as_a_range)
{
    json_t *answer = json_pack(
        "{s:{s:s}, s:b, s:[{s:{s:[o]}}, {s:{s:[o]}}, {s:{s:[o, o]}}]}", "header", "revision", "20",
        "succeeded", 1, "responses", "response_range", "kvs",
        kv(P "job", json_pack("{s:i, s:i}", "min_nodes", 2, "max_nodes", 2), 3, 0),
        "response_range", "kvs", kv(P "state", state_doc("gathering", 0, 0, 1, 2, 2), 5, 0),
        "response_range", "kvs", kv(P "m/a", member("a", "h1", 1, -1, 0), 8, 1),
        kv(P "m/b", member("b", "h2", 1, -1, 0), 9, 2));
    dl_etcd_txn_t read;
    reply_of(&dl_etcd_txn_type, answer, &read);
    dl_ejob_view_t v;
    dl_ejob_view_init(&v, P);
    ck_assert_int_ge(dl_ejob_view_load_read(&v, &read), 0);
    dl_proto_rec_free(&dl_etcd_txn_type, &read);
    ck_assert_int_eq(v.rev, 20);
    ck_assert_int_eq(v.state_rev, 5);
    ck_assert_int_eq(dl_ejob_count(&v, 0), 2);
    json_t *close = dl_ejob_txn_close(&v, 1.0);
    json_t *st = close_state(close);
    ck_assert_str_eq(json_string_value(json_object_get(st, "state")), "running");
    ck_assert_str_eq(id_at(close, 0), "a");
    json_decref(st);
    json_decref(close);
    dl_ejob_view_clear(&v);
    json_decref(answer);
}

/* The same failure round after round (docs/exit-codes.md, 5): the state counts it, and at
 * max_same_failures the job fails with exit 5 before its restarts are spent. */
static json_t *worker_culprit(int rank, int code, int step)
{
    json_t *c = json_pack("{s:s, s:s, s:i, s:i, s:i}", "node", "b", "host", "hb", "node_rank", 1,
                          "rank", rank, "exit_code", code);
    if (step >= 0)
        json_object_set_new(c, "step", json_integer(step));
    return c;
}

static json_int_t state_int(const json_t *txn, const char *field)
{
    json_t *s = put_of(txn, "state");
    json_int_t v = json_integer_value(json_object_get(s, field));
    json_decref(s);
    return v;
}

DL_TEST(the_same_failure_in_a_row_fails_the_job_with_5)
{
    dl_ejob_view_t v;
    json_t *st = state_doc("running", 2, 2, 10, 2, 2);
    json_object_set_new(st, "max_same_failures", json_integer(3));
    json_object_set_new(st, "same_failures", json_integer(2));
    json_t *prev = worker_culprit(1, 7, 40);
    json_object_set_new(prev, "cause", json_string("worker_failed"));
    json_object_set_new(st, "culprit", prev);
    load(&v, json_pack("[o]", kv(P "state", st, 2, 0)), 3);

    /* Another rank, another code, or a step further: the row starts again at 1. */
    static const int other[][3] = {{0, 7, 40}, {1, 8, 40}, {1, 7, 41}};
    for (size_t i = 0; i < 3; i++) {
        json_t *c = worker_culprit(other[i][0], other[i][1], other[i][2]);
        ck_assert_int_eq(dl_ejob_same_failures(&v, DL_EJOB_CAUSE_WORKER_FAILED, c), 1);
        ck_assert(!dl_ejob_next_fails(&v, DL_EJOB_CAUSE_WORKER_FAILED, c));
        json_t *t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_WORKER_FAILED, "r", c, NULL, 0, 0, 1);
        ck_assert_int_eq(state_int(t, "same_failures"), 1);
        ck_assert_int_eq(state_int(t, "round"), 3);
        json_decref(t);
        json_decref(c);
    }
    /* A lost node is no same failure; neither is a failure without a rank. */
    DL_CHECK_ERRNO(dl_ejob_same_failures(&v, DL_EJOB_CAUSE_NODE_LOST, NULL), 0);

    /* The same again (no step known this time, or an earlier one): the third in a row. */
    json_t *c = worker_culprit(1, 7, -1);
    ck_assert_int_eq(dl_ejob_same_failures(&v, DL_EJOB_CAUSE_WORKER_FAILED, c), 3);
    ck_assert(dl_ejob_next_fails(&v, DL_EJOB_CAUSE_WORKER_FAILED, c));
    json_t *t = dl_ejob_txn_next(&v, DL_EJOB_CAUSE_WORKER_FAILED, "rank 1 exited with code 7", c,
                                 NULL, 0, 99, 1);
    json_t *s = put_of(t, "state");
    ck_assert_str_eq(json_string_value(json_object_get(s, "state")), "failed");
    ck_assert_int_eq(json_integer_value(json_object_get(s, "exit_code")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(s, "restarts")), 2);
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(s, "reason")),
                                 "the same failure ended 3 rounds in a row"));
    json_t *ev = put_of(t, "ev/00000002-2");
    ck_assert_int_eq(json_integer_value(json_object_get(ev, "exit_code")), 5);
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(ev, "failure")), "rank 1 exited with code 7"));
    json_decref(ev);
    dl_ejob_view_clear(&v);
    /* Every agent reads the end from the state: exit 5. */
    load(&v, json_pack("[o]", kv(P "state", s, 4, 0)), 4);
    ck_assert_int_eq(dl_ejob_exit_code(&v), 5);
    dl_ejob_view_clear(&v);
    json_decref(t);

    /* max_same_failures 0 (or a state without it): never. */
    st = state_doc("running", 2, 2, 10, 2, 2);
    json_object_set_new(st, "same_failures", json_integer(9));
    prev = worker_culprit(1, 7, -1);
    json_object_set_new(prev, "cause", json_string("worker_failed"));
    json_object_set_new(st, "culprit", prev);
    load(&v, json_pack("[o]", kv(P "state", st, 2, 0)), 3);
    ck_assert_int_eq(dl_ejob_same_failures(&v, DL_EJOB_CAUSE_WORKER_FAILED, c), 10);
    ck_assert(!dl_ejob_next_fails(&v, DL_EJOB_CAUSE_WORKER_FAILED, c));
    dl_ejob_view_clear(&v);
    json_decref(c);
}

/* A node whose read found no assignment asks again in one transaction: its key while the state
 * is the one it read, else the state (a round change deleted the round's keys before the watch
 * brought it), so that it never takes itself for a newcomer to a full job by mistake. */
DL_TEST(a_missing_assignment_is_checked_against_the_state)
{
    dl_ejob_view_t v;
    load(&v, json_pack("[o]", kv(P "state", state_doc("running", 2, 0, 3, 2, 2), 7, 0)), 9);
    json_t *t = dl_ejob_txn_assignment_check(&v, "n1");
    ck_assert_ptr_nonnull(t);
    const json_t *cmp = json_array_get(json_object_get(t, "compare"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(cmp, "target")), "MOD");
    ck_assert_str_eq(json_string_value(json_object_get(cmp, "mod_revision")), "7");
    char *key = dl_etcd_unb64(json_object_get(cmp, "key"), NULL);
    ck_assert_str_eq(key, P "state");
    free(key);
    const json_t *mine =
        json_object_get(json_array_get(json_object_get(t, "success"), 0), "request_range");
    key = dl_etcd_unb64(json_object_get(mine, "key"), NULL);
    ck_assert_ptr_nonnull(strstr(key, "a/2/"));
    ck_assert_ptr_nonnull(strstr(key, "/n1"));
    free(key);
    ck_assert_ptr_null(json_object_get(mine, "serializable")); /* from the leader */
    const json_t *other =
        json_object_get(json_array_get(json_object_get(t, "failure"), 0), "request_range");
    key = dl_etcd_unb64(json_object_get(other, "key"), NULL);
    ck_assert_str_eq(key, P "state");
    free(key);
    /* Either branch's answer reads as a range. */
    json_t *answer =
        json_pack("{s:b, s:[{s:{s:[]}}]}", "succeeded", 0, "responses", "response_range", "kvs");
    dl_etcd_txn_t either;
    reply_of(&dl_etcd_txn_type, answer, &either);
    ck_assert(!either.succeeded);
    ck_assert_ptr_nonnull(dl_etcd_txn_range(&either, 0));
    ck_assert_uint_eq(dl_etcd_txn_range(&either, 0)->nkvs, 0);
    dl_proto_rec_free(&dl_etcd_txn_type, &either);
    json_decref(answer);
    json_decref(t);
    dl_ejob_view_clear(&v);
}

/* A node's report as an agent puts it (n/NODE_ID): a heartbeat message with its time. */
static json_t *report_doc(int round, int node_rank, double time, int recoveries, bool store)
{
    json_t *doc =
        json_pack("{s:i, s:s, s:i, s:f, s:{s:i, s:b}, s:{s:i, s:s, s:[{s:i, s:I}, {s:i, s:I}]}}",
                  "v", 1, "type", "heartbeat", "round", round, "time", time, "recovery",
                  "recoveries", recoveries, "recovering", 0, "diag", "node_rank", node_rank, "host",
                  node_rank ? "h1" : "h0", "ranks", "rank", 2 * node_rank, "step", (json_int_t)5,
                  "rank", 2 * node_rank + 1, "step", (json_int_t)5);
    if (store)
        json_object_set_new(
            doc, "store",
            json_pack("{s:i, s:i, s:i}", "keys", 3, "store_bytes", 30, "store_waits", 1));
    return doc;
}

static json_t *assignment_doc(const char *id, int node_rank)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:i}", "node_id", id, "host", node_rank ? "h1" : "h0",
                     "node_rank", node_rank, "first_rank", 2 * node_rank, "slots", 2);
}

DL_TEST(status_shows_what_the_running_rounds_reports_say)
{
    dl_ejob_view_t v;
    json_t *state = state_doc("running", 1, 1, 3, 2, 2);
    json_object_set_new(state, "assignment", json_integer(5));
    json_object_set_new(state, "reason", json_string("a worker failed"));
    load(&v,
         json_pack("[o, o, o, o, o, o, o]", kv(P "state", state, 7, 0),
                   kv(P "a/1/5/n0", assignment_doc("n0", 0), 6, 0),
                   kv(P "a/1/5/n1", assignment_doc("n1", 1), 6, 0),
                   kv(P "m/n0", member("n0", "h0", 2, -1, 1), 4, 11),
                   kv(P "m/n1", member("n1", "h1", 2, -1, 1), 4, 12),
                   /* node 0 of round 1, with the store; node 1's report is of round 0 */
                   kv(P "n/n0", report_doc(1, 0, 100.0, 2, true), 8, 11),
                   kv(P "n/n1", report_doc(0, 1, 90.0, 9, true), 8, 12)),
         9);
    json_t *st = dl_ejob_status_full(&v, "j", true, 101.5);
    ck_assert_ptr_nonnull(st);
    /* The fields of our rendezvous' status, no more: no reason, no first_rank. */
    ck_assert_ptr_null(json_object_get(st, "reason"));
    const json_t *nodes = json_object_get(st, "nodes");
    ck_assert_int_eq(json_array_size(nodes), 2);
    ck_assert_ptr_null(json_object_get(json_array_get(nodes, 0), "first_rank"));
    /* Node 0's store figures; the recoveries and ranks of round 1's reports only. */
    ck_assert_int_eq(json_integer_value(json_object_get(st, "keys")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "store_bytes")), 30);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "store_waits")), 1);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(st, "recovery"), "recoveries")), 2);
    const json_t *ranks = json_object_get(st, "ranks");
    ck_assert_int_eq(json_array_size(ranks), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(ranks, 0), "node_rank")), 0);
    /* A node's heartbeat is its report's age; none for a node whose report is older. */
    ck_assert(fabs(json_real_value(json_object_get(json_array_get(nodes, 0), "heartbeat_age")) -
                   1.5) < 1e-6);
    ck_assert(json_real_value(json_object_get(json_array_get(nodes, 1), "heartbeat_age")) == 0);
    json_decref(st);
    /* Without --ranks, no rank list. */
    st = dl_ejob_status_full(&v, "j", false, 101.5);
    ck_assert_ptr_null(json_object_get(st, "ranks"));
    json_decref(st);
    dl_ejob_view_clear(&v);
}

/* A node's report whose ranks keep flight recorders: rank 2*node_rank in all-reduce #seq (for
 * 30 s), the other one's last all-reduce #last, done 30 s ago. */
static json_t *recorder_report(int round, int node_rank, double time, int seq, int last)
{
    json_t *doc = report_doc(round, node_rank, time, 0, false);
    json_t *ranks = json_object_get(json_object_get(doc, "diag"), "ranks");
    for (int k = 0; k < 2; k++) {
        json_t *r = json_array_get(ranks, (size_t)k);
        json_object_set_new(r, "recorder", json_true());
        json_object_set_new(r, "ops",
                            json_pack("[{s:i, s:s, s:s, s:f}]", "seq", k ? last : seq, "op",
                                      "all-reduce", "state", k ? "done" : "running", "age_s",
                                      30.0));
    }
    return doc;
}

DL_TEST(a_failures_text_says_where_every_nodes_ranks_were)
{
    /* Node n1's worker failed in round 1: its report (as the failure brings it) and n0's latest
     * of round 1 say where the ranks were, as our server's text does: rank 1, on n0, is the one
     * behind. */
    dl_ejob_view_t v;
    load(&v,
         json_pack("[o, o, o]", kv(P "state", state_doc("running", 1, 0, 3, 2, 2), 7, 0),
                   kv(P "n/n0", recorder_report(1, 0, 100.0, 5, 4), 8, 11),
                   kv(P "n/n1", recorder_report(1, 1, 90.0, 1, 1), 8, 12)),
         9);
    json_t *mine = recorder_report(1, 1, 101.0, 5, 5);
    const json_t *own = json_object_get(mine, "diag");
    char all[1024], alone[1024];
    ck_assert_uint_gt(dl_ejob_explain(&v, "j", "n1", 1, own, 101.5, all, sizeof(all)), 0);
    ck_assert_ptr_nonnull(strstr(all, "rank 1 "));
    /* n0's report of an older round is not where its ranks are now. */
    ((dl_ejob_report_rec_t *)dl_ejob_table_get(&v.reports, "n0"))->round = 0;
    ck_assert_uint_gt(dl_ejob_explain(&v, "j", "n1", 1, own, 101.5, alone, sizeof(alone)), 0);
    ck_assert_ptr_null(strstr(alone, "rank 1 "));
    json_decref(mine);
    dl_ejob_view_clear(&v);
}

DL_TEST(a_victims_failure_is_put_on_the_rank_it_waited_for_as_our_server_puts_it)
{
    /* n1's rank 2 gave up in all-reduce #5 (it failed under it); n0's latest report has rank 1
     * still at #4: the failure is put on rank 1, on n0, whichever node writes first. */
    dl_ejob_view_t v;
    load(&v,
         json_pack("[o, o, o]", kv(P "state", state_doc("running", 1, 0, 3, 2, 2), 7, 0),
                   kv(P "n/n0", recorder_report(1, 0, 100.0, 5, 4), 8, 11),
                   kv(P "n/n1", recorder_report(1, 1, 90.0, 1, 1), 8, 12)),
         9);
    json_t *mine = recorder_report(1, 1, 101.0, 5, 5);
    json_t *own = json_object_get(mine, "diag");
    json_t *op =
        json_array_get(json_object_get(json_array_get(json_object_get(own, "ranks"), 0), "ops"), 0);
    json_object_set_new(op, "state", json_string("failed"));
    dl_ejob_waited_t w;
    ck_assert_int_eq(dl_ejob_waited_for(&v, "j", "n1", 1, own, 101.5, 2, false, &w), 0);
    ck_assert_int_eq(w.rank, 1);
    ck_assert_int_eq(w.node_rank, 0);
    ck_assert_str_eq(w.node, "n0");
    /* A crash inside it (still running, no hang named) is rank 2's own. */
    json_object_set_new(op, "state", json_string("running"));
    ck_assert_int_eq(dl_ejob_waited_for(&v, "j", "n1", 1, own, 101.5, 2, false, &w), -ENOENT);
    /* Named hung while it waited there: rank 1 again. */
    ck_assert_int_eq(dl_ejob_waited_for(&v, "j", "n1", 1, own, 101.5, 2, true, &w), 0);
    ck_assert_int_eq(w.rank, 1);
    /* n0's report of an older round says nothing of this one. */
    ((dl_ejob_report_rec_t *)dl_ejob_table_get(&v.reports, "n0"))->round = 0;
    ck_assert_int_eq(dl_ejob_waited_for(&v, "j", "n1", 1, own, 101.5, 2, true, &w), -ENOENT);
    json_decref(mine);
    dl_ejob_view_clear(&v);
}

DL_TEST(the_straggler_rules_verdict_reaches_every_node_and_the_status)
{
    dl_ejob_view_t v;
    json_t *state = state_doc("running", 1, 0, 3, 2, 2);
    json_object_set_new(state, "assignment", json_integer(5));
    /* A whole view, as the rule writes it (diag/report.c): status shows it field for field. */
    json_t *view = json_pack(
        "{s:i, s:f, s:f, s:f, s:[{s:i, s:i, s:s, s:f, s:f, s:f, s:i, s:f}], s:{s:i, s:f}}", "ranks",
        4, "median_compute_ms", 20.0, "step_ms", 25.0, "samples_per_s", 640.0, "stragglers", "rank",
        1, "node_rank", 1, "host", "h1", "compute_ms", 40.0, "median_ms", 20.0, "slower_pct", 100.0,
        "steps", 12, "cost_samples_per_s", 160.0, "slowest", "rank", 1, "compute_ms", 40.0);
    load(&v,
         json_pack("[o, o, o]", kv(P "state", state, 7, 0),
                   kv(P "n/n0", recorder_report(1, 0, 100.0, 5, 4), 8, 11),
                   kv(P "verdict", json_pack("{s:i, s:O}", "round", 1, "view", view), 9, 11)),
         9);
    /* Node 0 puts it on its lease; each node's report put reads it in the same transaction. */
    json_t *put = dl_ejob_put_verdict(&v, 1, view, 11);
    ck_assert_int_eq(dl_etcd_int(json_object_get(put, "lease")), 11);
    char *k = dl_etcd_unb64(json_object_get(put, "key"), NULL);
    ck_assert_str_eq(k, P "verdict");
    free(k);
    json_t *answer =
        json_pack("{s:b, s:[{s:{}}, {s:{s:[o]}}]}", "succeeded", 1, "responses", "response_put",
                  "response_range", "kvs",
                  kv(P "verdict", json_pack("{s:i, s:O}", "round", 1, "view", view), 9, 11));
    dl_etcd_txn_t read;
    reply_of(&dl_etcd_txn_type, answer, &read);
    json_t *got = dl_ejob_verdict_of(&read, 1);
    ck_assert(json_equal(got, view));
    json_decref(got);
    ck_assert_ptr_null(dl_ejob_verdict_of(&read, 2)); /* another round's: not this one's */
    dl_proto_rec_free(&dl_etcd_txn_type, &read);
    json_decref(answer);
    json_decref(put);
    json_t *t = dl_ejob_txn_report(&v, json_pack("{s:s}", "key", "x"));
    ck_assert_int_eq(json_array_size(json_object_get(t, "success")), 2);
    json_decref(t);
    /* `dlaunch status` shows the rule's verdict over the round, not one reading's. */
    json_t *st = dl_ejob_status_full(&v, "j", false, 101.0);
    ck_assert(json_equal(json_object_get(st, "diag"), view));
    json_decref(st);
    v.verdict->round = 0;
    st = dl_ejob_status_full(&v, "j", false, 101.0);
    ck_assert(!json_equal(json_object_get(st, "diag"), view));
    json_decref(st);
    json_decref(view);
    dl_ejob_view_clear(&v);
}

DL_TEST(a_report_is_put_on_the_lease_within_its_bound)
{
    dl_ejob_view_t v;
    load(&v, json_pack("[o]", kv(P "state", state_doc("running", 1, 0, 3, 2, 2), 7, 0)), 9);
    json_t *beat = report_doc(1, 0, 0, 0, false), *body = NULL;
    ck_assert_int_eq(dl_ejob_put_report(&v, "n0", beat, NULL, 12.5, 77, &body), 0);
    char *key = dl_etcd_unb64(json_object_get(body, "key"), NULL);
    ck_assert_str_eq(key, P "n/n0");
    free(key);
    ck_assert_str_eq(json_string_value(json_object_get(body, "lease")), "77");
    json_decref(body);
    /* Past DL_EJOB_REPORT_MAX: refused, for the agent to leave the ranks' figures out. */
    json_t *big = json_array();
    for (int i = 0; i < DL_EJOB_REPORT_MAX / 16; i++)
        json_array_append_new(big, json_string("0123456789abcdef"));
    json_object_set_new(json_object_get(beat, "diag"), "ranks", big);
    body = NULL;
    ck_assert_int_eq(dl_ejob_put_report(&v, "n0", beat, NULL, 12.5, 77, &body), -EMSGSIZE);
    ck_assert_ptr_null(body);
    json_decref(beat);
    dl_ejob_view_clear(&v);
}

DL_TEST(the_last_failure_is_the_states_culprit_at_its_round_change)
{
    dl_ejob_view_t v;
    json_t *state = state_doc("running", 1, 1, 3, 2, 2);
    json_object_set_new(state, "time", json_real(120.0)); /* the close, after the change */
    json_object_set_new(state, "reason", json_string("rank 3 on h1 exited with code 7"));
    json_object_set_new(state, "culprit",
                        json_pack("{s:s, s:s, s:i, s:i}", "cause", "worker_failed", "host", "h1",
                                  "rank", 3, "exit_code", 7));
    load(&v,
         json_pack(
             "[o, o]", kv(P "state", state, 7, 0),
             kv(P "ev/00000001-0",
                json_pack("{s:s, s:f, s:i}", "event", "round_changed", "time", 99.0, "round", 1), 6,
                0)),
         9);
    dl_proto_status_failure_t f;
    ck_assert_int_eq(dl_ejob_last_failure(&v, &f), 1);
    ck_assert_int_eq(f.round, 0);
    ck_assert_int_eq(f.rank, 3);
    ck_assert(f.has_exit_code && !f.has_signal);
    ck_assert_int_eq(f.exit_code, 7);
    ck_assert_str_eq(f.peer, "h1");
    ck_assert_str_eq(f.reason, "rank 3 on h1 exited with code 7");
    ck_assert(f.time == 99.0);
    free(f.peer);
    free(f.reason);
    dl_ejob_view_clear(&v);
    /* A round a node's loss ended names no failed worker. */
    state = state_doc("running", 1, 1, 3, 2, 2);
    json_object_set_new(state, "culprit",
                        json_pack("{s:s, s:s}", "cause", "node_lost", "host", "h1"));
    load(&v, json_pack("[o]", kv(P "state", state, 7, 0)), 9);
    ck_assert_int_eq(dl_ejob_last_failure(&v, &f), 0);
    dl_ejob_view_clear(&v);
}
