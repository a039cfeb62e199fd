/* Fuzz entry points (tests/fuzz/): the real code that reads what another
 * process wrote, run on bytes chosen by a fuzzer.  Nothing here is used by
 * the library itself.
 *
 * _fuzz_shm: two in-process shared-memory ranks (real segments, mapped as a
 * job maps them); rank 1's published words (control block, ring counters)
 * are overwritten with the fuzzed bytes, then rank 0 runs what it runs on
 * them in a collective: the identity check, a sync point (abort status and
 * message, "left" flag, step), the per-op value, the rings' read and write.
 */
#include "binding.h"

#include <stdlib.h>
#include <string.h>

#include "../util/kinds.h"
#include "../transport/shm/shm.h"
#include "../util/net.h"

static pd_shm *fz_shm[2];

static int
fz_shm_setup(pd_module_state *st)
{
    if (fz_shm[0] != NULL) {
        return 0;
    }
    uint64_t token = 0;
    pd_status s = pd_random_bytes(&token, sizeof(token));
    for (int r = 0; r < 2 && s == PD_OK; r++) {
        s = pd_shm_create(r, 2, token, 0xf022u, 0, &fz_shm[r]);
    }
    for (int r = 0; r < 2 && s == PD_OK; r++) {
        s = pd_shm_attach(fz_shm[r]);
    }
    for (int r = 0; r < 2; r++) {
        pd_shm_unlink(fz_shm[r], 0);
    }
    if (s != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        for (int r = 0; r < 2; r++) {
            pd_shm_close(fz_shm[r]);
            fz_shm[r] = NULL;
        }
        pd_py_set_error(st, s, msg);
        return -1;
    }
    return 0;
}

/* (status, message) of a step; message None when it succeeded. */
static PyObject *
outcome(pd_status s)
{
    if (s == PD_OK) {
        return Py_BuildValue("(iO)", 0, Py_None);
    }
    const char *m = pd_errmsg();
    return Py_BuildValue("(iN)", (int)s,
                         PyUnicode_DecodeUTF8(m, (Py_ssize_t)strlen(m),
                                              "replace"));
}

/* _fuzz_shm(ctrl, rings, ident, mode, readlen, writelen) -> dict */
static PyObject *
fuzz_shm(PyObject *m, PyObject *args)
{
    Py_buffer ctrl, rings;
    unsigned long long seq, count, aux;
    int kind, dtype, op, root, mode;
    Py_ssize_t readlen, writelen;
    if (!PyArg_ParseTuple(args, "y*y*(KKKiiii)inn:_fuzz_shm", &ctrl, &rings,
                          &seq, &count, &aux, &kind, &dtype, &op, &root,
                          &mode, &readlen, &writelen)) {
        return NULL;
    }
    PyObject *res = NULL;
    size_t cb, rcb, ringb;
    pd_shm_fuzz_sizes(&cb, &rcb, &ringb);
    if (readlen < 0 || writelen < 0 || (size_t)readlen > 4 * ringb ||
        (size_t)writelen > 4 * ringb) {
        PyErr_SetString(PyExc_ValueError,
                        "_fuzz_shm: readlen and writelen must be in "
                        "[0, 4 ring sizes]");
        goto out;
    }
    if (fz_shm_setup(pd_get_state(m)) < 0) {
        goto out;
    }
    pd_shm *s = fz_shm[0];
    pd_shm_fuzz_publish(s, 1, ctrl.buf, (size_t)ctrl.len, rings.buf,
                        (size_t)rings.len);
    pd_shm_ident id = {.seq = seq, .count = count, .aux = aux,
                       .kind = (uint8_t)kind, .dtype = (uint8_t)dtype,
                       .op = (uint8_t)op, .phase = 0, .root = root};
    pd_shm_waiter w = {.deadline = pd_now(), .check = NULL,
                       .interrupted = NULL, .ctx = NULL};
    char *buf = calloc(1, (size_t)(readlen > writelen ? readlen : writelen)
                              + 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject *o_check, *o_sync;
    pd_status st;
    Py_BEGIN_ALLOW_THREADS
    pd_shm_enter(s, &id, 7);
    st = pd_shm_check_ident_from(s, &id, pd_kind_name,
                                 mode == 1 ? PD_SHM_ANY : -1);
    Py_END_ALLOW_THREADS
    o_check = outcome(st);
    Py_BEGIN_ALLOW_THREADS
    st = pd_shm_sync_from(s, &w, mode == 1 ? PD_SHM_ANY : mode == 2 ? 1 : -1,
                          mode == 2);
    Py_END_ALLOW_THREADS
    o_sync = outcome(st);
    int readable = pd_shm_ring_readable(s, 1);
    size_t nread = pd_shm_ring_read(s, 1, buf, (size_t)readlen);
    int writable = pd_shm_ring_writable(s, 1);
    memset(buf, 0, (size_t)writelen);
    size_t nwritten = pd_shm_ring_write(s, 1, buf, (size_t)writelen);
    free(buf);
    res = Py_BuildValue(
        "{s:N,s:N,s:K,s:K,s:O,s:n,s:O,s:n,s:n}", "check", o_check, "sync",
        o_sync, "entered", (unsigned long long)pd_shm_entered(s, 1), "value",
        (unsigned long long)pd_shm_value(s, 1, seq), "readable",
        readable ? Py_True : Py_False, "read", (Py_ssize_t)nread, "writable",
        writable ? Py_True : Py_False, "written", (Py_ssize_t)nwritten,
        "ring_bytes", (Py_ssize_t)ringb);
out:
    PyBuffer_Release(&ctrl);
    PyBuffer_Release(&rings);
    return res;
}

static PyObject *
fuzz_shm_sizes(PyObject *m, PyObject *noargs)
{
    (void)m;
    (void)noargs;
    size_t cb, rcb, ringb;
    pd_shm_fuzz_sizes(&cb, &rcb, &ringb);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "ctrl", (Py_ssize_t)cb,
                         "ring_ctl", (Py_ssize_t)rcb, "ring",
                         (Py_ssize_t)ringb, "errmsg", (Py_ssize_t)PD_ERRMSG_MAX);
}

static PyMethodDef fuzz_methods[] = {
    {"_fuzz_shm", fuzz_shm, METH_VARARGS,
     "_fuzz_shm(ctrl, rings, ident, mode, readlen, writelen) -> dict: run "
     "rank 0's shared-memory code on what a peer published (fuzz target "
     "support; ident: (seq, count, aux, kind, dtype, op, root); mode 0: sync "
     "with all, 1: with any, 2: with rank 1 as the data source)."},
    {"_fuzz_shm_sizes", fuzz_shm_sizes, METH_NOARGS,
     "_fuzz_shm_sizes() -> dict: ctrl, ring_ctl, ring, errmsg byte sizes."},
    {NULL, NULL, 0, NULL},
};

int
pd_fuzz_add(PyObject *m)
{
    return PyModule_AddFunctions(m, fuzz_methods);
}
