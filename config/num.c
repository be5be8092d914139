/* Checked number parsing: the whole text must be the number, and it must fit. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int dl_parse_int(const char *s, long min, long max, long *ret)
{
    char *end;
    long v;

    if (s == NULL || *s == '\0' || *s == ' ' || *s == '\t' || *s == '+')
        return -EINVAL;
    errno = 0;
    v = strtol(s, &end, 10);
    if (*end != '\0')
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int dl_parse_double(const char *s, double min, double max, double *ret)
{
    char *end;
    double v;

    if (s == NULL || *s == '\0' || *s == ' ' || *s == '\t')
        return -EINVAL;
    errno = 0;
    v = strtod(s, &end);
    if (*end != '\0' || isnan(v))
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int dl_parse_nodes(const char *s, int *ret_min, int *ret_max)
{
    const char *colon = strchr(s, ':');
    long lo, hi;
    int r;

    if (colon == NULL) {
        r = dl_parse_int(s, 1, 1000000, &lo);
        if (r < 0)
            return r;
        *ret_min = *ret_max = (int)lo;
        return 0;
    }
    char head[32];
    size_t n = (size_t)(colon - s);
    if (n == 0 || n >= sizeof(head))
        return -EINVAL;
    memcpy(head, s, n);
    head[n] = '\0';
    r = dl_parse_int(head, 1, 1000000, &lo);
    if (r < 0)
        return r;
    r = dl_parse_int(colon + 1, 1, 1000000, &hi);
    if (r < 0)
        return r;
    if (lo > hi)
        return -ERANGE;
    *ret_min = (int)lo;
    *ret_max = (int)hi;
    return 0;
}
