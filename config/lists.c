/* Small list values of torchrun's flags: std specs, rank lists, signal lists. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"

static int std_value(const char *s, size_t n)
{
    return n == 1 && s[0] >= '0' && s[0] <= '3' ? s[0] - '0' : -EINVAL;
}

int dl_std_spec_for(const char *spec, int local_rank)
{
    if (spec == NULL)
        return 0;
    if (strchr(spec, ':') == NULL)
        return std_value(spec, strlen(spec));
    int found = 0;
    const char *p = spec;
    for (;;) {
        size_t n = strcspn(p, ",");
        const char *colon = memchr(p, ':', n);
        char rank[16];
        long r;
        if (colon == NULL || colon == p || (size_t)(colon - p) >= sizeof(rank))
            return -EINVAL;
        memcpy(rank, p, (size_t)(colon - p));
        rank[colon - p] = '\0';
        int v = std_value(colon + 1, n - (size_t)(colon - p) - 1);
        if (dl_parse_int(rank, 0, 1 << 20, &r) < 0 || v < 0)
            return -EINVAL;
        if (r == local_rank)
            found = v;
        if (p[n] == '\0')
            return found;
        p += n + 1;
    }
}

int dl_int_list_has(const char *list, int n)
{
    if (list == NULL)
        return 1;
    int has = 0;
    const char *p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        char item[16];
        long v;
        if (len == 0 || len >= sizeof(item))
            return -EINVAL;
        memcpy(item, p, len);
        item[len] = '\0';
        if (dl_parse_int(item, 0, 1 << 20, &v) < 0)
            return -EINVAL;
        has |= v == n;
        if (p[len] == '\0')
            return has;
        p += len + 1;
    }
}

static int signal_by_name(const char *name)
{
    if (strncasecmp(name, "SIG", 3) == 0)
        name += 3;
    for (int sig = 1; sig < NSIG; sig++) {
        const char *abbrev = sigabbrev_np(sig);
        if (abbrev != NULL && strcasecmp(abbrev, name) == 0)
            return sig;
    }
    return -EINVAL;
}

int dl_signal_list_each(const char *list, void (*cb)(void *ctx, int sig), void *ctx, char *bad,
                        size_t badlen)
{
    const char *p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        char item[32];
        if (len >= sizeof(item))
            len = sizeof(item) - 1;
        memcpy(item, p, len);
        item[len] = '\0';
        int sig = len > 0 ? signal_by_name(item) : -EINVAL;
        /* SIGKILL and SIGSTOP cannot be caught; SIGCHLD is how workers are reaped. */
        if (sig < 0 || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
            snprintf(bad, badlen, "%s", item);
            return -EINVAL;
        }
        cb(ctx, sig);
        if (p[strcspn(p, ",")] == '\0')
            return 0;
        p += strcspn(p, ",") + 1;
    }
}
