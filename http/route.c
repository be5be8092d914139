/* What a request asks for and whether its Host may ask it: pure functions of the request's text,
 * apart from libmicrohttpd (and fuzzed alone, fuzz/fuzz-http.c). */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

int dl__http_route(const char *method, const char *url)
{
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return DL__HTTP_ROUTE_METHOD;
    if (strcmp(url, "/") == 0)
        return DL__HTTP_PAGE;
    if (strcmp(url, "/metrics") == 0)
        return DL__HTTP_METRICS;
    if (strncmp(url, "/api/jobs", 9) == 0 && (url[9] == '\0' || url[9] == '/'))
        return DL__HTTP_API;
    return DL__HTTP_OTHER;
}

bool dl__http_host_is_loopback(const char *host)
{
    char name[300];
    if (host == NULL || strlen(host) >= sizeof(name))
        return false;
    snprintf(name, sizeof(name), "%s", host);
    bool bracket = name[0] == '[';
    char *colon = bracket ? strstr(name, "]:") : strrchr(name, ':');
    if (colon != NULL) {
        const char *port = colon + (bracket ? 2 : 1);
        if (*port == '\0' || strspn(port, "0123456789") != strlen(port))
            return false;
        colon[bracket ? 1 : 0] = '\0';
    }
    if (strcasecmp(name, "localhost") == 0 || strcmp(name, "[::1]") == 0)
        return true;
    struct in_addr a;
    return inet_pton(AF_INET, name, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}
