/* Internals shared by the files of the pure rendezvous core (core.c, store.c, core-util.c).
 * Nothing here knows of libuv; the server's own internals belong elsewhere. */
#ifndef DL_RDZV_CORE_INTERNAL_H
#define DL_RDZV_CORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdzv-core.h"
#include "rdzv-policy.h"

#define dl__rdzv_container_of(ptr, type, field) ((type *)((char *)(ptr)-offsetof(type, field)))

#if defined(__GNUC__)
#define DL__RDZV_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define DL__RDZV_PRINTF(f, a)
#endif

/* An intrusive chained hash map: objects embed a node and compare their own keys. */
typedef struct dl__rdzv_hnode_s {
    struct dl__rdzv_hnode_s *next;
    uint64_t hash;
} dl__rdzv_hnode_t;

typedef struct {
    dl__rdzv_hnode_t **buckets; /* NULL until the first reserve */
    size_t mask;                /* bucket count - 1; the count is a power of two */
    size_t count;
} dl__rdzv_map_t;

/* SipHash-1-3 of data under key. */
uint64_t dl__rdzv_hash(const uint64_t key[2], const void *data, size_t len);
uint64_t dl__rdzv_hash_u64(const uint64_t key[2], uint64_t v);

/* Makes room so that the next `extra` inserts cannot fail. Returns 0 or -ENOMEM. */
int dl__rdzv_map_reserve(dl__rdzv_map_t *map, size_t extra);
void dl__rdzv_map_insert(dl__rdzv_map_t *map, dl__rdzv_hnode_t *node, uint64_t hash);
void dl__rdzv_map_remove(dl__rdzv_map_t *map, dl__rdzv_hnode_t *node);
/* The chain that holds hash; walk it through ->next, comparing ->hash first. */
dl__rdzv_hnode_t *dl__rdzv_map_chain(const dl__rdzv_map_t *map, uint64_t hash);
/* Empties the map and returns its nodes as one list linked through ->next. */
dl__rdzv_hnode_t *dl__rdzv_map_take_all(dl__rdzv_map_t *map);
void dl__rdzv_map_free(dl__rdzv_map_t *map);

/* Deadlines live in one indexed min-heap, so arming, moving and disarming are O(log n) and an
 * expired timer finds its owner through container_of by kind. */
enum {
    DL__RDZV_T_LAST_CALL = 1,
    DL__RDZV_T_JOIN,
    DL__RDZV_T_LINGER,
    DL__RDZV_T_HEARTBEAT,
    DL__RDZV_T_WAIT,
};

#define DL__RDZV_UNARMED SIZE_MAX

typedef struct {
    double at;
    uint64_t seq; /* breaks ties in arming order so runs are reproducible */
    size_t idx;   /* position in the heap, DL__RDZV_UNARMED when not armed */
    int kind;
} dl__rdzv_timer_t;

typedef struct {
    dl__rdzv_timer_t **v;
    size_t n;
    size_t cap;
    uint64_t seq;
} dl__rdzv_heap_t;

void dl__rdzv_timer_init(dl__rdzv_timer_t *t, int kind);
static inline bool dl__rdzv_timer_armed(const dl__rdzv_timer_t *t)
{
    return t->idx != DL__RDZV_UNARMED;
}
/* Room for `extra` more armed timers. Returns 0 or -ENOMEM. */
int dl__rdzv_heap_reserve(dl__rdzv_heap_t *heap, size_t extra);
/* Arms or moves t; arming a timer that was not armed needs room reserved beforehand. */
void dl__rdzv_timer_arm(dl__rdzv_heap_t *heap, dl__rdzv_timer_t *t, double at);
void dl__rdzv_timer_disarm(dl__rdzv_heap_t *heap, dl__rdzv_timer_t *t);
dl__rdzv_timer_t *dl__rdzv_heap_top(const dl__rdzv_heap_t *heap);
void dl__rdzv_heap_free(dl__rdzv_heap_t *heap);

/* Memory for one step's messages, logs and status snapshots; reset at the next step. */
typedef struct dl__rdzv_block_s dl__rdzv_block_t;
typedef struct {
    dl__rdzv_block_t *head;
} dl__rdzv_arena_t;

void *dl__rdzv_arena_alloc(dl__rdzv_arena_t *arena, size_t size);
void dl__rdzv_arena_reset(dl__rdzv_arena_t *arena);
void dl__rdzv_arena_free(dl__rdzv_arena_t *arena);

typedef struct dl__rdzv_job_s dl__rdzv_job_t;
typedef struct dl__rdzv_member_s dl__rdzv_member_t;
typedef struct dl__rdzv_conn_s dl__rdzv_conn_t;
typedef struct dl__rdzv_waiter_s dl__rdzv_waiter_t;
typedef struct dl__rdzv_entry_s dl__rdzv_entry_t;

/* What the core knows of a connection: the member that joined on it and the WAITs it made. It
 * exists only while one of those does. */
struct dl__rdzv_conn_s {
    dl__rdzv_hnode_t node;
    uint64_t id;
    dl__rdzv_member_t *member;
    dl__rdzv_waiter_t *waiters; /* through conn_prev/conn_next */
    size_t nwaiters;
};

/* One key waited on by one WAIT, linked into the key's entry. */
typedef struct dl__rdzv_link_s {
    struct dl__rdzv_link_s *prev;
    struct dl__rdzv_link_s *next;
    dl__rdzv_entry_t *entry;
    dl__rdzv_waiter_t *waiter;
    bool satisfied; /* on the entry's satisfied list (the key exists) */
} dl__rdzv_link_t;

/* A key of the store. An entry without a value stays only while some WAIT is linked to it. */
struct dl__rdzv_entry_s {
    dl__rdzv_hnode_t node;
    dl__rdzv_link_t *pending;   /* WAITs still missing this key */
    dl__rdzv_link_t *satisfied; /* WAITs that counted this key as present */
    size_t npending;
    size_t nsatisfied;
    unsigned char *value;
    size_t value_len;
    bool present;
    size_t key_len;
    unsigned char key[];
};

struct dl__rdzv_waiter_s {
    dl__rdzv_waiter_t *job_prev, *job_next;
    dl__rdzv_waiter_t *conn_prev, *conn_next;
    dl__rdzv_conn_t *conn;
    dl__rdzv_job_t *job;
    uint64_t req_id;
    dl__rdzv_timer_t timer;
    double timeout;
    size_t nmissing;
    size_t nlinks;
    size_t nkeys; /* links allocated: what it is charged for */
    dl__rdzv_link_t links[];
};

typedef struct {
    dl__rdzv_map_t keys;
    dl__rdzv_waiter_t *waiters; /* through job_prev/job_next */
    size_t nwaiters;
    size_t bytes;    /* keys and values held */
    size_t npresent; /* keys with a value (the others are only waited on) */
    size_t memory;   /* all this store holds, entries and waits included (core->memory's share) */
} dl__rdzv_store_t;

struct dl__rdzv_member_s {
    dl__rdzv_hnode_t node; /* in the job's members, by agent id */
    dl__rdzv_job_t *job;
    dl__rdzv_conn_t *conn; /* NULL when its connection went away */
    const char *agent_id;
    const char *host;
    const char *master_addr; /* NULL: host */
    int master_port;
    int slots;
    int hint;
    int slurm_node_id;
    int node_rank; /* -1 until the round closes */
    int first_rank;
    double last_seen;
    dl__rdzv_timer_t heartbeat;
    size_t idx; /* in job->members */
    bool left;
};

struct dl__rdzv_job_s {
    dl__rdzv_hnode_t node;       /* in core->jobs, by run id */
    dl__rdzv_job_t *prev, *next; /* every job in creation order, for status */
    dl__rdzv_job_t *grave_next;
    const char *run_id;
    uint64_t creator; /* 0, or who created it (counted in core->creators) */
    dl_rdzv_job_opts_t opts;
    dl_rdzv_job_state_t state;
    int round;
    int restarts;
    dl__rdzv_map_t by_agent;
    dl__rdzv_member_t **members; /* of the current round */
    size_t nmembers;
    size_t members_cap;
    /* The node-rank rule's room (rdzv-policy.h), members_cap of each, grown with members so
     * that closing a round needs no memory. */
    dl_rdzv_policy_node_t *rank_nodes;
    dl_rdzv_policy_node_t **rank_order;
    bool *rank_taken;
    dl__rdzv_member_t **hint_owner; /* max_nodes slots, allocated at the first hint */
    size_t nhints;
    int64_t slots_sum;
    size_t nleft;
    int world_size;
    int host_node_rank; /* of the agent this rendezvous is embedded in, or -1 */
    char master_addr[DL_RDZV_MAX_NAME + 1];
    int master_port;
    char *failure;                   /* the first failure's description */
    dl_rdzv_culprit_t first_culprit; /* its strings owned here; text is failure */
    bool has_culprit;
    /* Who ended the last round, for the assignments of this one: an agent that was cut off
     * when it ended heard no round change. Strings owned here. */
    dl_rdzv_culprit_t round_culprit;
    bool has_round_culprit;
    /* The last worker failure that ended a round, compared with the next one (its strings are
     * not kept), and how many rounds in a row ended with that same failure. */
    dl_rdzv_culprit_t same_culprit;
    int same_failures;
    /* How a failed job ended, as its members heard it, for a member that comes back after
     * (cut off when it ended): why (owned here, or NULL), its cause, and the same-failure count
     * (exit 5 when > 0). */
    char *end_why;
    dl_rdzv_cause_t end_cause;
    int end_same;
    dl__rdzv_timer_t last_call;
    dl__rdzv_timer_t join;
    dl__rdzv_timer_t linger;
    dl__rdzv_store_t store;
};

struct dl_rdzv_core_s {
    dl_rdzv_core_opts_t opts;
    char *store_host;
    char *host_agent_id;
    dl__rdzv_map_t jobs;
    dl__rdzv_job_t *first_job, *last_job;
    size_t njobs;
    dl__rdzv_job_t *graveyard; /* removed jobs, freed at the next step: messages still point in */
    dl__rdzv_map_t conns;
    dl__rdzv_map_t creators; /* creator -> live jobs it made */
    size_t memory;           /* every store's memory together, against opts.max_memory */
    const size_t *replies;   /* the server's replies written but not yet sent (NULL: none) */
    dl__rdzv_heap_t heap;
    dl_rdzv_action_t *acts;
    size_t nacts;
    size_t acts_cap;
    bool oom;                 /* an action could not be recorded this step */
    dl_rdzv_action_t scratch; /* where actions that go nowhere are written */
    dl__rdzv_arena_t arena;
    double now;
    bool armed;
    double armed_at;
};

/* Actions. Reserve room first: pushes past it grow the list, and if that fails the action is lost
 * and the step reports -ENOMEM. */
int dl__rdzv_reserve(dl_rdzv_core_t *core, size_t n);
dl_rdzv_action_t *dl__rdzv_push(dl_rdzv_core_t *core, dl_rdzv_action_kind_t kind);
/* A message to conn; replies to DL_RDZV_CONN_NONE are written nowhere. */
dl_rdzv_msg_t *dl__rdzv_send(dl_rdzv_core_t *core, uint64_t conn, dl_rdzv_msg_kind_t kind,
                             uint64_t req_id, const char *run_id);
void dl__rdzv_close(dl_rdzv_core_t *core, uint64_t conn);
void dl__rdzv_error(dl_rdzv_core_t *core, uint64_t conn, uint64_t req_id, const char *run_id,
                    int code, const char *fmt, ...) DL__RDZV_PRINTF(6, 7);
void dl__rdzv_log(dl_rdzv_core_t *core, dl_rdzv_log_level_t level, const char *run_id,
                  const char *fmt, ...) DL__RDZV_PRINTF(4, 5);
/* A copy of c in the step's arena; NULL when memory runs out (the round change then names no
 * culprit, only its text). */
dl_rdzv_culprit_t *dl__rdzv_culprit(dl_rdzv_core_t *core, dl_rdzv_culprit_t c);
/* A string in the step's arena; never NULL (a fixed text stands in when memory runs out). */
const char *dl__rdzv_printf(dl_rdzv_core_t *core, const char *fmt, ...) DL__RDZV_PRINTF(2, 3);

/* Connections. */
dl__rdzv_conn_t *dl__rdzv_conn_find(dl_rdzv_core_t *core, uint64_t id);
/* Finds or creates. Returns 0 or -ENOMEM. */
int dl__rdzv_conn_get(dl_rdzv_core_t *core, uint64_t id, dl__rdzv_conn_t **ret_conn);
/* Frees conn once neither a member nor a WAIT refers to it. */
void dl__rdzv_conn_gc(dl_rdzv_core_t *core, dl__rdzv_conn_t *conn);

/* The store (store.c). */
void dl__rdzv_store_init(dl__rdzv_store_t *store);
/* Serves one STORE_* event for job. */
void dl__rdzv_store_request(dl_rdzv_core_t *core, dl__rdzv_job_t *job, const dl_rdzv_event_t *ev,
                            double now);
/* Drops every key; every WAIT gets an ERROR with code and message unless code is 0. */
void dl__rdzv_store_clear(dl_rdzv_core_t *core, dl__rdzv_job_t *job, int code, const char *message);
void dl__rdzv_store_wait_expired(dl_rdzv_core_t *core, dl__rdzv_timer_t *timer, double now);
/* The connection went away: its WAITs go without a reply. Leaves conn for the caller to gc. */
void dl__rdzv_store_drop_conn(dl_rdzv_core_t *core, dl__rdzv_conn_t *conn);

#endif
