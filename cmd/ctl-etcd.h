/* dlaunch status|stop|restart|events --rdzv-backend etcd (ctl-etcd.c). */
#ifndef DL_CTL_ETCD_H
#define DL_CTL_ETCD_H

#include <jansson.h>
#include <stdbool.h>

typedef struct {
    const char *endpoints; /* HOST:PORT[,HOST:PORT...] */
    const char *rdzv_conf; /* --rdzv-conf as the agents had it (user, password_file, protocol,
                            * cacert, cert, key, prefix), or NULL */
    bool json;
    bool ranks;            /* status --ranks: every rank's figures */
    double timeout;        /* seconds a request may take on one endpoint */
    double follow_timeout; /* events: stop after this long without one; < 0 never */
    /* Decodes one job's status and prints it; 1 (said on stderr) when it is malformed. */
    int (*print_status)(const json_t *job);
} dl_ctl_etcd_opts_t;

/* status (run_id NULL: every job under /dlaunch/), stop, restart. Returns the exit code. */
int dl_ctl_etcd_control(const char *cmd, const char *run_id, const dl_ctl_etcd_opts_t *o);

/* events: the job's events so far, then new ones until job_end (or follow_timeout). */
int dl_ctl_etcd_events(const char *run_id, const dl_ctl_etcd_opts_t *o);

#endif
