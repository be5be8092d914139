/* Process creation. libuv's uv_spawn cannot run code between fork and exec, and the
 * parent-death signal has to be set there, so workers are started here and reaped by the
 * agent's SIGCHLD handler. The statics below are the child's stack, which is only ever in use
 * while the agent's single thread waits in clone(), and /dev/null, open for the process's life. */
#include <errno.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spawn.h"

typedef struct {
    pid_t parent;
    const char *path;
    char *const *argv;
    char *const *envp;
    int stdout_fd;
    int stderr_fd;
    int health_fd;
    int control_fd;
    int null_fd;
    const sigset_t *ignored; /* the agent's ignored signals, which exec would pass on */
    const dl_cpus_t *cpus;   /* NULL: keep the agent's affinity */
    int mem_node;            /* -1: keep the agent's memory policy */
    uint64_t node_mask[4];   /* mem_node as the kernel's node mask */
} child_args_t;

/* Nodes the mask above can name; set_mempolicy counts one bit more than it reads. */
#define NODE_MASK_BITS 256

/* Writes "dlaunch: WHAT PATH': REASON" on the child's stderr, with system calls only. */
static void child_say(const char *what, const char *path, int err)
{
    static const char head[] = "dlaunch: ";
    const char *msg = strerror(err);
    if (write(STDERR_FILENO, head, sizeof(head) - 1) < 0 ||
        write(STDERR_FILENO, what, strlen(what)) < 0 ||
        write(STDERR_FILENO, path, strlen(path)) < 0 || write(STDERR_FILENO, "': ", 3) < 0 ||
        write(STDERR_FILENO, msg, strlen(msg)) < 0 || write(STDERR_FILENO, "\n", 1) < 0)
        return;
}

/* Says why the child cannot run, and ends it as a failed exec would. */
static void child_fail(const char *what, const char *path, int err)
{
    child_say(what, path, err);
    _exit(127);
}

/* Runs in the child, on its own stack, sharing the parent's memory until exec (CLONE_VM): only
 * system calls, no libc state. Every signal is blocked on entry, so no handler of the agent's
 * can run here. */
static int child_exec(void *arg)
{
    const child_args_t *c = arg;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigset_t none;

    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != c->parent)
        _exit(127); /* the agent is already gone */
    setpgid(0, 0);
    /* exec resets handled signals by itself; ignored ones (SIGPIPE here) it keeps. */
    for (int s = 1; s < NSIG; s++)
        if (sigismember(c->ignored, s) == 1)
            sigaction(s, &dfl, NULL);
    if (dup2(c->null_fd, STDIN_FILENO) < 0 || dup2(c->stdout_fd, STDOUT_FILENO) < 0 ||
        dup2(c->stderr_fd, STDERR_FILENO) < 0 ||
        (c->health_fd >= 0 && dup2(c->health_fd, DL_SPAWN_HEALTH_FD) < 0) ||
        (c->control_fd >= 0 && dup2(c->control_fd, DL_SPAWN_CONTROL_FD) < 0))
        _exit(127);
    /* Bound here, not by the worker, so that every thread it ever starts inherits the mask
     * and no allocation of its startup lands on a far node. libc's wrappers are left alone:
     * the raw calls touch no state the agent shares with us. */
    if (c->cpus != NULL &&
        syscall(SYS_sched_setaffinity, 0, sizeof(c->cpus->bits), c->cpus->bits) < 0)
        child_fail("cannot bind to its CPUs to run '", c->path, errno);
    /* A preference only: the worker runs without it (and says so) rather than not at all. */
    if (c->mem_node >= 0 &&
        syscall(SYS_set_mempolicy, MPOL_PREFERRED, c->node_mask, NODE_MASK_BITS + 1) < 0)
        child_say("warning: memory is not preferred on the worker's NUMA node, for '", c->path,
                  errno);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(c->path, c->argv, c->envp);
    child_fail("cannot execute '", c->path, errno);
    return 127;
}

/* The signals the agent ignores: SIGPIPE, and any it was started with ignored (nohup's SIGHUP).
 * Asked once, at the first spawn, rather than by every child (64 sigaction calls each while the
 * agent waits in clone()): the agent ignores no signal after it starts its first worker. */
static const sigset_t *ignored_signals(void)
{
    static sigset_t set;
    static bool known;
    if (!known) {
        sigemptyset(&set);
        for (int s = 1; s < NSIG; s++) {
            struct sigaction cur;
            if (sigaction(s, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
                sigaddset(&set, s);
        }
        known = true;
    }
    return &set;
}

/* The child needs a stack of its own while it shares our memory; exec is all it runs. */
#define CHILD_STACK_SIZE (64 * 1024)

int dl_spawn(const char *path, char *const argv[], char *const envp[], int stdout_fd, int stderr_fd,
             int health_fd, int control_fd, const dl_cpus_t *cpus, int mem_node, pid_t *ret_pid)
{
    static _Alignas(16) char stack[CHILD_STACK_SIZE];
    child_args_t c = {getpid(),   path, argv, envp, stdout_fd, stderr_fd, health_fd,
                      control_fd, -1,   NULL, cpus, -1,        {0}};
    sigset_t all, old;
    pid_t pid;
    int e = 0;

    if (mem_node >= NODE_MASK_BITS)
        return -EINVAL;
    if (mem_node >= 0) {
        c.mem_node = mem_node;
        c.node_mask[mem_node / 64] = UINT64_C(1) << (mem_node % 64);
    }

    /* A descriptor already sitting where the other must go would be overwritten by the first
     * dup2: move it out of the way (the copy closes itself at exec). */
    int moved = -1;
    if (control_fd == DL_SPAWN_HEALTH_FD && health_fd >= 0) {
        moved = fcntl(control_fd, F_DUPFD_CLOEXEC, 10);
        if (moved < 0)
            return -errno;
        c.control_fd = moved;
    } else if (health_fd == DL_SPAWN_CONTROL_FD && control_fd >= 0) {
        moved = fcntl(health_fd, F_DUPFD_CLOEXEC, 10);
        if (moved < 0)
            return -errno;
        c.health_fd = moved;
    }
    /* Every worker's stdin, opened once: it is the same file for all. */
    static int null_fd = -1;
    if (null_fd < 0 && (null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        e = errno;
        if (moved >= 0)
            close(moved);
        return -e;
    }
    c.null_fd = null_fd;
    c.ignored = ignored_signals();
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* Like posix_spawn: CLONE_VFORK suspends us until the child has exec'd, so there is no
     * page-table copy, which is most of fork's cost in a big agent. */
    pid = clone(child_exec, stack + sizeof(stack), CLONE_VM | CLONE_VFORK | SIGCHLD, &c);
    if (pid < 0)
        e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (moved >= 0)
        close(moved);
    if (pid < 0)
        return -e;
    /* No setpgid(pid, pid) here: clone returns once the child has exec'd, so its own
     * setpgid(0, 0) came first (ours would fail with EACCES). */
    *ret_pid = pid;
    return 0;
}

static int check_exec(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    if (S_ISDIR(st.st_mode))
        return -EISDIR;
    if (access(path, X_OK) < 0)
        return -errno;
    return 0;
}

int dl_resolve_command(const char *name, const char *path_env, char **ret_path)
{
    int r, best = -ENOENT;

    if (*name == '\0')
        return -ENOENT;
    if (strchr(name, '/') != NULL) {
        r = check_exec(name);
        if (r < 0)
            return r;
        *ret_path = strdup(name);
        return *ret_path != NULL ? 0 : -ENOMEM;
    }
    if (path_env == NULL || *path_env == '\0')
        path_env = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path_env;
    for (;;) {
        const char *end = strchr(p, ':');
        size_t dlen = end != NULL ? (size_t)(end - p) : strlen(p);
        char *full;
        if (asprintf(&full, "%.*s/%s", (int)dlen, dlen == 0 ? "." : p, name) < 0)
            return -ENOMEM;
        if (dlen == 0)
            full[1] = '/';
        r = check_exec(full);
        if (r == 0) {
            *ret_path = full;
            return 0;
        }
        free(full);
        if (r == -EACCES)
            best = r;
        if (end == NULL)
            break;
        p = end + 1;
    }
    return best;
}

/* The guard's whole life: wait for the pipe to close, then kill every group still listed. */
static void guard_main(int fd, const int32_t *groups)
{
    sigset_t all;

    /* Ctrl-C reaches the whole foreground group, and a Slurm step's signals (scancel, a time
     * limit's --signal=USR1@N) every process of the step: the guard must outlive the agent.
     * Blocked, they stay pending until the guard exits. */
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    /* Holding the caller's stdout open would make `out=$(dlaunch ...)` wait for us. */
    close(STDIN_FILENO);
    close(STDOUT_FILENO);
    close(STDERR_FILENO);
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r == 0 || (r < 0 && errno != EINTR))
            break;
    }
    for (unsigned i = 0; i < DL_GUARD_SLOTS; i++) {
        int32_t pgid = __atomic_load_n(&groups[i], __ATOMIC_ACQUIRE);
        if (pgid > 0)
            kill(-pgid, SIGKILL);
    }
    _exit(0);
}

int dl_guard_start(dl_guard_t *g)
{
    int fds[2];
    pid_t pid;

    g->fd = -1;
    g->pid = 0;
    g->watching = 0;
    g->next_free_hint = 0;
    g->used_end = 0;
    /* Untouched pages of a shared mapping cost nothing: a job of 8 workers touches one. */
    g->groups = mmap(NULL, DL_GUARD_SLOTS * sizeof(int32_t), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g->groups == MAP_FAILED) {
        g->groups = NULL;
        return -errno;
    }
    if (pipe2(fds, O_CLOEXEC) < 0) {
        int e = errno;
        munmap(g->groups, DL_GUARD_SLOTS * sizeof(int32_t));
        g->groups = NULL;
        return -e;
    }
    pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        munmap(g->groups, DL_GUARD_SLOTS * sizeof(int32_t));
        g->groups = NULL;
        return -e;
    }
    if (pid == 0) {
        close(fds[1]);
        guard_main(fds[0], g->groups);
    }
    close(fds[0]);
    g->fd = fds[1];
    g->pid = pid;
    return 0;
}

int dl_guard_watch(dl_guard_t *g, pid_t pgid, int add)
{
    if (g->fd < 0 || g->groups == NULL)
        return -EBADF;
    if (!add) {
        for (unsigned i = 0; i < g->used_end; i++) {
            if (g->groups[i] == (int32_t)pgid) {
                __atomic_store_n(&g->groups[i], 0, __ATOMIC_RELEASE);
                g->watching--;
                return 0;
            }
        }
        return 0;
    }
    for (unsigned k = 0; k < DL_GUARD_SLOTS; k++) {
        unsigned i = (g->next_free_hint + k) % DL_GUARD_SLOTS;
        if (g->groups[i] != 0)
            continue;
        __atomic_store_n(&g->groups[i], (int32_t)pgid, __ATOMIC_RELEASE);
        g->watching++;
        g->next_free_hint = (i + 1) % DL_GUARD_SLOTS;
        if (i >= g->used_end)
            g->used_end = i + 1;
        return 0;
    }
    return -ENOSPC;
}

void dl_guard_stop(dl_guard_t *g)
{
    if (g->fd >= 0) {
        close(g->fd);
        g->fd = -1;
    }
    if (g->pid > 0 && g->watching > 0) {
        while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    g->pid = 0;
    if (g->groups != NULL) {
        munmap(g->groups, DL_GUARD_SLOTS * sizeof(int32_t));
        g->groups = NULL;
    }
}
