/* dlaunch's control subcommands (status, stop, restart, events, kv, token, revoke, help): one
 * table of {name, handler, options, help}, read by the option engine (config/opt.h). */
#ifndef DL_CTL_H
#define DL_CTL_H

#include <stdbool.h>
#include <stddef.h>

#include "opt.h"

/* The most arguments a command takes after its name (kv wait's keys); one more is an error. */
#define DL_CTL_MAX_ARGS 64

/* A command's settings, read from its options (cmd/ctl.c). */
struct dl_ctl_opts_s;

typedef struct {
    const char *name;
    /* Runs the command with its options read; returns the exit code. */
    int (*handler)(const char *name, const struct dl_ctl_opts_s *opts);
    dl_opt_table_t options;
    const char *usage; /* what follows the options: "RUN_ID" */
    const char *help;  /* one line */
} dl_ctl_command_t;

/* The table, for the man page and the completion. */
const dl_ctl_command_t *dl_ctl_commands(size_t *ret_n);

/* Whether argv[1] names a subcommand rather than a job spec. */
bool dl_ctl_is_command(const char *word);

/* Runs the subcommand argv[1]; returns the exit code. */
int dl_ctl_main(int argc, char **argv);

/* The commands with their usage and help, for dlaunch --help and dlaunch help. */
void dl_ctl_print_commands(void *stream);

#endif
