/* The event stream (--events FILE|-): one JSON object per line, each with "event" and "time"
 * (Unix seconds). A stable API for scripts; docs/events.md lists every event. */
#ifndef DL_EVENTS_H
#define DL_EVENTS_H

#include <jansson.h>

typedef struct dl_events_s dl_events_t;

/* Opens path ("-" for stdout) for appending. Returns 0 or -errno. *ret owned by the caller. */
int dl_events_open(const char *path, dl_events_t **ret);

/* Writes {"event": name, "time": now, ...fields}; steals the reference to fields (may be NULL).
 * Safe with ev == NULL (then it only drops fields). Returns 0 or -errno. */
int dl_events_emit(dl_events_t *ev, const char *name, double now, json_t *fields);

void dl_events_close(dl_events_t *ev);

#endif
