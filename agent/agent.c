/* The agent's libuv shell around the supervisor state machine: it spawns, reaps, signals and
 * reports, and asks dl_sup_step() what to do after every event. One loop, one thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "agent.h"
#include "internal.h"
#include "events.h"
#include "gpu.h"
#include "output.h"
#include "spawn.h"
#include "summary.h"
#include "supervisor.h"
#include "workerenv.h"

/* How long output may keep arriving after a worker's process group is gone. */
#define DRAIN_TIMEOUT_MS 1000

double dl__now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void dl__agent_log(const dl_agent_t *a, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "[agent node=%d] %s\n", a->node_rank, msg);
}

static void apply(dl_agent_t *a, dl_sup_actions_t act);

void dl__agent_feed(dl_agent_t *a, dl_sup_event_t ev)
{
    apply(a, dl_sup_step(&a->sup, &ev, dl__now_unix()));
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static void kill_workers(dl_agent_t *a, int sig)
{
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid > 0 && kill(-w->pid, sig) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot signal rank %d (pid %d): %s", w->rank, (int)w->pid,
                      strerror(errno));
        /* A stopped worker (SIGSTOP, a debugger let go) takes its signal only once it runs. */
        else if (w->pid > 0 && sig != SIGKILL && sig != SIGCONT)
            kill(-w->pid, SIGCONT);
    }
}

static json_t *worker_env_json(char **envp)
{
    json_t *o = json_object();
    for (const char *const *n = dl_worker_env_names; *n != NULL; n++) {
        size_t len = strlen(*n);
        for (char **e = envp; *e != NULL; e++)
            if (strncmp(*e, *n, len) == 0 && (*e)[len] == '=')
                json_object_set_new(o, *n, json_string(*e + len + 1));
    }
    return o;
}

static int build_env(dl_agent_t *a, const dl__worker_t *w, int attempt, char ***ret_envp)
{
    dl_worker_env_t we = {
        .rank = w->rank,
        .local_rank = w->local_rank,
        .world_size = a->world_size,
        .local_world_size = a->nworkers,
        .group_rank = a->node_rank,
        .group_world_size = a->nnodes,
        .restart_count = attempt,
        .max_restarts = a->spec->max_restarts,
        .run_id = a->run_id,
        .master_addr = a->master_addr,
        .master_port = a->master_port,
        .attempt_dir = a->attempt_dir,
        .store = a->store_addr[0] != '\0' ? a->store_addr : NULL,
        .token_file = a->token_path,
        .health_fd = dl__diag_beats_wanted(a) ? DL_SPAWN_HEALTH_FD : -1,
    };
    return dl_worker_env_build(&we, a->environ_list, a->spec->env, ret_envp);
}

/* Starts one worker; returns 0 or -errno (then nothing of it is left running). */
static int spawn_worker(dl_agent_t *a, dl__worker_t *w, int attempt)
{
    char prefix[64];
    char **envp = NULL;
    int child_out = -1, child_err = -1;
    dl_output_t *out = NULL;
    int r;

    if (a->nnodes > 1)
        snprintf(prefix, sizeof(prefix), "[node%d rank %d] ", a->node_rank, w->rank);
    else
        snprintf(prefix, sizeof(prefix), "[rank %d] ", w->rank);
    r = build_env(a, w, attempt, &envp);
    if (r < 0)
        return r;
    r = dl_output_open(&a->loop, a->attempt_dir, w->rank, prefix, !a->spec->quiet, a->readbuf,
                       sizeof(a->readbuf), &out, &child_out, &child_err);
    if (r < 0) {
        dl_worker_env_free(envp);
        return r;
    }
    int health[2] = {-1, -1};
    dl__diag_worker_spawning(a, w);
    if (dl__diag_beats_wanted(a) && pipe2(health, O_CLOEXEC | O_NONBLOCK) < 0) {
        dl__agent_log(a, "no health pipe for rank %d: %s", w->rank, strerror(errno));
        health[0] = health[1] = -1;
    }
    r = dl_spawn(a->command_path, a->spec->command, envp, child_out, child_err, health[1],
                 &w->pid);
    close(child_out);
    close(child_err);
    if (health[1] >= 0)
        close(health[1]);
    w->health_rd = health[0];
    w->beating = w->hung = false;
    dl_worker_env_free(envp);
    if (r < 0) {
        w->pid = 0;
        if (w->health_rd >= 0)
            close(w->health_rd);
        w->health_rd = -1;
        dl_output_drain(out, 0);
        return r;
    }
    w->attempt = attempt;
    w->output = out;
    if (dl_guard_watch(&a->guard, w->pid, 1) < 0)
        dl__agent_log(a, "the orphan guard is gone: workers may outlive a killed agent");
    json_t *f = json_pack("{s:i, s:i, s:i, s:i}", "rank", w->rank, "local_rank", w->local_rank,
                          "pid", (int)w->pid, "attempt", attempt);
    dl_events_emit(a->events, "worker_start", dl__now_unix(), f);
    if (a->spec->verbose)
        dl__agent_log(a, "rank %d started (pid %d, attempt %d)", w->rank, (int)w->pid, attempt);
    return 0;
}

static void record_failure(dl_agent_t *a)
{
    dl_sup_failure_t *h = realloc(a->history, (a->nhistory + 1) * sizeof(*h));
    if (h == NULL)
        return; /* the summary then omits this attempt; the event stream still has it */
    a->history = h;
    a->history[a->nhistory++] = a->sup.first_failure;
}

static json_t *failure_json(const dl_sup_failure_t *f)
{
    json_t *o = json_pack("{s:i, s:i}", "rank", f->rank, "attempt", f->attempt);
    if (f->hung)
        json_object_set_new(o, "hung", json_true());
    if (f->spawn_errno > 0)
        json_object_set_new(o, "error", json_string(strerror(f->spawn_errno)));
    else if (f->signal > 0)
        json_object_set_new(o, "signal", json_string(dl_signal_name(f->signal)));
    else
        json_object_set_new(o, "exit_code", json_integer(f->exit_code));
    return o;
}

/* The health watchdog. Beats are drained now and then rather than read as they come: a
 * trainer beats every step, thousands of times a second, and waking for each would cost the
 * workers the CPU they train on. */
static void on_health_check(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    double now = (double)uv_hrtime() / 1e9;
    char buf[4096];
    bool explained = false;

    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid <= 0 || w->health_rd < 0 || w->hung)
            continue;
        ssize_t n, got = 0;
        while ((n = read(w->health_rd, buf, sizeof(buf))) > 0) {
            got += n;
            dl__diag_beats(w, buf, (size_t)n, now);
        }
        if (got > 0) {
            w->beating = true;
            w->last_beat = now;
        } else if (a->spec->health_timeout > 0 && w->beating &&
                   now - w->last_beat >= a->spec->health_timeout &&
                   a->sup.stop == DL_SUP_STOP_NONE) {
            /* Where every rank is, read before anything is killed (docs/diagnostics.md). */
            if (!explained)
                dl__diag_explain(a, "hang", true);
            explained = true;
            w->hung = true;
            dl__agent_log(a, "rank %d (pid %d) sent no health beat for %.1fs: it is hung; "
                             "killing it",
                          w->rank, (int)w->pid, now - w->last_beat);
            json_t *f = json_pack("{s:i, s:i, s:f}", "rank", w->rank, "pid", (int)w->pid,
                                  "silent_s", now - w->last_beat);
            if (dl__diag_text(a)[0] != '\0')
                json_object_set_new(f, "diagnosis", json_string(dl__diag_text(a)));
            dl_events_emit(a->events, "worker_hung", dl__now_unix(), f);
            kill(-w->pid, SIGKILL);
        }
    }
    dl__diag_tick(a, now);
}

static int start_attempt(dl_agent_t *a, int attempt)
{
    int r;

    snprintf(a->attempt_dir, sizeof(a->attempt_dir), "%s/attempt_%d", a->run_dir, attempt);
    r = mkdir_p(a->attempt_dir);
    if (r < 0) {
        dl__agent_log(a, "cannot create the log folder '%s': %s", a->attempt_dir, strerror(-r));
        return r;
    }
    json_t *ranks = json_array();
    for (int i = 0; i < a->nworkers; i++)
        json_array_append_new(ranks, json_integer(a->workers[i].rank));
    dl_events_emit(a->events, "rendezvous", dl__now_unix(),
                   json_pack("{s:i, s:i, s:i, s:i, s:o, s:s, s:i}", "round", attempt,
                             "world_size", a->world_size, "node_rank", a->node_rank, "nodes",
                             a->nnodes, "ranks", ranks, "master_addr", a->master_addr,
                             "master_port", a->master_port));
    return 0;
}

static void spawn_all(dl_agent_t *a, int attempt)
{
    int failed_rank = -1, failed_err = 0;

    if (attempt > 0 && !a->remote) {
        record_failure(a);
        json_t *f = json_pack("{s:i, s:o}", "attempt", attempt, "reason",
                              failure_json(&a->sup.first_failure));
        if (dl__diag_text(a)[0] != '\0')
            json_object_set_new(f, "diagnosis", json_string(dl__diag_text(a)));
        dl_events_emit(a->events, "restart", dl__now_unix(), f);
        dl__agent_log(a, "restarting the job (attempt %d of %d)", attempt,
                  a->spec->max_restarts + 1);
        /* Several nodes get a new round, and with it an empty store; one node does it here. */
        dl__rdzv_local_store_reset(a);
    }
    dl__diag_attempt(a);
    int r = start_attempt(a, attempt);
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (r == 0)
            r = spawn_worker(a, w, attempt);
        if (r < 0 && failed_rank < 0) {
            failed_rank = w->rank;
            failed_err = -r;
            dl__agent_log(a, "cannot start rank %d: %s", w->rank, strerror(-r));
        }
    }
    /* Every rank that did not start counts as exited, so the supervisor's books balance. */
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid == 0)
            dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_SPAWN_FAILED,
                                     .rank = w->rank,
                                     .spawn_errno = w->rank == failed_rank ? failed_err : EAGAIN});
    }
}

static void on_stop_timeout(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    dl__agent_log(a, "workers still running after %gs: sending SIGKILL", a->spec->stop_timeout);
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_STOP_TIMEOUT});
}

/* Lets go of the agent's own handles so that the loop ends once the outputs drain. */
static void finish_loop(dl_agent_t *a)
{
    for (size_t i = 0; i < sizeof(a->signals) / sizeof(a->signals[0]); i++)
        uv_close((uv_handle_t *)&a->signals[i], NULL);
    uv_close((uv_handle_t *)&a->stop_timer, NULL);
    uv_close((uv_handle_t *)&a->health_timer, NULL);
    dl__diag_close(a);
}

static void finish(dl_agent_t *a, int exit_code)
{
    const char *status = exit_code == 0   ? "succeeded"
                         : exit_code == 1 ? "failed"
                         : exit_code == 3 ? "timed_out"
                         : exit_code == 4 ? "refused"
                                          : "stopped";
    a->exit_code = exit_code;
    if (exit_code == 1 && a->sup.has_failure && !a->remote) {
        record_failure(a);
        dl_summary_print(stderr, a->history, a->nhistory, a->sup.attempt + 1, a->run_dir);
        if (dl__diag_text(a)[0] != '\0')
            fprintf(stderr, "  where the ranks were: %s\n", dl__diag_text(a));
    } else if (exit_code == 1 && a->remote) {
        /* This node's own failures were recorded as they were reported. */
        fprintf(stderr, "dlaunch: the job failed: %s\n",
                a->failure_text[0] ? a->failure_text : "see the other nodes' logs");
        if (a->nhistory > 0)
            dl_summary_print(stderr, a->history, a->nhistory, a->sup.attempt + 1, a->run_dir);
    }
    dl__rdzv_finish(a, exit_code);
    dl_events_emit(a->events, "job_end", dl__now_unix(),
                   json_pack("{s:s, s:i, s:i}", "status", status, "exit_code", exit_code,
                             "attempts", a->sup.attempt + 1));
    finish_loop(a);
}

static void apply(dl_agent_t *a, dl_sup_actions_t act)
{
    if (act.flags & DL_SUP_DISARM_TIMER)
        uv_timer_stop(&a->stop_timer);
    if (act.flags & DL_SUP_KILL)
        kill_workers(a, act.kill_signal);
    if (act.flags & DL_SUP_ARM_TIMER)
        uv_timer_start(&a->stop_timer, on_stop_timeout, (uint64_t)(a->spec->stop_timeout * 1000),
                       0);
    if (act.flags & DL_SUP_REPORT)
        dl__rdzv_report(a);
    if (act.flags & DL_SUP_NODE_DONE)
        dl__rdzv_node_done(a);
    if (act.flags & DL_SUP_JOIN)
        dl__rdzv_join(a);
    if (act.flags & DL_SUP_SPAWN)
        spawn_all(a, act.attempt);
    if (act.flags & DL_SUP_EXIT)
        finish(a, act.exit_code);
}

/* How long a worker's death by SIGTERM/SIGINT/SIGHUP waits for the agent's own signal. */
#define OUTSIDE_STOP_GRACE_MS 300

typedef struct {
    uv_timer_t timer;
    dl_agent_t *agent;
    int rank;
    pid_t pid;
    int code;
    int sig;
} deferred_exit_t;

static void report_exit(dl_agent_t *a, int rank, pid_t pid, int code, int sig, bool hung)
{
    if (hung) {
        /* Already said when it was killed. */
    } else if (a->spec->verbose || (code != 0 && a->sup.stop == DL_SUP_STOP_NONE)) {
        /* The attempt's first failure: where the others are, before they are stopped. */
        if (code != 0 && a->sup.stop == DL_SUP_STOP_NONE && dl__diag_text(a)[0] == '\0')
            dl__diag_explain(a, "failure", true);
        if (sig > 0)
            dl__agent_log(a, "rank %d (pid %d) was killed by %s", rank, (int)pid,
                          dl_signal_name(sig));
        else
            dl__agent_log(a, "rank %d (pid %d) exited with code %d", rank, (int)pid, code);
    }
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_WORKER_EXIT, .rank = rank,
                                       .exit_code = code, .signal = sig, .hung = hung});
}

static void deferred_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_deferred(uv_timer_t *t)
{
    deferred_exit_t *d = t->data;
    report_exit(d->agent, d->rank, d->pid, d->code, d->sig, false);
    uv_close((uv_handle_t *)t, deferred_closed);
}

static int defer_exit(dl_agent_t *a, int rank, pid_t pid, int code, int sig)
{
    deferred_exit_t *d = malloc(sizeof(*d));
    if (d == NULL)
        return -ENOMEM;
    *d = (deferred_exit_t){.agent = a, .rank = rank, .pid = pid, .code = code, .sig = sig};
    uv_timer_init(&a->loop, &d->timer);
    d->timer.data = d;
    uv_timer_start(&d->timer, on_deferred, OUTSIDE_STOP_GRACE_MS, 0);
    return 0;
}

static void worker_reaped(dl_agent_t *a, dl__worker_t *w, int status)
{
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    pid_t pid = w->pid;

    /* What the worker left running in its group goes with it: nothing outlives its worker. */
    if (kill(-pid, SIGKILL) < 0 && errno != ESRCH)
        dl__agent_log(a, "cannot clean up after rank %d: %s", w->rank, strerror(errno));
    dl_guard_watch(&a->guard, pid, 0);
    w->pid = 0;
    if (w->health_rd >= 0)
        close(w->health_rd);
    w->health_rd = -1;
    dl_output_drain(w->output, DRAIN_TIMEOUT_MS);
    w->output = NULL;

    json_t *f = json_pack("{s:i, s:i, s:i}", "rank", w->rank, "attempt", w->attempt, "pid",
                          (int)pid);
    if (sig > 0)
        json_object_set_new(f, "signal", json_string(dl_signal_name(sig)));
    else
        json_object_set_new(f, "exit_code", json_integer(code));
    dl_events_emit(a->events, "worker_exit", dl__now_unix(), f);
    /* A batch system stopping a whole step (scancel) signals every process of it, workers
     * first as often as not: a worker killed by a stop signal we did not send is news only if
     * no signal reaches the agent itself within a moment. */
    if ((sig == SIGTERM || sig == SIGINT || sig == SIGHUP) && a->sup.stop == DL_SUP_STOP_NONE &&
        defer_exit(a, w->rank, pid, code, sig) == 0)
        return;
    report_exit(a, w->rank, pid, code, sig, w->hung);
}

static void on_signal(uv_signal_t *h, int signum)
{
    dl_agent_t *a = h->data;

    if (signum == SIGCHLD) {
        for (;;) {
            int status;
            pid_t pid = waitpid(-1, &status, WNOHANG);
            if (pid <= 0)
                break;
            for (int i = 0; i < a->nworkers; i++) {
                if (a->workers[i].pid == pid) {
                    worker_reaped(a, &a->workers[i], status);
                    break;
                }
            }
            if (pid == a->guard.pid) {
                a->guard.pid = 0;
                dl__agent_log(a, "the orphan guard exited unexpectedly");
            }
        }
        return;
    }
    dl__agent_log(a, "got %s: stopping the workers", dl_signal_name(signum));
    dl_events_emit(a->events, "signal", dl__now_unix(),
                   json_pack("{s:s}", "signal", dl_signal_name(signum)));
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_SIGNAL, .signal = signum});
}

/* A port nothing listens on now, for the workers' own rendezvous (torch's TCPStore). */
static int find_free_port(int *ret_port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int r = 0;

    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        r = -errno;
    else
        *ret_port = ntohs(sa.sin_port);
    close(fd);
    return r;
}

static char *make_run_id(void)
{
    char buf[64];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    snprintf(buf, sizeof(buf), "%04d%02d%02d-%02d%02d%02d-%d", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)getpid());
    return strdup(buf);
}

/* Decides the shape of the job on this node. Returns 0, or an exit code (2) after saying why. */
static int plan(dl_agent_t *a)
{
    const dl_job_spec_t *spec = a->spec;
    int gpus = dl_gpu_count("/proc", dl_env_get(a->environ_list, "CUDA_VISIBLE_DEVICES"));
    int r;

    a->remote = spec->rdzv_endpoint != NULL;
    if (spec->nodes_max > 1 && !a->remote) {
        fprintf(stderr, "dlaunch: --nodes %d:%d: a job over several nodes needs "
                        "--rdzv-endpoint HOST:PORT\n",
                spec->nodes_min, spec->nodes_max);
        return 2;
    }
    if (a->remote && spec->run_id == NULL) {
        fprintf(stderr, "dlaunch: --rdzv-endpoint: every node of the job needs the same "
                        "--run-id\n");
        return 2;
    }
    /* Until the rendezvous says otherwise (remote), this node is the whole job. */
    a->nnodes = 1;
    a->node_rank = 0;
    if (spec->gpus_per_node == DL_GPUS_AUTO) {
        a->nworkers = gpus > 0 ? gpus : 1;
    } else {
        a->nworkers = spec->gpus_per_node;
        if (a->nworkers > gpus && !spec->quiet)
            fprintf(stderr,
                    "dlaunch: warning: %d workers per node asked for, %d GPU%s found; "
                    "starting %d workers%s\n",
                    a->nworkers, gpus, gpus == 1 ? "" : "s", a->nworkers,
                    gpus > 0 ? ", some sharing a GPU" : " on the CPU");
    }
    a->world_size = a->nworkers * a->nnodes;

    r = dl_resolve_command(spec->command[0], dl_env_get(a->environ_list, "PATH"),
                           &a->command_path);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot run '%s': %s\n", spec->command[0],
                r == -ENOENT ? "command not found" : strerror(-r));
        return 2;
    }
    a->run_id = spec->run_id != NULL ? strdup(spec->run_id) : make_run_id();
    if (a->run_id == NULL || asprintf(&a->run_dir, "%s/%s",
                                      spec->log_dir != NULL ? spec->log_dir : "dlaunch_logs",
                                      a->run_id) < 0) {
        a->run_dir = NULL;
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    snprintf(a->master_addr, sizeof(a->master_addr), "127.0.0.1");
    r = find_free_port(&a->master_port);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot find a free port for MASTER_PORT: %s\n", strerror(-r));
        return 2;
    }
    if (dl__agent_set_ranks(a, 0, a->nworkers) < 0) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    return 0;
}

int dl__agent_set_ranks(dl_agent_t *a, int first_rank, int n)
{
    if (a->workers == NULL || n != a->nworkers) {
        dl__worker_t *w = calloc((size_t)n, sizeof(*w));
        if (w == NULL)
            return -ENOMEM;
        free(a->workers);
        a->workers = w;
        a->nworkers = n;
    }
    for (int i = 0; i < n; i++) {
        a->workers[i].agent = a;
        a->workers[i].local_rank = i;
        a->workers[i].rank = first_rank + i;
        a->workers[i].health_rd = -1;
    }
    return 0;
}

static void print_quoted(const char *s)
{
    if (*s != '\0' && strpbrk(s, " \t\n'\"\\$`*?[]{}()<>|&;#~!") == NULL) {
        fputs(s, stdout);
        return;
    }
    putchar('\'');
    for (; *s != '\0'; s++) {
        if (*s == '\'')
            fputs("'\\''", stdout);
        else
            putchar(*s);
    }
    putchar('\'');
}

static int dry_run(dl_agent_t *a)
{
    printf("run %s: %d node%s, %d worker%s per node, world size %d, max restarts %d\n",
           a->run_id, a->nnodes, a->nnodes == 1 ? "" : "s", a->nworkers,
           a->nworkers == 1 ? "" : "s", a->world_size, a->spec->max_restarts);
    printf("logs: %s/attempt_K/rank_N.{out,err}\ncommand:", a->run_dir);
    for (char **c = a->spec->command; *c != NULL; c++) {
        putchar(' ');
        print_quoted(*c);
    }
    printf("\n");
    snprintf(a->attempt_dir, sizeof(a->attempt_dir), "%s/attempt_0", a->run_dir);
    for (int i = 0; i < a->nworkers; i++) {
        char **envp;
        if (build_env(a, &a->workers[i], 0, &envp) < 0) {
            fprintf(stderr, "dlaunch: out of memory\n");
            return 2;
        }
        printf("rank %d:", a->workers[i].rank);
        json_t *o = worker_env_json(envp);
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v)
        {
            printf(" %s=", k);
            print_quoted(json_string_value(v));
        }
        printf("\n");
        json_decref(o);
        dl_worker_env_free(envp);
    }
    return 0;
}

static int setup_loop(dl_agent_t *a)
{
    int r;
    static const int all[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

    r = uv_loop_init(&a->loop);
    if (r < 0)
        return r;
    for (size_t i = 0; i < 4; i++) {
        uv_signal_init(&a->loop, &a->signals[i]);
        a->signals[i].data = a;
        r = uv_signal_start(&a->signals[i], on_signal, all[i]);
        if (r < 0)
            return r;
    }
    uv_timer_init(&a->loop, &a->stop_timer);
    a->stop_timer.data = a;
    uv_timer_init(&a->loop, &a->health_timer);
    a->health_timer.data = a;
    if (dl__diag_beats_wanted(a)) {
        /* A few times per health timeout; at least once a heartbeat for the straggler rule. */
        uint64_t every = (uint64_t)(a->spec->heartbeat * 1000);
        if (a->spec->health_timeout > 0 && a->spec->health_timeout * 1000 / 4 < every)
            every = (uint64_t)(a->spec->health_timeout * 1000 / 4);
        uv_timer_start(&a->health_timer, on_health_check, every > 10 ? every : 10,
                       every > 10 ? every : 10);
    }
    return 0;
}

static void agent_free(dl_agent_t *a)
{
    dl__diag_free(a);
    dl__rdzv_free(a);
    free(a->workers);
    free(a->run_id);
    free(a->run_dir);
    free(a->command_path);
    free(a->history);
    free(a->token_path);
    dl_events_close(a->events);
    free(a);
}

int dl_agent_run(const dl_job_spec_t *spec, char **environ_list)
{
    dl_agent_t *a = calloc(1, sizeof(*a));
    int r, code;

    if (a == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    a->spec = spec;
    a->environ_list = environ_list;
    a->guard.fd = -1;
    code = plan(a);
    if (code != 0 || spec->dry_run) {
        if (code == 0)
            code = dry_run(a);
        agent_free(a);
        return code;
    }
    if (spec->events != NULL) {
        r = dl_events_open(spec->events, &a->events);
        if (r < 0) {
            fprintf(stderr, "dlaunch: --events '%s': %s\n", spec->events, strerror(-r));
            agent_free(a);
            return 2;
        }
    }
    /* Workers write into pipes we may stop reading when stdout goes away; never die of it. */
    signal(SIGPIPE, SIG_IGN);
    r = dl_guard_start(&a->guard);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot start the orphan guard: %s\n", strerror(-r));
        agent_free(a);
        return 1;
    }
    r = setup_loop(a);
    if (r == 0)
        r = dl__diag_start(a);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot set up the event loop: %s\n", uv_strerror(r));
        dl_guard_stop(&a->guard);
        agent_free(a);
        return 1;
    }
    if (a->remote)
        dl_sup_init_remote(&a->sup, a->nworkers);
    else
        dl_sup_init(&a->sup, a->nworkers, spec->max_restarts);
    json_t *cmd = json_array();
    for (char **c = spec->command; *c != NULL; c++)
        json_array_append_new(cmd, json_string(*c));
    dl_events_emit(a->events, "job_start", dl__now_unix(),
                   json_pack("{s:s, s:i, s:i, s:i, s:i, s:s, s:o}", "run_id", a->run_id, "nodes",
                             a->nnodes, "workers_per_node", a->nworkers, "world_size",
                             a->world_size, "max_restarts", spec->max_restarts, "log_dir",
                             a->run_dir, "command", cmd));
    if (a->remote) {
        /* The supervisor starts once the rendezvous answers (dl__rdzv_start's ready). */
        code = dl__rdzv_start(a);
        if (code != 0) {
            dl_events_emit(a->events, "job_end", dl__now_unix(),
                           json_pack("{s:s, s:i, s:i}", "status", "refused", "exit_code", code,
                                     "attempts", 0));
            dl__rdzv_finish(a, code);
            finish_loop(a);
            uv_run(&a->loop, UV_RUN_DEFAULT);
            uv_loop_close(&a->loop);
            dl_guard_stop(&a->guard);
            agent_free(a);
            return code;
        }
    } else {
        if (dl__rdzv_local_store(a) < 0)
            dl__agent_log(a, "no key-value store for the workers (DLAUNCH_STORE unset)");
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_START});
    }
    uv_run(&a->loop, UV_RUN_DEFAULT);

    code = a->exit_code;
    dl_guard_stop(&a->guard);
    if (uv_loop_close(&a->loop) != 0)
        dl__agent_log(a, "event loop closed with handles still open");
    agent_free(a);
    return code;
}
