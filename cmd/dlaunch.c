/* dlaunch: the command users type. Parses the job spec and hands it to the node agent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "config.h"
#include "ctl.h"
#include "kube-launch.h"
#include "slurm-launch.h"
#include "train-command.h"

extern char **environ;

/* Under Slurm: fill the spec from the job (in a step) or start one agent per node through srun
 * (in an allocation). Returns 0 to go on, -1 when all is done (a dry run printed srun's line),
 * or an exit code. */
static int with_slurm(dl_job_spec_t *spec, int argc, char **argv)
{
    dl_slurm_env_t se;
    char err[DL_CONFIG_ERRLEN];
    int r;

    if (getenv("DLAUNCH_NO_SLURM") != NULL && *getenv("DLAUNCH_NO_SLURM") != '\0')
        return 0;
    if (dl_slurm_env_parse(environ, &se, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return 2;
    }
    r = 0;
    if (se.in_allocation && !se.in_step) {
        r = dl_slurm_self_launch(spec, &se, argc, argv, err, sizeof(err));
        if (r == 0) { /* only a dry run comes back */
            dl_slurm_env_free(&se);
            return -1;
        }
    } else if (se.in_step) {
        r = dl_slurm_apply(spec, &se, err, sizeof(err));
    }
    dl_slurm_env_free(&se);
    if (r < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return 2;
    }
    return 0;
}

/* In a pod of a Kubernetes operator: fill the spec from its variables. Returns 0 to go on, or an
 * exit code. */
static int with_kubernetes(dl_job_spec_t *spec)
{
    const char *off = getenv("DLAUNCH_NO_KUBERNETES");
    char host[256], err[DL_CONFIG_ERRLEN];
    dl_kube_env_t ke;

    if ((off != NULL && *off != '\0') || getenv("SLURM_STEP_ID") != NULL)
        return 0;
    if (gethostname(host, sizeof(host)) < 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    bool flags_say_all = spec->nodes_set && spec->node_rank >= 0 && spec->rdzv_endpoint != NULL;
    int r = dl_kube_env_parse(environ, host, &ke, err, sizeof(err));
    /* The flags win: an environment this cannot read needs no reading when they say it all. */
    if (r < 0 && flags_say_all)
        return 0;
    if (r < 0 || dl_kube_apply(spec, &ke, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunch: %s\n", err);
        return 2;
    }
    if (ke.kind == DL_KUBE_NONE)
        return 0;
    if ((spec->dry_run || spec->verbose) && !spec->quiet)
        printf("in a pod of a %s (from %s): node rank %d of %d%s, rendezvous %s, run id %s\n",
               ke.name, ke.from, spec->node_rank, spec->nodes_max,
               spec->nodes_min != spec->nodes_max ? " at most" : "",
               spec->rdzv_endpoint != NULL ? spec->rdzv_endpoint : "(none)", spec->run_id);
    /* The kubelet sends SIGTERM, then SIGKILL after the grace period: the workers' stop must
     * end before, with a moment left for the agent to report. */
    if (spec->stop_timeout + 2 > DL_KUBE_GRACE_S && !spec->quiet)
        fprintf(stderr,
                "dlaunch: warning: --stop-timeout %g s does not fit a pod's default "
                "termination grace period (%d s): give the pod a "
                "terminationGracePeriodSeconds above it (docs/kubernetes.md)\n",
                spec->stop_timeout, DL_KUBE_GRACE_S);
    return 0;
}

static void warn_unknown_var(void *ctx, const char *var, const char *closest)
{
    (void)ctx;
    fprintf(stderr, "dlaunch: warning: %s is no dlaunch setting%s%s%s; it is ignored\n", var,
            closest ? " (did you mean " : "", closest ? closest : "", closest ? "?)" : "");
}

/* torchrun's flags that dlaunch takes without acting on them: said once, at start. */
static void warn_ignored(const dl_job_spec_t *spec)
{
    if (spec->quiet)
        return;
    if (spec->logs_specs != NULL)
        fprintf(stderr,
                "dlaunch: warning: --logs-specs %s is ignored: dlaunch keeps every rank's "
                "output in --log-dir (see -r/--redirects, -t/--tee)\n",
                spec->logs_specs);
    if (spec->event_log_handler != NULL && strcmp(spec->event_log_handler, "null") != 0)
        fprintf(stderr,
                "dlaunch: warning: --event-log-handler %s is ignored: see --events for "
                "dlaunch's event stream\n",
                spec->event_log_handler);
}

int main(int argc, char **argv)
{
    dl_job_spec_t spec;
    dl_config_action_t action;
    char err[DL_CONFIG_ERRLEN];
    int code;

    if (argc > 1 && dl_ctl_is_command(argv[1]))
        return dl_ctl_main(argc, argv);
    dl_job_spec_init(&spec);
    dl_config_unknown_vars(environ, warn_unknown_var, NULL);
    if (dl_config_load(&spec, argc, argv, environ, &action, err, sizeof(err)) < 0 ||
        (action == DL_CONFIG_RUN && dl_train_command(&spec, environ, err, sizeof(err)) < 0)) {
        fprintf(stderr, "dlaunch: %s\n", err);
        dl_job_spec_free(&spec);
        return 2;
    }
    switch (action) {
    case DL_CONFIG_HELP:
        dl_config_print_help(stdout, "dlaunch");
        printf("\n");
        dl_ctl_print_commands(stdout);
        code = 0;
        break;
    case DL_CONFIG_VERSION:
        printf("dlaunch %s\n", DL_VERSION);
        code = 0;
        break;
    default:
        warn_ignored(&spec);
        code = with_slurm(&spec, argc, argv);
        if (code == 0)
            code = with_kubernetes(&spec);
        if (code != 0) {
            code = code < 0 ? 0 : code;
            break;
        }
        fflush(stdout);
        code = dl_agent_run(&spec, environ);
        break;
    }
    dl_job_spec_free(&spec);
    return code;
}
