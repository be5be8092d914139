/* The job spec from flags, DLAUNCH_* variables and YAML, and the errors a user sees. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dl-test.h"
#include "internal.h"

static char err[DL_CONFIG_ERRLEN];
static char tmpdir[] = "/tmp/dl-test-jobspec-XXXXXX";

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static const char *write_spec(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Loads argv (NULL-terminated) with env; returns dl_config_load's result. */
static int load(dl_job_spec_t *spec, char **env, dl_config_action_t *action, ...)
{
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, action);
    argv[argc++] = "dlaunch";
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    dl_job_spec_init(spec);
    err[0] = '\0';
    return dl_config_load(spec, argc, argv, env, action, err, sizeof(err));
}

DL_TEST(defaults_and_command)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, "--", "sh", "-c", "echo hi", NULL), 0);
    ck_assert_int_eq(act, DL_CONFIG_RUN);
    ck_assert_int_eq(s.nodes_min, 1);
    ck_assert_int_eq(s.nodes_max, 1);
    ck_assert_int_eq(s.gpus_per_node, DL_GPUS_DEFAULT);
    ck_assert_int_eq(s.max_restarts, 0);
    ck_assert(s.stop_timeout == 10.0);
    ck_assert_uint_eq(s.command_len, 3);
    ck_assert_str_eq(s.command[2], "echo hi");
    ck_assert_ptr_null(s.command[3]);
    dl_job_spec_free(&s);
}

DL_TEST(flags_forms)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, "--nodes=2:4", "--nproc-per-node", "8", "-q",
                          "--max-restarts", "3", "--stop-timeout=2.5", "--dry-run", "--run-id",
                          "r1", "--", "true", NULL),
                     0);
    ck_assert_int_eq(s.nodes_min, 2);
    ck_assert_int_eq(s.nodes_max, 4);
    ck_assert_int_eq(s.gpus_per_node, 8);
    ck_assert(s.quiet);
    ck_assert(s.dry_run);
    ck_assert_int_eq(s.max_restarts, 3);
    ck_assert(s.stop_timeout == 2.5);
    ck_assert_str_eq(s.run_id, "r1");
    dl_job_spec_free(&s);
}

DL_TEST(precedence_flag_env_yaml_default)
{
    const char *path = write_spec("prec.yaml", "max_restarts: 1\n"
                                               "gpus_per_node: 2\n"
                                               "stop_timeout: 4\n"
                                               "command: [\"true\"]\n");
    char *env[] = {"DLAUNCH_MAX_RESTARTS=2", "DLAUNCH_GPUS_PER_NODE=3", "DLAUNCH_QUIET=", NULL};
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, env, &act, (char *)path, "--max-restarts", "5", NULL), 0);
    ck_assert_int_eq(s.max_restarts, 5);  /* flag over env and YAML */
    ck_assert_int_eq(s.gpus_per_node, 3); /* env over YAML */
    ck_assert(s.stop_timeout == 4.0);     /* YAML over default */
    ck_assert(!s.quiet);                  /* an empty variable counts as unset */
    ck_assert_str_eq(s.command[0], "true");
    dl_job_spec_free(&s);
}

DL_TEST(yaml_everything)
{
    const char *path = write_spec("all.yaml", "# a full spec\n"
                                              "nodes: 1:3\n"
                                              "gpus_per_node: auto\n"
                                              "run_id: exp-1\n"
                                              "log_dir: /tmp/x\n"
                                              "events: '-'\n"
                                              "verbose: true\n"
                                              "command:\n"
                                              "  - python3\n"
                                              "  - train.py\n"
                                              "  - --lr=0.1\n"
                                              "env:\n"
                                              "  NCCL_DEBUG: INFO\n"
                                              "  SEED: 7\n");
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, (char *)path, NULL), 0);
    ck_assert_int_eq(s.nodes_min, 1);
    ck_assert_int_eq(s.nodes_max, 3);
    ck_assert_str_eq(s.run_id, "exp-1");
    ck_assert_str_eq(s.events, "-");
    ck_assert(s.verbose);
    ck_assert_uint_eq(s.command_len, 3);
    ck_assert_str_eq(s.command[2], "--lr=0.1");
    ck_assert_uint_eq(s.env_len, 2);
    ck_assert_str_eq(s.env[0], "NCCL_DEBUG=INFO");
    ck_assert_str_eq(s.env[1], "SEED=7");
    ck_assert_str_eq(s.spec_path, path);
    dl_job_spec_free(&s);
}

/* Each bad spec and the start of the one-line error it must give. */
static const struct {
    const char *yaml;
    const char *error; /* after "<path>:" */
} bad_yaml[] = {
    {"max_restart: 1\ncommand: [x]\n", "1:1: unknown key 'max_restart'"},
    {"command: [x]\nmax-restarts: 1\n", "2:1: unknown key 'max-restarts' (keys use '_', not '-')"},
    {"command: [x]\nmax_restarts: -1\n", "2:15: max_restarts: '-1' is out of range"},
    {"command: [x]\nmax_restarts: lots\n", "2:15: max_restarts: 'lots' is not a whole number"},
    {"command: [x]\nmax_restarts: '3'\n",
     "2:15: max_restarts: expected a whole number, got a quoted"},
    {"command: [x]\nnodes: 3:1\n", "2:8: nodes: '3:1' is out of range"},
    {"command: [x]\nnodes: [1, 2]\n", "2:8: nodes: expected a single value, got a list"},
    {"command: x\n", "1:10: command: expected a list of strings (argv), got a scalar"},
    {"command: []\n", "1:10: command: must not be empty"},
    {"command: [a, {b: c}]\n", "1:14: command: each argument must be a string, got a mapping"},
    {"command: [x]\nenv: [A]\n", "2:6: env: expected a mapping"},
    {"command: [x]\nenv:\n  1BAD: x\n", "3:3: env: '1BAD' is not a variable name"},
    {"command: [x]\nenv:\n  A: [1]\n", "3:6: env: A: expected a string, got a list"},
    {"command: [x]\ncommand: [y]\n", "2:1: duplicate key 'command'"},
    {"- a\n- b\n", "1:1: the job spec must be a mapping of keys, got a list"},
    {"command: [x\n", "2:1: did not find expected ',' or ']'"},
    {"quiet: maybe\ncommand: [x]\n", "1:8: quiet: 'maybe' is not a boolean"},
    {"stop_timeout: 1e9\ncommand: [x]\n", "1:15: stop_timeout: '1e9' is out of range"},
    {"run_id: ''\ncommand: [x]\n", "1:9: run_id: must not be empty"},
    {"run_id: a/b\ncommand: [x]\n", "1:9: run_id: 'a/b' is not a run id"},
    {"", "the job spec is empty"},
};

DL_TEST_LOOP(yaml_errors_name_line_and_column, 0, (int)(sizeof(bad_yaml) / sizeof(bad_yaml[0])))
{
    dl_job_spec_t s;
    dl_config_action_t act;
    char expect[1024];
    const char *path = write_spec("bad.yaml", bad_yaml[_i].yaml);
    DL_CHECK_ERRNO(load(&s, NULL, &act, (char *)path, NULL), -EINVAL);
    snprintf(expect, sizeof(expect), "%s:%s", path, bad_yaml[_i].error);
    if (bad_yaml[_i].error[0] == 't') /* no position for an empty file */
        snprintf(expect, sizeof(expect), "%s: %s", path, bad_yaml[_i].error);
    ck_assert_msg(strncmp(err, expect, strlen(expect)) == 0, "got '%s', want '%s...'", err, expect);
    ck_assert_ptr_null(strchr(err, '\n'));
    dl_job_spec_free(&s);
}

DL_TEST(yaml_train_section)
{
    const char *path = write_spec("train.yaml", "gpus_per_node: 2\n"
                                                "train:\n"
                                                "  epochs: 3\n"
                                                "  layers: [784, 128, 10]\n"
                                                "  lr: 0.05\n");
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, (char *)path, NULL), 0);
    ck_assert_ptr_null(s.command); /* the trainer runs */
    ck_assert_uint_eq(s.train_len, 3);
    ck_assert_str_eq(s.train[0], "epochs=3");
    ck_assert_str_eq(s.train[1], "layers=784,128,10");
    ck_assert_str_eq(s.train[2], "lr=0.05");
    char expect[600];
    snprintf(expect, sizeof(expect), "%s:4:11", path);
    ck_assert_str_eq(s.train_where[1], expect);
    dl_job_spec_free(&s);

    path = write_spec("train-bad.yaml", "train: [1]\n");
    DL_CHECK_ERRNO(load(&s, NULL, &act, (char *)path, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, ":1:8: train: expected a mapping of settings"));
    dl_job_spec_free(&s);
}

DL_TEST(flag_and_env_errors)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    char *bad_env[] = {"DLAUNCH_NODES=two", NULL};

    DL_CHECK_ERRNO(load(&s, NULL, &act, "--nodes", "0", "--", "x", NULL), -EINVAL);
    ck_assert_str_eq(err, "--nodes: '0' is out of range (want N or MIN:MAX, 1 <= MIN <= MAX)");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--gpus-per-node", "many", "--", "x", NULL), -EINVAL);
    ck_assert_str_eq(err, "--gpus-per-node: 'many' is not a count (1 to 4096) or 'auto'");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--bogus", NULL), -EINVAL);
    ck_assert_str_eq(err, "unknown option '--bogus' (see --help)");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--max-restarts", NULL), -EINVAL);
    ck_assert_str_eq(err, "option '--max-restarts' needs a value (N)");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--quiet=yes", "--", "x", NULL), -EINVAL);
    ck_assert_str_eq(err, "option '--quiet' takes no value");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, bad_env, &act, "--", "x", NULL), -EINVAL);
    ck_assert_str_eq(err, "DLAUNCH_NODES: 'two' is not N or MIN:MAX");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, NULL), -EINVAL);
    ck_assert_str_eq(err, "nothing to run: give JOB.yaml, a script, or -- COMMAND [ARGS...]");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--", NULL), -EINVAL);
    ck_assert_str_eq(err, "nothing after '--': give the command to run");
    dl_job_spec_free(&s);
    DL_CHECK_ERRNO(load(&s, NULL, &act, "a.yaml", "b.yaml", NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "unexpected argument 'b.yaml'"));
    dl_job_spec_free(&s);
    ck_assert_int_lt(load(&s, NULL, &act, "/nonexistent/job.yaml", NULL), 0);
    ck_assert_str_eq(err, "/nonexistent/job.yaml: cannot open the job spec: "
                          "No such file or directory");
    dl_job_spec_free(&s);
}

DL_TEST(straggler_options)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, "--", "true", NULL), 0);
    ck_assert_ptr_null(s.straggler_action);
    ck_assert(s.straggler_threshold == 0.3);
    ck_assert_int_eq(s.straggler_window, 100);
    ck_assert(s.straggler_cooldown == 300.0);
    dl_job_spec_free(&s);
    char *env[] = {"DLAUNCH_STRAGGLER_WINDOW=40", NULL};
    const char *yaml = write_spec("straggler.yaml", "straggler_action: off\n"
                                                    "straggler_cooldown: 5\n"
                                                    "command: [true]\n");
    ck_assert_int_eq(load(&s, env, &act, "--straggler-action", "exclude",
                          "--straggler-threshold=0.5", yaml, NULL),
                     0);
    ck_assert_str_eq(s.straggler_action, "exclude");
    ck_assert(s.straggler_threshold == 0.5);
    ck_assert_int_eq(s.straggler_window, 40);
    ck_assert(s.straggler_cooldown == 5.0);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--straggler-action", "kick", "--", "true", NULL),
                     -EINVAL);
    ck_assert_str_eq(err, "--straggler-action: 'kick' is not one of warn, exclude, off");
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--straggler-threshold", "0", "--", "true", NULL),
                     -EINVAL);
    ck_assert_str_eq(err, "--straggler-threshold: '0' is out of range (0.01 to 100)");
    dl_job_spec_free(&s);
    char *bad[] = {"DLAUNCH_STRAGGLER_WINDOW=0", NULL};
    DL_CHECK_ERRNO(load(&s, bad, &act, "--", "true", NULL), -EINVAL);
    ck_assert_str_eq(err, "DLAUNCH_STRAGGLER_WINDOW: '0' is out of range (1 to 1000000000)");
    dl_job_spec_free(&s);
}

DL_TEST(numa_binding_modes)
{
    static const struct {
        const char *text;
        dl_numa_mode_t mode;
    } modes[] = {{"auto", DL_NUMA_AUTO},           {"none", DL_NUMA_NONE},
                 {"node", DL_NUMA_NODE},           {"socket", DL_NUMA_SOCKET},
                 {"exclusive", DL_NUMA_EXCLUSIVE}, {"core-complex", DL_NUMA_CORE_COMPLEX}};
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, "--", "true", NULL), 0);
    ck_assert_int_eq(s.numa_binding, DL_NUMA_AUTO);
    dl_job_spec_free(&s);
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        ck_assert_int_eq(load(&s, NULL, &act, "--numa-binding", modes[i].text, "--", "true", NULL),
                         0);
        ck_assert_int_eq(s.numa_binding, modes[i].mode);
        dl_job_spec_free(&s);
    }
    const char *path = write_spec("numa.yaml", "numa_binding: exclusive\ncommand: [\"true\"]\n");
    char *env[] = {"PET_NUMA_BINDING=socket", NULL};
    ck_assert_int_eq(load(&s, NULL, &act, (char *)path, NULL), 0);
    ck_assert_int_eq(s.numa_binding, DL_NUMA_EXCLUSIVE);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, env, &act, (char *)path, NULL), 0);
    ck_assert_int_eq(s.numa_binding, DL_NUMA_SOCKET);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--numa-binding", "core_complex", "--", "true", NULL),
                     -EINVAL);
    ck_assert_str_eq(err, "--numa-binding: 'core_complex' is not one of auto, none, node, socket, "
                          "exclusive, core-complex");
    dl_job_spec_free(&s);
}

DL_TEST(help_and_version_win)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_int_eq(load(&s, NULL, &act, "--nodes", "2", "--help", NULL), 0);
    ck_assert_int_eq(act, DL_CONFIG_HELP);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "-V", NULL), 0);
    ck_assert_int_eq(act, DL_CONFIG_VERSION);
    dl_job_spec_free(&s);
}

DL_TEST(number_parsers)
{
    long l;
    double d;
    int lo, hi;
    DL_CHECK_ERRNO(dl_parse_int("42", 0, 100, &l), 0);
    ck_assert_int_eq(l, 42);
    DL_CHECK_ERRNO(dl_parse_int("", 0, 100, &l), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_int(" 4", 0, 100, &l), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_int("4x", 0, 100, &l), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_int("+4", 0, 100, &l), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_int("101", 0, 100, &l), -ERANGE);
    DL_CHECK_ERRNO(dl_parse_int("99999999999999999999999", 0, 100, &l), -ERANGE);
    DL_CHECK_ERRNO(dl_parse_double("0.5", 0, 1, &d), 0);
    DL_CHECK_ERRNO(dl_parse_double("nan", 0, 1, &d), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_double("inf", 0, 1, &d), -ERANGE);
    DL_CHECK_ERRNO(dl_parse_nodes("2:8", &lo, &hi), 0);
    ck_assert_int_eq(lo * 10 + hi, 28);
    DL_CHECK_ERRNO(dl_parse_nodes(":8", &lo, &hi), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_nodes("2:", &lo, &hi), -EINVAL);
    DL_CHECK_ERRNO(dl_parse_nodes("2:3:4", &lo, &hi), -EINVAL);
}

/* docs/job-spec.md's table is written by hand: every flag of the table must be in it. */
DL_TEST(docs_name_every_option)
{
    const char *root = getenv("SOURCE_ROOT");
    char path[4096], flag[128];
    if (root == NULL)
        return;
    snprintf(path, sizeof(path), "%s/docs/job-spec.md", root);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s", path);
    static char doc[1 << 20];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    doc[n] = '\0';
    fclose(f);
    for (size_t i = 0; i < dl__options_count; i++) {
        snprintf(flag, sizeof(flag), "`--%s`", dl__options[i].name);
        ck_assert_msg(strstr(doc, flag) != NULL, "docs/job-spec.md does not name %s", flag);
        if (dl__options[i].alias != NULL) {
            snprintf(flag, sizeof(flag), "`--%s`", dl__options[i].alias);
            ck_assert_msg(strstr(doc, flag) != NULL, "docs/job-spec.md does not name %s", flag);
        }
    }
}

/* torchrun parses with argparse, which takes any unambiguous start of a long flag. */
DL_TEST(flag_prefixes_as_argparse)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_msg(load(&s, NULL, &act, "--nproc", "3", "--max_rest=2", "--stand", "--rdzv-i", "p1",
                       "--dry", "--", "true", NULL) == 0,
                  "%s", err);
    ck_assert_int_eq(s.gpus_per_node, 3);
    ck_assert(s.gpus_from_nproc);
    ck_assert_int_eq(s.max_restarts, 2);
    ck_assert(s.standalone);
    ck_assert(s.dry_run);
    ck_assert_str_eq(s.run_id, "p1");
    dl_job_spec_free(&s);

    /* An exact name wins over the longer names it begins (--tee, not a prefix). */
    ck_assert_msg(load(&s, NULL, &act, "--tee", "3", "--", "true", NULL) == 0, "%s", err);
    ck_assert_str_eq(s.tee, "3");
    dl_job_spec_free(&s);

    ck_assert_msg(load(&s, NULL, &act, "--nproc-per-node", "xpu", "--", "true", NULL) == 0, "%s",
                  err);
    ck_assert_int_eq(s.gpus_per_node, DL_GPUS_XPU);
    dl_job_spec_free(&s);

    DL_CHECK_ERRNO(load(&s, NULL, &act, "--no", "--", "true", NULL), -EINVAL);
    ck_assert_str_eq(err, "ambiguous option '--no' could match --nodes, --node-rank, --no-python");
    dl_job_spec_free(&s);
    /* A flag that takes no value still takes none through its prefix. */
    DL_CHECK_ERRNO(load(&s, NULL, &act, "--stand=1", "--", "true", NULL), -EINVAL);
    ck_assert_str_eq(err, "option '--standalone' takes no value");
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--nproc-per-nodes", "2", "--", "true", NULL), -EINVAL);
    ck_assert_msg(strstr(err, "unknown option '--nproc-per-nodes'") != NULL, "%s", err);
    dl_job_spec_free(&s);
}

/* torchrun's c10d keys: keep_alive_interval is our heartbeat, a node missing
 * keep_alive_max_attempt of them is dead; store_type tcp is what we serve, file is refused. */
DL_TEST(rdzv_conf_c10d_keep_alive_keys)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    ck_assert_msg(load(&s, NULL, &act, "--rdzv-conf",
                       "keep_alive_interval=2,keep_alive_max_attempt=4,heartbeat_timeout=3,"
                       "store_type=TCP",
                       "--", "true", NULL) == 0,
                  "%s", err);
    ck_assert_double_eq(s.heartbeat, 2);
    ck_assert_double_eq(s.dead_after, 8);
    dl_job_spec_free(&s);
    /* The count goes with the interval in force, and a later --dead-after still wins. */
    ck_assert_msg(load(&s, NULL, &act, "--heartbeat", "0.5", "--rdzv-conf",
                       "keep_alive_max_attempt=3", "--", "true", NULL) == 0,
                  "%s", err);
    ck_assert_double_eq(s.dead_after, 1.5);
    dl_job_spec_free(&s);
    ck_assert_msg(load(&s, NULL, &act, "--rdzv-conf", "keep_alive_max_attempt=3", "--dead-after",
                       "9", "--", "true", NULL) == 0,
                  "%s", err);
    ck_assert_double_eq(s.dead_after, 9);
    dl_job_spec_free(&s);
    /* Without the key the default stays. */
    ck_assert_msg(
        load(&s, NULL, &act, "--rdzv-conf", "keep_alive_interval=1", "--", "true", NULL) == 0, "%s",
        err);
    ck_assert_double_eq(s.dead_after, 5);
    dl_job_spec_free(&s);

    /* HOST:0, a free port: one node hosts it itself; over several nodes it is an error. */
    ck_assert_msg(load(&s, NULL, &act, "--rdzv-endpoint", "localhost:0", "--", "true", NULL) == 0,
                  "%s", err);
    ck_assert_ptr_null(s.rdzv_endpoint);
    dl_job_spec_free(&s);
    ck_assert_int_eq(
        load(&s, NULL, &act, "--nnodes", "1:2", "--rdzv-endpoint", "h:0", "--", "true", NULL),
        -EINVAL);
    ck_assert_msg(strstr(err, "--rdzv-endpoint h:0: port 0 picks a free port that the other "
                              "nodes cannot know"),
                  "%s", err);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--rdzv-conf", "store_type=file", "--", "true", NULL),
                     -EINVAL);
    ck_assert_msg(strstr(err, "store_type=file: dlaunch's rendezvous is always served over TCP"),
                  "%s", err);
    dl_job_spec_free(&s);
    ck_assert_int_eq(
        load(&s, NULL, &act, "--rdzv-conf", "keep_alive_max_attempt=2.5", "--", "true", NULL),
        -EINVAL);
    ck_assert_msg(strstr(err, "keep_alive_max_attempt=2.5: want a whole number"), "%s", err);
    dl_job_spec_free(&s);
}

DL_TEST(torchrun_spellings_and_pet_variables)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    char *argv[] = {"dlaunch", "--nproc_per_node", "3",    "--max_restarts=2", "--rdzv-id", "x",
                    "-r3",     "--no-python",      "prog", "--nproc-per-node", "9",         NULL};
    char *env[] = {"PET_NNODES=1:4", "PET_MAX_RESTARTS=7", "DLAUNCH_MAX_RESTARTS=", NULL};
    dl_job_spec_init(&s);
    ck_assert_msg(dl_config_load(&s, 11, argv, env, &act, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(s.gpus_per_node, 3);
    ck_assert(s.gpus_from_nproc);
    ck_assert_int_eq(s.max_restarts, 2);
    ck_assert_int_eq(s.nodes_min, 1);
    ck_assert_int_eq(s.nodes_max, 4);
    ck_assert_str_eq(s.run_id, "x");
    ck_assert_str_eq(s.redirects, "3");
    /* After the script everything is the script's, options included. */
    ck_assert_int_eq((int)s.command_len, 3);
    ck_assert_str_eq(s.command[0], "prog");
    ck_assert_str_eq(s.command[1], "--nproc-per-node");
    dl_job_spec_free(&s);

    char *py[] = {"dlaunch", "-m", "pkg.mod", "--lr", "1", NULL};
    char *pyenv[] = {"PYTHON_EXEC=/opt/py/bin/python3", NULL};
    ck_assert_msg(dl_config_load(&s, 5, py, pyenv, &act, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq((int)s.command_len, 6);
    ck_assert_str_eq(s.command[0], "/opt/py/bin/python3");
    ck_assert_str_eq(s.command[1], "-u");
    ck_assert_str_eq(s.command[2], "-m");
    ck_assert_str_eq(s.command[3], "pkg.mod");
    dl_job_spec_free(&s);

    char *conf[] = {"dlaunch", "--rdzv-conf", "'join_timeout=5,last_call_timeout=1,is_host=0'",
                    "--",      "true",        NULL};
    ck_assert_msg(dl_config_load(&s, 5, conf, NULL, &act, err, sizeof(err)) == 0, "%s", err);
    ck_assert_double_eq(s.join_timeout, 5);
    ck_assert_double_eq(s.last_call, 1);
    ck_assert_int_eq(s.is_host, 0);
    dl_job_spec_free(&s);

    char *missing[] = {"dlaunch", "--max-restarts", "--", "true", NULL};
    DL_CHECK_ERRNO(dl_config_load(&s, 4, missing, NULL, &act, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "option '--max-restarts' needs a value (N)");
    dl_job_spec_free(&s);
}

DL_TEST(forwarded_signals_and_stop_grace)
{
    dl_job_spec_t s;
    dl_config_action_t act;
    char *slurm_env[] = {"SLURM_JOB_ID=42", NULL};
    char *no_slurm_env[] = {"SLURM_JOB_ID=42", "DLAUNCH_NO_SLURM=1", NULL};
    char *grace_env[] = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=25", NULL};
    char *both_env[] = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=25", "DLAUNCH_STOP_TIMEOUT=7", NULL};

    /* Outside Slurm nothing is passed on by default; under it the preemption warnings are. */
    ck_assert_int_eq(load(&s, NULL, &act, "--", "true", NULL), 0);
    ck_assert_str_eq(dl_forward_signals(&s, NULL), "");
    ck_assert_str_eq(dl_forward_signals(&s, slurm_env), "SIGUSR1,SIGUSR2");
    ck_assert_str_eq(dl_forward_signals(&s, no_slurm_env), "");
    dl_job_spec_free(&s);

    ck_assert_int_eq(load(&s, slurm_env, &act, "--forward-signals", "none", "--", "true", NULL), 0);
    ck_assert_str_eq(dl_forward_signals(&s, slurm_env), "");
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--forward-signals=USR2,SIGWINCH", "--", "true", NULL),
                     0);
    ck_assert_str_eq(dl_forward_signals(&s, NULL), "USR2,SIGWINCH");
    dl_job_spec_free(&s);

    /* A signal cannot both stop the job and be passed on while it goes on. */
    ck_assert_int_eq(
        load(&s, NULL, &act, "--forward-signals", "SIGUSR1,SIGTERM", "--", "true", NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "SIGTERM also stops the job"));
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--signals-to-handle", "SIGTERM,SIGUSR1",
                          "--forward-signals", "USR1", "--", "true", NULL),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "SIGUSR1 also stops the job"));
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, NULL, &act, "--forward-signals", "SIGKILL", "--", "true", NULL),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--forward-signals"));
    dl_job_spec_free(&s);

    /* torchrun's variable for the stop grace, below our own variable and flag. */
    ck_assert_int_eq(load(&s, grace_env, &act, "--", "true", NULL), 0);
    ck_assert(s.stop_timeout == 25.0);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, both_env, &act, "--", "true", NULL), 0);
    ck_assert(s.stop_timeout == 7.0);
    dl_job_spec_free(&s);
    ck_assert_int_eq(load(&s, grace_env, &act, "--stop-timeout", "3", "--", "true", NULL), 0);
    ck_assert(s.stop_timeout == 3.0);
    dl_job_spec_free(&s);
    char *bad_env[] = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon", NULL};
    DL_CHECK_ERRNO(load(&s, bad_env, &act, "--", "true", NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
    dl_job_spec_free(&s);
}

DL_TEST_SUITE(.setup_once = setup);
