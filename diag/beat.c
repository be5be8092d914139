/* Health beats: bytes a worker writes to DLAUNCH_HEALTH_FD, of which lines of key=value pairs
 * also carry its step, its compute and collective-wait times, its loss and its samples. Parsing
 * is forgiving on purpose: any worker may write here, and a line the agent cannot read is still
 * a beat. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"

void dl_diag_beats_init(dl_diag_beats_t *b)
{
    memset(b, 0, sizeof(*b));
    b->loss = NAN;
}

/* Beyond these a value is junk, not a figure: they keep the sums finite and the step a whole
 * number a double holds exactly. */
#define STEP_MAX 9007199254740992.0 /* 2^53 */
#define STEPS_MAX 1e9
#define MS_MAX 1e9
#define SAMPLES_MAX 1e12

/* A finite number >= 0 (loss may be any finite number), the whole token. */
static bool number(const char *s, size_t len, bool any_sign, double *ret)
{
    char buf[64];
    if (len == 0 || len >= sizeof(buf))
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end = NULL;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno != 0 || end != buf + len || !isfinite(v) || (!any_sign && v < 0))
        return false;
    *ret = v;
    return true;
}

static bool key_is(const char *k, size_t klen, const char *want)
{
    return strlen(want) == klen && memcmp(k, want, klen) == 0;
}

int dl_diag_beats_line(dl_diag_beats_t *b, const char *line, size_t len)
{
    double step = -1, steps = 1, compute = -1, wait = -1, samples = -1, loss = NAN, v;
    size_t i = 0;
    while (i < len) {
        while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
            i++;
        size_t start = i;
        while (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
            i++;
        const char *tok = line + start, *eq = memchr(tok, '=', i - start);
        if (eq == NULL)
            continue;
        size_t klen = (size_t)(eq - tok), vlen = i - start - klen - 1;
        if (key_is(tok, klen, "loss")) {
            if (number(eq + 1, vlen, true, &v))
                loss = v;
        } else if (number(eq + 1, vlen, false, &v)) {
            if (key_is(tok, klen, "step") && v <= STEP_MAX)
                step = v;
            else if (key_is(tok, klen, "steps") && v >= 1 && v <= STEPS_MAX)
                steps = v;
            else if (key_is(tok, klen, "compute_ms") && v <= MS_MAX)
                compute = v;
            else if (key_is(tok, klen, "wait_ms") && v <= MS_MAX)
                wait = v;
            else if (key_is(tok, klen, "samples") && v <= SAMPLES_MAX)
                samples = v;
        }
    }
    if (step < 0)
        return 0;
    b->figures = true;
    b->step = (uint64_t)step;
    b->loss = loss;
    b->compute_ms = compute >= 0 ? compute : 0;
    b->wait_ms = wait >= 0 ? wait : 0;
    b->samples = samples >= 0 ? samples : 0;
    /* Only lines that time their steps count towards the sums the rule compares. */
    if (compute >= 0) {
        b->total_steps += steps;
        b->total_compute_ms += b->compute_ms * steps;
        b->total_wait_ms += b->wait_ms * steps;
        b->total_samples += b->samples * steps;
    }
    return 1;
}

int dl_diag_beats_feed(dl_diag_beats_t *b, const char *data, size_t len, double now)
{
    int lines = 0;
    bool newline = false;
    if (len == 0)
        return 0;
    b->last_beat = now;
    for (size_t i = 0; i < len; i++) {
        char c = data[i];
        if (c == '\n') {
            b->beats++;
            newline = true;
            if (!b->overlong)
                lines += dl_diag_beats_line(b, b->partial, b->partial_len);
            b->partial_len = 0;
            b->overlong = false;
            continue;
        }
        /* Bytes without newlines (a worker that writes one '.' a step) fill the line and then
         * keep it overlong: bounded, and never mistaken for figures. A line cut by a read
         * anywhere, even before its first '=', continues with the next bytes. */
        if (b->partial_len + 1 >= sizeof(b->partial)) {
            b->overlong = true;
            continue;
        }
        b->partial[b->partial_len++] = c;
    }
    if (!newline)
        b->beats++;
    return lines;
}
