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

/* One blocking store call: its arguments converted from Python (with the
 * GIL), the call itself (without it), and its results. */
typedef struct {
    pd_store *s;
    const char *key;
    Py_buffer val[2];  /* set: the value; compare_set: expected, desired */
    int nval;
    key_list keys;
    double timeout;
    int64_t num;       /* add: the delta, then the new value; num_keys */
    int flag;          /* check, delete_key */
    uint8_t *out;      /* get, compare_set: malloc'd by the store */
    size_t outlen;
    char addr[128];    /* local_addr */
    char **ks;         /* list_keys: malloc'd by the store */
    size_t nks;
} store_call;

/* What a method returns on success. */
enum { RET_NONE, RET_BYTES, RET_INT, RET_BOOL, RET_STR, RET_LIST };

/* A method: how to parse its arguments and which core call to make.
 * args names what each parameter (in kwlist order) is: k a key, v a value
 * (str or bytes-like), i an int64, t a timeout, L a list of keys. */
typedef struct {
    const char *format; /* PyArg_ParseTupleAndKeywords; NULL: no arguments */
    char *kwlist[4];
    const char *args;
    pd_status (*call)(store_call *c);
    int ret;
} store_method;

static int
int64_of(PyObject *obj, const char *argname, int64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be int, not %.100s", argname,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0) {
        PyErr_Format(PyExc_OverflowError, "%s %R does not fit in int64",
                     argname, obj);
        return -1;
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static void
call_release(store_call *c)
{
    for (int i = 0; i < c->nval; i++) {
        value_release(&c->val[i]);
    }
    c->nval = 0;
    key_list_free(&c->keys);
    c->keys.tuple = NULL;
    c->keys.ptrs = NULL;
}

/* Parameters are converted in order, except that a key list is copied last,
 * after the cheap checks of the others. */
static int
call_parse(store_call *c, const store_method *m, PyObject *args,
           PyObject *kwds)
{
    PyObject *o[3] = {NULL, NULL, NULL};
    memset(c, 0, sizeof(*c));
    c->timeout = PD_STORE_DEFAULT_TIMEOUT;
    if (m->format == NULL) {
        return 0;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, m->format,
                                     (char **)m->kwlist, &o[0], &o[1],
                                     &o[2])) {
        return -1;
    }
    int list_at = -1;
    for (int i = 0; m->args[i] != '\0'; i++) {
        const char *name = m->kwlist[i];
        int r = 0;
        switch (m->args[i]) {
        case 'k':
            c->key = key_of(o[i], name);
            r = c->key == NULL ? -1 : 0;
            break;
        case 'v':
            r = value_of(o[i], name, &c->val[c->nval]);
            c->nval += r == 0;
            break;
        case 'i':
            r = int64_of(o[i], name, &c->num);
            break;
        case 't':
            r = timeout_of(o[i], &c->timeout);
            break;
        case 'L':
            list_at = i;
            break;
        }
        if (r < 0) {
            call_release(c);
            return -1;
        }
    }
    if (list_at >= 0 && key_list_init(&c->keys, o[list_at]) < 0) {
        call_release(c);
        return -1;
    }
    return 0;
}

/* Parse, run the core call with the GIL released, raise its error or build
 * the result: the body of every blocking store method. */
static PyObject *
store_run(PyObject *self, const store_method *m, PyObject *args,
          PyObject *kwds)
{
    store_call c;
    pd_status st;
    if (call_parse(&c, m, args, kwds) < 0) {
        return NULL;
    }
    c.s = ((StoreObject *)self)->store;
    Py_BEGIN_ALLOW_THREADS
    st = m->call(&c);
    Py_END_ALLOW_THREADS
    call_release(&c);
    if (st != PD_OK) {
        free(c.out);
        return raise_status(self, st);
    }
    switch (m->ret) {
    case RET_BYTES:
        return bytes_and_free(c.out, c.outlen);
    case RET_INT:
        return PyLong_FromLongLong((long long)c.num);
    case RET_BOOL:
        return PyBool_FromLong(c.flag);
    case RET_STR:
        return PyUnicode_FromString(c.addr);
    case RET_LIST: {
        PyObject *l = PyList_New((Py_ssize_t)c.nks);
        for (size_t i = 0; l != NULL && i < c.nks; i++) {
            PyObject *k = PyUnicode_DecodeUTF8(c.ks[i],
                                               (Py_ssize_t)strlen(c.ks[i]),
                                               "surrogateescape");
            if (k == NULL) {
                Py_CLEAR(l);
                break;
            }
            PyList_SET_ITEM(l, (Py_ssize_t)i, k);
        }
        pd_store_free_keys(c.ks, c.nks);
        return l;
    }
    default:
        Py_RETURN_NONE;
    }
}

static pd_status
call_set(store_call *c)
{
    return pd_store_set(c->s, c->key, c->val[0].buf, (size_t)c->val[0].len);
}

static pd_status
call_get(store_call *c)
{
    return pd_store_get_timeout(c->s, c->key, c->timeout, &c->out,
                                &c->outlen);
}

static pd_status
call_add(store_call *c)
{
    return pd_store_add(c->s, c->key, c->num, &c->num);
}

static pd_status
call_compare_set(store_call *c)
{
    return pd_store_compare_set(c->s, c->key, c->val[0].buf,
                                (size_t)c->val[0].len, c->val[1].buf,
                                (size_t)c->val[1].len, &c->out, &c->outlen);
}

static pd_status
call_wait(store_call *c)
{
    return pd_store_wait(c->s, c->keys.ptrs, c->keys.n, c->timeout);
}

static pd_status
call_check(store_call *c)
{
    return pd_store_check(c->s, c->keys.ptrs, c->keys.n, &c->flag);
}

static pd_status
call_delete_key(store_call *c)
{
    return pd_store_delete_key(c->s, c->key, &c->flag);
}

static pd_status
call_num_keys(store_call *c)
{
    return pd_store_num_keys(c->s, &c->num);
}

static pd_status
call_append(store_call *c)
{
    return pd_store_append(c->s, c->key, c->val[0].buf,
                           (size_t)c->val[0].len);
}

static pd_status
call_list_keys(store_call *c)
{
    return pd_store_list_keys(c->s, &c->ks, &c->nks);
}

static pd_status
call_local_addr(store_call *c)
{
    return pd_tcp_store_local_addr(c->s, c->addr, sizeof(c->addr));
}

static pd_status
call_ping(store_call *c)
{
    return pd_tcp_store_ping(c->s);
}

static pd_status
call_set_will(store_call *c)
{
    return pd_tcp_store_will(c->s, c->key, c->val[0].buf,
                             (size_t)c->val[0].len, 1);
}

static pd_status
call_clear_will(store_call *c)
{
    return pd_tcp_store_will(c->s, c->key, NULL, 0, 0);
}

/* Store_NAME (METH_VARARGS | METH_KEYWORDS) over call_NAME; the parameter
 * names follow ARGS. */
#define STORE_METHOD(NAME, FORMAT, ARGS, RET, ...)                           \
    static const store_method NAME##_method = {                              \
        FORMAT, {__VA_ARGS__, NULL}, ARGS, call_##NAME, RET};                \
    static PyObject *                                                        \
    Store_##NAME(PyObject *self, PyObject *args, PyObject *kwds)             \
    {                                                                        \
        return store_run(self, &NAME##_method, args, kwds);                  \
    }

/* Store_NAME (METH_NOARGS) over call_NAME. */
#define STORE_NOARGS_METHOD(NAME, RET)                                       \
    static const store_method NAME##_method = {                              \
        NULL, {NULL}, "", call_##NAME, RET};                                 \
    static PyObject *                                                        \
    Store_##NAME(PyObject *self, PyObject *Py_UNUSED(ignored))               \
    {                                                                        \
        return store_run(self, &NAME##_method, NULL, NULL);                  \
    }

STORE_METHOD(set, "OO:set", "kv", RET_NONE, "key", "value")
STORE_METHOD(get, "O|O:get", "kt", RET_BYTES, "key", "timeout_s")
STORE_METHOD(add, "OO:add", "ki", RET_INT, "key", "value")
STORE_METHOD(compare_set, "OOO:compare_set", "kvv", RET_BYTES, "key",
             "expected_value", "desired_value")
STORE_METHOD(wait, "O|O:wait", "Lt", RET_NONE, "keys", "timeout_s")
STORE_METHOD(check, "O:check", "L", RET_BOOL, "keys")
STORE_METHOD(delete_key, "O:delete_key", "k", RET_BOOL, "key")
STORE_NOARGS_METHOD(num_keys, RET_INT)
STORE_METHOD(append, "OO:append", "kv", RET_NONE, "key", "value")
STORE_NOARGS_METHOD(list_keys, RET_LIST)
STORE_NOARGS_METHOD(local_addr, RET_STR)
STORE_NOARGS_METHOD(ping, RET_NONE)
STORE_METHOD(set_will, "OO:set_will", "kv", RET_NONE, "key", "value")
STORE_METHOD(clear_will, "O:clear_will", "k", RET_NONE, "key")

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
    {"append", (PyCFunction)(void (*)(void))Store_append,                   \
     METH_VARARGS | METH_KEYWORDS,                                           \
     "append(key, value): append value to key's value (created empty)."},    \
    {"list_keys", Store_list_keys, METH_NOARGS,                              \
     "list_keys() -> list of str: the user keys present."},                  \
    {"set_timeout", Store_set_timeout, METH_O,                               \
     "set_timeout(seconds): the default timeout (0: none)."}

/* ------------------------------------------------------------ TCPStore */

static PyObject *
TCPStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"host", "port", "world_size", "is_master",
                             "timeout_s", "wait_for_workers", "secret",
                             "listen_fd", "bind_host", NULL};
    const char *host;
    int port, is_master = 0, wait_workers = 1, listen_fd = -1;
    PyObject *ws_obj = Py_None;
    double timeout = 300.0;
    const char *secret = NULL, *bind_host = NULL;
    pd_tcp_store_opts o;
    pd_module_state *ms = pd_state_from_type(type);

    if (ms == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "si|Opdpziz:TCPStore", kwlist,
                                     &host, &port, &ws_obj, &is_master,
                                     &timeout, &wait_workers, &secret,
                                     &listen_fd, &bind_host)) {
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
    o.bind_host = bind_host;
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
    {"local_addr", Store_local_addr, METH_NOARGS,
     "local_addr() -> str: numeric local IP of the connection to the server."},
    {"ping", Store_ping, METH_NOARGS, "ping(): one round trip."},
    {"set_will", (PyCFunction)(void (*)(void))Store_set_will,
     METH_VARARGS | METH_KEYWORDS,
     "set_will(key, value): TCPStore only: when this connection closes, the "
     "server sets key to value."},
    {"clear_will", (PyCFunction)(void (*)(void))Store_clear_will,
     METH_VARARGS | METH_KEYWORDS,
     "clear_will(key): drop this connection's will on key."},
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
                "listen_fd=-1, bind_host=None)\n\nA client of a TCP key-value "
                "server; the master also runs the server (one thread, on "
                "bind_host, or on all interfaces when it is None or '')."},
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

static PyType_Spec TCPStore_spec = {
    .name = "pyddp._C.TCPStore",
    .basicsize = sizeof(StoreObject),
    .flags = PD_TPFLAGS,
    .slots = TCPStore_slots,
};

static PyType_Spec FileStore_spec = {
    .name = "pyddp._C.FileStore",
    .basicsize = sizeof(StoreObject),
    .flags = PD_TPFLAGS,
    .slots = FileStore_slots,
};

static PyType_Spec HashStore_spec = {
    .name = "pyddp._C.HashStore",
    .basicsize = sizeof(StoreObject),
    .flags = PD_TPFLAGS,
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
