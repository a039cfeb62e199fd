/* Shared declarations of the pyddp._C binding layer (csrc/python/).
 *
 * One file per exposed type or function group; each adds its types to the
 * module through a pd_*_add_types() hook called from module.c.  Exceptions are
 * raised only through pd_py_set_error().
 */
#ifndef PD_PYTHON_BINDING_H
#define PD_PYTHON_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../util/status.h"

/* Python 3.9 lacks PyModule_AddObjectRef (3.10+). */
#if PY_VERSION_HEX < 0x030A0000
static inline int
PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *value)
{
    Py_XINCREF(value);
    int rc = PyModule_AddObject(m, name, value);
    if (rc < 0) {
        Py_XDECREF(value);
    }
    return rc;
}
#endif

typedef struct pd_module_state {
    PyObject *DistError;         /* RuntimeError subclass */
    PyObject *DistBackendError;  /* DistError subclass */
    PyObject *DistNetworkError;  /* DistError subclass */
    PyObject *DistStoreError;    /* DistError subclass */
    PyTypeObject *TCPStoreType;
    PyTypeObject *FileStoreType;
    PyTypeObject *HashStoreType;
    PyTypeObject *ProcessGroupType;
    PyTypeObject *WorkType;
    PyTypeObject *SharedBufferType;
    PyTypeObject *GeneratorType;     /* random.c */
} pd_module_state;

pd_module_state *pd_get_state(PyObject *module);
/* State of the module that defined a heap type (PyType_FromModuleAndSpec). */
pd_module_state *pd_state_from_type(PyTypeObject *tp);

/* The one place a (status, message) pair becomes a Python exception.
 * Always returns NULL so callers can `return pd_py_set_error(...)`. */
PyObject *pd_py_set_error(pd_module_state *st, pd_status s, const char *msg);

/* The C store behind a _C.TCPStore / FileStore / HashStore object, or NULL
 * when obj is none of them.  Borrowed: hold a reference to obj while the
 * store is in use. */
struct pd_store;
struct pd_store *pd_py_store_get(PyObject *obj, pd_module_state *st);

/* Type registration hooks (each file owns its types). Return 0 / -1. */
int pd_store_add_types(PyObject *m, pd_module_state *st);
int pd_group_add_types(PyObject *m, pd_module_state *st);
/* KINDS, K_*, DTYPE_CODES, DTYPE_SIZES, REDUCE_OPS (tables.c). */
int pd_tables_add(PyObject *m, pd_module_state *st);
/* Module functions: amp kernels (amp.c), fused optimizers (optim.c). */
int pd_amp_add_functions(PyObject *m, pd_module_state *st);
int pd_optim_add_functions(PyObject *m, pd_module_state *st);

/* Float arrays for the kernels (amp.c): a C-contiguous buffer whose format
 * gives the dtype ('e' float16, 'H' = bfloat16 as a uint16 view, 'f'
 * float32, 'd' float64).  Errors name the function, the argument and its
 * index ("adam_step: grads[3] must be ..."); idx < 0 leaves the index out. */
#define PD_F16_BIT 1u
#define PD_BF16_BIT 2u
#define PD_F32_BIT 4u
#define PD_F64_BIT 8u
#define PD_ALLFLOAT_BITS 15u
typedef struct pd_fview {
    Py_buffer buf;
    int held;
    int dt;        /* a pd_dtype */
    size_t count;  /* elements */
} pd_fview;
unsigned pd_py_dtype_bit(int dt);
int pd_py_fview_get(PyObject *obj, const char *fn, const char *name,
                    Py_ssize_t idx, int writable, unsigned allowed,
                    pd_fview *v);
void pd_py_fview_release(pd_fview *v);
/* Views of every array of a sequence (expect >= 0: required length);
 * PyMem_RawCalloc'ed so they can be read with the GIL released. */
pd_fview *pd_py_fviews_get(PyObject *seq, Py_ssize_t expect, const char *fn,
                           const char *name, int writable, unsigned allowed,
                           Py_ssize_t *n_out);
void pd_py_fviews_release(pd_fview *v, Py_ssize_t n);
int pd_py_found_inf(PyObject *obj, const char *fn, pd_fview *v,
                    float **flag);
int pd_py_inv_scale(PyObject *obj, const char *fn, float *out);
int pd_random_add_types(PyObject *m, pd_module_state *st);

#endif
