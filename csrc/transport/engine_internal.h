/* Private to the frame engine (engine.c: frames, matching and progress;
 * engine_ctrl.c: the control sockets' messages): the engine's and its
 * peers' state, and what the two files share.  The interface is engine.h.
 */
#ifndef PD_ENGINE_INTERNAL_H
#define PD_ENGINE_INTERNAL_H

#include <poll.h>
#include <stdint.h>

#include "engine.h"

#define CTRL_MAGIC 0x50444443u  /* "PDDC" */
#define CTRL_MAX 1024

enum { CH_DATA = 0, CH_CTRL = 1 };
enum { CTRL_ABORT = 1, CTRL_QUERY = 2, CTRL_REPLY = 3, CTRL_BYE = 4 };

typedef struct ctrl_msg {
    uint32_t magic;
    uint32_t type;
    uint32_t status;
    uint32_t len; /* text bytes that follow */
    uint64_t seq;
} ctrl_msg;

_Static_assert(sizeof(ctrl_msg) == 24, "ctrl_msg must have no padding");

typedef struct unexp {
    pd_hdr hdr;
    char *data;
    size_t cap; /* allocated: grows as the payload arrives */
    struct unexp *next;
} unexp;

typedef struct peer {
    pd_link *link; /* frames */
    int cfd;       /* control socket */
    pd_req *sq_head, *sq_tail; /* sends in order */
    pd_req *rq_head, *rq_tail; /* receives posted for this peer, in order */
    /* the frame being read */
    pd_hdr ih;
    size_t ih_off;
    pd_req *ireq;
    unexp *iux;
    size_t ioff;
    unexp *ux_head, *ux_tail;
    /* control bytes being read */
    char cbuf[CTRL_MAX + sizeof(ctrl_msg)];
    size_t coff;
    int data_eof;
    int ctrl_eof;
    int bye;
    int gone; /* handled: either left (bye) or fatal */
    uint64_t reply_seq;
    int replied;
    /* it failed the group (sent an abort) at this sequence number: where
     * it went after that is no news, and never a culprit */
    int aborted;
    uint64_t abort_at;
} peer;

typedef struct engine {
    pd_transport base;
    pd_transport_events ev;
    int wfd;
    peer *peers;
    int nbuffered; /* links that buffer in memory (link.h) */
    void *setup;
    void (*setup_release)(void *);
    pd_req *any_head, *any_tail;
    uint64_t coll_seq;
    pd_hdr coll_id;
    /* An abort for a collective this rank has not reached yet: it may still
     * finish the one it is in (all its data was sent), and fails on reaching
     * that sequence number. */
    uint64_t abort_seq;
    pd_status abort_st;
    char abort_msg[PD_ERRMSG_MAX];
    uint64_t completed; /* sends completed: progress() must not then sleep */
    pd_status err;
    char errmsg[PD_ERRMSG_MAX];
    struct pollfd *pfds;
    int *pfd_peer;
    int *pfd_chan;
} engine;

/* engine.c: record the transport's first fatal error (later calls keep the
 * first) and return it; a gone peer's deferred abort as that error. */
pd_status pd_eng_fail(engine *t, pd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pd_eng_adopt_abort(engine *t, int p);

/* The transport's error, if any (every progress step returns it). */
static inline pd_status
sticky(engine *t)
{
    if (t->err != PD_OK) {
        return pd_error(t->err, "%s", t->errmsg);
    }
    return PD_OK;
}

/* engine_ctrl.c: send one control message to p (dropped when its socket
 * is gone); read and handle p's waiting messages; p's socket reported
 * EOF or hang-up (a goodbye or a crash); and the two transport ops that
 * are control messages. */
void pd_eng_ctrl_send(engine *t, int p, uint32_t type, uint32_t status,
                      uint64_t seq, const char *text);
void pd_eng_ctrl_read(engine *t, int p);
void pd_eng_peer_gone(engine *t, int p);
void pd_eng_abort_peers(pd_transport *base, int status, const char *msg);
pd_status pd_eng_query_seqs(pd_transport *base, uint64_t *seqs,
                            double timeout_s);

#endif
