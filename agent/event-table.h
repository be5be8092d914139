/* The event stream's events, declared once as data (docs/events.md, issue #31): each event is a
 * list of rows X(S, KIND, PRESENCE, name) in the order its fields are written (S is the struct,
 * bound in where a row needs it). The rows make the event's C struct (dl_ev_NAME_t), its table
 * (dl_event_table) and its typed emitter (dl_ev_NAME()); the one encoder in event-table.c writes
 * any of them, and the unit test agent-eventtable holds docs/events.md to the same table.
 * Adding a field is one row here and its words in docs/events.md; an event, its list, its line in
 * DL_EVENTS and its rows in docs/events.md.
 *
 * KIND, its C type and the type docs/events.md gives it:
 *   INT int "int"; I64 long long "int"; REAL double "float"; STR const char * "string";
 *   BOOL bool "bool"; TRUE bool "true" (written only when set); INTS const int * and
 *   int NAME_count "int[]"; STRV char *const * ending in NULL "string[]"; OBJ json_t * "object";
 *   OBJS json_t * "object[]"; OBJ_OR_STR json_t * "object or string" (the json_t * kinds are
 *   stolen, written or not).
 * PRESENCE:
 *   REQ always there; OPT there when has_NAME is set (numbers and BOOL); SET there when the
 *   pointer is not NULL or the TRUE is true; NULLABLE always there, null when has_NAME is not set
 *   (numbers) or the pointer is NULL ("KIND or null" in the docs).
 * REQ and NULLABLE fields are the docs' "always", OPT and SET ones "when they apply". */
#ifndef DL_EVENT_TABLE_H
#define DL_EVENT_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "events.h"

#define DL_EV_JOB_START(X, S)                                                                      \
    X(S, STR, REQ, run_id)                                                                         \
    X(S, INT, REQ, nodes)                                                                          \
    X(S, INT, REQ, min_nodes)                                                                      \
    X(S, INT, REQ, workers_per_node)                                                               \
    X(S, INT, REQ, max_restarts)                                                                   \
    X(S, STR, REQ, log_dir)                                                                        \
    X(S, STRV, REQ, command)                                                                       \
    X(S, INT, NULLABLE, world_size)

#define DL_EV_RENDEZVOUS(X, S)                                                                     \
    X(S, INT, REQ, round)                                                                          \
    X(S, INT, REQ, world_size)                                                                     \
    X(S, INT, REQ, node_rank)                                                                      \
    X(S, INT, REQ, nodes)                                                                          \
    X(S, INTS, REQ, ranks)                                                                         \
    X(S, STR, REQ, master_addr)                                                                    \
    X(S, INT, REQ, master_port)                                                                    \
    X(S, STR, NULLABLE, interface)                                                                 \
    X(S, BOOL, OPT, kept)

#define DL_EV_WORKER_START(X, S)                                                                   \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, local_rank)                                                                     \
    X(S, INT, REQ, pid)                                                                            \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, TRUE, SET, spare)                                                                         \
    X(S, INT, OPT, generation)

#define DL_EV_WORKER_EXIT(X, S)                                                                    \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, INT, REQ, pid)                                                                            \
    X(S, STR, SET, signal)                                                                         \
    X(S, INT, OPT, exit_code)                                                                      \
    X(S, TRUE, SET, oom)                                                                           \
    X(S, I64, OPT, mem_peak_mib)                                                                   \
    X(S, I64, OPT, mem_limit_mib)                                                                  \
    X(S, STR, SET, error)                                                                          \
    X(S, STR, SET, traceback)

#define DL_EV_WORKER_UNREAPABLE(X, S)                                                              \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, INT, REQ, pid)                                                                            \
    X(S, STR, REQ, state)                                                                          \
    X(S, STR, REQ, wchan)                                                                          \
    X(S, REAL, REQ, after_s)

#define DL_EV_LOG_WRITE_FAILED(X, S)                                                               \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, STR, REQ, path)                                                                           \
    X(S, STR, REQ, error)

#define DL_EV_WORKER_HUNG(X, S)                                                                    \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, pid)                                                                            \
    X(S, REAL, REQ, silent_s)                                                                      \
    X(S, TRUE, SET, waiting)                                                                       \
    X(S, STR, SET, diagnosis)

#define DL_EV_WORKER_TIMER_EXPIRED(X, S)                                                           \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, pid)                                                                            \
    X(S, STR, REQ, scope_id)                                                                       \
    X(S, INT, REQ, signal)                                                                         \
    X(S, REAL, REQ, overrun_s)

#define DL_EV_RANKS(X, S)                                                                          \
    X(S, STR, REQ, reason)                                                                         \
    X(S, STR, REQ, diagnosis)                                                                      \
    X(S, OBJS, NULLABLE, ranks)

#define DL_EV_STRAGGLER(X, S)                                                                      \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, node_rank)                                                                      \
    X(S, STR, REQ, host)                                                                           \
    X(S, REAL, REQ, compute_ms)                                                                    \
    X(S, REAL, REQ, median_ms)                                                                     \
    X(S, REAL, REQ, slower_pct)                                                                    \
    X(S, I64, REQ, steps)                                                                          \
    X(S, REAL, REQ, cost_samples_per_s)                                                            \
    X(S, STR, REQ, action)

#define DL_EV_RESTART(X, S)                                                                        \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, INT, OPT, round)                                                                          \
    X(S, OBJ, REQ, reason)                                                                         \
    X(S, STR, SET, diagnosis)

#define DL_EV_RECOVERY(X, S)                                                                       \
    X(S, STR, REQ, status)                                                                         \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, INT, REQ, recovery)                                                                       \
    X(S, INT, OPT, generation)                                                                     \
    X(S, INT, OPT, round)                                                                          \
    X(S, INT, REQ, max_restarts)                                                                   \
    X(S, INTS, REQ, replaced)                                                                      \
    X(S, OBJ_OR_STR, REQ, reason)                                                                  \
    X(S, I64, OPT, step)                                                                           \
    X(S, I64, OPT, steps_redone)                                                                   \
    X(S, STR, SET, source)                                                                         \
    X(S, INT, OPT, source_rank)                                                                    \
    X(S, REAL, OPT, duration_ms)                                                                   \
    X(S, STR, SET, error)                                                                          \
    X(S, STR, SET, fallback)

#define DL_EV_SIGNAL(X, S)                                                                         \
    X(S, STR, REQ, signal)                                                                         \
    X(S, BOOL, REQ, forwarded)                                                                     \
    X(S, INT, OPT, workers)

#define DL_EV_FAILOVER(X, S)                                                                       \
    X(S, STR, REQ, host)                                                                           \
    X(S, INT, REQ, port)                                                                           \
    X(S, BOOL, REQ, hosting)                                                                       \
    X(S, REAL, REQ, took_s)

#define DL_EV_JOB_END(X, S)                                                                        \
    X(S, STR, REQ, status)                                                                         \
    X(S, INT, REQ, exit_code)                                                                      \
    X(S, INT, REQ, attempts)                                                                       \
    X(S, INT, OPT, recoveries)

/* Not an event: a worker's failure as the one-node restart and recovery events give it in
 * "reason" ({rank, attempt, exit_code | signal | error, hung, ...}). */
#define DL_EV_FAILURE(X, S)                                                                        \
    X(S, INT, REQ, rank)                                                                           \
    X(S, INT, REQ, attempt)                                                                        \
    X(S, TRUE, SET, hung)                                                                          \
    X(S, TRUE, SET, oom)                                                                           \
    X(S, I64, OPT, mem_peak_mib)                                                                   \
    X(S, I64, OPT, mem_limit_mib)                                                                  \
    X(S, TRUE, SET, unreapable)                                                                    \
    X(S, STR, SET, error)                                                                          \
    X(S, STR, SET, signal)                                                                         \
    X(S, INT, OPT, exit_code)

/* Every event, in docs/events.md's order: E(name, LIST). */
#define DL_EVENTS(E)                                                                               \
    E(job_start, DL_EV_JOB_START)                                                                  \
    E(rendezvous, DL_EV_RENDEZVOUS)                                                                \
    E(worker_start, DL_EV_WORKER_START)                                                            \
    E(worker_exit, DL_EV_WORKER_EXIT)                                                              \
    E(worker_unreapable, DL_EV_WORKER_UNREAPABLE)                                                  \
    E(log_write_failed, DL_EV_LOG_WRITE_FAILED)                                                    \
    E(worker_hung, DL_EV_WORKER_HUNG)                                                              \
    E(worker_timer_expired, DL_EV_WORKER_TIMER_EXPIRED)                                            \
    E(ranks, DL_EV_RANKS)                                                                          \
    E(straggler, DL_EV_STRAGGLER)                                                                  \
    E(restart, DL_EV_RESTART)                                                                      \
    E(recovery, DL_EV_RECOVERY)                                                                    \
    E(signal, DL_EV_SIGNAL)                                                                        \
    E(failover, DL_EV_FAILOVER)                                                                    \
    E(job_end, DL_EV_JOB_END)

typedef enum {
    DL_EVK_INT,
    DL_EVK_I64,
    DL_EVK_REAL,
    DL_EVK_STR,
    DL_EVK_BOOL,
    DL_EVK_TRUE,
    DL_EVK_INTS,
    DL_EVK_STRV,
    DL_EVK_OBJ,
    DL_EVK_OBJS,
    DL_EVK_OBJ_OR_STR,
} dl_event_kind_t;

typedef enum { DL_EVP_REQ, DL_EVP_OPT, DL_EVP_SET, DL_EVP_NULLABLE } dl_event_presence_t;

typedef struct {
    const char *name;
    dl_event_kind_t kind;
    dl_event_presence_t presence;
    size_t off;
    size_t has_off;   /* OPT and NULLABLE numbers: their bool has_NAME */
    size_t count_off; /* INTS: their int NAME_count */
} dl_event_field_t;

typedef struct {
    const char *name;
    const dl_event_field_t *fields;
    size_t nfields;
} dl_event_desc_t;

/* The C types. A number or BOOL that may be left out has a bool has_NAME beside it, an INTS its
 * NAME_count. DL_EV_HAS_ has a line for each allowed KIND and PRESENCE: a row with any other
 * (an OPT string, a SET number, a REQ TRUE) does not compile. */
#define DL_EV_CT_INT(n) int n;
#define DL_EV_CT_I64(n) long long n;
#define DL_EV_CT_REAL(n) double n;
#define DL_EV_CT_STR(n) const char *n;
#define DL_EV_CT_BOOL(n) bool n;
#define DL_EV_CT_TRUE(n) bool n;
#define DL_EV_CT_INTS(n)                                                                           \
    const int *n;                                                                                  \
    int n##_count;
#define DL_EV_CT_STRV(n) char *const *n;
#define DL_EV_CT_OBJ(n) json_t *n;
#define DL_EV_CT_OBJS(n) json_t *n;
#define DL_EV_CT_OBJ_OR_STR(n) json_t *n;
#define DL_EV_HAS_INT_REQ(n)
#define DL_EV_HAS_INT_OPT(n) bool has_##n;
#define DL_EV_HAS_INT_NULLABLE(n) bool has_##n;
#define DL_EV_HAS_I64_REQ(n)
#define DL_EV_HAS_I64_OPT(n) bool has_##n;
#define DL_EV_HAS_I64_NULLABLE(n) bool has_##n;
#define DL_EV_HAS_REAL_REQ(n)
#define DL_EV_HAS_REAL_OPT(n) bool has_##n;
#define DL_EV_HAS_REAL_NULLABLE(n) bool has_##n;
#define DL_EV_HAS_BOOL_REQ(n)
#define DL_EV_HAS_BOOL_OPT(n) bool has_##n;
#define DL_EV_HAS_BOOL_NULLABLE(n) bool has_##n;
#define DL_EV_HAS_STR_REQ(n)
#define DL_EV_HAS_STR_SET(n)
#define DL_EV_HAS_STR_NULLABLE(n)
#define DL_EV_HAS_INTS_REQ(n)
#define DL_EV_HAS_INTS_SET(n)
#define DL_EV_HAS_INTS_NULLABLE(n)
#define DL_EV_HAS_STRV_REQ(n)
#define DL_EV_HAS_STRV_SET(n)
#define DL_EV_HAS_STRV_NULLABLE(n)
#define DL_EV_HAS_OBJ_REQ(n)
#define DL_EV_HAS_OBJ_SET(n)
#define DL_EV_HAS_OBJ_NULLABLE(n)
#define DL_EV_HAS_OBJS_REQ(n)
#define DL_EV_HAS_OBJS_SET(n)
#define DL_EV_HAS_OBJS_NULLABLE(n)
#define DL_EV_HAS_OBJ_OR_STR_REQ(n)
#define DL_EV_HAS_OBJ_OR_STR_SET(n)
#define DL_EV_HAS_OBJ_OR_STR_NULLABLE(n)
#define DL_EV_HAS_TRUE_SET(n)
#define DL_EV_MEMBER(S, k, p, n) DL_EV_CT_##k(n) DL_EV_HAS_##k##_##p(n)

#define DL_EV_STRUCT(name, LIST)                                                                   \
    typedef struct {                                                                               \
        LIST(DL_EV_MEMBER, _)                                                                      \
    } dl_ev_##name##_t;
DL_EVENTS(DL_EV_STRUCT)
DL_EV_STRUCT(failure, DL_EV_FAILURE)

#define DL_EV_ENUM(name, LIST) DL_EV_ID_##name,
typedef enum { DL_EVENTS(DL_EV_ENUM) DL_EV__COUNT } dl_event_id_t;

extern const dl_event_desc_t dl_event_table[DL_EV__COUNT];
extern const dl_event_desc_t dl_event_failure;

/* A new object with d's fields of data (a dl_ev_*_t), in the table's order; the json_t * fields
 * are stolen. NULL when out of memory. */
json_t *dl_event_encode(const dl_event_desc_t *d, const void *data);

/* Writes event id of data to ev (dl_events_emit); safe with ev == NULL. Returns 0 or -errno. */
int dl_event_emit(dl_events_t *ev, double now, dl_event_id_t id, const void *data);

/* The typed emitters: dl_ev_worker_start(ev, now, &(dl_ev_worker_start_t){.rank = ...}). */
#define DL_EV_EMITTER(name, LIST)                                                                  \
    static inline int dl_ev_##name(dl_events_t *ev, double now, const dl_ev_##name##_t *e)         \
    {                                                                                              \
        return dl_event_emit(ev, now, DL_EV_ID_##name, e);                                         \
    }
DL_EVENTS(DL_EV_EMITTER)

/* A worker's failure as an event's "reason" object; NULL when out of memory. */
static inline json_t *dl_ev_failure_json(const dl_ev_failure_t *f)
{
    return dl_event_encode(&dl_event_failure, f);
}

/* The docs' words for field f's type ("int", "string or null", ...) into buf. */
void dl_event_type_name(const dl_event_field_t *f, char *buf, size_t len);

/* Whether f is among docs/events.md's "always" fields (else "when they apply"). */
bool dl_event_always(const dl_event_field_t *f);

#endif
