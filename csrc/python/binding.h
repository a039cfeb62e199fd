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

/* Heap types are immutable where the interpreter supports it (3.10+), as
 * CPython's _bz2module; those that hold Python objects are also
 * garbage-collected (PD_TPFLAGS_GC). */
#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define PD_TPFLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define PD_TPFLAGS Py_TPFLAGS_DEFAULT
#endif
#define PD_TPFLAGS_GC (PD_TPFLAGS | Py_TPFLAGS_HAVE_GC)

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
    PyTypeObject *PinnedBufferType;  /* cuda.c */
    PyTypeObject *NcclCommType;      /* nccl.c */
    PyTypeObject *NcclWorkType;
    PyTypeObject *FlightRecorderType; /* flight.c */
    PyObject *TensorType;            /* buffers.c: pyddp.Tensor, or NULL */
    PyObject *str_data;              /* interned "_data" */
    /* buffers.c: numpy.ndarray, read directly by the fast paths once one
     * array described both ways agreed (np_direct 1; -1: they did not, or
     * no ndarray type; 0: not yet known) */
    PyObject *ndarray_type;
    int np_direct;
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

/* ---------------------------------------------------------------- views
 * The one array adapter of the binding (buffers.c): the buffer protocol,
 * then DLPack, then __cuda_array_interface__ (mpi4py's order). */
enum { PD_DEV_CPU = 1, PD_DEV_CUDA = 2, PD_DEV_CUDA_HOST = 3,
       PD_DEV_CUDA_MANAGED = 13 }; /* DLPack's device codes */
enum { PD_VIEW_NONE = 0, PD_VIEW_BUFFER, PD_VIEW_DLPACK, PD_VIEW_DLPACK_V1,
       PD_VIEW_CAI, PD_VIEW_NUMPY };
enum {
    PD_VIEW_WRITABLE = 1u,  /* ask the exporter for a writable buffer */
    PD_VIEW_NO_DLPACK = 2u, /* buffer protocol (and pyddp Tensors) only */
    PD_VIEW_CONTIGUOUS = 4u, /* the caller takes only C-contiguous memory: a
                                hint that makes the common case cheaper */
};
typedef struct pd_view {
    Py_buffer buf;      /* PD_VIEW_BUFFER */
    PyObject *capsule;  /* PD_VIEW_DLPACK*: renamed "used_...", deleter
                           called at release */
    void *managed;      /* its DLManagedTensor[Versioned] */
    const void *dlt;    /* PD_VIEW_DLPACK*: its DLTensor (shape, strides) */
    PyObject *owner;    /* PD_VIEW_CAI, PD_VIEW_NUMPY: the exporting object */
    PyObject *cai;      /* PD_VIEW_CAI: its __cuda_array_interface__ dict */
    int how;            /* PD_VIEW_* */
    char *ptr;
    size_t nbytes;
    size_t count;       /* elements */
    size_t itemsize;
    int dtype;          /* a pd_dtype, or -1 when no pyddp dtype matches */
    int device;         /* PD_DEV_* */
    int device_index;   /* -1: unknown */
    int readonly;
    int contiguous;     /* C order */
    long long stream;   /* __cuda_array_interface__ stream, 0 if none */
} pd_view;
/* 0, or -1 with an exception when obj offers no array interface (or a
 * broken one).  Accepting the device, dtype, writability and contiguity is
 * the caller's call; release with pd_view_release (GIL held).  st may be
 * NULL: no registered Tensor type is unwrapped then. */
int pd_view_get(pd_module_state *st, PyObject *obj, unsigned flags,
                pd_view *v);
void pd_view_release(pd_view *v);
/* A view the fast paths (group_fast.c, mpi.c) can run on: CPU memory,
 * C-contiguous, a known dtype, writable when it is an output.  1 with the
 * view held, or 0 with nothing held and no exception: the Python layer then
 * takes the general path and explains what is wrong. */
int pd_view_get_host(pd_module_state *st, PyObject *obj, int writable,
                     pd_view *v);
/* The length of a view's first dimension (1 for a 0-d array), or -1 when
 * its exporter did not say. */
long long pd_view_rows(const pd_view *v);
/* A view's dimensions: their number (-1 when its exporter did not say),
 * the first max of them in shape. */
int pd_view_shape(const pd_view *v, long long *shape, int max);
/* PEP 3118 format -> pd_dtype or -1 ('H' is uint16; the float kernels take
 * bfloat16 as uint16 views, see amp.c). */
int pd_dtype_of_format(const char *f, Py_ssize_t itemsize);
const char *pd_device_name(int device);
int pd_buffers_add(PyObject *m, pd_module_state *st);
/* The fuzz targets' entry points (fuzz.c). */
int pd_fuzz_add(PyObject *m);

/* Type registration hooks (each file owns its types). Return 0 / -1. */
int pd_store_add_types(PyObject *m, pd_module_state *st);
int pd_group_add_types(PyObject *m, pd_module_state *st);
/* KINDS, K_*, DTYPE_CODES, DTYPE_SIZES, REDUCE_OPS (tables.c). */
int pd_tables_add(PyObject *m, pd_module_state *st);
/* Module functions: amp kernels (amp.c), fused optimizers (optim.c). */
int pd_amp_add_functions(PyObject *m, pd_module_state *st);
int pd_optim_add_functions(PyObject *m, pd_module_state *st);

/* Float arrays for the kernels (amp.c): a C-contiguous CPU array from the
 * adapter above: float16, float32, float64, and bfloat16 (as itself through
 * DLPack, or as a uint16 view through the buffer protocol).  Errors name the function, the argument and its
 * index ("adam_step: grads[3] must be ..."); idx < 0 leaves the index out. */
#define PD_F16_BIT 1u
#define PD_BF16_BIT 2u
#define PD_F32_BIT 4u
#define PD_F64_BIT 8u
#define PD_ALLFLOAT_BITS 15u
typedef struct pd_fview {
    pd_view view;
    int held;
    char *ptr;
    size_t nbytes;
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
/* CUDA runtime and NCCL loading and queries, PinnedBuffer (cuda.c). */
int pd_cuda_add_functions(PyObject *m, pd_module_state *st);
/* NcclComm and NcclWork (nccl.c). */
int pd_nccl_add_types(PyObject *m, pd_module_state *st);
int pd_mpi_add_types(PyObject *m, pd_module_state *st);

/* flight.c: flight-recorder rings (group/flight.h) from Python, shared by
 * ProcessGroup's ring and _C.FlightRecorder: the records as dicts, and a
 * device backend's calls (flight_via, flight_note, flight_update); the ring
 * of a _C.FlightRecorder (NULL when obj is none). */
struct pd_fr;
PyObject *pd_py_fr_records(struct pd_fr *fr);
PyObject *pd_py_fr_via(struct pd_fr *fr, PyObject *args);
PyObject *pd_py_fr_note(struct pd_fr *fr, PyObject *const *args,
                        Py_ssize_t nargs);
PyObject *pd_py_fr_update(struct pd_fr *fr, PyObject *const *args,
                          Py_ssize_t nargs);
struct pd_fr *pd_py_flight_recorder(PyObject *obj, pd_module_state *st);
int pd_flight_add_types(PyObject *m, pd_module_state *st);
/* timeline.c: _C.timeline_* */
int pd_timeline_add_functions(PyObject *m, pd_module_state *st);

#endif
