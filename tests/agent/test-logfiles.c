/* An attempt's log files opened ahead of their workers (agent/logfiles.h): each is there, empty
 * and held, when its worker's turn comes; a link in a file's place is refused as when the agent
 * opened it itself, and what no worker took is closed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dl-test.h"
#include "logfiles.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/dl-test-logfiles-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static bool is_file(const char *name)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* What fd is: the file name in dir it is open on. */
static void assert_open_on(int fd, const char *name)
{
    char link[64], target[512], want[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    ck_assert_int_gt(n, 0);
    target[n] = '\0';
    snprintf(want, sizeof(want), "%s/%s", dir, name);
    ck_assert_str_eq(target, want);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & (O_APPEND | O_NONBLOCK), O_APPEND);
    ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
}

DL_TEST(every_rank_gets_its_two_files_in_order_spares_under_their_own_name)
{
    make_dir();
    int ranks[] = {0, 1, -1};
    dl_logfiles_t *lf = dl_logfiles_start(dir, ranks, 3);
    ck_assert_ptr_nonnull(lf);
    int fds[2];
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 0, fds), 0);
    assert_open_on(fds[0], "rank_0.out");
    assert_open_on(fds[1], "rank_0.err");
    close(fds[0]);
    close(fds[1]);
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 2, fds), 0);
    assert_open_on(fds[0], "spare_0.out");
    assert_open_on(fds[1], "spare_0.err");
    close(fds[0]);
    close(fds[1]);
    dl_logfiles_free(lf); /* rank 1's were not taken: closed here */
    ck_assert(is_file("rank_1.out") && is_file("rank_1.err"));
    lf = dl_logfiles_start(dir, ranks, 0);
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 0, fds), -EINVAL);
    dl_logfiles_free(lf);
    remove_dir();
}

DL_TEST(a_link_in_a_files_place_fails_that_rank_and_the_thread_opens_no_more)
{
    make_dir();
    char link[128];
    snprintf(link, sizeof(link), "%s/rank_1.err", dir);
    ck_assert_int_eq(symlink("/etc/passwd", link), 0);
    int ranks[] = {0, 1, 2};
    dl_logfiles_t *lf = dl_logfiles_start(dir, ranks, 3);
    int fds[2];
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 1, fds), -ELOOP);
    /* The thread stopped at rank 1: rank 2's are made only when asked for. */
    dl_logfiles_free(lf);
    ck_assert(!is_file("rank_2.out"));
    lf = dl_logfiles_start(dir, ranks, 3);
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 1, fds), -ELOOP);
    DL_CHECK_ERRNO(dl_logfiles_take(lf, 2, fds), 0);
    assert_open_on(fds[0], "rank_2.out");
    close(fds[0]);
    close(fds[1]);
    dl_logfiles_free(lf);
    remove_dir();
}
