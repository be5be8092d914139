/* See harness.h. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int harness_programs(int argc, char **argv, const char **ret_worker, const char **ret_dlaunch)
{
    const char *dlaunch = getenv("DLAUNCH");

    if (argc != 2 || dlaunch == NULL) {
        fprintf(stderr, "usage: DLAUNCH=path %s [-t TEST] COLL-WORKER\n", argv[0]);
        return 2;
    }
    *ret_worker = argv[1];
    *ret_dlaunch = dlaunch;
    return 0;
}

double harness_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

char *harness_tmpdir(void)
{
    char *d = strdup("/tmp/dl-coll-test-XXXXXX");
    if (d == NULL || mkdtemp(d) == NULL) {
        free(d);
        return NULL;
    }
    return d;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void harness_rmdir(const char *dir)
{
    if (dir != NULL)
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

pid_t harness_spawn(char *const argv[], char *const extra_env[], const char *log)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    setpgid(0, 0);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    for (int i = 0; extra_env != NULL && extra_env[i] != NULL; i++)
        putenv(extra_env[i]);
    execvp(argv[0], argv);
    _exit(127);
}

void harness_wait(proc_t *p, int n, double start_s, double limit_s)
{
    int left = 0;
    for (int i = 0; i < n; i++) {
        p[i].status = -1;
        left++;
    }
    while (left > 0) {
        int reaped = 0;
        for (int i = 0; i < n; i++) {
            int st = 0;
            if (p[i].status != -1 || waitpid(p[i].pid, &st, WNOHANG) != p[i].pid)
                continue;
            p[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            p[i].exited_s = harness_now() - start_s;
            left--;
            reaped = 1;
        }
        if (reaped)
            continue;
        if (harness_now() - start_s > limit_s) {
            for (int i = 0; i < n; i++)
                if (p[i].status == -1) {
                    kill(-p[i].pid, SIGKILL);
                    kill(p[i].pid, SIGKILL);
                    kill(p[i].pid, SIGCONT);
                }
            limit_s += 30; /* reap them */
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

/* A port below the kernel's ephemeral range (32768 and up by default), so no socket another
 * test binds to port 0, or connects from, takes it between this check and its use; among
 * themselves tests collide only by chance. */
int harness_free_port(void)
{
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 200; tries++) {
        int port = 20000 + (int)(rand_r(&seed) % 12000);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)port)};
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return -1;
        int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok)
            return port;
    }
    return -1;
}

char *harness_read(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf != NULL && (k = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf != NULL)
        buf[len] = '\0';
    return buf;
}

int harness_count_shm(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}
