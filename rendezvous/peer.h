/* The owner of a loopback peer's socket: what stands in for a token when there is none.
 * Internal to rendezvous/. */
#ifndef DL_RDZV_PEER_H
#define DL_RDZV_PEER_H

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

/* 127.0.0.0/8, ::1, or ::ffff:127.x.x.x. */
bool dl__peer_is_loopback(const struct sockaddr *sa);

/* The uid owning the socket at the other end of the connected TCP socket fd. Returns 0,
 * -EPERM when the peer is not on loopback (the kernel cannot tell us then), -ENOENT when its
 * socket is gone, or another -errno. */
int dl__peer_uid(int fd, uid_t *ret_uid);

/* The same, keeping the netlink socket it asks through in *nlfd (-1 at first; the caller closes
 * it when done), so that a server pays two system calls a connection, not four. */
int dl__peer_uid_with(int *nlfd, int fd, uid_t *ret_uid);

/* Whether a peer of this uid may use what we serve, or serve us, without a token: our own
 * user, or root (who can read any token anyway). */
bool dl__peer_trusted(uid_t uid);

#endif
