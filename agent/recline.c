/* The worker's side of the control channel, read (recline.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recline.h"

#define STEP_MAX (1LL << 62)

/* The value of key in a "verb k=v k=v" line, into buf; false when absent. reason's value is the
 * rest of the line, the others end at a space. */
static bool field(const char *line, const char *key, char *buf, size_t len)
{
    size_t k = strlen(key);
    for (const char *p = strchr(line, ' '); p != NULL; p = strchr(p + 1, ' ')) {
        if (strncmp(p + 1, key, k) != 0 || p[1 + k] != '=')
            continue;
        const char *v = p + 2 + k;
        size_t n = strcmp(key, "reason") == 0 ? strlen(v) : strcspn(v, " ");
        snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), v);
        return true;
    }
    return false;
}

/* A plain decimal within lo..hi (an optional '-', digits, nothing else). */
static bool number(const char *line, const char *key, long long lo, long long hi, long long *ret)
{
    char v[32], *end;
    if (!field(line, key, v, sizeof(v)) || v[0] == '\0' || v[0] == '+' || v[0] == ' ')
        return false;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < lo || x > hi)
        return false;
    *ret = x;
    return true;
}

static bool verb_is(const char *line, const char *verb)
{
    size_t n = strlen(verb);
    return strncmp(line, verb, n) == 0 && (line[n] == ' ' || line[n] == '\0');
}

dl_recline_verb_t dl_recline_parse(const char *line, dl_recline_t *ret)
{
    long long x;
    memset(ret, 0, sizeof(*ret));
    ret->gen = -1;
    ret->was = -1;
    if (verb_is(line, "hello"))
        ret->verb = DL_RECLINE_HELLO;
    else if (verb_is(line, "recovered"))
        ret->verb = DL_RECLINE_RECOVERED;
    else if (verb_is(line, "broken"))
        ret->verb = DL_RECLINE_BROKEN;
    else if (verb_is(line, "failed"))
        ret->verb = DL_RECLINE_FAILED;
    else
        return DL_RECLINE_OTHER;
    if (number(line, "gen", 0, INT_MAX, &x))
        ret->gen = (int)x;
    ret->has_step = number(line, "step", 0, STEP_MAX, &ret->step);
    ret->has_was = number(line, "was", -1, STEP_MAX, &ret->was);
    if ((ret->has_source = number(line, "source", 0, INT_MAX, &x)))
        ret->source = (int)x;
    ret->has_reason = field(line, "reason", ret->reason, sizeof(ret->reason));
    /* The reason goes into the agent's log and the terminal. */
    for (unsigned char *p = (unsigned char *)ret->reason; *p != '\0'; p++)
        if (*p < 0x20 || *p == 0x7f)
            *p = '?';
    return ret->verb;
}
