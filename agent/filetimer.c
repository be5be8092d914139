/* The file-timer table (filetimer.h). Linear scans: a node holds a few timers per worker, and
 * the cap bounds the worst case. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "filetimer.h"
#include "timer-request.h"

int dl_filetimer_parse(const char *line, size_t len, dl_filetimer_req_t *ret)
{
    if (len > DL_FILETIMER_MAX_LINE)
        return -EINVAL;
    json_auto_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    dl_proto_timer_request_t q;
    char err[160];
    if (dl_proto_rec_decode(&dl_proto_timer_request_type, o, &q, "timer", err, sizeof(err)) < 0)
        return -EINVAL;
    dl_filetimer_req_t r = {
        .pid = (int)q.pid, .expiration_time = q.expiration_time, .signal = (int)q.signal};
    size_t slen = strlen(q.scope_id);
    bool ok = q.pid > 0 && q.pid <= 0x7fffffff && q.signal >= 0 && q.signal <= 64 &&
              isfinite(q.expiration_time) && slen < sizeof(r.scope_id);
    if (ok)
        memcpy(r.scope_id, q.scope_id, slen + 1);
    dl_proto_rec_free(&dl_proto_timer_request_type, &q);
    if (!ok)
        return -EINVAL;
    *ret = r;
    return 0;
}

void dl_filetimer_init(dl_filetimer_table_t *tab)
{
    *tab = (dl_filetimer_table_t){0};
}

void dl_filetimer_free(dl_filetimer_table_t *tab)
{
    if (tab == NULL)
        return;
    free(tab->t);
    *tab = (dl_filetimer_table_t){0};
}

static size_t find(const dl_filetimer_table_t *tab, int pid, const char *scope)
{
    for (size_t i = 0; i < tab->n; i++)
        if (tab->t[i].pid == pid && strcmp(tab->t[i].scope_id, scope) == 0)
            return i;
    return tab->n;
}

int dl_filetimer_apply(dl_filetimer_table_t *tab, const dl_filetimer_req_t *req)
{
    size_t i = find(tab, req->pid, req->scope_id);
    if (req->expiration_time < 0) {
        if (i < tab->n)
            tab->t[i] = tab->t[--tab->n];
        return 0;
    }
    if (i < tab->n) {
        tab->t[i] = *req;
        return 0;
    }
    if (tab->n >= DL_FILETIMER_MAX_TIMERS)
        return -E2BIG;
    if (tab->n == tab->cap) {
        size_t cap = tab->cap ? tab->cap * 2 : 16;
        dl_filetimer_req_t *t = realloc(tab->t, cap * sizeof(*t));
        if (t == NULL)
            return -ENOMEM;
        tab->t = t;
        tab->cap = cap;
    }
    tab->t[tab->n++] = *req;
    return 0;
}

int dl_filetimer_due(const dl_filetimer_table_t *tab, double now, dl_filetimer_req_t *ret)
{
    /* The earliest expired timer with a signal is the earliest of its own pid's too, so one
     * pass finds the worker torch's watchdog would reap first. */
    const dl_filetimer_req_t *best = NULL;
    for (size_t i = 0; i < tab->n; i++) {
        const dl_filetimer_req_t *t = &tab->t[i];
        if (t->expiration_time <= now && t->signal > 0 &&
            (best == NULL || t->expiration_time < best->expiration_time))
            best = t;
    }
    if (best == NULL)
        return 0;
    *ret = *best;
    return 1;
}

void dl_filetimer_forget_pid(dl_filetimer_table_t *tab, int pid)
{
    for (size_t i = 0; i < tab->n;) {
        if (tab->t[i].pid == pid)
            tab->t[i] = tab->t[--tab->n];
        else
            i++;
    }
}

double dl_filetimer_next(const dl_filetimer_table_t *tab)
{
    double next = -1;
    for (size_t i = 0; i < tab->n; i++)
        if (tab->t[i].signal > 0 && (next < 0 || tab->t[i].expiration_time < next))
            next = tab->t[i].expiration_time;
    return next;
}
