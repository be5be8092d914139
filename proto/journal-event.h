/* A journal event (docs/events.md, "The rendezvous' journal") as its readers take it: the fields
 * the server's own events carry (rendezvous/codec-server.c writes them: rendezvous,
 * round_changed, job_end, log). The server's statistics (rendezvous/stats.c) decode each event
 * once by this table and read C fields. Every field optional: each event has some of them. */
#ifndef DL_PROTO_JOURNAL_EVENT_H
#define DL_PROTO_JOURNAL_EVENT_H

#include "record.h"

typedef struct {
    char *event; /* its name */
    double time; /* Unix time */
    bool has_time;
    long long round;
    bool has_round;
    char *reason; /* round_changed */
    char *cause;  /* round_changed: rdzv-core.h's cause name */
    char *status; /* job_end: succeeded, failed, stopped */
    char *level;  /* log: error, warning, info */
    char *text;   /* log */
} dl_proto_journal_event_t;

extern const dl_proto_rec_type_t dl_proto_journal_event_type;

#endif
