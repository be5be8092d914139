/* torch's file-timer watchdog (torch.distributed.elastic.timer.FileTimerClient), the agent's
 * side, pure: a request line read into fields, the table of live timers, and which worker is due
 * to be killed. No clock and no I/O: the caller passes the time (seconds since the epoch, as
 * the clients write it) and reads the named pipe itself. */
#ifndef DL_FILETIMER_H
#define DL_FILETIMER_H

#include <stddef.h>

/* A client writes one JSON object a line, each under PIPE_BUF so that writes stay whole. */
#define DL_FILETIMER_MAX_LINE 4096
/* Live timers held at most; a request beyond it is refused (-E2BIG), so a runaway client
 * cannot grow the agent without bound. */
#define DL_FILETIMER_MAX_TIMERS 4096

/* One request: {"version":1,"pid":P,"scope_id":S,"expiration_time":T,"signal":N}. A negative
 * expiration_time releases (pid, scope_id). */
typedef struct {
    int pid;
    char scope_id[256];
    double expiration_time;
    int signal;
} dl_filetimer_req_t;

/* Reads line (len bytes, no newline). Returns 0, or -EINVAL for anything that is not such an
 * object (bad JSON, a field missing or of the wrong type, pid <= 0, a signal outside 0..64, a
 * scope_id too long); *ret is untouched on failure. */
int dl_filetimer_parse(const char *line, size_t len, dl_filetimer_req_t *ret);

typedef struct {
    dl_filetimer_req_t *t; /* owned */
    size_t n, cap;
} dl_filetimer_table_t;

void dl_filetimer_init(dl_filetimer_table_t *tab);
void dl_filetimer_free(dl_filetimer_table_t *tab);

/* Sets (or replaces) the timer of (pid, scope_id), or releases it when expiration_time < 0 (a
 * release of an unknown timer is not an error, as in torch). Returns 0, -E2BIG (table full) or
 * -ENOMEM. */
int dl_filetimer_apply(dl_filetimer_table_t *tab, const dl_filetimer_req_t *req);

/* The worker due to be killed at now: among the pids with a timer expired by now, the first
 * whose earliest-expiring expired timer with a signal > 0 is earliest; that timer is copied to
 * *ret. Returns 1 (found) or 0. A pid whose expired timers all carry signal 0 is never chosen
 * (torch's "do not reap"): its timers stay. */
int dl_filetimer_due(const dl_filetimer_table_t *tab, double now, dl_filetimer_req_t *ret);

/* Drops every timer of pid: after it was killed, or once it exited. */
void dl_filetimer_forget_pid(dl_filetimer_table_t *tab, int pid);

/* The earliest expiration_time among the timers with a signal > 0, or a negative number when
 * there is none: when the caller should look again. */
double dl_filetimer_next(const dl_filetimer_table_t *tab);

#endif
