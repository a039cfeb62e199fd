/* The TCPStore server: one thread running an epoll loop over non-blocking
 * sockets, serving any number of clients at once.
 *
 * Each connection first passes the handshake of util/auth.h (driven by its
 * non-blocking state machine); until then not one request byte is read.
 * GET and WAIT for missing keys do not block the loop: the request is parked
 * as a "waiter" linked to the table entries of the keys it misses, and
 * answered when the last of them gets a value.  Timeouts are the client's
 * business; a client that gives up sends CANCEL, which drops that waiter.
 * Shutdown goes through an eventfd, so pd_tcp_server_stop never races the
 * loop.
 *
 * A client may leave wills (WILL): key/value pairs the server sets when its
 * connection closes.  They fire after the batch of events that closed it,
 * never in the middle of a request, whose entries they could change.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../util/auth.h"
#include "../util/net.h"
#include "kvmap.h"
#include "store.h"
#include "tcp_proto.h"

/* A connection that has not authenticated within this time is dropped, so
 * idle strangers cannot pile up. */
#define SRV_AUTH_TIMEOUT 30.0
#define SRV_BACKLOG 2048
#define SRV_MAX_EVENTS 128
#define SRV_READ_CHUNK ((size_t)64 << 10)
/* Buffers above this size are released once empty. */
#define SRV_KEEP_BUFFER ((size_t)1 << 20)
/* After EMFILE, stop accepting for a moment instead of spinning. */
#define SRV_ACCEPT_PAUSE 0.1

struct srv_waiter;
struct srv_conn;

/* One (waiter, missing key) link, threaded on the entry's e->aux list. */
typedef struct srv_wref {
    struct srv_wref *prev;
    struct srv_wref *next;
    struct srv_waiter *w;
    pd_kv_entry *e;
    int linked;
} srv_wref;

/* A parked GET or WAIT. */
typedef struct srv_waiter {
    struct srv_waiter *prev;
    struct srv_waiter *next;
    struct srv_conn *conn;
    uint32_t seq;
    uint8_t cmd;
    size_t remaining;
    size_t nrefs;
    srv_wref refs[];
} srv_waiter;

/* A key this connection's close sets (WILL). */
typedef struct srv_will {
    struct srv_will *next;
    char *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
} srv_will;

typedef struct srv_conn {
    struct srv_conn *prev;
    struct srv_conn *next;
    int fd;
    int authed;
    int dead;
    uint32_t events;
    double auth_deadline;
    pd_auth_srv auth;
    uint8_t *in;
    size_t inlen;
    size_t incap;
    pd_wbuf out;
    size_t outoff;
    srv_waiter *waiters;
    srv_will *wills;
} srv_conn;

struct pd_tcp_server {
    int lfd;
    int wakefd;
    int epfd;
    int port;
    int started;
    pid_t owner;     /* the process whose thread serves */
    int accepting;
    double accept_resume;
    pthread_t thread;
    char *secret;
    /* Clients refused for their secret: written by the loop, read by the
     * waits of this process's client (their timeout message names them). */
    pthread_mutex_t refused_mu;
    int refused_mu_init;
    pd_auth_refusals refused;
    pd_kvmap map;
    srv_conn *conns;
    srv_conn *dead;
    int stopping;    /* closing every connection: wills no longer fire */
};

/* ------------------------------------------------------------- plumbing */

static void
conn_list_remove(srv_conn **head, srv_conn *c)
{
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        *head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    c->prev = c->next = NULL;
}

static void
conn_list_push(srv_conn **head, srv_conn *c)
{
    c->prev = NULL;
    c->next = *head;
    if (*head != NULL) {
        (*head)->prev = c;
    }
    *head = c;
}

static void
wref_unlink(srv_wref *r)
{
    if (!r->linked) {
        return;
    }
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        r->e->aux = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    r->prev = r->next = NULL;
    r->linked = 0;
}

static void
wref_link(srv_wref *r, pd_kv_entry *e)
{
    r->e = e;
    r->prev = NULL;
    r->next = e->aux;
    if (r->next != NULL) {
        r->next->prev = r;
    }
    e->aux = r;
    r->linked = 1;
}

static void
waiter_unlink_from_conn(srv_waiter *w)
{
    srv_conn *c = w->conn;
    if (w->prev != NULL) {
        w->prev->next = w->next;
    } else {
        c->waiters = w->next;
    }
    if (w->next != NULL) {
        w->next->prev = w->prev;
    }
}

/* Free a waiter, unlinking its remaining refs; entries that only existed
 * for it go away. */
static void
waiter_free(pd_tcp_server *srv, srv_waiter *w)
{
    waiter_unlink_from_conn(w);
    for (size_t i = 0; i < w->nrefs; i++) {
        srv_wref *r = &w->refs[i];
        if (r->linked) {
            pd_kv_entry *e = r->e;
            wref_unlink(r);
            if (!e->present && e->aux == NULL) {
                pd_kvmap_remove(&srv->map, e);
            }
        }
    }
    free(w);
}

static void
conn_drop_waiters(pd_tcp_server *srv, srv_conn *c)
{
    while (c->waiters != NULL) {
        waiter_free(srv, c->waiters);
    }
}

static void
conn_set_events(pd_tcp_server *srv, srv_conn *c, uint32_t ev)
{
    if (c->dead || ev == c->events) {
        return;
    }
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) {
        c->events = ev;
    }
}

/* Close a connection now; its memory is freed after the current batch of
 * events, which may still name it. */
static void
conn_kill(pd_tcp_server *srv, srv_conn *c)
{
    if (c->dead) {
        return;
    }
    c->dead = 1;
    conn_drop_waiters(srv, c);
    (void)epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    (void)close(c->fd);
    c->fd = -1;
    conn_list_remove(&srv->conns, c);
    conn_list_push(&srv->dead, c);
}

static void
will_free_all(srv_conn *c)
{
    while (c->wills != NULL) {
        srv_will *w = c->wills;
        c->wills = w->next;
        free(w->key);
        free(w->val);
        free(w);
    }
}

static void
conn_free(srv_conn *c)
{
    will_free_all(c);
    free(c->in);
    pd_wbuf_free(&c->out);
    memset(&c->auth, 0, sizeof(c->auth));
    free(c);
}

static void notify(pd_tcp_server *srv, pd_kv_entry *e);

/* Set the keys a closed connection left wills for.  Out of memory, a will
 * is lost: its waiters time out as they would without it. */
static void
fire_wills(pd_tcp_server *srv, srv_conn *c)
{
    while (c->wills != NULL) {
        srv_will *w = c->wills;
        c->wills = w->next;
        pd_kv_entry *e = NULL;
        if (pd_kvmap_get_or_add(&srv->map, w->key, w->klen, &e) == PD_OK) {
            if (pd_kvmap_store(&srv->map, e, w->val, w->vlen) == PD_OK) {
                notify(srv, e);
            } else if (!e->present && e->aux == NULL) {
                pd_kvmap_remove(&srv->map, e);
            }
        }
        free(w->key);
        free(w->val);
        free(w);
    }
}

/* Free the connections closed in this batch; their wills fire first (a
 * reply they cause may close more connections, which join the list). */
static void
free_dead(pd_tcp_server *srv)
{
    while (srv->dead != NULL) {
        srv_conn *c = srv->dead;
        conn_list_remove(&srv->dead, c);
        if (!srv->stopping) {
            fire_wills(srv, c);
        }
        conn_free(c);
    }
}

/* Send what is buffered; watch for writability while some is left. */
static void
conn_flush(pd_tcp_server *srv, srv_conn *c)
{
    if (c->dead) {
        return;
    }
    while (c->outoff < c->out.len) {
        ssize_t r = send(c->fd, c->out.p + c->outoff, c->out.len - c->outoff,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) {
            c->outoff += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        conn_kill(srv, c);
        return;
    }
    if (c->outoff == c->out.len) {
        c->outoff = 0;
        c->out.len = 0;
        if (c->out.cap > SRV_KEEP_BUFFER) {
            pd_wbuf_free(&c->out);
        }
        conn_set_events(srv, c, EPOLLIN);
    } else {
        conn_set_events(srv, c, EPOLLIN | EPOLLOUT);
    }
}

/* ------------------------------------------------------------- replies */

/* What a request answers: an error (st != PD_OK; the message is the
 * current pd_errmsg()) or a payload of one kind; PARKED: nothing yet. */
typedef struct srv_reply {
    pd_status st;
    enum { REP_EMPTY, REP_U8, REP_I64, REP_BYTES, REP_PARKED } kind;
    int64_t num;    /* U8, I64 */
    const void *p;  /* BYTES */
    size_t n;
    void *owned;    /* freed once the reply is queued */
} srv_reply;

static srv_reply
rep_error(pd_status st)
{
    return (srv_reply){.st = st, .kind = REP_EMPTY};
}

static srv_reply
rep_num(int kind, int64_t v)
{
    return (srv_reply){.st = PD_OK, .kind = kind, .num = v};
}

static srv_reply
rep_bytes(const void *p, size_t n)
{
    return (srv_reply){.st = PD_OK, .kind = REP_BYTES, .p = p, .n = n};
}

/* Queue the reply frame to request seq (the one place frames are built) and
 * send what can be sent.  The connection dies if memory runs out, since its
 * reply stream would be incomplete. */
static void
reply(pd_tcp_server *srv, srv_conn *c, uint32_t seq, srv_reply r)
{
    if (c->dead || (r.st == PD_OK && r.kind == REP_PARKED)) {
        return;
    }
    size_t at = pd_wbuf_begin(&c->out, (uint8_t)r.st, seq);
    if (r.st != PD_OK) {
        pd_wbuf_str(&c->out, "", pd_errmsg());
    } else if (r.kind == REP_U8) {
        pd_wbuf_u8(&c->out, (uint8_t)r.num);
    } else if (r.kind == REP_I64) {
        pd_wbuf_i64(&c->out, r.num);
    } else if (r.kind == REP_BYTES) {
        pd_wbuf_bytes(&c->out, r.p, r.n);
    }
    if (c->out.oom) {
        conn_kill(srv, c);
        return;
    }
    pd_wbuf_end(&c->out, at);
    conn_flush(srv, c);
}

/* Answer every waiter parked on e, which just got a value. */
static void
notify(pd_tcp_server *srv, pd_kv_entry *e)
{
    while (e->aux != NULL) {
        srv_wref *r = e->aux;
        srv_waiter *w = r->w;
        wref_unlink(r);
        if (--w->remaining > 0) {
            continue;
        }
        srv_conn *c = w->conn;
        uint32_t seq = w->seq;
        uint8_t cmd = w->cmd;
        waiter_free(srv, w);
        reply(srv, c, seq, cmd == PD_TS_GET ? rep_bytes(e->val, e->vallen)
                                            : rep_num(REP_EMPTY, 0));
    }
}

/* Park a GET/WAIT on its missing keys (the caller checked that at least one
 * is missing). */
static srv_reply
park(pd_tcp_server *srv, srv_conn *c, uint32_t seq, uint8_t cmd,
     const char *const *keys, const size_t *lens, size_t n)
{
    size_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        pd_kv_entry *e = pd_kvmap_find(&srv->map, keys[i], lens[i]);
        if (e == NULL || !e->present) {
            missing++;
        }
    }
    srv_waiter *w = calloc(1, sizeof(*w) + missing * sizeof(srv_wref));
    if (w == NULL) {
        return rep_error(pd_error(PD_ENOMEM, "TCPStore server: out of "
                                  "memory parking a wait"));
    }
    w->conn = c;
    w->seq = seq;
    w->cmd = cmd;
    w->next = c->waiters;
    if (c->waiters != NULL) {
        c->waiters->prev = w;
    }
    c->waiters = w;
    for (size_t i = 0; i < n; i++) {
        pd_kv_entry *e = pd_kvmap_find(&srv->map, keys[i], lens[i]);
        if (e != NULL && e->present) {
            continue;
        }
        pd_status st = pd_kvmap_get_or_add(&srv->map, keys[i], lens[i], &e);
        if (st != PD_OK) {
            waiter_free(srv, w);
            return rep_error(st);
        }
        srv_wref *r = &w->refs[w->nrefs++];
        r->w = w;
        wref_link(r, e);
        w->remaining++;
    }
    return rep_num(REP_PARKED, 0);
}

/* ------------------------------------------------------------- requests */

/* The arguments of a request.  Strings and bytes point into the frame. */
typedef struct srv_args {
    const char *key;
    size_t klen;
    const uint8_t *b[2];  /* CAS: expected, desired; SET: the value */
    size_t blen[2];
    int64_t i64;
    uint32_t u32;
    const char **keys;    /* malloc'd */
    size_t *lens;         /* malloc'd */
    size_t nkeys;
} srv_args;

/* Each command's arguments, in wire order: s str, b bytes, i i64, u u32,
 * K a list of str.  PING tolerates bytes after its (no) arguments. */
static const struct {
    const char *args;
    int trailing_ok;
} srv_cmds[] = {
    [PD_TS_SET] = {"sb", 0},   [PD_TS_GET] = {"s", 0},
    [PD_TS_ADD] = {"si", 0},   [PD_TS_CAS] = {"sbb", 0},
    [PD_TS_WAIT] = {"K", 0},   [PD_TS_CHECK] = {"K", 0},
    [PD_TS_DELETE] = {"s", 0}, [PD_TS_NUM_KEYS] = {"", 0},
    [PD_TS_PING] = {"", 1},    [PD_TS_CANCEL] = {"u", 0},
    [PD_TS_APPEND] = {"sb", 0}, [PD_TS_LIST] = {"s", 0},
    [PD_TS_WILL] = {"usb", 0},
};

/* -1: malformed; -2: out of memory. */
static int
read_keys(pd_rbuf *rd, srv_args *a)
{
    uint32_t n = pd_rbuf_u32(rd);
    /* Each key takes at least 5 bytes on the wire: bound n by the frame. */
    if (rd->bad || n > (rd->n - rd->off) / 5 + 1) {
        return -1;
    }
    a->keys = malloc((n ? n : 1) * sizeof(*a->keys));
    a->lens = malloc((n ? n : 1) * sizeof(*a->lens));
    if (a->keys == NULL || a->lens == NULL) {
        return -2;
    }
    a->nkeys = n;
    for (uint32_t i = 0; i < n; i++) {
        a->keys[i] = pd_rbuf_str(rd, &a->lens[i]);
    }
    return rd->bad ? -1 : 0;
}

/* -1: malformed (arguments missing, bad or followed by more bytes); -2: out
 * of memory.  a->keys and a->lens are the caller's to free either way. */
static int
read_args(pd_rbuf *rd, uint8_t cmd, srv_args *a)
{
    int nb = 0;
    for (const char *t = srv_cmds[cmd].args; *t != '\0'; t++) {
        switch (*t) {
        case 's':
            a->key = pd_rbuf_str(rd, &a->klen);
            break;
        case 'b':
            a->b[nb] = pd_rbuf_bytes(rd, &a->blen[nb]);
            nb++;
            break;
        case 'i':
            a->i64 = pd_rbuf_i64(rd);
            break;
        case 'u':
            a->u32 = pd_rbuf_u32(rd);
            break;
        case 'K': {
            int r = read_keys(rd, a);
            if (r < 0) {
                return r;
            }
            break;
        }
        }
    }
    if (rd->bad || (!srv_cmds[cmd].trailing_ok && rd->off != rd->n)) {
        return -1;
    }
    return 0;
}

/* WILL: add (or replace) the will on a->key, or drop it (a->u32 == 0). */
static srv_reply
set_will(srv_conn *c, const srv_args *a)
{
    srv_will **pp = &c->wills;
    while (*pp != NULL && !((*pp)->klen == a->klen &&
                            memcmp((*pp)->key, a->key, a->klen) == 0)) {
        pp = &(*pp)->next;
    }
    if (*pp != NULL) {
        srv_will *old = *pp;
        *pp = old->next;
        free(old->key);
        free(old->val);
        free(old);
    }
    if (a->u32 == 0) {
        return rep_num(REP_EMPTY, 0);
    }
    srv_will *w = calloc(1, sizeof(*w));
    if (w != NULL) {
        w->key = malloc(a->klen + 1);
        w->val = malloc(a->blen[0] ? a->blen[0] : 1);
    }
    if (w == NULL || w->key == NULL || w->val == NULL) {
        if (w != NULL) {
            free(w->key);
            free(w->val);
            free(w);
        }
        return rep_error(pd_error(PD_ENOMEM, "TCPStore server: out of "
                                  "memory recording a will"));
    }
    memcpy(w->key, a->key, a->klen + 1);
    w->klen = a->klen;
    memcpy(w->val, a->b[0], a->blen[0]);
    w->vlen = a->blen[0];
    w->next = c->wills;
    c->wills = w;
    return rep_num(REP_EMPTY, 0);
}

static srv_reply
run_request(pd_tcp_server *srv, srv_conn *c, uint32_t seq, uint8_t cmd,
            const srv_args *a)
{
    pd_kv_entry *e = NULL;
    pd_status st;

    switch (cmd) {
    case PD_TS_SET:
        st = pd_kvmap_get_or_add(&srv->map, a->key, a->klen, &e);
        if (st == PD_OK) {
            st = pd_kvmap_store(&srv->map, e, a->b[0], a->blen[0]);
            if (st != PD_OK && !e->present && e->aux == NULL) {
                pd_kvmap_remove(&srv->map, e);
            }
        }
        if (st != PD_OK) {
            return rep_error(st);
        }
        notify(srv, e);
        return rep_num(REP_EMPTY, 0);
    case PD_TS_GET:
        e = pd_kvmap_find(&srv->map, a->key, a->klen);
        if (e != NULL && e->present) {
            return rep_bytes(e->val, e->vallen);
        }
        return park(srv, c, seq, PD_TS_GET, &a->key, &a->klen, 1);
    case PD_TS_ADD: {
        int64_t v = 0;
        st = pd_kv_add(&srv->map, a->key, a->klen, a->i64, &v, &e);
        if (st != PD_OK) {
            return rep_error(st);
        }
        notify(srv, e);
        return rep_num(REP_I64, v);
    }
    case PD_TS_CAS: {
        size_t rlen;
        const uint8_t *res;
        st = pd_kv_compare_set(&srv->map, a->key, a->klen, a->b[0],
                               a->blen[0], a->b[1], a->blen[1], &res, &rlen,
                               &e);
        if (st != PD_OK) {
            return rep_error(st);
        }
        if (e != NULL) {
            notify(srv, e);
        }
        return rep_bytes(res, rlen);
    }
    case PD_TS_WAIT:
    case PD_TS_CHECK: {
        int all = 1;
        for (size_t i = 0; i < a->nkeys && all; i++) {
            e = pd_kvmap_find(&srv->map, a->keys[i], a->lens[i]);
            all = e != NULL && e->present;
        }
        if (cmd == PD_TS_CHECK) {
            return rep_num(REP_U8, all);
        }
        if (all) {
            return rep_num(REP_EMPTY, 0);
        }
        return park(srv, c, seq, PD_TS_WAIT, a->keys, a->lens, a->nkeys);
    }
    case PD_TS_DELETE:
        e = pd_kvmap_find(&srv->map, a->key, a->klen);
        return rep_num(REP_U8, e != NULL ? pd_kvmap_unset(&srv->map, e) : 0);
    case PD_TS_NUM_KEYS:
        return rep_num(REP_I64, (int64_t)srv->map.npresent);
    case PD_TS_APPEND:
        st = pd_kv_append(&srv->map, a->key, a->klen, a->b[0], a->blen[0],
                          &e);
        if (st != PD_OK) {
            return rep_error(st);
        }
        notify(srv, e);
        return rep_num(REP_EMPTY, 0);
    case PD_TS_LIST: {
        char **ks;
        size_t nk;
        st = pd_kvmap_list(&srv->map, a->key, &ks, &nk);
        if (st != PD_OK) {
            return rep_error(st);
        }
        pd_wbuf b = {0};
        pd_wbuf_u32(&b, (uint32_t)nk);
        for (size_t i = 0; i < nk; i++) {
            pd_wbuf_str(&b, "", ks[i]);
        }
        pd_store_free_keys(ks, nk);
        if (b.oom) {
            pd_wbuf_free(&b);
            return rep_error(pd_error(PD_ENOMEM, "TCPStore server: out of "
                                      "memory listing keys"));
        }
        srv_reply r = rep_bytes(b.p, b.len);
        r.owned = b.p;
        return r;
    }
    case PD_TS_WILL:
        return set_will(c, a);
    case PD_TS_CANCEL:
        for (srv_waiter *w = c->waiters; w != NULL; w = w->next) {
            if (w->seq == a->u32) {
                waiter_free(srv, w);
                break;
            }
        }
        return rep_num(REP_EMPTY, 0);
    default: /* PD_TS_PING */
        return rep_num(REP_EMPTY, 0);
    }
}

/* Returns -1 on a malformed request (the connection is dropped). */
static int
handle_request(pd_tcp_server *srv, srv_conn *c, const uint8_t *body,
               size_t len)
{
    pd_rbuf rd = {.p = body, .n = len, .off = 0, .bad = 0};
    uint8_t cmd = pd_rbuf_u8(&rd);
    uint32_t seq = pd_rbuf_u32(&rd);
    srv_args a;
    srv_reply rep;

    if (cmd < PD_TS_SET || cmd > PD_TS_LAST) {
        return -1;
    }
    memset(&a, 0, sizeof(a));
    int r = read_args(&rd, cmd, &a);
    if (r == -2) {
        rep = rep_error(pd_error(PD_ENOMEM, "TCPStore server: out of memory"));
    } else if (r == 0) {
        rep = run_request(srv, c, seq, cmd, &a);
    }
    free(a.keys);
    free(a.lens);
    if (r == -1) {
        return -1;
    }
    reply(srv, c, seq, rep);
    free(rep.owned);
    return 0;
}

/* Read what is there and run every complete request in it. */
static void
conn_read(pd_tcp_server *srv, srv_conn *c)
{
    /* Room for a large frame grows as its bytes arrive (at most doubling
     * what came), never ahead of them: a length field alone (up to
     * PD_TS_MAX_FRAME) allocates nothing big. */
    size_t want = SRV_READ_CHUNK;
    if (c->inlen >= 4) {
        size_t flen = 4 + (size_t)pd_rd32(c->in);
        if (flen > c->inlen && flen - c->inlen > want) {
            size_t left = flen - c->inlen;
            want = c->inlen > want ? c->inlen : want;
            want = want < left ? want : left;
        }
    }
    if (c->incap - c->inlen < want) {
        size_t cap = c->inlen + want;
        uint8_t *p = realloc(c->in, cap);
        if (p == NULL) {
            conn_kill(srv, c);
            return;
        }
        c->in = p;
        c->incap = cap;
    }
    ssize_t r;
    do {
        r = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, MSG_DONTWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
    }
    if (r <= 0) {
        conn_kill(srv, c);
        return;
    }
    c->inlen += (size_t)r;

    size_t pos = 0;
    while (!c->dead && c->inlen - pos >= 4) {
        size_t blen = pd_rd32(c->in + pos);
        if (blen < PD_TS_HDR || blen > PD_TS_MAX_FRAME) {
            conn_kill(srv, c);
            return;
        }
        if (c->inlen - pos - 4 < blen) {
            break;
        }
        if (handle_request(srv, c, c->in + pos + 4, blen) < 0) {
            conn_kill(srv, c);
            return;
        }
        pos += 4 + blen;
    }
    if (c->dead) {
        return;
    }
    if (pos > 0) {
        memmove(c->in, c->in + pos, c->inlen - pos);
        c->inlen -= pos;
    }
    if (c->inlen == 0 && c->incap > SRV_KEEP_BUFFER) {
        free(c->in);
        c->in = NULL;
        c->incap = 0;
    }
}

static void
conn_auth_step(pd_tcp_server *srv, srv_conn *c)
{
    pd_status st = pd_auth_srv_step(&c->auth, c->fd);
    if (st != PD_OK) {
        if (c->auth.refused) {
            /* perhaps a rank started with another secret: said at once,
             * and the job goes on waiting (a stranger can claim anything) */
            char who[64];
            snprintf(who, sizeof(who), "the TCPStore server on port %d",
                     srv->port);
            pthread_mutex_lock(&srv->refused_mu);
            pd_auth_note_refusal(&srv->refused, "store", who);
            pthread_mutex_unlock(&srv->refused_mu);
        }
        conn_kill(srv, c);
        return;
    }
    if (c->auth.done) {
        c->authed = 1;
        memset(&c->auth, 0, sizeof(c->auth));
        conn_set_events(srv, c, EPOLLIN);
        return;
    }
    conn_set_events(srv, c, c->auth.want_write ? EPOLLOUT : EPOLLIN);
}

static void
conn_event(pd_tcp_server *srv, srv_conn *c, uint32_t ev)
{
    if (c->dead) {
        return;
    }
    if (!c->authed) {
        conn_auth_step(srv, c);
        return;
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        conn_read(srv, c);
    }
    if (!c->dead && (ev & EPOLLOUT)) {
        conn_flush(srv, c);
    }
}

static void
accept_pause(pd_tcp_server *srv, int on)
{
    if (on && srv->accepting) {
        (void)epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
        srv->accepting = 0;
        srv->accept_resume = pd_now() + SRV_ACCEPT_PAUSE;
    } else if (!on && !srv->accepting) {
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &srv->lfd};
        if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &e) == 0) {
            srv->accepting = 1;
        } else {
            srv->accept_resume = pd_now() + SRV_ACCEPT_PAUSE;
        }
    }
}

static void
srv_accept(pd_tcp_server *srv)
{
    for (int i = 0; i < 64; i++) {
        int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) {
                continue;
            }
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM) {
                accept_pause(srv, 1);
            }
            return;
        }
        srv_conn *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            (void)close(fd);
            continue;
        }
        c->fd = fd;
        (void)pd_net_set_nodelay(fd);
        if (pd_auth_srv_init(&c->auth, srv->secret) != PD_OK) {
            (void)close(fd);
            free(c);
            continue;
        }
        c->auth_deadline = pd_now() + SRV_AUTH_TIMEOUT;
        c->events = EPOLLOUT;
        struct epoll_event e = {.events = EPOLLOUT, .data.ptr = c};
        if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
            (void)close(fd);
            free(c);
            continue;
        }
        conn_list_push(&srv->conns, c);
        conn_auth_step(srv, c);
    }
}

/* Milliseconds until the next timer (auth deadline, accept resume). */
static int
next_timeout_ms(pd_tcp_server *srv)
{
    double next = 0;
    for (srv_conn *c = srv->conns; c != NULL; c = c->next) {
        if (!c->authed && (next == 0 || c->auth_deadline < next)) {
            next = c->auth_deadline;
        }
    }
    if (!srv->accepting && (next == 0 || srv->accept_resume < next)) {
        next = srv->accept_resume;
    }
    if (next == 0) {
        return -1;
    }
    double ms = (next - pd_now()) * 1000.0 + 1.0;
    if (ms < 0) {
        return 0;
    }
    return ms > 1e9 ? 1000000000 : (int)ms;
}

static void
run_timers(pd_tcp_server *srv)
{
    double now = pd_now();
    srv_conn *c = srv->conns;
    while (c != NULL) {
        srv_conn *next = c->next;
        if (!c->authed && now >= c->auth_deadline) {
            conn_kill(srv, c);
        }
        c = next;
    }
    if (!srv->accepting && now >= srv->accept_resume) {
        accept_pause(srv, 0);
    }
}

static void *
srv_main(void *arg)
{
    pd_tcp_server *srv = arg;
    struct epoll_event evs[SRV_MAX_EVENTS];
    int stop = 0;

    while (!stop) {
        int n = epoll_wait(srv->epfd, evs, SRV_MAX_EVENTS,
                           next_timeout_ms(srv));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            break; /* Cannot happen with valid fds; clients see EOF. */
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &srv->wakefd) {
                stop = 1;
            } else if (p == &srv->lfd) {
                srv_accept(srv);
            } else {
                conn_event(srv, (srv_conn *)p, evs[i].events);
            }
        }
        run_timers(srv);
        free_dead(srv);
    }
    /* Close the listening socket before the clients: a client that sees
     * EOF and reconnects at once must get "connection refused" (and retry
     * until the next server is up), not land in this dying server's
     * backlog. */
    if (srv->lfd >= 0) {
        (void)close(srv->lfd);
        srv->lfd = -1;
    }
    srv->stopping = 1;
    while (srv->conns != NULL) {
        conn_kill(srv, srv->conns);
    }
    free_dead(srv);
    return NULL;
}

/* --------------------------------------------------------------- public */

int
pd_tcp_server_port(const pd_tcp_server *srv)
{
    return srv->port;
}

pd_status
pd_tcp_server_explain_refusals(pd_tcp_server *srv, pd_status st)
{
    if (srv == NULL || !srv->refused_mu_init) {
        return st;
    }
    pthread_mutex_lock(&srv->refused_mu);
    st = pd_auth_refusals_explain(&srv->refused, st);
    pthread_mutex_unlock(&srv->refused_mu);
    return st;
}

void
pd_tcp_server_stop(pd_tcp_server *srv)
{
    if (srv == NULL) {
        return;
    }
    /* In a child made by fork() the thread does not exist, and the eventfd
     * is the parent's: signalling it would stop the parent's server.  Only
     * close this process's copies of the descriptors. */
    if (srv->started && srv->owner == getpid()) {
        uint64_t one = 1;
        ssize_t r;
        do {
            r = write(srv->wakefd, &one, sizeof(one));
        } while (r < 0 && errno == EINTR);
        pthread_join(srv->thread, NULL);
    }
    if (srv->epfd >= 0) {
        (void)close(srv->epfd);
    }
    if (srv->wakefd >= 0) {
        (void)close(srv->wakefd);
    }
    if (srv->lfd >= 0) {
        (void)close(srv->lfd);
    }
    pd_kvmap_free(&srv->map);
    if (srv->refused_mu_init) {
        pthread_mutex_destroy(&srv->refused_mu);
    }
    if (srv->secret != NULL) {
        memset(srv->secret, 0, strlen(srv->secret));
        free(srv->secret);
    }
    free(srv);
}

pd_status
pd_tcp_server_start(const char *bind_host, int port, int listen_fd,
                    const char *secret, pd_tcp_server **out)
{
    pd_status st = PD_OK;
    pd_tcp_server *srv = calloc(1, sizeof(*srv));
    *out = NULL;
    if (srv == NULL) {
        return pd_error(PD_ENOMEM, "TCPStore server: out of memory");
    }
    srv->lfd = srv->wakefd = srv->epfd = -1;
    srv->secret = strdup(secret != NULL ? secret : "");
    if (srv->secret == NULL) {
        st = pd_error(PD_ENOMEM, "TCPStore server: out of memory");
        goto fail;
    }
    PD_CHECK_GOTO(pd_kvmap_init(&srv->map), st, fail);
    if (pthread_mutex_init(&srv->refused_mu, NULL) != 0) {
        st = pd_error(PD_ESYS, "TCPStore server: pthread_mutex_init failed");
        goto fail;
    }
    srv->refused_mu_init = 1;

    if (listen_fd >= 0) {
        char addr[64];
        srv->lfd = listen_fd;
        PD_CHECK_GOTO(pd_net_local_addr(listen_fd, addr, sizeof(addr),
                                        &srv->port), st, fail);
    } else {
        PD_CHECK_GOTO(pd_net_listen(bind_host, port, SRV_BACKLOG, &srv->lfd,
                                    &srv->port), st, fail);
    }
    PD_CHECK_GOTO(pd_net_set_nonblock(srv->lfd, 1), st, fail);

    srv->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->wakefd < 0) {
        st = pd_syserror(PD_ESYS, "TCPStore server: eventfd");
        goto fail;
    }
    srv->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->epfd < 0) {
        st = pd_syserror(PD_ESYS, "TCPStore server: epoll_create1");
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->wakefd};
    if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->wakefd, &ev) < 0) {
        st = pd_syserror(PD_ESYS, "TCPStore server: epoll_ctl");
        goto fail;
    }
    ev.data.ptr = &srv->lfd;
    if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &ev) < 0) {
        st = pd_syserror(PD_ESYS, "TCPStore server: epoll_ctl");
        goto fail;
    }
    srv->accepting = 1;

    /* The loop thread must never take the process's signals (Python wants
     * SIGINT on its main thread): start it with all signals blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&srv->thread, NULL, srv_main, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        errno = r;
        st = pd_syserror(PD_ESYS, "TCPStore server: pthread_create");
        goto fail;
    }
    srv->started = 1;
    srv->owner = getpid();
    *out = srv;
    return PD_OK;
fail:
    pd_tcp_server_stop(srv);
    return st;
}
