/* The bodies of etcd's JSON gateway (base64 keys and values, decimal 64-bit numbers; reply.h
 * reads the answers) and the password file (etcd.h): pure code that both the program and the etcd plugin
 * (dlaunch-etcd.so, the one part that needs libcurl) use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "etcd.h"

/* ---- Bodies ----------------------------------------------------------------------------------- */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_t *dl_etcd_b64(const void *data, size_t n)
{
    const unsigned char *p = data;
    size_t out_len = 4 * ((n + 2) / 3);
    char *out = malloc(out_len + 1);
    size_t o = 0;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        out[o++] = b64chars[(v >> 18) & 63];
        out[o++] = b64chars[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64chars[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64chars[v & 63] : '=';
    }
    out[o] = '\0';
    json_t *j = json_stringn(out, o);
    free(out);
    return j;
}

json_t *dl_etcd_b64_str(const char *s)
{
    return dl_etcd_b64(s, strlen(s));
}

static int b64val(int c)
{
    const char *p = c != '\0' ? strchr(b64chars, c) : NULL;
    return p != NULL ? (int)(p - b64chars) : -1;
}

char *dl_etcd_unb64(const json_t *v, size_t *ret_len)
{
    const char *s = json_string_value(v);
    if (s == NULL)
        return NULL;
    size_t n = json_string_length(v);
    char *out = malloc(n / 4 * 3 + 4);
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=')
            break;
        int d = b64val((unsigned char)s[i]);
        if (d < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (unsigned)d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[o] = '\0';
    if (ret_len != NULL)
        *ret_len = o;
    return out;
}

int64_t dl_etcd_int(const json_t *v)
{
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    const char *s = json_string_value(v);
    if (s == NULL)
        return 0;
    return strtoll(s, NULL, 10);
}

json_t *dl_etcd_num(int64_t n)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", (long long)n);
    return json_string(buf);
}

json_t *dl_etcd_prefix_end(const char *prefix)
{
    size_t n = strlen(prefix);
    char *end = strdup(prefix);
    json_t *j = NULL;
    if (end == NULL)
        return NULL;
    /* The last byte that can be raised is raised, what follows it dropped. */
    while (n > 0 && (unsigned char)end[n - 1] == 0xff)
        n--;
    if (n == 0) {
        free(end);
        return json_string("AA=="); /* "\0": every key */
    }
    end[n - 1] = (char)((unsigned char)end[n - 1] + 1);
    j = dl_etcd_b64(end, n);
    free(end);
    return j;
}

/* ---- Passwords -------------------------------------------------------------------------------- */

int dl_etcd_read_password(const char *path, char **ret, char *err, size_t errlen)
{
    struct stat st;
    char buf[4096];
    FILE *f = fopen(path, "r");
    *ret = NULL;
    if (f == NULL) {
        int r = -errno;
        snprintf(err, errlen, "'%s': %s", path, strerror(errno));
        return r;
    }
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
        snprintf(err, errlen,
                 "'%s' must be a regular file that neither group nor others may "
                 "read or write (chmod 600 %s)",
                 path, path);
        fclose(f);
        return -EPERM;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (n > 0 && buf[n - 1] == '\r')
        buf[--n] = '\0';
    if (n == 0) {
        snprintf(err, errlen, "'%s' is empty", path);
        return -EINVAL;
    }
    *ret = strdup(buf);
    memset(buf, 0, sizeof(buf));
    return *ret != NULL ? 0 : -ENOMEM;
}
