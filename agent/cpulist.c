/* The kernel writes CPU and node sets as ranges (cpulist, thread_siblings_list,
 * shared_cpu_list, Cpus_allowed_list); one parser and one printer serve them all. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cpulist.h"

int dl_cpus_count(const dl_cpus_t *s)
{
    int n = 0;
    for (size_t i = 0; i < DL_CPUS_MAX / 64; i++)
        n += __builtin_popcountll(s->bits[i]);
    return n;
}

int dl_cpus_first(const dl_cpus_t *s)
{
    for (size_t i = 0; i < DL_CPUS_MAX / 64; i++)
        if (s->bits[i] != 0)
            return (int)(i * 64) + __builtin_ctzll(s->bits[i]);
    return -1;
}

void dl_cpus_and(dl_cpus_t *s, const dl_cpus_t *with)
{
    for (size_t i = 0; i < DL_CPUS_MAX / 64; i++)
        s->bits[i] &= with->bits[i];
}

void dl_cpus_or(dl_cpus_t *s, const dl_cpus_t *with)
{
    for (size_t i = 0; i < DL_CPUS_MAX / 64; i++)
        s->bits[i] |= with->bits[i];
}

/* A number at *p; advances *p past it. */
static int number(const char **p, int *ret)
{
    long v = 0;
    if (**p < '0' || **p > '9')
        return -EINVAL;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (**p - '0');
        if (v >= DL_CPUS_MAX)
            return -ERANGE;
        (*p)++;
    }
    *ret = (int)v;
    return 0;
}

int dl_cpus_parse(const char *text, dl_cpus_t *ret)
{
    dl_cpus_t s;
    const char *p = text;
    memset(&s, 0, sizeof(s));
    p += strspn(p, " \t\n");
    while (*p != '\0') {
        int lo, hi, r = number(&p, &lo);
        if (r < 0)
            return r;
        hi = lo;
        if (*p == '-') {
            p++;
            r = number(&p, &hi);
            if (r < 0)
                return r;
            if (hi < lo)
                return -EINVAL;
        }
        for (int c = lo; c <= hi; c++)
            dl_cpus_set(&s, c);
        p += strspn(p, " \t\n");
        if (*p == ',') {
            p++;
            if (*p < '0' || *p > '9')
                return -EINVAL;
        } else if (*p != '\0') {
            return -EINVAL;
        }
    }
    *ret = s;
    return 0;
}

void dl_cpus_format(const dl_cpus_t *s, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    for (int c = 0; c < DL_CPUS_MAX; c++) {
        if (!dl_cpus_has(s, c))
            continue;
        int end = c;
        while (end + 1 < DL_CPUS_MAX && dl_cpus_has(s, end + 1))
            end++;
        int n = end == c ? snprintf(buf + used, len - used, "%s%d", used ? "," : "", c)
                         : snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", c, end);
        if (n < 0 || (size_t)n >= len - used) {
            buf[len - 1] = '\0';
            return;
        }
        used += (size_t)n;
        c = end;
    }
}
