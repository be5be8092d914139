/* Shared between the files of http/: the text buffer the pages are written into, and the
 * renderers, each a pure function of a snapshot (docs/operations.md) and the time. */
#ifndef DL_HTTP_INTERNAL_H
#define DL_HTTP_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growing text buffer. Appends never fail: running out of memory sets oom, drops what follows
 * and leaves p NULL-terminated, so a renderer checks once at the end. */
typedef struct {
    char *p;
    size_t len;
    size_t cap;
    bool oom;
} dl__http_buf_t;

void dl__http_buf_put(dl__http_buf_t *b, const char *s, size_t n);
void dl__http_buf_puts(dl__http_buf_t *b, const char *s);
void dl__http_buf_printf(dl__http_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* s escaped for HTML text and attribute values. */
void dl__http_buf_html(dl__http_buf_t *b, const char *s);
/* s escaped for a Prometheus label value (backslash, double quote, newline). */
void dl__http_buf_label(dl__http_buf_t *b, const char *s);
/* A number as Prometheus writes floats: NaN, +Inf, -Inf or the shortest exact form. */
void dl__http_buf_float(dl__http_buf_t *b, double v);
/* Gives up the text (the caller frees it); the buffer is left empty. NULL after oom. */
char *dl__http_buf_take(dl__http_buf_t *b, size_t *ret_len);
void dl__http_buf_free(dl__http_buf_t *b);

/* What the HTTP thread counts of itself, for /metrics. */
typedef struct {
    uint64_t requests[4]; /* by handler: DL__HTTP_PAGE, DL__HTTP_METRICS, DL__HTTP_API, other */
    uint64_t unauthorized;
    double snapshot_time; /* Unix time of the snapshot being served */
} dl__http_counters_t;

enum { DL__HTTP_PAGE = 0, DL__HTTP_METRICS, DL__HTTP_API, DL__HTTP_OTHER };
#define DL__HTTP_ROUTE_METHOD (-1)

/* What a request of method for url asks for: DL__HTTP_PAGE, _METRICS, _API, _OTHER (not
 * found), or DL__HTTP_ROUTE_METHOD for a method other than GET and HEAD. */
int dl__http_route(const char *method, const char *url);

/* Whether a Host header names a loopback server ("localhost", 127.x.x.x or [::1], with or
 * without a port): anything else to a loopback server is a page that rebound its own name to
 * 127.0.0.1 (DNS rebinding), to read us from the browser of our own user. */
bool dl__http_host_is_loopback(const char *host);

/* Prometheus text exposition format 0.0.4 of the snapshot, the HTTP layer's own counters and
 * this process's CPU and memory, read now. */
void dl__http_metrics(dl__http_buf_t *b, const json_t *snap, const dl__http_counters_t *hc,
                      double unix_now);

/* The status page: every job with its nodes, restarts, last failure and progress charts. It
 * reloads itself every refresh seconds; no script, nothing fetched from elsewhere. */
void dl__http_page(dl__http_buf_t *b, const json_t *snap, const char *title, double unix_now,
                   int refresh);

/* Brings the snapshot's heartbeat ages up to unix_now (from each node's last_heartbeat). */
void dl__http_refresh_ages(json_t *snap, double unix_now);

#endif
