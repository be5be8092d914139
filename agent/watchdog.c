/* The hang watchdog: a worker that sent health beats and then fell silent for --health-timeout
 * is hung. Only the culprit is named and killed here (diag.h's rule: ranks waiting in a
 * collective for it are its victims, whatever node it is on); the others stop with the
 * attempt, as the supervisor stops every worker for a restart. */
#include <signal.h>
#include <stdlib.h>

#include "internal.h"

void dl__watchdog_check(dl_agent_t *a, double now)
{
    double timeout = a->spec->health_timeout;
    /* In-job recovery: nothing is killed while a recovery is under way (its ranks are silent
     * by design). */
    if (a->recovering)
        return;
    dl_diag_rank_t *v = calloc((size_t)a->nworkers, sizeof(*v));
    int *index = calloc((size_t)a->nworkers, sizeof(*index));
    size_t n = 0;
    if (v == NULL || index == NULL) {
        dl__agent_log(a,
                      "the hang watchdog is out of memory for %d workers; it looks again "
                      "at its next check",
                      a->nworkers);
        goto out;
    }
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid <= 0 || w->health_rd < 0 || w->hung || !w->beating ||
            now - w->last_beat < timeout)
            continue;
        dl__diag_snapshot(a, w, now, &v[n]);
        v[n].silent_s = now - w->last_beat;
        index[n++] = i;
    }
    bool waiting;
    int c = n > 0 ? dl_diag_hang_culprit(v, n, timeout, &waiting) : -1;
    /* In-job recovery keeps the living ranks: one that only waits for another is never
     * killed, whatever the wait (its culprit's node names the culprit). */
    if (c < 0 || (waiting && a->sup.in_job))
        goto out;
    dl__worker_t *w = &a->workers[index[c]];
    /* Where every rank is, read before anything is killed (docs/diagnostics.md). */
    dl__diag_explain(a, "hang", true);
    /* A watched Python rank says where it is in its own code (docs/python.md). */
    char st[512], more[600];
    if (dl__stacks_read(a, w, 3, st, sizeof(st)) == 0) {
        dl__agent_log(a, "rank %d's Python stack, innermost first: %s", w->rank, st);
        snprintf(more, sizeof(more), "; rank %d is at %s", w->rank, st);
        dl__diag_append(a, more);
    }
    w->hung = true;
    if (waiting)
        dl__agent_log(a,
                      "rank %d (pid %d) sent no health beat for %.1fs, waiting in a "
                      "collective that no rank completes: it is hung; killing it",
                      w->rank, (int)w->pid, v[c].silent_s);
    else
        dl__agent_log(a, "rank %d (pid %d) sent no health beat for %.1fs: it is hung; killing it",
                      w->rank, (int)w->pid, v[c].silent_s);
    const char *diag = dl__diag_text(a);
    dl_ev_worker_hung(a->events, dl__now_unix(),
                      &(dl_ev_worker_hung_t){.rank = w->rank,
                                             .pid = (int)w->pid,
                                             .silent_s = v[c].silent_s,
                                             .waiting = waiting,
                                             .diagnosis = diag[0] != '\0' ? diag : NULL});
    dl__agent_sigkill(a, w);
out:
    free(v);
    free(index);
}
