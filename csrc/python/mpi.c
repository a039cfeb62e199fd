/* Backend "mpi": the calls on its hot path made from C (_C.MpiComm).
 *
 * pyddp/distributed/_mpi.py reaches MPI through mpi4py, which finds the
 * site's MPI and knows its ABI.  Each mpi4py call costs about 1-2 us of
 * argument handling, more than a small MPI_Allreduce itself (0.5 us between
 * two ranks of one host), and the signature check (one nonblocking
 * allreduce polled until done) costs about 30 us when polled from Python
 * against 2 us from C.  So the check and the small blocking collectives on
 * plain CPU arrays call MPI from here, on the library mpi4py already loaded
 * (found among the process's loaded objects by its MPI_Allreduce symbol,
 * never linked: pyddp builds without MPI) and on handles mpi4py gives
 * (communicators, datatypes, ops as integers).
 *
 * Handles are pointers in Open MPI's ABI and ints in MPICH's (mpi4py's
 * _sizeof says which): the entry points are called through one of two
 * prototype sets accordingly.  MPI_Request storage is 8 bytes (either ABI);
 * statuses are given a buffer larger than either ABI's MPI_Status.
 *
 * What is not handled here (other kinds, other arrays) goes to the Python
 * fast path given at construction, so one call serves every collective. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr, RTLD_NOLOAD */
#endif
#include "binding.h"

#include "../util/kinds.h"
#include "../util/status.h"

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ the library */

typedef intptr_t req_t; /* an MPI_Request of either ABI (int or pointer) */

/* Prototypes with pointer handles (Open MPI) and with int handles (MPICH,
 * Intel MPI). */
typedef struct {
    int (*allreduce)(const void *, void *, int, void *, void *, void *);
    int (*bcast)(void *, int, void *, int, void *);
    int (*barrier)(void *);
    int (*isend)(const void *, int, void *, int, int, void *, req_t *);
    int (*irecv)(void *, int, void *, int, int, void *, req_t *);
} mpi_ptr_abi;

typedef struct {
    int (*allreduce)(const void *, void *, int, int, int, int);
    int (*bcast)(void *, int, int, int, int);
    int (*barrier)(int);
    int (*isend)(const void *, int, int, int, int, int, req_t *);
    int (*irecv)(void *, int, int, int, int, int, req_t *);
} mpi_int_abi;

typedef struct {
    void *lib;
    int int_handles; /* 1: MPICH's ABI */
    mpi_ptr_abi p;
    mpi_int_abi i;
    int (*test)(req_t *, int *, void *);
    int (*error_string)(int, char *, int *);
} mpi_lib;

static mpi_lib lib; /* resolved once, under the GIL */

static int
find_mpi(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    void **out = data;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0') {
        return 0;
    }
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL) {
        return 0;
    }
    if (dlsym(h, "MPI_Iallreduce") != NULL && dlsym(h, "MPI_Test") != NULL) {
        *out = h;
        return 1;
    }
    dlclose(h);
    return 0;
}

/* POSIX: dlsym's void * converts to a function pointer. */
#define SYM(field, name)                                                     \
    do {                                                                     \
        void *s_ = dlsym(h, name);                                           \
        if (s_ == NULL) {                                                    \
            goto missing;                                                    \
        }                                                                    \
        memcpy(&(field), &s_, sizeof(s_));                                   \
    } while (0)

static int
load_mpi(pd_module_state *st, int int_handles)
{
    if (lib.lib != NULL) {
        if (lib.int_handles != int_handles) {
            PyErr_SetString(PyExc_ValueError,
                            "MpiComm: handle_size differs from the first "
                            "MpiComm's (one MPI per process)");
            return -1;
        }
        return 0;
    }
    void *h = NULL;
    dl_iterate_phdr(find_mpi, &h);
    if (h == NULL) {
        PyErr_SetString(st->DistBackendError,
                        "backend 'mpi': no MPI library is loaded in this "
                        "process (import mpi4py.MPI first)");
        return -1;
    }
    mpi_lib l;
    memset(&l, 0, sizeof(l));
    l.int_handles = int_handles;
    if (int_handles) {
        SYM(l.i.allreduce, "MPI_Allreduce");
        SYM(l.i.bcast, "MPI_Bcast");
        SYM(l.i.barrier, "MPI_Barrier");
        SYM(l.i.isend, "MPI_Isend");
        SYM(l.i.irecv, "MPI_Irecv");
    }
    else {
        SYM(l.p.allreduce, "MPI_Allreduce");
        SYM(l.p.bcast, "MPI_Bcast");
        SYM(l.p.barrier, "MPI_Barrier");
        SYM(l.p.isend, "MPI_Isend");
        SYM(l.p.irecv, "MPI_Irecv");
    }
    SYM(l.test, "MPI_Test");
    SYM(l.error_string, "MPI_Error_string");
    l.lib = h;
    lib = l;
    return 0;
missing:
    dlclose(h);
    PyErr_SetString(st->DistBackendError,
                    "backend 'mpi': the loaded MPI library lacks an entry "
                    "point pyddp calls (MPI_Allreduce, MPI_Bcast, "
                    "MPI_Barrier, MPI_Isend, MPI_Irecv, MPI_Test, "
                    "MPI_Error_string)");
    return -1;
}

#define HANDLE_P(x) ((void *)(x))
#define HANDLE_I(x) ((int)(x))

static int
call_allreduce(const void *s, void *r, int n, intptr_t dt, intptr_t op,
               intptr_t comm)
{
    return lib.int_handles
               ? lib.i.allreduce(s, r, n, HANDLE_I(dt), HANDLE_I(op),
                                 HANDLE_I(comm))
               : lib.p.allreduce(s, r, n, HANDLE_P(dt), HANDLE_P(op),
                                 HANDLE_P(comm));
}

static int
call_bcast(void *b, int n, intptr_t dt, int root, intptr_t comm)
{
    return lib.int_handles
               ? lib.i.bcast(b, n, HANDLE_I(dt), root, HANDLE_I(comm))
               : lib.p.bcast(b, n, HANDLE_P(dt), root, HANDLE_P(comm));
}

static int
call_barrier(intptr_t comm)
{
    return lib.int_handles ? lib.i.barrier(HANDLE_I(comm))
                           : lib.p.barrier(HANDLE_P(comm));
}

static int
call_isend(const void *b, int n, intptr_t dt, int to, int tag, intptr_t comm,
           req_t *req)
{
    return lib.int_handles
               ? lib.i.isend(b, n, HANDLE_I(dt), to, tag, HANDLE_I(comm), req)
               : lib.p.isend(b, n, HANDLE_P(dt), to, tag, HANDLE_P(comm),
                             req);
}

static int
call_irecv(void *b, int n, intptr_t dt, int from, int tag, intptr_t comm,
           req_t *req)
{
    return lib.int_handles
               ? lib.i.irecv(b, n, HANDLE_I(dt), from, tag, HANDLE_I(comm),
                             req)
               : lib.p.irecv(b, n, HANDLE_P(dt), from, tag, HANDLE_P(comm),
                             req);
}

/* ---------------------------------------------------------------- the type */

#define NDT 16  /* pyddp dtype codes */
#define NOPS 8  /* pyddp reduce op codes */
#define SIGN 6  /* signature fields: seq, kind, dtype, op, root, count */
#define SIG_TAG 11 /* the check's messages on aux (_mpi.py: _TAG_CHECK) */

/* Outcomes: the check's (ST_OK .. ST_MISMATCH, as check() returns them),
 * a Ctrl-C, and an error of the collective's own MPI call. */
enum { ST_OK = 0, ST_MPI_ERROR = 1, ST_TIMEOUT = 2, ST_MISMATCH = 3,
       ST_INTERRUPTED = 4, ST_CALL_ERROR = 5 };

typedef struct {
    PyObject_HEAD
    pd_module_state *st;
    intptr_t coll, aux;     /* communicator handles */
    intptr_t in_place;      /* MPI_IN_PLACE's value */
    intptr_t sig_type;      /* MPI_INT64_T */
    intptr_t types[NDT];    /* dtype code -> MPI datatype (0: not here) */
    intptr_t ops[NDT][NOPS];/* (dtype, op) -> MPI op (0: not here) */
    int rank, size, check;
    double timeout;
    int failed;             /* the group failed: everything goes to Python */
    long long seq;
    /* the check's buffers (2 * SIGN int64 each: this rank's signature, the
     * running MIN, a peer's); left to MPI (leaked) when a check is
     * abandoned (timeout, Ctrl-C) with a request still pending */
    int64_t *sig, *sigr, *sigp;
    PyObject *fallback;     /* the Python fast path */
    PyObject *on_failure;   /* raises the DistBackendError */
} MpiCommObject;

static int
handle_of(PyObject *o, intptr_t *out, const char *what)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "MpiComm: %s must be an int handle",
                     what);
        return -1;
    }
    *out = (intptr_t)v;
    return 0;
}

/* MpiComm(handle_size, coll, aux, in_place, sig_type, types, ops, rank,
 *         size, check, timeout, fallback, on_failure)
 * types: {dtype code: handle}; ops: {(dtype code, op code): handle}. */
static PyObject *
MpiComm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"handle_size", "coll", "aux", "in_place", "sig_type",
                         "types", "ops", "rank", "size", "check",
                         "timeout", "fallback", "on_failure", NULL};
    int hsize, rank, size, check;
    double timeout;
    PyObject *coll, *aux, *inp, *sigt, *types, *ops, *fb, *onf;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOO!O!iipdOO", kw,
                                     &hsize, &coll, &aux, &inp, &sigt,
                                     &PyDict_Type, &types, &PyDict_Type, &ops,
                                     &rank, &size, &check, &timeout, &fb,
                                     &onf)) {
        return NULL;
    }
    pd_module_state *st = pd_state_from_type(type);
    if (hsize != 4 && hsize != 8) {
        PyErr_Format(PyExc_ValueError,
                     "MpiComm: handle_size must be 4 or 8, got %d", hsize);
        return NULL;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        PyErr_Format(PyExc_ValueError,
                     "MpiComm: rank %d out of range for size %d", rank, size);
        return NULL;
    }
    if (!PyCallable_Check(fb) || !PyCallable_Check(onf)) {
        PyErr_SetString(PyExc_TypeError,
                        "MpiComm: fallback and on_failure must be callable");
        return NULL;
    }
    if (load_mpi(st, hsize == 4) < 0) {
        return NULL;
    }
    MpiCommObject *self = (MpiCommObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->st = st;
    self->rank = rank;
    self->size = size;
    self->check = check;
    self->timeout = timeout;
    self->fallback = Py_NewRef(fb);
    self->on_failure = Py_NewRef(onf);
    self->sig = PyMem_RawCalloc(6 * SIGN, sizeof(int64_t));
    if (self->sig == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->sigr = self->sig + 2 * SIGN;
    self->sigp = self->sig + 4 * SIGN;
    if (handle_of(coll, &self->coll, "coll") < 0 ||
        handle_of(aux, &self->aux, "aux") < 0 ||
        handle_of(inp, &self->in_place, "in_place") < 0 ||
        handle_of(sigt, &self->sig_type, "sig_type") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(types, &pos, &k, &v)) {
        long code = PyLong_AsLong(k);
        intptr_t h;
        if ((code == -1 && PyErr_Occurred()) || code < 0 || code >= NDT ||
            handle_of(v, &h, "a datatype") < 0) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError,
                             "MpiComm: dtype code %ld out of range", code);
            }
            Py_DECREF(self);
            return NULL;
        }
        self->types[code] = h;
    }
    pos = 0;
    while (PyDict_Next(ops, &pos, &k, &v)) {
        long code, op;
        intptr_t h;
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2 ||
            ((code = PyLong_AsLong(PyTuple_GET_ITEM(k, 0))) == -1 &&
             PyErr_Occurred()) ||
            ((op = PyLong_AsLong(PyTuple_GET_ITEM(k, 1))) == -1 &&
             PyErr_Occurred()) ||
            code < 0 || code >= NDT || op < 0 || op >= NOPS ||
            handle_of(v, &h, "an op") < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "MpiComm: ops keys must be (dtype code, op "
                                "code) in range");
            }
            Py_DECREF(self);
            return NULL;
        }
        self->ops[code][op] = h;
    }
    return (PyObject *)self;
}

static int
MpiComm_traverse(MpiCommObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->fallback);
    Py_VISIT(self->on_failure);
    return 0;
}

static int
MpiComm_clear(MpiCommObject *self)
{
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->on_failure);
    return 0;
}

static void
MpiComm_dealloc(MpiCommObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    MpiComm_clear(self);
    PyMem_RawFree(self->sig);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* ------------------------------------------------------------- the check */

/* Poll the n requests until all are done, the deadline, or a signal's
 * exception: GIL released, spinning for the first 2 ms (MPI progresses only
 * inside its calls, and a peer descheduled for a moment on a busy host must
 * not cost a sleep's overshoot), then sleeping 10 us more per round up to
 * 1 ms; every 50 ms the GIL is taken back to run signal handlers (Ctrl-C).
 * MPI_Test one request at a time: an MPI_Request array's element size
 * differs between the ABIs. */
static int
poll_reqs(req_t *reqs, int n, double deadline, int *mpi_err)
{
    unsigned char status[256];
    int done[2] = {0, 0}, ndone = 0, out = ST_OK;
    long spins = 0;
    long sleep_ns = 0;
    double next_signals = 0, spin_until = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (int last = 0;; spins++) {
        for (int i = 0; i < n; i++) {
            if (done[i]) {
                continue;
            }
            int flag = 0;
            int rc = lib.test(&reqs[i], &flag, status);
            if (rc != 0) {
                *mpi_err = rc;
                out = ST_MPI_ERROR;
                goto end;
            }
            if (flag) {
                done[i] = 1;
                ndone++;
            }
        }
        if (ndone == n) {
            break;
        }
        if (last) {
            out = ST_TIMEOUT;
            break;
        }
        if ((spins & 63) != 63) {
            continue;
        }
        double now = pd_now();
        if (now > deadline) {
            last = 1; /* one more test of each */
            continue;
        }
        if (spin_until == 0) {
            spin_until = now + 2e-3;
        }
        if (now > spin_until) {
            if (next_signals == 0) {
                next_signals = now + 0.05;
            }
            sleep_ns = sleep_ns < 1000000 ? sleep_ns + 10000 : 1000000;
            struct timespec d = {0, sleep_ns};
            nanosleep(&d, NULL);
            if (now > next_signals) {
                next_signals = now + 0.05;
                PyEval_RestoreThread(ts);
                int sig = PyErr_CheckSignals();
                ts = PyEval_SaveThread();
                if (sig < 0) {
                    out = ST_INTERRUPTED;
                    break;
                }
            }
        }
    }
end:
    PyEval_RestoreThread(ts);
    return out;
}

/* The signature check of one collective: ST_OK, or a failure status
 * (*mpi_err set for ST_MPI_ERROR; an exception set for ST_INTERRUPTED). */
static int
run_check(MpiCommObject *self, int kind, int dtype, long op, long root,
          long long count, double timeout, int *mpi_err)
{
    self->seq++;
    int64_t f[SIGN] = {self->seq, kind, dtype, op, root, count};
    for (int i = 0; i < SIGN; i++) {
        self->sig[i] = f[i];
        self->sig[SIGN + i] = -f[i];
    }
    /* A dissemination allreduce of MIN (idempotent: a value met twice does
     * no harm): in round k rank r sends what it has to r + 2^k and takes
     * the MIN with what r - 2^k sent; after ceil(log2 n) rounds every rank
     * has every rank's.  Point-to-point on aux: half the time of Open MPI's
     * nonblocking MPI_Iallreduce for two ranks. */
    memcpy(self->sigr, self->sig, 2 * SIGN * sizeof(int64_t));
    double deadline = pd_now() + (timeout > 0 ? timeout : self->timeout);
    int n = self->size, s = ST_OK;
    for (int d = 1; d < n && s == ST_OK; d <<= 1) {
        req_t reqs[2] = {0, 0};
        int rc = call_irecv(self->sigp, 2 * SIGN, self->sig_type,
                            (self->rank - d + n) % n, SIG_TAG, self->aux,
                            &reqs[0]);
        if (rc == 0) {
            rc = call_isend(self->sigr, 2 * SIGN, self->sig_type,
                            (self->rank + d) % n, SIG_TAG, self->aux,
                            &reqs[1]);
            s = rc != 0 ? ST_MPI_ERROR : poll_reqs(reqs, 2, deadline, mpi_err);
        }
        else {
            s = ST_MPI_ERROR;
        }
        if (rc != 0) {
            *mpi_err = rc;
        }
        for (int i = 0; i < 2 * SIGN && s == ST_OK; i++) {
            if (self->sigp[i] < self->sigr[i]) {
                self->sigr[i] = self->sigp[i];
            }
        }
    }
    if (s != ST_OK) {
        /* a request may still be MPI's: so are the buffers */
        int64_t *fresh = PyMem_RawCalloc(6 * SIGN, sizeof(int64_t));
        if (fresh == NULL) {
            self->failed = 1; /* no more checks from C */
            return s;
        }
        memcpy(fresh, self->sig, 2 * SIGN * sizeof(int64_t));
        self->sig = fresh;
        self->sigr = fresh + 2 * SIGN;
        self->sigp = fresh + 4 * SIGN;
        return s;
    }
    for (int i = 0; i < SIGN; i++) {
        if (self->sigr[i] != -self->sigr[SIGN + i]) {
            return ST_MISMATCH;
        }
    }
    return ST_OK;
}

/* MPI's text for an error code. */
static void
mpi_text(int err, char *text, size_t cap)
{
    int len = 0;
    if (lib.error_string(err, text, &len) != 0 || len < 0 ||
        (size_t)len >= cap) {
        snprintf(text, cap, "MPI error code %d", err);
    }
    else {
        text[len] = '\0';
    }
}

/* Hand a failure of the fast path to the Python layer, whose
 * on_failure(what, status, mpi_text) raises the DistBackendError (and marks
 * the group failed).  A Ctrl-C keeps its KeyboardInterrupt. */
static PyObject *
failure(MpiCommObject *self, const char *what, int status, int mpi_err)
{
    if (status == ST_INTERRUPTED) {
        return NULL; /* the signal handler's exception */
    }
    char text[4096] = "";
    if (status == ST_MPI_ERROR || status == ST_CALL_ERROR) {
        mpi_text(mpi_err, text, sizeof(text));
    }
    self->failed = 1;
    PyObject *r = PyObject_CallFunction(self->on_failure, "sis", what, status,
                                        text);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Format(self->st->DistBackendError, "%s on backend 'mpi' failed",
                 what);
    return NULL;
}

/* check(kind, dtype, op, root, count, timeout) -> (status, MPI error text):
 * the general path's signature check. */
static PyObject *
MpiComm_check(MpiCommObject *self, PyObject *args)
{
    int kind, dtype;
    long op, root;
    long long count;
    double timeout;
    if (!PyArg_ParseTuple(args, "iillLd", &kind, &dtype, &op, &root, &count,
                          &timeout)) {
        return NULL;
    }
    if (self->failed) { /* its communicators may be freed (destroy) */
        PyErr_SetString(self->st->DistBackendError,
                        "backend 'mpi': this group failed or was destroyed");
        return NULL;
    }
    int err = 0;
    int s = run_check(self, kind, dtype, op, root, count, timeout, &err);
    if (s == ST_INTERRUPTED) {
        return NULL;
    }
    char text[4096] = "";
    if (s == ST_MPI_ERROR) {
        mpi_text(err, text, sizeof(text));
    }
    return Py_BuildValue("is", s, text);
}

/* -------------------------------------------------------------- fast path */

/* fast(kind, array, arg[, input[, root]]): pyddp's fast protocol (see
 * group.c's PG_fast).  all_reduce (in place), broadcast and barrier of a
 * C-contiguous CPU array of a type MPI reduces natively run here; anything
 * else goes to the Python fast path. */
static PyObject *
MpiComm_fast(MpiCommObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(kind, array, arg[, input[, root]])");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    if (self->failed ||
        (kind != PD_K_ALLREDUCE && kind != PD_K_BROADCAST &&
         kind != PD_K_BARRIER) ||
        (kind == PD_K_BARRIER) != (args[1] == Py_None) ||
        (nargs > 3 && args[3] != Py_None)) {
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    long arg = PyLong_AsLong(args[2]);
    if (arg == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    int err = 0, s;
    if (kind == PD_K_BARRIER) {
        s = self->check && self->size > 1
                ? run_check(self, PD_K_BARRIER, 0, 0, 0, 0, 0.0, &err)
                : ST_OK;
        if (s != ST_OK) {
            return failure(self, "barrier", s, err);
        }
        Py_BEGIN_ALLOW_THREADS
        err = call_barrier(self->coll);
        Py_END_ALLOW_THREADS
        if (err != 0) {
            return failure(self, "barrier", ST_CALL_ERROR, err);
        }
        Py_RETURN_TRUE;
    }
    pd_view v;
    if (!pd_view_get_host(self->st, args[1], 1, &v)) {
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    intptr_t dt = v.dtype < NDT ? self->types[v.dtype] : 0;
    intptr_t mop = 0;
    if (kind == PD_K_ALLREDUCE && dt != 0 && arg >= 0 && arg < NOPS) {
        mop = self->ops[v.dtype][arg];
    }
    if (dt == 0 || v.count > INT32_MAX ||
        (kind == PD_K_ALLREDUCE ? mop == 0 : (arg < 0 || arg >= self->size))) {
        pd_view_release(&v);
        return PyObject_Vectorcall(self->fallback, args, (size_t)nargs, NULL);
    }
    const char *what = kind == PD_K_ALLREDUCE ? "all_reduce" : "broadcast";
    if (self->check && self->size > 1) {
        s = kind == PD_K_ALLREDUCE
                ? run_check(self, (int)kind, v.dtype, arg, 0,
                            (long long)v.count, 0.0, &err)
                : run_check(self, (int)kind, v.dtype, 0, arg,
                            (long long)v.count, 0.0, &err);
        if (s != ST_OK) {
            pd_view_release(&v);
            return failure(self, what, s, err);
        }
    }
    int n = (int)v.count;
    void *p = v.ptr;
    Py_BEGIN_ALLOW_THREADS
    if (kind == PD_K_ALLREDUCE) {
        err = call_allreduce((const void *)self->in_place, p, n, dt, mop,
                             self->coll);
    }
    else {
        err = call_bcast(p, n, dt, (int)arg, self->coll);
    }
    Py_END_ALLOW_THREADS
    pd_view_release(&v);
    if (err != 0) {
        return failure(self, what, ST_CALL_ERROR, err);
    }
    Py_RETURN_TRUE;
}

static PyObject *
MpiComm_set_failed(MpiCommObject *self, PyObject *Py_UNUSED(ignored))
{
    self->failed = 1;
    Py_RETURN_NONE;
}

static PyObject *
MpiComm_get_seq(MpiCommObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(self->seq);
}

static PyObject *
MpiComm_get_sig(MpiCommObject *self, void *closure)
{
    (void)closure;
    return PyBytes_FromStringAndSize((const char *)self->sig,
                                     2 * SIGN * sizeof(int64_t));
}

static PyMethodDef MpiComm_methods[] = {
    {"fast", (PyCFunction)(void (*)(void))MpiComm_fast, METH_FASTCALL,
     "fast(kind, array, arg[, input[, root]]) -> bool: pyddp's fast "
     "protocol; all_reduce, broadcast and barrier called from C"},
    {"check", (PyCFunction)MpiComm_check, METH_VARARGS,
     "check(kind, dtype, op, root, count, timeout) -> (status, mpi_text): "
     "the signature check (0 ok, 1 MPI error, 2 timeout, 3 mismatch)"},
    {"set_failed", (PyCFunction)MpiComm_set_failed, METH_NOARGS,
     "the group failed or was destroyed: fast() hands every later call to "
     "the Python path, check() refuses"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MpiComm_getset[] = {
    {"seq", (getter)MpiComm_get_seq, NULL,
     "sequence number of the last checked collective", NULL},
    {"sig", (getter)MpiComm_get_sig, NULL,
     "the last signature sent (12 int64: the fields, then their negations)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot MpiComm_slots[] = {
    {Py_tp_new, MpiComm_new},
    {Py_tp_dealloc, MpiComm_dealloc},
    {Py_tp_traverse, MpiComm_traverse},
    {Py_tp_clear, MpiComm_clear},
    {Py_tp_methods, MpiComm_methods},
    {Py_tp_getset, MpiComm_getset},
    {Py_tp_doc, "MpiComm(...): backend mpi's signature check and small "
                "blocking collectives, called from C on the MPI library "
                "mpi4py loaded (pyddp/distributed/_mpi.py makes it)"},
    {0, NULL},
};

static PyType_Spec MpiComm_spec = {
    .name = "pyddp._C.MpiComm",
    .basicsize = sizeof(MpiCommObject),
    .flags = PD_TPFLAGS_GC,
    .slots = MpiComm_slots,
};

int
pd_mpi_add_types(PyObject *m, pd_module_state *st)
{
    (void)st;
    PyObject *t = PyType_FromModuleAndSpec(m, &MpiComm_spec, NULL);
    if (t == NULL) {
        return -1;
    }
    int rc = PyModule_AddObjectRef(m, "MpiComm", t);
    Py_DECREF(t);
    return rc;
}
