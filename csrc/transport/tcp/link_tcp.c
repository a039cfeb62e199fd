/* The TCP link: a frame engine's bytes to and from one peer on the pair's
 * data socket, written with sendmsg straight from the caller's buffers and
 * read straight into the posted ones.  The kernel's socket buffers give flow
 * control; poll() says when to move; EOF / POLLRDHUP is the peer going. */
#include "link_tcp.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* Largest receive low-water mark: well under the 4 MiB socket buffer. */
#define PD_TCP_LOWAT_MAX (256 << 10)

typedef struct tcp_link {
    pd_link base;
    int fd;
    int lowat; /* SO_RCVLOWAT in force (0: the default, 1) */
} tcp_link;

static ssize_t
tcp_read(pd_link *base, void *buf, size_t n)
{
    return recv(((tcp_link *)base)->fd, buf, n, 0);
}

static ssize_t
tcp_writev(pd_link *base, const struct iovec *iov, int niov)
{
    struct msghdr mh = {0};
    mh.msg_iov = (struct iovec *)iov;
    mh.msg_iovlen = (size_t)niov;
    return sendmsg(((tcp_link *)base)->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Wake up for a large payload only when a good part of it has arrived, not
 * for every segment: each wakeup costs more than copying 64 KiB. */
static void
set_lowat(tcp_link *l, size_t want)
{
    int v = want > PD_TCP_LOWAT_MAX ? PD_TCP_LOWAT_MAX : (int)want;
    if (v < 1) {
        v = 1;
    }
    if (v != l->lowat) {
        if (setsockopt(l->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) {
            l->lowat = v;
        }
    }
}

static int
tcp_poll(pd_link *base, const pd_link_wait *w, struct pollfd *pfd)
{
    tcp_link *l = (tcp_link *)base;
    short ev = 0;
    if (w->hangup) {
        ev |= POLLRDHUP;
    }
    if (w->write) {
        ev |= POLLOUT;
    }
    if (w->read) {
        ev |= POLLIN;
        set_lowat(l, w->lowat);
    }
    if (ev == 0) {
        return 0;
    }
    *pfd = (struct pollfd){l->fd, ev, 0};
    return 1;
}

static int
tcp_events(pd_link *base, short re)
{
    (void)base;
    int ev = 0;
    if (re & (POLLIN | POLLHUP | POLLERR)) {
        ev |= PD_LINK_IN;
    }
    if (re & POLLOUT) {
        ev |= PD_LINK_OUT;
    }
    if (re & POLLRDHUP) {
        ev |= PD_LINK_HUP;
    }
    if (re & (POLLHUP | POLLERR)) {
        ev |= PD_LINK_ERR;
    }
    return ev;
}

/* Half-close so queued bytes still arrive, drain what the peer sent us
 * (closing with unread bytes would reset the connection), close. */
static void
tcp_link_close(pd_link *base)
{
    tcp_link *l = (tcp_link *)base;
    shutdown(l->fd, SHUT_WR);
    char junk[4096];
    while (recv(l->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0) {
    }
    close(l->fd);
    free(l);
}

static const pd_link_ops tcp_link_ops = {
    .name = "tcp",
    .read = tcp_read,
    .writev = tcp_writev,
    .readable = NULL,
    .writable = NULL,
    .want = NULL,
    .poll = tcp_poll,
    .events = tcp_events,
    .close = tcp_link_close,
};

pd_status
pd_tcp_link_new(int fd, pd_link **out)
{
    tcp_link *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        close(fd);
        return pd_error(PD_ENOMEM, "tcp transport: out of memory");
    }
    l->base.ops = &tcp_link_ops;
    l->fd = fd;
    *out = &l->base;
    return PD_OK;
}

int
pd_tcp_link_fd(const pd_link *l)
{
    return ((const tcp_link *)l)->fd;
}
