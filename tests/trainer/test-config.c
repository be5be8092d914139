/* The trainer's settings: documented defaults, the key/value setter a YAML loader drives, and
 * errors that name the key. */
#include <errno.h>
#include <string.h>

#include "dl-test.h"
#include "trainer.h"

static char err[DL_TRAIN_ERRLEN];

DL_TEST(defaults)
{
    dl_train_config_t c;
    dl_train_config_init(&c);
    ck_assert_ptr_null(c.dataset_dir); /* means DL_TRAIN_DEFAULT_DATASET */
    ck_assert_uint_eq(c.n_layers, 3);
    ck_assert_uint_eq(c.sizes[0], 784);
    ck_assert_uint_eq(c.sizes[1], 256);
    ck_assert_uint_eq(c.sizes[2], 128);
    ck_assert_uint_eq(c.sizes[3], 10);
    ck_assert_int_eq(c.activation, DL_TRAIN_ACT_RELU);
    ck_assert_uint_eq(c.batch_size, 64);
    ck_assert_uint_eq(c.epochs, 10);
    ck_assert_double_eq(c.lr, 0.05);
    ck_assert_double_eq(c.momentum, 0.9);
    ck_assert_int_eq(c.schedule, DL_TRAIN_SCHED_COSINE);
    ck_assert_int_eq(c.lr_scaling, DL_TRAIN_SCALE_NONE);
    ck_assert_uint_eq(c.keep_checkpoints, 3);
    ck_assert(c.resume);
    ck_assert_int_eq(c.blas_threads, 1);
    ck_assert_int_eq(c.overlap, DL_TRAIN_OVERLAP_AUTO);
    ck_assert_uint_eq(c.fail_at_step, 0); /* no crash on purpose unless asked */
    DL_CHECK_ERRNO(dl_train_config_check(&c, err, sizeof(err)), 0);
    dl_train_config_free(&c);
    dl_train_config_free(NULL);
}

DL_TEST(set_every_kind)
{
    dl_train_config_t c;
    dl_train_config_init(&c);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "layers", "784,512,10", err, sizeof(err)), 0);
    ck_assert_uint_eq(c.n_layers, 2);
    ck_assert_uint_eq(c.sizes[1], 512);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "activation", "gelu", err, sizeof(err)), 0);
    ck_assert_int_eq(c.activation, DL_TRAIN_ACT_GELU);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "lr", "0.125", err, sizeof(err)), 0);
    ck_assert_double_eq(c.lr, 0.125);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "steps", "5000", err, sizeof(err)), 0);
    ck_assert_uint_eq(c.steps, 5000);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "drop_last", "yes", err, sizeof(err)), 0);
    ck_assert(c.drop_last);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "lr_scaling", "linear", err, sizeof(err)), 0);
    ck_assert_int_eq(c.lr_scaling, DL_TRAIN_SCALE_LINEAR);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "checkpoint_dir", "/tmp/x", err, sizeof(err)), 0);
    ck_assert_str_eq(c.checkpoint_dir, "/tmp/x");
    DL_CHECK_ERRNO(dl_train_config_set(&c, "checkpoint_dir", "", err, sizeof(err)), 0);
    ck_assert_ptr_null(c.checkpoint_dir);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "summary_file", "s.json", err, sizeof(err)), 0);
    ck_assert_int_eq(dl_train_config_set(&c, "seed", "18446744073709551615", err, sizeof(err)),
                     -ERANGE);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "bucket_bytes", "1048576", err, sizeof(err)), 0);
    ck_assert_uint_eq(c.bucket_bytes, 1048576);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "overlap", "off", err, sizeof(err)), 0);
    ck_assert_int_eq(c.overlap, DL_TRAIN_OVERLAP_OFF);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "overlap", "on", err, sizeof(err)), 0);
    ck_assert_int_eq(c.overlap, DL_TRAIN_OVERLAP_ON);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "fail_at_step", "300", err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "fail_rank", "1", err, sizeof(err)), 0);
    ck_assert_uint_eq(c.fail_at_step, 300);
    ck_assert_int_eq(c.fail_rank, 1);
    dl_train_config_free(&c);
}

DL_TEST(bad_values_name_the_key_and_change_nothing)
{
    static const char *const cases[][3] = {
        {"lr", "fast", "not a number"},
        {"lr", "-1", "out of range"},
        {"momentum", "1.5", "out of range"},
        {"batch_size", "0", "out of range"},
        {"batch_size", "64k", "not a whole number"},
        {"activation", "sigmoid", "relu, tanh, gelu"},
        {"schedule", "linear", "constant, step, cosine"},
        {"layers", "784", "at least an input and an output"},
        {"layers", "784--10", "list of widths"},
        {"layers", "784-0-10", "bad width"},
        {"layers", "1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16-17-18", "more than"},
        {"drop_last", "maybe", "true/false"},
        {"overlap", "true", "auto, on, off"},
        {"fail_rank", "-1", "out of range"},
        {"no_such_key", "1", "unknown trainer setting"},
    };
    dl_train_config_t c, before;
    dl_train_config_init(&c);
    before = c;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        ck_assert_int_lt(dl_train_config_set(&c, cases[i][0], cases[i][1], err, sizeof(err)), 0);
        ck_assert_msg(strstr(err, cases[i][0]) && strstr(err, cases[i][2]), "%s=%s: %s",
                      cases[i][0], cases[i][1], err);
        ck_assert_mem_eq(&c, &before, sizeof(c));
    }
    dl_train_config_free(&c);
}

DL_TEST(check_catches_contradictions)
{
    dl_train_config_t c;
    dl_train_config_init(&c);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "epochs", "0", err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_train_config_check(&c, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "nothing to do"));
    DL_CHECK_ERRNO(dl_train_config_set(&c, "steps", "10", err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_train_config_check(&c, err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_train_config_set(&c, "lr_min", "1", err, sizeof(err)), 0);
    DL_CHECK_ERRNO(dl_train_config_check(&c, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "lr_min"));
    dl_train_config_free(&c);
}

DL_TEST(key_table_covers_every_key)
{
    size_t n = dl_train_settings.n;
    dl_train_config_t c;
    dl_train_config_init(&c);
    for (size_t i = 0; i < n; i++) {
        const dl_opt_t *o = &dl_train_settings.opts[i];
        ck_assert(o->help[0] != '\0');
        /* Every listed default is accepted by the setter. */
        if (o->def != NULL)
            ck_assert_msg(dl_train_config_set(&c, o->name, o->def, err, sizeof(err)) == 0, "%s",
                          err);
    }
    ck_assert_uint_ge(n, 20);
    const char *required[] = {
        "dataset_dir",  "layers",    "activation",     "batch_size",       "epochs",
        "steps",        "lr",        "momentum",       "weight_decay",     "lr_scaling",
        "warmup_steps", "schedule",  "seed",           "bucket_bytes",     "overlap",
        "fail_at_step", "fail_rank", "checkpoint_dir", "checkpoint_every", "eval_every",
        "summary_file"};
    for (size_t r = 0; r < sizeof(required) / sizeof(required[0]); r++) {
        bool found = false;
        for (size_t i = 0; i < n; i++)
            found = found || strcmp(dl_train_settings.opts[i].name, required[r]) == 0;
        ck_assert_msg(found, "no key %s", required[r]);
    }
    dl_train_config_free(&c);
}
