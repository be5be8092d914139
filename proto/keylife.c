/* How long a job key lasts: the span it names, and what a server makes of it. A key that never
 * ended let whoever was handed it once act on every later job of the same run id; so a key names
 * when it was issued and when it expires (bound into the key itself, proto/auth.c), and a server
 * refuses it outside that span, or when its run's keys issued before some time are revoked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto.h"

int64_t dl_proto_unix_now(void)
{
    /* Not time(): on Linux it reads the clock of the last tick, which after a second turns
     * still says the second before for up to a tick, so a key would be issued before the
     * moment its maker asked for it, and judged by a server reading the exact clock. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

bool dl_proto_key_life_valid(const dl_proto_key_life_t *life)
{
    return life != NULL && life->issued >= 0 && life->issued < life->expires &&
           life->expires <= DL_PROTO_KEY_TIME_MAX;
}

char *dl_proto_time_text(int64_t t, char *buf, size_t len)
{
    time_t tt = (time_t)t;
    struct tm tm;

    if (t < 0 || t > DL_PROTO_KEY_TIME_MAX || gmtime_r(&tt, &tm) == NULL ||
        strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%lld", (long long)t);
    return buf;
}

dl_proto_key_verdict_t dl_proto_key_judge(const dl_proto_key_life_t *life, const char *run_id,
                                          int64_t now, int64_t revoked_before, char *why,
                                          size_t whylen)
{
    char a[32], b[32];

    /* Every term is below 2^38, so none of the sums overflows. */
    if (now < 0 || now > DL_PROTO_KEY_TIME_MAX)
        now = now < 0 ? 0 : DL_PROTO_KEY_TIME_MAX;
    if (revoked_before > 0 && life->issued < revoked_before) {
        snprintf(why, whylen,
                 "the key of job '%s' was issued at %s, and the keys of '%s' issued before %s "
                 "are revoked; ask for a new one (dlaunch token)",
                 run_id, dl_proto_time_text(life->issued, a, sizeof(a)), run_id,
                 dl_proto_time_text(revoked_before, b, sizeof(b)));
        return DL_PROTO_KEY_REVOKED;
    }
    if (now >= life->expires + DL_PROTO_KEY_LEEWAY_S) {
        snprintf(why, whylen,
                 "the key of job '%s' expired at %s (the server's clock says %s); ask for a new "
                 "one (dlaunch token)",
                 run_id, dl_proto_time_text(life->expires, a, sizeof(a)),
                 dl_proto_time_text(now, b, sizeof(b)));
        return DL_PROTO_KEY_EXPIRED;
    }
    if (life->issued > now + DL_PROTO_KEY_LEEWAY_S) {
        snprintf(why, whylen,
                 "the key of job '%s' is issued at %s, ahead of the server's clock (%s) by more "
                 "than %d s; check the clocks",
                 run_id, dl_proto_time_text(life->issued, a, sizeof(a)),
                 dl_proto_time_text(now, b, sizeof(b)), DL_PROTO_KEY_LEEWAY_S);
        return DL_PROTO_KEY_NOT_YET;
    }
    return DL_PROTO_KEY_GOOD;
}

int dl_proto_lifetime_parse(const char *text, int64_t *ret_seconds)
{
    static const struct {
        char unit;
        int64_t seconds;
    } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}};
    int64_t n = 0, scale = 1;
    size_t len = text != NULL ? strlen(text) : 0, digits = len;

    if (len == 0)
        return -EINVAL;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (text[len - 1] == units[i].unit) {
            scale = units[i].seconds;
            digits = len - 1;
        }
    if (digits == 0 || digits > 9)
        return digits == 0 ? -EINVAL : -ERANGE;
    for (size_t i = 0; i < digits; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -EINVAL;
        n = n * 10 + (text[i] - '0'); /* 9 digits: below 2^30 */
    }
    n *= scale; /* below 2^47 */
    if (n < 1 || n > DL_PROTO_KEY_LIFETIME_MAX_S)
        return -ERANGE;
    *ret_seconds = n;
    return 0;
}

int dl_proto_time_parse(const char *text, int64_t *ret)
{
    struct tm tm;
    size_t len = text != NULL ? strlen(text) : 0;

    if (len == 0)
        return -EINVAL;
    if (strspn(text, "0123456789") == len) {
        if (len > 12 || (len > 1 && text[0] == '0'))
            return -ERANGE;
        int64_t v = strtoll(text, NULL, 10);
        if (v > DL_PROTO_KEY_TIME_MAX)
            return -ERANGE;
        *ret = v;
        return 0;
    }
    memset(&tm, 0, sizeof(tm));
    const char *end = strptime(text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (end == NULL || *end != '\0')
        return -EINVAL;
    time_t t = timegm(&tm);
    if (t < 0 || (int64_t)t > DL_PROTO_KEY_TIME_MAX)
        return -ERANGE;
    *ret = (int64_t)t;
    return 0;
}
