/* Backend "nccl"'s core: one NCCL communicator on one device (pd_ncomm)
 * and the operations it launched (pd_nwork); no Python.h
 * (csrc/python/nccl.c binds them as _C.NcclComm and _C.NcclWork).
 *
 * Stream rules are torch's ProcessGroupNCCL's.  A communicator owns a
 * non-blocking stream.  A launch records an event on the caller's stream and
 * makes the communicator's stream wait for it (no host sync), enqueues the
 * NCCL calls on the communicator's stream and records the work's end event
 * there.  pd_nwork_wait_stream(s) makes the caller's stream s wait for that
 * event; pd_nwork_poll waits on the host, bounded.
 *
 * Never hang: communicators are created non-blocking (ncclCommInitRankConfig
 * with blocking=0 where NCCL has it), so initialisation and every call that
 * answers ncclInProgress are polled here with the abort flag and a deadline
 * checked; pd_ncomm_abort (any thread: the Python watchdog's) sets the flag
 * first, then calls ncclCommAbort, never ncclCommDestroy on a broken
 * communicator.
 *
 * Every function that fails returns a pd_status with the message in the
 * thread-local error buffer (util/status.h); the caller (the binding)
 * releases the GIL around those that block. */
#ifndef PD_NCCL_COMM_H
#define PD_NCCL_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "../cuda/cudawrap.h"
#include "../util/status.h"

typedef struct pd_ncomm {
    const struct pd_cudart *rt;
    const struct pd_nccl *nc;
    pthread_mutex_t mu;     /* launches, abort, destroy (a launch may hold it
                             * while NCCL connects: nothing another thread
                             * needs meanwhile takes it) */
    pthread_mutex_t pool_mu; /* the event pool alone; held briefly */
    pd_nccl_comm comm;      /* NULL once aborted or destroyed (set under mu;
                             * read without it by error_string: see users) */
    atomic_int users;       /* readers of comm without mu (take_comm waits) */
    atomic_int abort_done;  /* ncclCommAbort or destroy returned */
    /* threads inside an NCCL call on comm, and how often one entered while
     * another was inside: NCCL gives no thread-safety guarantee, so this
     * must stay 0 (tests/gpu/verify.sh reads it on a GPU) */
    atomic_int inside;
    atomic_long overlaps;
    double timeout;         /* seconds a call may stay ncclInProgress; 0: none */
    pd_cuda_stream stream;
    pd_cuda_event start;    /* recorded on the caller's stream per launch */
    pd_cuda_event *pool;    /* free end events */
    int npool, cappool;
    void *scratch;          /* the device's 4 barrier bytes (never freed) */
    int device, rank, size;
    atomic_int aborted;
    pthread_mutex_t why_mu; /* reason alone: the first abort takes it before
                             * it sets `aborted`, so a reader that saw the
                             * flag and takes it reads the whole reason */
    char reason[PD_ERRMSG_MAX];
    unsigned long long seq;
} pd_ncomm;

/* One launch: arrays arrive as device pointers, sizes in elements (count)
 * or bytes (splits); laid out as the CPU backend's (see
 * pyddp.distributed._backend).  kind PD_K_NONE: batched point-to-point. */
typedef struct pd_nlaunch {
    int kind, dtype, op, root;
    size_t count;          /* elements */
    size_t itemsize;
    void **ins, **outs;
    ptrdiff_t nin, nout;
    size_t *isplit, *osplit; /* bytes per rank, or NULL */
    /* batched point-to-point */
    int np2p;
    int *p2p_send, *p2p_peer;
    void **p2p_ptr;
    size_t *p2p_bytes;
} pd_nlaunch;

/* An operation launched on a communicator's stream. */
typedef struct pd_nwork {
    pd_ncomm *c;
    pd_cuda_event end;
    unsigned long long seq;
    double t0;
    int done;               /* 1 done, 2 failed */
    int holds;              /* the caller must keep the arrays alive */
    long long ustream;      /* the caller's stream at the launch (-1: none) */
} pd_nwork;

/* ---------------------------------------------------------- communicator */

/* Set up c (zeroed memory) for a communicator on device; no CUDA call. */
void pd_ncomm_setup(pd_ncomm *c, const struct pd_cudart *rt,
                    const struct pd_nccl *nc, int device);
/* Create c's stream, then the communicator (ncclCommInitRankConfig,
 * non-blocking where NCCL has it) on c's device, restoring the caller's
 * device.  c->rank, c->size and c->timeout are set by the caller. */
pd_status pd_ncomm_init(pd_ncomm *c, const pd_nccl_uid *uid);
/* ncclCommSplit of parent into child (set up, rank, size and timeout set):
 * PD_OK with child->comm NULL for NCCL_SPLIT_NOCOLOR.  *orphaned = 1: NCCL
 * may still write child->comm (the poll timed out or the parent was
 * aborted): the parent's owner must keep child, never free it. */
pd_status pd_ncomm_split(pd_ncomm *parent, pd_ncomm *child, int color, int key,
                         double timeout, int *orphaned);
/* ncclCommGetAsyncError's result (ncclInProgress while a non-blocking call
 * is in progress); ncclInternalError once aborted.  Under mu, never waiting
 * for it: ncclInProgress while another thread is inside the communicator. */
pd_nccl_res pd_ncomm_async_error(pd_ncomm *c);
/* The result once no call is in progress (ncclInProgress: the timeout
 * passed first). */
pd_nccl_res pd_ncomm_wait_ready(pd_ncomm *c, double timeout);
/* NCCL's text for r with its last error message. */
const char *pd_ncomm_error_string(pd_ncomm *c, pd_nccl_res r, char *buf,
                                  size_t cap);
/* 1 if this call aborted the communicator (the first reason is kept), else
 * 0.  Any thread; never blocks on the communicator's work. */
int pd_ncomm_abort(pd_ncomm *c, const char *reason);
/* "destroyed" or "aborted": a communicator whose stream is idle and that
 * reports no error is finalized and destroyed (bounded by timeout);
 * anything else is aborted. */
const char *pd_ncomm_destroy(pd_ncomm *c, double timeout);
/* Release everything c holds (aborting a communicator never destroyed) and
 * its mutexes: the end of c. */
void pd_ncomm_close(pd_ncomm *c);
/* The error of a call on an aborted or destroyed communicator: its reason. */
pd_status pd_ncomm_aborted_error(pd_ncomm *c);
/* 1 and the reason in buf once c was aborted or destroyed, else 0. */
int pd_ncomm_reason(pd_ncomm *c, char *buf, size_t cap);

/* ---------------------------------------------------------------- launch */

/* The NCCL type and op for a pyddp dtype and ReduceOp, or why not (NULL:
 * supported).  *mult: elements per pyddp element (complex as pairs of
 * reals). */
const char *pd_ncomm_reduction(int dt, int op, int *ndt, int *nop,
                               size_t *mult);
/* Whether L's numbers of inputs and outputs are the layout the launch of
 * its kind reads on this rank. */
int pd_ncomm_layout_ok(const pd_ncomm *c, const pd_nlaunch *L);
/* Launch L after the caller's stream (ustream; -1: no ordering) and fill
 * w; with `wait`, the caller's stream also waits for the work's end (a
 * blocking call's Work.wait(), in the same launch).  While NCCL keeps the
 * call in progress, interrupted(ictx) is asked between slices of 50 ms (c's
 * mutex held: it must not take it); when it answers 1 the communicator is
 * aborted and PD_EINTR returned.  Past c->timeout the communicator is
 * aborted too. */
pd_status pd_ncomm_launch(pd_ncomm *c, const pd_nlaunch *L, long long ustream,
                          int wait, int (*interrupted)(void *), void *ictx,
                          pd_nwork *w);

/* ------------------------------------------------------------------ work */

/* 1 done, 0 running, -1 failed (the communicator was aborted; no message
 * set), -2 a CUDA error (message set).  w->holds turns 0 once the caller may
 * let the arrays go. */
int pd_nwork_query(pd_nwork *w);
/* Poll w's end event on the host until slice_end (pd_now() seconds) or an
 * abort: the last cudaEventQuery result. */
pd_cuda_err pd_nwork_poll(pd_nwork *w, double slice_end);
/* Make the caller's stream s wait for w (no host block). */
pd_status pd_nwork_wait_stream(pd_nwork *w, pd_cuda_stream s);
/* Give w's end event back to its communicator's pool (w is let go). */
void pd_nwork_release(pd_nwork *w);

#endif
