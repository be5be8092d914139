/* libFuzzer target for what the HTTP side does with a request (http/): the route of a method and
 * URL, the Host check against DNS rebinding, and the page, /metrics and /api renderers over a
 * snapshot, whose names and reasons come from agents and workers. The input is
 * "METHOD URL HOST\n" followed by the snapshot's JSON. Nothing may crash or read out of bounds
 * (ASan), the route is one of the five, and the metrics text ends with a newline.
 *
 * Build: CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz fuzz/fuzz-http
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t head = nl != NULL ? (size_t)(nl - data) : size;
    char *line = malloc(head + 1);
    if (line == NULL)
        return 0;
    memcpy(line, data, head);
    line[head] = '\0';
    char *method = line, *url = "", *host = NULL;
    char *sp = strchr(line, ' ');
    if (sp != NULL) {
        *sp = '\0';
        url = sp + 1;
        char *sp2 = strchr(url, ' ');
        if (sp2 != NULL) {
            *sp2 = '\0';
            host = sp2 + 1;
        }
    }
    int route = dl__http_route(method, url);
    DL_FUZZ_REQUIRE(route == DL__HTTP_ROUTE_METHOD ||
                    (route >= DL__HTTP_PAGE && route <= DL__HTTP_OTHER));
    (void)dl__http_host_is_loopback(host);

    json_t *snap = nl != NULL ? json_loadb((const char *)nl + 1, size - head - 1, 0, NULL) : NULL;
    if (json_is_object(snap)) {
        dl__http_counters_t hc = {{1, 2, 3, 4}, 5, 6.0};
        dl__http_buf_t b = {0};
        size_t len;
        dl__http_refresh_ages(snap, 1e9);
        dl__http_metrics(&b, snap, &hc, 1e9);
        char *text = dl__http_buf_take(&b, &len);
        DL_FUZZ_REQUIRE(text == NULL || len == 0 || text[len - 1] == '\n');
        free(text);
        dl__http_page(&b, snap, "t<&>", 1e9, 2);
        free(dl__http_buf_take(&b, &len));
        dl__http_buf_free(&b);
    }
    json_decref(snap);
    free(line);
    return 0;
}
