/* Credentials and the challenge-response that proves a peer holds one without sending it: the
 * server picks a fresh nonce per connection, the client answers
 * HMAC-SHA256(key, nonce || run_id || role), and the server compares in constant time. Binding
 * run_id and role into the proof stops a proof for one job or role from being replayed as
 * another; the fresh nonce stops replays altogether. The server then proves the same key back
 * over the client's own nonce, so that a client believes nothing a stranger on its port says.
 *
 * Keys form a chain, master -> job -> worker, each an HMAC of the one before and the run id: a
 * holder can go down the chain but never up it, nor sideways to another job. A job key also
 * covers the span it is good for (issued, expires), written in its text: the span is public, and
 * a holder who changes it gets another key, whose proofs fail. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* 0 when the n bytes are equal, in time that does not depend on where they differ (as
 * CRYPTO_memcmp). */
static int ct_memcmp(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(x[i] ^ y[i]);
    return d;
}

#define MAC_LEN 32

#define JOB_PREFIX "dlaunch-job-v2:"
#define WORKER_PREFIX "dlaunch-worker-v2:"
/* Version 1 keys named no span: they never ended, so they are refused, saying so. */
#define OLD_JOB_PREFIX "dlaunch-job-v1:"
#define OLD_WORKER_PREFIX "dlaunch-worker-v1:"
/* Decimal digits of DL_PROTO_KEY_TIME_MAX: a longer time is out of range before it is read. */
#define TIME_DIGITS_MAX 12
#define SCRAPE_PREFIX "dlaunch-scrape-v1:"
#define SCRAPE_LABEL "dlaunch scrape key v1\n"

struct dl_proto_token_s {
    dl_proto_token_kind_t kind;
    char run_id[DL_PROTO_RUN_ID_MAX + 1]; /* job and worker keys: theirs */
    dl_proto_key_life_t life;             /* job and worker keys: theirs; else {0, 0} */
    size_t len;
    unsigned char data[]; /* the HMAC key: a master's bytes, or 32 derived */
};

__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t errlen, const char *fmt,
                                                          ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int token_new_kind(dl_proto_token_kind_t kind, const char *run_id,
                          const dl_proto_key_life_t *life, const unsigned char *data, size_t len,
                          dl_proto_token_t **ret_token)
{
    dl_proto_token_t *t = calloc(1, sizeof(*t) + len);

    if (t == NULL)
        return -ENOMEM;
    t->kind = kind;
    if (life != NULL)
        t->life = *life;
    if (run_id != NULL) {
        size_t n = strnlen(run_id, DL_PROTO_RUN_ID_MAX);
        memcpy(t->run_id, run_id, n);
        t->run_id[n] = '\0';
    }
    t->len = len;
    memcpy(t->data, data, len);
    *ret_token = t;
    return 0;
}

static int hex_decode(const char *hex, uint8_t *out, size_t len);

static bool has_prefix(const unsigned char *data, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(data, prefix, n) == 0;
}

/* A time of a key: 1 to TIME_DIGITS_MAX decimal digits, no sign, no leading zero, at most
 * DL_PROTO_KEY_TIME_MAX. */
static int parse_key_time(const char *text, int64_t *ret)
{
    size_t n = strlen(text);
    int64_t v = 0;

    if (n == 0 || n > TIME_DIGITS_MAX || (n > 1 && text[0] == '0'))
        return -ERANGE;
    for (size_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -EINVAL;
        v = v * 10 + (text[i] - '0'); /* 12 digits fit in 40 bits */
    }
    if (v > DL_PROTO_KEY_TIME_MAX)
        return -ERANGE;
    *ret = v;
    return 0;
}

/* Cuts the last ":FIELD" off text; returns FIELD, or NULL when there is no colon. */
static char *cut_last(char *text)
{
    char *colon = strrchr(text, ':');
    if (colon == NULL)
        return NULL;
    *colon = '\0';
    return colon + 1;
}

/* "dlaunch-job-v2:RUN_ID:ISSUED:EXPIRES:HEX" or "dlaunch-worker-v2:...", as a typed key;
 * "dlaunch-scrape-v1:HEX" as the read-only credential; anything else is a master. Returns 0, or
 * -EINVAL for text that claims to be a typed key but is malformed (a version 1 key among them),
 * with why in err after "where: ". */
static int token_parse(const unsigned char *data, size_t len, const char *where,
                       dl_proto_token_t **ret_token, char *err, size_t errlen)
{
    dl_proto_token_kind_t kind;
    char text[sizeof(WORKER_PREFIX) + DL_PROTO_RUN_ID_MAX + 2 * MAC_LEN + 2 * TIME_DIGITS_MAX + 4];
    uint8_t key[MAC_LEN];
    dl_proto_key_life_t life;
    size_t plen;
    int r;

    if (has_prefix(data, len, SCRAPE_PREFIX)) {
        /* No run id: it reads every job's figures, and acts on none. */
        char hex[2 * MAC_LEN + 1];
        plen = strlen(SCRAPE_PREFIX);
        if (len - plen != 2 * MAC_LEN) {
            set_err(err, errlen, "%s: a malformed dlaunch read-only credential", where);
            return -EINVAL;
        }
        memcpy(hex, data + plen, 2 * MAC_LEN);
        hex[2 * MAC_LEN] = '\0';
        r = hex_decode(hex, key, sizeof(key)) < 0
                ? -EINVAL
                : token_new_kind(DL_PROTO_TOKEN_SCRAPE, NULL, NULL, key, sizeof(key), ret_token);
        explicit_bzero(key, sizeof(key));
        explicit_bzero(hex, sizeof(hex));
        if (r == -EINVAL)
            set_err(err, errlen, "%s: a malformed dlaunch read-only credential", where);
        return r;
    }
    if (has_prefix(data, len, OLD_JOB_PREFIX) || has_prefix(data, len, OLD_WORKER_PREFIX)) {
        set_err(err, errlen,
                "%s: a version 1 dlaunch key, which never ends, is no longer accepted; make a "
                "new one with 'dlaunch token RUN_ID' (docs/protocol.md, \"Key lifetime\")",
                where);
        return -EINVAL;
    }
    if (has_prefix(data, len, JOB_PREFIX)) {
        kind = DL_PROTO_TOKEN_JOB;
        plen = strlen(JOB_PREFIX);
    } else if (has_prefix(data, len, WORKER_PREFIX)) {
        kind = DL_PROTO_TOKEN_WORKER;
        plen = strlen(WORKER_PREFIX);
    } else {
        return token_new_kind(DL_PROTO_TOKEN_MASTER, NULL, NULL, data, len, ret_token);
    }
    const char *what = kind == DL_PROTO_TOKEN_JOB ? "job" : "worker";
    if (len - plen >= sizeof(text)) {
        set_err(err, errlen, "%s: a malformed dlaunch %s key (too long)", where, what);
        return -EINVAL;
    }
    memcpy(text, data + plen, len - plen);
    text[len - plen] = '\0';
    /* From the right: the run id may hold colons, the other fields may not. */
    char *hex = cut_last(text);
    char *expires = hex != NULL ? cut_last(text) : NULL;
    char *issued = expires != NULL ? cut_last(text) : NULL;
    r = -EINVAL;
    if (issued == NULL) {
        set_err(err, errlen, "%s: a malformed dlaunch %s key (not RUN_ID:ISSUED:EXPIRES:HEX)",
                where, what);
    } else if (!dl_proto_run_id_valid(text)) {
        set_err(err, errlen, "%s: a malformed dlaunch %s key (its run id)", where, what);
    } else if (parse_key_time(issued, &life.issued) < 0 ||
               parse_key_time(expires, &life.expires) < 0) {
        set_err(err, errlen,
                "%s: a malformed dlaunch %s key (its times must be Unix seconds from 0 to %lld)",
                where, what, (long long)DL_PROTO_KEY_TIME_MAX);
    } else if (!dl_proto_key_life_valid(&life)) {
        set_err(err, errlen, "%s: a malformed dlaunch %s key (it expires before it is issued)",
                where, what);
    } else if (hex_decode(hex, key, sizeof(key)) < 0) {
        set_err(err, errlen, "%s: a malformed dlaunch %s key (its key is not %d hex digits)", where,
                what, 2 * MAC_LEN);
    } else {
        r = token_new_kind(kind, text, &life, key, sizeof(key), ret_token);
    }
    explicit_bzero(key, sizeof(key));
    explicit_bzero(text, sizeof(text));
    return r;
}

void dl_proto_token_free(dl_proto_token_t *token)
{
    if (token == NULL)
        return;
    explicit_bzero(token->data, token->len);
    free(token);
}

int dl_proto_token_copy(const dl_proto_token_t *token, dl_proto_token_t **ret)
{
    return token_new_kind(token->kind, token->run_id, &token->life, token->data, token->len, ret);
}

int dl_proto_token_from_string(const char *text, const char *where, dl_proto_token_t **ret_token,
                               char *err, size_t errlen)
{
    size_t len = strlen(text);

    if (len == 0) {
        set_err(err, errlen, "%s: the token is empty", where);
        return -EINVAL;
    }
    if (len > DL_PROTO_TOKEN_MAX) {
        set_err(err, errlen, "%s: the token is longer than %d bytes", where, DL_PROTO_TOKEN_MAX);
        return -EINVAL;
    }
    return token_parse((const unsigned char *)text, len, where, ret_token, err, errlen);
}

int dl_proto_token_load(const char *file, const char *env_value, dl_proto_token_t **ret_token,
                        char *err, size_t errlen)
{
    *ret_token = NULL;
    if (file != NULL)
        return dl_proto_token_from_file(file, ret_token, err, errlen);
    if (env_value != NULL && *env_value != '\0')
        return dl_proto_token_from_string(env_value, "DLAUNCH_TOKEN", ret_token, err, errlen);
    return 0;
}

/* Reads at most max bytes; returns the count or -errno. */
static ssize_t read_upto(int fd, unsigned char *buf, size_t max)
{
    size_t have = 0;

    while (have < max) {
        ssize_t n = read(fd, buf + have, max - have);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            break;
        have += (size_t)n;
    }
    return (ssize_t)have;
}

static int token_read_fd(int fd, const char *path, const struct stat *st,
                         dl_proto_token_t **ret_token, char *err, size_t errlen)
{
    unsigned char *buf;
    ssize_t n;
    size_t len;
    int r;

    if (!S_ISREG(st->st_mode)) {
        set_err(err, errlen, "token file '%s': not a regular file", path);
        return -EINVAL;
    }
    /* Another user's file holds a secret that user knows (or chose): root could read it. */
    if (st->st_uid != geteuid()) {
        set_err(err, errlen, "token file '%s': it belongs to uid %u, not to this user (uid %u)",
                path, (unsigned)st->st_uid, (unsigned)geteuid());
        return -EPERM;
    }
    /* Like ssh with its keys: a secret others can read is no longer a secret, and one others can
     * write lets them pick it. */
    if ((st->st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0) {
        set_err(err, errlen,
                "token file '%s': mode %04o lets group or others read or write it; chmod 600 it",
                path, (unsigned)(st->st_mode & 07777));
        return -EACCES;
    }
    /* One byte over the limit tells a too-large file from one exactly at it, even if the file
     * grows between fstat() and read(). */
    buf = malloc(DL_PROTO_TOKEN_MAX + 1);
    if (buf == NULL)
        return -ENOMEM;
    n = read_upto(fd, buf, DL_PROTO_TOKEN_MAX + 1);
    if (n < 0) {
        set_err(err, errlen, "token file '%s': %s", path, strerror((int)-n));
        r = (int)n;
    } else if ((size_t)n > DL_PROTO_TOKEN_MAX) {
        set_err(err, errlen, "token file '%s': larger than %d bytes; is it the right file?", path,
                DL_PROTO_TOKEN_MAX);
        r = -EINVAL;
    } else {
        len = (size_t)n;
        if (len > 0 && buf[len - 1] == '\n') {
            len--;
            if (len > 0 && buf[len - 1] == '\r')
                len--;
        }
        if (len == 0) {
            set_err(err, errlen, "token file '%s': the token is empty", path);
            r = -EINVAL;
        } else {
            char where[300];
            snprintf(where, sizeof(where), "token file '%s'", path);
            r = token_parse(buf, len, where, ret_token, err, errlen);
        }
    }
    explicit_bzero(buf, DL_PROTO_TOKEN_MAX + 1);
    free(buf);
    return r;
}

int dl_proto_token_from_file(const char *path, dl_proto_token_t **ret_token, char *err,
                             size_t errlen)
{
    struct stat st;
    int fd, r;

    /* fstat() on the opened file, so the mode checked is the mode of the bytes read. */
    /* O_NONBLOCK: a FIFO in its place must not block us before the regular-file check. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        r = -errno;
        set_err(err, errlen, "token file '%s': %s", path, strerror(-r));
        return r;
    }
    if (fstat(fd, &st) < 0) {
        r = -errno;
        set_err(err, errlen, "token file '%s': %s", path, strerror(-r));
    } else {
        r = token_read_fd(fd, path, &st, ret_token, err, errlen);
    }
    close(fd);
    return r;
}

int dl_proto_hmac_sha256(const void *key, size_t key_len, const void *data, size_t data_len,
                         uint8_t ret_mac[32])
{
    static const unsigned char empty[1];
    unsigned char mac[64]; /* EVP_MAX_MD_SIZE */
    unsigned int mac_len = 0;

    if (key_len > INT_MAX)
        return -EINVAL;
    /* OpenSSL treats a NULL key as "reuse the previous one"; an empty key must be non-NULL. */
    int r = dl__proto_hmac_raw(key_len > 0 ? key : empty, (int)key_len, data_len > 0 ? data : empty,
                               data_len, mac, &mac_len);
    if (r < 0 || mac_len != MAC_LEN)
        return r < 0 ? r : -EIO;
    memcpy(ret_mac, mac, MAC_LEN);
    explicit_bzero(mac, sizeof(mac));
    return 0;
}

static void hex_encode(const uint8_t *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 0xf];
    }
    out[2 * len] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Decodes exactly 2 * len lowercase hex digits followed by the string's end. */
static int hex_decode(const char *hex, uint8_t *out, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int hi = hex_digit(hex[2 * i]);
        int lo = hi < 0 ? -1 : hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return hex[2 * len] == '\0' ? 0 : -EINVAL;
}

int dl_proto_random(void *buf, size_t len)
{
    /* The kernel's generator: no library state to set up for a few bytes at start. */
    for (size_t off = 0; off < len;) {
        ssize_t n = getrandom((char *)buf + off, len - off, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -EIO;
        off += (size_t)n;
    }
    return 0;
}

int dl_proto_nonce_new(char ret_nonce[DL_PROTO_NONCE_HEX_LEN + 1])
{
    uint8_t nonce[DL_PROTO_NONCE_BYTES];

    if (dl_proto_random(nonce, sizeof(nonce)) < 0)
        return -EIO;
    hex_encode(nonce, sizeof(nonce), ret_nonce);
    return 0;
}

/* ---- Kinds and derivation ---- */

dl_proto_token_kind_t dl_proto_token_kind(const dl_proto_token_t *token)
{
    return token->kind;
}

const char *dl_proto_token_run_id(const dl_proto_token_t *token)
{
    bool none = token->kind == DL_PROTO_TOKEN_MASTER || token->kind == DL_PROTO_TOKEN_SCRAPE;
    return none ? NULL : token->run_id;
}

dl_proto_key_life_t dl_proto_token_life(const dl_proto_token_t *token)
{
    return token->life;
}

const char *dl_proto_token_kind_name(dl_proto_token_kind_t kind)
{
    switch (kind) {
    case DL_PROTO_TOKEN_MASTER: return "master";
    case DL_PROTO_TOKEN_JOB: return "job";
    case DL_PROTO_TOKEN_WORKER: return "worker";
    case DL_PROTO_TOKEN_SCRAPE: return "read-only";
    }
    return "unknown";
}

bool dl_proto_token_may(const dl_proto_token_t *token, const char *run_id, dl_proto_role_t role)
{
    if (token == NULL || run_id == NULL || token->kind == DL_PROTO_TOKEN_SCRAPE)
        return false;
    if (token->kind == DL_PROTO_TOKEN_MASTER)
        return true;
    if (strcmp(token->run_id, run_id) != 0)
        return false;
    return token->kind == DL_PROTO_TOKEN_JOB || role == DL_PROTO_ROLE_WORKER;
}

/* key' = HMAC-SHA256(key, label || run_id [|| "\n" || issued || "\n" || expires]): one step
 * down the chain. A run id holds no newline, and the times are plain decimal, so the message
 * reads one way only. */
static int derive_step(const unsigned char *key, size_t key_len, const char *label,
                       const char *run_id, const dl_proto_key_life_t *life,
                       uint8_t ret_key[MAC_LEN])
{
    char msg[64 + DL_PROTO_RUN_ID_MAX + 2 * TIME_DIGITS_MAX + 4];
    int len = life != NULL ? snprintf(msg, sizeof(msg), "%s%s\n%lld\n%lld", label, run_id,
                                      (long long)life->issued, (long long)life->expires)
                           : snprintf(msg, sizeof(msg), "%s%s", label, run_id);

    if (len < 0 || (size_t)len >= sizeof(msg))
        return -EINVAL;
    return dl_proto_hmac_sha256(key, key_len, msg, (size_t)len, ret_key);
}

#define JOB_LABEL "dlaunch job key v2\n"
#define WORKER_LABEL "dlaunch worker key v2\n"

int dl_proto_token_derive(const dl_proto_token_t *token, dl_proto_token_kind_t kind,
                          const char *run_id, const dl_proto_key_life_t *life,
                          dl_proto_token_t **ret)
{
    uint8_t job[MAC_LEN], worker[MAC_LEN];
    int r;

    if (token == NULL || run_id == NULL || !dl_proto_run_id_valid(run_id))
        return -EINVAL;
    /* A read-only credential is a side branch off the master: nothing derives from it. */
    if (token->kind == DL_PROTO_TOKEN_SCRAPE || kind == DL_PROTO_TOKEN_SCRAPE)
        return -EPERM;
    if (token->kind != DL_PROTO_TOKEN_MASTER && strcmp(token->run_id, run_id) != 0)
        return -EPERM;
    if (kind == token->kind && kind != DL_PROTO_TOKEN_MASTER)
        return token_new_kind(kind, run_id, &token->life, token->data, token->len, ret);
    /* Only down the chain: never to a master, never from a worker to a job key. */
    if (kind == DL_PROTO_TOKEN_MASTER || kind < token->kind)
        return -EPERM;
    if (token->kind == DL_PROTO_TOKEN_MASTER) {
        if (life == NULL || !dl_proto_key_life_valid(life))
            return -EINVAL;
        r = derive_step(token->data, token->len, JOB_LABEL, run_id, life, job);
    } else {
        life = &token->life; /* a worker key ends with its job key */
        memcpy(job, token->data, MAC_LEN);
        r = 0;
    }
    if (r == 0 && kind == DL_PROTO_TOKEN_WORKER)
        r = derive_step(job, MAC_LEN, WORKER_LABEL, run_id, NULL, worker);
    if (r == 0)
        r = token_new_kind(kind, run_id, life, kind == DL_PROTO_TOKEN_JOB ? job : worker, MAC_LEN,
                           ret);
    explicit_bzero(job, sizeof(job));
    explicit_bzero(worker, sizeof(worker));
    return r;
}

static void hex_encode(const uint8_t *bytes, size_t len, char *out);

int dl_proto_token_text(const dl_proto_token_t *token, char **ret_text)
{
    char hex[2 * MAC_LEN + 1];
    char *text;

    if (token == NULL || token->kind == DL_PROTO_TOKEN_MASTER || token->len != MAC_LEN)
        return -EPERM;
    hex_encode(token->data, MAC_LEN, hex);
    if (token->kind == DL_PROTO_TOKEN_SCRAPE) {
        int n = asprintf(&text, "%s%s", SCRAPE_PREFIX, hex);
        explicit_bzero(hex, sizeof(hex));
        if (n < 0)
            return -ENOMEM;
        *ret_text = text;
        return 0;
    }
    int n = asprintf(&text, "%s%s:%lld:%lld:%s",
                     token->kind == DL_PROTO_TOKEN_JOB ? JOB_PREFIX : WORKER_PREFIX, token->run_id,
                     (long long)token->life.issued, (long long)token->life.expires, hex);
    explicit_bzero(hex, sizeof(hex));
    if (n < 0)
        return -ENOMEM;
    *ret_text = text;
    return 0;
}

int dl_proto_token_scrape(const dl_proto_token_t *master, dl_proto_token_t **ret)
{
    uint8_t key[MAC_LEN];

    if (master == NULL || master->kind != DL_PROTO_TOKEN_MASTER)
        return -EPERM;
    int r =
        dl_proto_hmac_sha256(master->data, master->len, SCRAPE_LABEL, strlen(SCRAPE_LABEL), key);
    if (r == 0)
        r = token_new_kind(DL_PROTO_TOKEN_SCRAPE, NULL, NULL, key, sizeof(key), ret);
    explicit_bzero(key, sizeof(key));
    return r;
}

int dl_proto_token_reach(const dl_proto_token_t *server, const dl_proto_token_t *given)
{
    dl_proto_token_t *scrape = NULL;

    if (server == NULL || given == NULL)
        return -EACCES;
    if (dl_proto_token_equal(given, server))
        return DL_PROTO_REACH_ALL;
    if (given->kind != DL_PROTO_TOKEN_SCRAPE || dl_proto_token_scrape(server, &scrape) < 0)
        return -EACCES;
    bool ok = dl_proto_token_equal(given, scrape);
    dl_proto_token_free(scrape);
    return ok ? DL_PROTO_REACH_READ : -EACCES;
}

bool dl_proto_token_equal(const dl_proto_token_t *a, const dl_proto_token_t *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    return a->kind == b->kind && strcmp(a->run_id, b->run_id) == 0 &&
           a->life.issued == b->life.issued && a->life.expires == b->life.expires &&
           a->len == b->len && ct_memcmp(a->data, b->data, a->len) == 0;
}

int dl_proto_token_random(dl_proto_token_t **ret_token)
{
    uint8_t bytes[MAC_LEN];
    char hex[2 * MAC_LEN + 1];
    int r;

    if (dl_proto_random(bytes, sizeof(bytes)) < 0)
        return -EIO;
    hex_encode(bytes, sizeof(bytes), hex);
    r = token_new_kind(DL_PROTO_TOKEN_MASTER, NULL, NULL, (const unsigned char *)hex, 2 * MAC_LEN,
                       ret_token);
    explicit_bzero(bytes, sizeof(bytes));
    explicit_bzero(hex, sizeof(hex));
    return r;
}

/* ---- Proofs ---- */

static int compute_mac(const dl_proto_token_t *token, const char *nonce, const char *run_id,
                       dl_proto_role_t role, uint8_t ret_mac[MAC_LEN])
{
    /* The nonce has a fixed length and no role name ends another, so the plain concatenation
     * cannot be read two ways. */
    char msg[DL_PROTO_NONCE_HEX_LEN + DL_PROTO_RUN_ID_MAX + 16];
    uint8_t scratch[DL_PROTO_NONCE_BYTES];
    const char *role_name = dl_proto_role_name(role);
    size_t run_len;
    int len;

    if (token == NULL || nonce == NULL || run_id == NULL || role == DL_PROTO_ROLE_SERVER ||
        role_name == NULL || !dl_proto_run_id_valid(run_id) ||
        hex_decode(nonce, scratch, sizeof(scratch)) < 0)
        return -EINVAL;
    run_len = strlen(run_id);
    len = snprintf(msg, sizeof(msg), "%s%s%s", nonce, run_id, role_name);
    if (len < 0 || (size_t)len != DL_PROTO_NONCE_HEX_LEN + run_len + strlen(role_name))
        return -EINVAL;
    return dl_proto_hmac_sha256(token->data, token->len, msg, (size_t)len, ret_mac);
}

int dl_proto_auth_proof(const dl_proto_token_t *token, const char *nonce, const char *run_id,
                        dl_proto_role_t role, char ret_proof[DL_PROTO_PROOF_HEX_LEN + 1])
{
    uint8_t mac[MAC_LEN];
    int r;

    if (token != NULL && run_id != NULL && !dl_proto_token_may(token, run_id, role))
        return -EPERM;
    r = compute_mac(token, nonce, run_id, role, mac);
    if (r < 0)
        return r;
    hex_encode(mac, sizeof(mac), ret_proof);
    explicit_bzero(mac, sizeof(mac));
    return 0;
}

int dl_proto_auth_add_life(json_t *auth, const dl_proto_token_t *token)
{
    if (token == NULL || !dl_proto_key_life_valid(&token->life))
        return 0;
    if (json_object_set_new(auth, "key_issued", json_integer((json_int_t)token->life.issued)) < 0 ||
        json_object_set_new(auth, "key_expires", json_integer((json_int_t)token->life.expires)) < 0)
        return -ENOMEM;
    return 0;
}

dl_proto_key_life_t dl_proto_auth_claimed_life(const json_t *auth)
{
    json_t *i = json_object_get(auth, "key_issued"), *e = json_object_get(auth, "key_expires");
    dl_proto_key_life_t life = {0, 0};

    if (json_is_integer(i) && json_is_integer(e)) {
        life.issued = json_integer_value(i);
        life.expires = json_integer_value(e);
    }
    return life;
}

int dl_proto_auth_verify(const dl_proto_token_t *token, const char *nonce, const char *run_id,
                         dl_proto_role_t role, const char *proof)
{
    uint8_t want[MAC_LEN], got[MAC_LEN];
    int r;

    r = compute_mac(token, nonce, run_id, role, want);
    if (r < 0)
        return r;
    /* Decoding the peer's own hex leaks nothing; only the comparison with the secret-derived
     * value must not depend on where the first difference lies. */
    if (proof == NULL || hex_decode(proof, got, sizeof(got)) < 0)
        r = -EACCES;
    else
        r = ct_memcmp(want, got, MAC_LEN) == 0 ? 0 : -EACCES;
    explicit_bzero(want, sizeof(want));
    return r;
}

#define SERVER_LABEL "dlaunch server proof v1\n"

static int server_mac(const dl_proto_token_t *key, const char *client_nonce, const char *nonce,
                      const char *run_id, dl_proto_role_t role, uint8_t ret_mac[MAC_LEN])
{
    char msg[sizeof(SERVER_LABEL) + 2 * DL_PROTO_NONCE_HEX_LEN + DL_PROTO_RUN_ID_MAX + 16];
    uint8_t scratch[DL_PROTO_NONCE_BYTES];
    const char *role_name = dl_proto_role_name(role);

    if (client_nonce == NULL || role_name == NULL || role == DL_PROTO_ROLE_SERVER ||
        hex_decode(client_nonce, scratch, sizeof(scratch)) < 0 ||
        hex_decode(nonce, scratch, sizeof(scratch)) < 0 || !dl_proto_run_id_valid(run_id))
        return -EINVAL;
    int len = snprintf(msg, sizeof(msg), "%s%s%s%s\n%s", SERVER_LABEL, client_nonce, nonce, run_id,
                       role_name);
    if (len < 0 || (size_t)len >= sizeof(msg))
        return -EINVAL;
    return dl_proto_hmac_sha256(key->data, key->len, msg, (size_t)len, ret_mac);
}

int dl_proto_auth_accept(const dl_proto_token_t *server, const char *nonce,
                         const char *client_nonce, const char *run_id, dl_proto_role_t role,
                         const char *proof, const dl_proto_key_life_t *claimed,
                         dl_proto_token_kind_t *ret_level, dl_proto_key_life_t *ret_life,
                         char ret_server_proof[DL_PROTO_PROOF_HEX_LEN + 1])
{
    dl_proto_token_t *key = NULL, *job = NULL;
    int r = -EACCES; /* no key of the chain tried: a worker key's server and another role */

    if (server == NULL || run_id == NULL || !dl_proto_run_id_valid(run_id))
        return -EINVAL;
    if (server->kind == DL_PROTO_TOKEN_SCRAPE)
        return -EACCES;
    /* A server holding one job's key serves that job only. */
    if (server->kind != DL_PROTO_TOKEN_MASTER && strcmp(server->run_id, run_id) != 0)
        return -EACCES;
    /* Down the chain from the server's own key, as far as this role may be reached from, until
     * one matches: the client knows which key it holds, so which one matched is no secret. */
    for (dl_proto_token_kind_t kind = server->kind; kind <= DL_PROTO_TOKEN_WORKER; kind++) {
        dl_proto_token_t *k = NULL;
        if (kind == DL_PROTO_TOKEN_WORKER && role != DL_PROTO_ROLE_WORKER)
            break;
        /* A client that names no span holds no key below a master's: none to derive. */
        if (kind == DL_PROTO_TOKEN_JOB && server->kind == DL_PROTO_TOKEN_MASTER &&
            (claimed == NULL || !dl_proto_key_life_valid(claimed))) {
            r = -EACCES;
            break;
        }
        if (kind == server->kind)
            r = token_new_kind(kind, dl_proto_token_run_id(server), &server->life, server->data,
                               server->len, &k);
        else
            r = dl_proto_token_derive(kind == DL_PROTO_TOKEN_WORKER && job != NULL ? job : server,
                                      kind, run_id, claimed, &k);
        if (r < 0)
            break;
        r = dl_proto_auth_verify(k, nonce, run_id, role, proof);
        if (r == 0) {
            key = k;
            break;
        }
        if (kind == DL_PROTO_TOKEN_JOB) {
            job = k; /* the worker key is one step from it */
        } else {
            dl_proto_token_free(k);
        }
        if (r != -EACCES)
            break;
    }
    dl_proto_token_free(job);
    if (key == NULL)
        return r < 0 && r != -EACCES ? r : -EACCES;
    r = 0;
    if (client_nonce != NULL) {
        uint8_t mac[MAC_LEN];
        r = server_mac(key, client_nonce, nonce, run_id, role, mac);
        if (r == 0)
            hex_encode(mac, sizeof(mac), ret_server_proof);
        explicit_bzero(mac, sizeof(mac));
    }
    if (r == 0) {
        *ret_level = key->kind;
        *ret_life = key->life;
    }
    dl_proto_token_free(key);
    return r;
}

int dl_proto_auth_check_server(const dl_proto_token_t *token, const char *client_nonce,
                               const char *nonce, const char *run_id, dl_proto_role_t role,
                               const char *server_proof)
{
    uint8_t want[MAC_LEN], got[MAC_LEN];
    int r;

    if (token == NULL || run_id == NULL)
        return -EINVAL;
    if (!dl_proto_token_may(token, run_id, role))
        return -EPERM;
    r = server_mac(token, client_nonce, nonce, run_id, role, want);
    if (r < 0)
        return r;
    if (server_proof == NULL || hex_decode(server_proof, got, sizeof(got)) < 0)
        r = -EACCES;
    else
        r = ct_memcmp(want, got, MAC_LEN) == 0 ? 0 : -EACCES;
    explicit_bzero(want, sizeof(want));
    return r;
}
