/* The message table: every type, who may send it, its fields and their JSON types, in one place.
 * docs/protocol.md describes the same table for people; change both together. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

#define I32 INT32_MAX
#define TEXT_MAX 1024 /* reasons and other free text */
/* json_int_t is long long wherever jansson has strtoll, which is everywhere we build. */
#define JINT_MIN LLONG_MIN
#define JINT_MAX LLONG_MAX

#define REQ(n, k, lo, hi)                                                                          \
    {                                                                                              \
        .name = (n), .kind = (k), .required = true, .min = (lo), .max = (hi)                       \
    }
#define OPT(n, k, lo, hi)                                                                          \
    {                                                                                              \
        .name = (n), .kind = (k), .required = false, .min = (lo), .max = (hi)                      \
    }
#define END                                                                                        \
    {                                                                                              \
        .name = NULL                                                                               \
    }

#define AGENT DL_PROTO_ROLE_AGENT
#define WORKER DL_PROTO_ROLE_WORKER
#define CONTROL DL_PROTO_ROLE_CONTROL
#define SERVER DL_PROTO_ROLE_SERVER
#define CLIENTS (AGENT | WORKER | CONTROL)

static const dl__field_t hello_fields[] = {
    REQ("role", DL__F_ROLE, 0, 0),
    REQ("run_id", DL__F_RUN_ID, 0, 0),
    REQ("proto", DL__F_INT, 1, I32),
    OPT("client", DL__F_STR, 1, DL_PROTO_NAME_MAX),
    /* The client's own nonce: asks the server to prove the key back in auth_ok. */
    OPT("nonce", DL__F_HEX, DL_PROTO_NONCE_HEX_LEN, DL_PROTO_NONCE_HEX_LEN),
    END,
};

static const dl__field_t challenge_fields[] = {
    REQ("nonce", DL__F_HEX, DL_PROTO_NONCE_HEX_LEN, DL_PROTO_NONCE_HEX_LEN),
    END,
};

static const dl__field_t auth_fields[] = {
    REQ("proof", DL__F_HEX, DL_PROTO_PROOF_HEX_LEN, DL_PROTO_PROOF_HEX_LEN),
    /* The span of a job or worker key (its text has them): a server holding the master derives
     * the key from them. */
    OPT("key_issued", DL__F_INT, 0, DL_PROTO_KEY_TIME_MAX),
    OPT("key_expires", DL__F_INT, 0, DL_PROTO_KEY_TIME_MAX),
    END,
};

static const dl__field_t revoke_fields[] = {
    REQ("before", DL__F_INT, 1, DL_PROTO_KEY_TIME_MAX),
    END,
};

static const dl__field_t auth_ok_fields[] = {
    OPT("heartbeat_ms", DL__F_INT, 1, 86400000),
    /* The server's proof over the client's nonce, when hello carried one. */
    OPT("proof", DL__F_HEX, DL_PROTO_PROOF_HEX_LEN, DL_PROTO_PROOF_HEX_LEN),
    END,
};

static const dl__field_t join_fields[] = {
    /* Names and addresses end up in logs, terminals and workers' environments: no spaces, no
     * control characters. */
    REQ("node_id", DL__F_NAME, 1, DL_PROTO_NAME_MAX),
    REQ("host", DL__F_ADDR, 1, DL_PROTO_NAME_MAX),
    REQ("slots", DL__F_INT, 1, 65536),
    OPT("node_rank", DL__F_INT, -1, I32),
    OPT("slurm_node_id", DL__F_INT, -1, I32),
    OPT("round", DL__F_INT, 0, I32),
    OPT("failures", DL__F_INT, 0, I32), /* restarts spent, for a restarted rendezvous */
    /* The job's parameters, from the agent's job spec: the first join of a job sets them on a
     * server that was not started with its own. */
    OPT("min_nodes", DL__F_INT, 1, 1000000),
    OPT("max_nodes", DL__F_INT, 1, 1000000),
    OPT("max_restarts", DL__F_INT, 0, I32),
    OPT("max_same_failures", DL__F_INT, 0, 1000000), /* 0: never */
    OPT("last_call_ms", DL__F_INT, 0, JINT_MAX),
    OPT("join_timeout_ms", DL__F_INT, 0, JINT_MAX),
    OPT("dead_after_ms", DL__F_INT, 0, JINT_MAX),
    /* Where this node would host MASTER_ADDR:MASTER_PORT if it becomes node rank 0; port 0 for
     * none. */
    OPT("master_addr", DL__F_ADDR, 1, DL_PROTO_NAME_MAX),
    OPT("master_port", DL__F_INT, 0, 65535),
    /* Asks a server serving many jobs (dlaunchd) to serve the job's store in torch's protocol
     * (docs/store.md). */
    OPT("torch_store", DL__F_BOOL, 0, 0),
    END,
};

static const dl__field_t assignment_fields[] = {
    REQ("round", DL__F_INT, 0, I32),
    REQ("node_rank", DL__F_INT, 0, I32),
    REQ("nodes", DL__F_INT, 1, I32),
    REQ("world_size", DL__F_INT, 1, I32),
    REQ("first_rank", DL__F_INT, 0, I32),
    REQ("local_world_size", DL__F_INT, 1, 65536),
    REQ("master_addr", DL__F_ADDR, 1, DL_PROTO_NAME_MAX),
    REQ("master_port", DL__F_INT, 1, 65535),
    REQ("store_addr", DL__F_ADDR, 1, DL_PROTO_NAME_MAX),
    OPT("restart_count", DL__F_INT, 0, I32),
    OPT("failures", DL__F_INT, 0, I32),
    OPT("max_restarts", DL__F_INT, 0, I32),
    /* Where the rendezvous is hosted again if its host dies (an agent's embedded one). */
    OPT("successors", DL__F_STRV, 0, 8),
    OPT("host_node_rank", DL__F_INT, 0, I32), /* the agent hosting an embedded rendezvous */
    /* MASTER_ADDR:MASTER_PORT is the job's store in torch's protocol, served by the rendezvous
     * (TORCHELASTIC_USE_AGENT_STORE=True); else the workers' rank 0 hosts it there. */
    OPT("torch_store", DL__F_BOOL, 0, 0),
    END,
};

/* The training progress an agent passes on with its heartbeat, when its workers report one: for
 * the status page and /api; the server keeps a few minutes of it per job. */
static const dl__field_t progress_fields[] = {
    REQ("step", DL__F_INT, 0, JINT_MAX),
    OPT("loss", DL__F_NUM, 0, 0),
    OPT("samples_per_s", DL__F_NUM, 0, 0),
    END,
};

static const dl__field_t heartbeat_fields[] = {
    REQ("round", DL__F_INT, 0, I32),
    OPT("workers", DL__F_INT, 0, 65536),
    {.name = "progress", .kind = DL__F_OBJ, .required = false, .sub = progress_fields},
    /* The node's figures and its ranks' last operations (diag.h checks the inside). */
    OPT("diag", DL__F_OBJ, 0, 0),
    END,
};

static const dl__field_t reason_fields[] = {
    OPT("reason", DL__F_STR, 1, TEXT_MAX),
    END,
};

static const dl__field_t worker_failed_fields[] = {
    REQ("round", DL__F_INT, 0, I32),
    REQ("rank", DL__F_INT, 0, I32),
    OPT("local_rank", DL__F_INT, 0, 65535),
    OPT("exit_code", DL__F_INT, 0, 255),
    OPT("signal", DL__F_INT, 1, 127),
    OPT("reason", DL__F_STR, 1, TEXT_MAX),
    OPT("time", DL__F_NUM, 0, 0),
    OPT("log_tail", DL__F_STR, 0, 65536),
    OPT("diag", DL__F_OBJ, 0, 0),
    OPT("excluded", DL__F_BOOL, 0, 0), /* the node steps out as a straggler */
    OPT("hung", DL__F_BOOL, 0, 0),     /* killed by the hang watchdog */
    OPT("oom", DL__F_BOOL, 0, 0),      /* killed by the kernel's OOM killer */
    /* The furthest training step the node's workers reported in the round (none: unknown). */
    OPT("step", DL__F_INT, 0, JINT_MAX),
    END,
};

static const dl__field_t node_done_fields[] = {
    REQ("round", DL__F_INT, 0, I32),
    END,
};

static const dl__field_t round_changed_fields[] = {
    REQ("round", DL__F_INT, 0, I32),
    REQ("reason", DL__F_STR, 1, TEXT_MAX),
    OPT("restart_count", DL__F_INT, 0, I32),
    OPT("failed_rank", DL__F_INT, 0, I32),
    OPT("failed_node", DL__F_NAME, 1, DL_PROTO_NAME_MAX),
    OPT("cause", DL__F_NAME, 1, DL_PROTO_NAME_MAX),
    OPT("failure", DL__F_OBJ, 0, 0),
    END,
};

static const dl__field_t shutdown_fields[] = {
    REQ("reason", DL__F_STR, 1, TEXT_MAX),
    REQ("exit_code", DL__F_INT, 0, 255),
    OPT("failure", DL__F_OBJ, 0, 0),
    END,
};

static const dl__field_t kv_key_fields[] = {
    REQ("key", DL__F_STR, 1, DL_PROTO_KEY_MAX),
    END,
};

static const dl__field_t kv_set_fields[] = {
    REQ("key", DL__F_STR, 1, DL_PROTO_KEY_MAX),
    REQ("value", DL__F_STR, 0, DL_PROTO_LIMIT),
    END,
};

static const dl__field_t kv_add_fields[] = {
    REQ("key", DL__F_STR, 1, DL_PROTO_KEY_MAX),
    REQ("delta", DL__F_INT, JINT_MIN, JINT_MAX),
    END,
};

static const dl__field_t kv_wait_fields[] = {
    REQ("keys", DL__F_STRV, 1, DL_PROTO_WAIT_KEYS_MAX),
    REQ("timeout_ms", DL__F_INT, 0, I32),
    END,
};

static const dl__field_t kv_cas_fields[] = {
    REQ("key", DL__F_STR, 1, DL_PROTO_KEY_MAX),
    REQ("expected", DL__F_STR_OR_NULL, 0, DL_PROTO_LIMIT),
    REQ("value", DL__F_STR, 0, DL_PROTO_LIMIT),
    END,
};

static const dl__field_t events_follow_fields[] = {
    OPT("since", DL__F_INT, 0, JINT_MAX),
    END,
};

/* The agent's --events lines: "event" and "time" first, then whatever fields the event has. */
static const dl__field_t event_body_fields[] = {
    REQ("event", DL__F_STR, 1, DL_PROTO_NAME_MAX),
    REQ("time", DL__F_NUM, 0, 0),
    END,
};

static const dl__field_t event_fields[] = {
    REQ("seq", DL__F_INT, 0, JINT_MAX),
    {.name = "event", .kind = DL__F_OBJ, .required = true, .sub = event_body_fields},
    END,
};

static const dl__field_t reply_fields[] = {
    REQ("result", DL__F_OBJ, 0, 0),
    END,
};

static const dl__field_t error_body_fields[] = {
    REQ("code", DL__F_STR, 1, 64),
    REQ("message", DL__F_STR, 0, TEXT_MAX),
    END,
};

static const dl__field_t error_fields[] = {
    {.name = "error", .kind = DL__F_OBJ, .required = true, .sub = error_body_fields},
    END,
};

static const dl__field_t status_fields[] = {
    OPT("all", DL__F_BOOL, 0, 0),
    OPT("ranks", DL__F_BOOL, 0, 0), /* add every rank's figures and last operations */
    END,
};

/* What generic replies carry in "result", per request. */
static const dl__field_t round_result[] = {
    REQ("round", DL__F_INT, 0, I32),
    END,
};

static const dl__field_t heartbeat_result[] = {
    REQ("round", DL__F_INT, 0, I32),
    OPT("diag", DL__F_OBJ, 0, 0), /* the job-wide figures and the stragglers named */
    END,
};

static const dl__field_t kv_get_result[] = {
    REQ("value", DL__F_STR, 0, DL_PROTO_LIMIT),
    END,
};

static const dl__field_t kv_add_result[] = {
    REQ("value", DL__F_INT, JINT_MIN, JINT_MAX),
    END,
};

static const dl__field_t kv_cas_result[] = {
    REQ("swapped", DL__F_BOOL, 0, 0),
    REQ("value", DL__F_STR_OR_NULL, 0, DL_PROTO_LIMIT),
    END,
};

static const dl__field_t kv_del_result[] = {
    REQ("deleted", DL__F_BOOL, 0, 0),
    END,
};

static const dl__field_t status_result[] = {
    REQ("state", DL__F_STR, 1, DL_PROTO_NAME_MAX),
    REQ("round", DL__F_INT, 0, I32),
    END,
};

static int check_worker_failed(const json_t *msg, dl_proto_error_t *err)
{
    bool has_code = json_object_get(msg, "exit_code") != NULL;
    bool has_signal = json_object_get(msg, "signal") != NULL;

    if (has_code == has_signal)
        return dl__proto_error_set(err, has_code ? DL_PROTO_E_BAD_FIELD : DL_PROTO_E_MISSING_FIELD,
                                   "worker_failed: exactly one of 'exit_code' and 'signal' must "
                                   "be given, got %s",
                                   has_code ? "both" : "neither");
    return 0;
}

static int check_assignment(const json_t *msg, dl_proto_error_t *err)
{
    json_int_t nodes = dl_proto_get_int(msg, "nodes", 0);
    json_int_t node_rank = dl_proto_get_int(msg, "node_rank", 0);
    json_int_t world = dl_proto_get_int(msg, "world_size", 0);
    json_int_t first = dl_proto_get_int(msg, "first_rank", 0);
    json_int_t local = dl_proto_get_int(msg, "local_world_size", 0);

    if (node_rank >= nodes)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "assignment: node_rank %" JSON_INTEGER_FORMAT
                                   " is not below nodes %" JSON_INTEGER_FORMAT,
                                   node_rank, nodes);
    if (nodes > world)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "assignment: %" JSON_INTEGER_FORMAT
                                   " nodes cannot share world_size %" JSON_INTEGER_FORMAT,
                                   nodes, world);
    /* Both are below 2^31, so the sum cannot overflow. */
    if (first + local > world)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "assignment: ranks %" JSON_INTEGER_FORMAT
                                   "..%" JSON_INTEGER_FORMAT
                                   " run past world_size %" JSON_INTEGER_FORMAT,
                                   first, first + local - 1, world);
    return 0;
}

#define MSG(t, n, k, s, f) [t] = {.name = (n), .kind = (k), .senders = (s), .fields = (f)}

const dl__msgdef_t dl__proto_messages[DL_PROTO_TYPE_COUNT] = {
    MSG(DL_PROTO_HELLO, "hello", DL_PROTO_KIND_REQUEST, CLIENTS, hello_fields),
    MSG(DL_PROTO_CHALLENGE, "challenge", DL_PROTO_KIND_REPLY, SERVER, challenge_fields),
    MSG(DL_PROTO_AUTH, "auth", DL_PROTO_KIND_REQUEST, CLIENTS, auth_fields),
    MSG(DL_PROTO_AUTH_OK, "auth_ok", DL_PROTO_KIND_REPLY, SERVER, auth_ok_fields),
    MSG(DL_PROTO_JOIN, "join", DL_PROTO_KIND_REQUEST, AGENT, join_fields),
    [DL_PROTO_ASSIGNMENT] = {.name = "assignment",
                             .kind = DL_PROTO_KIND_REPLY,
                             .senders = SERVER,
                             .fields = assignment_fields,
                             .check = check_assignment},
    [DL_PROTO_HEARTBEAT] = {.name = "heartbeat",
                            .kind = DL_PROTO_KIND_REQUEST,
                            .senders = AGENT,
                            .fields = heartbeat_fields,
                            .result = heartbeat_result},
    MSG(DL_PROTO_LEAVE, "leave", DL_PROTO_KIND_REQUEST, AGENT, reason_fields),
    [DL_PROTO_WORKER_FAILED] = {.name = "worker_failed",
                                .kind = DL_PROTO_KIND_REQUEST,
                                .senders = AGENT,
                                .fields = worker_failed_fields,
                                .check = check_worker_failed},
    MSG(DL_PROTO_NODE_DONE, "node_done", DL_PROTO_KIND_REQUEST, AGENT, node_done_fields),
    MSG(DL_PROTO_ROUND_CHANGED, "round_changed", DL_PROTO_KIND_NOTIFY, SERVER,
        round_changed_fields),
    MSG(DL_PROTO_SHUTDOWN, "shutdown", DL_PROTO_KIND_NOTIFY, SERVER, shutdown_fields),
    MSG(DL_PROTO_KV_SET, "kv_set", DL_PROTO_KIND_REQUEST, CLIENTS, kv_set_fields),
    [DL_PROTO_KV_GET] = {.name = "kv_get",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CLIENTS,
                         .fields = kv_key_fields,
                         .result = kv_get_result},
    [DL_PROTO_KV_ADD] = {.name = "kv_add",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CLIENTS,
                         .fields = kv_add_fields,
                         .result = kv_add_result},
    MSG(DL_PROTO_KV_WAIT, "kv_wait", DL_PROTO_KIND_REQUEST, CLIENTS, kv_wait_fields),
    [DL_PROTO_KV_CAS] = {.name = "kv_cas",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CLIENTS,
                         .fields = kv_cas_fields,
                         .result = kv_cas_result},
    [DL_PROTO_KV_DEL] = {.name = "kv_del",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CLIENTS,
                         .fields = kv_key_fields,
                         .result = kv_del_result},
    [DL_PROTO_STATUS] = {.name = "status",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CONTROL,
                         .fields = status_fields,
                         .result = status_result},
    MSG(DL_PROTO_STOP, "stop", DL_PROTO_KIND_REQUEST, CONTROL, reason_fields),
    [DL_PROTO_RESTART] = {.name = "restart",
                          .kind = DL_PROTO_KIND_REQUEST,
                          .senders = CONTROL,
                          .fields = reason_fields,
                          .result = round_result},
    /* Agents too: one that sits out as a straggler hears of the job's end this way. */
    MSG(DL_PROTO_EVENTS_FOLLOW, "events_follow", DL_PROTO_KIND_REQUEST, CONTROL | AGENT,
        events_follow_fields),
    MSG(DL_PROTO_EVENT, "event", DL_PROTO_KIND_NOTIFY, SERVER, event_fields),
    [DL_PROTO_REVOKE] = {.name = "revoke",
                         .kind = DL_PROTO_KIND_REQUEST,
                         .senders = CONTROL,
                         .fields = revoke_fields,
                         .result = revoke_fields},
    MSG(DL_PROTO_REPLY, "reply", DL_PROTO_KIND_REPLY, SERVER, reply_fields),
    MSG(DL_PROTO_ERROR, "error", DL_PROTO_KIND_REPLY, SERVER, error_fields),
};

static bool type_valid(dl_proto_type_t type)
{
    return (int)type >= 0 && type < DL_PROTO_TYPE_COUNT;
}

const char *dl_proto_type_name(dl_proto_type_t type)
{
    return type_valid(type) ? dl__proto_messages[type].name : NULL;
}

dl_proto_type_t dl_proto_type_parse(const char *name)
{
    /* Two dozen short names: a linear scan is as fast as anything cleverer. */
    for (int t = 0; t < DL_PROTO_TYPE_COUNT; t++) {
        if (strcmp(dl__proto_messages[t].name, name) == 0)
            return (dl_proto_type_t)t;
    }
    return DL_PROTO_TYPE_NONE;
}

dl_proto_kind_t dl_proto_type_kind(dl_proto_type_t type)
{
    return type_valid(type) ? dl__proto_messages[type].kind : DL_PROTO_KIND_NOTIFY;
}

bool dl_proto_may_send(dl_proto_type_t type, dl_proto_role_t sender)
{
    return type_valid(type) && (dl__proto_messages[type].senders & (unsigned)sender) != 0;
}

bool dl_proto_is_reply_to(dl_proto_type_t request, dl_proto_type_t reply)
{
    if (!type_valid(request) || dl__proto_messages[request].kind != DL_PROTO_KIND_REQUEST)
        return false;
    if (reply == DL_PROTO_ERROR)
        return true;
    switch (request) {
    case DL_PROTO_HELLO:
        /* A server without a token skips the challenge. */
        return reply == DL_PROTO_CHALLENGE || reply == DL_PROTO_AUTH_OK;
    case DL_PROTO_AUTH: return reply == DL_PROTO_AUTH_OK;
    case DL_PROTO_JOIN: return reply == DL_PROTO_ASSIGNMENT;
    default: return reply == DL_PROTO_REPLY;
    }
}

const char *dl_proto_role_name(dl_proto_role_t role)
{
    switch (role) {
    case DL_PROTO_ROLE_AGENT: return "agent";
    case DL_PROTO_ROLE_WORKER: return "worker";
    case DL_PROTO_ROLE_CONTROL: return "control";
    case DL_PROTO_ROLE_SERVER: return "server";
    }
    return NULL;
}

int dl_proto_role_parse(const char *name, dl_proto_role_t *ret_role)
{
    static const dl_proto_role_t clients[] = {DL_PROTO_ROLE_AGENT, DL_PROTO_ROLE_WORKER,
                                              DL_PROTO_ROLE_CONTROL};

    for (size_t i = 0; i < sizeof(clients) / sizeof(clients[0]); i++) {
        if (strcmp(dl_proto_role_name(clients[i]), name) == 0) {
            *ret_role = clients[i];
            return 0;
        }
    }
    return -EINVAL;
}

bool dl_proto_run_id_valid(const char *run_id)
{
    size_t n = 0;

    for (const char *p = run_id; *p != '\0'; p++, n++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok || n >= DL_PROTO_RUN_ID_MAX)
            return false;
    }
    return n > 0;
}

/* ---- Field checks ---- */

static const char *json_type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

static bool is_lower_hex(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

static int bad_type(const char *where, const char *path, const dl__field_t *f, const char *want,
                    const json_t *v, dl_proto_error_t *err)
{
    return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD, "%s: field '%s%s' must be %s, got %s",
                               where, path, f->name, want, json_type_word(v));
}

static int check_string(const char *where, const char *path, const dl__field_t *f, const json_t *v,
                        dl_proto_error_t *err)
{
    size_t len = json_string_length(v);

    if ((json_int_t)len < f->min || (json_int_t)len > f->max)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "%s: field '%s%s' must be %" JSON_INTEGER_FORMAT
                                   " to %" JSON_INTEGER_FORMAT " bytes long, got %zu",
                                   where, path, f->name, f->min, f->max, len);
    /* Jansson accepts "\u0000" only when asked to, but a message built in memory could hold one,
     * and every consumer reads these as C strings. */
    if (strlen(json_string_value(v)) != len)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "%s: field '%s%s' contains a NUL character", where, path,
                                   f->name);
    return 0;
}

static bool name_char(char c)
{
    return c > 0x20 && c < 0x7f;
}

static bool addr_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '%' || c == '-' || c == '[' || c == ']';
}

static int check_chars(const char *where, const char *path, const dl__field_t *f, const json_t *v,
                       bool (*ok)(char), const char *what, dl_proto_error_t *err)
{
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);

    for (size_t i = 0; i < len; i++)
        if (!ok(s[i]))
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must be %s; byte %zu is 0x%02x", where,
                                       path, f->name, what, i, (unsigned char)s[i]);
    return 0;
}

static int check_field(const char *where, const char *path, const dl__field_t *f, const json_t *v,
                       dl_proto_error_t *err)
{
    switch (f->kind) {
    case DL__F_NAME:
    case DL__F_ADDR: {
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string", v, err);
        int r = check_string(where, path, f, v, err);
        if (r < 0)
            return r;
        return f->kind == DL__F_NAME
                   ? check_chars(where, path, f, v, name_char, "printable ASCII without spaces",
                                 err)
                   : check_chars(where, path, f, v, addr_char,
                                 "a host name or address ([A-Za-z0-9._:%-], brackets)", err);
    }
    case DL__F_STR_OR_NULL:
        if (json_is_null(v))
            return 0;
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string or null", v, err);
        return check_string(where, path, f, v, err);
    case DL__F_STR:
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string", v, err);
        return check_string(where, path, f, v, err);
    case DL__F_INT: {
        json_int_t n;
        if (!json_is_integer(v))
            return bad_type(where, path, f, "an integer", v, err);
        n = json_integer_value(v);
        if (n < f->min || n > f->max)
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must be in [%" JSON_INTEGER_FORMAT
                                       ", %" JSON_INTEGER_FORMAT "], got %" JSON_INTEGER_FORMAT,
                                       where, path, f->name, f->min, f->max, n);
        return 0;
    }
    case DL__F_NUM: return json_is_number(v) ? 0 : bad_type(where, path, f, "a number", v, err);
    case DL__F_BOOL:
        return json_is_boolean(v) ? 0 : bad_type(where, path, f, "true or false", v, err);
    case DL__F_OBJ: {
        char sub_path[128];
        if (!json_is_object(v))
            return bad_type(where, path, f, "an object", v, err);
        if (f->sub == NULL)
            return 0;
        snprintf(sub_path, sizeof(sub_path), "%s%s.", path, f->name);
        return dl__proto_check_fields(where, sub_path, v, f->sub, err);
    }
    case DL__F_STRV: {
        size_t n = json_array_size(v), i;
        const json_t *item;
        if (!json_is_array(v))
            return bad_type(where, path, f, "an array of strings", v, err);
        if ((json_int_t)n < f->min || (json_int_t)n > f->max)
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must hold %" JSON_INTEGER_FORMAT
                                       " to %" JSON_INTEGER_FORMAT " strings, got %zu",
                                       where, path, f->name, f->min, f->max, n);
        json_array_foreach (v, i, item) {
            size_t len = json_string_length(item);
            if (!json_is_string(item))
                return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                           "%s: field '%s%s' item %zu must be a string, got %s",
                                           where, path, f->name, i, json_type_word(item));
            if (len == 0 || len > DL_PROTO_KEY_MAX || strlen(json_string_value(item)) != len)
                return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                           "%s: field '%s%s' item %zu must be 1 to %d bytes "
                                           "without NUL, got %zu bytes",
                                           where, path, f->name, i, DL_PROTO_KEY_MAX, len);
        }
        return 0;
    }
    case DL__F_HEX:
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string", v, err);
        if ((json_int_t)json_string_length(v) != f->min ||
            !is_lower_hex(json_string_value(v), json_string_length(v)))
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must be %" JSON_INTEGER_FORMAT
                                       " lowercase hex digits",
                                       where, path, f->name, f->min);
        return 0;
    case DL__F_ROLE: {
        dl_proto_role_t role;
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string", v, err);
        if (dl_proto_role_parse(json_string_value(v), &role) < 0)
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must be agent, worker or control, "
                                       "got '%.32s'",
                                       where, path, f->name, json_string_value(v));
        return 0;
    }
    case DL__F_RUN_ID:
        if (!json_is_string(v))
            return bad_type(where, path, f, "a string", v, err);
        if (strlen(json_string_value(v)) != json_string_length(v) ||
            !dl_proto_run_id_valid(json_string_value(v)))
            return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                       "%s: field '%s%s' must be 1 to %d characters of "
                                       "[A-Za-z0-9._:-]",
                                       where, path, f->name, DL_PROTO_RUN_ID_MAX);
        return 0;
    }
    return dl__proto_error_set(err, DL_PROTO_E_INTERNAL, "%s: field '%s%s' has no checker", where,
                               path, f->name);
}

int dl__proto_check_fields(const char *where, const char *prefix, const json_t *obj,
                           const dl__field_t *fields, dl_proto_error_t *err)
{
    for (const dl__field_t *f = fields; f->name != NULL; f++) {
        const json_t *v = json_object_get(obj, f->name);
        int r;

        if (v == NULL) {
            if (f->required)
                return dl__proto_error_set(err, DL_PROTO_E_MISSING_FIELD,
                                           "%s: missing field '%s%s'", where, prefix, f->name);
            continue;
        }
        r = check_field(where, prefix, f, v, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* ---- Whole messages ---- */

static int check_envelope(const json_t *msg, dl_proto_type_t *ret_type, dl_proto_error_t *err)
{
    const json_t *v = json_object_get(msg, "v");
    const json_t *type = json_object_get(msg, "type");
    dl_proto_type_t t;

    if (v == NULL)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_VERSION,
                                   "missing field 'v' (the protocol version, %d)",
                                   DL_PROTO_VERSION);
    if (!json_is_integer(v))
        return dl__proto_error_set(err, DL_PROTO_E_BAD_VERSION,
                                   "field 'v' must be an integer, got %s", json_type_word(v));
    if (json_integer_value(v) != DL_PROTO_VERSION)
        return dl__proto_error_set(err, DL_PROTO_E_UNSUPPORTED_VERSION,
                                   "protocol version %" JSON_INTEGER_FORMAT
                                   " is not supported (this peer speaks %d)",
                                   json_integer_value(v), DL_PROTO_VERSION);
    if (type == NULL)
        return dl__proto_error_set(err, DL_PROTO_E_MISSING_FIELD, "missing field 'type'");
    if (!json_is_string(type))
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "field 'type' must be a string, got %s", json_type_word(type));
    t = dl_proto_type_parse(json_string_value(type));
    if (t == DL_PROTO_TYPE_NONE)
        return dl__proto_error_set(err, DL_PROTO_E_UNKNOWN_TYPE, "unknown message type '%.64s'",
                                   json_string_value(type));
    *ret_type = t;
    return 0;
}

static int check_id(const json_t *msg, const dl__msgdef_t *def, dl_proto_error_t *err)
{
    const json_t *id = json_object_get(msg, "id");
    /* Notifications have no id; one that came with an id anyway is not worth refusing. */
    bool wanted = def->kind != DL_PROTO_KIND_NOTIFY;
    /* An error about a frame whose id could not be read has none to echo. */
    bool required = def != &dl__proto_messages[DL_PROTO_ERROR];

    if (!wanted)
        return 0;
    if (id == NULL)
        return required ? dl__proto_error_set(err, DL_PROTO_E_MISSING_FIELD,
                                              "%s: missing field 'id'", def->name)
                        : 0;
    if (!json_is_integer(id) || json_integer_value(id) < 0)
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "%s: field 'id' must be an integer >= 0", def->name);
    return 0;
}

int dl_proto_validate(const json_t *msg, dl_proto_type_t *ret_type, dl_proto_error_t *err)
{
    const json_t *id = json_object_get(msg, "id");
    const dl__msgdef_t *def;
    dl_proto_type_t type = DL_PROTO_TYPE_NONE;
    int r;

    dl__proto_error_reset(err);
    if (!json_is_object(msg))
        return dl__proto_error_set(err, DL_PROTO_E_NOT_OBJECT,
                                   "a message must be a JSON object, got %s",
                                   msg == NULL ? "nothing" : json_type_word(msg));
    /* Remember a usable id before anything else can fail, so the error reply can echo it. */
    if (err != NULL && json_is_integer(id) && json_integer_value(id) >= 0)
        err->id = json_integer_value(id);
    r = check_envelope(msg, &type, err);
    if (r < 0)
        return r;
    if (err != NULL)
        err->type = type;
    def = &dl__proto_messages[type];
    r = check_id(msg, def, err);
    if (r < 0)
        return r;
    r = dl__proto_check_fields(def->name, "", msg, def->fields, err);
    if (r < 0)
        return r;
    if (def->check != NULL) {
        r = def->check(msg, err);
        if (r < 0)
            return r;
    }
    *ret_type = type;
    return 0;
}

int dl_proto_validate_result(dl_proto_type_t request, const json_t *result, dl_proto_error_t *err)
{
    char where[64];

    dl__proto_error_reset(err);
    if (!type_valid(request) || dl__proto_messages[request].kind != DL_PROTO_KIND_REQUEST)
        return dl__proto_error_set(err, DL_PROTO_E_INTERNAL, "type %d is not a request",
                                   (int)request);
    snprintf(where, sizeof(where), "%s reply", dl__proto_messages[request].name);
    if (!json_is_object(result))
        return dl__proto_error_set(err, DL_PROTO_E_BAD_FIELD,
                                   "%s: field 'result' must be an object, got %s", where,
                                   result == NULL ? "nothing" : json_type_word(result));
    if (dl__proto_messages[request].result == NULL)
        return 0;
    return dl__proto_check_fields(where, "result.", result, dl__proto_messages[request].result,
                                  err);
}

/* ---- Building and reading ---- */

json_t *dl_proto_msg_new(dl_proto_type_t type, json_int_t id)
{
    json_t *msg;

    if (!type_valid(type))
        return NULL;
    msg = json_pack("{s:i, s:s}", "v", DL_PROTO_VERSION, "type", dl__proto_messages[type].name);
    if (msg == NULL)
        return NULL;
    if (id >= 0 && json_object_set_new(msg, "id", json_integer(id)) < 0) {
        json_decref(msg);
        return NULL;
    }
    return msg;
}

json_t *dl_proto_reply_new(json_int_t id, json_t *result)
{
    json_t *msg = NULL;

    if (result == NULL)
        result = json_object();
    if (id < 0 || !json_is_object(result))
        goto fail;
    msg = dl_proto_msg_new(DL_PROTO_REPLY, id);
    if (msg == NULL)
        goto fail;
    /* json_object_set_new() drops result itself when it fails. */
    if (json_object_set_new(msg, "result", result) < 0) {
        json_decref(msg);
        return NULL;
    }
    return msg;
fail:
    json_decref(result);
    return NULL;
}

const char *dl_proto_get_str(const json_t *msg, const char *field)
{
    return json_string_value(json_object_get(msg, field));
}

json_int_t dl_proto_get_int(const json_t *msg, const char *field, json_int_t dflt)
{
    const json_t *v = json_object_get(msg, field);

    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

double dl_proto_get_num(const json_t *msg, const char *field, double dflt)
{
    const json_t *v = json_object_get(msg, field);

    return json_is_number(v) ? json_number_value(v) : dflt;
}
