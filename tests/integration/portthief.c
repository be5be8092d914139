/* A fault for the integration tests, preloaded into dlaunch: the moment a program lets go of a
 * TCP port it found free (bound to port 0 of every address, asked which port it got, closed),
 * this takes that port and keeps it, as another program's connection may on a busy machine.
 * A program that later binds that port on the word of its earlier probe finds it in use. */
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int probe_fd = -1;
static in_port_t probe_port;

int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (real == NULL)
        real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "getsockname");
    int r = real(fd, sa, len);
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    int type = 0;
    socklen_t tlen = sizeof(type);
    if (r == 0 && *len >= sizeof(*in) && in->sin_family == AF_INET &&
        in->sin_addr.s_addr == htonl(INADDR_ANY) &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM) {
        probe_fd = fd;
        probe_port = in->sin_port;
    }
    return r;
}

int close(int fd)
{
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "close");
    int r = real(fd);
    if (fd == probe_fd) {
        probe_fd = -1;
        /* Held (never closed) until the process ends; no SO_REUSEADDR, so nobody else binds it. */
        int thief = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in at = {.sin_family = AF_INET,
                                 .sin_port = probe_port,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (thief >= 0)
            (void)bind(thief, (struct sockaddr *)&at, sizeof(at));
    }
    return r;
}
