/* Why a worker died, or why it cannot: see death.h. The parsers are pure; the readers below
 * them open small files under a root folder. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cgroup.h"
#include "death.h"

/* ---- parsers -------------------------------------------------------------------------------- */

long long dl_memcg_parse_oom_kills(const char *text)
{
    for (const char *line = text; *line != '\0';) {
        size_t n = strcspn(line, "\n");
        if (n > 9 && strncmp(line, "oom_kill ", 9) == 0) {
            char *end;
            errno = 0;
            long long v = strtoll(line + 9, &end, 10);
            if (errno == 0 && end != line + 9 && v >= 0)
                return v;
            return -EINVAL;
        }
        line += n + (line[n] == '\n');
    }
    return -ENOENT;
}

long long dl_memcg_parse_limit(const char *text)
{
    char *end;
    if (strncmp(text, "max", 3) == 0)
        return 0;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    /* v1 says "no limit" as the largest page-aligned number below 2^63. */
    if (errno != 0 || end == text || v <= 0 || v >= (1LL << 62))
        return 0;
    return v;
}

/* ---- readers -------------------------------------------------------------------------------- */

/* Reads a small file under root into buf. Returns its length or -errno. O_NONBLOCK: a FIFO put
 * in a file's place cannot hold the agent. */
static ssize_t read_small(const char *root, const char *path, char *buf, size_t len)
{
    char full[1024];
    ssize_t n = 0, got = 0;
    snprintf(full, sizeof(full), "%s%s", root, path);
    int fd = open(full, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    while ((size_t)got < len - 1 && (n = read(fd, buf + got, len - 1 - (size_t)got)) > 0)
        got += n;
    int e = n < 0 ? errno : 0;
    close(fd);
    if (got == 0 && e != 0)
        return -e;
    buf[got] = '\0';
    return got;
}

static long long read_oom_kills(const char *root, const dl_memcg_t *w, int i)
{
    char path[600], buf[2048];
    snprintf(path, sizeof(path), "%s/%s", w->dir[i],
             w->version == 1 ? "memory.oom_control" : "memory.events");
    if (read_small(root, path, buf, sizeof(buf)) < 0)
        return -1;
    return dl_memcg_parse_oom_kills(buf);
}

int dl_memcg_open(dl_memcg_t *w, const char *root, pid_t pid)
{
    dl_cgroup_place_t places[DL_CGROUP_PLACES];
    int n = 0;

    memset(w, 0, sizeof(*w));
    /* The agent opens this before every launch's workers start, and mountinfo is most of its
     * cost: the usual layout is checked first. */
    int r = pid == 0 ? dl_cgroup_place_quick(root, "memory", "memory.oom_control", &places[0]) : 0;
    if (r < 0)
        return r;
    if (r == 1)
        n = 1;
    else if ((r = dl_cgroup_places(root, pid, "memory", places, DL_CGROUP_PLACES, &n)) < 0)
        return r;
    const dl_cgroup_place_t *p = dl_cgroup_charging(places, n);
    if (p == NULL)
        return -ENOENT;
    char dir[sizeof(p->dir)];
    if (strlen(p->dir) >= sizeof(w->dir[0]))
        return -ENAMETOOLONG;
    snprintf(dir, sizeof(dir), "%s", p->dir);
    w->version = p->v2 ? 2 : 1;
    do {
        snprintf(w->dir[w->n], sizeof(w->dir[0]), "%.511s", dir); /* checked above */
        w->oom_kills[w->n] = read_oom_kills(root, w, w->n);
        w->n++;
    } while (w->n < DL_MEMCG_LEVELS && dl_cgroup_parent(dir, p->mount));
    return 0;
}

bool dl_memcg_oom_since(dl_memcg_t *w, const char *root, dl_oom_t *what)
{
    bool found = false;
    for (int i = 0; i < w->n; i++) {
        long long now = read_oom_kills(root, w, i);
        if (now > w->oom_kills[i] && w->oom_kills[i] >= 0 && !found) {
            char path[600], buf[64];
            found = true;
            what->killed = true;
            snprintf(path, sizeof(path), "%s/%s", w->dir[i],
                     w->version == 1 ? "memory.limit_in_bytes" : "memory.max");
            what->limit =
                read_small(root, path, buf, sizeof(buf)) > 0 ? dl_memcg_parse_limit(buf) : 0;
            snprintf(what->cgroup, sizeof(what->cgroup), "%s", w->dir[i]);
        }
        if (now >= 0)
            w->oom_kills[i] = now;
    }
    return found;
}

int dl_kmsg_oom_killed(const char *root, pid_t pid, dl_oom_t *what)
{
    char path[1024], rec[2048], want[64], want2[64];
    snprintf(path, sizeof(path), "%s/dev/kmsg", root);
    /* Non-blocking: a read past the newest record says EAGAIN instead of waiting for one. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    snprintf(want, sizeof(want), "Killed process %d ", (int)pid);
    snprintf(want2, sizeof(want2), ",pid=%d,", (int)pid);
    int found = 0;
    for (int records = 0; records < 100000; records++) {
        ssize_t n = read(fd, rec, sizeof(rec) - 1);
        if (n < 0 && errno == EPIPE)
            continue; /* a record was overwritten while we read: go on with the next */
        if (n <= 0)
            break;
        rec[n] = '\0';
        if (strstr(rec, want) != NULL && strstr(rec, "out of memory") != NULL)
            found = 1;
        const char *memcg = strstr(rec, "oom-kill:") != NULL && strstr(rec, want2) != NULL
                                ? strstr(rec, "oom_memcg=")
                                : NULL;
        if (memcg != NULL) {
            memcg += strlen("oom_memcg=");
            snprintf(what->cgroup, sizeof(what->cgroup), "%.*s", (int)strcspn(memcg, ",\n"), memcg);
        }
    }
    close(fd);
    if (found)
        what->killed = true;
    return found;
}

int dl_proc_wait_state(const char *root, pid_t pid, char *state, char *wchan, size_t len)
{
    char path[64], buf[1024];
    ssize_t r;

    *state = '?';
    wchan[0] = '\0';
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((r = read_small(root, path, buf, sizeof(buf))) < 0)
        return r == -ENOENT ? -ESRCH : (int)r;
    /* "PID (COMM) S ...": the command may hold spaces and parentheses; the last ')' ends it. */
    const char *close_paren = strrchr(buf, ')');
    if (close_paren == NULL || close_paren[1] != ' ' || close_paren[2] == '\0')
        return -EINVAL;
    *state = close_paren[2];
    snprintf(path, sizeof(path), "/proc/%d/wchan", (int)pid);
    if (read_small(root, path, buf, sizeof(buf)) > 0 && strcmp(buf, "0") != 0)
        snprintf(wchan, len, "%.*s", (int)strcspn(buf, "\n"), buf);
    return 0;
}

const char *dl_proc_state_name(char state)
{
    switch (state) {
    case 'D': return "uninterruptible sleep";
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'T': return "stopped";
    case 't': return "stopped by a tracer";
    case 'Z': return "zombie";
    default: return "unknown state";
    }
}
