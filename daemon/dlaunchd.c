/* dlaunchd: the standalone rendezvous, serving many jobs at once (each keyed by its run id).
 *
 *   dlaunchd [--listen ADDR:PORT] [--token-file FILE] [--verbose]
 *
 * Agents point at it with --rdzv-endpoint; control commands (dlaunch status|stop|restart) with
 * --endpoint. Without a token it serves loopback only. SIGINT/SIGTERM stop it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "rendezvous.h"

static int verbose;

static void on_log(void *ctx, dl_rdzv_log_level_t level, const char *run_id, const char *text)
{
    if (level >= DL_RDZV_LOG_INFO || verbose)
        fprintf(stderr, "[dlaunchd%s%s] %s\n", run_id ? " " : "", run_id ? run_id : "", text);
}

typedef struct {
    dl_rdzv_server_t *server;
    uv_signal_t sig[2];
} daemon_t;

static void on_signal(uv_signal_t *h, int signum)
{
    daemon_t *d = h->data;
    fprintf(stderr, "[dlaunchd] got %s: shutting down\n", signum == SIGINT ? "SIGINT" : "SIGTERM");
    dl_rdzv_server_close(d->server, NULL, NULL);
    for (int i = 0; i < 2; i++)
        if (!uv_is_closing((uv_handle_t *)&d->sig[i]))
            uv_close((uv_handle_t *)&d->sig[i], NULL);
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: dlaunchd [--listen ADDR:PORT] [--token-file FILE] [--verbose]\n"
               "  --listen ADDR:PORT   where to serve (default 127.0.0.1:29400; port 0: a free one,\n"
               "                       printed on start; a non-loopback address needs a token)\n"
               "  --token-file FILE    the job token (mode 0600); DLAUNCH_TOKEN also works\n"
               "  -v, --verbose        log every rendezvous step\n");
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
    const char *listen = "127.0.0.1:29400", *token_file = NULL;
    char host[256], err[512];
    int port;
    dl_proto_token_t *token = NULL;

    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "--listen") == 0 || strcmp(argv[i], "--token-file") == 0) &&
            i + 1 >= argc) {
            fprintf(stderr, "dlaunchd: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--listen") == 0)
            listen = argv[++i];
        else if (strcmp(argv[i], "--token-file") == 0)
            token_file = argv[++i];
        else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0)
            verbose = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "dlaunchd: unknown argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (dl_rdzv_listen_parse(listen, host, sizeof(host), &port) < 0) {
        fprintf(stderr, "dlaunchd: --listen: '%s' is not ADDR:PORT\n", listen);
        return 2;
    }
    int r = dl_proto_token_load(token_file, getenv("DLAUNCH_TOKEN"), &token, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunchd: %s\n", err);
        return 2;
    }
    raise_fd_limit();
    signal(SIGPIPE, SIG_IGN);

    uv_loop_t *loop = uv_default_loop();
    dl_rdzv_server_opts_t so;
    dl_rdzv_server_t *server;
    dl_rdzv_server_opts_init(&so);
    so.host = host;
    so.port = port;
    so.token = token;
    so.log = on_log;
    r = dl_rdzv_server_start(loop, &so, &server, err, sizeof(err));
    if (r < 0) {
        fprintf(stderr, "dlaunchd: %s\n", err);
        dl_proto_token_free(token);
        return r == -EPERM || r == -EINVAL ? 2 : 1;
    }
    fprintf(stderr, "[dlaunchd] serving %s:%d%s\n", host, dl_rdzv_server_port(server),
            token ? " (job token required)" : "");
    daemon_t d = {.server = server};
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
