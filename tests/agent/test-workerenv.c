/* A worker's environment: torchrun's names, our values win, user variables kept. */
#include <errno.h>
#include <string.h>

#include "dl-test.h"
#include "workerenv.h"

static const char *get(char **env, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    int count = 0;
    for (; *env != NULL; env++) {
        if (strncmp(*env, name, n) == 0 && (*env)[n] == '=') {
            found = *env + n + 1;
            count++;
        }
    }
    ck_assert_int_le(count, 1); /* never two entries for one name */
    return found;
}

static dl_worker_env_t sample(void)
{
    return (dl_worker_env_t){
        .rank = 5,
        .local_rank = 1,
        .world_size = 8,
        .local_world_size = 4,
        .group_rank = 1,
        .group_world_size = 2,
        .restart_count = 2,
        .max_restarts = 3,
        .run_id = "job7",
        .master_addr = "10.0.0.1",
        .master_port = 29500,
        .attempt_dir = "/tmp/logs/job7/attempt_2",
        .health_fd = -1,
    };
}

DL_TEST(torchrun_names)
{
    char *base[] = {"PATH=/bin", "RANK=99", "HOME=/root", NULL};
    char **env;
    dl_worker_env_t w = sample();
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_str_eq(get(env, "RANK"), "5");
    ck_assert_str_eq(get(env, "LOCAL_RANK"), "1");
    ck_assert_str_eq(get(env, "WORLD_SIZE"), "8");
    ck_assert_str_eq(get(env, "LOCAL_WORLD_SIZE"), "4");
    ck_assert_str_eq(get(env, "GROUP_RANK"), "1");
    ck_assert_str_eq(get(env, "GROUP_WORLD_SIZE"), "2");
    ck_assert_str_eq(get(env, "ROLE_RANK"), "5");
    ck_assert_str_eq(get(env, "ROLE_NAME"), "default");
    ck_assert_str_eq(get(env, "ROLE_WORLD_SIZE"), "8");
    ck_assert_str_eq(get(env, "MASTER_ADDR"), "10.0.0.1");
    ck_assert_str_eq(get(env, "MASTER_PORT"), "29500");
    ck_assert_str_eq(get(env, "TORCHELASTIC_RESTART_COUNT"), "2");
    ck_assert_str_eq(get(env, "TORCHELASTIC_MAX_RESTARTS"), "3");
    ck_assert_str_eq(get(env, "TORCHELASTIC_RUN_ID"), "job7");
    ck_assert_str_eq(get(env, "DLAUNCH_ATTEMPT_DIR"), "/tmp/logs/job7/attempt_2");
    ck_assert_str_eq(get(env, "PATH"), "/bin");
    ck_assert_str_eq(get(env, "HOME"), "/root");
    ck_assert_str_eq(get(env, "OMP_NUM_THREADS"), "1");
    dl_worker_env_free(env);
}

/* torchrun's --virtual-local-rank: LOCAL_RANK 0, and only the worker's own device visible. */
DL_TEST(virtual_local_rank)
{
    char *base[] = {"CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c", NULL};
    char **env;
    dl_worker_env_t w = sample();
    w.virtual_local_rank = true;
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_str_eq(get(env, "LOCAL_RANK"), "0");
    ck_assert_str_eq(get(env, "CUDA_VISIBLE_DEVICES"), "GPU-b");
    ck_assert_str_eq(get(env, "RANK"), "5");
    dl_worker_env_free(env);
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_str_eq(get(env, "CUDA_VISIBLE_DEVICES"), "1");
    dl_worker_env_free(env);
    char *short_list[] = {"CUDA_VISIBLE_DEVICES=3", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, short_list, NULL, &env), -ERANGE);
    /* torchrun's agent passes its --signals-to-handle on; a stale value in base is replaced. */
    char *stale[] = {"TORCHELASTIC_SIGNALS_TO_HANDLE=SIGKILL", NULL};
    w = sample();
    w.signals_to_handle = "SIGTERM,SIGUSR1";
    DL_CHECK_ERRNO(dl_worker_env_build(&w, stale, NULL, &env), 0);
    ck_assert_str_eq(get(env, "TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGUSR1");
    dl_worker_env_free(env);
}

DL_TEST(spec_env_overrides_base_but_not_ours)
{
    char *base[] = {"FOO=base", "OMP_NUM_THREADS=8", NULL};
    char *extra[] = {"FOO=spec", "BAR=x=y", "WORLD_SIZE=1", NULL};
    char **env;
    dl_worker_env_t w = sample();
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, extra, &env), 0);
    ck_assert_str_eq(get(env, "FOO"), "spec");
    ck_assert_str_eq(get(env, "BAR"), "x=y");
    ck_assert_str_eq(get(env, "WORLD_SIZE"), "8");
    ck_assert_str_eq(get(env, "OMP_NUM_THREADS"), "8"); /* the user's choice is kept */
    dl_worker_env_free(env);
}

DL_TEST(single_worker_keeps_threads_free)
{
    char **env;
    dl_worker_env_t w = sample();
    w.local_world_size = 1;
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_ptr_null(get(env, "OMP_NUM_THREADS"));
    dl_worker_env_free(env);
}

DL_TEST(interface_for_frameworks)
{
    char **env;
    dl_worker_env_t w = sample();
    w.ifname = "eth1";
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_str_eq(get(env, "GLOO_SOCKET_IFNAME"), "eth1");
    ck_assert_str_eq(get(env, "NCCL_SOCKET_IFNAME"), "=eth1"); /* exact, not a prefix */
    ck_assert_str_eq(get(env, "TP_SOCKET_IFNAME"), "eth1");
    ck_assert_str_eq(get(env, "DLAUNCH_SOCKET_IFNAME"), "eth1");
    dl_worker_env_free(env);

    /* The user's own choice, from the agent's environment or the spec, stays; an empty one
     * counts as unset. */
    char *base[] = {"GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME=", NULL};
    char *extra[] = {"DLAUNCH_SOCKET_IFNAME=bond0", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, extra, &env), 0);
    ck_assert_str_eq(get(env, "GLOO_SOCKET_IFNAME"), "ib0");
    ck_assert_str_eq(get(env, "NCCL_SOCKET_IFNAME"), "=eth1");
    ck_assert_str_eq(get(env, "DLAUNCH_SOCKET_IFNAME"), "bond0");
    dl_worker_env_free(env);

    /* Unknown: nothing is set, the frameworks choose as they would. */
    w.ifname = NULL;
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_ptr_null(get(env, "GLOO_SOCKET_IFNAME"));
    ck_assert_ptr_null(get(env, "NCCL_SOCKET_IFNAME"));
    ck_assert_ptr_null(get(env, "DLAUNCH_SOCKET_IFNAME"));
    dl_worker_env_free(env);
}

DL_TEST(a_spare_is_marked_and_an_outer_mark_never_passes)
{
    char **env;
    dl_worker_env_t w = sample();
    w.recovery = "in-job";
    w.control_fd = 4;
    /* An outer dlaunch's spare running this one: its mark is not this job's. */
    char *base[] = {"DLAUNCH_SPARE=1", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_ptr_null(get(env, "DLAUNCH_SPARE"));
    dl_worker_env_free(env);
    w.spare = true;
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_str_eq(get(env, "DLAUNCH_SPARE"), "1");
    ck_assert_str_eq(get(env, "DLAUNCH_CONTROL_FD"), "4");
    dl_worker_env_free(env);
    w.control_fd = -1; /* no channel, no spare: nothing could give it a rank */
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_ptr_null(get(env, "DLAUNCH_SPARE"));
    dl_worker_env_free(env);
}

DL_TEST(the_python_package_goes_first_on_pythonpath)
{
    char **env;
    dl_worker_env_t w = sample();
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_ptr_null(get(env, "PYTHONPATH")); /* no package: left alone */
    dl_worker_env_free(env);
    w.python_path = "/usr/share/dlaunch/python";
    DL_CHECK_ERRNO(dl_worker_env_build(&w, NULL, NULL, &env), 0);
    ck_assert_str_eq(get(env, "PYTHONPATH"), "/usr/share/dlaunch/python");
    dl_worker_env_free(env);
    /* The user's path stays, after ours; the spec's env: is the user's too; empty is unset. */
    char *base[] = {"PYTHONPATH=/home/u/lib", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_str_eq(get(env, "PYTHONPATH"), "/usr/share/dlaunch/python:/home/u/lib");
    dl_worker_env_free(env);
    char *extra[] = {"PYTHONPATH=/job/src", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, extra, &env), 0);
    ck_assert_str_eq(get(env, "PYTHONPATH"), "/usr/share/dlaunch/python:/job/src");
    dl_worker_env_free(env);
    char *empty[] = {"PYTHONPATH=", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, empty, NULL, &env), 0);
    ck_assert_str_eq(get(env, "PYTHONPATH"), "/usr/share/dlaunch/python");
    dl_worker_env_free(env);
}

/* Numbers in decimal, as printf writes them, at both ends of an int; an outer launcher's
 * DLAUNCH_ control variables are dropped, its other DLAUNCH_ settings kept. */
DL_TEST(numbers_at_the_ends_of_an_int_and_outer_dlaunch_variables)
{
    char *base[] = {"DLAUNCH_TOKEN=t",
                    "DLAUNCH_SPARE=1",
                    "DLAUNCH_GROUP_GEN=4",
                    "DLAUNCH_QUIET=1",
                    "DLAUNCH_",
                    "DLAUNCHX=2",
                    NULL};
    char **env;
    dl_worker_env_t w = sample();
    w.rank = 0;
    w.world_size = 2147483647;
    w.max_restarts = -2147483647 - 1;
    w.control_fd = -1; /* no channel: DLAUNCH_GROUP_GEN is not ours to set */
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, NULL, &env), 0);
    ck_assert_str_eq(get(env, "RANK"), "0");
    ck_assert_str_eq(get(env, "WORLD_SIZE"), "2147483647");
    ck_assert_str_eq(get(env, "TORCHELASTIC_MAX_RESTARTS"), "-2147483648");
    ck_assert_ptr_null(get(env, "DLAUNCH_TOKEN"));
    ck_assert_ptr_null(get(env, "DLAUNCH_SPARE"));
    ck_assert_ptr_null(get(env, "DLAUNCH_GROUP_GEN"));
    ck_assert_str_eq(get(env, "DLAUNCH_QUIET"), "1");
    ck_assert_str_eq(get(env, "DLAUNCHX"), "2");
    dl_worker_env_free(env);
}

/* torchrun's defaults (OMP_NUM_THREADS=1 beside other workers, TORCH_NCCL_ASYNC_ERROR_HANDLING=1)
 * yield to the user's from either the agent's environment or the spec's, even an empty one;
 * an entry without '=' sets nothing, but does not hide an earlier one that does. */
DL_TEST(torchrun_defaults_yield_to_the_user_from_either_side)
{
    char *base[] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING=", NULL};
    char *extra[] = {"OMP_NUM_THREADS=4", NULL};
    char **env;
    dl_worker_env_t w = sample();
    DL_CHECK_ERRNO(dl_worker_env_build(&w, base, extra, &env), 0);
    ck_assert_str_eq(get(env, "OMP_NUM_THREADS"), "4");
    ck_assert_str_eq(get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "");
    dl_worker_env_free(env);

    char *bare[] = {"OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, bare, NULL, &env), 0);
    ck_assert_str_eq(get(env, "OMP_NUM_THREADS"), "1");
    ck_assert_str_eq(get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    dl_worker_env_free(env);

    char *set_then_bare[] = {"OMP_NUM_THREADS=2", NULL};
    char *bare_extra[] = {"OMP_NUM_THREADS", NULL};
    DL_CHECK_ERRNO(dl_worker_env_build(&w, set_then_bare, bare_extra, &env), 0);
    /* The bare entry replaced the value, and the user's setting still keeps ours out. */
    ck_assert_ptr_null(get(env, "OMP_NUM_THREADS"));
    for (char **e = env; *e != NULL; e++)
        ck_assert_str_ne(*e, "OMP_NUM_THREADS=1");
    dl_worker_env_free(env);
}
