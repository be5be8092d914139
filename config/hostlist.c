/* Slurm hostlist expansion: "node[01-04,07]" -> node01 node02 node03 node04 node07.
 *
 * The result equals `scontrol show hostnames` (Slurm 22.05) for every list Slurm accepts, including
 * its loop order for several bracket groups. Slurm silently repairs some broken lists ("node[1-3"
 * prints "node]", "n[1-]" prints "n1", "n[ 1]" prints "n01"); those are errors here, because a
 * launcher that guesses host names connects to the wrong machines.
 *
 * Expansion runs in two passes over the text: the first validates and sizes everything, the second
 * writes the names into one allocation, so a list that is too large fails before any memory is
 * spent on it. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurm.h"

typedef struct {
    uint64_t lo, hi;
    unsigned width; /* characters of the lower bound as written: Slurm's zero padding */
} range_t;

typedef struct {
    size_t off;              /* of the '[' */
    size_t lit_off, lit_len; /* literal text before the '[' */
    size_t first, nranges;   /* slice of parser_t.ranges */
    uint64_t count;          /* values in the group */
    uint64_t len_sum;        /* characters printed for all values together */
    unsigned max_len;        /* longest printed value */
} group_t;

/* One item of the list (between separators), parsed; buffers are reused from item to item. */
typedef struct {
    const char *list;
    group_t *groups;
    size_t ngroups, gcap;
    range_t *ranges;
    size_t nranges, rcap;
    size_t off, end;           /* the item's text */
    size_t tail_off, tail_len; /* literal after the last group */
    uint64_t count;            /* hosts of the item */
    uint64_t bytes;            /* their names, with terminators */
    char *err;
    size_t errlen;
} parser_t;

static const uint64_t pow10_table[20] = {
    1ULL,
    10ULL,
    100ULL,
    1000ULL,
    10000ULL,
    100000ULL,
    1000000ULL,
    10000000ULL,
    100000000ULL,
    1000000000ULL,
    10000000000ULL,
    100000000000ULL,
    1000000000000ULL,
    10000000000000ULL,
    100000000000000ULL,
    1000000000000000ULL,
    10000000000000000ULL,
    100000000000000000ULL,
    1000000000000000000ULL,
    10000000000000000000ULL,
};

static int is_sep(char c)
{
    /* Slurm's separators; other control characters are part of a name, as in Slurm. */
    return c == ',' || c == ' ' || c == '\t' || c == '\n';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static unsigned ndigits(uint64_t v)
{
    unsigned d = 1;

    while (d < 20 && v >= pow10_table[d])
        d++;
    return d;
}

/* Characters printed for every value of lo..hi padded to width, without looping over them. */
static uint64_t printed_len_sum(uint64_t lo, uint64_t hi, unsigned width)
{
    uint64_t sum = 0;

    for (unsigned d = ndigits(lo); d <= ndigits(hi); d++) {
        uint64_t band_lo = d == 1 ? 0 : pow10_table[d - 1];
        uint64_t band_hi = d == 20 ? UINT64_MAX : pow10_table[d] - 1;
        uint64_t a = lo > band_lo ? lo : band_lo;
        uint64_t b = hi < band_hi ? hi : band_hi;
        sum += (b - a + 1) * (d > width ? d : width);
    }
    return sum;
}

/* Writes the list into buf for a message: at most 64 characters, control bytes as '?'. */
static void quote_list(const char *list, char *buf, size_t len)
{
    size_t i, n = 0;

    for (i = 0; list[i] != '\0' && n + 4 < len && i < 64; i++)
        buf[n++] = (unsigned char)list[i] < 0x20 || list[i] == 0x7f ? '?' : list[i];
    if (list[i] != '\0' && n + 4 < len) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int
fail(parser_t *p, int code, size_t off, const char *fmt, ...)
{
    char what[160], shown[72];
    va_list ap;

    if (p->errlen == 0)
        return code;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    quote_list(p->list, shown, sizeof(shown));
    snprintf(p->err, p->errlen, "hostlist '%s': %s at offset %zu", shown, what, off);
    return code;
}

static int describe_char(parser_t *p, size_t off, size_t bracket, const char *expected)
{
    char c = p->list[off];

    if (c == '\0')
        return fail(p, -EINVAL, bracket, "'[' is never closed");
    if (c == '[')
        return fail(p, -EINVAL, off, "'[' inside brackets");
    if (c == ' ' || c == '\t' || c == '\n')
        return fail(p, -EINVAL, off, "whitespace inside brackets");
    if ((unsigned char)c < 0x20 || c == 0x7f)
        return fail(p, -EINVAL, off, "control character 0x%02x where %s was expected",
                    (unsigned)(unsigned char)c, expected);
    return fail(p, -EINVAL, off, "'%c' where %s was expected", c, expected);
}

/* A bound of a range: digits only (Slurm's strtoul would also take "+1" and " 1"). */
static int parse_bound(parser_t *p, size_t *pos, size_t bracket, uint64_t *ret)
{
    size_t i = *pos;
    uint64_t v = 0;

    if (!is_digit(p->list[i]))
        return describe_char(p, i, bracket, "a digit");
    for (; is_digit(p->list[i]); i++) {
        unsigned d = (unsigned)(p->list[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return fail(p, -ERANGE, *pos, "number '%.*s' is too large", (int)(i - *pos + 1),
                        p->list + *pos);
        v = v * 10 + d;
    }
    *pos = i;
    *ret = v;
    return 0;
}

static int push_range(parser_t *p, const range_t *r)
{
    if (p->nranges == p->rcap) {
        size_t cap = p->rcap ? p->rcap * 2 : 16;
        range_t *n = realloc(p->ranges, cap * sizeof(*n));
        if (n == NULL)
            return fail(p, -ENOMEM, 0, "out of memory");
        p->ranges = n;
        p->rcap = cap;
    }
    p->ranges[p->nranges++] = *r;
    return 0;
}

static int push_group(parser_t *p, const group_t *g)
{
    if (p->ngroups == p->gcap) {
        size_t cap = p->gcap ? p->gcap * 2 : 4;
        group_t *n = realloc(p->groups, cap * sizeof(*n));
        if (n == NULL)
            return fail(p, -ENOMEM, 0, "out of memory");
        p->groups = n;
        p->gcap = cap;
    }
    p->groups[p->ngroups++] = *g;
    return 0;
}

/* Parses "[a-b,c,...]" starting at the '[' in g->off; *pos ends after the ']'. */
static int parse_group(parser_t *p, group_t *g, size_t *pos)
{
    size_t i = g->off + 1;
    int r;

    g->first = p->nranges;
    g->count = 0;
    g->len_sum = 0;
    g->max_len = 0;
    for (;;) {
        size_t start = i;
        range_t rg;

        if (p->list[i] == ',' || p->list[i] == ']')
            return fail(p, -EINVAL, i, "empty range");
        r = parse_bound(p, &i, g->off, &rg.lo);
        if (r < 0)
            return r;
        rg.width = (unsigned)(i - start);
        rg.hi = rg.lo;
        if (p->list[i] == '-') {
            i++;
            if (p->list[i] == ',' || p->list[i] == ']')
                return fail(p, -EINVAL, start, "range '%.*s' has no upper bound", (int)(i - start),
                            p->list + start);
            r = parse_bound(p, &i, g->off, &rg.hi);
            if (r < 0)
                return r;
        }
        if (rg.hi < rg.lo)
            return fail(p, -EINVAL, start, "range '%.*s' runs backwards", (int)(i - start),
                        p->list + start);
        if (rg.hi - rg.lo >= DL_HOSTLIST_MAX_RANGE)
            return fail(p, -E2BIG, start, "range '%.*s' has more than %d hosts", (int)(i - start),
                        p->list + start, DL_HOSTLIST_MAX_RANGE);
        if (rg.width > DL_HOSTLIST_MAX_NAME)
            return fail(p, -ENAMETOOLONG, start, "number longer than %d characters",
                        DL_HOSTLIST_MAX_NAME);
        g->count += rg.hi - rg.lo + 1;
        if (g->count > DL_HOSTLIST_MAX_HOSTS)
            return fail(p, -E2BIG, g->off, "more than %d hosts", DL_HOSTLIST_MAX_HOSTS);
        g->len_sum += printed_len_sum(rg.lo, rg.hi, rg.width);
        unsigned len = ndigits(rg.hi) > rg.width ? ndigits(rg.hi) : rg.width;
        if (len > g->max_len)
            g->max_len = len;
        r = push_range(p, &rg);
        if (r < 0)
            return r;
        if (p->list[i] == ']')
            break;
        if (p->list[i] != ',')
            return describe_char(p, i, g->off, "',', '-' or ']'");
        i++;
    }
    g->nranges = p->nranges - g->first;
    *pos = i + 1;
    return 0;
}

/* Parses the item at p->off up to the next separator outside brackets, and sizes it. */
static int parse_item(parser_t *p)
{
    size_t i = p->off, lit = p->off;
    uint64_t lit_total, max_len, count = 1;
    int r;

    p->ngroups = 0;
    p->nranges = 0;
    while (p->list[i] != '\0' && !is_sep(p->list[i])) {
        if (p->list[i] == ']')
            return fail(p, -EINVAL, i, "']' without '['");
        if (p->list[i] != '[') {
            i++;
            continue;
        }
        group_t g = {.off = i, .lit_off = lit, .lit_len = i - lit};
        r = parse_group(p, &g, &i);
        if (r < 0)
            return r;
        r = push_group(p, &g);
        if (r < 0)
            return r;
        lit = i;
    }
    p->end = i;
    p->tail_off = lit;
    p->tail_len = i - lit;
    if (p->ngroups > 0 && p->tail_len > 0)
        return fail(p, -EINVAL, lit, "text after the last ']' (Slurm allows none)");

    lit_total = p->tail_len;
    max_len = p->tail_len;
    for (size_t k = 0; k < p->ngroups; k++) {
        lit_total += p->groups[k].lit_len;
        max_len += p->groups[k].lit_len + p->groups[k].max_len;
        /* Each factor is at most the cap, so the product of two cannot overflow. */
        count *= p->groups[k].count;
        if (count > DL_HOSTLIST_MAX_HOSTS)
            return fail(p, -E2BIG, p->off, "more than %d hosts", DL_HOSTLIST_MAX_HOSTS);
    }
    if (max_len > DL_HOSTLIST_MAX_NAME)
        return fail(p, -ENAMETOOLONG, p->off, "host name of %llu characters (limit %d)",
                    (unsigned long long)max_len, DL_HOSTLIST_MAX_NAME);
    p->count = count;
    p->bytes = count * (lit_total + 1);
    for (size_t k = 0; k < p->ngroups; k++)
        p->bytes += p->groups[k].len_sum * (count / p->groups[k].count);
    return 0;
}

/* Sizes the whole list. */
static int measure(parser_t *p, size_t *ret_n, size_t *ret_bytes)
{
    uint64_t n = 0, bytes = 0;
    size_t i = 0;
    int r;

    for (;;) {
        while (is_sep(p->list[i]))
            i++;
        if (p->list[i] == '\0')
            break;
        p->off = i;
        r = parse_item(p);
        if (r < 0)
            return r;
        n += p->count;
        bytes += p->bytes;
        if (n > DL_HOSTLIST_MAX_HOSTS)
            return fail(p, -E2BIG, i, "more than %d hosts", DL_HOSTLIST_MAX_HOSTS);
        if (bytes > DL_HOSTLIST_MAX_BYTES)
            return fail(p, -E2BIG, i, "more than %d bytes of host names", DL_HOSTLIST_MAX_BYTES);
        i = p->end;
    }
    *ret_n = (size_t)n;
    *ret_bytes = (size_t)bytes;
    return 0;
}

static char *put_value(char *out, uint64_t v, unsigned width)
{
    char digits[20];
    unsigned n = 0;

    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    for (; width > n; width--)
        *out++ = '0';
    while (n > 0)
        *out++ = digits[--n];
    return out;
}

typedef struct {
    size_t range;   /* index within the group */
    uint64_t value; /* current value of that range */
} cursor_t;

/* Writes every host of the parsed item. Slurm's loop order for groups G1..Gk (k >= 2) is, from the
 * slowest to the fastest changing: G(k-1), G(k-2), ..., G1, then Gk ("a[1-2]b[3-4]c[5-6]" gives
 * a1b3c5 a1b3c6 a2b3c5 ...). For one or two groups that is plain left-to-right order. */
static int emit_item(parser_t *p, char ***slot, char **text)
{
    size_t k, ng = p->ngroups;
    cursor_t *cur = NULL;
    size_t *order = NULL;

    if (ng == 0) {
        **slot = *text;
        memcpy(*text, p->list + p->tail_off, p->tail_len);
        (*text)[p->tail_len] = '\0';
        *text += p->tail_len + 1;
        (*slot)++;
        return 0;
    }
    cur = calloc(ng, sizeof(*cur));
    order = calloc(ng, sizeof(*order));
    if (cur == NULL || order == NULL) {
        free(cur);
        free(order);
        return fail(p, -ENOMEM, p->off, "out of memory");
    }
    /* order[0] changes fastest. */
    order[0] = ng - 1;
    for (k = 1; k < ng; k++)
        order[k] = k - 1;
    for (k = 0; k < ng; k++)
        cur[k].value = p->ranges[p->groups[k].first].lo;

    for (uint64_t h = 0; h < p->count; h++) {
        char *out = *text;
        **slot = out;
        for (k = 0; k < ng; k++) {
            const group_t *g = &p->groups[k];
            memcpy(out, p->list + g->lit_off, g->lit_len);
            out += g->lit_len;
            out = put_value(out, cur[k].value, p->ranges[g->first + cur[k].range].width);
        }
        *out++ = '\0';
        *text = out;
        (*slot)++;

        /* Odometer step, fastest group first; a group that wraps carries into the next. */
        for (k = 0; k < ng; k++) {
            const group_t *g = &p->groups[order[k]];
            cursor_t *c = &cur[order[k]];
            const range_t *rg = &p->ranges[g->first + c->range];
            if (c->value < rg->hi) {
                c->value++;
                break;
            }
            if (c->range + 1 < g->nranges) {
                c->range++;
                c->value = p->ranges[g->first + c->range].lo;
                break;
            }
            c->range = 0;
            c->value = p->ranges[g->first].lo;
        }
    }
    free(cur);
    free(order);
    return 0;
}

static void parser_release(parser_t *p)
{
    free(p->groups);
    free(p->ranges);
}

int dl_hostlist_count(const char *list, size_t *ret_n, char *err, size_t errlen)
{
    parser_t p = {.list = list, .err = err, .errlen = errlen};
    size_t n, bytes;
    int r;

    if (list == NULL) {
        p.list = "";
        return fail(&p, -EINVAL, 0, "no list");
    }
    r = measure(&p, &n, &bytes);
    parser_release(&p);
    if (r < 0)
        return r;
    *ret_n = n;
    return 0;
}

int dl_hostlist_expand(const char *list, char ***ret_hosts, size_t *ret_n, char *err, size_t errlen)
{
    parser_t p = {.list = list, .err = err, .errlen = errlen};
    size_t n, bytes, i = 0;
    char **hosts = NULL, **slot, *text;
    int r;

    if (list == NULL) {
        p.list = "";
        return fail(&p, -EINVAL, 0, "no list");
    }
    r = measure(&p, &n, &bytes);
    if (r < 0)
        goto fail;
    /* One block: the NULL-terminated vector, then the names it points to. */
    hosts = malloc((n + 1) * sizeof(char *) + bytes);
    if (hosts == NULL) {
        r = fail(&p, -ENOMEM, 0, "out of memory for %zu hosts", n);
        goto fail;
    }
    slot = hosts;
    text = (char *)(hosts + n + 1);
    for (;;) {
        while (is_sep(list[i]))
            i++;
        if (list[i] == '\0')
            break;
        p.off = i;
        /* Cannot fail on syntax: the text was validated by measure(). */
        r = parse_item(&p);
        if (r >= 0)
            r = emit_item(&p, &slot, &text);
        if (r < 0)
            goto fail;
        i = p.end;
    }
    *slot = NULL;
    parser_release(&p);
    *ret_hosts = hosts;
    *ret_n = n;
    return 0;

fail:
    parser_release(&p);
    free(hosts);
    return r;
}

void dl_hostlist_free(char **hosts)
{
    free(hosts);
}
