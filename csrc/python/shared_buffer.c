/* pyddp._C.SharedBuffer and ProcessGroup.shared_alloc: memory that every
 * rank of a shared-memory group maps, this rank's part exposed through the
 * buffer protocol.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "group_internal.h"

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
PyObject *
pd_pg_shared_alloc(PGObject *self, PyObject *arg)
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

int
pd_py_shared_buffer_add_type(PyObject *m, pd_module_state *st)
{
    st->SharedBufferType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &SB_spec, NULL);
    if (st->SharedBufferType == NULL ||
        PyModule_AddObjectRef(m, "SharedBuffer",
                              (PyObject *)st->SharedBufferType) < 0) {
        return -1;
    }
    return 0;
}
