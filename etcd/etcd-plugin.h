/* The boundary between dlaunch and its etcd plugin, dlaunch-etcd.so (client.c on libcurl): the
 * plugin's one exported function returns this table, and loader.c, linked into the programs,
 * defines etcd.h's client functions by forwarding to it. Program and plugin come from one
 * build; the name of the entry point carries the version of the table. */
#ifndef DL_ETCD_PLUGIN_H
#define DL_ETCD_PLUGIN_H

#include "etcd.h"

#define DL_ETCD_PLUGIN_ENTRY "dl_etcd_plugin_v1"

typedef struct {
    int (*new_client)(uv_loop_t *loop, const dl_etcd_opts_t *opts, dl_etcd_t **ret, char *err,
                      size_t errlen);
    void (*close)(dl_etcd_t *e);
    const char *(*endpoints)(const dl_etcd_t *e);
    int (*call)(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb cb, void *ctx,
                dl_etcd_req_t **ret);
    int (*stream)(dl_etcd_t *e, const char *path, json_t *body, dl_etcd_cb on_msg, dl_etcd_cb done,
                  void *ctx, dl_etcd_req_t **ret);
    void (*cancel)(dl_etcd_req_t *r);
    dl_etcd_status_t (*call_sync)(dl_etcd_t *e, const char *path, json_t *body, json_t **ret_body,
                                  char *err, size_t errlen);
} dl_etcd_plugin_t;

typedef const dl_etcd_plugin_t *(*dl_etcd_plugin_fn)(void);

const dl_etcd_plugin_t *dl_etcd_plugin_v1(void);

#endif
