/* The option table and what reads it: the command line, DLAUNCH_* variables and --help.
 * The YAML loader (yaml.c) uses the same table and setters. */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define OFF(field) offsetof(dl_job_spec_t, field)

const dl__option_t dl__options[] = {
    {"nodes", NULL, 0, DL__OPT_NODES, OFF(nodes_min), 1, 1e6, "N|MIN:MAX",
     "number of nodes, or an elastic range (default 1)", false},
    {"gpus-per-node", "nproc-per-node", 0, DL__OPT_GPUS, OFF(gpus_per_node), 1, 4096, "N|auto",
     "workers per node, one per GPU; auto = GPUs found, else 1 (default auto)", false},
    {"max-restarts", NULL, 0, DL__OPT_INT, OFF(max_restarts), 0, 1e6, "N",
     "restarts of the whole job after a worker fails (default 0)", false},
    {"run-id", NULL, 0, DL__OPT_STRING, OFF(run_id), 0, 0, "ID",
     "job name, shared by its nodes; names the log folder (default: made up)", false},
    {"log-dir", NULL, 0, DL__OPT_STRING, OFF(log_dir), 0, 0, "DIR",
     "where LOGDIR/RUN_ID/attempt_K/rank_N.{out,err} go (default dlaunch_logs)", false},
    {"events", NULL, 0, DL__OPT_STRING, OFF(events), 0, 0, "FILE|-",
     "write one JSON object per line for every state change", false},
    {"stop-timeout", NULL, 0, DL__OPT_DOUBLE, OFF(stop_timeout), 0, 86400, "SEC",
     "grace between SIGTERM and SIGKILL when stopping workers (default 10)", false},
    {"health-timeout", NULL, 0, DL__OPT_DOUBLE, OFF(health_timeout), 0, 86400, "SEC",
     "a worker that beat on DLAUNCH_HEALTH_FD and then fell silent this long is hung: it is "
     "killed and the job restarts (default 0: off)", false},
    {"dry-run", NULL, 0, DL__OPT_BOOL, OFF(dry_run), 0, 0, NULL,
     "print the plan (ranks, environment, commands) and exit", false},
    {"quiet", NULL, 'q', DL__OPT_BOOL, OFF(quiet), 0, 0, NULL,
     "do not echo worker output (it still goes to the log files)", false},
    {"verbose", NULL, 'v', DL__OPT_BOOL, OFF(verbose), 0, 0, NULL,
     "report every worker start and exit on stderr", false},
    {"rdzv-endpoint", NULL, 0, DL__OPT_STRING, OFF(rdzv_endpoint), 0, 0, "HOST:PORT",
     "the rendezvous of a job over several nodes; the agent that can bind it hosts it", false},
    {"node-rank", NULL, 0, DL__OPT_INT, OFF(node_rank), 0, 1e6, "N",
     "this node's rank (default: the rendezvous decides; 0 hosts the rendezvous)", false},
    {"join-timeout", NULL, 0, DL__OPT_DOUBLE, OFF(join_timeout), 0.1, 86400, "SEC",
     "give up (exit 3) when the nodes have not gathered by then (default 600)", false},
    {"last-call", NULL, 0, DL__OPT_DOUBLE, OFF(last_call), 0, 86400, "SEC",
     "with --nodes MIN:MAX, wait this long for more nodes once MIN joined (default 5)", false},
    {"heartbeat", NULL, 0, DL__OPT_DOUBLE, OFF(heartbeat), 0.01, 3600, "SEC",
     "seconds between heartbeats to the rendezvous (default 1)", false},
    {"dead-after", NULL, 0, DL__OPT_DOUBLE, OFF(dead_after), 0.05, 86400, "SEC",
     "a node silent this long is dead and the job restarts without it (default 5)", false},
    {"token-file", NULL, 0, DL__OPT_STRING, OFF(token_file), 0, 0, "FILE",
     "the job token (mode 0600) proving agents and workers belong to the job", false},
    {"straggler-action", NULL, 0, DL__OPT_STRING, OFF(straggler_action), 0, 0,
     "warn|exclude|off",
     "what to do about a rank slower than the others: name it (warn), or with --nodes MIN:MAX "
     "also drop its node from the job for --straggler-cooldown (exclude) (default warn)", false},
    {"straggler-threshold", NULL, 0, DL__OPT_DOUBLE, OFF(straggler_threshold), 0.01, 100, "F",
     "a straggler's compute time a step exceeds the median by this fraction (default 0.3)",
     false},
    {"straggler-window", NULL, 0, DL__OPT_INT, OFF(straggler_window), 1, 1e9, "STEPS",
     "... over this many steps, in 3 reports in a row at least (default 100)", false},
    {"straggler-cooldown", NULL, 0, DL__OPT_DOUBLE, OFF(straggler_cooldown), 0, 1e7, "SEC",
     "an excluded node joins the job again after this long (default 300)", false},
};
const size_t dl__options_count = sizeof(dl__options) / sizeof(dl__options[0]);

void dl__option_key(const dl__option_t *opt, char *buf, size_t len)
{
    size_t i;
    for (i = 0; opt->name[i] != '\0' && i + 1 < len; i++)
        buf[i] = opt->name[i] == '-' ? '_' : opt->name[i];
    buf[i] = '\0';
}

void dl__option_env_name(const dl__option_t *opt, char *buf, size_t len)
{
    int n = snprintf(buf, len, "DLAUNCH_");
    size_t i;
    for (i = 0; opt->name[i] != '\0' && (size_t)n + i + 1 < len; i++)
        buf[n + i] = opt->name[i] == '-' ? '_' : (char)toupper((unsigned char)opt->name[i]);
    buf[n + i] = '\0';
}

const dl__option_t *dl__option_by_key(const char *key)
{
    char buf[64];
    for (size_t i = 0; i < dl__options_count; i++) {
        dl__option_key(&dl__options[i], buf, sizeof(buf));
        if (strcmp(buf, key) == 0)
            return &dl__options[i];
    }
    return NULL;
}

static const dl__option_t *option_by_flag(const char *name, size_t len)
{
    for (size_t i = 0; i < dl__options_count; i++) {
        const dl__option_t *o = &dl__options[i];
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
        if (o->alias != NULL && strlen(o->alias) == len && strncmp(o->alias, name, len) == 0)
            return o;
    }
    return NULL;
}

static const dl__option_t *option_by_short(char c)
{
    for (size_t i = 0; i < dl__options_count; i++)
        if (dl__options[i].short_name == c)
            return &dl__options[i];
    return NULL;
}

static int parse_bool(const char *s, bool *ret)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int range_error(const dl__option_t *opt, const char *text, const char *where, char *err,
                       size_t errlen, int r)
{
    if (r == -ERANGE && opt->kind == DL__OPT_NODES)
        snprintf(err, errlen, "%s: '%s' is out of range (want N or MIN:MAX, 1 <= MIN <= MAX)",
                 where, text);
    else if (r == -ERANGE)
        snprintf(err, errlen, "%s: '%s' is out of range (%g to %g)", where, text, opt->min,
                 opt->max);
    else
        snprintf(err, errlen, "%s: '%s' is not %s", where, text,
                 opt->kind == DL__OPT_DOUBLE  ? "a number"
                 : opt->kind == DL__OPT_NODES ? "N or MIN:MAX"
                 : opt->kind == DL__OPT_GPUS  ? "a whole number or 'auto'"
                 : opt->kind == DL__OPT_BOOL  ? "a boolean (true or false)"
                                              : "a whole number");
    return -EINVAL;
}

int dl__option_set(dl_job_spec_t *spec, const dl__option_t *opt, const char *text,
                   const char *where, char *err, size_t errlen)
{
    char *field = (char *)spec + opt->offset;
    long l;
    double d;
    bool b;
    int r;

    switch (opt->kind) {
    case DL__OPT_INT:
        r = dl_parse_int(text, (long)opt->min, (long)opt->max, &l);
        if (r < 0)
            return range_error(opt, text, where, err, errlen, r);
        *(int *)field = (int)l;
        return 0;
    case DL__OPT_DOUBLE:
        r = dl_parse_double(text, opt->min, opt->max, &d);
        if (r < 0)
            return range_error(opt, text, where, err, errlen, r);
        *(double *)field = d;
        return 0;
    case DL__OPT_BOOL:
        r = parse_bool(text, &b);
        if (r < 0)
            return range_error(opt, text, where, err, errlen, r);
        *(bool *)field = b;
        return 0;
    case DL__OPT_NODES:
        r = dl_parse_nodes(text, &spec->nodes_min, &spec->nodes_max);
        if (r < 0)
            return range_error(opt, text, where, err, errlen, r);
        spec->nodes_set = true;
        return 0;
    case DL__OPT_GPUS:
        spec->gpus_set = true;
        if (strcmp(text, "auto") == 0) {
            *(int *)field = DL_GPUS_AUTO;
            return 0;
        }
        r = dl_parse_int(text, (long)opt->min, (long)opt->max, &l);
        if (r < 0)
            return range_error(opt, text, where, err, errlen, r);
        *(int *)field = (int)l;
        return 0;
    case DL__OPT_STRING: {
        if (*text == '\0') {
            snprintf(err, errlen, "%s: must not be empty", where);
            return -EINVAL;
        }
        /* The run id names log folders, goes in environment variables and on the wire. */
        if (opt->offset == OFF(run_id) &&
            (strlen(text) > 128 ||
             strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") !=
                 strlen(text))) {
            snprintf(err, errlen,
                     "%s: '%s' is not a run id (at most 128 letters, digits, '.', '_', ':', '-')",
                     where, text);
            return -EINVAL;
        }
        if (opt->offset == OFF(straggler_action) && strcmp(text, "warn") != 0 &&
            strcmp(text, "exclude") != 0 && strcmp(text, "off") != 0) {
            snprintf(err, errlen, "%s: '%s' is not warn, exclude or off", where, text);
            return -EINVAL;
        }
        char *copy = strdup(text);
        if (copy == NULL) {
            snprintf(err, errlen, "%s: out of memory", where);
            return -ENOMEM;
        }
        free(*(char **)field);
        *(char **)field = copy;
        return 0;
    }
    }
    return -EINVAL;
}

void dl__strv_free(char **v)
{
    if (v == NULL)
        return;
    for (char **p = v; *p != NULL; p++)
        free(*p);
    free(v);
}

void dl_job_spec_init(dl_job_spec_t *spec)
{
    memset(spec, 0, sizeof(*spec));
    spec->nodes_min = 1;
    spec->nodes_max = 1;
    spec->gpus_per_node = DL_GPUS_AUTO;
    spec->max_restarts = 0;
    spec->stop_timeout = 10.0;
    spec->node_rank = -1;
    spec->join_timeout = 600.0;
    spec->last_call = 5.0;
    spec->heartbeat = 1.0;
    spec->dead_after = 5.0;
    spec->straggler_threshold = 0.3;
    spec->straggler_window = 100;
    spec->straggler_cooldown = 300.0;
}

void dl_job_spec_free(dl_job_spec_t *spec)
{
    if (spec == NULL)
        return;
    free(spec->run_id);
    free(spec->log_dir);
    free(spec->events);
    free(spec->rdzv_endpoint);
    free(spec->token_file);
    free(spec->straggler_action);
    free(spec->spec_path);
    dl__strv_free(spec->command);
    dl__strv_free(spec->env);
    dl__strv_free(spec->train);
    dl__strv_free(spec->train_where);
    dl_job_spec_init(spec);
}

static int apply_environment(dl_job_spec_t *spec, char **environ_list, char *err, size_t errlen)
{
    char name[64];
    for (size_t i = 0; i < dl__options_count; i++) {
        const dl__option_t *o = &dl__options[i];
        dl__option_env_name(o, name, sizeof(name));
        const char *v = dl_env_get(environ_list, name);
        /* An empty variable is how scripts unset a setting, so it counts as absent. */
        if (v == NULL || *v == '\0')
            continue;
        int r = dl__option_set(spec, o, v, name, err, errlen);
        if (r < 0)
            return r;
    }
    return 0;
}

typedef struct {
    const dl__option_t *opt;
    const char *value;
    char where[80];
} pending_flag_t;

static int copy_command(dl_job_spec_t *spec, int argc, char **argv, char *err, size_t errlen)
{
    char **v = calloc((size_t)argc + 1, sizeof(char *));
    if (v == NULL)
        goto nomem;
    for (int i = 0; i < argc; i++) {
        v[i] = strdup(argv[i]);
        if (v[i] == NULL) {
            dl__strv_free(v);
            goto nomem;
        }
    }
    dl__strv_free(spec->command);
    spec->command = v;
    spec->command_len = (size_t)argc;
    return 0;
nomem:
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
}

int dl_config_load(dl_job_spec_t *spec, int argc, char **argv, char **environ_list,
                   dl_config_action_t *ret_action, char *err, size_t errlen)
{
    pending_flag_t *flags = calloc((size_t)argc + 1, sizeof(*flags));
    size_t nflags = 0;
    const char *yaml_path = NULL;
    int command_at = -1;
    int r = -EINVAL;

    if (flags == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    *ret_action = DL_CONFIG_RUN;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const dl__option_t *o;
        const char *value = NULL;

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
            if (yaml_path != NULL) {
                snprintf(err, errlen,
                         "unexpected argument '%s' (one JOB.yaml at most; put a command after --)",
                         a);
                goto out;
            }
            yaml_path = a;
            continue;
        }
        if (a[1] != '-') {
            o = a[2] == '\0' ? option_by_short(a[1]) : NULL;
            if (o == NULL || o->kind != DL__OPT_BOOL) {
                snprintf(err, errlen, "unknown option '%s' (see --help)", a);
                goto out;
            }
        } else {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq != NULL ? (size_t)(eq - (a + 2)) : strlen(a + 2);
            o = option_by_flag(a + 2, len);
            if (o == NULL) {
                snprintf(err, errlen, "unknown option '%.*s' (see --help)", (int)len + 2, a);
                goto out;
            }
            if (eq != NULL) {
                if (o->kind == DL__OPT_BOOL) {
                    snprintf(err, errlen, "option '--%s' takes no value", o->name);
                    goto out;
                }
                value = eq + 1;
            }
        }
        if (o->kind == DL__OPT_BOOL) {
            value = "true";
        } else if (value == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '%s' needs a value (%s)", a, o->metavar);
                goto out;
            }
            value = argv[++i];
        }
        flags[nflags].opt = o;
        flags[nflags].value = value;
        snprintf(flags[nflags].where, sizeof(flags[nflags].where), "%s", a);
        char *eqw = strchr(flags[nflags].where, '=');
        if (eqw != NULL)
            *eqw = '\0';
        nflags++;
    }

    if (yaml_path != NULL) {
        r = dl_config_load_yaml(spec, yaml_path, err, errlen);
        if (r < 0)
            goto out;
    }
    r = apply_environment(spec, environ_list, err, errlen);
    if (r < 0)
        goto out;
    for (size_t i = 0; i < nflags; i++) {
        r = dl__option_set(spec, flags[i].opt, flags[i].value, flags[i].where, err, errlen);
        if (r < 0)
            goto out;
    }
    if (command_at >= 0) {
        if (command_at >= argc) {
            snprintf(err, errlen, "nothing after '--': give the command to run");
            r = -EINVAL;
            goto out;
        }
        r = copy_command(spec, argc - command_at, argv + command_at, err, errlen);
        if (r < 0)
            goto out;
    }
    if (spec->command == NULL && spec->train == NULL) {
        if (yaml_path != NULL)
            snprintf(err, errlen, "%s: no 'command:' or 'train:' in the job spec, and no command "
                                  "after '--'",
                     yaml_path);
        else
            snprintf(err, errlen, "nothing to run: give JOB.yaml or -- COMMAND [ARGS...]");
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
    char env[64];

    fprintf(f,
            "Usage: %s [OPTIONS] JOB.yaml\n"
            "       %s [OPTIONS] -- COMMAND [ARGS...]\n"
            "       dlaunch status|stop|restart|events [--json] [--ranks] [--endpoint HOST:PORT] RUN_ID\n"
            "       dlaunch kv get|set|add|wait|del|cas KEY [VALUE...]   (inside a worker)\n\n"
            "Starts one worker per GPU slot with torchrun's environment, restarts the job\n"
            "when a worker fails, and keeps every rank's output.\n\n"
            "Options (each also settable as a YAML key with '_' for '-', or DLAUNCH_<NAME>;\n"
            "a flag wins over the environment, which wins over the YAML file):\n",
            progname, progname);
    for (size_t i = 0; i < dl__options_count; i++) {
        const dl__option_t *o = &dl__options[i];
        char lhs[64];
        int n = 0;
        if (o->short_name != 0)
            n = snprintf(lhs, sizeof(lhs), "-%c, ", o->short_name);
        n += snprintf(lhs + n, sizeof(lhs) - (size_t)n, "--%s", o->name);
        if (o->metavar != NULL)
            snprintf(lhs + n, sizeof(lhs) - (size_t)n, " %s", o->metavar);
        dl__option_env_name(o, env, sizeof(env));
        fprintf(f, "  %-28s %s\n", lhs, o->help);
        if (o->alias != NULL)
            fprintf(f, "  %-28s   alias --%s; env %s\n", "", o->alias, env);
        else
            fprintf(f, "  %-28s   env %s\n", "", env);
    }
    fprintf(f, "  %-28s %s\n  %-28s %s\n", "-h, --help", "show this help and exit",
            "-V, --version", "print the version and exit");
    fprintf(f, "\nExit codes: 0 success, 1 workers failed, 2 usage or job-spec error,\n"
               "3 rendezvous timeout, 4 auth or protocol error, 128+n killed by signal n.\n");
}
