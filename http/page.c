/* The status page at /: one HTML document written from the snapshot, with its style inline and
 * its charts as inline SVG drawn here, so it needs no script, no framework and nothing from
 * another host, and reloads itself with a meta refresh. Everything an agent or a worker wrote
 * (hosts, reasons, log tails) is escaped. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "status-reply.h"

/* Past this many nodes a job's table stops; the whole list is in /api/jobs/RUN_ID. */
#define NODES_SHOWN 64

static const char style[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}"
    "header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;"
    "align-items:baseline;flex-wrap:wrap}"
    "header h1{font-size:18px;margin:0}header span{color:#b8c0d0}"
    "main{padding:12px 20px}"
    "table{border-collapse:collapse;background:#fff;margin:6px 0 12px}"
    "th,td{border:1px solid #dde1e8;padding:3px 8px;text-align:left;vertical-align:top}"
    "th{background:#eef0f4;font-weight:600}td.n{text-align:right;font-variant-numeric:"
    "tabular-nums}"
    "section.job{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:8px 16px;"
    "margin:14px 0}"
    "section.job h2{font-size:16px;margin:6px 0}"
    ".state{display:inline-block;border-radius:9px;padding:0 8px;font-size:12px;color:#fff;"
    "background:#6b7280}"
    ".gathering{background:#b7791f}.running{background:#2563eb}.succeeded{background:#15803d}"
    ".failed,.timed-out{background:#b91c1c}.stopped{background:#6b7280}"
    ".up{color:#15803d}.down{color:#b91c1c}.muted{color:#6b7280}"
    ".charts{display:flex;gap:12px;flex-wrap:wrap}"
    "figure{margin:0;border:1px solid #dde1e8;border-radius:4px;padding:4px 6px}"
    "figcaption{font-size:12px;color:#374151}"
    ".failure{border-left:4px solid #b91c1c;padding:2px 10px;margin:8px 0;background:#fef2f2}"
    "pre{background:#111827;color:#e5e7eb;padding:6px 8px;overflow:auto;max-height:16em;"
    "font-size:12px;white-space:pre-wrap}"
    "footer{padding:10px 20px;color:#6b7280}a{color:#1d4ed8}";

typedef dl_proto_status_job_t job_t;
typedef dl_proto_status_point_t point_t;

static const char *str(const char *s)
{
    return s != NULL ? s : "";
}

static void clock_time(dl__http_buf_t *b, double unix_time)
{
    char text[32];
    time_t t = (time_t)unix_time;
    struct tm tm;
    if (localtime_r(&t, &tm) == NULL || strftime(text, sizeof(text), "%H:%M:%S", &tm) == 0)
        snprintf(text, sizeof(text), "%.0f", unix_time);
    dl__http_buf_puts(b, text);
}

static void duration(dl__http_buf_t *b, double s)
{
    if (s < 0)
        s = 0;
    if (s < 10)
        dl__http_buf_printf(b, "%.1fs", s);
    else if (s < 120)
        dl__http_buf_printf(b, "%.0fs", s);
    else if (s < 7200)
        dl__http_buf_printf(b, "%.0fm", s / 60);
    else
        dl__http_buf_printf(b, "%.1fh", s / 3600);
}

/* A value in few characters: 0.4731, 12.5, 8123, 1.2e+06. */
static void shortnum(dl__http_buf_t *b, double v)
{
    double a = fabs(v);
    if (v == (double)(long long)v && a < 1e9)
        dl__http_buf_printf(b, "%lld", (long long)v);
    else if (a != 0 && (a < 0.001 || a >= 1e6))
        dl__http_buf_printf(b, "%.3g", v);
    else if (a < 10)
        dl__http_buf_printf(b, "%.4f", v);
    else if (a < 1000)
        dl__http_buf_printf(b, "%.1f", v);
    else
        dl__http_buf_printf(b, "%.0f", v);
}

/* What a chart plots of a progress point; false where the point has none. */
typedef enum { TIME, STEP, LOSS, RATE } axis_t;
static const char *const axis_names[] = {"time", "step", "loss", "samples_per_s"};

static bool value(const point_t *p, axis_t a, double *v)
{
    switch (a) {
    case TIME: *v = p->time; return true;
    case STEP: *v = (double)p->step; return true;
    case LOSS: *v = p->loss; return p->has_loss;
    case RATE: *v = p->samples_per_s; return p->has_samples_per_s;
    }
    return false;
}

/* A line chart of the progress points' y against x (TIME or STEP), as an inline SVG with its
 * range written at the corners. Points without the field are skipped. */
static void chart(dl__http_buf_t *b, const job_t *job, axis_t xa, axis_t ya, const char *caption,
                  const char *cls)
{
    enum { W = 300, H = 110, L = 6, R = 6, T = 16, B = 16 };
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY, last = NAN;
    size_t i, n = 0;
    double xv, yv;

    for (i = 0; i < job->nprogress; i++) {
        if (!value(&job->progress[i], xa, &xv) || !value(&job->progress[i], ya, &yv))
            continue;
        xmin = fmin(xmin, xv);
        xmax = fmax(xmax, xv);
        ymin = fmin(ymin, yv);
        ymax = fmax(ymax, yv);
        last = yv;
        n++;
    }
    if (n == 0)
        return;
    if (xmax <= xmin)
        xmax = xmin + 1;
    if (ymax <= ymin) {
        ymax += fabs(ymax) * 0.05 + 0.5;
        ymin -= fabs(ymin) * 0.05 + 0.5;
    }
    dl__http_buf_printf(
        b,
        "<figure class=\"%s\"><svg width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
        "role=\"img\"><rect width=\"%d\" height=\"%d\" fill=\"#fbfcfe\"/>",
        cls, W, H, W, H, W, H);
    /* A restart from an earlier step starts a new line instead of drawing one back. */
    double prev = -INFINITY;
    bool open = false;
    for (i = 0; i < job->nprogress; i++) {
        if (!value(&job->progress[i], xa, &xv) || !value(&job->progress[i], ya, &yv))
            continue;
        if (xv < prev && open) {
            dl__http_buf_puts(b, "\"/>");
            open = false;
        }
        if (!open)
            dl__http_buf_puts(b, "<polyline fill=\"none\" stroke=\"#2563eb\" "
                                 "stroke-width=\"1.5\" points=\"");
        open = true;
        prev = xv;
        double px = L + (xv - xmin) / (xmax - xmin) * (W - L - R);
        double py = T + (ymax - yv) / (ymax - ymin) * (H - T - B);
        dl__http_buf_printf(b, "%.1f,%.1f ", px, py);
    }
    dl__http_buf_puts(b, "\"/><text x=\"4\" y=\"12\" font-size=\"10\" fill=\"#6b7280\">");
    shortnum(b, ymax);
    dl__http_buf_printf(b, "</text><text x=\"4\" y=\"%d\" font-size=\"10\" fill=\"#6b7280\">",
                        H - 4);
    shortnum(b, ymin);
    dl__http_buf_printf(b,
                        "</text><text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#6b7280\" "
                        "text-anchor=\"end\">",
                        W - 4, H - 4);
    if (xa == TIME) {
        dl__http_buf_puts(b, "last ");
        duration(b, xmax - xmin);
    } else {
        dl__http_buf_printf(b, "%s %.0f&#8211;%.0f", axis_names[xa], xmin, xmax);
    }
    dl__http_buf_printf(b, "</text></svg><figcaption>%s: <b>", caption);
    shortnum(b, last);
    dl__http_buf_puts(b, "</b></figcaption></figure>");
}

/* The first global rank of each node follows from the node ranks: nodes take consecutive blocks
 * of ranks in node-rank order, each as many as its slots. */
static long long first_rank(const job_t *job, long long node_rank)
{
    long long first = 0;
    for (size_t i = 0; i < job->nnodes; i++) {
        long long r = job->nodes[i].node_rank;
        if (r >= 0 && r < node_rank)
            first += job->nodes[i].slots;
    }
    return first;
}

static void nodes_table(dl__http_buf_t *b, const job_t *job, double unix_now)
{
    if (job->nnodes == 0) {
        dl__http_buf_puts(b, "<p class=\"muted\">No node has joined this round yet.</p>");
        return;
    }
    dl__http_buf_puts(b, "<table class=\"nodes\"><tr><th>node</th><th>host</th><th>node rank</th>"
                         "<th>ranks</th><th>heartbeat</th><th>state</th></tr>");
    for (size_t i = 0; i < job->nnodes; i++) {
        const dl_proto_status_node_t *n = &job->nodes[i];
        if (i == NODES_SHOWN) {
            dl__http_buf_printf(b,
                                "<tr><td colspan=\"6\" class=\"muted\">and %zu more: see "
                                "<a href=\"/api/jobs/",
                                job->nnodes - NODES_SHOWN);
            dl__http_buf_html(b, job->run_id);
            dl__http_buf_puts(b, "\">the API</a></td></tr>");
            break;
        }
        long long rank = n->node_rank, slots = n->slots;
        dl__http_buf_puts(b, "<tr class=\"node\"><td>");
        dl__http_buf_html(b, n->node_id);
        dl__http_buf_puts(b, "</td><td>");
        dl__http_buf_html(b, n->host);
        if (rank >= 0) {
            long long first = first_rank(job, rank);
            dl__http_buf_printf(b, "</td><td class=\"n\">%lld</td><td class=\"n\">%lld", rank,
                                first);
            if (slots > 1)
                dl__http_buf_printf(b, "&#8211;%lld", first + slots - 1);
        } else {
            dl__http_buf_printf(b, "</td><td class=\"n\">&#8211;</td><td class=\"n\">%lld slots",
                                slots);
        }
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        duration(b, unix_now - n->last_heartbeat);
        dl__http_buf_printf(b, " ago</td><td class=\"%s\">%s</td></tr>",
                            n->left        ? "muted"
                            : n->connected ? "up"
                                           : "down",
                            n->left        ? "done"
                            : n->connected ? "up"
                                           : "disconnected");
    }
    dl__http_buf_puts(b, "</table>");
}

static void failure(dl__http_buf_t *b, const job_t *job, double unix_now)
{
    const dl_proto_status_failure_t *f = job->last_failure;
    if (f == NULL) {
        if (*str(job->failure) != '\0') {
            dl__http_buf_puts(b, "<div class=\"failure\"><h3>First failure</h3><p>");
            dl__http_buf_html(b, job->failure);
            dl__http_buf_puts(b, "</p></div>");
        }
        return;
    }
    dl__http_buf_puts(b, "<div class=\"failure\"><h3>Last failure</h3><p>");
    clock_time(b, f->time);
    dl__http_buf_puts(b, " (");
    duration(b, unix_now - f->time);
    dl__http_buf_printf(b, " ago), round %lld: <b>rank %lld</b>", f->round, f->rank);
    if (f->has_local_rank)
        dl__http_buf_printf(b, " (local rank %lld)", f->local_rank);
    dl__http_buf_puts(b, " on the node at ");
    dl__http_buf_html(b, f->peer);
    if (f->has_signal)
        dl__http_buf_printf(b, ", killed by signal %lld", f->signal);
    else
        dl__http_buf_printf(b, ", exit code %lld", f->exit_code);
    if (*str(f->reason) != '\0') {
        dl__http_buf_puts(b, ": ");
        dl__http_buf_html(b, f->reason);
    }
    dl__http_buf_puts(b, "</p>");
    if (*str(f->log_tail) != '\0') {
        dl__http_buf_puts(b, "<pre class=\"tail\">");
        dl__http_buf_html(b, f->log_tail);
        dl__http_buf_puts(b, "</pre>");
    }
    dl__http_buf_puts(b, "</div>");
}

static void history(dl__http_buf_t *b, const job_t *job)
{
    if (job->nhistory > 0) {
        dl__http_buf_printf(b,
                            "<details><summary>Restarts (%zu shown)</summary><table><tr>"
                            "<th>time</th><th>round</th><th>reason</th><th>what</th></tr>",
                            job->nhistory);
        for (size_t i = 0; i < job->nhistory; i++) {
            const dl_proto_status_restart_t *e = &job->history[i];
            dl__http_buf_puts(b, "<tr><td>");
            clock_time(b, e->time);
            dl__http_buf_printf(b, "</td><td class=\"n\">%lld</td><td>", e->round);
            dl__http_buf_html(b, e->cause);
            dl__http_buf_puts(b, "</td><td>");
            dl__http_buf_html(b, e->reason);
            dl__http_buf_puts(b, "</td></tr>");
        }
        dl__http_buf_puts(b, "</table></details>");
    }
    if (job->nlog > 0) {
        dl__http_buf_puts(b, "<details><summary>Rendezvous log</summary><pre>");
        for (size_t i = 0; i < job->nlog; i++) {
            clock_time(b, job->log[i].time);
            dl__http_buf_puts(b, " ");
            dl__http_buf_html(b, job->log[i].level);
            dl__http_buf_puts(b, ": ");
            dl__http_buf_html(b, job->log[i].text);
            dl__http_buf_puts(b, "\n");
        }
        dl__http_buf_puts(b, "</pre></details>");
    }
}

static const point_t *last_point(const job_t *job)
{
    return job->nprogress > 0 ? &job->progress[job->nprogress - 1] : NULL;
}

static void progress(dl__http_buf_t *b, const job_t *job)
{
    const point_t *last = last_point(job);
    if (last == NULL)
        return;
    dl__http_buf_printf(b, "<p class=\"progress\">Training: step <b>%lld</b>", last->step);
    if (last->has_loss) {
        dl__http_buf_puts(b, ", loss <b>");
        shortnum(b, last->loss);
        dl__http_buf_puts(b, "</b>");
    }
    if (last->has_samples_per_s) {
        dl__http_buf_puts(b, ", <b>");
        shortnum(b, last->samples_per_s);
        dl__http_buf_puts(b, "</b> samples/s");
    }
    dl__http_buf_puts(b, "</p><div class=\"charts\">");
    chart(b, job, STEP, LOSS, "loss by step", "loss");
    chart(b, job, TIME, RATE, "samples/s", "rate");
    chart(b, job, TIME, STEP, "step", "steps");
    dl__http_buf_puts(b, "</div>");
}

static void job_section(dl__http_buf_t *b, const job_t *job, double unix_now)
{
    dl__http_buf_puts(b, "<section class=\"job\" id=\"job-");
    dl__http_buf_html(b, job->run_id);
    dl__http_buf_puts(b, "\"><h2>");
    dl__http_buf_html(b, job->run_id);
    dl__http_buf_puts(b, " <span class=\"state ");
    dl__http_buf_html(b, job->state);
    dl__http_buf_puts(b, "\">");
    dl__http_buf_html(b, job->state);
    dl__http_buf_printf(b,
                        "</span></h2><p>round %lld &#183; restarts %lld of %lld &#183; %zu "
                        "nodes (%lld:%lld) &#183; world size %lld &#183; store: %lld keys, "
                        "%lld bytes, %lld waits, %lld torch clients</p>",
                        job->round, job->restarts, job->max_restarts, job->nnodes, job->min_nodes,
                        job->max_nodes, job->world_size, job->keys, job->store_bytes,
                        job->store_waits, job->store_clients);
    progress(b, job);
    nodes_table(b, job, unix_now);
    failure(b, job, unix_now);
    history(b, job);
    dl__http_buf_puts(b, "</section>");
}

static void summary(dl__http_buf_t *b, const dl_proto_status_snapshot_t *s)
{
    dl__http_buf_puts(b, "<table class=\"jobs\"><tr><th>job</th><th>state</th><th>round</th>"
                         "<th>restarts</th><th>nodes</th><th>world</th><th>step</th>"
                         "<th>loss</th><th>samples/s</th></tr>");
    for (size_t i = 0; i < s->njobs; i++) {
        const job_t *j = &s->jobs[i];
        const point_t *last = last_point(j);
        dl__http_buf_puts(b, "<tr><td><a href=\"#job-");
        dl__http_buf_html(b, j->run_id);
        dl__http_buf_puts(b, "\">");
        dl__http_buf_html(b, j->run_id);
        dl__http_buf_puts(b, "</a></td><td><span class=\"state ");
        dl__http_buf_html(b, j->state);
        dl__http_buf_puts(b, "\">");
        dl__http_buf_html(b, j->state);
        dl__http_buf_printf(b,
                            "</span></td><td class=\"n\">%lld</td><td class=\"n\">%lld/%lld</td>"
                            "<td class=\"n\">%zu</td><td class=\"n\">%lld</td><td class=\"n\">",
                            j->round, j->restarts, j->max_restarts, j->nnodes, j->world_size);
        if (last != NULL)
            dl__http_buf_printf(b, "%lld", last->step);
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        if (last != NULL && last->has_loss)
            shortnum(b, last->loss);
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        if (last != NULL && last->has_samples_per_s)
            shortnum(b, last->samples_per_s);
        dl__http_buf_puts(b, "</td></tr>");
    }
    dl__http_buf_puts(b, "</table>");
}

void dl__http_page(dl__http_buf_t *b, const json_t *snap, const char *title, double unix_now,
                   int refresh)
{
    dl_proto_status_snapshot_t s = {0};
    char err[512];
    int bad = snap != NULL ? dl_proto_rec_decode(&dl_proto_status_snapshot_type, snap, &s,
                                                 "snapshot", err, sizeof(err))
                           : 0;

    dl__http_buf_printf(b,
                        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                        "<meta http-equiv=\"refresh\" content=\"%d\"><meta name=\"viewport\" "
                        "content=\"width=device-width\"><title>",
                        refresh);
    dl__http_buf_html(b, title);
    dl__http_buf_printf(b, " &#8212; %zu jobs</title><style>%s</style></head><body><header><h1>",
                        s.njobs, style);
    dl__http_buf_html(b, title);
    dl__http_buf_puts(b, "</h1><span>dlaunch ");
    dl__http_buf_html(b, s.version);
    if (s.server != NULL) {
        dl__http_buf_puts(b, " &#183; up ");
        duration(b, unix_now - s.server->started);
        dl__http_buf_printf(b, " &#183; %lld connections", s.server->connections);
    }
    dl__http_buf_puts(b, " &#183; as of ");
    clock_time(b, unix_now);
    dl__http_buf_puts(b, "</span></header><main>");
    if (snap == NULL) {
        dl__http_buf_puts(b, "<p>The rendezvous has not answered yet.</p>");
    } else if (bad < 0) {
        dl__http_buf_puts(b, "<p class=\"failure\">");
        dl__http_buf_html(b, err);
        dl__http_buf_puts(b, "</p>");
    } else if (s.njobs == 0) {
        dl__http_buf_puts(b, "<p class=\"muted\">No jobs.</p>");
    } else {
        summary(b, &s);
    }
    for (size_t i = 0; i < s.njobs; i++)
        job_section(b, &s.jobs[i], unix_now);
    dl__http_buf_printf(b,
                        "</main><footer>Reloads every %d s &#183; <a href=\"/api/jobs\">JSON</a> "
                        "&#183; <a href=\"/metrics\">metrics</a></footer></body></html>\n",
                        refresh);
    dl_proto_rec_free(&dl_proto_status_snapshot_type, &s);
}

void dl__http_refresh_ages(json_t *snap, double unix_now)
{
    size_t i, k;
    json_t *j, *n;
    json_array_foreach (json_object_get(snap, "jobs"), i, j) {
        json_array_foreach (json_object_get(j, "nodes"), k, n) {
            json_t *seen = json_object_get(n, "last_heartbeat");
            if (json_is_number(seen))
                json_object_set_new(n, "heartbeat_age",
                                    json_real(unix_now - json_number_value(seen)));
        }
    }
}
