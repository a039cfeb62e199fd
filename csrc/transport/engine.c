/* The frame engine (engine.h): the transport of every process group.
 *
 * Every pair of ranks shares a data link (link.h) that carries frames
 * (header + payload, written straight from the caller's buffer, read
 * straight into the posted buffer) and a control socket for small
 * out-of-band messages (abort, sequence queries, goodbye) that must never
 * queue behind megabytes of data.  The link is the pair's data socket
 * (tcp/), or byte rings in shared memory between ranks on one host (shm/),
 * whose doorbells travel on that socket.
 *
 * Frames from one peer arrive in the order that peer sent them.  A frame is
 * read only when a receive from that peer (or from any peer) is posted; a
 * frame that matches no posted receive is parked in the peer's unexpected
 * queue.  Everything else stays in the link (the kernel's socket buffer, the
 * ring), which gives flow control for free.  Death of a peer shows up as EOF
 * / hang-up on its link or control socket without a preceding goodbye.
 *
 * This file: the engine's lifecycle, the frames (posting, matching,
 * unexpected queues, mismatch detection) and the progress loop; the
 * control sockets' messages are in engine_ctrl.c.
 */
#include "engine_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../kernels/kernels.h"
#include "../util/kinds.h"
#include "../util/log.h"
#include "../util/net.h"

/* First allocation for an unexpected frame's payload: the rest grows as the
 * bytes arrive (at most doubling), so a header's nbytes alone never
 * allocates more than this. */
#define UX_CHUNK ((size_t)1 << 20)

static const pd_transport_ops engine_ops;

/* ------------------------------------------------------------------ errors */

pd_status
pd_eng_fail(engine *t, pd_status st, const char *fmt, ...)
{
    if (t->err == PD_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->errmsg, sizeof(t->errmsg), fmt, ap);
        va_end(ap);
        t->err = st;
    }
    return pd_error(t->err, "%s", t->errmsg);
}

/* Peer p is gone or unreachable: if it had failed the group first (an
 * abort this rank deferred, its collective being ahead), that failure is
 * the cause and becomes the transport's error, so that the error this rank
 * reports next names the culprit that peer found, not the peer that left
 * after its own timeout. */
void
pd_eng_adopt_abort(engine *t, int p)
{
    if (t->peers[p].aborted && t->abort_seq != 0) {
        pd_eng_fail(t, t->abort_st, "%s", t->abort_msg);
    }
}

/* ------------------------------------------------------------ create/close */

pd_status
pd_engine_create(int rank, int size, const pd_transport_events *ev,
                 pd_transport **out)
{
    pd_status st = PD_OK;
    engine *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return pd_error(PD_ENOMEM, "tcp transport: out of memory");
    }
    t->base.ops = &engine_ops;
    t->base.rank = rank;
    t->base.size = size;
    t->ev = *ev;
    t->wfd = -1;
    t->peers = calloc((size_t)size, sizeof(peer));
    t->pfds = calloc((size_t)size * 2 + 1, sizeof(struct pollfd));
    t->pfd_peer = calloc((size_t)size * 2 + 1, sizeof(int));
    t->pfd_chan = calloc((size_t)size * 2 + 1, sizeof(int));
    if (t->peers == NULL || t->pfds == NULL || t->pfd_peer == NULL ||
        t->pfd_chan == NULL) {
        st = pd_error(PD_ENOMEM, "tcp transport: out of memory");
        goto fail;
    }
    for (int i = 0; i < size; i++) {
        t->peers[i].cfd = -1;
    }
    t->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wfd < 0) {
        st = pd_syserror(PD_ESYS, "eventfd");
        goto fail;
    }
    *out = &t->base;
    return PD_OK;
fail:
    engine_ops.close(&t->base);
    return st;
}

void
pd_engine_set_setup(pd_transport *base, void *state,
                    void (*release)(void *state))
{
    engine *t = (engine *)base;
    t->setup = state;
    t->setup_release = release;
}

void *
pd_engine_setup(pd_transport *base)
{
    return ((engine *)base)->setup;
}

pd_link *
pd_engine_link(pd_transport *base, int p)
{
    return ((engine *)base)->peers[p].link;
}

void
pd_engine_set_link(pd_transport *base, int p, pd_link *l)
{
    engine *t = (engine *)base;
    peer *pe = &t->peers[p];
    t->nbuffered -= pe->link != NULL && pe->link->ops->readable != NULL;
    t->nbuffered += l != NULL && l->ops->readable != NULL;
    pe->link = l;
}

int
pd_engine_peer_busy(pd_transport *base, int p)
{
    peer *pe = &((engine *)base)->peers[p];
    return pe->sq_head != NULL || pe->ih_off > 0 || pe->ireq != NULL ||
           pe->iux != NULL;
}

int
pd_engine_ctrl_fd(pd_transport *base, int p)
{
    return ((engine *)base)->peers[p].cfd;
}

void
pd_engine_set_ctrl_fd(pd_transport *base, int p, int fd)
{
    ((engine *)base)->peers[p].cfd = fd;
}

static void
free_unexp(unexp *u)
{
    while (u != NULL) {
        unexp *n = u->next;
        free(u->data);
        free(u);
        u = n;
    }
}

static void
engine_close(pd_transport *base)
{
    engine *t = (engine *)base;
    if (t == NULL) {
        return;
    }
    if (t->peers != NULL) {
        /* Goodbye first, so peers tell a clean exit from a crash; then
         * close the links (queued bytes still arrive). */
        for (int p = 0; p < base->size; p++) {
            peer *pe = &t->peers[p];
            if (pe->cfd >= 0 && !pe->ctrl_eof) {
                pd_eng_ctrl_send(t, p, CTRL_BYE, 0, 0, NULL);
            }
        }
        for (int p = 0; p < base->size; p++) {
            peer *pe = &t->peers[p];
            if (pe->link != NULL) {
                pe->link->ops->close(pe->link);
            }
            if (pe->cfd >= 0) {
                close(pe->cfd);
            }
            free_unexp(pe->ux_head);
            if (pe->iux != NULL) {
                free_unexp(pe->iux);
            }
        }
    }
    if (t->setup_release != NULL) {
        t->setup_release(t->setup);
    }
    if (t->wfd >= 0) {
        close(t->wfd);
    }
    free(t->peers);
    free(t->pfds);
    free(t->pfd_peer);
    free(t->pfd_chan);
    free(t);
}
/* ------------------------------------------------------------ send / recv */


static void
describe(const pd_hdr *h, size_t nbytes, char *buf, size_t len)
{
    if (h->type == PD_FRAME_P2P) {
        snprintf(buf, len, "send/recv(tag=%d, dtype=%s, count=%llu, %zu bytes)",
                 h->tag, pd_dtype_name((pd_dtype)h->dtype),
                 (unsigned long long)h->count, nbytes);
        return;
    }
    int kind = h->kind;
    int reduces = pd_kind_has(kind, PD_KF_REDUCES);
    int rooted = pd_kind_has(kind, PD_KF_ROOTED);
    char opbuf[32] = "", rootbuf[32] = "";
    if (reduces) {
        snprintf(opbuf, sizeof(opbuf), ", op=%s",
                 pd_redop_name((pd_redop)h->op));
    }
    if (rooted) {
        snprintf(rootbuf, sizeof(rootbuf), ", root=%d", h->root);
    }
    /* all_to_all's per-rank sizes may differ legitimately: show bytes */
    char countbuf[48];
    if (pd_kind_has(kind, PD_KF_SPLITS)) {
        snprintf(countbuf, sizeof(countbuf), "%zu bytes to this pair", nbytes);
    }
    else {
        snprintf(countbuf, sizeof(countbuf), "count=%llu",
                 (unsigned long long)h->count);
    }
    snprintf(buf, len, "%s(dtype=%s, %s%s%s) [sequence number %llu]",
             pd_kind_name(h->kind), pd_dtype_name((pd_dtype)h->dtype),
             countbuf, rootbuf, opbuf, (unsigned long long)h->seq);
}

static pd_status
mismatch(engine *t, int p, const pd_hdr *got, const pd_hdr *want,
         size_t want_len)
{
    char a[256], b[256];
    describe(want, want_len, a, sizeof(a));
    describe(got, got->nbytes, b, sizeof(b));
    if (got->type == PD_FRAME_P2P && want->type == PD_FRAME_P2P) {
        /* "send/recv(" is 10 characters: recv(...) and send(...) read
         * better here */
        return pd_eng_fail(t, PD_EMISMATCH,
                           "send/recv mismatch between ranks: rank %d posted "
                           "recv(%s but rank %d sent send(%s; the sender's "
                           "send has returned, so it sees this error at its "
                           "next call",
                           t->base.rank, a + 10, p, b + 10);
    }
    return pd_eng_fail(t, PD_EMISMATCH,
                       "collective mismatch between ranks: rank %d called %s "
                       "but rank %d called %s",
                       t->base.rank, a, p, b);
}

/* Does frame header h satisfy receive r?  1 yes, 0 no, -1 mismatch (the
 * frame belongs to the collective r waits for but disagrees with it). */
static int
match(const pd_req *r, const pd_hdr *h)
{
    const pd_hdr *e = &r->expect;
    if (h->type != e->type) {
        return 0;
    }
    if (h->type == PD_FRAME_P2P) {
        if (h->tag != e->tag) {
            return 0;
        }
        return h->nbytes == r->len && h->dtype == e->dtype &&
                       h->count == e->count
                   ? 1
                   : -1;
    }
    if (h->seq != e->seq || h->tag != e->tag) {
        return 0;
    }
    if (h->kind != e->kind || h->dtype != e->dtype || h->op != e->op ||
        h->root != e->root || h->count != e->count || h->nbytes != r->len) {
        return -1;
    }
    return 1;
}

static void
complete_recv(pd_req *r, const pd_hdr *h, int src)
{
    r->hdr = *h;
    r->peer = src;
    r->state = PD_REQ_DONE;
}

/* Remove r from a singly linked queue. */
static void
unlink_req(pd_req **head, pd_req **tail, pd_req *r)
{
    pd_req *prev = NULL;
    for (pd_req *q = *head; q != NULL; prev = q, q = q->next) {
        if (q == r) {
            if (prev) {
                prev->next = q->next;
            }
            else {
                *head = q->next;
            }
            if (*tail == q) {
                *tail = prev;
            }
            q->next = NULL;
            return;
        }
    }
}

static pd_status
engine_post_send(pd_transport *base, pd_req *r)
{
    engine *t = (engine *)base;
    PD_CHECK(sticky(t));
    int p = r->peer;
    if (p < 0 || p >= base->size || p == base->rank) {
        return pd_error(PD_EINVAL, "send to invalid rank %d", p);
    }
    peer *pe = &t->peers[p];
    if (pe->gone || pe->data_eof) {
        pd_eng_adopt_abort(t, p);
        return pd_eng_fail(t, PD_ENETWORK,
                           "rank %d cannot send to rank %d: rank %d has left "
                           "the group (destroyed its process group or exited)",
                           base->rank, p, p);
    }
    r->hdr.magic = PD_FRAME_MAGIC;
    r->hdr.src = (uint32_t)base->rank;
    r->hdr.nbytes = r->len;
    r->off = 0;
    r->state = PD_REQ_POSTED;
    r->next = NULL;
    if (pe->sq_tail) {
        pe->sq_tail->next = r;
    }
    else {
        pe->sq_head = r;
    }
    pe->sq_tail = r;
    return PD_OK;
}

/* Try to satisfy r from peer p's unexpected queue. */
static int
take_unexpected(engine *t, int p, pd_req *r, pd_status *st)
{
    peer *pe = &t->peers[p];
    unexp *prev = NULL;
    for (unexp *u = pe->ux_head; u != NULL; prev = u, u = u->next) {
        int m = match(r, &u->hdr);
        if (m == 0) {
            continue;
        }
        if (m < 0) {
            *st = mismatch(t, p, &u->hdr, &r->expect, r->len);
            return 1;
        }
        if (u->hdr.nbytes) {
            memcpy(r->buf, u->data, u->hdr.nbytes);
        }
        complete_recv(r, &u->hdr, p);
        if (prev) {
            prev->next = u->next;
        }
        else {
            pe->ux_head = u->next;
        }
        if (pe->ux_tail == u) {
            pe->ux_tail = prev;
        }
        free(u->data);
        free(u);
        *st = PD_OK;
        return 1;
    }
    return 0;
}

static pd_status
engine_post_recv(pd_transport *base, pd_req *r)
{
    engine *t = (engine *)base;
    PD_CHECK(sticky(t));
    r->state = PD_REQ_POSTED;
    r->off = 0;
    r->next = NULL;
    pd_status st = PD_OK;
    if (r->peer < 0) {
        for (int p = 0; p < base->size; p++) {
            if (p != base->rank && take_unexpected(t, p, r, &st)) {
                return st;
            }
        }
        if (t->any_tail) {
            t->any_tail->next = r;
        }
        else {
            t->any_head = r;
        }
        t->any_tail = r;
        return PD_OK;
    }
    int p = r->peer;
    if (p >= base->size || p == base->rank) {
        return pd_error(PD_EINVAL, "receive from invalid rank %d", p);
    }
    if (take_unexpected(t, p, r, &st)) {
        return st;
    }
    peer *pe = &t->peers[p];
    if (pe->gone && pe->data_eof &&
        !pd_link_readable(pe->link)) {
        pd_eng_adopt_abort(t, p);
        return pd_eng_fail(t, PD_ENETWORK,
                           "rank %d cannot receive from rank %d: rank %d has "
                           "left the group (destroyed its process group or "
                           "exited)",
                           base->rank, p, p);
    }
    if (pe->rq_tail) {
        pe->rq_tail->next = r;
    }
    else {
        pe->rq_head = r;
    }
    pe->rq_tail = r;
    return PD_OK;
}

/* Does something posted need this very peer (not just any peer)? */
static int
needs_peer(const peer *pe)
{
    return pe->ih_off > 0 || pe->ireq != NULL || pe->iux != NULL ||
           pe->rq_head != NULL;
}

static int
wants_read(engine *t, peer *pe)
{
    return pe->ih_off > 0 || pe->ireq != NULL || pe->iux != NULL ||
           pe->rq_head != NULL || t->any_head != NULL;
}

/* A frame header from p is complete: find its destination. */
static pd_status
route_frame(engine *t, int p)
{
    peer *pe = &t->peers[p];
    pd_hdr *h = &pe->ih;
    if (h->magic != PD_FRAME_MAGIC || h->src != (uint32_t)p) {
        return pd_eng_fail(t, PD_ENETWORK,
                           "corrupt frame from rank %d (bad magic or source)",
                           p);
    }
    if (h->type == PD_FRAME_COLL && h->seq < t->coll_seq) {
        char a[256];
        describe(h, h->nbytes, a, sizeof(a));
        return pd_eng_fail(t, PD_EMISMATCH,
                           "collective mismatch between ranks: rank %d sent "
                           "data for %s, which rank %d did not expect (it is "
                           "at sequence number %llu); the ranks called "
                           "different collectives",
                           p, a, t->base.rank,
                           (unsigned long long)t->coll_seq);
    }
    if (h->type == PD_FRAME_COLL && h->seq == t->coll_seq) {
        const pd_hdr *e = &t->coll_id;
        if (h->kind != e->kind || h->dtype != e->dtype || h->op != e->op ||
            h->root != e->root || h->count != e->count) {
            return mismatch(t, p, h, e, h->nbytes);
        }
    }
    for (pd_req *r = pe->rq_head; r != NULL; r = r->next) {
        int m = match(r, h);
        if (m < 0) {
            return mismatch(t, p, h, &r->expect, r->len);
        }
        if (m > 0) {
            unlink_req(&pe->rq_head, &pe->rq_tail, r);
            pe->ireq = r;
            pe->ioff = 0;
            return PD_OK;
        }
    }
    if (h->type == PD_FRAME_P2P) {
        for (pd_req *r = t->any_head; r != NULL; r = r->next) {
            int m = match(r, h);
            if (m < 0) {
                return mismatch(t, p, h, &r->expect, r->len);
            }
            if (m > 0) {
                unlink_req(&t->any_head, &t->any_tail, r);
                pe->ireq = r;
                pe->ioff = 0;
                return PD_OK;
            }
        }
    }
    unexp *u = calloc(1, sizeof(*u));
    size_t first = h->nbytes < UX_CHUNK ? (size_t)h->nbytes : UX_CHUNK;
    if (u == NULL || (first && (u->data = malloc(first)) == NULL)) {
        free(u);
        return pd_eng_fail(t, PD_ENOMEM,
                           "out of memory buffering %llu bytes from rank %d",
                           (unsigned long long)h->nbytes, p);
    }
    u->hdr = *h;
    u->cap = first;
    pe->iux = u;
    pe->ioff = 0;
    return PD_OK;
}

static void
frame_done(engine *t, int p)
{
    peer *pe = &t->peers[p];
    if (pe->ireq) {
        pd_req *r = pe->ireq;
        complete_recv(r, &pe->ih, p);
        pe->ireq = NULL;
    }
    else if (pe->iux) {
        unexp *u = pe->iux;
        if (pe->ux_tail) {
            pe->ux_tail->next = u;
        }
        else {
            pe->ux_head = u;
        }
        pe->ux_tail = u;
        pe->iux = NULL;
    }
    pe->ih_off = 0;
    pe->ioff = 0;
}

/* Read as much as is useful from peer p's link.  Not after a fatal error:
 * a frame that failed to route (a mismatch) has its header read but no
 * destination, and nothing moves any more. */
static pd_status
do_read(engine *t, int p)
{
    peer *pe = &t->peers[p];
    while (t->err == PD_OK && wants_read(t, pe)) {
        char *dst;
        size_t want;
        if (pe->ih_off < sizeof(pd_hdr)) {
            dst = (char *)&pe->ih + pe->ih_off;
            want = sizeof(pd_hdr) - pe->ih_off;
        }
        else if (pe->ireq) {
            dst = pe->ireq->buf + pe->ioff;
            want = pe->ih.nbytes - pe->ioff;
        }
        else {
            unexp *u = pe->iux;
            if (pe->ioff == u->cap) {
                size_t nb = pe->ih.nbytes;
                size_t cap = u->cap < nb / 2 ? 2 * u->cap : nb;
                char *np = realloc(u->data, cap);
                if (np == NULL) {
                    return pd_eng_fail(t, PD_ENOMEM,
                                       "out of memory buffering %zu bytes "
                                       "from rank %d", nb, p);
                }
                u->data = np;
                u->cap = cap;
            }
            dst = u->data + pe->ioff;
            want = u->cap - pe->ioff;
        }
        ssize_t n = want ? pe->link->ops->read(pe->link, dst, want) : 0;
        if (want && n == 0) {
            pe->data_eof = 1;
            pd_eng_peer_gone(t, p);
            /* A receive from any rank may still be satisfied by another. */
            if (needs_peer(pe)) {
                return pd_eng_fail(t, PD_ENETWORK,
                                   "rank %d: connection to rank %d closed "
                                   "while waiting for its data (rank %d "
                                   "exited or destroyed its process group)",
                                   t->base.rank, p, p);
            }
            return sticky(t);
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return PD_OK;
            }
            pe->data_eof = 1;
            pd_eng_peer_gone(t, p);
            return pd_eng_fail(t, PD_ENETWORK,
                               "rank %d: receiving from rank %d: %s",
                               t->base.rank, p, strerror(errno));
        }
        if (pe->ih_off < sizeof(pd_hdr)) {
            pe->ih_off += (size_t)n;
            if (pe->ih_off == sizeof(pd_hdr)) {
                PD_CHECK(route_frame(t, p));
                if (pe->ih.nbytes == 0) {
                    frame_done(t, p);
                }
            }
        }
        else {
            pe->ioff += (size_t)n;
            if (pe->ioff == pe->ih.nbytes) {
                frame_done(t, p);
            }
        }
        /* A short read drained the link: skip the read that would only
         * say EAGAIN, and let poll report the next arrival. */
        if ((size_t)n < want) {
            return PD_OK;
        }
    }
    return sticky(t);
}

static pd_status
do_write(engine *t, int p)
{
    peer *pe = &t->peers[p];
    while (pe->sq_head != NULL) {
        pd_req *r = pe->sq_head;
        struct iovec iov[2];
        int niov = 0;
        size_t hl = sizeof(pd_hdr);
        if (r->off < hl) {
            iov[niov].iov_base = (char *)&r->hdr + r->off;
            iov[niov].iov_len = hl - r->off;
            niov++;
            if (r->len) {
                iov[niov].iov_base = r->buf;
                iov[niov].iov_len = r->len;
                niov++;
            }
        }
        else {
            iov[niov].iov_base = r->buf + (r->off - hl);
            iov[niov].iov_len = r->len - (r->off - hl);
            niov++;
        }
        ssize_t n = pe->link->ops->writev(pe->link, iov, niov);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return PD_OK;
            }
            int e = errno;
            pd_eng_peer_gone(t, p);
            return pd_eng_fail(t, PD_ENETWORK,
                               "rank %d: sending to rank %d: %s",
                               t->base.rank, p, strerror(e));
        }
        size_t asked = 0;
        for (int i = 0; i < niov; i++) {
            asked += iov[i].iov_len;
        }
        r->off += (size_t)n;
        if ((size_t)n < asked) {
            return PD_OK; /* the link is full: wait until it is writable */
        }
        if (r->off == hl + r->len) {
            pe->sq_head = r->next;
            if (pe->sq_head == NULL) {
                pe->sq_tail = NULL;
            }
            r->next = NULL;
            r->state = PD_REQ_DONE;
            t->completed++;
        }
    }
    return PD_OK;
}

/* Move frames through the links that buffer in memory; returns 1 if
 * anything moved or can move now (the caller must not sleep), else 0 with
 * every wait announced. */
static int
buffered_progress(engine *t)
{
    int moved = 0;
    for (int p = 0; p < t->base.size; p++) {
        peer *pe = &t->peers[p];
        pd_link *l = pe->link;
        if (l == NULL || l->ops->readable == NULL) {
            continue;
        }
        /* a peer that left may have left frames in the link: still read */
        if (wants_read(t, pe) && l->ops->readable(l)) {
            (void)do_read(t, p); /* errors are sticky: progress reports */
            moved = 1;
        }
        if (pe->gone) {
            if (pe->data_eof && needs_peer(pe) && !l->ops->readable(l)) {
                pd_eng_adopt_abort(t, p);
                pd_eng_fail(t, PD_ENETWORK,
                            "rank %d cannot receive from rank %d: rank %d has "
                            "left the group (destroyed its process group or "
                            "exited)",
                            t->base.rank, p, p);
                return 1;
            }
            continue;
        }
        if (pe->sq_head != NULL && l->ops->writable(l)) {
            (void)do_write(t, p);
            moved = 1;
        }
    }
    if (moved || t->err != PD_OK) {
        return 1;
    }
    for (int p = 0; p < t->base.size; p++) {
        peer *pe = &t->peers[p];
        pd_link *l = pe->link;
        if (l == NULL || l->ops->readable == NULL) {
            continue;
        }
        int data = !pe->gone && wants_read(t, pe);
        int space = !pe->gone && pe->sq_head != NULL;
        l->ops->want(l, data, space);
        /* the peer may have moved just before seeing the flag */
        if ((data && l->ops->readable(l)) || (space && l->ops->writable(l))) {
            moved = 1;
        }
    }
    return moved;
}

/* Peer p's link says it is gone, but what it wrote before may still be
 * buffered in the link: read that, then fail if p is still needed. */
static pd_status
link_dead(engine *t, int p)
{
    peer *pe = &t->peers[p];
    pe->data_eof = 1;
    pd_eng_peer_gone(t, p);
    if (wants_read(t, pe)) {
        PD_CHECK(do_read(t, p));
    }
    if ((needs_peer(pe) && !pd_link_readable(pe->link)) ||
        pe->sq_head != NULL) {
        pd_eng_adopt_abort(t, p);
        return pd_eng_fail(t, PD_ENETWORK,
                           "rank %d: connection to rank %d closed while "
                           "waiting for it (rank %d exited or destroyed its "
                           "process group)", t->base.rank, p, p);
    }
    return sticky(t);
}

static pd_status
engine_progress(pd_transport *base, int timeout_ms)
{
    engine *t = (engine *)base;
    int n = 0;
    if (t->err != PD_OK) {
        /* Nothing moves any more, but peers may still ask where we are. */
        for (int p = 0; p < base->size; p++) {
            peer *pe = &t->peers[p];
            if (p != base->rank && !pe->ctrl_eof && pe->cfd >= 0) {
                t->pfds[n] = (struct pollfd){pe->cfd, POLLIN, 0};
                t->pfd_peer[n++] = p;
            }
        }
        t->pfds[n] = (struct pollfd){t->wfd, POLLIN, 0};
        t->pfd_peer[n++] = -1;
        if (poll(t->pfds, (nfds_t)n, timeout_ms) > 0) {
            for (int i = 0; i < n; i++) {
                if (t->pfds[i].revents && t->pfd_peer[i] >= 0) {
                    pd_eng_ctrl_read(t, t->pfd_peer[i]);
                }
                else if (t->pfds[i].revents) {
                    uint64_t v;
                    ssize_t r = read(t->wfd, &v, sizeof(v));
                    (void)r;
                }
            }
        }
        return sticky(t);
    }
    /* Buffering links first: move what can move; sleep only when nothing
     * can, after telling the peers what we wait for (they wake us). */
    if (t->nbuffered > 0 && buffered_progress(t)) {
        if (t->err != PD_OK) {
            return sticky(t); /* what buffered_progress met (it goes on) */
        }
        timeout_ms = 0;
    }
    /* Opportunistic writes first: most sends complete without polling.
     * If one did, the caller may be waiting for exactly that: do not sleep. */
    uint64_t before = t->completed;
    for (int p = 0; p < base->size; p++) {
        peer *pe = &t->peers[p];
        if (p != base->rank && pe->sq_head != NULL && !pe->gone) {
            PD_CHECK(do_write(t, p));
        }
    }
    if (t->completed != before) {
        timeout_ms = 0;
    }
    int sending = 0;
    for (int p = 0; p < base->size; p++) {
        if (p != base->rank && t->peers[p].sq_head != NULL) {
            sending = 1;
        }
    }
    t->pfds[n] = (struct pollfd){t->wfd, POLLIN, 0};
    t->pfd_peer[n] = -1;
    t->pfd_chan[n] = -1;
    n++;
    for (int p = 0; p < base->size; p++) {
        peer *pe = &t->peers[p];
        if (p == base->rank) {
            continue;
        }
        if (!pe->data_eof && pe->link != NULL) {
            pd_link_wait w = {0, pe->sq_head != NULL, !pe->gone, 1};
            if (wants_read(t, pe)) {
                w.read = 1;
                /* Mid-payload while this rank is also sending (a ring step):
                 * wake when a good part of the rest is here, and spend the
                 * time in between on the sends.  A rank that only receives
                 * reads every segment at once: that keeps the sender's
                 * window open.  A header may be all that comes: any byte. */
                int payload = pe->ih_off == sizeof(pd_hdr) &&
                              (pe->ireq != NULL || pe->iux != NULL);
                if (payload && sending) {
                    w.lowat = pe->ih.nbytes - pe->ioff;
                }
            }
            if (pe->link->ops->poll(pe->link, &w, &t->pfds[n])) {
                t->pfd_peer[n] = p;
                t->pfd_chan[n] = CH_DATA;
                n++;
            }
        }
        if (!pe->ctrl_eof && pe->cfd >= 0) {
            t->pfds[n] = (struct pollfd){pe->cfd, POLLIN | POLLRDHUP, 0};
            t->pfd_peer[n] = p;
            t->pfd_chan[n] = CH_CTRL;
            n++;
        }
    }
    int rc;
    do {
        rc = poll(t->pfds, (nfds_t)n, timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        return pd_syserror(PD_ESYS, "poll");
    }
    for (int i = 0; i < n && rc > 0; i++) {
        short re = t->pfds[i].revents;
        if (re == 0) {
            continue;
        }
        int p = t->pfd_peer[i];
        if (p < 0) {
            uint64_t v;
            ssize_t r = read(t->wfd, &v, sizeof(v));
            (void)r;
            continue;
        }
        peer *pe = &t->peers[p];
        if (t->pfd_chan[i] == CH_CTRL) {
            pd_eng_ctrl_read(t, p);
            if (pe->ctrl_eof) {
                pd_eng_peer_gone(t, p);
            }
            continue;
        }
        int ev = pe->link->ops->events(pe->link, re);
        if (ev & PD_LINK_DEAD) {
            PD_CHECK(link_dead(t, p));
            continue;
        }
        if (ev & PD_LINK_IN) {
            if (wants_read(t, pe)) {
                PD_CHECK(do_read(t, p));
            }
        }
        if (ev & PD_LINK_OUT) {
            PD_CHECK(do_write(t, p));
        }
        if ((ev & (PD_LINK_HUP | PD_LINK_ERR)) && !pe->gone) {
            if (!wants_read(t, pe) || (ev & PD_LINK_ERR)) {
                pd_eng_peer_gone(t, p);
            }
        }
    }
    /* A peer that left cleanly is fatal only if we still need it. */
    for (int p = 0; p < base->size; p++) {
        peer *pe = &t->peers[p];
        if (p != base->rank && pe->gone && pe->sq_head != NULL) {
            pd_eng_adopt_abort(t, p);
            return pd_eng_fail(t, PD_ENETWORK,
                               "rank %d cannot send to rank %d: rank %d has "
                               "left "
                               "the group", base->rank, p, p);
        }
    }
    return sticky(t);
}

static void
engine_wake(pd_transport *base)
{
    engine *t = (engine *)base;
    uint64_t one = 1;
    ssize_t r = write(t->wfd, &one, sizeof(one));
    (void)r;
}

static void
engine_fail(pd_transport *base, int status, const char *msg)
{
    pd_eng_fail((engine *)base, (pd_status)status, "%s", msg);
}

static void
engine_set_coll(pd_transport *base, const pd_hdr *id)
{
    engine *t = (engine *)base;
    t->coll_seq = id->seq;
    t->coll_id = *id;
    if (t->abort_seq != 0 && id->seq >= t->abort_seq) {
        pd_eng_fail(t, t->abort_st, "%s", t->abort_msg);
    }
}

static const pd_transport_ops engine_ops = {
    .name = "tcp",
    .post_send = engine_post_send,
    .post_recv = engine_post_recv,
    .progress = engine_progress,
    .wake = engine_wake,
    .abort_peers = pd_eng_abort_peers,
    .query_seqs = pd_eng_query_seqs,
    .set_coll = engine_set_coll,
    .fail = engine_fail,
    .close = engine_close,
};

