/* The restart policy as a pure state machine. A job attempt ends when every worker of it has
 * exited; the first failure decides whether the next attempt starts or the job fails. In remote
 * mode that decision belongs to the rendezvous: the supervisor reports and waits. */
#include <signal.h>
#include <string.h>

#include "rdzv-policy.h"
#include "supervisor.h"

void dl_sup_init(dl_sup_t *sup, int nworkers, int max_restarts)
{
    memset(sup, 0, sizeof(*sup));
    sup->nworkers = nworkers;
    sup->max_restarts = max_restarts;
    sup->phase = DL_SUP_IDLE;
}

void dl_sup_set_in_job(dl_sup_t *sup, bool on)
{
    sup->in_job = on;
}

void dl_sup_set_max_same(dl_sup_t *sup, int n)
{
    sup->max_same = n;
}

int dl_sup_restarts_used(const dl_sup_t *sup)
{
    return sup->attempt + sup->recoveries;
}

int dl_sup_attempts(const dl_sup_t *sup)
{
    if (sup->in_job && sup->starts > 0)
        return sup->starts;
    return sup->attempt + 1;
}

void dl_sup_init_remote(dl_sup_t *sup, int nworkers)
{
    dl_sup_init(sup, nworkers, 0);
    sup->remote = true;
}

static void start_attempt(dl_sup_t *sup, dl_sup_actions_t *act)
{
    sup->starts++;
    sup->recovering = false;
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
    /* A worker that cannot be reaped holds what it held (a device, a mount): nothing more starts
     * on this node. A stop signal still says how the agent ends. */
    if (sup->unhealthy && sup->stop != DL_SUP_STOP_SIGNAL) {
        finish(sup, act, DL_SUP_EXIT_UNHEALTHY);
        return;
    }
    switch (sup->stop) {
    case DL_SUP_STOP_NONE:
        if (sup->remote) {
            sup->phase = DL_SUP_WAITING;
            act->flags |= DL_SUP_NODE_DONE;
        } else {
            finish(sup, act, sup->succeeded == sup->nworkers ? 0 : 1);
        }
        break;
    case DL_SUP_STOP_REPORT: sup->phase = DL_SUP_WAITING; break;
    case DL_SUP_STOP_REJOIN:
        sup->phase = DL_SUP_WAITING;
        act->flags |= DL_SUP_JOIN;
        break;
    case DL_SUP_STOP_END: finish(sup, act, sup->end_code); break;
    case DL_SUP_STOP_RESTART:
        sup->attempt++;
        start_attempt(sup, act);
        break;
    case DL_SUP_STOP_FAIL: finish(sup, act, 1); break;
    case DL_SUP_STOP_SAME: finish(sup, act, DL_SUP_EXIT_SAME_FAILURE); break;
    case DL_SUP_STOP_SIGNAL: finish(sup, act, 128 + sup->signal); break;
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

static bool same_failure(const dl_sup_failure_t *a, const dl_sup_failure_t *b)
{
    return a->rank == b->rank && a->exit_code == b->exit_code && a->signal == b->signal &&
           a->spawn_errno == b->spawn_errno && a->hung == b->hung && a->oom == b->oom;
}

/* Local mode, a restart's first failure: counts the attempts in a row that failed as the one
 * before did, without a worker getting further than it. */
static void count_same(dl_sup_t *sup, const dl_sup_failure_t *prev, bool had,
                       const dl_sup_event_t *ev)
{
    bool no_progress = ev->step < 0 || ev->step <= sup->same_step;
    if (had && prev->attempt == sup->attempt - 1 && same_failure(prev, &sup->first_failure) &&
        no_progress)
        sup->same++;
    else
        sup->same = 1;
    sup->same_step = ev->step;
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
    dl_sup_failure_t prev = sup->first_failure;
    bool had = sup->has_failure;
    sup->has_failure = true;
    sup->first_failure = (dl_sup_failure_t){
        .rank = ev->rank,
        .attempt = sup->attempt,
        .exit_code = ev->kind == DL_SUP_EV_WORKER_EXIT && ev->signal == 0 ? ev->exit_code : -1,
        .signal = ev->kind == DL_SUP_EV_WORKER_EXIT ? ev->signal : 0,
        .spawn_errno = ev->kind == DL_SUP_EV_SPAWN_FAILED ? ev->spawn_errno : 0,
        .hung = ev->hung,
        .oom = ev->kind == DL_SUP_EV_WORKER_EXIT && ev->oom,
        .mem_peak = ev->mem_peak,
        .mem_limit = ev->mem_limit,
        .time = now,
    };
    if (sup->remote) {
        /* The round is changing with the workers kept: this slot is refilled at the
         * assignment, as any other dead one. */
        if (sup->awaiting)
            return;
        /* In-job: the rendezvous opens the next round (and counts the restart); the others
         * stay and form the group again in it (docs/recovery.md). */
        if (sup->in_job && ev->recoverable && !sup->recovering && sup->succeeded == 0) {
            act->flags |= DL_SUP_REPORT;
            return;
        }
        if (sup->recovering) {
            sup->recovering = false;
            act->flags |= DL_SUP_RECOVERY_OFF;
        }
        act->flags |= DL_SUP_REPORT;
        begin_stop(sup, act, DL_SUP_STOP_REPORT, SIGTERM);
        return;
    }
    bool left = dl_rdzv_policy_restart_left(dl_sup_restarts_used(sup), sup->max_restarts);
    /* In-job: the others go on, a replacement joins them (docs/recovery.md). Not while another
     * recovery is under way (that one failed then: back to a restart), nor once a worker of the
     * attempt finished (the job is ending). */
    if (sup->in_job && ev->recoverable && left && !sup->recovering && sup->succeeded == 0) {
        sup->recoveries++;
        sup->recovering = true;
        sup->running++; /* the replacement */
        act->flags |= DL_SUP_RECOVER;
        act->rank = ev->rank;
        act->attempt = sup->attempt;
        return;
    }
    if (sup->recovering) {
        sup->recovering = false;
        act->flags |= DL_SUP_RECOVERY_OFF;
    }
    count_same(sup, &prev, had, ev);
    if (sup->max_same > 0 && sup->same >= sup->max_same)
        begin_stop(sup, act, DL_SUP_STOP_SAME, SIGTERM);
    else
        begin_stop(sup, act, left ? DL_SUP_STOP_RESTART : DL_SUP_STOP_FAIL, SIGTERM);
}

/* Remote: the round changed under running workers, or the job ended for every node. */
static void remote_stop(dl_sup_t *sup, dl_sup_actions_t *act, dl_sup_stop_t why)
{
    switch (sup->phase) {
    case DL_SUP_RUNNING: begin_stop(sup, act, why, SIGTERM); break;
    case DL_SUP_STOPPING:
        /* A signal already decides how this ends; otherwise the newer news wins. */
        if (sup->stop != DL_SUP_STOP_SIGNAL && sup->stop != DL_SUP_STOP_END)
            sup->stop = why;
        break;
    default:
        if (why == DL_SUP_STOP_END)
            finish(sup, act, sup->end_code);
        else
            act->flags |= DL_SUP_JOIN;
        break;
    }
}

dl_sup_actions_t dl_sup_step(dl_sup_t *sup, const dl_sup_event_t *ev, double now)
{
    dl_sup_actions_t act = {0};

    if (sup->phase == DL_SUP_DONE)
        return act;

    switch (ev->kind) {
    case DL_SUP_EV_START:
        if (sup->phase != DL_SUP_IDLE)
            break;
        if (sup->remote) {
            sup->phase = DL_SUP_WAITING;
            act.flags |= DL_SUP_JOIN;
        } else {
            start_attempt(sup, &act);
        }
        break;

    case DL_SUP_EV_ASSIGNED:
        if (sup->remote && sup->awaiting && sup->phase == DL_SUP_RUNNING) {
            /* The kept workers go on in the new group; the empty slots get replacements. */
            sup->awaiting = false;
            sup->attempt = ev->attempt;
            sup->running = sup->nworkers;
            sup->succeeded = 0;
            act.flags |= DL_SUP_RESUME;
            act.attempt = ev->attempt;
        } else if (sup->remote && sup->phase == DL_SUP_WAITING) {
            sup->attempt = ev->attempt;
            start_attempt(sup, &act);
        }
        break;

    case DL_SUP_EV_ROUND_CHANGED:
        if (!sup->remote)
            break;
        if (sup->awaiting) {
            /* Another change before the assignment: join that round instead. */
            act.flags |= DL_SUP_JOIN;
            break;
        }
        if (sup->in_job && ev->recoverable && sup->phase == DL_SUP_RUNNING &&
            sup->stop == DL_SUP_STOP_NONE && !sup->recovering) {
            sup->awaiting = true;
            sup->recovering = true;
            sup->recoveries++;
            act.flags |= DL_SUP_KEEP | DL_SUP_JOIN;
            break;
        }
        /* A change while a recovery is under way: it failed; back to a restart. */
        if (sup->recovering) {
            sup->recovering = false;
            act.flags |= DL_SUP_RECOVERY_OFF;
        }
        remote_stop(sup, &act, DL_SUP_STOP_REJOIN);
        break;

    case DL_SUP_EV_JOB_END:
        sup->awaiting = false;
        if (sup->remote) {
            if (sup->stop != DL_SUP_STOP_SIGNAL)
                sup->end_code = ev->exit_code;
            remote_stop(sup, &act, DL_SUP_STOP_END);
        }
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
        if (sup->phase == DL_SUP_IDLE || sup->phase == DL_SUP_WAITING) {
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

    case DL_SUP_EV_RECOVERED: sup->recovering = false; break;

    case DL_SUP_EV_RECOVERY_FAILED:
        /* The recovery's failure is the attempt's: back to a restart from the last checkpoint,
         * which spends one more (the recovery spent its own). */
        if (!sup->recovering || sup->phase != DL_SUP_RUNNING || sup->stop != DL_SUP_STOP_NONE)
            break;
        sup->recovering = false;
        act.flags |= DL_SUP_RECOVERY_OFF;
        if (sup->remote) {
            /* The shell says why in the report; the rendezvous decides what next. */
            act.flags |= DL_SUP_REPORT;
            begin_stop(sup, &act, DL_SUP_STOP_REPORT, SIGTERM);
            break;
        }
        begin_stop(sup, &act,
                   dl_rdzv_policy_restart_left(dl_sup_restarts_used(sup), sup->max_restarts)
                       ? DL_SUP_STOP_RESTART
                       : DL_SUP_STOP_FAIL,
                   SIGTERM);
        break;

    case DL_SUP_EV_UNREAPABLE:
        sup->unhealthy = true;
        if (sup->phase == DL_SUP_IDLE || sup->running == 0)
            break;
        sup->running--;
        if (sup->stop == DL_SUP_STOP_NONE) {
            /* Given up on before anything stopped the attempt: it is the attempt's failure. */
            dl_sup_event_t as_exit = *ev;
            as_exit.kind = DL_SUP_EV_WORKER_EXIT;
            as_exit.signal = SIGKILL;
            worker_failed(sup, &as_exit, now, &act);
            sup->first_failure.unreapable = true;
        } else if (sup->running == 0) {
            attempt_over(sup, &act);
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
