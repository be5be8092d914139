/* The agent's libuv shell around the supervisor state machine: it spawns, reaps, signals and
 * reports, and asks dl_sup_step() what to do after every event. One loop, one thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "agent.h"
#include "cgroup.h"
#include "errorfile.h"
#include "event-table.h"
#include "gpu.h"
#include "internal.h"
#include "netif.h"
#include "opt.h"
#include "output.h"
#include "ownfile.h"
#include "rendezvous.h"
#include "spawn.h"
#include "summary.h"
#include "supervisor.h"
#include "workerenv.h"

/* How long output may keep arriving after a worker's process group is gone. */
#define DRAIN_TIMEOUT_MS 1000
/* The end of a worker's traceback that its worker_exit event carries (docs/events.md). */
#define EVENT_TRACE_BYTES (64 * 1024)

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

/* Returns 1 when it made the last folder of path, 0 when that was there, or -errno. The last
 * folder is tried first: its parents are there but on a job's first start. */
static int mkdir_p(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    if (mkdir(path, 0750) == 0)
        return 1;
    if (errno == EEXIST)
        return 0;
    if (errno != ENOENT)
        return -errno;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0750) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0750) == 0)
        return 1;
    return errno == EEXIST ? 0 : -errno;
}

static double mono_now(void)
{
    return (double)uv_hrtime() / 1e9;
}

/* How long a worker may outlive its SIGKILL before it is named unreapable: the stop grace once
 * more, and a second at least (the kernel frees a large process's memory first). */
static double reap_bound(const dl_agent_t *a)
{
    return a->spec->stop_timeout > 1 ? a->spec->stop_timeout : 1;
}

static void on_reap_timer(uv_timer_t *t);

void dl__agent_sigkill(dl_agent_t *a, dl__worker_t *w)
{
    if (w->pid <= 0)
        return;
    if (kill(-w->pid, SIGKILL) < 0 && errno != ESRCH)
        dl__agent_log(a, "cannot signal rank %d (pid %d): %s", w->rank, (int)w->pid,
                      strerror(errno));
    if (w->killed_at == 0) {
        w->killed_at = mono_now();
        if (!uv_is_active((uv_handle_t *)&a->reap_timer))
            uv_timer_start(&a->reap_timer, on_reap_timer, (uint64_t)(reap_bound(a) * 1000) + 10, 0);
    }
}

static void kill_workers(dl_agent_t *a, int sig)
{
    if (sig != SIGCONT)
        dl__spares_kill(a); /* they hold no state: killed at once, whatever the stop signal */
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid > 0 && sig == SIGKILL)
            dl__agent_sigkill(a, w);
        else if (w->pid > 0 && kill(-w->pid, sig) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot signal rank %d (pid %d): %s", w->rank, (int)w->pid,
                          strerror(errno));
        /* A stopped worker (SIGSTOP, a debugger let go) takes its signal only once it runs. */
        else if (w->pid > 0 && sig != SIGCONT)
            kill(-w->pid, SIGCONT);
    }
}

/* What a worker gets beyond the agent's own environment: our variables, in their usual order,
 * then the spec's env:. */
static json_t *worker_env_json(const dl_agent_t *a, char **envp)
{
    json_t *o = json_object();
    for (int pass = 0; pass < 2; pass++) {
        char *const *names = pass == 0 ? (char *const *)dl_worker_env_names : a->spec->env;
        for (; names != NULL && *names != NULL; names++) {
            size_t len = pass == 0 ? strlen(*names) : strcspn(*names, "=");
            for (char **e = envp; *e != NULL; e++) {
                if (strncmp(*e, *names, len) != 0 || (*e)[len] != '=')
                    continue;
                char name[256];
                snprintf(name, sizeof(name), "%.*s", (int)len, *e);
                json_object_set_new(o, name, json_string(*e + len + 1));
            }
        }
    }
    return o;
}

static int build_env(dl_agent_t *a, const dl__worker_t *w, int attempt, int restart_count,
                     int control_fd, char ***ret_envp)
{
    char error_file[4200];
    (void)attempt;
    dl_error_file_path(a->attempt_dir, w->rank, error_file, sizeof(error_file));
    char python_dir[4096];
    bool python = dl__python_dir(python_dir, sizeof(python_dir)) == 0;
    dl_worker_env_t we = {
        .rank = w->rank,
        .local_rank = w->local_rank,
        .world_size = a->world_size,
        .local_world_size = a->nworkers,
        .group_rank = a->node_rank,
        .group_world_size = a->nnodes,
        .restart_count = restart_count,
        .max_restarts = a->spec->max_restarts,
        .run_id = a->run_id,
        .master_addr = a->master_addr,
        .master_port = a->master_port,
        .attempt_dir = a->attempt_dir,
        .store = a->store_addr[0] != '\0' ? a->store_addr : NULL,
        .token_file = a->token_path,
        .health_fd = dl__diag_beats_wanted(a) ? DL_SPAWN_HEALTH_FD : -1,
        .recovery = dl__rec_in_job(a) ? "in-job" : "restart",
        .control_fd = control_fd >= 0 ? DL_SPAWN_CONTROL_FD : -1,
        .group_gen = a->gen,
        .spare = w->spare,
        .role = a->spec->role,
        .error_file = error_file,
        .python_exec = a->spec->python_exec != NULL ? a->command_path : NULL,
        .verbose = a->spec->verbose,
        .ifname = a->ifname[0] != '\0' ? a->ifname : NULL,
        .agent_store = a->agent_store,
        .python_path = python ? python_dir : NULL,
        .virtual_local_rank = a->spec->virtual_local_rank,
        .signals_to_handle = a->spec->signals != NULL ? a->spec->signals : DL_DEFAULT_SIGNALS,
        .timer_file = dl__ftimer_path(a),
    };
    return dl_worker_env_build(&we, a->environ_list, a->spec->env, ret_envp);
}

/* Identifies an output to the agent after its worker may be gone, or its slot reused. */
typedef struct {
    dl_agent_t *agent;
    int rank;
    int attempt;
    unsigned incarnation;
} output_owner_t;

static dl__worker_t *worker_by_rank(dl_agent_t *a, int rank)
{
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].rank == rank)
            return &a->workers[i];
    return NULL;
}

/* A failure is described from the failed rank's log, so it is told only once that log is whole:
 * a worker's last words can still be in the pipe when its exit is reaped. */
static bool failure_output_drained(dl_agent_t *a)
{
    const dl_sup_failure_t *f = &a->sup.first_failure;
    const dl__worker_t *w = worker_by_rank(a, f->rank);
    return w == NULL || w->attempt != f->attempt || !w->output_open;
}

static void on_output_drained(void *ctx)
{
    output_owner_t *oo = ctx;
    dl_agent_t *a = oo->agent;
    dl__worker_t *w = worker_by_rank(a, oo->rank);

    if (w != NULL && w->attempt == oo->attempt && w->incarnation == oo->incarnation)
        w->output_open = false;
    if (a->report_pending && failure_output_drained(a)) {
        a->report_pending = false;
        dl__rdzv_report(a);
    }
    free(oo);
}

static uint64_t merge_window_ms(const dl_agent_t *a)
{
    double ms = a->spec->merge_window * 1000.0;
    return ms > 1 ? (uint64_t)ms : 1;
}

static void print_merged(void *ctx, int stream, const char *ranks, const char *line, size_t len)
{
    (void)ctx;
    FILE *f = stream == 0 ? stdout : stderr;
    fprintf(f, "[%s] %.*s\n", ranks, (int)len, line);
    fflush(f);
}

static void on_merge_timer(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    dl_merge_due(&a->merge, (double)uv_now(&a->loop) / 1000.0);
    double next = dl_merge_next(&a->merge);
    if (next >= 0) {
        double wait = next * 1000.0 - (double)uv_now(&a->loop);
        uv_timer_start(t, on_merge_timer, wait > 1 ? (uint64_t)wait : 1, 0);
    }
}

static void on_output_line(void *ctx, int stream, const char *prefix, const char *line, size_t len)
{
    output_owner_t *oo = ctx;
    dl_agent_t *a = oo->agent;
    dl__dup_line(a, oo->attempt, stream, prefix, line, len);
    if (!a->spec->merge_output)
        return;
    if (a->merge_closed) {
        char ranks[32];
        snprintf(ranks, sizeof(ranks), "rank %d", oo->rank);
        print_merged(a, stream, ranks, line, len);
        return;
    }
    dl_merge_line(&a->merge, stream, oo->rank, line, len, (double)uv_now(&a->loop) / 1000.0);
    if (!uv_is_active((uv_handle_t *)&a->merge_timer) && dl_merge_next(&a->merge) >= 0)
        uv_timer_start(&a->merge_timer, on_merge_timer, merge_window_ms(a), 0);
}

static void on_log_write_failed(void *ctx, const char *path, int err)
{
    output_owner_t *oo = ctx;
    dl_agent_t *a = oo->agent;

    /* A full disk fails every file of every rank: the console hears of the first, the events
     * and the failure summary of each. */
    if (a->nunwritten == 0)
        dl__agent_log(a,
                      "cannot write the log file '%s': %s; rank %d's further output to it is "
                      "lost%s; the job goes on (every such file is named in the "
                      "log_write_failed events and the failure summary)",
                      path, strerror(err), oo->rank,
                      a->spec->quiet ? "" : " (the console still shows it)");
    dl_summary_unwritten_t *v = realloc(a->unwritten, (a->nunwritten + 1) * sizeof(*v));
    char *copy = strdup(path);
    if (v != NULL)
        a->unwritten = v;
    if (v != NULL && copy != NULL)
        a->unwritten[a->nunwritten++] = (dl_summary_unwritten_t){copy, err};
    else
        free(copy);
    dl_ev_log_write_failed(
        a->events, dl__now_unix(),
        &(dl_ev_log_write_failed_t){
            .rank = oo->rank, .attempt = oo->attempt, .path = path, .error = strerror(err)});
}

/* The console prefix: torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE when set, else ours,
 * "[rank N] " alone or "[nodeK rank N] " for a job of several nodes: one form for a job's whole
 * life, even when an elastic job shrinks to one node. */
static void worker_prefix(const dl_agent_t *a, const dl__worker_t *w, char *buf, size_t len)
{
    if (w->spare) {
        if (a->remote)
            snprintf(buf, len, "[node%d spare %d] ", a->node_rank, -1 - w->rank);
        else
            snprintf(buf, len, "[spare %d] ", -1 - w->rank);
        return;
    }
    if (a->prefix_template[0] == '\0') {
        if (a->remote)
            snprintf(buf, len, "[node%d rank %d] ", a->node_rank, w->rank);
        else
            snprintf(buf, len, "[rank %d] ", w->rank);
        return;
    }
    static const char *const vars[] = {"${role_name}", "${rank}", "${local_rank}"};
    size_t o = 0;
    for (const char *p = a->prefix_template; *p != '\0' && o + 1 < len;) {
        size_t i;
        for (i = 0; i < 3 && strncmp(p, vars[i], strlen(vars[i])) != 0; i++)
            ;
        if (i == 3) {
            buf[o++] = *p++;
            continue;
        }
        int n = i == 0 ? snprintf(buf + o, len - o, "%s",
                                  a->spec->role != NULL ? a->spec->role : "default")
                       : snprintf(buf + o, len - o, "%d", i == 1 ? w->rank : w->local_rank);
        o = n > 0 && o + (size_t)n < len ? o + (size_t)n : len - 1;
        p += strlen(vars[i]);
    }
    buf[o] = '\0';
}

/* Which of a worker's streams reach the console (DL_OUTPUT_ECHO_*): torchrun's -r/--redirects
 * keep a stream off it unless -t/--tee brings it back; --local-ranks-filter and --quiet keep
 * ranks off it. The log files get everything regardless. */
static unsigned console_streams(const dl_agent_t *a, const dl__worker_t *w)
{
    const dl_job_spec_t *spec = a->spec;
    if (spec->quiet || dl_int_list_has(spec->local_ranks_filter, w->local_rank) != 1)
        return 0;
    int redirect = dl_std_spec_for(spec->redirects, w->local_rank);
    int tee = dl_std_spec_for(spec->tee, w->local_rank);
    unsigned echo = 0;
    if (!(redirect & 1) || (tee & 1))
        echo |= DL_OUTPUT_ECHO_OUT;
    if (!(redirect & 2) || (tee & 2))
        echo |= DL_OUTPUT_ECHO_ERR;
    if (echo != 0 && spec->merge_output)
        echo |= DL_OUTPUT_ECHO_VIA_CB;
    return echo;
}

/* A spare has no rank until it takes one: a program that does not wait as a spare (only
 * dlaunch.torch does) finds no RANK and stops at once, instead of joining the job as rank -1. */
static void drop_rank_vars(char **envp)
{
    static const char *const names[] = {"RANK=", "LOCAL_RANK=", "ROLE_RANK=", "GROUP_RANK=", NULL};
    char **out = envp;
    for (char **e = envp; *e != NULL; e++) {
        bool drop = false;
        for (const char *const *n = names; *n != NULL && !drop; n++)
            drop = strncmp(*e, *n, strlen(*n)) == 0;
        if (drop)
            free(*e);
        else
            *out++ = *e;
    }
    *out = NULL;
}

/* Starts one worker; returns 0 or -errno (then nothing of it is left running). restart_count
 * is its TORCHELASTIC_RESTART_COUNT (dl__agent_restart_count), or for an in-job replacement on
 * one node the restarts spent so far. */
static int spawn_worker(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count)
{
    static const dl_output_cbs_t output_cbs = {on_log_write_failed, on_output_drained,
                                               on_output_line};
    char prefix[256];
    char **envp = NULL;
    int child_out = -1, child_err = -1;
    dl_output_t *out = NULL;
    int r;

    worker_prefix(a, w, prefix, sizeof(prefix));
    w->attempt = attempt;
    w->output_open = false;
    w->incarnation++;
    int control = -1;
    r = dl__rec_channel_open(a, w, &control);
    if (r < 0)
        return r;
    r = build_env(a, w, attempt, restart_count, control, &envp);
    if (r == 0 && w->spare)
        drop_rank_vars(envp);
    if (r < 0) {
        dl__rec_channel_close(w);
        if (control >= 0)
            close(control);
        return r;
    }
    output_owner_t *oo = malloc(sizeof(*oo));
    if (oo == NULL) {
        dl_worker_env_free(envp);
        dl__rec_channel_close(w);
        if (control >= 0)
            close(control);
        return -ENOMEM;
    }
    *oo = (output_owner_t){a, w->rank, attempt, w->incarnation};
    w->output_owner = oo;
    r = dl_output_open(&a->loop, a->attempt_dir, w->rank, prefix, console_streams(a, w), a->readbuf,
                       sizeof(a->readbuf), &output_cbs, oo, &out, &child_out, &child_err);
    if (r < 0) {
        free(oo);
        dl_worker_env_free(envp);
        dl__rec_channel_close(w);
        if (control >= 0)
            close(control);
        return r;
    }
    w->output_open = true;
    int health[2] = {-1, -1};
    if (w->spare)
        dl_diag_beats_init(&w->beats); /* the diagnosis's files are a rank's, not its */
    else
        dl__diag_worker_spawning(a, w);
    if (dl__diag_beats_wanted(a) && pipe2(health, O_CLOEXEC | O_NONBLOCK) < 0) {
        dl__agent_log(a, "no health pipe for rank %d: %s", w->rank, strerror(errno));
        health[0] = health[1] = -1;
    }
    int mem_node;
    const dl_cpus_t *cpus = dl__place_cpus(a, w->local_rank, &mem_node);
    r = dl_spawn(a->command_path, a->spec->command, envp, child_out, child_err, health[1], control,
                 cpus, mem_node, &w->pid);
    close(child_out);
    close(child_err);
    if (health[1] >= 0)
        close(health[1]);
    if (control >= 0)
        close(control);
    w->health_rd = health[0];
    w->beating = w->hung = false;
    w->killed_at = 0;
    dl_worker_env_free(envp);
    if (r < 0) {
        w->pid = 0;
        if (w->health_rd >= 0)
            close(w->health_rd);
        w->health_rd = -1;
        dl__rec_channel_close(w);
        dl_output_drain(out, 0);
        return r;
    }
    w->output = out;
    r = dl_guard_watch(&a->guard, w->pid, 1);
    if (r < 0)
        dl__agent_log(a,
                      "the orphan guard cannot list worker %d's group (%s): its children may "
                      "outlive a killed agent",
                      (int)w->pid, r == -ENOSPC ? "its list is full" : "it is gone");
    if (w->spare) {
        w->last_beat = mono_now(); /* its start, for the line that hands it on */
        dl__agent_log(a,
                      "spare %d started (pid %d): it loads the program and waits for a "
                      "failed rank's place",
                      -1 - w->rank, (int)w->pid);
        return 0;
    }
    dl_ev_worker_start(a->events, dl__now_unix(),
                       &(dl_ev_worker_start_t){.rank = w->rank,
                                               .local_rank = w->local_rank,
                                               .pid = (int)w->pid,
                                               .attempt = attempt,
                                               .generation = a->gen,
                                               .has_generation = a->gen > 0});
    if (a->spec->verbose)
        dl__agent_log(a, "rank %d started (pid %d, attempt %d)", w->rank, (int)w->pid, attempt);
    return 0;
}

int dl__agent_restart_count(const dl_agent_t *a, int attempt)
{
    return a->remote ? a->restarts_spent : attempt;
}

int dl__agent_spawn(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count)
{
    return spawn_worker(a, w, attempt, restart_count);
}

/* One line to a spare's channel, whole or not at all: it blocks on nothing. */
static int tell_spare(int fd, const char *line)
{
    size_t n = strlen(line);
    ssize_t r = send(fd, line, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    return r == (ssize_t)n ? 0 : r < 0 ? -errno : -EAGAIN;
}

/* Gives rank w's empty slot a waiting spare: the rank's environment goes to it on its control
 * channel (`env NAME=VALUE` lines, then `assign`), and its process, pipes and channel become
 * the slot's. -errno when none could take it (then a new process is started). */
static int take_spare(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count)
{
    dl__worker_t *s = dl__spares_ready(a);
    if (s == NULL)
        return -ENOENT;
    char **envp = NULL;
    char line[8192];
    /* The rank's old diagnosis files go before the spare can write its own. */
    dl__diag_worker_spawning(a, w);
    int r = build_env(a, w, attempt, restart_count, DL_SPAWN_CONTROL_FD, &envp);
    for (char **e = envp; r == 0 && *e != NULL; e++) {
        if (strchr(*e, '\n') != NULL || strlen(*e) + 6 > sizeof(line))
            continue; /* no line carries it; the spare keeps its own value */
        snprintf(line, sizeof(line), "env %s\n", *e);
        r = tell_spare(s->ctl_fd, line);
    }
    if (r == 0) {
        snprintf(line, sizeof(line), "assign rank=%d\n", w->rank);
        r = tell_spare(s->ctl_fd, line);
    }
    dl_worker_env_free(envp);
    if (r < 0) {
        dl__agent_log(a, "cannot hand rank %d's place to spare %d: %s; starting a new process",
                      w->rank, -1 - s->rank, strerror(-r));
        dl__spares_kill(a);
        return r;
    }
    int k = -1 - s->rank;
    double waited = mono_now() - s->last_beat;
    w->pid = s->pid;
    w->attempt = attempt;
    w->health_rd = s->health_rd;
    w->beating = w->hung = false;
    w->killed_at = 0;
    w->ctl_fd = s->ctl_fd;
    w->ctl_poll = s->ctl_poll;
    if (w->ctl_poll != NULL)
        w->ctl_poll->data = w;
    memcpy(w->ctl_buf, s->ctl_buf, s->ctl_len);
    w->ctl_len = s->ctl_len;
    w->ctl_hello = false;
    w->ctl_gen = -1;
    w->incarnation++;
    w->output = s->output;
    w->output_open = s->output_open;
    w->output_owner = s->output_owner;
    output_owner_t *oo = w->output_owner;
    if (oo != NULL)
        *oo = (output_owner_t){a, w->rank, attempt, w->incarnation};
    char prefix[256];
    worker_prefix(a, w, prefix, sizeof(prefix));
    if (w->output != NULL)
        dl_output_set_prefix(w->output, prefix);
    dl__spares_handed_on(s);
    dl__agent_log(a,
                  "rank %d's place goes to spare %d (pid %d, waiting for %.1f s); another "
                  "spare starts once the group is formed again",
                  w->rank, k, (int)w->pid, waited);
    dl_ev_worker_start(a->events, dl__now_unix(),
                       &(dl_ev_worker_start_t){.rank = w->rank,
                                               .local_rank = w->local_rank,
                                               .pid = (int)w->pid,
                                               .attempt = attempt,
                                               .spare = true,
                                               .generation = a->gen,
                                               .has_generation = a->gen > 0});
    return 0;
}

int dl__agent_respawn(dl_agent_t *a, dl__worker_t *w, int attempt, int restart_count)
{
    if (take_spare(a, w, attempt, restart_count) == 0)
        return 0;
    int r = spawn_worker(a, w, attempt, restart_count);
    if (r < 0) {
        dl__agent_log(a, "cannot start a replacement for rank %d: %s", w->rank, strerror(-r));
        dl__agent_feed(a, (dl_sup_event_t){
                              .kind = DL_SUP_EV_SPAWN_FAILED, .rank = w->rank, .spawn_errno = -r});
    }
    return r;
}

static void record_failure(dl_agent_t *a)
{
    dl_sup_failure_t *h = realloc(a->history, (a->nhistory + 1) * sizeof(*h));
    if (h == NULL)
        return; /* the summary then omits this attempt; the event stream still has it */
    a->history = h;
    a->history[a->nhistory++] = a->sup.first_failure;
}

/* The first failure as the restart event's reason. An OOM kill: "oom": true and the figures
 * known, in MiB. */
static json_t *failure_json(const dl_sup_failure_t *f)
{
    return dl_ev_failure_json(&(dl_ev_failure_t){
        .rank = f->rank,
        .attempt = f->attempt,
        .hung = f->hung,
        .oom = f->oom,
        .mem_peak_mib = f->mem_peak >> 20,
        .has_mem_peak_mib = f->oom && f->mem_peak > 0,
        .mem_limit_mib = f->mem_limit >> 20,
        .has_mem_limit_mib = f->oom && f->mem_limit > 0,
        .unreapable = f->unreapable,
        .error = f->spawn_errno > 0 ? strerror(f->spawn_errno) : NULL,
        .signal = f->spawn_errno <= 0 && f->signal > 0 ? dl_signal_name(f->signal) : NULL,
        .exit_code = f->exit_code,
        .has_exit_code = f->spawn_errno <= 0 && f->signal <= 0});
}

/* The health watchdog. Beats are drained now and then rather than read as they come: a
 * trainer beats every step, thousands of times a second, and waking for each would cost the
 * workers the CPU they train on. */
static void on_health_check(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    double now = (double)uv_hrtime() / 1e9;
    char buf[4096];

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
        }
        /* The worker closed its end: it says it will beat no more (dlaunch.torch does as its
         * interpreter begins to exit, which under load can outlast --health-timeout), so its
         * silence from here on is no hang. */
        if (n == 0) {
            close(w->health_rd);
            w->health_rd = -1;
        }
    }
    if (a->spec->health_timeout > 0 && a->sup.stop == DL_SUP_STOP_NONE)
        dl__watchdog_check(a, now);
    dl__diag_tick(a, now);
}

/* Finds the interface the workers should bind: the one holding --local-addr, else the one this
 * node reaches `toward` (MASTER_ADDR) from. Says in note[] how it decided, or why it cannot
 * tell; then a->ifname is "" and the frameworks choose as they would without us. */
static int pick_interface(dl_agent_t *a, const char *what, const char *toward, char *note,
                          size_t notelen)
{
    const char *local = a->spec->local_addr;
    int r;
    /* An advertised address that is not this machine's (a NAT's, say) names no interface here:
     * the route then decides, as without --local-addr. */
    if (local != NULL && dl_netif_resolve(local, a->if_addr, sizeof(a->if_addr)) == 0 &&
        dl_netif_name(a->if_addr, a->ifname, sizeof(a->ifname)) == 0) {
        snprintf(note, notelen, "the interface of --local-addr %s", local);
        return 0;
    }
    r = dl_netif_source(toward, a->if_addr, sizeof(a->if_addr));
    if (r == 0)
        r = dl_netif_name(a->if_addr, a->ifname, sizeof(a->ifname));
    if (r < 0) {
        a->ifname[0] = a->if_addr[0] = '\0';
        snprintf(note, notelen, "cannot tell which interface reaches %s %s: %s", what, toward,
                 r == -ENODEV   ? "no interface has the route's address"
                 : r == -ENOENT ? "the name does not resolve"
                                : strerror(-r));
        return r;
    }
    snprintf(note, notelen, "the interface that reaches %s %s%s%s", what, toward,
             local != NULL ? " (--local-addr " : "",
             local != NULL ? "is not an address here)" : "");
    return 0;
}

void dl__agent_rendezvous_event(dl_agent_t *a, int round, bool has_kept, bool kept)
{
    int *ranks = malloc(((size_t)a->nworkers + 1) * sizeof(*ranks));
    for (int i = 0; ranks != NULL && i < a->nworkers; i++)
        ranks[i] = a->workers[i].rank;
    dl_ev_rendezvous(a->events, dl__now_unix(),
                     &(dl_ev_rendezvous_t){.round = round,
                                           .world_size = a->world_size,
                                           .node_rank = a->node_rank,
                                           .nodes = a->nnodes,
                                           .ranks = ranks,
                                           .ranks_count = ranks != NULL ? a->nworkers : 0,
                                           .master_addr = a->master_addr,
                                           .master_port = a->master_port,
                                           .interface = a->ifname[0] != '\0' ? a->ifname : NULL,
                                           .kept = kept,
                                           .has_kept = has_kept});
    free(ranks);
}

static int start_attempt(dl_agent_t *a, int attempt)
{
    char why[512];
    int r;

    snprintf(a->attempt_dir, sizeof(a->attempt_dir), "%s/attempt_%d", a->run_dir_abs, attempt);
    r = mkdir_p(a->attempt_dir);
    if (r < 0) {
        dl__agent_log(a, "cannot create the log folder '%s': %s", a->attempt_dir, strerror(-r));
        return r;
    }
    a->attempt_serial++;
    free(a->made_dir);
    a->made_dir = r == 1 ? strdup(a->attempt_dir) : NULL; /* none: nothing is taken for new */
    r = dl_ownfile_check_dir(a->attempt_dir);
    if (r < 0) {
        dl__agent_log(a, "the log folder '%s' is not safe to write: %s", a->attempt_dir,
                      dl_ownfile_strerror(r));
        return r;
    }
    /* MASTER_ADDR may move with every round. */
    if (pick_interface(a, "MASTER_ADDR", a->master_addr, why, sizeof(why)) < 0) {
        if (!a->spec->quiet)
            dl__agent_log(a, "%s; GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME stay unset", why);
    } else if (a->spec->verbose) {
        dl__agent_log(a, "workers bind %s (%s), %s", a->ifname, a->if_addr, why);
    }
    dl__agent_rendezvous_event(a, attempt, false, false);
    return 0;
}

/* OOM kills are told apart by the counters of the workers' memory cgroups (the agent's). They
 * are first read once the first round's workers are started, not before: finding the cgroups
 * and reading a counter a level costs a launch about 0.1 ms of cgroupfs look-ups, which here
 * overlaps the workers' start instead of holding up the first. Deaths are looked at only back in
 * the event loop, after this read, and no worker or spare runs before the first round. The
 * price: a worker the OOM killer takes between its spawn and this read (the rest of the round's
 * spawns, about 0.4 ms a worker) is named only from the kernel's log (find_oom), which a user
 * may not read (dmesg_restrict): it is then reported as a plain SIGKILL. */
static void read_oom_counters(dl_agent_t *a)
{
    if (a->memcg_read)
        return;
    a->memcg_read = true;
    if (dl_memcg_open(&a->memcg, "", 0) < 0)
        a->memcg.version = 0;
}

static void spawn_all(dl_agent_t *a, int attempt)
{
    int failed_rank = -1, failed_err = 0;

    if (attempt > 0 && !a->remote) {
        record_failure(a);
        const char *diag = dl__diag_text(a);
        dl_ev_restart(a->events, dl__now_unix(),
                      &(dl_ev_restart_t){.attempt = attempt,
                                         .reason = failure_json(&a->sup.first_failure),
                                         .diagnosis = diag[0] != '\0' ? diag : NULL});
        dl__agent_log(a, "restarting the job (attempt %d of %d)", attempt,
                      a->spec->max_restarts + 1);
        /* Several nodes get a new round, and with it an empty store; one node does it here. */
        dl__rdzv_local_store_reset(a);
    }
    if (attempt > 0)
        dl__rdzv_renew_worker_key(a);
    dl__diag_attempt(a);
    /* Over several nodes every new round is a group generation of its own: a node that starts
     * its workers afresh may join others that kept theirs (docs/recovery.md). */
    a->gen = a->remote && dl__rec_in_job(a) ? a->round : 0;
    int r = start_attempt(a, attempt);
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (r == 0)
            r = spawn_worker(a, w, attempt, dl__agent_restart_count(a, attempt));
        if (r < 0 && failed_rank < 0) {
            failed_rank = w->rank;
            failed_err = -r;
            dl__agent_log(a, "cannot start rank %d: %s", w->rank, strerror(-r));
        }
    }
    read_oom_counters(a);
    /* Every rank that did not start counts as exited, so the supervisor's books balance. */
    for (int i = 0; i < a->nworkers; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid == 0)
            dl__agent_feed(
                a, (dl_sup_event_t){.kind = DL_SUP_EV_SPAWN_FAILED,
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

/* The job has ended (its code is decided): a stop signal from now on (a scheduler's SIGTERM at
 * the job's end) changes nothing. Blocked here, before job_end is written, it stays pending;
 * finish_loop then ignores it, where closing the loop's handle would put back the default
 * action, which killed the agent before it drained the logs (at most a second), wrote its
 * summary and removed the workers' key file, and hid the job's exit code behind the signal's. */
static void stop_signals_block(dl_agent_t *a)
{
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < a->nsignals; i++)
        if (a->signals[i].signum != SIGCHLD)
            sigaddset(&set, a->signals[i].signum);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        dl__agent_log(a, "cannot block the stop signals while finishing: %s", strerror(errno));
}

/* Lets go of the agent's own handles so that the loop ends once the outputs drain. */
static void finish_loop(dl_agent_t *a)
{
    for (int i = 0; i < a->nsignals; i++) {
        int signum = a->signals[i].signum;
        uv_close((uv_handle_t *)&a->signals[i], NULL);
        if (signum != SIGCHLD)
            signal(signum, SIG_IGN); /* stop_signals_block: one pending is dropped */
    }
    dl__forward_close(a);
    uv_close((uv_handle_t *)&a->stop_timer, NULL);
    uv_close((uv_handle_t *)&a->reap_timer, NULL);
    uv_close((uv_handle_t *)&a->health_timer, NULL);
    dl__ftimer_close(a);
    dl_merge_flush(&a->merge);
    a->merge_closed = true;
    uv_close((uv_handle_t *)&a->merge_timer, NULL);
    dl__spares_close(a);
    dl__rec_close(a);
    dl__diag_close(a);
}

/* The codes a failure summary goes with: docs/exit-codes.md. */
static bool failed_code(int exit_code)
{
    return exit_code == 1 || exit_code == DL_SUP_EXIT_SAME_FAILURE ||
           exit_code == DL_SUP_EXIT_UNHEALTHY;
}

static void finish(dl_agent_t *a, int exit_code)
{
    const char *status = a->stopped_by_request    ? "stopped"
                         : exit_code == 0         ? "succeeded"
                         : exit_code == 1         ? "failed"
                         : exit_code == 3         ? "timed_out"
                         : exit_code == 4         ? "refused"
                         : failed_code(exit_code) ? "failed"
                                                  : "stopped";
    a->exit_code = exit_code;
    stop_signals_block(a);
    if (failed_code(exit_code) && a->sup.has_failure && !a->remote)
        record_failure(a);
    dl__rdzv_finish(a, exit_code);
    dl_ev_job_end(a->events, dl__now_unix(),
                  &(dl_ev_job_end_t){.status = status,
                                     .exit_code = exit_code,
                                     .attempts = dl_sup_attempts(&a->sup),
                                     .recoveries = a->sup.recoveries,
                                     .has_recoveries = dl__rec_in_job(a)});
    finish_loop(a);
}

/* The run's last line: how it ended, how long it took, where to look. */
static void print_closing_line(const dl_agent_t *a)
{
    const char *status = a->stopped_by_request ? "was stopped on request"
                         : a->exit_code == 0   ? "succeeded"
                         : a->exit_code == 1   ? "failed"
                         : a->exit_code == DL_SUP_EXIT_SAME_FAILURE
                             ? "failed the same way on every attempt (exit 5: do not requeue)"
                         : a->exit_code == DL_SUP_EXIT_UNHEALTHY
                             ? "failed: a worker could not be reaped (exit 6: this node is "
                               "unhealthy)"
                         : a->exit_code == 3 ? "timed out"
                         : a->exit_code == 4 ? "was refused"
                                             : "was stopped";
    const char *summary = NULL;
    int attempts = dl_sup_attempts(&a->sup);

    for (size_t i = 0; a->spec->train != NULL && i < a->spec->train_len; i++)
        if (strncmp(a->spec->train[i], "summary_file=", 13) == 0)
            summary = a->spec->train[i] + 13;
    char recovered[64] = "";
    if (a->sup.recoveries > 0)
        snprintf(recovered, sizeof(recovered), " and %d in-job recover%s", a->sup.recoveries,
                 a->sup.recoveries == 1 ? "y" : "ies");
    fprintf(stderr, "dlaunch: run %s %s after %d attempt%s%s in %.1f s; logs in %s/%s%s\n",
            a->run_id, status, attempts, attempts == 1 ? "" : "s", recovered,
            dl__now_unix() - a->started_at, a->run_dir,
            summary != NULL ? "; trainer summary in " : "", summary != NULL ? summary : "");
}

static void print_summary(const dl_agent_t *a)
{
    if (!failed_code(a->exit_code))
        return;
    if (a->remote)
        fprintf(stderr, "dlaunch: the job failed: %s\n",
                a->failure_text[0] ? a->failure_text : "see the other nodes' logs");
    if (a->nhistory > 0)
        dl_summary_print(stderr, a->history, a->nhistory, a->sup.attempt + 1, a->run_dir,
                         a->unwritten, a->nunwritten);
    if (dl__diag_text(a)[0] != '\0')
        fprintf(stderr, "  where the ranks were: %s\n", dl__diag_text(a));
}

static void apply(dl_agent_t *a, dl_sup_actions_t act)
{
    if (act.flags & DL_SUP_RECOVERY_OFF)
        dl__rec_off(a);
    if (act.flags & DL_SUP_DISARM_TIMER)
        uv_timer_stop(&a->stop_timer);
    if (act.flags & DL_SUP_KILL)
        kill_workers(a, act.kill_signal);
    if (act.flags & DL_SUP_ARM_TIMER)
        uv_timer_start(&a->stop_timer, on_stop_timeout, (uint64_t)(a->spec->stop_timeout * 1000),
                       0);
    if (act.flags & DL_SUP_KEEP)
        dl__rec_keep(a);
    if (act.flags & DL_SUP_REPORT) {
        record_failure(a);
        if (failure_output_drained(a))
            dl__rdzv_report(a);
        else
            a->report_pending = true;
    }
    if (act.flags & DL_SUP_NODE_DONE)
        dl__rdzv_node_done(a);
    if (act.flags & DL_SUP_JOIN)
        dl__rdzv_join(a);
    if (act.flags & DL_SUP_SPAWN)
        spawn_all(a, act.attempt);
    if (act.flags & DL_SUP_RECOVER) {
        record_failure(a);
        dl__rec_start(a, act.rank, act.attempt);
    }
    if (act.flags & DL_SUP_RESUME)
        dl__rec_resume(a, act.attempt);
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

long long dl__agent_attempt_step(const dl_agent_t *a)
{
    long long best = -1;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].beats.figures && (long long)a->workers[i].beats.step > best)
            best = (long long)a->workers[i].beats.step;
    return best;
}

static void report_exit(dl_agent_t *a, int rank, pid_t pid, int code, int sig, bool hung,
                        const dl_oom_t *oom)
{
    if (hung) {
        /* Already said when it was killed. */
    } else if (a->spec->verbose || (code != 0 && a->sup.stop == DL_SUP_STOP_NONE)) {
        /* The attempt's first failure: where the others are, before they are stopped. */
        if (code != 0 && a->sup.stop == DL_SUP_STOP_NONE && dl__diag_text(a)[0] == '\0')
            dl__diag_explain(a, "failure", true);
        if (oom != NULL && oom->killed) {
            char what[200];
            dl_oom_text(oom->peak, oom->limit, what, sizeof(what));
            dl__agent_log(a, "rank %d (pid %d) was killed by the OOM killer (%s)%s%s", rank,
                          (int)pid, what, oom->cgroup[0] ? "; memory cgroup " : "", oom->cgroup);
        } else if (sig > 0)
            dl__agent_log(a, "rank %d (pid %d) was killed by %s", rank, (int)pid,
                          dl_signal_name(sig));
        else
            dl__agent_log(a, "rank %d (pid %d) exited with code %d", rank, (int)pid, code);
    }
    dl__worker_t *w = worker_by_rank(a, rank);
    bool recoverable = w != NULL && code != 0 && dl__rec_recoverable(a, w);
    if (w != NULL && code != 0 && !recoverable) {
        dl_sup_failure_t f = {.rank = rank, .signal = sig, .exit_code = code, .hung = hung};
        dl__rec_unspoken(a, w, &f);
    }
    if (code != 0 && a->recovering) {
        dl_sup_failure_t f = {.rank = rank, .signal = sig, .exit_code = code, .hung = hung};
        dl__rec_interrupted(a, &f);
    }
    bool killed = oom != NULL && oom->killed;
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_WORKER_EXIT,
                                       .rank = rank,
                                       .exit_code = code,
                                       .signal = sig,
                                       .hung = hung,
                                       .recoverable = recoverable,
                                       .oom = killed,
                                       .mem_peak = killed ? oom->peak : 0,
                                       .mem_limit = killed ? oom->limit : 0,
                                       .step = dl__agent_attempt_step(a)});
}

static void deferred_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_deferred(uv_timer_t *t)
{
    deferred_exit_t *d = t->data;
    report_exit(d->agent, d->rank, d->pid, d->code, d->sig, false, NULL);
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

/* What the worker said of its own death (PyTorch's @record): its message into msg and its
 * traceback into *trace (malloc'd, "" when it wrote none). False when it left no error file. */
static bool read_error_file(dl_agent_t *a, int rank, char *msg, size_t len, char **trace)
{
    char path[4200];
    *trace = malloc(EVENT_TRACE_BYTES);
    dl_error_file_path(a->attempt_dir, rank, path, sizeof(path));
    return *trace != NULL && dl_error_file_read(path, msg, len, *trace, EVENT_TRACE_BYTES) == 1;
}

/* A SIGKILL the agent did not send: the kernel's OOM killer, if the workers' memory cgroups
 * counted a kill since the last look or the kernel log names the process. */
static void find_oom(dl_agent_t *a, pid_t pid, long long peak, dl_oom_t *oom)
{
    if (a->memcg.version == 0 || !dl_memcg_oom_since(&a->memcg, "", oom))
        dl_kmsg_oom_killed("", pid, oom);
    oom->peak = peak;
}

static void worker_reaped(dl_agent_t *a, dl__worker_t *w, int status, long long peak)
{
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    pid_t pid = w->pid;
    dl_oom_t oom = {0};

    if (sig == SIGKILL && w->killed_at == 0 && !w->hung)
        find_oom(a, pid, peak, &oom);
    w->killed_at = 0;

    /* What the worker left running in its group goes with it: nothing outlives its worker. */
    if (kill(-pid, SIGKILL) < 0 && errno != ESRCH)
        dl__agent_log(a, "cannot clean up after rank %d: %s", w->rank, strerror(errno));
    dl_guard_watch(&a->guard, pid, 0);
    w->pid = 0;
    if (w->health_rd >= 0)
        close(w->health_rd);
    w->health_rd = -1;
    dl__rec_channel_close(w);
    dl_output_drain(w->output, DRAIN_TIMEOUT_MS);
    w->output = NULL;

    char msg[1024];
    char *trace = NULL;
    bool said = (sig > 0 || code != 0) && read_error_file(a, w->rank, msg, sizeof(msg), &trace);
    dl_ev_worker_exit(a->events, dl__now_unix(),
                      &(dl_ev_worker_exit_t){.rank = w->rank,
                                             .attempt = w->attempt,
                                             .pid = (int)pid,
                                             .signal = sig > 0 ? dl_signal_name(sig) : NULL,
                                             .exit_code = code,
                                             .has_exit_code = sig <= 0,
                                             .oom = oom.killed,
                                             .mem_peak_mib = oom.peak >> 20,
                                             .has_mem_peak_mib = oom.killed && oom.peak > 0,
                                             .mem_limit_mib = oom.limit >> 20,
                                             .has_mem_limit_mib = oom.killed && oom.limit > 0,
                                             .error = said ? msg : NULL,
                                             .traceback = said && trace[0] != '\0' ? trace : NULL});
    free(trace);
    /* A batch system stopping a whole step (scancel) signals every process of it, workers
     * first as often as not: a worker killed by a stop signal we did not send is news only if
     * no signal reaches the agent itself within a moment. */
    /* So is a worker that exited as such a signal makes it (128 + n): the bundled trainer
     * stopped by a peer's stop vote does, when an operator stopped that peer's node; the node's
     * agent says so to the rendezvous, which stops this node too within the moment. */
    bool stop_code = code == 128 + SIGTERM || code == 128 + SIGINT || code == 128 + SIGHUP;
    if ((sig == SIGTERM || sig == SIGINT || sig == SIGHUP || stop_code) &&
        a->sup.stop == DL_SUP_STOP_NONE && defer_exit(a, w->rank, pid, code, sig) == 0)
        return;
    report_exit(a, w->rank, pid, code, sig, w->hung, &oom);
}

/* A worker still there long after its SIGKILL sleeps where no signal reaches it (a wedged
 * device or file system): it is named, with where the kernel holds it, and given up on. */
static void give_up_on(dl_agent_t *a, dl__worker_t *w, double after)
{
    char state, wchan[128];
    int r = dl_proc_wait_state("", w->pid, &state, wchan, sizeof(wchan));
    if (r == -ESRCH || (r == 0 && state == 'Z'))
        return; /* dead: its SIGCHLD is on the way */
    pid_t pid = w->pid;
    int rank = w->rank;
    dl__agent_log(a,
                  "rank %d (pid %d) cannot be reaped: %.1fs after SIGKILL it is still in %s "
                  "(state %c%s%s); giving up on it: this node is unhealthy",
                  rank, (int)pid, after, dl_proc_state_name(state), state,
                  wchan[0] ? ", waiting in " : "", wchan);
    dl_ev_worker_unreapable(a->events, dl__now_unix(),
                            &(dl_ev_worker_unreapable_t){.rank = rank,
                                                         .attempt = w->attempt,
                                                         .pid = (int)pid,
                                                         .state = (char[]){state, '\0'},
                                                         .wchan = wchan,
                                                         .after_s = after});
    dl_guard_watch(&a->guard, pid, 0);
    w->pid = 0;
    w->killed_at = 0;
    if (w->health_rd >= 0)
        close(w->health_rd);
    w->health_rd = -1;
    dl__rec_channel_close(w);
    /* It holds its pipes' other ends: what it wrote is kept, no more is waited for. */
    dl_output_drain(w->output, 0);
    w->output = NULL;
    dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_UNREAPABLE, .rank = rank, .step = -1});
}

static void on_reap_timer(uv_timer_t *t)
{
    dl_agent_t *a = t->data;
    double now = mono_now(), next = 0;
    for (int i = 0; i < a->nworkers && a->sup.phase != DL_SUP_DONE; i++) {
        dl__worker_t *w = &a->workers[i];
        if (w->pid <= 0 || w->killed_at == 0)
            continue;
        double due = w->killed_at + reap_bound(a);
        if (now >= due)
            give_up_on(a, w, now - w->killed_at);
        else if (next == 0 || due < next)
            next = due;
    }
    if (next > 0 && a->sup.phase != DL_SUP_DONE)
        uv_timer_start(t, on_reap_timer, (uint64_t)((next - now) * 1000) + 10, 0);
}

static void on_signal(uv_signal_t *h, int signum)
{
    dl_agent_t *a = h->data;

    if (signum == SIGCHLD) {
        for (;;) {
            int status;
            struct rusage ru = {0};
            pid_t pid = wait4(-1, &status, WNOHANG, &ru);
            if (pid <= 0)
                break;
            if (dl__spares_reaped(a, pid, status))
                continue;
            for (int i = 0; i < a->nworkers; i++) {
                if (a->workers[i].pid == pid) {
                    worker_reaped(a, &a->workers[i], status, (long long)ru.ru_maxrss * 1024);
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
    if (a->sup.stop == DL_SUP_STOP_SIGNAL && a->sup.phase == DL_SUP_STOPPING)
        dl__agent_log(a, "got %s again: killing the workers now (SIGKILL)", dl_signal_name(signum));
    else
        dl__agent_log(a, "got %s: stopping the workers (again to kill them at once)",
                      dl_signal_name(signum));
    dl_ev_signal(a->events, dl__now_unix(),
                 &(dl_ev_signal_t){.signal = dl_signal_name(signum), .forwarded = false});
    dl__rdzv_quit(a, signum);
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

/* CPUs the workers may use: the affinity mask (which a cpuset narrows), lowered to the whole
 * CPUs of the cgroups' CPU quota (docs/agent.md, "Placement"). */
static int usable_cpus(const dl_agent_t *a)
{
    cpu_set_t set;
    int n;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
        n = CPU_COUNT(&set);
    } else {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    dl_cpu_quota_t q;
    char warn[700];
    int r = dl_cgroup_cpu_quota("", &q, warn, sizeof(warn));
    if (r < 0) {
        if (!a->spec->quiet)
            fprintf(stderr,
                    "dlaunch: warning: cannot read the CPU quota (/proc/self/cgroup or "
                    "/proc/self/mountinfo: %s); counting the %d CPUs of the affinity "
                    "mask\n",
                    strerror(-r), n);
        return n;
    }
    if (warn[0] != '\0' && !a->spec->quiet)
        fprintf(stderr, "dlaunch: warning: CPU quota: %s; that level is not counted\n", warn);
    int w = dl_cgroup_cpu_workers(n, &q);
    if (w < n && a->spec->verbose)
        fprintf(stderr, "dlaunch: %d of %d CPUs: %s allows %lld us every %lld us\n", w, n, q.file,
                q.quota_us, q.period_us);
    return w;
}

/* --virtual-local-rank gives worker i entry i of CUDA_VISIBLE_DEVICES: as torchrun, a shorter
 * list is an error. Returns 0, or 2 after saying why. */
static int virtual_rank_check(dl_agent_t *a)
{
    const char *list = dl_env_get(a->environ_list, "CUDA_VISIBLE_DEVICES");
    if (!a->spec->virtual_local_rank || list == NULL || *list == '\0')
        return 0;
    int n = 1;
    for (const char *p = list; *p != '\0'; p++)
        n += *p == ',';
    if (a->nworkers <= n)
        return 0;
    fprintf(stderr,
            "dlaunch: --virtual-local-rank: %d workers, but CUDA_VISIBLE_DEVICES '%s' "
            "names %d device%s: each worker needs one of its own\n",
            a->nworkers, list, n, n == 1 ? "" : "s");
    return 2;
}

/* How many workers this node runs: --gpus-per-node / --nproc-per-node against what is found.
 * Returns 0, or 2 after saying why. */
static int count_workers(dl_agent_t *a)
{
    const dl_job_spec_t *spec = a->spec;
    char proc[4200];
    snprintf(proc, sizeof(proc), "%s/proc", dl__place_hw_root(a));
    int gpus = dl_gpu_count(proc, dl_env_get(a->environ_list, "CUDA_VISIBLE_DEVICES"));
    bool say = !spec->quiet;

    a->gpus = gpus;
    switch (spec->gpus_per_node) {
    case DL_GPUS_DEFAULT:
        a->nworkers = gpus > 0 ? gpus : 1;
        /* Asked for by name: a GPU count where there is none is worth a word. */
        if (gpus == 0 && spec->gpus_set && say)
            fprintf(stderr, "dlaunch: warning: --gpus-per-node auto: no GPU found; starting 1 "
                            "worker on the CPU\n");
        return 0;
    case DL_GPUS_AUTO:
        a->nworkers = gpus > 0 ? gpus : usable_cpus(a);
        if (gpus == 0 && say)
            fprintf(stderr,
                    "dlaunch: warning: --nproc-per-node auto: no GPU found; starting %d "
                    "worker%s, one per usable CPU\n",
                    a->nworkers, a->nworkers == 1 ? "" : "s");
        return 0;
    case DL_GPUS_CPU: a->nworkers = usable_cpus(a); return 0;
    case DL_GPUS_XPU:
        a->nworkers =
            dl_xpu_count(dl__place_hw_root(a), dl_env_get(a->environ_list, "ZE_AFFINITY_MASK"));
        if (a->nworkers == 0) {
            fprintf(stderr, "dlaunch: --nproc-per-node xpu: no Intel GPU found (no card in "
                            "/sys/class/drm with the i915 or xe driver); give a count or cpu\n");
            return 2;
        }
        return 0;
    case DL_GPUS_GPU:
        if (gpus == 0) {
            fprintf(stderr, "dlaunch: --nproc-per-node gpu: no GPU found (none in /proc/driver/"
                            "nvidia, or CUDA_VISIBLE_DEVICES hides them); give a count or cpu\n");
            return 2;
        }
        a->nworkers = gpus;
        return 0;
    default:
        a->nworkers = spec->gpus_per_node;
        /* A process count (--nproc-per-node) says nothing of GPUs; a GPU count does. */
        if (!spec->gpus_from_nproc && a->nworkers > gpus && say)
            fprintf(stderr,
                    "dlaunch: warning: --gpus-per-node %d: %d GPU%s found; starting %d "
                    "worker%s%s\n",
                    a->nworkers, gpus, gpus == 1 ? "" : "s", a->nworkers,
                    a->nworkers == 1 ? "" : "s", gpus > 0 ? ", some sharing a GPU" : " on the CPU");
        return 0;
    }
}

/* Where the rendezvous is, if any, by --rdzv-backend, --standalone and the node count.
 * Returns 0, or 2 after saying why. */
static int place_rendezvous(dl_agent_t *a)
{
    const dl_job_spec_t *spec = a->spec;

    a->nodes_min = spec->nodes_min;
    a->nodes_max = spec->nodes_max;
    a->want_node_rank = spec->node_rank;
    if (spec->standalone) {
        if (spec->nodes_max > 1) {
            fprintf(stderr, "dlaunch: --standalone runs one node, but --nnodes asks for %d:%d\n",
                    spec->nodes_min, spec->nodes_max);
            return 2;
        }
        return 0;
    }
    switch (spec->rdzv_backend) {
    case DL_RDZV_STATIC:
        /* torchrun's static rendezvous: node 0's address and port, every node's rank given. */
        if (spec->nodes_max > 1) {
            if (spec->nodes_min != spec->nodes_max) {
                fprintf(stderr,
                        "dlaunch: --rdzv-backend static: --nnodes %d:%d is elastic; "
                        "static takes a fixed count (use c10d for a range)\n",
                        spec->nodes_min, spec->nodes_max);
                return 2;
            }
            if (asprintf(&a->endpoint, "%s:%d",
                         spec->master_addr != NULL ? spec->master_addr : "127.0.0.1",
                         spec->master_port > 0 ? spec->master_port : 29500) < 0) {
                a->endpoint = NULL;
                fprintf(stderr, "dlaunch: out of memory\n");
                return 2;
            }
            if (a->want_node_rank < 0)
                a->want_node_rank = 0;
        }
        break;
    case DL_RDZV_ETCD:
        /* An etcd v3 cluster holds the rendezvous (docs/etcd.md), even for one node. */
        if (spec->rdzv_endpoint == NULL) {
            fprintf(stderr, "dlaunch: --rdzv-backend etcd needs --rdzv-endpoint "
                            "HOST:PORT[,HOST:PORT...], the etcd cluster's client endpoints\n");
            return 2;
        }
        if ((a->endpoint = strdup(spec->rdzv_endpoint)) == NULL) {
            fprintf(stderr, "dlaunch: out of memory\n");
            return 2;
        }
        /* --http: the agent serves the job's status page as etcd holds it (rdzv-etcd.c). */
        break;
    default:
        if (spec->rdzv_endpoint != NULL && (a->endpoint = strdup(spec->rdzv_endpoint)) == NULL) {
            fprintf(stderr, "dlaunch: out of memory\n");
            return 2;
        }
        if (spec->nodes_max > 1 && a->endpoint == NULL) {
            fprintf(stderr,
                    "dlaunch: --nodes %d:%d: a job over several nodes needs "
                    "--rdzv-endpoint HOST:PORT\n",
                    spec->nodes_min, spec->nodes_max);
            return 2;
        }
        break;
    }
    a->remote = a->endpoint != NULL;
    if (spec->http != NULL && !a->remote) {
        fprintf(stderr, "dlaunch: --http: only the node that hosts a rendezvous serves it; give "
                        "--rdzv-endpoint HOST:PORT\n");
        return 2;
    }
    if (a->remote && spec->run_id == NULL) {
        fprintf(stderr,
                "dlaunch: %s: every node of the job needs the same --run-id (or "
                "--rdzv-id)\n",
                spec->rdzv_backend == DL_RDZV_STATIC ? "--rdzv-backend static"
                : spec->rdzv_backend == DL_RDZV_ETCD ? "--rdzv-backend etcd"
                                                     : "--rdzv-endpoint");
        return 2;
    }
    if (a->remote && spec->dead_after <= spec->heartbeat) {
        char dead[32], beat[32];
        fprintf(stderr,
                "dlaunch: --dead-after %s is not above --heartbeat %s: every node would "
                "be declared dead between two of its heartbeats\n",
                dl_opt_num_text(spec->dead_after, dead, sizeof(dead)),
                dl_opt_num_text(spec->heartbeat, beat, sizeof(beat)));
        return 2;
    }
    if (a->want_node_rank >= a->nodes_max) {
        fprintf(stderr, "dlaunch: --node-rank %d: a job of %d node%s has ranks 0 to %d\n",
                a->want_node_rank, a->nodes_max, a->nodes_max == 1 ? "" : "s", a->nodes_max - 1);
        return 2;
    }
    return 0;
}

/* The log folder is made and tried before any worker starts: a folder nobody can write would
 * otherwise fail every attempt and blame rank 0. */
static int check_log_dir(dl_agent_t *a)
{
    char probe[4200];
    int r = mkdir_p(a->run_dir);
    bool made = r == 1;
    /* On shared storage another user may have made it first, to swap the files in it. */
    if (r >= 0 && (r = dl_ownfile_check_dir(a->run_dir)) < 0) {
        fprintf(stderr, "dlaunch: --log-dir: the log folder '%s' is not safe to write: %s\n",
                a->run_dir, dl_ownfile_strerror(r));
        return 2;
    }
    /* One made just now is ours with mode 0750, and as writable as a file made in it would
     * prove: only one that was there (a --run-id used before, a read-only mount) needs it. */
    if (r == 0 && !made) {
        snprintf(probe, sizeof(probe), "%s/.dlaunch-probe-%d", a->run_dir, (int)getpid());
        int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            r = -errno;
        } else {
            close(fd);
            unlink(probe);
        }
    }
    if (r < 0) {
        fprintf(stderr, "dlaunch: --log-dir: cannot write the log folder '%s': %s\n", a->run_dir,
                strerror(-r));
        return 2;
    }
    return 0;
}

/* Decides the shape of the job on this node. Returns 0, or an exit code (2) after saying why. */
static int plan(dl_agent_t *a)
{
    const dl_job_spec_t *spec = a->spec;
    int r;

    r = place_rendezvous(a);
    if (r == 0)
        r = count_workers(a);
    if (r == 0)
        r = dl__spares_plan(a);
    if (r == 0)
        r = virtual_rank_check(a);
    if (r == 0)
        r = dl__place_plan(a);
    if (r != 0)
        return r;
    /* Until the rendezvous says otherwise (remote), this node is the whole job. */
    a->nnodes = 1;
    a->node_rank = 0;
    a->world_size = a->nworkers * a->nnodes;

    r = dl_resolve_command(spec->command[0], dl_env_get(a->environ_list, "PATH"), &a->command_path);
    if (r < 0) {
        fprintf(stderr, "dlaunch: cannot run '%s': %s\n", spec->command[0],
                r == -ENOENT ? "command not found" : strerror(-r));
        return 2;
    }
    a->run_id = spec->run_id != NULL ? strdup(spec->run_id) : make_run_id();
    if (a->run_id == NULL ||
        asprintf(&a->run_dir, "%s/%s", spec->log_dir != NULL ? spec->log_dir : "dlaunch_logs",
                 a->run_id) < 0) {
        a->run_dir = NULL;
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    /* Workers get absolute paths: one that changes its folder still finds its files. */
    char cwd[4096];
    if (a->run_dir[0] == '/')
        a->run_dir_abs = strdup(a->run_dir);
    else if (getcwd(cwd, sizeof(cwd)) == NULL ||
             asprintf(&a->run_dir_abs, "%s/%s", cwd, a->run_dir) < 0)
        a->run_dir_abs = NULL;
    if (a->run_dir_abs == NULL) {
        fprintf(stderr, "dlaunch: cannot tell the log folder's absolute path: %s\n",
                strerror(errno));
        return 2;
    }
    const char *tmpl = dl_env_get(a->environ_list, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    snprintf(a->prefix_template, sizeof(a->prefix_template), "%s", tmpl != NULL ? tmpl : "");
    snprintf(a->master_addr, sizeof(a->master_addr), "%s",
             spec->master_addr != NULL && !a->remote ? spec->master_addr : "127.0.0.1");
    /* One node alone: --master-port is the workers' own (their rank 0 binds it), as torchrun's
     * single-node static rendezvous hands it on. */
    if (spec->master_port > 0 && !a->remote)
        a->master_port = spec->master_port;
    else if (!a->remote && !spec->dry_run)
        a->master_port = 0; /* the store's own bind, else a free port then (dl_agent_run) */
    else if ((r = find_free_port(&a->master_port)) < 0) {
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
        for (int i = 0; i < n; i++) {
            a->workers[i].health_rd = -1;
            a->workers[i].ctl_fd = -1;
        }
    }
    /* A worker kept into a new round (in-job recovery) keeps its pipes; it only gets its new
     * rank, which the control channel tells it. */
    for (int i = 0; i < n; i++) {
        a->workers[i].agent = a;
        a->workers[i].local_rank = i;
        a->workers[i].rank = first_rank + i;
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
    if (a->remote) {
        char nodes[64];
        if (a->nodes_min == a->nodes_max)
            snprintf(nodes, sizeof(nodes), "%d node%s", a->nodes_max, a->nodes_max == 1 ? "" : "s");
        else
            snprintf(nodes, sizeof(nodes), "%d to %d nodes", a->nodes_min, a->nodes_max);
        printf("run %s: %s through the rendezvous at %s, %d worker%s on this node, "
               "max restarts %d (ranks, world size and MASTER_* come from the rendezvous)\n",
               a->run_id, nodes, a->endpoint, a->nworkers, a->nworkers == 1 ? "" : "s",
               a->spec->max_restarts);
    } else {
        printf("run %s: %d node%s, %d worker%s per node, world size %d, max restarts %d\n",
               a->run_id, a->nnodes, a->nnodes == 1 ? "" : "s", a->nworkers,
               a->nworkers == 1 ? "" : "s", a->world_size, a->spec->max_restarts);
    }
    /* The store's port is taken when the job starts; say so rather than leave it out. */
    snprintf(a->store_addr, sizeof(a->store_addr), "%s",
             a->remote ? "(node 0's, from the rendezvous)" : "127.0.0.1:(a free port at start)");
    /* So is the workers' key file, when the job has a token. */
    const char *token_env = dl_env_get(a->environ_list, "DLAUNCH_TOKEN");
    if (a->token_path == NULL &&
        (a->spec->token_file != NULL || (token_env != NULL && *token_env != '\0')))
        a->token_path = strdup("(made at start: a file of mode 0600 with the worker key)");
    printf("logs: %s/attempt_K/rank_N.{out,err}\ncommand:", a->run_dir);
    for (char **c = a->spec->command; *c != NULL; c++) {
        putchar(' ');
        print_quoted(*c);
    }
    printf("\n");
    /* Several nodes: MASTER_ADDR is node 0's, known only after the rendezvous; the interface
     * that reaches the rendezvous is the one that would be chosen. */
    char toward[300], why[512];
    int port = 0;
    if (a->endpoint == NULL ||
        dl_rdzv_endpoint_parse(a->endpoint, toward, sizeof(toward), &port) < 0)
        snprintf(toward, sizeof(toward), "%s", a->master_addr);
    if (pick_interface(a, port > 0 ? "the rendezvous" : "MASTER_ADDR", toward, why, sizeof(why)) <
        0)
        printf("network: %s; GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME stay unset\n", why);
    else
        printf("network: workers bind %s (%s), %s\n", a->ifname, a->if_addr, why);
    dl__place_print(a);
    snprintf(a->attempt_dir, sizeof(a->attempt_dir), "%s/attempt_0", a->run_dir_abs);
    for (int i = 0; i < a->nworkers; i++) {
        char **envp;
        if (build_env(a, &a->workers[i], 0, 0, dl__rec_in_job(a) ? DL_SPAWN_CONTROL_FD : -1,
                      &envp) < 0) {
            fprintf(stderr, "dlaunch: out of memory\n");
            return 2;
        }
        printf("rank %d:", a->workers[i].rank);
        json_t *o = worker_env_json(a, envp);
        const char *k;
        json_t *v;
        json_object_foreach (o, k, v) {
            printf(" %s=", k);
            print_quoted(json_string_value(v));
        }
        printf("\n");
        json_decref(o);
        dl_worker_env_free(envp);
    }
    return 0;
}

static void add_signal(void *ctx, int sig)
{
    int *list = ctx;
    /* list[0] counts; duplicates and overflow are dropped quietly (the lists were checked). */
    for (int i = 1; i <= list[0]; i++)
        if (list[i] == sig)
            return;
    if (list[0] < 30)
        list[++list[0]] = sig;
}

static int setup_loop(dl_agent_t *a)
{
    int r, list[32] = {0};
    char bad[64];

    r = uv_loop_init(&a->loop);
    if (r < 0)
        return r;
    /* The signals that stop the job (torchrun's --signals-to-handle), then SIGCHLD to reap;
     * then those passed on while it goes on. */
    dl_signal_list_each(a->spec->signals != NULL ? a->spec->signals : DL_DEFAULT_SIGNALS,
                        add_signal, list, bad, sizeof(bad));
    list[++list[0]] = SIGCHLD;
    for (int i = 0; i < list[0]; i++) {
        uv_signal_init(&a->loop, &a->signals[i]);
        a->signals[i].data = a;
        a->nsignals = i + 1;
        r = uv_signal_start(&a->signals[i], on_signal, list[i + 1]);
        if (r < 0)
            return r;
    }
    r = dl__forward_start(a);
    if (r < 0)
        return r;
    uv_timer_init(&a->loop, &a->stop_timer);
    a->stop_timer.data = a;
    uv_timer_init(&a->loop, &a->reap_timer);
    a->reap_timer.data = a;
    uv_timer_init(&a->loop, &a->health_timer);
    a->health_timer.data = a;
    dl__rec_init(a);
    dl_merge_init(&a->merge, a->spec->merge_window, print_merged, a);
    uv_timer_init(&a->loop, &a->merge_timer);
    a->merge_timer.data = a;
    r = dl__ftimer_start(a);
    if (r < 0)
        return r;
    /* torchrun's open-source health-check server is a stub that serves nothing; ours neither,
     * but a user who set the port hears it instead of finding it closed. */
    const char *hc = getenv("TORCHELASTIC_HEALTH_CHECK_PORT");
    if (hc != NULL && hc[0] != '\0')
        dl__agent_log(a,
                      "TORCHELASTIC_HEALTH_CHECK_PORT=%.32s: no health-check server is started "
                      "(torchrun's is a stub too: docs/torchrun.md); see --http",
                      hc);
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
    dl__place_free(a);
    free(a->workers);
    free(a->spares);
    free(a->run_id);
    free(a->run_dir);
    free(a->run_dir_abs);
    free(a->made_dir);
    free(a->command_path);
    free(a->history);
    for (size_t i = 0; i < a->nunwritten; i++)
        free(a->unwritten[i].path);
    free(a->unwritten);
    free(a->token_path);
    free(a->endpoint);
    dl__dup_close(a);
    dl_merge_flush(&a->merge);
    dl_events_close(a->events);
    munmap(a, sizeof(*a));
}

/* The agent is 90 KB, most of it the output read buffer: mapped rather than calloc'd, a page
 * costs nothing until first used (calloc would clear them all, and the orphan guard's fork
 * would then have every one of them copied on the agent's next write to it). */
static dl_agent_t *agent_alloc(void)
{
    void *p =
        mmap(NULL, sizeof(dl_agent_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p != MAP_FAILED ? p : NULL;
}

int dl_agent_run(const dl_job_spec_t *spec, char **environ_list)
{
    dl_agent_t *a = agent_alloc();
    int r, code;

    if (a == NULL) {
        fprintf(stderr, "dlaunch: out of memory\n");
        return 2;
    }
    a->spec = spec;
    a->environ_list = environ_list;
    a->guard.fd = -1;
    a->started_at = dl__now_unix();
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
    if (check_log_dir(a) != 0) {
        agent_free(a);
        return 2;
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
    dl_sup_set_in_job(&a->sup, dl__rec_in_job(a));
    dl_sup_set_max_same(&a->sup, spec->max_same_failures);
    /* Over several nodes the shape is the rendezvous's to decide: the job's range now, the
     * world size with each round's `rendezvous` event. */
    dl_ev_job_start(a->events, dl__now_unix(),
                    &(dl_ev_job_start_t){.run_id = a->run_id,
                                         .nodes = a->remote ? a->nodes_max : a->nnodes,
                                         .min_nodes = a->remote ? a->nodes_min : a->nnodes,
                                         .workers_per_node = a->nworkers,
                                         .max_restarts = spec->max_restarts,
                                         .log_dir = a->run_dir,
                                         .command = spec->command,
                                         .world_size = a->world_size,
                                         .has_world_size = !a->remote});
    /* Several nodes: the supervisor starts once the rendezvous answers (dl__rdzv_start's
     * ready). One: the store for the workers, then the supervisor at once. */
    code = a->remote ? dl__rdzv_start(a) : dl__rdzv_local_store(a);
    /* One node: the agent's store serving torch's has bound MASTER_PORT already; without it
     * (store=worker, or no store) rank 0 binds one found free now, a bind saved otherwise. */
    if (code == 0 && !a->remote && a->master_port == 0 &&
        (r = find_free_port(&a->master_port)) < 0) {
        fprintf(stderr, "dlaunch: cannot find a free port for MASTER_PORT: %s\n", strerror(-r));
        code = 2;
    }
    if (code != 0) {
        {
            stop_signals_block(a);
            dl_ev_job_end(a->events, dl__now_unix(),
                          &(dl_ev_job_end_t){.status = "refused", .exit_code = code});
            dl__rdzv_finish(a, code);
            finish_loop(a);
            uv_run(&a->loop, UV_RUN_DEFAULT);
            uv_loop_close(&a->loop);
            dl_guard_stop(&a->guard);
            agent_free(a);
            return code;
        }
    }
    if (!a->remote)
        dl__agent_feed(a, (dl_sup_event_t){.kind = DL_SUP_EV_START});
    uv_run(&a->loop, UV_RUN_DEFAULT);

    code = a->exit_code;
    /* The loop ends once every worker's output has drained, so the logs the summary quotes are
     * whole by now. */
    print_summary(a);
    print_closing_line(a);
    dl_guard_stop(&a->guard);
    if (uv_loop_close(&a->loop) != 0)
        dl__agent_log(a, "event loop closed with handles still open");
    agent_free(a);
    return code;
}
