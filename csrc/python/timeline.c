/* _C.timeline_*: the process's timeline file (util/timeline.h). */
#include "binding.h"

#include <string.h>

#include "../util/probe.h"
#include "../util/timeline.h"

static PyObject *
tl_open(PyObject *m, PyObject *args)
{
    const char *path, *name;
    int pid;
    if (!PyArg_ParseTuple(args, "sis:timeline_open", &path, &pid, &name)) {
        return NULL;
    }
    pd_status st = pd_tl_open(path, pid, name);
    if (st != PD_OK) {
        return pd_py_set_error(pd_get_state(m), st, pd_errmsg());
    }
    Py_RETURN_NONE;
}

static PyObject *
tl_close(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    pd_tl_close();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
tl_flush(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    pd_tl_flush();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
tl_enabled(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(pd_tl_enabled());
}

static PyObject *
tl_wall(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble(pd_wall());
}

/* timeline_event(name, cat, ph, ts_us, dur_us, tid, args_json=None) */
static PyObject *
tl_event(PyObject *Py_UNUSED(m), PyObject *args)
{
    const char *name, *cat, *ph, *extra = NULL;
    double ts, dur;
    int tid;
    if (!PyArg_ParseTuple(args, "sssddi|z:timeline_event", &name, &cat, &ph,
                          &ts, &dur, &tid, &extra)) {
        return NULL;
    }
    if (strlen(ph) != 1 || strchr("XiBEM", ph[0]) == NULL) {
        PyErr_Format(PyExc_ValueError,
                     "timeline_event: ph must be one of 'X', 'i', 'B', 'E', "
                     "'M', got %R", PyTuple_GET_ITEM(args, 2));
        return NULL;
    }
    if (pd_tl_enabled()) {
        pd_tl_event(name, cat, ph[0], ts, dur, tid, extra);
    }
    Py_RETURN_NONE;
}

/* probe_handoff(seconds=0.2) -> (ns, gbps): util/probe.c */
static PyObject *
tl_probe_handoff(PyObject *Py_UNUSED(m), PyObject *args)
{
    double seconds = 0.2, ns, gbps;
    if (!PyArg_ParseTuple(args, "|d:probe_handoff", &seconds)) {
        return NULL;
    }
    if (!(seconds > 0 && seconds <= 60)) {
        PyErr_Format(PyExc_ValueError,
                     "probe_handoff: seconds must be in (0, 60], got %g",
                     seconds);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pd_probe_handoff(seconds, &ns, &gbps);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "probe_handoff: no complete round (out of memory, no "
                        "thread, or too short a time)");
        return NULL;
    }
    return Py_BuildValue("(dd)", ns, gbps);
}

static PyMethodDef tl_methods[] = {
    {"probe_handoff", tl_probe_handoff, METH_VARARGS,
     "probe_handoff(seconds=0.2) -> (ns, gbps): two threads take turns on "
     "one cache line (one-way handoff, ns) and hand 1 MiB over through a "
     "shared buffer (GB/s): how fast data crosses between cores right "
     "now (benchmarks print it; it changes on some virtual machines)."},
    {"timeline_open", tl_open, METH_VARARGS,
     "timeline_open(path, pid, process_name): start this process's "
     "timeline (Chrome trace JSON)."},
    {"timeline_close", tl_close, METH_NOARGS, "finish the timeline file."},
    {"timeline_flush", tl_flush, METH_NOARGS, "flush the timeline file."},
    {"timeline_enabled", tl_enabled, METH_NOARGS,
     "whether a timeline is being written."},
    {"timeline_event", tl_event, METH_VARARGS,
     "timeline_event(name, cat, ph, ts_us, dur_us, tid, args_json=None)."},
    {"wall", tl_wall, METH_NOARGS,
     "wall() -> float: the clock of the timeline and flight recorder "
     "(seconds since the epoch)."},
    {NULL, NULL, 0, NULL},
};

int
pd_timeline_add_functions(PyObject *m, pd_module_state *Py_UNUSED(st))
{
    return PyModule_AddFunctions(m, tl_methods);
}
