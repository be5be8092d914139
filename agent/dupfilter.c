/* torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: every console line of a
 * stream that contains one of the filter's comma-separated strings is copied, with its rank
 * prefix, to one file for all ranks: attempt_K/filtered_stdout.log (or filtered_stderr.log),
 * where torchrun puts it in its own attempt folder. The ranks' own log files are untouched. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

static bool matches(const char *filters, const char *line, size_t len)
{
    const char *f = filters;
    while (f != NULL && *f != '\0') {
        size_t n = strcspn(f, ",");
        if (n > 0 && n <= len && memmem(line, len, f, n) != NULL)
            return true;
        f += n;
        if (*f == ',')
            f++;
    }
    return false;
}

/* The attempt's file, opened at its first line. Returns the fd or -1 (said once). */
static int file_for(dl_agent_t *a, int stream, int attempt)
{
    dl__dup_t *d = &a->dup[stream];
    if (d->open && d->attempt == attempt)
        return d->fd;
    if (d->open)
        close(d->fd);
    d->open = true;
    d->attempt = attempt;
    char path[4200];
    snprintf(path, sizeof(path), "%s/filtered_%s.log", a->attempt_dir,
             stream == 0 ? "stdout" : "stderr");
    d->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (d->fd < 0)
        dl__agent_log(a, "cannot open '%s' for --duplicate-%s-filters: %s; lines are not copied",
                      path, stream == 0 ? "stdout" : "stderr", strerror(errno));
    return d->fd;
}

void dl__dup_line(dl_agent_t *a, int attempt, int stream, const char *prefix, const char *line,
                  size_t len)
{
    const char *filters =
        stream == 0 ? a->spec->duplicate_stdout_filters : a->spec->duplicate_stderr_filters;
    if (filters == NULL || !matches(filters, line, len))
        return;
    int fd = file_for(a, stream, attempt);
    if (fd < 0)
        return;
    struct iovec iov[3] = {{(void *)prefix, strlen(prefix)}, {(void *)line, len}, {"\n", 1}};
    if (writev(fd, iov, 3) < 0 && !a->dup[stream].failed) {
        a->dup[stream].failed = true;
        dl__agent_log(a, "cannot write filtered_%s.log: %s", stream == 0 ? "stdout" : "stderr",
                      strerror(errno));
    }
}

void dl__dup_close(dl_agent_t *a)
{
    for (int i = 0; i < 2; i++) {
        if (a->dup[i].open && a->dup[i].fd >= 0)
            close(a->dup[i].fd);
        a->dup[i].open = false;
    }
}
