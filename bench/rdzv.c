/* bench/rdzv: N simulated agents, each a real TCP connection from this one process, join one
 * job on a dlaunchd started for the run. Prints, for each N, the time from the first join sent
 * to the last assignment received, and the server's peak RSS; and before that, the handshakes
 * of all N (hello to auth_ok, with the token's challenge and both proofs under --token-file).
 * With --scrape-ms, dlaunchd also serves --http and a child process GETs /metrics that often for
 * the whole run, as Prometheus would, so that the figures show what watching the daemon costs.
 * --dlaunchd runs another build's daemon, for A/B runs side by side. --etcd adds, for each N,
 * the etcd row: N agents' real etcd backends through a 3-member etcd cluster started for the
 * run (rdzv-etcd.c), the same figure beside our own server's.
 *
 *   bench/rdzv [--agents N[,N...]] [--scrape-ms MS] [--token-file FILE] [--dlaunchd PATH]
 *              [--etcd] [--json]      (default 100,1000,10000; with --etcd 8,64,256) */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"
#include "rdzv-etcd-bench.h"

typedef struct {
    int fd;
    int state; /* 0 connecting, 1 hello sent, 2 ready, 3 join sent, 4 assigned */
    dl_proto_decoder_t dec;
} agent_t;

/* The token the agents prove under --token-file, and its path for dlaunchd; NULL: none. */
static dl_proto_token_t *bench_token;
static const char *bench_token_file;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long rss_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    long v = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, strlen(field)) == 0)
            v = strtol(line + strlen(field) + 1, NULL, 10);
    fclose(f);
    return v;
}

/* CPU seconds (user + system) the process has used: a figure the machine's load does not skew. */
static double cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int send_msg(int fd, json_t *m)
{
    char *frame;
    size_t len, off = 0;
    int r = dl_proto_encode(m, &frame, &len, NULL);
    json_decref(m);
    if (r < 0)
        return r;
    while (off < len) {
        ssize_t w = send(fd, frame + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR))
            continue; /* frames are small: the kernel takes them almost at once */
        if (w < 0) {
            free(frame);
            return -errno;
        }
        off += (size_t)w;
    }
    free(frame);
    return 0;
}

/* Starts dlaunchd on an ephemeral port and reads the port from its "serving HOST:PORT" line, so
 * that nothing else can take the port between picking and binding it. */
static pid_t start_dlaunchd(const char *dlaunchd, bool http, int *ret_port, int *ret_http)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        const char *av[8];
        int k = 0;
        av[k++] = dlaunchd;
        av[k++] = "--listen";
        av[k++] = "127.0.0.1:0";
        if (http) {
            av[k++] = "--http";
            av[k++] = "127.0.0.1:0";
        }
        if (bench_token_file != NULL) {
            av[k++] = "--token-file";
            av[k++] = bench_token_file;
        }
        av[k] = NULL;
        execv(dlaunchd, (char *const *)av);
        _exit(127);
    }
    close(p[1]);
    FILE *f = pid > 0 ? fdopen(p[0], "r") : NULL;
    char line[256];
    *ret_port = 0;
    while (f != NULL && *ret_port == 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *at = strstr(line, "serving 127.0.0.1:");
        /* " (job token required)" may follow the port. */
        const char *h = strstr(line, "http://127.0.0.1:");
        if (at != NULL)
            *ret_port = atoi(at + strlen("serving 127.0.0.1:"));
        if (h != NULL)
            *ret_http = atoi(h + strlen("http://127.0.0.1:"));
    }
    if (f != NULL)
        fclose(f); /* later lines go to a closed pipe: dlaunchd ignores SIGPIPE on stderr */
    else
        close(p[0]);
    if (*ret_port > 0)
        return pid;
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* The scraper: GET /metrics every ms milliseconds until killed, each on a new connection as
 * Prometheus' default does not keep one open between scrapes of a slow interval. */
static pid_t start_scraper(int http_port, int ms)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)http_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    char buf[65536];
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
            send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1)
            while (recv(fd, buf, sizeof(buf), 0) > 0)
                ;
        if (fd >= 0)
            close(fd);
        usleep((useconds_t)ms * 1000);
    }
}

/* Reads what is there; returns messages of the wanted type seen, or -1 on error. */
static int drain(agent_t *a, dl_proto_type_t want)
{
    char buf[16384];
    int seen = 0;
    for (;;) {
        ssize_t n = recv(a->fd, buf, sizeof(buf), 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return seen;
        if (n <= 0)
            return -1;
        size_t off = 0;
        while (off < (size_t)n) {
            json_t *msg = NULL;
            dl_proto_type_t type;
            dl_proto_error_t err;
            size_t used = 0;
            int r = dl_proto_decoder_feed(&a->dec, buf + off, (size_t)n - off, &used, &msg, &type,
                                          &err);
            off += used;
            if (r == DL_PROTO_MESSAGE) {
                if (type == DL_PROTO_CHALLENGE && bench_token != NULL) {
                    char proof[DL_PROTO_PROOF_HEX_LEN + 1];
                    json_t *auth = dl_proto_msg_new(DL_PROTO_AUTH, 1);
                    if (dl_proto_auth_proof(bench_token, dl_proto_get_str(msg, "nonce"), "bench",
                                            DL_PROTO_ROLE_AGENT, proof) < 0 ||
                        json_object_set_new(auth, "proof", json_string(proof)) < 0 ||
                        send_msg(a->fd, auth) < 0) {
                        json_decref(msg);
                        return -1;
                    }
                } else if (type == want)
                    seen++;
                else if (type == DL_PROTO_ERROR)
                    fprintf(stderr, "rdzv: error from the server: %s\n",
                            json_dumps(msg, JSON_COMPACT));
                json_decref(msg);
            } else if (r != DL_PROTO_NEED_MORE) {
                return -1;
            }
        }
    }
}

/* Waits until count agents reached state target (advancing via on_event). */
static int pump(int ep, agent_t *agents, int n, dl_proto_type_t want, int next_state, int *count,
                double deadline)
{
    struct epoll_event evs[1024];
    while (*count < n) {
        if (mono() > deadline)
            return -ETIMEDOUT;
        int k = epoll_wait(ep, evs, 1024, 100);
        for (int i = 0; i < k; i++) {
            agent_t *a = &agents[evs[i].data.u32];
            int got = drain(a, want);
            if (got < 0)
                return -EPIPE;
            if (got > 0 && a->state != next_state) {
                a->state = next_state;
                (*count)++;
            }
        }
    }
    return 0;
}

static int run(int n, const char *dlaunchd, int json, int scrape_ms)
{
    int port, http_port = 0;
    pid_t scraper = -1;
    pid_t pid = start_dlaunchd(dlaunchd, scrape_ms > 0, &port, &http_port);
    if (pid < 0 || (scrape_ms > 0 && http_port <= 0)) {
        fprintf(stderr, "rdzv: %s did not start serving\n", dlaunchd);
        return -1;
    }
    if (scrape_ms > 0)
        scraper = start_scraper(http_port, scrape_ms);
    agent_t *agents = calloc((size_t)n, sizeof(*agents));
    int ep = epoll_create1(0), ready = 0, r = -1;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    long base = -1;
    char **frames = NULL;
    size_t *lens = NULL;

    /* Wait for the daemon to listen, then note its resting size. */
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        close(fd);
        if (ok)
            break;
        usleep(10000);
    }
    base = rss_kib(pid, "VmRSS:");
    double deadline = mono() + 120;
    double hs_cpu0 = cpu_seconds(pid), hs_t0 = mono();
    for (int i = 0; i < n; i++) {
        agent_t *a = &agents[i];
        dl_proto_decoder_init(&a->dec, DL_PROTO_LIMIT);
        a->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (a->fd < 0 || connect(a->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
            fprintf(stderr, "rdzv: connection %d: %s\n", i, strerror(errno));
            goto out;
        }
        int one = 1;
        setsockopt(a->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fcntl(a->fd, F_SETFL, O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, a->fd, &ev);
        json_t *hello = dl_proto_msg_new(DL_PROTO_HELLO, 0);
        json_object_set_new(hello, "role", json_string("agent"));
        json_object_set_new(hello, "run_id", json_string("bench"));
        json_object_set_new(hello, "proto", json_integer(1));
        if (send_msg(a->fd, hello) < 0)
            goto out;
        a->state = 1;
        /* Keep the accept backlog from overflowing: let handshakes complete as we go. */
        if (i % 512 == 511 &&
            pump(ep, agents, i + 1 - 256, DL_PROTO_AUTH_OK, 2, &ready, deadline) < 0)
            goto out;
    }
    if (pump(ep, agents, n, DL_PROTO_AUTH_OK, 2, &ready, deadline) < 0) {
        fprintf(stderr, "rdzv: handshakes did not finish (%d of %d)\n", ready, n);
        goto out;
    }
    double hs_secs = mono() - hs_t0, hs_cpu = cpu_seconds(pid) - hs_cpu0;
    /* Frames are made before the clock starts: the figure is the server's, not our encoder's. */
    frames = calloc((size_t)n, sizeof(char *));
    lens = calloc((size_t)n, sizeof(size_t));
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "agent-%06d", i);
        json_t *m = dl_proto_msg_new(DL_PROTO_JOIN, 1);
        json_object_update_new(m, json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "node_id",
                                            id, "host", "bench-host", "slots", 1, "min_nodes", n,
                                            "max_nodes", n, "last_call_ms", (json_int_t)60000,
                                            "join_timeout_ms", (json_int_t)600000, "dead_after_ms",
                                            (json_int_t)600000));
        int e = dl_proto_encode(m, &frames[i], &lens[i], NULL);
        json_decref(m);
        if (e < 0)
            goto out;
    }
    double cpu0 = cpu_seconds(pid);
    double t0 = mono();
    for (int i = 0; i < n; i++) {
        if (send(agents[i].fd, frames[i], lens[i], MSG_NOSIGNAL) != (ssize_t)lens[i]) {
            fprintf(stderr, "rdzv: join %d: short send\n", i);
            goto out;
        }
        agents[i].state = 3;
    }
    double sent = mono() - t0;
    int assigned = 0;
    if (pump(ep, agents, n, DL_PROTO_ASSIGNMENT, 4, &assigned, deadline) < 0) {
        fprintf(stderr, "rdzv: only %d of %d agents assigned\n", assigned, n);
        goto out;
    }
    double secs = mono() - t0;
    double cpu = cpu_seconds(pid) - cpu0;
    long peak = rss_kib(pid, "VmHWM:");
    long per = n > 0 && peak > base ? (peak - base) * 1024 / n : 0;
    if (json)
        printf("{\"agents\": %d, \"seconds\": %.4f, \"server_cpu_seconds\": %.3f, "
               "\"handshake_seconds\": %.4f, \"handshake_cpu_seconds\": %.3f, "
               "\"rss_kib\": %ld, \"bytes_per_agent\": %ld, \"scrape_ms\": %d, "
               "\"token\": %s}\n",
               n, secs, cpu, hs_secs, hs_cpu, peak, per, scrape_ms,
               bench_token != NULL ? "true" : "false");
    else
        printf("%8d agents%s%s: first join -> last assignment %8.1f ms (server CPU %.0f ms; "
               "sending the joins took %.1f ms); handshakes %.1f ms (server CPU %.0f ms); server "
               "peak RSS %ld KiB (%ld bytes an agent over its %ld KiB at rest)\n",
               n, scrape_ms > 0 ? ", /metrics scraped" : "", bench_token != NULL ? ", token" : "",
               secs * 1e3, cpu * 1e3, sent * 1e3, hs_secs * 1e3, hs_cpu * 1e3, peak, per, base);
    fflush(stdout);
    r = 0;
out:
    for (int i = 0; i < n; i++) {
        if (agents[i].fd > 0)
            close(agents[i].fd);
        dl_proto_decoder_cleanup(&agents[i].dec);
    }
    free(agents);
    if (frames != NULL)
        for (int i = 0; i < n; i++)
            free(frames[i]);
    free(frames);
    free(lens);
    close(ep);
    if (scraper > 0) {
        kill(scraper, SIGKILL);
        waitpid(scraper, NULL, 0);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return r;
}

int main(int argc, char **argv)
{
    int json = 0, scrape_ms = 0, etcd = 0;
    const char *list = NULL, *other = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--agents") == 0 && i + 1 < argc)
            list = argv[++i];
        else if (strcmp(argv[i], "--scrape-ms") == 0 && i + 1 < argc &&
                 (scrape_ms = atoi(argv[i + 1])) > 0)
            i++;
        else if (strcmp(argv[i], "--token-file") == 0 && i + 1 < argc)
            bench_token_file = argv[++i];
        else if (strcmp(argv[i], "--dlaunchd") == 0 && i + 1 < argc)
            other = argv[++i];
        else if (strcmp(argv[i], "--etcd") == 0)
            etcd = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--agents N[,N...]] [--scrape-ms MS] [--token-file FILE] "
                    "[--dlaunchd PATH] [--etcd] [--json]\n",
                    argv[0]);
            return 2;
        }
    }
    if (list == NULL)
        list = etcd ? "8,64,256" : "100,1000,10000";
    if (bench_token_file != NULL) {
        char err[512];
        if (dl_proto_token_from_file(bench_token_file, &bench_token, err, sizeof(err)) < 0) {
            fprintf(stderr, "rdzv: %s\n", err);
            return 2;
        }
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);
    char dlaunchd[4200];
    snprintf(dlaunchd, sizeof(dlaunchd), "%s", argv[0]);
    char *slash = strrchr(dlaunchd, '/');
    snprintf(slash ? slash + 1 : dlaunchd, 64, "../daemon/dlaunchd");
    if (other != NULL)
        snprintf(dlaunchd, sizeof(dlaunchd), "%s", other);
    if (etcd && dl_bench_etcd_start() == NULL)
        return 1;
    char *copy = strdup(list), *save = NULL;
    int failed = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int n = atoi(tok);
        if (n < 1 || n > 100000) {
            fprintf(stderr, "rdzv: '%s' is not 1..100000 agents\n", tok);
            failed = 1;
            continue;
        }
        if (run(n, dlaunchd, json, scrape_ms) < 0)
            failed = 1;
        if (etcd && dl_bench_etcd_run(n, json) < 0)
            failed = 1;
    }
    free(copy);
    if (etcd)
        dl_bench_etcd_stop();
    dl_proto_token_free(bench_token);
    return failed;
}
