/* Journals and their followers. A job's record is a JSON object:
 *   {"seq": n, "events": [... the last `keep` events ...], "followers": [[conn, next], ...], ...}
 * where next is the seq the follower waits for. A new follower's replay is queued, not sent at
 * once: dl__journals_pump sends a few events per follower per call, so a thousand follows of a
 * thousand-event journal cost the loop a thousand small slices, not one long stall. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"

/* Events one follower gets per turn of a pump: the rest wait for the next turn. */
#define TURN 32

struct dl__journals_s {
    size_t keep;
    size_t max_followers;
    dl__journal_cbs_t cbs;
    void *ctx;
    json_t *jobs;    /* run id -> record */
    json_t *replays; /* [[run_id, conn], ...]: followers behind the journal's end, in turn */
};

int dl__journals_new(size_t keep, size_t max_followers, const dl__journal_cbs_t *cbs, void *ctx,
                     dl__journals_t **ret)
{
    dl__journals_t *js = calloc(1, sizeof(*js));
    if (js == NULL)
        return -ENOMEM;
    js->keep = keep > 0 ? keep : 1;
    js->max_followers = max_followers;
    js->cbs = *cbs;
    js->ctx = ctx;
    js->jobs = json_object();
    js->replays = json_array();
    if (js->jobs == NULL || js->replays == NULL) {
        dl__journals_free(js);
        return -ENOMEM;
    }
    *ret = js;
    return 0;
}

void dl__journals_free(dl__journals_t *js)
{
    if (js == NULL)
        return;
    json_decref(js->jobs);
    json_decref(js->replays);
    free(js);
}

json_t *dl__journals_get(dl__journals_t *js, const char *run_id, bool create)
{
    json_t *j = json_object_get(js->jobs, run_id);
    if (j != NULL || !create)
        return j;
    j = json_pack("{s:I, s:[], s:[]}", "seq", (json_int_t)0, "events", "followers");
    if (j == NULL || json_object_set_new(js->jobs, run_id, j) < 0)
        return NULL;
    return j;
}

bool dl__journals_mark(dl__journals_t *js, const char *run_id, const char *mark, json_int_t value)
{
    json_t *j = json_object_get(js->jobs, run_id), *was = json_object_get(j, mark);
    if (j == NULL || (json_is_integer(was) && json_integer_value(was) == value))
        return false;
    return json_object_set_new(j, mark, json_integer(value)) == 0;
}

void dl__journals_forget(dl__journals_t *js, const char *run_id)
{
    /* Queued replays of this job find no record and are dropped at their turn. */
    json_object_del(js->jobs, run_id);
}

/* The seq of the oldest event kept, or the next one when none is. */
static json_int_t first_seq(json_t *j)
{
    json_t *events = json_object_get(j, "events");
    json_t *first = json_array_get(events, 0);
    if (first != NULL)
        return json_integer_value(json_object_get(first, "seq"));
    return json_integer_value(json_object_get(j, "seq")) + 1;
}

json_int_t dl__journals_append(dl__journals_t *js, const char *run_id, json_t *event)
{
    json_t *j = dl__journals_get(js, run_id, true);
    if (j == NULL || event == NULL) {
        json_decref(event);
        return -ENOMEM;
    }
    json_int_t seq = json_integer_value(json_object_get(j, "seq")) + 1;
    json_t *events = json_object_get(j, "events");
    if (json_object_set_new(j, "seq", json_integer(seq)) < 0 ||
        json_object_set_new(event, "seq", json_integer(seq)) < 0 ||
        json_array_append(events, event) < 0) {
        json_decref(event);
        return -ENOMEM;
    }
    if (json_array_size(events) > js->keep)
        json_array_remove(events, 0);
    json_t *followers = json_object_get(j, "followers");
    for (size_t i = 0; i < json_array_size(followers);) {
        json_t *f = json_array_get(followers, i);
        uint64_t conn = (uint64_t)json_integer_value(json_array_get(f, 0));
        if (!js->cbs.alive(js->ctx, conn)) {
            json_array_remove(followers, i);
            continue;
        }
        /* One still replaying gets this event in its turn, after the ones before it. */
        if (json_integer_value(json_array_get(f, 1)) == seq) {
            js->cbs.send(js->ctx, conn, seq, event);
            json_array_set_new(f, 1, json_integer(seq + 1));
        }
        i++;
    }
    json_decref(event);
    return seq;
}

int dl__journals_follow(dl__journals_t *js, const char *run_id, uint64_t conn, json_int_t since)
{
    json_t *j = dl__journals_get(js, run_id, false);
    if (j == NULL)
        return -ENOENT;
    json_t *followers = json_object_get(j, "followers");
    for (size_t i = 0; i < json_array_size(followers);) {
        uint64_t c = (uint64_t)json_integer_value(json_array_get(json_array_get(followers, i), 0));
        if (!js->cbs.alive(js->ctx, c)) {
            json_array_remove(followers, i);
            continue;
        }
        i++;
    }
    if (json_array_size(followers) >= js->max_followers)
        return -ENOSPC;
    json_int_t first = first_seq(j), last = json_integer_value(json_object_get(j, "seq"));
    /* since is the client's: any integer, the largest included (since + 1 would overflow). */
    json_int_t next = since < first ? first : since < LLONG_MAX ? since + 1 : since;
    if (json_array_append_new(followers, json_pack("[I, I]", (json_int_t)conn, next)) < 0)
        return -ENOMEM;
    if (next <= last &&
        json_array_append_new(js->replays, json_pack("[s, I]", run_id, (json_int_t)conn)) < 0) {
        json_array_remove(followers, json_array_size(followers) - 1);
        return -ENOMEM;
    }
    return 0;
}

/* The follower entry of conn in job j, or NULL. */
static json_t *follower_of(json_t *j, uint64_t conn)
{
    size_t i;
    json_t *f;
    json_array_foreach (json_object_get(j, "followers"), i, f) {
        if ((uint64_t)json_integer_value(json_array_get(f, 0)) == conn)
            return f;
    }
    return NULL;
}

/* Sends up to n events of the replay of conn in j; returns how many it sent and sets *ret_done
 * when the follower has caught up (or is gone). */
static size_t replay_some(dl__journals_t *js, json_t *j, uint64_t conn, size_t n, bool *ret_done)
{
    json_t *f = j != NULL ? follower_of(j, conn) : NULL;
    size_t sent = 0;

    *ret_done = true;
    if (f == NULL || !js->cbs.alive(js->ctx, conn))
        return 0;
    json_t *events = json_object_get(j, "events");
    json_int_t first = first_seq(j), last = json_integer_value(json_object_get(j, "seq"));
    json_int_t next = json_integer_value(json_array_get(f, 1));
    /* Events dropped from the journal while it waited are lost to it, as to anyone. */
    if (next < first)
        next = first;
    for (; next <= last && sent < n; next++, sent++)
        js->cbs.send(js->ctx, conn, next, json_array_get(events, (size_t)(next - first)));
    json_array_set_new(f, 1, json_integer(next));
    *ret_done = next > last;
    return sent;
}

bool dl__journals_pump(dl__journals_t *js, size_t budget)
{
    /* One pass over the queue at most, so that a pump always ends. */
    size_t turns = json_array_size(js->replays);
    while (turns-- > 0 && budget > 0 && json_array_size(js->replays) > 0) {
        json_t *r = json_incref(json_array_get(js->replays, 0));
        json_array_remove(js->replays, 0);
        const char *run_id = json_string_value(json_array_get(r, 0));
        uint64_t conn = (uint64_t)json_integer_value(json_array_get(r, 1));
        bool done;
        size_t sent = replay_some(js, dl__journals_get(js, run_id, false), conn,
                                  budget < TURN ? budget : TURN, &done);
        budget -= sent;
        if (!done)
            json_array_append(js->replays, r);
        json_decref(r);
    }
    return json_array_size(js->replays) > 0;
}

bool dl__journals_pending(const dl__journals_t *js)
{
    return json_array_size(js->replays) > 0;
}
