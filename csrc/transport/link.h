/* The link interface: how the frame engine (engine.h) moves bytes to and
 * from one peer.
 *
 * A link is a struct of function pointers, one per peer, chosen when the
 * group is set up (like NCCL's struct ncclTransport or Open MPI's BTLs):
 * tcp/ implements it over the pair's data socket, shm/ over byte rings in
 * shared memory (local peers).  The engine frames, matches and orders; a
 * link only carries bytes, in order, and says when the engine may sleep.
 *
 * Two kinds of readiness:
 *   - a socket link knows nothing without poll(): readable, writable and want
 *     are NULL, and poll()/events() say when to read and write;
 *   - a link that buffers in memory (readable != NULL) is moved by the
 *     engine before it sleeps, and announces through want() what the engine
 *     waits for, so that the peer wakes it (a doorbell on the fd it polls).
 * Only the engine's progress thread calls a link.
 */
#ifndef PD_TRANSPORT_LINK_H
#define PD_TRANSPORT_LINK_H

#include <poll.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct pd_link pd_link;

/* What the engine waits for on a link before it sleeps in poll(). */
typedef struct pd_link_wait {
    int read;     /* bytes from the peer are wanted */
    int write;    /* frames to the peer are queued */
    int hangup;   /* report the peer hanging up (it has not left yet) */
    size_t lowat; /* read: bytes worth waking up for (>= 1) */
} pd_link_wait;

/* What poll() found on a link (events()). */
enum {
    PD_LINK_IN = 1,   /* bytes may be readable (or EOF / an error) */
    PD_LINK_OUT = 2,  /* bytes may be writable */
    PD_LINK_HUP = 4,  /* the peer shut down its side: bytes may remain */
    PD_LINK_ERR = 8,  /* hang-up or error: nothing more will arrive */
    PD_LINK_DEAD = 16 /* the peer is gone; what it wrote before may still
                       * be readable (buffering links) */
};

typedef struct pd_link_ops {
    const char *name;
    /* Copy up to n bytes from the peer into buf: bytes copied, 0 at EOF (the
     * peer closed), or -1 with errno (EAGAIN: nothing now). */
    ssize_t (*read)(pd_link *l, void *buf, size_t n);
    /* Send from iov in order: bytes taken (maybe fewer than asked: out of
     * space), or -1 with errno (EAGAIN: no space now). */
    ssize_t (*writev)(pd_link *l, const struct iovec *iov, int niov);
    /* Buffering links only (else NULL): can bytes be read / written now? */
    int (*readable)(pd_link *l);
    int (*writable)(pd_link *l);
    /* Buffering links only: the engine is about to sleep waiting for data
     * and/or space; the peer must wake it when it moves. */
    void (*want)(pd_link *l, int data, int space);
    /* Fill *pfd to wait for w; returns 0 when there is nothing to poll. */
    int (*poll)(pd_link *l, const pd_link_wait *w, struct pollfd *pfd);
    /* What the revents of that pollfd mean (PD_LINK_* flags). */
    int (*events)(pd_link *l, short revents);
    /* Flush what was sent, release everything (the peer sees EOF). */
    void (*close)(pd_link *l);
} pd_link_ops;

struct pd_link {
    const pd_link_ops *ops;
};

/* Whether bytes wait in a buffering link (0 for socket links and NULL). */
static inline int
pd_link_readable(pd_link *l)
{
    return l != NULL && l->ops->readable != NULL && l->ops->readable(l);
}

#endif
