/* Which interface carries an address: over made-up interface lists (IPv4, IPv6, mapped, zoned),
 * then over this machine's own loopback. */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>

#include "dl-test.h"
#include "netif.h"

typedef struct {
    struct ifaddrs ifa;
    struct sockaddr_storage ss;
} entry_t;

/* Entries linked in order; text NULL: an interface without an address (as getifaddrs gives for
 * AF_PACKET entries, whose ifa_addr is of another family). */
static void add(entry_t *e, int *n, const char *name, const char *text)
{
    entry_t *x = &e[*n];
    memset(x, 0, sizeof(*x));
    x->ifa.ifa_name = (char *)name;
    if (text == NULL) {
        x->ss.ss_family = AF_PACKET;
    } else if (strchr(text, ':') != NULL) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&x->ss;
        s6->sin6_family = AF_INET6;
        ck_assert_int_eq(inet_pton(AF_INET6, text, &s6->sin6_addr), 1);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&x->ss;
        s4->sin_family = AF_INET;
        ck_assert_int_eq(inet_pton(AF_INET, text, &s4->sin_addr), 1);
    }
    x->ifa.ifa_addr = (struct sockaddr *)&x->ss;
    if (*n > 0)
        e[*n - 1].ifa.ifa_next = &x->ifa;
    (*n)++;
}

/* lo, a wrong eth0 with the default route, the right eth1, and two interfaces sharing one
 * link-local address. */
static int machine(entry_t *e)
{
    int n = 0;
    add(e, &n, "lo", NULL);
    add(e, &n, "lo", "127.0.0.1");
    add(e, &n, "lo", "::1");
    add(e, &n, "eth0", NULL);
    add(e, &n, "eth0", "10.77.1.1");
    add(e, &n, "eth1", "10.77.0.2");
    add(e, &n, "eth1", "fd00:77::2");
    add(e, &n, "veth0", "fe80::1");
    add(e, &n, "veth1", "fe80::1");
    return n;
}

DL_TEST(finds_the_interface_of_an_address)
{
    entry_t e[16];
    machine(e);
    char name[IF_NAMESIZE];
    const struct {
        const char *addr, *ifname;
    } cases[] = {
        {"127.0.0.1", "lo"},
        {"::1", "lo"},
        {"[::1]", "lo"},
        {"10.77.0.2", "eth1"},
        {"10.77.1.1", "eth0"},
        {"fd00:77::2", "eth1"},
        {"::ffff:10.77.0.2", "eth1"}, /* IPv4 as a dual-stack socket reports it */
        {"fe80::1", "veth0"},
        {"fe80::1%veth1", "veth1"}, /* the zone says which */
        {"fe80::1%nothere", "veth0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memset(name, 0, sizeof(name));
        ck_assert_msg(dl_netif_find(&e[0].ifa, cases[i].addr, name, sizeof(name)) == 0, "%s",
                      cases[i].addr);
        ck_assert_str_eq(name, cases[i].ifname);
    }
}

DL_TEST(refuses_what_it_cannot_place)
{
    entry_t e[16];
    machine(e);
    char name[IF_NAMESIZE] = "untouched";
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "10.77.0.9", name, sizeof(name)), -ENODEV);
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "fd00:77::9", name, sizeof(name)), -ENODEV);
    DL_CHECK_ERRNO(dl_netif_find(NULL, "10.77.0.2", name, sizeof(name)), -ENODEV);
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "node0.example", name, sizeof(name)), -EINVAL);
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "10.77.0.2%eth1", name, sizeof(name)), -EINVAL);
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "", name, sizeof(name)), -EINVAL);
    DL_CHECK_ERRNO(dl_netif_find(&e[0].ifa, "10.77.0.2", name, 4), -ENAMETOOLONG);
    ck_assert_str_eq(name, "untouched");
}

DL_TEST(this_machine_reaches_itself_over_lo)
{
    char addr[128], name[IF_NAMESIZE];
    DL_CHECK_ERRNO(dl_netif_source("127.0.0.1", addr, sizeof(addr)), 0);
    ck_assert_str_eq(addr, "127.0.0.1");
    DL_CHECK_ERRNO(dl_netif_name(addr, name, sizeof(name)), 0);
    ck_assert_str_eq(name, "lo");
    DL_CHECK_ERRNO(dl_netif_resolve("127.0.0.1", addr, sizeof(addr)), 0);
    ck_assert_str_eq(addr, "127.0.0.1");
    DL_CHECK_ERRNO(dl_netif_resolve("no-such-host.invalid", addr, sizeof(addr)), -ENOENT);
    /* IPv6 where the machine has it. */
    if (dl_netif_source("::1", addr, sizeof(addr)) == 0) {
        ck_assert_str_eq(addr, "::1");
        DL_CHECK_ERRNO(dl_netif_name(addr, name, sizeof(name)), 0);
        ck_assert_str_eq(name, "lo");
    }
}

/* The machine's own answer for each of its IPv4 addresses (one SIOCGIFCONF) is the one its
 * getifaddrs list gives. */
DL_TEST(ipv4_lookup_agrees_with_getifaddrs)
{
    struct ifaddrs *list = NULL;
    int checked = 0;
    ck_assert_int_eq(getifaddrs(&list), 0);
    for (struct ifaddrs *i = list; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        char addr[INET_ADDRSTRLEN], want[IF_NAMESIZE], got[IF_NAMESIZE];
        ck_assert_ptr_nonnull(
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr, sizeof(addr)));
        ck_assert_int_eq(dl_netif_find(list, addr, want, sizeof(want)), 0);
        ck_assert_int_eq(dl_netif_name(addr, got, sizeof(got)), 0);
        ck_assert_str_eq(got, want);
        checked++;
    }
    freeifaddrs(list);
    ck_assert_int_ge(checked, 1); /* lo's 127.0.0.1 at least */
    char name[IF_NAMESIZE];
    ck_assert_int_eq(dl_netif_name("::ffff:127.0.0.1", name, sizeof(name)), 0);
    ck_assert_str_eq(name, "lo");
}
