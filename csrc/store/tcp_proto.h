/* Internal: the TCPStore wire protocol, shared by tcp_store_server.c and
 * tcp_store_client.c.
 *
 * After the handshake of util/auth.h, both directions carry frames:
 *   u32 body length (little-endian), body.
 * Request body:  u8 command, u32 seq, arguments.
 * Response body: u8 status (0 ok, else a pd_status), u32 seq (of the
 *                request), then the result, or on failure a str message.
 * Integers are little-endian; str = u32 n, n bytes, NUL (so keys can be used
 * in place as C strings); bytes = u32 n, n bytes.
 *
 *   SET k v -> -          GET k -> bytes (parked until k exists)
 *   ADD k i64 -> i64      CAS k exp des -> bytes
 *   WAIT u32 n, n*k -> -  (parked until all exist)
 *   CHECK u32 n, n*k -> u8
 *   DELETE k -> u8        NUM_KEYS -> i64        PING -> -
 *   CANCEL u32 seq -> -   (drop this connection's parked GET/WAIT that
 *                          was sent with that seq)
 *   APPEND k v -> -       (value becomes current value, or empty, + v)
 *   LIST prefix -> bytes  (u32 n, n*str: the present keys that start with
 *                          prefix, prefix removed)
 *   WILL u32 on, k v -> -  (on 1: when this connection closes, the server
 *                          sets k to v, as a SET would; on 0: drop the will
 *                          on k.  Waiters learn that a client is gone
 *                          without polling it.)
 *
 * Several threads may share a connection, and parked requests are answered
 * late, so replies come in any order: the client matches them to requests
 * by seq and drops replies nobody waits for any more.
 */
#ifndef PD_STORE_TCP_PROTO_H
#define PD_STORE_TCP_PROTO_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../util/status.h"
#include "store.h"

enum {
    PD_TS_SET = 1,
    PD_TS_GET,
    PD_TS_ADD,
    PD_TS_CAS,
    PD_TS_WAIT,
    PD_TS_CHECK,
    PD_TS_DELETE,
    PD_TS_NUM_KEYS,
    PD_TS_PING,
    PD_TS_CANCEL,
    PD_TS_APPEND,
    PD_TS_LIST,
    PD_TS_WILL,
    PD_TS_LAST = PD_TS_WILL,
};

/* Request header: u8 cmd + u32 seq; response header: u8 status + u32 seq. */
#define PD_TS_HDR 5
/* A frame may hold one value of PD_STORE_MAX_VALUE plus some keys. */
#define PD_TS_MAX_FRAME (PD_STORE_MAX_VALUE + ((size_t)1 << 20))

/* A growable byte buffer. */
typedef struct pd_wbuf {
    uint8_t *p;
    size_t len;
    size_t cap;
    int oom;   /* an append failed: the content is incomplete */
} pd_wbuf;

static inline int
pd_wbuf_reserve(pd_wbuf *b, size_t extra)
{
    if (b->oom) {
        return -1;
    }
    if (b->len + extra <= b->cap) {
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) {
        cap *= 2;
    }
    uint8_t *np = realloc(b->p, cap);
    if (np == NULL) {
        b->oom = 1;
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline void
pd_wbuf_put(pd_wbuf *b, const void *p, size_t n)
{
    if (n == 0 || pd_wbuf_reserve(b, n) < 0) {
        return;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static inline void
pd_wbuf_u8(pd_wbuf *b, uint8_t v)
{
    pd_wbuf_put(b, &v, 1);
}

static inline void
pd_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t
pd_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline void
pd_wbuf_u32(pd_wbuf *b, uint32_t v)
{
    uint8_t t[4];
    pd_le32(t, v);
    pd_wbuf_put(b, t, 4);
}

static inline void
pd_wbuf_i64(pd_wbuf *b, int64_t v)
{
    uint64_t u = (uint64_t)v;
    uint8_t t[8];
    for (int i = 0; i < 8; i++) {
        t[i] = (uint8_t)(u >> (8 * i));
    }
    pd_wbuf_put(b, t, 8);
}

static inline void
pd_wbuf_bytes(pd_wbuf *b, const void *p, size_t n)
{
    pd_wbuf_u32(b, (uint32_t)n);
    pd_wbuf_put(b, p, n);
}

/* str with an optional one-string prefix (the client's "/" for user keys). */
static inline void
pd_wbuf_str(pd_wbuf *b, const char *prefix, const char *s)
{
    size_t pn = strlen(prefix), sn = strlen(s);
    pd_wbuf_u32(b, (uint32_t)(pn + sn));
    pd_wbuf_put(b, prefix, pn);
    pd_wbuf_put(b, s, sn);
    pd_wbuf_u8(b, 0);
}

/* Start a frame: placeholder length; returns its offset for pd_wbuf_end. */
static inline size_t
pd_wbuf_begin(pd_wbuf *b, uint8_t code, uint32_t seq)
{
    size_t at = b->len;
    pd_wbuf_u32(b, 0);
    pd_wbuf_u8(b, code);
    pd_wbuf_u32(b, seq);
    return at;
}

static inline void
pd_wbuf_end(pd_wbuf *b, size_t at)
{
    if (!b->oom) {
        pd_le32(b->p + at, (uint32_t)(b->len - at - 4));
    }
}

static inline void
pd_wbuf_free(pd_wbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* A bounds-checked reader over one frame body. */
typedef struct pd_rbuf {
    const uint8_t *p;
    size_t n;
    size_t off;
    int bad;
} pd_rbuf;

static inline const uint8_t *
pd_rbuf_take(pd_rbuf *r, size_t n)
{
    if (r->bad || r->n - r->off < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

static inline uint8_t
pd_rbuf_u8(pd_rbuf *r)
{
    const uint8_t *p = pd_rbuf_take(r, 1);
    return p ? p[0] : 0;
}

static inline uint32_t
pd_rbuf_u32(pd_rbuf *r)
{
    const uint8_t *p = pd_rbuf_take(r, 4);
    return p ? pd_rd32(p) : 0;
}

static inline int64_t
pd_rbuf_i64(pd_rbuf *r)
{
    const uint8_t *p = pd_rbuf_take(r, 8);
    uint64_t u = 0;
    if (p != NULL) {
        for (int i = 0; i < 8; i++) {
            u |= (uint64_t)p[i] << (8 * i);
        }
    }
    return (int64_t)u;
}

static inline const uint8_t *
pd_rbuf_bytes(pd_rbuf *r, size_t *n)
{
    *n = pd_rbuf_u32(r);
    const uint8_t *p = pd_rbuf_take(r, *n);
    if (p == NULL) {
        *n = 0;
    }
    return p;
}

/* A NUL-terminated str without embedded NULs, used in place. */
static inline const char *
pd_rbuf_str(pd_rbuf *r, size_t *n)
{
    *n = pd_rbuf_u32(r);
    const uint8_t *p = pd_rbuf_take(r, *n);
    const uint8_t *z = pd_rbuf_take(r, 1);
    if (p == NULL || z == NULL || *z != 0 || memchr(p, 0, *n) != NULL) {
        r->bad = 1;
        *n = 0;
        return NULL;
    }
    return (const char *)p;
}

#endif
