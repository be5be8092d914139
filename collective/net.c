/* Socket plumbing shared by the bootstrap and the TCP transport: addresses, listening,
 * connecting with retries, and exact-length sends and receives with a deadline. Every socket is
 * nonblocking; waits go through poll so that a deadline always holds. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Socket buffers big enough to hold a pipeline chunk in flight each way; the kernel caps them at
 * net.core.{w,r}mem_max, which is fine. */
#define SOCK_BUF_BYTES (4 << 20)

int dl__coll_fail(dl__coll_err_t *e, int code, const char *fmt, ...)
{
    if (e == NULL || e->code != 0)
        return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return code;
}

int64_t dl__coll_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t dl__coll_hash64(const void *data, size_t len, uint64_t seed)
{
    /* FNV-1a with a final mix; identities only, nothing adversarial. */
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

void dl__coll_addr_str(const dl__coll_addr_t *a, char *buf, size_t buflen)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a->ss.ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)&a->ss;
        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        port = ntohs(s4->sin_port);
        snprintf(buf, buflen, "%s:%d", host, port);
    } else if (a->ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&a->ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        port = ntohs(s6->sin6_port);
        snprintf(buf, buflen, "[%s]:%d", host, port);
    } else {
        snprintf(buf, buflen, "(no address)");
    }
}

int dl__coll_resolve(const char *host, int port, dl__coll_addr_t *ret_addr)
{
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int r = getaddrinfo(host, portstr, &hints, &res);
    if (r != 0)
        return r == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
    if (res == NULL || res->ai_addrlen > sizeof(ret_addr->ss)) {
        freeaddrinfo(res);
        return -EHOSTUNREACH;
    }
    memset(ret_addr, 0, sizeof(*ret_addr));
    memcpy(&ret_addr->ss, res->ai_addr, res->ai_addrlen);
    ret_addr->len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int dl__coll_route_addr(const dl__coll_addr_t *dst, dl__coll_addr_t *ret_addr)
{
    int fd = socket(dst->ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    dl__coll_addr_t a = {.len = sizeof(a.ss)};
    int r = 0;
    if (connect(fd, (const struct sockaddr *)&dst->ss, dst->len) < 0 ||
        getsockname(fd, (struct sockaddr *)&a.ss, &a.len) < 0)
        r = -errno;
    close(fd);
    if (r < 0)
        return r;
    if (a.ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&a.ss)->sin_port = 0;
    else if (a.ss.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&a.ss)->sin6_port = 0;
    *ret_addr = a;
    return 0;
}

static int same_host(const struct sockaddr *a, const dl__coll_addr_t *b)
{
    if (a->sa_family != b->ss.ss_family)
        return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)&b->ss)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)&b->ss)->sin6_addr, 16) == 0;
}

static int usable(const struct sockaddr *a)
{
    if (a == NULL)
        return 0;
    if (a->sa_family == AF_INET)
        return 1;
    return a->sa_family == AF_INET6 &&
           !IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

int dl__coll_iface_pick(const struct ifaddrs *list, const char *ifname,
                        const dl__coll_addr_t *prefer, dl__coll_addr_t *ret_addr)
{
    const struct sockaddr *best = NULL;
    int rank = 0, found = 0; /* 3: prefer itself, 2: its family, 1: another family */
    for (const struct ifaddrs *i = list; i != NULL; i = i->ifa_next) {
        if (i->ifa_name == NULL || strcmp(i->ifa_name, ifname) != 0)
            continue;
        found = 1;
        if (!usable(i->ifa_addr))
            continue;
        int k = prefer != NULL && same_host(i->ifa_addr, prefer)                   ? 3
                : prefer != NULL && i->ifa_addr->sa_family == prefer->ss.ss_family ? 2
                                                                                   : 1;
        if (k > rank) {
            rank = k;
            best = i->ifa_addr;
        }
    }
    if (best == NULL)
        return found ? -EADDRNOTAVAIL : -ENODEV;
    dl__coll_addr_t a;
    memset(&a, 0, sizeof(a));
    a.len = best->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&a.ss, best, a.len);
    if (best->sa_family == AF_INET)
        ((struct sockaddr_in *)&a.ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&a.ss)->sin6_port = 0;
    *ret_addr = a;
    return 0;
}

int dl__coll_iface_addr(const char *ifname, const dl__coll_addr_t *prefer,
                        dl__coll_addr_t *ret_addr)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0)
        return -errno;
    int r = dl__coll_iface_pick(list, ifname, prefer, ret_addr);
    freeifaddrs(list);
    return r;
}

int dl__coll_tune_socket(int fd)
{
    int one = 1, buf = SOCK_BUF_BYTES;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return -errno;
    /* Latency-bound small messages must not wait for Nagle. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
        return -errno;
    /* Best effort: a smaller cap only costs throughput. */
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    return 0;
}

int dl__coll_listen(const dl__coll_addr_t *addr, int backlog, int *ret_fd,
                    dl__coll_addr_t *ret_bound)
{
    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int one = 1, buf = SOCK_BUF_BYTES;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Accepted sockets inherit the buffer sizes; they must be set before listen to take effect
     * on the window advertised in the handshake. */
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    dl__coll_addr_t b = {.len = sizeof(b.ss)};
    if (bind(fd, (const struct sockaddr *)&addr->ss, addr->len) < 0 || listen(fd, backlog) < 0 ||
        getsockname(fd, (struct sockaddr *)&b.ss, &b.len) < 0) {
        int r = -errno;
        close(fd);
        return r;
    }
    *ret_fd = fd;
    if (ret_bound != NULL)
        *ret_bound = b;
    return 0;
}

static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - dl__coll_now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r > 0)
            return 0;
    }
}

static int connect_once(const dl__coll_addr_t *addr, int64_t deadline_ms, int *ret_fd)
{
    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int r = dl__coll_tune_socket(fd);
    if (r == 0 && connect(fd, (const struct sockaddr *)&addr->ss, addr->len) < 0) {
        r = -errno;
        if (r == -EINPROGRESS) {
            r = wait_fd(fd, POLLOUT, deadline_ms);
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (r == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                r = -errno;
            else if (r == 0)
                r = -soerr;
        }
    }
    if (r < 0) {
        close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

int dl__coll_connect(const dl__coll_addr_t *addr, int64_t deadline_ms, int *ret_fd)
{
    int64_t backoff = 10;
    for (;;) {
        int r = connect_once(addr, deadline_ms, ret_fd);
        if (r == 0)
            return 0;
        /* Nobody listening yet (the peer starts later) is the one failure worth waiting out. */
        if (r != -ECONNREFUSED && r != -ENETUNREACH && r != -EHOSTUNREACH && r != -ECONNRESET &&
            r != -ECONNABORTED)
            return r;
        int64_t left = deadline_ms - dl__coll_now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        int64_t nap = backoff < left ? backoff : left;
        struct timespec ts = {.tv_sec = nap / 1000, .tv_nsec = (nap % 1000) * 1000000};
        nanosleep(&ts, NULL);
        if (backoff < 200)
            backoff *= 2;
    }
}

int dl__coll_accept(int lfd, int64_t deadline_ms, int *ret_fd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            int r = dl__coll_tune_socket(fd);
            if (r < 0) {
                close(fd);
                return r;
            }
            *ret_fd = fd;
            return 0;
        }
        if (errno == ECONNABORTED || errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int r = wait_fd(lfd, POLLIN, deadline_ms);
        if (r < 0)
            return r;
    }
}

int dl__coll_send_all(int fd, const void *buf, size_t len, int64_t deadline_ms)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int r = wait_fd(fd, POLLOUT, deadline_ms);
        if (r < 0)
            return r;
    }
    return 0;
}

int dl__coll_recv_all(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int r = wait_fd(fd, POLLIN, deadline_ms);
        if (r < 0)
            return r;
    }
    return 0;
}
