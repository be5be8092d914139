/* The orphan guard: a real guard process, and real process groups it kills (or leaves) once the
 * agent's end of its pipe closes; its list of groups, full and reused. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dl-test.h"
#include "spawn.h"

/* A child leading a process group of its own, asleep until killed. */
static pid_t sleeping_group(void)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        for (;;)
            pause();
    }
    setpgid(pid, pid); /* whichever of the two runs first, the group exists before we list it */
    return pid;
}

static int killed_by(pid_t pid)
{
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

/* As when the agent dies: the pipe closes, and every group still listed is killed. */
DL_TEST(listed_groups_are_killed_when_the_pipe_closes_and_others_are_left)
{
    dl_guard_t g = {0};
    pid_t listed = sleeping_group(), gone = sleeping_group();

    DL_CHECK_ERRNO(dl_guard_start(&g), 0);
    DL_CHECK_ERRNO(dl_guard_watch(&g, listed, 1), 0);
    DL_CHECK_ERRNO(dl_guard_watch(&g, gone, 1), 0);
    DL_CHECK_ERRNO(dl_guard_watch(&g, gone, 0), 0);
    ck_assert_int_eq(g.watching, 1);
    dl_guard_stop(&g); /* a group is listed: waits for the guard to have killed it */
    ck_assert_int_eq(killed_by(listed), SIGKILL);
    ck_assert_int_eq(kill(gone, 0), 0); /* taken off the list: alive */
    kill(gone, SIGKILL);
    ck_assert_int_eq(killed_by(gone), SIGKILL);
}

/* DL_GUARD_SLOTS groups fit; one more is refused; a slot given back is used again. The ids are
 * taken off again before the guard stops, so it kills none of them. */
DL_TEST(the_list_says_when_it_is_full_and_reuses_slots)
{
    dl_guard_t g = {0};
    const pid_t first = 4000000; /* never killed: all taken off before the guard stops */

    DL_CHECK_ERRNO(dl_guard_start(&g), 0);
    for (int i = 0; i < DL_GUARD_SLOTS; i++)
        DL_CHECK_ERRNO(dl_guard_watch(&g, first + i, 1), 0);
    DL_CHECK_ERRNO(dl_guard_watch(&g, first + DL_GUARD_SLOTS, 1), -ENOSPC);
    DL_CHECK_ERRNO(dl_guard_watch(&g, first + 17, 0), 0);
    DL_CHECK_ERRNO(dl_guard_watch(&g, first + DL_GUARD_SLOTS, 1), 0);
    ck_assert_int_eq(g.watching, DL_GUARD_SLOTS);
    DL_CHECK_ERRNO(dl_guard_watch(&g, first + 17, 0), 0); /* not listed now: nothing to do */
    ck_assert_int_eq(g.watching, DL_GUARD_SLOTS);
    for (int i = 0; i <= DL_GUARD_SLOTS; i++)
        if (i != 17)
            DL_CHECK_ERRNO(dl_guard_watch(&g, first + i, 0), 0);
    ck_assert_int_eq(g.watching, 0);
    dl_guard_stop(&g);
}

/* Without a guard (never started, or stopped) nothing is listed. */
DL_TEST(no_guard_lists_nothing)
{
    dl_guard_t g = {.fd = -1};
    DL_CHECK_ERRNO(dl_guard_watch(&g, getpid(), 1), -EBADF);
}
