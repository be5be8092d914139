/* The per-job key-value store of the rendezvous core: operations, waits, limits and the round
 * scoping, with an injected clock. */
#include <errno.h>
#include <string.h>

#include "dl-test.h"
#include "harness.h"

static dl_rdzv_buf_t buf(const char *s)
{
    return (dl_rdzv_buf_t){s, s ? strlen(s) : 0};
}

static void op(harness_t *h, dl_rdzv_event_kind_t kind, uint64_t conn, const char *run_id,
               int round, const char *key, const char *value, double now)
{
    dl_rdzv_event_t ev = {.kind = kind, .conn = conn, .req_id = 500 + conn, .run_id = run_id};
    ev.store.round = round;
    ev.store.key = buf(key);
    ev.store.value = buf(value);
    h_step(h, &ev, now);
}

static void wait_keys(harness_t *h, uint64_t conn, const char *run_id, int round,
                      const char *const *keys, size_t n, double timeout, double now)
{
    dl_rdzv_buf_t b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = buf(keys[i]);
    dl_rdzv_event_t ev = {
        .kind = DL_RDZV_EV_STORE_WAIT, .conn = conn, .req_id = 700 + conn, .run_id = run_id};
    ev.wait.round = round;
    ev.wait.keys = b;
    ev.wait.nkeys = n;
    ev.wait.timeout = timeout;
    h_step(h, &ev, now);
}

static void cas(harness_t *h, uint64_t conn, const char *key, const char *expected,
                const char *desired)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_CAS, .conn = conn, .req_id = 9, .run_id = "job"};
    ev.store.round = -1;
    ev.store.key = buf(key);
    ev.store.expected = buf(expected);
    ev.store.expect_absent = expected == NULL;
    ev.store.value = buf(desired);
    h_step(h, &ev, 0);
}

static int64_t add(harness_t *h, uint64_t conn, const char *key, int64_t delta)
{
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_ADD, .conn = conn, .req_id = 8, .run_id = "job"};
    ev.store.round = -1;
    ev.store.key = buf(key);
    ev.store.delta = delta;
    h_step(h, &ev, 0);
    const dl_rdzv_msg_t *m = h_msg(h, conn, DL_RDZV_MSG_COUNTER);
    ck_assert_ptr_nonnull(m);
    return m->counter.value;
}

static bool value_is(const dl_rdzv_msg_t *m, const char *want)
{
    size_t n = strlen(want);
    return m && m->kind == DL_RDZV_MSG_VALUE && m->value.found && m->value.value.len == n &&
           memcmp(m->value.value.data, want, n) == 0;
}

static void setup(harness_t *h)
{
    h_init(h);
    dl_rdzv_job_opts_t o = h_opts(1, 4);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h->core, "job", &o, NULL), 0);
}

DL_TEST(set_then_get)
{
    harness_t h;
    setup(&h);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "addr/0", "10.0.0.5:1234", 0);
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_OK);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->req_id, 501);
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", -1, "addr/0", NULL, 0);
    ck_assert(value_is(h_msg(&h, 2, DL_RDZV_MSG_VALUE), "10.0.0.5:1234"));
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "addr/0", "overwritten", 0);
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", 0, "addr/0", NULL, 0);
    ck_assert(value_is(h_msg(&h, 2, DL_RDZV_MSG_VALUE), "overwritten"));
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", 0, "missing", NULL, 0);
    m = h_msg(&h, 2, DL_RDZV_MSG_VALUE);
    ck_assert_ptr_nonnull(m);
    ck_assert(!m->value.found);
    /* Values are bytes: NULs and empty values survive. */
    static const char bin[] = {'a', 0, 'b', 0};
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_SET, .conn = 1, .run_id = "job"};
    ev.store.round = -1;
    ev.store.key = buf("bin");
    ev.store.value = (dl_rdzv_buf_t){bin, sizeof(bin)};
    h_step(&h, &ev, 0);
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", 0, "bin", NULL, 0);
    m = h_msg(&h, 2, DL_RDZV_MSG_VALUE);
    ck_assert_uint_eq(m->value.value.len, 4);
    ck_assert_int_eq(memcmp(m->value.value.data, bin, 4), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "empty", "", 0);
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", 0, "empty", NULL, 0);
    m = h_msg(&h, 2, DL_RDZV_MSG_VALUE);
    ck_assert(m->value.found);
    ck_assert_uint_eq(m->value.value.len, 0);
    ck_assert_uint_eq(h_status(&h, "job", 0)->nkeys, 3);
    /* The status counts keys and values: "key"+"value" of the first SET, "bin", "empty". */
    ck_assert_uint_gt(h_status(&h, "job", 0)->store_bytes, strlen("bin") + sizeof(bin));
    ck_assert_uint_eq(h_status(&h, "job", 0)->store_waits, 0);
    h_fini(&h);
}

DL_TEST(add_is_an_integer_counter)
{
    harness_t h;
    setup(&h);
    ck_assert_int_eq(add(&h, 1, "n", 5), 5);
    ck_assert_int_eq(add(&h, 2, "n", -7), -2);
    ck_assert_int_eq(add(&h, 1, "n", 0), -2);
    op(&h, DL_RDZV_EV_STORE_GET, 2, "job", 0, "n", NULL, 0);
    ck_assert(value_is(h_msg(&h, 2, DL_RDZV_MSG_VALUE), "-2"));
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "s", "12x", 0);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_ADD, .conn = 1, .run_id = "job"};
    ev.store.round = -1;
    ev.store.key = buf("s");
    ev.store.delta = 1;
    h_step(&h, &ev, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "s", "9223372036854775807", 0);
    h_step(&h, &ev, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -ERANGE);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "s", "-9223372036854775808", 0);
    ck_assert_int_eq(add(&h, 1, "s", 1), -9223372036854775807LL);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "s", "99999999999999999999", 0);
    h_step(&h, &ev, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    h_fini(&h);
}

DL_TEST(compare_set_swaps_only_on_a_match)
{
    harness_t h;
    setup(&h);
    cas(&h, 1, "leader", NULL, "a");
    const dl_rdzv_msg_t *m = h_msg(&h, 1, DL_RDZV_MSG_CAS);
    ck_assert(m->cas.swapped);
    ck_assert(m->cas.found);
    ck_assert_int_eq(memcmp(m->cas.value.data, "a", 1), 0);
    cas(&h, 2, "leader", NULL, "b");
    m = h_msg(&h, 2, DL_RDZV_MSG_CAS);
    ck_assert(!m->cas.swapped);
    ck_assert_uint_eq(m->cas.value.len, 1);
    ck_assert_int_eq(memcmp(m->cas.value.data, "a", 1), 0);
    cas(&h, 2, "leader", "x", "b");
    ck_assert(!h_msg(&h, 2, DL_RDZV_MSG_CAS)->cas.swapped);
    cas(&h, 2, "leader", "a", "bb");
    m = h_msg(&h, 2, DL_RDZV_MSG_CAS);
    ck_assert(m->cas.swapped);
    ck_assert_uint_eq(m->cas.value.len, 2);
    cas(&h, 3, "nothing", "a", "b");
    m = h_msg(&h, 3, DL_RDZV_MSG_CAS);
    ck_assert(!m->cas.swapped);
    ck_assert(!m->cas.found);
    h_fini(&h);
}

DL_TEST(delete_removes_a_key)
{
    harness_t h;
    setup(&h);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k", "v", 0);
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "job", 0, "k", NULL, 0);
    ck_assert(h_msg(&h, 1, DL_RDZV_MSG_DELETED)->deleted.deleted);
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "job", 0, "k", NULL, 0);
    ck_assert(!h_msg(&h, 1, DL_RDZV_MSG_DELETED)->deleted.deleted);
    op(&h, DL_RDZV_EV_STORE_GET, 1, "job", 0, "k", NULL, 0);
    ck_assert(!h_msg(&h, 1, DL_RDZV_MSG_VALUE)->value.found);
    ck_assert_uint_eq(h_status(&h, "job", 0)->nkeys, 0);
    h_fini(&h);
}

DL_TEST(a_wait_is_completed_by_later_sets)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"a", "b"};
    wait_keys(&h, 5, "job", 0, keys, 2, 30, 0);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    ck_assert(h_armed(&h) == 30);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "a", "1", 1);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "b", "2", 2);
    const dl_rdzv_msg_t *m = h_msg(&h, 5, DL_RDZV_MSG_WAIT_DONE);
    ck_assert_ptr_nonnull(m);
    ck_assert_uint_eq(m->req_id, 705);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    /* Done means gone: no timeout later, and the timer was dropped. */
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), -ENOENT);
    h_tick(&h, 40);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    h_fini(&h);
}

DL_TEST(a_wait_times_out)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"a", "b", "c"};
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "b", "1", 0);
    wait_keys(&h, 5, "job", 0, keys, 3, 5, 10);
    ck_assert_uint_eq(h_status(&h, "job", 10)->store_waits, 1);
    h_tick(&h, 14.9);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    h_tick(&h, 15);
    const dl_rdzv_msg_t *m = h_msg(&h, 5, DL_RDZV_MSG_ERROR);
    ck_assert_ptr_nonnull(m);
    DL_CHECK_ERRNO(m->error.code, -ETIMEDOUT);
    ck_assert_uint_eq(m->req_id, 705);
    ck_assert_ptr_nonnull(strstr(m->error.message, "2 of 3"));
    /* Keys only waited on are gone with the wait. */
    ck_assert_uint_eq(h_status(&h, "job", 15)->nkeys, 1);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "a", "1", 16);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "c", "1", 16);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    h_fini(&h);
}

DL_TEST(present_keys_and_zero_timeouts_answer_at_once)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"a", "b"};
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "a", "1", 0);
    wait_keys(&h, 5, "job", 0, keys, 2, 0, 0);
    DL_CHECK_ERRNO(h_error(&h, 5), -ETIMEDOUT);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "b", "1", 0);
    wait_keys(&h, 5, "job", 0, keys, 2, 0, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 5, DL_RDZV_MSG_WAIT_DONE));
    h_fini(&h);
}

DL_TEST(many_waiters_on_one_key)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"barrier"};
    enum { N = 2000 };
    for (uint64_t c = 1; c <= N; c++)
        wait_keys(&h, 100 + c, "job", 0, keys, 1, c % 2 ? 60 : -1, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "barrier", "go", 1);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_WAIT_DONE), N);
    for (uint64_t c = 1; c <= N; c++)
        ck_assert_uint_eq(h_msg(&h, 100 + c, DL_RDZV_MSG_WAIT_DONE)->req_id, 700 + 100 + c);
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), -ENOENT);
    h_fini(&h);
}

DL_TEST(waits_go_with_their_connection)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"k"};
    wait_keys(&h, 5, "job", 0, keys, 1, 30, 0);
    wait_keys(&h, 5, "job", 0, keys, 1, -1, 0);
    wait_keys(&h, 6, "job", 0, keys, 1, 30, 0);
    h_conn_event(&h, DL_RDZV_EV_DISCONNECT, 5, 0, 1);
    ck_assert_uint_eq(h.acts.n, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k", "v", 2);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    ck_assert_ptr_nonnull(h_msg(&h, 6, DL_RDZV_MSG_WAIT_DONE));
    double at;
    DL_CHECK_ERRNO(dl_rdzv_core_next_deadline(h.core, &at), -ENOENT);
    h_fini(&h);
}

DL_TEST(a_deleted_key_is_missing_again)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"a", "b"};
    wait_keys(&h, 5, "job", 0, keys, 2, -1, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "a", "1", 0);
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "job", 0, "a", NULL, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "b", "1", 0);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    /* CAS and ADD that create a key count as writes too. */
    cas(&h, 1, "a", NULL, "x");
    ck_assert_ptr_nonnull(h_msg(&h, 5, DL_RDZV_MSG_WAIT_DONE));
    static const char *const counter[] = {"n"};
    wait_keys(&h, 6, "job", 0, counter, 1, -1, 0);
    add(&h, 1, "n", 1);
    ck_assert_ptr_nonnull(h_msg(&h, 6, DL_RDZV_MSG_WAIT_DONE));
    h_fini(&h);
}

DL_TEST(limits_are_errors)
{
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.max_key_len = 8;
    o.max_value_len = 16;
    o.max_keys = 3;
    o.max_wait_keys = 2;
    o.max_waits = 2;
    h_init_opts(&h, &o);
    dl_rdzv_job_opts_t jo = h_opts(1, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "job", &jo, NULL), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "123456789", "v", 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "", "v", 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EINVAL);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k", "0123456789abcdefg", 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -EMSGSIZE);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k1", "0123456789abcdef", 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k2", "0123456789abcdef", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k3", "0123456789abcdef", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k1", "0123456789abcdef", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK)); /* an overwrite of equal size fits */
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "job", 0, "k3", NULL, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k3", "x", 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k4", "x", 0);
    ck_assert_int_eq(h_error(&h, 1), -ENOSPC); /* three keys at most */
    ck_assert_ptr_nonnull(strstr(h_msg(&h, 1, DL_RDZV_MSG_ERROR)->error.message, "limit"));
    static const char *const three[] = {"a", "b", "c"}, *const one[] = {"w"};
    wait_keys(&h, 5, "job", 0, three, 3, 10, 0);
    DL_CHECK_ERRNO(h_error(&h, 5), -EINVAL);
    wait_keys(&h, 5, "job", 0, one, 1, 10, 0);
    ck_assert_int_eq(h_error(&h, 5), -ENOSPC); /* a waited-on key needs room too */
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "job", 0, "k3", NULL, 0);
    wait_keys(&h, 5, "job", 0, one, 1, 10, 0);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    wait_keys(&h, 6, "job", 0, one, 1, 10, 0);
    ck_assert_uint_eq(h_sends_to(&h, 6), 0);
    wait_keys(&h, 7, "job", 0, one, 1, 10, 0);
    ck_assert_int_eq(h_error(&h, 7), -ENOSPC); /* two pending waits at most */
    h_fini(&h);
}

DL_TEST(the_bytes_of_a_store_are_capped)
{
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.max_store_bytes = 40;
    h_init_opts(&h, &o);
    dl_rdzv_job_opts_t jo = h_opts(1, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "job", &jo, NULL), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k1", "0123456789abcdef", 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k2", "0123456789abcdef", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    /* 36 bytes held: a 2-byte key fits, its 4-byte value does not. */
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k3", "0123", 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -ENOSPC);
    ck_assert_uint_eq(h_status(&h, "job", 0)->nkeys, 2);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k2", "01", 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k3", "0123", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    h_fini(&h);
}

DL_TEST(the_memory_of_all_stores_is_capped)
{
    /* Every job under its own limit, but all of them together under max_memory: two jobs cannot
     * each take their full share when the server has room for less. */
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.max_memory = 64 * 1024;
    h_init_opts(&h, &o);
    dl_rdzv_job_opts_t jo = h_opts(1, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "a", &jo, NULL), 0);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "b", &jo, NULL), 0);
    static char value[4097];
    memset(value, 'v', 4096);
    char key[32];
    int stored = 0, code = 0;
    for (int i = 0; i < 64 && code == 0; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        op(&h, DL_RDZV_EV_STORE_SET, 1, i % 2 ? "a" : "b", 0, key, value, 0);
        code = h_error(&h, 1);
        stored += code == 0;
    }
    DL_CHECK_ERRNO(code, -ENOBUFS);
    ck_assert_int_ge(stored, 10);
    ck_assert_int_le(stored, 16);
    /* Small keys fill what is left... */
    code = 0;
    for (int i = 0; i < 10000 && code == 0; i++) {
        snprintf(key, sizeof(key), "s%d", i);
        op(&h, DL_RDZV_EV_STORE_SET, 1, "a", 0, key, "", 0);
        code = h_error(&h, 1);
    }
    DL_CHECK_ERRNO(h_error(&h, 1), -ENOBUFS);
    /* ...and then a wait, which needs memory too, finds none; a delete gives it back. */
    static const char *const keys[] = {"nobody-sets-this"};
    wait_keys(&h, 2, "a", -1, keys, 1, 5, 0);
    DL_CHECK_ERRNO(h_error(&h, 2), -ENOBUFS);
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "a", 0, "k1", NULL, 0);
    op(&h, DL_RDZV_EV_STORE_DELETE, 1, "b", 0, "k0", NULL, 0);
    wait_keys(&h, 2, "a", -1, keys, 1, 5, 0);
    ck_assert_int_eq(h_error(&h, 2), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "b", 0, "again", value, 0);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    h_fini(&h);
}

DL_TEST(waits_of_one_connection_are_capped)
{
    harness_t h;
    dl_rdzv_core_opts_t o;
    dl_rdzv_core_opts_init(&o);
    o.max_waits_per_conn = 3;
    h_init_opts(&h, &o);
    dl_rdzv_job_opts_t jo = h_opts(1, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "job", &jo, NULL), 0);
    static const char *const keys[] = {"x"};
    for (int i = 0; i < 3; i++) {
        wait_keys(&h, 1, "job", -1, keys, 1, 50, 0);
        ck_assert_int_eq(h_error(&h, 1), 0);
    }
    wait_keys(&h, 1, "job", -1, keys, 1, 50, 0);
    DL_CHECK_ERRNO(h_error(&h, 1), -ENOSPC);
    /* Another connection has its own; one that finishes makes room. */
    wait_keys(&h, 2, "job", -1, keys, 1, 50, 0);
    ck_assert_int_eq(h_error(&h, 2), 0);
    op(&h, DL_RDZV_EV_STORE_SET, 3, "job", 0, "x", "1", 1);
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_WAIT_DONE), 4);
    wait_keys(&h, 1, "job", -1, keys, 1, 50, 1);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_WAIT_DONE));
    h_fini(&h);
}

static void start_two_nodes(harness_t *h)
{
    h_init(h);
    dl_rdzv_job_opts_t o = h_opts(2, 2);
    h_join(h, 1, "job", 1, &o, 0);
    h_join(h, 2, "job", 1, &o, 0);
    ck_assert_uint_eq(h_count(h, DL_RDZV_MSG_ASSIGNMENT), 2);
}

DL_TEST(a_new_round_starts_an_empty_store)
{
    harness_t h;
    start_two_nodes(&h);
    static const char *const keys[] = {"x"};
    op(&h, DL_RDZV_EV_STORE_SET, 10, "job", 0, "k", "v", 1);
    wait_keys(&h, 11, "job", 0, keys, 1, 60, 1);
    op(&h, DL_RDZV_EV_STORE_SET, 10, "job", 1, "k", "v", 1);
    DL_CHECK_ERRNO(h_error(&h, 10), -ESTALE);
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 1, 0, 2);
    DL_CHECK_ERRNO(h_error(&h, 11), -ESTALE);
    op(&h, DL_RDZV_EV_STORE_GET, 10, "job", 0, "k", NULL, 3);
    DL_CHECK_ERRNO(h_error(&h, 10), -ESTALE);
    op(&h, DL_RDZV_EV_STORE_GET, 10, "job", 1, "k", NULL, 3);
    ck_assert(!h_msg(&h, 10, DL_RDZV_MSG_VALUE)->value.found);
    op(&h, DL_RDZV_EV_STORE_SET, 10, "job", -1, "k", "new", 3);
    op(&h, DL_RDZV_EV_STORE_GET, 10, "job", 1, "k", NULL, 3);
    ck_assert(value_is(h_msg(&h, 10, DL_RDZV_MSG_VALUE), "new"));
    h_fini(&h);
}

/* A one-node job's restart: the agent empties the store, and waits of the last attempt end. */
DL_TEST(a_reset_empties_the_store_and_ends_its_waits)
{
    harness_t h;
    setup(&h);
    static const char *const keys[] = {"x"};
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", -1, "k", "v", 0);
    wait_keys(&h, 2, "job", -1, keys, 1, 60, 0);
    dl_rdzv_event_t ev = {.kind = DL_RDZV_EV_STORE_RESET, .run_id = "job"};
    h_step(&h, &ev, 1);
    DL_CHECK_ERRNO(h_error(&h, 2), -ESTALE);
    op(&h, DL_RDZV_EV_STORE_GET, 1, "job", -1, "k", NULL, 2);
    ck_assert(!h_msg(&h, 1, DL_RDZV_MSG_VALUE)->value.found);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", -1, "k", "again", 2);
    op(&h, DL_RDZV_EV_STORE_GET, 1, "job", -1, "k", NULL, 2);
    ck_assert(value_is(h_msg(&h, 1, DL_RDZV_MSG_VALUE), "again"));
    /* Another job, or none, is left alone. */
    ev.run_id = "nope";
    h_step(&h, &ev, 3);
    op(&h, DL_RDZV_EV_STORE_GET, 1, "job", -1, "k", NULL, 3);
    ck_assert(value_is(h_msg(&h, 1, DL_RDZV_MSG_VALUE), "again"));
    h_fini(&h);
}

DL_TEST(waits_end_with_the_job)
{
    harness_t h;
    start_two_nodes(&h);
    static const char *const keys[] = {"x"};
    wait_keys(&h, 11, "job", -1, keys, 1, -1, 1);
    h_control(&h, DL_RDZV_EV_STOP, 50, "job", 2);
    DL_CHECK_ERRNO(h_error(&h, 11), -ESHUTDOWN);
    op(&h, DL_RDZV_EV_STORE_GET, 10, "job", -1, "x", NULL, 3);
    DL_CHECK_ERRNO(h_error(&h, 10), -ESHUTDOWN);
    op(&h, DL_RDZV_EV_STORE_GET, 10, "nope", -1, "x", NULL, 3);
    DL_CHECK_ERRNO(h_error(&h, 10), -ENOENT);
    h_fini(&h);
}

DL_TEST(stores_are_per_job)
{
    harness_t h;
    setup(&h);
    dl_rdzv_job_opts_t o = h_opts(1, 1);
    DL_CHECK_ERRNO(dl_rdzv_core_add_job(h.core, "other", &o, NULL), 0);
    static const char *const keys[] = {"k"};
    wait_keys(&h, 5, "other", 0, keys, 1, -1, 0);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "job", 0, "k", "in job", 0);
    ck_assert_uint_eq(h_sends_to(&h, 5), 0);
    op(&h, DL_RDZV_EV_STORE_GET, 1, "other", 0, "k", NULL, 0);
    ck_assert(!h_msg(&h, 1, DL_RDZV_MSG_VALUE)->value.found);
    op(&h, DL_RDZV_EV_STORE_SET, 1, "other", 0, "k", "in other", 0);
    ck_assert_ptr_nonnull(h_msg(&h, 5, DL_RDZV_MSG_WAIT_DONE));
    op(&h, DL_RDZV_EV_STORE_GET, 1, "job", 0, "k", NULL, 0);
    ck_assert(value_is(h_msg(&h, 1, DL_RDZV_MSG_VALUE), "in job"));
    h_fini(&h);
}

DL_TEST(a_member_connection_keeps_its_membership_after_its_waits)
{
    harness_t h;
    start_two_nodes(&h);
    static const char *const keys[] = {"x"};
    /* The agent's own connection waits, and the wait completes: it stays a member. */
    wait_keys(&h, 1, "job", 0, keys, 1, 5, 1);
    op(&h, DL_RDZV_EV_STORE_SET, 2, "job", 0, "x", "v", 2);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_WAIT_DONE));
    h_conn_event(&h, DL_RDZV_EV_WORKER_FAILED, 1, 0, 3);
    ck_assert_ptr_nonnull(h_msg(&h, 1, DL_RDZV_MSG_OK));
    ck_assert_uint_eq(h_count(&h, DL_RDZV_MSG_ROUND_CHANGED), 2);
    h_fini(&h);
}
