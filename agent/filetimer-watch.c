/* torch's file-timer watchdog served by the agent, as torch's LocalElasticAgent serves it when
 * TORCHELASTIC_ENABLE_FILE_TIMER=1: a named pipe (TORCHELASTIC_TIMER_FILE, else a fresh name
 * under /tmp) that FileTimerClient writes request lines to, and a check every 100 ms (torch's
 * max_interval) that kills the worker whose timer expired with the signal it asked for. The
 * decisions are filetimer.c's; this file reads the pipe and acts. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "filetimer.h"
#include "internal.h"
#include "linebuf.h"

struct dl__ftimer_s {
    dl_agent_t *agent;
    uv_pipe_t pipe;
    uv_timer_t check;
    int keep_wr;   /* a write end held open, so the pipe never reads EOF between clients */
    int handles;   /* handles whose close callback has not run */
    bool bad_said; /* one warning for bad lines, not one per line */
    char path[4096];
    dl_linebuf_t lb;
    dl_filetimer_table_t tab;
    char readbuf[4096];
};

static void on_line(void *ctx, const char *line, size_t len)
{
    dl__ftimer_t *ft = ctx;
    dl_filetimer_req_t req;
    int r = dl_filetimer_parse(line, len, &req);
    if (r == 0)
        r = dl_filetimer_apply(&ft->tab, &req);
    if (r < 0 && !ft->bad_said) {
        ft->bad_said = true;
        dl__agent_log(ft->agent, "file timer '%s': %s (said once): '%.*s'", ft->path,
                      r == -EINVAL ? "ignored a line that is not a FileTimerClient request"
                                   : "ignored a request: too many timers",
                      (int)(len > 120 ? 120 : len), line);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    dl__ftimer_t *ft = h->data;
    *buf = uv_buf_init(ft->readbuf, sizeof(ft->readbuf));
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf)
{
    dl__ftimer_t *ft = h->data;
    if (nread > 0)
        dl_linebuf_feed(&ft->lb, buf->base, (size_t)nread, on_line, ft);
    else if (nread < 0 && nread != UV_EOF) {
        dl__agent_log(ft->agent, "file timer '%s': read failed: %s; timers are no longer read",
                      ft->path, uv_strerror((int)nread));
        uv_read_stop(h);
    }
}

static dl__worker_t *worker_by_pid(dl_agent_t *a, int pid)
{
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].pid > 0 && (int)a->workers[i].pid == pid)
            return &a->workers[i];
    return NULL;
}

static void on_check(uv_timer_t *t)
{
    dl__ftimer_t *ft = t->data;
    dl_agent_t *a = ft->agent;
    double now = dl__now_unix();
    dl_filetimer_req_t due;
    while (dl_filetimer_due(&ft->tab, now, &due) == 1) {
        dl_filetimer_forget_pid(&ft->tab, due.pid);
        dl__worker_t *w = worker_by_pid(a, due.pid);
        /* Only this agent's workers: a pipe line must not be a way to kill anything else. */
        if (w == NULL) {
            dl__agent_log(a,
                          "file timer '%s': timer '%s' of pid %d expired, but pid %d is not a "
                          "worker of this node; not killed",
                          ft->path, due.scope_id, due.pid, due.pid);
            continue;
        }
        dl__agent_log(a,
                      "rank %d (pid %d) overran its file timer '%s' by %.1fs: killing it "
                      "with signal %d",
                      w->rank, due.pid, due.scope_id, now - due.expiration_time, due.signal);
        dl_ev_worker_timer_expired(
            a->events, now,
            &(dl_ev_worker_timer_expired_t){.rank = w->rank,
                                            .pid = due.pid,
                                            .scope_id = due.scope_id,
                                            .signal = due.signal,
                                            .overrun_s = now - due.expiration_time});
        if (kill(due.pid, due.signal) < 0 && errno != ESRCH)
            dl__agent_log(a, "cannot send signal %d to rank %d (pid %d): %s", due.signal, w->rank,
                          due.pid, strerror(errno));
    }
}

static void free_ft(dl__ftimer_t *ft)
{
    dl_linebuf_free(&ft->lb);
    dl_filetimer_free(&ft->tab);
    if (ft->keep_wr >= 0)
        close(ft->keep_wr);
    free(ft);
}

static void handle_closed(uv_handle_t *h)
{
    dl__ftimer_t *ft = h->data;
    if (--ft->handles == 0)
        free_ft(ft);
}

/* torch removes whatever is at the path before mkfifo; a regular file someone named by mistake
 * is refused here instead of deleted. */
static int make_fifo(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISFIFO(st.st_mode))
            return -EEXIST;
        if (unlink(path) < 0)
            return -errno;
    }
    if (mkfifo(path, 0600) < 0)
        return -errno;
    return 0;
}

int dl__ftimer_start(dl_agent_t *a)
{
    const char *on = getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
    if (on == NULL || strcmp(on, "1") != 0)
        return 0;
    dl__ftimer_t *ft = calloc(1, sizeof(*ft));
    if (ft == NULL)
        return -ENOMEM;
    ft->agent = a;
    ft->keep_wr = -1;
    const char *path = getenv("TORCHELASTIC_TIMER_FILE");
    if (path != NULL && path[0] != '\0')
        snprintf(ft->path, sizeof(ft->path), "%s", path);
    else
        snprintf(ft->path, sizeof(ft->path), "/tmp/watchdog_timer_%s_%d", a->run_id, (int)getpid());
    dl_linebuf_init(&ft->lb);
    dl_filetimer_init(&ft->tab);
    int r = make_fifo(ft->path);
    int rd = -1;
    if (r == 0 && (rd = open(ft->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
        r = -errno;
    if (r == 0 && (ft->keep_wr = open(ft->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
        r = -errno;
    if (r < 0) {
        dl__agent_log(a,
                      "cannot serve the file timer at '%s' (TORCHELASTIC_ENABLE_FILE_TIMER=1): "
                      "%s",
                      ft->path, strerror(-r));
        if (rd >= 0)
            close(rd);
        free_ft(ft);
        return r;
    }
    uv_pipe_init(&a->loop, &ft->pipe, 0);
    ft->pipe.data = ft;
    uv_timer_init(&a->loop, &ft->check);
    ft->check.data = ft;
    ft->handles = 2;
    a->ftimer = ft;
    r = uv_pipe_open(&ft->pipe, rd);
    if (r == 0)
        r = uv_read_start((uv_stream_t *)&ft->pipe, on_alloc, on_read);
    if (r < 0) {
        dl__agent_log(a, "cannot read the file timer '%s': %s", ft->path, uv_strerror(r));
        dl__ftimer_close(a);
        return r;
    }
    uv_timer_start(&ft->check, on_check, 100, 100);
    dl__agent_log(a, "serving the file timer at '%s' (TORCHELASTIC_TIMER_FILE)", ft->path);
    return 0;
}

const char *dl__ftimer_path(const dl_agent_t *a)
{
    if (a->ftimer != NULL)
        return a->ftimer->path;
    /* As torch: a path set without the watchdog still reaches the workers. */
    return getenv("TORCHELASTIC_TIMER_FILE");
}

void dl__ftimer_close(dl_agent_t *a)
{
    dl__ftimer_t *ft = a->ftimer;
    if (ft == NULL)
        return;
    a->ftimer = NULL;
    unlink(ft->path);
    uv_close((uv_handle_t *)&ft->pipe, handle_closed);
    uv_close((uv_handle_t *)&ft->check, handle_closed);
}
