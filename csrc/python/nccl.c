/* Backend "nccl": one NCCL communicator on one device (_C.NcclComm) and the
 * handles of the operations it launched (_C.NcclWork).
 *
 * Stream rules are torch's ProcessGroupNCCL's.  A communicator owns a
 * non-blocking stream.  A launch records an event on the caller's stream and
 * makes the communicator's stream wait for it (no host sync), enqueues the
 * NCCL calls on the communicator's stream and records the work's end event
 * there.  NcclWork.wait_stream(s) makes the caller's stream s wait for that
 * event; NcclWork.synchronize() waits on the host, bounded.
 *
 * Never hang: communicators are created non-blocking (ncclCommInitRankConfig
 * with blocking=0 where NCCL has it), so initialisation and every call that
 * answers ncclInProgress are polled here with the abort flag and a deadline
 * checked; abort() (any thread: the Python watchdog's) sets the flag first,
 * then calls ncclCommAbort, never ncclCommDestroy on a broken communicator.
 *
 * The Python layer (pyddp/distributed/_nccl.py) checks arrays, devices and
 * signatures across ranks; here arrays arrive as device pointers, sizes in
 * elements (counts) or bytes (splits), and the objects to keep alive until
 * the work completes. */
#include "binding.h"

#include "../util/kinds.h"
#include "../cuda/cudawrap.h"
#include "../kernels/kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    pd_module_state *st;
    const struct pd_cudart *rt;
    const struct pd_nccl *nc;
    pthread_mutex_t mu;     /* launches, abort, destroy (a launch may hold it
                             * while NCCL connects: nothing another thread
                             * needs meanwhile takes it) */
    pthread_mutex_t pool_mu; /* the event pool alone; held briefly */
    pd_nccl_comm comm;      /* NULL once aborted or destroyed (set under mu;
                             * read without it by async_error: see users) */
    atomic_int users;       /* lock-free readers of comm (take_comm waits) */
    atomic_int abort_done;  /* ncclCommAbort or destroy returned */
    double timeout;         /* seconds a call may stay ncclInProgress; 0: none */
    PyObject *orphans;      /* split children NCCL may still write: kept */
    pd_cuda_stream stream;
    pd_cuda_event start;    /* recorded on the caller's stream per launch */
    pd_cuda_event *pool;    /* free end events */
    int npool, cappool;
    void *scratch;          /* 4 device bytes: barrier */
    int device, rank, size;
    atomic_int aborted;
    char reason[PD_ERRMSG_MAX];
    unsigned long long seq;
} CommObject;

typedef struct {
    PyObject_HEAD
    CommObject *comm;
    pd_cuda_event end;
    PyObject *keep;         /* the arrays, until the work completed */
    unsigned long long seq;
    double t0;
    int done;
} NWorkObject;

/* ------------------------------------------------------------ helpers */

static void
nap(void)
{
    struct timespec ts = {0, 20000}; /* 20 us */
    nanosleep(&ts, NULL);
}

static const char *
nccl_text(const struct pd_nccl *nc, pd_nccl_comm comm, pd_nccl_res r,
          char *buf, size_t cap)
{
    const char *last = nc->GetLastError != NULL ? nc->GetLastError(comm) : NULL;
    snprintf(buf, cap, "%s%s%s", nc->GetErrorString(r),
             last != NULL && last[0] ? ": " : "", last != NULL ? last : "");
    return buf;
}

static PyObject *
comm_error(CommObject *c, const char *what, pd_nccl_res r)
{
    char buf[PD_ERRMSG_MAX];
    char text[PD_ERRMSG_MAX / 2];
    snprintf(buf, sizeof(buf), "%s failed on rank %d (cuda:%d): NCCL error %d: %s",
             what, c->rank, c->device, r,
             nccl_text(c->nc, c->comm, r, text, sizeof(text)));
    return pd_py_set_error(c->st, PD_EBACKEND, buf);
}

static PyObject *
cuda_error(pd_module_state *st, const struct pd_cudart *rt, const char *what,
           pd_cuda_err e)
{
    char buf[PD_ERRMSG_MAX];
    snprintf(buf, sizeof(buf), "%s failed: CUDA error %d (%s): %s", what, e,
             rt->GetErrorName(e), rt->GetErrorString(e));
    return pd_py_set_error(st, PD_EBACKEND, buf);
}

/* Make c's device current in this thread (the caller's device is returned):
 * a CUDA call in a thread whose current device has no context would create
 * one there (a thread that never set a device is on device 0). */
static int
dev_enter(CommObject *c)
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
static void
dev_leave(CommObject *c, int prev)
{
    if (prev >= 0 && prev != c->device && pd_cuda_ctx_active(prev) == 1) {
        c->rt->SetDevice(prev);
    }
}

/* With c->mu held: take the communicator out of c (NULL from now on for every
 * reader) and wait until no lock-free reader still uses it; the caller then
 * aborts or destroys it. */
static pd_nccl_comm
take_comm(CommObject *c)
{
    pd_nccl_comm comm = c->comm;
    __atomic_store_n(&c->comm, NULL, __ATOMIC_SEQ_CST);
    while (atomic_load(&c->users) > 0) {
        sched_yield();
    }
    return comm;
}

static PyObject *
aborted_error(CommObject *c)
{
    return pd_py_set_error(c->st, PD_EBACKEND, c->reason);
}

/* Poll a non-blocking communicator until it is not ncclInProgress, the
 * communicator is aborted or the deadline (pd_now() seconds; <= 0: none)
 * passes (PD_NCCL_TIMEOUT).  GIL released. */
static pd_nccl_res
settle(CommObject *c, pd_nccl_comm comm, double deadline)
{
    for (int i = 0;; i++) {
        pd_nccl_res r = PD_NCCL_SUCCESS;
        pd_nccl_res q = c->nc->CommGetAsyncError(comm, &r);
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
            nap();
        }
    }
}

/* The NCCL type and op for a pyddp dtype and ReduceOp, or an error message.
 * *mult: elements per pyddp element (complex as pairs of reals). */
static const char *
nccl_reduction(int dt, int op, int *ndt, int *nop, size_t *mult)
{
    static const int types[PD_NDTYPES] = {
        [PD_BOOL] = PD_NCCL_UINT8,       [PD_INT8] = PD_NCCL_INT8,
        [PD_UINT8] = PD_NCCL_UINT8,      [PD_INT16] = -1,
        [PD_UINT16] = -1,                [PD_INT32] = PD_NCCL_INT32,
        [PD_UINT32] = PD_NCCL_UINT32,    [PD_INT64] = PD_NCCL_INT64,
        [PD_UINT64] = PD_NCCL_UINT64,    [PD_FLOAT16] = PD_NCCL_FLOAT16,
        [PD_BFLOAT16] = PD_NCCL_BFLOAT16, [PD_FLOAT32] = PD_NCCL_FLOAT32,
        [PD_FLOAT64] = PD_NCCL_FLOAT64,  [PD_COMPLEX64] = PD_NCCL_FLOAT32,
        [PD_COMPLEX128] = PD_NCCL_FLOAT64,
    };
    static const int ops[PD_NREDOPS] = {
        [PD_SUM] = PD_NCCL_SUM, [PD_AVG] = PD_NCCL_AVG,
        [PD_PRODUCT] = PD_NCCL_PROD, [PD_MIN] = PD_NCCL_MIN,
        [PD_MAX] = PD_NCCL_MAX, [PD_BAND] = -1, [PD_BOR] = -1, [PD_BXOR] = -1,
    };
    if (dt < 0 || dt >= PD_NDTYPES || types[dt] < 0) {
        return "NCCL has no reductions on this dtype (int16 and uint16 can only "
               "be broadcast, gathered, scattered or sent)";
    }
    if (op < 0 || op >= PD_NREDOPS || ops[op] < 0) {
        return "NCCL supports ReduceOp SUM, AVG, PRODUCT, MIN and MAX (not "
               "BAND, BOR or BXOR)";
    }
    *ndt = types[dt];
    *nop = ops[op];
    *mult = 1;
    if (dt == PD_COMPLEX64 || dt == PD_COMPLEX128) {
        if (op != PD_SUM && op != PD_AVG) {
            return "complex tensors can only be reduced with SUM or AVG";
        }
        *mult = 2;
    }
    if (dt == PD_BOOL) { /* as torch: logical or / and */
        if (op == PD_SUM || op == PD_MAX) {
            *nop = PD_NCCL_MAX;
        }
        else if (op == PD_PRODUCT || op == PD_MIN) {
            *nop = PD_NCCL_MIN;
        }
        else {
            return "bool tensors cannot be reduced with AVG";
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ NcclComm */

static int
comm_init_stream(CommObject *c, pd_cuda_err *e, const char **what)
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
    if ((*e = c->rt->Malloc(&c->scratch, 4))) {
        *what = "cudaMalloc";
        return -1;
    }
    return 0;
}

static CommObject *
comm_alloc(PyTypeObject *tp, int device)
{
    pd_module_state *st = pd_state_from_type(tp);
    const struct pd_cudart *rt = pd_cudart_get();
    const struct pd_nccl *nc = pd_nccl_get();
    if (rt == NULL || nc == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "NcclComm: libcudart and libnccl are not loaded "
                        "(pyddp.cuda loads them first)");
        return NULL;
    }
    CommObject *c = (CommObject *)tp->tp_alloc(tp, 0);
    if (c == NULL) {
        return NULL;
    }
    c->st = st;
    c->rt = rt;
    c->nc = nc;
    c->device = device;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->pool_mu, NULL);
    return c;
}

/* Create the communicator's stream, then the communicator itself (by `make`)
 * on `device`, restoring the caller's device.  GIL released. */
typedef pd_nccl_res (*comm_maker)(CommObject *c, void *ctx, pd_nccl_comm *out);

static PyObject *
comm_finish_init(CommObject *c, comm_maker make, void *ctx, const char *what)
{
    pd_cuda_err e = 0;
    const char *cwhat = NULL;
    pd_nccl_res r = PD_NCCL_SUCCESS;
    int prev = -1;
    Py_BEGIN_ALLOW_THREADS
    c->rt->GetDevice(&prev);
    e = c->rt->SetDevice(c->device);
    if (e) {
        cwhat = "cudaSetDevice";
    }
    else if (comm_init_stream(c, &e, &cwhat) == 0) {
        r = make(c, ctx, &c->comm);
    }
    dev_leave(c, prev);
    Py_END_ALLOW_THREADS
    if (cwhat != NULL) {
        cuda_error(c->st, c->rt, cwhat, e);
        Py_DECREF(c);
        return NULL;
    }
    if (r != PD_NCCL_SUCCESS && r != PD_NCCL_IN_PROGRESS) {
        comm_error(c, what, r);
        if (c->comm != NULL) {
            c->nc->CommAbort(c->comm);
            c->comm = NULL;
        }
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

typedef struct {
    pd_nccl_uid uid;
    int size, rank;
} init_args;

static pd_nccl_res
make_init(CommObject *c, void *ctx, pd_nccl_comm *out)
{
    init_args *a = ctx;
    if (c->nc->CommInitRankConfig != NULL) {
        pd_nccl_config cfg;
        pd_nccl_config_init(&cfg, 0);
        return c->nc->CommInitRankConfig(out, a->size, a->uid, a->rank, &cfg);
    }
    return c->nc->CommInitRank(out, a->size, a->uid, a->rank);
}

static PyObject *
Comm_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"uid", "size", "rank", "device", "timeout", NULL};
    Py_buffer uid;
    int size, rank, device;
    double timeout = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*iii|d:NcclComm", kwlist,
                                     &uid, &size, &rank, &device, &timeout)) {
        return NULL;
    }
    init_args a;
    if (uid.len != (Py_ssize_t)sizeof(a.uid.internal)) {
        PyBuffer_Release(&uid);
        PyErr_Format(PyExc_ValueError,
                     "NcclComm: uid must be %zu bytes (ncclUniqueId), got %zd",
                     sizeof(a.uid.internal), uid.len);
        return NULL;
    }
    memcpy(a.uid.internal, uid.buf, sizeof(a.uid.internal));
    PyBuffer_Release(&uid);
    if (size < 1 || rank < 0 || rank >= size || device < 0) {
        PyErr_Format(PyExc_ValueError,
                     "NcclComm: need 0 <= rank < size and device >= 0, got "
                     "rank %d, size %d, device %d", rank, size, device);
        return NULL;
    }
    a.size = size;
    a.rank = rank;
    CommObject *c = comm_alloc(tp, device);
    if (c == NULL) {
        return NULL;
    }
    c->rank = rank;
    c->size = size;
    c->timeout = timeout > 0 ? timeout : 0.0;
    return comm_finish_init(c, make_init, &a, "ncclCommInitRank");
}

typedef struct {
    CommObject *parent;
    int color, key;
    pd_nccl_res r;
} split_args;

static pd_nccl_res
make_split(CommObject *c, void *ctx, pd_nccl_comm *out)
{
    split_args *a = ctx;
    pd_nccl_config cfg;
    pd_nccl_config_init(&cfg, 0);
    pthread_mutex_lock(&a->parent->mu);
    a->r = a->parent->comm == NULL
        ? PD_NCCL_INVALID_USAGE
        : c->nc->CommSplit(a->parent->comm, a->color, a->key, out, &cfg);
    pthread_mutex_unlock(&a->parent->mu);
    return a->r;
}

/* split(color, key, size, rank, timeout=0) -> NcclComm, or None for
 * NCCL_SPLIT_NOCOLOR (collective over the parent's ranks; size and rank: of
 * the new group).  On a non-blocking parent NCCL answers ncclInProgress and
 * writes the child's handle later, from its own thread: the parent is polled
 * (bounded by timeout, else by the parent's) until it is no longer in
 * progress, and only then does the handle tell whether this rank has a child.
 * The slot NCCL writes into is the child object's: a child NCCL may still
 * write (the poll timed out or the parent was aborted) is kept by the parent,
 * never freed. */
static PyObject *
Comm_split(CommObject *self, PyObject *args)
{
    int color, key, size, rank;
    double timeout = 0.0;
    if (!PyArg_ParseTuple(args, "iiii|d:split", &color, &key, &size, &rank,
                          &timeout)) {
        return NULL;
    }
    if (self->nc->CommSplit == NULL) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "this libnccl has no ncclCommSplit");
        return NULL;
    }
    if (atomic_load(&self->aborted)) {
        return aborted_error(self);
    }
    CommObject *c = comm_alloc(Py_TYPE(self), self->device);
    if (c == NULL) {
        return NULL;
    }
    c->rank = rank;
    c->size = size;
    c->timeout = self->timeout;
    split_args a = {self, color, key, PD_NCCL_SUCCESS};
    PyObject *res = comm_finish_init(c, make_split, &a, "ncclCommSplit");
    if (res == NULL) {
        return NULL;
    }
    if (a.r == PD_NCCL_IN_PROGRESS) {
        if (timeout <= 0) {
            timeout = self->timeout;
        }
        double deadline = timeout > 0 ? pd_now() + timeout : 0;
        pd_nccl_res r;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mu);
        r = self->comm != NULL ? settle(self, self->comm, deadline)
                               : PD_NCCL_INVALID_USAGE;
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
        if (r == PD_NCCL_TIMEOUT || r == PD_NCCL_IN_PROGRESS ||
            atomic_load(&self->aborted)) {
            /* NCCL may still write c->comm: the parent keeps c */
            if ((self->orphans == NULL && (self->orphans = PyList_New(0)) == NULL) ||
                PyList_Append(self->orphans, res) < 0) {
                Py_INCREF(res); /* leaked rather than freed under NCCL */
            }
            Py_DECREF(res);
            if (atomic_load(&self->aborted)) {
                return aborted_error(self);
            }
            char buf[PD_ERRMSG_MAX];
            snprintf(buf, sizeof(buf), "ncclCommSplit on rank %d (cuda:%d) was "
                     "still in progress after %g s: a rank of the parent "
                     "communicator did not call split, died or is stuck",
                     self->rank, self->device, timeout);
            return pd_py_set_error(self->st, PD_EBACKEND, buf);
        }
        pd_nccl_comm child = __atomic_load_n(&c->comm, __ATOMIC_ACQUIRE);
        if (r != PD_NCCL_SUCCESS) {
            comm_error(self, "ncclCommSplit", r);
            if (child != NULL) {
                c->nc->CommAbort(child);
                c->comm = NULL;
            }
            Py_DECREF(res);
            return NULL;
        }
    }
    if (__atomic_load_n(&c->comm, __ATOMIC_ACQUIRE) == NULL) {
        Py_DECREF(res);  /* NCCL_SPLIT_NOCOLOR: no communicator */
        Py_RETURN_NONE;
    }
    return res;
}

/* async_error() -> ncclResult_t of ncclCommGetAsyncError (7 while a
 * non-blocking call is in progress); 3 (internal) once aborted. */
static PyObject *
Comm_async_error(CommObject *self, PyObject *Py_UNUSED(ignored))
{
    /* Without the mutex (a launch may hold it while NCCL connects): a reader
     * count keeps abort/destroy from freeing the communicator meanwhile
     * (take_comm); ncclCommGetAsyncError is thread-safe. */
    pd_nccl_res r = PD_NCCL_INTERNAL;
    atomic_fetch_add(&self->users, 1);
    pd_nccl_comm comm = __atomic_load_n(&self->comm, __ATOMIC_SEQ_CST);
    if (comm != NULL && !atomic_load(&self->aborted)) {
        pd_nccl_res q = self->nc->CommGetAsyncError(comm, &r);
        if (q != PD_NCCL_SUCCESS) {
            r = q;
        }
    }
    atomic_fetch_sub(&self->users, 1);
    return PyLong_FromLong(r);
}

/* wait_ready(timeout) -> ncclResult_t once no call is in progress (7: the
 * timeout passed first). */
static PyObject *
Comm_wait_ready(CommObject *self, PyObject *arg)
{
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    pd_nccl_res r = PD_NCCL_INTERNAL;
    Py_BEGIN_ALLOW_THREADS
    /* Under mu, so abort() (which sets the flag settle() polls, then takes
     * mu) never frees the communicator while it is polled here. */
    pthread_mutex_lock(&self->mu);
    if (self->comm != NULL && !atomic_load(&self->aborted)) {
        r = settle(self, self->comm, pd_now() + t);
        if (r == PD_NCCL_TIMEOUT) {
            r = PD_NCCL_IN_PROGRESS;
        }
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(r);
}

static PyObject *
Comm_error_string(CommObject *self, PyObject *arg)
{
    long r = PyLong_AsLong(arg);
    if (r == -1 && PyErr_Occurred()) {
        return NULL;
    }
    char text[PD_ERRMSG_MAX];
    atomic_fetch_add(&self->users, 1); /* as async_error: no mutex */
    nccl_text(self->nc, __atomic_load_n(&self->comm, __ATOMIC_SEQ_CST),
              (pd_nccl_res)r, text, sizeof(text));
    atomic_fetch_sub(&self->users, 1);
    return PyUnicode_FromString(text);
}

/* After the abort flag was set (a launch polling NCCL sees it and lets the
 * mutex go): ncclCommAbort.  GIL held on entry, released meanwhile. */
static void
comm_abort_now(CommObject *c)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->mu);
    pd_nccl_comm comm = take_comm(c);
    if (comm != NULL) {
        int prev = dev_enter(c);
        c->nc->CommAbort(comm);
        dev_leave(c, prev);
    }
    atomic_store(&c->abort_done, 1);
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
}

/* abort(reason) -> True if this call aborted the communicator (the first
 * reason is kept).  Any thread; never blocks on the communicator's work. */
static PyObject *
Comm_abort(CommObject *self, PyObject *arg)
{
    const char *reason = PyUnicode_AsUTF8(arg);
    if (reason == NULL) {
        return NULL;
    }
    int zero = 0;
    if (!atomic_compare_exchange_strong(&self->aborted, &zero, 1)) {
        Py_RETURN_FALSE;
    }
    snprintf(self->reason, sizeof(self->reason), "%s", reason);
    comm_abort_now(self);
    Py_RETURN_TRUE;
}

static void
comm_free_resources(CommObject *c)
{
    pthread_mutex_lock(&c->pool_mu);
    for (int i = 0; i < c->npool; i++) {
        c->rt->EventDestroy(c->pool[i]);
    }
    c->npool = 0;
    PyMem_RawFree(c->pool);
    c->pool = NULL;
    c->cappool = 0;
    pthread_mutex_unlock(&c->pool_mu);
    if (c->start != NULL) {
        c->rt->EventDestroy(c->start);
        c->start = NULL;
    }
    if (c->scratch != NULL && !atomic_load(&c->aborted)) {
        c->rt->Free(c->scratch);
    }
    c->scratch = NULL;
    if (c->stream != NULL) {
        c->rt->StreamDestroy(c->stream);
        c->stream = NULL;
    }
}

/* destroy(timeout) -> 'destroyed' or 'aborted': a communicator whose
 * stream is idle and that reports no error is finalized and destroyed
 * (bounded by timeout); anything else is aborted. */
static PyObject *
Comm_destroy(CommObject *self, PyObject *arg)
{
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    const char *how = "aborted";
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    pd_nccl_comm comm = self->comm;
    int prev = comm != NULL ? dev_enter(self) : -1;
    if (comm != NULL) {
        int clean = self->rt->StreamQuery(self->stream) == PD_CUDA_SUCCESS;
        pd_nccl_res r = PD_NCCL_SUCCESS;
        if (clean && self->nc->CommFinalize != NULL) {
            r = self->nc->CommFinalize(comm);
            if (r == PD_NCCL_SUCCESS || r == PD_NCCL_IN_PROGRESS) {
                r = settle(self, comm, pd_now() + t);
            }
        }
        else if (clean) {
            self->nc->CommGetAsyncError(comm, &r);
        }
        if (!clean || r != PD_NCCL_SUCCESS) {
            atomic_store(&self->aborted, 1);
        }
        comm = take_comm(self);
        if (clean && r == PD_NCCL_SUCCESS) {
            self->nc->CommDestroy(comm);
            how = "destroyed";
        }
        else {
            self->nc->CommAbort(comm);
        }
        atomic_store(&self->abort_done, 1);
        comm_free_resources(self);
        dev_leave(self, prev);
    }
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (self->reason[0] == '\0') {
        snprintf(self->reason, sizeof(self->reason),
                 "the NCCL communicator of rank %d (cuda:%d) was destroyed",
                 self->rank, self->device);
    }
    atomic_store(&self->aborted, 1);
    return PyUnicode_FromString(how);
}

/* ------------------------------------------------------------- launches */

typedef struct {
    int kind, dtype, op, root;
    size_t count;          /* elements */
    size_t itemsize;
    void **ins, **outs;
    Py_ssize_t nin, nout;
    size_t *isplit, *osplit; /* bytes per rank, or NULL */
    /* batched point-to-point */
    int np2p;
    int *p2p_send, *p2p_peer;
    void **p2p_ptr;
    size_t *p2p_bytes;
} launch;

/* Enqueue the NCCL calls of one launch on s.  Returns the NCCL result or
 * -1 - cudaError for a CUDA call's failure. */
static pd_nccl_res
enqueue(CommObject *c, const launch *L, pd_cuda_stream s, const char **what)
{
    const struct pd_nccl *nc = c->nc;
    pd_nccl_comm comm = c->comm;
    int n = c->size, me = c->rank;
    size_t bytes = L->count * L->itemsize;
    int ndt = PD_NCCL_UINT8, nop = PD_NCCL_SUM;
    size_t mult = 1;
    pd_nccl_res r = PD_NCCL_SUCCESS;
    pd_cuda_err e;
    if (pd_kind_has(L->kind, PD_KF_REDUCES)) {
        nccl_reduction(L->dtype, L->op, &ndt, &nop, &mult); /* checked */
    }
    size_t rcount = L->count * mult;
#define TRY(call, name)                                                    \
    do {                                                                   \
        *what = (name);                                                    \
        if ((r = (call)) != PD_NCCL_SUCCESS && r != PD_NCCL_IN_PROGRESS) { \
            goto out;                                                      \
        }                                                                  \
    } while (0)
#define COPY(dst, src, nb)                                                 \
    do {                                                                   \
        if ((nb) > 0 && (e = c->rt->MemcpyAsync((dst), (src), (nb),        \
                                                PD_CUDA_D2D, s))) {        \
            *what = "cudaMemcpyAsync";                                     \
            r = -1 - e;                                                    \
            goto out;                                                      \
        }                                                                  \
    } while (0)
    int grouped = 0;
    switch (L->kind) {
    case PD_K_ALLREDUCE:
        TRY(nc->AllReduce(L->nin ? L->ins[0] : L->outs[0], L->outs[0],
                          rcount, ndt, nop, comm, s), "ncclAllReduce");
        break;
    case PD_K_BROADCAST:
        TRY(nc->Broadcast(L->outs[0], L->outs[0], bytes, PD_NCCL_UINT8,
                          L->root, comm, s), "ncclBroadcast");
        break;
    case PD_K_REDUCE:
        TRY(nc->Reduce(L->ins[0], L->outs[0], rcount, ndt, nop, L->root, comm,
                       s), "ncclReduce");
        break;
    case PD_K_BARRIER:
        TRY(nc->AllReduce(c->scratch, c->scratch, 1, PD_NCCL_FLOAT32,
                          PD_NCCL_SUM, comm, s), "ncclAllReduce (barrier)");
        break;
    case PD_K_SEND:
        TRY(nc->Send(L->ins[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
            "ncclSend");
        break;
    case PD_K_RECV:
        TRY(nc->Recv(L->outs[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
            "ncclRecv");
        break;
    case PD_K_ALLGATHER:
        if (L->nout == 1) {
            TRY(nc->AllGather(L->ins[0], L->outs[0], bytes, PD_NCCL_UINT8,
                              comm, s), "ncclAllGather");
            break;
        }
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int p = 0; p < n; p++) {
            TRY(nc->Broadcast(p == me ? L->ins[0] : L->outs[p], L->outs[p],
                              bytes, PD_NCCL_UINT8, p, comm, s),
                "ncclBroadcast (all_gather)");
        }
        break;
    case PD_K_REDUCE_SCATTER:
        if (L->nin == 1) {
            TRY(nc->ReduceScatter(L->ins[0], L->outs[0], rcount, ndt, nop,
                                  comm, s), "ncclReduceScatter");
            break;
        }
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int p = 0; p < n; p++) {
            TRY(nc->Reduce(L->ins[p], L->outs[0], rcount, ndt, nop, p, comm,
                           s), "ncclReduce (reduce_scatter)");
        }
        break;
    case PD_K_GATHER:
    case PD_K_SCATTER: {
        int gather = L->kind == PD_K_GATHER;
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        if (me != L->root) {
            if (gather) {
                TRY(nc->Send(L->ins[0], bytes, PD_NCCL_UINT8, L->root, comm, s),
                    "ncclSend (gather)");
            }
            else {
                TRY(nc->Recv(L->outs[0], bytes, PD_NCCL_UINT8, L->root, comm,
                             s), "ncclRecv (scatter)");
            }
            break;
        }
        for (int p = 0; p < n; p++) {
            if (p == me) {
                COPY(gather ? L->outs[p] : L->outs[0],
                     gather ? L->ins[0] : L->ins[p], bytes);
            }
            else if (gather) {
                TRY(nc->Recv(L->outs[p], bytes, PD_NCCL_UINT8, p, comm, s),
                    "ncclRecv (gather)");
            }
            else {
                TRY(nc->Send(L->ins[p], bytes, PD_NCCL_UINT8, p, comm, s),
                    "ncclSend (scatter)");
            }
        }
        break;
    }
    case PD_K_ALLTOALL: {
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        size_t ioff = 0, ooff = 0;
        for (int p = 0; p < n; p++) {
            size_t ib = L->isplit ? L->isplit[p] : bytes;
            size_t ob = L->osplit ? L->osplit[p] : bytes;
            char *ip = L->nin == 1 ? (char *)L->ins[0] + ioff : L->ins[p];
            char *op = L->nout == 1 ? (char *)L->outs[0] + ooff : L->outs[p];
            ioff += ib;
            ooff += ob;
            if (p == me) {
                COPY(op, ip, ib < ob ? ib : ob);
                continue;
            }
            if (ib > 0) {
                TRY(nc->Send(ip, ib, PD_NCCL_UINT8, p, comm, s),
                    "ncclSend (all_to_all)");
            }
            if (ob > 0) {
                TRY(nc->Recv(op, ob, PD_NCCL_UINT8, p, comm, s),
                    "ncclRecv (all_to_all)");
            }
        }
        break;
    }
    case PD_K_NONE: /* batched point-to-point */
        TRY(nc->GroupStart(), "ncclGroupStart");
        grouped = 1;
        for (int i = 0; i < L->np2p; i++) {
            if (L->p2p_send[i]) {
                TRY(nc->Send(L->p2p_ptr[i], L->p2p_bytes[i], PD_NCCL_UINT8,
                             L->p2p_peer[i], comm, s), "ncclSend");
            }
            else {
                TRY(nc->Recv(L->p2p_ptr[i], L->p2p_bytes[i], PD_NCCL_UINT8,
                             L->p2p_peer[i], comm, s), "ncclRecv");
            }
        }
        break;
    default:
        *what = "launch";
        r = PD_NCCL_INVALID_ARGUMENT;
        break;
    }
out:
    if (grouped) {
        pd_nccl_res g = nc->GroupEnd();
        if (r == PD_NCCL_SUCCESS || r == PD_NCCL_IN_PROGRESS) {
            *what = "ncclGroupEnd";
            r = g;
        }
    }
    return r;
#undef TRY
#undef COPY
}

static pd_cuda_event
pool_get(CommObject *c, pd_cuda_err *e)
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
static void
pool_put(CommObject *c, pd_cuda_event ev)
{
    pthread_mutex_lock(&c->pool_mu);
    int live = __atomic_load_n(&c->comm, __ATOMIC_SEQ_CST) != NULL;
    if (live && c->npool == c->cappool) {
        int cap = c->cappool ? 2 * c->cappool : 16;
        pd_cuda_event *p = PyMem_RawRealloc(c->pool, sizeof(*p) * cap);
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

/* Launch L after the caller's stream (ustream; -1: no ordering) and return
 * its work handle holding `keep`; with `wait`, the caller's stream also waits
 * for the work's end (a blocking call's Work.wait(), in the same launch). */
static PyObject *
comm_launch(CommObject *c, const launch *L, long long ustream, PyObject *keep,
            int wait)
{
    if (atomic_load(&c->aborted)) {
        return aborted_error(c);
    }
    NWorkObject *w = PyObject_GC_New(NWorkObject, c->st->NcclWorkType);
    if (w == NULL) {
        return NULL;
    }
    w->comm = NULL;
    w->end = NULL;
    w->keep = NULL;
    w->done = 0;
    pd_nccl_res r = PD_NCCL_SUCCESS;
    pd_cuda_err e = 0;
    const char *what = NULL;
    int closed = 0, stalled = 0, interrupted = 0;
    int prev = -1;
    pd_cuda_event end = NULL;
    double waited = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->mu);
    if (c->comm == NULL) {
        closed = 1;
    }
    else {
        c->rt->GetDevice(&prev);
        if (prev != c->device && (e = c->rt->SetDevice(c->device))) {
            what = "cudaSetDevice";
        }
        else if ((end = pool_get(c, &e)) == NULL) {
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
            r = enqueue(c, L, c->stream, &what);
            /* NCCL connects point-to-point peers inside ncclGroupEnd (and
             * collectives lazily): a peer that is late or never posts keeps
             * the call in progress.  Polled in slices, bounded by the
             * group's timeout, with Ctrl-C seen between slices; the abort
             * flag (any thread) ends it at once. */
            double t0 = pd_now();
            double deadline = c->timeout > 0 ? t0 + c->timeout : 0;
            while (r == PD_NCCL_IN_PROGRESS) {
                double slice = pd_now() + 0.05;
                if (deadline > 0 && deadline < slice) {
                    slice = deadline;
                }
                r = settle(c, c->comm, slice);
                if (r != PD_NCCL_TIMEOUT) {
                    break;
                }
                r = PD_NCCL_IN_PROGRESS;
                if (deadline > 0 && pd_now() >= deadline) {
                    stalled = 1;
                    break;
                }
                /* the GIL while holding mu: no thread takes mu with the
                 * GIL held */
                Py_BLOCK_THREADS
                interrupted = PyErr_CheckSignals() < 0;
                Py_UNBLOCK_THREADS
                if (interrupted) {
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
        dev_leave(c, prev);
        c->seq++;
        w->seq = c->seq;
    }
    pthread_mutex_unlock(&c->mu);
    Py_END_ALLOW_THREADS
    if (closed) {
        Py_DECREF(w);
        return aborted_error(c);
    }
    if (stalled || interrupted) {
        /* the communicator is mid-call: nothing but an abort ends that */
        if (end != NULL) {
            pool_put(c, end);
        }
        Py_DECREF(w);
        char reason[PD_ERRMSG_MAX];
        snprintf(reason, sizeof(reason),
                 "%s on rank %d (cuda:%d) was still in progress after %.3g s "
                 "(NCCL connects to the peers of a call before it runs): %s; "
                 "the NCCL communicator was aborted",
                 what != NULL ? what : "an NCCL call", c->rank, c->device, waited,
                 interrupted ? "interrupted by a signal"
                             : "a peer did not post the matching operation "
                               "within the timeout, died or is stuck");
        int zero = 0;
        if (atomic_compare_exchange_strong(&c->aborted, &zero, 1)) {
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb); /* the KeyboardInterrupt, if any */
            snprintf(c->reason, sizeof(c->reason), "%s", reason);
            comm_abort_now(c);
            PyErr_Restore(et, ev, etb);
        }
        return interrupted ? NULL : aborted_error(c);
    }
    if (what != NULL) {
        if (end != NULL) {
            pool_put(c, end);
        }
        Py_DECREF(w);
        if (atomic_load(&c->aborted)) {
            return aborted_error(c);
        }
        if (e) {
            return cuda_error(c->st, c->rt, what, e);
        }
        return comm_error(c, what, r);
    }
    Py_INCREF(c);
    w->comm = c;
    w->end = end;
    Py_XINCREF(keep);
    w->keep = keep;
    w->t0 = pd_now();
    PyObject_GC_Track(w);
    return (PyObject *)w;
}

/* Pointers of a tuple of ints into a PyMem array. */
static void **
ptrs_of(PyObject *t, const char *name, Py_ssize_t *n)
{
    if (!PyTuple_Check(t)) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of device pointers",
                     name);
        return NULL;
    }
    *n = PyTuple_GET_SIZE(t);
    void **p = PyMem_Calloc(*n ? *n : 1, sizeof(void *));
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        p[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(t, i));
        if (p[i] == NULL && PyErr_Occurred()) {
            PyMem_Free(p);
            return NULL;
        }
    }
    return p;
}

/* A null pointer is an empty array's (torch's data_ptr() of a 0-element
 * tensor): refused wherever the launch would read or write bytes through it
 * (NCCL does not check pointers: it would fault on the device). */
static int
check_null(void **p, Py_ssize_t n, const size_t *split, int nranks,
           size_t bytes, const char *name)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] != NULL) {
            continue;
        }
        size_t need = bytes;
        if (split != NULL) {
            need = 0;
            for (int r = 0; r < nranks; r++) {
                if (n == 1 || r == i) {
                    need += split[r];
                }
            }
        }
        if (need > 0) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is a null pointer", name,
                         i);
            return -1;
        }
    }
    return 0;
}

static size_t *
splits_of(PyObject *t, const char *name, int n)
{
    if (t == Py_None) {
        return NULL;
    }
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of %d byte counts",
                     name, n);
        return NULL;
    }
    size_t *s = PyMem_Calloc(n, sizeof(size_t));
    if (s == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        s[i] = PyLong_AsSize_t(PyTuple_GET_ITEM(t, i));
        if (s[i] == (size_t)-1 && PyErr_Occurred()) {
            PyMem_Free(s);
            return NULL;
        }
    }
    return s;
}

/* run(kind, dtype, op, root, count, ins, outs, in_splits, out_splits,
 *     stream, keep) -> NcclWork.  ins/outs: tuples of device pointers laid
 * out as the CPU backend's (see pyddp.distributed._backend); root: group
 * rank (the peer for send/recv); splits: bytes per rank or None; stream: the
 * caller's stream handle (-1: none); keep: held until the work completes. */
static PyObject *
Comm_run(CommObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "run() takes 11 or 12 arguments");
        return NULL;
    }
    launch L;
    memset(&L, 0, sizeof(L));
    long long ustream;
    L.kind = PyLong_AsLong(args[0]);
    L.dtype = PyLong_AsLong(args[1]);
    L.op = PyLong_AsLong(args[2]);
    L.root = PyLong_AsLong(args[3]);
    L.count = PyLong_AsSize_t(args[4]);
    ustream = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    const pd_kind_info *ki = pd_kind_get(L.kind);
    if (ki == NULL || pd_kind_has(L.kind, PD_KF_INTERNAL) ||
        L.kind == PD_K_MONITORED_BARRIER) {
        PyErr_Format(PyExc_ValueError, "run: kind %d is not an NCCL collective",
                     L.kind);
        return NULL;
    }
    if (L.dtype < 0 || L.dtype >= PD_NDTYPES) {
        PyErr_Format(PyExc_ValueError, "run: invalid dtype code %d", L.dtype);
        return NULL;
    }
    L.itemsize = pd_dtype_size((pd_dtype)L.dtype);
    if (pd_kind_has(L.kind, PD_KF_REDUCES)) {
        int a, b;
        size_t m;
        const char *why = nccl_reduction(L.dtype, L.op, &a, &b, &m);
        if (why != NULL) {
            PyErr_Format(PyExc_TypeError, "%s on %s: %s", pd_kind_name(L.kind),
                         pd_dtype_name((pd_dtype)L.dtype), why);
            return NULL;
        }
    }
    if ((pd_kind_has(L.kind, PD_KF_ROOTED)) &&
        (L.root < 0 || L.root >= self->size)) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d out of range [0, %d)",
                     pd_kind_name(L.kind), L.root, self->size);
        return NULL;
    }
    PyObject *res = NULL;
    L.ins = ptrs_of(args[5], "ins", &L.nin);
    if (L.ins == NULL) {
        return NULL;
    }
    L.outs = ptrs_of(args[6], "outs", &L.nout);
    if (L.outs == NULL) {
        goto done;
    }
    L.isplit = splits_of(args[7], "in_splits", self->size);
    if (L.isplit == NULL && PyErr_Occurred()) {
        goto done;
    }
    L.osplit = splits_of(args[8], "out_splits", self->size);
    if (L.osplit == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (check_null(L.ins, L.nin, L.isplit, self->size, L.count * L.itemsize,
                   "ins") < 0 ||
        check_null(L.outs, L.nout, L.osplit, self->size, L.count * L.itemsize,
                   "outs") < 0) {
        goto done;
    }
    /* the layouts the launch reads (the Python layer builds them) */
    {
        Py_ssize_t n = self->size;
        int ok = 1;
        switch (L.kind) {
        case PD_K_ALLREDUCE: case PD_K_BROADCAST: case PD_K_RECV:
            ok = L.nout == 1;
            break;
        case PD_K_REDUCE:
            ok = L.nin == 1 && L.nout == 1;
            break;
        case PD_K_SEND:
            ok = L.nin == 1;
            break;
        case PD_K_ALLGATHER:
            ok = L.nin == 1 && (L.nout == 1 || L.nout == n);
            break;
        case PD_K_REDUCE_SCATTER:
            ok = L.nout == 1 && (L.nin == 1 || L.nin == n);
            break;
        case PD_K_GATHER:
            ok = L.nin == 1 && (self->rank == L.root ? L.nout == n : 1);
            break;
        case PD_K_SCATTER:
            ok = L.nout == 1 && (self->rank == L.root ? L.nin == n : 1);
            break;
        case PD_K_ALLTOALL:
            ok = (L.nin == 1 || L.nin == n) && (L.nout == 1 || L.nout == n) &&
                 L.isplit != NULL && L.osplit != NULL;
            break;
        default:
            break;
        }
        if (!ok) {
            PyErr_Format(PyExc_ValueError,
                         "run: %s got %zd inputs and %zd outputs",
                         pd_kind_name(L.kind), L.nin, L.nout);
            goto done;
        }
    }
    int wait = nargs == 12 ? PyObject_IsTrue(args[11]) : 0;
    if (wait < 0) {
        goto done;
    }
    res = comm_launch(self, &L, ustream, args[10], wait);
done:
    PyMem_Free(L.ins);
    PyMem_Free(L.outs);
    PyMem_Free(L.isplit);
    PyMem_Free(L.osplit);
    return res;
}

/* run_p2p(ops, stream, keep) -> NcclWork: one NCCL group of sends and
 * receives; ops: tuple of (is_send, device pointer, nbytes, peer). */
static PyObject *
Comm_run_p2p(CommObject *self, PyObject *args)
{
    PyObject *ops, *keep;
    long long ustream;
    if (!PyArg_ParseTuple(args, "O!LO:run_p2p", &PyTuple_Type, &ops, &ustream,
                          &keep)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(ops);
    if (n < 1 || n > 1 << 20) {
        PyErr_SetString(PyExc_ValueError, "run_p2p: ops must hold 1 or more "
                        "operations");
        return NULL;
    }
    launch L;
    memset(&L, 0, sizeof(L));
    L.kind = PD_K_NONE;
    L.np2p = (int)n;
    L.p2p_send = PyMem_Calloc(n, sizeof(int));
    L.p2p_peer = PyMem_Calloc(n, sizeof(int));
    L.p2p_ptr = PyMem_Calloc(n, sizeof(void *));
    L.p2p_bytes = PyMem_Calloc(n, sizeof(size_t));
    PyObject *res = NULL;
    if (!L.p2p_send || !L.p2p_peer || !L.p2p_ptr || !L.p2p_bytes) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(ops, i);
        PyObject *ptr;
        if (!PyTuple_Check(o) ||
            !PyArg_ParseTuple(o, "pOni", &L.p2p_send[i], &ptr, &L.p2p_bytes[i],
                              &L.p2p_peer[i])) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "run_p2p: each op must be "
                                "(is_send, pointer, nbytes, peer)");
            }
            goto done;
        }
        L.p2p_ptr[i] = PyLong_AsVoidPtr(ptr);
        if (PyErr_Occurred()) {
            goto done;
        }
        if (L.p2p_ptr[i] == NULL && L.p2p_bytes[i] > 0) {
            PyErr_Format(PyExc_ValueError, "run_p2p: ops[%zd] is a null "
                         "pointer", i);
            goto done;
        }
        if (L.p2p_peer[i] < 0 || L.p2p_peer[i] >= self->size) {
            PyErr_Format(PyExc_ValueError, "run_p2p: peer %d out of range "
                         "[0, %d)", L.p2p_peer[i], self->size);
            goto done;
        }
    }
    res = comm_launch(self, &L, ustream, keep, 0);
done:
    PyMem_Free(L.p2p_send);
    PyMem_Free(L.p2p_peer);
    PyMem_Free(L.p2p_ptr);
    PyMem_Free(L.p2p_bytes);
    return res;
}

static int
Comm_traverse(CommObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->orphans);
    return 0;
}

static void
Comm_dealloc(CommObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* Dropped without destroy(): abort (never blocks), as torch's
     * ProcessGroupNCCL does for a communicator that is not shut down. */
    if (self->comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        atomic_store(&self->aborted, 1);
        pthread_mutex_lock(&self->mu);
        pd_nccl_comm comm = take_comm(self);
        int prev = dev_enter(self);
        self->nc->CommAbort(comm);
        atomic_store(&self->abort_done, 1);
        comm_free_resources(self);
        dev_leave(self, prev);
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
    }
    else if (self->rt != NULL && self->stream != NULL) {
        int prev = dev_enter(self);
        comm_free_resources(self);
        dev_leave(self, prev);
    }
    Py_CLEAR(self->orphans);
    pthread_mutex_destroy(&self->mu);
    pthread_mutex_destroy(&self->pool_mu);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
Comm_get_int(CommObject *self, void *which)
{
    switch ((int)(intptr_t)which) {
    case 0:
        return PyLong_FromLong(self->rank);
    case 1:
        return PyLong_FromLong(self->size);
    case 2:
        return PyLong_FromLong(self->device);
    case 3:
        return PyLong_FromVoidPtr(self->stream);
    default:
        return PyLong_FromUnsignedLongLong(self->seq);
    }
}

static PyObject *
Comm_get_reason(CommObject *self, void *Py_UNUSED(closure))
{
    if (!atomic_load(&self->aborted)) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(self->reason);
}

static PyGetSetDef Comm_getset[] = {
    {"rank", (getter)Comm_get_int, NULL, "rank in the communicator",
     (void *)0},
    {"size", (getter)Comm_get_int, NULL, "ranks in the communicator",
     (void *)1},
    {"device", (getter)Comm_get_int, NULL, "CUDA device ordinal", (void *)2},
    {"stream", (getter)Comm_get_int, NULL,
     "the communicator's stream (cudaStream_t as an int)", (void *)3},
    {"seq", (getter)Comm_get_int, NULL, "operations launched", (void *)4},
    {"abort_reason", (getter)Comm_get_reason, NULL,
     "None, or why the communicator was aborted or destroyed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Comm_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Comm_run, METH_FASTCALL,
     "run(kind, dtype, op, root, count, ins, outs, in_splits, out_splits, "
     "stream, keep, wait=False) -> NcclWork (wait: the stream also waits for "
     "the work's end)"},
    {"run_p2p", (PyCFunction)Comm_run_p2p, METH_VARARGS,
     "run_p2p(ops, stream, keep) -> NcclWork: one group of sends/receives"},
    {"split", (PyCFunction)Comm_split, METH_VARARGS,
     "split(color, key, size, rank) -> NcclComm or None (ncclCommSplit)"},
    {"async_error", (PyCFunction)Comm_async_error, METH_NOARGS,
     "ncclCommGetAsyncError's result (7: a call is in progress)"},
    {"wait_ready", (PyCFunction)Comm_wait_ready, METH_O,
     "wait_ready(timeout) -> result once no call is in progress (7: timed "
     "out)"},
    {"error_string", (PyCFunction)Comm_error_string, METH_O,
     "error_string(result) -> NCCL's text with its last error message"},
    {"abort", (PyCFunction)Comm_abort, METH_O,
     "abort(reason) -> bool: ncclCommAbort, from any thread; later calls "
     "raise DistBackendError(reason)"},
    {"destroy", (PyCFunction)Comm_destroy, METH_O,
     "destroy(timeout) -> 'destroyed' or 'aborted'"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Comm_slots[] = {
    {Py_tp_new, Comm_new},
    {Py_tp_dealloc, Comm_dealloc},
    {Py_tp_traverse, Comm_traverse},
    {Py_tp_methods, Comm_methods},
    {Py_tp_getset, Comm_getset},
    {Py_tp_doc, "NcclComm(uid, size, rank, device): one NCCL communicator "
                "with its own stream (created non-blocking)."},
    {0, NULL},
};

static PyType_Spec Comm_spec = {
    .name = "pyddp._C.NcclComm",
    .basicsize = sizeof(CommObject),
    .flags = PD_TPFLAGS_GC,
    .slots = Comm_slots,
};

/* ------------------------------------------------------------- NcclWork */

static void
work_finish(NWorkObject *w)
{
    w->done = 1;
    Py_CLEAR(w->keep);
}

/* A failed work's arrays are let go only once the abort returned and the
 * stream went past the work: until then NCCL kernels may still touch them,
 * and a caching allocator would hand their memory to someone else. */
static void
work_release_failed(NWorkObject *w)
{
    CommObject *c = w->comm;
    if (w->keep == NULL || !atomic_load(&c->abort_done)) {
        return;
    }
    int prev = dev_enter(c);
    pd_cuda_err e = c->rt->EventQuery(w->end);
    dev_leave(c, prev);
    if (e != PD_CUDA_ERR_NOT_READY) {
        if (e != PD_CUDA_SUCCESS) {
            c->rt->GetLastError();
        }
        Py_CLEAR(w->keep);
    }
}

/* 1 done, 0 running, -1 failed (the communicator was aborted; no exception
 * set), -2 a CUDA error (exception set). */
static int
work_query(NWorkObject *w)
{
    if (w->done == 1) {
        return 1;
    }
    CommObject *c = w->comm;
    if (w->done == 2 || atomic_load(&c->aborted)) {
        w->done = 2;
        work_release_failed(w);
        return -1;
    }
    int prev = dev_enter(c);
    pd_cuda_err e = c->rt->EventQuery(w->end);
    dev_leave(c, prev);
    if (e == PD_CUDA_SUCCESS) {
        work_finish(w);
        return 1;
    }
    if (e == PD_CUDA_ERR_NOT_READY) {
        return 0;
    }
    c->rt->GetLastError(); /* clear the sticky-free error */
    cuda_error(c->st, c->rt, "cudaEventQuery", e);
    return -2;
}

static PyObject *
NWork_query(NWorkObject *self, PyObject *Py_UNUSED(ignored))
{
    int q = work_query(self);
    if (q == -2) {
        return NULL;
    }
    return PyLong_FromLong(q);
}

/* wait_stream(stream): make the caller's stream wait for this work. */
static PyObject *
NWork_wait_stream(NWorkObject *self, PyObject *arg)
{
    long long s = PyLong_AsLongLong(arg);
    if (s == -1 && PyErr_Occurred()) {
        return NULL;
    }
    CommObject *c = self->comm;
    int q = work_query(self);
    if (q == -1) {
        return aborted_error(c);
    }
    if (q != 0) {
        if (q == -2) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    pd_cuda_err e;
    Py_BEGIN_ALLOW_THREADS
    int prev = dev_enter(c);
    e = c->rt->StreamWaitEvent((pd_cuda_stream)(intptr_t)s, self->end, 0);
    dev_leave(c, prev);
    Py_END_ALLOW_THREADS
    if (e) {
        return cuda_error(c->st, c->rt, "cudaStreamWaitEvent", e);
    }
    Py_RETURN_NONE;
}

/* synchronize(timeout) -> query result after waiting on the host at most
 * timeout seconds (< 0: until done or aborted); Ctrl-C is seen. */
static PyObject *
NWork_synchronize(NWorkObject *self, PyObject *arg)
{
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    double deadline = t < 0 ? -1.0 : pd_now() + t;
    for (;;) {
        int q = work_query(self);
        if (q != 0) {
            return q == -2 ? NULL : PyLong_FromLong(q);
        }
        double slice_end = pd_now() + 0.05;
        if (deadline >= 0 && deadline < slice_end) {
            slice_end = deadline;
        }
        CommObject *c = self->comm;
        pd_cuda_err e = PD_CUDA_ERR_NOT_READY;
        Py_BEGIN_ALLOW_THREADS
        int prev = dev_enter(c);
        for (int i = 0; pd_now() < slice_end && !atomic_load(&c->aborted); i++) {
            e = c->rt->EventQuery(self->end);
            if (e != PD_CUDA_ERR_NOT_READY) {
                break;
            }
            if (i < 50) {
                sched_yield();
            }
            else {
                nap();
            }
        }
        dev_leave(c, prev);
        Py_END_ALLOW_THREADS
        if (e != PD_CUDA_ERR_NOT_READY || atomic_load(&c->aborted)) {
            continue;
        }
        if (deadline >= 0 && pd_now() >= deadline) {
            return PyLong_FromLong(0);
        }
        if (PyErr_CheckSignals() < 0) {
            return NULL;
        }
    }
}

static PyObject *
NWork_get(NWorkObject *self, void *which)
{
    switch ((int)(intptr_t)which) {
    case 0:
        return PyLong_FromUnsignedLongLong(self->seq);
    case 1:
        return PyFloat_FromDouble(self->t0);
    case 3:
        return PyBool_FromLong(self->keep != NULL);
    default:
        return PyLong_FromVoidPtr(self->end);
    }
}

static int
NWork_traverse(NWorkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->comm);
    Py_VISIT(self->keep);
    return 0;
}

static int
NWork_clear(NWorkObject *self)
{
    Py_CLEAR(self->keep);
    return 0;
}

static void
NWork_dealloc(NWorkObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->comm != NULL && self->end != NULL) {
        /* A running work's arrays stay alive with the group's own list
         * (pyddp/distributed/_nccl.py); the event may be re-recorded. */
        pool_put(self->comm, self->end);
    }
    Py_CLEAR(self->keep);
    Py_CLEAR(self->comm);
    PyObject_GC_Del(self);
    Py_DECREF(tp);
}

static PyGetSetDef NWork_getset[] = {
    {"seq", (getter)NWork_get, NULL, "the launch's sequence number", (void *)0},
    {"t0", (getter)NWork_get, NULL, "launch time (pyddp's monotonic clock)",
     (void *)1},
    {"event", (getter)NWork_get, NULL, "the end event (cudaEvent_t as an int)",
     (void *)2},
    {"holds_arrays", (getter)NWork_get, NULL,
     "whether the work still keeps its arrays alive (until it completed, or "
     "after a failure until the abort returned and the stream went past it)",
     (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef NWork_methods[] = {
    {"query", (PyCFunction)NWork_query, METH_NOARGS,
     "1 done, 0 running, -1 failed (communicator aborted)"},
    {"wait_stream", (PyCFunction)NWork_wait_stream, METH_O,
     "wait_stream(stream): the stream waits for the work (no host block)"},
    {"synchronize", (PyCFunction)NWork_synchronize, METH_O,
     "synchronize(timeout) -> query() after waiting on the host"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot NWork_slots[] = {
    {Py_tp_dealloc, NWork_dealloc},
    {Py_tp_traverse, NWork_traverse},
    {Py_tp_clear, NWork_clear},
    {Py_tp_methods, NWork_methods},
    {Py_tp_getset, NWork_getset},
    {Py_tp_doc, "An operation launched on an NcclComm's stream."},
    {0, NULL},
};

static PyType_Spec NWork_spec = {
    .name = "pyddp._C.NcclWork",
    .basicsize = sizeof(NWorkObject),
    .flags = PD_TPFLAGS_GC,
    .slots = NWork_slots,
};

static PyObject *
module_pd_now(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble(pd_now());
}

static PyMethodDef nccl_functions[] = {
    {"monotonic", module_pd_now, METH_NOARGS,
     "pyddp's monotonic clock in seconds (NcclWork.t0's)"},
    {NULL, NULL, 0, NULL},
};

int
pd_nccl_add_types(PyObject *m, pd_module_state *st)
{
    st->NcclCommType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Comm_spec,
                                                                NULL);
    if (st->NcclCommType == NULL ||
        PyModule_AddObjectRef(m, "NcclComm", (PyObject *)st->NcclCommType) < 0) {
        return -1;
    }
    st->NcclWorkType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &NWork_spec,
                                                                NULL);
    if (st->NcclWorkType == NULL ||
        PyModule_AddObjectRef(m, "NcclWork", (PyObject *)st->NcclWorkType) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, nccl_functions);
}
