/* The status page at /: one HTML document written from the snapshot, with its style inline and
 * its charts as inline SVG drawn here, so it needs no script, no framework and nothing from
 * another host, and reloads itself with a meta refresh. Everything an agent or a worker wrote
 * (hosts, reasons, log tails) is escaped. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

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

static const char *str(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s != NULL ? s : "";
}

static long long integer(const json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
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

/* A line chart of the progress points' yfield against xfield ("time" or "step"), as an inline
 * SVG with its range written at the corners. Points without the field are skipped. */
static void chart(dl__http_buf_t *b, const json_t *points, const char *xfield, const char *yfield,
                  const char *caption, const char *cls)
{
    enum { W = 300, H = 110, L = 6, R = 6, T = 16, B = 16 };
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY, last = NAN;
    size_t i, n = 0;
    json_t *p;

    json_array_foreach (points, i, p) {
        json_t *x = json_object_get(p, xfield), *y = json_object_get(p, yfield);
        if (!json_is_number(x) || !json_is_number(y))
            continue;
        double xv = json_number_value(x), yv = json_number_value(y);
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
    json_array_foreach (points, i, p) {
        json_t *x = json_object_get(p, xfield), *y = json_object_get(p, yfield);
        if (!json_is_number(x) || !json_is_number(y))
            continue;
        if (json_number_value(x) < prev && open) {
            dl__http_buf_puts(b, "\"/>");
            open = false;
        }
        if (!open)
            dl__http_buf_puts(b, "<polyline fill=\"none\" stroke=\"#2563eb\" "
                                 "stroke-width=\"1.5\" points=\"");
        open = true;
        prev = json_number_value(x);
        double px = L + (json_number_value(x) - xmin) / (xmax - xmin) * (W - L - R);
        double py = T + (ymax - json_number_value(y)) / (ymax - ymin) * (H - T - B);
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
    if (strcmp(xfield, "time") == 0) {
        dl__http_buf_puts(b, "last ");
        duration(b, xmax - xmin);
    } else {
        dl__http_buf_printf(b, "%s %.0f&#8211;%.0f", xfield, xmin, xmax);
    }
    dl__http_buf_printf(b, "</text></svg><figcaption>%s: <b>", caption);
    shortnum(b, last);
    dl__http_buf_puts(b, "</b></figcaption></figure>");
}

/* The first global rank of each node follows from the node ranks: nodes take consecutive blocks
 * of ranks in node-rank order, each as many as its slots. */
static long long first_rank(const json_t *nodes, long long node_rank)
{
    long long first = 0;
    size_t i;
    json_t *n;
    json_array_foreach (nodes, i, n) {
        long long r = integer(n, "node_rank");
        if (r >= 0 && r < node_rank)
            first += integer(n, "slots");
    }
    return first;
}

static void nodes_table(dl__http_buf_t *b, const json_t *job, double unix_now)
{
    const json_t *nodes = json_object_get(job, "nodes");
    size_t i;
    json_t *n;

    if (json_array_size(nodes) == 0) {
        dl__http_buf_puts(b, "<p class=\"muted\">No node has joined this round yet.</p>");
        return;
    }
    dl__http_buf_puts(b, "<table class=\"nodes\"><tr><th>node</th><th>host</th><th>node rank</th>"
                         "<th>ranks</th><th>heartbeat</th><th>state</th></tr>");
    json_array_foreach (nodes, i, n) {
        if (i == NODES_SHOWN) {
            dl__http_buf_printf(b,
                                "<tr><td colspan=\"6\" class=\"muted\">and %zu more: see "
                                "<a href=\"/api/jobs/",
                                json_array_size(nodes) - NODES_SHOWN);
            dl__http_buf_html(b, str(job, "run_id"));
            dl__http_buf_puts(b, "\">the API</a></td></tr>");
            break;
        }
        long long rank = integer(n, "node_rank"), slots = integer(n, "slots");
        bool connected = json_is_true(json_object_get(n, "connected"));
        bool left = json_is_true(json_object_get(n, "left"));
        dl__http_buf_puts(b, "<tr class=\"node\"><td>");
        dl__http_buf_html(b, str(n, "node_id"));
        dl__http_buf_puts(b, "</td><td>");
        dl__http_buf_html(b, str(n, "host"));
        if (rank >= 0) {
            long long first = first_rank(nodes, rank);
            dl__http_buf_printf(b, "</td><td class=\"n\">%lld</td><td class=\"n\">%lld", rank,
                                first);
            if (slots > 1)
                dl__http_buf_printf(b, "&#8211;%lld", first + slots - 1);
        } else {
            dl__http_buf_printf(b, "</td><td class=\"n\">&#8211;</td><td class=\"n\">%lld slots",
                                slots);
        }
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        duration(b, unix_now - json_number_value(json_object_get(n, "last_heartbeat")));
        dl__http_buf_printf(b, " ago</td><td class=\"%s\">%s</td></tr>",
                            left        ? "muted"
                            : connected ? "up"
                                        : "down",
                            left        ? "done"
                            : connected ? "up"
                                        : "disconnected");
    }
    dl__http_buf_puts(b, "</table>");
}

static void failure(dl__http_buf_t *b, const json_t *job, double unix_now)
{
    const json_t *f = json_object_get(job, "last_failure");
    if (f == NULL) {
        if (*str(job, "failure") != '\0') {
            dl__http_buf_puts(b, "<div class=\"failure\"><h3>First failure</h3><p>");
            dl__http_buf_html(b, str(job, "failure"));
            dl__http_buf_puts(b, "</p></div>");
        }
        return;
    }
    dl__http_buf_puts(b, "<div class=\"failure\"><h3>Last failure</h3><p>");
    clock_time(b, json_number_value(json_object_get(f, "time")));
    dl__http_buf_puts(b, " (");
    duration(b, unix_now - json_number_value(json_object_get(f, "time")));
    dl__http_buf_printf(b, " ago), round %lld: <b>rank %lld</b>", integer(f, "round"),
                        integer(f, "rank"));
    if (json_object_get(f, "local_rank") != NULL)
        dl__http_buf_printf(b, " (local rank %lld)", integer(f, "local_rank"));
    dl__http_buf_puts(b, " on the node at ");
    dl__http_buf_html(b, str(f, "peer"));
    if (json_object_get(f, "signal") != NULL)
        dl__http_buf_printf(b, ", killed by signal %lld", integer(f, "signal"));
    else
        dl__http_buf_printf(b, ", exit code %lld", integer(f, "exit_code"));
    if (*str(f, "reason") != '\0') {
        dl__http_buf_puts(b, ": ");
        dl__http_buf_html(b, str(f, "reason"));
    }
    dl__http_buf_puts(b, "</p>");
    if (*str(f, "log_tail") != '\0') {
        dl__http_buf_puts(b, "<pre class=\"tail\">");
        dl__http_buf_html(b, str(f, "log_tail"));
        dl__http_buf_puts(b, "</pre>");
    }
    dl__http_buf_puts(b, "</div>");
}

static void history(dl__http_buf_t *b, const json_t *job)
{
    const json_t *h = json_object_get(job, "history"), *log = json_object_get(job, "log");
    size_t i;
    json_t *e;

    if (json_array_size(h) > 0) {
        dl__http_buf_printf(b,
                            "<details><summary>Restarts (%zu shown)</summary><table><tr>"
                            "<th>time</th><th>round</th><th>reason</th><th>what</th></tr>",
                            json_array_size(h));
        json_array_foreach (h, i, e) {
            dl__http_buf_puts(b, "<tr><td>");
            clock_time(b, json_number_value(json_object_get(e, "time")));
            dl__http_buf_printf(b, "</td><td class=\"n\">%lld</td><td>", integer(e, "round"));
            dl__http_buf_html(b, str(e, "cause"));
            dl__http_buf_puts(b, "</td><td>");
            dl__http_buf_html(b, str(e, "reason"));
            dl__http_buf_puts(b, "</td></tr>");
        }
        dl__http_buf_puts(b, "</table></details>");
    }
    if (json_array_size(log) > 0) {
        dl__http_buf_puts(b, "<details><summary>Rendezvous log</summary><pre>");
        json_array_foreach (log, i, e) {
            clock_time(b, json_number_value(json_object_get(e, "time")));
            dl__http_buf_puts(b, " ");
            dl__http_buf_html(b, str(e, "level"));
            dl__http_buf_puts(b, ": ");
            dl__http_buf_html(b, str(e, "text"));
            dl__http_buf_puts(b, "\n");
        }
        dl__http_buf_puts(b, "</pre></details>");
    }
}

static const json_t *last_point(const json_t *job)
{
    const json_t *ring = json_object_get(job, "progress");
    return json_array_get(ring, json_array_size(ring) - 1);
}

static void progress(dl__http_buf_t *b, const json_t *job)
{
    const json_t *points = json_object_get(job, "progress"), *last = last_point(job);
    if (last == NULL)
        return;
    dl__http_buf_printf(b, "<p class=\"progress\">Training: step <b>%lld</b>",
                        integer(last, "step"));
    if (json_is_number(json_object_get(last, "loss"))) {
        dl__http_buf_puts(b, ", loss <b>");
        shortnum(b, json_number_value(json_object_get(last, "loss")));
        dl__http_buf_puts(b, "</b>");
    }
    if (json_is_number(json_object_get(last, "samples_per_s"))) {
        dl__http_buf_puts(b, ", <b>");
        shortnum(b, json_number_value(json_object_get(last, "samples_per_s")));
        dl__http_buf_puts(b, "</b> samples/s");
    }
    dl__http_buf_puts(b, "</p><div class=\"charts\">");
    chart(b, points, "step", "loss", "loss by step", "loss");
    chart(b, points, "time", "samples_per_s", "samples/s", "rate");
    chart(b, points, "time", "step", "step", "steps");
    dl__http_buf_puts(b, "</div>");
}

static void job_section(dl__http_buf_t *b, const json_t *job, double unix_now)
{
    const char *id = str(job, "run_id"), *state = str(job, "state");

    dl__http_buf_puts(b, "<section class=\"job\" id=\"job-");
    dl__http_buf_html(b, id);
    dl__http_buf_puts(b, "\"><h2>");
    dl__http_buf_html(b, id);
    dl__http_buf_puts(b, " <span class=\"state ");
    dl__http_buf_html(b, state);
    dl__http_buf_puts(b, "\">");
    dl__http_buf_html(b, state);
    dl__http_buf_printf(
        b,
        "</span></h2><p>round %lld &#183; restarts %lld of %lld &#183; %zu "
        "nodes (%lld:%lld) &#183; world size %lld &#183; store: %lld keys, "
        "%lld bytes, %lld waits, %lld torch clients</p>",
        integer(job, "round"), integer(job, "restarts"), integer(job, "max_restarts"),
        json_array_size(json_object_get(job, "nodes")), integer(job, "min_nodes"),
        integer(job, "max_nodes"), integer(job, "world_size"), integer(job, "keys"),
        integer(job, "store_bytes"), integer(job, "store_waits"), integer(job, "store_clients"));
    progress(b, job);
    nodes_table(b, job, unix_now);
    failure(b, job, unix_now);
    history(b, job);
    dl__http_buf_puts(b, "</section>");
}

static void summary(dl__http_buf_t *b, const json_t *jobs)
{
    size_t i;
    json_t *j;

    dl__http_buf_puts(b, "<table class=\"jobs\"><tr><th>job</th><th>state</th><th>round</th>"
                         "<th>restarts</th><th>nodes</th><th>world</th><th>step</th>"
                         "<th>loss</th><th>samples/s</th></tr>");
    json_array_foreach (jobs, i, j) {
        const json_t *last = last_point(j);
        dl__http_buf_puts(b, "<tr><td><a href=\"#job-");
        dl__http_buf_html(b, str(j, "run_id"));
        dl__http_buf_puts(b, "\">");
        dl__http_buf_html(b, str(j, "run_id"));
        dl__http_buf_puts(b, "</a></td><td><span class=\"state ");
        dl__http_buf_html(b, str(j, "state"));
        dl__http_buf_puts(b, "\">");
        dl__http_buf_html(b, str(j, "state"));
        dl__http_buf_printf(b,
                            "</span></td><td class=\"n\">%lld</td><td class=\"n\">%lld/%lld</td>"
                            "<td class=\"n\">%zu</td><td class=\"n\">%lld</td><td class=\"n\">",
                            integer(j, "round"), integer(j, "restarts"), integer(j, "max_restarts"),
                            json_array_size(json_object_get(j, "nodes")), integer(j, "world_size"));
        if (last != NULL)
            dl__http_buf_printf(b, "%lld", integer(last, "step"));
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        if (json_is_number(json_object_get(last, "loss")))
            shortnum(b, json_number_value(json_object_get(last, "loss")));
        dl__http_buf_puts(b, "</td><td class=\"n\">");
        if (json_is_number(json_object_get(last, "samples_per_s")))
            shortnum(b, json_number_value(json_object_get(last, "samples_per_s")));
        dl__http_buf_puts(b, "</td></tr>");
    }
    dl__http_buf_puts(b, "</table>");
}

void dl__http_page(dl__http_buf_t *b, const json_t *snap, const char *title, double unix_now,
                   int refresh)
{
    const json_t *jobs = json_object_get(snap, "jobs");
    const json_t *srv = json_object_get(snap, "server");
    size_t i;
    json_t *j;

    dl__http_buf_printf(b,
                        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
                        "<meta http-equiv=\"refresh\" content=\"%d\"><meta name=\"viewport\" "
                        "content=\"width=device-width\"><title>",
                        refresh);
    dl__http_buf_html(b, title);
    dl__http_buf_printf(b, " &#8212; %zu jobs</title><style>%s</style></head><body><header><h1>",
                        json_array_size(jobs), style);
    dl__http_buf_html(b, title);
    dl__http_buf_puts(b, "</h1><span>dlaunch ");
    dl__http_buf_html(b, json_string_value(json_object_get(snap, "version")));
    if (srv != NULL) {
        dl__http_buf_puts(b, " &#183; up ");
        duration(b, unix_now - json_number_value(json_object_get(srv, "started")));
        dl__http_buf_printf(b, " &#183; %lld connections",
                            (long long)json_integer_value(json_object_get(srv, "connections")));
    }
    dl__http_buf_puts(b, " &#183; as of ");
    clock_time(b, unix_now);
    dl__http_buf_puts(b, "</span></header><main>");
    if (snap == NULL)
        dl__http_buf_puts(b, "<p>The rendezvous has not answered yet.</p>");
    else if (json_array_size(jobs) == 0)
        dl__http_buf_puts(b, "<p class=\"muted\">No jobs.</p>");
    else
        summary(b, jobs);
    json_array_foreach (jobs, i, j) {
        job_section(b, j, unix_now);
    }
    dl__http_buf_printf(b,
                        "</main><footer>Reloads every %d s &#183; <a href=\"/api/jobs\">JSON</a> "
                        "&#183; <a href=\"/metrics\">metrics</a></footer></body></html>\n",
                        refresh);
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
