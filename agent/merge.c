/* --merge-output (merge.h). A short list searched linearly: the window holds a few lines per
 * rank, and DL_MERGE_MAX_PENDING bounds the worst case. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "merge.h"

struct dl_merge_entry_s {
    dl_merge_entry_t *next;
    int stream;
    double due;
    int *ranks; /* sorted, distinct */
    size_t nranks, cap;
    size_t len;
    char line[]; /* len bytes */
};

void dl_merge_init(dl_merge_t *m, double window, dl_merge_emit_cb emit, void *ctx)
{
    *m = (dl_merge_t){.window = window, .emit = emit, .ctx = ctx};
}

/* "rank 3", or "ranks " and runs of consecutive ranks ("0-3,6"); cut with "..." if too long. */
static void ranks_text(const int *r, size_t n, char *buf, size_t size)
{
    size_t at = (size_t)snprintf(buf, size, n == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < n && at < size;) {
        size_t j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1)
            j++;
        int w = j > i ? snprintf(buf + at, size - at, "%s%d-%d", i ? "," : "", r[i], r[j])
                      : snprintf(buf + at, size - at, "%s%d", i ? "," : "", r[i]);
        if (w < 0 || (size_t)w >= size - at) {
            snprintf(buf + (size > 4 ? size - 4 : 0), size > 4 ? 4 : size, "...");
            return;
        }
        at += (size_t)w;
        i = j + 1;
    }
}

static void emit_entry(dl_merge_t *m, dl_merge_entry_t *e)
{
    char ranks[256];
    ranks_text(e->ranks, e->nranks, ranks, sizeof(ranks));
    m->emit(m->ctx, e->stream, ranks, e->line, e->len);
}

/* Takes e out of the list (prev is its predecessor or NULL), prints it and frees it. */
static void pop(dl_merge_t *m, dl_merge_entry_t *prev, dl_merge_entry_t *e)
{
    if (prev != NULL)
        prev->next = e->next;
    else
        m->head = e->next;
    if (m->tail == e)
        m->tail = prev;
    m->n--;
    emit_entry(m, e);
    free(e->ranks);
    free(e);
}

static int add_rank(dl_merge_entry_t *e, int rank)
{
    if (e->nranks == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        int *r = realloc(e->ranks, cap * sizeof(*r));
        if (r == NULL)
            return -ENOMEM;
        e->ranks = r;
        e->cap = cap;
    }
    size_t i = e->nranks;
    while (i > 0 && e->ranks[i - 1] > rank) {
        e->ranks[i] = e->ranks[i - 1];
        i--;
    }
    e->ranks[i] = rank;
    e->nranks++;
    return 0;
}

static bool has_rank(const dl_merge_entry_t *e, int rank)
{
    for (size_t i = 0; i < e->nranks; i++)
        if (e->ranks[i] == rank)
            return true;
    return false;
}

int dl_merge_line(dl_merge_t *m, int stream, int rank, const char *line, size_t len, double now)
{
    dl_merge_due(m, now);
    dl_merge_entry_t *prev = NULL;
    for (dl_merge_entry_t *e = m->head; e != NULL; prev = e, e = e->next) {
        if (e->stream != stream || e->len != len || memcmp(e->line, line, len) != 0)
            continue;
        if (has_rank(e, rank)) {
            pop(m, prev, e);
            break;
        }
        if (add_rank(e, rank) == 0)
            return 0;
        break; /* no memory: printed on its own below */
    }
    dl_merge_entry_t *e = calloc(1, sizeof(*e) + len);
    if (e == NULL || add_rank(e, rank) < 0) {
        free(e);
        char ranks[32];
        snprintf(ranks, sizeof(ranks), "rank %d", rank);
        m->emit(m->ctx, stream, ranks, line, len);
        return -ENOMEM;
    }
    e->stream = stream;
    e->due = now + m->window;
    e->len = len;
    memcpy(e->line, line, len);
    if (m->n >= DL_MERGE_MAX_PENDING)
        pop(m, NULL, m->head);
    if (m->tail != NULL)
        m->tail->next = e;
    else
        m->head = e;
    m->tail = e;
    m->n++;
    return 0;
}

void dl_merge_due(dl_merge_t *m, double now)
{
    /* Entries are due in the order they were made: the window is the same for all. */
    while (m->head != NULL && m->head->due <= now)
        pop(m, NULL, m->head);
}

double dl_merge_next(const dl_merge_t *m)
{
    return m->head != NULL ? m->head->due : -1;
}

void dl_merge_flush(dl_merge_t *m)
{
    while (m->head != NULL)
        pop(m, NULL, m->head);
}
