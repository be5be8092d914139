/* The bundled trainer as the workers' command (see train-command.c). */
#ifndef DL_TRAIN_COMMAND_H
#define DL_TRAIN_COMMAND_H

#include <stddef.h>

#include "config.h"

/* With a train: section: checks every setting, the DLAUNCH_TRAIN_* variables of environ_list
 * included (errors name file:line:column or the variable; unknown variables are warned about on
 * stderr) and, when the spec has no command, makes the command `dlaunch-train --set KEY=VALUE...`.
 * Without one, when the command is dlaunch-train itself: checks the DLAUNCH_TRAIN_* variables.
 * Returns 0 or -errno with one line in err. */
int dl_train_command(dl_job_spec_t *spec, char **environ_list, char *err, size_t errlen);

#endif
