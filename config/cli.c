/* The command line: dlaunch's flags and torchrun's, a job spec or a script, and what follows.
 *
 *   dlaunch [OPTIONS] JOB.yaml [OPTIONS]
 *   dlaunch [OPTIONS] SCRIPT [SCRIPT ARGS...]     (as torchrun: python3 -u SCRIPT ARGS)
 *   dlaunch [OPTIONS] -- COMMAND [ARGS...]
 *
 * Precedence: flag > environment (DLAUNCH_*, then torchrun's PET_*) > YAML > default.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    const dl_opt_t *opt;
    const char *value;
    char where[80];
} pending_flag_t;

static bool is_yaml(const char *path)
{
    size_t n = strlen(path);
    return (n > 5 && strcmp(path + n - 5, ".yaml") == 0) ||
           (n > 4 && strcmp(path + n - 4, ".yml") == 0);
}

static int copy_argv(char ***ret, size_t *ret_len, char *const *head, size_t nhead,
                     char *const *tail, size_t ntail, char *err, size_t errlen)
{
    char **v = calloc(nhead + ntail + 1, sizeof(char *));
    size_t k = 0;
    if (v == NULL)
        goto nomem;
    for (size_t i = 0; i < nhead + ntail; i++) {
        v[k] = strdup(i < nhead ? head[i] : tail[i - nhead]);
        if (v[k++] == NULL) {
            dl__strv_free(v);
            goto nomem;
        }
    }
    dl__strv_free(*ret);
    *ret = v;
    *ret_len = k;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
}

/* torchrun runs a script as `python -u SCRIPT ARGS`, a module as `python -u -m MODULE ARGS`, and
 * with --no-python the script itself. */
static int script_command(dl_job_spec_t *spec, char **environ_list, char *const *script, size_t n,
                          char *err, size_t errlen)
{
    if (spec->module && spec->no_python && !spec->run_path) {
        snprintf(err, errlen,
                 "--no-python and -m/--module do not go together: a module needs "
                 "the Python interpreter");
        return -EINVAL;
    }
    if (spec->no_python && !spec->run_path)
        return copy_argv(&spec->command, &spec->command_len, NULL, 0, script, n, err, errlen);
    const char *py = dl_env_get(environ_list, "PYTHON_EXEC");
    if (py == NULL || *py == '\0')
        py = "python3";
    char *head[3] = {(char *)py, "-u", "-m"};
    size_t nhead = spec->module && !spec->run_path ? 3 : 2;
    free(spec->python_exec);
    spec->python_exec = strdup(py);
    if (spec->python_exec == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return copy_argv(&spec->command, &spec->command_len, head, nhead, script, n, err, errlen);
}

static int unknown_option(const char *arg, size_t len, char *err, size_t errlen)
{
    char word[128], raw[256], shown[256];
    snprintf(word, sizeof(word), "%.*s", (int)(len > 2 ? len - 2 : 0), arg + 2);
    snprintf(raw, sizeof(raw), "%.*s", (int)len, arg);
    dl_opt_escape(raw, shown, sizeof(shown));
    const dl_opt_t *c = dl_opt_closest(&dl__job_table, word, false);
    if (c != NULL)
        snprintf(err, errlen, "unknown option '%s' (did you mean --%s? see --help)", shown,
                 c->name);
    else
        snprintf(err, errlen, "unknown option '%s' (see --help)", shown);
    return -EINVAL;
}

/* A value may not be the next option or the '--' that ends them: `--max-restarts -- true` is a
 * flag missing its value, not a max_restarts of '--'. */
static bool looks_like_option(const char *s)
{
    return s[0] == '-' && s[1] == '-';
}

/* --rdzv-endpoint HOST:0, which torchrun documents for several single-node jobs on one machine:
 * the rendezvous takes a free port. Only the node that binds it could know that port, so it
 * means one node, which then hosts a rendezvous of its own as it does without an endpoint. */
static int free_port_endpoint(dl_job_spec_t *spec, char *err, size_t errlen)
{
    const char *ep = spec->rdzv_endpoint, *colon;
    if (ep == NULL || spec->rdzv_backend != DL_RDZV_C10D || spec->standalone ||
        (colon = strrchr(ep, ':')) == NULL || strcmp(colon + 1, "0") != 0)
        return 0;
    if (spec->nodes_max > 1) {
        snprintf(err, errlen,
                 "--rdzv-endpoint %s: port 0 picks a free port that the other "
                 "nodes cannot know; it serves one node (--nnodes 1): give a port "
                 "for --nnodes %d:%d",
                 ep, spec->nodes_min, spec->nodes_max);
        return -EINVAL;
    }
    free(spec->rdzv_endpoint);
    spec->rdzv_endpoint = NULL;
    return 0;
}

int dl_config_load(dl_job_spec_t *spec, int argc, char **argv, char **environ_list,
                   dl_config_action_t *ret_action, char *err, size_t errlen)
{
    pending_flag_t *flags = calloc((size_t)argc + 1, sizeof(*flags));
    size_t nflags = 0;
    const char *yaml_path = NULL;
    int command_at = -1, script_at = -1;
    int r = -EINVAL;

    if (flags == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    *ret_action = DL_CONFIG_RUN;

    for (int i = 1; i < argc && command_at < 0 && script_at < 0; i++) {
        const char *a = argv[i];
        const dl_opt_t *o;
        const char *value = NULL;
        size_t name_len;

        if (strcmp(a, "--") == 0) {
            command_at = i + 1;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *ret_action = DL_CONFIG_HELP;
            free(flags);
            return 0;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            *ret_action = DL_CONFIG_VERSION;
            free(flags);
            return 0;
        }
        if (a[0] != '-' || a[1] == '\0') {
            if (!is_yaml(a)) {
                script_at = i;
                break;
            }
            if (yaml_path != NULL) {
                snprintf(err, errlen,
                         "unexpected argument '%s' (one JOB.yaml at most; put a "
                         "command after --)",
                         a);
                goto out;
            }
            yaml_path = a;
            continue;
        }
        if (a[1] != '-') {
            /* -q, -v, -m; -r 3 or -r3; -t 3 or -t3. */
            o = dl_opt_by_short(&dl__job_table, a[1]);
            if (o == NULL || (a[2] != '\0' && (o->flags & DL_OPT_FLAG))) {
                snprintf(err, errlen, "unknown option '%s' (see --help)", a);
                goto out;
            }
            if (a[2] != '\0')
                value = a + 2;
            name_len = 2;
        } else {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq != NULL ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            char candidates[400];
            r = dl_opt_by_prefix(&dl__job_table, a + 2, len, &o, candidates, sizeof(candidates));
            if (r == -EINVAL) {
                snprintf(err, errlen, "ambiguous option '%.*s' could match %s", (int)(len + 2), a,
                         candidates);
                goto out;
            }
            if (r < 0) {
                r = unknown_option(a, len + 2, err, errlen);
                goto out;
            }
            r = -EINVAL;
            if (eq != NULL) {
                if (o->flags & DL_OPT_FLAG) {
                    snprintf(err, errlen, "option '--%s' takes no value", o->name);
                    goto out;
                }
                value = eq + 1;
            }
            name_len = len + 2;
        }
        if (o->flags & DL_OPT_FLAG) {
            value = "true";
        } else if (value == NULL) {
            if (i + 1 >= argc || looks_like_option(argv[i + 1])) {
                snprintf(err, errlen, "option '%s' needs a value (%s)", a,
                         o->metavar != NULL ? o->metavar : "a value");
                goto out;
            }
            value = argv[++i];
        }
        flags[nflags].opt = o;
        flags[nflags].value = value;
        snprintf(flags[nflags].where, sizeof(flags[nflags].where), "%.*s", (int)name_len, a);
        nflags++;
    }

    if (yaml_path != NULL) {
        r = dl_config_load_yaml(spec, yaml_path, err, errlen);
        if (r < 0)
            goto out;
    }
    /* torchrun's agent takes its stop grace from this variable; ours ranks below our own. */
    const char *grace = dl_env_get(environ_list, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    if (grace != NULL && *grace != '\0') {
        r = dl_opt_set(dl_opt_by_flag(&dl__job_table, "stop-timeout", strlen("stop-timeout")), spec,
                       grace, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", err, errlen);
        if (r < 0)
            goto out;
    }
    r = dl_opt_from_env(&dl__job_table, spec, environ_list, err, errlen);
    for (size_t i = 0; i < nflags && r == 0; i++)
        r = dl_opt_set(flags[i].opt, spec, flags[i].value, flags[i].where, err, errlen);
    if (r < 0) {
        r = r == -ERANGE ? -EINVAL : r;
        goto out;
    }
    r = dl__signals_check(spec, err, errlen);
    if (r < 0)
        goto out;
    r = free_port_endpoint(spec, err, errlen);
    if (r < 0)
        goto out;
    if (spec->rdzv_backend == DL_RDZV_ETCD_V2) {
        snprintf(err, errlen,
                 "--rdzv-backend etcd-v2: etcd's v2 API was removed in etcd 3.6 "
                 "(and is off by default since 3.4); use --rdzv-backend etcd, which "
                 "speaks the v3 API");
        r = -EINVAL;
        goto out;
    }
    r = 0;
    if (command_at >= 0) {
        if (command_at >= argc) {
            snprintf(err, errlen, "nothing after '--': give the command to run");
            r = -EINVAL;
            goto out;
        }
        r = copy_argv(&spec->command, &spec->command_len, NULL, 0, argv + command_at,
                      (size_t)(argc - command_at), err, errlen);
    } else if (script_at >= 0) {
        if (yaml_path != NULL) {
            snprintf(err, errlen,
                     "'%s': a job spec and a script at once (put the script in the "
                     "spec's command:, or drop the spec)",
                     argv[script_at]);
            r = -EINVAL;
            goto out;
        }
        r = script_command(spec, environ_list, argv + script_at, (size_t)(argc - script_at), err,
                           errlen);
    } else if ((spec->module || spec->no_python || spec->run_path) && spec->command == NULL) {
        snprintf(err, errlen, "%s needs a script to run",
                 spec->module      ? "-m/--module"
                 : spec->no_python ? "--no-python"
                                   : "--run-path");
        r = -EINVAL;
    }
    if (r < 0)
        goto out;
    if (spec->command == NULL && spec->train == NULL) {
        if (yaml_path != NULL)
            snprintf(err, errlen,
                     "%s: no 'command:' or 'train:' in the job spec, and no command "
                     "after '--'",
                     yaml_path);
        else
            snprintf(err, errlen,
                     "nothing to run: give JOB.yaml, a script, or -- COMMAND "
                     "[ARGS...]");
        r = -EINVAL;
        goto out;
    }
    r = 0;
out:
    free(flags);
    return r;
}

void dl_config_print_help(void *stream, const char *progname)
{
    FILE *f = stream;

    fprintf(f,
            "Usage: %s [OPTIONS] JOB.yaml\n"
            "       %s [OPTIONS] SCRIPT.py [ARGS...]       (as torchrun: python3 -u SCRIPT.py)\n"
            "       %s [OPTIONS] -- COMMAND [ARGS...]\n"
            "       dlaunch COMMAND [OPTIONS] [ARGS...]    (the control commands: dlaunch help)\n\n"
            "Starts one worker per GPU slot with torchrun's environment, restarts the job\n"
            "when a worker fails, and keeps every rank's output. Takes torchrun's flags too,\n"
            "in either spelling (--nproc-per-node or --nproc_per_node).\n\n"
            "Options (each also settable as a YAML key with '_' for '-', or DLAUNCH_<NAME>,\n"
            "and torchrun's as PET_<NAME>; a flag wins over the environment, which wins over\n"
            "the YAML file):\n",
            progname, progname, progname);
    dl_opt_print_help(&dl__job_table, f);
    fprintf(f, "  %-30s %s\n  %-30s %s\n", "-h, --help", "show this help and exit", "-V, --version",
            "print the version and exit");
    fprintf(f, "\nExit codes: 0 success, 1 workers failed, 2 usage or job-spec error,\n"
               "3 rendezvous timeout, 4 auth or protocol error, 128+n killed by signal n.\n");
}
