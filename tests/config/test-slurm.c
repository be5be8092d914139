/* The Slurm environment: environments captured from real srun, sbatch and salloc runs on the test
 * cluster (tests/config/slurm-env/), then precedence, errors and the port formula. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dl-test.h"
#include "slurm.h"

static char err[512];

/* ---- environments captured on tests/slurm/cluster-start.sh (DLS_GPUS=2) */

typedef struct {
    char *lines[128];
    size_t n;
} envfile_t;

static char **load(envfile_t *f, const char *name)
{
    const char *root = getenv("SOURCE_ROOT");
    char path[4096], line[4096];
    FILE *fp;

    ck_assert_msg(root != NULL, "SOURCE_ROOT is not set");
    snprintf(path, sizeof(path), "%s/tests/config/slurm-env/%s", root, name);
    fp = fopen(path, "r");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    f->n = 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        ck_assert_uint_lt(f->n, 127);
        f->lines[f->n] = strdup(line);
        ck_assert_ptr_nonnull(f->lines[f->n]);
        f->n++;
    }
    fclose(fp);
    f->lines[f->n] = NULL;
    ck_assert_uint_gt(f->n, 10);
    return f->lines;
}

static void unload(envfile_t *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->lines[i]);
    f->n = 0;
}

static dl_slurm_env_t parsed(char **envp)
{
    dl_slurm_env_t e;
    int r = dl_slurm_env_parse(envp, &e, err, sizeof(err));

    ck_assert_msg(r == 0, "parse failed: %d %s", r, err);
    return e;
}

DL_TEST(srun_task)
{
    envfile_t f;
    /* srun -N2 --ntasks-per-node=2, the task with SLURM_PROCID=3 */
    dl_slurm_env_t e = parsed(load(&f, "srun-n2-task3.env"));

    ck_assert(e.in_allocation);
    ck_assert(e.in_step);
    ck_assert_int_eq(e.job_id, 2);
    ck_assert_int_eq(e.step_id, 0);
    ck_assert_int_eq(e.nnodes, 2);
    ck_assert_uint_eq(e.nhosts, 2);
    ck_assert_str_eq(e.hosts[0], "dln01");
    ck_assert_str_eq(e.hosts[1], "dln02");
    ck_assert_ptr_null(e.hosts[2]);
    ck_assert_str_eq(e.nodelist_var, "SLURM_STEP_NODELIST");
    ck_assert_int_eq(e.node_id, 1);
    ck_assert_str_eq(e.rdzv_host, "dln01");
    ck_assert_int_eq(e.rdzv_port, 20002);
    ck_assert_int_eq(e.proc_id, 3);
    ck_assert_int_eq(e.local_id, 1);
    ck_assert_int_eq(e.ntasks, 4);
    ck_assert_int_eq(e.cpus_on_node, 2);
    ck_assert_int_eq(e.gpus_per_node, -1);
    ck_assert_int_eq(e.restart_count, 0);
    ck_assert_str_eq(e.submit_dir, "/tmp/envcap");
    dl_slurm_env_free(&e);
    unload(&f);
}

DL_TEST(sbatch_script)
{
    envfile_t f;
    dl_slurm_env_t e = parsed(load(&f, "sbatch-n2.env"));

    ck_assert(e.in_allocation);
    ck_assert(!e.in_step);
    ck_assert_int_eq(e.job_id, 3);
    ck_assert_int_eq(e.step_id, -1);
    ck_assert_int_eq(e.nnodes, 2);
    ck_assert_str_eq(e.nodelist_var, "SLURM_JOB_NODELIST");
    ck_assert_int_eq(e.node_id, 0);
    ck_assert_str_eq(e.rdzv_host, "dln01");
    ck_assert_int_eq(e.rdzv_port, 20003);
    ck_assert_int_eq(e.ntasks, -1);
    dl_slurm_env_free(&e);
    unload(&f);
}

DL_TEST(step_smaller_than_the_job)
{
    envfile_t f;
    /* srun -N1 inside sbatch -N2: SLURM_NODELIST and SLURM_JOB_* describe the job's two nodes,
     * SLURM_STEP_* and SLURM_NNODES the step's one. */
    dl_slurm_env_t e = parsed(load(&f, "sbatch-n2-srun-n1.env"));

    ck_assert(e.in_step);
    ck_assert_int_eq(e.nnodes, 1);
    ck_assert_uint_eq(e.nhosts, 1);
    ck_assert_str_eq(e.hosts[0], "dln01");
    ck_assert_int_eq(e.node_id, 0);
    ck_assert_int_eq(e.ntasks, 1);
    dl_slurm_env_free(&e);
    unload(&f);
}

DL_TEST(gpus_from_real_runs)
{
    envfile_t f;
    dl_slurm_env_t e = parsed(load(&f, "sbatch-n2-gpus.env")); /* --gpus-per-node=fake:2 */

    ck_assert_int_eq(e.gpus_per_node, 2);
    dl_slurm_env_free(&e);
    unload(&f);

    e = parsed(load(&f, "sbatch-n2-gpus-srun-task1.env"));
    ck_assert(e.in_step);
    ck_assert_int_eq(e.node_id, 1);
    ck_assert_int_eq(e.gpus_per_node, 2);
    dl_slurm_env_free(&e);
    unload(&f);

    /* salloc's shell runs on the submit host: no SLURM_NODEID, no SLURM_GPUS_ON_NODE. */
    e = parsed(load(&f, "salloc-n2-gpus.env"));
    ck_assert(e.in_allocation);
    ck_assert(!e.in_step);
    ck_assert_int_eq(e.node_id, -1);
    ck_assert_int_eq(e.gpus_per_node, 1);
    ck_assert_int_eq(e.nnodes, 2);
    dl_slurm_env_free(&e);
    unload(&f);
}

/* ---- precedence */

DL_TEST(outside_slurm)
{
    char *none[] = {NULL};
    char *other[] = {"PATH=/bin", "SLURM_NNODES=4", "SLURM_NODEID=junk", NULL};
    dl_slurm_env_t e = parsed(none);

    ck_assert(!e.in_allocation);
    ck_assert(!e.in_step);
    ck_assert_ptr_null(e.hosts);
    ck_assert_ptr_null(e.rdzv_host);
    ck_assert_int_eq(e.node_id, -1);
    ck_assert_int_eq(e.gpus_per_node, -1);
    ck_assert_int_eq(e.rdzv_port, 0);
    dl_slurm_env_free(&e);

    /* Leftover variables without a job id are ignored, junk included. */
    e = parsed(other);
    ck_assert(!e.in_allocation);
    ck_assert_int_eq(e.nnodes, 0);
    dl_slurm_env_free(&e);

    e = parsed(NULL);
    ck_assert(!e.in_allocation);
    dl_slurm_env_free(&e);
}

DL_TEST(older_names_and_first_occurrence)
{
    char *env[] = {"SLURM_JOBID=12001",
                   "SLURM_STEPID=7",
                   "SLURM_NODELIST=c[1-3]",
                   "SLURM_NODEID=2",
                   "SLURM_NPROCS=3",
                   "SLURM_NODEID=0",
                   NULL};
    dl_slurm_env_t e = parsed(env);

    ck_assert_int_eq(e.job_id, 12001);
    ck_assert_int_eq(e.rdzv_port, 20001);
    ck_assert(e.in_step);
    ck_assert_int_eq(e.step_id, 7);
    ck_assert_str_eq(e.nodelist_var, "SLURM_NODELIST");
    ck_assert_int_eq(e.nnodes, 3);
    ck_assert_int_eq(e.node_id, 2);
    ck_assert_int_eq(e.ntasks, 3);
    dl_slurm_env_free(&e);
}

DL_TEST(step_list_only_inside_a_step)
{
    /* A stale SLURM_STEP_NODELIST without a step (exported into a batch script, say) is ignored. */
    char *batch[] = {"SLURM_JOB_ID=9", "SLURM_JOB_NODELIST=a[1-4]", "SLURM_JOB_NUM_NODES=4",
                     "SLURM_NNODES=4", "SLURM_STEP_NODELIST=a1",    NULL};
    char *step[] = {"SLURM_JOB_ID=9",         "SLURM_STEP_ID=1", "SLURM_JOB_NODELIST=a[1-4]",
                    "SLURM_JOB_NUM_NODES=4",  "SLURM_NNODES=2",  "SLURM_STEP_NODELIST=a[3-4]",
                    "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=1",  NULL};
    dl_slurm_env_t e = parsed(batch);

    ck_assert_int_eq(e.nnodes, 4);
    ck_assert_str_eq(e.rdzv_host, "a1");
    ck_assert_str_eq(e.hosts[3], "a4");
    dl_slurm_env_free(&e);

    e = parsed(step);
    ck_assert_int_eq(e.nnodes, 2);
    ck_assert_str_eq(e.rdzv_host, "a3");
    ck_assert_int_eq(e.node_id, 1);
    dl_slurm_env_free(&e);
}

DL_TEST(gpus_on_node_wins)
{
    char *env[] = {"SLURM_JOB_ID=1",       "SLURM_JOB_NODELIST=g1", "SLURM_GPUS_PER_NODE=a100:8",
                   "SLURM_GPUS_ON_NODE=4", "SLURM_RESTART_COUNT=3", NULL};
    dl_slurm_env_t e = parsed(env);

    ck_assert_int_eq(e.gpus_per_node, 4);
    ck_assert_int_eq(e.restart_count, 3);
    dl_slurm_env_free(&e);
}

/* ---- errors */

DL_TEST(errors_name_the_variable)
{
    static const struct {
        const char *env[8];
        int code;
        const char *message;
    } cases[] = {
        {{"SLURM_JOB_ID=abc"}, -EINVAL, "SLURM_JOB_ID='abc': not a number"},
        {{"SLURM_JOBID= 5"}, -EINVAL, "SLURM_JOBID=' 5': not a number"},
        {{"SLURM_JOB_ID=0"}, -ERANGE, "SLURM_JOB_ID='0': out of range 1..4294967295"},
        {{"SLURM_JOB_ID=5"}, -ENOENT, "SLURM_JOB_NODELIST: not set, although SLURM_JOB_ID=5 is"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n[5-3]"},
         -EINVAL,
         "SLURM_JOB_NODELIST: hostlist 'n[5-3]': range '5-3' runs backwards at offset 2"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST="},
         -EINVAL,
         "SLURM_JOB_NODELIST='': names no host"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_NNODES=3"},
         -EINVAL,
         "SLURM_NNODES='3': does not match SLURM_JOB_NODELIST (2 hosts)"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_NODEID=x"},
         -EINVAL,
         "SLURM_NODEID='x': not a number"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_NODEID=2"},
         -ERANGE,
         "SLURM_NODEID='2': out of range 0..1 (SLURM_JOB_NODELIST names 2 hosts)"},
        {{"SLURM_JOB_ID=5", "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n1"},
         -ENOENT,
         "SLURM_NODEID: not set, although SLURM_STEP_ID=0 is"},
        {{"SLURM_JOB_ID=5", "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n1", "SLURM_NODEID=0",
          "SLURM_PROCID=4", "SLURM_NTASKS=4"},
         -ERANGE,
         "SLURM_PROCID='4': out of range 0..3 (SLURM_NTASKS=4)"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_GPUS_PER_NODE=gpu:"},
         -EINVAL,
         "SLURM_GPUS_PER_NODE='gpu:': expected [type:]count[(xN)], comma-separated (e.g. 4, "
         "a100:4, gpu:a100:4)"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_GPUS_PER_NODE=a:2000"},
         -ERANGE,
         "SLURM_GPUS_PER_NODE='a:2000': more than 1024 GPUs"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_GPUS_ON_NODE=-1"},
         -ERANGE,
         "SLURM_GPUS_ON_NODE='-1': out of range 0..1024"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_CPUS_ON_NODE=0"},
         -ERANGE,
         "SLURM_CPUS_ON_NODE='0': out of range 1..1000000"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_RESTART_COUNT=1x"},
         -EINVAL,
         "SLURM_RESTART_COUNT='1x': not a number"},
        {{"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", "SLURM_LOCALID=\x01"},
         -EINVAL,
         "SLURM_LOCALID='?': not a number"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dl_slurm_env_t e, before;
        memset(&e, 0x5a, sizeof(e));
        before = e;
        err[0] = '\0';
        int r = dl_slurm_env_parse((char *const *)cases[i].env, &e, err, sizeof(err));
        ck_assert_msg(r == cases[i].code, "case %zu: expected %d, got %d (%s)", i, cases[i].code, r,
                      err);
        ck_assert_str_eq(err, cases[i].message);
        ck_assert_msg(memcmp(&e, &before, sizeof(e)) == 0, "case %zu: ret was touched", i);
    }
}

DL_TEST(long_values_are_shortened)
{
    char value[200], var[220];
    char *env[] = {"SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n1", var, NULL};
    dl_slurm_env_t e;

    memset(value, '7', 150);
    value[150] = 'x';
    value[151] = '\0';
    snprintf(var, sizeof(var), "SLURM_NODEID=%s", value);
    DL_CHECK_ERRNO(dl_slurm_env_parse(env, &e, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "777...': not a number") != NULL, "%s", err);
    ck_assert_uint_lt(strlen(err), 100);
}

/* ---- GPU counts */

DL_TEST(gpu_forms)
{
    static const struct {
        const char *text;
        int code, gpus;
    } cases[] = {
        {"2", 0, 2},
        {"0", 0, 0},
        {"gpu:2", 0, 2},
        {"tesla:2", 0, 2},
        {"tesla:2(x2)", 0, 2},
        {"gpu:a100:4", 0, 4},
        {"gpu:a100:4(x16)", 0, 4},
        {"volta:3,kepler:1", 0, 4},
        {"1024", 0, 1024},
        {"", -EINVAL, 0},
        {"gpu:", -EINVAL, 0},
        {":2", -EINVAL, 0},
        {"a::2", -EINVAL, 0},
        {"a:b:c:2", -EINVAL, 0},
        {"2(x)", -EINVAL, 0},
        {"2(x0)", -EINVAL, 0},
        {"2(y2)", -EINVAL, 0},
        {"2(x2", -EINVAL, 0},
        {"(x2)", -EINVAL, 0},
        {"2x", -EINVAL, 0},
        {"-1", -EINVAL, 0},
        {"2,", -EINVAL, 0},
        {"a 100:2", -EINVAL, 0},
        {"1025", -ERANGE, 0},
        {"gpu:600,gpu:600", -ERANGE, 0},
        {"99999999999999999999999", -ERANGE, 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int gpus = -7;
        int r = dl_slurm_parse_gpus(cases[i].text, &gpus);
        ck_assert_msg(r == cases[i].code, "'%s': expected %d, got %d", cases[i].text, cases[i].code,
                      r);
        ck_assert_msg(gpus == (r == 0 ? cases[i].gpus : -7), "'%s': %d GPUs", cases[i].text, gpus);
    }
    DL_CHECK_ERRNO(dl_slurm_parse_gpus(NULL, &(int){0}), -EINVAL);
}

/* ---- the rendezvous port */

DL_TEST(port_formula)
{
    ck_assert_int_eq(dl_slurm_rdzv_port(0), 20000);
    ck_assert_int_eq(dl_slurm_rdzv_port(1), 20001);
    ck_assert_int_eq(dl_slurm_rdzv_port(11999), 31999);
    ck_assert_int_eq(dl_slurm_rdzv_port(12000), 20000);
    ck_assert_int_eq(dl_slurm_rdzv_port(4294967295L), 31295);
    /* Unprivileged and below Linux's default ephemeral range, for every job id. */
    for (long id = 0; id < 50000; id += 7) {
        int port = dl_slurm_rdzv_port(id);
        ck_assert_int_ge(port, 1024);
        ck_assert_int_lt(port, 32768);
    }
}

DL_TEST(free_is_safe_twice_and_on_null)
{
    char *env[] = {"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-3]", "SLURM_SUBMIT_DIR=/x", NULL};
    dl_slurm_env_t e = parsed(env);

    dl_slurm_env_free(&e);
    ck_assert_ptr_null(e.hosts);
    ck_assert_ptr_null(e.submit_dir);
    dl_slurm_env_free(&e);
    dl_slurm_env_free(NULL);
}
