/* bench/restart: how fast a failed job is running again. dlaunch runs 8 workers with
 * --max-restarts 3; one worker is killed with SIGKILL; the time from the kill to the start of
 * the last worker of the next attempt is read from the event stream. Repeated, median printed.
 *
 *   bench/restart [--runs N] [--workers N] [--json] */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int starts[2];        /* worker_start events per attempt */
    double last_start[2]; /* time of the last one */
    pid_t victim;
    double noticed; /* worker_exit of the victim */
    int ended;
} seen_t;

static void scan(const char *path, int victim_rank, seen_t *s)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    memset(s, 0, sizeof(*s));
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        json_t *o = json_loads(line, 0, NULL);
        if (o == NULL)
            continue;
        const char *ev = json_string_value(json_object_get(o, "event"));
        int attempt = (int)json_integer_value(json_object_get(o, "attempt"));
        int rank = (int)json_integer_value(json_object_get(o, "rank"));
        double t = json_real_value(json_object_get(o, "time"));
        if (ev != NULL && strcmp(ev, "worker_start") == 0 && attempt >= 0 && attempt < 2) {
            s->starts[attempt]++;
            if (t > s->last_start[attempt])
                s->last_start[attempt] = t;
            if (attempt == 0 && rank == victim_rank)
                s->victim = (pid_t)json_integer_value(json_object_get(o, "pid"));
        } else if (ev != NULL && strcmp(ev, "worker_exit") == 0 && attempt == 0 &&
                   rank == victim_rank) {
            s->noticed = t;
        } else if (ev != NULL && strcmp(ev, "job_end") == 0) {
            s->ended = 1;
        }
        json_decref(o);
    }
    fclose(f);
}

static void pause_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* One trial; returns 0 and the two delays, or -1. */
static int trial(const char *dlaunch, const char *dir, int workers, double *ret_restart,
                 double *ret_notice)
{
    char events[4200], nworkers[16];
    snprintf(events, sizeof(events), "%s/events.jsonl", dir);
    snprintf(nworkers, sizeof(nworkers), "%d", workers);
    unlink(events);
    char *argv[] = {(char *)dlaunch,
                    "-q",
                    "--gpus-per-node",
                    nworkers,
                    "--max-restarts",
                    "3",
                    "--log-dir",
                    (char *)dir,
                    "--events",
                    events,
                    "--",
                    "sh",
                    "-c",
                    "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exec sleep 60; exit 0",
                    NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int r = posix_spawn(&pid, dlaunch, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0) {
        fprintf(stderr, "restart: cannot run %s: %s\n", dlaunch, strerror(r));
        return -1;
    }
    int victim_rank = workers / 2;
    seen_t s;
    for (int waited = 0; waited < 10000; waited++) {
        scan(events, victim_rank, &s);
        if (s.starts[0] == workers)
            break;
        pause_ms(1);
    }
    pause_ms(100); /* let every worker reach its exec */
    double killed = now_unix();
    if (s.victim <= 0 || kill(s.victim, SIGKILL) < 0) {
        fprintf(stderr, "restart: no worker to kill\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    scan(events, victim_rank, &s);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || s.starts[1] != workers) {
        fprintf(stderr, "restart: the job did not restart cleanly (status %d, %d starts)\n", status,
                s.starts[1]);
        return -1;
    }
    *ret_restart = s.last_start[1] - killed;
    *ret_notice = s.noticed - killed;
    return 0;
}

int main(int argc, char **argv)
{
    int runs = 11, workers = 8, json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            workers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--runs N] [--workers N] [--json]\n", argv[0]);
            return 2;
        }
    }
    char dlaunch[4200], dir[] = "/tmp/dl-bench-restart-XXXXXX";
    snprintf(dlaunch, sizeof(dlaunch), "%s", argv[0]);
    char *slash = strrchr(dlaunch, '/');
    snprintf(slash != NULL ? slash : dlaunch, sizeof(dlaunch) - (size_t)(slash - dlaunch), "%s",
             slash != NULL ? "/../cmd/dlaunch" : "../cmd/dlaunch");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    double *restart = calloc((size_t)runs, sizeof(double));
    double *notice = calloc((size_t)runs, sizeof(double));
    int done = 0;
    for (int i = 0; i < runs; i++)
        if (trial(dlaunch, dir, workers, &restart[done], &notice[done]) == 0)
            done++;
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "restart: could not remove %s\n", dir);
    if (done == 0)
        return 1;
    qsort(restart, (size_t)done, sizeof(double), cmp_double);
    qsort(notice, (size_t)done, sizeof(double), cmp_double);
    double med = restart[done / 2], max = restart[done - 1], med_notice = notice[done / 2];
    if (json)
        printf("{\"bench\": \"restart\", \"workers\": %d, \"runs\": %d, \"median_ms\": %.2f, "
               "\"max_ms\": %.2f, \"notice_median_ms\": %.2f}\n",
               workers, done, med * 1e3, max * 1e3, med_notice * 1e3);
    else
        printf("kill -> all %d workers of the next attempt started: median %.2f ms, max %.2f ms "
               "over %d runs (kill -> agent noticed: median %.2f ms)\n",
               workers, med * 1e3, max * 1e3, done, med_notice * 1e3);
    free(restart);
    free(notice);
    return done == runs ? 0 : 1;
}
