/* Launches: the end-event pool and one launch on the communicator's stream,
 * polled while NCCL keeps it in progress (csrc/nccl/comm.h). */
#include "internal.h"

#include "../util/kinds.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

pd_cuda_event
pd_ncomm_pool_get(pd_ncomm *c, pd_cuda_err *e)
{
    pd_cuda_event ev = NULL;
    pthread_mutex_lock(&c->pool_mu);
    if (c->npool > 0) {
        ev = c->pool[--c->npool];
    }
    pthread_mutex_unlock(&c->pool_mu);
    if (ev != NULL) {
        return ev;
    }
    *e = c->rt->EventCreateWithFlags(&ev, PD_CUDA_EVENT_DISABLE_TIMING);
    return *e ? NULL : ev;
}

/* Any thread, GIL held or not: pool_mu is never held across a slow call. */
void
pd_ncomm_pool_put(pd_ncomm *c, pd_cuda_event ev)
{
    pthread_mutex_lock(&c->pool_mu);
    int live = __atomic_load_n(&c->comm, __ATOMIC_SEQ_CST) != NULL;
    if (live && c->npool == c->cappool) {
        int cap = c->cappool ? 2 * c->cappool : 16;
        pd_cuda_event *p = realloc(c->pool, sizeof(*p) * cap);
        if (p != NULL) {
            c->pool = p;
            c->cappool = cap;
        }
    }
    if (live && c->npool < c->cappool) {
        c->pool[c->npool++] = ev;
        ev = NULL;
    }
    pthread_mutex_unlock(&c->pool_mu);
    if (ev != NULL) {
        c->rt->EventDestroy(ev);
    }
}

pd_status
pd_ncomm_launch(pd_ncomm *c, const pd_nlaunch *L, long long ustream, int wait,
                int (*interrupted)(void *), void *ictx, pd_nwork *w)
{
    if (atomic_load(&c->aborted)) {
        return pd_ncomm_aborted_error(c);
    }
    pd_nccl_res r = PD_NCCL_SUCCESS;
    pd_cuda_err e = 0;
    const char *what = NULL;
    int closed = 0, stalled = 0, intr = 0, polled = 0;
    int prev = -1;
    pd_cuda_event end = NULL;
    double waited = 0;
    unsigned long long seq = 0;
    pthread_mutex_lock(&c->mu);
    if (c->comm == NULL) {
        closed = 1;
    }
    else {
        c->rt->GetDevice(&prev);
        if (prev != c->device && (e = c->rt->SetDevice(c->device))) {
            what = "cudaSetDevice";
        }
        else if ((end = pd_ncomm_pool_get(c, &e)) == NULL) {
            what = "cudaEventCreateWithFlags";
        }
        else if (ustream >= 0 &&
                 ((e = c->rt->EventRecord(c->start,
                                          (pd_cuda_stream)(intptr_t)ustream)) ||
                  (e = c->rt->StreamWaitEvent(c->stream, c->start, 0)))) {
            what = "ordering after the caller's stream (cudaEventRecord / "
                   "cudaStreamWaitEvent)";
        }
        else {
            PD_NCCL_ENTER(c);
            r = pd_ncomm_enqueue(c, L, c->stream, &what);
            PD_NCCL_LEAVE(c);
            /* NCCL connects point-to-point peers inside ncclGroupEnd (and
             * collectives lazily): a peer that is late or never posts keeps
             * the call in progress.  Polled in slices, bounded by the
             * group's timeout, with Ctrl-C seen between slices; the abort
             * flag (any thread) ends it at once. */
            double t0 = pd_now();
            double deadline = c->timeout > 0 ? t0 + c->timeout : 0;
            while (r == PD_NCCL_IN_PROGRESS) {
                polled = 1;
                double slice = pd_now() + 0.05;
                if (deadline > 0 && deadline < slice) {
                    slice = deadline;
                }
                r = pd_ncomm_settle(c, c->comm, slice);
                if (r != PD_NCCL_TIMEOUT) {
                    break;
                }
                r = PD_NCCL_IN_PROGRESS;
                if (deadline > 0 && pd_now() >= deadline) {
                    stalled = 1;
                    break;
                }
                /* the binding takes the GIL here while holding mu: no
                 * thread takes mu with the GIL held */
                intr = interrupted != NULL && interrupted(ictx);
                if (intr) {
                    break;
                }
            }
            waited = pd_now() - t0;
            if (r < 0) {
                e = -1 - r;
            }
            else if (r == PD_NCCL_SUCCESS) {
                what = NULL;
                if ((e = c->rt->EventRecord(end, c->stream))) {
                    what = "cudaEventRecord";
                }
                else if (wait && ustream >= 0 &&
                         (e = c->rt->StreamWaitEvent(
                              (pd_cuda_stream)(intptr_t)ustream, end, 0))) {
                    what = "cudaStreamWaitEvent (the caller's stream after the work)";
                }
            }
        }
        pd_ncomm_dev_leave(c, prev);
        c->seq++;
        seq = c->seq;
    }
    pthread_mutex_unlock(&c->mu);
    if (closed) {
        return pd_ncomm_aborted_error(c);
    }
    if (stalled || intr) {
        /* the communicator is mid-call: nothing but an abort ends that */
        if (end != NULL) {
            pd_ncomm_pool_put(c, end);
        }
        char reason[PD_ERRMSG_MAX];
        snprintf(reason, sizeof(reason),
                 "%s on rank %d (cuda:%d) was still in progress after %.3g s "
                 "(NCCL connects to the peers of a call before it runs): %s; "
                 "the NCCL communicator was aborted",
                 what != NULL ? what : "an NCCL call", c->rank, c->device, waited,
                 intr ? "interrupted by a signal"
                 : L->kind == PD_K_SEND || L->kind == PD_K_RECV ||
                         L->kind == PD_K_NONE
                     ? "a peer did not post the matching operation within the "
                       "timeout, died or is stuck (point-to-point calls share "
                       "the communicator with collectives: a peer that runs a "
                       "collective before its matching send or recv cannot "
                       "reach it; post them in the same order on both sides, "
                       "or use batch_isend_irecv)"
                     : "a peer did not post the matching operation "
                       "within the timeout, died or is stuck");
        pd_ncomm_abort(c, reason);
        pd_ncomm_aborted_error(c);
        return intr ? PD_EINTR : PD_EBACKEND;
    }
    if (what != NULL) {
        if (end != NULL) {
            pd_ncomm_pool_put(c, end);
        }
        if (atomic_load(&c->aborted)) {
            return pd_ncomm_aborted_error(c);
        }
        if (e) {
            return pd_ncomm_cuda_error(c->rt, what, e);
        }
        if (polled) {
            /* the call was taken (ncclInProgress); NCCL's job failed later:
             * the communicator's asynchronous error, as the watchdog says */
            char text[PD_ERRMSG_MAX / 2];
            return pd_error(PD_EBACKEND,
                            "%s on rank %d (cuda:%d) reported an asynchronous "
                            "error while in progress: NCCL error %d: %s",
                            what, c->rank, c->device, r,
                            pd_nccl_text(c->nc, c->comm, r, text,
                                         sizeof(text)));
        }
        return pd_ncomm_nccl_error(c, what, r);
    }
    w->c = c;
    w->end = end;
    w->seq = seq;
    w->ustream = ustream;
    w->t0 = pd_now();
    w->done = 0;
    w->holds = 1;
    return PD_OK;
}
