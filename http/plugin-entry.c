/* The one symbol dlaunch-http.so exports (http-plugin.h), and the four rendezvous functions the
 * plugin's code calls, answered by the program that loaded it. */
#include "http-plugin.h"

static const dl_http_host_t *host;

int dl_rdzv_server_snapshot(dl_rdzv_server_t *s, json_t **ret_snapshot)
{
    return host->server_snapshot(s, ret_snapshot);
}

uint64_t dl_rdzv_server_generation(const dl_rdzv_server_t *s)
{
    return host->server_generation(s);
}

int dl_rdzv_peer_trusted(int *nlfd, int fd)
{
    return host->peer_trusted(nlfd, fd);
}

int dl_rdzv_peer_uid(int *nlfd, int fd, uid_t *ret_uid)
{
    return host->peer_uid(nlfd, fd, ret_uid);
}

__attribute__((visibility("default"))) const dl_http_plugin_t *
dl_http_plugin_v1(const dl_http_host_t *h)
{
    static const dl_http_plugin_t table = {
        .start = dl_http_start,
        .port = dl_http_port,
        .close = dl_http_close,
    };
    host = h;
    return &table;
}
