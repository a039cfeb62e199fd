/* TCP: connection setup, for every group.
 *
 * Every pair of ranks shares two sockets: a data socket, the pair's link
 * for frames (link_tcp.c; replaced by a shared-memory link between ranks on
 * one host, which keeps the socket for doorbells), and a control socket for
 * the engine's out-of-band messages (../engine.c).  Both are set up here:
 * authenticated (PYDDP_SECRET), then a hello with the group token.
 */
#include "tcp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
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
typedef struct tcp_mesh {
    int lfd;
    char secret[256];
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
pd_tcp_create(int rank, int size, const char *secret,
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
        pd_status st = pd_net_listen(NULL, 0, 4 * size + 16, &m->lfd,
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

pd_status
pd_tcp_connect(pd_transport *t, const char *const *hosts, const int *ports,
               uint64_t token, double deadline)
{
    tcp_mesh *m = pd_engine_setup(t);
    int rank = t->rank, size = t->size;
    pd_status st = PD_OK;
    int fd = -1;

    /* Connect to every lower rank: two channels each. */
    for (int p = 0; p < rank; p++) {
        for (int ch = 0; ch < 2; ch++) {
            PD_CHECK_GOTO(pd_net_connect(hosts[p], ports[p], deadline, &fd),
                          st, fail_conn);
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
    int need = 2 * (size - 1 - rank);
    while (need > 0) {
        PD_CHECK_GOTO(pd_net_accept(m->lfd, deadline, &fd), st, fail_acc);
        /* A stranger gets a short deadline so it cannot stall the mesh. */
        double d = pd_now() + 5.0;
        if (deadline > 0 && deadline < d) {
            d = deadline;
        }
        if (pd_auth_server(fd, m->secret, d) != PD_OK) {
            close(fd);
            fd = -1;
            continue;
        }
        hello h;
        if (pd_net_recv_all(fd, &h, sizeof(h), d) != PD_OK ||
            h.magic != HELLO_MAGIC || h.token != token ||
            h.size != (uint32_t)size || h.rank <= (uint32_t)rank ||
            h.rank >= (uint32_t)size || h.channel > 1) {
            close(fd);
            fd = -1;
            continue;
        }
        if (connected(t, (int)h.rank, (int)h.channel)) {
            close(fd);
            fd = -1;
            continue;
        }
        uint32_t ok = HELLO_MAGIC;
        if (pd_net_send_all(fd, &ok, sizeof(ok), d) != PD_OK) {
            close(fd);
            fd = -1;
            continue;
        }
        int afd = fd;
        fd = -1;
        PD_CHECK_GOTO(install(t, (int)h.rank, (int)h.channel, afd), st,
                      fail_acc);
        need--;
    }
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

