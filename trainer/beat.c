/* The trainer's health beats: a line of figures to DLAUNCH_HEALTH_FD (docs/diagnostics.md) that
 * the agent's watchdog reads for liveness and its straggler rule for each rank's compute and
 * collective-wait time. A line at most every BEAT_EVERY_S, covering the steps since the one
 * before: a step every 0.5 ms would otherwise fill the pipe long before the agent drains it, and
 * the agent would read stale figures. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

#define BEAT_EVERY_S 0.1

void dl__train_beat_init(dl__train_beat_t *b, int fd)
{
    *b = (dl__train_beat_t){.fd = fd};
}

void dl__train_beat_step(dl__train_beat_t *b, uint64_t step, double compute_s, double wait_s,
                         double loss, size_t samples, double now, bool force)
{
    if (b->fd < 0)
        return;
    b->steps++;
    b->compute_s += compute_s;
    b->wait_s += wait_s;
    b->loss += loss;
    b->samples += (double)samples;
    if (!force && b->lines > 0 && now - b->last < BEAT_EVERY_S)
        return;
    char line[256];
    double k = (double)b->steps;
    int n = snprintf(line, sizeof(line),
                     "step=%llu steps=%llu compute_ms=%.4f wait_ms=%.4f loss=%.5g samples=%.6g\n",
                     (unsigned long long)step, (unsigned long long)b->steps, b->compute_s * 1e3 / k,
                     b->wait_s * 1e3 / k, b->loss / k, b->samples / k);
    /* One write: a line never reaches the agent in two pieces that another write could split. */
    if (n > 0 && write(b->fd, line, (size_t)n) < 0 && errno != EAGAIN && errno != EINTR)
        b->fd = -1; /* the watchdog is gone; nobody to tell */
    b->lines++;
    b->last = now;
    b->steps = 0;
    b->compute_s = b->wait_s = b->loss = b->samples = 0;
}
