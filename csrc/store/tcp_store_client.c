/* The TCPStore client: requests over one authenticated socket, shared by
 * any number of threads.  On the master it also owns the server thread.
 *
 * Threads do not hold a lock while they wait for their reply: each request
 * registers a slot under its sequence number and sends its frame (under the
 * send lock); then one waiting thread at a time acts as the reader, reading
 * frames and handing each to the slot of its sequence number, while the
 * others sleep on a condition variable.  So a get() blocked in one thread
 * never delays another thread's set(), not even the set it waits for.
 *
 * User keys travel with a "/" prefix (as in torch), so internal keys such as
 * the worker counter "init/" never collide with them, and error messages
 * read like torch's: "wait timeout after 1000ms, keys: /foo".
 *
 * A GET or WAIT that times out is cancelled on the server (CANCEL seq); a
 * reply that still comes is dropped, since no slot waits for it.  A
 * connection that breaks stays broken: every later call fails at once
 * naming the server, instead of stalling.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../util/sync.h"
#include "../util/auth.h"
#include "../util/log.h"
#include "../util/net.h"
#include "kvmap.h"
#include "store.h"
#include "tcp_proto.h"

#define USER_PREFIX "/"
#define INIT_KEY "init/"
/* Time allowed to send a CANCEL after a timed-out wait. */
#define CANCEL_GRACE 5.0
/* A pyddp server greets a connection as it accepts it.  Silence past
 * HELLO_SAY is said (naming the address); past HELLO_LIMIT it is an error:
 * another program holds the port, or the store's host stopped accepting. */
#define HELLO_SAY 3.0
#define HELLO_LIMIT 10.0
/* First allocation for a reply body; larger ones grow as they arrive. */
#define RX_CHUNK ((size_t)64 << 10)

/* A request waiting for its reply. */
typedef struct ts_slot {
    struct ts_slot *next;
    uint32_t seq;
    int done;
    uint8_t *body; /* the reply frame body, malloc'd */
    size_t len;
} ts_slot;

typedef struct tcp_store {
    pd_store base;
    pthread_mutex_t mu;      /* slots, reader, seq, broken, rx state */
    pthread_cond_t cv;       /* a slot completed or the reader left */
    pthread_mutex_t send_mu; /* one frame on the wire at a time */
    int mu_init;
    int cv_init;
    int send_mu_init;
    int fd;
    int broken;
    char broken_msg[PD_ERRMSG_MAX];
    char *host;
    int port;
    uint32_t seq;
    ts_slot *slots;
    int reader;              /* a thread is reading replies */
    /* The frame being read, kept across readers (a reader whose deadline
     * passes mid-frame leaves the rest to the next one). */
    uint8_t hdr[4];
    size_t hdr_got;
    uint8_t *rx;
    size_t rx_len;  /* the frame's body length */
    size_t rx_cap;  /* allocated: grows with what arrived, up to rx_len */
    size_t rx_got;
    pd_tcp_server *server;
} tcp_store;

static const pd_store_ops tcp_ops;

static tcp_store *
ts_of(pd_store *s)
{
    return (tcp_store *)s;
}

static double
deadline_of(double timeout)
{
    return timeout > 0 ? pd_now() + timeout : 0;
}

/* Mark the connection unusable (caller holds mu) with the current message
 * as the cause, and wake everyone.  shutdown() rather than close(): other
 * threads may still be in send() or poll() on the fd. */
static void
ts_mark_broken(tcp_store *t, const char *what)
{
    if (!t->broken) {
        t->broken = 1;
        snprintf(t->broken_msg, sizeof(t->broken_msg),
                 "TCPStore: connection to the server at %s:%d lost during %s: "
                 "%s", t->host, t->port, what, pd_errmsg());
        if (t->fd >= 0) {
            (void)shutdown(t->fd, SHUT_RDWR);
        }
    }
    pthread_cond_broadcast(&t->cv);
}

static pd_status
ts_broken_error(tcp_store *t)
{
    return pd_error(PD_ENETWORK, "%s", t->broken_msg);
}

/* Read bytes into p[*got..n) until complete or deadline; progress is kept
 * in *got.  Only the reader calls this, without mu. */
static pd_status
ts_read_some(tcp_store *t, uint8_t *p, size_t n, size_t *got, double deadline)
{
    while (*got < n) {
        ssize_t r = recv(t->fd, p + *got, n - *got, MSG_DONTWAIT);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) {
            return pd_error(PD_ENETWORK, "the server closed the connection");
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            return pd_syserror(PD_ENETWORK, "recv");
        }
        for (;;) {
            int ms = -1;
            if (deadline > 0) {
                double left = deadline - pd_now();
                ms = left <= 0 ? 0 : (left > 1e6 ? 1000000000
                                                 : (int)(left * 1000.0) + 1);
            }
            struct pollfd pf = {.fd = t->fd, .events = POLLIN, .revents = 0};
            int pr = poll(&pf, 1, ms);
            if (pr > 0) {
                break;
            }
            if (pr < 0 && errno != EINTR) {
                return pd_syserror(PD_ENETWORK, "poll");
            }
            if (pr == 0 && deadline > 0 && pd_now() >= deadline) {
                return PD_ETIMEOUT;
            }
        }
    }
    return PD_OK;
}

/* As the reader: read frames and deliver them until mine is done, the
 * deadline passes (PD_ETIMEOUT) or the connection fails.  Called and
 * returns with mu held. */
static pd_status
ts_read_replies(tcp_store *t, ts_slot *mine, double deadline)
{
    while (!mine->done) {
        pthread_mutex_unlock(&t->mu);
        pd_status st = PD_OK;
        if (t->hdr_got < 4) {
            st = ts_read_some(t, t->hdr, 4, &t->hdr_got, deadline);
            if (st == PD_OK) {
                size_t blen = pd_rd32(t->hdr);
                if (blen < PD_TS_HDR || blen > PD_TS_MAX_FRAME) {
                    st = pd_error(PD_ENETWORK, "malformed reply of %zu bytes",
                                  blen);
                } else {
                    t->rx_len = blen;
                    t->rx_cap = 0;
                    t->rx_got = 0;
                }
            }
        }
        /* The buffer grows as the body arrives (at most doubling), so a
         * length field alone never allocates a gigabyte. */
        while (st == PD_OK && t->rx_got < t->rx_len) {
            if (t->rx_got == t->rx_cap) {
                size_t cap = t->rx_cap >= RX_CHUNK ? 2 * t->rx_cap : RX_CHUNK;
                cap = cap < t->rx_len ? cap : t->rx_len;
                uint8_t *p = realloc(t->rx, cap);
                if (p == NULL) {
                    st = pd_error(PD_ENETWORK, "out of memory for a reply of "
                                  "%zu bytes", t->rx_len);
                    break;
                }
                t->rx = p;
                t->rx_cap = cap;
            }
            st = ts_read_some(t, t->rx, t->rx_cap, &t->rx_got, deadline);
        }
        pthread_mutex_lock(&t->mu);
        if (st != PD_OK) {
            return st;
        }
        /* A whole frame: hand it to its slot, or drop it (a cancelled
         * wait's late answer). */
        uint8_t *body = t->rx;
        size_t len = t->rx_len;
        uint32_t seq = pd_rd32(body + 1);
        t->rx = NULL;
        t->rx_len = t->rx_cap = t->rx_got = t->hdr_got = 0;
        ts_slot *s = t->slots;
        while (s != NULL && s->seq != seq) {
            s = s->next;
        }
        if (s != NULL && !s->done) {
            s->body = body;
            s->len = len;
            s->done = 1;
            pthread_cond_broadcast(&t->cv);
        } else {
            free(body);
        }
    }
    return PD_OK;
}

static void
ts_unregister(tcp_store *t, ts_slot *slot)
{
    ts_slot **pp = &t->slots;
    while (*pp != NULL && *pp != slot) {
        pp = &(*pp)->next;
    }
    if (*pp == slot) {
        *pp = slot->next;
    }
}

/* Sleep on cv until woken or deadline (0: none); 1 when it passed. */
static int
ts_sleep(tcp_store *t, double deadline)
{
    return pd_cond_wait_until(&t->cv, &t->mu, deadline);
}

static pd_status
ts_send_frame(tcp_store *t, const pd_wbuf *req, double deadline,
              const char *what)
{
    pthread_mutex_lock(&t->send_mu);
    pd_status st = pd_net_send_all(t->fd, req->p, req->len, deadline);
    pthread_mutex_unlock(&t->send_mu);
    if (st != PD_OK) {
        /* Part of a frame may be on the wire: the stream is unusable. */
        pthread_mutex_lock(&t->mu);
        ts_mark_broken(t, what);
        st = ts_broken_error(t);
        pthread_mutex_unlock(&t->mu);
    }
    return st;
}

/* One request and its reply.  ts_req_begin starts the frame (the caller
 * appends the arguments to r->b), ts_req_call sends it and waits for the
 * reply, leaving its payload in r->rd for the caller to read, and
 * ts_req_end frees the reply and reports a malformed one. */
typedef struct ts_req {
    tcp_store *t;
    const char *what;  /* the command, for messages */
    pd_wbuf b;
    size_t at;
    uint32_t seq;
    uint8_t *body;     /* the reply frame body */
    pd_rbuf rd;        /* its payload */
} ts_req;

static void
ts_req_begin(ts_req *r, tcp_store *t, uint8_t cmd, const char *what)
{
    memset(r, 0, sizeof(*r));
    r->t = t;
    r->what = what;
    pthread_mutex_lock(&t->mu);
    r->seq = ++t->seq;
    pthread_mutex_unlock(&t->mu);
    r->at = pd_wbuf_begin(&r->b, cmd, r->seq);
}

/* Tell the server to drop the parked request seq; its reply is ignored. */
static void
ts_cancel(tcp_store *t, uint32_t target)
{
    ts_req r;
    ts_req_begin(&r, t, PD_TS_CANCEL, "cancel");
    pd_wbuf_u32(&r.b, target);
    pd_wbuf_end(&r.b, r.at);
    if (!r.b.oom) {
        (void)ts_send_frame(t, &r.b, pd_now() + CANCEL_GRACE,
                            "the cancellation of a timed-out wait");
    }
    pd_wbuf_free(&r.b);
}

/* Send the request in req (built with sequence seq) and wait for its reply.
 * is_wait marks a GET/WAIT: its deadline is wait_timeout and running past
 * it gives PD_ETIMEOUT (the request is cancelled, the connection kept).
 * Other requests are bounded by the store's timeout.  On success *body is
 * the reply frame body (malloc'd; the caller frees it), whose payload
 * starts at PD_TS_HDR. */
static pd_status
ts_call(tcp_store *t, pd_wbuf *req, uint32_t seq, const char *what,
        int is_wait, double wait_timeout, uint8_t **body, size_t *len)
{
    ts_slot slot = {.next = NULL, .seq = seq, .done = 0, .body = NULL,
                    .len = 0};
    double timeout = is_wait ? wait_timeout : pd_store_timeout(&t->base);
    double deadline = deadline_of(timeout);
    pd_status st = PD_OK;
    int timed_out = 0;

    *body = NULL;
    if (req->oom) {
        return pd_error(PD_ENOMEM, "TCPStore.%s: out of memory building the "
                        "request", what);
    }
    if (req->len - 4 > PD_TS_MAX_FRAME) {
        return pd_error(PD_EINVAL, "TCPStore.%s: a request of %zu bytes "
                        "exceeds the limit of %zu bytes", what, req->len,
                        PD_TS_MAX_FRAME);
    }
    pthread_mutex_lock(&t->mu);
    if (t->broken) {
        /* broken by an earlier call: say which call this is, and that the
         * connection broke before it */
        const char *m = t->broken_msg;
        if (strncmp(m, "TCPStore: ", 10) == 0) {
            m += 10;
        }
        st = pd_error(PD_ENETWORK, "TCPStore.%s: %s (earlier; a broken "
                      "connection is not reopened)", what, m);
        pthread_mutex_unlock(&t->mu);
        return st;
    }
    slot.next = t->slots;
    t->slots = &slot;
    pthread_mutex_unlock(&t->mu);

    st = ts_send_frame(t, req, deadline, what);

    pthread_mutex_lock(&t->mu);
    while (st == PD_OK && !slot.done && !t->broken) {
        if (!t->reader) {
            t->reader = 1;
            pd_status rst = ts_read_replies(t, &slot, deadline);
            t->reader = 0;
            pthread_cond_broadcast(&t->cv); /* someone else may read now */
            if (rst == PD_ETIMEOUT) {
                timed_out = 1;
                break;
            }
            if (rst != PD_OK) {
                ts_mark_broken(t, what);
            }
        } else if (ts_sleep(t, deadline) && !slot.done) {
            timed_out = 1;
            break;
        }
    }
    ts_unregister(t, &slot);
    if (st == PD_OK && !slot.done && !timed_out) {
        st = ts_broken_error(t);
    }
    pthread_mutex_unlock(&t->mu);

    if (st != PD_OK) {
        free(slot.body);
        return st;
    }
    if (timed_out) {
        if (is_wait) {
            ts_cancel(t, seq);
            return PD_ETIMEOUT;
        }
        return pd_error(PD_ENETWORK, "TCPStore: no reply from the server at "
                        "%s:%d to %s within %.0fms", t->host, t->port, what,
                        timeout * 1000.0);
    }
    uint8_t code = slot.body[0];
    if (code != 0) {
        pd_rbuf rd = {.p = slot.body, .n = slot.len, .off = PD_TS_HDR,
                      .bad = 0};
        size_t mlen;
        const char *msg = pd_rbuf_str(&rd, &mlen);
        pd_status err = code < PD_NSTATUS ? (pd_status)code : PD_ESTORE;
        st = pd_error(err, "%s", msg != NULL ? msg : "TCPStore: server error");
        free(slot.body);
        return st;
    }
    *body = slot.body;
    *len = slot.len;
    return PD_OK;
}

static pd_status
ts_bad_reply(tcp_store *t, const char *what)
{
    pd_error(PD_ENETWORK, "malformed reply");
    pthread_mutex_lock(&t->mu);
    ts_mark_broken(t, what);
    pd_status st = ts_broken_error(t);
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* is_wait and timeout as in ts_call.  On failure nothing is left to free. */
static pd_status
ts_req_call(ts_req *r, int is_wait, double timeout)
{
    size_t len = 0;
    pd_wbuf_end(&r->b, r->at);
    pd_status st = ts_call(r->t, &r->b, r->seq, r->what, is_wait, timeout,
                           &r->body, &len);
    pd_wbuf_free(&r->b);
    r->rd = (pd_rbuf){.p = r->body, .n = len, .off = PD_TS_HDR, .bad = 0};
    return st;
}

static pd_status
ts_req_end(ts_req *r)
{
    free(r->body);
    r->body = NULL;
    return r->rd.bad ? ts_bad_reply(r->t, r->what) : PD_OK;
}

/* A reply carrying one bytes value: copy it out. */
static pd_status
ts_req_end_bytes(ts_req *r, uint8_t **val, size_t *n)
{
    size_t vlen;
    const uint8_t *v = pd_rbuf_bytes(&r->rd, &vlen);
    pd_status st = PD_OK;
    if (!r->rd.bad) {
        st = pd_kv_dup(v, vlen, val);
        if (st == PD_OK) {
            *n = vlen;
        }
    }
    pd_status est = ts_req_end(r);
    return st != PD_OK ? st : est;
}

/* ------------------------------------------------------------- commands */

static pd_status
ts_set_raw(tcp_store *t, const char *prefix, const char *key, const void *val,
           size_t n)
{
    ts_req r;
    ts_req_begin(&r, t, PD_TS_SET, "set");
    pd_wbuf_str(&r.b, prefix, key);
    pd_wbuf_bytes(&r.b, val, n);
    PD_CHECK(ts_req_call(&r, 0, 0));
    return ts_req_end(&r);
}

static pd_status
ts_set(pd_store *s, const char *key, const void *val, size_t n)
{
    return ts_set_raw(ts_of(s), USER_PREFIX, key, val, n);
}

static pd_status
ts_get(pd_store *s, const char *key, double timeout, uint8_t **val,
       size_t *n)
{
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_GET, "get");
    pd_wbuf_str(&r.b, USER_PREFIX, key);
    pd_status st = ts_req_call(&r, 1, timeout);
    if (st == PD_ETIMEOUT) {
        return pd_tcp_server_explain_refusals(
            r.t->server, pd_store_timeout_error(USER_PREFIX, timeout, &key, 1));
    }
    PD_CHECK(st);
    return ts_req_end_bytes(&r, val, n);
}

static pd_status
ts_add_raw(tcp_store *t, const char *prefix, const char *key, int64_t delta,
           int64_t *out)
{
    ts_req r;
    ts_req_begin(&r, t, PD_TS_ADD, "add");
    pd_wbuf_str(&r.b, prefix, key);
    pd_wbuf_i64(&r.b, delta);
    PD_CHECK(ts_req_call(&r, 0, 0));
    *out = pd_rbuf_i64(&r.rd);
    return ts_req_end(&r);
}

static pd_status
ts_add(pd_store *s, const char *key, int64_t delta, int64_t *out)
{
    return ts_add_raw(ts_of(s), USER_PREFIX, key, delta, out);
}

static pd_status
ts_compare_set(pd_store *s, const char *key, const void *expected,
               size_t explen, const void *desired, size_t deslen,
               uint8_t **out, size_t *outlen)
{
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_CAS, "compare_set");
    pd_wbuf_str(&r.b, USER_PREFIX, key);
    pd_wbuf_bytes(&r.b, expected, explen);
    pd_wbuf_bytes(&r.b, desired, deslen);
    PD_CHECK(ts_req_call(&r, 0, 0));
    return ts_req_end_bytes(&r, out, outlen);
}

/* WAIT or CHECK over a list of user keys. */
static pd_status
ts_keys_cmd(tcp_store *t, uint8_t cmd, const char *const *keys, size_t n,
            double timeout, int *out)
{
    ts_req r;
    ts_req_begin(&r, t, cmd, cmd == PD_TS_WAIT ? "wait" : "check");
    pd_wbuf_u32(&r.b, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        pd_wbuf_str(&r.b, USER_PREFIX, keys[i]);
    }
    pd_status st = ts_req_call(&r, cmd == PD_TS_WAIT, timeout);
    if (st == PD_ETIMEOUT) {
        return pd_tcp_server_explain_refusals(
            t->server, pd_store_timeout_error(USER_PREFIX, timeout, keys, n));
    }
    PD_CHECK(st);
    if (cmd == PD_TS_CHECK) {
        *out = pd_rbuf_u8(&r.rd) != 0;
    }
    return ts_req_end(&r);
}

static pd_status
ts_wait(pd_store *s, const char *const *keys, size_t n, double timeout)
{
    int dummy;
    return ts_keys_cmd(ts_of(s), PD_TS_WAIT, keys, n, timeout, &dummy);
}

static pd_status
ts_check(pd_store *s, const char *const *keys, size_t n, int *out)
{
    return ts_keys_cmd(ts_of(s), PD_TS_CHECK, keys, n, 0, out);
}

static pd_status
ts_delete_key(pd_store *s, const char *key, int *deleted)
{
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_DELETE, "delete_key");
    pd_wbuf_str(&r.b, USER_PREFIX, key);
    PD_CHECK(ts_req_call(&r, 0, 0));
    *deleted = pd_rbuf_u8(&r.rd) != 0;
    return ts_req_end(&r);
}

/* A request without arguments whose reply is empty or one i64. */
static pd_status
ts_simple(tcp_store *t, uint8_t cmd, const char *what, int64_t *out)
{
    ts_req r;
    ts_req_begin(&r, t, cmd, what);
    PD_CHECK(ts_req_call(&r, 0, 0));
    if (out != NULL) {
        *out = pd_rbuf_i64(&r.rd);
    }
    return ts_req_end(&r);
}

static pd_status
ts_num_keys(pd_store *s, int64_t *out)
{
    return ts_simple(ts_of(s), PD_TS_NUM_KEYS, "num_keys", out);
}

static pd_status
ts_append(pd_store *s, const char *key, const void *val, size_t n)
{
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_APPEND, "append");
    pd_wbuf_str(&r.b, USER_PREFIX, key);
    pd_wbuf_bytes(&r.b, val, n);
    PD_CHECK(ts_req_call(&r, 0, 0));
    return ts_req_end(&r);
}

static pd_status
ts_list_keys(pd_store *s, char ***keys, size_t *n)
{
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_LIST, "list_keys");
    pd_wbuf_str(&r.b, "", USER_PREFIX);
    PD_CHECK(ts_req_call(&r, 0, 0));
    size_t blen;
    const uint8_t *blob = pd_rbuf_bytes(&r.rd, &blen);
    pd_rbuf rd = {.p = blob, .n = blen, .off = 0, .bad = r.rd.bad};
    uint32_t cnt = pd_rbuf_u32(&rd);
    pd_status st = PD_OK;
    char **ks = NULL;
    size_t got = 0;
    if (!rd.bad && cnt <= blen / 5) {
        ks = calloc(cnt ? cnt : 1, sizeof(*ks));
        if (ks == NULL) {
            st = pd_error(PD_ENOMEM, "TCPStore.list_keys: out of memory");
        }
        for (; st == PD_OK && got < cnt; got++) {
            size_t kl;
            const char *k = pd_rbuf_str(&rd, &kl);
            if (rd.bad) {
                break;
            }
            ks[got] = malloc(kl + 1);
            if (ks[got] == NULL) {
                st = pd_error(PD_ENOMEM, "TCPStore.list_keys: out of memory");
                break;
            }
            memcpy(ks[got], k, kl + 1);
        }
    } else {
        rd.bad = 1;
    }
    r.rd.bad |= rd.bad || rd.off != rd.n;
    pd_status est = ts_req_end(&r);
    if (st == PD_OK) {
        st = est;
    }
    if (st != PD_OK) {
        pd_store_free_keys(ks, got);
        return st;
    }
    *keys = ks;
    *n = got;
    return PD_OK;
}

static void
ts_destroy(pd_store *s)
{
    tcp_store *t = ts_of(s);
    /* The client goes first, so the server sees an orderly close. */
    if (t->fd >= 0) {
        (void)close(t->fd);
    }
    pd_tcp_server_stop(t->server);
    free(t->rx);
    free(t->host);
    if (t->cv_init) {
        pthread_cond_destroy(&t->cv);
    }
    if (t->send_mu_init) {
        pthread_mutex_destroy(&t->send_mu);
    }
    if (t->mu_init) {
        pthread_mutex_destroy(&t->mu);
    }
    free(t);
}

static const pd_store_ops tcp_ops = {
    .name = "TCPStore",
    .set = ts_set,
    .get = ts_get,
    .add = ts_add,
    .compare_set = ts_compare_set,
    .wait = ts_wait,
    .check = ts_check,
    .delete_key = ts_delete_key,
    .num_keys = ts_num_keys,
    .append = ts_append,
    .list_keys = ts_list_keys,
    .destroy = ts_destroy,
};

/* -------------------------------------------------------------- public */

static void
sleep_seconds(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait for the first byte of the server's hello (the handshake then reads
 * it), saying so at HELLO_SAY and failing at HELLO_LIMIT: a connection the
 * kernel accepted for a program that never answers must not wait out the
 * whole store timeout in silence. */
static pd_status
wait_for_hello(tcp_store *t, double deadline, double timeout)
{
    double start = pd_now();
    double limit = start + HELLO_LIMIT;
    int said = 0, cut = 0; /* cut: the store's timeout ends the wait first */

    if (deadline > 0 && deadline < limit) {
        limit = deadline;
        cut = 1;
    }
    for (;;) {
        double now = pd_now();
        double until = said ? limit : start + HELLO_SAY;
        until = until < limit ? until : limit;
        int ms = until > now ? (int)((until - now) * 1000.0) + 1 : 0;
        struct pollfd pf = {.fd = t->fd, .events = POLLIN, .revents = 0};
        int pr = poll(&pf, 1, ms);
        if (pr > 0) {
            return PD_OK; /* bytes, or a close: the handshake says which */
        }
        if (pr < 0 && errno != EINTR) {
            return pd_syserror(PD_ENETWORK, "poll");
        }
        now = pd_now();
        if (now >= limit && cut) {
            /* Most of the timeout went before the connection (a store
             * host slow to start, many processes on few cores): blaming
             * another program after a fraction of a second misleads. */
            return pd_error(PD_ENETWORK, "connected to %s:%d, but the "
                            "store's timeout (%.3g s) ran out %.3g s later, "
                            "before the store's first message arrived: its "
                            "host (rank 0) is slow to start or overloaded "
                            "(raise the timeout), or another program listens "
                            "on that port (check MASTER_ADDR and "
                            "MASTER_PORT)", t->host, t->port, timeout,
                            now - start);
        }
        if (now >= limit) {
            return pd_error(PD_ENETWORK, "connected to %s:%d, but nothing "
                            "answered as a pyddp store within %.0f s: another "
                            "program listens on that port (check MASTER_ADDR "
                            "and MASTER_PORT, or the launcher's --master_port), "
                            "or the store's host (rank 0) stopped accepting "
                            "connections (out of file descriptors, stopped, "
                            "overloaded: see its output)", t->host, t->port,
                            now - start);
        }
        if (!said && now >= start + HELLO_SAY) {
            PD_NOTICE("store", "connected to %s:%d, but no pyddp store has "
                      "answered after %.0f s: another program may listen "
                      "there, or the store's host is not accepting (out of "
                      "file descriptors?); giving up in %.0f s", t->host,
                      t->port, now - start, limit - now);
            said = 1;
        }
    }
}

/* torch's rule: every store created with wait_for_workers adds 1 to the
 * "init/" counter; the master then polls it until world_size joined. */
static pd_status
wait_for_workers(tcp_store *t, const pd_tcp_store_opts *o)
{
    int64_t joined = 0;
    double start = pd_now();
    double deadline = deadline_of(o->timeout);
    double pause = 0.001;

    PD_CHECK(ts_add_raw(t, "", INIT_KEY, 1, &joined));
    if (!o->is_master) {
        return PD_OK;
    }
    while (joined < o->world_size) {
        if (deadline > 0 && pd_now() >= deadline) {
            return pd_tcp_server_explain_refusals(
                t->server,
                pd_error(PD_ESTORE,
                         "Timed out after %.0f seconds waiting for clients. "
                         "%" PRId64 "/%d clients joined.",
                         pd_now() - start, joined, o->world_size));
        }
        sleep_seconds(pause);
        pause = pause * 2 > 0.01 ? 0.01 : pause * 2;
        PD_CHECK(ts_add_raw(t, "", INIT_KEY, 0, &joined));
    }
    return PD_OK;
}

void
pd_tcp_store_opts_init(pd_tcp_store_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->world_size = -1;
    o->timeout = 300.0;
    o->wait_for_workers = 1;
    o->listen_fd = -1;
}

pd_status
pd_tcp_store_new(const pd_tcp_store_opts *o, pd_store **out)
{
    pd_status st = PD_OK;
    tcp_store *t = NULL;
    double deadline;

    *out = NULL;
    if (o->host == NULL || o->host[0] == '\0') {
        return pd_error(PD_EINVAL, "TCPStore: host_name must not be empty");
    }
    if (o->port < 0 || o->port > 65535) {
        return pd_error(PD_EINVAL, "TCPStore: port must be in [0, 65535], got "
                        "%d", o->port);
    }
    if (!o->is_master && o->port == 0) {
        return pd_error(PD_EINVAL, "TCPStore: port 0 (pick a free port) is "
                        "only valid for the master (is_master=True)");
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return pd_error(PD_ENOMEM, "TCPStore: out of memory");
    }
    t->base.ops = &tcp_ops;
    t->fd = -1;
    pd_store_set_timeout(&t->base, o->timeout);
    t->host = strdup(o->host);
    if (t->host == NULL) {
        st = pd_error(PD_ENOMEM, "TCPStore: out of memory");
        goto fail;
    }
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        st = pd_error(PD_ESYS, "TCPStore: pthread_mutex_init failed");
        goto fail;
    }
    t->mu_init = 1;
    if (pthread_mutex_init(&t->send_mu, NULL) != 0) {
        st = pd_error(PD_ESYS, "TCPStore: pthread_mutex_init failed");
        goto fail;
    }
    t->send_mu_init = 1;
    PD_CHECK_GOTO(pd_cond_init_monotonic(&t->cv, "TCPStore"), st, fail);
    t->cv_init = 1;
    t->port = o->port;

    if (o->is_master) {
        int lfd = -1;
        if (o->listen_fd >= 0) {
            /* The caller keeps its descriptor; the server owns a copy. */
            lfd = fcntl(o->listen_fd, F_DUPFD_CLOEXEC, 0);
            if (lfd < 0) {
                st = pd_syserror(PD_EINVAL, "TCPStore: master_listen_fd %d",
                                 o->listen_fd);
                goto fail;
            }
        }
        st = pd_tcp_server_start(o->bind_host, o->port, lfd, o->secret,
                                 &t->server);
        if (st != PD_OK) {
            if (st == PD_ENETWORK && strstr(pd_errmsg(), "EADDRINUSE") != NULL) {
                char cause[PD_ERRMSG_MAX];
                snprintf(cause, sizeof(cause), "%s", pd_errmsg());
                st = pd_error(st, "%s; is another TCPStore or program "
                              "already listening on port %d? Choose another "
                              "port, or port 0 for a free one", cause,
                              o->port);
            }
            goto fail;
        }
        t->port = pd_tcp_server_port(t->server);
    }

    deadline = deadline_of(o->timeout);
    PD_CHECK_GOTO(pd_net_connect(t->host, t->port, deadline, &t->fd), st,
                  fail_conn);
    PD_CHECK_GOTO(wait_for_hello(t, deadline, o->timeout), st,
                  fail_conn);
    PD_CHECK_GOTO(pd_auth_client(t->fd, o->secret, deadline), st, fail_conn);
    if (o->wait_for_workers && o->world_size > 0) {
        PD_CHECK_GOTO(wait_for_workers(t, o), st, fail);
    }
    *out = &t->base;
    return PD_OK;
fail_conn:
    pd_error_prefix("TCPStore client");
fail:
    if (t != NULL) {
        ts_destroy(&t->base);
    }
    return st;
}

int
pd_tcp_store_port(const pd_store *s)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return -1;
    }
    return ((const tcp_store *)s)->port;
}

const char *
pd_tcp_store_host(const pd_store *s)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return NULL;
    }
    return ((const tcp_store *)s)->host;
}

pd_status
pd_tcp_store_local_addr(pd_store *s, char *buf, size_t len)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return pd_error(PD_EINVAL, "local_addr: not a TCPStore");
    }
    tcp_store *t = ts_of(s);
    pthread_mutex_lock(&t->mu);
    int broken = t->broken;
    pthread_mutex_unlock(&t->mu);
    if (broken) {
        return ts_broken_error(t);
    }
    /* fd stays open until destroy, so no lock is needed to query it. */
    return pd_net_local_addr(t->fd, buf, len, NULL);
}

pd_status
pd_tcp_store_ping(pd_store *s)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return pd_error(PD_EINVAL, "ping: not a TCPStore");
    }
    return ts_simple(ts_of(s), PD_TS_PING, "ping", NULL);
}

pd_status
pd_tcp_store_will(pd_store *s, const char *key, const void *val, size_t n,
                  int on)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return pd_error(PD_EINVAL, "will: not a TCPStore");
    }
    ts_req r;
    ts_req_begin(&r, ts_of(s), PD_TS_WILL, "will");
    pd_wbuf_u32(&r.b, on ? 1u : 0u);
    pd_wbuf_str(&r.b, USER_PREFIX, key);
    pd_wbuf_bytes(&r.b, on ? val : NULL, on ? n : 0);
    PD_CHECK(ts_req_call(&r, 0, 0));
    return ts_req_end(&r);
}
