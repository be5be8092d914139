/* The bundled trainer as the workers' command (see train-command.c). */
#ifndef DL_TRAIN_COMMAND_H
#define DL_TRAIN_COMMAND_H

#include <stddef.h>

#include "config.h"

/* With a train: section: checks every setting (errors name file:line:column) and, when the
 * spec has no command, makes the command `dlaunch-train --set KEY=VALUE...`. Returns 0 or
 * -errno with one line in err. */
int dl_train_command(dl_job_spec_t *spec, char *err, size_t errlen);

#endif
