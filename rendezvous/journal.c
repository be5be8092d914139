/* Journals and their followers. A job's journal is a C record: its last seq, a ring of the last
 * `keep` events (JSON: they are the wire's events, sent as they are), its followers with the
 * seq each waits for, and the server's marks. A new follower's replay is queued, not sent at
 * once: dl__journals_pump sends a few events per follower per call, so a thousand follows of a
 * thousand-event journal cost the loop a thousand small slices, not one long stall. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core-internal.h"
#include "journal.h"
#include "proto.h"

/* Events one follower gets per turn of a pump: the rest wait for the next turn. */
#define TURN 32

typedef struct {
    uint64_t conn;
    json_int_t next; /* the seq it waits for */
} follower_t;

typedef struct {
    char *name;
    json_int_t value;
} mark_t;

struct dl__journal_s {
    dl__rdzv_hnode_t node;
    char *run_id;
    json_int_t seq;  /* the last event's; 0: none yet */
    json_t **events; /* event seq s at (s - 1) % keep; grows to keep */
    size_t cap;      /* of events */
    size_t nevents;  /* kept: the last nevents seqs */
    follower_t *followers;
    size_t nfollowers;
    mark_t *marks;
    size_t nmarks;
};

/* A follower behind the journal's end, waiting for its turn. By run id, not by journal: one
 * forgotten meanwhile is found gone at its turn. */
typedef struct {
    char *run_id;
    uint64_t conn;
} replay_t;

struct dl__journals_s {
    size_t keep;
    size_t max_followers;
    dl__journal_cbs_t cbs;
    void *ctx;
    uint64_t hash_key[2];
    dl__rdzv_map_t jobs;
    replay_t *replays; /* a ring: head, count, cap */
    size_t rhead, nreplays, rcap;
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
    /* Run ids are the clients': a key of our own keeps them from choosing the chains. */
    if (dl_proto_random(js->hash_key, sizeof(js->hash_key)) < 0) {
        js->hash_key[0] = (uint64_t)(uintptr_t)js;
        js->hash_key[1] = 0x9e3779b97f4a7c15ull;
    }
    *ret = js;
    return 0;
}

static void journal_free(dl__journal_t *j)
{
    if (j == NULL)
        return;
    for (size_t i = 0; i < j->cap; i++)
        json_decref(j->events[i]);
    for (size_t i = 0; i < j->nmarks; i++)
        free(j->marks[i].name);
    free(j->events);
    free(j->followers);
    free(j->marks);
    free(j->run_id);
    free(j);
}

void dl__journals_free(dl__journals_t *js)
{
    if (js == NULL)
        return;
    dl__rdzv_hnode_t *n = dl__rdzv_map_take_all(&js->jobs);
    while (n != NULL) {
        dl__rdzv_hnode_t *next = n->next;
        journal_free(dl__rdzv_container_of(n, dl__journal_t, node));
        n = next;
    }
    dl__rdzv_map_free(&js->jobs);
    for (size_t i = 0; i < js->nreplays; i++)
        free(js->replays[(js->rhead + i) % js->rcap].run_id);
    free(js->replays);
    free(js);
}

static uint64_t hash_of(const dl__journals_t *js, const char *run_id)
{
    return dl__rdzv_hash(js->hash_key, run_id, strlen(run_id));
}

static dl__journal_t *find(const dl__journals_t *js, const char *run_id)
{
    uint64_t h = hash_of(js, run_id);
    for (dl__rdzv_hnode_t *n = dl__rdzv_map_chain(&js->jobs, h); n != NULL; n = n->next) {
        dl__journal_t *j = dl__rdzv_container_of(n, dl__journal_t, node);
        if (n->hash == h && strcmp(j->run_id, run_id) == 0)
            return j;
    }
    return NULL;
}

dl__journal_t *dl__journals_get(dl__journals_t *js, const char *run_id, bool create)
{
    dl__journal_t *j = find(js, run_id);
    if (j != NULL || !create)
        return j;
    j = calloc(1, sizeof(*j));
    if (j == NULL || (j->run_id = strdup(run_id)) == NULL ||
        dl__rdzv_map_reserve(&js->jobs, 1) < 0) {
        journal_free(j);
        return NULL;
    }
    dl__rdzv_map_insert(&js->jobs, &j->node, hash_of(js, run_id));
    return j;
}

bool dl__journals_mark(dl__journals_t *js, const char *run_id, const char *mark, json_int_t value)
{
    dl__journal_t *j = find(js, run_id);
    if (j == NULL)
        return false;
    for (size_t i = 0; i < j->nmarks; i++)
        if (strcmp(j->marks[i].name, mark) == 0) {
            if (j->marks[i].value == value)
                return false;
            j->marks[i].value = value;
            return true;
        }
    mark_t *m = realloc(j->marks, (j->nmarks + 1) * sizeof(*m));
    if (m == NULL)
        return false;
    j->marks = m;
    if ((m[j->nmarks].name = strdup(mark)) == NULL)
        return false;
    m[j->nmarks++].value = value;
    return true;
}

void dl__journals_forget(dl__journals_t *js, const char *run_id)
{
    /* Queued replays of this job find no journal and are dropped at their turn. */
    dl__journal_t *j = find(js, run_id);
    if (j == NULL)
        return;
    dl__rdzv_map_remove(&js->jobs, &j->node);
    journal_free(j);
}

/* The seq of the oldest event kept, or the next one when none is. */
static json_int_t first_seq(const dl__journal_t *j)
{
    return j->seq - (json_int_t)j->nevents + 1;
}

static json_t *event_at(const dl__journals_t *js, const dl__journal_t *j, json_int_t seq)
{
    return j->events[(size_t)(seq - 1) % js->keep];
}

/* Drops the followers whose connection is gone. */
static void prune(dl__journals_t *js, dl__journal_t *j)
{
    size_t k = 0;
    for (size_t i = 0; i < j->nfollowers; i++)
        if (js->cbs.alive(js->ctx, j->followers[i].conn))
            j->followers[k++] = j->followers[i];
    j->nfollowers = k;
}

json_int_t dl__journals_append(dl__journals_t *js, const char *run_id, json_t *event)
{
    dl__journal_t *j = dl__journals_get(js, run_id, true);
    if (j == NULL || event == NULL) {
        json_decref(event);
        return -ENOMEM;
    }
    /* Until the ring is full, event s sits at s - 1: growing keeps every index. */
    if (j->nevents == j->cap && j->cap < js->keep) {
        size_t cap = j->cap == 0 ? 16 : j->cap * 2;
        cap = cap < js->keep ? cap : js->keep;
        json_t **ev = realloc(j->events, cap * sizeof(*ev));
        if (ev == NULL) {
            json_decref(event);
            return -ENOMEM;
        }
        memset(ev + j->cap, 0, (cap - j->cap) * sizeof(*ev));
        j->events = ev;
        j->cap = cap;
    }
    json_int_t seq = j->seq + 1;
    if (json_object_set_new(event, "seq", json_integer(seq)) < 0) {
        json_decref(event);
        return -ENOMEM;
    }
    size_t slot = (size_t)(seq - 1) % js->keep;
    json_decref(j->events[slot]); /* the oldest, once the ring is full */
    j->events[slot] = event;
    j->seq = seq;
    if (j->nevents < js->keep)
        j->nevents++;
    prune(js, j);
    for (size_t i = 0; i < j->nfollowers; i++) {
        follower_t *f = &j->followers[i];
        /* One still replaying gets this event in its turn, after the ones before it. */
        if (f->next == seq) {
            js->cbs.send(js->ctx, f->conn, seq, event);
            f->next = seq + 1;
        }
    }
    return seq;
}

static int queue_replay(dl__journals_t *js, char *run_id, uint64_t conn)
{
    if (js->nreplays == js->rcap) {
        size_t cap = js->rcap == 0 ? 8 : js->rcap * 2;
        replay_t *r = malloc(cap * sizeof(*r));
        if (r == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < js->nreplays; i++)
            r[i] = js->replays[(js->rhead + i) % js->rcap];
        free(js->replays);
        js->replays = r;
        js->rcap = cap;
        js->rhead = 0;
    }
    js->replays[(js->rhead + js->nreplays++) % js->rcap] = (replay_t){run_id, conn};
    return 0;
}

int dl__journals_follow(dl__journals_t *js, const char *run_id, uint64_t conn, json_int_t since)
{
    dl__journal_t *j = find(js, run_id);
    if (j == NULL)
        return -ENOENT;
    prune(js, j);
    if (j->nfollowers >= js->max_followers)
        return -ENOSPC;
    json_int_t first = first_seq(j), last = j->seq;
    /* since is the client's: any integer, the largest included (since + 1 would overflow). */
    json_int_t next = since < first ? first : since < LLONG_MAX ? since + 1 : since;
    follower_t *f = realloc(j->followers, (j->nfollowers + 1) * sizeof(*f));
    if (f == NULL)
        return -ENOMEM;
    j->followers = f;
    if (next <= last) {
        char *id = strdup(run_id);
        if (id == NULL || queue_replay(js, id, conn) < 0) {
            free(id);
            return -ENOMEM;
        }
    }
    f[j->nfollowers++] = (follower_t){conn, next};
    return 0;
}

/* The follower entry of conn in job j, or NULL. */
static follower_t *follower_of(dl__journal_t *j, uint64_t conn)
{
    for (size_t i = 0; i < j->nfollowers; i++)
        if (j->followers[i].conn == conn)
            return &j->followers[i];
    return NULL;
}

/* Sends up to n events of the replay of conn in j; returns how many it sent and sets *ret_done
 * when the follower has caught up (or is gone). */
static size_t replay_some(dl__journals_t *js, dl__journal_t *j, uint64_t conn, size_t n,
                          bool *ret_done)
{
    follower_t *f = j != NULL ? follower_of(j, conn) : NULL;
    size_t sent = 0;

    *ret_done = true;
    if (f == NULL || !js->cbs.alive(js->ctx, conn))
        return 0;
    json_int_t first = first_seq(j), last = j->seq;
    json_int_t next = f->next;
    /* Events dropped from the journal while it waited are lost to it, as to anyone. */
    if (next < first)
        next = first;
    for (; next <= last && sent < n; next++, sent++)
        js->cbs.send(js->ctx, conn, next, event_at(js, j, next));
    f->next = next;
    *ret_done = next > last;
    return sent;
}

bool dl__journals_pump(dl__journals_t *js, size_t budget)
{
    /* One pass over the queue at most, so that a pump always ends. */
    size_t turns = js->nreplays;
    while (turns-- > 0 && budget > 0 && js->nreplays > 0) {
        replay_t r = js->replays[js->rhead];
        js->rhead = (js->rhead + 1) % js->rcap;
        js->nreplays--;
        bool done;
        size_t sent =
            replay_some(js, find(js, r.run_id), r.conn, budget < TURN ? budget : TURN, &done);
        budget -= sent;
        /* Back in the queue: a slot was just freed, so this cannot fail. */
        if (!done)
            (void)queue_replay(js, r.run_id, r.conn);
        else
            free(r.run_id);
    }
    return js->nreplays > 0;
}

bool dl__journals_pending(const dl__journals_t *js)
{
    return js->nreplays > 0;
}
