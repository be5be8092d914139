/* Whether a client believes the server that answered its hello (rdzv-sync.h): the token's
 * proof back, or without a token, a server of our own user on this machine. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"
#include "rdzv-sync.h"

int dl_rdzv_check_server(const dl_proto_token_t *token, bool challenged, const char *client_nonce,
                         const char *server_nonce, const char *run_id, dl_proto_role_t role,
                         const char *proof, int fd, char *err, size_t errlen)
{
    if (token != NULL) {
        if (!challenged) {
            snprintf(err, errlen,
                     "it did not ask for the job token, so it cannot prove it "
                     "holds it: not the job's rendezvous");
            return -EACCES;
        }
        if (proof == NULL) {
            snprintf(err, errlen, "it did not prove the job token (an older dlaunch?)");
            return -EACCES;
        }
        int r = dl_proto_auth_check_server(token, client_nonce, server_nonce, run_id, role, proof);
        if (r < 0) {
            snprintf(err, errlen, "its proof of the job token is wrong");
            return -EACCES;
        }
        return 0;
    }
    /* No token on either side: then it must be our own user's, on this machine. */
    uid_t uid;
    int r = fd >= 0 ? dl__peer_uid(fd, &uid) : -EBADF;
    if (r == -EPERM) {
        snprintf(err, errlen, "it is not on this machine and we have no job token to check it");
        return -EACCES;
    }
    if (r < 0) {
        snprintf(err, errlen, "cannot tell who runs it: %s", strerror(-r));
        return -EACCES;
    }
    if (!dl__peer_trusted(uid)) {
        snprintf(err, errlen,
                 "it runs as uid %u, not as this user (uid %u); without a job token "
                 "only our own rendezvous is trusted",
                 (unsigned)uid, (unsigned)geteuid());
        return -EACCES;
    }
    return 0;
}
