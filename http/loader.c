/* http.h's server functions in the programs: dl_http_start loads dlaunch-http.so (and with it
 * libmicrohttpd) the first time a status server starts; the others forward to its table, and
 * run only on a server that start made. */
#include <errno.h>
#include <stdio.h>

#include "http-plugin.h"
#include "plugin.h"

static const dl_http_plugin_t *plugin;

static const dl_http_host_t host = {
    .server_snapshot = dl_rdzv_server_snapshot,
    .server_generation = dl_rdzv_server_generation,
    .peer_uid = dl_rdzv_peer_uid,
    .peer_trusted = dl_rdzv_peer_trusted,
};

int dl_http_start(uv_loop_t *loop, dl_rdzv_server_t *server, const dl_http_opts_t *opts,
                  dl_http_t **ret, char *err, size_t errlen)
{
    *ret = NULL;
    if (plugin == NULL) {
        char why[4600];
        void *entry;
        if (dl_plugin_load("http", DL_HTTP_PLUGIN_ENTRY, &entry, why, sizeof(why)) < 0) {
            snprintf(err, errlen, "the status server (libmicrohttpd) is not available: %s", why);
            return -ELIBACC;
        }
        plugin = ((dl_http_plugin_fn)entry)(&host);
    }
    return plugin->start(loop, server, opts, ret, err, errlen);
}

int dl_http_port(const dl_http_t *h)
{
    return plugin->port(h);
}

void dl_http_close(dl_http_t *h)
{
    if (h != NULL)
        plugin->close(h);
}
