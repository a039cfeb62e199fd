/* ProcessGroup's algorithm choice (csrc/coll/select.c): the rules tables a
 * tuner sets (set_rules, set_slow_rules) and reads back, the probe that
 * switches between the machine's fast and slow phases, and explain(): what
 * a collective would run with now.
 */
#include "../coll/coll.h"
#include "../util/kinds.h"
#include "group_internal.h"

PyObject *
pd_pg_explain(PGObject *self, PyObject *args)
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

PyObject *
pd_pg_set_rules(PGObject *self, PyObject *args)
{
    PyObject *cma, *small;
    if (!PyArg_ParseTuple(args, "OO:set_rules", &cma, &small)) {
        return NULL;
    }
    return set_rules_common(self, cma, small, 0, -1);
}

PyObject *
pd_pg_set_slow_rules(PGObject *self, PyObject *args)
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

PyObject *
pd_pg_probe_phase(PGObject *self, PyObject *Py_UNUSED(ignored))
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

PyObject *
pd_pg_get_rules(PGObject *self, void *Py_UNUSED(closure))
{
    return rules_tuple(self, 0);
}

PyObject *
pd_pg_get_slow_rules(PGObject *self, void *Py_UNUSED(closure))
{
    return rules_tuple(self, 1);
}

PyObject *
pd_pg_get_phase(PGObject *self, void *Py_UNUSED(closure))
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
