/* Text generated from an option table for the man pages (scdoc source) and the shell
 * completion, so that neither can disagree with --help. Reads only each option's names,
 * metavar, default and help; an option left out of --help (DL_OPT_HIDDEN) is left out here. */
#include <stdio.h>
#include <string.h>

#include "opt.h"

/* scdoc reads '*' and '_' as bold and underline, and '\' as an escape. */
static void scd_escaped(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '*' || *s == '_' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

static void man_flag(const dl_opt_table_t *t, const dl_opt_t *o, FILE *f)
{
    char name[160];
    if (o->short_name != 0)
        fprintf(f, "*-%c*, ", o->short_name);
    fprintf(f, "*--");
    scd_escaped(f, o->name);
    fprintf(f, "*");
    if (o->metavar != NULL) {
        fprintf(f, " _");
        scd_escaped(f, o->metavar);
        fprintf(f, "_");
    }
    fprintf(f, "\n\t");
    scd_escaped(f, o->help);
    fprintf(f, ".");
    if (o->alias != NULL) {
        fprintf(f, " Also *--");
        scd_escaped(f, o->alias);
        fprintf(f, "*.");
    }
    if (!(o->flags & DL_OPT_CLI_ONLY)) {
        dl_opt_env_name(t, o, name, sizeof(name));
        fprintf(f, " Variable *");
        scd_escaped(f, name);
        fprintf(f, "*; YAML key *");
        dl_opt_key(o, name, sizeof(name));
        scd_escaped(f, name);
        fprintf(f, "*.");
    }
    fprintf(f, "\n\n");
}

static void man_key(const dl_opt_table_t *t, const dl_opt_t *o, FILE *f)
{
    char name[160];
    if ((o->flags & DL_OPT_CLI_ONLY))
        return;
    dl_opt_key(o, name, sizeof(name));
    fprintf(f, "*");
    scd_escaped(f, name);
    fprintf(f, "*: _");
    scd_escaped(f, o->metavar != NULL ? o->metavar : "true|false");
    fprintf(f, "_\n\t");
    scd_escaped(f, o->help);
    fprintf(f, ". Flag *--");
    scd_escaped(f, o->name);
    dl_opt_env_name(t, o, name, sizeof(name));
    fprintf(f, "*, variable *");
    scd_escaped(f, name);
    fprintf(f, "*.\n\n");
}

static void man_setting(const dl_opt_t *o, FILE *f)
{
    fprintf(f, "*");
    scd_escaped(f, o->name);
    fprintf(f, "*");
    if (o->def != NULL && o->def[0] != '\0') {
        fprintf(f, " (default _");
        scd_escaped(f, o->def);
        fprintf(f, "_)");
    }
    fprintf(f, "\n\t");
    scd_escaped(f, o->help);
    fprintf(f, ".\n\n");
}

void dl_opt_print_man(const dl_opt_table_t *t, void *stream, dl_opt_man_t what)
{
    FILE *f = stream;

    for (size_t i = 0; i < t->n; i++) {
        const dl_opt_t *o = &t->opts[i];
        if (o->flags & DL_OPT_HIDDEN)
            continue;
        if (what == DL_OPT_MAN_FLAGS) {
            man_flag(t, o, f);
        } else if (what == DL_OPT_MAN_KEYS) {
            man_key(t, o, f);
        } else if (what == DL_OPT_MAN_SETTINGS) {
            man_setting(o, f);
        } else if (what == DL_OPT_MAN_NAMES) {
            fprintf(f, "%s ", o->name);
        } else {
            /* Completion words: every flag, and apart those that take a value. */
            bool valued = what == DL_OPT_MAN_VALUE_FLAGS;
            if (valued && o->metavar == NULL)
                continue;
            fprintf(f, "--%s ", o->name);
            if (o->alias != NULL)
                fprintf(f, "--%s ", o->alias);
            if (!valued && o->short_name != 0)
                fprintf(f, "-%c ", o->short_name);
        }
    }
}
