/* dlaunch: the command users type. Parses the job spec and hands it to the node agent. */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "config.h"
#include "ctl.h"

extern char **environ;

int main(int argc, char **argv)
{
    dl_job_spec_t spec;
    dl_config_action_t action;
    char err[DL_CONFIG_ERRLEN];
    int code;

    if (argc > 1 && dl_ctl_is_command(argv[1]))
        return dl_ctl_main(argc, argv);
    dl_job_spec_init(&spec);
    if (dl_config_load(&spec, argc, argv, environ, &action, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        dl_job_spec_free(&spec);
        return 2;
    }
    switch (action) {
    case DL_CONFIG_HELP:
        dl_config_print_help(stdout, "dlaunch");
        code = 0;
        break;
    case DL_CONFIG_VERSION:
        printf("dlaunch %s\n", DL_VERSION);
        code = 0;
        break;
    default:
        fflush(stdout);
        code = dl_agent_run(&spec, environ);
        break;
    }
    dl_job_spec_free(&spec);
    return code;
}
