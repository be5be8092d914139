/* dlaunchd's option table and what reads it. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "options.h"

#define OFF(field) offsetof(dl_daemon_args_t, field)

const dl_daemon_option_t dl_daemon_options[] = {
    {"listen", 0, "ADDR:PORT", OFF(listen),
     "where to serve the rendezvous (default 127.0.0.1:29400; port 0: a free one, printed on "
     "start); an address other than loopback needs a token"},
    {"token-file", 0, "FILE", OFF(token_file),
     "the rendezvous' token (mode 0600): it admits every job, and each job's own key and "
     "workers' key are derived from it (dlaunch token RUN_ID); DLAUNCH_TOKEN also works. "
     "Without one, only this user is served. With a token, HTTP requests need it too, as a "
     "bearer token"},
    {"http", 0, "ADDR:PORT", OFF(http),
     "serve Prometheus metrics at /metrics, a status page at / and JSON at /api/jobs there "
     "(default: off; port 0: a free one, printed on start); an address other than loopback "
     "needs a token"},
    {"max-memory", 0, "MIB", OFF(max_memory),
     "memory for every job's key-value store and pending waits together, in MiB (default "
     "1024); past it, writes and waits get limit_exceeded"},
    {"max-jobs", 0, "N", OFF(max_jobs), "jobs served at once (default 4096)"},
    {"max-jobs-per-peer", 0, "N", OFF(max_jobs_per_peer),
     "live jobs that the joins of one address may create (default 512)"},
    {"max-timeout", 0, "SECONDS", OFF(max_timeout),
     "the longest join timeout, last call or dead-after a job may ask for (default 3600)"},
    {"idle-timeout", 0, "SECONDS", OFF(idle_timeout),
     "close an authenticated connection that sent nothing for this long and waits for "
     "nothing (default 300)"},
    {"frame-timeout", 0, "SECONDS", OFF(frame_timeout),
     "close a connection whose frame has not arrived whole this long after it began "
     "(default 30)"},
    {"linger", 0, "SECONDS", OFF(linger),
     "how long a finished job still answers its late agents and `dlaunch status`; then it is "
     "forgotten with its journal, and its run id is free again (default 60)"},
    {"revocations", 0, "FILE", OFF(revocations),
     "keep the revocations of `dlaunch revoke` in this file (JSON, rewritten at each one), so "
     "that a restarted dlaunchd still refuses the keys it refused (default: in memory only; "
     "they end with the process)"},
    {"verbose", 'v', NULL, OFF(verbose), "log every rendezvous step"},
};
const size_t dl_daemon_options_count = sizeof(dl_daemon_options) / sizeof(dl_daemon_options[0]);

void dl_daemon_args_init(dl_daemon_args_t *args)
{
    memset(args, 0, sizeof(*args));
    args->listen = "127.0.0.1:29400";
}

static const dl_daemon_option_t *find(const char *arg, const char **ret_value)
{
    *ret_value = NULL;
    for (size_t i = 0; i < dl_daemon_options_count; i++) {
        const dl_daemon_option_t *o = &dl_daemon_options[i];
        size_t n = strlen(o->name);
        if (o->short_name != 0 && arg[0] == '-' && arg[1] == o->short_name && arg[2] == '\0')
            return o;
        if (strncmp(arg, "--", 2) != 0 || strncmp(arg + 2, o->name, n) != 0)
            continue;
        if (arg[2 + n] == '\0')
            return o;
        if (arg[2 + n] == '=') {
            *ret_value = arg + 3 + n;
            return o;
        }
    }
    return NULL;
}

int dl_daemon_parse(int argc, char **argv, dl_daemon_args_t *args, dl_daemon_action_t *ret_action,
                    char *err, size_t errlen)
{
    *ret_action = DL_DAEMON_RUN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *ret_action = DL_DAEMON_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            *ret_action = DL_DAEMON_VERSION;
            return 0;
        }
        const dl_daemon_option_t *o = find(a, &value);
        if (o == NULL) {
            snprintf(err, errlen, "unknown argument '%s' (see --help)", a);
            return -EINVAL;
        }
        char *field = (char *)args + o->offset;
        if (o->metavar == NULL) {
            if (value != NULL) {
                snprintf(err, errlen, "option '--%s' takes no value", o->name);
                return -EINVAL;
            }
            *(bool *)field = true;
            continue;
        }
        if (value == NULL) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "option '%s' needs a value (%s)", a, o->metavar);
                return -EINVAL;
            }
            value = argv[++i];
        }
        if (*value == '\0') {
            snprintf(err, errlen, "option '--%s' must not be empty", o->name);
            return -EINVAL;
        }
        *(const char **)field = value;
    }
    return 0;
}

void dl_daemon_print_help(void *stream)
{
    FILE *f = stream;
    fprintf(f, "Usage: dlaunchd [OPTIONS]\n\n"
               "The standalone rendezvous: serves many jobs at once, each keyed by its run id,\n"
               "and answers dlaunch status|stop|restart|events. SIGINT and SIGTERM stop it.\n\n"
               "Options:\n");
    for (size_t i = 0; i < dl_daemon_options_count; i++) {
        const dl_daemon_option_t *o = &dl_daemon_options[i];
        char lhs[64];
        int n = 0;
        if (o->short_name != 0)
            n = snprintf(lhs, sizeof(lhs), "-%c, ", o->short_name);
        snprintf(lhs + n, sizeof(lhs) - (size_t)n, "--%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        /* Wrap the help at 76 columns beside a 24-column left side. */
        const char *h = o->help;
        bool first = true;
        while (*h != '\0') {
            size_t take = strlen(h);
            if (take > 52) {
                take = 52;
                while (take > 0 && h[take] != ' ')
                    take--;
                if (take == 0)
                    take = 52;
            }
            fprintf(f, "  %-24s %.*s\n", first ? lhs : "", (int)take, h);
            first = false;
            h += take;
            while (*h == ' ')
                h++;
        }
    }
    fprintf(f, "  %-24s %s\n  %-24s %s\n", "-h, --help", "show this help and exit",
            "-V, --version", "print the version and exit");
}
