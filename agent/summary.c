/* What a user reads first when a job fails: which rank, how, when, and where its log is. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    ssize_t n;

    if (len == 0)
        return -EINVAL;
    buf[0] = '\0';
    if (fd < 0)
        return -errno;
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
    return (int)(n - i);
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
    else if (x->signal > 0)
        fprintf(f, "was killed by %s", dl_signal_name(x->signal));
    else
        fprintf(f, "exited with code %d", x->exit_code);
    fprintf(f, " at %s\n", when);
}

void dl_summary_print(FILE *f, const dl_sup_failure_t *history, size_t n, int attempts,
                      const char *run_dir)
{
    char path[4096];
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
    snprintf(path, sizeof(path), "%s/attempt_%d/rank_%d.err", run_dir, last->attempt,
             last->rank);
    fprintf(f, "  its stderr: %s\n", path);
    int r = dl_summary_tail(path, TAIL_LINES, tail, sizeof(tail));
    if (r < 0) {
        fprintf(f, "  (cannot read it: %s)\n", strerror(-r));
    } else if (r == 0) {
        fprintf(f, "  (it is empty)\n");
    } else {
        fprintf(f, "  last lines:\n");
        for (char *line = strtok(tail, "\n"); line != NULL; line = strtok(NULL, "\n"))
            fprintf(f, "    | %s\n", line);
    }
}
