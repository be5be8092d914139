/* docs/events.md against the agent's event table (agent/event-table.h): its table of each
 * event's fields at a glance lists exactly the table's events, and for each its fields with
 * their JSON types, those it always has and those it has when they apply. The docs are the
 * stream's API for scripts, so a field added to the table and not to the docs fails here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "event-table.h"

#define GLANCE "| event | always | when they apply |"
#define MAXF 64

typedef struct {
    char name[64], type[64];
    bool always;
} doc_field_t;

typedef struct {
    char event[64];
    doc_field_t f[MAXF];
    int n;
} doc_row_t;

static char *read_doc(void)
{
    const char *root = getenv("SOURCE_ROOT");
    ck_assert_msg(root != NULL, "SOURCE_ROOT is not set");
    char path[4096];
    snprintf(path, sizeof(path), "%s/docs/events.md", root);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* "`rank` int, `exit_code` int or null" into row's fields; always says which column. */
static void parse_cell(const char *s, const char *end, bool always, doc_row_t *row)
{
    for (;;) {
        const char *a = memchr(s, '`', (size_t)(end - s));
        if (a == NULL)
            return;
        const char *b = memchr(a + 1, '`', (size_t)(end - a - 1));
        if (b == NULL || row->n == MAXF)
            return;
        const char *next = memchr(b + 1, '`', (size_t)(end - b - 1));
        const char *t = b + 1, *te = next != NULL ? next : end;
        while (t < te && (*t == ' ' || *t == ','))
            t++;
        while (te > t && (te[-1] == ' ' || te[-1] == ','))
            te--;
        doc_field_t *f = &row->f[row->n++];
        snprintf(f->name, sizeof(f->name), "%.*s", (int)(b - a - 1), a + 1);
        snprintf(f->type, sizeof(f->type), "%.*s", (int)(te - t), t);
        f->always = always;
        s = te;
    }
}

/* The glance table's rows; returns how many. */
static int parse_doc(const char *doc, doc_row_t *rows, int max)
{
    const char *p = strstr(doc, GLANCE);
    ck_assert_msg(p != NULL, "docs/events.md has no '%s' table", GLANCE);
    p = strchr(p, '\n') + 1; /* the header */
    p = strchr(p, '\n');     /* the separator */
    int n = 0;
    while (p != NULL && p[1] == '|' && n < max) {
        p++;
        const char *eol = strchr(p, '\n');
        if (eol == NULL)
            eol = p + strlen(p);
        const char *c1 = strchr(p + 1, '|'), *c2 = c1 ? strchr(c1 + 1, '|') : NULL,
                   *c3 = c2 ? strchr(c2 + 1, '|') : NULL;
        ck_assert_msg(c3 != NULL && c3 < eol, "docs/events.md: a glance row without 3 cells");
        doc_row_t *r = &rows[n++];
        memset(r, 0, sizeof(*r));
        const char *e = memchr(p, '`', (size_t)(c1 - p));
        const char *ee = e ? memchr(e + 1, '`', (size_t)(c1 - e - 1)) : NULL;
        if (e != NULL && ee != NULL)
            snprintf(r->event, sizeof(r->event), "%.*s", (int)(ee - e - 1), e + 1);
        parse_cell(c1 + 1, c2, true, r);
        parse_cell(c2 + 1, c3, false, r);
        p = eol;
    }
    return n;
}

/* The row docs/events.md should have for d, for the message that says how to mend it. */
static void expected_row(const dl_event_desc_t *d, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "| `%s` |", d->name);
    for (int col = 0; col < 2; col++) {
        bool first = true;
        for (size_t i = 0; i < d->nfields && off < len; i++) {
            char t[64];
            if (dl_event_always(&d->fields[i]) != (col == 0))
                continue;
            dl_event_type_name(&d->fields[i], t, sizeof(t));
            off += (size_t)snprintf(buf + off, len - off, "%s`%s` %s", first ? " " : ", ",
                                    d->fields[i].name, t);
            first = false;
        }
        if (off < len)
            off += (size_t)snprintf(buf + off, len - off, " |");
    }
}

/* How docs doc differs from the events in table: one line each into out; returns how many. */
static int compare(const char *doc, const dl_event_desc_t *table, size_t nevents, char *out,
                   size_t len)
{
    static doc_row_t rows[64];
    int nrows = parse_doc(doc, rows, 64), bad = 0;
    size_t off = 0;
    out[0] = '\0';
#define SAY(...)                                                                                   \
    do {                                                                                           \
        bad++;                                                                                     \
        if (off < len)                                                                             \
            off += (size_t)snprintf(out + off, len - off, __VA_ARGS__);                            \
    } while (0)
    for (int r = 0; r < nrows; r++) {
        bool known = false;
        for (size_t e = 0; e < nevents; e++)
            known |= strcmp(rows[r].event, table[e].name) == 0;
        if (!known)
            SAY("docs/events.md lists '%s', which the agent's event table has not\n",
                rows[r].event);
    }
    for (size_t e = 0; e < nevents; e++) {
        const dl_event_desc_t *d = &table[e];
        const doc_row_t *row = NULL;
        for (int r = 0; r < nrows; r++)
            if (strcmp(rows[r].event, d->name) == 0)
                row = &rows[r];
        int before = bad;
        if (row == NULL) {
            SAY("%s: not in docs/events.md's table of fields at a glance\n", d->name);
        } else {
            for (size_t i = 0; i < d->nfields; i++) {
                const dl_event_field_t *f = &d->fields[i];
                const doc_field_t *g = NULL;
                char t[64];
                dl_event_type_name(f, t, sizeof(t));
                for (int k = 0; k < row->n; k++)
                    if (strcmp(row->f[k].name, f->name) == 0)
                        g = &row->f[k];
                if (g == NULL)
                    SAY("%s: field '%s' (%s) is not in docs/events.md\n", d->name, f->name, t);
                else if (strcmp(g->type, t) != 0)
                    SAY("%s: field '%s' is %s, docs/events.md says '%s'\n", d->name, f->name, t,
                        g->type);
                else if (g->always != dl_event_always(f))
                    SAY("%s: field '%s' is %s, docs/events.md puts it under '%s'\n", d->name,
                        f->name, dl_event_always(f) ? "always there" : "there when it applies",
                        g->always ? "always" : "when they apply");
            }
            for (int k = 0; k < row->n; k++) {
                bool known = false;
                for (size_t i = 0; i < d->nfields; i++)
                    known |= strcmp(row->f[k].name, d->fields[i].name) == 0;
                if (!known)
                    SAY("%s: docs/events.md lists field '%s', which the event has not\n", d->name,
                        row->f[k].name);
            }
        }
        if (bad > before && off < len) {
            char want[2048];
            expected_row(d, want, sizeof(want));
            off += (size_t)snprintf(out + off, len - off, "  the row should read: %s\n", want);
        }
    }
#undef SAY
    return bad;
}

DL_TEST(the_docs_list_every_event_and_field_of_the_table_with_its_type)
{
    char *doc = read_doc();
    static char why[1 << 16];
    int bad = compare(doc, dl_event_table, DL_EV__COUNT, why, sizeof(why));
    /* libcheck's messages are short: the list goes to stderr. */
    if (bad > 0)
        fputs(why, stderr);
    ck_assert_msg(bad == 0, "docs/events.md and agent/event-table.h differ in %d place%s (above)",
                  bad, bad == 1 ? "" : "s");
    free(doc);
}

/* The check catches what it is for: a field the table gained and the docs did not, a type the
 * docs have wrong, an event the docs lack. */
DL_TEST(a_field_added_to_the_table_alone_fails_the_check)
{
    char *doc = read_doc();
    static char why[1 << 16];
    dl_event_desc_t table[DL_EV__COUNT];
    memcpy(table, dl_event_table, sizeof(table));
    const dl_event_desc_t *ws = &dl_event_table[DL_EV_ID_worker_start];
    dl_event_field_t more[MAXF];
    memcpy(more, ws->fields, ws->nfields * sizeof(*more));
    more[ws->nfields] =
        (dl_event_field_t){.name = "shard", .kind = DL_EVK_INT, .presence = DL_EVP_OPT};
    table[DL_EV_ID_worker_start].fields = more;
    table[DL_EV_ID_worker_start].nfields = ws->nfields + 1;
    ck_assert_int_eq(compare(doc, table, DL_EV__COUNT, why, sizeof(why)), 1);
    ck_assert_msg(strstr(why, "worker_start: field 'shard' (int) is not in docs/events.md") != NULL,
                  "%s", why);
    ck_assert_msg(strstr(why, ", `shard` int |") != NULL, "%s", why);

    /* One event fewer in the table: the docs' row of it is named. */
    ck_assert_int_eq(compare(doc, dl_event_table, DL_EV__COUNT - 1, why, sizeof(why)), 1);
    ck_assert_msg(strstr(why, "lists 'job_end'") != NULL, "%s", why);
    free(doc);
}

DL_TEST(a_type_the_docs_have_wrong_fails_the_check)
{
    char *doc = read_doc();
    static char why[1 << 16];
    char *row = strstr(strstr(doc, GLANCE), "| `worker_hung` |");
    ck_assert_ptr_nonnull(row);
    char *silent = strstr(row, "`silent_s` float");
    ck_assert_ptr_nonnull(silent);
    memcpy(silent + strlen("`silent_s` "), "int  ", 5);
    ck_assert_int_eq(compare(doc, dl_event_table, DL_EV__COUNT, why, sizeof(why)), 1);
    ck_assert_msg(
        strstr(why, "worker_hung: field 'silent_s' is float, docs/events.md says 'int'") != NULL,
        "%s", why);
    free(doc);
}

static int allocations;

static void *counting_malloc(size_t n)
{
    allocations++;
    return malloc(n);
}

/* Without --events a launch still emits every event: none may cost an allocation, and what
 * the caller handed over (a reason object) is released all the same. */
DL_TEST(an_event_without_a_stream_allocates_nothing_and_frees_what_it_was_given)
{
    json_set_alloc_funcs(counting_malloc, free);
    json_t *reason = json_pack("{s:s}", "kind", "exit");
    json_incref(reason); /* one reference of ours, to see the event's go */
    ck_assert_int_eq(reason->refcount, 2);
    allocations = 0;
    ck_assert_int_eq(dl_ev_restart(NULL, 1.5, &(dl_ev_restart_t){.attempt = 1, .reason = reason}),
                     0);
    ck_assert_int_eq(dl_ev_worker_start(NULL, 1.5, &(dl_ev_worker_start_t){.rank = 3, .pid = 42}),
                     0);
    ck_assert_int_eq(allocations, 0);
    ck_assert_int_eq(reason->refcount, 1);
    json_decref(reason);
}
