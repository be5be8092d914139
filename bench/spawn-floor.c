/* The floor for launching N processes: posix_spawn N copies of a command, then reap them all.
 * bench/launch times this program the same way it times the launchers. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s N COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    char *end;
    long n = strtol(argv[1], &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) {
        fprintf(stderr, "spawn-floor: N must be 1..4096, got '%s'\n", argv[1]);
        return 2;
    }
    for (long i = 0; i < n; i++) {
        pid_t pid;
        int r = posix_spawn(&pid, argv[2], NULL, NULL, argv + 2, environ);
        if (r != 0) {
            fprintf(stderr, "spawn-floor: %s: %s\n", argv[2], strerror(r));
            return 1;
        }
    }
    int status, failed = 0;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed = 1;
    return failed;
}
