/* Event lines are written whole with one write(2) and flushed at once, so a script tailing the
 * file never sees half an object, even when the agent is killed right after. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "events.h"

struct dl_events_s {
    int fd;
    int owned;
    bool failed; /* a write failed (a full disk): said once on stderr, then lines are dropped */
    char path[4096];
};

int dl_events_open(const char *path, dl_events_t **ret)
{
    dl_events_t *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return -ENOMEM;
    if (snprintf(ev->path, sizeof(ev->path), "%s", strcmp(path, "-") == 0 ? "stdout" : path) >=
        (int)sizeof(ev->path)) {
        free(ev);
        return -ENAMETOOLONG;
    }
    if (strcmp(path, "-") == 0) {
        ev->fd = STDOUT_FILENO;
    } else {
        ev->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (ev->fd < 0) {
            int e = errno;
            free(ev);
            return -e;
        }
        ev->owned = 1;
    }
    *ret = ev;
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dl_events_emit(dl_events_t *ev, const char *name, double now, json_t *fields)
{
    json_auto_t *obj = json_object();
    if (ev == NULL) {
        json_decref(fields);
        return 0;
    }
    if (obj == NULL) {
        json_decref(fields);
        return -ENOMEM;
    }
    json_object_set_new(obj, "event", json_string(name));
    json_object_set_new(obj, "time", json_real(now));
    if (fields != NULL) {
        json_object_update(obj, fields);
        json_decref(fields);
    }
    char *line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(16));
    if (line == NULL)
        return -ENOMEM;
    size_t n = strlen(line);
    line[n] = '\n'; /* replaces the terminator; n + 1 bytes go out */
    int r = ev->failed ? -EIO : write_all(ev->fd, line, n + 1);
    free(line);
    /* A stream that stops taking lines (a full disk) must not stop the job, nor fail quietly;
     * a line cut short by the error stays, the next ones are dropped whole. */
    if (r < 0 && !ev->failed) {
        ev->failed = true;
        fprintf(stderr,
                "dlaunch: cannot write the event stream '%s': %s; the events from '%s' "
                "on are lost (the job goes on)\n",
                ev->path, strerror(-r), name);
    }
    return r;
}

void dl_events_close(dl_events_t *ev)
{
    if (ev == NULL)
        return;
    if (ev->owned)
        close(ev->fd);
    free(ev);
}
