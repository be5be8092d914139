/* /metrics: the snapshot in Prometheus' text exposition format (version 0.0.4). Every family is
 * written whole, HELP and TYPE first, so a family's samples stay together as the format wants.
 * docs/operations.md lists every metric with its type and labels; change both together. */
#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "internal.h"
#include "status-reply.h"

static const char *const job_states[] = {"gathering", "running", "succeeded",
                                         "failed",    "stopped", "timed-out"};
static const char *const causes[] = {"worker_failed", "node_lost", "node_joined", "requested",
                                     "node_left"};

static void family(dl__http_buf_t *b, const char *name, const char *type, const char *help)
{
    dl__http_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{run_id="..."[,extra]} value */
static void job_sample(dl__http_buf_t *b, const char *name, const char *run_id,
                       const char *extra_label, const char *extra_value, double v)
{
    dl__http_buf_printf(b, "%s{run_id=\"", name);
    dl__http_buf_label(b, run_id);
    if (extra_label != NULL) {
        dl__http_buf_printf(b, "\",%s=\"", extra_label);
        dl__http_buf_label(b, extra_value);
    }
    dl__http_buf_puts(b, "\"} ");
    dl__http_buf_float(b, v);
    dl__http_buf_puts(b, "\n");
}

typedef dl_proto_status_job_t job_t;

static const char *str(const char *s)
{
    return s != NULL ? s : "";
}

/* One gauge a job, from a number member of its status (at offset). */
static void per_job(dl__http_buf_t *b, const dl_proto_status_snapshot_t *s, const char *name,
                    const char *help, size_t offset)
{
    family(b, name, "gauge", help);
    for (size_t i = 0; i < s->njobs; i++)
        job_sample(b, name, s->jobs[i].run_id, NULL, NULL,
                   (double)*(const long long *)((const char *)&s->jobs[i] + offset));
}

static void counters_by(dl__http_buf_t *b, const char *name, const char *help, const char *label,
                        const dl_proto_rec_count_t *counts, size_t n)
{
    family(b, name, "counter", help);
    for (size_t i = 0; i < n; i++) {
        dl__http_buf_printf(b, "%s{%s=\"", name, label);
        dl__http_buf_label(b, counts[i].name);
        dl__http_buf_printf(b, "\"} %lld\n", counts[i].n);
    }
}

static long long count_of(const dl_proto_rec_count_t *counts, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(counts[i].name, name) == 0)
            return counts[i].n;
    return 0;
}

static void histogram(dl__http_buf_t *b, const char *name, const char *help,
                      const dl_proto_status_hist_t *h)
{
    static const dl_proto_status_hist_t none = {0};
    if (h == NULL)
        h = &none;
    family(b, name, "histogram", help);
    for (size_t i = 0; i < h->nbounds; i++) {
        dl__http_buf_printf(b, "%s_bucket{le=\"", name);
        dl__http_buf_float(b, h->bounds[i]);
        dl__http_buf_printf(b, "\"} %lld\n", i < h->ncounts ? h->counts[i] : 0);
    }
    dl__http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum ", name, h->count, name);
    dl__http_buf_float(b, h->sum);
    dl__http_buf_printf(b, "\n%s_count %lld\n", name, h->count);
}

static void jobs_metrics(dl__http_buf_t *b, const dl_proto_status_snapshot_t *s)
{
    family(b, "dlaunch_jobs", "gauge", "Jobs the rendezvous knows, by state.");
    for (size_t st = 0; st < sizeof(job_states) / sizeof(job_states[0]); st++) {
        int n = 0;
        for (size_t i = 0; i < s->njobs; i++)
            n += strcmp(s->jobs[i].state, job_states[st]) == 0;
        dl__http_buf_printf(b, "dlaunch_jobs{state=\"%s\"} %d\n", job_states[st], n);
    }
    family(b, "dlaunch_job_state", "gauge", "1 for the state each job is in.");
    for (size_t i = 0; i < s->njobs; i++)
        job_sample(b, "dlaunch_job_state", s->jobs[i].run_id, "state", s->jobs[i].state, 1);
    per_job(b, s, "dlaunch_job_round", "The job's current rendezvous round.",
            offsetof(job_t, round));
    per_job(b, s, "dlaunch_job_restarts", "Restarts of the job so far (its round changes).",
            offsetof(job_t, restarts));
    per_job(b, s, "dlaunch_job_max_restarts", "Restarts the job may make before it fails.",
            offsetof(job_t, max_restarts));
    per_job(b, s, "dlaunch_job_world_size", "Workers of the running round (0 while gathering).",
            offsetof(job_t, world_size));
    family(b, "dlaunch_job_restarts_total", "counter",
           "Restarts of the job by reason: worker_failed, node_lost, node_joined, requested, "
           "node_left.");
    for (size_t i = 0; i < s->njobs; i++) {
        const job_t *j = &s->jobs[i];
        for (size_t c = 0; c < sizeof(causes) / sizeof(causes[0]); c++)
            job_sample(b, "dlaunch_job_restarts_total", j->run_id, "reason", causes[c],
                       (double)count_of(j->restarts_by_cause, j->nrestarts_by_cause, causes[c]));
    }
    family(b, "dlaunch_job_nodes", "gauge", "Nodes in the job's current round.");
    for (size_t i = 0; i < s->njobs; i++)
        job_sample(b, "dlaunch_job_nodes", s->jobs[i].run_id, NULL, NULL,
                   (double)s->jobs[i].nnodes);
    family(b, "dlaunch_job_last_failure_timestamp_seconds", "gauge",
           "Unix time of the job's last worker failure.");
    for (size_t i = 0; i < s->njobs; i++)
        if (s->jobs[i].last_failure != NULL)
            job_sample(b, "dlaunch_job_last_failure_timestamp_seconds", s->jobs[i].run_id, NULL,
                       NULL, s->jobs[i].last_failure->time);

    /* Training progress, for jobs whose agents report it. */
    static const char *const progress[][2] = {
        {"dlaunch_job_step", "The job's last reported optimizer step."},
        {"dlaunch_job_loss", "The job's last reported training loss."},
        {"dlaunch_job_samples_per_second", "The job's last reported training throughput."},
    };
    for (size_t p = 0; p < sizeof(progress) / sizeof(progress[0]); p++) {
        family(b, progress[p][0], "gauge", progress[p][1]);
        for (size_t i = 0; i < s->njobs; i++) {
            const job_t *j = &s->jobs[i];
            const dl_proto_status_point_t *last =
                j->nprogress > 0 ? &j->progress[j->nprogress - 1] : NULL;
            bool has =
                last != NULL && (p == 0 || (p == 1 ? last->has_loss : last->has_samples_per_s));
            if (has)
                job_sample(b, progress[p][0], j->run_id, NULL, NULL,
                           p == 0   ? (double)last->step
                           : p == 1 ? last->loss
                                    : last->samples_per_s);
        }
    }

    per_job(b, s, "dlaunch_store_keys", "Keys in the job's store.", offsetof(job_t, keys));
    per_job(b, s, "dlaunch_store_bytes", "Bytes of keys and values in the job's store.",
            offsetof(job_t, store_bytes));
    per_job(b, s, "dlaunch_store_waits", "WAITs pending on the job's store.",
            offsetof(job_t, store_waits));

    family(b, "dlaunch_node_heartbeat_age_seconds", "gauge",
           "Seconds since each node's last heartbeat (or its join).");
    for (size_t i = 0; i < s->njobs; i++) {
        for (size_t k = 0; k < s->jobs[i].nnodes; k++) {
            const dl_proto_status_node_t *node = &s->jobs[i].nodes[k];
            dl__http_buf_puts(b, "dlaunch_node_heartbeat_age_seconds{run_id=\"");
            dl__http_buf_label(b, s->jobs[i].run_id);
            dl__http_buf_puts(b, "\",node=\"");
            dl__http_buf_label(b, node->node_id);
            dl__http_buf_puts(b, "\",host=\"");
            dl__http_buf_label(b, node->host);
            dl__http_buf_puts(b, "\"} ");
            dl__http_buf_float(b, node->heartbeat_age);
            dl__http_buf_puts(b, "\n");
        }
    }
    family(b, "dlaunch_node_up", "gauge",
           "1 for a node connected and still running its workers, else 0.");
    for (size_t i = 0; i < s->njobs; i++) {
        for (size_t k = 0; k < s->jobs[i].nnodes; k++) {
            const dl_proto_status_node_t *node = &s->jobs[i].nodes[k];
            dl__http_buf_puts(b, "dlaunch_node_up{run_id=\"");
            dl__http_buf_label(b, s->jobs[i].run_id);
            dl__http_buf_puts(b, "\",node=\"");
            dl__http_buf_label(b, node->node_id);
            dl__http_buf_printf(b, "\"} %d\n", node->connected && !node->left ? 1 : 0);
        }
    }
}

static void server_metrics(dl__http_buf_t *b, const dl_proto_status_server_t *srv)
{
    /* An agent's page of an etcd job has no server figures: zeros, as ever. */
    static const dl_proto_status_server_t none = {0};
    if (srv == NULL)
        srv = &none;
    const dl_proto_status_hists_t *h = srv->histograms;

    family(b, "dlaunch_start_time_seconds", "gauge", "Unix time the rendezvous server started.");
    dl__http_buf_puts(b, "dlaunch_start_time_seconds ");
    dl__http_buf_float(b, srv->started);
    dl__http_buf_puts(b, "\n");
    counters_by(b, "dlaunch_restarts_total", "Restarts of every job served since start, by reason.",
                "reason", srv->restarts, srv->nrestarts);
    family(b, "dlaunch_rounds_total", "counter", "Rendezvous rounds closed with an assignment.");
    dl__http_buf_printf(b, "dlaunch_rounds_total %lld\n", srv->rounds);
    counters_by(b, "dlaunch_jobs_ended_total", "Jobs ended since start, by how.", "status",
                srv->ended, srv->nended);
    histogram(b, "dlaunch_rendezvous_round_seconds",
              "From a round's opening (its first join, or the restart) to its assignment.",
              h != NULL ? h->round_seconds : NULL);
    histogram(b, "dlaunch_rendezvous_step_seconds",
              "Time the rendezvous loop spent on one message or timer.",
              h != NULL ? h->step_seconds : NULL);
    family(b, "dlaunch_connections", "gauge", "Open connections to the rendezvous.");
    dl__http_buf_printf(b, "dlaunch_connections %lld\n", srv->connections);
    family(b, "dlaunch_connections_peak", "gauge", "Most connections open at once since start.");
    dl__http_buf_printf(b, "dlaunch_connections_peak %lld\n", srv->peak_connections);
    family(b, "dlaunch_connections_accepted_total", "counter", "Connections accepted.");
    dl__http_buf_printf(b, "dlaunch_connections_accepted_total %lld\n", srv->accepted);
    counters_by(b, "dlaunch_messages_total", "Messages accepted after the handshake, by type.",
                "type", srv->messages, srv->nmessages);
    counters_by(b, "dlaunch_rejected_total",
                "Frames and messages refused with an error reply, by error code.", "code",
                srv->rejected, srv->nrejected);
    family(b, "dlaunch_auth_failures_total", "counter",
           "Connections refused for a wrong job token or no handshake in time.");
    dl__http_buf_printf(b,
                        "dlaunch_auth_failures_total{reason=\"wrong_token\"} %lld\n"
                        "dlaunch_auth_failures_total{reason=\"timeout\"} %lld\n",
                        srv->auth_failures, srv->auth_timeouts);
}

/* CPU, memory and descriptors of this process, as Prometheus' client libraries name them. */
static void process_metrics(dl__http_buf_t *b)
{
    char buf[1024];
    unsigned long long utime = 0, stime = 0, start = 0, vsize = 0;
    long long rss = 0, btime = 0;
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f != NULL)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    /* Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize) and 24 (rss) of proc(5). */
    if (p == NULL || sscanf(p + 2,
                            "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d "
                            "%*d %*d %*d %llu %llu %lld",
                            &utime, &stime, &start, &vsize, &rss) != 5)
        return;
    f = fopen("/proc/stat", "r");
    while (f != NULL && fgets(buf, sizeof(buf), f) != NULL)
        if (sscanf(buf, "btime %lld", &btime) == 1)
            break;
    if (f != NULL)
        fclose(f);
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        fds += e->d_name[0] != '.';
    if (d != NULL) {
        closedir(d);
        fds--; /* the one opendir holds */
    }
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);

    family(b, "process_cpu_seconds_total", "counter", "User and system CPU time spent.");
    dl__http_buf_puts(b, "process_cpu_seconds_total ");
    dl__http_buf_float(b, (double)(utime + stime) / (double)tck);
    dl__http_buf_puts(b, "\n");
    family(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    dl__http_buf_printf(b, "process_resident_memory_bytes %lld\n", rss * page);
    family(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    dl__http_buf_printf(b, "process_virtual_memory_bytes %llu\n", vsize);
    family(b, "process_start_time_seconds", "gauge", "Unix time the process started.");
    dl__http_buf_puts(b, "process_start_time_seconds ");
    dl__http_buf_float(b, (double)btime + (double)start / (double)tck);
    dl__http_buf_puts(b, "\n");
    family(b, "process_open_fds", "gauge", "Open file descriptors.");
    dl__http_buf_printf(b, "process_open_fds %d\n", fds);
    family(b, "process_max_fds", "gauge", "The limit of open file descriptors.");
    dl__http_buf_printf(b, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
}

void dl__http_metrics(dl__http_buf_t *b, const json_t *snap, const dl__http_counters_t *hc,
                      double unix_now)
{
    dl_proto_status_snapshot_t s = {0};
    char err[512];
    int bad = snap != NULL ? dl_proto_rec_decode(&dl_proto_status_snapshot_type, snap, &s,
                                                 "snapshot", err, sizeof(err))
                           : 0;
    family(b, "dlaunch_build_info", "gauge", "Always 1; the version is a label.");
    dl__http_buf_puts(b, "dlaunch_build_info{version=\"");
    dl__http_buf_label(b, str(s.version));
    dl__http_buf_puts(b, "\"} 1\n");
    if (bad < 0) {
        /* A comment, which scrapers skip: the figures it would have given are missing. */
        dl__http_buf_puts(b, "# ");
        dl__http_buf_label(b, err);
        dl__http_buf_puts(b, "\n");
    } else if (snap != NULL) {
        jobs_metrics(b, &s);
        server_metrics(b, s.server);
        family(b, "dlaunch_snapshot_age_seconds", "gauge",
               "Age of the rendezvous snapshot these figures come from.");
        dl__http_buf_puts(b, "dlaunch_snapshot_age_seconds ");
        dl__http_buf_float(b, unix_now - s.time);
        dl__http_buf_puts(b, "\n");
    }
    dl_proto_rec_free(&dl_proto_status_snapshot_type, &s);
    static const char *const handlers[] = {"page", "metrics", "api", "other"};
    family(b, "dlaunch_http_requests_total", "counter", "HTTP requests served, by handler.");
    for (size_t i = 0; i < 4; i++)
        dl__http_buf_printf(b, "dlaunch_http_requests_total{handler=\"%s\"} %llu\n", handlers[i],
                            (unsigned long long)hc->requests[i]);
    family(b, "dlaunch_http_unauthorized_total", "counter",
           "HTTP requests refused for a missing or wrong token.");
    dl__http_buf_printf(b, "dlaunch_http_unauthorized_total %llu\n",
                        (unsigned long long)hc->unauthorized);
    process_metrics(b);
}
