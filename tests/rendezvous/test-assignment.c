/* An assignment made from a typed record (proto/assignment.h: what the etcd backend reads from
 * the job's keys) meets the same validator as our server's frame: the same checks and the same
 * one-line refusal, so that whoever can write etcd's keys never puts text of their own into the
 * workers' environment. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dl-test.h"
#include "rendezvous.h"

static dl_proto_assignment_t good(void)
{
    return (dl_proto_assignment_t){.round = 2,
                                   .restart_count = 2,
                                   .nodes = 2,
                                   .world_size = 4,
                                   .has_world_size = true,
                                   .max_restarts = 3,
                                   .failures = 1,
                                   .master_port = 29500,
                                   .has_master_port = true,
                                   .master_addr = "10.0.0.1",
                                   .store_addr = "10.0.0.1:29401",
                                   .node_rank = 1,
                                   .first_rank = 2,
                                   .local_world_size = 2};
}

static const dl_rdzv_assignment_want_t want = {
    .slots = 2, .min_nodes = 1, .max_nodes = 2, .min_round = 0};

DL_TEST(a_record_reads_as_the_frame_would)
{
    dl_proto_assignment_t rec = good();
    dl_rdzv_assignment_t as;
    char err[256];
    DL_CHECK_ERRNO(dl_rdzv_assignment_read_rec(&rec, &want, &as, err, sizeof(err)), 0);
    ck_assert_int_eq(as.round, 2);
    ck_assert_int_eq(as.node_rank, 1);
    ck_assert_int_eq(as.first_rank, 2);
    ck_assert_int_eq(as.world_size, 4);
    ck_assert_int_eq(as.failures, 1);
    ck_assert_int_eq(as.master_port, 29500);
    ck_assert_str_eq(as.master_addr, "10.0.0.1");
    ck_assert_str_eq(as.store_addr, "10.0.0.1:29401");
}

/* The refusal of each bad record, against that of the same fields in a frame. */
DL_TEST(a_bad_record_is_refused_in_the_frames_words)
{
    dl_proto_assignment_t rec = good();
    dl_rdzv_assignment_t as;
    char err[256], frame_err[256];

    rec.master_addr = "127.0.0.1\nLD_PRELOAD=/tmp/evil.so";
    DL_CHECK_ERRNO(dl_rdzv_assignment_read_rec(&rec, &want, &as, err, sizeof(err)), -EPROTO);
    json_t *msg = dl_proto_assignment_msg(&rec);
    DL_CHECK_ERRNO(dl_rdzv_assignment_read(msg, &want, &as, frame_err, sizeof(frame_err)), -EPROTO);
    json_decref(msg);
    ck_assert_str_eq(err, frame_err);
    ck_assert_msg(strstr(err, "not an assignment: ") == err && strstr(err, "master_addr") != NULL,
                  "%s", err);
    ck_assert_ptr_null(strchr(err, '\n'));

    rec = good();
    rec.has_master_port = false;
    DL_CHECK_ERRNO(dl_rdzv_assignment_read_rec(&rec, &want, &as, err, sizeof(err)), -EPROTO);
    ck_assert_msg(strstr(err, "master_port") != NULL, "%s", err);

    rec = good();
    rec.first_rank = 0;
    rec.local_world_size = 3; /* this node offered 2 */
    DL_CHECK_ERRNO(dl_rdzv_assignment_read_rec(&rec, &want, &as, err, sizeof(err)), -EPROTO);
    ck_assert_str_eq(err, "3 workers on this node, which offered 2");
}
