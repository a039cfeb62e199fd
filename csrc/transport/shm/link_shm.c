/* The shared-memory link: frames to and from a rank on this host through
 * byte rings in shared memory (ring.c), with the framing, matching and
 * ordering of the engine unchanged.
 *
 * The pair's data socket (the link this one replaces, kept as the "bell")
 * then only carries one-byte doorbells: a side that runs out of data or
 * space says so in the ring (want) and sleeps in poll() on the socket; the
 * other side sends a doorbell when it sees the flag, never otherwise.  The
 * socket still closes when the peer dies: what the peer wrote before is
 * still in the ring and may be read after that.
 */
#include "link_shm.h"

#include <errno.h>
#include <stdlib.h>

#include "../engine.h"

typedef struct shm_link {
    pd_link base;
    pd_shm *shm;
    int local; /* the peer's index in shm */
    pd_link *bell;
} shm_link;

/* One doorbell byte to the peer (which said it sleeps until we move). */
static void
ring_doorbell(shm_link *l)
{
    char b = 0;
    struct iovec iov = {&b, 1};
    ssize_t n = l->bell->ops->writev(l->bell, &iov, 1);
    (void)n; /* a full socket already holds doorbells */
}

static ssize_t
shm_read(pd_link *base, void *buf, size_t len)
{
    shm_link *l = (shm_link *)base;
    size_t n = pd_shm_ring_read(l->shm, l->local, buf, len);
    if (n == 0) {
        errno = EAGAIN;
        return -1;
    }
    if (pd_shm_ring_peer_waits(l->shm, l->local, 0)) {
        ring_doorbell(l);
    }
    return (ssize_t)n;
}

static ssize_t
shm_writev(pd_link *base, const struct iovec *iov, int niov)
{
    shm_link *l = (shm_link *)base;
    size_t total = 0;
    for (int i = 0; i < niov; i++) {
        size_t n = pd_shm_ring_write(l->shm, l->local, iov[i].iov_base,
                                     iov[i].iov_len);
        total += n;
        if (n < iov[i].iov_len) {
            break;
        }
    }
    if (total == 0) {
        errno = EAGAIN;
        return -1;
    }
    if (pd_shm_ring_peer_waits(l->shm, l->local, 1)) {
        ring_doorbell(l);
    }
    return (ssize_t)total;
}

static int
shm_readable(pd_link *base)
{
    shm_link *l = (shm_link *)base;
    return pd_shm_ring_readable(l->shm, l->local);
}

static int
shm_writable(pd_link *base)
{
    shm_link *l = (shm_link *)base;
    return pd_shm_ring_writable(l->shm, l->local);
}

static void
shm_want(pd_link *base, int data, int space)
{
    shm_link *l = (shm_link *)base;
    pd_shm_ring_want(l->shm, l->local, data, space);
}

/* Sleep on the socket for doorbells, and the peer's death. */
static int
shm_poll(pd_link *base, const pd_link_wait *w, struct pollfd *pfd)
{
    shm_link *l = (shm_link *)base;
    (void)w;
    pd_link_wait bell = {1, 0, 1, 1};
    return l->bell->ops->poll(l->bell, &bell, pfd);
}

/* Doorbell bytes: read them all, then the engine moves what it can; EOF
 * means the peer is gone. */
static int
shm_events(pd_link *base, short revents)
{
    shm_link *l = (shm_link *)base;
    (void)revents;
    char buf[256];
    for (;;) {
        ssize_t n = l->bell->ops->read(l->bell, buf, sizeof(buf));
        if (n > 0) {
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        return PD_LINK_DEAD;
    }
    return PD_LINK_IN | PD_LINK_OUT;
}

static void
shm_link_close(pd_link *base)
{
    shm_link *l = (shm_link *)base;
    l->bell->ops->close(l->bell);
    free(l);
}

static const pd_link_ops shm_link_ops = {
    .name = "shm",
    .read = shm_read,
    .writev = shm_writev,
    .readable = shm_readable,
    .writable = shm_writable,
    .want = shm_want,
    .poll = shm_poll,
    .events = shm_events,
    .close = shm_link_close,
};

pd_status
pd_shm_link_new(pd_shm *shm, int local, pd_link *bell, pd_link **out)
{
    shm_link *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        return pd_error(PD_ENOMEM, "shared-memory link: out of memory");
    }
    l->base.ops = &shm_link_ops;
    l->shm = shm;
    l->local = local;
    l->bell = bell;
    *out = &l->base;
    return PD_OK;
}

pd_status
pd_shm_use_links(pd_transport *t, pd_shm *shm, const int *local_of)
{
    for (int p = 0; p < t->size; p++) {
        if (p == t->rank || local_of[p] < 0) {
            continue;
        }
        if (pd_engine_peer_busy(t, p)) {
            return pd_error(PD_EBACKEND, "rank %d: frames to or from rank %d "
                            "are in flight: cannot switch to shared memory",
                            t->rank, p);
        }
        pd_link *l = NULL;
        PD_CHECK(pd_shm_link_new(shm, local_of[p], pd_engine_link(t, p), &l));
        pd_engine_set_link(t, p, l);
    }
    return PD_OK;
}
