/* pyddp._C.ProcessGroup: one member of a process group of the C core
 * (csrc/group/): its lifecycle (create, connect, fail, destroy), its state
 * as attributes, and the type's tables, which list the methods of every
 * concern (group_internal.h says which file holds each).  Every blocking
 * call releases the GIL.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "group_internal.h"

#include <structmember.h>

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
PG_get_bank_bytes(PGObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(self->g != NULL ? pd_group_bank_bytes(self->g)
                                             : 0);
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

static PyGetSetDef PG_getset[] = {
    {"error", (getter)PG_get_error, NULL,
     "None, or the group's sticky error (a dead peer, a mismatch, ...)",
     NULL},
    {"transport", (getter)PG_get_transport, NULL,
     "how collectives move: 'shm', 'tcp' or 'local'", NULL},
    {"single_copy", (getter)PG_get_single_copy, NULL,
     "True when large messages move with one copy between the ranks "
     "(cross-memory attach; PYDDP_CMA, PYDDP_CMA_THRESHOLD)", NULL},
    {"bank_bytes", (getter)PG_get_bank_bytes, NULL,
     "bytes of one shared-memory bank, the pipelining unit of large "
     "collectives (PYDDP_SHM_CHUNK; unset, 1 MiB where each of the host's "
     "ranks has a core, else 256 KiB); 0 without shared memory", NULL},
    {"rules", (getter)pd_pg_get_rules, NULL,
     "(cma_from, small_bytes): per kind (pyddp._C.KINDS), the bytes from "
     "which single copies run (None: never; (from, gap_lo, gap_hi): the "
     "banks again in [gap_lo, gap_hi)) and up to which direct "
     "algorithms run over the transport, as in force",
     NULL},
    {"slow_rules", (getter)pd_pg_get_slow_rules, NULL,
     "the same for the machine's slow phase (set_slow_rules)", NULL},
    {"phase", (getter)pd_pg_get_phase, NULL,
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
    {"shared_alloc", (PyCFunction)pd_pg_shared_alloc, METH_O,
     "shared_alloc(nbytes) -> SharedBuffer (collective, shm groups)."},
    {"fast", (PyCFunction)(void (*)(void))pd_pg_fast, METH_FASTCALL,
     "fast(kind, array, arg[, input[, root]]) -> bool: run a blocking "
     "collective here if the group is idle."},
    {"submit", (PyCFunction)(void (*)(void))pd_pg_submit,
     METH_VARARGS | METH_KEYWORDS, "submit an operation; returns a Work."},
    {"explain", (PyCFunction)pd_pg_explain, METH_VARARGS,
     "explain(kind, dtype, count) -> (transport, algorithm): what a "
     "collective of count elements (one rank's block; all_to_all: its "
     "longest) would run with now, as coll/select.c decides when it runs; "
     "runs nothing"},
    {"flight_records", (PyCFunction)pd_pg_flight_records, METH_NOARGS,
     "flight_records() -> list of dicts: the flight recorder's records, "
     "oldest first."},
    {"flight_via", (PyCFunction)pd_pg_flight_via, METH_VARARGS,
     "flight_via(backend, transport, algorithm) -> via: a device backend "
     "that notes its calls in this group's ring registers what runs them"},
    {"flight_note", (PyCFunction)(void (*)(void))pd_pg_flight_note,
     METH_FASTCALL,
     "flight_note(via, kind, dtype, op, root, count, bytes, name, "
     "collective) -> id: a device backend's call, enqueued (0: not "
     "recorded)"},
    {"flight_update", (PyCFunction)(void (*)(void))pd_pg_flight_update,
     METH_FASTCALL,
     "flight_update(id, state[, status]): the call moved to FR_STARTED, "
     "FR_COMPLETED or FR_FAILED (a pd status code)"},
    {"flight_recorder_configure", (PyCFunction)pd_pg_flight_configure,
     METH_VARARGS,
     "flight_recorder_configure(path, meta_json): dump there when the "
     "group fails (None: nowhere)."},
    {"flight_recorder_dump", (PyCFunction)pd_pg_flight_dump, METH_VARARGS,
     "flight_recorder_dump(path=None, reason='on demand'): write the "
     "records as JSON now."},
    {"set_rules", (PyCFunction)pd_pg_set_rules, METH_VARARGS,
     "set_rules(cma_from, small_bytes): the group's rules of algorithm "
     "choice, one entry per kind (0: the default; cma_from None: never, "
     "or (from, gap_lo, gap_hi): the banks again in [gap_lo, gap_hi)); "
     "between collectives, the same on every rank."},
    {"probe_phase", (PyCFunction)pd_pg_probe_phase, METH_NOARGS,
     "probe_phase() -> float or None: every rank at the same point (after "
     "a barrier); rank 0 gets the one-way handoff of a cache line between "
     "ranks 0 and 1 in ns (the probe that switches the phases' rules), "
     "the others None."},
    {"set_slow_rules", (PyCFunction)pd_pg_set_slow_rules, METH_VARARGS,
     "set_slow_rules(cma_from, small_bytes, phase_ns): rules for the "
     "machine's slow phase, which every rank uses from the collective "
     "after rank 0 probes a cache line's handoff between cores above "
     "phase_ns (0: no phases); as set_rules otherwise."},
    {"set_timeline_track", (PyCFunction)pd_pg_set_timeline_track, METH_O,
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
    if (pd_py_work_add_type(m, st) < 0 ||
        pd_py_shared_buffer_add_type(m, st) < 0) {
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
