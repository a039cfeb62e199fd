/* Flight-recorder rings (csrc/group/flight.h) from Python: a ring's records
 * as dicts, and the calls of a device backend noted in a ring (the
 * ProcessGroup's ring, group_flight.c, and _C.FlightRecorder share these);
 * _C.FlightRecorder, a ring without a group, for a backend that keeps none
 * ("mpi"): the same records, dumps and timeline slices as a group's. */
#include "binding.h"

#include "../coll/coll.h"
#include "../group/flight.h"
#include "../kernels/kernels.h"
#include "../util/kinds.h"

#include <stddef.h>
#include <stdint.h>

#include <structmember.h>

/* ------------------------------------------------------ shared by rings */

static PyObject *
fr_entry_dict(const pd_fr *fr, const pd_fr_entry *e)
{
    const char *be, *tr, *al;
    pd_fr_names(fr, e, &be, &tr, &al);
    return Py_BuildValue(
        "{s:K,s:K,s:s,s:s,s:s,s:s,s:i,s:K,s:K,s:s,s:s,s:s,s:s,s:s,s:d,s:d,"
        "s:d}",
        "id",
        (unsigned long long)e->id, "seq", (unsigned long long)e->seq, "name",
        e->name, "kind", pd_kind_name(e->kind), "dtype",
        pd_dtype_name((pd_dtype)e->dtype), "op",
        pd_redop_name((pd_redop)e->op), "root", (int)e->root, "count",
        (unsigned long long)e->count, "bytes", (unsigned long long)e->bytes,
        "backend", be, "transport", tr, "algorithm", al, "state",
        pd_fr_state_name(e->state), "status",
        e->state >= PD_FR_COMPLETED ? pd_status_name((pd_status)e->status)
                                    : "",
        "t_enqueued", e->t_enqueued, "t_started", e->t_started, "t_ended",
        e->t_ended);
}

PyObject *
pd_py_fr_records(struct pd_fr *fr)
{
    size_t cap = fr->cap;
    pd_fr_entry *buf = cap ? PyMem_Malloc(cap * sizeof(pd_fr_entry)) : NULL;
    if (cap && buf == NULL) {
        return PyErr_NoMemory();
    }
    size_t n = cap ? pd_fr_snapshot(fr, buf, cap) : 0;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *d = fr_entry_dict(fr, &buf[i]);
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    PyMem_Free(buf);
    return list;
}

PyObject *
pd_py_fr_via(struct pd_fr *fr, PyObject *args)
{
    const char *b, *t, *a;
    if (!PyArg_ParseTuple(args, "sss:flight_via", &b, &t, &a)) {
        return NULL;
    }
    int k = pd_fr_via(fr, b, t, a);
    if (k < 0) {
        PyErr_Format(PyExc_ValueError,
                     "flight_via: this ring already records %d kinds of "
                     "call (backend, transport, algorithm)",
                     PD_FR_VIAS - 1);
        return NULL;
    }
    return PyLong_FromLong(k);
}

/* note(via, kind, dtype, op, root, count, bytes, name, collective) -> id */
PyObject *
pd_py_fr_note(struct pd_fr *fr, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "flight_note(via, kind, dtype, op, root, count, "
                        "bytes, name, collective)");
        return NULL;
    }
    long v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    unsigned long long count = PyLong_AsUnsignedLongLong(args[5]);
    unsigned long long bytes = count == (unsigned long long)-1
                                   ? 0
                                   : PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[7]);
    if (name == NULL) {
        return NULL;
    }
    int coll = PyObject_IsTrue(args[8]);
    if (coll < 0) {
        return NULL;
    }
    uint64_t id = pd_fr_note(fr, (int)v[0], (int)v[1], (int)v[2], (int)v[3],
                             (int)v[4], count, bytes, name, coll);
    return PyLong_FromUnsignedLongLong(id);
}

/* update(id, state[, status]) */
PyObject *
pd_py_fr_update(struct pd_fr *fr, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError,
                        "flight_update(id, state[, status])");
        return NULL;
    }
    unsigned long long id = PyLong_AsUnsignedLongLong(args[0]);
    long state = id == (unsigned long long)-1 && PyErr_Occurred()
                     ? -1
                     : PyLong_AsLong(args[1]);
    long st = nargs > 2 && !PyErr_Occurred() ? PyLong_AsLong(args[2]) : 0;
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (state < PD_FR_STARTED || state > PD_FR_FAILED || st < 0 ||
        st >= PD_NSTATUS) {
        PyErr_Format(PyExc_ValueError,
                     "flight_update: state %ld or status %ld out of range",
                     state, st);
        return NULL;
    }
    pd_fr_update(fr, (uint64_t)id, (int)state, (pd_status)st);
    Py_RETURN_NONE;
}

/* --------------------------------------------------- _C.FlightRecorder */

typedef struct {
    PyObject_HEAD
    pd_fr fr;
    PyObject *transport;
    PyObject *weakrefs; /* the flight recorder's registry (_observe) */
} FRObject;

struct pd_fr *
pd_py_flight_recorder(PyObject *obj, pd_module_state *st)
{
    if (obj == NULL || st->FlightRecorderType == NULL ||
        !PyObject_TypeCheck(obj, st->FlightRecorderType)) {
        return NULL;
    }
    return &((FRObject *)obj)->fr;
}

static PyObject *
FR_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"transport", "capacity", NULL};
    PyObject *transport;
    Py_ssize_t cap = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "U|n:FlightRecorder", kw,
                                     &transport, &cap)) {
        return NULL;
    }
    FRObject *self = (FRObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    pd_status s = pd_fr_init(&self->fr, cap < 0 ? pd_fr_default_capacity()
                                                : (size_t)cap);
    self->transport = Py_NewRef(transport);
    if (s != PD_OK) {
        Py_DECREF(self);
        return pd_py_set_error(pd_state_from_type(type), s, pd_errmsg());
    }
    return (PyObject *)self;
}

static void
FR_dealloc(FRObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    pd_fr_free(&self->fr);
    Py_CLEAR(self->transport);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
FR_records(FRObject *self, PyObject *Py_UNUSED(ignored))
{
    return pd_py_fr_records(&self->fr);
}

static PyObject *
FR_configure(FRObject *self, PyObject *args)
{
    const char *path = NULL, *meta = NULL;
    if (!PyArg_ParseTuple(args, "zz:flight_recorder_configure", &path,
                          &meta)) {
        return NULL;
    }
    pd_status st = pd_fr_configure(&self->fr, path, meta);
    if (st != PD_OK) {
        return pd_py_set_error(pd_state_from_type(Py_TYPE(self)), st,
                               pd_errmsg());
    }
    Py_RETURN_NONE;
}

static PyObject *
dump(FRObject *self, const char *path, const char *reason, int once)
{
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_fr_dump(&self->fr, path, reason, once);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return pd_py_set_error(pd_state_from_type(Py_TYPE(self)), st,
                               pd_errmsg());
    }
    Py_RETURN_NONE;
}

static PyObject *
FR_dump(FRObject *self, PyObject *args)
{
    const char *path = NULL, *reason = "on demand";
    if (!PyArg_ParseTuple(args, "z|s:flight_recorder_dump", &path, &reason)) {
        return NULL;
    }
    return dump(self, path, reason, 0);
}

/* fail(status, reason): the backend failed: its open records fail with
 * status, and the ring is written where configured (once). */
static PyObject *
FR_fail(FRObject *self, PyObject *args)
{
    int st;
    const char *reason;
    if (!PyArg_ParseTuple(args, "is:fail", &st, &reason)) {
        return NULL;
    }
    if (st <= PD_OK || st >= PD_NSTATUS) {
        st = PD_EBACKEND;
    }
    pd_fr_fail_open(&self->fr, (pd_status)st);
    return dump(self, NULL, reason, 1);
}

static PyObject *
FR_set_track(FRObject *self, PyObject *arg)
{
    long tid = PyLong_AsLong(arg);
    if (tid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    pthread_mutex_lock(&self->fr.mu);
    self->fr.tl_tid = (int)tid;
    pthread_mutex_unlock(&self->fr.mu);
    Py_RETURN_NONE;
}

static PyObject *
FR_via(FRObject *self, PyObject *args)
{
    return pd_py_fr_via(&self->fr, args);
}

static PyObject *
FR_note(FRObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return pd_py_fr_note(&self->fr, args, nargs);
}

static PyObject *
FR_update(FRObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return pd_py_fr_update(&self->fr, args, nargs);
}

static PyObject *
FR_get_transport(FRObject *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->transport);
}

static PyMethodDef FR_methods[] = {
    {"flight_records", (PyCFunction)FR_records, METH_NOARGS,
     "flight_records() -> list of dicts, oldest first"},
    {"flight_recorder_configure", (PyCFunction)FR_configure, METH_VARARGS,
     "flight_recorder_configure(path, meta_json): where fail() writes"},
    {"flight_recorder_dump", (PyCFunction)FR_dump, METH_VARARGS,
     "flight_recorder_dump(path=None, reason='on demand')"},
    {"fail", (PyCFunction)FR_fail, METH_VARARGS,
     "fail(status, reason): open records fail; written where configured, "
     "once"},
    {"set_timeline_track", (PyCFunction)FR_set_track, METH_O,
     "set_timeline_track(tid): the timeline track of its records"},
    {"flight_via", (PyCFunction)FR_via, METH_VARARGS,
     "flight_via(backend, transport, algorithm) -> via"},
    {"flight_note", (PyCFunction)(void (*)(void))FR_note, METH_FASTCALL,
     "flight_note(via, kind, dtype, op, root, count, bytes, name, "
     "collective) -> id (0: not recorded)"},
    {"flight_update", (PyCFunction)(void (*)(void))FR_update, METH_FASTCALL,
     "flight_update(id, state[, status]): FR_STARTED, FR_COMPLETED, "
     "FR_FAILED"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FR_getset[] = {
    {"transport", (getter)FR_get_transport, NULL,
     "the word logs use for its transport", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef FR_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(FRObject, weakrefs), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot FR_slots[] = {
    {Py_tp_members, FR_members},
    {Py_tp_new, FR_new},
    {Py_tp_dealloc, FR_dealloc},
    {Py_tp_methods, FR_methods},
    {Py_tp_getset, FR_getset},
    {Py_tp_doc, "FlightRecorder(transport, capacity=-1): a flight-recorder "
                "ring without a process group, for a backend that keeps "
                "none (capacity -1: PYDDP_FLIGHT_RECORDER_SIZE's)"},
    {0, NULL},
};

static PyType_Spec FR_spec = {
    .name = "pyddp._C.FlightRecorder",
    .basicsize = sizeof(FRObject),
    .flags = PD_TPFLAGS,
    .slots = FR_slots,
};

int
pd_flight_add_types(PyObject *m, pd_module_state *st)
{
    PyObject *t = PyType_FromModuleAndSpec(m, &FR_spec, NULL);
    if (t == NULL) {
        return -1;
    }
    st->FlightRecorderType = (PyTypeObject *)t;
    if (PyModule_AddObjectRef(m, "FlightRecorder", t) < 0 ||
        PyModule_AddIntConstant(m, "FR_STARTED", PD_FR_STARTED) < 0 ||
        PyModule_AddIntConstant(m, "FR_COMPLETED", PD_FR_COMPLETED) < 0 ||
        PyModule_AddIntConstant(m, "FR_FAILED", PD_FR_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "ST_TIMEOUT", PD_ETIMEOUT) < 0 ||
        PyModule_AddIntConstant(m, "ST_NETWORK", PD_ENETWORK) < 0 ||
        PyModule_AddIntConstant(m, "ST_MISMATCH", PD_EMISMATCH) < 0 ||
        PyModule_AddIntConstant(m, "ST_BACKEND", PD_EBACKEND) < 0) {
        return -1;
    }
    return 0;
}
