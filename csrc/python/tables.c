/* pyddp._C's copies of the core's tables, so Python never re-encodes them:
 *
 *   KINDS       {name: {"code", "rooted", "reduces", "shm", "p2p", "splits",
 *                       "in", "out"}} for every user-facing collective kind
 *               ("in"/"out": "none", "one", "all" or "root_all" blocks)
 *   K_<IDENT>   each kind's code (K_ALLREDUCE, ...)
 *   DTYPE_CODES {name: code} in pd_dtype order ("float32": 11, ...)
 *   DTYPE_SIZES {name: bytes per element}
 *   REDUCE_OPS  {name: code} in pd_redop order ("SUM": 0, ...)
 */
#include "binding.h"

#include "../util/kinds.h"
#include "../kernels/kernels.h"

static const char *const block_names[] = {"none", "one", "all", "root_all"};

static int
set_item(PyObject *d, const char *key, PyObject *v)
{
    if (v == NULL) {
        return -1;
    }
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *
kind_dict(int kind)
{
    const pd_kind_info *k = pd_kind_get(kind);
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    if (set_item(d, "code", PyLong_FromLong(kind)) < 0 ||
        set_item(d, "rooted", PyBool_FromLong(k->flags & PD_KF_ROOTED)) < 0 ||
        set_item(d, "reduces", PyBool_FromLong(k->flags & PD_KF_REDUCES)) <
            0 ||
        set_item(d, "shm", PyBool_FromLong(k->flags & PD_KF_SHM)) < 0 ||
        set_item(d, "p2p", PyBool_FromLong(k->flags & PD_KF_P2P)) < 0 ||
        set_item(d, "splits", PyBool_FromLong(k->flags & PD_KF_SPLITS)) < 0 ||
        set_item(d, "in", PyUnicode_FromString(block_names[k->in])) < 0 ||
        set_item(d, "out", PyUnicode_FromString(block_names[k->out])) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static int
add_kinds(PyObject *m)
{
    PyObject *kinds = PyDict_New();
    if (kinds == NULL) {
        return -1;
    }
    for (int kind = 0; kind < PD_NKINDS; kind++) {
        const pd_kind_info *k = pd_kind_get(kind);
        if (k->flags & PD_KF_INTERNAL) {
            continue;
        }
        char cname[64];
        PyOS_snprintf(cname, sizeof(cname), "K_%s", k->ident);
        if (set_item(kinds, k->name, kind_dict(kind)) < 0 ||
            PyModule_AddIntConstant(m, cname, kind) < 0) {
            Py_DECREF(kinds);
            return -1;
        }
    }
    int rc = PyModule_AddObjectRef(m, "KINDS", kinds);
    Py_DECREF(kinds);
    /* the length of per-kind tables (ProcessGroup.set_rules) */
    return rc < 0 ? rc : PyModule_AddIntConstant(m, "NKINDS", PD_NKINDS);
}

static int
add_dtypes_and_ops(PyObject *m)
{
    PyObject *codes = PyDict_New(), *sizes = PyDict_New(),
             *ops = PyDict_New();
    int rc = -1;
    if (codes == NULL || sizes == NULL || ops == NULL) {
        goto exit;
    }
    for (int dt = 0; dt < PD_NDTYPES; dt++) {
        const char *name = pd_dtype_name((pd_dtype)dt);
        if (set_item(codes, name, PyLong_FromLong(dt)) < 0 ||
            set_item(sizes, name,
                     PyLong_FromSize_t(pd_dtype_size((pd_dtype)dt))) < 0) {
            goto exit;
        }
    }
    for (int op = 0; op < PD_NREDOPS; op++) {
        if (set_item(ops, pd_redop_name((pd_redop)op), PyLong_FromLong(op)) <
            0) {
            goto exit;
        }
    }
    if (PyModule_AddObjectRef(m, "DTYPE_CODES", codes) < 0 ||
        PyModule_AddObjectRef(m, "DTYPE_SIZES", sizes) < 0 ||
        PyModule_AddObjectRef(m, "REDUCE_OPS", ops) < 0) {
        goto exit;
    }
    rc = 0;
exit:
    Py_XDECREF(codes);
    Py_XDECREF(sizes);
    Py_XDECREF(ops);
    return rc;
}

int
pd_tables_add(PyObject *m, pd_module_state *st)
{
    (void)st;
    return add_kinds(m) < 0 || add_dtypes_and_ops(m) < 0 ? -1 : 0;
}
