/* pyddp._C.ProcessGroup and pyddp._C.Work.
 *
 * The binding turns Python buffers into the per-rank block pointers of a
 * pd_op, checks every length against what the collective will read or write
 * (so a wrong size can never be read or written out of bounds), and submits
 * it.  A Work owns the array views until the operation has completed.
 * Every blocking call releases the GIL.
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../coll/coll.h"
#include "../util/kinds.h"
#include "../group/group.h"
#include "../kernels/kernels.h"
#include "binding.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    pd_group *g;
    int port;
    int rank;
    int size;
    long pid; /* creator: a forked child must not touch the parent's thread */
    PyObject *handoffs; /* Works of interrupted inline collectives */
    pd_module_state *st; /* the defining module's state (the fast path's) */
    PyObject *weakrefs; /* weak references (the flight recorder's registry) */
} PGObject;

typedef struct {
    PyObject_HEAD
    pd_work *w;
    pd_view *views;  /* buffers.c views, released when the work is done */
    int nviews;
    char **ptrs;   /* in blocks then out blocks */
    size_t *lens;  /* same layout */
    PyObject *keep; /* objects to keep alive (the arrays) */
    int kind;
} WorkObject;

/* ------------------------------------------------------------------ Work */

static void
work_release_views(WorkObject *self)
{
    for (int i = 0; i < self->nviews; i++) {
        pd_view_release(&self->views[i]);
    }
    PyMem_Free(self->views);
    self->views = NULL;
    self->nviews = 0;
    PyMem_Free(self->ptrs);
    self->ptrs = NULL;
    PyMem_Free(self->lens);
    self->lens = NULL;
}

/* A new Work with nothing attached, tracked by the GC. */
static WorkObject *
work_alloc(pd_module_state *st)
{
    WorkObject *w = PyObject_GC_New(WorkObject, st->WorkType);
    if (w == NULL) {
        return NULL;
    }
    w->w = NULL;
    w->views = NULL;
    w->nviews = 0;
    w->ptrs = NULL;
    w->lens = NULL;
    w->keep = NULL;
    w->kind = 0;
    PyObject_GC_Track(w);
    return w;
}

static int
Work_traverse(WorkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->keep);
    for (int i = 0; i < self->nviews; i++) {
        pd_view *v = &self->views[i];
        Py_VISIT(v->buf.obj);
        Py_VISIT(v->capsule);
        Py_VISIT(v->owner);
    }
    return 0;
}

/* The arrays may be dropped only once nothing can touch them any more. */
static int
Work_clear(WorkObject *self)
{
    if (self->w == NULL || pd_work_done(self->w)) {
        work_release_views(self);
        Py_CLEAR(self->keep);
    }
    return 0;
}

static void
Work_dealloc(WorkObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->w != NULL) {
        /* The progress thread may still touch the buffers: wait for it
         * (bounded by the operation's own timeout). */
        if (!pd_work_done(self->w)) {
            Py_BEGIN_ALLOW_THREADS
            pd_work_wait(self->w, -1.0);
            Py_END_ALLOW_THREADS
        }
        pd_work_release(self->w);
        self->w = NULL;
    }
    work_release_views(self);
    Py_CLEAR(self->keep);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
Work_wait(WorkObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:wait", kwlist,
                                     &timeout)) {
        return NULL;
    }
    double t = -1.0;
    if (timeout != Py_None) {
        t = PyFloat_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (t < 0) {
            PyErr_SetString(PyExc_ValueError,
                            "timeout must be >= 0 seconds or None");
            return NULL;
        }
    }
    pd_status st;
    char msg[PD_ERRMSG_MAX];
    /* Wait in slices so Ctrl-C (a notebook's interrupt) is seen while a
     * collective waits for other ranks; the operation itself goes on (the
     * group keeps its handle and arrays) and fails or ends on its own. */
    double deadline = t < 0 ? -1.0 : pd_now() + t;
    for (;;) {
        double slice = 0.1;
        if (deadline >= 0) {
            double left = deadline - pd_now();
            slice = left < slice ? (left > 0 ? left : 0) : slice;
        }
        Py_BEGIN_ALLOW_THREADS
        st = pd_work_wait(self->w, slice);
        if (st != PD_OK) {
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        }
        Py_END_ALLOW_THREADS
        if (pd_work_done(self->w) ||
            (deadline >= 0 && pd_now() >= deadline)) {
            break;
        }
        if (PyErr_CheckSignals() < 0) {
            return NULL;
        }
    }
    if (pd_work_done(self->w)) {
        /* A slice may have timed out just before the work finished: the
         * work's own status is the answer. */
        st = pd_work_wait(self->w, 0);
        if (st != PD_OK) {
            snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        }
    }
    else {
        st = PD_ETIMEOUT;
        snprintf(msg, sizeof(msg),
                 "Work.wait(timeout=%.3g s) timed out: the operation is still "
                 "running", t);
    }
    if (pd_work_done(self->w)) {
        /* The core is done with the arrays: let them go now, not when this
         * handle dies (the group keeps handles of async work for a while). */
        work_release_views(self);
    }
    if (st != PD_OK) {
        return pd_py_set_error(pd_state_from_type(Py_TYPE(self)), st, msg);
    }
    Py_RETURN_TRUE;
}

static PyObject *
Work_is_completed(WorkObject *self, PyObject *Py_UNUSED(ignored))
{
    int done = pd_work_done(self->w);
    if (done) {
        work_release_views(self);
    }
    return PyBool_FromLong(done);
}

static PyObject *
Work_source_rank(WorkObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!pd_work_done(self->w)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "source_rank() is known only after the work completed");
        return NULL;
    }
    return PyLong_FromLong(pd_work_source(self->w));
}

static PyMethodDef Work_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Work_wait,
     METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): block until done; raise the operation's error."},
    {"is_completed", (PyCFunction)Work_is_completed, METH_NOARGS,
     "True once the operation has finished (successfully or not)."},
    {"source_rank", (PyCFunction)Work_source_rank, METH_NOARGS,
     "recv: the rank the message came from."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Work_slots[] = {
    {Py_tp_dealloc, Work_dealloc},
    {Py_tp_traverse, Work_traverse},
    {Py_tp_clear, Work_clear},
    {Py_tp_methods, Work_methods},
    {Py_tp_doc, "Handle of an operation submitted to a process group."},
    {0, NULL},
};

static PyType_Spec Work_spec = {
    .name = "pyddp._C.Work",
    .basicsize = sizeof(WorkObject),
    .flags = PD_TPFLAGS_GC,
    .slots = Work_slots,
};

/* ---------------------------------------------------------- ProcessGroup */

static pd_module_state *
pg_state(PyObject *self)
{
    return pd_state_from_type(Py_TYPE(self));
}

static PyObject *
PG_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rank", "size", "timeout", "secret", "bind_host",
                             NULL};
    int rank, size;
    double timeout;
    const char *secret = NULL, *bind_host = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iid|zz:ProcessGroup", kwlist,
                                     &rank, &size, &timeout, &secret,
                                     &bind_host)) {
        return NULL;
    }
    PGObject *self = (PGObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    pd_status st;
    char msg[PD_ERRMSG_MAX];
    pd_group *g = NULL;
    int port = 0;
    st = pd_group_create(rank, size, timeout, secret, bind_host, &g, &port);
    if (st != PD_OK) {
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        Py_DECREF(self);
        return pd_py_set_error(pd_state_from_type(type), st, msg);
    }
    self->g = g;
    self->handoffs = PyList_New(0);
    if (self->handoffs == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->pid = (long)getpid();
    self->st = pd_state_from_type(type);
    self->port = port;
    self->rank = rank;
    self->size = size;
    return (PyObject *)self;
}

static void
pg_destroy(PGObject *self)
{
    if (self->g != NULL) {
        pd_group *g = self->g;
        self->g = NULL;
        if ((long)getpid() != self->pid) {
            /* Forked child: the progress thread and sockets belong to the
             * parent; leave them alone (the memory goes with the child). */
            return;
        }
        Py_BEGIN_ALLOW_THREADS
        pd_group_destroy(g);
        Py_END_ALLOW_THREADS
    }
}

static int
PG_traverse(PGObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->handoffs);
    return 0;
}

static int
PG_clear(PGObject *self)
{
    Py_CLEAR(self->handoffs);
    return 0;
}

static void
PG_dealloc(PGObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    pg_destroy(self);
    Py_CLEAR(self->handoffs);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
PG_destroy(PGObject *self, PyObject *Py_UNUSED(ignored))
{
    pg_destroy(self);
    Py_RETURN_NONE;
}

static int
pg_check(PGObject *self)
{
    if (self->g == NULL) {
        pd_py_set_error(pg_state((PyObject *)self), PD_ECLOSED,
                        "the process group has been destroyed");
        return -1;
    }
    return 0;
}

/* Called from a watcher thread while connect() runs in another (without
 * the GIL): the C side only sets a flag that connect looks at. */
static PyObject *
PG_cancel_connect(PGObject *self, PyObject *why)
{
    const char *s = PyUnicode_AsUTF8(why);
    if (s == NULL) {
        return NULL;
    }
    if (pg_check(self) < 0) {
        return NULL;
    }
    pd_group_cancel_connect(self->g, s);
    Py_RETURN_NONE;
}

/* fail(msg): the group's sticky error, sent to every peer (a device
 * backend of the same ranks failed). */
static PyObject *
PG_fail(PGObject *self, PyObject *msg)
{
    const char *s = PyUnicode_AsUTF8(msg);
    if (s == NULL) {
        return NULL;
    }
    if (self->g != NULL) {
        pd_group_fail(self->g, s);
    }
    Py_RETURN_NONE;
}

static PyObject *
PG_connect(PGObject *self, PyObject *args)
{
    PyObject *hosts, *ports, *nodes = Py_None;
    unsigned long long token;
    int transport = PD_TRANSPORT_AUTO, cores = 0;
    if (!PyArg_ParseTuple(args, "OOK|Oii:connect", &hosts, &ports, &token,
                          &nodes, &transport, &cores)) {
        return NULL;
    }
    if (cores < 0) {
        PyErr_Format(PyExc_ValueError,
                     "connect: cores must be >= 0 (0: this host's online "
                     "CPUs), got %d", cores);
        return NULL;
    }
    if (pg_check(self) < 0) {
        return NULL;
    }
    Py_ssize_t n = self->size;
    if (!PyList_Check(hosts) || !PyList_Check(ports) ||
        PyList_GET_SIZE(hosts) != n || PyList_GET_SIZE(ports) != n ||
        (nodes != Py_None &&
         (!PyList_Check(nodes) || PyList_GET_SIZE(nodes) != n))) {
        PyErr_Format(PyExc_ValueError,
                     "connect: hosts, ports (and nodes) must be lists of %zd "
                     "entries", n);
        return NULL;
    }
    if (transport < PD_TRANSPORT_AUTO || transport > PD_TRANSPORT_SHM) {
        PyErr_Format(PyExc_ValueError, "connect: bad transport %d",
                     transport);
        return NULL;
    }
    const char **h = PyMem_RawCalloc((size_t)n, sizeof(char *));
    const char **nd = PyMem_RawCalloc((size_t)n, sizeof(char *));
    int *p = PyMem_RawCalloc((size_t)n, sizeof(int));
    PyObject *ret = NULL;
    if (h == NULL || p == NULL || nd == NULL) {
        PyErr_NoMemory();
        goto exit;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        h[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(hosts, i));
        p[i] = (int)PyLong_AsLong(PyList_GET_ITEM(ports, i));
        if (h[i] == NULL || (p[i] == -1 && PyErr_Occurred())) {
            goto exit;
        }
        if (nodes != Py_None &&
            (nd[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(nodes, i))) == NULL) {
            goto exit;
        }
    }
    pd_status st;
    char msg[PD_ERRMSG_MAX];
    Py_BEGIN_ALLOW_THREADS
    st = pd_group_connect(self->g, h, p, (uint64_t)token,
                          nodes != Py_None ? nd : NULL, transport, cores);
    if (st != PD_OK) {
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
    }
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        pd_py_set_error(pg_state((PyObject *)self), st, msg);
        goto exit;
    }
    ret = Py_None;
    Py_INCREF(ret);
exit:
    PyMem_RawFree(h);
    PyMem_RawFree(nd);
    PyMem_RawFree(p);
    return ret;
}

/* ------------------------------------------------------ inline collectives */

typedef struct {
    PyThreadState *ts;
} intr_ctx;

/* Polled (without the GIL) while an inline collective waits for late
 * ranks: take the GIL briefly and run the signal handlers. */
static int
py_interrupted(void *arg)
{
    intr_ctx *x = arg;
    PyEval_RestoreThread(x->ts);
    int r = PyErr_CheckSignals() < 0;
    x->ts = PyEval_SaveThread();
    return r;
}

/* Run o on this thread if the group allows.  Returns 0: not eligible (no
 * exception); 1: done; -1: exception set.  On an interrupt the collective
 * goes on in the progress thread: *handoff then holds its work. */
static int
run_inline(PGObject *self, pd_op *o, pd_work **handoff)
{
    pd_status st;
    int ran;
    char msg[PD_ERRMSG_MAX];
    intr_ctx x;
    x.ts = PyEval_SaveThread();
    ran = pd_group_inline(self->g, o, py_interrupted, &x, &st, handoff);
    if (ran && st != PD_OK && st != PD_EINTR) {
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
    }
    PyEval_RestoreThread(x.ts);
    if (!ran) {
        return 0;
    }
    if (st == PD_EINTR) {
        if (!PyErr_Occurred()) {
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        }
        return -1;
    }
    if (st != PD_OK) {
        pd_py_set_error(pg_state((PyObject *)self), st, msg);
        return -1;
    }
    return 1;
}

/* A collective interrupted by a signal still runs: keep its arrays alive
 * (in w) until it ends. */
static void
keep_handoff(PGObject *self, PyObject *w)
{
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    if (PyList_Append(self->handoffs, w) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(exc_type, exc, tb);
}


/* Whether the fast path may run reduction op on dtype dt: valid for the
 * kernels and allowed by torch's CPU (gloo) rules, which also refuse AVG on
 * integers and bool and PRODUCT on complex.  Refused pairs take the Python
 * path, which raises torch's errors. */
static int
fast_op_ok(int dt, long arg)
{
    if (arg < 0 || arg >= PD_NREDOPS ||
        pd_redop_check((pd_dtype)dt, (pd_redop)arg) != PD_OK) {
        return 0;
    }
    if (arg == PD_AVG && dt >= PD_BOOL && dt <= PD_UINT64) {
        return 0;
    }
    if (arg == PD_PRODUCT && (dt == PD_COMPLEX64 || dt == PD_COMPLEX128)) {
        return 0;
    }
    return 1;
}

/* A fast-path collective interrupted by a signal goes on in the progress
 * thread (handoff): a Work keeps the arrays' views (nviews of them, moved
 * there) until it ends.  If that Work cannot be made, the views leak rather
 * than dangle. */
static void
keep_views(PGObject *self, pd_work *handoff, pd_view *views, int nviews,
           int kind)
{
    WorkObject *w = work_alloc(pg_state((PyObject *)self));
    if (w == NULL) {
        return;
    }
    w->w = handoff;
    w->views = nviews > 0 ? PyMem_Calloc((size_t)nviews, sizeof(pd_view))
                          : NULL;
    w->nviews = 0;
    w->ptrs = NULL;
    w->lens = NULL;
    w->keep = NULL;
    w->kind = kind;
    if (w->views != NULL) {
        memcpy(w->views, views, (size_t)nviews * sizeof(pd_view));
        w->nviews = nviews;
    }
    keep_handoff(self, (PyObject *)w);
    Py_DECREF(w);
}

/* The largest group the block fast path serves (its views live on the
 * stack); larger groups take submit. */
#define FAST_MAXN 16

typedef struct {
    pd_view v[2 * FAST_MAXN];
    int n;
} fast_views;

/* One side of a collective for fast_blocks: an array (split into nblocks
 * equal blocks; by whole rows when rows is set, as all_to_all_single
 * splits) or a list/tuple of nblocks arrays, all of dtype *dt (-1: the
 * first's).  Fills ptrs/lens.  0 when the fast path cannot take it; the
 * views acquired so far stay in fv for the caller to release. */
static int
fast_side(PGObject *self, fast_views *fv, PyObject *obj, int nblocks,
          int writable, int rows, int *dt, char **ptrs, size_t *lens)
{
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        for (int i = 0; i < nblocks; i++) {
            /* re-read the length: an exporter's __dlpack__ is Python code */
            if (PySequence_Fast_GET_SIZE(obj) != nblocks ||
                fv->n >= 2 * FAST_MAXN) {
                return 0;
            }
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(obj, i));
            pd_view *v = &fv->v[fv->n];
            int got = pd_view_get_host(self->st, item, writable, v);
            Py_DECREF(item);
            if (!got) {
                return 0;
            }
            fv->n++;
            if (*dt >= 0 && v->dtype != *dt) {
                return 0;
            }
            *dt = v->dtype;
            ptrs[i] = v->ptr;
            lens[i] = v->nbytes;
        }
        return PySequence_Fast_GET_SIZE(obj) == nblocks;
    }
    if (fv->n >= 2 * FAST_MAXN) {
        return 0;
    }
    pd_view *v = &fv->v[fv->n];
    if (!pd_view_get_host(self->st, obj, writable, v)) {
        return 0;
    }
    fv->n++;
    if ((*dt >= 0 && v->dtype != *dt) || v->nbytes % (size_t)nblocks != 0) {
        return 0;
    }
    if (rows) {
        long long r = pd_view_rows(v);
        if (r < 0 || r % nblocks != 0) {
            return 0;
        }
    }
    *dt = v->dtype;
    size_t len = v->nbytes / (size_t)nblocks;
    for (int i = 0; i < nblocks; i++) {
        ptrs[i] = v->ptr + (size_t)i * len;
        lens[i] = len;
    }
    return 1;
}

/* Whether out's shape is in's with the first dimension n times as long (what
 * torch's all_gather_into_tensor takes without question; other shapes go to
 * the Python path, which applies torch's chunking rule or says why not). */
static int
fast_stacked(const pd_view *out, const pd_view *in, int n)
{
    long long os[8], is[8];
    int od = pd_view_shape(out, os, 8), id = pd_view_shape(in, is, 8);
    if (od < 1 || od > 8 || od != id || os[0] != is[0] * n) {
        return 0;
    }
    for (int i = 1; i < od; i++) {
        if (os[i] != is[i]) {
            return 0;
        }
    }
    return 1;
}

/* Whether obj is what a rank outside the root gives for the root's list:
 * None or an empty list/tuple (anything else: the Python path says what is
 * wrong). */
static int
fast_absent(PyObject *obj)
{
    return obj == Py_None ||
           ((PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) &&
            PySequence_Fast_GET_SIZE(obj) == 0);
}

/* Whether any of the n input blocks shares bytes with any output block
 * (all_to_all on one array in place): the Python path copies the input
 * first, since the peers read a rank's input while it writes its output. */
static int
blocks_overlap(char *const *ip, const size_t *il, char *const *op,
               const size_t *ol, int n)
{
    for (int p = 0; p < n; p++) {
        for (int q = 0; q < n; q++) {
            uintptr_t a = (uintptr_t)ip[p], b = (uintptr_t)op[q];
            if (il[p] > 0 && ol[q] > 0 && a < b + ol[q] && b < a + il[p]) {
                return 1;
            }
        }
    }
    return 0;
}

/* PG_fast for the collectives with blocks: reduce (out = the array, arg =
 * op, root), gather (in = the array, out = the root's list, arg = root),
 * scatter (out = the array, in = the root's list, arg = root), all_gather
 * (in = the array, out = a list or one array of world_size blocks),
 * reduce_scatter (out = the array, in = a list or one array, arg = op) and
 * all_to_all (lists, or single arrays split by rows).  The same checks as
 * submit; anything they would refuse is left to the Python path. */
static PyObject *
fast_blocks(PGObject *self, int kind, PyObject *outobj, long arg,
            PyObject *inobj, long root)
{
    int n = self->size, rank = self->rank;
    if (n > FAST_MAXN) {
        Py_RETURN_FALSE;
    }
    if (kind == PD_K_GATHER || kind == PD_K_SCATTER) {
        root = arg;
    }
    if ((kind == PD_K_REDUCE || kind == PD_K_GATHER ||
         kind == PD_K_SCATTER) && (root < 0 || root >= n)) {
        Py_RETURN_FALSE;
    }
    fast_views fv;
    fv.n = 0;
    char *ip[FAST_MAXN] = {0}, *opp[FAST_MAXN] = {0};
    size_t il[FAST_MAXN] = {0}, ol[FAST_MAXN] = {0};
    int dt = -1, ok = 0;
    int inlist = PyList_CheckExact(inobj) || PyTuple_CheckExact(inobj);
    int outlist = PyList_CheckExact(outobj) || PyTuple_CheckExact(outobj);
    const char *name = NULL;
    switch (kind) {
    case PD_K_REDUCE:
        ok = !outlist && fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             fast_op_ok(dt, arg);
        ip[0] = opp[0];
        il[0] = ol[0];
        name = "reduce";
        break;
    case PD_K_GATHER:
        ok = !inlist && fast_side(self, &fv, inobj, 1, 0, 0, &dt, ip, il) &&
             (rank == root ? outlist && fast_side(self, &fv, outobj, n, 1, 0,
                                                  &dt, opp, ol)
                           : fast_absent(outobj));
        name = "gather";
        break;
    case PD_K_SCATTER:
        ok = !outlist &&
             fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             (rank == root ? inlist && fast_side(self, &fv, inobj, n, 0, 0,
                                                 &dt, ip, il)
                           : fast_absent(inobj));
        name = "scatter";
        break;
    case PD_K_ALLGATHER:
        ok = !inlist && fast_side(self, &fv, inobj, 1, 0, 0, &dt, ip, il) &&
             fast_side(self, &fv, outobj, n, 1, 0, &dt, opp, ol) &&
             (outlist || fast_stacked(&fv.v[1], &fv.v[0], n));
        name = outlist ? "all_gather" : "all_gather_into_tensor";
        break;
    case PD_K_REDUCE_SCATTER:
        ok = !outlist &&
             fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             fast_side(self, &fv, inobj, n, 0, 0, &dt, ip, il) &&
             fast_op_ok(dt, arg);
        name = inlist ? "reduce_scatter" : "reduce_scatter_tensor";
        break;
    case PD_K_ALLTOALL:
        ok = inlist == outlist &&
             fast_side(self, &fv, inobj, n, 0, !inlist, &dt, ip, il) &&
             fast_side(self, &fv, outobj, n, 1, !outlist, &dt, opp, ol) &&
             il[rank] == ol[rank] && !blocks_overlap(ip, il, opp, ol, n);
        name = inlist ? "all_to_all" : "all_to_all_single";
        break;
    default:
        break;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    if (ok && kind != PD_K_ALLTOALL) {
        /* every block the size of the one-array side (submit's rule) */
        const pd_kind_info *ki = pd_kind_get(kind);
        size_t want = ki->in == PD_BLK_ONE ? il[0] : ol[0];
        int nin = pd_kind_blocks(kind, 0, rank, (int)root, n);
        int nout = pd_kind_blocks(kind, 1, rank, (int)root, n);
        for (int p = 0; p < nin; p++) {
            ok &= il[p] == want;
        }
        for (int p = 0; p < nout; p++) {
            ok &= ol[p] == want;
        }
        o.count = want / pd_dtype_size((pd_dtype)dt);
    }
    if (!ok) {
        for (int i = 0; i < fv.n; i++) {
            pd_view_release(&fv.v[i]);
        }
        Py_RETURN_FALSE;
    }
    o.kind = (pd_kind)kind;
    o.dtype = (pd_dtype)dt;
    if (kind == PD_K_REDUCE || kind == PD_K_REDUCE_SCATTER) {
        o.op = (pd_redop)arg;
    }
    o.root = (int)root;
    o.in = ip;
    o.out = opp;
    o.in_len = il;
    o.out_len = ol;
    o.nblocks = n;
    pd_strlcpy(o.name, name, sizeof(o.name));
    pd_work *handoff = NULL;
    int rc = run_inline(self, &o, &handoff);
    if (handoff != NULL) {
        keep_views(self, handoff, fv.v, fv.n, kind);
        return NULL; /* KeyboardInterrupt (or another signal's error) */
    }
    for (int i = 0; i < fv.n; i++) {
        pd_view_release(&fv.v[i]);
    }
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

/* fast(kind, array, arg[, input[, root]]): all_reduce (arg = op),
 * broadcast (arg = root), barrier (array None), or a collective with blocks
 * (fast_blocks: array = the output side, input = the input side) of
 * C-contiguous NumPy-like arrays, run on this thread when the group is idle.
 * True: done; False: not handled (nothing happened; use submit).  The
 * Python wrapper calls it first, so a blocking collective costs one C call. */
static PyObject *
PG_fast(PGObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(kind, array, arg[, input[, root]])");
        return NULL;
    }
    if (self->g == NULL) {
        Py_RETURN_FALSE;
    }
    long kind = PyLong_AsLong(args[0]);
    long arg = PyLong_AsLong(args[2]);
    if ((kind == -1 || arg == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    pd_view v;
    int have_view = 0;
    char *ptr = NULL;
    size_t len = 0;
    if (kind != PD_K_ALLREDUCE && kind != PD_K_BROADCAST &&
        kind != PD_K_BARRIER) {
        long root = nargs > 4 ? PyLong_AsLong(args[4]) : 0;
        if (root == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        return fast_blocks(self, (int)kind, args[1], arg,
                           nargs > 3 ? args[3] : Py_None, root);
    }
    if (kind == PD_K_ALLREDUCE || kind == PD_K_BROADCAST) {
        if (!pd_view_get_host(self->st, args[1], 1, &v)) {
            Py_RETURN_FALSE;
        }
        have_view = 1;
        int dt = v.dtype;
        if ((kind == PD_K_ALLREDUCE &&
             (arg < 0 || arg >= PD_NREDOPS ||
              !fast_op_ok(dt, arg))) ||
            (kind == PD_K_BROADCAST && (arg < 0 || arg >= self->size))) {
            pd_view_release(&v);
            Py_RETURN_FALSE;
        }
        o.dtype = (pd_dtype)dt;
        o.count = v.count;
        ptr = v.ptr;
        len = v.nbytes;
        if (kind == PD_K_ALLREDUCE) {
            o.op = (pd_redop)arg;
            pd_strlcpy(o.name, "all_reduce", sizeof(o.name));
        }
        else {
            o.root = (int)arg;
            pd_strlcpy(o.name, "broadcast", sizeof(o.name));
        }
    }
    else if (kind == PD_K_BARRIER) {
        pd_strlcpy(o.name, "barrier", sizeof(o.name));
    }
    else {
        Py_RETURN_FALSE;
    }
    o.kind = (pd_kind)kind;
    o.in = &ptr;
    o.out = &ptr;
    o.in_len = &len;
    o.out_len = &len;
    o.nblocks = 1;
    pd_work *handoff = NULL;
    int rc = run_inline(self, &o, &handoff);
    if (handoff != NULL) {
        keep_views(self, handoff, &v, have_view, (int)kind);
    }
    else if (have_view) {
        pd_view_release(&v);
    }
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

/* Fill ptrs/lens for one side from a tuple of buffers: either one buffer
 * per block, or one buffer split into nblocks (evenly, or by splits). */
static int
fill_side(WorkObject *w, PyObject *bufs, PyObject *splits, int nblocks,
          int writable, char **ptrs, size_t *lens, const char *what,
          const char *opname)
{
    Py_ssize_t nb = PyTuple_GET_SIZE(bufs);
    if (nblocks == 0) {
        return 0;
    }
    if (nb != nblocks && nb != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected %d %s arrays (one per rank) or one array, "
                     "got %zd", opname, nblocks, what, nb);
        return -1;
    }
    pd_module_state *st = pd_state_from_type(Py_TYPE(w));
    for (Py_ssize_t i = 0; i < nb; i++) {
        pd_view *v = &w->views[w->nviews];
        PyObject *obj = PyTuple_GET_ITEM(bufs, i);
        if (pd_view_get(st, obj, writable ? PD_VIEW_WRITABLE : 0, v) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd must be C-contiguous%s", opname,
                         what, i, writable ? " and writable" : "");
            return -1;
        }
        w->nviews++;
        if (v->device != PD_DEV_CPU) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd is on device %s:%d; this process "
                         "group's C core takes CPU memory", opname, what, i,
                         pd_device_name(v->device), v->device_index);
            return -1;
        }
        if (!v->contiguous || (writable && v->readonly)) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd must be C-contiguous%s", opname,
                         what, i, writable ? " and writable" : "");
            return -1;
        }
        if (nb == nblocks) {
            ptrs[i] = v->ptr;
            lens[i] = v->nbytes;
        }
    }
    if (nb == nblocks) {
        return 0;
    }
    /* split one buffer */
    pd_view *v = &w->views[w->nviews - 1];
    size_t total = v->nbytes, off = 0;
    for (int p = 0; p < nblocks; p++) {
        size_t len;
        if (splits != Py_None) {
            len = PyLong_AsSize_t(PyTuple_GET_ITEM(splits, p));
            if (len == (size_t)-1 && PyErr_Occurred()) {
                return -1;
            }
        }
        else {
            if (total % (size_t)nblocks != 0) {
                PyErr_Format(PyExc_ValueError,
                             "%s: %s array of %zu bytes cannot be split into "
                             "%d equal blocks", opname, what, total, nblocks);
                return -1;
            }
            len = total / (size_t)nblocks;
        }
        if (off + len > total) {
            PyErr_Format(PyExc_ValueError,
                         "%s: split sizes exceed the %s array (%zu bytes)",
                         opname, what, total);
            return -1;
        }
        ptrs[p] = v->ptr + off;
        lens[p] = len;
        off += len;
    }
    if (splits != Py_None && off != total) {
        PyErr_Format(PyExc_ValueError,
                     "%s: split sizes add up to %zu bytes but the %s array "
                     "has %zu bytes", opname, off, what, total);
        return -1;
    }
    return 0;
}

static int
check_lens(const size_t *lens, int n, size_t want, const char *what,
           const char *opname)
{
    for (int p = 0; p < n; p++) {
        if (lens[p] != want) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s block %d has %zu bytes, expected %zu", opname,
                         what, p, lens[p], want);
            return -1;
        }
    }
    return 0;
}

static PyObject *
PG_submit(PGObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"kind", "dtype", "op", "root", "tag", "count",
                             "inputs", "outputs", "in_splits", "out_splits",
                             "timeout", "wait_all", "name", "blocking", NULL};
    int kind, dtype, op, root, tag, wait_all, blocking = 0;
    Py_ssize_t count;
    PyObject *ins, *outs, *in_splits, *out_splits;
    double timeout;
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "iiiiinO!O!OOdps|p:submit", kwlist, &kind, &dtype,
            &op, &root, &tag, &count, &PyTuple_Type, &ins, &PyTuple_Type,
            &outs, &in_splits, &out_splits, &timeout, &wait_all, &name,
            &blocking)) {
        return NULL;
    }
    if (pg_check(self) < 0) {
        return NULL;
    }
    pd_module_state *st = pg_state((PyObject *)self);
    if (kind <= PD_K_NONE || kind >= PD_NKINDS ||
        pd_kind_has(kind, PD_KF_INTERNAL) || dtype < 0 ||
        dtype >= PD_NDTYPES || op < 0 || op >= PD_NREDOPS || count < 0) {
        PyErr_SetString(PyExc_ValueError, "submit: invalid kind/dtype/op");
        return NULL;
    }
    int size = self->size, rank = self->rank;
    const pd_kind_info *ki = pd_kind_get(kind);
    int needs_root = (ki->flags & PD_KF_ROOTED) != 0;
    if (needs_root && !(kind == PD_K_RECV && root == -1) &&
        (root < 0 || root >= size)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: rank %d is out of range: expected 0 <= rank < %d",
                     name, root, size);
        return NULL;
    }
    if ((ki->flags & PD_KF_P2P) && root == rank) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d cannot %s itself", name,
                     rank, kind == PD_K_SEND ? "send to" : "receive from");
        return NULL;
    }
    if (in_splits != Py_None && !PyTuple_Check(in_splits)) {
        PyErr_SetString(PyExc_TypeError, "in_splits must be a tuple or None");
        return NULL;
    }
    if (out_splits != Py_None && !PyTuple_Check(out_splits)) {
        PyErr_SetString(PyExc_TypeError, "out_splits must be a tuple or None");
        return NULL;
    }
    if ((ki->flags & PD_KF_REDUCES) &&
        pd_redop_check((pd_dtype)dtype, (pd_redop)op) != PD_OK) {
        return pd_py_set_error(st, PD_ETYPE, pd_errmsg());
    }
    int nin = pd_kind_blocks(kind, 0, rank, root, size);
    int nout = pd_kind_blocks(kind, 1, rank, root, size);
    if (kind == PD_K_ALLREDUCE && PyTuple_GET_SIZE(ins) == 1) {
        nin = 1; /* out of place (internal: _all_reduce_into) */
    }
    if ((in_splits != Py_None && PyTuple_GET_SIZE(in_splits) != nin) ||
        (out_splits != Py_None && PyTuple_GET_SIZE(out_splits) != nout)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: split sizes must have one entry per rank (%d)", name,
                     size);
        return NULL;
    }
    /* a root-only side may be given (and ignored) on the other ranks */
    if ((nin == 0 && PyTuple_GET_SIZE(ins) != 0 &&
         ki->in != PD_BLK_ROOT_ALL) ||
        (nout == 0 && PyTuple_GET_SIZE(outs) != 0 &&
         ki->out != PD_BLK_ROOT_ALL)) {
        PyErr_Format(PyExc_ValueError, "%s: unexpected arrays", name);
        return NULL;
    }
    WorkObject *w = work_alloc(st);
    if (w == NULL) {
        return NULL;
    }
    w->w = NULL;
    w->nviews = 0;
    w->keep = NULL;
    w->kind = kind;
    int nslots = nin + nout + 2;
    w->views = PyMem_Calloc((size_t)(PyTuple_GET_SIZE(ins) +
                                     PyTuple_GET_SIZE(outs) + 1),
                            sizeof(pd_view));
    w->ptrs = PyMem_Calloc((size_t)nslots, sizeof(char *));
    w->lens = PyMem_Calloc((size_t)nslots, sizeof(size_t));
    if (w->views == NULL || w->ptrs == NULL || w->lens == NULL) {
        Py_DECREF(w);
        return PyErr_NoMemory();
    }
    char **ip = w->ptrs, **op_ = w->ptrs + nin + 1;
    size_t *il = w->lens, *ol = w->lens + nin + 1;
    if ((nin && PyTuple_GET_SIZE(ins) > 0 &&
         fill_side(w, ins, in_splits, nin, 0, ip, il, "input", name) < 0) ||
        (nout && PyTuple_GET_SIZE(outs) > 0 &&
         fill_side(w, outs, out_splits, nout, 1, op_, ol, "output", name) <
             0)) {
        Py_DECREF(w);
        return NULL;
    }
    if ((nin && PyTuple_GET_SIZE(ins) == 0) ||
        (nout && PyTuple_GET_SIZE(outs) == 0)) {
        PyErr_Format(PyExc_ValueError, "%s: missing %s array", name,
                     nin && PyTuple_GET_SIZE(ins) == 0 ? "input" : "output");
        Py_DECREF(w);
        return NULL;
    }
    /* Every length the algorithm relies on is checked here. */
    size_t esz = pd_dtype_size((pd_dtype)dtype);
    size_t want = (size_t)count * esz;
    int bad = 0;
    if (ki->in == PD_BLK_NONE && ki->out == PD_BLK_ONE &&
        !(ki->flags & PD_KF_P2P) && nin == 0) {
        /* in place (broadcast, all_reduce): the output is the input */
        bad = check_lens(ol, 1, want, "output", name);
        ip[0] = op_[0];
        il[0] = ol[0];
    }
    else if (!(ki->flags & (PD_KF_P2P | PD_KF_SPLITS))) {
        bad = check_lens(il, nin, want, "input", name) ||
              check_lens(ol, nout, want, "output", name);
    }
    if (bad) {
        Py_DECREF(w);
        return NULL;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    o.kind = (pd_kind)kind;
    o.dtype = (pd_dtype)dtype;
    o.op = (pd_redop)op;
    o.root = root;
    o.tag = tag;
    o.count = (size_t)count;
    o.in = ip;
    o.out = op_;
    o.in_len = il;
    o.out_len = ol;
    o.nblocks = size;
    o.timeout = timeout;
    o.wait_all = wait_all;
    pd_strlcpy(o.name, name, sizeof(o.name));
    if (blocking) {
        /* small collective on an idle shared-memory group: run it here */
        pd_work *handoff = NULL;
        int rc = run_inline(self, &o, &handoff);
        if (handoff != NULL) {
            w->w = handoff;
            keep_handoff(self, (PyObject *)w);
        }
        if (rc != 0) {
            Py_DECREF(w);
            if (rc < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    pd_status s = pd_group_submit(self->g, &o, &w->w);
    if (s != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        Py_DECREF(w);
        return pd_py_set_error(st, s, msg);
    }
    return (PyObject *)w;
}

static PyObject *
PG_get_port(PGObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->port);
}

static PyObject *
PG_get_rank(PGObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->rank);
}

static PyObject *
PG_get_size(PGObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->size);
}

/* ---------------------------------------------------------- SharedBuffer */

/* Memory that every rank of a shared-memory group maps: exposes this rank's
 * part through the buffer protocol (numpy.frombuffer views it). */
typedef struct {
    PyObject_HEAD
    PGObject *pg;
    void *ptr;
    size_t maplen;
    Py_ssize_t len;
} SharedBufferObject;

/* No tp_clear: the group is needed until the buffer is freed (it forgets
 * the mapping); cycles through a SharedBuffer are broken at its Works. */
static int
SB_traverse(SharedBufferObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->pg);
    return 0;
}

static void
SB_dealloc(SharedBufferObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->ptr != NULL) {
        if (self->pg != NULL && self->pg->g != NULL &&
            (long)getpid() == self->pg->pid) {
            pd_group *g = self->pg->g;
            void *ptr = self->ptr;
            Py_BEGIN_ALLOW_THREADS
            pd_group_shm_forget(g, ptr);
            Py_END_ALLOW_THREADS
        }
        munmap(self->ptr, self->maplen);
        self->ptr = NULL;
    }
    Py_CLEAR(self->pg);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int
SB_getbuffer(SharedBufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 0,
                             flags);
}

static PyObject *
SB_len(SharedBufferObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->len);
}

static PyGetSetDef SB_getset[] = {
    {"nbytes", (getter)SB_len, NULL, "bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot SB_slots[] = {
    {Py_tp_dealloc, SB_dealloc},
    {Py_tp_traverse, SB_traverse},
    {Py_bf_getbuffer, SB_getbuffer},
    {Py_tp_getset, SB_getset},
    {Py_tp_doc, "This rank's part of a buffer in the group's shared memory."},
    {0, NULL},
};

static PyType_Spec SB_spec = {
    .name = "pyddp._C.SharedBuffer",
    .basicsize = sizeof(SharedBufferObject),
    .flags = PD_TPFLAGS_GC,
    .slots = SB_slots,
};

/* shared_alloc(nbytes): collective; every rank gets its own SharedBuffer. */
static PyObject *
PG_shared_alloc(PGObject *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0");
        return NULL;
    }
    if (pg_check(self) < 0) {
        return NULL;
    }
    pd_module_state *st = pg_state((PyObject *)self);
    SharedBufferObject *b = PyObject_GC_New(SharedBufferObject,
                                            st->SharedBufferType);
    if (b == NULL) {
        return NULL;
    }
    b->pg = NULL;
    b->ptr = NULL;
    b->maplen = 0;
    b->len = n;
    PyObject_GC_Track(b);
    pd_status s;
    char msg[PD_ERRMSG_MAX];
    void *ptr = NULL;
    size_t maplen = 0;
    pd_group *g = self->g;
    Py_BEGIN_ALLOW_THREADS
    s = pd_group_shm_alloc(g, (size_t)n, &ptr, &maplen);
    if (s != PD_OK) {
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
    }
    Py_END_ALLOW_THREADS
    if (s != PD_OK) {
        Py_DECREF(b);
        return pd_py_set_error(st, s, msg);
    }
    b->ptr = ptr;
    b->maplen = maplen;
    Py_INCREF(self);
    b->pg = self;
    return (PyObject *)b;
}

static PyObject *
PG_get_transport(PGObject *self, void *Py_UNUSED(closure))
{
    if (self->g == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(pd_group_transport(self->g));
}

static PyObject *
PG_get_single_copy(PGObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->g != NULL && pd_group_single_copy(self->g));
}

static PyObject *
PG_get_shm_fallback(PGObject *self, void *Py_UNUSED(closure))
{
    const char *why = self->g != NULL ? pd_group_shm_fallback(self->g) : NULL;
    if (why == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(why);
}

static PyObject *
PG_get_error(PGObject *self, void *Py_UNUSED(closure))
{
    char msg[PD_ERRMSG_MAX];
    if (self->g == NULL || pd_group_error(self->g, msg, sizeof(msg)) == PD_OK) {
        Py_RETURN_NONE;
    }
    /* may quote a peer's abort text: any bytes */
    return PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
}

/* ------------------------------------------------------ flight recorder */

static PyObject *
fr_entry_dict(const pd_fr_entry *e)
{
    return Py_BuildValue(
        "{s:K,s:K,s:s,s:s,s:s,s:s,s:i,s:K,s:K,s:s,s:s,s:s,s:s,s:s,s:d,s:d,"
        "s:d}",
        "id",
        (unsigned long long)e->id, "seq", (unsigned long long)e->seq, "name",
        e->name, "kind", pd_kind_name(e->kind), "dtype",
        pd_dtype_name((pd_dtype)e->dtype), "op",
        pd_redop_name((pd_redop)e->op), "root", (int)e->root, "count",
        (unsigned long long)e->count, "bytes", (unsigned long long)e->bytes,
        "backend", "cpu", "transport", pd_path_name(e->path), "algorithm",
        pd_algo_name(e->algo), "state", pd_fr_state_name(e->state), "status",
        e->state >= PD_FR_COMPLETED ? pd_status_name((pd_status)e->status)
                                    : "",
        "t_enqueued", e->t_enqueued, "t_started", e->t_started, "t_ended",
        e->t_ended);
}

static PyObject *
PG_flight_records(PGObject *self, PyObject *Py_UNUSED(ignored))
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    size_t cap = pd_group_flight_capacity(self->g);
    pd_fr_entry *buf = cap ? PyMem_Malloc(cap * sizeof(pd_fr_entry)) : NULL;
    if (cap && buf == NULL) {
        return PyErr_NoMemory();
    }
    size_t n = cap ? pd_group_flight_records(self->g, buf, cap) : 0;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = fr_entry_dict(&buf[i]);
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    PyMem_Free(buf);
    return list;
}

static PyObject *
PG_explain(PGObject *self, PyObject *args)
{
    int kind, dtype;
    unsigned long long count;
    if (!PyArg_ParseTuple(args, "iiK:explain", &kind, &dtype, &count) ||
        pg_check(self) < 0) {
        return NULL;
    }
    int path = 0, algo = 0;
    pd_status st = pd_group_explain(self->g, kind, dtype, (size_t)count,
                                    &path, &algo);
    if (st != PD_OK) {
        return pd_py_set_error(pg_state((PyObject *)self), st, pd_errmsg());
    }
    return Py_BuildValue("(ss)", pd_path_name(path), pd_algo_name(algo));
}

static PyObject *
PG_flight_configure(PGObject *self, PyObject *args)
{
    const char *path = NULL, *meta = NULL;
    if (!PyArg_ParseTuple(args, "zz:flight_recorder_configure", &path,
                          &meta) ||
        pg_check(self) < 0) {
        return NULL;
    }
    pd_status st = pd_group_flight_configure(self->g, path, meta);
    if (st != PD_OK) {
        return pd_py_set_error(pg_state((PyObject *)self), st, pd_errmsg());
    }
    Py_RETURN_NONE;
}

/* A byte count of set_rules: an int >= 0 that fits a size_t (not a bool);
 * -1 without an exception set otherwise. */
static int
rules_size(PyObject *v, size_t *out)
{
    unsigned long long x = PyLong_Check(v) && !PyBool_Check(v)
                               ? PyLong_AsUnsignedLongLong(v)
                               : (unsigned long long)-1;
    if (PyErr_Occurred() || !PyLong_Check(v) || PyBool_Check(v) ||
        x >= (unsigned long long)((size_t)-1)) {
        PyErr_Clear();
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

/* One table of set_rules: a sequence with an entry per kind, each an int
 * >= 0 (bytes; 0: the default) or None (never); with lo/hi (cma_from) also
 * (from, gap_lo, gap_hi): single copies from `from` bytes but the banks
 * again in [gap_lo, gap_hi). */
static int
rules_arg(PyObject *seq, size_t *out, size_t *lo, size_t *hi,
          const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "set_rules: expected a sequence");
    if (fast == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != PD_NKINDS) {
        PyErr_Format(PyExc_ValueError, "set_rules: %s must have %d entries "
                     "(one per kind, pyddp._C.KINDS), got %zd", what,
                     PD_NKINDS, n);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = PySequence_Fast_GET_ITEM(fast, k);
        int ok = 0;
        if (lo != NULL) {
            lo[k] = hi[k] = 0;
        }
        if (v == Py_None) {
            out[k] = (size_t)-1;
            ok = 1;
        }
        else if (lo != NULL && PyTuple_Check(v) && PyTuple_GET_SIZE(v) == 3) {
            ok = rules_size(PyTuple_GET_ITEM(v, 0), &out[k]) == 0 &&
                 rules_size(PyTuple_GET_ITEM(v, 1), &lo[k]) == 0 &&
                 rules_size(PyTuple_GET_ITEM(v, 2), &hi[k]) == 0 &&
                 lo[k] < hi[k];
        }
        else {
            ok = rules_size(v, &out[k]) == 0;
        }
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "set_rules: %s[%zd] must be an int "
                         ">= 0 (bytes; 0: the default)%s or None (never), "
                         "got %R", what, k,
                         lo != NULL ? ", a tuple (from, gap_lo, gap_hi) of "
                                      "them with gap_lo < gap_hi,"
                                    : "",
                         v);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* set_rules / set_slow_rules: the two tables parsed, then the group's. */
static PyObject *
set_rules_common(PGObject *self, PyObject *cma, PyObject *small, int slow,
                 double phase_ns)
{
    size_t a[PD_NKINDS], b[PD_NKINDS], lo[PD_NKINDS], hi[PD_NKINDS];
    if (pg_check(self) < 0 || rules_arg(cma, a, lo, hi, "cma_from") < 0 ||
        rules_arg(small, b, NULL, NULL, "small_bytes") < 0) {
        return NULL;
    }
    for (int k = 0; k < PD_NKINDS; k++) {
        if (b[k] == (size_t)-1) {
            PyErr_Format(PyExc_ValueError, "set_rules: small_bytes[%d] must "
                         "be an int >= 0, got None", k);
            return NULL;
        }
    }
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = slow ? pd_group_set_slow_rules(self->g, a, b, lo, hi, PD_NKINDS,
                                        phase_ns)
              : pd_group_set_rules(self->g, a, b, lo, hi, PD_NKINDS);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return pd_py_set_error(pg_state((PyObject *)self), st, pd_errmsg());
    }
    Py_RETURN_NONE;
}

static PyObject *
PG_set_rules(PGObject *self, PyObject *args)
{
    PyObject *cma, *small;
    if (!PyArg_ParseTuple(args, "OO:set_rules", &cma, &small)) {
        return NULL;
    }
    return set_rules_common(self, cma, small, 0, -1);
}

static PyObject *
PG_set_slow_rules(PGObject *self, PyObject *args)
{
    PyObject *cma, *small;
    double phase_ns;
    if (!PyArg_ParseTuple(args, "OOd:set_slow_rules", &cma, &small,
                          &phase_ns)) {
        return NULL;
    }
    if (!(phase_ns >= 0) || phase_ns > 1e9) {
        PyErr_Format(PyExc_ValueError, "set_slow_rules: phase_ns must be a "
                     "number of ns in [0, 1e9] (0: no phases), got %g",
                     phase_ns);
        return NULL;
    }
    return set_rules_common(self, cma, small, 1, phase_ns);
}

static PyObject *
PG_probe_phase(PGObject *self, PyObject *Py_UNUSED(ignored))
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    double ns;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_group_probe_phase(self->g, &ns);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return pd_py_set_error(pg_state((PyObject *)self), st, pd_errmsg());
    }
    if (ns > 0) {
        return PyFloat_FromDouble(ns);
    }
    Py_RETURN_NONE;
}

/* (cma_from, small_bytes) of one table, as in force. */
static PyObject *
rules_tuple(PGObject *self, int slow)
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    PyObject *cma = PyTuple_New(PD_NKINDS), *small = PyTuple_New(PD_NKINDS);
    if (cma == NULL || small == NULL) {
        Py_XDECREF(cma);
        Py_XDECREF(small);
        return NULL;
    }
    for (int k = 0; k < PD_NKINDS; k++) {
        size_t a, b, lo, hi;
        pd_group_rules_in_force(self->g, slow, k, &a, &b, &lo, &hi);
        PyObject *x = a == (size_t)-1 ? Py_NewRef(Py_None)
                      : lo < hi       ? Py_BuildValue("(nnn)", (Py_ssize_t)a,
                                                      (Py_ssize_t)lo,
                                                      (Py_ssize_t)hi)
                                      : PyLong_FromSize_t(a);
        PyObject *y = PyLong_FromSize_t(b);
        if (x == NULL || y == NULL) {
            Py_XDECREF(x);
            Py_XDECREF(y);
            Py_DECREF(cma);
            Py_DECREF(small);
            return NULL;
        }
        PyTuple_SET_ITEM(cma, k, x);
        PyTuple_SET_ITEM(small, k, y);
    }
    return Py_BuildValue("(NN)", cma, small);
}

static PyObject *
PG_get_rules(PGObject *self, void *Py_UNUSED(closure))
{
    return rules_tuple(self, 0);
}

static PyObject *
PG_get_slow_rules(PGObject *self, void *Py_UNUSED(closure))
{
    return rules_tuple(self, 1);
}

static PyObject *
PG_get_phase(PGObject *self, void *Py_UNUSED(closure))
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    int phase;
    double probe_ns, phase_ns;
    uint64_t probes;
    pd_group_phase(self->g, &phase, &probe_ns, &phase_ns, &probes);
    PyObject *last = probe_ns > 0 ? PyFloat_FromDouble(probe_ns)
                                  : Py_NewRef(Py_None);
    if (last == NULL) {
        return NULL;
    }
    return Py_BuildValue("{s:s,s:N,s:d,s:K}", "phase",
                         phase ? "slow" : "fast", "probe_ns", last,
                         "phase_ns", phase_ns, "probes",
                         (unsigned long long)probes);
}

static PyObject *
PG_flight_dump(PGObject *self, PyObject *args)
{
    const char *path = NULL, *reason = "on demand";
    if (!PyArg_ParseTuple(args, "z|s:flight_recorder_dump", &path, &reason) ||
        pg_check(self) < 0) {
        return NULL;
    }
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_group_flight_dump(self->g, path, reason);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return pd_py_set_error(pg_state((PyObject *)self), st, pd_errmsg());
    }
    Py_RETURN_NONE;
}

static PyObject *
PG_set_timeline_track(PGObject *self, PyObject *arg)
{
    long tid = PyLong_AsLong(arg);
    if ((tid == -1 && PyErr_Occurred()) || pg_check(self) < 0) {
        return NULL;
    }
    pd_group_set_timeline_track(self->g, (int)tid);
    Py_RETURN_NONE;
}

static PyGetSetDef PG_getset[] = {
    {"error", (getter)PG_get_error, NULL,
     "None, or the group's sticky error (a dead peer, a mismatch, ...)",
     NULL},
    {"transport", (getter)PG_get_transport, NULL,
     "how collectives move: 'shm', 'tcp' or 'local'", NULL},
    {"single_copy", (getter)PG_get_single_copy, NULL,
     "True when large messages move with one copy between the ranks "
     "(cross-memory attach; PYDDP_CMA, PYDDP_CMA_THRESHOLD)", NULL},
    {"rules", (getter)PG_get_rules, NULL,
     "(cma_from, small_bytes): per kind (pyddp._C.KINDS), the bytes from "
     "which single copies run (None: never; (from, gap_lo, gap_hi): the "
     "banks again in [gap_lo, gap_hi)) and up to which direct "
     "algorithms run over the transport, as in force",
     NULL},
    {"slow_rules", (getter)PG_get_slow_rules, NULL,
     "the same for the machine's slow phase (set_slow_rules)", NULL},
    {"phase", (getter)PG_get_phase, NULL,
     "{'phase': 'fast' or 'slow' (the rules in force), 'probe_ns': rank "
     "0's last probe of the handoff between cores (None: none or "
     "unanswered), 'phase_ns': the threshold (0: no phases), 'probes'}",
     NULL},
    {"shm_fallback", (getter)PG_get_shm_fallback, NULL,
     "None, or why shared memory could not be set up (collectives use TCP)",
     NULL},
    {"port", (getter)PG_get_port, NULL, "listening port (before connect)",
     NULL},
    {"rank", (getter)PG_get_rank, NULL, "this rank", NULL},
    {"size", (getter)PG_get_size, NULL, "number of ranks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef PG_methods[] = {
    {"connect", (PyCFunction)PG_connect, METH_VARARGS,
     "connect(hosts, ports, token): build the mesh, start progress."},
    {"cancel_connect", (PyCFunction)PG_cancel_connect, METH_O,
     "cancel_connect(why): from another thread, make a running connect() "
     "fail soon with DistBackendError(why)."},
    {"shared_alloc", (PyCFunction)PG_shared_alloc, METH_O,
     "shared_alloc(nbytes) -> SharedBuffer (collective, shm groups)."},
    {"fast", (PyCFunction)(void (*)(void))PG_fast, METH_FASTCALL,
     "fast(kind, array, arg[, input[, root]]) -> bool: run a blocking "
     "collective here if the group is idle."},
    {"submit", (PyCFunction)(void (*)(void))PG_submit,
     METH_VARARGS | METH_KEYWORDS, "submit an operation; returns a Work."},
    {"explain", (PyCFunction)PG_explain, METH_VARARGS,
     "explain(kind, dtype, count) -> (transport, algorithm): what a "
     "collective of count elements (one rank's block; all_to_all: its "
     "longest) would run with now, as coll/select.c decides when it runs; "
     "runs nothing"},
    {"flight_records", (PyCFunction)PG_flight_records, METH_NOARGS,
     "flight_records() -> list of dicts: the flight recorder's records, "
     "oldest first."},
    {"flight_recorder_configure", (PyCFunction)PG_flight_configure,
     METH_VARARGS,
     "flight_recorder_configure(path, meta_json): dump there when the "
     "group fails (None: nowhere)."},
    {"flight_recorder_dump", (PyCFunction)PG_flight_dump, METH_VARARGS,
     "flight_recorder_dump(path=None, reason='on demand'): write the "
     "records as JSON now."},
    {"set_rules", (PyCFunction)PG_set_rules, METH_VARARGS,
     "set_rules(cma_from, small_bytes): the group's rules of algorithm "
     "choice, one entry per kind (0: the default; cma_from None: never, "
     "or (from, gap_lo, gap_hi): the banks again in [gap_lo, gap_hi)); "
     "between collectives, the same on every rank."},
    {"probe_phase", (PyCFunction)PG_probe_phase, METH_NOARGS,
     "probe_phase() -> float or None: every rank at the same point (after "
     "a barrier); rank 0 gets the one-way handoff of a cache line between "
     "ranks 0 and 1 in ns (the probe that switches the phases' rules), "
     "the others None."},
    {"set_slow_rules", (PyCFunction)PG_set_slow_rules, METH_VARARGS,
     "set_slow_rules(cma_from, small_bytes, phase_ns): rules for the "
     "machine's slow phase, which every rank uses from the collective "
     "after rank 0 probes a cache line's handoff between cores above "
     "phase_ns (0: no phases); as set_rules otherwise."},
    {"set_timeline_track", (PyCFunction)PG_set_timeline_track, METH_O,
     "set_timeline_track(tid): this group's track in the timeline."},
    {"fail", (PyCFunction)PG_fail, METH_O,
     "fail(msg): make msg the group's error and tell every peer (a device "
     "backend of the same ranks failed); nothing once the group failed."},
    {"destroy", (PyCFunction)PG_destroy, METH_NOARGS,
     "stop the progress thread, say goodbye to peers, free everything."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PG_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PGObject, weakrefs), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot PG_slots[] = {
    {Py_tp_members, PG_members},
    {Py_tp_new, PG_new},
    {Py_tp_dealloc, PG_dealloc},
    {Py_tp_traverse, PG_traverse},
    {Py_tp_clear, PG_clear},
    {Py_tp_methods, PG_methods},
    {Py_tp_getset, PG_getset},
    {Py_tp_doc, "ProcessGroup(rank, size, timeout, secret=None, "
                "bind_host=None): one member of a pyddp process group (C "
                "core); its transport listens on bind_host (None or '': all "
                "interfaces)."},
    {0, NULL},
};

static PyType_Spec PG_spec = {
    .name = "pyddp._C.ProcessGroup",
    .basicsize = sizeof(PGObject),
    .flags = PD_TPFLAGS_GC,
    .slots = PG_slots,
};

int
pd_group_add_types(PyObject *m, pd_module_state *st)
{
    st->WorkType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Work_spec,
                                                            NULL);
    if (st->WorkType == NULL ||
        PyModule_AddObjectRef(m, "Work", (PyObject *)st->WorkType) < 0) {
        return -1;
    }
    st->SharedBufferType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &SB_spec, NULL);
    if (st->SharedBufferType == NULL ||
        PyModule_AddObjectRef(m, "SharedBuffer",
                              (PyObject *)st->SharedBufferType) < 0) {
        return -1;
    }
    st->ProcessGroupType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &PG_spec, NULL);
    if (st->ProcessGroupType == NULL ||
        PyModule_AddObjectRef(m, "ProcessGroup",
                              (PyObject *)st->ProcessGroupType) < 0) {
        return -1;
    }
    return 0;
}
