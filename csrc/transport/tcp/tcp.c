/* TCP: connection setup, for every group.
 *
 * Every pair of ranks shares two sockets: a data socket, the pair's link
 * for frames (link_tcp.c; replaced by a shared-memory link between ranks on
 * one host, which keeps the socket for doorbells), and a control socket for
 * the engine's out-of-band messages (../engine.c).  Both are set up here:
 * authenticated (PYDDP_SECRET), then a hello with the group token.
 */
#include "tcp.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../util/auth.h"
#include "../../util/log.h"
#include "../../util/net.h"
#include "../engine.h"
#include "link_tcp.h"

#define HELLO_MAGIC 0x50444448u /* "PDDH" */

enum { CH_DATA = 0, CH_CTRL = 1 };

typedef struct hello {
    uint32_t magic;
    uint32_t rank;
    uint32_t channel;
    uint32_t size;
    uint64_t token;
} hello;

_Static_assert(sizeof(hello) == 24, "hello must have no padding");

/* What connecting needs, kept by the engine until the transport closes. */
/* While waiting for higher ranks, a cancellation is looked for this often. */
#define CANCEL_POLL_MS 200

typedef struct tcp_mesh {
    int lfd;
    char secret[256];
    /* pd_tcp_cancel_connect: claimed by the first caller, who writes why,
     * then publishes cancelled (release; accept_peers reads it acquire) */
    atomic_int cancel_claimed;
    atomic_int cancelled;
    char why[PD_ERRMSG_MAX];
} tcp_mesh;

static void
mesh_release(void *state)
{
    tcp_mesh *m = state;
    if (m->lfd >= 0) {
        close(m->lfd);
    }
    free(m);
}

pd_status
pd_tcp_create(int rank, int size, const char *secret, const char *bind_host,
              const pd_transport_events *ev, pd_transport **out, int *port_out)
{
    pd_transport *t;
    PD_CHECK(pd_engine_create(rank, size, ev, &t));
    tcp_mesh *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        t->ops->close(t);
        return pd_error(PD_ENOMEM, "tcp transport: out of memory");
    }
    m->lfd = -1;
    if (secret != NULL) {
        snprintf(m->secret, sizeof(m->secret), "%s", secret);
    }
    pd_engine_set_setup(t, m, mesh_release);
    if (size > 1) {
        pd_status st = pd_net_listen(bind_host, 0, 4 * size + 16, &m->lfd,
                                     port_out);
        if (st != PD_OK) {
            t->ops->close(t);
            return st;
        }
    }
    else {
        *port_out = 0;
    }
    *out = t;
    return PD_OK;
}

/* Hand a connected socket to the engine: the data link or the control
 * socket of peer p. */
static pd_status
install(pd_transport *t, int p, int ch, int fd)
{
    if (ch == CH_CTRL) {
        pd_engine_set_ctrl_fd(t, p, fd);
        return PD_OK;
    }
    pd_link *l = NULL;
    PD_CHECK(pd_tcp_link_new(fd, &l));
    pd_engine_set_link(t, p, l);
    return PD_OK;
}

static int
connected(pd_transport *t, int p, int ch)
{
    return ch == CH_DATA ? pd_engine_link(t, p) != NULL
                         : pd_engine_ctrl_fd(t, p) >= 0;
}

static pd_status
setup_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* Large buffers keep the pipe full for big messages. */
    int bufsz = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
    /* Detect a vanished remote host without waiting for the op timeout. */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = 5, intvl = 1, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    return pd_net_set_nonblock(fd, 1);
}

/* An accepted connection on its way to becoming a rank's channel: the
 * server side of the handshake, then the hello, each step taken when the
 * socket is ready, within its own deadline. */
typedef struct pending {
    int fd;
    int stage; /* PEND_AUTH, PEND_HELLO */
    double deadline;
    size_t off;
    hello h;
    pd_auth_srv auth;
} pending;

enum { PEND_AUTH = 0, PEND_HELLO = 1 };

/* Connections authenticating at once; when full, a new one displaces the
 * oldest (a peer finishes in milliseconds, a stranger only ages). */
#define PENDING_MAX 64
/* Seconds one connection may take to authenticate and say hello. */
#define PENDING_SECONDS 5.0

static void
pending_drop(pending *pend, int *npend, int i)
{
    if (pend[i].fd >= 0) {
        close(pend[i].fd);
    }
    memset(&pend[i].auth, 0, sizeof(pend[i].auth)); /* the secret */
    pend[i] = pend[*npend - 1];
    pend[*npend - 1].fd = -1;
    (*npend)--;
}

/* One step of pending connection c; 1 when it became a rank's channel (the
 * fd then belongs to the transport), 0 while in progress, -1 to drop it. */
static int
pending_step(pd_transport *t, pending *c, uint64_t token,
             pd_auth_refusals *refused, pd_status *fatal)
{
    int rank = t->rank, size = t->size;
    if (c->stage == PEND_AUTH) {
        if (pd_auth_srv_step(&c->auth, c->fd) != PD_OK) {
            PD_LOG(PD_LOG_INFO, "tcp", "rank %d: dropped a connection: %s",
                   rank, pd_errmsg());
            if (c->auth.refused) {
                /* perhaps a rank started with another secret: said at
                 * once, and the wait goes on (a stranger can claim anything) */
                char who[32];
                snprintf(who, sizeof(who), "rank %d", rank);
                pd_auth_note_refusal(refused, "tcp", who);
            }
            return -1;
        }
        if (!c->auth.done) {
            return 0;
        }
        c->stage = PEND_HELLO;
        c->off = 0;
    }
    while (c->off < sizeof(c->h)) {
        ssize_t r = recv(c->fd, (char *)&c->h + c->off, sizeof(c->h) - c->off,
                         MSG_DONTWAIT);
        if (r > 0) {
            c->off += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        }
        return -1; /* closed or failed */
    }
    hello h = c->h;
    if (h.magic != HELLO_MAGIC || h.token != token ||
        h.size != (uint32_t)size || h.rank <= (uint32_t)rank ||
        h.rank >= (uint32_t)size || h.channel > 1 ||
        connected(t, (int)h.rank, (int)h.channel)) {
        PD_LOG(PD_LOG_INFO, "tcp", "rank %d: dropped a connection with a "
               "stale or foreign hello", rank);
        return -1;
    }
    uint32_t ok = HELLO_MAGIC;
    if (pd_net_send_all(c->fd, &ok, sizeof(ok), c->deadline) != PD_OK ||
        pd_net_set_nonblock(c->fd, 0) != PD_OK) {
        return -1;
    }
    int afd = c->fd;
    c->fd = -1;
    *fatal = install(t, (int)h.rank, (int)h.channel, afd);
    return 1;
}

/* Accept the channels of every higher rank.  Connections authenticate
 * concurrently, each within PENDING_SECONDS, so a stranger's idle or slow
 * handshake never delays a peer's (served one at a time, six idle
 * connections once delayed init by 30 s). */
static pd_status
accept_peers(pd_transport *t, tcp_mesh *m, uint64_t token, double deadline)
{
    int need = 2 * (t->size - 1 - t->rank);
    pd_status st = PD_OK;
    if (need <= 0) {
        return PD_OK;
    }
    pending *pend = calloc(PENDING_MAX, sizeof(*pend));
    struct pollfd *pfd = calloc(PENDING_MAX + 1, sizeof(*pfd));
    if (pend == NULL || pfd == NULL) {
        free(pend);
        free(pfd);
        return pd_error(PD_ENOMEM, "tcp transport: out of memory");
    }
    int npend = 0;
    pd_auth_refusals refused = {0};
    while (need > 0) {
        double now = pd_now();
        if (atomic_load_explicit(&m->cancelled, memory_order_acquire)) {
            st = pd_error(PD_EBACKEND, "%s", m->why);
            goto out;
        }
        if (deadline > 0 && now >= deadline) {
            st = pd_auth_refusals_explain(
                &refused,
                pd_error(PD_ETIMEOUT,
                         "accept: no connection arrived before the deadline"));
            goto out;
        }
        /* expired handshakes go; the soonest deadline bounds the wait */
        double wake = deadline;
        for (int i = 0; i < npend;) {
            if (pend[i].deadline <= now) {
                PD_LOG(PD_LOG_INFO, "tcp", "rank %d: dropped a connection "
                       "that did not authenticate within %.0f s", t->rank,
                       PENDING_SECONDS);
                pending_drop(pend, &npend, i);
                continue;
            }
            if (wake <= 0 || pend[i].deadline < wake) {
                wake = pend[i].deadline;
            }
            i++;
        }
        pfd[0].fd = m->lfd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        for (int i = 0; i < npend; i++) {
            int w = pend[i].stage == PEND_AUTH && pend[i].auth.want_write;
            pfd[i + 1].fd = pend[i].fd;
            pfd[i + 1].events = w ? POLLOUT : POLLIN;
            pfd[i + 1].revents = 0;
        }
        int ms = CANCEL_POLL_MS;
        if (wake > 0) {
            double left = wake - now;
            ms = left * 1000.0 >= CANCEL_POLL_MS ? CANCEL_POLL_MS
                                                 : (int)(left * 1000.0) + 1;
        }
        int r = poll(pfd, (nfds_t)npend + 1, ms);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            st = pd_syserror(PD_ESYS, "poll (accepting ranks)");
            goto out;
        }
        /* Step the connections that are ready, from the last so that a
         * drop (which moves the last into its slot) skips none. */
        for (int i = npend - 1; i >= 0; i--) {
            if (pfd[i + 1].revents == 0) {
                continue;
            }
            pd_status fatal = PD_OK;
            int done = pending_step(t, &pend[i], token, &refused, &fatal);
            if (fatal != PD_OK) {
                st = fatal;
                goto out;
            }
            if (done != 0) {
                pending_drop(pend, &npend, i);
                need -= done > 0;
            }
        }
        if (need <= 0 || !(pfd[0].revents & POLLIN)) {
            continue;
        }
        int fd = accept4(m->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK ||
                err == ECONNABORTED || err == EPROTO) {
                continue;
            }
            st = pd_syserror(err == EMFILE || err == ENFILE ? PD_ESYS
                                                            : PD_ENETWORK,
                             "accept");
            goto out;
        }
        (void)pd_net_set_nodelay(fd);
        if (npend == PENDING_MAX) {
            int oldest = 0;
            for (int i = 1; i < npend; i++) {
                if (pend[i].deadline < pend[oldest].deadline) {
                    oldest = i;
                }
            }
            pending_drop(pend, &npend, oldest);
        }
        pending *c = &pend[npend++];
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->stage = PEND_AUTH;
        c->deadline = pd_now() + PENDING_SECONDS;
        if (deadline > 0 && deadline < c->deadline) {
            c->deadline = deadline;
        }
        if (pd_auth_srv_init(&c->auth, m->secret) != PD_OK) {
            pending_drop(pend, &npend, npend - 1);
            continue;
        }
        /* the server speaks first: start now rather than after a poll */
        pd_status fatal = PD_OK;
        int done = pending_step(t, c, token, &refused, &fatal);
        if (fatal != PD_OK) {
            st = fatal;
            goto out;
        }
        if (done != 0) {
            pending_drop(pend, &npend, npend - 1);
            need -= done > 0;
        }
    }
out:
    while (npend > 0) {
        pending_drop(pend, &npend, npend - 1);
    }
    free(pend);
    free(pfd);
    return st;
}

void
pd_tcp_cancel_connect(pd_transport *t, const char *why)
{
    tcp_mesh *m = pd_engine_setup(t);
    int expected = 0;
    if (m == NULL || !atomic_compare_exchange_strong(&m->cancel_claimed,
                                                     &expected, 1)) {
        return;
    }
    snprintf(m->why, sizeof(m->why), "%s", why);
    atomic_store_explicit(&m->cancelled, 1, memory_order_release);
}

pd_status
pd_tcp_connect(pd_transport *t, const char *const *hosts, const int *ports,
               uint64_t token, double deadline)
{
    tcp_mesh *m = pd_engine_setup(t);
    int rank = t->rank, size = t->size;
    pd_status st = PD_OK;
    int fd = -1;

    /* Connect to every lower rank: two channels each.  Each listened before
     * it published its address and keeps listening until its higher ranks
     * are in, so a refusal means it failed or exited: said at once. */
    for (int p = 0; p < rank; p++) {
        for (int ch = 0; ch < 2; ch++) {
            st = pd_net_connect_listening(hosts[p], ports[p], deadline, &fd);
            if (st == PD_ENETWORK && strstr(pd_errmsg(), "refused") != NULL) {
                char cause[PD_ERRMSG_MAX];
                snprintf(cause, sizeof(cause), "%s", pd_errmsg());
                st = pd_error(st, "%s: rank %d was listening there when it "
                              "published this address and has closed its "
                              "listener since: it failed or exited during "
                              "setup (see its output)", cause, p);
            }
            if (st != PD_OK) {
                goto fail_conn;
            }
            PD_CHECK_GOTO(pd_auth_client(fd, m->secret, deadline), st,
                          fail_conn);
            hello h = {HELLO_MAGIC, (uint32_t)rank, (uint32_t)ch,
                       (uint32_t)size, token};
            PD_CHECK_GOTO(pd_net_send_all(fd, &h, sizeof(h), deadline), st,
                          fail_conn);
            /* The acceptor confirms, so a rejected hello is an error here
             * rather than a silent hang later. */
            uint32_t ok = 0;
            PD_CHECK_GOTO(pd_net_recv_all(fd, &ok, sizeof(ok), deadline), st,
                          fail_conn);
            if (ok != HELLO_MAGIC) {
                st = pd_error(PD_ENETWORK, "rank %d rejected the connection",
                              p);
                goto fail_conn;
            }
            int cfd = fd;
            fd = -1;
            PD_CHECK_GOTO(install(t, p, ch, cfd), st, fail_conn);
            continue;
        fail_conn:
            if (fd >= 0) {
                close(fd);
            }
            pd_error_prefix("rank %d: connecting to rank %d at %s:%d", rank,
                            p, hosts[p], ports[p]);
            return st;
        }
    }
    /* Accept every higher rank; drop strangers and stale connections. */
    PD_CHECK_GOTO(accept_peers(t, m, token, deadline), st, fail_acc);
    for (int p = 0; p < size; p++) {
        if (p == rank) {
            continue;
        }
        PD_CHECK(setup_socket(pd_tcp_link_fd(pd_engine_link(t, p))));
        PD_CHECK(setup_socket(pd_engine_ctrl_fd(t, p)));
    }
    close(m->lfd);
    m->lfd = -1;
    PD_LOG(PD_LOG_INFO, "tcp", "rank %d: mesh of %d ranks connected", rank,
           size);
    return PD_OK;
fail_acc:
    {
        char missing[256] = "";
        size_t off = 0;
        for (int p = rank + 1; p < size; p++) {
            if (!connected(t, p, CH_DATA) || !connected(t, p, CH_CTRL)) {
                int n = snprintf(missing + off, sizeof(missing) - off, "%s%d",
                                 off ? ", " : "", p);
                if (n < 0 || (size_t)n >= sizeof(missing) - off) {
                    break;
                }
                off += (size_t)n;
            }
        }
        pd_error_prefix("rank %d: waiting for ranks [%s] to connect", rank,
                        missing);
    }
    return st;
}

