/* Helpers for the collective integration tests: run processes with a deadline, read what the
 * workers left in their output folder. */
#ifndef DL_TEST_COLL_HARNESS_H
#define DL_TEST_COLL_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int status;      /* exit code, or 128 + signal; -1 while running */
    double exited_s; /* seconds from start to exit */
} proc_t;

/* The programs the tests start, as meson passes them: the worker as the one argument, the
 * launcher in DLAUNCH. Returns 0, or 2 after a usage line naming prog. */
int harness_programs(int argc, char **argv, const char **ret_worker, const char **ret_dlaunch);

/* A fresh folder under /tmp; the caller removes it with harness_rmdir. */
char *harness_tmpdir(void);
void harness_rmdir(const char *dir);

/* Starts argv with these extra NAME=value strings (NULL-terminated, may be NULL) in its own
 * process group, stdout and stderr appended to log. */
pid_t harness_spawn(char *const argv[], char *const extra_env[], const char *log);

/* Waits for all n processes or until limit_s from start_s (monotonic seconds); whatever is still
 * running then is killed (its whole process group) and gets status 137. */
void harness_wait(proc_t *p, int n, double start_s, double limit_s);

double harness_now(void);

/* A TCP port nobody listens on right now. */
int harness_free_port(void);

/* The whole file, NUL-terminated, or NULL. Caller frees. */
char *harness_read(const char *path);

/* How many /dev/shm entries start with prefix. */
int harness_count_shm(const char *prefix);

#endif
