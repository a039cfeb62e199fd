/* pyddp._C: module definition, module state, exception types and the single
 * status -> exception mapping.  Multi-phase init with heap types, no global
 * mutable state (CPython's Modules/_bz2module.c pattern). */
#include "binding.h"
#include <pthread.h>
#include "../transport/shm/shm.h"

static struct PyModuleDef pd_module;

pd_module_state *
pd_get_state(PyObject *module)
{
    return (pd_module_state *)PyModule_GetState(module);
}

pd_module_state *
pd_state_from_type(PyTypeObject *tp)
{
    PyObject *m = PyType_GetModule(tp);
    if (m == NULL) {
        return NULL;
    }
    return pd_get_state(m);
}

PyObject *
pd_py_set_error(pd_module_state *st, pd_status s, const char *msg)
{
    PyObject *exc;
    if (msg == NULL || msg[0] == '\0') {
        msg = pd_status_name(s);
    }
    switch (s) {
    case PD_EINVAL:
        exc = PyExc_ValueError;
        break;
    case PD_ETYPE:
        exc = PyExc_TypeError;
        break;
    case PD_ENOMEM:
        PyErr_NoMemory();
        return NULL;
    case PD_ETIMEOUT:
    case PD_EBACKEND:
        exc = st->DistBackendError;
        break;
    case PD_ENETWORK:
    case PD_EAUTH:
        exc = st->DistNetworkError;
        break;
    case PD_ESTORE:
        exc = st->DistStoreError;
        break;
    case PD_ESYS:
    case PD_EMISMATCH:
    case PD_ECLOSED:
    default:
        exc = st->DistError;
        break;
    }
    /* Messages may quote bytes from another process (a peer's abort text):
     * invalid UTF-8 is replaced, never turned into a UnicodeDecodeError in
     * place of the error itself. */
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg),
                                          "replace");
    if (text == NULL) {
        return NULL;
    }
    PyErr_SetObject(exc, text);
    Py_DECREF(text);
    return NULL;
}

static int
add_exception(PyObject *m, const char *name, PyObject *base, PyObject **slot,
              const char *doc)
{
    char qual[128];
    PyOS_snprintf(qual, sizeof(qual), "pyddp.distributed.%s", name);
    *slot = PyErr_NewExceptionWithDoc(qual, doc, base, NULL);
    if (*slot == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(m, name, *slot);
}

static int
pd_exec(PyObject *m)
{
    pd_module_state *st = pd_get_state(m);
    if (add_exception(m, "DistError", PyExc_RuntimeError, &st->DistError,
                      "Base of pyddp's distributed errors (a RuntimeError).") < 0 ||
        add_exception(m, "DistBackendError", st->DistError,
                      &st->DistBackendError,
                      "A backend (collective) failure or timeout.") < 0 ||
        add_exception(m, "DistNetworkError", st->DistError,
                      &st->DistNetworkError,
                      "A network failure: dead peer, lost connection, port in use.") < 0 ||
        add_exception(m, "DistStoreError", st->DistError, &st->DistStoreError,
                      "A store failure, e.g. a key that did not appear in time.") < 0) {
        return -1;
    }
    if (pd_store_add_types(m, st) < 0) {
        return -1;
    }
    if (pd_group_add_types(m, st) < 0 || pd_tables_add(m, st) < 0 ||
        pd_buffers_add(m, st) < 0 || pd_fuzz_add(m) < 0) {
        return -1;
    }
    if (pd_amp_add_functions(m, st) < 0 || pd_optim_add_functions(m, st) < 0 ||
        pd_random_add_types(m, st) < 0 || pd_cuda_add_functions(m, st) < 0 ||
        pd_nccl_add_types(m, st) < 0 || pd_flight_add_types(m, st) < 0 ||
        pd_mpi_add_types(m, st) < 0 || pd_timeline_add_functions(m, st) < 0) {
        return -1;
    }
    /* A child forked after the environment was read (os.fork, a test
     * harness's ranks, multiprocessing's fork) reads its own. */
    static int atfork_registered = 0;
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, pd_shm_env_forget) != 0) {
            PyErr_SetString(PyExc_RuntimeError,
                            "pyddp: pthread_atfork failed");
            return -1;
        }
        atfork_registered = 1;
    }
    return 0;
}

static int
pd_traverse(PyObject *m, visitproc visit, void *arg)
{
    pd_module_state *st = pd_get_state(m);
    Py_VISIT(st->DistError);
    Py_VISIT(st->DistBackendError);
    Py_VISIT(st->DistNetworkError);
    Py_VISIT(st->DistStoreError);
    Py_VISIT(st->TCPStoreType);
    Py_VISIT(st->FileStoreType);
    Py_VISIT(st->HashStoreType);
    Py_VISIT(st->ProcessGroupType);
    Py_VISIT(st->WorkType);
    Py_VISIT(st->SharedBufferType);
    Py_VISIT(st->GeneratorType);
    Py_VISIT(st->PinnedBufferType);
    Py_VISIT(st->NcclCommType);
    Py_VISIT(st->NcclWorkType);
    Py_VISIT(st->FlightRecorderType);
    Py_VISIT(st->TensorType);
    Py_VISIT(st->ndarray_type);
    return 0;
}

static int
pd_clear(PyObject *m)
{
    pd_module_state *st = pd_get_state(m);
    Py_CLEAR(st->DistError);
    Py_CLEAR(st->DistBackendError);
    Py_CLEAR(st->DistNetworkError);
    Py_CLEAR(st->DistStoreError);
    Py_CLEAR(st->TCPStoreType);
    Py_CLEAR(st->FileStoreType);
    Py_CLEAR(st->HashStoreType);
    Py_CLEAR(st->ProcessGroupType);
    Py_CLEAR(st->WorkType);
    Py_CLEAR(st->SharedBufferType);
    Py_CLEAR(st->GeneratorType);
    Py_CLEAR(st->PinnedBufferType);
    Py_CLEAR(st->NcclCommType);
    Py_CLEAR(st->NcclWorkType);
    Py_CLEAR(st->FlightRecorderType);
    Py_CLEAR(st->TensorType);
    Py_CLEAR(st->str_data);
    Py_CLEAR(st->ndarray_type);
    st->np_direct = 0;
    return 0;
}

static void
pd_free(void *m)
{
    pd_clear((PyObject *)m);
}

static PyModuleDef_Slot pd_slots[] = {
    {Py_mod_exec, pd_exec},
    {0, NULL},
};

static struct PyModuleDef pd_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pyddp._C",
    .m_doc = "pyddp C core: stores, process groups and collectives.",
    .m_size = sizeof(pd_module_state),
    .m_slots = pd_slots,
    .m_traverse = pd_traverse,
    .m_clear = pd_clear,
    .m_free = pd_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&pd_module);
}
