/* ProcessGroup's flight recorder (csrc/group/flight.c): the records as
 * dicts (flight.c), a device backend's calls noted beside the group's own,
 * where the group dumps them when it fails, a dump on demand; and the
 * group's track in the timeline.
 */
#include "group_internal.h"

PyObject *
pd_pg_flight_records(PGObject *self, PyObject *Py_UNUSED(ignored))
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    return pd_py_fr_records(pd_group_flight(self->g));
}

/* A device backend's calls in this group's ring (flight.c's helpers): the
 * host group a backend keeps beside it records them with its own. */
PyObject *
pd_pg_flight_via(PGObject *self, PyObject *args)
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    return pd_py_fr_via(pd_group_flight(self->g), args);
}

PyObject *
pd_pg_flight_note(PGObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (pg_check(self) < 0) {
        return NULL;
    }
    return pd_py_fr_note(pd_group_flight(self->g), args, nargs);
}

PyObject *
pd_pg_flight_update(PGObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->g == NULL) { /* destroyed: its ring is gone, nothing to do */
        Py_RETURN_NONE;
    }
    return pd_py_fr_update(pd_group_flight(self->g), args, nargs);
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
