/* The communicator's lifecycle: creation (non-blocking, polled), split
 * with its polling and orphans, the error query that never waits, abort, destroy
 * and release (csrc/nccl/comm.h). */
#include "internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ helpers */

void
pd_nccl_nap(void)
{
    struct timespec ts = {0, 20000}; /* 20 us */
    nanosleep(&ts, NULL);
}

const char *
pd_nccl_text(const struct pd_nccl *nc, pd_nccl_comm comm, pd_nccl_res r,
             char *buf, size_t cap)
{
    const char *last = nc->GetLastError != NULL ? nc->GetLastError(comm) : NULL;
    snprintf(buf, cap, "%s%s%s", nc->GetErrorString(r),
             last != NULL && last[0] ? ": " : "", last != NULL ? last : "");
    return buf;
}

pd_status
pd_ncomm_nccl_error(pd_ncomm *c, const char *what, pd_nccl_res r)
{
    char text[PD_ERRMSG_MAX / 2];
    return pd_error(PD_EBACKEND,
                    "%s failed on rank %d (cuda:%d): NCCL error %d: %s", what,
                    c->rank, c->device, r,
                    pd_nccl_text(c->nc, c->comm, r, text, sizeof(text)));
}

pd_status
pd_ncomm_cuda_error(const struct pd_cudart *rt, const char *what,
                    pd_cuda_err e)
{
    return pd_error(PD_EBACKEND, "%s failed: CUDA error %d (%s): %s", what, e,
                    rt->GetErrorName(e), rt->GetErrorString(e));
}

pd_status
pd_ncomm_aborted_error(pd_ncomm *c)
{
    pthread_mutex_lock(&c->why_mu);
    pd_error(PD_EBACKEND, "%s", c->reason);
    pthread_mutex_unlock(&c->why_mu);
    return PD_EBACKEND;
}

int
pd_ncomm_reason(pd_ncomm *c, char *buf, size_t cap)
{
    if (!atomic_load(&c->aborted)) {
        return 0;
    }
    pthread_mutex_lock(&c->why_mu);
    snprintf(buf, cap, "%s", c->reason);
    pthread_mutex_unlock(&c->why_mu);
    return 1;
}

/* Make c's device current in this thread (the caller's device is returned):
 * a CUDA call in a thread whose current device has no context would create
 * one there (a thread that never set a device is on device 0). */
int
pd_ncomm_dev_enter(pd_ncomm *c)
{
    int prev = -1;
    c->rt->GetDevice(&prev);
    if (prev != c->device) {
        c->rt->SetDevice(c->device);
    }
    return prev;
}

/* Give the caller its device back where that device has a context already:
 * cudaSetDevice creates one (CUDA 12+), ~500 MiB of a GPU the caller never
 * used; torch's MaybeSetDevice does the same. */
void
pd_ncomm_dev_leave(pd_ncomm *c, int prev)
{
    if (prev >= 0 && prev != c->device && pd_cuda_ctx_active(prev) == 1) {
        c->rt->SetDevice(prev);
    }
}

/* With c->mu held: take the communicator out of c (NULL from now on for every
 * reader) and wait until no lock-free reader still uses it; the caller then
 * aborts or destroys it. */
static pd_nccl_comm
take_comm(pd_ncomm *c)
{
    pd_nccl_comm comm = c->comm;
    __atomic_store_n(&c->comm, NULL, __ATOMIC_SEQ_CST);
    while (atomic_load(&c->users) > 0) {
        sched_yield();
    }
    return comm;
}

/* Poll a non-blocking communicator until it is not ncclInProgress, the
 * communicator is aborted or the deadline (pd_now() seconds; <= 0: none)
 * passes (PD_NCCL_TIMEOUT). */
pd_nccl_res
pd_ncomm_settle(pd_ncomm *c, pd_nccl_comm comm, double deadline)
{
    for (int i = 0;; i++) {
        pd_nccl_res r = PD_NCCL_SUCCESS;
        PD_NCCL_ENTER(c);
        pd_nccl_res q = c->nc->CommGetAsyncError(comm, &r);
        PD_NCCL_LEAVE(c);
        if (q != PD_NCCL_SUCCESS) {
            return q;
        }
        if (r != PD_NCCL_IN_PROGRESS) {
            return r;
        }
        if (atomic_load(&c->aborted)) {
            return PD_NCCL_INVALID_USAGE;
        }
        if (deadline > 0 && pd_now() > deadline) {
            return PD_NCCL_TIMEOUT;
        }
        if (i < 100) {
            sched_yield();
        }
        else {
            pd_nccl_nap();
        }
    }
}

/* ---------------------------------------------------------- creation */

/* The barrier's 4 device bytes: one buffer per device for the process, never
 * freed.  cudaFree synchronises the whole device, so freeing a communicator's
 * own at destroy (under its lock) could wait behind another group's stuck
 * kernel; what the barrier writes there is never read. */
#define PD_SCRATCH_DEVICES 1024
static pthread_mutex_t scratch_mu = PTHREAD_MUTEX_INITIALIZER;
static void *scratch_of[PD_SCRATCH_DEVICES];

/* With `device` current. */
static pd_cuda_err
device_scratch(const struct pd_cudart *rt, int device, void **out)
{
    pd_cuda_err e = 0;
    *out = NULL;
    if (device < 0 || device >= PD_SCRATCH_DEVICES) {
        return rt->Malloc(out, 4); /* never: no host has so many; leaked */
    }
    pthread_mutex_lock(&scratch_mu);
    if (scratch_of[device] == NULL) {
        e = rt->Malloc(&scratch_of[device], 4);
        if (e) {
            scratch_of[device] = NULL;
        }
    }
    *out = scratch_of[device];
    pthread_mutex_unlock(&scratch_mu);
    return e;
}

static int
init_stream(pd_ncomm *c, pd_cuda_err *e, const char **what)
{
    if ((*e = c->rt->StreamCreateWithFlags(&c->stream,
                                           PD_CUDA_STREAM_NON_BLOCKING))) {
        *what = "cudaStreamCreateWithFlags";
        return -1;
    }
    if ((*e = c->rt->EventCreateWithFlags(&c->start,
                                          PD_CUDA_EVENT_DISABLE_TIMING))) {
        *what = "cudaEventCreateWithFlags";
        return -1;
    }
    if ((*e = device_scratch(c->rt, c->device, &c->scratch))) {
        *what = "cudaMalloc";
        return -1;
    }
    return 0;
}

void
pd_ncomm_setup(pd_ncomm *c, const struct pd_cudart *rt,
               const struct pd_nccl *nc, int device)
{
    c->rt = rt;
    c->nc = nc;
    c->device = device;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->pool_mu, NULL);
    pthread_mutex_init(&c->why_mu, NULL);
}

/* Create the communicator's stream, then the communicator itself (by `make`)
 * on `device`, restoring the caller's device. */
typedef pd_nccl_res (*comm_maker)(pd_ncomm *c, void *ctx, pd_nccl_comm *out);

static pd_status
finish_init(pd_ncomm *c, comm_maker make, void *ctx, const char *what)
{
    pd_cuda_err e = 0;
    const char *cwhat = NULL;
    pd_nccl_res r = PD_NCCL_SUCCESS;
    int prev = -1;
    c->rt->GetDevice(&prev);
    e = c->rt->SetDevice(c->device);
    if (e) {
        cwhat = "cudaSetDevice";
    }
    else if (init_stream(c, &e, &cwhat) == 0) {
        r = make(c, ctx, &c->comm);
    }
    pd_ncomm_dev_leave(c, prev);
    if (cwhat != NULL) {
        return pd_ncomm_cuda_error(c->rt, cwhat, e);
    }
    if (r != PD_NCCL_SUCCESS && r != PD_NCCL_IN_PROGRESS) {
        pd_ncomm_nccl_error(c, what, r);
        if (c->comm != NULL) {
            c->nc->CommAbort(c->comm);
            c->comm = NULL;
        }
        return PD_EBACKEND;
    }
    return PD_OK;
}

static pd_nccl_res
make_init(pd_ncomm *c, void *ctx, pd_nccl_comm *out)
{
    const pd_nccl_uid *uid = ctx;
    if (c->nc->CommInitRankConfig != NULL) {
        pd_nccl_config cfg;
        pd_nccl_config_init(&cfg, 0);
        return c->nc->CommInitRankConfig(out, c->size, *uid, c->rank, &cfg);
    }
    return c->nc->CommInitRank(out, c->size, *uid, c->rank);
}

pd_status
pd_ncomm_init(pd_ncomm *c, const pd_nccl_uid *uid)
{
    return finish_init(c, make_init, (void *)uid, "ncclCommInitRank");
}

typedef struct {
    pd_ncomm *parent;
    int color, key;
    pd_nccl_res r;
} split_args;

static pd_nccl_res
make_split(pd_ncomm *c, void *ctx, pd_nccl_comm *out)
{
    split_args *a = ctx;
    pd_nccl_config cfg;
    pd_nccl_config_init(&cfg, 0);
    pthread_mutex_lock(&a->parent->mu);
    PD_NCCL_ENTER(a->parent);
    a->r = a->parent->comm == NULL
        ? PD_NCCL_INVALID_USAGE
        : c->nc->CommSplit(a->parent->comm, a->color, a->key, out, &cfg);
    PD_NCCL_LEAVE(a->parent);
    pthread_mutex_unlock(&a->parent->mu);
    return a->r;
}

/* On a non-blocking parent NCCL answers ncclInProgress and writes the
 * child's handle later, from its own thread: the parent is polled (bounded
 * by timeout, else by the parent's) until it is no longer in progress, and
 * only then does the handle tell whether this rank has a child.  The slot
 * NCCL writes into is the child's: a child NCCL may still write (the poll
 * timed out or the parent was aborted) is kept by the parent, never
 * freed. */
pd_status
pd_ncomm_split(pd_ncomm *parent, pd_ncomm *child, int color, int key,
               double timeout, int *orphaned)
{
    *orphaned = 0;
    split_args a = {parent, color, key, PD_NCCL_SUCCESS};
    pd_status st = finish_init(child, make_split, &a, "ncclCommSplit");
    if (st != PD_OK) {
        return st;
    }
    if (a.r == PD_NCCL_IN_PROGRESS) {
        if (timeout <= 0) {
            timeout = parent->timeout;
        }
        double deadline = timeout > 0 ? pd_now() + timeout : 0;
        pd_nccl_res r;
        pthread_mutex_lock(&parent->mu);
        r = parent->comm != NULL
                ? pd_ncomm_settle(parent, parent->comm, deadline)
                : PD_NCCL_INVALID_USAGE;
        pthread_mutex_unlock(&parent->mu);
        if (r == PD_NCCL_TIMEOUT || r == PD_NCCL_IN_PROGRESS ||
            atomic_load(&parent->aborted)) {
            /* NCCL may still write child->comm: the parent keeps child */
            *orphaned = 1;
            if (atomic_load(&parent->aborted)) {
                return pd_ncomm_aborted_error(parent);
            }
            return pd_error(PD_EBACKEND,
                            "ncclCommSplit on rank %d (cuda:%d) was still in "
                            "progress after %g s: a rank of the parent "
                            "communicator did not call split, died or is "
                            "stuck", parent->rank, parent->device, timeout);
        }
        pd_nccl_comm made = __atomic_load_n(&child->comm, __ATOMIC_ACQUIRE);
        if (r != PD_NCCL_SUCCESS) {
            pd_ncomm_nccl_error(parent, "ncclCommSplit", r);
            if (made != NULL) {
                child->nc->CommAbort(made);
                child->comm = NULL;
            }
            return PD_EBACKEND;
        }
    }
    return PD_OK;
}

/* ------------------------------------------------------ state and errors */

pd_nccl_res
pd_ncomm_async_error(pd_ncomm *c)
{
    /* NCCL gives no thread-safety guarantee for a communicator, and
     * ncclCommGetAsyncError joins and frees a finished group job: two threads
     * in it at once can free one twice (torch's watchdog hit this, hence its
     * mutex).  Every call into the communicator holds mu; this query (the
     * watchdog's) never waits behind one: while a launch holds mu it polls
     * the same error itself, so the round is skipped (in progress). */
    if (pthread_mutex_trylock(&c->mu) != 0) {
        return PD_NCCL_IN_PROGRESS;
    }
    pd_nccl_res r = PD_NCCL_INTERNAL;
    if (c->comm != NULL && !atomic_load(&c->aborted)) {
        PD_NCCL_ENTER(c);
        pd_nccl_res q = c->nc->CommGetAsyncError(c->comm, &r);
        PD_NCCL_LEAVE(c);
        if (q != PD_NCCL_SUCCESS) {
            r = q;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

pd_nccl_res
pd_ncomm_wait_ready(pd_ncomm *c, double timeout)
{
    pd_nccl_res r = PD_NCCL_INTERNAL;
    /* Under mu, so abort() (which sets the flag settle() polls, then takes
     * mu) never frees the communicator while it is polled here. */
    pthread_mutex_lock(&c->mu);
    if (c->comm != NULL && !atomic_load(&c->aborted)) {
        r = pd_ncomm_settle(c, c->comm, pd_now() + timeout);
        if (r == PD_NCCL_TIMEOUT) {
            r = PD_NCCL_IN_PROGRESS;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

const char *
pd_ncomm_error_string(pd_ncomm *c, pd_nccl_res r, char *buf, size_t cap)
{
    atomic_fetch_add(&c->users, 1); /* no mutex: ncclGetLastError reads no job */
    pd_nccl_text(c->nc, __atomic_load_n(&c->comm, __ATOMIC_SEQ_CST), r, buf,
                 cap);
    atomic_fetch_sub(&c->users, 1);
    return buf;
}

/* ------------------------------------------------------------ the end */

/* After the abort flag was set (a launch polling NCCL sees it and lets the
 * mutex go): ncclCommAbort. */
void
pd_ncomm_abort_now(pd_ncomm *c)
{
    pthread_mutex_lock(&c->mu);
    pd_nccl_comm comm = take_comm(c);
    if (comm != NULL) {
        int prev = pd_ncomm_dev_enter(c);
        PD_NCCL_ENTER(c);
        c->nc->CommAbort(comm);
        PD_NCCL_LEAVE(c);
        pd_ncomm_dev_leave(c, prev);
    }
    atomic_store(&c->abort_done, 1);
    pthread_mutex_unlock(&c->mu);
}

int
pd_ncomm_abort(pd_ncomm *c, const char *reason)
{
    int zero = 0;
    pthread_mutex_lock(&c->why_mu);
    int first = atomic_compare_exchange_strong(&c->aborted, &zero, 1);
    if (first) {
        snprintf(c->reason, sizeof(c->reason), "%s", reason);
    }
    pthread_mutex_unlock(&c->why_mu);
    if (!first) {
        return 0;
    }
    pd_ncomm_abort_now(c);
    return 1;
}

static void
free_resources(pd_ncomm *c)
{
    pthread_mutex_lock(&c->pool_mu);
    for (int i = 0; i < c->npool; i++) {
        c->rt->EventDestroy(c->pool[i]);
    }
    c->npool = 0;
    free(c->pool);
    c->pool = NULL;
    c->cappool = 0;
    pthread_mutex_unlock(&c->pool_mu);
    if (c->start != NULL) {
        c->rt->EventDestroy(c->start);
        c->start = NULL;
    }
    c->scratch = NULL; /* the device's, kept (device_scratch) */
    if (c->stream != NULL) {
        c->rt->StreamDestroy(c->stream);
        c->stream = NULL;
    }
}

const char *
pd_ncomm_destroy(pd_ncomm *c, double timeout)
{
    const char *how = "aborted";
    pthread_mutex_lock(&c->mu);
    pd_nccl_comm comm = c->comm;
    int prev = comm != NULL ? pd_ncomm_dev_enter(c) : -1;
    if (comm != NULL) {
        int clean = c->rt->StreamQuery(c->stream) == PD_CUDA_SUCCESS;
        pd_nccl_res r = PD_NCCL_SUCCESS;
        if (clean && c->nc->CommFinalize != NULL) {
            PD_NCCL_ENTER(c);
            r = c->nc->CommFinalize(comm);
            PD_NCCL_LEAVE(c);
            if (r == PD_NCCL_SUCCESS || r == PD_NCCL_IN_PROGRESS) {
                r = pd_ncomm_settle(c, comm, pd_now() + timeout);
            }
        }
        else if (clean) {
            PD_NCCL_ENTER(c);
            c->nc->CommGetAsyncError(comm, &r);
            PD_NCCL_LEAVE(c);
        }
        if (!clean || r != PD_NCCL_SUCCESS) {
            atomic_store(&c->aborted, 1);
        }
        comm = take_comm(c);
        PD_NCCL_ENTER(c);
        if (clean && r == PD_NCCL_SUCCESS) {
            c->nc->CommDestroy(comm);
            how = "destroyed";
        }
        else {
            c->nc->CommAbort(comm);
        }
        PD_NCCL_LEAVE(c);
        atomic_store(&c->abort_done, 1);
        free_resources(c);
        pd_ncomm_dev_leave(c, prev);
    }
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->why_mu);
    if (c->reason[0] == '\0') {
        snprintf(c->reason, sizeof(c->reason),
                 "the NCCL communicator of rank %d (cuda:%d) was destroyed",
                 c->rank, c->device);
    }
    atomic_store(&c->aborted, 1);
    pthread_mutex_unlock(&c->why_mu);
    return how;
}

void
pd_ncomm_close(pd_ncomm *c)
{
    /* Dropped without destroy: abort (never blocks), as torch's
     * ProcessGroupNCCL does for a communicator that is not shut down. */
    if (c->comm != NULL) {
        atomic_store(&c->aborted, 1);
        pthread_mutex_lock(&c->mu);
        pd_nccl_comm comm = take_comm(c);
        int prev = pd_ncomm_dev_enter(c);
        c->nc->CommAbort(comm);
        atomic_store(&c->abort_done, 1);
        free_resources(c);
        pd_ncomm_dev_leave(c, prev);
        pthread_mutex_unlock(&c->mu);
    }
    else if (c->rt != NULL && c->stream != NULL) {
        int prev = pd_ncomm_dev_enter(c);
        free_resources(c);
        pd_ncomm_dev_leave(c, prev);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->pool_mu);
    pthread_mutex_destroy(&c->why_mu);
}
