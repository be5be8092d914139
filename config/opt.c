/* The option engine (opt.h): lookup by flag, key and variable; the shared types; help; typos. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "opt.h"

#define FIELD(o, obj, type) ((type *)((char *)(obj) + (o)->offset))

/* ---- Names -------------------------------------------------------------------------------- */

static bool same_flag(const char *a, const char *b, size_t len)
{
    if (strlen(a) != len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
        if (x != y)
            return false;
    }
    return true;
}

const dl_opt_t *dl_opt_by_flag(const dl_opt_table_t *t, const char *name, size_t len)
{
    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        if (same_flag(o->name, name, len) || (o->alias != NULL && same_flag(o->alias, name, len)))
            return o;
    }
    return NULL;
}

/* True when name (len bytes, '_' and '-' alike) begins flag. */
static bool flag_starts(const char *flag, const char *name, size_t len)
{
    if (flag == NULL || strlen(flag) < len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char x = flag[i] == '_' ? '-' : flag[i], y = name[i] == '_' ? '-' : name[i];
        if (x != y)
            return false;
    }
    return true;
}

int dl_opt_by_prefix(const dl_opt_table_t *t, const char *name, size_t len, const dl_opt_t **ret,
                     char *candidates, size_t clen)
{
    const dl_opt_t *exact = dl_opt_by_flag(t, name, len), *found = NULL;
    size_t nfound = 0, used = 0;

    if (exact != NULL) {
        *ret = exact;
        return 0;
    }
    if (clen > 0)
        candidates[0] = '\0';
    if (len == 0)
        return -ENOENT;
    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        const char *shown = flag_starts(o->name, name, len)    ? o->name
                            : flag_starts(o->alias, name, len) ? o->alias
                                                               : NULL;
        if (shown == NULL)
            continue;
        found = o;
        nfound++;
        if (used < clen) {
            int n = snprintf(candidates + used, clen - used, "%s--%s", used > 0 ? ", " : "", shown);
            used = n < 0 ? clen : used + (size_t)n;
        }
    }
    if (nfound == 0)
        return -ENOENT;
    if (nfound > 1)
        return -EINVAL;
    *ret = found;
    return 0;
}

const dl_opt_t *dl_opt_by_short(const dl_opt_table_t *t, char c)
{
    for (size_t i = 0; i < t->n; i++)
        if (c != 0 && t->opts[i].short_name == c)
            return &t->opts[i];
    return NULL;
}

void dl_opt_key(const dl_opt_t *o, char *buf, size_t len)
{
    size_t i;
    for (i = 0; o->name[i] != '\0' && i + 1 < len; i++)
        buf[i] = o->name[i] == '-' ? '_' : o->name[i];
    buf[i] = '\0';
}

static void upper_name(const char *prefix, const char *name, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s", prefix);
    size_t i;
    if (n < 0 || (size_t)n >= len)
        return;
    for (i = 0; name[i] != '\0' && (size_t)n + i + 1 < len; i++)
        buf[n + i] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
    buf[n + i] = '\0';
}

void dl_opt_env_name(const dl_opt_table_t *t, const dl_opt_t *o, char *buf, size_t len)
{
    upper_name(t->env_prefix, o->name, buf, len);
}

void dl_opt_pet_name(const dl_opt_t *o, char *buf, size_t len)
{
    upper_name("PET_", o->alias != NULL ? o->alias : o->name, buf, len);
}

const dl_opt_t *dl_opt_by_key(const dl_opt_table_t *t, const char *key)
{
    char buf[128];
    for (size_t i = 0; i < t->n; i++) {
        if (t->opts[i].flags & DL_OPT_CLI_ONLY)
            continue;
        dl_opt_key(&t->opts[i], buf, sizeof(buf));
        if (strcmp(buf, key) == 0)
            return &t->opts[i];
    }
    return NULL;
}

/* ---- Text in messages ----------------------------------------------------------------------- */

void dl_opt_escape(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return;
    for (; *s != '\0' && o + 5 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n')
            o += (size_t)snprintf(buf + o, len - o, "\\n");
        else if (c == '\t')
            o += (size_t)snprintf(buf + o, len - o, "\\t");
        else if (c == '\\')
            o += (size_t)snprintf(buf + o, len - o, "\\\\");
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = '\0';
}

/* ---- Numbers in messages -------------------------------------------------------------------- */

const char *dl_opt_num_text(double v, char *buf, size_t len)
{
    /* Within +-2^63 (exclusive above) a double converts to long long without overflow. */
    if (v >= -9223372036854775808.0 && v < 9223372036854775808.0 && v == (double)(long long)v)
        snprintf(buf, len, "%lld", (long long)v);
    else
        snprintf(buf, len, "%.6g", v);
    return buf;
}

/* ---- Shared types ------------------------------------------------------------------------- */

static int parse_whole(const dl_opt_t *o, const char *text, long *ret)
{
    long max = o->max >= (double)LONG_MAX ? LONG_MAX : (long)o->max;
    return dl_parse_int(text, (long)o->min, max, ret);
}

static int parse_int(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    long v;
    int r = parse_whole(o, text, &v);
    if (r == 0)
        *FIELD(o, obj, int) = (int)v;
    return r;
}

static int parse_uint(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    long v;
    int r = parse_whole(o, text, &v);
    if (r == 0)
        *FIELD(o, obj, unsigned) = (unsigned)v;
    return r;
}

static int parse_u64(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    long v;
    int r = parse_whole(o, text, &v);
    if (r == 0)
        *FIELD(o, obj, uint64_t) = (uint64_t)v;
    return r;
}

static int parse_size(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    long v;
    int r = parse_whole(o, text, &v);
    if (r == 0)
        *FIELD(o, obj, size_t) = (size_t)v;
    return r;
}

static int parse_double(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    double v;
    int r = dl_parse_double(text, o->min, o->max, &v);
    if (r == 0)
        *FIELD(o, obj, double) = v;
    return r;
}

static int parse_string(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    if (*text == '\0') {
        snprintf(why, whylen, "must not be empty");
        return -EINVAL;
    }
    char *copy = strdup(text);
    if (copy == NULL)
        return -ENOMEM;
    free(*FIELD(o, obj, char *));
    *FIELD(o, obj, char *) = copy;
    return 0;
}

static int parse_path(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    char *copy = NULL;
    if (*text != '\0' && (copy = strdup(text)) == NULL)
        return -ENOMEM;
    free(*FIELD(o, obj, char *));
    *FIELD(o, obj, char *) = copy;
    return 0;
}

static void release_string(const dl_opt_t *o, void *obj)
{
    free(*FIELD(o, obj, char *));
    *FIELD(o, obj, char *) = NULL;
}

int dl_opt_parse_bool(const char *s, bool *ret)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_bool(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    bool b;
    if (dl_opt_parse_bool(text, &b) < 0)
        return -EINVAL;
    *FIELD(o, obj, bool) = b;
    return 0;
}

static int parse_enum(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    size_t off = 0;
    for (int i = 0; o->choices[i] != NULL; i++) {
        if (strcmp(text, o->choices[i]) == 0) {
            *FIELD(o, obj, int) = i;
            return 0;
        }
    }
    off += (size_t)snprintf(why, whylen, "is not one of ");
    for (int i = 0; o->choices[i] != NULL && off < whylen; i++)
        off += (size_t)snprintf(why + off, whylen - off, "%s%s", i ? ", " : "", o->choices[i]);
    return -EINVAL;
}

const dl_opt_type_t dl_opt_int = {"a whole number", parse_int, NULL, true};
const dl_opt_type_t dl_opt_uint = {"a whole number", parse_uint, NULL, true};
const dl_opt_type_t dl_opt_u64 = {"a whole number", parse_u64, NULL, true};
const dl_opt_type_t dl_opt_size = {"a whole number", parse_size, NULL, true};
const dl_opt_type_t dl_opt_double = {"a number", parse_double, NULL, true};
const dl_opt_type_t dl_opt_string = {"a string", parse_string, release_string, false};
const dl_opt_type_t dl_opt_path = {"a path", parse_path, release_string, false};
const dl_opt_type_t dl_opt_bool = {"a boolean (" DL_OPT_BOOL_WORDS ")", parse_bool, NULL, true};
const dl_opt_type_t dl_opt_enum = {"one of the choices", parse_enum, NULL, false};

static int parse_text(const dl_opt_t *o, void *obj, const char *text, char *why, size_t whylen)
{
    if (*text == '\0' && o->min >= 1) {
        snprintf(why, whylen, "must not be empty");
        return -EINVAL;
    }
    *FIELD(o, obj, const char *) = text;
    return 0;
}
const dl_opt_type_t dl_opt_text = {"a text", parse_text, NULL, false};

static bool numeric(const dl_opt_type_t *t)
{
    return t == &dl_opt_int || t == &dl_opt_uint || t == &dl_opt_u64 || t == &dl_opt_size ||
           t == &dl_opt_double;
}

/* ---- Setting -------------------------------------------------------------------------------- */

int dl_opt_set(const dl_opt_t *o, void *obj, const char *raw, const char *where, char *err,
               size_t errlen)
{
    char why[256] = "", text[256];
    int r = o->type->parse(o, obj, raw, why, sizeof(why));

    if (r == 0) {
        if (o->flags & DL_OPT_MARKS)
            *(bool *)((char *)obj + o->mark) = true;
        return 0;
    }
    if (r == -ENOMEM) {
        snprintf(err, errlen, "%s: out of memory", where);
        return r;
    }
    /* The value and the reason quote user text: one line, whatever it holds. */
    dl_opt_escape(raw, text, sizeof(text));
    char reason[256];
    dl_opt_escape(why, reason, sizeof(reason));
    memcpy(why, reason, sizeof(why));
    /* "must not be empty" stands alone; "is not N or MIN:MAX" wants its subject, even ''. */
    if (why[0] != '\0' && *text == '\0' && strncmp(why, "is ", 3) != 0) {
        snprintf(err, errlen, "%s: %s", where, why);
    } else if (why[0] != '\0') {
        snprintf(err, errlen, "%s: '%s' %s", where, text, why);
    } else if (r == -ERANGE && numeric(o->type)) {
        char lo[32], hi[32];
        dl_opt_num_text(o->min, lo, sizeof(lo));
        dl_opt_num_text(o->max, hi, sizeof(hi));
        snprintf(err, errlen, "%s: '%s' is out of range (%s to %s)", where, text, lo, hi);
    } else {
        snprintf(err, errlen, "%s: '%s' is not %s", where, text, o->type->expect);
    }
    return r == -ERANGE ? -ERANGE : -EINVAL;
}

int dl_opt_defaults(const dl_opt_table_t *t, void *obj, char *err, size_t errlen)
{
    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        /* A default that would own memory stays out (the setting stays NULL and its user applies
         * the default): settings at their defaults hold nothing to free. */
        if (o->def == NULL || o->type->release != NULL)
            continue;
        /* A default is no choice of the user's: it leaves the mark alone. */
        char why[256] = "";
        int r = o->type->parse(o, obj, o->def, why, sizeof(why));
        if (r < 0) {
            snprintf(err, errlen, "the default of --%s, '%s', is bad: %s", o->name, o->def,
                     why[0] ? why : o->type->expect);
            return r;
        }
    }
    return 0;
}

void dl_opt_release(const dl_opt_table_t *t, void *obj)
{
    if (obj == NULL)
        return;
    for (size_t i = 0; i < t->n; i++)
        if (t->opts[i].type->release != NULL)
            t->opts[i].type->release(&t->opts[i], obj);
}

/* Whether any variable's name starts with prefix. */
static bool env_has_prefix(char *const *envp, const char *prefix)
{
    size_t n = strlen(prefix);
    for (; envp != NULL && *envp != NULL; envp++)
        if (strncmp(*envp, prefix, n) == 0)
            return true;
    return false;
}

int dl_opt_from_env(const dl_opt_table_t *t, void *obj, char *const *envp, char *err, size_t errlen)
{
    char name[160];

    for (int pass = 0; pass < 2; pass++) {
        /* Every name of a pass has its prefix: without a variable that starts so, the pass
         * would look up each option's name in vain (a table's worth of scans at every start). */
        if (!env_has_prefix(envp, pass == 0 ? "PET_" : t->env_prefix))
            continue;
        for (size_t i = 0; i < t->n; i++) {
            const dl_opt_t *o = &t->opts[i];
            if (o->flags & DL_OPT_CLI_ONLY)
                continue;
            if (pass == 0 && !(o->flags & DL_OPT_PET))
                continue;
            if (pass == 0)
                dl_opt_pet_name(o, name, sizeof(name));
            else
                dl_opt_env_name(t, o, name, sizeof(name));
            const char *v = dl_env_get(envp, name);
            if (v == NULL || (*v == '\0' && t->empty_is_unset))
                continue;
            int r = dl_opt_set(o, obj, v, name, err, errlen);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

/* ---- Typos -------------------------------------------------------------------------------- */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[128];

    if (la >= 127 || lb >= 127)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost =
                tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]) ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const dl_opt_t *dl_opt_closest(const dl_opt_table_t *t, const char *word, bool as_key)
{
    const dl_opt_t *best = NULL;
    size_t best_d = SIZE_MAX;
    char buf[128];

    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        if (as_key && (o->flags & DL_OPT_CLI_ONLY))
            continue;
        for (int which = 0; which < 2; which++) {
            const char *cand = which == 0 ? o->name : o->alias;
            if (cand == NULL)
                continue;
            snprintf(buf, sizeof(buf), "%s", cand);
            for (char *p = buf; *p != '\0'; p++)
                if (as_key && *p == '-')
                    *p = '_';
            size_t d = edit_distance(word, buf);
            /* A prefix counts as close too: --max-restart for --max-restarts. */
            if (strncmp(buf, word, strlen(word)) == 0 && strlen(word) >= 3)
                d = d < 2 ? d : 2;
            if (d < best_d) {
                best_d = d;
                best = o;
            }
        }
    }
    /* Close enough to be a typo: about a third of the word may be wrong. */
    size_t allowed = strlen(word) / 3 + 1;
    return best_d <= allowed ? best : NULL;
}

static bool known_other(const dl_opt_table_t *t, const char *var, size_t len)
{
    for (const char *const *k = t->other_vars; k != NULL && *k != NULL; k++) {
        size_t kl = strlen(*k);
        if (kl > 0 && (*k)[kl - 1] == '*') {
            if (len >= kl - 1 && strncmp(var, *k, kl - 1) == 0)
                return true;
        } else if (kl == len && strncmp(var, *k, len) == 0) {
            return true;
        }
    }
    return false;
}

void dl_opt_unknown_vars(const dl_opt_table_t *t, char *const *envp,
                         void (*warn)(void *ctx, const char *var, const char *closest), void *ctx)
{
    size_t plen = strlen(t->env_prefix);
    char var[160], name[160], key[128];

    for (; envp != NULL && *envp != NULL; envp++) {
        const char *eq = strchr(*envp, '=');
        size_t len = eq != NULL ? (size_t)(eq - *envp) : strlen(*envp);
        if (len <= plen || len >= sizeof(var) || strncmp(*envp, t->env_prefix, plen) != 0)
            continue;
        if (known_other(t, *envp, len))
            continue;
        memcpy(var, *envp, len);
        var[len] = '\0';
        bool found = false;
        for (size_t i = 0; i < t->n && !found; i++) {
            if (t->opts[i].flags & DL_OPT_CLI_ONLY)
                continue;
            dl_opt_env_name(t, &t->opts[i], name, sizeof(name));
            found = strcmp(name, var) == 0;
        }
        if (found)
            continue;
        /* Suggest by the key the variable spells: DLAUNCH_MAX_RESTART -> max_restart. */
        size_t k;
        for (k = 0; var[plen + k] != '\0' && k + 1 < sizeof(key); k++)
            key[k] = (char)tolower((unsigned char)var[plen + k]);
        key[k] = '\0';
        const dl_opt_t *c = dl_opt_closest(t, key, true);
        if (c != NULL)
            dl_opt_env_name(t, c, name, sizeof(name));
        warn(ctx, var, c != NULL ? name : NULL);
    }
}

/* ---- Help ---------------------------------------------------------------------------------- */

void dl_opt_print_item(void *stream, const char *lhs, const char *help)
{
    FILE *f = stream;
    const size_t width = 80 - 33;
    bool first = true;
    /* A left side too wide for its column has the help start on the next line. */
    if (strlen(lhs) > 30) {
        fprintf(f, "  %s\n", lhs);
        first = false;
    }
    do {
        size_t take = strlen(help);
        if (take > width) {
            take = width;
            while (take > 0 && help[take] != ' ')
                take--;
            if (take == 0)
                take = width;
        }
        fprintf(f, "  %-30s %.*s\n", first ? lhs : "", (int)take, help);
        first = false;
        help += take;
        while (*help == ' ')
            help++;
    } while (*help != '\0');
}

void dl_opt_print_help(const dl_opt_table_t *t, void *stream)
{
    FILE *f = stream;
    char lhs[128], env[160], pet[160];

    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        if (o->flags & DL_OPT_HIDDEN)
            continue;
        int n = 0;
        if (o->short_name != 0)
            n = snprintf(lhs, sizeof(lhs), "-%c, ", o->short_name);
        n += snprintf(lhs + n, sizeof(lhs) - (size_t)n, "--%s", o->name);
        if (o->metavar != NULL)
            snprintf(lhs + n, sizeof(lhs) - (size_t)n, " %s", o->metavar);
        dl_opt_print_item(f, lhs, o->help);
        if (o->flags & DL_OPT_CLI_ONLY)
            continue;
        dl_opt_env_name(t, o, env, sizeof(env));
        fprintf(f, "  %-30s   ", "");
        if (o->alias != NULL)
            fprintf(f, "alias --%s; ", o->alias);
        fprintf(f, "env %s", env);
        if (o->flags & DL_OPT_PET) {
            dl_opt_pet_name(o, pet, sizeof(pet));
            fprintf(f, " or %s", pet);
        }
        fprintf(f, "\n");
    }
}
