/* pyddp's array adapter: the one place Python objects become views of array
 * memory (pd_view_get), as mpi4py's asbuffer (asbuffer.pxi): one function,
 * one rule per protocol, the first the object offers describing it --
 *
 *   1. the buffer protocol (NumPy, bytes, memoryview, array.array; pyddp
 *      Tensors through PEP 688 __buffer__ on Python 3.12+);
 *   2. a pyddp Tensor's `_data` array (the class registered with
 *      _register_tensor_type(), for Pythons without PEP 688);
 *   3. DLPack (torch, JAX, CuPy, ...), except CUDA arrays that also have
 *      rule 4's interface;
 *   4. __cuda_array_interface__ (CuPy, Numba, JAX GPU arrays).
 *
 * The C fast paths call it on the user's object; Python reaches it as
 * _C.describe_array, through pyddp/_interop.py, which adds no rule: it only
 * answers rules 1-2 itself for NumPy arrays and pyddp Tensors (the same
 * answer without the call), takes torch tensors with torch's own operations,
 * and gives host memory a NumPy view.
 *
 * A view describes the memory (pointer, bytes, dtype, device, read-only,
 * C-contiguity) and owns what keeps it valid until pd_view_release: the
 * Py_buffer, or the DLPack capsule whose deleter runs at release, or the
 * object behind a CUDA array interface.  Callers decide what they accept
 * (device, writability, contiguity) and word their own errors; the adapter
 * fails only when an object offers none of the protocols or describes
 * itself inconsistently.
 */
#include "binding.h"

#include <stdint.h>
#include <string.h>

#include "../kernels/kernels.h"

/* ------------------------------------------------------- DLPack structs */

/* The DLPack ABI (dlpack.h, v0.x "dltensor" and v1.x "dltensor_versioned"
 * capsules), declared here: nothing in the build depends on DLPack. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;

typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL = C-contiguous */
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
    dl_tensor t;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct dl_managed_v {
    uint32_t major, minor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_v *self);
    uint64_t flags;
    dl_tensor t;
} dl_managed_v;

#define DL_FLAG_READ_ONLY 1u

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4,
       DL_COMPLEX = 5, DL_BOOL = 6 };

/* NumPy's array and dtype fields, as far as np_view reads them (see there) */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} np_array_fields;

typedef struct {
    PyObject_HEAD
    PyTypeObject *typeobj;
    char kind;
    char type;
    char byteorder;
    char former_flags;
    int type_num;
} np_descr_fields;

enum { NP_C_CONTIGUOUS = 0x0001, NP_ALIGNED = 0x0100, NP_WRITEABLE = 0x0400,
       NP_WARN_ON_WRITE = (int)0x80000000u, NP_NTYPES_BUILTIN = 24 };

/* ------------------------------------------------------------- dtypes */

int
pd_dtype_of_format(const char *f, Py_ssize_t itemsize)
{
    if (f == NULL) {
        return PD_UINT8; /* PEP 3118: no format means unsigned bytes */
    }
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    if (f[0] == 'Z' && f[1] && !f[2]) {
        return f[1] == 'f' ? PD_COMPLEX64 : f[1] == 'd' ? PD_COMPLEX128 : -1;
    }
    if (!f[0] || f[1]) {
        return -1;
    }
    switch (f[0]) {
    case '?':
        return PD_BOOL;
    case 'b':
        return PD_INT8;
    case 'B':
        return PD_UINT8;
    case 'h':
        return PD_INT16;
    case 'H':
        return PD_UINT16;
    case 'i':
    case 'l':
    case 'q':
        return itemsize == 4 ? PD_INT32 : itemsize == 8 ? PD_INT64 : -1;
    case 'I':
    case 'L':
    case 'Q':
        return itemsize == 4 ? PD_UINT32 : itemsize == 8 ? PD_UINT64 : -1;
    case 'e':
        return itemsize == 2 ? PD_FLOAT16 : -1;
    case 'f':
        return itemsize == 4 ? PD_FLOAT32 : -1;
    case 'd':
        return itemsize == 8 ? PD_FLOAT64 : -1;
    default:
        return -1;
    }
}

static int
dtype_of_dlpack(dl_dtype d)
{
    if (d.lanes != 1) {
        return -1;
    }
    switch (d.code) {
    case DL_INT:
        return d.bits == 8    ? PD_INT8
               : d.bits == 16 ? PD_INT16
               : d.bits == 32 ? PD_INT32
               : d.bits == 64 ? PD_INT64
                              : -1;
    case DL_UINT:
        return d.bits == 8    ? PD_UINT8
               : d.bits == 16 ? PD_UINT16
               : d.bits == 32 ? PD_UINT32
               : d.bits == 64 ? PD_UINT64
                              : -1;
    case DL_FLOAT:
        return d.bits == 16   ? PD_FLOAT16
               : d.bits == 32 ? PD_FLOAT32
               : d.bits == 64 ? PD_FLOAT64
                              : -1;
    case DL_BFLOAT:
        return d.bits == 16 ? PD_BFLOAT16 : -1;
    case DL_COMPLEX:
        return d.bits == 64 ? PD_COMPLEX64 : d.bits == 128 ? PD_COMPLEX128 : -1;
    case DL_BOOL:
        return d.bits == 8 ? PD_BOOL : -1;
    default:
        return -1;
    }
}

/* NumPy array-interface typestr ("<f4", "|b1", ...) -> dtype, or -1. */
static int
dtype_of_typestr(const char *s)
{
    if (s == NULL || strlen(s) < 3 || (s[0] != '<' && s[0] != '|' &&
                                      s[0] != '=')) {
        return -1;
    }
    long n = strtol(s + 2, NULL, 10);
    switch (s[1]) {
    case 'b':
        return n == 1 ? PD_BOOL : -1;
    case 'i':
        return n == 1 ? PD_INT8 : n == 2 ? PD_INT16 : n == 4 ? PD_INT32
               : n == 8 ? PD_INT64 : -1;
    case 'u':
        return n == 1 ? PD_UINT8 : n == 2 ? PD_UINT16 : n == 4 ? PD_UINT32
               : n == 8 ? PD_UINT64 : -1;
    case 'f':
        return n == 2 ? PD_FLOAT16 : n == 4 ? PD_FLOAT32
               : n == 8 ? PD_FLOAT64 : -1;
    case 'c':
        return n == 8 ? PD_COMPLEX64 : n == 16 ? PD_COMPLEX128 : -1;
    default:
        return -1;
    }
}

/* ------------------------------------------------------------- views */

static void
view_init(pd_view *v)
{
    memset(v, 0, sizeof(*v));
    v->dtype = -1;
    v->device = PD_DEV_CPU;
    v->device_index = 0;
}

/* C-contiguity from element strides (NULL: contiguous); sizes of 1 may
 * carry any stride.  *count: the number of elements (overflow: -1). */
static int
shape_info(int ndim, const int64_t *shape, const int64_t *strides,
           size_t *count)
{
    size_t n = 1;
    uint64_t expect = 1; /* unsigned: a huge shape wraps, never overflows */
    int contiguous = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0) {
            return -1;
        }
        if (strides != NULL && shape[i] != 1 &&
            (strides[i] < 0 || (uint64_t)strides[i] != expect)) {
            contiguous = 0;
        }
        if (shape[i] != 0 && n > SIZE_MAX / (size_t)shape[i]) {
            return -1;
        }
        n *= (size_t)shape[i];
        expect *= shape[i] ? (uint64_t)shape[i] : 1;
    }
    *count = n;
    return n == 0 ? 1 : contiguous;
}

static int
view_from_buffer(PyObject *obj, unsigned flags, pd_view *v)
{
    int req = PyBUF_FORMAT | PyBUF_STRIDES;
    if (flags & PD_VIEW_WRITABLE) {
        req |= PyBUF_WRITABLE;
    }
    /* contiguous: 1 when the exporter vouched for C order (the fast paths'
     * common case: no stride check), -1 when the strides must tell */
    int contiguous = -1, formatted = 1;
    if ((flags & PD_VIEW_CONTIGUOUS) &&
        PyObject_GetBuffer(obj, &v->buf, req | PyBUF_C_CONTIGUOUS) == 0) {
        contiguous = 1;
    }
    else {
        PyErr_Clear();
        if (PyObject_GetBuffer(obj, &v->buf, req) < 0) {
            /* NumPy cannot describe some dtypes (ml_dtypes' bfloat16) in a
             * format string: take the bytes, dtype unknown */
            PyErr_Clear();
            formatted = 0;
            if (PyObject_GetBuffer(obj, &v->buf, req & ~PyBUF_FORMAT) < 0) {
                return -1;
            }
        }
    }
    v->how = PD_VIEW_BUFFER;
    v->ptr = v->buf.buf;
    v->nbytes = (size_t)v->buf.len;
    v->itemsize = v->buf.itemsize > 0 ? (size_t)v->buf.itemsize : 1;
    v->count = v->nbytes / v->itemsize;
    v->dtype = formatted ? pd_dtype_of_format(v->buf.format, v->buf.itemsize)
                         : -1;
    v->readonly = v->buf.readonly != 0;
    v->contiguous = contiguous >= 0 ? contiguous
                                    : PyBuffer_IsContiguous(&v->buf, 'C');
    return 0;
}

static int
dl_fill(pd_view *v, const dl_tensor *t, int readonly)
{
    v->device = t->device.device_type;
    v->device_index = t->device.device_id;
    v->dtype = dtype_of_dlpack(t->dtype);
    v->itemsize = ((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
    if (t->ndim < 0 || (t->ndim > 0 && t->shape == NULL)) {
        PyErr_SetString(PyExc_ValueError, "invalid DLPack tensor: shape");
        return -1;
    }
    int c = shape_info(t->ndim, t->shape, t->strides, &v->count);
    /* sizes are Py_ssize_t to Python: no array has 2**63 bytes */
    if (c < 0 || v->count > (size_t)PY_SSIZE_T_MAX ||
        (v->itemsize && v->count > (size_t)PY_SSIZE_T_MAX / v->itemsize)) {
        PyErr_SetString(PyExc_ValueError,
                        "invalid DLPack tensor: negative or overflowing shape");
        return -1;
    }
    v->contiguous = c;
    v->dlt = t;
    v->nbytes = v->count * v->itemsize;
    /* integer arithmetic: a byte_offset past the end must not be pointer
     * overflow (UB) before anyone checks the pointer */
    v->ptr = (void *)((uintptr_t)t->data + (uintptr_t)t->byte_offset);
    v->readonly = readonly;
    return 0;
}

static int
view_from_dlpack(PyObject *obj, unsigned flags, pd_view *v)
{
    PyObject *cap = NULL;
    /* ask for a versioned capsule (read-only flag); old producers take no
     * max_version */
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (meth == NULL) {
        return -1;
    }
    PyObject *kw = Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
    PyObject *noargs = PyTuple_New(0);
    if (kw != NULL && noargs != NULL) {
        cap = PyObject_Call(meth, noargs, kw);
        if (cap == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            cap = PyObject_CallNoArgs(meth);
        }
    }
    Py_XDECREF(kw);
    Py_XDECREF(noargs);
    Py_DECREF(meth);
    if (cap == NULL) {
        return -1;
    }
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m == NULL || PyCapsule_SetName(cap, "used_dltensor_versioned") <
                             0) {
            Py_DECREF(cap);
            return -1;
        }
        v->how = PD_VIEW_DLPACK_V1;
        v->capsule = cap;
        v->managed = m;
        if (m->major < 1) {
            PyErr_Format(PyExc_ValueError,
                         "DLPack version %u.%u is not supported",
                         (unsigned)m->major, (unsigned)m->minor);
            return -1;
        }
        return dl_fill(v, &m->t, (m->flags & DL_FLAG_READ_ONLY) != 0);
    }
    if (PyCapsule_IsValid(cap, "dltensor")) {
        dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m == NULL || PyCapsule_SetName(cap, "used_dltensor") < 0) {
            Py_DECREF(cap);
            return -1;
        }
        v->how = PD_VIEW_DLPACK;
        v->capsule = cap;
        v->managed = m;
        return dl_fill(v, &m->t, 0);
    }
    Py_DECREF(cap);
    PyErr_Format(PyExc_TypeError,
                 "%.100s.__dlpack__() did not return a DLPack capsule",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

/* __cuda_array_interface__ v2/v3: shape, typestr, data=(ptr, read_only),
 * strides (bytes, None = C-contiguous), mask None, stream. */
static int
view_from_cai(PyObject *obj, PyObject *d, pd_view *v)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError,
                        "__cuda_array_interface__ must be a dict");
        return -1;
    }
    PyObject *shape = PyDict_GetItemString(d, "shape");
    PyObject *typestr = PyDict_GetItemString(d, "typestr");
    PyObject *data = PyDict_GetItemString(d, "data");
    PyObject *strides = PyDict_GetItemString(d, "strides");
    PyObject *mask = PyDict_GetItemString(d, "mask");
    PyObject *stream = PyDict_GetItemString(d, "stream");
    if (shape == NULL || !PyTuple_Check(shape) || typestr == NULL ||
        !PyUnicode_Check(typestr) || data == NULL || !PyTuple_Check(data) ||
        PyTuple_GET_SIZE(data) != 2) {
        PyErr_SetString(PyExc_ValueError,
                        "invalid __cuda_array_interface__: needs shape "
                        "(tuple), typestr (str) and data (ptr, read_only)");
        return -1;
    }
    if (mask != NULL && mask != Py_None) {
        PyErr_SetString(PyExc_ValueError,
                        "masked CUDA arrays (__cuda_array_interface__ mask) "
                        "are not supported");
        return -1;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > 64) {
        PyErr_SetString(PyExc_ValueError,
                        "invalid __cuda_array_interface__: too many dims");
        return -1;
    }
    int64_t sh[64], st[64];
    int have_strides = strides != NULL && strides != Py_None;
    if (have_strides &&
        (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != ndim)) {
        PyErr_SetString(PyExc_ValueError,
                        "invalid __cuda_array_interface__: strides");
        return -1;
    }
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (ts == NULL) {
        return -1;
    }
    long itemsize = strlen(ts) >= 3 ? strtol(ts + 2, NULL, 10) : 0;
    if (itemsize <= 0 || itemsize > 64) {
        PyErr_Format(PyExc_ValueError,
                     "invalid __cuda_array_interface__ typestr %.20s", ts);
        return -1;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        sh[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (have_strides) {
            long long b = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
            if (b % itemsize != 0) {
                st[i] = INT64_MAX; /* never contiguous */
            }
            else {
                st[i] = b / itemsize;
            }
        }
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (ptr == NULL && PyErr_Occurred()) {
        return -1;
    }
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
    if (ro < 0) {
        return -1;
    }
    int c = shape_info((int)ndim, sh, have_strides ? st : NULL, &v->count);
    if (c < 0 || v->count > (size_t)PY_SSIZE_T_MAX / (size_t)itemsize) {
        PyErr_SetString(PyExc_ValueError,
                        "invalid __cuda_array_interface__: shape");
        return -1;
    }
    v->how = PD_VIEW_CAI;
    v->owner = Py_NewRef(obj);
    v->cai = Py_NewRef(d);
    v->ptr = ptr;
    v->itemsize = (size_t)itemsize;
    v->nbytes = v->count * v->itemsize;
    v->dtype = dtype_of_typestr(ts);
    v->readonly = ro;
    v->contiguous = c;
    v->device = PD_DEV_CUDA;
    v->device_index = -1; /* the pointer's device: asked of CUDA, later */
    v->stream = 0;
    if (stream != NULL && stream != Py_None) {
        v->stream = PyLong_AsLongLong(stream);
        if (v->stream == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (v->stream == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "invalid __cuda_array_interface__ stream 0 "
                            "(the spec forbids it)");
            return -1;
        }
    }
    return 0;
}

/* Whether obj says its memory is not host memory: __dlpack_device__() names
 * a device other than kDLCPU (1), or, without it, __cuda_array_interface__.
 * Called with no exception set; leaves none. */
static int
off_host(PyObject *obj)
{
    PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (d == NULL) {
        PyErr_Clear();
        int cai = PyObject_HasAttrString(obj, "__cuda_array_interface__");
        PyErr_Clear();
        return cai;
    }
    long type = PyTuple_Check(d) && PyTuple_GET_SIZE(d) >= 1
                    ? PyLong_AsLong(PyTuple_GET_ITEM(d, 0))
                    : -1;
    Py_DECREF(d);
    PyErr_Clear();
    return type != -1 && type != 1;
}

/* A flag of pd_view_get_host's own: the caller takes host memory only. */
#define VIEW_HOST_ONLY 0x100u

/* What obj's __dlpack_device__() declares: 0 with *type, *id set, or -1
 * (no method, or an answer that is not a (type, id) pair).  Called with no
 * exception set; leaves none. */
static int
dlpack_device(PyObject *obj, long *type, long *id)
{
    PyObject *d = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    int rc = -1;
    if (PyTuple_Check(d) && PyTuple_GET_SIZE(d) >= 2) {
        *type = PyLong_AsLong(PyTuple_GET_ITEM(d, 0));
        *id = PyLong_AsLong(PyTuple_GET_ITEM(d, 1));
        rc = PyErr_Occurred() ? -1 : 0;
    }
    Py_DECREF(d);
    PyErr_Clear();
    return rc;
}

/* The rules, one per protocol, in mpi4py's order (asbuffer.pxi): the first
 * the object offers describes it.  *offered: 0 when it offers none (the
 * TypeError then says so), 1 when a protocol it offers failed. */
static int
view_get(pd_module_state *st, PyObject *obj, unsigned flags, pd_view *v,
         int *offered)
{
    view_init(v);
    *offered = 1;
    /* 1. the buffer protocol: NumPy, bytes, memoryview, array.array, pyddp
     * Tensors on Python 3.12+ (PEP 688) */
    PyBufferProcs *bp = Py_TYPE(obj)->tp_as_buffer;
    if (bp != NULL && bp->bf_getbuffer != NULL) {
        if (view_from_buffer(obj, flags, v) == 0) {
            return 0;
        }
        /* CuPy 14 and JAX export a buffer that only host-resident arrays
         * can give (CuPy: managed or system memory; JAX: CPU buffers): a
         * device array refuses it and is described by DLPack or its
         * __cuda_array_interface__ instead.  Anything else keeps the
         * buffer protocol's error. */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (!off_host(obj)) {
            PyErr_Restore(et, ev, etb);
            return -1;
        }
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        view_init(v);
    }
    /* 2. pyddp Tensors before Python 3.12 (no PEP 688): their `_data` array's
     * buffer */
    if (st != NULL && st->TensorType != NULL &&
        PyObject_TypeCheck(obj, (PyTypeObject *)st->TensorType)) {
        PyObject *data = PyObject_GetAttr(obj, st->str_data);
        if (data == NULL) {
            return -1;
        }
        int rc = -1;
        bp = Py_TYPE(data)->tp_as_buffer;
        if (bp != NULL && bp->bf_getbuffer != NULL) {
            rc = view_from_buffer(data, flags, v);
        }
        else {
            PyErr_Format(PyExc_TypeError,
                         "%.100s._data must be an array, got %.100s",
                         Py_TYPE(obj)->tp_name, Py_TYPE(data)->tp_name);
        }
        Py_DECREF(data);
        return rc;
    }
    /* 3. DLPack (torch, JAX, CuPy, ...).  __dlpack_device__ is asked first,
     * as DLPack consumers do: CUDA arrays that also have a
     * __cuda_array_interface__ go to rule 4, which describes them without
     * an export (a producer's __dlpack__ may synchronise a stream, CuPy's
     * does); the device it declares is the view's.  A caller that takes
     * host memory only (the fast paths, VIEW_HOST_ONLY) skips the question
     * (torch's __dlpack_device__ costs a microsecond): it refuses a device
     * capsule anyway. */
    if (!(flags & PD_VIEW_NO_DLPACK) &&
        PyObject_HasAttrString(obj, "__dlpack__")) {
        long type = -1, id = 0;
        int declared = !(flags & VIEW_HOST_ONLY) &&
                       dlpack_device(obj, &type, &id) == 0;
        int cai = declared &&
                  (type == PD_DEV_CUDA || type == PD_DEV_CUDA_MANAGED) &&
                  PyObject_HasAttrString(obj, "__cuda_array_interface__");
        PyErr_Clear();
        if (!cai) {
            int rc = view_from_dlpack(obj, flags, v);
            if (rc < 0) {
                pd_view_release(v);
                return rc;
            }
            if (declared) {
                v->device = (int)type;
                v->device_index = (int)id;
            }
            return 0;
        }
    }
    /* 4. __cuda_array_interface__ (CuPy, Numba, JAX GPU arrays, ...) */
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (cai != NULL) {
        int rc = view_from_cai(obj, cai, v);
        Py_DECREF(cai);
        if (rc < 0) {
            pd_view_release(v);
        }
        return rc;
    }
    PyErr_Clear();
    *offered = 0;
    PyErr_Format(PyExc_TypeError,
                 "expected an array (buffer protocol, DLPack or "
                 "__cuda_array_interface__), got %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

int
pd_view_get(pd_module_state *st, PyObject *obj, unsigned flags, pd_view *v)
{
    int offered;
    return view_get(st, obj, flags, v, &offered);
}

int
pd_view_shape(const pd_view *v, long long *shape, int max)
{
    int ndim;
    if (v->how == PD_VIEW_BUFFER) {
        ndim = v->buf.ndim;
        if (ndim > 0 && v->buf.shape == NULL) {
            return -1;
        }
        for (int i = 0; i < ndim && i < max; i++) {
            shape[i] = (long long)v->buf.shape[i];
        }
        return ndim;
    }
    if (v->how == PD_VIEW_NUMPY) {
        const np_array_fields *a = (const np_array_fields *)v->owner;
        for (int i = 0; i < a->nd && i < max; i++) {
            shape[i] = (long long)a->dimensions[i];
        }
        return a->nd;
    }
    if ((v->how == PD_VIEW_DLPACK || v->how == PD_VIEW_DLPACK_V1) &&
        v->dlt != NULL) {
        const dl_tensor *t = v->dlt;
        ndim = t->ndim;
        for (int i = 0; i < ndim && i < max; i++) {
            shape[i] = (long long)t->shape[i];
        }
        return ndim;
    }
    return -1;
}

long long
pd_view_rows(const pd_view *v)
{
    long long first = 1;
    int ndim = pd_view_shape(v, &first, 1);
    return ndim < 0 ? -1 : first;
}

/* NumPy arrays read directly: the fast paths' arrays are almost always
 * exact numpy.ndarrays, and the buffer protocol costs NumPy 100-150 ns per
 * array (it builds the format string and shape anew and compares them with
 * its cache), a tenth of a 4 KiB gather on 2 ranks, which takes three.  The
 * array's fields are NumPy's public ABI (PyArrayObject_fields, which the
 * PyArray_DATA-style macros of every compiled extension read); of the dtype
 * (PyArray_Descr) only the members before the ones NumPy 2 moved.  The
 * first array seen is described both ways; any difference turns this off
 * for good. */
/* The pd_dtype and item size of a builtin NumPy type character (native
 * byte order), or -1. */
static int
np_dtype(char type, size_t *itemsize)
{
    switch (type) {
    case '?': *itemsize = 1; return PD_BOOL;
    case 'b': *itemsize = 1; return PD_INT8;
    case 'B': *itemsize = 1; return PD_UINT8;
    case 'h': *itemsize = 2; return PD_INT16;
    case 'H': *itemsize = 2; return PD_UINT16;
    case 'i': *itemsize = sizeof(int); break;
    case 'I': *itemsize = sizeof(unsigned); break;
    case 'l': *itemsize = sizeof(long); break;
    case 'L': *itemsize = sizeof(unsigned long); break;
    case 'q': *itemsize = 8; return PD_INT64;
    case 'Q': *itemsize = 8; return PD_UINT64;
    case 'e': *itemsize = 2; return PD_FLOAT16;
    case 'f': *itemsize = 4; return PD_FLOAT32;
    case 'd': *itemsize = 8; return PD_FLOAT64;
    case 'F': *itemsize = 8; return PD_COMPLEX64;
    case 'D': *itemsize = 16; return PD_COMPLEX128;
    default: return -1;
    }
    int sig = type == 'i' || type == 'l';
    return *itemsize == 4 ? (sig ? PD_INT32 : PD_UINT32)
           : *itemsize == 8 ? (sig ? PD_INT64 : PD_UINT64)
                            : -1;
}

/* 1: v describes obj (an exact numpy.ndarray, C-contiguous, aligned, of a
 * builtin native dtype pyddp knows, writable if asked); 0: obj is none of
 * that, nothing held (the buffer protocol decides). */
static int
np_view(PyObject *obj, int writable, pd_view *v)
{
    const np_array_fields *a = (const np_array_fields *)obj;
    const np_descr_fields *d = (const np_descr_fields *)a->descr;
    int need = NP_C_CONTIGUOUS | NP_ALIGNED | (writable ? NP_WRITEABLE : 0);
    if ((a->flags & need) != need || (a->flags & NP_WARN_ON_WRITE) ||
        d == NULL || d->type_num < 0 || d->type_num >= NP_NTYPES_BUILTIN ||
        d->byteorder == '>' || a->nd < 0 || a->nd > 64) {
        return 0;
    }
    size_t itemsize;
    int dt = np_dtype(d->type, &itemsize);
    if (dt < 0) {
        return 0;
    }
    size_t count = 1;
    for (int i = 0; i < a->nd; i++) {
        if (a->dimensions[i] < 0 ||
            __builtin_mul_overflow(count, (size_t)a->dimensions[i], &count)) {
            return 0;
        }
    }
    view_init(v);
    v->how = PD_VIEW_NUMPY;
    v->owner = Py_NewRef(obj);
    v->ptr = a->data;
    v->count = count;
    v->itemsize = itemsize;
    v->nbytes = count * itemsize;
    v->dtype = dt;
    v->readonly = !(a->flags & NP_WRITEABLE);
    v->contiguous = 1;
    return 1;
}

/* Whether obj is an exact numpy.ndarray (the type found in sys.modules once
 * NumPy is imported) and arrays may be read directly: the first one that
 * np_view takes is described by the buffer protocol too, and any
 * difference turns the direct reading off. */
static int
np_direct(pd_module_state *st, PyObject *obj)
{
    if (st == NULL || st->np_direct < 0) {
        return 0;
    }
    if (st->np_direct > 0) {
        return Py_TYPE(obj) == (PyTypeObject *)st->ndarray_type;
    }
    if (strcmp(Py_TYPE(obj)->tp_name, "numpy.ndarray") != 0) {
        return 0;
    }
    if (st->ndarray_type == NULL) {
        PyObject *np = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");
        PyObject *t = np != NULL ? PyObject_GetAttrString(np, "ndarray") : NULL;
        if (t == NULL || !PyType_Check(t)) {
            PyErr_Clear();
            Py_XDECREF(t);
            return 0;
        }
        st->ndarray_type = t;
    }
    if (Py_TYPE(obj) != (PyTypeObject *)st->ndarray_type) {
        return 0;
    }
    pd_view d, b;
    if (!np_view(obj, 0, &d)) {
        return 0; /* not one to compare with: next time */
    }
    int offered;
    if (view_get(st, obj, PD_VIEW_CONTIGUOUS | PD_VIEW_NO_DLPACK, &b,
                 &offered) < 0) {
        PyErr_Clear();
        pd_view_release(&d);
        st->np_direct = -1;
        return 0;
    }
    long long ds[64], bs[64];
    int dn = pd_view_shape(&d, ds, 64), bn = pd_view_shape(&b, bs, 64);
    int same = d.ptr == b.ptr && d.nbytes == b.nbytes &&
               d.itemsize == b.itemsize && d.dtype == b.dtype &&
               d.readonly == b.readonly && b.contiguous && dn == bn &&
               dn >= 0 && memcmp(ds, bs, sizeof(long long) * (size_t)dn) == 0;
    pd_view_release(&b);
    pd_view_release(&d);
    st->np_direct = same ? 1 : -1;
    return same;
}

int
pd_view_get_host(pd_module_state *st, PyObject *obj, int writable,
                 pd_view *v)
{
    if (np_direct(st, obj) && np_view(obj, writable, v)) {
        return 1;
    }
    if (pd_view_get(st, obj,
                    PD_VIEW_CONTIGUOUS | VIEW_HOST_ONLY |
                        (writable ? PD_VIEW_WRITABLE : 0),
                    v) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (v->device != PD_DEV_CPU || !v->contiguous || v->dtype < 0 ||
        (writable && v->readonly)) {
        pd_view_release(v);
        return 0;
    }
    return 1;
}

void
pd_view_release(pd_view *v)
{
    /* A view is often released on an error path: the producer's deleter and
     * the objects' destructors may run Python code, which must not see (nor
     * clobber) the pending exception. */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    switch (v->how) {
    case PD_VIEW_BUFFER:
        PyBuffer_Release(&v->buf);
        break;
    case PD_VIEW_DLPACK: {
        dl_managed *m = v->managed;
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
        break;
    }
    case PD_VIEW_DLPACK_V1: {
        dl_managed_v *m = v->managed;
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
        break;
    }
    default:
        break;
    }
    Py_CLEAR(v->capsule);
    Py_CLEAR(v->owner);
    Py_CLEAR(v->cai);
    v->dlt = NULL;
    v->how = PD_VIEW_NONE;
    v->managed = NULL;
    if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(NULL); /* a deleter that raised: report it */
    }
    if (et != NULL) {
        PyErr_Restore(et, ev, tb);
    }
}

const char *
pd_device_name(int device)
{
    switch (device) {
    case PD_DEV_CPU:
        return "cpu";
    case PD_DEV_CUDA:
        return "cuda";
    case PD_DEV_CUDA_HOST:
        return "cuda_host";
    case PD_DEV_CUDA_MANAGED:
        return "cuda_managed";
    default:
        return "unknown";
    }
}

/* ------------------------------------------------------ Python entries */

/* _register_tensor_type(cls): pyddp's Tensor class, viewed through its
 * `_data` array where the interpreter has no PEP 688 buffers. */
static PyObject *
register_tensor_type(PyObject *m, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "expected a class, got %.100s",
                     Py_TYPE(cls)->tp_name);
        return NULL;
    }
    pd_module_state *st = pd_get_state(m);
    Py_XSETREF(st->TensorType, Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* (shape, strides in bytes or None for C order) of a view, from what its
 * exporter described. */
static PyObject *
shape_strides(const pd_view *v)
{
    if (v->how == PD_VIEW_CAI) {
        PyObject *sh = PyDict_GetItemString(v->cai, "shape");
        PyObject *st = PyDict_GetItemString(v->cai, "strides");
        return Py_BuildValue("(OO)", sh, st != NULL ? st : Py_None);
    }
    Py_ssize_t ndim;
    PyObject *shape, *strides = NULL;
    if (v->how == PD_VIEW_BUFFER) {
        ndim = v->buf.ndim;
    }
    else {
        ndim = ((const dl_tensor *)v->dlt)->ndim;
    }
    shape = PyTuple_New(ndim);
    if (shape == NULL) {
        return NULL;
    }
    int has_strides = v->how == PD_VIEW_BUFFER
                          ? v->buf.strides != NULL
                          : ((const dl_tensor *)v->dlt)->strides != NULL;
    if (has_strides && (strides = PyTuple_New(ndim)) == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        long long n, b = 0;
        if (v->how == PD_VIEW_BUFFER) {
            n = v->buf.shape != NULL ? (long long)v->buf.shape[i]
                                     : (long long)v->count;
            b = has_strides ? (long long)v->buf.strides[i] : 0;
        }
        else {
            const dl_tensor *t = v->dlt;
            n = (long long)t->shape[i];
            if (has_strides &&
                __builtin_mul_overflow((long long)t->strides[i],
                                       (long long)v->itemsize, &b)) {
                PyErr_SetString(PyExc_ValueError,
                                "invalid DLPack tensor: a stride in bytes "
                                "overflows 64 bits");
                goto fail;
            }
        }
        PyObject *pn = PyLong_FromLongLong(n);
        if (pn == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(shape, i, pn);
        if (has_strides) {
            PyObject *pb = PyLong_FromLongLong(b);
            if (pb == NULL) {
                goto fail;
            }
            PyTuple_SET_ITEM(strides, i, pb);
        }
    }
    return Py_BuildValue("(NN)", shape, has_strides ? strides : Py_NewRef(Py_None));
fail:
    Py_DECREF(shape);
    Py_XDECREF(strides);
    return NULL;
}

/* The error of a view that failed, worded for the argument `name`: an
 * object offering no protocol is "not an array"; a protocol that failed keeps
 * its message (and its exception as the cause). */
static void
name_error(const char *name, PyObject *obj, int offered)
{
    const char *tp = Py_TYPE(obj)->tp_name, *dot = strrchr(tp, '.');
    if (!offered) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "%s must be an array (numpy.ndarray, torch tensor, "
                     "DLPack, __cuda_array_interface__ or buffer object), "
                     "got %.100s", name, dot != NULL ? dot + 1 : tp);
        return;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (ev == NULL) {
        Py_XDECREF(et);
        Py_XDECREF(tb);
        PyErr_Format(PyExc_TypeError, "%s: cannot describe this array", name);
        return;
    }
    if (tb != NULL) {
        PyException_SetTraceback(ev, tb);
    }
    PyErr_Format(PyExc_TypeError, "%s: cannot describe this array: %S", name,
                 ev);
    PyObject *et2, *ev2, *tb2;
    PyErr_Fetch(&et2, &ev2, &tb2);
    PyErr_NormalizeException(&et2, &ev2, &tb2);
    PyException_SetCause(ev2, ev); /* steals ev */
    PyException_SetContext(ev2, Py_NewRef(ev));
    PyErr_Restore(et2, ev2, tb2);
    Py_XDECREF(et);
    Py_XDECREF(tb);
}

/* describe_array(obj, writable=False, dlpack=True, name=None) -> dict: what
 * the adapter sees.  pyddp._interop's describe for every object it does not
 * hold itself (the one entry, see there), the tests, and the fuzz targets of
 * the array descriptions.  With a name, errors are worded for that
 * argument. */
static PyObject *
describe_array(PyObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"obj", "writable", "dlpack", "name", NULL};
    PyObject *obj;
    int writable = 0, dlpack = 1;
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|ppz:describe_array",
                                     kwlist, &obj, &writable, &dlpack,
                                     &name)) {
        return NULL;
    }
    pd_view v;
    unsigned flags = (writable ? PD_VIEW_WRITABLE : 0) |
                     (dlpack ? 0 : PD_VIEW_NO_DLPACK);
    int offered;
    if (view_get(pd_get_state(m), obj, flags, &v, &offered) < 0) {
        if (name != NULL) {
            name_error(name, obj, offered);
        }
        return NULL;
    }
    static const char *const hows[] = {"none", "buffer", "dlpack",
                                       "dlpack", "cuda_array_interface"};
    PyObject *ss = shape_strides(&v);
    if (ss == NULL) {
        pd_view_release(&v);
        return NULL;
    }
    PyObject *r = Py_BuildValue(
        "{s:s,s:N,s:n,s:n,s:n,s:s,s:s,s:i,s:O,s:O,s:L,s:O,s:O}", "via",
        hows[v.how],
        "ptr", PyLong_FromVoidPtr(v.ptr), "nbytes", (Py_ssize_t)v.nbytes,
        "count", (Py_ssize_t)v.count, "itemsize", (Py_ssize_t)v.itemsize,
        "dtype", v.dtype >= 0 ? pd_dtype_name((pd_dtype)v.dtype) : "unknown",
        "device", pd_device_name(v.device), "device_index", v.device_index,
        "readonly", v.readonly ? Py_True : Py_False, "contiguous",
        v.contiguous ? Py_True : Py_False, "stream", v.stream, "shape",
        PyTuple_GET_ITEM(ss, 0), "strides", PyTuple_GET_ITEM(ss, 1));
    Py_DECREF(ss);
    pd_view_release(&v);
    return r;
}

static PyMethodDef buffer_methods[] = {
    {"_register_tensor_type", (PyCFunction)register_tensor_type, METH_O,
     "_register_tensor_type(cls): view instances of cls through their "
     "`_data` array (Python < 3.12 has no PEP 688 buffers)."},
    {"describe_array", (PyCFunction)(void (*)(void))describe_array,
     METH_VARARGS | METH_KEYWORDS,
     "describe_array(obj, writable=False, dlpack=True, name=None) -> dict: "
     "how the array adapter views obj (via, ptr, nbytes, count, itemsize, dtype, device, "
     "device_index, readonly, contiguous, stream, shape, strides: bytes or "
     "None for C order).  dlpack=False skips DLPack, e.g. to describe a "
     "CUDA array from its __cuda_array_interface__ without a stream sync.  "
     "With a name, errors are TypeErrors naming that argument."},
    {NULL, NULL, 0, NULL},
};

int
pd_buffers_add(PyObject *m, pd_module_state *st)
{
    st->str_data = PyUnicode_InternFromString("_data");
    if (st->str_data == NULL) {
        return -1;
    }
    return PyModule_AddFunctions(m, buffer_methods);
}
