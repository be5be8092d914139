/* bench/rdzv --etcd: the etcd row. A 3-member etcd cluster on loopback, started for the run
 * (etcd on PATH, data in a temporary folder), and for each N, N agents' real etcd backends
 * (agent/rdzv-etcd.c, each with its own client, lease, watch and store) on one libuv loop in this
 * process: the time from the first join to the last assignment, as for our own server. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "etcd.h"
#include "rdzv-backend.h"
#include "rdzv-etcd-bench.h"

#define MEMBERS 3

static pid_t members[MEMBERS];
static char folder[256];
static char endpoints[256];

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

void dl_bench_etcd_stop(void)
{
    for (int i = 0; i < MEMBERS; i++) {
        if (members[i] > 0) {
            kill(members[i], SIGKILL);
            waitpid(members[i], NULL, 0);
            members[i] = 0;
        }
    }
    if (folder[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", folder);
        if (system(cmd) != 0)
            fprintf(stderr, "rdzv: could not remove %s\n", folder);
        folder[0] = '\0';
    }
}

const char *dl_bench_etcd_start(void)
{
    int client[MEMBERS], peer[MEMBERS];
    char cluster[512] = "";
    snprintf(folder, sizeof(folder), "/tmp/dl-bench-etcd-XXXXXX");
    if (mkdtemp(folder) == NULL) {
        fprintf(stderr, "rdzv: mkdtemp: %s\n", strerror(errno));
        folder[0] = '\0';
        return NULL;
    }
    for (int i = 0; i < MEMBERS; i++) {
        client[i] = free_port();
        peer[i] = free_port();
        size_t n = strlen(cluster);
        snprintf(cluster + n, sizeof(cluster) - n, "%sm%d=http://127.0.0.1:%d", i ? "," : "", i,
                 peer[i]);
        n = strlen(endpoints);
        snprintf(endpoints + n, sizeof(endpoints) - n, "%s127.0.0.1:%d", i ? "," : "", client[i]);
    }
    for (int i = 0; i < MEMBERS; i++) {
        char name[16], dir[300], curl[64], purl[64], log[300];
        snprintf(name, sizeof(name), "m%d", i);
        snprintf(dir, sizeof(dir), "%s/%s", folder, name);
        snprintf(log, sizeof(log), "%s/%s.log", folder, name);
        snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", client[i]);
        snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", peer[i]);
        pid_t pid = fork();
        if (pid == 0) {
            FILE *f = freopen(log, "w", stderr);
            (void)f;
            execlp("etcd", "etcd", "--name", name, "--data-dir", dir, "--listen-client-urls", curl,
                   "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                   "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                   "--initial-cluster-state", "new", "--initial-cluster-token", folder,
                   "--heartbeat-interval", "50", "--election-timeout", "500", "--logger", "zap",
                   "--log-outputs", "stderr", (char *)NULL);
            _exit(127);
        }
        members[i] = pid;
    }
    /* Healthy once a linearized read goes through. */
    uv_loop_t loop;
    dl_etcd_t *e = NULL;
    char err[1200];
    uv_loop_init(&loop);
    dl_etcd_opts_t o = {.endpoints = endpoints, .timeout = 2};
    bool ok = false;
    if (dl_etcd_new(&loop, &o, &e, err, sizeof(err)) == 0) {
        double deadline = mono() + 30;
        while (!ok && mono() < deadline) {
            json_t *ans = NULL;
            ok = dl_etcd_call_sync(e, "/v3/kv/range",
                                   json_pack("{s:o}", "key", dl_etcd_b64_str("/health")), &ans, err,
                                   sizeof(err)) == DL_ETCD_OK;
            json_decref(ans);
            if (!ok)
                usleep(100000);
        }
        dl_etcd_close(e);
        uv_run(&loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(&loop);
    if (!ok) {
        fprintf(stderr, "rdzv: the etcd cluster did not come up (etcd on PATH? logs in %s): %s\n",
                folder, err);
        dl_bench_etcd_stop();
        return NULL;
    }
    return endpoints;
}

typedef struct {
    int n;
    int ready, assigned, ended;
    double t0, t1, t_first;
    dl_rdzv_impl_t **b;
} run_t;

typedef struct {
    run_t *run;
    int i;
} agent_t;

static void cb_ready(void *ctx)
{
    agent_t *a = ctx;
    run_t *r = a->run;
    if (++r->ready < r->n)
        return;
    /* Every agent has its lease and its view: all join at once. */
    r->t0 = mono();
    for (int i = 0; i < r->n; i++) {
        dl_rdzv_join_t j = {.slots = 1, .last_round = 0};
        dl__rdzv_backend_etcd.join(r->b[i], &j);
    }
}

static void cb_assigned(void *ctx, const dl_rdzv_assignment_t *as,
                        const dl_rdzv_culprit_info_t *culprit)
{
    agent_t *a = ctx;
    (void)culprit;
    int k = ++a->run->assigned;
    if (k == 1)
        a->run->t_first = mono();
    if (k == a->run->n)
        a->run->t1 = mono();
}

static void cb_round_changed(void *ctx, int round, const char *reason,
                             const dl_rdzv_culprit_info_t *culprit)
{
    (void)culprit;
    fprintf(stderr, "rdzv: etcd: round %d: %s\n", round, reason);
}

static void cb_lost(void *ctx, const char *why, const dl_rdzv_culprit_info_t *culprit)
{
    (void)why, (void)culprit;
}

static void cb_view(void *ctx, const json_t *view)
{
}

static void cb_ended(void *ctx, const dl_rdzv_end_t *e)
{
    agent_t *a = ctx;
    a->run->ended++;
    fprintf(stderr, "rdzv: etcd: agent %d: the job ended (%s, exit %d)\n", a->i, e->status,
            e->exit_code);
}

static void cb_log(void *ctx, const char *text)
{
    fprintf(stderr, "rdzv: etcd: %s\n", text);
}

int dl_bench_etcd_run(int n, int json)
{
    static const dl_rdzv_backend_cbs_t cbs = {.ready = cb_ready,
                                              .assigned = cb_assigned,
                                              .round_changed = cb_round_changed,
                                              .lost = cb_lost,
                                              .view = cb_view,
                                              .ended = cb_ended,
                                              .log = cb_log};
    uv_loop_t loop;
    dl_job_spec_t spec;
    char run_id[64], ids[64];
    run_t r = {.n = n};
    agent_t *agents = calloc((size_t)n, sizeof(*agents));
    char(*node_ids)[32] = calloc((size_t)n, 32);
    int rc = -1;

    r.b = calloc((size_t)n, sizeof(*r.b));
    if (agents == NULL || node_ids == NULL || r.b == NULL)
        goto out;
    uv_loop_init(&loop);
    dl_job_spec_init(&spec);
    spec.heartbeat = 1;
    spec.dead_after = 60;
    spec.join_timeout = 120;
    spec.last_call = 60; /* the round closes when the last agent joins */
    spec.max_restarts = 0;
    snprintf(run_id, sizeof(run_id), "bench-%d-%d", n, (int)getpid());
    for (int i = 0; i < n; i++) {
        snprintf(node_ids[i], 32, "agent-%06d", i);
        agents[i] = (agent_t){&r, i};
        dl_rdzv_backend_conf_t conf = {.loop = &loop,
                                       .spec = &spec,
                                       .run_id = run_id,
                                       .endpoint = endpoints,
                                       .hostname = "bench-host",
                                       .node_id = node_ids[i],
                                       .nodes_min = n,
                                       .nodes_max = n,
                                       .want_node_rank = -1,
                                       .master_port = 29500};
        if (dl__rdzv_backend_etcd.start(&conf, &cbs, &agents[i], &r.b[i]) != 0) {
            fprintf(stderr, "rdzv: etcd: agent %d did not start\n", i);
            goto close;
        }
    }
    double deadline = mono() + 180;
    while (r.assigned < n && r.ended == 0 && mono() < deadline)
        uv_run(&loop, UV_RUN_ONCE);
    if (r.assigned < n) {
        fprintf(stderr, "rdzv: etcd: only %d of %d agents assigned (%d ready)\n", r.assigned, n,
                r.ready);
        goto close;
    }
    snprintf(ids, sizeof(ids), "%d", MEMBERS);
    if (json)
        printf("{\"agents\": %d, \"backend\": \"etcd\", \"etcd_members\": %d, "
               "\"seconds\": %.4f, \"first_assignment_seconds\": %.4f}\n",
               n, MEMBERS, r.t1 - r.t0, r.t_first - r.t0);
    else
        printf("%8d agents, etcd (%s members): first join -> last assignment %8.1f ms (first "
               "assignment after %.1f ms)\n",
               n, ids, (r.t1 - r.t0) * 1e3, (r.t_first - r.t0) * 1e3);
    fflush(stdout);
    rc = 0;
close:
    for (int i = 0; i < n; i++)
        if (r.b[i] != NULL)
            dl__rdzv_backend_etcd.close(r.b[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    dl_job_spec_free(&spec);
    /* The job never ends: its keys go by hand. */
    {
        uv_loop_t l2;
        dl_etcd_t *e = NULL;
        char err[1200], prefix[96];
        json_t *ans = NULL;
        uv_loop_init(&l2);
        dl_etcd_opts_t o = {.endpoints = endpoints, .timeout = 5};
        snprintf(prefix, sizeof(prefix), "/dlaunch/%s/", run_id);
        if (dl_etcd_new(&l2, &o, &e, err, sizeof(err)) == 0) {
            dl_etcd_call_sync(e, "/v3/kv/deleterange",
                              json_pack("{s:o, s:o}", "key", dl_etcd_b64_str(prefix), "range_end",
                                        dl_etcd_prefix_end(prefix)),
                              &ans, err, sizeof(err));
            json_decref(ans);
            dl_etcd_close(e);
            uv_run(&l2, UV_RUN_DEFAULT);
        }
        uv_loop_close(&l2);
    }
out:
    free(agents);
    free(node_ids);
    free(r.b);
    return rc;
}
