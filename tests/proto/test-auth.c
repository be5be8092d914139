/* Authentication: HMAC-SHA256 against RFC 4231, the challenge-response proof, and reading the
 * token from a file or a string. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dl-test.h"
#include "proto.h"

#define NONCE "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define TOKEN "correct horse battery staple"

static void to_hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static dl_proto_token_t *token_of(const char *text)
{
    dl_proto_token_t *t = NULL;
    char err[256];

    DL_CHECK_ERRNO(dl_proto_token_from_string(text, "test", &t, err, sizeof(err)), 0);
    return t;
}

DL_TEST(test_hmac_rfc4231)
{
    /* Test cases 1, 2 and 6 of RFC 4231 (short key, text key, key longer than a block). */
    uint8_t key1[20], key6[131], mac[32];
    char hex[65];

    memset(key1, 0x0b, sizeof(key1));
    DL_CHECK_ERRNO(dl_proto_hmac_sha256(key1, sizeof(key1), "Hi There", 8, mac), 0);
    to_hex(mac, 32, hex);
    ck_assert_str_eq(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");

    DL_CHECK_ERRNO(dl_proto_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, mac), 0);
    to_hex(mac, 32, hex);
    ck_assert_str_eq(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

    memset(key6, 0xaa, sizeof(key6));
    ck_assert_int_eq(dl_proto_hmac_sha256(key6, sizeof(key6),
                                          "Test Using Larger Than Block-Size Key - Hash Key First",
                                          54, mac),
                     0);
    to_hex(mac, 32, hex);
    ck_assert_str_eq(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

DL_TEST(test_proof_formula)
{
    /* Known answers from an independent implementation (Python's hmac module) of the documented
     * formula HMAC-SHA256(token, nonce_hex || run_id || role). */
    dl_proto_token_t *t = token_of(TOKEN);
    char proof[DL_PROTO_PROOF_HEX_LEN + 1];

    DL_CHECK_ERRNO(dl_proto_auth_proof(t, NONCE, "job-42", DL_PROTO_ROLE_AGENT, proof), 0);
    ck_assert_str_eq(proof, "f69bd8c328e71a1b33894f86384a860e38d90ebad521eb7a459f336759bd0699");
    DL_CHECK_ERRNO(dl_proto_auth_proof(t, NONCE, "job-42", DL_PROTO_ROLE_WORKER, proof), 0);
    ck_assert_str_eq(proof, "bb0397751ad662b0bebbb5fe2817b410d5008b5bfba721850d58fc9a7816c04d");
    dl_proto_token_free(t);
}

DL_TEST(test_verify)
{
    dl_proto_token_t *t = token_of(TOKEN);
    dl_proto_token_t *other = token_of(TOKEN "!");
    char nonce[DL_PROTO_NONCE_HEX_LEN + 1], nonce2[DL_PROTO_NONCE_HEX_LEN + 1];
    char proof[DL_PROTO_PROOF_HEX_LEN + 1], bad[DL_PROTO_PROOF_HEX_LEN + 1];

    DL_CHECK_ERRNO(dl_proto_nonce_new(nonce), 0);
    DL_CHECK_ERRNO(dl_proto_nonce_new(nonce2), 0);
    DL_CHECK_ERRNO(dl_proto_auth_proof(t, nonce, "run1", DL_PROTO_ROLE_AGENT, proof), 0);
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, proof), 0);

    /* Each input is bound into the proof. */
    ck_assert_int_eq(dl_proto_auth_verify(other, nonce, "run1", DL_PROTO_ROLE_AGENT, proof),
                     -EACCES);
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce2, "run1", DL_PROTO_ROLE_AGENT, proof), -EACCES);
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run2", DL_PROTO_ROLE_AGENT, proof), -EACCES);
    ck_assert_int_eq(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_CONTROL, proof), -EACCES);

    /* A proof that is off by one digit, the wrong case, the wrong length or not hex is refused. */
    strcpy(bad, proof);
    bad[63] = bad[63] == '0' ? '1' : '0';
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, bad), -EACCES);
    strcpy(bad, proof);
    for (char *p = bad; *p != '\0'; p++)
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    if (strcmp(bad, proof) != 0)
        ck_assert_int_eq(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, bad), -EACCES);
    strcpy(bad, proof);
    bad[62] = '\0';
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, bad), -EACCES);
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, ""), -EACCES);
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, NULL), -EACCES);
    {
        char longer[DL_PROTO_PROOF_HEX_LEN + 3];
        snprintf(longer, sizeof(longer), "%s00", proof);
        ck_assert_int_eq(dl_proto_auth_verify(t, nonce, "run1", DL_PROTO_ROLE_AGENT, longer),
                         -EACCES);
    }

    /* Malformed inputs from the caller are its bug, not a failed login. */
    DL_CHECK_ERRNO(dl_proto_auth_verify(t, "abc", "run1", DL_PROTO_ROLE_AGENT, proof), -EINVAL);
    ck_assert_int_eq(dl_proto_auth_proof(t, nonce, "bad run", DL_PROTO_ROLE_AGENT, proof), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_auth_proof(t, nonce, "run1", DL_PROTO_ROLE_SERVER, proof), -EINVAL);
    dl_proto_token_free(t);
    dl_proto_token_free(other);
}

DL_TEST(test_nonce)
{
    char a[DL_PROTO_NONCE_HEX_LEN + 1], b[DL_PROTO_NONCE_HEX_LEN + 1];

    DL_CHECK_ERRNO(dl_proto_nonce_new(a), 0);
    DL_CHECK_ERRNO(dl_proto_nonce_new(b), 0);
    ck_assert_uint_eq(strlen(a), DL_PROTO_NONCE_HEX_LEN);
    ck_assert_uint_eq(strspn(a, "0123456789abcdef"), DL_PROTO_NONCE_HEX_LEN);
    ck_assert_str_ne(a, b);
}

/* ---- Token files ---- */

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/dl-test-auth-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *write_file(const char *name, const void *data, size_t len, mode_t mode)
{
    static char path[128];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
    ck_assert_int_eq(fchmod(fd, mode), 0);
    close(fd);
    return path;
}

/* A token's identity is what it proves: compare proofs rather than peeking inside. */
static void assert_same_token(dl_proto_token_t *a, const char *text)
{
    dl_proto_token_t *b = token_of(text);
    char pa[DL_PROTO_PROOF_HEX_LEN + 1], pb[DL_PROTO_PROOF_HEX_LEN + 1];

    DL_CHECK_ERRNO(dl_proto_auth_proof(a, NONCE, "r", DL_PROTO_ROLE_AGENT, pa), 0);
    DL_CHECK_ERRNO(dl_proto_auth_proof(b, NONCE, "r", DL_PROTO_ROLE_AGENT, pb), 0);
    ck_assert_str_eq(pa, pb);
    dl_proto_token_free(b);
}

static void expect_file_error(const char *path, int want, const char *needle)
{
    dl_proto_token_t *t = NULL;
    char err[512] = "";

    ck_assert_int_eq(dl_proto_token_from_file(path, &t, err, sizeof(err)), want);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, needle) != NULL, "'%s' not in '%s'", needle, err);
    ck_assert_msg(strstr(err, path) != NULL, "path not in '%s'", err);
}

DL_TEST(test_token_file)
{
    dl_proto_token_t *t = NULL;
    char err[512];

    make_tmpdir();
    ck_assert_int_eq(
        dl_proto_token_from_file(write_file("t1", "s3cret\n", 7, 0600), &t, err, sizeof(err)), 0);
    assert_same_token(t, "s3cret");
    dl_proto_token_free(t);

    /* No newline, a CRLF, and only one newline stripped. */
    ck_assert_int_eq(
        dl_proto_token_from_file(write_file("t2", "s3cret", 6, 0400), &t, err, sizeof(err)), 0);
    assert_same_token(t, "s3cret");
    dl_proto_token_free(t);
    ck_assert_int_eq(
        dl_proto_token_from_file(write_file("t3", "s3cret\r\n", 8, 0600), &t, err, sizeof(err)), 0);
    assert_same_token(t, "s3cret");
    dl_proto_token_free(t);
    ck_assert_int_eq(
        dl_proto_token_from_file(write_file("t4", "s3cret\n\n", 8, 0600), &t, err, sizeof(err)), 0);
    assert_same_token(t, "s3cret\n");
    dl_proto_token_free(t);
    remove_tmpdir();
}

/* The file wins over the variable; an empty variable is no token; no source is no token. */
DL_TEST(test_token_load)
{
    dl_proto_token_t *t = (dl_proto_token_t *)&t;
    char err[512];

    make_tmpdir();
    const char *file = write_file("t1", "from-file\n", 10, 0600);
    DL_CHECK_ERRNO(dl_proto_token_load(file, "from-env", &t, err, sizeof(err)), 0);
    assert_same_token(t, "from-file");
    dl_proto_token_free(t);
    DL_CHECK_ERRNO(dl_proto_token_load(NULL, "from-env", &t, err, sizeof(err)), 0);
    assert_same_token(t, "from-env");
    dl_proto_token_free(t);
    DL_CHECK_ERRNO(dl_proto_token_load(NULL, "", &t, err, sizeof(err)), 0);
    ck_assert_ptr_null(t);
    t = (dl_proto_token_t *)&t;
    DL_CHECK_ERRNO(dl_proto_token_load(NULL, NULL, &t, err, sizeof(err)), 0);
    ck_assert_ptr_null(t);
    /* A named file that is not there is an error, not a fall back to the variable. */
    ck_assert_int_eq(dl_proto_token_load("/nonexistent/token", "from-env", &t, err, sizeof(err)),
                     -ENOENT);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, "/nonexistent/token") != NULL, "%s", err);
    remove_tmpdir();
}

DL_TEST(test_token_file_mode)
{
    make_tmpdir();
    expect_file_error(write_file("g", "x\n", 2, 0640), -EACCES, "mode 0640");
    expect_file_error(write_file("w", "x\n", 2, 0604), -EACCES, "chmod 600");
    expect_file_error(write_file("gw", "x\n", 2, 0620), -EACCES, "group or others");
    expect_file_error(write_file("a", "x\n", 2, 0644), -EACCES, "mode 0644");
    remove_tmpdir();
}

DL_TEST(test_token_file_errors)
{
    char *big = calloc(1, DL_PROTO_TOKEN_MAX + 1);
    char path[128];

    make_tmpdir();
    expect_file_error(write_file("empty", "", 0, 0600), -EINVAL, "empty");
    expect_file_error(write_file("nl", "\n", 1, 0600), -EINVAL, "empty");
    memset(big, 'k', DL_PROTO_TOKEN_MAX + 1);
    expect_file_error(write_file("big", big, DL_PROTO_TOKEN_MAX + 1, 0600), -EINVAL, "larger than");
    snprintf(path, sizeof(path), "%s/missing", tmpdir);
    expect_file_error(path, -ENOENT, "No such file");
    snprintf(path, sizeof(path), "%s", tmpdir);
    chmod(path, 0700);
    expect_file_error(path, -EINVAL, "not a regular file");
    /* Exactly at the size limit is fine. */
    {
        dl_proto_token_t *t = NULL;
        char err[256];
        ck_assert_int_eq(dl_proto_token_from_file(write_file("max", big, DL_PROTO_TOKEN_MAX, 0600),
                                                  &t, err, sizeof(err)),
                         0);
        dl_proto_token_free(t);
    }
    remove_tmpdir();
    free(big);
}

DL_TEST(test_token_string)
{
    dl_proto_token_t *t = (dl_proto_token_t *)&t; /* must stay untouched on failure */
    dl_proto_token_t *before = t;
    char err[256] = "";

    ck_assert_int_eq(dl_proto_token_from_string("", "DLAUNCH_TOKEN", &t, err, sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_eq(t, before);
    ck_assert_ptr_nonnull(strstr(err, "DLAUNCH_TOKEN"));
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    dl_proto_token_free(NULL);
}

#define CNONCE "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
#define JOB7_KEY "d459e903a64df6982134422783ef364deb3a126515d11c4542a297eb7c53d119"
#define JOB7_WORKER "2e0accafe67982aea097b9c9468f0345994619f5ecfa8f39e7aade58ef607f6e"
/* The span the known answers are made for. */
#define L7 "1700000000:1700604800"
static const dl_proto_key_life_t LIFE7 = {1700000000, 1700604800};

DL_TEST(test_derive_known_answers)
{
    /* From Python's hmac: job = HMAC(master, "dlaunch job key v2\n" || run || "\n" || issued ||
     * "\n" || expires), worker = HMAC(job, "dlaunch worker key v2\n" || run). */
    dl_proto_token_t *master = token_of(TOKEN), *job = NULL, *worker = NULL, *w2 = NULL;
    char *text = NULL, proof[DL_PROTO_PROOF_HEX_LEN + 1];

    ck_assert_int_eq(dl_proto_token_kind(master), DL_PROTO_TOKEN_MASTER);
    ck_assert_ptr_null(dl_proto_token_run_id(master));
    DL_CHECK_ERRNO(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "job7", &LIFE7, &job), 0);
    DL_CHECK_ERRNO(dl_proto_token_text(job, &text), 0);
    ck_assert_str_eq(text, "dlaunch-job-v2:job7:" L7 ":" JOB7_KEY);
    free(text);
    /* The worker key keeps the job key's span, whatever life is asked for. */
    dl_proto_key_life_t other = {1, 2};
    ck_assert_int_eq(dl_proto_token_derive(job, DL_PROTO_TOKEN_WORKER, "job7", &other, &worker), 0);
    ck_assert_int_eq(dl_proto_token_life(worker).issued, LIFE7.issued);
    ck_assert_int_eq(dl_proto_token_life(worker).expires, LIFE7.expires);
    DL_CHECK_ERRNO(dl_proto_token_text(worker, &text), 0);
    ck_assert_str_eq(text, "dlaunch-worker-v2:job7:" L7 ":" JOB7_WORKER);
    /* The text reads back as the same credential; a master derives the same worker key. */
    dl_proto_token_t *back = token_of(text);
    ck_assert(dl_proto_token_equal(back, worker));
    ck_assert_int_eq(dl_proto_token_kind(back), DL_PROTO_TOKEN_WORKER);
    ck_assert_str_eq(dl_proto_token_run_id(back), "job7");
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_WORKER, "job7", &LIFE7, &w2), 0);
    ck_assert(dl_proto_token_equal(w2, worker));
    ck_assert(!dl_proto_token_equal(job, worker));
    DL_CHECK_ERRNO(dl_proto_auth_proof(worker, NONCE, "job7", DL_PROTO_ROLE_WORKER, proof), 0);
    ck_assert_str_eq(proof, "229eadaeda391f02c82067bd26e35326b59fce3767d7caba95d0524a4933dfa7");
    /* Another span is another key: no span can be stretched by editing the text. */
    dl_proto_key_life_t longer = {LIFE7.issued, LIFE7.expires + 1};
    dl_proto_token_free(w2);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_WORKER, "job7", &longer, &w2), 0);
    ck_assert(!dl_proto_token_equal(w2, worker));
    /* A master needs a valid span to make a key. */
    dl_proto_token_t *none = NULL;
    dl_proto_key_life_t bad = {10, 10};
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "job7", NULL, &none),
                     -EINVAL);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "job7", &bad, &none),
                     -EINVAL);
    ck_assert_ptr_null(none);
    free(text);
    dl_proto_token_free(back);
    dl_proto_token_free(w2);
    dl_proto_token_free(worker);
    dl_proto_token_free(job);
    dl_proto_token_free(master);
}

DL_TEST(test_derive_only_down)
{
    dl_proto_token_t *master = token_of(TOKEN), *job = NULL, *worker = NULL, *t = NULL;
    char *text = NULL;

    DL_CHECK_ERRNO(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "a", &LIFE7, &job), 0);
    DL_CHECK_ERRNO(dl_proto_token_derive(job, DL_PROTO_TOKEN_WORKER, "a", NULL, &worker), 0);
    /* Never up, never sideways, never to a master; a master is never written out. */
    DL_CHECK_ERRNO(dl_proto_token_derive(worker, DL_PROTO_TOKEN_JOB, "a", &LIFE7, &t), -EPERM);
    DL_CHECK_ERRNO(dl_proto_token_derive(job, DL_PROTO_TOKEN_JOB, "b", &LIFE7, &t), -EPERM);
    DL_CHECK_ERRNO(dl_proto_token_derive(job, DL_PROTO_TOKEN_WORKER, "b", &LIFE7, &t), -EPERM);
    DL_CHECK_ERRNO(dl_proto_token_derive(job, DL_PROTO_TOKEN_MASTER, "a", &LIFE7, &t), -EPERM);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_MASTER, "a", &LIFE7, &t), -EPERM);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "../x", &LIFE7, &t),
                     -EINVAL);
    DL_CHECK_ERRNO(dl_proto_token_text(master, &text), -EPERM);
    ck_assert_ptr_null(t);
    /* The read-only credential: from a master only, reaches reading only, derives nothing. */
    dl_proto_token_t *scrape = NULL, *back = NULL;
    DL_CHECK_ERRNO(dl_proto_token_scrape(job, &scrape), -EPERM);
    DL_CHECK_ERRNO(dl_proto_token_scrape(master, &scrape), 0);
    DL_CHECK_ERRNO(dl_proto_token_text(scrape, &text), 0);
    ck_assert_int_eq(strncmp(text, "dlaunch-scrape-v1:", 18), 0);
    back = token_of(text);
    free(text);
    ck_assert_int_eq(dl_proto_token_kind(back), DL_PROTO_TOKEN_SCRAPE);
    ck_assert_int_eq(dl_proto_token_reach(master, back), DL_PROTO_REACH_READ);
    ck_assert_int_eq(dl_proto_token_reach(master, master), DL_PROTO_REACH_ALL);
    DL_CHECK_ERRNO(dl_proto_token_reach(master, job), -EACCES);
    DL_CHECK_ERRNO(dl_proto_token_reach(job, back), -EACCES);
    ck_assert(!dl_proto_token_may(back, "a", DL_PROTO_ROLE_WORKER));
    DL_CHECK_ERRNO(dl_proto_token_derive(back, DL_PROTO_TOKEN_WORKER, "a", &LIFE7, &t), -EPERM);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_SCRAPE, "a", &LIFE7, &t), -EPERM);
    dl_proto_token_free(back);
    dl_proto_token_free(scrape);
    /* What each may say hello as. */
    ck_assert(dl_proto_token_may(master, "b", DL_PROTO_ROLE_CONTROL));
    ck_assert(dl_proto_token_may(job, "a", DL_PROTO_ROLE_CONTROL));
    ck_assert(dl_proto_token_may(job, "a", DL_PROTO_ROLE_AGENT));
    ck_assert(!dl_proto_token_may(job, "b", DL_PROTO_ROLE_WORKER));
    ck_assert(dl_proto_token_may(worker, "a", DL_PROTO_ROLE_WORKER));
    ck_assert(!dl_proto_token_may(worker, "a", DL_PROTO_ROLE_CONTROL));
    ck_assert(!dl_proto_token_may(worker, "a", DL_PROTO_ROLE_AGENT));
    char proof[DL_PROTO_PROOF_HEX_LEN + 1];
    ck_assert_int_eq(dl_proto_auth_proof(worker, NONCE, "a", DL_PROTO_ROLE_CONTROL, proof), -EPERM);
    DL_CHECK_ERRNO(dl_proto_auth_proof(job, NONCE, "b", DL_PROTO_ROLE_AGENT, proof), -EPERM);
    dl_proto_token_free(worker);
    dl_proto_token_free(job);
    dl_proto_token_free(master);
}

/* Runs the handshake between a server holding server_tok and a client holding client_tok;
 * returns what dl_proto_auth_accept returned, with the level and a checked server proof. */
static int handshake(dl_proto_token_t *server_tok, dl_proto_token_t *client_tok, const char *run_id,
                     dl_proto_role_t role, dl_proto_token_kind_t *level)
{
    char proof[DL_PROTO_PROOF_HEX_LEN + 1], sproof[DL_PROTO_PROOF_HEX_LEN + 1];
    /* What the client's auth says of its key, read back as the server reads it. */
    json_auto_t *auth = json_object();
    DL_CHECK_ERRNO(dl_proto_auth_add_life(auth, client_tok), 0);
    dl_proto_key_life_t claimed = dl_proto_auth_claimed_life(auth), life;

    if (dl_proto_auth_proof(client_tok, NONCE, run_id, role, proof) < 0)
        return -EPERM;
    int r = dl_proto_auth_accept(server_tok, NONCE, CNONCE, run_id, role, proof, &claimed, level,
                                 &life, sproof);
    if (r == 0 && *level != DL_PROTO_TOKEN_MASTER) {
        ck_assert_int_eq(life.issued, dl_proto_token_life(client_tok).issued);
        ck_assert_int_eq(life.expires, dl_proto_token_life(client_tok).expires);
    }
    if (r == 0)
        ck_assert_int_eq(
            dl_proto_auth_check_server(client_tok, CNONCE, NONCE, run_id, role, sproof), 0);
    return r;
}

DL_TEST(test_accept_levels)
{
    dl_proto_token_t *master = token_of(TOKEN), *job = NULL, *worker = NULL, *other = NULL;
    dl_proto_token_t *stranger = token_of("guess");
    dl_proto_token_kind_t level = (dl_proto_token_kind_t)-1;

    dl_proto_key_life_t life;
    DL_CHECK_ERRNO(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "a", &LIFE7, &job), 0);
    ck_assert_int_eq(dl_proto_token_derive(master, DL_PROTO_TOKEN_WORKER, "a", &LIFE7, &worker), 0);
    DL_CHECK_ERRNO(dl_proto_token_derive(master, DL_PROTO_TOKEN_JOB, "b", &LIFE7, &other), 0);
    /* A master server knows every level of every job. */
    ck_assert_int_eq(handshake(master, master, "a", DL_PROTO_ROLE_CONTROL, &level), 0);
    ck_assert_int_eq(level, DL_PROTO_TOKEN_MASTER);
    ck_assert_int_eq(handshake(master, job, "a", DL_PROTO_ROLE_AGENT, &level), 0);
    ck_assert_int_eq(level, DL_PROTO_TOKEN_JOB);
    ck_assert_int_eq(handshake(master, worker, "a", DL_PROTO_ROLE_WORKER, &level), 0);
    ck_assert_int_eq(level, DL_PROTO_TOKEN_WORKER);
    DL_CHECK_ERRNO(handshake(master, stranger, "a", DL_PROTO_ROLE_WORKER, &level), -EACCES);
    /* A worker's key proves nothing as control, even if the client tries (proof made by hand
     * with the worker key). */
    char proof[DL_PROTO_PROOF_HEX_LEN + 1], sproof[DL_PROTO_PROOF_HEX_LEN + 1];
    DL_CHECK_ERRNO(dl_proto_auth_proof(worker, NONCE, "a", DL_PROTO_ROLE_WORKER, proof), 0);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, NULL, "a", DL_PROTO_ROLE_WORKER, proof,
                                          &LIFE7, &level, &life, NULL),
                     0);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, NULL, "a", DL_PROTO_ROLE_CONTROL, proof,
                                          &LIFE7, &level, &life, NULL),
                     -EACCES);
    /* A server holding a worker's key (none of dlaunch's does) lets in no agent: the chain
     * below it has no key for that role, and the answer is a refusal, never a value left
     * over (the result was read unset there). */
    DL_CHECK_ERRNO(dl_proto_auth_proof(job, NONCE, "a", DL_PROTO_ROLE_AGENT, proof), 0);
    ck_assert_int_eq(dl_proto_auth_accept(worker, NONCE, NULL, "a", DL_PROTO_ROLE_AGENT, proof,
                                          &LIFE7, &level, &life, NULL),
                     -EACCES);
    /* Job b's key opens nothing of job a. */
    DL_CHECK_ERRNO(dl_proto_auth_proof(other, NONCE, "b", DL_PROTO_ROLE_CONTROL, proof), 0);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, NULL, "a", DL_PROTO_ROLE_CONTROL, proof,
                                          &LIFE7, &level, &life, NULL),
                     -EACCES);
    /* A server holding job a's key serves job a (its agents and workers) and nothing else. */
    ck_assert_int_eq(handshake(job, job, "a", DL_PROTO_ROLE_AGENT, &level), 0);
    ck_assert_int_eq(handshake(job, worker, "a", DL_PROTO_ROLE_WORKER, &level), 0);
    DL_CHECK_ERRNO(handshake(job, master, "b", DL_PROTO_ROLE_AGENT, &level), -EACCES);
    DL_CHECK_ERRNO(handshake(job, master, "a", DL_PROTO_ROLE_AGENT, &level), -EACCES);
    /* A server proof is for one client nonce, one server key. */
    DL_CHECK_ERRNO(dl_proto_auth_proof(job, NONCE, "a", DL_PROTO_ROLE_AGENT, proof), 0);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, CNONCE, "a", DL_PROTO_ROLE_AGENT, proof,
                                          &LIFE7, &level, &life, sproof),
                     0);
    ck_assert_int_eq(
        dl_proto_auth_check_server(job, NONCE, NONCE, "a", DL_PROTO_ROLE_AGENT, sproof), -EACCES);
    ck_assert_int_eq(
        dl_proto_auth_check_server(other, CNONCE, NONCE, "b", DL_PROTO_ROLE_AGENT, sproof),
        -EACCES);
    ck_assert_int_eq(dl_proto_auth_check_server(job, CNONCE, NONCE, "a", DL_PROTO_ROLE_AGENT, NULL),
                     -EACCES);
    /* A job key proves nothing under a span other than its own (the client names it), nor
     * with none. */
    dl_proto_key_life_t shifted = {LIFE7.issued + 1, LIFE7.expires};
    DL_CHECK_ERRNO(dl_proto_auth_proof(job, NONCE, "a", DL_PROTO_ROLE_AGENT, proof), 0);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, NULL, "a", DL_PROTO_ROLE_AGENT, proof,
                                          &shifted, &level, &life, NULL),
                     -EACCES);
    ck_assert_int_eq(dl_proto_auth_accept(master, NONCE, NULL, "a", DL_PROTO_ROLE_AGENT, proof,
                                          NULL, &level, &life, NULL),
                     -EACCES);
    /* A key whose HMAC is wrong (one digit changed) reads as a key, and proves nothing. */
    char *jtext = NULL;
    DL_CHECK_ERRNO(dl_proto_token_text(job, &jtext), 0);
    char *last = jtext + strlen(jtext) - 1;
    *last = *last == '0' ? '1' : '0';
    dl_proto_token_t *forged = token_of(jtext);
    free(jtext);
    DL_CHECK_ERRNO(handshake(master, forged, "a", DL_PROTO_ROLE_AGENT, &level), -EACCES);
    DL_CHECK_ERRNO(handshake(master, forged, "a", DL_PROTO_ROLE_CONTROL, &level), -EACCES);
    dl_proto_token_free(forged);
    /* A server holding the job key answers with its own span, whatever the client claims. */
    ck_assert_int_eq(dl_proto_auth_accept(job, NONCE, NULL, "a", DL_PROTO_ROLE_AGENT, proof,
                                          &shifted, &level, &life, NULL),
                     0);
    ck_assert_int_eq(life.issued, LIFE7.issued);
    /* Known answer from Python: HMAC(worker, "dlaunch server proof v1\n" || cnonce || nonce ||
     * run || "\n" || role). */
    dl_proto_token_t *w7 = token_of("dlaunch-worker-v2:job7:" L7 ":" JOB7_WORKER);
    ck_assert_int_eq(dl_proto_auth_check_server(
                         w7, CNONCE, NONCE, "job7", DL_PROTO_ROLE_WORKER,
                         "bce4393c1330ca0e51adb7a9591454d0e2e49c27a70b9ee74020015cc676ce90"),
                     0);
    dl_proto_token_free(w7);
    dl_proto_token_free(stranger);
    dl_proto_token_free(other);
    dl_proto_token_free(worker);
    dl_proto_token_free(job);
    dl_proto_token_free(master);
}

DL_TEST(test_typed_text_errors)
{
    dl_proto_token_t *t = NULL, *r = NULL;
    char err[256] = "";

    /* Each malformed key is refused with a line that says what is wrong with it. */
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"dlaunch-job-v2:a:1234", "not RUN_ID:ISSUED:EXPIRES:HEX"},
        {"dlaunch-job-v2:a:1:2:1234", "hex digits"},
        {"dlaunch-job-v2:a:" L7 ":" JOB7_KEY "0", "hex digits"},
        {"dlaunch-job-v2:a:" L7 ":" JOB7_KEY ":", "Unix seconds"},
        {"dlaunch-worker-v2:a/b:" L7 ":" JOB7_KEY, "its run id"},
        {"dlaunch-job-v2::" L7 ":" JOB7_KEY, "its run id"},
        {"dlaunch-job-v2:" L7 ":" JOB7_KEY, "not RUN_ID:ISSUED:EXPIRES:HEX"},
        /* Times: digits only, no sign, no leading zero, not past 9999, not out of order. */
        {"dlaunch-job-v2:a:-1:1700604800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:+1:1700604800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:01:1700604800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a::1700604800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:1 :1700604800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:1:253402300800:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:1:9223372036854775807:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:1:18446744073709551617:" JOB7_KEY, "Unix seconds"},
        {"dlaunch-job-v2:a:1700604800:1700000000:" JOB7_KEY, "expires before it is issued"},
        {"dlaunch-job-v2:a:5:5:" JOB7_KEY, "expires before it is issued"},
        /* Version 1 keys never ended: refused, saying how to get a new one. */
        {"dlaunch-job-v1:a:" JOB7_KEY, "dlaunch token RUN_ID"},
        {"dlaunch-worker-v1:a:" JOB7_KEY, "no longer accepted"},
        {"dlaunch-job-v1:a:1234", "version 1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(dl_proto_token_from_string(bad[i].text, "x", &t, err, sizeof(err)) == -EINVAL,
                      "%s was taken", bad[i].text);
        ck_assert_msg(strstr(err, bad[i].says) != NULL && strncmp(err, "x: ", 3) == 0 &&
                          strchr(err, '\n') == NULL,
                      "%s: '%s' does not say '%s'", bad[i].text, err, bad[i].says);
        ck_assert_ptr_null(t);
    }
    /* The latest time there is, and a run id with colons, read back as written. */
    ck_assert_int_eq(dl_proto_token_from_string("dlaunch-job-v2:a:b:0:253402300799:" JOB7_KEY, "x",
                                                &t, err, sizeof(err)),
                     0);
    ck_assert_str_eq(dl_proto_token_run_id(t), "a:b");
    ck_assert_int_eq(dl_proto_token_life(t).issued, 0);
    ck_assert_int_eq(dl_proto_token_life(t).expires, DL_PROTO_KEY_TIME_MAX);
    dl_proto_token_free(t);
    t = NULL;
    DL_CHECK_ERRNO(dl_proto_token_random(&r), 0);
    ck_assert_int_eq(dl_proto_token_kind(r), DL_PROTO_TOKEN_MASTER);
    dl_proto_token_free(r);
}

DL_TEST(test_key_judge)
{
    char why[400];
    const int64_t L = DL_PROTO_KEY_LEEWAY_S;

    /* Good from issued to expires, and within the leeway either side. */
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", LIFE7.issued, 0, why, sizeof(why)),
                     DL_PROTO_KEY_GOOD);
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", LIFE7.issued - L, 0, why, sizeof(why)),
                     DL_PROTO_KEY_GOOD);
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", LIFE7.expires + L - 1, 0, why, sizeof(why)),
                     DL_PROTO_KEY_GOOD);
    /* Expired: the line names the run and the moment, and says what to do. */
    why[0] = '\0';
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", LIFE7.expires + L, 0, why, sizeof(why)),
                     DL_PROTO_KEY_EXPIRED);
    ck_assert_ptr_nonnull(strstr(why, "job 'a' expired at 2023-11-21T22:13:20Z"));
    ck_assert_ptr_nonnull(strstr(why, "dlaunch token"));
    ck_assert_ptr_null(strchr(why, '\n'));
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", DL_PROTO_KEY_TIME_MAX, 0, why, sizeof(why)),
                     DL_PROTO_KEY_EXPIRED);
    /* A clock far out of range is taken at the range's end, with no overflow. */
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", INT64_MAX, 0, why, sizeof(why)),
                     DL_PROTO_KEY_EXPIRED);
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", INT64_MIN, 0, why, sizeof(why)),
                     DL_PROTO_KEY_NOT_YET);
    ck_assert_int_eq(dl_proto_key_judge(&LIFE7, "a", LIFE7.issued - L - 1, 0, why, sizeof(why)),
                     DL_PROTO_KEY_NOT_YET);
    ck_assert_ptr_nonnull(strstr(why, "clock"));
    /* Revoked: issued before the revocation, even if not yet expired; issued at it or after,
     * good. */
    ck_assert_int_eq(
        dl_proto_key_judge(&LIFE7, "a", LIFE7.issued + 10, LIFE7.issued + 1, why, sizeof(why)),
        DL_PROTO_KEY_REVOKED);
    ck_assert_ptr_nonnull(strstr(why, "revoked"));
    ck_assert_ptr_nonnull(strstr(why, "issued at 2023-11-14T22:13:20Z"));
    ck_assert_int_eq(
        dl_proto_key_judge(&LIFE7, "a", LIFE7.issued + 10, LIFE7.issued, why, sizeof(why)),
        DL_PROTO_KEY_GOOD);
    /* The span itself. */
    dl_proto_key_life_t l = {0, 1};
    ck_assert(dl_proto_key_life_valid(&l));
    l = (dl_proto_key_life_t){-1, 1};
    ck_assert(!dl_proto_key_life_valid(&l));
    l = (dl_proto_key_life_t){1, DL_PROTO_KEY_TIME_MAX + 1};
    ck_assert(!dl_proto_key_life_valid(&l));
    ck_assert(!dl_proto_key_life_valid(NULL));
}

DL_TEST(test_lifetime_and_time_parse)
{
    int64_t v = 0;

    DL_CHECK_ERRNO(dl_proto_lifetime_parse("3600", &v), 0);
    ck_assert_int_eq(v, 3600);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("7d", &v), 0);
    ck_assert_int_eq(v, 7 * 86400);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("90m", &v), 0);
    ck_assert_int_eq(v, 5400);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("12h", &v), 0);
    ck_assert_int_eq(v, 43200);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("366d", &v), 0);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("367d", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("0", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("9999999999d", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("999999999d", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("-5", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("d", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("5w", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_lifetime_parse("1.5h", &v), -EINVAL);

    DL_CHECK_ERRNO(dl_proto_time_parse("1700000000", &v), 0);
    ck_assert_int_eq(v, 1700000000);
    DL_CHECK_ERRNO(dl_proto_time_parse("2023-11-14T22:13:20Z", &v), 0);
    ck_assert_int_eq(v, 1700000000);
    DL_CHECK_ERRNO(dl_proto_time_parse("253402300800", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_time_parse("99999999999999999999999", &v), -ERANGE);
    DL_CHECK_ERRNO(dl_proto_time_parse("2023-11-14 22:13:20", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_time_parse("2023-11-14T22:13:20Zjunk", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_time_parse("-1", &v), -EINVAL);
    DL_CHECK_ERRNO(dl_proto_time_parse("", &v), -EINVAL);
    char buf[32];
    ck_assert_str_eq(dl_proto_time_text(1700000000, buf, sizeof(buf)), "2023-11-14T22:13:20Z");
    ck_assert_str_eq(dl_proto_time_text(-5, buf, sizeof(buf)), "-5");
}

DL_TEST(test_escape)
{
    char out[64];

    ck_assert_str_eq(dl_proto_escape("node-1", out, sizeof(out)), "node-1");
    ck_assert_str_eq(dl_proto_escape("a\nb\x1b[2J\\", out, sizeof(out)), "a\\x0ab\\x1b[2J\\x5c");
    ck_assert_str_eq(dl_proto_escape("\xff\xfe", out, 6), "\\xff");
    ck_assert_str_eq(dl_proto_escape(NULL, out, sizeof(out)), "");
}
