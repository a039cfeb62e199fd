/* ProcessGroup's flight recorder (csrc/group/flight.c): the records as
 * dicts, where the group dumps them when it fails, a dump on demand; and
 * the group's track in the timeline.
 */
#include "../coll/coll.h"
#include "../kernels/kernels.h"
#include "../util/kinds.h"
#include "group_internal.h"

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

PyObject *
pd_pg_flight_records(PGObject *self, PyObject *Py_UNUSED(ignored))
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

PyObject *
pd_pg_flight_configure(PGObject *self, PyObject *args)
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

PyObject *
pd_pg_flight_dump(PGObject *self, PyObject *args)
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

PyObject *
pd_pg_set_timeline_track(PGObject *self, PyObject *arg)
{
    long tid = PyLong_AsLong(arg);
    if ((tid == -1 && PyErr_Occurred()) || pg_check(self) < 0) {
        return NULL;
    }
    pd_group_set_timeline_track(self->g, (int)tid);
    Py_RETURN_NONE;
}
