/* dlaunch's control subcommands (status, stop, restart, kv). */
#ifndef DL_CTL_H
#define DL_CTL_H

#include <stdbool.h>

/* Whether argv[1] names a subcommand rather than a job spec. */
bool dl_ctl_is_command(const char *word);

/* Runs the subcommand argv[1]; returns the exit code. */
int dl_ctl_main(int argc, char **argv);

#endif
