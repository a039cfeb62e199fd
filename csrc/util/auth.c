/* SHA-256, HMAC-SHA256 and the connection handshake of auth.h.
 *
 * Wire protocol (all fixed sizes, so neither side ever reads past the
 * handshake into application data):
 *
 *   both  -> hello word: "PDDP" | version (u16 BE) | mode (u16 BE),
 *            mode 1 = "I have a secret", followed by a 32-byte nonce when
 *            mode is 1.  Each side sends its hello before reading the
 *            other's, so a mode mismatch is seen by both ends at once.
 *   client -> HMAC(secret, 'C' | nonce_s | nonce_c)        (mode 1 only)
 *   server -> HMAC(secret, 'S' | nonce_s | nonce_c)        (mode 1 only)
 *
 * The server answers only after checking the client's proof, and the role
 * byte keeps a proof from being reflected back to its sender.
 */
#include "auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "net.h"

#define AUTH_VERSION 1
#define AUTH_WORD 8
#define AUTH_NONCE 32
#define AUTH_MAC 32

enum {
    SRV_SEND_HELLO = 0,
    SRV_RECV_WORD,
    SRV_RECV_PROOF,
    SRV_SEND_PROOF,
    SRV_DONE,
};

/* ---------------------------------------------------------------- SHA-256 */

typedef struct sha256_ctx {
    uint32_t h[8];
    uint64_t len;       /* bytes hashed so far */
    uint8_t block[64];
    size_t fill;
} sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu,
    0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u, 0xd807aa98u, 0x12835b01u,
    0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u,
    0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu,
    0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u,
    0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u,
    0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u,
    0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u, 0x1e376c08u,
    0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu,
    0x682e6ff3u, 0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u,
    0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

static uint32_t
rotr32(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32u - n));
}

static void
sha256_init(sha256_ctx *c)
{
    static const uint32_t iv[8] = {
        0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
        0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
    };
    memcpy(c->h, iv, sizeof(iv));
    c->len = 0;
    c->fill = 0;
}

static void
sha256_block(sha256_ctx *c, const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
               ((uint32_t)p[4 * i + 2] << 8) | (uint32_t)p[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr32(w[i - 15], 7) ^ rotr32(w[i - 15], 18) ^
                      (w[i - 15] >> 3);
        uint32_t s1 = rotr32(w[i - 2], 17) ^ rotr32(w[i - 2], 19) ^
                      (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3];
    uint32_t e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = h + S1 + ch + K256[i] + w[i];
        uint32_t S0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
        uint32_t maj = (a & b) ^ (a & cc) ^ (b & cc);
        uint32_t t2 = S0 + maj;
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
    c->h[5] += f;
    c->h[6] += g;
    c->h[7] += h;
}

static void
sha256_update(sha256_ctx *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    if (n == 0) {
        return; /* data may be NULL then */
    }
    c->len += n;
    if (c->fill > 0) {
        size_t take = 64 - c->fill < n ? 64 - c->fill : n;
        memcpy(c->block + c->fill, p, take);
        c->fill += take;
        p += take;
        n -= take;
        if (c->fill < 64) {
            return;
        }
        sha256_block(c, c->block);
        c->fill = 0;
    }
    while (n >= 64) {
        sha256_block(c, p);
        p += 64;
        n -= 64;
    }
    if (n > 0) {
        memcpy(c->block, p, n);
        c->fill = n;
    }
}

static void
sha256_final(sha256_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->len * 8u;
    uint8_t pad = 0x80;
    sha256_update(c, &pad, 1);
    uint8_t zero = 0;
    while (c->fill != 56) {
        sha256_update(c, &zero, 1);
    }
    uint8_t lenbe[8];
    for (int i = 0; i < 8; i++) {
        lenbe[i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    sha256_update(c, lenbe, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
    memset(c, 0, sizeof(*c));
}

void
pd_sha256(const void *data, size_t n, uint8_t out[32])
{
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, data, n);
    sha256_final(&c, out);
}

/* HMAC over the concatenation of up to three parts (role, nonces) without
 * building the message in memory. */
static void
hmac_parts(const void *key, size_t keylen, const void *p1, size_t n1,
           const void *p2, size_t n2, const void *p3, size_t n3,
           uint8_t out[32])
{
    uint8_t k[64];
    uint8_t pad[64];
    uint8_t inner[32];
    sha256_ctx c;

    memset(k, 0, sizeof(k));
    if (keylen > 64) {
        pd_sha256(key, keylen, k);
    } else if (keylen > 0) {
        memcpy(k, key, keylen);
    }
    for (int i = 0; i < 64; i++) {
        pad[i] = k[i] ^ 0x36;
    }
    sha256_init(&c);
    sha256_update(&c, pad, 64);
    sha256_update(&c, p1, n1);
    sha256_update(&c, p2, n2);
    sha256_update(&c, p3, n3);
    sha256_final(&c, inner);
    for (int i = 0; i < 64; i++) {
        pad[i] = k[i] ^ 0x5c;
    }
    sha256_init(&c);
    sha256_update(&c, pad, 64);
    sha256_update(&c, inner, 32);
    sha256_final(&c, out);
    memset(k, 0, sizeof(k));
    memset(pad, 0, sizeof(pad));
}

void
pd_hmac_sha256(const void *key, size_t keylen, const void *msg, size_t msglen,
               uint8_t out[32])
{
    hmac_parts(key, keylen, msg, msglen, NULL, 0, NULL, 0, out);
}

/* -------------------------------------------------------------- handshake */

static int
ct_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < n; i++) {
        diff |= (uint8_t)(a[i] ^ b[i]);
    }
    return diff == 0;
}

static void
make_word(uint8_t w[AUTH_WORD], int has_secret)
{
    w[0] = 'P';
    w[1] = 'D';
    w[2] = 'D';
    w[3] = 'P';
    w[4] = (uint8_t)(AUTH_VERSION >> 8);
    w[5] = (uint8_t)(AUTH_VERSION & 0xff);
    w[6] = 0;
    w[7] = has_secret ? 1 : 0;
}

static void
peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN];
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
            snprintf(buf, len, "%s:%d", host, (int)ntohs(in4->sin_port));
            return;
        }
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
            snprintf(buf, len, "[%s]:%d", host, (int)ntohs(in6->sin6_port));
            return;
        }
    }
    snprintf(buf, len, "peer");
}

/* Check the peer's hello word against ours.  who: "client" or "server". */
static pd_status
check_word(int fd, const uint8_t w[AUTH_WORD], int we_have_secret,
           const char *who)
{
    char pn[INET6_ADDRSTRLEN + 16];
    if (memcmp(w, "PDDP", 4) != 0) {
        peer_name(fd, pn, sizeof(pn));
        return pd_error(PD_EAUTH,
                        "authentication with %s %s failed: it is not a pyddp "
                        "process (bad handshake magic %02x%02x%02x%02x)",
                        who, pn, w[0], w[1], w[2], w[3]);
    }
    unsigned ver = ((unsigned)w[4] << 8) | w[5];
    if (ver != AUTH_VERSION) {
        peer_name(fd, pn, sizeof(pn));
        return pd_error(PD_EAUTH,
                        "authentication with %s %s failed: it speaks handshake "
                        "version %u, this process speaks %u (mixed pyddp "
                        "versions?)", who, pn, ver, AUTH_VERSION);
    }
    int peer_secret = w[7] != 0;
    if (w[6] != 0 || w[7] > 1) {
        peer_name(fd, pn, sizeof(pn));
        return pd_error(PD_EAUTH,
                        "authentication with %s %s failed: bad handshake mode "
                        "%02x%02x", who, pn, w[6], w[7]);
    }
    if (peer_secret != we_have_secret) {
        peer_name(fd, pn, sizeof(pn));
        if (we_have_secret) {
            return pd_error(PD_EAUTH,
                            "authentication with %s %s failed: this process has "
                            "PYDDP_SECRET set but the %s does not use a secret",
                            who, pn, who);
        }
        return pd_error(PD_EAUTH,
                        "authentication with %s %s failed: the %s requires a "
                        "secret (PYDDP_SECRET) but this process has none",
                        who, pn, who);
    }
    return PD_OK;
}

/* Load the HMAC key: keys longer than the SHA-256 block are replaced by
 * their hash (RFC 2104), which gives the same MACs and a bounded size. */
static void
load_key(const char *secret, char out[256], size_t *len_out)
{
    size_t n = secret != NULL ? strlen(secret) : 0;
    if (n > 64) {
        uint8_t h[32];
        pd_sha256(secret, n, h);
        memcpy(out, h, 32);
        *len_out = 32;
        memset(h, 0, sizeof(h));
    } else {
        if (n > 0) {
            memcpy(out, secret, n);
        }
        *len_out = n;
    }
}

static void
proof(const char *key, size_t keylen, char role, const uint8_t *nonce_s,
      const uint8_t *nonce_c, uint8_t out[AUTH_MAC])
{
    hmac_parts(key, keylen, &role, 1, nonce_s, AUTH_NONCE, nonce_c,
               AUTH_NONCE, out);
}

pd_status
pd_auth_srv_init(pd_auth_srv *a, const char *secret)
{
    memset(a, 0, sizeof(*a));
    load_key(secret, a->secret, &a->secret_len);
    int has = a->secret_len > 0;
    make_word(a->buf, has);
    if (has) {
        PD_CHECK(pd_random_bytes(a->nonce_s, AUTH_NONCE));
        memcpy(a->buf + AUTH_WORD, a->nonce_s, AUTH_NONCE);
    }
    a->stage = SRV_SEND_HELLO;
    a->want_write = 1;
    a->off = 0;
    return PD_OK;
}

/* Non-blocking partial transfer of a->buf[a->off .. total).  Returns PD_OK
 * with *complete set when all bytes moved, PD_OK with *complete 0 on
 * EAGAIN, or a failure. */
static pd_status
srv_io(pd_auth_srv *a, int fd, size_t total, int sending, int *complete)
{
    *complete = 0;
    while (a->off < total) {
        ssize_t r;
        if (sending) {
            r = send(fd, a->buf + a->off, total - a->off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
        } else {
            r = recv(fd, a->buf + a->off, total - a->off, MSG_DONTWAIT);
        }
        if (r > 0) {
            a->off += (size_t)r;
            continue;
        }
        char pn[INET6_ADDRSTRLEN + 16];
        if (r == 0 && !sending) {
            peer_name(fd, pn, sizeof(pn));
            return pd_error(PD_EAUTH,
                            "authentication of client %s failed: it closed the "
                            "connection during the handshake", pn);
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return PD_OK;
        }
        peer_name(fd, pn, sizeof(pn));
        return pd_syserror(PD_ENETWORK,
                           "authentication of client %s: %s during handshake",
                           pn, sending ? "send" : "recv");
    }
    *complete = 1;
    return PD_OK;
}

pd_status
pd_auth_srv_step(pd_auth_srv *a, int fd)
{
    int complete = 0;
    int has = a->secret_len > 0;
    for (;;) {
        switch (a->stage) {
        case SRV_SEND_HELLO:
            a->want_write = 1;
            PD_CHECK(srv_io(a, fd, AUTH_WORD + (has ? AUTH_NONCE : 0), 1,
                            &complete));
            if (!complete) {
                return PD_OK;
            }
            a->stage = SRV_RECV_WORD;
            a->off = 0;
            a->want_write = 0;
            break;
        case SRV_RECV_WORD:
            a->want_write = 0;
            PD_CHECK(srv_io(a, fd, AUTH_WORD, 0, &complete));
            if (!complete) {
                return PD_OK;
            }
            if (memcmp(a->buf, "PDDP", 4) == 0) {
                a->refused = 1; /* a pyddp process: only a failure counts */
            }
            PD_CHECK(check_word(fd, a->buf, has, "client"));
            a->refused = 0;
            a->off = 0;
            if (!has) {
                a->stage = SRV_DONE;
                a->done = 1;
                return PD_OK;
            }
            a->stage = SRV_RECV_PROOF;
            break;
        case SRV_RECV_PROOF: {
            a->want_write = 0;
            PD_CHECK(srv_io(a, fd, AUTH_NONCE + AUTH_MAC, 0, &complete));
            if (!complete) {
                return PD_OK;
            }
            uint8_t expect[AUTH_MAC];
            memcpy(a->nonce_c, a->buf, AUTH_NONCE);
            proof(a->secret, a->secret_len, 'C', a->nonce_s, a->nonce_c,
                  expect);
            if (!ct_equal(expect, a->buf + AUTH_NONCE, AUTH_MAC)) {
                char pn[INET6_ADDRSTRLEN + 16];
                peer_name(fd, pn, sizeof(pn));
                a->refused = 1;
                return pd_error(PD_EAUTH,
                                "authentication of client %s failed: wrong "
                                "secret (PYDDP_SECRET differs)", pn);
            }
            proof(a->secret, a->secret_len, 'S', a->nonce_s, a->nonce_c,
                  a->buf);
            a->off = 0;
            a->stage = SRV_SEND_PROOF;
            break;
        }
        case SRV_SEND_PROOF:
            a->want_write = 1;
            PD_CHECK(srv_io(a, fd, AUTH_MAC, 1, &complete));
            if (!complete) {
                return PD_OK;
            }
            a->stage = SRV_DONE;
            a->want_write = 0;
            a->done = 1;
            /* The key is no longer needed: do not keep it around. */
            memset(a->secret, 0, sizeof(a->secret));
            return PD_OK;
        default:
            a->done = 1;
            return PD_OK;
        }
    }
}

void
pd_auth_note_refusal(pd_auth_refusals *r, const char *subsys, const char *who)
{
    r->count++;
    pd_strlcpy(r->last, pd_errmsg(), sizeof(r->last));
    if (r->count > PD_AUTH_REFUSALS_SAID) {
        return;
    }
    PD_NOTICE(subsys,
              "%s refused a connection: %s. If that was a process of this "
              "job, give every process of the job the same PYDDP_SECRET (set "
              "it in every shell or task that starts one, or in none); this "
              "process keeps waiting for the job's ranks until its timeout%s",
              who, r->last,
              r->count == PD_AUTH_REFUSALS_SAID
                  ? " (further refusals are counted, not said)" : "");
}

pd_status
pd_auth_refusals_explain(const pd_auth_refusals *r, pd_status st)
{
    if (r->count == 0) {
        return st;
    }
    char msg[PD_ERRMSG_MAX];
    pd_strlcpy(msg, pd_errmsg(), sizeof(msg));
    return pd_error(st,
                    "%s; meanwhile %d connection%s refused, the last: %s "
                    "(every process of the job needs the same PYDDP_SECRET)",
                    msg, r->count, r->count == 1 ? " was" : "s were", r->last);
}

pd_status
pd_auth_server(int fd, const char *secret, double deadline)
{
    pd_auth_srv a;
    pd_status st = pd_auth_srv_init(&a, secret);
    while (st == PD_OK && !a.done) {
        st = pd_auth_srv_step(&a, fd);
        if (st != PD_OK || a.done) {
            break;
        }
        struct pollfd p = {.fd = fd,
                           .events = a.want_write ? POLLOUT : POLLIN,
                           .revents = 0};
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - pd_now();
            if (left <= 0) {
                char pn[INET6_ADDRSTRLEN + 16];
                peer_name(fd, pn, sizeof(pn));
                st = pd_error(PD_EAUTH,
                              "authentication of client %s failed: handshake "
                              "timed out", pn);
                break;
            }
            ms = left > 2000000.0 ? 2000000000 : (int)(left * 1000.0) + 1;
        }
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) {
            st = pd_syserror(PD_ESYS, "poll (authentication)");
        }
    }
    memset(&a, 0, sizeof(a));
    return st;
}

/* Blocking transfer for the client, turning the server hanging up into an
 * authentication error: a server that rejects us just closes. */
static pd_status
client_io(int fd, void *buf, size_t n, int sending, double deadline,
          const char *what)
{
    pd_status st = sending ? pd_net_send_all(fd, buf, n, deadline)
                           : pd_net_recv_all(fd, buf, n, deadline);
    if (st == PD_OK) {
        return PD_OK;
    }
    char pn[INET6_ADDRSTRLEN + 16];
    peer_name(fd, pn, sizeof(pn));
    if (st == PD_ETIMEOUT) {
        return pd_error(PD_EAUTH,
                        "authentication with server %s failed: handshake timed "
                        "out while waiting for %s: the address belongs to "
                        "another service (another program, not a pyddp store "
                        "or rank, listens there); give this job a free port "
                        "(MASTER_PORT or the launcher's --master_port)",
                        pn, what);
    }
    if (st == PD_ENETWORK && !sending && strcmp(what, "the server's hello") == 0) {
        /* The server speaks first, before it reads a byte of ours: a close
         * before its hello is no verdict on our secret.  The process that
         * listens there closed the connection unanswered (a pyddp one that
         * failed or exited, out of file descriptors for one) or is not
         * pyddp. */
        char cause[PD_ERRMSG_MAX];
        snprintf(cause, sizeof(cause), "%s", pd_errmsg());
        return pd_error(PD_EAUTH,
                        "authentication with server %s failed: it closed the "
                        "connection before its hello (%s), without reading "
                        "ours: the process listening there failed or exited "
                        "(e.g. it ran out of file descriptors: see its "
                        "output), or it is not a pyddp store or rank", pn,
                        cause);
    }
    if (st == PD_ENETWORK) {
        char cause[PD_ERRMSG_MAX];
        snprintf(cause, sizeof(cause), "%s", pd_errmsg());
        return pd_error(PD_EAUTH,
                        "authentication with server %s failed: the connection "
                        "broke while sending or waiting for %s (%s): the "
                        "server refused this job's secret, so the address most "
                        "likely belongs to another job or service (another "
                        "pyddp job, whose PYDDP_SECRET differs, or another "
                        "program); give this job a free port (MASTER_PORT or "
                        "the launcher's --master_port; pyddp-run --standalone "
                        "picks one), or, if that server is this job's, give "
                        "every process the same PYDDP_SECRET", pn, what, cause);
    }
    return st;
}

pd_status
pd_auth_client(int fd, const char *secret, double deadline)
{
    pd_status st = PD_OK;
    char key[256];
    size_t keylen = 0;
    int has = secret != NULL && secret[0] != '\0';
    uint8_t hello[AUTH_WORD + AUTH_NONCE];
    uint8_t word[AUTH_WORD];
    uint8_t nonce_s[AUTH_NONCE];
    uint8_t mac[AUTH_MAC];
    uint8_t expect[AUTH_MAC];

    load_key(secret, key, &keylen);
    make_word(hello, has);
    if (has) {
        PD_CHECK_GOTO(pd_random_bytes(hello + AUTH_WORD, AUTH_NONCE), st, out);
    }
    PD_CHECK_GOTO(client_io(fd, hello, AUTH_WORD + (has ? AUTH_NONCE : 0), 1,
                            deadline, "the hello"), st, out);
    PD_CHECK_GOTO(client_io(fd, word, AUTH_WORD, 0, deadline,
                            "the server's hello"), st, out);
    PD_CHECK_GOTO(check_word(fd, word, has, "server"), st, out);
    if (!has) {
        goto out;
    }
    PD_CHECK_GOTO(client_io(fd, nonce_s, AUTH_NONCE, 0, deadline,
                            "the server's nonce"), st, out);
    proof(key, keylen, 'C', nonce_s, hello + AUTH_WORD, mac);
    PD_CHECK_GOTO(client_io(fd, mac, AUTH_MAC, 1, deadline, "our proof"), st,
                  out);
    PD_CHECK_GOTO(client_io(fd, mac, AUTH_MAC, 0, deadline,
                            "the server's proof"), st, out);
    proof(key, keylen, 'S', nonce_s, hello + AUTH_WORD, expect);
    if (!ct_equal(expect, mac, AUTH_MAC)) {
        char pn[INET6_ADDRSTRLEN + 16];
        peer_name(fd, pn, sizeof(pn));
        st = pd_error(PD_EAUTH,
                      "authentication with server %s failed: it does not know "
                      "our secret (PYDDP_SECRET differs)", pn);
    }
out:
    memset(key, 0, sizeof(key));
    return st;
}
