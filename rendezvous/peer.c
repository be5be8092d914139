/* Who is at the other end of a loopback TCP connection: the uid that owns the peer's socket.
 * A server without a token serves only its own user, and a client without one believes only a
 * server of its own user (or root), so on one machine the uid plays the part of the token, as
 * SO_PEERCRED does on a Unix socket. The kernel says who owns the socket through sock_diag, one
 * exact lookup of the peer's 4-tuple; /proc/net/tcp is read when netlink is not allowed. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "peer.h"
#include "rendezvous.h"

bool dl__peer_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a))
            return a->s6_addr[12] == 127;
        return memcmp(a, &in6addr_loopback, sizeof(*a)) == 0;
    }
    return false;
}

/* The peer's socket seen from its side: source = our peer, destination = us. */
static int diag_lookup(int *nlfd, const struct sockaddr_storage *peer,
                       const struct sockaddr_storage *self, uid_t *ret_uid)
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 req;
    } msg;
    char buf[8192];
    struct sockaddr_nl nladdr = {.nl_family = AF_NETLINK};
    struct timeval tv = {.tv_sec = 1};
    int fd, r = -ENOENT;

    memset(&msg, 0, sizeof(msg));
    msg.nlh.nlmsg_len = sizeof(msg);
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST;
    msg.nlh.nlmsg_seq = 1;
    msg.req.sdiag_family = (uint8_t)peer->ss_family;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_states = ~0u;
    msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    if (peer->ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)peer;
        const struct sockaddr_in *s = (const struct sockaddr_in *)self;
        msg.req.id.idiag_sport = p->sin_port;
        msg.req.id.idiag_dport = s->sin_port;
        memcpy(msg.req.id.idiag_src, &p->sin_addr, 4);
        memcpy(msg.req.id.idiag_dst, &s->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)peer;
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)self;
        msg.req.id.idiag_sport = p->sin6_port;
        msg.req.id.idiag_dport = s->sin6_port;
        memcpy(msg.req.id.idiag_src, &p->sin6_addr, 16);
        memcpy(msg.req.id.idiag_dst, &s->sin6_addr, 16);
    }
    fd = *nlfd;
    if (fd < 0) {
        fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
        if (fd < 0)
            return -errno;
        /* The kernel answers at once; the timeout guards against one that never does. */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        *nlfd = fd;
    }
    if (sendto(fd, &msg, sizeof(msg), 0, (struct sockaddr *)&nladdr, sizeof(nladdr)) < 0)
        return -errno;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0)
        r = -errno;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(h, (size_t)n);
         h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            r = e->error < 0 ? e->error : -ENOENT;
            break;
        }
        if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
            const struct inet_diag_msg *d = NLMSG_DATA(h);
            *ret_uid = (uid_t)d->idiag_uid;
            r = 0;
            break;
        }
    }
    return r;
}

/* /proc/net/tcp prints addresses as the kernel holds them: each 32-bit word in host order. */
static void proc_addr(const struct sockaddr_storage *sa, char *out, size_t len)
{
    const uint32_t *w;
    int nw, port;

    if (sa->ss_family == AF_INET) {
        w = (const uint32_t *)&((const struct sockaddr_in *)sa)->sin_addr;
        nw = 1;
        port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
    } else {
        w = (const uint32_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
        nw = 4;
        port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
    }
    size_t o = 0;
    for (int i = 0; i < nw; i++)
        o += (size_t)snprintf(out + o, len - o, "%08X", w[i]);
    snprintf(out + o, len - o, ":%04X", port);
}

static int proc_lookup(const struct sockaddr_storage *peer, const struct sockaddr_storage *self,
                       uid_t *ret_uid)
{
    char want_local[64], want_remote[64], line[512], local[64], remote[64];
    unsigned uid;
    FILE *f = fopen(peer->ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6", "re");
    int r = -ENOENT;

    if (f == NULL)
        return -errno;
    proc_addr(peer, want_local, sizeof(want_local));
    proc_addr(self, want_remote, sizeof(want_remote));
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, " %*d: %63s %63s %*x %*x:%*x %*x:%*x %*x %u", local, remote, &uid) == 3 &&
            strcmp(local, want_local) == 0 && strcmp(remote, want_remote) == 0) {
            *ret_uid = (uid_t)uid;
            r = 0;
            break;
        }
    }
    fclose(f);
    return r;
}

int dl__peer_uid_with(int *nlfd, int fd, uid_t *ret_uid)
{
    struct sockaddr_storage peer, self;
    socklen_t plen = sizeof(peer), slen = sizeof(self);

    if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0 ||
        getsockname(fd, (struct sockaddr *)&self, &slen) < 0)
        return -errno;
    if (!dl__peer_is_loopback((struct sockaddr *)&peer))
        return -EPERM;
    if (peer.ss_family != AF_INET && peer.ss_family != AF_INET6)
        return -EAFNOSUPPORT;
    int r = diag_lookup(nlfd, &peer, &self, ret_uid);
    if (r == 0 || r == -ENOENT)
        return r;
    /* A netlink socket that failed once is not trusted again. */
    if (*nlfd >= 0) {
        close(*nlfd);
        *nlfd = -1;
    }
    return proc_lookup(&peer, &self, ret_uid);
}

int dl__peer_uid(int fd, uid_t *ret_uid)
{
    int nlfd = -1;
    int r = dl__peer_uid_with(&nlfd, fd, ret_uid);
    if (nlfd >= 0)
        close(nlfd);
    return r;
}

bool dl__peer_trusted(uid_t uid)
{
    return uid == geteuid() || uid == 0;
}

int dl_rdzv_peer_uid(int *nlfd, int fd, uid_t *ret_uid)
{
    return dl__peer_uid_with(nlfd, fd, ret_uid);
}

int dl_rdzv_peer_trusted(int *nlfd, int fd)
{
    uid_t uid;
    int r = dl__peer_uid_with(nlfd, fd, &uid);
    if (r == -EPERM)
        return 0;
    return r < 0 ? r : dl__peer_trusted(uid);
}
