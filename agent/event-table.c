/* The one encoder of the event stream: a dl_ev_*_t and its table (event-table.h) make the JSON
 * object, field by field in the table's order, so every event is written as docs/events.md
 * lists it and agent-eventtable can hold the docs to the same rows. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "event-table.h"

/* Where a row's has_NAME and NAME_count are, for the kinds and presences that have them. */
#define HOFF_INT_REQ(S, n) 0
#define HOFF_INT_OPT(S, n) offsetof(S, has_##n)
#define HOFF_INT_NULLABLE(S, n) offsetof(S, has_##n)
#define HOFF_I64_REQ(S, n) 0
#define HOFF_I64_OPT(S, n) offsetof(S, has_##n)
#define HOFF_I64_NULLABLE(S, n) offsetof(S, has_##n)
#define HOFF_REAL_REQ(S, n) 0
#define HOFF_REAL_OPT(S, n) offsetof(S, has_##n)
#define HOFF_REAL_NULLABLE(S, n) offsetof(S, has_##n)
#define HOFF_BOOL_REQ(S, n) 0
#define HOFF_BOOL_OPT(S, n) offsetof(S, has_##n)
#define HOFF_BOOL_NULLABLE(S, n) offsetof(S, has_##n)
#define HOFF_STR_REQ(S, n) 0
#define HOFF_STR_SET(S, n) 0
#define HOFF_STR_NULLABLE(S, n) 0
#define HOFF_INTS_REQ(S, n) 0
#define HOFF_INTS_SET(S, n) 0
#define HOFF_INTS_NULLABLE(S, n) 0
#define HOFF_STRV_REQ(S, n) 0
#define HOFF_STRV_SET(S, n) 0
#define HOFF_STRV_NULLABLE(S, n) 0
#define HOFF_OBJ_REQ(S, n) 0
#define HOFF_OBJ_SET(S, n) 0
#define HOFF_OBJ_NULLABLE(S, n) 0
#define HOFF_OBJS_REQ(S, n) 0
#define HOFF_OBJS_SET(S, n) 0
#define HOFF_OBJS_NULLABLE(S, n) 0
#define HOFF_OBJ_OR_STR_REQ(S, n) 0
#define HOFF_OBJ_OR_STR_SET(S, n) 0
#define HOFF_OBJ_OR_STR_NULLABLE(S, n) 0
#define HOFF_TRUE_SET(S, n) 0
#define COFF_INT(S, n) 0
#define COFF_I64(S, n) 0
#define COFF_REAL(S, n) 0
#define COFF_STR(S, n) 0
#define COFF_BOOL(S, n) 0
#define COFF_TRUE(S, n) 0
#define COFF_STRV(S, n) 0
#define COFF_OBJ(S, n) 0
#define COFF_OBJS(S, n) 0
#define COFF_OBJ_OR_STR(S, n) 0
#define COFF_INTS(S, n) offsetof(S, n##_count)

#define ROW(S, k, p, n)                                                                            \
    {.name = #n,                                                                                   \
     .kind = DL_EVK_##k,                                                                           \
     .presence = DL_EVP_##p,                                                                       \
     .off = offsetof(S, n),                                                                        \
     .has_off = HOFF_##k##_##p(S, n),                                                              \
     .count_off = COFF_##k(S, n)},

#define FIELDS(name, LIST)                                                                         \
    static const dl_event_field_t name##_fields[] = {LIST(ROW, dl_ev_##name##_t)};
#define DESC(name, LIST)                                                                           \
    [DL_EV_ID_##name] = {#name, name##_fields, sizeof(name##_fields) / sizeof(name##_fields[0])},

DL_EVENTS(FIELDS)
FIELDS(failure, DL_EV_FAILURE)

const dl_event_desc_t dl_event_table[DL_EV__COUNT] = {DL_EVENTS(DESC)};
const dl_event_desc_t dl_event_failure = {"failure", failure_fields,
                                          sizeof(failure_fields) / sizeof(failure_fields[0])};

static const char *const kind_names[] = {
    [DL_EVK_INT] = "int",
    [DL_EVK_I64] = "int",
    [DL_EVK_REAL] = "float",
    [DL_EVK_STR] = "string",
    [DL_EVK_BOOL] = "bool",
    [DL_EVK_TRUE] = "true",
    [DL_EVK_INTS] = "int[]",
    [DL_EVK_STRV] = "string[]",
    [DL_EVK_OBJ] = "object",
    [DL_EVK_OBJS] = "object[]",
    [DL_EVK_OBJ_OR_STR] = "object or string",
};

void dl_event_type_name(const dl_event_field_t *f, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s", kind_names[f->kind],
             f->presence == DL_EVP_NULLABLE ? " or null" : "");
}

bool dl_event_always(const dl_event_field_t *f)
{
    return f->presence == DL_EVP_REQ || f->presence == DL_EVP_NULLABLE;
}

#define AT(data, off, type) (*(type *)((const char *)(data) + (off)))

/* A json_t * field of the declared JSON type; a bug if not, said once per field. */
static json_t *checked(const char *owner, const dl_event_field_t *f, json_t *v)
{
    bool ok = f->kind == DL_EVK_OBJ    ? json_is_object(v)
              : f->kind == DL_EVK_OBJS ? json_is_array(v)
                                       : json_is_object(v) || json_is_string(v);
    if (ok)
        return v;
    fprintf(stderr, "dlaunch: event '%s': field '%s' is not of type %s (a bug); written null\n",
            owner, f->name, kind_names[f->kind]);
    json_decref(v);
    return json_null();
}

/* The value of f in data, or NULL when it is left out. */
static json_t *value(const char *owner, const dl_event_field_t *f, const void *data)
{
    const void *p = (const char *)data + f->off;
    if ((f->presence == DL_EVP_OPT || f->presence == DL_EVP_NULLABLE) && f->has_off != 0 &&
        !AT(data, f->has_off, bool))
        return f->presence == DL_EVP_NULLABLE ? json_null() : NULL;
    switch (f->kind) {
    case DL_EVK_INT: return json_integer(*(const int *)p);
    case DL_EVK_I64: return json_integer(*(const long long *)p);
    case DL_EVK_REAL: return json_real(*(const double *)p);
    case DL_EVK_BOOL: return json_boolean(*(const bool *)p);
    case DL_EVK_TRUE: return *(const bool *)p ? json_true() : NULL;
    case DL_EVK_STR: {
        const char *s = *(const char *const *)p;
        return s != NULL ? json_string(s) : f->presence == DL_EVP_SET ? NULL : json_null();
    }
    case DL_EVK_INTS: {
        const int *v = *(const int *const *)p;
        int n = AT(data, f->count_off, int);
        if (v == NULL && f->presence != DL_EVP_REQ)
            return f->presence == DL_EVP_SET ? NULL : json_null();
        json_t *a = json_array();
        for (int i = 0; v != NULL && i < n && a != NULL; i++)
            json_array_append_new(a, json_integer(v[i]));
        return a;
    }
    case DL_EVK_STRV: {
        char *const *v = *(char *const *const *)p;
        if (v == NULL && f->presence != DL_EVP_REQ)
            return f->presence == DL_EVP_SET ? NULL : json_null();
        json_t *a = json_array();
        for (; v != NULL && *v != NULL && a != NULL; v++)
            json_array_append_new(a, json_string(*v));
        return a;
    }
    case DL_EVK_OBJ:
    case DL_EVK_OBJS:
    case DL_EVK_OBJ_OR_STR: {
        json_t *v = *(json_t *const *)p;
        if (v == NULL)
            return f->presence == DL_EVP_SET ? NULL : json_null();
        return checked(owner, f, v);
    }
    }
    return NULL;
}

json_t *dl_event_encode(const dl_event_desc_t *d, const void *data)
{
    json_t *o = json_object();
    for (size_t i = 0; i < d->nfields; i++) {
        const dl_event_field_t *f = &d->fields[i];
        json_t *v = value(d->name, f, data);
        if (o == NULL)
            json_decref(v); /* stolen all the same */
        else if (v != NULL)
            json_object_set_new(o, f->name, v);
    }
    return o;
}

/* Drops the json_t * fields of data that dl_event_encode would have stolen. */
static void release_fields(const dl_event_desc_t *d, const void *data)
{
    for (size_t i = 0; i < d->nfields; i++) {
        const dl_event_field_t *f = &d->fields[i];
        if (f->kind != DL_EVK_OBJ && f->kind != DL_EVK_OBJS && f->kind != DL_EVK_OBJ_OR_STR)
            continue;
        if ((f->presence == DL_EVP_OPT || f->presence == DL_EVP_NULLABLE) && f->has_off != 0 &&
            !AT(data, f->has_off, bool))
            continue;
        json_decref(AT(data, f->off, json_t *));
    }
}

int dl_event_emit(dl_events_t *ev, double now, dl_event_id_t id, const void *data)
{
    /* No --events: a launch emits a score of events, each a dozen allocations to encode. */
    if (ev == NULL) {
        release_fields(&dl_event_table[id], data);
        return 0;
    }
    json_t *o = dl_event_encode(&dl_event_table[id], data);
    if (o == NULL)
        return ev == NULL ? 0 : -ENOMEM;
    return dl_events_emit(ev, dl_event_table[id].name, now, o);
}
