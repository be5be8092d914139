/* The restart policy as a pure state machine. A job attempt ends when every worker of it has
 * exited; the first failure decides whether the next attempt starts or the job fails. */
#include <signal.h>
#include <string.h>

#include "supervisor.h"

void dl_sup_init(dl_sup_t *sup, int nworkers, int max_restarts)
{
    memset(sup, 0, sizeof(*sup));
    sup->nworkers = nworkers;
    sup->max_restarts = max_restarts;
    sup->phase = DL_SUP_IDLE;
}

static void start_attempt(dl_sup_t *sup, dl_sup_actions_t *act)
{
    sup->phase = DL_SUP_RUNNING;
    sup->stop = DL_SUP_STOP_NONE;
    sup->running = sup->nworkers;
    sup->succeeded = 0;
    act->flags |= DL_SUP_SPAWN;
    act->attempt = sup->attempt;
}

static void finish(dl_sup_t *sup, dl_sup_actions_t *act, int exit_code)
{
    sup->phase = DL_SUP_DONE;
    act->flags |= DL_SUP_EXIT;
    act->exit_code = exit_code;
}

/* Every worker of the attempt is gone: decide what comes next. */
static void attempt_over(dl_sup_t *sup, dl_sup_actions_t *act)
{
    if (sup->phase == DL_SUP_STOPPING)
        act->flags |= DL_SUP_DISARM_TIMER;
    switch (sup->stop) {
    case DL_SUP_STOP_NONE:
        finish(sup, act, sup->succeeded == sup->nworkers ? 0 : 1);
        break;
    case DL_SUP_STOP_RESTART:
        sup->attempt++;
        start_attempt(sup, act);
        break;
    case DL_SUP_STOP_FAIL:
        finish(sup, act, 1);
        break;
    case DL_SUP_STOP_SIGNAL:
        finish(sup, act, 128 + sup->signal);
        break;
    }
}

static void begin_stop(dl_sup_t *sup, dl_sup_actions_t *act, dl_sup_stop_t why, int sig)
{
    sup->stop = why;
    if (sup->running == 0) {
        attempt_over(sup, act);
        return;
    }
    sup->phase = DL_SUP_STOPPING;
    act->flags |= DL_SUP_KILL | DL_SUP_ARM_TIMER;
    act->kill_signal = sig;
}

static void worker_failed(dl_sup_t *sup, const dl_sup_event_t *ev, double now,
                          dl_sup_actions_t *act)
{
    if (sup->stop != DL_SUP_STOP_NONE) {
        /* Workers dying of the SIGTERM we sent are not news. */
        if (sup->running == 0)
            attempt_over(sup, act);
        return;
    }
    sup->has_failure = true;
    sup->first_failure = (dl_sup_failure_t){
        .rank = ev->rank,
        .attempt = sup->attempt,
        .exit_code = ev->kind == DL_SUP_EV_WORKER_EXIT && ev->signal == 0 ? ev->exit_code : -1,
        .signal = ev->kind == DL_SUP_EV_WORKER_EXIT ? ev->signal : 0,
        .spawn_errno = ev->kind == DL_SUP_EV_SPAWN_FAILED ? ev->spawn_errno : 0,
        .time = now,
    };
    begin_stop(sup, act,
               sup->attempt < sup->max_restarts ? DL_SUP_STOP_RESTART : DL_SUP_STOP_FAIL,
               SIGTERM);
}

dl_sup_actions_t dl_sup_step(dl_sup_t *sup, const dl_sup_event_t *ev, double now)
{
    dl_sup_actions_t act = {0};

    if (sup->phase == DL_SUP_DONE)
        return act;

    switch (ev->kind) {
    case DL_SUP_EV_START:
        if (sup->phase == DL_SUP_IDLE)
            start_attempt(sup, &act);
        break;

    case DL_SUP_EV_WORKER_EXIT:
    case DL_SUP_EV_SPAWN_FAILED:
        if (sup->phase == DL_SUP_IDLE || sup->running == 0)
            break;
        sup->running--;
        if (ev->kind == DL_SUP_EV_WORKER_EXIT && ev->signal == 0 && ev->exit_code == 0) {
            sup->succeeded++;
            if (sup->running == 0)
                attempt_over(sup, &act);
        } else {
            worker_failed(sup, ev, now, &act);
        }
        break;

    case DL_SUP_EV_SIGNAL:
        if (sup->phase == DL_SUP_IDLE) {
            sup->signal = ev->signal;
            finish(sup, &act, 128 + ev->signal);
        } else if (sup->stop == DL_SUP_STOP_SIGNAL) {
            /* A second signal while stopping: the user is done waiting. */
            act.flags |= DL_SUP_KILL;
            act.kill_signal = SIGKILL;
        } else {
            sup->signal = ev->signal;
            if (sup->phase == DL_SUP_STOPPING) {
                sup->stop = DL_SUP_STOP_SIGNAL;
                act.flags |= DL_SUP_KILL;
                act.kill_signal = ev->signal;
            } else {
                begin_stop(sup, &act, DL_SUP_STOP_SIGNAL, ev->signal);
            }
        }
        break;

    case DL_SUP_EV_STOP_TIMEOUT:
        if (sup->phase == DL_SUP_STOPPING) {
            act.flags |= DL_SUP_KILL;
            act.kill_signal = SIGKILL;
        }
        break;
    }
    return act;
}
