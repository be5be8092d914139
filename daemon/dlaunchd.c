/* dlaunchd: the standalone rendezvous, serving many jobs at once (each keyed by its run id).
 *
 *   dlaunchd [--listen ADDR:PORT] [--token-file FILE] [--http ADDR:PORT] [--revocations FILE]
 *            [limits] [--verbose]
 *
 * Agents point at it with --rdzv-endpoint; control commands (dlaunch status|stop|restart) with
 * --endpoint; Prometheus and people at --http. Without a token it serves loopback only.
 * SIGINT/SIGTERM stop it. The options are daemon/options.c's table. */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "config.h"
#include "http.h"
#include "options.h"
#include "rendezvous.h"

static int verbose;

/* The server's texts are one printable line already; run ids are checked as they arrive. */
static void on_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    if (level >= DL_RDZV_LOG_INFO || verbose)
        fprintf(stderr, "[dlaunchd%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

typedef struct {
    dl_rdzv_server_t *server;
    dl_http_t *http;
    uv_signal_t sig[2];
} daemon_t;

static void on_signal(uv_signal_t *h, int signum)
{
    daemon_t *d = h->data;
    fprintf(stderr, "[dlaunchd] got %s: shutting down\n", signum == SIGINT ? "SIGINT" : "SIGTERM");
    dl_http_close(d->http);
    d->http = NULL;
    dl_rdzv_server_close(d->server, NULL, NULL);
    for (int i = 0; i < 2; i++)
        if (!uv_is_closing((uv_handle_t *)&d->sig[i]))
            uv_close((uv_handle_t *)&d->sig[i], NULL);
}

/* Thousands of agents need thousands of descriptors: take what the hard limit allows. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    char host[256], http_host[256], err[512], http_at[300] = "";
    int port, http_port = 0;
    dl_proto_token_t *token = NULL;
    dl_daemon_args_t args;
    dl_daemon_action_t action;

    /* A frame that arrives in pieces is buffered, up to 1 MiB a connection, and freed when it ends.
     * glibc raises its mmap threshold after such frees, so later buffers come from the heap and
     * stay resident once freed; a fixed threshold keeps every large buffer mmapped, handed back to
     * the kernel the moment its frame is done, so a flood leaves a long-lived daemon no bigger. */
    if (mallopt(M_MMAP_THRESHOLD, 128 * 1024) != 1)
        fprintf(stderr, "dlaunchd: warning: mallopt(M_MMAP_THRESHOLD) refused; memory freed after "
                        "a flood of large frames may stay resident\n");
    dl_daemon_args_init(&args);
    if (dl_daemon_parse(argc, argv, &args, &action, err, sizeof(err)) < 0) {
        fprintf(stderr, "dlaunchd: %s\n", err);
        return 2;
    }
    if (action == DL_DAEMON_HELP) {
        dl_daemon_print_help(stdout);
        return 0;
    }
    if (action == DL_DAEMON_VERSION) {
        printf("dlaunchd %s\n", DL_VERSION);
        return 0;
    }
    verbose = args.verbose;
    dl_rdzv_server_opts_t so;
    dl_rdzv_server_opts_init(&so);
    long n;
    double secs;
    if (args.max_memory != NULL) {
        if (dl_parse_int(args.max_memory, 1, 1L << 30, &n) < 0) {
            fprintf(stderr, "dlaunchd: --max-memory: '%s' is not a number of MiB\n",
                    args.max_memory);
            return 2;
        }
        so.core.max_memory = (size_t)n << 20;
    }
    if (args.max_jobs != NULL) {
        if (dl_parse_int(args.max_jobs, 1, 1L << 24, &n) < 0) {
            fprintf(stderr, "dlaunchd: --max-jobs: '%s' is not a count of jobs\n", args.max_jobs);
            return 2;
        }
        so.core.max_jobs = (size_t)n;
    }
    if (args.max_jobs_per_peer != NULL) {
        if (dl_parse_int(args.max_jobs_per_peer, 1, 1L << 24, &n) < 0) {
            fprintf(stderr, "dlaunchd: --max-jobs-per-peer: '%s' is not a count of jobs\n",
                    args.max_jobs_per_peer);
            return 2;
        }
        so.core.max_jobs_per_creator = (size_t)n;
    }
    if (args.max_timeout != NULL) {
        if (dl_parse_double(args.max_timeout, 0.001, 1e7, &secs) < 0) {
            fprintf(stderr, "dlaunchd: --max-timeout: '%s' is not a number of seconds\n",
                    args.max_timeout);
            return 2;
        }
        so.core.max_timeout = secs;
    }
    if (args.idle_timeout != NULL) {
        if (dl_parse_double(args.idle_timeout, 0.001, 1e7, &secs) < 0) {
            fprintf(stderr, "dlaunchd: --idle-timeout: '%s' is not a number of seconds\n",
                    args.idle_timeout);
            return 2;
        }
        so.idle_timeout = secs;
    }
    if (args.frame_timeout != NULL) {
        if (dl_parse_double(args.frame_timeout, 0.001, 1e7, &secs) < 0) {
            fprintf(stderr, "dlaunchd: --frame-timeout: '%s' is not a number of seconds\n",
                    args.frame_timeout);
            return 2;
        }
        so.frame_timeout = secs;
    }
    if (args.linger != NULL) {
        if (dl_parse_double(args.linger, 0, 1e7, &secs) < 0) {
            fprintf(stderr, "dlaunchd: --linger: '%s' is not a number of seconds\n", args.linger);
            return 2;
        }
        so.core.job_defaults.linger = secs;
    }
    if (dl_rdzv_listen_parse(args.listen, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "dlaunchd: --listen: '%s' is not ADDR:PORT\n", args.listen);
        return 2;
    }
    if (args.http != NULL &&
        dl_rdzv_listen_parse(args.http, http_host, sizeof(http_host), &http_port) < 0) {
        fprintf(stderr, "dlaunchd: --http: '%s' is not ADDR:PORT\n", args.http);
        return 2;
    }
    int r = dl_proto_token_load(args.token_file, getenv("DLAUNCH_TOKEN"), &token, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunchd: %s\n", err);
        return 2;
    }
    raise_fd_limit();
    signal(SIGPIPE, SIG_IGN);

    uv_loop_t *loop = uv_default_loop();
    dl_rdzv_server_t *server;
    so.host = host;
    so.port = port;
    so.token = token;
    so.log = on_log;
    /* Each job's workers' store in torch's protocol too, on a port of its own (docs/store.md). */
    so.torch_jobs = true;
    so.revocations_file = args.revocations;
    r = dl_rdzv_server_start(loop, &so, &server, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunchd: %s\n", err);
        dl_proto_token_free(token);
        return r == -EPERM || r == -EINVAL ? 2 : 1;
    }
    daemon_t d = {.server = server};
    if (args.http != NULL) {
        dl_http_opts_t ho;
        dl_http_opts_init(&ho);
        ho.host = http_host;
        ho.port = http_port;
        ho.token = token;
        ho.title = "dlaunchd";
        r = dl_http_start(loop, server, &ho, &d.http, err, sizeof(err));
        if (r < 0) {
            fprintf(stderr, "dlaunchd: --http: %s\n", err);
            dl_rdzv_server_close(server, NULL, NULL);
            uv_run(loop, UV_RUN_DEFAULT);
            uv_loop_close(loop);
            dl_proto_token_free(token);
            /* -ELIBACC: libmicrohttpd or the plugin is missing, a setup error like a bad flag. */
            return r == -EPERM || r == -EINVAL || r == -ELIBACC ? 2 : 1;
        }
        snprintf(http_at, sizeof(http_at), "; http://%s%s%s:%d/", strchr(http_host, ':') ? "[" : "",
                 http_host, strchr(http_host, ':') ? "]" : "", dl_http_port(d.http));
    }
    /* One line, so that tests and scripts can read both ports from it. */
    fprintf(stderr, "[dlaunchd] serving %s:%d%s%s\n", host, dl_rdzv_server_port(server),
            token ? " (job token required)" : "", http_at);
    static const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        uv_signal_init(loop, &d.sig[i]);
        d.sig[i].data = &d;
        uv_signal_start(&d.sig[i], on_signal, sigs[i]);
    }
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    dl_proto_token_free(token);
    return 0;
}
