/* The control commands as one table: each command's name, handler, options (read by the option
 * engine, config/opt.h) and help, from which come its parser, `dlaunch COMMAND --help`, the list
 * of `dlaunch help`, and (through man/mangen.c) dlaunch(1) and the completion. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ctl-internal.h"
#include "ctl.h"
#include "opt.h"

#define OFF(field) offsetof(struct dl_ctl_opts_s, field)
#define FLAG(name, field, help)                                                                    \
    {                                                                                              \
        name, NULL, 0, &dl_opt_bool, OFF(field), 0, 0, NULL, NULL, NULL, help,                     \
            DL_OPT_FLAG | DL_OPT_CLI_ONLY, 0                                                       \
    }
#define TEXT(name, meta, field, help)                                                              \
    {                                                                                              \
        name, NULL, 0, &dl_opt_text, OFF(field), 0, 0, NULL, NULL, meta, help, DL_OPT_CLI_ONLY, 0  \
    }
#define SECONDS(help)                                                                              \
    {                                                                                              \
        "timeout", NULL, 0, &dl_opt_double, OFF(timeout), 0, 86400, NULL, "10", "SECONDS", help,   \
            DL_OPT_CLI_ONLY | DL_OPT_MARKS, OFF(timeout_given)                                     \
    }

static const char *const backends[] = {"c10d", "static", "etcd", NULL};

#define O_JSON FLAG("json", json, "print the server's answer as JSON")
#define O_ENDPOINT                                                                                 \
    TEXT("endpoint", "HOST:PORT", endpoint,                                                        \
         "the rendezvous or dlaunchd (else DLAUNCH_ENDPOINT, else 127.0.0.1:29400); with "         \
         "--rdzv-backend etcd, the etcd cluster's HOST:PORT[,HOST:PORT...]")
#define O_TOKEN_FILE                                                                               \
    TEXT("token-file", "FILE", token_file,                                                         \
         "the token or key to prove (else DLAUNCH_TOKEN_FILE, else DLAUNCH_TOKEN)")
#define O_TIMEOUT SECONDS("how long to wait for the answer (default 10)")
#define O_BACKEND                                                                                  \
    {                                                                                              \
        "rdzv-backend", NULL, 0, &dl_opt_enum, OFF(backend), 0, 0, backends, "c10d",               \
            "c10d|static|etcd", "etcd: read and write the job's keys in etcd (docs/etcd.md)",      \
            DL_OPT_CLI_ONLY, 0                                                                     \
    }
#define O_CONF                                                                                     \
    TEXT("rdzv-conf", "K=V,...", rdzv_conf,                                                        \
         "for etcd: user, password_file and TLS settings (docs/etcd.md)")
#define O_HELP                                                                                     \
    {                                                                                              \
        "help", NULL, 'h', &dl_opt_bool, OFF(help), 0, 0, NULL, NULL, NULL,                        \
            "show this command's help and exit", DL_OPT_FLAG | DL_OPT_CLI_ONLY | DL_OPT_STOP, 0    \
    }

#define TABLE(opts)                                                                                \
    {                                                                                              \
        opts, sizeof(opts) / sizeof(opts[0]), "DLAUNCH_", NULL, true                               \
    }

static const dl_opt_t status_opts[] = {
    O_JSON,
    FLAG("ranks", ranks,
         "also every rank's figures and last collective operations, and where a stuck job is "
         "stuck (docs/diagnostics.md)"),
    O_ENDPOINT,
    O_TOKEN_FILE,
    O_TIMEOUT,
    O_BACKEND,
    O_CONF,
    O_HELP};
static const dl_opt_t stop_opts[] = {O_JSON,    O_ENDPOINT, O_TOKEN_FILE, O_TIMEOUT,
                                     O_BACKEND, O_CONF,     O_HELP};
static const dl_opt_t events_opts[] = {
    /* Taken before each command had its own options; the events are JSON lines anyway. */
    {"json", NULL, 0, &dl_opt_bool, OFF(json), 0, 0, NULL, NULL, NULL, "no effect",
     DL_OPT_FLAG | DL_OPT_CLI_ONLY | DL_OPT_HIDDEN, 0},
    O_ENDPOINT,
    O_TOKEN_FILE,
    SECONDS("stop after this long without an event (default: follow until the job ends)"),
    O_BACKEND,
    O_CONF,
    O_HELP};
static const dl_opt_t kv_opts[] = {
    TEXT("endpoint", "HOST:PORT", endpoint, "the job's store (else DLAUNCH_STORE)"), O_TOKEN_FILE,
    SECONDS("how long to wait for the answer; for wait, how long to wait for the keys "
            "(default 10)"),
    O_HELP};
static const dl_opt_t token_opts[] = {
    FLAG("worker", worker, "the job's workers' key rather than the job's key"),
    FLAG("read-only", read_only,
         "the server's read-only credential for its HTTP side (Prometheus), for no job"),
    TEXT("expires", "DURATION", expires,
         "the key's lifetime: N seconds, or N with s, m, h or d (default 7d, at most 366d; "
         "only the rendezvous' token takes it)"),
    TEXT("token-file", "FILE", token_file,
         "the token to make the key from (else DLAUNCH_TOKEN_FILE, else DLAUNCH_TOKEN)"),
    O_HELP};
static const dl_opt_t revoke_opts[] = {
    TEXT("before", "TIME", before,
         "withdraw the keys issued before TIME (Unix seconds or YYYY-MM-DDTHH:MM:SSZ, not "
         "ahead of this machine's clock; default now)"),
    O_JSON,
    O_ENDPOINT,
    O_TOKEN_FILE,
    O_TIMEOUT,
    O_BACKEND,
    O_CONF,
    O_HELP};
static const dl_opt_t help_opts[] = {O_HELP};

static int help_command(const char *cmd, const struct dl_ctl_opts_s *o);

static const dl_ctl_command_t commands[] = {
    {"status", dl__ctl_control, TABLE(status_opts), "[RUN_ID]",
     "the job's state, round, restarts, nodes and figures; every job without RUN_ID"},
    {"stop", dl__ctl_control, TABLE(stop_opts), "RUN_ID",
     "every agent stops its workers and exits 0 reporting the stop"},
    {"restart", dl__ctl_control, TABLE(stop_opts), "RUN_ID",
     "opens the next round: every agent restarts its workers (no restart spent)"},
    {"events", dl__ctl_events, TABLE(events_opts), "RUN_ID",
     "the job's event stream as JSON lines, until the job ends"},
    {"kv", dl__ctl_kv, TABLE(kv_opts), "get|set|add|wait|del|cas KEY [VALUE...]",
     "the job's key-value store, from inside a worker (get KEY, set KEY VALUE, add KEY DELTA, "
     "wait KEY..., del KEY, cas KEY EXPECTED VALUE)"},
    {"token", dl__ctl_token, TABLE(token_opts), "RUN_ID | --read-only",
     "prints job RUN_ID's key (or its workers'), made from the token given"},
    {"revoke", dl__ctl_revoke, TABLE(revoke_opts), "RUN_ID",
     "the rendezvous refuses RUN_ID's keys issued so far (needs the server's token)"},
    {"help", help_command, TABLE(help_opts), "[COMMAND]", "this list, or one command's help"},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

const dl_ctl_command_t *dl_ctl_commands(size_t *ret_n)
{
    *ret_n = NCOMMANDS;
    return commands;
}

static const dl_ctl_command_t *find_command(const char *word)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(word, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

bool dl_ctl_is_command(const char *word)
{
    return find_command(word) != NULL;
}

void dl_ctl_print_commands(void *stream)
{
    FILE *f = stream;
    char lhs[128];
    fprintf(f, "Control commands (dlaunch COMMAND --help shows one):\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        snprintf(lhs, sizeof(lhs), "%s %s", commands[i].name, commands[i].usage);
        dl_opt_print_item(f, lhs, commands[i].help);
    }
}

static void print_command_help(const dl_ctl_command_t *c, FILE *f)
{
    fprintf(f, "Usage: dlaunch %s [OPTIONS] %s\n\n%s.\n\nOptions:\n", c->name, c->usage, c->help);
    dl_opt_print_help(&c->options, f);
    fprintf(f, "\nExit codes (docs/control.md): 0 success, 1 no such job or key, or the answer\n"
               "was no; 2 usage error; 3 unreachable or timed out; 4 credentials refused.\n");
}

static int help_command(const char *cmd, const struct dl_ctl_opts_s *o)
{
    (void)cmd;
    if (o->nargs > 1)
        return dl__ctl_usage_error("help takes one COMMAND");
    if (o->nargs == 0) {
        dl_ctl_print_commands(stdout);
        return 0;
    }
    const dl_ctl_command_t *c = find_command(o->args[0]);
    if (c == NULL)
        return dl__ctl_usage_error("help: '%s' is no control command (dlaunch help lists them)",
                                   o->args[0]);
    print_command_help(c, stdout);
    return 0;
}

int dl_ctl_main(int argc, char **argv)
{
    const dl_ctl_command_t *c = find_command(argv[1]);
    const char *args[DL_CTL_MAX_ARGS];
    char prog[64], err[1024];
    struct dl_ctl_opts_s o;

    memset(&o, 0, sizeof(o));
    if (dl_opt_defaults(&c->options, &o, err, sizeof(err)) < 0)
        return dl__ctl_usage_error("%s", err);
    snprintf(prog, sizeof(prog), "dlaunch %s", c->name);
    dl_opt_argv_t a = {.prog = prog, .args = args, .max_args = DL_CTL_MAX_ARGS};
    if (dl_opt_parse_argv(&c->options, &o, argc - 2, argv + 2, &a, err, sizeof(err)) < 0)
        return dl__ctl_usage_error("%s", err);
    if (o.help) {
        print_command_help(c, stdout);
        return 0;
    }
    o.args = args;
    o.nargs = (int)a.nargs;
    o.etcd = strcmp(backends[o.backend], "etcd") == 0;
    o.follow_timeout = o.timeout_given ? o.timeout : -1;
    return c->handler(c->name, &o);
}
