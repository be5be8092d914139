/* A command line read against an option table: the parser of the commands whose options are
 * all flags (dlaunchd, the control commands). The launcher's own (config/cli.c) adds torchrun's
 * ways on top: prefixes, the script that ends the options, the job spec. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "opt.h"

static bool is_option(const char *w)
{
    return w[0] == '-' && w[1] != '\0' && !(w[1] >= '0' && w[1] <= '9');
}

static int unknown(const dl_opt_table_t *t, const dl_opt_argv_t *a, const char *word, size_t len,
                   char *err, size_t errlen)
{
    char raw[256], shown[256], name[128];
    snprintf(raw, sizeof(raw), "%.*s", (int)len, word);
    dl_opt_escape(raw, shown, sizeof(shown));
    snprintf(name, sizeof(name), "%s", raw + (raw[1] == '-' ? 2 : 1));
    const dl_opt_t *c = name[0] != '\0' ? dl_opt_closest(t, name, false) : NULL;
    if (c != NULL)
        snprintf(err, errlen, "unknown option '%s' (did you mean --%s? see %s --help)", shown,
                 c->name, a->prog);
    else
        snprintf(err, errlen, "unknown option '%s' (see %s --help)", shown, a->prog);
    return -EINVAL;
}

static int argument(dl_opt_argv_t *a, const char *word, char *err, size_t errlen)
{
    char shown[256];
    if (a->nargs >= a->max_args) {
        dl_opt_escape(word, shown, sizeof(shown));
        if (a->max_args == 0)
            snprintf(err, errlen, "unknown argument '%s' (%s takes options only; see --help)",
                     shown, a->prog);
        else
            snprintf(err, errlen,
                     "too many arguments: %s takes at most %zu, and '%s' is one "
                     "more",
                     a->prog, a->max_args, shown);
        return -EINVAL;
    }
    a->args[a->nargs++] = word;
    return 0;
}

int dl_opt_parse_argv(const dl_opt_table_t *t, void *obj, int argc, char **argv, dl_opt_argv_t *a,
                      char *err, size_t errlen)
{
    char where[140];

    a->nargs = 0;
    a->stopped_at = NULL;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i], *value = NULL, *eq = NULL;
        const dl_opt_t *o;
        if (!is_option(w)) {
            if (argument(a, w, err, errlen) < 0)
                return -EINVAL;
            continue;
        }
        if (w[1] == '-') {
            eq = strchr(w, '=');
            size_t len = eq != NULL ? (size_t)(eq - w) : strlen(w);
            o = len > 2 ? dl_opt_by_flag(t, w + 2, len - 2) : NULL;
            if (o == NULL)
                return unknown(t, a, w, len, err, errlen);
            if (eq != NULL)
                value = eq + 1;
            snprintf(where, sizeof(where), "--%s", o->name);
        } else {
            o = w[2] == '\0' ? dl_opt_by_short(t, w[1]) : NULL;
            if (o == NULL)
                return unknown(t, a, w, strlen(w), err, errlen);
            snprintf(where, sizeof(where), "-%c", o->short_name);
        }
        if (o->flags & DL_OPT_FLAG) {
            if (value != NULL) {
                snprintf(err, errlen, "option '%s' takes no value", where);
                return -EINVAL;
            }
            value = "true";
        } else if (value == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '%s' needs a value (%s)", where,
                         o->metavar != NULL ? o->metavar : o->type->expect);
                return -EINVAL;
            }
            value = argv[++i];
        }
        int r = dl_opt_set(o, obj, value, where, err, errlen);
        if (r < 0)
            return r;
        if (o->flags & DL_OPT_STOP) {
            a->stopped_at = o;
            return 0;
        }
    }
    return 0;
}
