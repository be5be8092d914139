/* --http for either backend: the status page and metrics of the rendezvous state this agent
 * holds (the TCP backend's hosted server, or the etcd backend's view of the job). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "http.h"
#include "rdzv-backend.h"

int dl__rdzv_http_start(const dl_rdzv_backend_conf_t *conf, dl_rdzv_server_t *server,
                        dl_http_t **http, char *url, size_t url_len, char *err, size_t err_len)
{
    dl_http_opts_t ho;
    char host[256], why[512], title[300];
    int port, r;

    if (dl_rdzv_listen_parse(conf->spec->http, host, sizeof(host), &port) < 0) {
        snprintf(err, err_len, "--http: '%s' is not ADDR:PORT", conf->spec->http);
        return -EINVAL;
    }
    snprintf(title, sizeof(title), "dlaunch %s", conf->run_id);
    dl_http_opts_init(&ho);
    ho.host = host;
    ho.port = port;
    ho.token = conf->token;
    ho.title = title;
    r = dl_http_start(conf->loop, server, &ho, http, why, sizeof(why));
    if (r < 0) {
        snprintf(err, err_len, "--http: %s", why);
        return r;
    }
    /* An IPv6 address is bracketed in a URL. */
    bool v6 = strchr(host, ':') != NULL;
    snprintf(url, url_len, "http://%s%s%s:%d/", v6 ? "[" : "", host, v6 ? "]" : "",
             dl_http_port(*http));
    return 0;
}
