/* dlaunchd's options: one table drives its parser, its --help and its man page (dlaunchd(8)), so
 * the three never disagree. */
#ifndef DL_DAEMON_OPTIONS_H
#define DL_DAEMON_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *listen;     /* ADDR:PORT of the rendezvous */
    const char *token_file; /* NULL: $DLAUNCH_TOKEN, else none */
    const char *http;       /* ADDR:PORT of /metrics, / and /api; NULL: off */
    /* Limits (docs/operations.md, "Limits"), as given; NULL: the default. */
    const char *max_memory;        /* MiB for every job's store and waits together */
    const char *max_jobs;          /* jobs at once */
    const char *max_jobs_per_peer; /* live jobs the JOINs of one address may create */
    const char *max_timeout;       /* seconds: the longest join timeout a job may ask for */
    const char *idle_timeout;      /* seconds an authenticated connection may do nothing */
    const char *frame_timeout;     /* seconds a frame may take to arrive */
    const char *linger;            /* seconds a finished job still answers */
    const char *revocations;       /* the file `dlaunch revoke` is kept in; NULL: memory only */
    bool verbose;
    bool help, version;
} dl_daemon_args_t;

/* The table (config/opt.h): each option's flag, value, help and default; --help, -V/--version
 * and the man page's list come from it. */
extern const struct dl_opt_table_s dl_daemon_options;

typedef enum {
    DL_DAEMON_RUN = 0,
    DL_DAEMON_HELP,
    DL_DAEMON_VERSION,
} dl_daemon_action_t;

/* Defaults: listen 127.0.0.1:29400, no token file, no HTTP, not verbose. */
void dl_daemon_args_init(dl_daemon_args_t *args);

/* Parses argv (argv[0] is the program; values point into argv). Returns 0 with *ret_action, or
 * -EINVAL with one line in err naming the argument. */
int dl_daemon_parse(int argc, char **argv, dl_daemon_args_t *args, dl_daemon_action_t *ret_action,
                    char *err, size_t errlen);

/* --help, to stream (a FILE *). */
void dl_daemon_print_help(void *stream);

#endif
