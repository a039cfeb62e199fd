/* pyddp._C: loading libcudart and libnccl (csrc/cuda/loader.c), the CUDA
 * runtime calls pyddp.cuda needs, NCCL's version / unique id / error
 * strings, and PinnedBuffer (page-locked host memory with the buffer
 * protocol).  pyddp/cuda/_lib.py builds the candidate paths and calls the
 * loaders; every other function here needs its library loaded first.
 * CUDA and NCCL calls run with the GIL released; a failed CUDA call raises
 * RuntimeError with cudaGetErrorName and cudaGetErrorString. */
#include "binding.h"

#include <stdatomic.h>

#include <limits.h>
#include <stdint.h>

#include "../cuda/cudawrap.h"

#define LOAD_REPORT_CAP 8192
#define LOAD_PATH_CAP 4096

/* torch's "Cannot re-initialize CUDA in forked subprocess", with what to do. */
#define CUDA_AFTER_FORK                                                       \
    "CUDA cannot be used in this process: it was forked after its parent "    \
    "had used CUDA, and the CUDA runtime refuses such a child "               \
    "(cudaErrorInitializationError).  Start processes that use CUDA with "    \
    "the 'spawn' start method (pyddp.multiprocessing.spawn, "                 \
    "multiprocessing_context='spawn' for DataLoader workers), or use no "     \
    "CUDA in the parent before it forks (in a notebook: restart the kernel "  \
    "and call pyddp.notebook_launcher before any CUDA call)"

/* The runtime's table, or NULL with an exception: not loaded, or this is a
 * child forked after CUDA was used. */
static const struct pd_cudart *
cudart_usable(void)
{
    const struct pd_cudart *rt = pd_cudart_get();
    if (rt == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "libcudart is not loaded (pyddp.cuda loads it: "
                        "pyddp.cuda._lib.load_cudart())");
    }
    else if (pd_cudart_fork_state() == 2) {
        PyErr_SetString(PyExc_RuntimeError, CUDA_AFTER_FORK);
        return NULL;
    }
    return rt;
}

/* As cudart_usable, for a call that initialises CUDA (a fork from now on
 * gives a child that cannot use it), where there is a device: without one
 * the runtime initialises nothing, and a forked child has lost nothing. */
static const struct pd_cudart *
cudart(void)
{
    static atomic_int has_device = -1; /* -1: not asked yet */
    const struct pd_cudart *rt = cudart_usable();
    if (rt != NULL && atomic_load(&has_device) != 0) {
        if (atomic_load(&has_device) < 0) {
            int n = 0;
            if (rt->GetDeviceCount(&n) != PD_CUDA_SUCCESS) {
                n = 0;
                rt->GetLastError();
            }
            atomic_store(&has_device, n > 0);
        }
        if (atomic_load(&has_device) > 0) {
            pd_cudart_mark_used();
        }
    }
    return rt;
}

static const struct pd_nccl *
nccl(void)
{
    const struct pd_nccl *nc = pd_nccl_get();
    if (nc == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "libnccl is not loaded (pyddp.cuda.nccl loads it: "
                        "pyddp.cuda._lib.load_nccl())");
    }
    return nc;
}

/* RuntimeError "<what>: cudaErrorX (its description)"; clears the runtime's
 * last error so it does not resurface in a later cudaGetLastError. */
static PyObject *
cuda_error(const struct pd_cudart *rt, const char *what, pd_cuda_err e)
{
    rt->GetLastError();
    PyErr_Format(PyExc_RuntimeError, "%s: %s (%s)", what, rt->GetErrorName(e),
                 rt->GetErrorString(e));
    return NULL;
}

/* The one shape of every wrapper of a runtime call: its arguments checked
 * first (addr_arg, int_arg: errors name the function and the argument),
 * then the runtime got (cudart(), or cudart_usable() for a call that
 * initialises nothing), then RT_CALL: the call made without the GIL and,
 * when it fails, the RuntimeError "<what>: cudaErrorX (its description)"
 * returned from the wrapper (mpi4py's CHKERR); then the result built. */
#define RT_CALL(rt, what, call)                                               \
    do {                                                                      \
        pd_cuda_err rt_err_;                                                  \
        Py_BEGIN_ALLOW_THREADS                                                \
        rt_err_ = (call);                                                     \
        Py_END_ALLOW_THREADS                                                  \
        if (rt_err_ != PD_CUDA_SUCCESS) {                                     \
            return cuda_error((rt), (what), rt_err_);                         \
        }                                                                     \
    } while (0)

/* The same for NCCL: RuntimeError "<what>: <ncclGetErrorString>". */
#define NCCL_CALL(nc, what, call)                                             \
    do {                                                                      \
        pd_nccl_res nccl_res_;                                                \
        Py_BEGIN_ALLOW_THREADS                                                \
        nccl_res_ = (call);                                                   \
        Py_END_ALLOW_THREADS                                                  \
        if (nccl_res_ != PD_NCCL_SUCCESS) {                                   \
            return PyErr_Format(PyExc_RuntimeError, "%s: %s", (what),         \
                                (nc)->GetErrorString(nccl_res_));             \
        }                                                                     \
    } while (0)

/* An address (a device pointer or cudaStream_t) given as a Python int. */
static int
addr_arg(PyObject *o, const char *fn, const char *name, uintptr_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int (an address), "
                     "not %.100s", fn, name, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: %s must be an address, an int in "
                     "[0, 2**64), got %R", fn, name, o);
        return -1;
    }
    if (v > UINTPTR_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s=%R does not fit a pointer", fn,
                     name, o);
        return -1;
    }
    *out = (uintptr_t)v;
    return 0;
}

/* A Python int that fits a C int. */
static int
int_arg(PyObject *o, const char *fn, const char *name, int *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.100s", fn,
                     name, Py_TYPE(o)->tp_name);
        return -1;
    }
    long v = PyLong_AsLong(o);
    if ((v == -1 && PyErr_Occurred()) || v < INT_MIN || v > INT_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s: %s=%R does not fit a C int",
                     fn, name, o);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* ------------------------------------------------------------- loading */

/* What a loader call takes: the candidate paths as file-system bytes (kept
 * alive by keep), a PyMem_Malloc'ed array of their char pointers, and the
 * buffers the loader writes its report and the loaded path into. */
typedef struct {
    PyObject *keep;
    const char **paths;
    int n;
    char *report; /* LOAD_REPORT_CAP bytes, then path: LOAD_PATH_CAP */
    char *path;
} load_args;

static void
load_args_free(load_args *a)
{
    Py_CLEAR(a->keep);
    PyMem_Free(a->paths);
    PyMem_Free(a->report);
    a->paths = NULL;
    a->report = NULL;
}

static int paths_arg(PyObject *seq, const char *fn, PyObject **keep,
                     const char ***out, int *n);

static int
load_args_get(PyObject *seq, const char *fn, load_args *a)
{
    memset(a, 0, sizeof(*a));
    if (paths_arg(seq, fn, &a->keep, &a->paths, &a->n) < 0) {
        return -1;
    }
    a->report = PyMem_Malloc(LOAD_REPORT_CAP + LOAD_PATH_CAP);
    if (a->report == NULL) {
        load_args_free(a);
        PyErr_NoMemory();
        return -1;
    }
    a->path = a->report + LOAD_REPORT_CAP;
    return 0;
}

static int
paths_arg(PyObject *seq, const char *fn, PyObject **keep, const char ***out,
          int *n)
{
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s: paths must be a list of str, "
                     "not %.100s", fn, Py_TYPE(seq)->tp_name);
        return -1;
    }
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) {
        return -1;
    }
    Py_ssize_t len = PyTuple_GET_SIZE(t);
    if (len > 1024) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "%s: at most 1024 paths", fn);
        return -1;
    }
    PyObject *enc = PyTuple_New(len);
    const char **p = PyMem_Malloc(sizeof(char *) * (size_t)(len > 0 ? len : 1));
    if (enc == NULL || p == NULL) {
        Py_DECREF(t);
        Py_XDECREF(enc);
        PyMem_Free(p);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(t, i), &b)) {
            PyErr_Format(PyExc_TypeError, "%s: paths[%zd] must be a str "
                         "without NUL characters", fn, i);
            Py_DECREF(t);
            Py_DECREF(enc);
            PyMem_Free(p);
            return -1;
        }
        PyTuple_SET_ITEM(enc, i, b);
        p[i] = PyBytes_AS_STRING(b);
    }
    Py_DECREF(t);
    *keep = enc;
    *out = p;
    *n = (int)len;
    return 0;
}

/* The report without its final newline, as the message of a RuntimeError. */
static PyObject *
load_error(const char *report)
{
    size_t len = strlen(report);
    while (len > 0 && report[len - 1] == '\n') {
        len--;
    }
    PyObject *msg = PyUnicode_DecodeFSDefaultAndSize(report, (Py_ssize_t)len);
    if (msg != NULL) {
        PyErr_SetObject(PyExc_RuntimeError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

static PyObject *
cuda_load(PyObject *module, PyObject *arg)
{
    load_args a;
    if (load_args_get(arg, "_cuda_load", &a) < 0) {
        return NULL;
    }
    const struct pd_cudart *rt;
    int runtime = 0, driver = 0;
    pd_cuda_err e1 = PD_CUDA_SUCCESS, e2 = PD_CUDA_SUCCESS;
    Py_BEGIN_ALLOW_THREADS
    rt = pd_cudart_load(a.paths, a.n, a.report, LOAD_REPORT_CAP, a.path);
    if (rt != NULL) {
        e1 = rt->RuntimeGetVersion(&runtime);
        e2 = rt->DriverGetVersion(&driver); /* 0 without a driver */
    }
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (rt == NULL) {
        load_error(a.report);
    } else if (e1 != PD_CUDA_SUCCESS) {
        cuda_error(rt, "cudaRuntimeGetVersion", e1);
    } else if (e2 != PD_CUDA_SUCCESS) {
        cuda_error(rt, "cudaDriverGetVersion", e2);
    } else {
        PyObject *p = PyUnicode_DecodeFSDefault(a.path);
        if (p != NULL) {
            ret = Py_BuildValue("{sNsisi}", "path", p, "runtime_version",
                                runtime, "driver_version", driver);
        }
    }
    load_args_free(&a);
    return ret;
}

static PyObject *
nccl_load(PyObject *module, PyObject *arg)
{
    load_args a;
    if (load_args_get(arg, "_nccl_load", &a) < 0) {
        return NULL;
    }
    const struct pd_nccl *nc;
    int version = 0;
    Py_BEGIN_ALLOW_THREADS
    nc = pd_nccl_load(a.paths, a.n, a.report, LOAD_REPORT_CAP, a.path, &version);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL;
    if (nc == NULL) {
        load_error(a.report);
    } else {
        PyObject *p = PyUnicode_DecodeFSDefault(a.path);
        if (p != NULL) {
            ret = Py_BuildValue("(Ni)", p, version);
        }
    }
    load_args_free(&a);
    return ret;
}

/* ------------------------------------------------------------- runtime */

static PyObject *
cuda_device_count(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    /* never raises once loaded: a forked child that cannot use CUDA has
     * no device */
    if (pd_cudart_get() != NULL && pd_cudart_fork_state() == 2) {
        return Py_BuildValue("(ii)", 0, PD_CUDA_ERR_INITIALIZATION);
    }
    /* marks CUDA used only when it found a device: without one a forked
     * child has lost nothing */
    const struct pd_cudart *rt = cudart_usable();
    if (rt == NULL) {
        return NULL;
    }
    int count = 0;
    pd_cuda_err e;
    Py_BEGIN_ALLOW_THREADS
    e = rt->GetDeviceCount(&count);
    if (e != PD_CUDA_SUCCESS) {
        count = 0;
        rt->GetLastError();
    }
    Py_END_ALLOW_THREADS
    if (count > 0) {
        pd_cudart_mark_used();
    }
    return Py_BuildValue("(ii)", count, e);
}

static PyObject *
cuda_get_device(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    int dev = -1;
    RT_CALL(rt, "cudaGetDevice", rt->GetDevice(&dev));
    return PyLong_FromLong(dev);
}

static PyObject *
cuda_set_device(PyObject *module, PyObject *arg)
{
    int dev;
    if (int_arg(arg, "cuda_set_device", "device", &dev) < 0) {
        return NULL;
    }
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    char what[64];
    PyOS_snprintf(what, sizeof(what), "cudaSetDevice(%d)", dev);
    RT_CALL(rt, what, rt->SetDevice(dev));
    Py_RETURN_NONE;
}

static PyObject *
cuda_synchronize(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    RT_CALL(rt, "cudaDeviceSynchronize", rt->DeviceSynchronize());
    Py_RETURN_NONE;
}

static PyObject *
cuda_stream_synchronize(PyObject *module, PyObject *arg)
{
    uintptr_t s;
    if (addr_arg(arg, "cuda_stream_synchronize", "stream", &s) < 0) {
        return NULL;
    }
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    RT_CALL(rt, "cudaStreamSynchronize",
            rt->StreamSynchronize((pd_cuda_stream)s));
    Py_RETURN_NONE;
}

static PyObject *
cuda_memcpy_async(PyObject *module, PyObject *args)
{
    static const char fn[] = "cuda_memcpy_async";
    PyObject *dst_o, *src_o, *stream_o;
    Py_ssize_t nbytes;
    int kind;
    uintptr_t dst, src, s;
    if (!PyArg_ParseTuple(args, "OOniO:cuda_memcpy_async", &dst_o, &src_o,
                          &nbytes, &kind, &stream_o) ||
        addr_arg(dst_o, fn, "dst", &dst) < 0 ||
        addr_arg(src_o, fn, "src", &src) < 0 ||
        addr_arg(stream_o, fn, "stream", &s) < 0) {
        return NULL;
    }
    if (nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "%s: nbytes must be >= 0, got %zd", fn,
                     nbytes);
        return NULL;
    }
    if (kind < PD_CUDA_H2H || kind > PD_CUDA_DEFAULT) {
        PyErr_Format(PyExc_ValueError, "%s: kind must be a cudaMemcpyKind "
                     "(0 host-to-host ... 4 default), got %d", fn, kind);
        return NULL;
    }
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    RT_CALL(rt, "cudaMemcpyAsync",
            rt->MemcpyAsync((void *)dst, (const void *)src, (size_t)nbytes,
                            kind, (pd_cuda_stream)s));
    Py_RETURN_NONE;
}

static PyObject *
cuda_pointer_attributes(PyObject *module, PyObject *arg)
{
    uintptr_t p;
    if (addr_arg(arg, "cuda_pointer_attributes", "ptr", &p) < 0) {
        return NULL;
    }
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    pd_cuda_ptr_attrs a;
    memset(&a, 0, sizeof(a));
    RT_CALL(rt, "cudaPointerGetAttributes",
            rt->PointerGetAttributes(&a, (const void *)p));
    return Py_BuildValue("(ii)", a.type, a.device);
}

static PyObject *
cuda_error_string(PyObject *module, PyObject *arg)
{
    int code;
    if (int_arg(arg, "cuda_error_string", "code", &code) < 0) {
        return NULL;
    }
    const struct pd_cudart *rt = cudart_usable();
    if (rt == NULL) {
        return NULL;
    }
    return PyUnicode_FromFormat("%s (%s)", rt->GetErrorName(code),
                                rt->GetErrorString(code));
}

/* ---------------------------------------------------------- PinnedBuffer */

typedef struct {
    PyObject_HEAD
    void *ptr;
    Py_ssize_t nbytes;
} PinnedBufferObject;

static void
PB_dealloc(PinnedBufferObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    const struct pd_cudart *rt = pd_cudart_get();
    if (self->ptr != NULL && rt != NULL) {
        void *p = self->ptr;
        Py_BEGIN_ALLOW_THREADS
        rt->FreeHost(p);
        Py_END_ALLOW_THREADS
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int
PB_getbuffer(PinnedBufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->nbytes,
                             0, flags);
}

static PyObject *
PB_get_ptr(PinnedBufferObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromVoidPtr(self->ptr);
}

static PyObject *
PB_get_nbytes(PinnedBufferObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->nbytes);
}

static PyGetSetDef PB_getset[] = {
    {"ptr", (getter)PB_get_ptr, NULL, "the host address", NULL},
    {"nbytes", (getter)PB_get_nbytes, NULL, "bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot PB_slots[] = {
    {Py_tp_dealloc, PB_dealloc},
    {Py_bf_getbuffer, PB_getbuffer},
    {Py_tp_getset, PB_getset},
    {Py_tp_doc, "Page-locked host memory (cudaHostAlloc, portable), writable "
                "through the buffer protocol; freed with cudaFreeHost."},
    {0, NULL},
};

static PyType_Spec PB_spec = {
    .name = "pyddp._C.PinnedBuffer",
    .basicsize = sizeof(PinnedBufferObject),
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION
    .flags = PD_TPFLAGS | Py_TPFLAGS_DISALLOW_INSTANTIATION,
#else
    .flags = PD_TPFLAGS,
#endif
    .slots = PB_slots,
};

static PyObject *
cuda_host_alloc(PyObject *module, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "cuda_host_alloc: nbytes must be >= 0, "
                     "got %zd", n);
        return NULL;
    }
    const struct pd_cudart *rt = cudart();
    if (rt == NULL) {
        return NULL;
    }
    pd_module_state *st = pd_get_state(module);
    PinnedBufferObject *b = PyObject_New(PinnedBufferObject,
                                         st->PinnedBufferType);
    if (b == NULL) {
        return NULL;
    }
    b->ptr = NULL;
    b->nbytes = n;
    void *p = NULL;
    pd_cuda_err e;
    Py_BEGIN_ALLOW_THREADS
    /* at least one byte: an empty buffer still has an address */
    e = rt->HostAlloc(&p, n > 0 ? (size_t)n : 1, PD_CUDA_HOST_ALLOC_PORTABLE);
    Py_END_ALLOW_THREADS
    if (e != PD_CUDA_SUCCESS) {
        Py_DECREF(b);
        char what[80];
        PyOS_snprintf(what, sizeof(what), "cudaHostAlloc(%zd bytes)", n);
        return cuda_error(rt, what, e);
    }
    b->ptr = p;
    return (PyObject *)b;
}

static PyObject *
cuda_fork_state(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(pd_cudart_fork_state());
}

/* ------------------------------------------------------------------ NCCL */

static PyObject *
nccl_version(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const struct pd_nccl *nc = nccl();
    if (nc == NULL) {
        return NULL;
    }
    int v = 0;
    NCCL_CALL(nc, "ncclGetVersion", nc->GetVersion(&v));
    return PyLong_FromLong(v);
}

static PyObject *
nccl_unique_id(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    const struct pd_nccl *nc = nccl();
    if (nc == NULL) {
        return NULL;
    }
    pd_nccl_uid id;
    memset(&id, 0, sizeof(id));
    NCCL_CALL(nc, "ncclGetUniqueId", nc->GetUniqueId(&id));
    return PyBytes_FromStringAndSize(id.internal, sizeof(id.internal));
}

static PyObject *
nccl_error_string(PyObject *module, PyObject *arg)
{
    int code;
    if (int_arg(arg, "nccl_error_string", "code", &code) < 0) {
        return NULL;
    }
    const struct pd_nccl *nc = nccl();
    if (nc == NULL) {
        return NULL;
    }
    return PyUnicode_FromString(nc->GetErrorString(code));
}

static PyMethodDef cuda_methods[] = {
    {"_cuda_load", cuda_load, METH_O,
     "_cuda_load(paths) -> dict\n\n"
     "Load libcudart from the first of paths that has every required "
     "symbol (once per process: later calls return the first outcome).  "
     "Returns {'path', 'runtime_version', 'driver_version'} (driver 0: no "
     "driver); raises RuntimeError with one line per path tried, "
     "'<path>: <why>'."},
    {"_nccl_load", nccl_load, METH_O,
     "_nccl_load(paths) -> (path, version)\n\n"
     "Load libnccl as _cuda_load loads libcudart; a library older than NCCL "
     "2.18 is refused.  version is ncclGetVersion's code (2.19.3: 21903)."},
    {"cuda_device_count", cuda_device_count, METH_NOARGS,
     "cuda_device_count() -> (count, error)\n\n"
     "cudaGetDeviceCount: count is 0 when the runtime reports an error "
     "(35: no or an old driver, 100: no device); never raises once "
     "libcudart is loaded."},
    {"cuda_get_device", cuda_get_device, METH_NOARGS,
     "cuda_get_device() -> int\n\ncudaGetDevice."},
    {"cuda_set_device", cuda_set_device, METH_O,
     "cuda_set_device(device) -> None\n\ncudaSetDevice."},
    {"cuda_synchronize", cuda_synchronize, METH_NOARGS,
     "cuda_synchronize() -> None\n\ncudaDeviceSynchronize (current device)."},
    {"cuda_stream_synchronize", cuda_stream_synchronize, METH_O,
     "cuda_stream_synchronize(stream) -> None\n\n"
     "cudaStreamSynchronize; stream is a cudaStream_t as an int (0 or 1: "
     "the legacy default stream, 2: per-thread)."},
    {"cuda_memcpy_async", cuda_memcpy_async, METH_VARARGS,
     "cuda_memcpy_async(dst, src, nbytes, kind, stream) -> None\n\n"
     "cudaMemcpyAsync; addresses and stream as ints, kind a cudaMemcpyKind "
     "(0 H2H, 1 H2D, 2 D2H, 3 D2D, 4 default)."},
    {"cuda_pointer_attributes", cuda_pointer_attributes, METH_O,
     "cuda_pointer_attributes(ptr) -> (memory_type, device)\n\n"
     "cudaPointerGetAttributes: memory_type 0 unregistered host memory, "
     "1 pinned host, 2 device, 3 managed."},
    {"cuda_host_alloc", cuda_host_alloc, METH_O,
     "cuda_host_alloc(nbytes) -> PinnedBuffer\n\n"
     "Page-locked host memory (cudaHostAlloc, portable to every device), "
     "freed with cudaFreeHost when the buffer is."},
    {"cuda_fork_state", cuda_fork_state, METH_NOARGS,
     "cuda_fork_state() -> int\n\n"
     "0: this process has not used CUDA through pyddp (a fork is safe); "
     "1: it has (a forked child cannot use CUDA); 2: it is such a child "
     "(every CUDA function raises RuntimeError, CUDA_AFTER_FORK)."},
    {"cuda_error_string", cuda_error_string, METH_O,
     "cuda_error_string(code) -> str\n\n"
     "'<cudaGetErrorName> (<cudaGetErrorString>)' for a cudaError_t."},
    {"nccl_version", nccl_version, METH_NOARGS,
     "nccl_version() -> int\n\nncclGetVersion's code (2.19.3: 21903)."},
    {"nccl_unique_id", nccl_unique_id, METH_NOARGS,
     "nccl_unique_id() -> bytes\n\n"
     "ncclGetUniqueId: the 128 bytes rank 0 shares with the others."},
    {"nccl_error_string", nccl_error_string, METH_O,
     "nccl_error_string(code) -> str\n\nncclGetErrorString."},
    {NULL, NULL, 0, NULL},
};

int
pd_cuda_add_functions(PyObject *m, pd_module_state *st)
{
    st->PinnedBufferType = (PyTypeObject *)PyType_FromModuleAndSpec(
        m, &PB_spec, NULL);
    if (st->PinnedBufferType == NULL ||
        PyModule_AddObjectRef(m, "PinnedBuffer",
                              (PyObject *)st->PinnedBufferType) < 0) {
        return -1;
    }
    if (PyModule_AddStringConstant(m, "CUDA_AFTER_FORK", CUDA_AFTER_FORK) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(m, cuda_methods);
}
