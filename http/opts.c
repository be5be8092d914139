/* The status server's defaults (http.h): in the programs, not the plugin, so that filling them in
 * loads nothing. */
#include <string.h>

#include "http.h"

void dl_http_opts_init(dl_http_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->host = "127.0.0.1";
    opts->interval = 0.5;
    opts->title = "dlaunch";
}
