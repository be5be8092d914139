/* dlaunchd's option table, read by the option engine (config/opt.h). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "opt.h"
#include "options.h"

#define OFF(field) offsetof(dl_daemon_args_t, field)
/* A value kept as typed, checked where it is used (dlaunchd.c); "" is refused here. */
#define TEXT(name, meta, field, help)                                                              \
    {                                                                                              \
        name, NULL, 0, &dl_opt_text, OFF(field), 1, 0, NULL, NULL, meta, help, DL_OPT_CLI_ONLY, 0  \
    }
#define FLAG(name, short_name, field, flags, help)                                                 \
    {                                                                                              \
        name, NULL, short_name, &dl_opt_bool, OFF(field), 0, 0, NULL, NULL, NULL, help,            \
            DL_OPT_FLAG | DL_OPT_CLI_ONLY | (flags), 0                                             \
    }

static const dl_opt_t options[] = {
    TEXT("listen", "ADDR:PORT", listen,
         "where to serve the rendezvous (default 127.0.0.1:29400; port 0: a free one, printed "
         "on start); an address other than loopback needs a token"),
    TEXT("token-file", "FILE", token_file,
         "the rendezvous' token (mode 0600): it admits every job, and each job's own key and "
         "workers' key are derived from it (dlaunch token RUN_ID); DLAUNCH_TOKEN also works. "
         "Without one, only this user is served. With a token, HTTP requests need it too, as a "
         "bearer token"),
    TEXT("http", "ADDR:PORT", http,
         "serve Prometheus metrics at /metrics, a status page at / and JSON at /api/jobs there "
         "(default: off; port 0: a free one, printed on start); an address other than loopback "
         "needs a token"),
    TEXT("max-memory", "MIB", max_memory,
         "memory for every job's key-value store and pending waits together, in MiB (default "
         "1024); past it, writes and waits get limit_exceeded"),
    TEXT("max-jobs", "N", max_jobs, "jobs served at once (default 4096)"),
    TEXT("max-jobs-per-peer", "N", max_jobs_per_peer,
         "live jobs that the joins of one address may create (default 512)"),
    TEXT("max-timeout", "SECONDS", max_timeout,
         "the longest join timeout, last call or dead-after a job may ask for (default 3600)"),
    TEXT("idle-timeout", "SECONDS", idle_timeout,
         "close an authenticated connection that sent nothing for this long and waits for "
         "nothing (default 300)"),
    TEXT("frame-timeout", "SECONDS", frame_timeout,
         "close a connection whose frame has not arrived whole this long after it began "
         "(default 30)"),
    TEXT("linger", "SECONDS", linger,
         "how long a finished job still answers its late agents and `dlaunch status`; then it "
         "is forgotten with its journal, and its run id is free again (default 60)"),
    TEXT("revocations", "FILE", revocations,
         "keep the revocations of `dlaunch revoke` in this file (JSON, rewritten at each one), "
         "so that a restarted dlaunchd still refuses the keys it refused (default: in memory "
         "only; they end with the process)"),
    FLAG("verbose", 'v', verbose, 0, "log every rendezvous step"),
    FLAG("help", 'h', help, DL_OPT_STOP, "show this help and exit"),
    FLAG("version", 'V', version, DL_OPT_STOP, "print the version and exit"),
};

const dl_opt_table_t dl_daemon_options = {options, sizeof(options) / sizeof(options[0]),
                                          "DLAUNCHD_", NULL, true};

void dl_daemon_args_init(dl_daemon_args_t *args)
{
    memset(args, 0, sizeof(*args));
    args->listen = "127.0.0.1:29400";
}

int dl_daemon_parse(int argc, char **argv, dl_daemon_args_t *args, dl_daemon_action_t *ret_action,
                    char *err, size_t errlen)
{
    dl_opt_argv_t a = {.prog = "dlaunchd", .args = NULL, .max_args = 0};

    *ret_action = DL_DAEMON_RUN;
    int r = dl_opt_parse_argv(&dl_daemon_options, args, argc - 1, argv + 1, &a, err, errlen);
    if (r < 0)
        return r;
    if (args->help)
        *ret_action = DL_DAEMON_HELP;
    else if (args->version)
        *ret_action = DL_DAEMON_VERSION;
    return 0;
}

void dl_daemon_print_help(void *stream)
{
    FILE *f = stream;
    fprintf(f, "Usage: dlaunchd [OPTIONS]\n\n"
               "The standalone rendezvous: serves many jobs at once, each keyed by its run id,\n"
               "and answers dlaunch status|stop|restart|events. SIGINT and SIGTERM stop it.\n\n"
               "Options:\n");
    dl_opt_print_help(&dl_daemon_options, f);
}
