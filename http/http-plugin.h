/* The boundary between dlaunch and its status-server plugin, dlaunch-http.so (buf.c, httpd.c,
 * metrics.c, page.c on libmicrohttpd): the plugin's one exported function takes the program's
 * functions it calls back (plugin-entry.c defines rendezvous.h's four for the plugin's code) and returns
 * the table that loader.c forwards http.h's functions to. Program and plugin come from one
 * build; the name of the entry point carries the version of the tables. */
#ifndef DL_HTTP_PLUGIN_H
#define DL_HTTP_PLUGIN_H

#include "http.h"

#define DL_HTTP_PLUGIN_ENTRY "dl_http_plugin_v1"

/* What the plugin calls in the program: the rendezvous server lives there. */
typedef struct {
    int (*server_snapshot)(dl_rdzv_server_t *s, json_t **ret_snapshot);
    uint64_t (*server_generation)(const dl_rdzv_server_t *s);
    /* Who holds a loopback connection (a token-less server serves its own user alone). */
    int (*peer_uid)(int *nlfd, int fd, uid_t *ret_uid);
    int (*peer_trusted)(int *nlfd, int fd);
} dl_http_host_t;

typedef struct {
    int (*start)(uv_loop_t *loop, dl_rdzv_server_t *server, const dl_http_opts_t *opts,
                 dl_http_t **ret, char *err, size_t errlen);
    int (*port)(const dl_http_t *h);
    void (*close)(dl_http_t *h);
} dl_http_plugin_t;

typedef const dl_http_plugin_t *(*dl_http_plugin_fn)(const dl_http_host_t *host);

const dl_http_plugin_t *dl_http_plugin_v1(const dl_http_host_t *host);

#endif
