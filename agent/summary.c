/* What a user reads first when a job fails: which rank, how, when, and where its log is. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errorfile.h"
#include "ownfile.h"
#include "summary.h"

#define TAIL_LINES 10
#define SHOWN_ATTEMPTS 5

const char *dl_signal_name(int sig)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev != NULL)
        snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    else
        snprintf(buf, sizeof(buf), "signal %d", sig);
    return buf;
}

int dl_summary_tail(const char *path, int max_lines, char *buf, size_t len)
{
    struct stat st;
    ssize_t n;

    if (len == 0)
        return -EINVAL;
    buf[0] = '\0';
    int fd = dl_ownfile_open(path, O_RDONLY, 0);
    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    off_t start = st.st_size > (off_t)(len - 1) ? st.st_size - (off_t)(len - 1) : 0;
    n = pread(fd, buf, len - 1, start);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    /* Walk back over max_lines newlines, ignoring a final one. */
    ssize_t i = n;
    if (i > 0 && buf[i - 1] == '\n')
        i--;
    int lines = 0;
    while (i > 0) {
        if (buf[i - 1] == '\n' && ++lines == max_lines)
            break;
        i--;
    }
    memmove(buf, buf + i, (size_t)(n - i) + 1);
    dl_ownfile_clean(buf, 1); /* for a terminal and the status page */
    return (int)(n - i);
}

/* The last max_lines lines of text, each as "    | line". */
static void print_last_lines(FILE *f, const char *text, int max_lines)
{
    const char *end = text + strlen(text), *start = end;
    int lines = 0;

    if (start > text && start[-1] == '\n')
        start--;
    while (start > text) {
        if (start[-1] == '\n' && ++lines == max_lines)
            break;
        start--;
    }
    while (start < end) {
        size_t n = strcspn(start, "\n");
        if (n > 0)
            fprintf(f, "    | %.*s\n", (int)n, start);
        start += n + (start[n] == '\n');
    }
}

void dl_oom_text(long long peak, long long limit, char *buf, size_t len)
{
    char p[64] = "", l[64] = "";
    if (peak > 0)
        snprintf(p, sizeof(p), "its memory peak %lld MiB", peak >> 20);
    if (limit > 0)
        snprintf(l, sizeof(l), "the limit %lld MiB", limit >> 20);
    snprintf(buf, len, "%s%s%s", p, p[0] && l[0] ? ", " : "", p[0] || l[0] ? l : "no figures");
}

static void describe(FILE *f, const dl_sup_failure_t *x)
{
    char when[64];
    time_t t = (time_t)x->time;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);

    fprintf(f, "  attempt %d: rank %d ", x->attempt, x->rank);
    if (x->spawn_errno > 0)
        fprintf(f, "could not be started (%s)", strerror(x->spawn_errno));
    else if (x->hung)
        fprintf(f, "hung (no health beat in time) and was killed");
    else if (x->unreapable)
        fprintf(f, "could not be reaped (still there after SIGKILL: the node is unhealthy)");
    else if (x->oom) {
        char what[200];
        dl_oom_text(x->mem_peak, x->mem_limit, what, sizeof(what));
        fprintf(f, "was killed by the OOM killer (%s)", what);
    } else if (x->signal > 0)
        fprintf(f, "was killed by %s", dl_signal_name(x->signal));
    else
        fprintf(f, "exited with code %d", x->exit_code);
    fprintf(f, " at %s\n", when);
}

void dl_summary_print(FILE *f, const dl_sup_failure_t *history, size_t n, int attempts,
                      const char *run_dir, const dl_summary_unwritten_t *unwritten,
                      size_t nunwritten)
{
    char path[4200];
    char tail[4096];

    fprintf(f, "dlaunch: the job failed after %d attempt%s; first failure of each:\n", attempts,
            attempts == 1 ? "" : "s");
    size_t from = n > SHOWN_ATTEMPTS ? n - SHOWN_ATTEMPTS : 0;
    if (from > 0)
        fprintf(f, "  (%zu earlier attempts left out; see the event stream)\n", from);
    for (size_t i = from; i < n; i++)
        describe(f, &history[i]);
    if (n == 0)
        return;
    const dl_sup_failure_t *last = &history[n - 1];
    char dir[4096], msg[1024], trace[8192];
    snprintf(dir, sizeof(dir), "%s/attempt_%d", run_dir, last->attempt);
    dl_error_file_path(dir, last->rank, path, sizeof(path));
    /* What the worker said of its own death (PyTorch's @record) says more than its stderr. */
    if (dl_error_file_read(path, msg, sizeof(msg), trace, sizeof(trace)) == 1) {
        fprintf(f, "  its error: %s\n  (from %s)\n", msg, path);
        if (trace[0] != '\0') {
            fprintf(f, "  traceback, last lines:\n");
            print_last_lines(f, trace, TAIL_LINES);
        }
        return;
    }
    snprintf(path, sizeof(path), "%s/rank_%d.err", dir, last->rank);
    fprintf(f, "  its stderr: %s\n", path);
    int werr = 0;
    for (size_t i = 0; i < nunwritten && werr == 0; i++)
        if (strcmp(unwritten[i].path, path) == 0)
            werr = unwritten[i].err;
    if (werr != 0)
        fprintf(f, "  (it could not be written: %s; what it lacks went to the console only)\n",
                strerror(werr));
    int r = dl_summary_tail(path, TAIL_LINES, tail, sizeof(tail));
    if (r < 0) {
        fprintf(f, "  (cannot read it: %s)\n", dl_ownfile_strerror(r));
    } else if (r == 0) {
        if (werr == 0)
            fprintf(f, "  (it is empty)\n");
    } else {
        fprintf(f, "  last lines%s:\n", werr != 0 ? " written before that" : "");
        print_last_lines(f, tail, TAIL_LINES);
    }
}
