/* Text generated from the option table for the man pages (scdoc source) and the shell
 * completion, so that neither can disagree with --help. Reads only each option's names,
 * metavar and help. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* scdoc reads '*' and '_' as bold and underline, and '\' as an escape. */
static void scd_escaped(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '*' || *s == '_' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

void dl_config_print_man(void *stream, dl_config_man_t what)
{
    FILE *f = stream;
    char name[64];

    for (size_t i = 0; i < dl__options_count; i++) {
        const dl_opt_t *o = &dl__options[i];
        if (what == DL_CONFIG_MAN_FLAGS) {
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
                dl_opt_env_name(&dl__job_table, o, name, sizeof(name));
                fprintf(f, " Variable *");
                scd_escaped(f, name);
                fprintf(f, "*; YAML key *");
                dl_opt_key(o, name, sizeof(name));
                scd_escaped(f, name);
                fprintf(f, "*.");
            }
            fprintf(f, "\n\n");
        } else if (what == DL_CONFIG_MAN_KEYS) {
            if ((o->flags & DL_OPT_CLI_ONLY))
                continue;
            dl_opt_key(o, name, sizeof(name));
            fprintf(f, "*");
            scd_escaped(f, name);
            fprintf(f, "*: _");
            scd_escaped(f, o->metavar != NULL ? o->metavar : "true|false");
            fprintf(f, "_\n\t");
            scd_escaped(f, o->help);
            fprintf(f, ". Flag *--");
            scd_escaped(f, o->name);
            dl_opt_env_name(&dl__job_table, o, name, sizeof(name));
            fprintf(f, "*, variable *");
            scd_escaped(f, name);
            fprintf(f, "*.\n\n");
        } else {
            /* Completion words: every flag, and apart those that take a value. */
            bool valued = what == DL_CONFIG_MAN_VALUE_FLAGS;
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
