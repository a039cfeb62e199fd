/* The transport interface: how a process group moves bytes between ranks.
 *
 * A transport is a struct of function pointers.  The frame engine
 * (engine.h) implements it once for every group; it moves each peer's bytes
 * through that peer's link (link.h, like NCCL's struct ncclTransport),
 * chosen per peer: a TCP socket (tcp/) for any host, shared-memory rings
 * (shm/) between ranks of one host.  The group's progress thread is the
 * only caller, except wake(), which any thread may call.
 *
 * Messages are frames: a 48-byte header (pd_hdr) then nbytes of payload.  The
 * header of every collective frame carries the collective's identity
 * (sequence number, kind, dtype, count, root, op) and the algorithm step, so
 * the receiver detects ranks that called different collectives instead of
 * hanging or producing a wrong result.
 */
#ifndef PD_TRANSPORT_H
#define PD_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

#define PD_FRAME_MAGIC 0x50444450u /* "PDDP" */

enum { PD_FRAME_COLL = 1, PD_FRAME_P2P = 2 };

typedef struct pd_hdr {
    uint32_t magic;
    uint8_t type;    /* PD_FRAME_COLL or PD_FRAME_P2P */
    uint8_t kind;    /* collective kind (util/kinds.h) */
    uint8_t dtype;
    uint8_t op;
    int32_t root;
    int32_t tag;     /* collective: algorithm step; p2p: user tag */
    uint32_t src;    /* sender rank */
    uint32_t pad;
    uint64_t seq;    /* collective sequence number (0 for p2p) */
    uint64_t count;  /* collective: elements of the whole call */
    uint64_t nbytes; /* payload bytes that follow */
} pd_hdr;

/* Headers go on the wire as raw bytes between ranks of one architecture:
 * fixed layout, no padding. */
_Static_assert(sizeof(pd_hdr) == 48, "pd_hdr must be 48 bytes");

enum { PD_REQ_POSTED = 0, PD_REQ_DONE = 1 };

/* One posted send or receive.  Owned by the caller until it is done (or the
 * transport is closed). */
typedef struct pd_req {
    pd_hdr hdr;      /* send: header to send; recv: the header that arrived */
    pd_hdr expect;   /* recv: type/seq/tag (and identity) that must arrive */
    int peer;        /* send: destination; recv: source or -1 (any, p2p) */
    int state;       /* PD_REQ_POSTED / PD_REQ_DONE */
    char *buf;       /* payload */
    size_t len;      /* payload bytes */
    size_t off;      /* bytes moved so far (send: header included) */
    struct pd_req *next;
} pd_req;

typedef struct pd_transport pd_transport;

/* Callbacks from the transport into its group (progress thread only). */
typedef struct pd_transport_events {
    void *ctx;
    /* A peer reported a fatal error (mismatch, timeout) to the whole group. */
    void (*on_abort)(void *ctx, int peer, int status, const char *msg);
    /* A peer asks which collective this rank has reached (timeout diagnosis). */
    uint64_t (*current_seq)(void *ctx);
} pd_transport_events;

typedef struct pd_transport_ops {
    const char *name;
    pd_status (*post_send)(pd_transport *t, pd_req *r);
    pd_status (*post_recv)(pd_transport *t, pd_req *r);
    /* Move bytes until something completes, an error is found, or timeout_ms
     * passes (-1: no limit).  Returns the transport's sticky error if any. */
    pd_status (*progress)(pd_transport *t, int timeout_ms);
    /* Interrupt a progress() blocked in another thread. */
    void (*wake)(pd_transport *t);
    /* Tell every peer that this group failed (best effort, bounded). */
    void (*abort_peers)(pd_transport *t, int status, const char *msg);
    /* Ask every peer which collective sequence number it has reached; fills
     * seqs[peer] (UINT64_MAX when it did not answer within timeout_s). */
    pd_status (*query_seqs)(pd_transport *t, uint64_t *seqs, double timeout_s);
    /* The collective the group is running now (type, kind, dtype, op, root,
     * seq, count): any frame of that sequence number with another identity
     * is a mismatch, whatever receives are posted. */
    void (*set_coll)(pd_transport *t, const pd_hdr *id);
    /* Make status/msg the transport's sticky error: nothing moves after it,
     * so buffers of requests still queued may be released. */
    void (*fail)(pd_transport *t, int status, const char *msg);
    /* Graceful close: say goodbye, flush, release everything.  Accepts a
     * half-built transport. */
    void (*close)(pd_transport *t);
} pd_transport_ops;

struct pd_transport {
    const pd_transport_ops *ops;
    int rank;
    int size;
};

#endif
