/* What the control commands share between their table (ctl-commands.c) and their handlers
 * (ctl.c): the settings their options fill, and the handlers. */
#ifndef DL_CTL_INTERNAL_H
#define DL_CTL_INTERNAL_H

#include <stdbool.h>

struct dl_ctl_opts_s {
    const char *endpoint;
    const char *token_file;
    bool json;
    bool ranks;          /* status: every rank's figures and last operations */
    bool worker;         /* token: the worker key rather than the job key */
    bool read_only;      /* token: the HTTP side's read-only credential, for no job */
    const char *expires; /* token: the key's lifetime (--expires), NULL for the default */
    const char *before;  /* revoke: keys issued before this moment (--before), NULL for now */
    double timeout;
    bool timeout_given;
    double follow_timeout; /* events: stop after this long without one; < 0 never */
    const char **args;     /* positional arguments after the subcommand */
    int nargs;
    int backend;           /* --rdzv-backend: an index into backends[] */
    bool etcd;             /* --rdzv-backend etcd: the job's keys in etcd */
    const char *rdzv_conf; /* --rdzv-conf, for etcd */
    bool help;
};

/* Each runs command cmd with its options read and returns the exit code (docs/exit-codes.md). */
int dl__ctl_control(const char *cmd, const struct dl_ctl_opts_s *o); /* status, stop, restart */
int dl__ctl_events(const char *cmd, const struct dl_ctl_opts_s *o);
int dl__ctl_kv(const char *cmd, const struct dl_ctl_opts_s *o);
int dl__ctl_token(const char *cmd, const struct dl_ctl_opts_s *o);
int dl__ctl_revoke(const char *cmd, const struct dl_ctl_opts_s *o);

/* "dlaunch: MESSAGE" on stderr; returns 2, the exit code of a bad command line. */
int dl__ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
