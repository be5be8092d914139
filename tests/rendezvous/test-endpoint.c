/* Parsing HOST:PORT: what --rdzv-endpoint, --endpoint and dlaunchd --listen accept. */
#include <errno.h>
#include <stdlib.h>

#include "dl-test.h"
#include "rendezvous.h"

DL_TEST(host_and_port)
{
    char host[64];
    int port = 0;
    DL_CHECK_ERRNO(dl_rdzv_endpoint_parse("node-1.example:29400", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "node-1.example");
    ck_assert_int_eq(port, 29400);
    DL_CHECK_ERRNO(dl_rdzv_endpoint_parse("[::1]:65535", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 65535);
}

DL_TEST(bad_endpoints)
{
    static const char *const bad[] = {"",           "host",       "host:",    ":29400",
                                      "host:0",     "host:65536", "host:12x", "host:-1",
                                      "[::1]29400", "[::1:29400"};
    char host[64];
    int port;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(dl_rdzv_endpoint_parse(bad[i], host, sizeof(host), &port) == -EINVAL,
                      "'%s' was accepted", bad[i]);
    char tiny[4];
    DL_CHECK_ERRNO(dl_rdzv_endpoint_parse("longhost:1", tiny, sizeof(tiny), &port), -EINVAL);
}

DL_TEST(listen_takes_port_zero)
{
    char host[64];
    int port = -1;
    DL_CHECK_ERRNO(dl_rdzv_listen_parse("127.0.0.1:0", host, sizeof(host), &port), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(port, 0);
    DL_CHECK_ERRNO(dl_rdzv_listen_parse("127.0.0.1:65536", host, sizeof(host), &port), -EINVAL);
    DL_CHECK_ERRNO(dl_rdzv_listen_parse("127.0.0.1", host, sizeof(host), &port), -EINVAL);
}
