/* pyddp._C.Work: the handle of an operation submitted to a process group
 * (group_submit.c makes them; group_fast.c for interrupted inline runs).
 * A Work owns the array views until the operation has completed; waiting
 * releases the GIL, in slices so that Ctrl-C is seen.
 */
#include <stdio.h>

#include "../util/status.h"
#include "group_internal.h"

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
WorkObject *
pd_py_work_alloc(pd_module_state *st)
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

int
pd_py_work_add_type(PyObject *m, pd_module_state *st)
{
    st->WorkType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Work_spec,
                                                            NULL);
    if (st->WorkType == NULL ||
        PyModule_AddObjectRef(m, "Work", (PyObject *)st->WorkType) < 0) {
        return -1;
    }
    return 0;
}
