/* libFuzzer target for the job state documents of the etcd backend (etcd/job.c): anyone who may
 * write the job's prefix writes them. The input is a JSON object {KEY: DOCUMENT, ...} of the
 * keys under the job's prefix ("job", "state", "m/ID", "done/ID", "ev/..."), each put as etcd's
 * gateway answers a range; a view is loaded from it and every reader and transaction is run on
 * it. Nothing may crash, leak or read out of bounds (ASan), and a transaction that closes a round
 * names at least one node.
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-ejob
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etcd-job.h"
#include "etcd.h"
#include "fuzz.h"

#define P "/dlaunch/f/"

static json_t *range_of(const json_t *docs)
{
    json_t *kvs = json_array();
    const char *k;
    json_t *v;
    int rev = 2;
    json_object_foreach ((json_t *)docs, k, v) {
        char key[600];
        snprintf(key, sizeof(key), P "%s", k);
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (text == NULL)
            continue;
        json_array_append_new(kvs, json_pack("{s:o, s:o, s:o, s:o, s:o}", "key",
                                             dl_etcd_b64_str(key), "value", dl_etcd_b64_str(text),
                                             "mod_revision", dl_etcd_num(rev), "create_revision",
                                             dl_etcd_num(rev), "lease", dl_etcd_num(rev * 7)));
        free(text);
        rev++;
    }
    return json_pack("{s:{s:o}, s:o}", "header", "revision", dl_etcd_num(rev), "kvs", kvs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *docs = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!json_is_object(docs)) {
        json_decref(docs);
        return 0;
    }
    json_t *range = range_of(docs);
    dl_ejob_view_t v;
    dl_ejob_view_init(&v, P);
    dl_etcd_range_t r;
    char err[256];
    bool read =
        range != NULL && dl_etcd_reply(&dl_etcd_range_type, range, &r, err, sizeof(err)) == 0;
    if (read && dl_ejob_view_load(&v, &r) >= 0) {
        int round = dl_ejob_round(&v);
        (void)dl_ejob_state_name(&v);
        (void)dl_ejob_over(&v);
        (void)dl_ejob_count(&v, round);
        (void)dl_ejob_assigned(&v, "a");
        (void)dl_ejob_exit_code(&v);
        json_decref(dl_ejob_status(&v, "f"));
        json_t *close = dl_ejob_txn_close(&v, 1.0);
        if (close != NULL) {
            /* The state its last transaction puts counts the nodes of the round: at least one,
             * and no transaction holds more operations than etcd takes. */
            size_t i;
            json_t *txn;
            json_array_foreach (close, i, txn) {
                DL_FUZZ_REQUIRE(json_array_size(json_object_get(txn, "success")) <=
                                DL_EJOB_MAX_TXN_OPS);
            }
            json_t *last = json_array_get(close, json_array_size(close) - 1);
            json_t *put =
                json_object_get(json_array_get(json_object_get(last, "success"), 0), "request_put");
            char *text = dl_etcd_unb64(json_object_get(put, "value"), NULL);
            json_t *state = text != NULL ? json_loads(text, 0, NULL) : NULL;
            DL_FUZZ_REQUIRE(json_integer_value(json_object_get(state, "node_count")) >= 1);
            json_decref(state);
            free(text);
        }
        json_decref(close);
        dl_ejob_member_t m = {.node_id = "z",
                              .host = "h",
                              .addr = "h",
                              .store = "h:1",
                              .slots = 1,
                              .node_rank = -1,
                              .round = round};
        json_t *culprit = json_object_get(docs, "culprit");
        for (int c = DL_EJOB_CAUSE_WORKER_FAILED; c <= DL_EJOB_CAUSE_EXCLUDED; c++)
            json_decref(dl_ejob_txn_next(&v, (dl_ejob_cause_t)c, "r",
                                         json_is_object(culprit) ? culprit : NULL,
                                         c == DL_EJOB_CAUSE_NODE_JOINED ? &m : NULL, 5, 9, 1.0));
        json_decref(dl_ejob_txn_end(&v, "failed", "r", 9, 1.0));
        json_decref(dl_ejob_txn_join(&v, &m, 5));
        json_decref(dl_ejob_txn_done(&v, "a"));
    }
    if (read)
        dl_proto_rec_free(&dl_etcd_range_type, &r);
    dl_ejob_view_clear(&v);
    json_decref(range);
    json_decref(docs);
    return 0;
}
