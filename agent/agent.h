/* The node agent: starts this node's workers, shows and files their output, forwards signals,
 * restarts the job when a worker fails, and reports every state change. */
#ifndef DL_AGENT_H
#define DL_AGENT_H

#include "config.h"

/* Runs the job on this node until it ends. environ_list is the agent's environment (passed to
 * workers). Returns the process exit code (0, 1, 2, 3, 4 or 128+signal; see docs/exit-codes.md).
 * Messages go to stderr with a role prefix; worker output to stdout/stderr with rank prefixes. */
int dl_agent_run(const dl_job_spec_t *spec, char **environ_list);

#endif
