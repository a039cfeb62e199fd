/* The work of one launch: completion by its end event, host waits in
 * slices, stream waits, and when its arrays may be let go
 * (csrc/nccl/comm.h). */
#include "internal.h"

#include <sched.h>
#include <stdint.h>

/* A failed work's arrays are let go only once the abort returned and the
 * stream went past the work: until then NCCL kernels may still touch them,
 * and a caching allocator would hand their memory to someone else. */
static void
release_failed(pd_nwork *w)
{
    pd_ncomm *c = w->c;
    if (!w->holds || !atomic_load(&c->abort_done)) {
        return;
    }
    int prev = pd_ncomm_dev_enter(c);
    pd_cuda_err e = c->rt->EventQuery(w->end);
    pd_ncomm_dev_leave(c, prev);
    if (e != PD_CUDA_ERR_NOT_READY) {
        if (e != PD_CUDA_SUCCESS) {
            c->rt->GetLastError();
        }
        w->holds = 0;
    }
}

int
pd_nwork_query(pd_nwork *w)
{
    if (w->done == 1) {
        return 1;
    }
    pd_ncomm *c = w->c;
    if (w->done == 2 || atomic_load(&c->aborted)) {
        w->done = 2;
        release_failed(w);
        return -1;
    }
    int prev = pd_ncomm_dev_enter(c);
    pd_cuda_err e = c->rt->EventQuery(w->end);
    pd_ncomm_dev_leave(c, prev);
    if (e == PD_CUDA_SUCCESS) {
        w->done = 1;
        w->holds = 0;
        return 1;
    }
    if (e == PD_CUDA_ERR_NOT_READY) {
        return 0;
    }
    c->rt->GetLastError(); /* clear the sticky-free error */
    pd_ncomm_cuda_error(c->rt, "cudaEventQuery", e);
    return -2;
}

pd_cuda_err
pd_nwork_poll(pd_nwork *w, double slice_end)
{
    pd_ncomm *c = w->c;
    pd_cuda_err e = PD_CUDA_ERR_NOT_READY;
    int prev = pd_ncomm_dev_enter(c);
    for (int i = 0; pd_now() < slice_end && !atomic_load(&c->aborted); i++) {
        e = c->rt->EventQuery(w->end);
        if (e != PD_CUDA_ERR_NOT_READY) {
            break;
        }
        if (i < 50) {
            sched_yield();
        }
        else {
            pd_nccl_nap();
        }
    }
    pd_ncomm_dev_leave(c, prev);
    return e;
}

pd_status
pd_nwork_wait_stream(pd_nwork *w, pd_cuda_stream s)
{
    pd_ncomm *c = w->c;
    int prev = pd_ncomm_dev_enter(c);
    pd_cuda_err e = c->rt->StreamWaitEvent(s, w->end, 0);
    pd_ncomm_dev_leave(c, prev);
    if (e) {
        return pd_ncomm_cuda_error(c->rt, "cudaStreamWaitEvent", e);
    }
    return PD_OK;
}

void
pd_nwork_release(pd_nwork *w)
{
    if (w->c != NULL && w->end != NULL) {
        pd_ncomm_pool_put(w->c, w->end);
    }
    w->end = NULL;
}
