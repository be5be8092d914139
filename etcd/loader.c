/* etcd.h's client functions in the programs: dl_etcd_new loads dlaunch-etcd.so (and with it
 * libcurl) the first time a client is made; the others forward to its table. A client exists
 * only once that load succeeded, so they never run without it. */
#include <errno.h>
#include <stdio.h>

#include "etcd-plugin.h"
#include "plugin.h"

static const dl_etcd_plugin_t *plugin;

int dl_etcd_new(uv_loop_t *loop, const dl_etcd_opts_t *opts, dl_etcd_t **ret, char *err,
                size_t errlen)
{
    *ret = NULL;
    if (plugin == NULL) {
        char why[4600];
        void *entry;
        if (dl_plugin_load("etcd", DL_ETCD_PLUGIN_ENTRY, &entry, why, sizeof(why)) < 0) {
            snprintf(err, errlen, "the etcd client (libcurl) is not available: %s", why);
            return -ELIBACC;
        }
        plugin = ((dl_etcd_plugin_fn)entry)();
    }
    return plugin->new_client(loop, opts, ret, err, errlen);
}

void dl_etcd_close(dl_etcd_t *e)
{
    if (e != NULL)
        plugin->close(e);
}

const char *dl_etcd_endpoints(const dl_etcd_t *e)
{
    return plugin->endpoints(e);
}

int dl_etcd_call(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb, void *ctx,
                 dl_etcd_req_t **ret)
{
    return plugin->call(e, path, body, cb, ctx, ret);
}

int dl_etcd_stream(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb on_msg, dl_etcd_cb done,
                   void *ctx, dl_etcd_req_t **ret)
{
    return plugin->stream(e, path, body, on_msg, done, ctx, ret);
}

void dl_etcd_cancel(dl_etcd_req_t *r)
{
    if (r != NULL)
        plugin->cancel(r);
}

dl_etcd_status_t dl_etcd_call_sync(dl_etcd_t *e, const char *path, json_t *body, json_t **ret_body,
                                   char *err, size_t errlen)
{
    return plugin->call_sync(e, path, body, ret_body, err, errlen);
}
