/* Where the ranks of a stuck job are, in one line. Every rank numbers its collective operations
 * 1, 2, ... in the same order, so the newest operation that some rank is inside is the one the
 * job waits on; whoever has not reached it is the one to look at. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

const char *dl_diag_op_state_name(dl_diag_op_state_t s)
{
    static const char *names[] = {"none", "queued", "running", "done", "failed"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "none";
}

dl_diag_op_state_t dl_diag_op_state_parse(const char *name)
{
    for (int s = DL_DIAG_OP_QUEUED; s <= DL_DIAG_OP_FAILED; s++)
        if (name != NULL && strcmp(name, dl_diag_op_state_name((dl_diag_op_state_t)s)) == 0)
            return (dl_diag_op_state_t)s;
    return DL_DIAG_OP_NONE;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

size_t dl_diag_ranks_text(int *ranks, size_t n, char *buf, size_t len)
{
    size_t off = 0;
    if (len == 0)
        return 0;
    buf[0] = '\0';
    qsort(ranks, n, sizeof(*ranks), cmp_int);
    for (size_t i = 0; i < n && off < len;) {
        size_t k = i;
        while (k + 1 < n && ranks[k + 1] == ranks[k] + 1)
            k++;
        int w = k > i ? snprintf(buf + off, len - off, "%s%d-%d", i ? "," : "", ranks[i], ranks[k])
                      : snprintf(buf + off, len - off, "%s%d", i ? "," : "", ranks[i]);
        off += w > 0 ? (size_t)w : 0;
        i = k + 1;
    }
    return off < len ? off : len - 1;
}

typedef struct {
    char *buf;
    size_t len, off;
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out_t *o, const char *fmt, ...)
{
    if (o->off + 1 >= o->len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(o->buf + o->off, o->len - o->off, fmt, ap);
    va_end(ap);
    if (w > 0)
        o->off += (size_t)w < o->len - o->off ? (size_t)w : o->len - o->off - 1;
}

static const dl_diag_op_t *newest(const dl_diag_rank_t *r)
{
    return r->nops > 0 ? &r->ops[r->nops - 1] : NULL;
}

/* An operation that has a rank inside it. One that failed under it counts: it failed because a
 * peer went away (or was killed for a hang) while the rank waited there, which is where the
 * account must leave it. */
static bool inside(const dl_diag_op_t *op)
{
    return op != NULL && (op->state == DL_DIAG_OP_RUNNING || op->state == DL_DIAG_OP_QUEUED ||
                          op->state == DL_DIAG_OP_FAILED);
}

static bool stopped(const dl_diag_rank_t *r)
{
    return r->proc == 'T' || r->proc == 't';
}

int dl_diag_hang_culprit(const dl_diag_rank_t *v, size_t n, double timeout, bool *ret_waiting)
{
    int culprit = -1, waiter = -1;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_rank_t *r = &v[i];
        if (r->silent_s < 0 || r->silent_s < timeout)
            continue;
        /* A stopped process is the culprit wherever its last operation left it, but not one
         * whose collective failed under it: a peer went away first, and the rank is on its
         * way out, where a leak checker at exit (LeakSanitizer) holds it traced ('t') for a
         * while. */
        const dl_diag_op_t *op = newest(r);
        if (inside(op) && (op->state == DL_DIAG_OP_FAILED || !stopped(r))) {
            if (r->silent_s >= 2 * timeout && (waiter < 0 || r->silent_s > v[waiter].silent_s))
                waiter = (int)i;
        } else if (culprit < 0 || r->silent_s > v[culprit].silent_s) {
            culprit = (int)i;
        }
    }
    *ret_waiting = culprit < 0 && waiter >= 0;
    return culprit >= 0 ? culprit : waiter;
}

static void seconds(out_t *o, double s)
{
    if (s < 10)
        put(o, "%.1f s", s);
    else
        put(o, "%.0f s", s);
}

static void rank_list(out_t *o, int *ranks, size_t n)
{
    char text[256];
    dl_diag_ranks_text(ranks, n, text, sizeof(text));
    put(o, "%s %s", n == 1 ? "rank" : "ranks", text);
}

/* "rank 3 on node 1" when the job has several nodes. */
static void who(out_t *o, const dl_diag_rank_t *r, bool nodes)
{
    put(o, "rank %d", r->rank);
    if (nodes && r->node_rank >= 0)
        put(o, " on node %d%s%s%s", r->node_rank, r->host ? " (" : "", r->host ? r->host : "",
            r->host ? ")" : "");
}

static void about(out_t *o, const dl_diag_rank_t *r)
{
    const dl_diag_op_t *last = newest(r);
    bool open = false;
    if (last != NULL) {
        put(o, " (its last: %s #%llu, %s", last->op, (unsigned long long)last->seq,
            dl_diag_op_state_name(last->state));
        if (last->age_s >= 0 && inside(last)) {
            put(o, " for ");
            seconds(o, last->age_s);
        } else if (last->age_s >= 0) {
            put(o, " ");
            seconds(o, last->age_s);
            put(o, " ago");
        }
        open = true;
    }
    if (r->proc == 'T' || r->proc == 't') {
        put(o, "%sits process is stopped", open ? "; " : " (");
        open = true;
    } else if (r->proc == 'Z' || r->proc == 'X') {
        put(o, "%sits process is gone", open ? "; " : " (");
        open = true;
    }
    if (open)
        put(o, ")");
}

size_t dl_diag_explain(const dl_diag_rank_t *v, size_t n, char *buf, size_t len)
{
    out_t o = {buf, len, 0};
    if (len == 0)
        return 0;
    buf[0] = '\0';
    /* Five lists of ranks: inside the operation, behind it, without a recorder, stopped, and
     * at its number in another operation. */
    int *lists = calloc(5 * (n + 1), sizeof(int));
    int *in = lists, *behind = lists + (n + 1), *none = lists + 2 * (n + 1);
    int *stopped = lists + 3 * (n + 1), *other = lists + 4 * (n + 1);
    if (lists == NULL) {
        put(&o, "(out of memory)");
        return o.off;
    }
    bool nodes = false;
    for (size_t i = 1; i < n; i++)
        nodes = nodes || v[i].node_rank != v[0].node_rank;
    /* The newest operation anyone is inside: the one the job waits on. */
    uint64_t seq = 0;
    const dl_diag_op_t *target = NULL;
    size_t nnone = 0, nstopped = 0;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_op_t *op = newest(&v[i]);
        if (!v[i].recorder || op == NULL) {
            none[nnone++] = v[i].rank;
            continue;
        }
        if (v[i].proc == 'T' || v[i].proc == 't')
            stopped[nstopped++] = v[i].rank;
        if (inside(op) && op->seq > seq) {
            seq = op->seq;
            target = op;
        }
    }
    if (nnone == n) {
        put(&o, "no rank has a flight recorder (yet: the workers have not formed a process group, "
                "or do not use dlaunch's collective library)");
        goto out;
    }
    if (target == NULL) {
        /* Nobody waits inside a collective: all are computing (or stopped) between two. */
        uint64_t hi = 0;
        for (size_t i = 0; i < n; i++)
            if (v[i].recorder && newest(&v[i]) != NULL && newest(&v[i])->seq > hi)
                hi = newest(&v[i])->seq;
        size_t nb = 0;
        for (size_t i = 0; i < n; i++)
            if (v[i].recorder && newest(&v[i]) != NULL && newest(&v[i])->seq < hi)
                behind[nb++] = v[i].rank;
        if (nb > 0) {
            rank_list(&o, behind, nb);
            put(&o,
                " %s behind the others, who finished operation #%llu; no rank is inside a "
                "collective",
                nb == 1 ? "is" : "are", (unsigned long long)hi);
        } else {
            put(&o, "no rank is inside a collective: all finished operation #%llu",
                (unsigned long long)hi);
        }
        if (nstopped > 0) {
            put(&o, "; stopped: ");
            rank_list(&o, stopped, nstopped);
        }
        goto out;
    }
    /* Who is in it, who has not come, and whether they even agree on what it is. */
    size_t nin = 0, nb = 0;
    double waited = -1;
    const dl_diag_rank_t *first_behind = NULL;
    const char *other_op = NULL;
    size_t nother = 0;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_op_t *op = newest(&v[i]);
        if (!v[i].recorder || op == NULL)
            continue;
        if (op->seq < seq || (op->seq == seq && op->state == DL_DIAG_OP_QUEUED &&
                              target->state != DL_DIAG_OP_QUEUED)) {
            if (first_behind == NULL)
                first_behind = &v[i];
            behind[nb++] = v[i].rank;
            continue;
        }
        if (op->seq == seq && strcmp(op->op, target->op) != 0) {
            other_op = op->op;
            other[nother++] = v[i].rank;
            continue;
        }
        if (op->seq == seq && inside(op)) {
            in[nin++] = v[i].rank;
            if (op->age_s > waited)
                waited = op->age_s;
        }
    }
    if (nother > 0) {
        put(&o, "the ranks disagree on operation #%llu: ", (unsigned long long)seq);
        rank_list(&o, in, nin);
        put(&o, " %s in %s, ", nin == 1 ? "is" : "are", target->op);
        rank_list(&o, other, nother);
        put(&o, " in %s", other_op);
        if (nb > 0) {
            put(&o, "; ");
            rank_list(&o, behind, nb);
            put(&o, " never got there");
        }
        goto out;
    }
    if (nb == 0) {
        put(&o, "every rank is inside %s #%llu", target->op, (unsigned long long)seq);
        if (waited >= 0) {
            put(&o, ", the first for ");
            seconds(&o, waited);
        }
    } else {
        if (nb == 1) {
            who(&o, first_behind, nodes);
            put(&o, " never entered %s #%llu", target->op, (unsigned long long)seq);
            about(&o, first_behind);
        } else {
            rank_list(&o, behind, nb);
            put(&o, " never entered %s #%llu", target->op, (unsigned long long)seq);
        }
        put(&o, "; ");
        rank_list(&o, in, nin);
        put(&o, " %s waited in it", nin == 1 ? "has" : "have");
        if (waited >= 0) {
            put(&o, " for ");
            seconds(&o, waited);
        }
    }
    if (nb != 1 && nstopped > 0) {
        put(&o, "; stopped: ");
        rank_list(&o, stopped, nstopped);
    }
    if (nnone > 0 && nnone < n) {
        put(&o, "; no flight recorder: ");
        rank_list(&o, none, nnone);
    }
out:
    free(lists);
    return o.off;
}

double dl_diag_stuck_s(const dl_diag_rank_t *v, size_t n)
{
    double longest = 0;
    for (size_t i = 0; i < n; i++) {
        const dl_diag_op_t *op = newest(&v[i]);
        if (v[i].recorder && inside(op) && op->age_s > longest)
            longest = op->age_s;
    }
    return longest;
}
