/* SHA-256 / HMAC-SHA256 test vectors and the connection handshake of
 * util/auth.h over socketpairs and TCP. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pd_test.h"
#include "util/auth.h"
#include "util/net.h"

static void
to_hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static void
check_sha(const void *msg, size_t n, const char *want)
{
    uint8_t d[32];
    char hex[65];
    pd_sha256(msg, n, d);
    to_hex(d, 32, hex);
    if (strcmp(hex, want) != 0) {
        fprintf(stderr, "sha256 of %zu bytes: got %s want %s\n", n, hex, want);
    }
    T_CHECK(strcmp(hex, want) == 0);
}

/* FIPS 180-4 / NIST example vectors. */
static void
test_sha256_vectors(void)
{
    check_sha("", 0,
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3,
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(m448, strlen(m448),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                       "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_sha(m896, strlen(m896),
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *million = malloc(1000000);
    T_CHECK(million != NULL);
    if (million != NULL) {
        memset(million, 'a', 1000000);
        check_sha(million, 1000000,
                  "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        free(million);
    }
}

static void
check_hmac(const void *key, size_t kl, const void *msg, size_t ml,
           const char *want)
{
    uint8_t d[32];
    char hex[65];
    pd_hmac_sha256(key, kl, msg, ml, d);
    to_hex(d, 32, hex);
    size_t wl = strlen(want); /* case 5 is truncated to 128 bits */
    if (strncmp(hex, want, wl) != 0) {
        fprintf(stderr, "hmac: got %s want %s\n", hex, want);
    }
    T_CHECK(strncmp(hex, want, wl) == 0);
}

/* RFC 4231 test cases 1-7. */
static void
test_hmac_rfc4231(void)
{
    uint8_t k[131], m[152];

    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(k, 0xaa, 20);
    memset(m, 0xdd, 50);
    check_hmac(k, 20, m, 50,
               "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    for (int i = 0; i < 25; i++) {
        k[i] = (uint8_t)(i + 1);
    }
    memset(m, 0xcd, 50);
    check_hmac(k, 25, m, 50,
               "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    memset(k, 0x0c, 20);
    check_hmac(k, 20, "Test With Truncation", 20,
               "a3b6167473100ee06e0c796c2955552b");
    memset(k, 0xaa, 131);
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, 131, m6, strlen(m6),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    const char *m7 = "This is a test using a larger than block-size key and a "
                     "larger than block-size data. The key needs to be hashed "
                     "before being used by the HMAC algorithm.";
    check_hmac(k, 131, m7, strlen(m7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

/* Incremental hashing across block boundaries agrees with one-shot hashing
 * of the same bytes through HMAC's multi-part path: HMAC(k, m) computed for
 * every length 0..300 must be stable and distinct from its neighbours. */
static void
test_sha256_lengths(void)
{
    uint8_t buf[300], prev[32], d[32];
    for (int i = 0; i < 300; i++) {
        buf[i] = (uint8_t)(i * 7 + 1);
    }
    memset(prev, 0, sizeof(prev));
    for (size_t n = 0; n <= sizeof(buf); n++) {
        uint8_t d2[32];
        pd_sha256(buf, n, d);
        pd_sha256(buf, n, d2);
        T_CHECK(memcmp(d, d2, 32) == 0);
        T_CHECK(memcmp(d, prev, 32) != 0);
        memcpy(prev, d, 32);
    }
}

/* ------------------------------------------------------------ handshake */

typedef struct side {
    int fd;
    const char *secret;
    double timeout;
    pd_status st;
    char msg[PD_ERRMSG_MAX];
} side;

static void *
server_thread(void *arg)
{
    side *s = arg;
    s->st = pd_auth_server(s->fd, s->secret, pd_now() + s->timeout);
    snprintf(s->msg, sizeof(s->msg), "%s", pd_errmsg());
    if (s->st != PD_OK) {
        /* A failing side closes its socket, as real callers do. */
        close(s->fd);
        s->fd = -1;
    }
    return NULL;
}

/* Run client (this thread) against server (a thread) over a socketpair.
 * Returns the elapsed seconds. */
static double
handshake(const char *ssecret, const char *csecret, pd_status *sst,
          pd_status *cst, char *smsg, char *cmsg)
{
    int sv[2];
    pthread_t th;
    side srv;
    double t0 = pd_now();

    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    srv.fd = sv[0];
    srv.secret = ssecret;
    srv.timeout = 5.0;
    pthread_create(&th, NULL, server_thread, &srv);
    *cst = pd_auth_client(sv[1], csecret, pd_now() + 5.0);
    if (cmsg != NULL) {
        snprintf(cmsg, PD_ERRMSG_MAX, "%s", pd_errmsg());
    }
    /* A failing side closes its socket, as real callers do. */
    if (*cst != PD_OK) {
        close(sv[1]);
        sv[1] = -1;
    }
    pthread_join(th, NULL);
    *sst = srv.st;
    if (smsg != NULL) {
        snprintf(smsg, PD_ERRMSG_MAX, "%s", srv.msg);
    }
    if (srv.fd >= 0) {
        close(srv.fd);
    }
    if (sv[1] >= 0) {
        close(sv[1]);
    }
    return pd_now() - t0;
}

static void
test_handshake_no_secret(void)
{
    pd_status s, c;
    handshake(NULL, NULL, &s, &c, NULL, NULL);
    T_ST(s, PD_OK);
    T_ST(c, PD_OK);
    handshake("", NULL, &s, &c, NULL, NULL); /* "" means no secret */
    T_ST(s, PD_OK);
    T_ST(c, PD_OK);
}

static void
test_handshake_same_secret(void)
{
    pd_status s, c;
    handshake("s3cret", "s3cret", &s, &c, NULL, NULL);
    T_ST(s, PD_OK);
    T_ST(c, PD_OK);
    /* Keys longer than a SHA-256 block are hashed first (RFC 2104). */
    char longkey[301];
    memset(longkey, 'k', 300);
    longkey[300] = '\0';
    handshake(longkey, longkey, &s, &c, NULL, NULL);
    T_ST(s, PD_OK);
    T_ST(c, PD_OK);
}

static void
test_handshake_wrong_secret(void)
{
    pd_status s, c;
    char smsg[PD_ERRMSG_MAX], cmsg[PD_ERRMSG_MAX];
    double dt = handshake("right", "wrong", &s, &c, smsg, cmsg);
    T_ST(s, PD_EAUTH);
    T_ST(c, PD_EAUTH);
    T_CHECK(strstr(smsg, "wrong secret") != NULL);
    T_CHECK(strstr(cmsg, "authentication") != NULL);
    T_CHECK(dt < 2.0);
    /* Same length, one byte apart. */
    handshake("abcdef", "abcdeg", &s, &c, NULL, NULL);
    T_ST(s, PD_EAUTH);
    T_ST(c, PD_EAUTH);
}

static void
test_handshake_secret_mismatch(void)
{
    pd_status s, c;
    char smsg[PD_ERRMSG_MAX], cmsg[PD_ERRMSG_MAX];
    double dt = handshake("only-server", NULL, &s, &c, smsg, cmsg);
    T_ST(s, PD_EAUTH);
    T_ST(c, PD_EAUTH);
    T_CHECK(dt < 2.0); /* never a hang */
    T_CHECK(strstr(cmsg, "requires a secret") != NULL);
    T_CHECK(strstr(smsg, "does not use a secret") != NULL);

    dt = handshake(NULL, "only-client", &s, &c, smsg, cmsg);
    T_ST(s, PD_EAUTH);
    T_ST(c, PD_EAUTH);
    T_CHECK(dt < 2.0);
    T_CHECK(strstr(cmsg, "does not use a secret") != NULL);
    T_CHECK(strstr(smsg, "requires a secret") != NULL);
}

/* A peer that is not pyddp (here: an HTTP request) is rejected at once. */
static void
test_handshake_stranger(void)
{
    int sv[2];
    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    const char *req = "GET / HTTP/1.1\r\n\r\n";
    T_CHECK(write(sv[1], req, strlen(req)) == (ssize_t)strlen(req));
    T_ST(pd_auth_server(sv[0], "x", pd_now() + 2.0), PD_EAUTH);
    T_MSG_HAS("not a pyddp process");
    close(sv[0]);
    close(sv[1]);
}

/* A silent peer: the deadline ends the handshake with PD_EAUTH. */
static void
test_handshake_deadline(void)
{
    int sv[2];
    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    double t0 = pd_now();
    T_ST(pd_auth_client(sv[1], "x", pd_now() + 0.2), PD_EAUTH);
    T_MSG_HAS("timed out");
    T_ST(pd_auth_server(sv[0], NULL, pd_now() + 0.2), PD_EAUTH);
    T_CHECK(pd_now() - t0 < 2.0);
    close(sv[0]);
    close(sv[1]);
}

static void *
client_thread(void *arg)
{
    side *s = arg;
    s->st = pd_auth_client(s->fd, s->secret, pd_now() + s->timeout);
    snprintf(s->msg, sizeof(s->msg), "%s", pd_errmsg());
    return NULL;
}

/* Play the server by hand: the client's bytes never contain the secret and
 * its proof is HMAC(secret, 'C' | nonce_s | nonce_c), as documented; the
 * matching server proof HMAC(secret, 'S' | ...) completes the handshake. */
static void
test_no_secret_on_wire(void)
{
    const char *secret = "correct horse battery staple";
    int sv[2];
    uint8_t hello[40], shello[40], proof[32], msg[65], mac[32];
    pthread_t th;
    side cli;

    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    cli.fd = sv[1];
    cli.secret = secret;
    cli.timeout = 5.0;
    pthread_create(&th, NULL, client_thread, &cli);

    memcpy(shello, "PDDP\x00\x01\x00\x01", 8);
    T_OK(pd_random_bytes(shello + 8, 32));
    T_OK(pd_net_send_all(sv[0], shello, 40, pd_now() + 5.0));
    T_OK(pd_net_recv_all(sv[0], hello, 40, pd_now() + 5.0));
    T_OK(pd_net_recv_all(sv[0], proof, 32, pd_now() + 5.0));
    T_CHECK(memcmp(hello, "PDDP\x00\x01\x00\x01", 8) == 0);
    T_CHECK(memmem(hello, 40, secret, strlen(secret)) == NULL);
    T_CHECK(memmem(proof, 32, secret, strlen(secret)) == NULL);

    msg[0] = 'C';
    memcpy(msg + 1, shello + 8, 32);
    memcpy(msg + 33, hello + 8, 32);
    pd_hmac_sha256(secret, strlen(secret), msg, sizeof(msg), mac);
    T_CHECK(memcmp(mac, proof, 32) == 0);

    msg[0] = 'S';
    pd_hmac_sha256(secret, strlen(secret), msg, sizeof(msg), mac);
    T_OK(pd_net_send_all(sv[0], mac, 32, pd_now() + 5.0));
    pthread_join(th, NULL);
    T_ST(cli.st, PD_OK);
    close(sv[0]);
    close(sv[1]);
}

/* A server that answers with a proof made from another secret is refused
 * by the client (mutual authentication). */
static void
test_client_checks_server(void)
{
    int sv[2];
    uint8_t hello[40], shello[40], proof[32], msg[65], mac[32];
    pthread_t th;
    side cli;

    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    cli.fd = sv[1];
    cli.secret = "real";
    cli.timeout = 5.0;
    pthread_create(&th, NULL, client_thread, &cli);
    memcpy(shello, "PDDP\x00\x01\x00\x01", 8);
    T_OK(pd_random_bytes(shello + 8, 32));
    T_OK(pd_net_send_all(sv[0], shello, 40, pd_now() + 5.0));
    T_OK(pd_net_recv_all(sv[0], hello, 40, pd_now() + 5.0));
    T_OK(pd_net_recv_all(sv[0], proof, 32, pd_now() + 5.0));
    msg[0] = 'S';
    memcpy(msg + 1, shello + 8, 32);
    memcpy(msg + 33, hello + 8, 32);
    pd_hmac_sha256("fake", 4, msg, sizeof(msg), mac);
    T_OK(pd_net_send_all(sv[0], mac, 32, pd_now() + 5.0));
    pthread_join(th, NULL);
    T_ST(cli.st, PD_EAUTH);
    T_CHECK(strstr(cli.msg, "does not know our secret") != NULL);
    close(sv[0]);
    close(sv[1]);
}

/* The non-blocking state machine driven by poll, as the store's event loop
 * drives it, against a blocking client over real TCP. */
static void
test_nonblocking_server_tcp(void)
{
    int lfd, port, cfd, sfd;
    pthread_t th;
    side cli;
    pd_auth_srv a;

    T_OK(pd_net_listen("127.0.0.1", 0, 4, &lfd, &port));
    T_OK(pd_net_connect("127.0.0.1", port, pd_now() + 5.0, &cfd));
    T_OK(pd_net_accept(lfd, pd_now() + 5.0, &sfd));
    T_OK(pd_net_set_nonblock(sfd, 1));
    cli.fd = cfd;
    cli.secret = "tcp-secret";
    cli.timeout = 5.0;
    pthread_create(&th, NULL, client_thread, &cli);
    T_OK(pd_auth_srv_init(&a, "tcp-secret"));
    double deadline = pd_now() + 5.0;
    int steps = 0;
    while (!a.done && pd_now() < deadline) {
        pd_status st = pd_auth_srv_step(&a, sfd);
        T_ST(st, PD_OK);
        if (st != PD_OK) {
            break;
        }
        steps++;
        if (!a.done) {
            struct pollfd p = {sfd, a.want_write ? POLLOUT : POLLIN, 0};
            poll(&p, 1, 100);
        }
    }
    T_CHECK(a.done);
    pthread_join(th, NULL);
    T_ST(cli.st, PD_OK);
    close(sfd);
    close(cfd);
    close(lfd);
}

/* Drive the non-blocking server against a client thread (secret csecret),
 * or against raw bytes (garbage, then a hang-up), until it fails; returns
 * a.refused, the "say it at once" mark. */
static int
refused_by_server(const char *ssecret, const char *csecret,
                  const char *garbage)
{
    int sv[2];
    pthread_t th;
    side cli;
    pd_auth_srv a;
    pd_status st = PD_OK;

    T_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    T_OK(pd_net_set_nonblock(sv[0], 1));
    if (garbage != NULL) {
        T_CHECK(write(sv[1], garbage, strlen(garbage)) ==
                (ssize_t)strlen(garbage));
        shutdown(sv[1], SHUT_WR); /* then nothing more: EOF */
    } else {
        cli.fd = sv[1];
        cli.secret = csecret;
        cli.timeout = 5.0;
        pthread_create(&th, NULL, client_thread, &cli);
    }
    T_OK(pd_auth_srv_init(&a, ssecret));
    double deadline = pd_now() + 5.0;
    while (st == PD_OK && !a.done && pd_now() < deadline) {
        st = pd_auth_srv_step(&a, sv[0]);
        if (st == PD_OK && !a.done) {
            struct pollfd p = {sv[0], a.want_write ? POLLOUT : POLLIN, 0};
            poll(&p, 1, 100);
        }
    }
    T_ST(st, PD_EAUTH);
    int refused = a.refused;
    close(sv[0]); /* the client, refused, sees the hang-up */
    if (garbage == NULL) {
        pthread_join(th, NULL);
        T_ST(cli.st, PD_EAUTH);
    }
    close(sv[1]);
    return refused;
}

/* A pyddp client with the wrong secret, or none, is a refusal worth saying
 * at once; a stranger that is not pyddp, or one that hangs up, is not. */
static void
test_refusals(void)
{
    T_CHECK(refused_by_server("right", "wrong", NULL) == 1);
    T_CHECK(refused_by_server("right", NULL, NULL) == 1);
    T_CHECK(refused_by_server(NULL, "only-client", NULL) == 1);
    T_CHECK(refused_by_server("x", NULL, "GET / HTTP/1.1\r\n\r\n") == 0);
    T_CHECK(refused_by_server("x", NULL, "PDD") == 0); /* hangs up */

    /* the record: counted always, the last kept, added to a timeout */
    pd_auth_refusals r = {0};
    T_ST(pd_auth_refusals_explain(&r, pd_error(PD_ETIMEOUT, "waited")),
         PD_ETIMEOUT);
    T_CHECK(strcmp(pd_errmsg(), "waited") == 0);
    for (int i = 0; i < PD_AUTH_REFUSALS_SAID + 3; i++) {
        pd_error(PD_EAUTH, "client 10.0.0.%d: wrong secret", i);
        pd_auth_note_refusal(&r, "test", "the test's listener");
    }
    T_CHECK(r.count == PD_AUTH_REFUSALS_SAID + 3);
    T_ST(pd_auth_refusals_explain(&r, pd_error(PD_ESTORE, "waited")),
         PD_ESTORE);
    T_MSG_HAS("waited; meanwhile 7 connections were refused, the last: "
              "client 10.0.0.6: wrong secret");
    T_MSG_HAS("PYDDP_SECRET");
}

int
main(void)
{
    printf("test_auth\n");
    T_RUN(test_sha256_vectors);
    T_RUN(test_sha256_lengths);
    T_RUN(test_hmac_rfc4231);
    T_RUN(test_handshake_no_secret);
    T_RUN(test_handshake_same_secret);
    T_RUN(test_handshake_wrong_secret);
    T_RUN(test_handshake_secret_mismatch);
    T_RUN(test_handshake_stranger);
    T_RUN(test_handshake_deadline);
    T_RUN(test_no_secret_on_wire);
    T_RUN(test_client_checks_server);
    T_RUN(test_nonblocking_server_tcp);
    T_RUN(test_refusals);
    return pd_test_result();
}
