/* mangen: fills a man page (scdoc source) or the shell completion from the option tables, at
 * build time. The text around is written by hand; every @NAME@ in it becomes what the tables say:
 *
 *   mangen TEMPLATE OUTPUT
 *
 *   @DLAUNCH_FLAGS@        dlaunch's options (scdoc)        @DLAUNCH_WORDS@   its flags
 *   @JOBSPEC_KEYS@         the job spec's YAML keys (scdoc)  @DLAUNCH_VALUE_FLAGS@
 *   @DLAUNCHD_OPTIONS@     dlaunchd's options (scdoc)       @DLAUNCHD_WORDS@  @DLAUNCHD_VALUE_FLAGS@
 *   @TRAIN_SETTINGS@       the trainer's settings (scdoc)   @TRAIN_KEYS@      their keys
 *   @DLAUNCH_COMMANDS@     the control commands with their options (scdoc)
 *   @DLAUNCH_COMMAND_SYNOPSIS@  a synopsis line for each (scdoc)
 *   @DLAUNCH_COMMAND_NAMES@     their names          @DLAUNCH_COMMAND_CASES@  their completion
 *   @VERSION@ */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ctl.h"
#include "opt.h"
#include "options.h"
#include "trainer.h"

/* scdoc reads '*' and '_' as bold and underline, and '\\' as an escape. */
static void scd_escaped(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '*' || *s == '_' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

/* The control commands: a synopsis line each, or each with its help and then its options. */
static void commands(FILE *f, bool synopsis)
{
    size_t n;
    const dl_ctl_command_t *c = dl_ctl_commands(&n);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, synopsis ? "*dlaunch* *%s* [_OPTIONS_] " : "## dlaunch %s [OPTIONS] ",
                c[i].name);
        scd_escaped(f, c[i].usage);
        fprintf(f, "\n\n");
        if (synopsis)
            continue;
        scd_escaped(f, c[i].help);
        fprintf(f, ".\n\n");
        dl_opt_print_man(&c[i].options, f, DL_OPT_MAN_FLAGS);
    }
}

/* The completion: the commands' names, and a case of the shell's `case` for each. */
static void command_names(FILE *f)
{
    size_t n;
    const dl_ctl_command_t *c = dl_ctl_commands(&n);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? " " : "", c[i].name);
}

static void command_cases(FILE *f)
{
    size_t n;
    const dl_ctl_command_t *c = dl_ctl_commands(&n);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "    %s)\n        _dlaunch_command \"", c[i].name);
        dl_opt_print_man(&c[i].options, f, DL_OPT_MAN_WORDS);
        fprintf(f, "\" \"");
        dl_opt_print_man(&c[i].options, f, DL_OPT_MAN_VALUE_FLAGS);
        fprintf(f, "\"\n        return\n        ;;\n");
    }
}

static int expand(FILE *f, const char *name)
{
    static const struct {
        const char *name;
        dl_opt_man_t what;
        int table; /* 0 dlaunch, 1 dlaunchd, 2 the trainer */
    } lists[] = {
        {"DLAUNCH_FLAGS", DL_OPT_MAN_FLAGS, 0},       {"JOBSPEC_KEYS", DL_OPT_MAN_KEYS, 0},
        {"DLAUNCH_WORDS", DL_OPT_MAN_WORDS, 0},       {"DLAUNCH_VALUE_FLAGS", DL_OPT_MAN_VALUE_FLAGS, 0},
        {"DLAUNCHD_OPTIONS", DL_OPT_MAN_FLAGS, 1},    {"DLAUNCHD_WORDS", DL_OPT_MAN_WORDS, 1},
        {"DLAUNCHD_VALUE_FLAGS", DL_OPT_MAN_VALUE_FLAGS, 1},
        {"TRAIN_SETTINGS", DL_OPT_MAN_SETTINGS, 2},   {"TRAIN_KEYS", DL_OPT_MAN_NAMES, 2},
    };
    const dl_opt_table_t *tables[] = {dl_config_options(), &dl_daemon_options, &dl_train_settings};

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        if (strcmp(name, lists[i].name) == 0) {
            dl_opt_print_man(tables[lists[i].table], f, lists[i].what);
            return 0;
        }
    }
    if (strcmp(name, "DLAUNCH_COMMAND_CASES") == 0)
        command_cases(f);
    else if (strcmp(name, "DLAUNCH_COMMAND_NAMES") == 0)
        command_names(f);
    else if (strcmp(name, "DLAUNCH_COMMANDS") == 0)
        commands(f, false);
    else if (strcmp(name, "DLAUNCH_COMMAND_SYNOPSIS") == 0)
        commands(f, true);
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
