/* Backend "nccl"'s binding: _C.NcclComm (one NCCL communicator on one
 * device) and _C.NcclWork (the handles of the operations it launched) over
 * the core in csrc/nccl/ (comm.h: stream rules, the never-hang polling,
 * abort).  Here: arguments, the GIL (released around every call that may
 * block; taken back between the slices of a launch's poll to see Ctrl-C),
 * the arrays a work keeps alive, and the exceptions.
 *
 * The Python layer (pyddp/distributed/backends/nccl/backend.py) checks arrays, devices and
 * signatures across ranks; here arrays arrive as device pointers, sizes in
 * elements (counts) or bytes (splits), and the objects to keep alive until
 * the work completes. */
#include "binding.h"

#include "../cuda/cudawrap.h"
#include "../kernels/kernels.h"
#include "../nccl/comm.h"
#include "../util/kinds.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    pd_module_state *st;
    PyObject *orphans;      /* split children NCCL may still write: kept */
    pd_ncomm c;
} CommObject;

typedef struct {
    PyObject_HEAD
    CommObject *comm;
    PyObject *keep;         /* the arrays, until the work completed */
    pd_nwork w;
} NWorkObject;

/* The core's failure (its message in the thread-local buffer) as the
 * exception of its status. */
static PyObject *
core_error(pd_module_state *st, pd_status s)
{
    return pd_py_set_error(st, s, pd_errmsg());
}

/* ------------------------------------------------------------ NcclComm */

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
    pd_ncomm_setup(&c->c, rt, nc, device);
    return c;
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
    pd_nccl_uid id;
    if (uid.len != (Py_ssize_t)sizeof(id.internal)) {
        PyBuffer_Release(&uid);
        PyErr_Format(PyExc_ValueError,
                     "NcclComm: uid must be %zu bytes (ncclUniqueId), got %zd",
                     sizeof(id.internal), uid.len);
        return NULL;
    }
    memcpy(id.internal, uid.buf, sizeof(id.internal));
    PyBuffer_Release(&uid);
    if (size < 1 || rank < 0 || rank >= size || device < 0) {
        PyErr_Format(PyExc_ValueError,
                     "NcclComm: need 0 <= rank < size and device >= 0, got "
                     "rank %d, size %d, device %d", rank, size, device);
        return NULL;
    }
    CommObject *c = comm_alloc(tp, device);
    if (c == NULL) {
        return NULL;
    }
    c->c.rank = rank;
    c->c.size = size;
    c->c.timeout = timeout > 0 ? timeout : 0.0;
    pd_status s;
    Py_BEGIN_ALLOW_THREADS
    s = pd_ncomm_init(&c->c, &id);
    Py_END_ALLOW_THREADS
    if (s != PD_OK) {
        core_error(c->st, s);
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
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
    if (self->c.nc->CommSplit == NULL) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "this libnccl has no ncclCommSplit");
        return NULL;
    }
    if (atomic_load(&self->c.aborted)) {
        pd_ncomm_aborted_error(&self->c);
        return core_error(self->st, PD_EBACKEND);
    }
    CommObject *c = comm_alloc(Py_TYPE(self), self->c.device);
    if (c == NULL) {
        return NULL;
    }
    c->c.rank = rank;
    c->c.size = size;
    c->c.timeout = self->c.timeout;
    pd_status s;
    int orphaned = 0;
    Py_BEGIN_ALLOW_THREADS
    s = pd_ncomm_split(&self->c, &c->c, color, key, timeout, &orphaned);
    Py_END_ALLOW_THREADS
    if (orphaned) {
        /* NCCL may still write c's communicator: the parent keeps c */
        if ((self->orphans == NULL && (self->orphans = PyList_New(0)) == NULL) ||
            PyList_Append(self->orphans, (PyObject *)c) < 0) {
            Py_INCREF(c); /* leaked rather than freed under NCCL */
        }
    }
    if (s != PD_OK) {
        core_error(self->st, s);
        Py_DECREF(c);
        return NULL;
    }
    if (__atomic_load_n(&c->c.comm, __ATOMIC_ACQUIRE) == NULL) {
        Py_DECREF(c);  /* NCCL_SPLIT_NOCOLOR: no communicator */
        Py_RETURN_NONE;
    }
    return (PyObject *)c;
}

/* async_error() -> ncclResult_t of ncclCommGetAsyncError (7 while a
 * non-blocking call is in progress, or another thread is inside the
 * communicator: never waits); 3 (internal) once aborted.  Serialised with
 * every other call into the communicator, never waiting behind one. */
static PyObject *
Comm_async_error(CommObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(pd_ncomm_async_error(&self->c));
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
    pd_nccl_res r;
    Py_BEGIN_ALLOW_THREADS
    r = pd_ncomm_wait_ready(&self->c, t);
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
    pd_ncomm_error_string(&self->c, (pd_nccl_res)r, text, sizeof(text));
    return PyUnicode_FromString(text);
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
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = pd_ncomm_abort(&self->c, reason);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
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
    const char *how;
    Py_BEGIN_ALLOW_THREADS
    how = pd_ncomm_destroy(&self->c, t);
    Py_END_ALLOW_THREADS
    return PyUnicode_FromString(how);
}

/* ------------------------------------------------------------- launches */

/* The launch poll's signal check (pd_ncomm_launch's interrupted): takes the
 * GIL while the core holds the communicator's mutex (no thread takes that
 * mutex with the GIL held). */
static int
launch_interrupted(void *arg)
{
    PyThreadState **save = arg;
    PyEval_RestoreThread(*save);
    int r = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    return r;
}

/* Launch L after the caller's stream (ustream; -1: no ordering) and return
 * its work handle holding `keep`; with `wait`, the caller's stream also waits
 * for the work's end (a blocking call's Work.wait(), in the same launch). */
static PyObject *
comm_launch(CommObject *c, const pd_nlaunch *L, long long ustream,
            PyObject *keep, int wait)
{
    NWorkObject *w = PyObject_GC_New(NWorkObject, c->st->NcclWorkType);
    if (w == NULL) {
        return NULL;
    }
    w->comm = NULL;
    w->keep = NULL;
    memset(&w->w, 0, sizeof(w->w));
    pd_status s;
    PyThreadState *save = PyEval_SaveThread();
    s = pd_ncomm_launch(&c->c, L, ustream, wait, launch_interrupted, &save,
                        &w->w);
    PyEval_RestoreThread(save);
    if (s != PD_OK) {
        Py_DECREF(w);
        /* PD_EINTR: the KeyboardInterrupt the signal check raised */
        return s == PD_EINTR ? NULL : core_error(c->st, s);
    }
    Py_INCREF(c);
    w->comm = c;
    if (wait && ustream >= 0) {
        /* the caller's stream already waits for the end: what it frees
         * after this (back to a stream-ordered allocator, torch's or CuPy's,
         * on that stream) is reused only after the work (torch's
         * TORCH_NCCL_AVOID_RECORD_STREAMS rule) */
        w->w.holds = 0;
        keep = NULL;
    }
    Py_XINCREF(keep);
    w->keep = keep;
    PyObject_GC_Track(w);
    return (PyObject *)w;
}

/* Pointers of a tuple of ints into a PyMem array. */
static void **
ptrs_of(PyObject *t, const char *name, ptrdiff_t *n)
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
    pd_nlaunch L;
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
        const char *why = pd_ncomm_reduction(L.dtype, L.op, &a, &b, &m);
        if (why != NULL) {
            PyErr_Format(PyExc_TypeError, "%s on %s: %s", pd_kind_name(L.kind),
                         pd_dtype_name((pd_dtype)L.dtype), why);
            return NULL;
        }
    }
    if ((pd_kind_has(L.kind, PD_KF_ROOTED)) &&
        (L.root < 0 || L.root >= self->c.size)) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d out of range [0, %d)",
                     pd_kind_name(L.kind), L.root, self->c.size);
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
    L.isplit = splits_of(args[7], "in_splits", self->c.size);
    if (L.isplit == NULL && PyErr_Occurred()) {
        goto done;
    }
    L.osplit = splits_of(args[8], "out_splits", self->c.size);
    if (L.osplit == NULL && PyErr_Occurred()) {
        goto done;
    }
    if (check_null(L.ins, L.nin, L.isplit, self->c.size, L.count * L.itemsize,
                   "ins") < 0 ||
        check_null(L.outs, L.nout, L.osplit, self->c.size, L.count * L.itemsize,
                   "outs") < 0) {
        goto done;
    }
    /* the layouts the launch reads (the Python layer builds them) */
    if (!pd_ncomm_layout_ok(&self->c, &L)) {
        PyErr_Format(PyExc_ValueError, "run: %s got %zd inputs and %zd outputs",
                     pd_kind_name(L.kind), (Py_ssize_t)L.nin,
                     (Py_ssize_t)L.nout);
        goto done;
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
    pd_nlaunch L;
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
        if (L.p2p_peer[i] < 0 || L.p2p_peer[i] >= self->c.size) {
            PyErr_Format(PyExc_ValueError, "run_p2p: peer %d out of range "
                         "[0, %d)", L.p2p_peer[i], self->c.size);
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
    /* Dropped without destroy(): aborted by the core (never blocks). */
    if (self->c.comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        pd_ncomm_close(&self->c);
        Py_END_ALLOW_THREADS
    }
    else {
        pd_ncomm_close(&self->c);
    }
    Py_CLEAR(self->orphans);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
Comm_get_int(CommObject *self, void *which)
{
    switch ((int)(intptr_t)which) {
    case 0:
        return PyLong_FromLong(self->c.rank);
    case 1:
        return PyLong_FromLong(self->c.size);
    case 2:
        return PyLong_FromLong(self->c.device);
    case 3:
        return PyLong_FromVoidPtr(self->c.stream);
    case 5:
        return PyLong_FromLong(atomic_load(&self->c.overlaps));
    default:
        return PyLong_FromUnsignedLongLong(self->c.seq);
    }
}

static PyObject *
Comm_get_reason(CommObject *self, void *Py_UNUSED(closure))
{
    char why[PD_ERRMSG_MAX];
    if (!pd_ncomm_reason(&self->c, why, sizeof(why))) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(why);
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
    {"overlapping_entries", (getter)Comm_get_int, NULL,
     "calls into NCCL on this communicator made while another thread was in "
     "one (NCCL gives no thread-safety guarantee: must stay 0)", (void *)5},
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

/* The core's query; the arrays are let go once it says so (done, or failed
 * and past the abort).  1 done, 0 running, -1 failed (no exception set), -2
 * a CUDA error (exception set). */
static int
work_query(NWorkObject *w)
{
    int q = pd_nwork_query(&w->w);
    if (!w->w.holds) {
        Py_CLEAR(w->keep);
    }
    if (q == -2) {
        core_error(w->comm->st, PD_EBACKEND);
    }
    return q;
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
        pd_ncomm_aborted_error(&c->c);
        return core_error(c->st, PD_EBACKEND);
    }
    if (q != 0) {
        if (q == -2) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_nwork_wait_stream(&self->w, (pd_cuda_stream)(intptr_t)s);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return core_error(c->st, st);
    }
    if (s == self->w.ustream) {
        /* the stream the call was made on now waits for its end: the
         * arrays go at once, not when the host sees the end (torch's rule
         * for wait(): their memory is reused on that stream after it) */
        self->w.holds = 0;
        Py_CLEAR(self->keep);
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
        pd_cuda_err e;
        Py_BEGIN_ALLOW_THREADS
        e = pd_nwork_poll(&self->w, slice_end);
        Py_END_ALLOW_THREADS
        if (e != PD_CUDA_ERR_NOT_READY || atomic_load(&self->comm->c.aborted)) {
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
        return PyLong_FromUnsignedLongLong(self->w.seq);
    case 1:
        return PyFloat_FromDouble(self->w.t0);
    case 3:
        return PyBool_FromLong(self->keep != NULL);
    default:
        return PyLong_FromVoidPtr(self->w.end);
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
    self->w.holds = 0;
    return 0;
}

static void
NWork_dealloc(NWorkObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    /* A running work's arrays stay alive with the group's own list
     * (pyddp/distributed/backends/nccl/backend.py); the event may be re-recorded. */
    pd_nwork_release(&self->w);
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
