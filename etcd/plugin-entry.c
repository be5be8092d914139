/* The one symbol dlaunch-etcd.so exports (etcd-plugin.h): client.c's functions, as a table. */
#include "etcd-plugin.h"

__attribute__((visibility("default"))) const dl_etcd_plugin_t *dl_etcd_plugin_v1(void)
{
    static const dl_etcd_plugin_t table = {
        .new_client = dl_etcd_new,
        .close = dl_etcd_close,
        .endpoints = dl_etcd_endpoints,
        .call = dl_etcd_call,
        .stream = dl_etcd_stream,
        .cancel = dl_etcd_cancel,
        .call_sync = dl_etcd_call_sync,
    };
    return &table;
}
