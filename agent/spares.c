/* Hot spares (--spares N, docs/recovery.md "Hot spares"): with in-job recovery, N more workers
 * per node run the job's command with DLAUNCH_SPARE=1 once every worker of the attempt said
 * hello. dlaunch.torch loads the program's imports and then waits on its control channel;
 * when a rank fails, agent.c gives its slot to a spare (its process, pipes and channel) and
 * sends it the rank's environment instead of starting a new process. Spares hold no state:
 * they are SIGKILLed whenever the attempt's workers are stopped, and at the end. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

int dl__spares_plan(dl_agent_t *a)
{
    int n = a->spec->spares;
    if (n <= 0)
        return 0;
    if (!dl__rec_in_job(a)) {
        fprintf(stderr,
                "dlaunch: --spares %d needs --recovery in-job: a spare only takes the "
                "place of a rank that failed in a job that goes on\n",
                n);
        return 2;
    }
    a->spares = calloc((size_t)n, sizeof(*a->spares));
    if (a->spares == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    a->nspares = n;
    for (int k = 0; k < n; k++) {
        dl__worker_t *s = &a->spares[k];
        s->agent = a;
        s->spare = true;
        s->rank = -1 - k;
        s->local_rank = 0; /* placement and console filters: local rank 0's until it has one */
        s->health_rd = -1;
        s->ctl_fd = -1;
    }
    return 0;
}

void dl__spares_fill(dl_agent_t *a)
{
    if (a->nspares == 0 || a->spares_lost || a->sup.phase != DL_SUP_RUNNING ||
        a->sup.stop != DL_SUP_STOP_NONE || a->recovering)
        return;
    /* Only a program that speaks the protocol can use a spare, and it has said so. */
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].pid <= 0 || !a->workers[i].ctl_hello)
            return;
    for (int k = 0; k < a->nspares; k++) {
        dl__worker_t *s = &a->spares[k];
        if (s->pid > 0)
            continue;
        int r = dl__agent_spawn(a, s, a->sup.attempt, dl_sup_restarts_used(&a->sup));
        if (r < 0) {
            dl__agent_log(a, "cannot start spare %d: %s; going on without it", k, strerror(-r));
            a->spares_lost = true;
            return;
        }
    }
}

dl__worker_t *dl__spares_ready(dl_agent_t *a)
{
    for (int k = 0; k < a->nspares; k++) {
        dl__worker_t *s = &a->spares[k];
        if (s->pid > 0 && s->killed_at == 0 && s->ctl_fd >= 0)
            return s;
    }
    return NULL;
}

/* Lets go of what a spare's slot holds once its process is gone or handed on. */
static void spare_release(dl__worker_t *s, bool drain)
{
    if (s->health_rd >= 0)
        close(s->health_rd);
    s->health_rd = -1;
    dl__rec_channel_close(s);
    if (drain && s->output != NULL)
        dl_output_drain(s->output, 0);
    s->output = NULL;
    s->output_owner = NULL;
    s->pid = 0;
    s->killed_at = 0;
}

void dl__spares_handed_on(dl__worker_t *s)
{
    /* Its process, pipes and channel now belong to a rank's slot. */
    s->health_rd = -1;
    s->ctl_fd = -1;
    s->ctl_poll = NULL;
    s->ctl_len = 0;
    spare_release(s, false);
}

bool dl__spares_reaped(dl_agent_t *a, pid_t pid, int status)
{
    for (int k = 0; k < a->nspares; k++) {
        dl__worker_t *s = &a->spares[k];
        if (s->pid != pid)
            continue;
        bool ours = s->killed_at != 0;
        if (kill(-pid, SIGKILL) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot clean up after spare %d: %s", k, strerror(errno));
        dl_guard_watch(&a->guard, pid, 0);
        spare_release(s, true);
        if (!ours) {
            /* It died waiting: started again it would likely die again, every attempt. */
            a->spares_lost = true;
            if (WIFSIGNALED(status))
                dl__agent_log(a,
                              "spare %d (pid %d) was killed by %s while it waited; no spare "
                              "is started again: a failed rank gets a new process",
                              k, (int)pid, dl_signal_name(WTERMSIG(status)));
            else
                dl__agent_log(a,
                              "spare %d (pid %d) exited with code %d while it waited; no "
                              "spare is started again: a failed rank gets a new process",
                              k, (int)pid, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        return true;
    }
    return false;
}

void dl__spares_kill(dl_agent_t *a)
{
    for (int k = 0; k < a->nspares; k++) {
        dl__worker_t *s = &a->spares[k];
        if (s->pid <= 0 || s->killed_at != 0)
            continue;
        if (kill(-s->pid, SIGKILL) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot stop spare %d (pid %d): %s", k, (int)s->pid, strerror(errno));
        s->killed_at = 1; /* ours: not a spare that died by itself */
    }
}

void dl__spares_close(dl_agent_t *a)
{
    dl__spares_kill(a);
    for (int k = 0; k < a->nspares; k++) {
        dl__worker_t *s = &a->spares[k];
        if (s->pid > 0) {
            dl_guard_watch(&a->guard, s->pid, 0);
            spare_release(s, true);
        }
    }
}
