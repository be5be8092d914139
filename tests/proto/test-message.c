/* Messages: the table of types and fields, validation errors with their codes, who may send
 * what, and the reply and error builders. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "proto.h"

/* One valid example of every type, written as a peer would send it. */
static const char *const examples[] = {
    "{\"v\":1,\"type\":\"hello\",\"id\":1,\"role\":\"agent\",\"run_id\":\"job-42\",\"proto\":1}",
    "{\"v\":1,\"type\":\"challenge\",\"id\":1,\"nonce\":"
    "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"}",
    "{\"v\":1,\"type\":\"auth\",\"id\":2,\"proof\":"
    "\"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\"}",
    "{\"v\":1,\"type\":\"auth_ok\",\"id\":2}",
    "{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"n0\",\"host\":\"h0\",\"slots\":8}",
    "{\"v\":1,\"type\":\"assignment\",\"id\":3,\"round\":0,\"node_rank\":1,\"nodes\":2,"
    "\"world_size\":16,\"first_rank\":8,\"local_world_size\":8,\"master_addr\":\"10.0.0.1\","
    "\"master_port\":29500,\"store_addr\":\"10.0.0.1:29400\"}",
    "{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0}",
    "{\"v\":1,\"type\":\"leave\",\"id\":5}",
    "{\"v\":1,\"type\":\"worker_failed\",\"id\":6,\"round\":0,\"rank\":3,\"exit_code\":1}",
    "{\"v\":1,\"type\":\"node_done\",\"id\":7,\"round\":0}",
    "{\"v\":1,\"type\":\"round_changed\",\"round\":1,\"reason\":\"worker 3 exited with 1\"}",
    "{\"v\":1,\"type\":\"shutdown\",\"reason\":\"succeeded\",\"exit_code\":0}",
    "{\"v\":1,\"type\":\"kv_set\",\"id\":8,\"key\":\"k\",\"value\":\"\"}",
    "{\"v\":1,\"type\":\"kv_get\",\"id\":9,\"key\":\"k\"}",
    "{\"v\":1,\"type\":\"kv_add\",\"id\":10,\"key\":\"n\",\"delta\":-1}",
    "{\"v\":1,\"type\":\"kv_wait\",\"id\":11,\"keys\":[\"a\",\"b\"],\"timeout_ms\":0}",
    "{\"v\":1,\"type\":\"kv_cas\",\"id\":12,\"key\":\"k\",\"expected\":null,\"value\":\"x\"}",
    "{\"v\":1,\"type\":\"kv_del\",\"id\":13,\"key\":\"k\"}",
    "{\"v\":1,\"type\":\"status\",\"id\":14}",
    "{\"v\":1,\"type\":\"stop\",\"id\":15,\"reason\":\"user\"}",
    "{\"v\":1,\"type\":\"restart\",\"id\":16}",
    "{\"v\":1,\"type\":\"events_follow\",\"id\":17,\"since\":0}",
    "{\"v\":1,\"type\":\"event\",\"seq\":0,\"event\":{\"event\":\"job_start\",\"time\":1.5}}",
    "{\"v\":1,\"type\":\"revoke\",\"id\":19,\"before\":1700000000}",
    "{\"v\":1,\"type\":\"reply\",\"id\":18,\"result\":{}}",
    "{\"v\":1,\"type\":\"error\",\"error\":{\"code\":\"bad_json\",\"message\":\"x\"}}",
};

static json_t *parse(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, 0, &jerr);

    ck_assert_msg(v != NULL, "test JSON: %s: %s", text, jerr.text);
    return v;
}

/* Validates text and expects the given code, with needle in the message. */
static void expect_code(const char *text, dl_proto_errcode_t code, const char *needle)
{
    json_auto_t *m = parse(text);
    dl_proto_type_t type = DL_PROTO_TYPE_NONE;
    dl_proto_error_t err;
    int r = dl_proto_validate(m, &type, &err);

    if (code == DL_PROTO_E_NONE) {
        ck_assert_msg(r == 0, "%s: %s", text, err.message);
        return;
    }
    ck_assert_msg(r == -EBADMSG, "%s was accepted", text);
    ck_assert_msg(err.code == code, "%s: expected %s, got %s (%s)", text,
                  dl_proto_errcode_name(code), dl_proto_errcode_name(err.code), err.message);
    ck_assert_msg(strstr(err.message, needle) != NULL, "'%s' not in '%s'", needle, err.message);
    ck_assert_int_eq(type, DL_PROTO_TYPE_NONE);
}

DL_TEST(test_every_type_has_a_valid_example)
{
    ck_assert_uint_eq(sizeof(examples) / sizeof(examples[0]), DL_PROTO_TYPE_COUNT);
    for (size_t i = 0; i < DL_PROTO_TYPE_COUNT; i++) {
        json_auto_t *m = parse(examples[i]);
        dl_proto_type_t type;
        dl_proto_error_t err;
        ck_assert_msg(dl_proto_validate(m, &type, &err) == 0, "%s: %s", examples[i], err.message);
        ck_assert_str_eq(dl_proto_type_name(type), dl_proto_get_str(m, "type"));
        ck_assert_int_eq(dl_proto_type_parse(dl_proto_type_name(type)), type);
    }
}

DL_TEST(test_each_required_field)
{
    /* Dropping any one field of the examples above gives missing_field naming it, except for
     * the two optional fields they show and the version (bad_version, tested with frames). */
    for (size_t i = 0; i < DL_PROTO_TYPE_COUNT; i++) {
        json_auto_t *m = parse(examples[i]);
        const char *type_name = dl_proto_get_str(m, "type");
        const char *key;
        json_t *value;
        void *tmp;
        json_object_foreach_safe (m, tmp, key, value) {
            json_auto_t *copy = json_deep_copy(m);
            dl_proto_type_t type;
            dl_proto_error_t err;
            char needle[64];
            if (strcmp(key, "v") == 0 ||
                (strcmp(type_name, "stop") == 0 && strcmp(key, "reason") == 0) ||
                (strcmp(type_name, "events_follow") == 0 && strcmp(key, "since") == 0) ||
                (strcmp(type_name, "error") == 0 && strcmp(key, "id") == 0))
                continue;
            json_object_del(copy, key);
            ck_assert_msg(dl_proto_validate(copy, &type, &err) == -EBADMSG,
                          "%s without %s accepted", examples[i], key);
            ck_assert_int_eq(err.code, DL_PROTO_E_MISSING_FIELD);
            snprintf(needle, sizeof(needle), "'%s'", key);
            ck_assert_msg(strstr(err.message, needle) != NULL, "%s", err.message);
        }
    }
}

DL_TEST(test_field_types_and_ranges)
{
    const char *join = "{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"n0\",\"host\":\"h0\",";
    char buf[512];

#define JOIN(tail) (snprintf(buf, sizeof(buf), "%s%s}", join, tail), buf)
    expect_code(JOIN("\"slots\":8,\"node_rank\":-1,\"slurm_node_id\":-1"), DL_PROTO_E_NONE, "");
    expect_code(JOIN("\"slots\":\"8\""), DL_PROTO_E_BAD_FIELD, "'slots' must be an integer");
    expect_code(JOIN("\"slots\":8.0"), DL_PROTO_E_BAD_FIELD, "got a real number");
    expect_code(JOIN("\"slots\":0"), DL_PROTO_E_BAD_FIELD, "'slots' must be in [1, 65536], got 0");
    expect_code(JOIN("\"slots\":8,\"node_rank\":-2"), DL_PROTO_E_BAD_FIELD, "'node_rank'");
    expect_code(JOIN("\"slots\":8,\"slurm_node_id\":true"), DL_PROTO_E_BAD_FIELD, "a boolean");
    expect_code(JOIN("\"slots\":8,\"future_field\":[1,2]"), DL_PROTO_E_NONE, "");
    /* The job parameters an agent's join may carry. */
    expect_code(JOIN("\"slots\":8,\"min_nodes\":2,\"max_nodes\":4,\"max_restarts\":3,"
                     "\"last_call_ms\":0,\"join_timeout_ms\":600000,\"dead_after_ms\":30000,"
                     "\"master_addr\":\"10.0.0.1\",\"master_port\":0"),
                DL_PROTO_E_NONE, "");
    expect_code(JOIN("\"slots\":8,\"min_nodes\":0"), DL_PROTO_E_BAD_FIELD, "'min_nodes'");
    expect_code(JOIN("\"slots\":8,\"master_port\":65536"), DL_PROTO_E_BAD_FIELD,
                "'master_port' must be in [0, 65535]");
    expect_code(JOIN("\"slots\":8,\"dead_after_ms\":-5"), DL_PROTO_E_BAD_FIELD, "'dead_after_ms'");
#undef JOIN
    expect_code("{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"\",\"host\":\"h\",\"slots\":1}",
                DL_PROTO_E_BAD_FIELD, "'node_id' must be 1 to 255 bytes long, got 0");

    expect_code("{\"v\":1,\"type\":\"hello\",\"id\":1,\"role\":\"server\",\"run_id\":\"j\","
                "\"proto\":1}",
                DL_PROTO_E_BAD_FIELD, "agent, worker or control");
    expect_code("{\"v\":1,\"type\":\"hello\",\"id\":1,\"role\":\"worker\",\"run_id\":\"a b\","
                "\"proto\":1}",
                DL_PROTO_E_BAD_FIELD, "'run_id'");
    expect_code("{\"v\":1,\"type\":\"hello\",\"id\":1,\"role\":\"control\",\"run_id\":\"j\","
                "\"proto\":0}",
                DL_PROTO_E_BAD_FIELD, "'proto'");
    expect_code("{\"v\":1,\"type\":\"auth\",\"id\":2,\"proof\":\"ABCDEF\"}", DL_PROTO_E_BAD_FIELD,
                "64 lowercase hex digits");
    expect_code("{\"v\":1,\"type\":\"auth\",\"id\":2,\"proof\":"
                "\"FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210\"}",
                DL_PROTO_E_BAD_FIELD, "lowercase hex");
    /* A key's times: Unix seconds up to 9999, never negative or past what an int64 holds. */
    expect_code("{\"v\":1,\"type\":\"auth\",\"id\":2,\"proof\":"
                "\"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\","
                "\"key_issued\":-1,\"key_expires\":5}",
                DL_PROTO_E_BAD_FIELD, "'key_issued'");
    expect_code("{\"v\":1,\"type\":\"auth\",\"id\":2,\"proof\":"
                "\"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\","
                "\"key_issued\":1,\"key_expires\":253402300800}",
                DL_PROTO_E_BAD_FIELD, "'key_expires'");
    expect_code("{\"v\":1,\"type\":\"revoke\",\"id\":2,\"before\":0}", DL_PROTO_E_BAD_FIELD,
                "'before'");
    expect_code("{\"v\":1,\"type\":\"revoke\",\"id\":2}", DL_PROTO_E_MISSING_FIELD, "'before'");

    expect_code("{\"v\":1,\"type\":\"kv_wait\",\"id\":1,\"keys\":[],\"timeout_ms\":5}",
                DL_PROTO_E_BAD_FIELD, "'keys' must hold 1 to 1024 strings, got 0");
    expect_code("{\"v\":1,\"type\":\"kv_wait\",\"id\":1,\"keys\":[\"a\",3],\"timeout_ms\":5}",
                DL_PROTO_E_BAD_FIELD, "item 1 must be a string");
    expect_code("{\"v\":1,\"type\":\"kv_wait\",\"id\":1,\"keys\":[\"\"],\"timeout_ms\":5}",
                DL_PROTO_E_BAD_FIELD, "item 0 must be 1 to 1024 bytes");
    expect_code("{\"v\":1,\"type\":\"kv_wait\",\"id\":1,\"keys\":\"a\",\"timeout_ms\":5}",
                DL_PROTO_E_BAD_FIELD, "an array of strings");
    expect_code("{\"v\":1,\"type\":\"kv_wait\",\"id\":1,\"keys\":[\"a\"],\"timeout_ms\":-1}",
                DL_PROTO_E_BAD_FIELD, "'timeout_ms'");
    expect_code("{\"v\":1,\"type\":\"kv_cas\",\"id\":1,\"key\":\"k\",\"expected\":\"a\","
                "\"value\":null}",
                DL_PROTO_E_BAD_FIELD, "'value' must be a string, got null");
    expect_code("{\"v\":1,\"type\":\"kv_cas\",\"id\":1,\"key\":\"k\",\"expected\":1,"
                "\"value\":\"b\"}",
                DL_PROTO_E_BAD_FIELD, "a string or null");
    expect_code("{\"v\":1,\"type\":\"kv_set\",\"id\":1,\"key\":\"\",\"value\":\"v\"}",
                DL_PROTO_E_BAD_FIELD, "'key'");
    expect_code("{\"v\":1,\"type\":\"kv_add\",\"id\":1,\"key\":\"n\","
                "\"delta\":-9223372036854775808}",
                DL_PROTO_E_NONE, "");

    expect_code("{\"v\":1,\"type\":\"event\",\"seq\":1,\"event\":{\"event\":\"x\"}}",
                DL_PROTO_E_MISSING_FIELD, "'event.time'");
    expect_code("{\"v\":1,\"type\":\"event\",\"seq\":1,\"event\":{\"event\":\"x\",\"time\":\"t\"}}",
                DL_PROTO_E_BAD_FIELD, "'event.time' must be a number");
    expect_code("{\"v\":1,\"type\":\"error\",\"id\":3,\"error\":{\"code\":7,\"message\":\"\"}}",
                DL_PROTO_E_BAD_FIELD, "'error.code'");
    expect_code("{\"v\":1,\"type\":\"reply\",\"id\":3,\"result\":[]}", DL_PROTO_E_BAD_FIELD,
                "'result' must be an object");

    /* The optional progress a heartbeat carries. */
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":"
                "{\"step\":120,\"loss\":0.53,\"samples_per_s\":8123.5}}",
                DL_PROTO_E_NONE, "");
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":{\"step\":1}}",
                DL_PROTO_E_NONE, "");
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":{\"loss\":1}}",
                DL_PROTO_E_MISSING_FIELD, "'progress.step'");
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":"
                "{\"step\":-1}}",
                DL_PROTO_E_BAD_FIELD, "'progress.step'");
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":"
                "{\"step\":1,\"loss\":\"low\"}}",
                DL_PROTO_E_BAD_FIELD, "'progress.loss' must be a number");
    expect_code("{\"v\":1,\"type\":\"heartbeat\",\"id\":4,\"round\":0,\"progress\":[1]}",
                DL_PROTO_E_BAD_FIELD, "'progress' must be an object");
}

DL_TEST(test_ids)
{
    expect_code("{\"v\":1,\"type\":\"status\"}", DL_PROTO_E_MISSING_FIELD,
                "status: missing field 'id'");
    expect_code("{\"v\":1,\"type\":\"status\",\"id\":-1}", DL_PROTO_E_BAD_FIELD, "'id'");
    expect_code("{\"v\":1,\"type\":\"status\",\"id\":\"1\"}", DL_PROTO_E_BAD_FIELD, "'id'");
    expect_code("{\"v\":1,\"type\":\"auth_ok\"}", DL_PROTO_E_MISSING_FIELD, "'id'");
    expect_code("{\"v\":1,\"type\":\"error\",\"id\":1.5,"
                "\"error\":{\"code\":\"x\",\"message\":\"\"}}",
                DL_PROTO_E_BAD_FIELD, "'id'");
    /* A notification with an id is odd but harmless. */
    expect_code("{\"v\":1,\"type\":\"shutdown\",\"id\":4,\"reason\":\"r\",\"exit_code\":1}",
                DL_PROTO_E_NONE, "");
}

DL_TEST(test_cross_field_rules)
{
    expect_code("{\"v\":1,\"type\":\"worker_failed\",\"id\":1,\"round\":0,\"rank\":0,\"signal\":9}",
                DL_PROTO_E_NONE, "");
    expect_code("{\"v\":1,\"type\":\"worker_failed\",\"id\":1,\"round\":0,\"rank\":0}",
                DL_PROTO_E_MISSING_FIELD, "exactly one of 'exit_code' and 'signal'");
    expect_code("{\"v\":1,\"type\":\"worker_failed\",\"id\":1,\"round\":0,\"rank\":0,"
                "\"exit_code\":1,\"signal\":9}",
                DL_PROTO_E_BAD_FIELD, "got both");
    expect_code("{\"v\":1,\"type\":\"worker_failed\",\"id\":1,\"round\":0,\"rank\":0,"
                "\"exit_code\":256}",
                DL_PROTO_E_BAD_FIELD, "'exit_code'");

    const char *a = "{\"v\":1,\"type\":\"assignment\",\"id\":3,\"round\":0,\"master_addr\":\"m\","
                    "\"master_port\":1,\"store_addr\":\"s:1\",";
    char buf[512];
#define ASSIGN(tail) (snprintf(buf, sizeof(buf), "%s%s}", a, tail), buf)
    expect_code(ASSIGN("\"node_rank\":2,\"nodes\":2,\"world_size\":4,\"first_rank\":0,"
                       "\"local_world_size\":2"),
                DL_PROTO_E_BAD_FIELD, "node_rank 2 is not below nodes 2");
    expect_code(ASSIGN("\"node_rank\":1,\"nodes\":2,\"world_size\":4,\"first_rank\":3,"
                       "\"local_world_size\":2"),
                DL_PROTO_E_BAD_FIELD, "ranks 3..4 run past world_size 4");
    expect_code(ASSIGN("\"node_rank\":1,\"nodes\":3,\"world_size\":2,\"first_rank\":1,"
                       "\"local_world_size\":1"),
                DL_PROTO_E_BAD_FIELD, "3 nodes cannot share world_size 2");
    expect_code(ASSIGN("\"node_rank\":1,\"nodes\":2,\"world_size\":4,\"first_rank\":2,"
                       "\"local_world_size\":2,\"master_port\":65536"),
                DL_PROTO_E_BAD_FIELD, "'master_port' must be in [1, 65535]");
#undef ASSIGN
}

DL_TEST(test_senders)
{
    ck_assert(dl_proto_may_send(DL_PROTO_JOIN, DL_PROTO_ROLE_AGENT));
    ck_assert(!dl_proto_may_send(DL_PROTO_JOIN, DL_PROTO_ROLE_WORKER));
    ck_assert(!dl_proto_may_send(DL_PROTO_JOIN, DL_PROTO_ROLE_CONTROL));
    ck_assert(dl_proto_may_send(DL_PROTO_KV_WAIT, DL_PROTO_ROLE_WORKER));
    ck_assert(dl_proto_may_send(DL_PROTO_STOP, DL_PROTO_ROLE_CONTROL));
    ck_assert(!dl_proto_may_send(DL_PROTO_STOP, DL_PROTO_ROLE_AGENT));
    ck_assert(!dl_proto_may_send(DL_PROTO_ASSIGNMENT, DL_PROTO_ROLE_AGENT));
    ck_assert(dl_proto_may_send(DL_PROTO_ASSIGNMENT, DL_PROTO_ROLE_SERVER));
    ck_assert(!dl_proto_may_send(DL_PROTO_HELLO, DL_PROTO_ROLE_SERVER));
    ck_assert(!dl_proto_may_send(DL_PROTO_TYPE_NONE, DL_PROTO_ROLE_AGENT));
    ck_assert(!dl_proto_may_send(DL_PROTO_TYPE_COUNT, DL_PROTO_ROLE_SERVER));

    /* Every type is sent by the server or by clients, never both. */
    for (int t = 0; t < DL_PROTO_TYPE_COUNT; t++) {
        bool server = dl_proto_may_send((dl_proto_type_t)t, DL_PROTO_ROLE_SERVER);
        bool client = dl_proto_may_send((dl_proto_type_t)t, DL_PROTO_ROLE_AGENT) ||
                      dl_proto_may_send((dl_proto_type_t)t, DL_PROTO_ROLE_WORKER) ||
                      dl_proto_may_send((dl_proto_type_t)t, DL_PROTO_ROLE_CONTROL);
        ck_assert_msg(server != client, "%s", dl_proto_type_name((dl_proto_type_t)t));
        ck_assert_int_eq(client, dl_proto_type_kind((dl_proto_type_t)t) == DL_PROTO_KIND_REQUEST);
    }
}

DL_TEST(test_replies_match_requests)
{
    ck_assert(dl_proto_is_reply_to(DL_PROTO_HELLO, DL_PROTO_CHALLENGE));
    ck_assert(dl_proto_is_reply_to(DL_PROTO_HELLO, DL_PROTO_AUTH_OK));
    ck_assert(!dl_proto_is_reply_to(DL_PROTO_HELLO, DL_PROTO_REPLY));
    ck_assert(dl_proto_is_reply_to(DL_PROTO_AUTH, DL_PROTO_AUTH_OK));
    ck_assert(dl_proto_is_reply_to(DL_PROTO_JOIN, DL_PROTO_ASSIGNMENT));
    ck_assert(!dl_proto_is_reply_to(DL_PROTO_JOIN, DL_PROTO_REPLY));
    ck_assert(dl_proto_is_reply_to(DL_PROTO_KV_GET, DL_PROTO_REPLY));
    ck_assert(!dl_proto_is_reply_to(DL_PROTO_KV_GET, DL_PROTO_ASSIGNMENT));
    ck_assert(!dl_proto_is_reply_to(DL_PROTO_EVENT, DL_PROTO_REPLY));
    for (int t = 0; t < DL_PROTO_TYPE_COUNT; t++) {
        bool request = dl_proto_type_kind((dl_proto_type_t)t) == DL_PROTO_KIND_REQUEST;
        ck_assert_int_eq(dl_proto_is_reply_to((dl_proto_type_t)t, DL_PROTO_ERROR), request);
    }
}

DL_TEST(test_results)
{
    static const struct {
        dl_proto_type_t request;
        const char *result;
        dl_proto_errcode_t code;
    } cases[] = {
        {DL_PROTO_KV_GET, "{\"value\":\"abc\"}", DL_PROTO_E_NONE},
        {DL_PROTO_KV_GET, "{\"value\":1}", DL_PROTO_E_BAD_FIELD},
        {DL_PROTO_KV_GET, "{}", DL_PROTO_E_MISSING_FIELD},
        {DL_PROTO_KV_ADD, "{\"value\":-5}", DL_PROTO_E_NONE},
        {DL_PROTO_KV_ADD, "{\"value\":\"5\"}", DL_PROTO_E_BAD_FIELD},
        {DL_PROTO_KV_CAS, "{\"swapped\":false,\"value\":null}", DL_PROTO_E_NONE},
        {DL_PROTO_KV_CAS, "{\"swapped\":1,\"value\":\"x\"}", DL_PROTO_E_BAD_FIELD},
        {DL_PROTO_KV_DEL, "{\"deleted\":true}", DL_PROTO_E_NONE},
        {DL_PROTO_HEARTBEAT, "{\"round\":3}", DL_PROTO_E_NONE},
        {DL_PROTO_STATUS, "{\"state\":\"running\",\"round\":0,\"nodes\":[]}", DL_PROTO_E_NONE},
        {DL_PROTO_STATUS, "{\"round\":0}", DL_PROTO_E_MISSING_FIELD},
        {DL_PROTO_RESTART, "{\"round\":2}", DL_PROTO_E_NONE},
        {DL_PROTO_KV_SET, "{}", DL_PROTO_E_NONE},
        {DL_PROTO_KV_SET, "[]", DL_PROTO_E_BAD_FIELD},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_auto_t *result = json_loads(cases[i].result, JSON_DECODE_ANY, NULL);
        dl_proto_error_t err;
        int r = dl_proto_validate_result(cases[i].request, result, &err);
        ck_assert_msg(r == (cases[i].code == DL_PROTO_E_NONE ? 0 : -EBADMSG), "case %zu", i);
        ck_assert_msg(err.code == cases[i].code, "case %zu: %s", i, err.message);
        if (r < 0)
            ck_assert_ptr_nonnull(strstr(err.message, " reply: "));
    }
    /* A notification is not a request and has no result. */
    DL_CHECK_ERRNO(dl_proto_validate_result(DL_PROTO_EVENT, NULL, NULL), -EBADMSG);
}

DL_TEST(test_builders)
{
    json_auto_t *reply = dl_proto_reply_new(7, NULL);
    json_auto_t *reply2 = dl_proto_reply_new(8, json_pack("{s:s}", "value", "v"));
    json_auto_t *error = dl_proto_error_new(9, DL_PROTO_E_NOT_FOUND, "no key '%s'", "a/b");
    json_auto_t *anon = dl_proto_error_new(-1, DL_PROTO_E_FRAME_TOO_LARGE, "too big");
    json_auto_t *msg = dl_proto_msg_new(DL_PROTO_ROUND_CHANGED, -1);
    dl_proto_type_t type;
    const char *text = NULL;

    DL_CHECK_ERRNO(dl_proto_validate(reply, &type, NULL), 0);
    ck_assert_int_eq(type, DL_PROTO_REPLY);
    ck_assert_int_eq(json_object_size(json_object_get(reply, "result")), 0);
    DL_CHECK_ERRNO(dl_proto_validate(reply2, &type, NULL), 0);
    ck_assert_int_eq(
        dl_proto_validate_result(DL_PROTO_KV_GET, json_object_get(reply2, "result"), NULL), 0);
    ck_assert_int_eq(dl_proto_reply_error(reply2, NULL), DL_PROTO_E_NONE);

    DL_CHECK_ERRNO(dl_proto_validate(error, &type, NULL), 0);
    ck_assert_int_eq(type, DL_PROTO_ERROR);
    ck_assert_int_eq(dl_proto_get_int(error, "id", -1), 9);
    ck_assert_int_eq(dl_proto_reply_error(error, &text), DL_PROTO_E_NOT_FOUND);
    ck_assert_str_eq(text, "no key 'a/b'");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(error, "error"), "code")),
                     "not_found");

    DL_CHECK_ERRNO(dl_proto_validate(anon, &type, NULL), 0);
    ck_assert_ptr_null(json_object_get(anon, "id"));

    /* A notification is built without an id, then completed by the caller. */
    ck_assert_ptr_null(json_object_get(msg, "id"));
    json_object_set_new(msg, "round", json_integer(2));
    json_object_set_new(msg, "reason", json_string("node n1 missed heartbeats"));
    DL_CHECK_ERRNO(dl_proto_validate(msg, &type, NULL), 0);

    ck_assert_ptr_null(dl_proto_reply_new(-1, NULL));
    ck_assert_ptr_null(dl_proto_reply_new(1, json_array()));
    ck_assert_ptr_null(dl_proto_msg_new(DL_PROTO_TYPE_COUNT, 1));
    ck_assert_ptr_null(dl_proto_error_new(1, DL_PROTO_E_NONE, "no"));
}

DL_TEST(test_error_messages_are_one_printable_line)
{
    /* The peer's bytes end up in the message; they must not break the line or the UTF-8. */
    json_auto_t *m = json_pack("{s:i, s:s, s:i}", "v", 1, "type", "bad\ntype\xc3\xa9", "id", 5);
    json_auto_t *reply = NULL;
    dl_proto_type_t type;
    dl_proto_error_t err;

    DL_CHECK_ERRNO(dl_proto_validate(m, &type, &err), -EBADMSG);
    ck_assert_int_eq(err.code, DL_PROTO_E_UNKNOWN_TYPE);
    ck_assert_int_eq(err.id, 5);
    for (const char *p = err.message; *p != '\0'; p++)
        ck_assert_msg(*p >= 0x20 && *p <= 0x7e, "byte 0x%02x in '%s'", (unsigned char)*p,
                      err.message);
    reply = dl_proto_error_from(&err);
    ck_assert_ptr_nonnull(reply);
}

DL_TEST(test_errcode_names)
{
    for (int c = DL_PROTO_E_NONE + 1; c < DL_PROTO_E_OTHER; c++) {
        const char *name = dl_proto_errcode_name((dl_proto_errcode_t)c);
        ck_assert_ptr_nonnull(name);
        ck_assert_int_eq(dl_proto_errcode_parse(name), c);
        for (const char *p = name; *p != '\0'; p++)
            ck_assert((*p >= 'a' && *p <= 'z') || *p == '_');
    }
    ck_assert_str_eq(dl_proto_errcode_name(DL_PROTO_E_FRAME_TOO_LARGE), "frame_too_large");
    ck_assert_str_eq(dl_proto_errcode_name(DL_PROTO_E_AUTH_FAILED), "auth_failed");
    ck_assert_str_eq(dl_proto_errcode_name(DL_PROTO_E_NOT_AUTHENTICATED), "not_authenticated");
    ck_assert_int_eq(dl_proto_errcode_parse("from_the_future"), DL_PROTO_E_OTHER);
    ck_assert_int_eq(dl_proto_errcode_parse("none"), DL_PROTO_E_OTHER);
    ck_assert_ptr_null(dl_proto_errcode_name(DL_PROTO_E_COUNT));
}

DL_TEST(test_roles_and_run_ids)
{
    dl_proto_role_t role = DL_PROTO_ROLE_SERVER;
    char long_id[DL_PROTO_RUN_ID_MAX + 2];

    DL_CHECK_ERRNO(dl_proto_role_parse("worker", &role), 0);
    ck_assert_int_eq(role, DL_PROTO_ROLE_WORKER);
    DL_CHECK_ERRNO(dl_proto_role_parse("server", &role), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_role_parse("Agent", &role), -EINVAL);
    ck_assert_int_eq(role, DL_PROTO_ROLE_WORKER);
    ck_assert_str_eq(dl_proto_role_name(DL_PROTO_ROLE_CONTROL), "control");

    ck_assert(dl_proto_run_id_valid("job-42_a.b:c"));
    ck_assert(!dl_proto_run_id_valid(""));
    ck_assert(!dl_proto_run_id_valid("a/b"));
    ck_assert(!dl_proto_run_id_valid("a b"));
    ck_assert(!dl_proto_run_id_valid("caf\xc3\xa9"));
    memset(long_id, 'r', sizeof(long_id));
    long_id[DL_PROTO_RUN_ID_MAX] = '\0';
    ck_assert(dl_proto_run_id_valid(long_id));
    long_id[DL_PROTO_RUN_ID_MAX] = 'r';
    long_id[DL_PROTO_RUN_ID_MAX + 1] = '\0';
    ck_assert(!dl_proto_run_id_valid(long_id));
}

DL_TEST(test_getters)
{
    json_auto_t *m = parse(examples[DL_PROTO_JOIN]);

    ck_assert_str_eq(dl_proto_get_str(m, "host"), "h0");
    ck_assert_ptr_null(dl_proto_get_str(m, "slots"));
    ck_assert_ptr_null(dl_proto_get_str(m, "absent"));
    ck_assert_int_eq(dl_proto_get_int(m, "slots", -7), 8);
    ck_assert_int_eq(dl_proto_get_int(m, "node_rank", -1), -1);
    ck_assert_int_eq(dl_proto_get_int(m, "host", -7), -7);
}

DL_TEST(test_names_and_addresses)
{
    /* Names and addresses reach logs, terminals and environments: no line breaks, escapes or
     * spaces (docs/protocol.md). */
    expect_code("{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"n\\u001b[2J\",\"host\":\"h\","
                "\"slots\":1}",
                DL_PROTO_E_BAD_FIELD, "node_id");
    expect_code("{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"n 1\",\"host\":\"h\","
                "\"slots\":1}",
                DL_PROTO_E_BAD_FIELD, "node_id");
    expect_code("{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"n\",\"host\":\"h\\nX=1\","
                "\"slots\":1}",
                DL_PROTO_E_BAD_FIELD, "host");
    expect_code("{\"v\":1,\"type\":\"join\",\"id\":3,\"node_id\":\"gpu-7.example:x\",\"host\":"
                "\"[fe80::1%eth0]\",\"slots\":1,\"master_addr\":\"10.0.0.1\"}",
                DL_PROTO_E_NONE, NULL);
    expect_code("{\"v\":1,\"type\":\"assignment\",\"id\":3,\"round\":0,\"node_rank\":0,\"nodes\":1,"
                "\"world_size\":1,\"first_rank\":0,\"local_world_size\":1,\"master_addr\":"
                "\"10.0.0.1\\nLD_PRELOAD=/x\",\"master_port\":29500,\"store_addr\":\"h:1\"}",
                DL_PROTO_E_BAD_FIELD, "master_addr");
    expect_code("{\"v\":1,\"type\":\"assignment\",\"id\":3,\"round\":0,\"node_rank\":0,\"nodes\":1,"
                "\"world_size\":1,\"first_rank\":0,\"local_world_size\":1,\"master_addr\":"
                "\"h\",\"master_port\":29500,\"store_addr\":\"h:1 x\"}",
                DL_PROTO_E_BAD_FIELD, "store_addr");
    /* The handshake's nonces and proofs. */
    expect_code(
        "{\"v\":1,\"type\":\"hello\",\"id\":1,\"role\":\"agent\",\"run_id\":\"j\",\"proto\":1,"
        "\"nonce\":\"00\"}",
        DL_PROTO_E_BAD_FIELD, "nonce");
    expect_code("{\"v\":1,\"type\":\"auth_ok\",\"id\":2,\"proof\":"
                "\"fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\"}",
                DL_PROTO_E_NONE, NULL);
    expect_code("{\"v\":1,\"type\":\"auth_ok\",\"id\":2,\"proof\":\"FF\"}", DL_PROTO_E_BAD_FIELD,
                "proof");
}
