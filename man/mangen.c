/* mangen: fills a man page (scdoc source) or the shell completion from the option tables, at
 * build time. The text around is written by hand; every @NAME@ in it becomes what the tables say:
 *
 *   mangen TEMPLATE OUTPUT
 *
 *   @DLAUNCH_FLAGS@        dlaunch's options (scdoc)        @DLAUNCH_WORDS@   its flags
 *   @JOBSPEC_KEYS@         the job spec's YAML keys (scdoc)  @DLAUNCH_VALUE_FLAGS@
 *   @DLAUNCHD_OPTIONS@     dlaunchd's options (scdoc)       @DLAUNCHD_WORDS@  @DLAUNCHD_VALUE_FLAGS@
 *   @TRAIN_SETTINGS@       the trainer's settings (scdoc)   @TRAIN_KEYS@      their keys
 *   @VERSION@ */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "options.h"
#include "trainer.h"

static void scd_escaped(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '*' || *s == '_' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

static void daemon_options(FILE *f, int mode)
{
    for (size_t i = 0; i < dl_daemon_options_count; i++) {
        const dl_daemon_option_t *o = &dl_daemon_options[i];
        if (mode == 1) {
            fprintf(f, "--%s ", o->name);
            if (o->short_name != 0)
                fprintf(f, "-%c ", o->short_name);
            continue;
        }
        if (mode == 2) {
            if (o->metavar != NULL)
                fprintf(f, "--%s ", o->name);
            continue;
        }
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
        fprintf(f, ".\n\n");
    }
}

static void train_settings(FILE *f, bool words)
{
    for (size_t i = 0; i < dl_train_settings.n; i++) {
        const dl_opt_t *o = &dl_train_settings.opts[i];
        const char *key = o->name, *def = o->def != NULL ? o->def : "", *help = o->help;
        if (words) {
            fprintf(f, "%s ", key);
            continue;
        }
        fprintf(f, "*");
        scd_escaped(f, key);
        fprintf(f, "*");
        if (def[0] != '\0') {
            fprintf(f, " (default _");
            scd_escaped(f, def);
            fprintf(f, "_)");
        }
        fprintf(f, "\n\t");
        scd_escaped(f, help);
        fprintf(f, ".\n\n");
    }
}

static int expand(FILE *f, const char *name)
{
    if (strcmp(name, "DLAUNCH_FLAGS") == 0)
        dl_config_print_man(f, DL_CONFIG_MAN_FLAGS);
    else if (strcmp(name, "JOBSPEC_KEYS") == 0)
        dl_config_print_man(f, DL_CONFIG_MAN_KEYS);
    else if (strcmp(name, "DLAUNCH_WORDS") == 0)
        dl_config_print_man(f, DL_CONFIG_MAN_WORDS);
    else if (strcmp(name, "DLAUNCH_VALUE_FLAGS") == 0)
        dl_config_print_man(f, DL_CONFIG_MAN_VALUE_FLAGS);
    else if (strcmp(name, "DLAUNCHD_OPTIONS") == 0)
        daemon_options(f, 0);
    else if (strcmp(name, "DLAUNCHD_WORDS") == 0)
        daemon_options(f, 1);
    else if (strcmp(name, "DLAUNCHD_VALUE_FLAGS") == 0)
        daemon_options(f, 2);
    else if (strcmp(name, "TRAIN_SETTINGS") == 0)
        train_settings(f, false);
    else if (strcmp(name, "TRAIN_KEYS") == 0)
        train_settings(f, true);
    else if (strcmp(name, "VERSION") == 0)
        fputs(DL_VERSION, f);
    else
        return -EINVAL;
    return 0;
}

int main(int argc, char **argv)
{
    char line[4096];
    int lineno = 0, r = 0;

    if (argc != 3) {
        fprintf(stderr, "usage: mangen TEMPLATE OUTPUT\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "r");
    if (in == NULL) {
        fprintf(stderr, "mangen: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    FILE *out = fopen(argv[2], "w");
    if (out == NULL) {
        fprintf(stderr, "mangen: %s: %s\n", argv[2], strerror(errno));
        fclose(in);
        return 1;
    }
    while (r == 0 && fgets(line, sizeof(line), in) != NULL) {
        lineno++;
        for (char *p = line; *p != '\0';) {
            char *at = strchr(p, '@'), *end = at ? strchr(at + 1, '@') : NULL;
            if (at == NULL || end == NULL || end == at + 1 ||
                strspn(at + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") != (size_t)(end - at - 1)) {
                /* Not a placeholder: copy up to and including this '@' (or the rest). */
                size_t n = at ? (size_t)(at - p) + 1 : strlen(p);
                fwrite(p, 1, n, out);
                p += n;
                continue;
            }
            fwrite(p, 1, (size_t)(at - p), out);
            *end = '\0';
            if (expand(out, at + 1) < 0) {
                fprintf(stderr, "mangen: %s:%d: unknown placeholder '@%s@'\n", argv[1], lineno,
                        at + 1);
                r = 1;
                break;
            }
            p = end + 1;
        }
    }
    fclose(in);
    if (fclose(out) != 0 && r == 0) {
        fprintf(stderr, "mangen: %s: %s\n", argv[2], strerror(errno));
        r = 1;
    }
    if (r != 0)
        remove(argv[2]);
    return r;
}
