/* The frame engine's control sockets (engine_internal.h): small
 * out-of-band messages between every pair of ranks that must never queue
 * behind megabytes of data: an abort (the group failed, at which sequence
 * number), a query of the sequence number a peer is at and its reply
 * (timeout diagnosis), and the goodbye that tells a clean exit
 * (destroy_process_group) from a crash.
 */
#include "engine_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "../util/log.h"
#include "../util/net.h"

void
pd_eng_ctrl_send(engine *t, int p, uint32_t type, uint32_t status,
                 uint64_t seq, const char *text)
{
    peer *pe = &t->peers[p];
    if (pe->cfd < 0 || pe->ctrl_eof) {
        return;
    }
    char buf[sizeof(ctrl_msg) + CTRL_MAX];
    size_t len = text ? strnlen(text, CTRL_MAX) : 0;
    ctrl_msg m = {CTRL_MAGIC, type, status, (uint32_t)len, seq};
    memcpy(buf, &m, sizeof(m));
    if (len) {
        memcpy(buf + sizeof(m), text, len);
    }
    /* Control messages are tiny and the control socket is otherwise idle,
     * so this cannot block for long; bound it anyway. */
    pd_status st = pd_net_send_all(pe->cfd, buf, sizeof(m) + len,
                                   pd_now() + 1.0);
    (void)st;
}

static void
handle_ctrl(engine *t, int p, const ctrl_msg *m, const char *text)
{
    peer *pe = &t->peers[p];
    switch (m->type) {
    case CTRL_ABORT: {
        /* the status is the peer's word: a failure code, never "ok" (which
         * would fail nothing) nor one this build does not know */
        pd_status ast = m->status > (uint32_t)PD_OK &&
                                m->status < (uint32_t)PD_NSTATUS
                            ? (pd_status)m->status
                            : PD_EBACKEND;
        pe->aborted = 1;
        pe->abort_at = m->seq;
        PD_LOG(PD_LOG_WARN, "tcp",
               "rank %d: abort from rank %d for #%llu: %.*s", t->base.rank, p,
               (unsigned long long)m->seq, (int)m->len, text);
        if (t->err == PD_OK && m->seq > t->coll_seq) {
            if (t->abort_seq == 0 || m->seq < t->abort_seq) {
                t->abort_seq = m->seq;
                t->abort_st = ast;
                snprintf(t->abort_msg, sizeof(t->abort_msg), "%.*s",
                         (int)m->len, text);
            }
        }
        else if (t->err == PD_OK) {
            char msg[PD_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%.*s", (int)m->len, text);
            if (t->ev.on_abort != NULL) {
                t->ev.on_abort(t->ev.ctx, p, (int)ast, msg);
            }
            pd_eng_fail(t, ast, "%s", msg);
        }
        break;
    }
    case CTRL_QUERY: {
        uint64_t cur = t->ev.current_seq ? t->ev.current_seq(t->ev.ctx) : 0;
        pd_eng_ctrl_send(t, p, CTRL_REPLY, 0, cur, NULL);
        break;
    }
    case CTRL_REPLY:
        pe->reply_seq = m->seq;
        pe->replied = 1;
        break;
    case CTRL_BYE:
        pe->bye = 1;
        break;
    default:
        break;
    }
}

/* Read and handle whatever control messages are waiting. */
void
pd_eng_ctrl_read(engine *t, int p)
{
    peer *pe = &t->peers[p];
    while (pe->cfd >= 0 && !pe->ctrl_eof) {
        ssize_t n = recv(pe->cfd, pe->cbuf + pe->coff,
                         sizeof(pe->cbuf) - pe->coff, MSG_DONTWAIT);
        if (n == 0) {
            pe->ctrl_eof = 1;
            break;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                pe->ctrl_eof = 1;
            }
            break;
        }
        pe->coff += (size_t)n;
        for (;;) {
            if (pe->coff < sizeof(ctrl_msg)) {
                break;
            }
            ctrl_msg m;
            memcpy(&m, pe->cbuf, sizeof(m));
            if (m.magic != CTRL_MAGIC || m.len > CTRL_MAX) {
                pe->ctrl_eof = 1; /* garbage: treat as lost */
                pe->coff = 0;
                break;
            }
            size_t total = sizeof(m) + m.len;
            if (pe->coff < total) {
                break;
            }
            handle_ctrl(t, p, &m, pe->cbuf + sizeof(m));
            memmove(pe->cbuf, pe->cbuf + total, pe->coff - total);
            pe->coff -= total;
        }
    }
}

/* A socket of peer p reported EOF / hang-up / error.  Decide between a
 * clean goodbye (destroy_process_group) and a crash. */
void
pd_eng_peer_gone(engine *t, int p)
{
    peer *pe = &t->peers[p];
    if (pe->gone) {
        return;
    }
    pd_eng_ctrl_read(t, p);
    if (!pe->bye && !pe->ctrl_eof) {
        /* The goodbye travels on the other socket: give it a moment. */
        struct pollfd pf = {pe->cfd, POLLIN | POLLRDHUP, 0};
        double until = pd_now() + 0.2;
        while (!pe->bye && !pe->ctrl_eof) {
            int ms = (int)((until - pd_now()) * 1000.0);
            if (ms <= 0 || poll(&pf, 1, ms) <= 0) {
                break;
            }
            pd_eng_ctrl_read(t, p);
        }
    }
    pe->gone = 1;
    PD_LOG(PD_LOG_INFO, "tcp", "rank %d: rank %d %s", t->base.rank, p,
           pe->bye ? "left the group" : "vanished without a goodbye");
    if (!pe->bye) {
        pd_eng_adopt_abort(t, p);
        pd_eng_fail(t, PD_ENETWORK,
                    "rank %d lost its connection to rank %d: rank %d died, "
                    "was killed or closed its sockets without "
                    "destroy_process_group()",
                    t->base.rank, p, p);
    }
}

void
pd_eng_abort_peers(pd_transport *base, int status, const char *msg)
{
    engine *t = (engine *)base;
    for (int p = 0; p < base->size; p++) {
        if (p != base->rank) {
            pd_eng_ctrl_send(t, p, CTRL_ABORT, (uint32_t)status, t->coll_seq,
                             msg);
        }
    }
}

pd_status
pd_eng_query_seqs(pd_transport *base, uint64_t *seqs, double timeout_s)
{
    engine *t = (engine *)base;
    for (int p = 0; p < base->size; p++) {
        seqs[p] = UINT64_MAX;
        t->peers[p].replied = 0;
        if (p != base->rank && !t->peers[p].gone) {
            pd_eng_ctrl_send(t, p, CTRL_QUERY, 0, 0, NULL);
        }
    }
    /* every live peer's control socket, not only the ones still to reply:
     * a peer that answered may time out next and ask this rank, which must
     * answer now, not after its own wait (two ranks timing out together
     * would each call the other silent).  The engine's poll set: this runs
     * on the progress thread, its only other user. */
    struct pollfd *pf = t->pfds;
    int *map = t->pfd_peer;
    double until = pd_now() + timeout_s;
    for (;;) {
        int all = 1;
        int n = 0;
        for (int p = 0; p < base->size; p++) {
            peer *pe = &t->peers[p];
            if (p == base->rank || pe->cfd < 0 || pe->ctrl_eof) {
                continue; /* a lost control socket answers nothing */
            }
            if (!pe->gone && !pe->replied) {
                all = 0;
            }
            pf[n] = (struct pollfd){pe->cfd, POLLIN, 0};
            map[n++] = p;
        }
        double left = until - pd_now();
        if (all || left <= 0 || n == 0 ||
            poll(pf, (nfds_t)n, (int)(left * 1000) + 1) <= 0) {
            break;
        }
        for (int i = 0; i < n; i++) {
            if (pf[i].revents) {
                pd_eng_ctrl_read(t, map[i]);
            }
        }
    }
    for (int p = 0; p < base->size; p++) {
        if (t->peers[p].replied) {
            seqs[p] = t->peers[p].reply_seq;
        }
        else if (t->peers[p].aborted) {
            /* it failed the group there and may have left since: silent,
             * but not a culprit (its abort named one) */
            seqs[p] = t->peers[p].abort_at;
        }
    }
    return PD_OK;
}
