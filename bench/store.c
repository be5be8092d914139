/* bench/store: N torch store clients, each a real TCP connection speaking PyTorch's TCPStore
 * protocol (torch 1.13's framing, which both servers speak), spread over several client
 * processes so that no process runs out of file descriptors. Each client does what a rank of
 * init_process_group does to the store: a SET of its own key, an ADD on a shared counter, and a
 * WAIT on a barrier key that the client whose ADD reached N sets. For each N it runs our store
 * (the rendezvous server's torch store, as the hosting agent serves it) and, side by side in the
 * same run, PyTorch's own TCPStore server (Debian's python3-torch, is_master=True in its own
 * process), and prints two times: connecting every client (the kernel's work and the server's
 * accepts), then from the moment every client is connected to the last one released (the
 * store's work: N sets, N adds, N waits, the barrier's set and N wake-ups); then the server's CPU
 * seconds over both, and its memory per client (RSS with every client connected and released,
 * less its RSS before the first connect, over N).
 *
 *   bench/store [--clients N[,N...]] [--torch-max N] [--python PATH] [--procs P]
 *       (default clients 1000,2000,10000,max; torch up to 2000; max: what the file limit
 *        leaves the server) */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <uv.h>

#include "rendezvous.h"

enum { Q_SET = 0, Q_ADD = 3, Q_WAIT = 5 }; /* torch <= 2.0's numbering */

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long v = -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = strtol(line + 7, NULL, 10);
    fclose(f);
    return v;
}

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

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ---- the servers ---- */

/* Our store in a child process: the rendezvous server with its torch store, as an agent
 * serves it. Writes its port to fd. */
static void serve_ours(int fd)
{
    uv_loop_t loop;
    dl_rdzv_server_opts_t so;
    dl_rdzv_server_t *s;
    char err[256];
    raise_fd_limit();
    uv_loop_init(&loop);
    dl_rdzv_server_opts_init(&so);
    so.only_run_id = "bench";
    so.store_only = true;
    so.torch_store = true;
    if (dl_rdzv_server_start(&loop, &so, &s, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench/store: %s\n", err);
        _exit(1);
    }
    dl_rdzv_job_opts_t jo;
    dl_rdzv_job_opts_init(&jo);
    if (dl_rdzv_server_add_job(s, "bench", &jo) < 0)
        _exit(1);
    int port = dl_rdzv_server_torch_port(s);
    if (write(fd, &port, sizeof(port)) != sizeof(port))
        _exit(1);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(0);
}

static const char *python = "/usr/bin/python3";

/* PyTorch's own server in a child: python3 -c "TCPStore(..., is_master=True)". */
static void serve_torch(int fd)
{
    raise_fd_limit();
    dup2(fd, 1);
    close(fd);
    execl(python, python, "-c",
          "import sys, time\n"
          "from datetime import timedelta\n"
          "import torch.distributed as d\n"
          "s = d.TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=600),"
          " wait_for_workers=False)\n"
          "sys.stdout.write('%d\\n' % s.port); sys.stdout.flush()\n"
          "time.sleep(3600)\n",
          (char *)NULL);
    _exit(127);
}

static pid_t start_server(bool torch, int *ret_port)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        if (torch)
            serve_torch(p[1]);
        serve_ours(p[1]);
    }
    close(p[1]);
    int port = -1;
    if (torch) {
        char line[32] = "";
        FILE *f = fdopen(p[0], "r");
        if (f != NULL && fgets(line, sizeof(line), f) != NULL)
            port = atoi(line);
        if (f != NULL)
            fclose(f);
    } else {
        if (read(p[0], &port, sizeof(port)) != sizeof(port))
            port = -1;
        close(p[0]);
    }
    if (port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    *ret_port = port;
    return pid;
}

/* ---- the clients ---- */

static size_t put_str(uint8_t *p, const char *s)
{
    uint64_t n = strlen(s);
    memcpy(p, &n, 8); /* little-endian: every machine torch runs on */
    memcpy(p + 8, s, n);
    return 8 + n;
}

typedef struct {
    int fd;
    int state; /* 0: ADD's answer due, 1: WAIT's, 2: released */
    uint8_t got[8];
    int have;
} client_t;

static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int connect_one(int port, int i)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    /* Several loopback source addresses: one has only ~28,000 ephemeral ports. */
    struct sockaddr_in src = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    src.sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)(i / 20000) * 256);
    for (int tries = 0; tries < 200; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* A source address chosen, its port left to connect: a bind to port 0 would search
         * the ports in use at every call, quadratic in the clients. Closed with a reset, so no
         * port stays in TIME_WAIT for the next run. */
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        if ((i < 20000 || bind(fd, (struct sockaddr *)&src, sizeof(src)) == 0) &&
            connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            return fd;
        close(fd);
        usleep(10000);
    }
    return -1;
}

/* One client process: clients first..first+k-1 of n. Writes 'c' to done once all are connected,
 * starts on a byte from start, writes 'd' once all are released, then holds them until go_away
 * says so. Exits 0 on success. */
static int run_clients(int port, int first, int k, int n, int done, int start, int go_away)
{
    client_t *c = calloc((size_t)k, sizeof(*c));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    uint8_t q[256];
    char b = 'c';
    if (c == NULL || ep < 0)
        return 1;
    for (int i = 0; i < k; i++) {
        c[i].fd = connect_one(port, first + i);
        if (c[i].fd < 0) {
            fprintf(stderr, "bench/store: client %d cannot connect: %s\n", first + i,
                    strerror(errno));
            return 1;
        }
    }
    if (write(done, &b, 1) != 1 || read(start, &b, 1) != 1)
        return 1;
    for (int i = 0; i < k; i++) {
        char key[32];
        size_t len = 0;
        snprintf(key, sizeof(key), "/c%d", first + i);
        q[len++] = Q_SET;
        len += put_str(q + len, key);
        len += put_str(q + len, "x");
        q[len++] = Q_ADD;
        len += put_str(q + len, "/counter");
        int64_t one = 1;
        memcpy(q + len, &one, 8);
        len += 8;
        if (send_all(c[i].fd, q, len) < 0)
            return 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &ev);
    }
    int released = 0;
    struct epoll_event evs[256];
    while (released < k) {
        int m = epoll_wait(ep, evs, 256, 120000);
        if (m <= 0) {
            fprintf(stderr, "bench/store: %d of %d clients still waiting\n", k - released, k);
            return 1;
        }
        for (int e = 0; e < m; e++) {
            client_t *cl = &c[evs[e].data.u32];
            int want = cl->state == 0 ? 8 : 1;
            ssize_t r = read(cl->fd, cl->got + cl->have, (size_t)(want - cl->have));
            if (r <= 0) {
                fprintf(stderr, "bench/store: the server closed a client\n");
                return 1;
            }
            cl->have += (int)r;
            if (cl->have < want)
                continue;
            cl->have = 0;
            if (cl->state == 1) {
                cl->state = 2;
                released++;
                continue;
            }
            int64_t count;
            memcpy(&count, cl->got, 8);
            size_t len = 0;
            if (count == n) {
                q[len++] = Q_SET;
                len += put_str(q + len, "/barrier");
                len += put_str(q + len, "1");
            }
            q[len++] = Q_WAIT;
            uint64_t one = 1;
            memcpy(q + len, &one, 8);
            len += 8;
            len += put_str(q + len, "/barrier");
            if (send_all(cl->fd, q, len) < 0)
                return 1;
            cl->state = 1;
        }
    }
    b = 'd';
    if (write(done, &b, 1) != 1 || read(go_away, &b, 1) < 0)
        return 1;
    return 0;
}

typedef struct {
    double connect;
    double seconds;
    double cpu;
    double kib_per_client;
    bool ok;
} result_t;

static result_t run(bool torch, int n, int nprocs)
{
    result_t res = {0};
    int port;
    pid_t server = start_server(torch, &port);
    if (server < 0) {
        fprintf(stderr, "bench/store: the %s server did not start\n", torch ? "torch" : "our");
        return res;
    }
    usleep(200000);
    long rss0 = rss_kib(server);
    double cpu0 = cpu_seconds(server);
    int done[2], go[2], start[2];
    if (pipe(done) < 0 || pipe(go) < 0 || pipe(start) < 0)
        return res;
    pid_t *kids = calloc((size_t)nprocs, sizeof(*kids));
    double t0 = mono();
    int per = (n + nprocs - 1) / nprocs, started = 0;
    for (int p = 0; p < nprocs && p * per < n; p++) {
        int k = n - p * per < per ? n - p * per : per;
        kids[p] = fork();
        if (kids[p] == 0) {
            raise_fd_limit();
            close(done[0]);
            close(go[1]);
            close(start[1]);
            _exit(run_clients(port, p * per, k, n, done[1], start[0], go[0]));
        }
        started++;
    }
    close(done[1]);
    close(go[0]);
    close(start[0]);
    int connected = 0, finished = 0;
    char b;
    while (connected < started && read(done[0], &b, 1) == 1)
        connected++;
    res.connect = mono() - t0;
    double t1 = mono();
    /* Every process starts at once: one byte each. */
    for (int p = 0; p < started; p++)
        if (write(start[1], "g", 1) != 1)
            break;
    close(start[1]);
    while (finished < started && read(done[0], &b, 1) == 1)
        finished++;
    res.seconds = mono() - t1;
    res.cpu = cpu_seconds(server) - cpu0;
    res.kib_per_client = (double)(rss_kib(server) - rss0) / n;
    res.ok = finished == started;
    close(go[1]);
    for (int p = 0; p < started; p++) {
        int st;
        waitpid(kids[p], &st, 0);
        res.ok = res.ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    close(done[0]);
    free(kids);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
    return res;
}

int main(int argc, char **argv)
{
    const char *list = "1000,2000,10000,max";
    int torch_max = 2000, nprocs_opt = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--clients") == 0 && i + 1 < argc)
            list = argv[++i];
        else if (strcmp(argv[i], "--torch-max") == 0 && i + 1 < argc)
            torch_max = atoi(argv[++i]);
        else if (strcmp(argv[i], "--python") == 0 && i + 1 < argc)
            python = argv[++i];
        else if (strcmp(argv[i], "--procs") == 0 && i + 1 < argc)
            nprocs_opt = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--clients N[,N...]] [--torch-max N] [--python PATH] "
                    "[--procs P]\n",
                    argv[0]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    /* The server needs one descriptor a client and a few of its own. */
    int max = (int)(rl.rlim_cur > 1100 ? rl.rlim_cur - 100 : 1000);
    printf("bench/store: set + add on a shared counter + wait on a barrier, one TCP connection "
           "a client, file limit %llu\n",
           (unsigned long long)rl.rlim_cur);
    printf("%8s  %-6s %10s %10s %12s %9s %11s %9s\n", "clients", "server", "connect s", "store s",
           "clients/s", "cpu s", "KiB/client", "torch/us");
    char *copy = strdup(list), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int n = strcmp(tok, "max") == 0 ? max : atoi(tok);
        if (n < 1 || n > max) {
            fprintf(stderr, "bench/store: %s clients is outside 1..%d\n", tok, max);
            return 2;
        }
        /* Each client process holds its clients' descriptors: stay well under the limit. */
        int nprocs = nprocs_opt > 0 ? nprocs_opt : (n + 4999) / 5000 + 1;
        result_t ours = run(false, n, nprocs);
        printf("%8d  %-6s %10.3f %10.3f %12.0f %9.2f %11.2f %9s%s\n", n, "ours", ours.connect,
               ours.seconds, n / ours.seconds, ours.cpu, ours.kib_per_client, "",
               ours.ok ? "" : "  FAILED");
        fflush(stdout);
        if (n <= torch_max) {
            result_t t = run(true, n, nprocs);
            char ratio[32];
            snprintf(ratio, sizeof(ratio), "%.1fx", t.seconds / ours.seconds);
            printf("%8d  %-6s %10.3f %10.3f %12.0f %9.2f %11.2f %9s%s\n", n, "torch", t.connect,
                   t.seconds, n / t.seconds, t.cpu, t.kib_per_client, ratio,
                   t.ok ? "" : "  FAILED");
            fflush(stdout);
        }
    }
    free(copy);
    return 0;
}
