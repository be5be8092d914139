/* See netif.h. */
#include "netif.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    int family; /* AF_INET or AF_INET6 */
    unsigned char bytes[16];
    char zone[64]; /* "" when none */
} addr_t;

/* "10.0.0.1", "fe80::1%eth0", "[::1]", "::ffff:10.0.0.1" (taken as the IPv4 address). */
static int parse(const char *text, addr_t *ret)
{
    char buf[INET6_ADDRSTRLEN + 64];
    size_t n = strlen(text);
    if (n >= sizeof(buf))
        return -EINVAL;
    if (n >= 2 && text[0] == '[' && text[n - 1] == ']') {
        text++;
        n -= 2;
    }
    memcpy(buf, text, n);
    buf[n] = '\0';
    memset(ret, 0, sizeof(*ret));
    char *pct = strchr(buf, '%');
    if (pct != NULL) {
        if (strlen(pct + 1) >= sizeof(ret->zone))
            return -EINVAL;
        strcpy(ret->zone, pct + 1);
        *pct = '\0';
    }
    if (inet_pton(AF_INET, buf, ret->bytes) == 1) {
        ret->family = AF_INET;
        return pct != NULL ? -EINVAL : 0;
    }
    if (inet_pton(AF_INET6, buf, ret->bytes) != 1)
        return -EINVAL;
    ret->family = AF_INET6;
    if (IN6_IS_ADDR_V4MAPPED((struct in6_addr *)ret->bytes)) {
        memmove(ret->bytes, ret->bytes + 12, 4);
        memset(ret->bytes + 4, 0, 12);
        ret->family = AF_INET;
    }
    return 0;
}

static int same(const struct sockaddr *sa, const addr_t *a)
{
    if (sa == NULL || sa->sa_family != a->family)
        return 0;
    if (a->family == AF_INET)
        return memcmp(&((const struct sockaddr_in *)sa)->sin_addr, a->bytes, 4) == 0;
    return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, a->bytes, 16) == 0;
}

int dl_netif_find(const struct ifaddrs *list, const char *addr, char *ifname, size_t len)
{
    addr_t a;
    if (parse(addr, &a) < 0)
        return -EINVAL;
    /* A link-local address can sit on several interfaces; its zone, when given, says which. */
    const struct ifaddrs *hit = NULL;
    for (int pass = a.zone[0] != '\0' ? 0 : 1; pass < 2 && hit == NULL; pass++)
        for (const struct ifaddrs *i = list; i != NULL && hit == NULL; i = i->ifa_next)
            if (i->ifa_name != NULL && same(i->ifa_addr, &a) &&
                (pass == 1 || strcmp(i->ifa_name, a.zone) == 0))
                hit = i;
    if (hit == NULL)
        return -ENODEV;
    if (strlen(hit->ifa_name) >= len)
        return -ENAMETOOLONG;
    strcpy(ifname, hit->ifa_name);
    return 0;
}

/* The IPv4 interfaces from one SIOCGIFCONF, in getifaddrs' form, searched as dl_netif_find
 * does: getifaddrs dumps every link with its statistics as well, several times the work, at
 * every attempt's start. -EAGAIN when the list may not be whole or the address is not there:
 * getifaddrs then decides, as before. */
#define IFCONF_MAX 64
static int ipv4_name(const char *addr, char *ifname, size_t len)
{
    struct ifreq reqs[IFCONF_MAX];
    struct ifaddrs nodes[IFCONF_MAX];
    struct ifconf ifc = {.ifc_len = (int)sizeof(reqs), .ifc_req = reqs};
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -EAGAIN;
    int r = ioctl(fd, SIOCGIFCONF, &ifc);
    close(fd);
    if (r < 0 || ifc.ifc_len < 0 || (size_t)ifc.ifc_len >= sizeof(reqs))
        return -EAGAIN;
    size_t n = (size_t)ifc.ifc_len / sizeof(reqs[0]);
    memset(nodes, 0, sizeof(nodes));
    for (size_t i = 0; i < n; i++) {
        reqs[i].ifr_name[IFNAMSIZ - 1] = '\0';
        nodes[i].ifa_name = reqs[i].ifr_name;
        nodes[i].ifa_addr = &reqs[i].ifr_addr;
        nodes[i].ifa_next = i + 1 < n ? &nodes[i + 1] : NULL;
    }
    r = dl_netif_find(n > 0 ? nodes : NULL, addr, ifname, len);
    return r == -ENODEV ? -EAGAIN : r;
}

int dl_netif_name(const char *addr, char *ifname, size_t len)
{
    addr_t a;
    if (parse(addr, &a) == 0 && a.family == AF_INET) {
        int r = ipv4_name(addr, ifname, len);
        if (r != -EAGAIN)
            return r;
    }
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0)
        return -errno;
    int r = dl_netif_find(list, addr, ifname, len);
    freeifaddrs(list);
    return r;
}

/* The numeric form of ss, with the zone of a link-local IPv6 address. */
static int numeric(const struct sockaddr_storage *ss, char *addr, size_t len)
{
    const void *bytes = ss->ss_family == AF_INET
                            ? (const void *)&((const struct sockaddr_in *)ss)->sin_addr
                            : (const void *)&((const struct sockaddr_in6 *)ss)->sin6_addr;
    char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 1];
    if (inet_ntop(ss->ss_family, bytes, buf, sizeof(buf)) == NULL)
        return -errno;
    /* A link-local address names its interface, which the address alone may not. */
    unsigned scope =
        ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_scope_id : 0;
    char zone[IF_NAMESIZE];
    if (scope != 0 && if_indextoname(scope, zone) != NULL)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%%%s", zone);
    if (strlen(buf) >= len)
        return -ENAMETOOLONG;
    strcpy(addr, buf);
    return 0;
}

static int resolve(const char *host, struct addrinfo **ret)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
    /* Any port will do: nothing is sent. */
    errno = 0;
    int g = getaddrinfo(host, "9", &hints, ret);
    if (g != 0)
        return g == EAI_SYSTEM && errno != 0 ? -errno : -ENOENT;
    return 0;
}

int dl_netif_resolve(const char *host, char *addr, size_t len)
{
    struct addrinfo *res = NULL;
    int r = resolve(host, &res);
    if (r < 0)
        return r;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    memcpy(&ss, res->ai_addr, res->ai_addrlen < sizeof(ss) ? res->ai_addrlen : sizeof(ss));
    freeaddrinfo(res);
    return numeric(&ss, addr, len);
}

int dl_netif_source(const char *host, char *addr, size_t len)
{
    struct addrinfo *res = NULL;
    int r = resolve(host, &res);
    if (r < 0)
        return r;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    /* A UDP connect picks the route and the source address, and sends nothing. */
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        r = -errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return r < 0 ? r : numeric(&ss, addr, len);
}
