/* --forward-signals: signals that belong to the workers (a scheduler's warning before a time
 * limit or a preemption), passed on while the job goes on. They are read from a signalfd rather
 * than through libuv's handler, because the sender matters: inside a Slurm step, slurmstepd
 * signals every process of the step itself (proctrack/cgroup and linuxproc), the workers
 * included, and a second copy from the agent would reach a worker that has already caught the
 * first and is exiting with its handler gone. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "internal.h"
#include "summary.h"

static void add_forwarded(void *ctx, int sig)
{
    dl_agent_t *a = ctx;
    if (sig == SIGCHLD || a->nforward >= (int)(sizeof(a->forward) / sizeof(a->forward[0])))
        return;
    for (int i = 0; i < a->nforward; i++)
        if (a->forward[i] == sig)
            return;
    a->forward[a->nforward++] = sig;
}

bool dl__agent_forwards(const dl_agent_t *a, int sig)
{
    for (int i = 0; i < a->nforward; i++)
        if (a->forward[i] == sig)
            return true;
    return false;
}

static bool in_slurm_step(const dl_agent_t *a)
{
    const char *off = dl_env_get(a->environ_list, "DLAUNCH_NO_SLURM");
    return (off == NULL || *off == '\0') && (dl_env_get(a->environ_list, "SLURM_STEP_ID") != NULL ||
                                             dl_env_get(a->environ_list, "SLURM_STEPID") != NULL);
}

static void pass_on(dl_agent_t *a, int sig, pid_t sender)
{
    int n = 0;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].pid > 0)
            n++;
    /* Slurm's step signal reached every process of the step already. */
    bool slurm_did = in_slurm_step(a) && sender == getppid();
    if (slurm_did)
        dl__agent_log(a,
                      "got %s from Slurm, which signals the workers too (%d here); the job "
                      "goes on",
                      dl_signal_name(sig), n);
    else
        dl__agent_log(a, "got %s: passed on to %d worker%s; the job goes on", dl_signal_name(sig),
                      n, n == 1 ? "" : "s");
    dl_ev_signal(
        a->events, dl__now_unix(),
        &(dl_ev_signal_t){
            .signal = dl_signal_name(sig), .forwarded = true, .workers = n, .has_workers = true});
    for (int i = 0; i < a->nworkers && !slurm_did; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid <= 0)
            continue;
        if (kill(-w->pid, sig) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot signal rank %d (pid %d): %s", w->rank, (int)w->pid,
                          strerror(errno));
        else
            kill(-w->pid, SIGCONT); /* a stopped worker takes it only once it runs */
    }
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    dl_agent_t *a = h->data;
    struct signalfd_siginfo si;
    (void)status;
    (void)events;
    while (read(a->forward_fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
        pass_on(a, (int)si.ssi_signo, (pid_t)si.ssi_pid);
}

int dl__forward_start(dl_agent_t *a)
{
    sigset_t set;
    char bad[64];
    const char *list = dl_forward_signals(a->spec, a->environ_list);

    a->forward_fd = -1;
    if (*list != '\0')
        dl_signal_list_each(list, add_forwarded, a, bad, sizeof(bad));
    /* A signal that stops the job stays one (Slurm's default list gives way). */
    for (int i = 0; i < a->nsignals; i++)
        for (int j = 0; j < a->nforward; j++)
            if (a->signals[i].signum == a->forward[j])
                a->forward[j--] = a->forward[--a->nforward];
    if (a->nforward == 0)
        return 0;
    sigemptyset(&set);
    for (int i = 0; i < a->nforward; i++)
        sigaddset(&set, a->forward[i]);
    /* Blocked, they wait in the signalfd; workers unblock every signal before exec. */
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -errno;
    a->forward_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (a->forward_fd < 0)
        return -errno;
    int r = uv_poll_init(&a->loop, &a->forward_poll, a->forward_fd);
    if (r < 0)
        return r;
    a->forward_poll.data = a;
    a->forward_open = true;
    return uv_poll_start(&a->forward_poll, UV_READABLE, on_readable);
}

static void forward_closed(uv_handle_t *h)
{
    dl_agent_t *a = h->data;
    close(a->forward_fd);
    a->forward_fd = -1;
}

void dl__forward_close(dl_agent_t *a)
{
    if (!a->forward_open)
        return;
    a->forward_open = false;
    uv_close((uv_handle_t *)&a->forward_poll, forward_closed);
}
