/* The field tables of a job's values in etcd (job-records.h): one row a field. docs/etcd.md
 * ("Keys") describes the same fields for people; change both together. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job-records.h"
#include "record-rows.h"

#define T dl_ejob_job_rec_t
static const dl_proto_rec_field_t job_fields[] = {
    REQ(DL_PROTO_REC_INT, min_nodes),     REQ(DL_PROTO_REC_INT, max_nodes),
    OPT(DL_PROTO_REC_INT, max_restarts),  OPT(DL_PROTO_REC_INT, max_same_failures),
    OPT(DL_PROTO_REC_INT, last_call_ms),  OPT(DL_PROTO_REC_INT, join_timeout_ms),
    OPT(DL_PROTO_REC_INT, dead_after_ms), HAS(DL_PROTO_REC_INT, master_port),
    OPT(DL_PROTO_REC_STR, store_key),     END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_job_type = {sizeof(dl_ejob_job_rec_t), job_fields};

#define T dl_ejob_state_rec_t
static const dl_proto_rec_field_t state_fields[] = {
    REQ(DL_PROTO_REC_INT, round),
    REQ(DL_PROTO_REC_STR, state),
    OPT(DL_PROTO_REC_INT, restarts),
    OPT(DL_PROTO_REC_INT, max_restarts),
    OPT(DL_PROTO_REC_INT, max_same_failures),
    HAS(DL_PROTO_REC_INT, min_nodes),
    HAS(DL_PROTO_REC_INT, max_nodes),
    OPT(DL_PROTO_REC_STR, reason),
    OPT(DL_PROTO_REC_STR, cause),
    OPT(DL_PROTO_REC_STR, failure),
    OPT(DL_PROTO_REC_JSON, culprit),
    HAS(DL_PROTO_REC_INT, same_failures),
    HAS(DL_PROTO_REC_INT, exit_code),
    HAS(DL_PROTO_REC_REAL, time),
    HAS(DL_PROTO_REC_INT, assignment),
    HAS(DL_PROTO_REC_INT, node_count),
    OPT(DL_PROTO_REC_STR, node0),
    HAS(DL_PROTO_REC_INT, world_size),
    OPT(DL_PROTO_REC_STR, master_addr),
    HAS(DL_PROTO_REC_INT, master_port),
    OPT(DL_PROTO_REC_STR, store_addr),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_state_type = {sizeof(dl_ejob_state_rec_t), state_fields};

#define T dl_ejob_member_rec_t
static const dl_proto_rec_field_t member_fields[] = {
    REQ(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_STR, node_id),
    OPT(DL_PROTO_REC_STR, host),
    OPT(DL_PROTO_REC_STR, addr),
    OPT(DL_PROTO_REC_STR, store),
    HAS(DL_PROTO_REC_INT, slots),
    HAS(DL_PROTO_REC_INT, node_rank),
    OPT(DL_PROTO_REC_INT, master_port),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_member_type = {sizeof(dl_ejob_member_rec_t), member_fields};

#define T dl_ejob_done_rec_t
static const dl_proto_rec_field_t done_fields[] = {
    REQ(DL_PROTO_REC_INT, round),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_done_type = {sizeof(dl_ejob_done_rec_t), done_fields};

#define T dl_ejob_assign_rec_t
static const dl_proto_rec_field_t assign_fields[] = {
    REQ(DL_PROTO_REC_STR, node_id),    OPT(DL_PROTO_REC_STR, host),
    OPT(DL_PROTO_REC_STR, addr),       OPT(DL_PROTO_REC_STR, store),
    REQ(DL_PROTO_REC_INT, slots),      REQ(DL_PROTO_REC_INT, node_rank),
    REQ(DL_PROTO_REC_INT, first_rank), OPT(DL_PROTO_REC_INT, master_port),
    OPT(DL_PROTO_REC_STR, next),       END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_assign_type = {sizeof(dl_ejob_assign_rec_t), assign_fields};

#define T dl_ejob_verdict_rec_t
static const dl_proto_rec_field_t verdict_fields[] = {
    REQ(DL_PROTO_REC_INT, round),
    OPT(DL_PROTO_REC_JSON, view),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_verdict_type = {sizeof(dl_ejob_verdict_rec_t), verdict_fields};

#define T dl_ejob_store_rec_t
static const dl_proto_rec_field_t store_fields[] = {
    HAS(DL_PROTO_REC_INT, keys),
    HAS(DL_PROTO_REC_INT, store_bytes),
    HAS(DL_PROTO_REC_INT, store_waits),
    HAS(DL_PROTO_REC_INT, store_clients),
    END,
};
#undef T
static const dl_proto_rec_type_t store_type = {sizeof(dl_ejob_store_rec_t), store_fields};

#define T dl_ejob_progress_rec_t
static const dl_proto_rec_field_t progress_fields[] = {
    REQ(DL_PROTO_REC_INT, step),
    HAS(DL_PROTO_REC_REAL, loss),
    HAS(DL_PROTO_REC_REAL, samples_per_s),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_progress_type = {sizeof(dl_ejob_progress_rec_t), progress_fields};

#define T dl_ejob_report_rec_t
static const dl_proto_rec_field_t report_fields[] = {
    HAS(DL_PROTO_REC_INT, v),
    OPT(DL_PROTO_REC_STR, type),
    REQ(DL_PROTO_REC_INT, round),
    OBJ(progress, dl_ejob_progress_type),
    OPT(DL_PROTO_REC_JSON, diag),
    OPT(DL_PROTO_REC_JSON, recovery),
    OPT(DL_PROTO_REC_REAL, time),
    OBJ(store, store_type),
    END,
};
#undef T
const dl_proto_rec_type_t dl_ejob_report_type = {sizeof(dl_ejob_report_rec_t), report_fields};

char *dl_ejob_rec_text(const dl_proto_rec_type_t *t, const void *rec)
{
    json_t *doc = dl_proto_rec_encode(t, rec);
    char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    return text;
}

int dl_ejob_rec_read(const dl_proto_rec_type_t *t, const char *key, const char *text, size_t len,
                     void *rec, char *err, size_t errlen)
{
    char where[700];
    json_error_t jerr;
    json_t *doc = json_loadb(text != NULL ? text : "", len, 0, &jerr);
    snprintf(where, sizeof(where), "etcd key %s", key);
    if (doc == NULL) {
        memset(rec, 0, t->size);
        snprintf(err, errlen, "%s: not JSON (%s)", where, jerr.text);
        return -EBADMSG;
    }
    int r = dl_proto_rec_decode(t, doc, rec, where, err, errlen);
    json_decref(doc);
    return r;
}

void dl_ejob_table_init(dl_ejob_table_t *t, const dl_proto_rec_type_t *type)
{
    memset(t, 0, sizeof(*t));
    t->type = type;
}

static void entry_free(const dl_ejob_table_t *t, dl_ejob_entry_t *e)
{
    free(e->key);
    dl_proto_rec_free(t->type, e->rec);
    free(e->rec);
}

void dl_ejob_table_clear(dl_ejob_table_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        entry_free(t, &t->items[i]);
    free(t->items);
    t->items = NULL;
    t->n = t->cap = 0;
}

static dl_ejob_entry_t *find(const dl_ejob_table_t *t, const char *key)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->items[i].key, key) == 0)
            return &t->items[i];
    return NULL;
}

void *dl_ejob_table_get(const dl_ejob_table_t *t, const char *key)
{
    dl_ejob_entry_t *e = find(t, key);
    return e != NULL ? e->rec : NULL;
}

int dl_ejob_table_put(dl_ejob_table_t *t, const char *key, void *rec, int64_t lease, int64_t rev)
{
    void *own = malloc(t->type->size);
    if (own == NULL)
        return -ENOMEM;
    memcpy(own, rec, t->type->size);
    memset(rec, 0, t->type->size);
    dl_ejob_entry_t *e = find(t, key);
    if (e != NULL) {
        dl_proto_rec_free(t->type, e->rec);
        free(e->rec);
    } else {
        if (t->n == t->cap) {
            size_t cap = t->cap > 0 ? t->cap * 2 : 8;
            dl_ejob_entry_t *items = realloc(t->items, cap * sizeof(*items));
            if (items == NULL) {
                dl_proto_rec_free(t->type, own);
                free(own);
                return -ENOMEM;
            }
            t->items = items;
            t->cap = cap;
        }
        e = &t->items[t->n];
        if ((e->key = strdup(key)) == NULL) {
            dl_proto_rec_free(t->type, own);
            free(own);
            return -ENOMEM;
        }
        t->n++;
    }
    e->rec = own;
    e->lease = lease;
    e->rev = rev;
    return 0;
}

void dl_ejob_table_del(dl_ejob_table_t *t, const char *key)
{
    dl_ejob_entry_t *e = find(t, key);
    if (e == NULL)
        return;
    entry_free(t, e);
    memmove(e, e + 1, (size_t)(&t->items[t->n] - (e + 1)) * sizeof(*e));
    t->n--;
}
