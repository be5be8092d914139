/* The dlaunch wire protocol: frames, messages, limits and the job-token handshake.
 *
 * A frame is a 4-byte big-endian length followed by that many bytes of one JSON object:
 *
 *     {"v":1,"type":"join","id":7,"node_id":"n3","host":"gpu3","slots":8}
 *
 * Requests carry "id" (an integer >= 0 the sender picks); the answer echoes it, either as a typed
 * reply (challenge, auth_ok, assignment), as {"type":"reply","result":{...}}, or as
 * {"type":"error","error":{"code":"...","message":"..."}}. Notifications (round_changed,
 * shutdown, event) flow from the server unasked and carry no id. docs/protocol.md is the
 * reference for every message; the table in message.c is the one place that defines them.
 *
 * This layer is pure: no sockets, no event loop, no clock, no printing. It uses libc, jansson and
 * libcrypto. Functions return >= 0 on success and -errno on failure; ret_* out-parameters are
 * only written on success (the documented exceptions say so). Protocol errors also fill a
 * dl_proto_error_t with a stable code and a one-line message meant for the peer.
 *
 * How a server uses it, per connection:
 *   1. dl_proto_decoder_init(&c->dec, DL_PROTO_LIMIT_PREAUTH).
 *   2. On every read, call dl_proto_decoder_feed() in a loop until it has consumed everything:
 *      - DL_PROTO_NEED_MORE: wait for more bytes.
 *      - DL_PROTO_MESSAGE: handle (msg, type); json_decref(msg) when done.
 *      - DL_PROTO_INVALID: the frame was skipped; send dl_proto_error_from(&err). Before
 *        authentication close the connection after that; after, carry on.
 *      - < 0: the stream is unusable; send dl_proto_error_from(&err) and close.
 *   3. Before authentication accept only hello and auth (reply DL_PROTO_E_NOT_AUTHENTICATED to
 *      anything else, then close). hello -> dl_proto_nonce_new() -> challenge; auth ->
 *      dl_proto_auth_verify(); on success send auth_ok and call
 *      dl_proto_decoder_set_limit(&c->dec, DL_PROTO_LIMIT); on failure send auth_failed, close.
 *   4. After authentication check dl_proto_may_send(type, role) before acting on a message.
 *   5. dl_proto_decoder_cleanup(&c->dec) when the connection closes.
 */
#ifndef DL_PROTO_H
#define DL_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Limits ------------------------------------------------------------------------------- */

#define DL_PROTO_VERSION 1
#define DL_PROTO_HEADER_LEN 4
/* Largest frame body (the JSON text, without the 4-byte header) before the peer has
 * authenticated: hello and auth fit many times over, and a stranger cannot make us allocate. */
#define DL_PROTO_LIMIT_PREAUTH 4096u
/* Largest frame body after authentication, and the most dl_proto_encode() will produce. */
#define DL_PROTO_LIMIT 1048576u

#define DL_PROTO_RUN_ID_MAX 128 /* bytes; [A-Za-z0-9._:-] */
#define DL_PROTO_KEY_MAX 1024   /* store keys, bytes */
#define DL_PROTO_NAME_MAX 255   /* node ids, host names, reasons, addresses */
#define DL_PROTO_WAIT_KEYS_MAX 1024
#define DL_PROTO_NONCE_BYTES 32
#define DL_PROTO_NONCE_HEX_LEN 64 /* lowercase hex, as sent */
#define DL_PROTO_PROOF_HEX_LEN 64 /* HMAC-SHA256 in lowercase hex */
#define DL_PROTO_TOKEN_MAX 65536  /* bytes */
#define DL_PROTO_KEY_BYTES 32     /* a derived job or worker key */
#define DL_PROTO_ERRMSG_LEN 256

/* ---- Message types ------------------------------------------------------------------------ */

typedef enum {
    DL_PROTO_TYPE_NONE = -1,
    /* handshake */
    DL_PROTO_HELLO = 0, /* client -> server request: role, run_id, proto */
    DL_PROTO_CHALLENGE, /* reply to hello: nonce */
    DL_PROTO_AUTH,      /* client -> server request: proof */
    DL_PROTO_AUTH_OK,   /* reply to auth (or to hello when the server has no token) */
    /* membership (agents) */
    DL_PROTO_JOIN,          /* request: node_id, host, slots, [node_rank, slurm_node_id, round] */
    DL_PROTO_ASSIGNMENT,    /* reply to join once the round closes */
    DL_PROTO_HEARTBEAT,     /* request: round; result {round} */
    DL_PROTO_LEAVE,         /* request: [reason] */
    DL_PROTO_WORKER_FAILED, /* request: round, rank, exit_code | signal, ... */
    DL_PROTO_NODE_DONE,     /* request: round; every local worker exited 0 */
    DL_PROTO_ROUND_CHANGED, /* server notification: round, reason; stop workers and re-join */
    DL_PROTO_SHUTDOWN,      /* server notification: reason, exit_code; the job is over */
    /* key-value store (agents, workers, control) */
    DL_PROTO_KV_SET,  /* key, value */
    DL_PROTO_KV_GET,  /* key; result {value} or error not_found */
    DL_PROTO_KV_ADD,  /* key, delta; result {value} */
    DL_PROTO_KV_WAIT, /* keys, timeout_ms; result {} or error timeout */
    DL_PROTO_KV_CAS,  /* key, expected (string or null), value; result {swapped, value} */
    DL_PROTO_KV_DEL,  /* key; result {deleted} */
    /* control */
    DL_PROTO_STATUS,        /* result {state, round, ...} */
    DL_PROTO_STOP,          /* [reason] */
    DL_PROTO_RESTART,       /* [reason]; result {round} */
    DL_PROTO_EVENTS_FOLLOW, /* [since]; result {}, then event notifications */
    DL_PROTO_EVENT,         /* server notification: seq, event {event, time, ...} */
    DL_PROTO_REVOKE,        /* before; result {before}: the server's own token only */
    /* generic answers */
    DL_PROTO_REPLY, /* id, result (object) */
    DL_PROTO_ERROR, /* [id], error {code, message} */
    DL_PROTO_TYPE_COUNT
} dl_proto_type_t;

typedef enum {
    DL_PROTO_KIND_REQUEST, /* client -> server, "id" required, answered exactly once */
    DL_PROTO_KIND_REPLY,   /* server -> client, "id" echoes the request ("error": may lack it) */
    DL_PROTO_KIND_NOTIFY,  /* server -> client, unasked, no "id" */
} dl_proto_kind_t;

/* Who is talking: a bit each, so the message table can say who may send what. */
typedef enum {
    DL_PROTO_ROLE_AGENT = 1 << 0,
    DL_PROTO_ROLE_WORKER = 1 << 1,
    DL_PROTO_ROLE_CONTROL = 1 << 2,
    DL_PROTO_ROLE_SERVER = 1 << 3,
} dl_proto_role_t;

/* "join" for DL_PROTO_JOIN; NULL for an out-of-range value. */
const char *dl_proto_type_name(dl_proto_type_t type);
/* The type named name, or DL_PROTO_TYPE_NONE. */
dl_proto_type_t dl_proto_type_parse(const char *name);
dl_proto_kind_t dl_proto_type_kind(dl_proto_type_t type);
/* Whether a peer of this role may send this type (e.g. only control sends stop, only the server
 * sends assignment). */
bool dl_proto_may_send(dl_proto_type_t type, dl_proto_role_t sender);
/* Whether reply is a valid answer to a request of type request: error always is; hello gets
 * challenge or auth_ok, auth gets auth_ok, join gets assignment, the rest get reply. */
bool dl_proto_is_reply_to(dl_proto_type_t request, dl_proto_type_t reply);

/* "agent", "worker", "control", "server"; NULL for anything else. */
const char *dl_proto_role_name(dl_proto_role_t role);
/* Parses a hello's role (agent, worker or control; a client cannot claim "server").
 * Returns 0 or -EINVAL. */
int dl_proto_role_parse(const char *name, dl_proto_role_t *ret_role);

/* 1 to DL_PROTO_RUN_ID_MAX bytes of [A-Za-z0-9._:-]: safe in file names, environment variables
 * and log prefixes. The config layer should check a user's --run-id with this. */
bool dl_proto_run_id_valid(const char *run_id);

/* ---- Error codes -------------------------------------------------------------------------- */

/* The "code" strings of error replies are a stable API; docs/protocol.md lists them. */
typedef enum {
    DL_PROTO_E_NONE = 0,
    DL_PROTO_E_FRAME_TOO_LARGE,     /* "frame_too_large": length over the limit; stream ends */
    DL_PROTO_E_EMPTY_FRAME,         /* "empty_frame": length 0 */
    DL_PROTO_E_BAD_JSON,            /* "bad_json": not JSON, or duplicate keys */
    DL_PROTO_E_NOT_OBJECT,          /* "not_object": JSON, but not an object */
    DL_PROTO_E_BAD_VERSION,         /* "bad_version": "v" missing or not an integer */
    DL_PROTO_E_UNSUPPORTED_VERSION, /* "unsupported_version": "v" is not 1 */
    DL_PROTO_E_UNKNOWN_TYPE,        /* "unknown_type" */
    DL_PROTO_E_MISSING_FIELD,       /* "missing_field" (also a missing "type" or "id") */
    DL_PROTO_E_BAD_FIELD,           /* "bad_field": wrong JSON type, range or format */
    DL_PROTO_E_AUTH_FAILED,         /* "auth_failed": wrong proof, or unknown run */
    DL_PROTO_E_NOT_AUTHENTICATED,   /* "not_authenticated": anything but hello/auth before auth */
    DL_PROTO_E_FORBIDDEN,           /* "forbidden": this role may not send this type */
    DL_PROTO_E_UNEXPECTED,          /* "unexpected_message": valid, but not now (second hello) */
    DL_PROTO_E_STALE_ROUND,         /* "stale_round": names a round that is over */
    DL_PROTO_E_NOT_FOUND,           /* "not_found": kv_get of a missing key */
    DL_PROTO_E_TIMEOUT,             /* "timeout": kv_wait ran out of time */
    DL_PROTO_E_BAD_VALUE,           /* "bad_value": kv_add on a value that is not an integer */
    DL_PROTO_E_CONFLICT,            /* "conflict": join clashes (node_id or node_rank taken) */
    DL_PROTO_E_SHUTTING_DOWN,       /* "shutting_down": the job is ending; no new work */
    DL_PROTO_E_INTERNAL,            /* "internal": the server failed (out of memory...) */
    DL_PROTO_E_LIMIT_EXCEEDED,      /* "limit_exceeded": a documented bound of the server (store
                                     * size, memory, jobs, outstanding requests) was reached */
    DL_PROTO_E_JOB_FULL,            /* "job_full": join to a running job that has its most nodes */
    DL_PROTO_E_OTHER,               /* a code this version does not know (from a newer peer) */
    DL_PROTO_E_COUNT
} dl_proto_errcode_t;

/* "frame_too_large" ...; "other" for DL_PROTO_E_OTHER, NULL for out-of-range values. */
const char *dl_proto_errcode_name(dl_proto_errcode_t code);
/* The code named name; DL_PROTO_E_OTHER for unknown strings (never DL_PROTO_E_NONE). */
dl_proto_errcode_t dl_proto_errcode_parse(const char *name);

/* A protocol error, as found by the decoder or the validator. */
typedef struct dl_proto_error_s {
    dl_proto_errcode_t code;
    json_int_t id;        /* the offending request's "id" when it could be read, else -1 */
    dl_proto_type_t type; /* its type when known, else DL_PROTO_TYPE_NONE */
    char message[DL_PROTO_ERRMSG_LEN]; /* one line: where (frame offset, type, field) and why */
} dl_proto_error_t;

/* ---- Building messages -------------------------------------------------------------------- */

/* A new {"v":1,"type":...} object, with "id" when id >= 0; add the fields with jansson.
 * Returns a new reference owned by the caller, or NULL (out of memory, bad type). */
json_t *dl_proto_msg_new(dl_proto_type_t type, json_int_t id);

/* {"v":1,"type":"reply","id":id,"result":result}. Steals the reference to result; NULL means {}.
 * Returns a new reference, or NULL (out of memory, id < 0, result not an object). */
json_t *dl_proto_reply_new(json_int_t id, json_t *result);

/* {"v":1,"type":"error","id":id,"error":{"code":...,"message":...}}; id < 0 leaves "id" out.
 * Returns a new reference or NULL (out of memory, code out of range). */
json_t *dl_proto_error_new(json_int_t id, dl_proto_errcode_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The error reply for a decode or validation failure: same code, message and id. */
json_t *dl_proto_error_from(const dl_proto_error_t *err);

/* Reads an error reply: returns its code and points *ret_message into msg (valid while msg
 * lives). DL_PROTO_E_NONE when msg is not an error. ret_message may be NULL. */
dl_proto_errcode_t dl_proto_reply_error(const json_t *msg, const char **ret_message);

/* Field access for validated messages (validation guarantees the JSON types).
 * dl_proto_get_str: the string, or NULL when absent or not a string; valid while msg lives.
 * dl_proto_get_int: the integer, or dflt when absent or not an integer.
 * dl_proto_get_num: the number (integer or real), or dflt when absent or not a number. */
const char *dl_proto_get_str(const json_t *msg, const char *field);
json_int_t dl_proto_get_int(const json_t *msg, const char *field, json_int_t dflt);
double dl_proto_get_num(const json_t *msg, const char *field, double dflt);

/* ---- Validation, encoding, decoding ------------------------------------------------------- */

/* Checks a message against the table: "v", "type", "id" for its kind, every required field,
 * the JSON type and range of every known field (unknown fields are ignored, so that a v1 peer
 * can add optional fields), and the rules that tie fields together. Returns 0 and sets
 * *ret_type, or -EBADMSG and fills err (if not NULL). */
int dl_proto_validate(const json_t *msg, dl_proto_type_t *ret_type, dl_proto_error_t *err);

/* Checks the "result" of a generic reply against what a request of type request returns
 * (kv_get: {value: string}, ...). Returns 0 or -EBADMSG with err filled. */
int dl_proto_validate_result(dl_proto_type_t request, const json_t *result, dl_proto_error_t *err);

/* Validates msg and serializes it as a frame: 4-byte big-endian length, then compact JSON.
 * *ret_frame is malloc'd, owned by the caller (free()), *ret_len counts the header.
 * Returns 0, -EBADMSG (invalid message), -EMSGSIZE (body over DL_PROTO_LIMIT) or -ENOMEM;
 * err (may be NULL) says why. */
int dl_proto_encode(const json_t *msg, char **ret_frame, size_t *ret_len, dl_proto_error_t *err);

/* Parses and validates one frame body (without the length header). Returns 0 with a new
 * reference in *ret_msg and its type in *ret_type, or -EBADMSG / -ENOMEM with err filled
 * (including err->id when the body had a readable id). */
int dl_proto_decode(const void *body, size_t len, json_t **ret_msg, dl_proto_type_t *ret_type,
                    dl_proto_error_t *err);

/* ---- The incremental decoder -------------------------------------------------------------- */

enum {
    DL_PROTO_NEED_MORE = 0, /* every byte consumed, no complete frame yet */
    DL_PROTO_MESSAGE = 1,   /* a valid message came out */
    DL_PROTO_INVALID = 2,   /* a whole frame was consumed but its content is invalid; err says
                             * why; the decoder is ready for the next frame */
};

/* One per connection; embed it in the connection's struct. Fields are private. */
typedef struct dl_proto_decoder_s {
    uint32_t limit;    /* largest body accepted */
    uint32_t body_len; /* length of the frame in progress, once the header is complete */
    uint8_t header[DL_PROTO_HEADER_LEN];
    uint8_t header_have;
    int failed; /* sticky fatal error (-errno) */
    dl_proto_errcode_t failed_code;
    char *buf; /* body of a frame that arrived in pieces */
    size_t buf_cap, buf_have;
    uint64_t offset; /* stream offset of the frame in progress, for messages */
} dl_proto_decoder_t;

/* Allocates nothing. limit: DL_PROTO_LIMIT_PREAUTH until the peer authenticates. */
void dl_proto_decoder_init(dl_proto_decoder_t *dec, uint32_t limit);

/* Changes the largest body accepted, from the next frame header on (a frame whose header was
 * already accepted is finished under the limit it was checked against). Capped at
 * DL_PROTO_LIMIT. */
void dl_proto_decoder_set_limit(dl_proto_decoder_t *dec, uint32_t limit);

/* Frees the partial frame buffer; dec can be initialized again. Accepts NULL. */
void dl_proto_decoder_cleanup(dl_proto_decoder_t *dec);

/* Whether the decoder holds part of a frame (a peer that closes now cut a frame short). */
bool dl_proto_decoder_pending(const dl_proto_decoder_t *dec);

/* Bytes of memory the decoder holds for a frame that arrived in pieces. It grows with the bytes
 * received, not with the length announced, so a peer that announces a large frame and sends
 * little of it makes the decoder hold little. */
size_t dl_proto_decoder_buffered(const dl_proto_decoder_t *dec);

/* Feeds up to len bytes of the stream; pieces may be any size, one byte included.
 * Stops after at most one frame and sets *ret_consumed to the bytes it used (for
 * DL_PROTO_INVALID and errors too); call again with the rest.
 * Returns:
 *   DL_PROTO_NEED_MORE  all len bytes consumed, nothing to hand out yet;
 *   DL_PROTO_MESSAGE    *ret_msg (new reference, caller owns) and *ret_type are set;
 *   DL_PROTO_INVALID    the frame was skipped; err filled (code, message, id when readable);
 *   -EMSGSIZE           the length is over the limit (DL_PROTO_E_FRAME_TOO_LARGE) and the
 *                       stream cannot be resynchronized: reply and close;
 *   -ENOMEM             out of memory (DL_PROTO_E_INTERNAL).
 * A decoder that returned a negative value keeps returning it. The length is checked before
 * anything is allocated, and a frame that arrives whole is parsed in place without a copy. */
int dl_proto_decoder_feed(dl_proto_decoder_t *dec, const void *data, size_t len,
                          size_t *ret_consumed, json_t **ret_msg, dl_proto_type_t *ret_type,
                          dl_proto_error_t *err);

/* ---- Credentials and authentication ---------------------------------------------------- */

/* A credential. Opaque; its bytes are wiped when freed. Three kinds, each reaching less than the
 * one before (docs/protocol.md, "Credentials"):
 *   MASTER  a secret of any bytes (a token file, DLAUNCH_TOKEN): acts for every job of a server
 *           that holds it, in every role;
 *   JOB     "dlaunch-job-v2:RUN_ID:ISSUED:EXPIRES:HEX", derived from a master for one run id and
 *           a span of time: that job's agents and its control (status, stop, restart, events,
 *           store);
 *   WORKER  "dlaunch-worker-v2:RUN_ID:ISSUED:EXPIRES:HEX", derived from the job key (and ending
 *           with it): that job's store only.
 * A server holding a master recognizes all three for every run id; one holding a job key,
 * that job's job and worker keys. Version 1 keys (no times: they never ended) are refused. */
typedef struct dl_proto_token_s dl_proto_token_t;

typedef enum {
    DL_PROTO_TOKEN_MASTER = 0,
    DL_PROTO_TOKEN_JOB,
    DL_PROTO_TOKEN_WORKER,
    /* "dlaunch-scrape-v1:HEX" = HMAC-SHA256(master, "dlaunch scrape key v1\n"): the HTTP side
     * reads with it (/metrics, /api, the page); it acts on nothing and opens no rendezvous
     * connection. */
    DL_PROTO_TOKEN_SCRAPE,
} dl_proto_token_kind_t;

/* The span a job or worker key is good for, in Unix seconds: issued <= now < expires, give or take
 * DL_PROTO_KEY_LEEWAY_S of clock skew. {0, 0} for a master, which does not end. */
typedef struct {
    int64_t issued;
    int64_t expires;
} dl_proto_key_life_t;

/* 9999-12-31T23:59:59Z: the latest time a key may name, far enough from INT64_MAX that adding
 * the leeway or a lifetime cannot overflow. */
#define DL_PROTO_KEY_TIME_MAX 253402300799LL
/* How far the clocks of the server and of whoever made a key may disagree. */
#define DL_PROTO_KEY_LEEWAY_S 120
/* What `dlaunch token` gives a key when not told (--expires), and how long the worker key an
 * agent holding the master makes for its workers lasts. */
#define DL_PROTO_KEY_LIFETIME_S (7 * 86400)

/* The wall clock in seconds, as keys are issued and judged by it. */
int64_t dl_proto_unix_now(void);
/* Whether life is a span a key may have: 0 <= issued < expires <= DL_PROTO_KEY_TIME_MAX. */
bool dl_proto_key_life_valid(const dl_proto_key_life_t *life);

typedef enum {
    DL_PROTO_KEY_GOOD = 0,
    DL_PROTO_KEY_EXPIRED, /* now is past expires (beyond the leeway) */
    DL_PROTO_KEY_NOT_YET, /* issued lies ahead of now (beyond the leeway) */
    DL_PROTO_KEY_REVOKED, /* issued before revoked_before */
} dl_proto_key_verdict_t;

/* What the server makes of a proven key's life at now (Unix seconds), for a run whose keys issued
 * before revoked_before are withdrawn (0: none are). When not good, why gets one line for the
 * client that says which and what to do (as "the job key of run 'X' expired at
 * 2026-12-01T10:00:00Z; make a new one with dlaunch token"). Pure. */
dl_proto_key_verdict_t dl_proto_key_judge(const dl_proto_key_life_t *life, const char *run_id,
                                          int64_t now, int64_t revoked_before, char *why,
                                          size_t whylen);

/* The longest span `dlaunch token --expires` gives a key: a year and a day. */
#define DL_PROTO_KEY_LIFETIME_MAX_S (366LL * 86400)

/* A lifetime: N seconds, or N followed by s, m, h or d (9 digits at most), from 1 s to
 * DL_PROTO_KEY_LIFETIME_MAX_S. Returns 0, -EINVAL (not of that form) or -ERANGE. */
int dl_proto_lifetime_parse(const char *text, int64_t *ret_seconds);

/* A moment: Unix seconds, or "2026-12-06T16:00:00Z" (UTC), from 0 to DL_PROTO_KEY_TIME_MAX.
 * Returns 0, -EINVAL or -ERANGE. */
int dl_proto_time_parse(const char *text, int64_t *ret);

/* t (Unix seconds) as "2026-12-06T16:00:00Z" in buf (at least 21 bytes). Returns buf. */
char *dl_proto_time_text(int64_t t, char *buf, size_t len);

/* Reads the token from a --token-file: a regular file that neither group nor others may read
 * or write (chmod 600), at most DL_PROTO_TOKEN_MAX bytes, not empty once one trailing newline
 * ("\n" or "\r\n") is stripped. Text of the form of a job or worker key is read as one (a
 * malformed one is refused). It must be this user's (another user knows, or chose, what is in
 * it), and a FIFO in its place is refused without blocking. Returns 0 with *ret_token owned by
 * the caller, or -errno with a line in err naming the file (-EACCES also for a too-open mode,
 * -EPERM for another user's, -EINVAL for empty/too big or not a regular file). */
int dl_proto_token_from_file(const char *path, dl_proto_token_t **ret_token, char *err,
                             size_t errlen);

/* The token from a string such as $DLAUNCH_TOKEN, taken as is; where names the source in
 * messages. Returns 0 or -EINVAL (empty, too long, a malformed job or worker key) / -ENOMEM. */
int dl_proto_token_from_string(const char *text, const char *where, dl_proto_token_t **ret_token,
                               char *err, size_t errlen);

/* Where every dlaunch program finds the job token: the file when one is named, else env_value
 * (what $DLAUNCH_TOKEN holds) when it is set and not empty, else none (*ret_token = NULL,
 * return 0). Returns 0 or the error of the source tried, as above. */
int dl_proto_token_load(const char *file, const char *env_value, dl_proto_token_t **ret_token,
                        char *err, size_t errlen);

/* A fresh random master (DL_PROTO_KEY_BYTES random bytes as hex). Returns 0, -EIO or -ENOMEM. */
int dl_proto_token_random(dl_proto_token_t **ret_token);

void dl_proto_token_free(dl_proto_token_t *token);

/* A copy of token (any kind), owned by the caller. Returns 0 or -ENOMEM. */
int dl_proto_token_copy(const dl_proto_token_t *token, dl_proto_token_t **ret);

dl_proto_token_kind_t dl_proto_token_kind(const dl_proto_token_t *token);
/* The run id a job or worker key belongs to; NULL for a master. Valid while token lives. */
const char *dl_proto_token_run_id(const dl_proto_token_t *token);
/* The span a job or worker key is good for; {0, 0} for a master or the read-only credential. */
dl_proto_key_life_t dl_proto_token_life(const dl_proto_token_t *token);
/* "master", "job", "worker", "read-only". */
const char *dl_proto_token_kind_name(dl_proto_token_kind_t kind);

/* Whether a peer holding token may say hello as role for run_id: a master always; a job key
 * for its own run in any role; a worker key for its own run as a worker. */
bool dl_proto_token_may(const dl_proto_token_t *token, const char *run_id, dl_proto_role_t role);

/* The key of the given kind for run_id, derived from token:
 *   job    = HMAC-SHA256(master, "dlaunch job key v2\n" || run_id || "\n" || ISSUED || "\n" ||
 *                                EXPIRES)
 *   worker = HMAC-SHA256(job,    "dlaunch worker key v2\n" || run_id)
 * with the times in decimal. A master gives either, for the span life (which must be valid); a
 * job key its worker key (run_id must be its own), which keeps the job key's span (life is
 * ignored); a worker key only a copy of itself. Returns 0 with *ret (owned), -EPERM when token
 * cannot reach that far, -EINVAL for a bad run id or span, -EIO or -ENOMEM. */
int dl_proto_token_derive(const dl_proto_token_t *token, dl_proto_token_kind_t kind,
                          const char *run_id, const dl_proto_key_life_t *life,
                          dl_proto_token_t **ret);

/* The text that dl_proto_token_from_string reads back as this job or worker key
 * ("dlaunch-worker-v2:RUN_ID:ISSUED:EXPIRES:HEX", no newline), malloc'd, owned by the caller. A master is never
 * written out: -EPERM. Returns 0 or -errno. */
int dl_proto_token_text(const dl_proto_token_t *token, char **ret_text);

/* The read-only credential of a master (DL_PROTO_TOKEN_SCRAPE). Returns 0 with *ret owned,
 * -EPERM when master is not one, -EIO or -ENOMEM. */
int dl_proto_token_scrape(const dl_proto_token_t *master, dl_proto_token_t **ret);

#define DL_PROTO_REACH_READ 1 /* reads only */
#define DL_PROTO_REACH_ALL 2  /* the server's own token */

/* What a credential given to a server holding server reaches: DL_PROTO_REACH_ALL for the
 * server's own token, DL_PROTO_REACH_READ for its read-only credential, else -EACCES. */
int dl_proto_token_reach(const dl_proto_token_t *server, const dl_proto_token_t *given);

/* Whether a and b are the same credential (kind, run id and key), compared in constant time for
 * tokens of one length. NULLs are equal only to each other. */
bool dl_proto_token_equal(const dl_proto_token_t *a, const dl_proto_token_t *b);

/* len bytes from the kernel's cryptographic generator (getrandom). Returns 0 or -EIO. */
int dl_proto_random(void *buf, size_t len);

/* DL_PROTO_NONCE_BYTES random bytes (RAND_bytes) as lowercase hex, NUL-terminated.
 * Returns 0 or -EIO when the random generator fails. */
int dl_proto_nonce_new(char ret_nonce[DL_PROTO_NONCE_HEX_LEN + 1]);

/* The client's answer to a challenge: lowercase hex of
 * HMAC-SHA256(key = token, message = nonce || run_id || role name), where nonce is the 64 hex
 * characters as sent and the role name is "agent", "worker" or "control". The key is a master's
 * bytes, or the 32 bytes of a job or worker key.
 * Returns 0, -EPERM (the token may not act as role for run_id, see dl_proto_token_may), -EINVAL
 * (malformed nonce, invalid run_id or role) or -EIO (libcrypto failed). */
int dl_proto_auth_proof(const dl_proto_token_t *token, const char *nonce, const char *run_id,
                        dl_proto_role_t role, char ret_proof[DL_PROTO_PROOF_HEX_LEN + 1]);

/* Adds to an auth message the span of the client's key (key_issued, key_expires) when it is a
 * job or worker key; nothing for a master. Returns 0 or -ENOMEM. */
int dl_proto_auth_add_life(json_t *auth, const dl_proto_token_t *token);

/* The span an auth message names, {0, 0} when it names none (or half of one). */
dl_proto_key_life_t dl_proto_auth_claimed_life(const json_t *auth);

/* Recomputes a proof made with this same token and compares in constant time. Returns 0 when
 * proof is right, -EACCES when it is wrong or malformed, -EINVAL for a malformed nonce/run_id/
 * role, -EIO when libcrypto fails. */
int dl_proto_auth_verify(const dl_proto_token_t *token, const char *nonce, const char *run_id,
                         dl_proto_role_t role, const char *proof);

/* Server side of the handshake: checks a client's proof against every key server can derive for
 * run_id that may act as role (its master, the job key, the worker key), and on success sets
 * *ret_level to the kind that matched and *ret_life to that key's span ({0, 0} for a master).
 * claimed is the span the client says its key has (auth's key_issued and key_expires; NULL or
 * not valid when it sent none): a server holding the master derives the job key for that span,
 * so a claim that is not the key's own makes another key, and the proof fails. A server holding
 * a job key uses its own span. The span is not judged here (dl_proto_key_judge). When client_nonce is not NULL (the client sent one in
 * hello) it also writes the server's own proof into ret_server_proof:
 *   HMAC-SHA256(the matched key, "dlaunch server proof v1\n" || client_nonce || nonce ||
 *               run_id || "\n" || role name)
 * which the client checks with dl_proto_auth_check_server before it believes anything.
 * Returns 0, -EACCES (no key matches, or the server's own key does not cover run_id), -EINVAL,
 * -EIO. */
int dl_proto_auth_accept(const dl_proto_token_t *server, const char *nonce,
                         const char *client_nonce, const char *run_id, dl_proto_role_t role,
                         const char *proof, const dl_proto_key_life_t *claimed,
                         dl_proto_token_kind_t *ret_level, dl_proto_key_life_t *ret_life,
                         char ret_server_proof[DL_PROTO_PROOF_HEX_LEN + 1]);

/* Client side: checks the server's proof (from auth_ok) made with the key this client proved.
 * Returns 0, -EACCES (wrong or missing), -EPERM, -EINVAL or -EIO. */
int dl_proto_auth_check_server(const dl_proto_token_t *token, const char *client_nonce,
                               const char *nonce, const char *run_id, dl_proto_role_t role,
                               const char *server_proof);

/* Plain HMAC-SHA256, exposed for known-answer tests. Returns 0 or -EIO. */
int dl_proto_hmac_sha256(const void *key, size_t key_len, const void *data, size_t data_len,
                         uint8_t ret_mac[32]);

/* ---- Text from peers ------------------------------------------------------------------------ */

/* Copies src into dst (dstlen > 0, always NUL-terminated) with every byte outside printable ASCII
 * (and the backslash) written as \xNN, so that a name or reason a peer chose can go into a log
 * line or a terminal without starting a new line or an escape sequence. Cut short to fit.
 * Returns dst. */
char *dl_proto_escape(const char *src, char *dst, size_t dstlen);

#endif
