/* _C.TCPStore, _C.FileStore, _C.HashStore: thin heap types over the C stores
 * of csrc/store/.  Every blocking call runs with the GIL released; memory
 * touched without the GIL comes from PyMem_Raw*; errors become exceptions
 * only through pd_py_set_error.  pyddp/distributed/store.py wraps these in
 * torch-compatible classes. */
#include "binding.h"

#include <structmember.h>

#include "../store/store.h"

typedef struct {
    PyObject_HEAD
    pd_store *store;
} StoreObject;

static pd_module_state *
state_of(PyObject *self)
{
    return pd_state_from_type(Py_TYPE(self));
}

static PyObject *
raise_status(PyObject *self, pd_status st)
{
    pd_module_state *ms = state_of(self);
    if (ms == NULL) {
        return NULL;
    }
    return pd_py_set_error(ms, st, pd_errmsg());
}

/* A str key as UTF-8 owned by the str object (valid while it lives). */
static const char *
key_of(PyObject *obj, const char *argname)
{
    Py_ssize_t n;
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", argname,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
    if (s == NULL) {
        return NULL;
    }
    if ((size_t)n != strlen(s)) {
        PyErr_Format(PyExc_ValueError, "%s must not contain NUL characters",
                     argname);
        return NULL;
    }
    return s;
}

/* A value: str (UTF-8) or any contiguous bytes-like object.  Fills view;
 * release with PyBuffer_Release when view->obj is set. */
static int
value_of(PyObject *obj, const char *argname, Py_buffer *view)
{
    memset(view, 0, sizeof(*view));
    if (PyUnicode_Check(obj)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (s == NULL) {
            return -1;
        }
        view->buf = (void *)s;
        view->len = n;
        return 0;
    }
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be str or bytes-like, not %.100s", argname,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    return 0;
}

static void
value_release(Py_buffer *view)
{
    if (view->obj != NULL) {
        PyBuffer_Release(view);
    }
}

/* A tuple copy of keys, so another thread cannot drop the strings while the
 * GIL is released, plus a PyMem_Raw array of their UTF-8 pointers. */
typedef struct {
    PyObject *tuple;
    const char **ptrs;
    size_t n;
} key_list;

static int
key_list_init(key_list *kl, PyObject *keys)
{
    kl->tuple = NULL;
    kl->ptrs = NULL;
    kl->n = 0;
    if (PyUnicode_Check(keys) || PyBytes_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of str, not a "
                        "single string");
        return -1;
    }
    kl->tuple = PySequence_Tuple(keys);
    if (kl->tuple == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "keys must be a list of str, not "
                         "%.100s", Py_TYPE(keys)->tp_name);
        }
        return -1;
    }
    kl->n = (size_t)PyTuple_GET_SIZE(kl->tuple);
    kl->ptrs = PyMem_RawMalloc((kl->n ? kl->n : 1) * sizeof(char *));
    if (kl->ptrs == NULL) {
        Py_CLEAR(kl->tuple);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < kl->n; i++) {
        kl->ptrs[i] = key_of(PyTuple_GET_ITEM(kl->tuple, (Py_ssize_t)i),
                             "every key");
        if (kl->ptrs[i] == NULL) {
            PyMem_RawFree(kl->ptrs);
            kl->ptrs = NULL;
            Py_CLEAR(kl->tuple);
            return -1;
        }
    }
    return 0;
}

static void
key_list_free(key_list *kl)
{
    PyMem_RawFree(kl->ptrs);
    Py_XDECREF(kl->tuple);
}

/* Timeout in seconds from a float or None (None: the store's default). */
static int
timeout_of(PyObject *obj, double *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = PD_STORE_DEFAULT_TIMEOUT;
        return 0;
    }
    double t = PyFloat_AsDouble(obj);
    if (t == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "timeout must be a number of seconds or "
                     "None, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!(t >= 0)) {
        PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds, got %R",
                     obj);
        return -1;
    }
    *out = t;
    return 0;
}

static PyObject *
bytes_and_free(uint8_t *v, size_t n)
{
    PyObject *r = PyBytes_FromStringAndSize((const char *)v, (Py_ssize_t)n);
    free(v);
    return r;
}

/* ------------------------------------------------------------- methods */

static PyObject *
Store_set(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "value", NULL};
    PyObject *kobj, *vobj;
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:set", kwlist, &kobj,
                                     &vobj)) {
        return NULL;
    }
    const char *key = key_of(kobj, "key");
    if (key == NULL || value_of(vobj, "value", &view) < 0) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_set(s, key, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    value_release(&view);
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    Py_RETURN_NONE;
}

static PyObject *
Store_get(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "timeout_s", NULL};
    PyObject *kobj, *tobj = NULL;
    double timeout;
    uint8_t *v = NULL;
    size_t n = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:get", kwlist, &kobj,
                                     &tobj)) {
        return NULL;
    }
    const char *key = key_of(kobj, "key");
    if (key == NULL || timeout_of(tobj, &timeout) < 0) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_get_timeout(s, key, timeout, &v, &n);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return bytes_and_free(v, n);
}

static PyObject *
Store_add(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "value", NULL};
    PyObject *kobj, *vobj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:add", kwlist, &kobj,
                                     &vobj)) {
        return NULL;
    }
    const char *key = key_of(kobj, "key");
    if (key == NULL) {
        return NULL;
    }
    if (!PyLong_Check(vobj)) {
        return PyErr_Format(PyExc_TypeError, "value must be int, not %.100s",
                            Py_TYPE(vobj)->tp_name);
    }
    int overflow = 0;
    long long delta = PyLong_AsLongLongAndOverflow(vobj, &overflow);
    if (overflow != 0) {
        return PyErr_Format(PyExc_OverflowError,
                            "value %R does not fit in int64", vobj);
    }
    if (delta == -1 && PyErr_Occurred()) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    int64_t out = 0;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_add(s, key, (int64_t)delta, &out);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return PyLong_FromLongLong((long long)out);
}

static PyObject *
Store_compare_set(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "expected_value", "desired_value", NULL};
    PyObject *kobj, *eobj, *dobj;
    Py_buffer ev, dv;
    uint8_t *v = NULL;
    size_t n = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:compare_set", kwlist,
                                     &kobj, &eobj, &dobj)) {
        return NULL;
    }
    const char *key = key_of(kobj, "key");
    if (key == NULL || value_of(eobj, "expected_value", &ev) < 0) {
        return NULL;
    }
    if (value_of(dobj, "desired_value", &dv) < 0) {
        value_release(&ev);
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_compare_set(s, key, ev.buf, (size_t)ev.len, dv.buf,
                              (size_t)dv.len, &v, &n);
    Py_END_ALLOW_THREADS
    value_release(&ev);
    value_release(&dv);
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return bytes_and_free(v, n);
}

static PyObject *
Store_wait(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"keys", "timeout_s", NULL};
    PyObject *keys, *tobj = NULL;
    double timeout;
    key_list kl;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:wait", kwlist, &keys,
                                     &tobj)) {
        return NULL;
    }
    if (timeout_of(tobj, &timeout) < 0 || key_list_init(&kl, keys) < 0) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_wait(s, kl.ptrs, kl.n, timeout);
    Py_END_ALLOW_THREADS
    key_list_free(&kl);
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    Py_RETURN_NONE;
}

static PyObject *
Store_check(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"keys", NULL};
    PyObject *keys;
    key_list kl;
    int ok = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:check", kwlist, &keys)) {
        return NULL;
    }
    if (key_list_init(&kl, keys) < 0) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_check(s, kl.ptrs, kl.n, &ok);
    Py_END_ALLOW_THREADS
    key_list_free(&kl);
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return PyBool_FromLong(ok);
}

static PyObject *
Store_delete_key(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", NULL};
    PyObject *kobj;
    int deleted = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:delete_key", kwlist,
                                     &kobj)) {
        return NULL;
    }
    const char *key = key_of(kobj, "key");
    if (key == NULL) {
        return NULL;
    }
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_delete_key(s, key, &deleted);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return PyBool_FromLong(deleted);
}

static PyObject *
Store_num_keys(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    int64_t n = 0;
    pd_store *s = ((StoreObject *)self)->store;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    st = pd_store_num_keys(s, &n);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return PyLong_FromLongLong((long long)n);
}

static PyObject *
Store_set_timeout(PyObject *self, PyObject *arg)
{
    double t;
    if (arg == Py_None) {
        PyErr_SetString(PyExc_TypeError, "timeout must be a number of seconds, "
                        "not None");
        return NULL;
    }
    if (timeout_of(arg, &t) < 0) {
        return NULL;
    }
    pd_store_set_timeout(((StoreObject *)self)->store, t);
    Py_RETURN_NONE;
}

static PyObject *
Store_get_timeout(PyObject *self, void *Py_UNUSED(closure))
{
    return PyFloat_FromDouble(pd_store_timeout(((StoreObject *)self)->store));
}

static void
Store_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    pd_store *s = ((StoreObject *)self)->store;
    ((StoreObject *)self)->store = NULL;
    if (s != NULL) {
        /* Stopping a server thread or taking a file lock can take a moment:
         * let other threads run. */
        Py_BEGIN_ALLOW_THREADS
        pd_store_destroy(s);
        Py_END_ALLOW_THREADS
    }
    tp->tp_free(self);
    Py_DECREF(tp);
}

#define STORE_METHODS                                                        \
    {"set", (PyCFunction)(void (*)(void))Store_set,                         \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "set(key, value): store value (str or bytes-like) under key."},         \
    {"get", (PyCFunction)(void (*)(void))Store_get,                         \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "get(key, timeout_s=None) -> bytes: wait for key (seconds; None: "     \
     "the store's timeout) and return its value."},                            \
    {"add", (PyCFunction)(void (*)(void))Store_add,                         \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "add(key, value) -> int: atomically add value to an int64 counter."},   \
    {"compare_set", (PyCFunction)(void (*)(void))Store_compare_set,         \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "compare_set(key, expected_value, desired_value) -> bytes."},           \
    {"wait", (PyCFunction)(void (*)(void))Store_wait,                       \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "wait(keys, timeout_s=None): wait until every key exists."},              \
    {"check", (PyCFunction)(void (*)(void))Store_check,                     \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "check(keys) -> bool: whether every key exists, without waiting."},     \
    {"delete_key", (PyCFunction)(void (*)(void))Store_delete_key,           \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "delete_key(key) -> bool: whether the key existed."},                   \
    {"num_keys", Store_num_keys, METH_NOARGS,                                \
     "num_keys() -> int: keys in the store, internal ones included."},       \
    {"set_timeout", Store_set_timeout, METH_O,                               \
     "set_timeout(seconds): the default timeout (0: none)."}

/* ------------------------------------------------------------ TCPStore */

static PyObject *
TCPStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"host", "port", "world_size", "is_master",
                             "timeout_s", "wait_for_workers", "secret",
                             "listen_fd", NULL};
    const char *host;
    int port, is_master = 0, wait_workers = 1, listen_fd = -1;
    PyObject *ws_obj = Py_None;
    double timeout = 300.0;
    const char *secret = NULL;
    pd_tcp_store_opts o;
    pd_module_state *ms = pd_state_from_type(type);

    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "si|Opdpzi:TCPStore", kwlist,
                                     &host, &port, &ws_obj, &is_master,
                                     &timeout, &wait_workers, &secret,
                                     &listen_fd)) {
        return NULL;
    }
    pd_tcp_store_opts_init(&o);
    o.host = host;
    o.port = port;
    o.is_master = is_master;
    o.timeout = timeout;
    o.wait_for_workers = wait_workers;
    o.secret = secret;
    o.listen_fd = listen_fd;
    if (ws_obj != Py_None) {
        long ws = PyLong_AsLong(ws_obj);
        if (ws == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (ws < -1 || ws == 0 || ws > INT32_MAX) {
            return PyErr_Format(PyExc_ValueError, "world_size must be a "
                                "positive int or None, got %ld", ws);
        }
        o.world_size = (int)ws;
    }
    if (timeout < 0) {
        return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds");
    }
    StoreObject *self = (StoreObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    pd_status st;
    pd_store *s = NULL;
    /* host and secret point into the argument tuple, which outlives us. */
    Py_BEGIN_ALLOW_THREADS
    st = pd_tcp_store_new(&o, &s);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        Py_DECREF(self);
        return pd_py_set_error(ms, st, pd_errmsg());
    }
    self->store = s;
    return (PyObject *)self;
}

static PyObject *
TCPStore_local_addr(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    char buf[128];
    pd_status st;
    pd_store *s = ((StoreObject *)self)->store;
    Py_BEGIN_ALLOW_THREADS
    st = pd_tcp_store_local_addr(s, buf, sizeof(buf));
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    return PyUnicode_FromString(buf);
}

static PyObject *
TCPStore_ping(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    pd_status st;
    pd_store *s = ((StoreObject *)self)->store;
    Py_BEGIN_ALLOW_THREADS
    st = pd_tcp_store_ping(s);
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        return raise_status(self, st);
    }
    Py_RETURN_NONE;
}

static PyObject *
TCPStore_get_port(PyObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(pd_tcp_store_port(((StoreObject *)self)->store));
}

static PyObject *
TCPStore_get_host(PyObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(pd_tcp_store_host(((StoreObject *)self)->store));
}

static PyMethodDef TCPStore_methods[] = {
    STORE_METHODS,
    {"local_addr", TCPStore_local_addr, METH_NOARGS,
     "local_addr() -> str: numeric local IP of the connection to the server."},
    {"ping", TCPStore_ping, METH_NOARGS, "ping(): one round trip."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TCPStore_getset[] = {
    {"port", TCPStore_get_port, NULL, "The server's port.", NULL},
    {"host", TCPStore_get_host, NULL, "The server's host name.", NULL},
    {"timeout", Store_get_timeout, NULL, "Default timeout in seconds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot TCPStore_slots[] = {
    {Py_tp_new, TCPStore_new},
    {Py_tp_dealloc, Store_dealloc},
    {Py_tp_methods, TCPStore_methods},
    {Py_tp_getset, TCPStore_getset},
    {Py_tp_doc, "TCPStore(host, port, world_size=None, is_master=False, "
                "timeout_s=300.0, wait_for_workers=True, secret=None, "
                "listen_fd=-1)\n\nA client of a TCP key-value server; the "
                "master also runs the server (one thread, all interfaces)."},
    {0, NULL},
};

/* ----------------------------------------------------------- FileStore */

static PyObject *
FileStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "world_size", "timeout_s", NULL};
    PyObject *path = NULL;
    int world_size = -1;
    double timeout = 300.0;
    pd_module_state *ms = pd_state_from_type(type);

    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "O&|id:FileStore", kwlist,
                                     PyUnicode_FSConverter, &path, &world_size,
                                     &timeout)) {
        return NULL;
    }
    if (timeout < 0) {
        Py_DECREF(path);
        return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds");
    }
    StoreObject *self = (StoreObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(path);
    pd_status st;
    pd_store *s = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = pd_file_store_new(p, world_size, timeout, &s);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (st != PD_OK) {
        Py_DECREF(self);
        return pd_py_set_error(ms, st, pd_errmsg());
    }
    self->store = s;
    return (PyObject *)self;
}

static PyObject *
FileStore_get_path(PyObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_DecodeFSDefault(
        pd_file_store_path(((StoreObject *)self)->store));
}

static PyMethodDef FileStore_methods[] = {
    STORE_METHODS,
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FileStore_getset[] = {
    {"path", FileStore_get_path, NULL, "The shared file.", NULL},
    {"timeout", Store_get_timeout, NULL, "Default timeout in seconds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot FileStore_slots[] = {
    {Py_tp_new, FileStore_new},
    {Py_tp_dealloc, Store_dealloc},
    {Py_tp_methods, FileStore_methods},
    {Py_tp_getset, FileStore_getset},
    {Py_tp_doc, "FileStore(path, world_size=-1, timeout_s=300.0)\n\nA store "
                "shared by processes through one file."},
    {0, NULL},
};

/* ----------------------------------------------------------- HashStore */

static PyObject *
HashStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"timeout_s", NULL};
    double timeout = 300.0;
    pd_module_state *ms = pd_state_from_type(type);
    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "|d:HashStore", kwlist,
                                     &timeout)) {
        return NULL;
    }
    if (timeout < 0) {
        return PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds");
    }
    StoreObject *self = (StoreObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    pd_store *s = NULL;
    pd_status st = pd_hash_store_new(timeout, &s);
    if (st != PD_OK) {
        Py_DECREF(self);
        return pd_py_set_error(ms, st, pd_errmsg());
    }
    self->store = s;
    return (PyObject *)self;
}

static PyMethodDef HashStore_methods[] = {
    STORE_METHODS,
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef HashStore_getset[] = {
    {"timeout", Store_get_timeout, NULL, "Default timeout in seconds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot HashStore_slots[] = {
    {Py_tp_new, HashStore_new},
    {Py_tp_dealloc, Store_dealloc},
    {Py_tp_methods, HashStore_methods},
    {Py_tp_getset, HashStore_getset},
    {Py_tp_doc, "HashStore(timeout_s=300.0)\n\nAn in-memory store for the "
                "threads of one process."},
    {0, NULL},
};

/* ---------------------------------------------------------- registration */

#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define STORE_TPFLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define STORE_TPFLAGS Py_TPFLAGS_DEFAULT
#endif

static PyType_Spec TCPStore_spec = {
    .name = "pyddp._C.TCPStore",
    .basicsize = sizeof(StoreObject),
    .flags = STORE_TPFLAGS,
    .slots = TCPStore_slots,
};

static PyType_Spec FileStore_spec = {
    .name = "pyddp._C.FileStore",
    .basicsize = sizeof(StoreObject),
    .flags = STORE_TPFLAGS,
    .slots = FileStore_slots,
};

static PyType_Spec HashStore_spec = {
    .name = "pyddp._C.HashStore",
    .basicsize = sizeof(StoreObject),
    .flags = STORE_TPFLAGS,
    .slots = HashStore_slots,
};

static int
add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot)
{
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    if (*slot == NULL) {
        return -1;
    }
    return PyModule_AddType(m, *slot);
}

int
pd_store_add_types(PyObject *m, pd_module_state *st)
{
    if (add_type(m, &TCPStore_spec, &st->TCPStoreType) < 0 ||
        add_type(m, &FileStore_spec, &st->FileStoreType) < 0 ||
        add_type(m, &HashStore_spec, &st->HashStoreType) < 0) {
        return -1;
    }
    return 0;
}

pd_store *
pd_py_store_get(PyObject *obj, pd_module_state *st)
{
    if (Py_IS_TYPE(obj, st->TCPStoreType) || Py_IS_TYPE(obj, st->FileStoreType) ||
        Py_IS_TYPE(obj, st->HashStoreType)) {
        return ((StoreObject *)obj)->store;
    }
    return NULL;
}
