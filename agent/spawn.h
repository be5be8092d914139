/* Starting worker processes so that none can outlive the agent, and finding their command. */
#ifndef DL_SPAWN_H
#define DL_SPAWN_H

#include <sys/types.h>

#include "cpulist.h"

/* The descriptor a worker writes its health beats to, when it has one. */
#define DL_SPAWN_HEALTH_FD 3
/* The control channel of in-job recovery (docs/recovery.md), when the job has one. */
#define DL_SPAWN_CONTROL_FD 4

/* Starts path with argv and envp in a new process group of its own (pgid == pid), stdin on
 * /dev/null, stdout and stderr on the given fds, health_fd (or -1) on DL_SPAWN_HEALTH_FD,
 * control_fd (or -1) on DL_SPAWN_CONTROL_FD,
 * default signal dispositions, and a parent-death signal of SIGKILL. With cpus (may be NULL) the
 * process is bound to those CPUs, and with mem_node >= 0 its memory is preferred on that NUMA
 * node, both before exec. Returns 0 with *ret_pid set, or -errno when the process could not be
 * made. An exec or CPU binding failure shows up as exit status 127 with the reason on the
 * worker's stderr; a memory policy the kernel refuses is a warning there, and it runs. */
int dl_spawn(const char *path, char *const argv[], char *const envp[], int stdout_fd, int stderr_fd,
             int health_fd, int control_fd, const dl_cpus_t *cpus, int mem_node, pid_t *ret_pid);

/* Resolves name like execvp would: names with a '/' are taken as they are, others are looked
 * up in path_env (PATH; NULL means the default). Returns 0 with a malloc'd path in *ret_path,
 * -ENOENT when nothing is found, -EACCES when found but not executable. */
int dl_resolve_command(const char *name, const char *path_env, char **ret_path);

/* The orphan guard: a small helper process that holds the read end of a pipe from the agent.
 * When the agent dies by any means, even SIGKILL, the pipe closes and the guard SIGKILLs every
 * process group listed then in a page the two share. The agent writes that list without a system
 * call: a pipe message per group woke the guard twice per worker, on the cores the workers were
 * starting on. */
#define DL_GUARD_SLOTS 4096

typedef struct {
    int fd; /* write end, -1 when no guard */
    pid_t pid;
    int watching;            /* groups listed */
    int32_t *groups;         /* DL_GUARD_SLOTS shared slots, 0 when free */
    unsigned next_free_hint; /* where the last group went: the next free slot is usually after */
    unsigned used_end;       /* slots from here on were never used */
} dl_guard_t;

int dl_guard_start(dl_guard_t *g);
/* Lists a new group (add) or takes one that is gone off the list. Returns 0, -EBADF without a
 * guard, or -ENOSPC when DL_GUARD_SLOTS groups are listed. */
int dl_guard_watch(dl_guard_t *g, pid_t pgid, int add);
/* Closes the pipe. While groups are left for the guard to kill, waits for it, so that they are
 * gone when this returns; with none it exits by itself and is left to whoever adopts it, since
 * waiting for its exit would add a process's teardown to every launch. */
void dl_guard_stop(dl_guard_t *g);

#endif
