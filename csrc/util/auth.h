/* Mutual challenge-response authentication of a fresh TCP connection.
 *
 * When the job secret (PYDDP_SECRET) is set, both ends prove they know it
 * without sending it: each side sends a 32-byte random nonce and answers the
 * other's nonce with HMAC-SHA256(secret, role || nonce_server || nonce_client).
 * A connection that fails is closed by the caller before any application byte
 * is read or written.  With no secret (NULL or ""), both sides still exchange
 * an 8-byte magic+version word, so a stray client is rejected early.
 *
 * The server and client must agree on whether a secret is set: a mismatch is
 * an authentication failure (PD_EAUTH), never a hang (deadline applies).
 */
#ifndef PD_UTIL_AUTH_H
#define PD_UTIL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* SHA-256 and HMAC-SHA256 (FIPS 180-4 / RFC 2104). */
void pd_sha256(const void *data, size_t n, uint8_t out[32]);
void pd_hmac_sha256(const void *key, size_t keylen, const void *msg,
                    size_t msglen, uint8_t out[32]);

/* Blocking handshakes on a connected socket, bounded by deadline. */
pd_status pd_auth_server(int fd, const char *secret, double deadline);
pd_status pd_auth_client(int fd, const char *secret, double deadline);

/* Non-blocking server side, for an event-loop server (the TCPStore thread).
 * Usage: pd_auth_srv_init(&a, secret) then, whenever the fd is readable or
 * writable, pd_auth_srv_step(&a, fd); it returns PD_OK while in progress or
 * finished (check a.done), PD_EAUTH / PD_ENETWORK on failure.  The state
 * tells which poll events it waits for (a.want_write). */
typedef struct pd_auth_srv {
    int stage;
    int done;
    int want_write;
    /* Set when the step failed for a client that speaks pyddp's handshake
     * (a wrong or missing secret, another version): perhaps a process of the
     * job started with another PYDDP_SECRET, worth saying at once
     * (pd_auth_note_refusal); not for a port scanner or a hang-up. */
    int refused;
    size_t off;
    uint8_t buf[128];
    uint8_t nonce_s[32];
    uint8_t nonce_c[32];
    char secret[256];
    size_t secret_len;
} pd_auth_srv;

pd_status pd_auth_srv_init(pd_auth_srv *a, const char *secret);
pd_status pd_auth_srv_step(pd_auth_srv *a, int fd);

/* What a listener (the store server, a rank accepting its peers) refused:
 * a refusal never ends the wait (a stranger can claim to be anyone, and must
 * not be able to stop a job), but the first few are said at once on stderr
 * and the count and the last one go into the wait's timeout message. */
#define PD_AUTH_REFUSALS_SAID 4
typedef struct pd_auth_refusals {
    int count;
    char last[512];
} pd_auth_refusals;

/* Record the refusal whose message is this thread's pd_errmsg() and, for the
 * first PD_AUTH_REFUSALS_SAID, say it (a notice of subsys, who: what
 * refused it, e.g. "the TCPStore server on port 29500"). */
void pd_auth_note_refusal(pd_auth_refusals *r, const char *subsys,
                          const char *who);
/* Append to this thread's error message what r holds (nothing when empty),
 * keeping status st; returns st. */
pd_status pd_auth_refusals_explain(const pd_auth_refusals *r, pd_status st);

#endif
