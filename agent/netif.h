/* Which network interface carries an address, and which local address reaches a host.
 *
 * Frameworks left to themselves pick the interface their host name resolves to (Gloo), or the
 * first one that looks right (NCCL); on a host with several interfaces, or a host name that maps
 * to 127.0.1.1, that is often one the other nodes cannot reach. The agent knows better: the
 * address it reaches MASTER_ADDR from. These helpers turn that address into the interface name
 * that GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME want. The search over an interface list is pure;
 * the wrappers read the machine's list (SIOCGIFCONF for an IPv4 address, else getifaddrs) or ask
 * the kernel for a route. */
#ifndef DL_NETIF_H
#define DL_NETIF_H

#include <ifaddrs.h>
#include <stddef.h>

/* The name of the first interface in list (getifaddrs' form) that has the numeric address addr
 * (IPv4, IPv6, or IPv4 written as IPv4-mapped IPv6; an IPv6 zone such as "%eth0" is ignored),
 * copied into ifname. Returns 0; -EINVAL if addr is not a numeric address; -ENODEV if no
 * interface has it; -ENAMETOOLONG if len is too small. */
int dl_netif_find(const struct ifaddrs *list, const char *addr, char *ifname, size_t len);

/* The same over this machine's interfaces. */
int dl_netif_name(const char *addr, char *ifname, size_t len);

/* host (a name or an address) as a numeric address: the first that getaddrinfo gives. Returns 0,
 * or -errno (-ENOENT: it does not resolve). */
int dl_netif_resolve(const char *host, char *addr, size_t len);

/* The local address, numeric, that the kernel sends from to reach host (a name or an address):
 * the route's source, found with a UDP connect that sends nothing. For one of this machine's own
 * addresses it is that address. Returns 0, or -errno (-ENOENT: host does not resolve). */
int dl_netif_source(const char *host, char *addr, size_t len);

#endif
