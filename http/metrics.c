/* /metrics: the snapshot in Prometheus' text exposition format (version 0.0.4). Every family is
 * written whole, HELP and TYPE first, so a family's samples stay together as the format wants.
 * docs/operations.md lists every metric with its type and labels; change both together. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "internal.h"

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

static double num(const json_t *o, const char *key)
{
    return json_number_value(json_object_get(o, key));
}

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s != NULL ? s : "";
}

/* One gauge a job, from a number field of its status. */
static void per_job(dl__http_buf_t *b, const json_t *jobs, const char *name, const char *help,
                    const char *field)
{
    size_t i;
    json_t *j;
    family(b, name, "gauge", help);
    json_array_foreach (jobs, i, j) {
        job_sample(b, name, str(j, "run_id"), NULL, NULL, num(j, field));
    }
}

static void counters_by(dl__http_buf_t *b, const char *name, const char *help, const char *label,
                        const json_t *counts)
{
    const char *key;
    json_t *v;
    family(b, name, "counter", help);
    json_object_foreach ((json_t *)counts, key, v) {
        dl__http_buf_printf(b, "%s{%s=\"", name, label);
        dl__http_buf_label(b, key);
        dl__http_buf_printf(b, "\"} %lld\n", (long long)json_integer_value(v));
    }
}

static void histogram(dl__http_buf_t *b, const char *name, const char *help, const json_t *h)
{
    const json_t *bounds = json_object_get(h, "bounds"), *counts = json_object_get(h, "counts");
    size_t i;
    json_t *bound;
    family(b, name, "histogram", help);
    json_array_foreach (bounds, i, bound) {
        dl__http_buf_printf(b, "%s_bucket{le=\"", name);
        dl__http_buf_float(b, json_number_value(bound));
        dl__http_buf_printf(b, "\"} %lld\n",
                            (long long)json_integer_value(json_array_get(counts, i)));
    }
    dl__http_buf_printf(b, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum ", name,
                        (long long)json_integer_value(json_object_get(h, "count")), name);
    dl__http_buf_float(b, num(h, "sum"));
    dl__http_buf_printf(b, "\n%s_count %lld\n", name,
                        (long long)json_integer_value(json_object_get(h, "count")));
}

static void jobs_metrics(dl__http_buf_t *b, const json_t *jobs)
{
    size_t i, k;
    json_t *j, *node;

    family(b, "dlaunch_jobs", "gauge", "Jobs the rendezvous knows, by state.");
    for (size_t s = 0; s < sizeof(job_states) / sizeof(job_states[0]); s++) {
        int n = 0;
        json_array_foreach (jobs, i, j) {
            n += strcmp(str(j, "state"), job_states[s]) == 0;
        }
        dl__http_buf_printf(b, "dlaunch_jobs{state=\"%s\"} %d\n", job_states[s], n);
    }
    family(b, "dlaunch_job_state", "gauge", "1 for the state each job is in.");
    json_array_foreach (jobs, i, j) {
        job_sample(b, "dlaunch_job_state", str(j, "run_id"), "state", str(j, "state"), 1);
    }
    per_job(b, jobs, "dlaunch_job_round", "The job's current rendezvous round.", "round");
    per_job(b, jobs, "dlaunch_job_restarts", "Restarts of the job so far (its round changes).",
            "restarts");
    per_job(b, jobs, "dlaunch_job_max_restarts", "Restarts the job may make before it fails.",
            "max_restarts");
    per_job(b, jobs, "dlaunch_job_world_size", "Workers of the running round (0 while gathering).",
            "world_size");
    family(b, "dlaunch_job_restarts_total", "counter",
           "Restarts of the job by reason: worker_failed, node_lost, node_joined, requested, "
           "node_left.");
    json_array_foreach (jobs, i, j) {
        const json_t *by = json_object_get(j, "restarts_by_cause");
        for (size_t c = 0; c < sizeof(causes) / sizeof(causes[0]); c++)
            job_sample(b, "dlaunch_job_restarts_total", str(j, "run_id"), "reason", causes[c],
                       (double)json_integer_value(json_object_get(by, causes[c])));
    }
    family(b, "dlaunch_job_nodes", "gauge", "Nodes in the job's current round.");
    json_array_foreach (jobs, i, j) {
        job_sample(b, "dlaunch_job_nodes", str(j, "run_id"), NULL, NULL,
                   (double)json_array_size(json_object_get(j, "nodes")));
    }
    family(b, "dlaunch_job_last_failure_timestamp_seconds", "gauge",
           "Unix time of the job's last worker failure.");
    json_array_foreach (jobs, i, j) {
        const json_t *f = json_object_get(j, "last_failure");
        if (f != NULL)
            job_sample(b, "dlaunch_job_last_failure_timestamp_seconds", str(j, "run_id"), NULL,
                       NULL, num(f, "time"));
    }

    /* Training progress, for jobs whose agents report it. */
    static const struct {
        const char *name, *field, *help;
    } progress[] = {
        {"dlaunch_job_step", "step", "The job's last reported optimizer step."},
        {"dlaunch_job_loss", "loss", "The job's last reported training loss."},
        {"dlaunch_job_samples_per_second", "samples_per_s",
         "The job's last reported training throughput."},
    };
    for (size_t p = 0; p < sizeof(progress) / sizeof(progress[0]); p++) {
        family(b, progress[p].name, "gauge", progress[p].help);
        json_array_foreach (jobs, i, j) {
            const json_t *ring = json_object_get(j, "progress");
            const json_t *last = json_array_get(ring, json_array_size(ring) - 1);
            const json_t *v = json_object_get(last, progress[p].field);
            if (json_is_number(v))
                job_sample(b, progress[p].name, str(j, "run_id"), NULL, NULL, json_number_value(v));
        }
    }

    per_job(b, jobs, "dlaunch_store_keys", "Keys in the job's store.", "keys");
    per_job(b, jobs, "dlaunch_store_bytes", "Bytes of keys and values in the job's store.",
            "store_bytes");
    per_job(b, jobs, "dlaunch_store_waits", "WAITs pending on the job's store.", "store_waits");

    family(b, "dlaunch_node_heartbeat_age_seconds", "gauge",
           "Seconds since each node's last heartbeat (or its join).");
    json_array_foreach (jobs, i, j) {
        json_array_foreach (json_object_get(j, "nodes"), k, node) {
            dl__http_buf_puts(b, "dlaunch_node_heartbeat_age_seconds{run_id=\"");
            dl__http_buf_label(b, str(j, "run_id"));
            dl__http_buf_puts(b, "\",node=\"");
            dl__http_buf_label(b, str(node, "node_id"));
            dl__http_buf_puts(b, "\",host=\"");
            dl__http_buf_label(b, str(node, "host"));
            dl__http_buf_puts(b, "\"} ");
            dl__http_buf_float(b, num(node, "heartbeat_age"));
            dl__http_buf_puts(b, "\n");
        }
    }
    family(b, "dlaunch_node_up", "gauge",
           "1 for a node connected and still running its workers, else 0.");
    json_array_foreach (jobs, i, j) {
        json_array_foreach (json_object_get(j, "nodes"), k, node) {
            bool up = json_is_true(json_object_get(node, "connected")) &&
                      !json_is_true(json_object_get(node, "left"));
            dl__http_buf_puts(b, "dlaunch_node_up{run_id=\"");
            dl__http_buf_label(b, str(j, "run_id"));
            dl__http_buf_puts(b, "\",node=\"");
            dl__http_buf_label(b, str(node, "node_id"));
            dl__http_buf_printf(b, "\"} %d\n", up ? 1 : 0);
        }
    }
}

static void server_metrics(dl__http_buf_t *b, const json_t *srv)
{
    const json_t *h = json_object_get(srv, "histograms");

    family(b, "dlaunch_start_time_seconds", "gauge", "Unix time the rendezvous server started.");
    dl__http_buf_puts(b, "dlaunch_start_time_seconds ");
    dl__http_buf_float(b, num(srv, "started"));
    dl__http_buf_puts(b, "\n");
    counters_by(b, "dlaunch_restarts_total", "Restarts of every job served since start, by reason.",
                "reason", json_object_get(srv, "restarts"));
    family(b, "dlaunch_rounds_total", "counter", "Rendezvous rounds closed with an assignment.");
    dl__http_buf_printf(b, "dlaunch_rounds_total %lld\n",
                        (long long)json_integer_value(json_object_get(srv, "rounds")));
    counters_by(b, "dlaunch_jobs_ended_total", "Jobs ended since start, by how.", "status",
                json_object_get(srv, "ended"));
    histogram(b, "dlaunch_rendezvous_round_seconds",
              "From a round's opening (its first join, or the restart) to its assignment.",
              json_object_get(h, "round_seconds"));
    histogram(b, "dlaunch_rendezvous_step_seconds",
              "Time the rendezvous loop spent on one message or timer.",
              json_object_get(h, "step_seconds"));
    family(b, "dlaunch_connections", "gauge", "Open connections to the rendezvous.");
    dl__http_buf_printf(b, "dlaunch_connections %lld\n",
                        (long long)json_integer_value(json_object_get(srv, "connections")));
    family(b, "dlaunch_connections_peak", "gauge", "Most connections open at once since start.");
    dl__http_buf_printf(b, "dlaunch_connections_peak %lld\n",
                        (long long)json_integer_value(json_object_get(srv, "peak_connections")));
    family(b, "dlaunch_connections_accepted_total", "counter", "Connections accepted.");
    dl__http_buf_printf(b, "dlaunch_connections_accepted_total %lld\n",
                        (long long)json_integer_value(json_object_get(srv, "accepted")));
    counters_by(b, "dlaunch_messages_total", "Messages accepted after the handshake, by type.",
                "type", json_object_get(srv, "messages"));
    counters_by(b, "dlaunch_rejected_total",
                "Frames and messages refused with an error reply, by error code.", "code",
                json_object_get(srv, "rejected"));
    family(b, "dlaunch_auth_failures_total", "counter",
           "Connections refused for a wrong job token or no handshake in time.");
    dl__http_buf_printf(b,
                        "dlaunch_auth_failures_total{reason=\"wrong_token\"} %lld\n"
                        "dlaunch_auth_failures_total{reason=\"timeout\"} %lld\n",
                        (long long)json_integer_value(json_object_get(srv, "auth_failures")),
                        (long long)json_integer_value(json_object_get(srv, "auth_timeouts")));
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
    family(b, "dlaunch_build_info", "gauge", "Always 1; the version is a label.");
    dl__http_buf_puts(b, "dlaunch_build_info{version=\"");
    dl__http_buf_label(b, str(snap, "version"));
    dl__http_buf_puts(b, "\"} 1\n");
    if (snap != NULL) {
        jobs_metrics(b, json_object_get(snap, "jobs"));
        server_metrics(b, json_object_get(snap, "server"));
        family(b, "dlaunch_snapshot_age_seconds", "gauge",
               "Age of the rendezvous snapshot these figures come from.");
        dl__http_buf_puts(b, "dlaunch_snapshot_age_seconds ");
        dl__http_buf_float(b, unix_now - num(snap, "time"));
        dl__http_buf_puts(b, "\n");
    }
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
