/* The handshake: hello, the challenge and the auth that proves a key reaches the job in the
 * role the peer claims (or, without a token, the peer's uid), within a deadline. Kept apart
 * because nothing before it is trusted: a stranger gets here and no further. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"
#include "rdzv-codec.h"
#include "server-internal.h"

/* ---- the authentication deadline: one timer for the oldest unauthenticated connection ---- */

static void on_auth_timer(uv_timer_t *t);

void dl__server_preauth_arm(dl_rdzv_server_t *s)
{
    if (s->preauth_head == NULL || s->closing) {
        uv_timer_stop(&s->auth_timer);
        return;
    }
    double wait = s->preauth_head->accepted + s->auth_timeout - dl__server_now();
    uv_timer_start(&s->auth_timer, on_auth_timer, wait > 0 ? (uint64_t)(wait * 1000) + 1 : 0, 0);
}

void dl__sconn_preauth_remove(dl__sconn_t *sc)
{
    dl_rdzv_server_t *s = sc->s;
    if (!sc->in_preauth)
        return;
    sc->in_preauth = false;
    if (sc->prev != NULL)
        sc->prev->next = sc->next;
    else
        s->preauth_head = sc->next;
    if (sc->next != NULL)
        sc->next->prev = sc->prev;
    else
        s->preauth_tail = sc->prev;
    sc->prev = sc->next = NULL;
}

static void on_auth_timer(uv_timer_t *t)
{
    dl_rdzv_server_t *s = t->data;
    double now = dl__server_now();
    while (s->preauth_head != NULL && s->preauth_head->accepted + s->auth_timeout <= now) {
        dl__sconn_t *sc = s->preauth_head;
        dl__sconn_preauth_remove(sc);
        s->stats.auth_timeouts++;
        dl__sconn_error(sc, -1, DL_PROTO_E_NOT_AUTHENTICATED,
                        "no hello and auth within %g s; closing", s->auth_timeout);
        dl__conn_close(&sc->c, UV_ETIMEDOUT);
    }
    dl__server_preauth_arm(s);
}

/* server_proof: our proof of the token over the client's nonce, or NULL when it sent none. */
static void become_ready(dl__sconn_t *sc, json_int_t id, const char *server_proof)
{
    json_auto_t *ok = dl_rdzv_enc_auth_ok(id, sc->s->heartbeat, server_proof);
    if (ok == NULL)
        return;
    dl__sconn_preauth_remove(sc);
    dl__sconn_held_job_attach(sc);
    dl_proto_decoder_set_limit(&sc->c.dec, DL_PROTO_LIMIT);
    dl__conn_send(&sc->c, ok);
    sc->state = DL__SCONN_READY;
    sc->c.last_frame = uv_now(sc->s->loop);
    dl__server_sweep_start(sc->s);
}

/* A failed handshake: one error, then the connection is closed. */
static void refuse(dl__sconn_t *sc, json_int_t id, const char *why, const char *log_why)
{
    dl_rdzv_server_t *s = sc->s;
    char peer[80];
    dl__conn_peer(&sc->c, peer, sizeof(peer));
    dl__rdzv_server_log(s, DL_RDZV_LOG_WARN, sc->run_id, "refused %s from %s: %s",
                        dl_proto_role_name(sc->role), peer, log_why);
    s->stats.auth_failures++;
    dl__sconn_error(sc, id, DL_PROTO_E_AUTH_FAILED, "%s", why);
    dl__conn_close(&sc->c, 0);
}

static bool serves(const dl_rdzv_server_t *s, const char *run_id)
{
    return s->only_run_id[0] == '\0' || strcmp(s->only_run_id, run_id) == 0;
}

/* A one-node job's store answers its workers only. Told only to a peer that proved itself (or,
 * without a token, is our own user): the one case where a refusal may say why. Returns true
 * when sc was refused. */
static bool refused_by_store(dl__sconn_t *sc, json_int_t id)
{
    dl_rdzv_server_t *s = sc->s;
    char peer[80];

    if (!s->store_only || sc->role == DL_PROTO_ROLE_WORKER)
        return false;
    dl__conn_peer(&sc->c, peer, sizeof(peer));
    dl__rdzv_server_log(
        s, DL_RDZV_LOG_WARN, sc->run_id,
        "refused %s from %s: this is a one-node job's store; it takes no control commands",
        dl_proto_role_name(sc->role), peer);
    dl__sconn_error(
        sc, id, DL_PROTO_E_FORBIDDEN, "%s",
        "this is a one-node job's key-value store, not a rendezvous: it takes no status, "
        "stop, restart, events or agents (signal the job's agent, or run the job with "
        "--rdzv-endpoint)");
    dl__conn_close(&sc->c, 0);
    return true;
}

/* hello. Without a token the peer's uid stands in for it: only our own user (or root) gets in,
 * which the kernel tells us for a loopback peer, and a server without a token serves nothing
 * else. With one, a challenge. */
void dl__sconn_hello(dl__sconn_t *sc, json_t *msg, json_int_t id)
{
    dl_rdzv_server_t *s = sc->s;
    dl_rdzv_hello_msg_t h;

    dl_rdzv_dec_hello(msg, &h);
    if (dl_proto_role_parse(h.role, &sc->role) < 0) {
        dl__sconn_error(sc, id, DL_PROTO_E_BAD_FIELD, "hello: unknown role");
        dl__conn_close(&sc->c, 0);
        return;
    }
    if (h.proto != DL_PROTO_VERSION) {
        dl__sconn_error(sc, id, DL_PROTO_E_UNSUPPORTED_VERSION, "this server speaks protocol %d",
                        DL_PROTO_VERSION);
        dl__conn_close(&sc->c, 0);
        return;
    }
    snprintf(sc->run_id, sizeof(sc->run_id), "%s", h.run_id);
    if (h.nonce != NULL) {
        snprintf(sc->client_nonce, sizeof(sc->client_nonce), "%s", h.nonce);
        sc->has_client_nonce = true;
    }
    if (s->token == NULL) {
        uv_os_fd_t fd;
        uid_t uid = (uid_t)-1;
        int r = uv_fileno((uv_handle_t *)&sc->c.tcp, &fd);
        if (r == 0)
            r = dl__peer_uid_with(&s->diag_fd, fd, &uid);
        if (r < 0 || !dl__peer_trusted(uid)) {
            char why[128];
            if (r < 0)
                snprintf(why, sizeof(why), "cannot tell who the peer is: %s", strerror(-r));
            else
                snprintf(why, sizeof(why), "a peer of uid %u (this rendezvous serves uid %u)",
                         (unsigned)uid, (unsigned)geteuid());
            refuse(sc, id,
                   "this rendezvous has no token and serves only its own user; give the job "
                   "a token to share it",
                   why);
            return;
        }
        if (refused_by_store(sc, id))
            return;
        if (!serves(s, sc->run_id)) {
            refuse(sc, id, "wrong job: this rendezvous serves another run id",
                   "a hello for another job");
            return;
        }
        sc->level = DL_PROTO_TOKEN_MASTER;
        become_ready(sc, id, NULL);
        return;
    }
    if (dl_proto_nonce_new(sc->nonce) < 0) {
        dl__sconn_error(sc, id, DL_PROTO_E_INTERNAL, "no randomness for a challenge");
        dl__conn_close(&sc->c, 0);
        return;
    }
    json_auto_t *ch = dl_rdzv_enc_challenge(id, sc->nonce);
    if (ch == NULL) {
        dl__conn_close(&sc->c, UV_ENOMEM);
        return;
    }
    sc->state = DL__SCONN_AUTH;
    dl__conn_send(&sc->c, ch);
}

/* auth: the proof must come from a key that reaches this job in this role (the server's own
 * token, the job's key, or for a worker the job's worker key); we prove the same key back. */
void dl__sconn_auth(dl__sconn_t *sc, json_t *msg, json_int_t id)
{
    dl_rdzv_server_t *s = sc->s;
    char server_proof[DL_PROTO_PROOF_HEX_LEN + 1];
    dl_proto_token_kind_t level;
    dl_proto_key_life_t life = {0, 0};
    dl_rdzv_auth_msg_t a;
    dl_rdzv_dec_auth(msg, &a);
    int r = dl_proto_auth_accept(s->token, sc->nonce,
                                 sc->has_client_nonce ? sc->client_nonce : NULL, sc->run_id,
                                 sc->role, a.proof, &a.claimed, &level, &life, server_proof);
    /* The same answer for a wrong token and for a job this server does not serve, so that a
     * stranger learns nothing of which jobs exist. */
    if (r == 0 && refused_by_store(sc, id))
        return;
    if (r < 0 || !serves(s, sc->run_id)) {
        refuse(sc, id, "wrong job token (or one that does not reach this job in this role)",
               "wrong job token");
        return;
    }
    /* Judged only once proven: a stranger learns nothing of what a server revoked. */
    if (level != DL_PROTO_TOKEN_MASTER) {
        char why[400];
        int64_t now = (int64_t)dl__server_unix_now();
        if (dl_proto_key_judge(&life, sc->run_id, now, dl__revoked_before(s->revoked, sc->run_id),
                               why, sizeof(why)) != DL_PROTO_KEY_GOOD) {
            refuse(sc, id, why, why);
            return;
        }
    }
    sc->level = level;
    sc->life = life;
    become_ready(sc, id, sc->has_client_nonce ? server_proof : NULL);
}
