/* Python stacks of a watched PyTorch rank (docs/python.md): the dlaunch package registers
 * faulthandler for a signal and names it, with its pid, in the first line of
 * DLAUNCH_ATTEMPT_DIR/rank_R.stacks; the agent sends that signal and reads the dump that the
 * handler appends. The handler runs in C inside the rank, so a rank asleep, waiting in C++ or
 * holding the GIL answers; a stopped one does not, and the wait ends at STACK_WAIT_S. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "diag.h"
#include "internal.h"

#define STACK_WAIT_S 0.5
#define STACK_READ_MAX (64 * 1024) /* of the newest dump: a few hundred frames */

static off_t file_size(int fd)
{
    struct stat st;
    return fstat(fd, &st) < 0 ? -1 : st.st_size;
}

static void nap_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

int dl__stacks_read(dl_agent_t *a, const dl__worker_t *w, int frames, char *buf, size_t len)
{
    char path[4300], head[128];
    if (w->pid <= 0)
        return -ESRCH;
    snprintf(path, sizeof(path), "%s/rank_%d.stacks", a->attempt_dir, w->rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = pread(fd, head, sizeof(head) - 1, 0);
    int sig = 0, pid = 0;
    head[n > 0 ? n : 0] = '\0';
    /* Only the process that wrote the file, for the signal it named: any other would die of it
     * (a real-time signal's default action ends a process). */
    if (sscanf(head, "dlaunch-stacks 1 signal=%d pid=%d", &sig, &pid) != 2 || pid != w->pid ||
        sig < SIGRTMIN || sig > SIGRTMAX) {
        close(fd);
        return -EBADMSG;
    }
    off_t before = file_size(fd), now = before, seen = -1;
    if (before < 0 || kill(w->pid, sig) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    /* The dump is written in one go from the handler: done once the file stops growing. */
    for (int i = 0; i < (int)(STACK_WAIT_S * 100) && (now == before || now != seen); i++) {
        seen = now;
        nap_ms(10);
        now = file_size(fd);
    }
    if (now <= before) {
        close(fd);
        return -ETIMEDOUT;
    }
    size_t want = (size_t)(now - before) < STACK_READ_MAX ? (size_t)(now - before) : STACK_READ_MAX;
    char *text = malloc(want);
    ssize_t got = text != NULL ? pread(fd, text, want, now - (off_t)want) : -1;
    int e = got < 0 ? (text == NULL ? ENOMEM : errno) : 0;
    close(fd);
    if (got > 0 && dl_diag_stack_top(text, (size_t)got, frames, buf, len) == 0)
        e = ENODATA;
    free(text);
    return -e;
}
