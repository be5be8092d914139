/* Why a worker died, or why it cannot die: the kernel's OOM killer, as the memory cgroup's
 * counters (or the kernel log) tell, and a process stuck in uninterruptible sleep. Every
 * reader takes the root of the file system it reads ("" for the real one), so that tests can
 * hand it a made-up tree. */
#ifndef DL_DEATH_H
#define DL_DEATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DL_MEMCG_LEVELS 16

/* The memory cgroups a process is charged to, its own first, then each parent up to the
 * hierarchy's root, with their OOM-kill counts when last looked at. */
typedef struct {
    int version; /* 1 or 2; 0 when no memory controller was found */
    int n;
    char dir[DL_MEMCG_LEVELS][512]; /* the cgroup's folder, under root */
    long long oom_kills[DL_MEMCG_LEVELS];
} dl_memcg_t;

/* What the OOM killer did, when it did. */
typedef struct {
    bool killed;
    long long peak;   /* bytes: the worker's own peak resident set (from wait4), 0 unknown */
    long long limit;  /* bytes: the limit of the cgroup that ran out, 0 unknown */
    char cgroup[512]; /* that cgroup's folder, or the memcg the kernel log names, or "" */
} dl_oom_t;

/* Pure parsers, over a file's text. */
/* "oom_kill N" in v1's memory.oom_control or v2's memory.events: N, or -ENOENT. */
long long dl_memcg_parse_oom_kills(const char *text);
/* A limit file (v1 memory.limit_in_bytes, v2 memory.max): bytes, 0 for none ("max", or v1's
 * page-rounded 2^63). */
long long dl_memcg_parse_limit(const char *text);

/* Finds pid's memory cgroups (0: the caller) under root (cgroup.h's places) and reads their
 * counts now.
 * Returns 0, or -errno (no memory controller: -ENOENT; w->version is then 0). */
int dl_memcg_open(dl_memcg_t *w, const char *root, pid_t pid);
/* Whether any of the cgroups counted an OOM kill since the last look (open or this call);
 * the counts are brought up to date. On true, fills what (the cgroup and its limit). */
bool dl_memcg_oom_since(dl_memcg_t *w, const char *root, dl_oom_t *what);

/* Whether the kernel log (root/dev/kmsg) says the OOM killer killed pid: 1 yes, 0 no, -errno
 * when it cannot be read. On yes, what->cgroup is the memcg the log names, if it does. */
int dl_kmsg_oom_killed(const char *root, pid_t pid, dl_oom_t *what);

/* A process the agent waits for in vain: its state letter from /proc/PID/stat ('D': in
 * uninterruptible sleep) and its kernel wait channel (/proc/PID/wchan), "" when unknown.
 * Returns 0, or -errno (-ESRCH: gone). */
int dl_proc_wait_state(const char *root, pid_t pid, char *state, char *wchan, size_t len);

/* "uninterruptible sleep" for 'D' and the like: the name ps(1) gives a state letter. */
const char *dl_proc_state_name(char state);

#endif
