/* The bootstrap through the job's key-value store (DLAUNCH_STORE, which dlaunch gives every
 * worker: the agent's store, or the rendezvous of a job over several nodes), as Gloo meets its
 * peers through a store. Nothing listens on MASTER_PORT, so the port stays free for the worker's
 * own use (torch's TCPStore, say).
 *
 * An all-gather round r of group g: every rank sets dlaunch/coll/g/r/RANK to its blob (hex);
 * rank 0 waits for all of them, puts them together under dlaunch/coll/g/r/all, and the others
 * wait for that one key: about 3n requests a round in all, not n^2. The store starts empty with
 * every attempt of the job (a new round on several nodes, a reset by the agent on one), so a
 * restarted job never reads the last one's table. g counts the groups this process has made,
 * which every rank makes in the same order. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "proto.h"
#include "rdzv-sync.h"

typedef struct {
    dl__coll_boot_t base;
    dl_rdzv_sync_t *client;
    double timeout_s;
    unsigned group;
    int generation;
    unsigned round;
    char store[DL_COLL_ADDR_MAX + 16];
} store_boot_t;

static _Atomic unsigned groups_made;

static void store_close(dl__coll_boot_t *base)
{
    store_boot_t *b = (store_boot_t *)base;
    if (b == NULL)
        return;
    dl_rdzv_sync_close(b->client);
    free(b);
}

/* Sends one store request; *ret_reply (new reference, may be NULL) holds what *ret borrows. */
static int request(store_boot_t *b, const dl_rdzv_kv_req_t *req, json_t **ret_reply,
                   dl_rdzv_kv_result_t *ret, char *err, size_t errlen)
{
    char why[512];
    json_t *reply = NULL;
    dl_rdzv_kv_result_t res;
    dl_proto_errcode_t code;
    /* A wait answers by its own timeout_ms: give the call a margin past it. */
    int r =
        dl_rdzv_sync_kv(b->client, req, b->timeout_s + 5, &reply, &res, &code, why, sizeof(why));
    if (r == -EPROTO) {
        r = code == DL_PROTO_E_TIMEOUT ? -ETIMEDOUT : -EPROTO;
        snprintf(err, errlen, "bootstrap: store at %s, round %u: %s%s", b->store, b->round, why,
                 r == -ETIMEDOUT ? " (a rank did not get this far in time)" : "");
        return r;
    }
    if (r < 0) {
        snprintf(err, errlen, "bootstrap: store at %s: %s", b->store, why);
        return r;
    }
    if (ret_reply != NULL) {
        *ret_reply = reply;
        *ret = res;
    } else {
        json_decref(reply);
    }
    return 0;
}

static void key_of(const store_boot_t *b, int rank, char *key, size_t len)
{
    char group[32];
    /* A later generation (in-job recovery) names its group by the generation: survivors and
     * their replacements made different numbers of groups before. */
    if (b->generation > 0)
        snprintf(group, sizeof(group), "gen%d", b->generation);
    else
        snprintf(group, sizeof(group), "%u", b->group);
    if (rank < 0)
        snprintf(key, len, "dlaunch/coll/%s/%u/all", group, b->round);
    else
        snprintf(key, len, "dlaunch/coll/%s/%u/%d", group, b->round, rank);
}

static int set_hex(store_boot_t *b, const char *key, const unsigned char *data, size_t len,
                   char *err, size_t errlen)
{
    static const char digits[] = "0123456789abcdef";
    char *hex = malloc(2 * len + 1);
    if (hex == NULL) {
        snprintf(err, errlen, "bootstrap: out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < len; i++) {
        hex[2 * i] = digits[data[i] >> 4];
        hex[2 * i + 1] = digits[data[i] & 15];
    }
    hex[2 * len] = '\0';
    dl_rdzv_kv_req_t req = {.op = DL_PROTO_KV_SET, .key = key, .value = hex};
    int r = request(b, &req, NULL, NULL, err, errlen);
    free(hex);
    return r;
}

static int unhex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Waits for key, then reads exactly len bytes of hex from it into out. */
static int wait_get_hex(store_boot_t *b, const char *key, unsigned char *out, size_t len, char *err,
                        size_t errlen)
{
    const char *keys[] = {key};
    dl_rdzv_kv_req_t wait = {.op = DL_PROTO_KV_WAIT,
                             .keys = keys,
                             .nkeys = 1,
                             .timeout_ms = (long long)(b->timeout_s * 1000)};
    dl_rdzv_kv_req_t get = {.op = DL_PROTO_KV_GET, .key = key};
    dl_rdzv_kv_result_t res;
    json_t *result = NULL;
    int r = request(b, &wait, NULL, NULL, err, errlen);
    if (r < 0)
        return r;
    r = request(b, &get, &result, &res, err, errlen);
    if (r < 0)
        return r;
    const char *hex = res.value;
    int ok = hex != NULL && strlen(hex) == 2 * len;
    for (size_t i = 0; ok && i < len; i++) {
        int hi = unhex(hex[2 * i]), lo = unhex(hex[2 * i + 1]);
        ok = hi >= 0 && lo >= 0;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    json_decref(result);
    if (!ok) {
        snprintf(err, errlen, "bootstrap: store at %s: %s is not %zu bytes of hex", b->store, key,
                 len);
        return -EPROTO;
    }
    return 0;
}

static int store_allgather(dl__coll_boot_t *base, const void *mine, size_t len, void *all_v,
                           char *err, size_t errlen)
{
    store_boot_t *b = (store_boot_t *)base;
    unsigned char *all = all_v;
    int n = base->size;
    char key[96];
    int r = 0;

    b->round++;
    memcpy(all + (size_t)base->rank * len, mine, len);
    if (n == 1)
        return 0;
    if (base->rank != 0) {
        key_of(b, base->rank, key, sizeof(key));
        r = set_hex(b, key, mine, len, err, errlen);
        key_of(b, -1, key, sizeof(key));
        return r < 0 ? r : wait_get_hex(b, key, all, (size_t)n * len, err, errlen);
    }
    for (int i = 1; i < n && r == 0; i++) {
        key_of(b, i, key, sizeof(key));
        r = wait_get_hex(b, key, all + (size_t)i * len, len, err, errlen);
    }
    key_of(b, -1, key, sizeof(key));
    return r < 0 ? r : set_hex(b, key, all, (size_t)n * len, err, errlen);
}

int dl__coll_boot_store_open(const dl_coll_options_t *o, dl__coll_boot_t **ret_boot, char *err,
                             size_t errlen)
{
    char host[DL_COLL_ADDR_MAX], why[512];
    int port, r;
    dl_proto_token_t *token = NULL;
    /* Counted on every call, failed ones too, so the ranks' counts stay in step. */
    unsigned group = atomic_fetch_add(&groups_made, 1);

    if (dl_rdzv_endpoint_parse(o->store, host, sizeof(host), &port) < 0) {
        snprintf(err, errlen, "bootstrap: DLAUNCH_STORE '%s' is not HOST:PORT", o->store);
        return -EINVAL;
    }
    store_boot_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, errlen, "bootstrap: out of memory");
        return -ENOMEM;
    }
    b->base.rank = o->rank;
    b->base.size = o->world_size;
    b->base.allgather = store_allgather;
    b->base.close = store_close;
    b->timeout_s = o->timeout_ms / 1000.0;
    b->group = group;
    b->generation = o->generation;
    snprintf(b->store, sizeof(b->store), "%s", o->store);
    r = dl_proto_token_load(o->token_file[0] != '\0' ? o->token_file : NULL, o->token, &token, why,
                            sizeof(why));
    if (r == 0)
        r = dl_rdzv_sync_connect(host, port, DL_PROTO_ROLE_WORKER, o->run_id, token, b->timeout_s,
                                 &b->client, why, sizeof(why));
    dl_proto_token_free(token);
    if (r < 0) {
        snprintf(err, errlen, "bootstrap: store at %s: %s", o->store, why);
        store_close(&b->base);
        return r;
    }
    *ret_boot = &b->base;
    return 0;
}
