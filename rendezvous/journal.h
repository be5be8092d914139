/* Every job's journal: the last events of the job (what `dlaunch events` prints), who follows
 * them, and the paced replay of the journal to a new follower, so that no request can hold the
 * loop for longer than a small slice however long the journal or however many the followers.
 * Lives inside the server, on its loop thread. Internal to rendezvous/. */
#ifndef DL_RDZV_JOURNAL_H
#define DL_RDZV_JOURNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dl__journals_s dl__journals_t;
typedef struct dl__journal_s dl__journal_t; /* one job's */

typedef struct {
    /* Sends event (borrowed), number seq, to the follower on conn. */
    void (*send)(void *ctx, uint64_t conn, json_int_t seq, const json_t *event);
    /* Whether conn is still there to be sent to; a follower that is not is dropped. */
    bool (*alive)(void *ctx, uint64_t conn);
} dl__journal_cbs_t;

/* keep: events kept per job; max_followers: followers per job. Returns 0 or -ENOMEM. */
int dl__journals_new(size_t keep, size_t max_followers, const dl__journal_cbs_t *cbs, void *ctx,
                     dl__journals_t **ret);
void dl__journals_free(dl__journals_t *js);

/* The job's journal (borrowed; the server keeps its own marks in it, such as the last round it
 * journaled), created empty when create is set. NULL when absent, or out of memory. */
dl__journal_t *dl__journals_get(dl__journals_t *js, const char *run_id, bool create);

/* One of the server's marks in the job's journal record (its own names, say the last round it
 * journaled): set to value. Returns false when it was value already, or the job has no journal;
 * true when it changed. */
bool dl__journals_mark(dl__journals_t *js, const char *run_id, const char *mark, json_int_t value);

/* Drops the job's journal and its followers: the job is forgotten, and a later job of the same
 * run id starts its own story. */
void dl__journals_forget(dl__journals_t *js, const char *run_id);

/* Appends event (stolen; "seq" is set here) to the job's journal, creating it, and sends it to
 * every follower that has seen all before it (the others get it from their replay). Returns
 * the event's seq, or -ENOMEM. */
json_int_t dl__journals_append(dl__journals_t *js, const char *run_id, json_t *event);

/* conn follows the job's events after seq since (0: from the start of what is kept). What is
 * already there is sent by dl__journals_pump, a slice at a time. Returns 0, -ENOENT (no journal:
 * no such job), -ENOSPC (the job has max_followers already) or -ENOMEM. */
int dl__journals_follow(dl__journals_t *js, const char *run_id, uint64_t conn, json_int_t since);

/* Sends at most budget events of pending replays, a few per follower in turn. Returns whether
 * some replay still has events to send. */
bool dl__journals_pump(dl__journals_t *js, size_t budget);

/* Whether some replay has events left to send. */
bool dl__journals_pending(const dl__journals_t *js);

#endif
