/* Backend "mpi"'s binding: _C.MpiComm over the core in csrc/mpi/ (comm.h:
 * why the check and the small blocking collectives call MPI from C, and how
 * the library mpi4py loaded is found and called).  Here: arguments, the
 * GIL (released around every MPI call that may block; taken back every
 * 50 ms of a check's wait to run signal handlers), the fallback to the
 * Python fast path, and the exceptions.
 *
 * What is not handled here (other kinds, other arrays) goes to the Python
 * fast path given at construction, so one call serves every collective. */
#include "binding.h"

#include "../group/flight.h"
#include "../mpi/comm.h"
#include "../util/kinds.h"
#include "../util/status.h"

#include "../kernels/kernels.h"

#include <stdint.h>
#include <string.h>

/* ---------------------------------------------------------------- the type */

typedef struct {
    PyObject_HEAD
    pd_module_state *st;
    PyObject *fallback;     /* the Python fast path */
    PyObject *on_failure;   /* raises the DistBackendError */
    PyObject *recorder;     /* the backend's _C.FlightRecorder, or NULL */
    pd_fr *fr;              /* its ring: the fast path's calls recorded */
    int via;
    pd_mpi_comm c;
} MpiCommObject;

static int
handle_of(PyObject *o, intptr_t *out, const char *what)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "MpiComm: %s must be an int handle",
                     what);
        return -1;
    }
    *out = (intptr_t)v;
    return 0;
}

/* MpiComm(handle_size, coll, aux, in_place, sig_type, types, ops, rank,
 *         size, check, timeout, fallback, on_failure[, recorder, via])
 * types: {dtype code: handle}; ops: {(dtype code, op code): handle};
 * recorder: a _C.FlightRecorder the fast path's calls are noted in (as via,
 * its flight_via number), or None. */
static PyObject *
MpiComm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"handle_size", "coll", "aux", "in_place", "sig_type",
                         "types", "ops", "rank", "size", "check",
                         "timeout", "fallback", "on_failure", "recorder",
                         "via", NULL};
    int hsize, rank, size, check, via = 0;
    double timeout;
    PyObject *coll, *aux, *inp, *sigt, *types, *ops, *fb, *onf;
    PyObject *rec = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOO!O!iipdOO|Oi", kw,
                                     &hsize, &coll, &aux, &inp, &sigt,
                                     &PyDict_Type, &types, &PyDict_Type, &ops,
                                     &rank, &size, &check, &timeout, &fb,
                                     &onf, &rec, &via)) {
        return NULL;
    }
    pd_module_state *st = pd_state_from_type(type);
    pd_fr *fr = rec == Py_None ? NULL : pd_py_flight_recorder(rec, st);
    if (rec != Py_None && fr == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "MpiComm: recorder must be a FlightRecorder or None");
        return NULL;
    }
    if (hsize != 4 && hsize != 8) {
        PyErr_Format(PyExc_ValueError,
                     "MpiComm: handle_size must be 4 or 8, got %d", hsize);
        return NULL;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        PyErr_Format(PyExc_ValueError,
                     "MpiComm: rank %d out of range for size %d", rank, size);
        return NULL;
    }
    if (!PyCallable_Check(fb) || !PyCallable_Check(onf)) {
        PyErr_SetString(PyExc_TypeError,
                        "MpiComm: fallback and on_failure must be callable");
        return NULL;
    }
    pd_status s = pd_mpi_load(hsize == 4);
    if (s != PD_OK) {
        return pd_py_set_error(st, s, pd_errmsg());
    }
    MpiCommObject *self = (MpiCommObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->st = st;
    self->c.rank = rank;
    self->c.size = size;
    self->c.check = check;
    self->c.timeout = timeout;
    self->fallback = Py_NewRef(fb);
    self->on_failure = Py_NewRef(onf);
    if (fr != NULL) {
        self->recorder = Py_NewRef(rec);
        self->fr = fr;
        self->via = via;
    }
    if (pd_mpi_comm_init(&self->c) != PD_OK) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (handle_of(coll, &self->c.coll, "coll") < 0 ||
        handle_of(aux, &self->c.aux, "aux") < 0 ||
        handle_of(inp, &self->c.in_place, "in_place") < 0 ||
        handle_of(sigt, &self->c.sig_type, "sig_type") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(types, &pos, &k, &v)) {
        long code = PyLong_AsLong(k);
        intptr_t h;
        if ((code == -1 && PyErr_Occurred()) || code < 0 || code >= PD_MPI_NDT ||
            handle_of(v, &h, "a datatype") < 0) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError,
                             "MpiComm: dtype code %ld out of range", code);
            }
            Py_DECREF(self);
            return NULL;
        }
        self->c.types[code] = h;
    }
    pos = 0;
    while (PyDict_Next(ops, &pos, &k, &v)) {
        long code, op;
        intptr_t h;
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2 ||
            ((code = PyLong_AsLong(PyTuple_GET_ITEM(k, 0))) == -1 &&
             PyErr_Occurred()) ||
            ((op = PyLong_AsLong(PyTuple_GET_ITEM(k, 1))) == -1 &&
             PyErr_Occurred()) ||
            code < 0 || code >= PD_MPI_NDT || op < 0 || op >= PD_MPI_NOPS ||
            handle_of(v, &h, "an op") < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "MpiComm: ops keys must be (dtype code, op "
                                "code) in range");
            }
            Py_DECREF(self);
            return NULL;
        }
        self->c.ops[code][op] = h;
    }
    return (PyObject *)self;
}

static int
MpiComm_traverse(MpiCommObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fallback);
    Py_VISIT(self->on_failure);
    Py_VISIT(self->recorder);
    return 0;
}

static int
MpiComm_clear(MpiCommObject *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->on_failure);
    /* the ring stays until dealloc (fr points into it) */
    return 0;
}

static void
MpiComm_dealloc(MpiCommObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    MpiComm_clear(self);
    self->fr = NULL;
    Py_CLEAR(self->recorder);
    pd_mpi_comm_free(&self->c);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------- the check */

/* The check's waits (pd_mpi_waiter): the GIL released meanwhile, taken back
 * every 50 ms to run signal handlers (Ctrl-C). */
static void
wait_enter(void *ctx)
{
    *(PyThreadState **)ctx = PyEval_SaveThread();
}

static void
wait_leave(void *ctx)
{
    PyEval_RestoreThread(*(PyThreadState **)ctx);
}

static int
wait_interrupted(void *ctx)
{
    PyEval_RestoreThread(*(PyThreadState **)ctx);
    int sig = PyErr_CheckSignals();
    *(PyThreadState **)ctx = PyEval_SaveThread();
    return sig < 0;
}

/* The signature check of one collective: PD_MPI_OK, or a failure outcome
 * (*mpi_err set for PD_MPI_ERROR; an exception set for
 * PD_MPI_INTERRUPTED). */
static int
run_check(MpiCommObject *self, int kind, int dtype, long op, long root,
          long long count, double timeout, int *mpi_err)
{
    PyThreadState *ts = NULL;
    pd_mpi_waiter w = {wait_enter, wait_leave, wait_interrupted, &ts};
    return pd_mpi_check(&self->c, kind, dtype, op, root, count, timeout,
                        mpi_err, &w);
}

/* Hand a failure of the fast path to the Python layer, whose
 * on_failure(what, status, mpi_text) raises the DistBackendError (and marks
 * the group failed).  A Ctrl-C keeps its KeyboardInterrupt. */
static PyObject *
failure(MpiCommObject *self, const char *what, int status, int mpi_err)
{
    if (status == PD_MPI_INTERRUPTED) {
        return NULL; /* the signal handler's exception */
    }
    char text[4096] = "";
    if (status == PD_MPI_ERROR || status == PD_MPI_CALL_ERROR) {
        pd_mpi_error_text(mpi_err, text, sizeof(text));
    }
    self->c.failed = 1;
    PyObject *r = PyObject_CallFunction(self->on_failure, "sis", what, status,
                                        text);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Format(self->st->DistBackendError, "%s on backend 'mpi' failed",
                 what);
    return NULL;
}

/* check(kind, dtype, op, root, count, timeout) -> (status, MPI error text):
 * the general path's signature check. */
static PyObject *
MpiComm_check(MpiCommObject *self, PyObject *args)
{
    int kind, dtype;
    long op, root;
    long long count;
    double timeout;
    if (!PyArg_ParseTuple(args, "iillLd", &kind, &dtype, &op, &root, &count,
                          &timeout)) {
        return NULL;
    }
    if (self->c.failed) { /* its communicators may be freed (destroy) */
        PyErr_SetString(self->st->DistBackendError,
                        "backend 'mpi': this group failed or was destroyed");
        return NULL;
    }
    int err = 0;
    int s = run_check(self, kind, dtype, op, root, count, timeout, &err);
    if (s == PD_MPI_INTERRUPTED) {
        return NULL;
    }
    char text[4096] = "";
    if (s == PD_MPI_ERROR) {
        pd_mpi_error_text(err, text, sizeof(text));
    }
    return Py_BuildValue("is", s, text);
}

/* -------------------------------------------------------------- fast path */

/* The fast path's flight records (nothing without a recorder). */
static uint64_t
fr_note(MpiCommObject *self, int kind, int dtype, long op, long root,
        size_t count, const char *name)
{
    if (self->fr == NULL) {
        return 0;
    }
    size_t esz = dtype >= 0 ? pd_dtype_size((pd_dtype)dtype) : 0;
    return pd_fr_note(self->fr, self->via, kind, dtype < 0 ? 0 : dtype,
                      (int)op, (int)root, (uint64_t)count,
                      (uint64_t)count * esz, name, 1);
}

static void
fr_set(MpiCommObject *self, uint64_t id, int state, int outcome)
{
    if (id == 0) {
        return;
    }
    pd_status st = PD_OK;
    if (state == PD_FR_FAILED) {
        st = outcome == PD_MPI_TIMEOUT       ? PD_ETIMEOUT
             : outcome == PD_MPI_MISMATCH    ? PD_EMISMATCH
             : outcome == PD_MPI_INTERRUPTED ? PD_EINTR
                                             : PD_EBACKEND;
    }
    pd_fr_update(self->fr, id, state, st);
}

/* fast(kind, array, arg[, input[, root]]): pyddp's fast protocol (see
 * group_fast.c's pd_pg_fast).  all_reduce (in place), broadcast and
 * barrier of a C-contiguous CPU array of a type MPI reduces natively run
 * here; anything else goes to the Python fast path. */
static PyObject *
MpiComm_fast(MpiCommObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(kind, array, arg[, input[, root]])");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (self->c.failed ||
        (kind != PD_K_ALLREDUCE && kind != PD_K_BROADCAST &&
         kind != PD_K_BARRIER) ||
        (kind == PD_K_BARRIER) != (args[1] == Py_None) ||
        (nargs > 3 && args[3] != Py_None)) {
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    long arg = PyLong_AsLong(args[2]);
    if (arg == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    int err = 0, s;
    uint64_t fid;
    if (kind == PD_K_BARRIER) {
        fid = fr_note(self, PD_K_BARRIER, 0, 0, 0, 0, "barrier");
        s = self->c.check && self->c.size > 1
                ? run_check(self, PD_K_BARRIER, 0, 0, 0, 0, 0.0, &err)
                : PD_MPI_OK;
        if (s != PD_MPI_OK) {
            fr_set(self, fid, PD_FR_FAILED, s);
            return failure(self, "barrier", s, err);
        }
        fr_set(self, fid, PD_FR_STARTED, 0);
        Py_BEGIN_ALLOW_THREADS
        err = pd_mpi_barrier(&self->c);
        Py_END_ALLOW_THREADS
        if (err != 0) {
            fr_set(self, fid, PD_FR_FAILED, PD_MPI_CALL_ERROR);
            return failure(self, "barrier", PD_MPI_CALL_ERROR, err);
        }
        fr_set(self, fid, PD_FR_COMPLETED, 0);
        Py_RETURN_TRUE;
    }
    pd_view v;
    if (!pd_view_get_host(self->st, args[1], 1, &v)) {
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    intptr_t dt = v.dtype < PD_MPI_NDT ? self->c.types[v.dtype] : 0;
    intptr_t mop = 0;
    if (kind == PD_K_ALLREDUCE && dt != 0 && arg >= 0 && arg < PD_MPI_NOPS) {
        mop = self->c.ops[v.dtype][arg];
    }
    if (dt == 0 || v.count > INT32_MAX ||
        (kind == PD_K_ALLREDUCE ? mop == 0 : (arg < 0 || arg >= self->c.size))) {
        pd_view_release(&v);
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    const char *what = kind == PD_K_ALLREDUCE ? "all_reduce" : "broadcast";
    fid = kind == PD_K_ALLREDUCE
              ? fr_note(self, (int)kind, v.dtype, arg, 0, v.count, what)
              : fr_note(self, (int)kind, v.dtype, 0, arg, v.count, what);
    if (self->c.check && self->c.size > 1) {
        s = kind == PD_K_ALLREDUCE
                ? run_check(self, (int)kind, v.dtype, arg, 0,
                            (long long)v.count, 0.0, &err)
                : run_check(self, (int)kind, v.dtype, 0, arg,
                            (long long)v.count, 0.0, &err);
        if (s != PD_MPI_OK) {
            pd_view_release(&v);
            fr_set(self, fid, PD_FR_FAILED, s);
            return failure(self, what, s, err);
        }
    }
    fr_set(self, fid, PD_FR_STARTED, 0);
    int n = (int)v.count;
    void *p = v.ptr;
    Py_BEGIN_ALLOW_THREADS
    if (kind == PD_K_ALLREDUCE) {
        err = pd_mpi_allreduce_inplace(&self->c, p, n, dt, mop);
    }
    else {
        err = pd_mpi_bcast(&self->c, p, n, dt, (int)arg);
    }
    Py_END_ALLOW_THREADS
    pd_view_release(&v);
    if (err != 0) {
        fr_set(self, fid, PD_FR_FAILED, PD_MPI_CALL_ERROR);
        return failure(self, what, PD_MPI_CALL_ERROR, err);
    }
    fr_set(self, fid, PD_FR_COMPLETED, 0);
    Py_RETURN_TRUE;
}

static PyObject *
MpiComm_set_failed(MpiCommObject *self, PyObject *Py_UNUSED(ignored))
{
    self->c.failed = 1;
    Py_RETURN_NONE;
}

static PyObject *
MpiComm_get_seq(MpiCommObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(self->c.seq);
}

static PyObject *
MpiComm_get_sig(MpiCommObject *self, void *closure)
{
    (void)closure;
    return PyBytes_FromStringAndSize((const char *)self->c.sig,
                                     2 * PD_MPI_SIGN * sizeof(int64_t));
}

static PyMethodDef MpiComm_methods[] = {
    {"fast", (PyCFunction)(void (*)(void))MpiComm_fast, METH_FASTCALL,
     "fast(kind, array, arg[, input[, root]]) -> bool: pyddp's fast "
     "protocol; all_reduce, broadcast and barrier called from C"},
    {"check", (PyCFunction)MpiComm_check, METH_VARARGS,
     "check(kind, dtype, op, root, count, timeout) -> (status, mpi_text): "
     "the signature check (0 ok, 1 MPI error, 2 timeout, 3 mismatch)"},
    {"set_failed", (PyCFunction)MpiComm_set_failed, METH_NOARGS,
     "the group failed or was destroyed: fast() hands every later call to "
     "the Python path, check() refuses"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MpiComm_getset[] = {
    {"seq", (getter)MpiComm_get_seq, NULL,
     "sequence number of the last checked collective", NULL},
    {"sig", (getter)MpiComm_get_sig, NULL,
     "the last signature sent (12 int64: the fields, then their negations)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot MpiComm_slots[] = {
    {Py_tp_new, MpiComm_new},
    {Py_tp_dealloc, MpiComm_dealloc},
    {Py_tp_traverse, MpiComm_traverse},
    {Py_tp_clear, MpiComm_clear},
    {Py_tp_methods, MpiComm_methods},
    {Py_tp_getset, MpiComm_getset},
    {Py_tp_doc, "MpiComm(...): backend mpi's signature check and small "
                "blocking collectives, called from C on the MPI library "
                "mpi4py loaded (pyddp/distributed/backends/mpi/backend.py makes it)"},
    {0, NULL},
};

static PyType_Spec MpiComm_spec = {
    .name = "pyddp._C.MpiComm",
    .basicsize = sizeof(MpiCommObject),
    .flags = PD_TPFLAGS_GC,
    .slots = MpiComm_slots,
};

int
pd_mpi_add_types(PyObject *m, pd_module_state *st)
{
    (void)st;
    PyObject *t = PyType_FromModuleAndSpec(m, &MpiComm_spec, NULL);
    if (t == NULL) {
        return -1;
    }
    int rc = PyModule_AddObjectRef(m, "MpiComm", t);
    Py_DECREF(t);
    return rc;
}
