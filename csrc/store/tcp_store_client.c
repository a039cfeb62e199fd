/* The TCPStore client: blocking requests over one authenticated socket,
 * serialised by a mutex so threads can share it.  On the master it also owns
 * the server thread.
 *
 * User keys travel with a "/" prefix (as in torch), so internal keys such as
 * the worker counter "init/" can never collide with them, and error messages
 * read like torch's: "wait timeout after 1000ms, keys: /foo".
 *
 * A GET or WAIT that times out is cancelled on the server (CANCEL), and the
 * late answer, if any, is recognised by its sequence number and dropped, so
 * the connection stays usable.  A connection that breaks stays broken: every
 * later call fails at once naming the server, instead of stalling.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../util/auth.h"
#include "../util/net.h"
#include "kvmap.h"
#include "store.h"
#include "tcp_proto.h"

#define USER_PREFIX "/"
#define INIT_KEY "init/"
/* Time allowed for the server to confirm a CANCEL after a timed-out wait. */
#define CANCEL_GRACE 5.0

typedef struct tcp_store {
    pd_store base;
    pthread_mutex_t mu;
    int mu_init;
    int fd;
    char broken[PD_ERRMSG_MAX];    /* why the connection is unusable */
    char *host;
    int port;
    uint32_t seq;
    pd_wbuf req;
    uint8_t *resp;
    size_t resp_cap;
    pd_tcp_server *server;
} tcp_store;

static const pd_store_ops tcp_ops;

static tcp_store *
ts_of(pd_store *s)
{
    return (tcp_store *)s;
}

static void
ts_close_fd(tcp_store *t)
{
    if (t->fd >= 0) {
        (void)close(t->fd);
        t->fd = -1;
    }
}

/* The connection is lost: remember why and fail with PD_ENETWORK. */
static pd_status
ts_broken(tcp_store *t, const char *what)
{
    char cause[PD_ERRMSG_MAX];
    snprintf(cause, sizeof(cause), "%s", pd_errmsg());
    ts_close_fd(t);
    snprintf(t->broken, sizeof(t->broken), "%s", cause);
    return pd_error(PD_ENETWORK,
                    "TCPStore: connection to the server at %s:%d lost during %s: "
                    "%s", t->host, t->port, what, cause);
}

static double
deadline_of(double timeout)
{
    return timeout > 0 ? pd_now() + timeout : 0;
}

/* Receive frames until the one answering seq; older answers (of cancelled
 * waits) are dropped.  On success the body is in t->resp[0..*len). */
static pd_status
ts_recv_reply(tcp_store *t, uint32_t seq, double deadline, size_t *len)
{
    for (;;) {
        uint8_t hdr[4];
        PD_CHECK(pd_net_recv_all(t->fd, hdr, 4, deadline));
        size_t blen = pd_rd32(hdr);
        if (blen < PD_TS_HDR || blen > PD_TS_MAX_FRAME) {
            return pd_error(PD_ENETWORK, "malformed reply of %zu bytes", blen);
        }
        if (blen > t->resp_cap) {
            uint8_t *p = realloc(t->resp, blen);
            if (p == NULL) {
                return pd_error(PD_ENETWORK, "out of memory for a reply of "
                                "%zu bytes", blen);
            }
            t->resp = p;
            t->resp_cap = blen;
        }
        PD_CHECK(pd_net_recv_all(t->fd, t->resp, blen, deadline));
        if (pd_rd32(t->resp + 1) == seq) {
            *len = blen;
            return PD_OK;
        }
    }
}

/* Ask the server to drop our parked waits and wait for its confirmation.
 * Failure leaves the connection broken. */
static pd_status
ts_cancel(tcp_store *t)
{
    size_t len;
    uint32_t seq = ++t->seq;
    double deadline = pd_now() + CANCEL_GRACE;
    pd_wbuf *b = &t->req;
    b->len = 0;
    size_t at = pd_wbuf_begin(b, PD_TS_CANCEL, seq);
    pd_wbuf_end(b, at);
    if (b->oom) {
        return pd_error(PD_ENOMEM, "TCPStore: out of memory");
    }
    pd_status st = pd_net_send_all(t->fd, b->p, b->len, deadline);
    if (st == PD_OK) {
        st = ts_recv_reply(t, seq, deadline, &len);
    }
    if (st != PD_OK) {
        return ts_broken(t, "the cancellation of a timed-out wait");
    }
    return PD_OK;
}

/* Send the request in t->req (built by the caller with sequence seq) and
 * read its reply.  wait_timeout > 0 marks a GET/WAIT: then the deadline is
 * that timeout, and running past it gives PD_ETIMEOUT (connection kept);
 * otherwise the store's timeout bounds the call and running past it breaks
 * the connection.  On success the reply's payload starts at
 * t->resp + PD_TS_HDR. */
static pd_status
ts_roundtrip(tcp_store *t, uint32_t seq, const char *what, int is_wait,
             double wait_timeout, size_t *len)
{
    if (t->req.oom) {
        t->req.oom = 0;
        return pd_error(PD_ENOMEM, "TCPStore.%s: out of memory building the "
                        "request", what);
    }
    if (t->fd < 0) {
        return pd_error(PD_ENETWORK,
                        "TCPStore: the connection to the server at %s:%d was "
                        "lost earlier (%s)", t->host, t->port, t->broken);
    }
    double timeout = is_wait ? wait_timeout : pd_store_timeout(&t->base);
    double deadline = deadline_of(timeout);
    pd_status st = pd_net_send_all(t->fd, t->req.p, t->req.len, deadline);
    if (st == PD_OK) {
        st = ts_recv_reply(t, seq, deadline, len);
    }
    if (st == PD_ETIMEOUT && is_wait) {
        PD_CHECK(ts_cancel(t));
        return PD_ETIMEOUT;
    }
    if (st == PD_ETIMEOUT) {
        pd_error(PD_ETIMEOUT, "no reply within %.0fms", timeout * 1000.0);
    }
    if (st != PD_OK) {
        return ts_broken(t, what);
    }
    uint8_t code = t->resp[0];
    if (code != 0) {
        pd_rbuf rd = {.p = t->resp, .n = *len, .off = PD_TS_HDR, .bad = 0};
        size_t mlen;
        const char *msg = pd_rbuf_str(&rd, &mlen);
        pd_status err = code < PD_NSTATUS ? (pd_status)code : PD_ESTORE;
        return pd_error(err, "%s", msg != NULL ? msg : "TCPStore: server error");
    }
    return PD_OK;
}

static pd_status
ts_bad_reply(tcp_store *t, const char *what)
{
    pd_error(PD_ENETWORK, "malformed reply");
    return ts_broken(t, what);
}

static uint32_t
ts_begin(tcp_store *t, uint8_t cmd, size_t *at)
{
    uint32_t seq = ++t->seq;
    t->req.len = 0;
    t->req.oom = 0;
    *at = pd_wbuf_begin(&t->req, cmd, seq);
    return seq;
}

/* ------------------------------------------------------------- commands */

static pd_status
ts_set_raw(tcp_store *t, const char *prefix, const char *key, const void *val,
           size_t n)
{
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_SET, &at);
    pd_wbuf_str(&t->req, prefix, key);
    pd_wbuf_bytes(&t->req, val, n);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "set", 0, 0, &len);
    pthread_mutex_unlock(&t->mu);
    return st;
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
    tcp_store *t = ts_of(s);
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_GET, &at);
    pd_wbuf_str(&t->req, USER_PREFIX, key);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "get", 1, timeout, &len);
    if (st == PD_ETIMEOUT) {
        st = pd_store_timeout_error(USER_PREFIX, timeout, &key, 1);
    } else if (st == PD_OK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        size_t vlen;
        const uint8_t *v = pd_rbuf_bytes(&rd, &vlen);
        if (rd.bad) {
            st = ts_bad_reply(t, "get");
        } else {
            st = pd_kv_dup(v, vlen, val);
            if (st == PD_OK) {
                *n = vlen;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static pd_status
ts_add_raw(tcp_store *t, const char *prefix, const char *key, int64_t delta,
           int64_t *out)
{
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_ADD, &at);
    pd_wbuf_str(&t->req, prefix, key);
    pd_wbuf_i64(&t->req, delta);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "add", 0, 0, &len);
    if (st == PD_OK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        *out = pd_rbuf_i64(&rd);
        if (rd.bad) {
            st = ts_bad_reply(t, "add");
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
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
    tcp_store *t = ts_of(s);
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_CAS, &at);
    pd_wbuf_str(&t->req, USER_PREFIX, key);
    pd_wbuf_bytes(&t->req, expected, explen);
    pd_wbuf_bytes(&t->req, desired, deslen);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "compare_set", 0, 0, &len);
    if (st == PD_OK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        size_t vlen;
        const uint8_t *v = pd_rbuf_bytes(&rd, &vlen);
        if (rd.bad) {
            st = ts_bad_reply(t, "compare_set");
        } else {
            st = pd_kv_dup(v, vlen, out);
            if (st == PD_OK) {
                *outlen = vlen;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* WAIT or CHECK over a list of user keys. */
static pd_status
ts_keys_cmd(tcp_store *t, uint8_t cmd, const char *const *keys, size_t n,
            double timeout, int *out)
{
    size_t at, len;
    const char *what = cmd == PD_TS_WAIT ? "wait" : "check";
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, cmd, &at);
    pd_wbuf_u32(&t->req, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        pd_wbuf_str(&t->req, USER_PREFIX, keys[i]);
    }
    pd_wbuf_end(&t->req, at);
    if (t->req.len > PD_TS_MAX_FRAME) {
        pthread_mutex_unlock(&t->mu);
        return pd_error(PD_EINVAL, "TCPStore.%s: %zu keys make a request of "
                        "%zu bytes, above the limit", what, n, t->req.len);
    }
    pd_status st = ts_roundtrip(t, seq, what, cmd == PD_TS_WAIT, timeout,
                                &len);
    if (st == PD_ETIMEOUT) {
        st = pd_store_timeout_error(USER_PREFIX, timeout, keys, n);
    } else if (st == PD_OK && cmd == PD_TS_CHECK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        *out = pd_rbuf_u8(&rd) != 0;
        if (rd.bad) {
            st = ts_bad_reply(t, what);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
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
    tcp_store *t = ts_of(s);
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_DELETE, &at);
    pd_wbuf_str(&t->req, USER_PREFIX, key);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "delete_key", 0, 0, &len);
    if (st == PD_OK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        *deleted = pd_rbuf_u8(&rd) != 0;
        if (rd.bad) {
            st = ts_bad_reply(t, "delete_key");
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static pd_status
ts_num_keys(pd_store *s, int64_t *out)
{
    tcp_store *t = ts_of(s);
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_NUM_KEYS, &at);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "num_keys", 0, 0, &len);
    if (st == PD_OK) {
        pd_rbuf rd = {.p = t->resp, .n = len, .off = PD_TS_HDR, .bad = 0};
        *out = pd_rbuf_i64(&rd);
        if (rd.bad) {
            st = ts_bad_reply(t, "num_keys");
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static void
ts_destroy(pd_store *s)
{
    tcp_store *t = ts_of(s);
    /* The client goes first, so the server sees an orderly close. */
    ts_close_fd(t);
    pd_tcp_server_stop(t->server);
    pd_wbuf_free(&t->req);
    free(t->resp);
    free(t->host);
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
            return pd_error(PD_ESTORE,
                            "Timed out after %.0f seconds waiting for clients. "
                            "%" PRId64 "/%d clients joined.",
                            pd_now() - start, joined, o->world_size);
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
        st = pd_tcp_server_start(o->port, lfd, o->secret, &t->server);
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
    pd_status st;
    if (t->fd < 0) {
        st = pd_error(PD_ENETWORK, "TCPStore: the connection to the server at "
                      "%s:%d was lost earlier (%s)", t->host, t->port,
                      t->broken);
    } else {
        st = pd_net_local_addr(t->fd, buf, len, NULL);
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

pd_status
pd_tcp_store_ping(pd_store *s)
{
    if (s == NULL || s->ops != &tcp_ops) {
        return pd_error(PD_EINVAL, "ping: not a TCPStore");
    }
    tcp_store *t = ts_of(s);
    size_t at, len;
    pthread_mutex_lock(&t->mu);
    uint32_t seq = ts_begin(t, PD_TS_PING, &at);
    pd_wbuf_end(&t->req, at);
    pd_status st = ts_roundtrip(t, seq, "ping", 0, 0, &len);
    pthread_mutex_unlock(&t->mu);
    return st;
}
