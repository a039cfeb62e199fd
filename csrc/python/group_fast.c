/* The fast path of pyddp._C.ProcessGroup: a blocking collective of
 * C-contiguous CPU arrays run on the calling thread when the group is idle
 * (fast(): one C call per collective from the Python wrapper), and the
 * inline run that submit's blocking case shares.  The same length checks
 * as submit; anything they would refuse returns False, and the Python path
 * then explains what is wrong.
 */
#include <stdint.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../util/kinds.h"
#include "group_internal.h"

/* ------------------------------------------------------ inline collectives */

typedef struct {
    PyThreadState *ts;
} intr_ctx;

/* Polled (without the GIL) while an inline collective waits for late
 * ranks: take the GIL briefly and run the signal handlers. */
static int
py_interrupted(void *arg)
{
    intr_ctx *x = arg;
    PyEval_RestoreThread(x->ts);
    int r = PyErr_CheckSignals() < 0;
    x->ts = PyEval_SaveThread();
    return r;
}

/* Run o on this thread if the group allows.  Returns 0: not eligible (no
 * exception); 1: done; -1: exception set.  On an interrupt the collective
 * goes on in the progress thread: *handoff then holds its work. */
int
pd_pg_run_inline(PGObject *self, pd_op *o, pd_work **handoff)
{
    pd_status st;
    int ran;
    char msg[PD_ERRMSG_MAX];
    intr_ctx x;
    x.ts = PyEval_SaveThread();
    ran = pd_group_inline(self->g, o, py_interrupted, &x, &st, handoff);
    if (ran && st != PD_OK && st != PD_EINTR) {
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
    }
    PyEval_RestoreThread(x.ts);
    if (!ran) {
        return 0;
    }
    if (st == PD_EINTR) {
        if (!PyErr_Occurred()) {
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        }
        return -1;
    }
    if (st != PD_OK) {
        pd_py_set_error(pg_state((PyObject *)self), st, msg);
        return -1;
    }
    return 1;
}

/* A collective interrupted by a signal still runs: keep its arrays alive
 * (in w) until it ends. */
void
pd_pg_keep_handoff(PGObject *self, PyObject *w)
{
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    if (PyList_Append(self->handoffs, w) < 0) {
        PyErr_Clear();
    }
    PyErr_Restore(exc_type, exc, tb);
}


/* Whether the fast path may run reduction op on dtype dt: valid for the
 * kernels and allowed by torch's CPU (gloo) rules, which also refuse AVG on
 * integers and bool and PRODUCT on complex.  Refused pairs take the Python
 * path, which raises torch's errors. */
static int
fast_op_ok(int dt, long arg)
{
    if (arg < 0 || arg >= PD_NREDOPS ||
        pd_redop_check((pd_dtype)dt, (pd_redop)arg) != PD_OK) {
        return 0;
    }
    if (arg == PD_AVG && dt >= PD_BOOL && dt <= PD_UINT64) {
        return 0;
    }
    if (arg == PD_PRODUCT && (dt == PD_COMPLEX64 || dt == PD_COMPLEX128)) {
        return 0;
    }
    return 1;
}

/* A fast-path collective interrupted by a signal goes on in the progress
 * thread (handoff): a Work keeps the arrays' views (nviews of them, moved
 * there) until it ends.  If that Work cannot be made, the views leak rather
 * than dangle. */
static void
keep_views(PGObject *self, pd_work *handoff, pd_view *views, int nviews,
           int kind)
{
    WorkObject *w = pd_py_work_alloc(pg_state((PyObject *)self));
    if (w == NULL) {
        return;
    }
    w->w = handoff;
    w->views = nviews > 0 ? PyMem_Calloc((size_t)nviews, sizeof(pd_view))
                          : NULL;
    w->nviews = 0;
    w->ptrs = NULL;
    w->lens = NULL;
    w->keep = NULL;
    w->kind = kind;
    if (w->views != NULL) {
        memcpy(w->views, views, (size_t)nviews * sizeof(pd_view));
        w->nviews = nviews;
    }
    pd_pg_keep_handoff(self, (PyObject *)w);
    Py_DECREF(w);
}

/* The largest group the block fast path serves (its views live on the
 * stack); larger groups take submit. */
#define FAST_MAXN 16

typedef struct {
    pd_view v[2 * FAST_MAXN];
    int n;
} fast_views;

/* One side of a collective for fast_blocks: an array (split into nblocks
 * equal blocks; by whole rows when rows is set, as all_to_all_single
 * splits) or a list/tuple of nblocks arrays, all of dtype *dt (-1: the
 * first's).  Fills ptrs/lens.  0 when the fast path cannot take it; the
 * views acquired so far stay in fv for the caller to release. */
static int
fast_side(PGObject *self, fast_views *fv, PyObject *obj, int nblocks,
          int writable, int rows, int *dt, char **ptrs, size_t *lens)
{
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        for (int i = 0; i < nblocks; i++) {
            /* re-read the length: an exporter's __dlpack__ is Python code */
            if (PySequence_Fast_GET_SIZE(obj) != nblocks ||
                fv->n >= 2 * FAST_MAXN) {
                return 0;
            }
            PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(obj, i));
            pd_view *v = &fv->v[fv->n];
            int got = pd_view_get_host(self->st, item, writable, v);
            Py_DECREF(item);
            if (!got) {
                return 0;
            }
            fv->n++;
            if (*dt >= 0 && v->dtype != *dt) {
                return 0;
            }
            *dt = v->dtype;
            ptrs[i] = v->ptr;
            lens[i] = v->nbytes;
        }
        return PySequence_Fast_GET_SIZE(obj) == nblocks;
    }
    if (fv->n >= 2 * FAST_MAXN) {
        return 0;
    }
    pd_view *v = &fv->v[fv->n];
    if (!pd_view_get_host(self->st, obj, writable, v)) {
        return 0;
    }
    fv->n++;
    if ((*dt >= 0 && v->dtype != *dt) || v->nbytes % (size_t)nblocks != 0) {
        return 0;
    }
    if (rows) {
        long long r = pd_view_rows(v);
        if (r < 0 || r % nblocks != 0) {
            return 0;
        }
    }
    *dt = v->dtype;
    size_t len = v->nbytes / (size_t)nblocks;
    for (int i = 0; i < nblocks; i++) {
        ptrs[i] = v->ptr + (size_t)i * len;
        lens[i] = len;
    }
    return 1;
}

/* Whether out's shape is in's with the first dimension n times as long (what
 * torch's all_gather_into_tensor takes without question; other shapes go to
 * the Python path, which applies torch's chunking rule or says why not). */
static int
fast_stacked(const pd_view *out, const pd_view *in, int n)
{
    long long os[8], is[8];
    int od = pd_view_shape(out, os, 8), id = pd_view_shape(in, is, 8);
    if (od < 1 || od > 8 || od != id || os[0] != is[0] * n) {
        return 0;
    }
    for (int i = 1; i < od; i++) {
        if (os[i] != is[i]) {
            return 0;
        }
    }
    return 1;
}

/* Whether obj is what a rank outside the root gives for the root's list:
 * None or an empty list/tuple (anything else: the Python path says what is
 * wrong). */
static int
fast_absent(PyObject *obj)
{
    return obj == Py_None ||
           ((PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) &&
            PySequence_Fast_GET_SIZE(obj) == 0);
}

/* Whether any of the n input blocks shares bytes with any output block
 * (all_to_all on one array in place): the Python path copies the input
 * first, since the peers read a rank's input while it writes its output. */
static int
blocks_overlap(char *const *ip, const size_t *il, char *const *op,
               const size_t *ol, int n)
{
    for (int p = 0; p < n; p++) {
        for (int q = 0; q < n; q++) {
            uintptr_t a = (uintptr_t)ip[p], b = (uintptr_t)op[q];
            if (il[p] > 0 && ol[q] > 0 && a < b + ol[q] && b < a + il[p]) {
                return 1;
            }
        }
    }
    return 0;
}

/* pd_pg_fast for the collectives with blocks: reduce (out = the array, arg =
 * op, root), gather (in = the array, out = the root's list, arg = root),
 * scatter (out = the array, in = the root's list, arg = root), all_gather
 * (in = the array, out = a list or one array of world_size blocks),
 * reduce_scatter (out = the array, in = a list or one array, arg = op) and
 * all_to_all (lists, or single arrays split by rows).  The same checks as
 * submit; anything they would refuse is left to the Python path. */
static PyObject *
fast_blocks(PGObject *self, int kind, PyObject *outobj, long arg,
            PyObject *inobj, long root)
{
    int n = self->size, rank = self->rank;
    if (n > FAST_MAXN) {
        Py_RETURN_FALSE;
    }
    if (kind == PD_K_GATHER || kind == PD_K_SCATTER) {
        root = arg;
    }
    if ((kind == PD_K_REDUCE || kind == PD_K_GATHER ||
         kind == PD_K_SCATTER) && (root < 0 || root >= n)) {
        Py_RETURN_FALSE;
    }
    fast_views fv;
    fv.n = 0;
    char *ip[FAST_MAXN] = {0}, *opp[FAST_MAXN] = {0};
    size_t il[FAST_MAXN] = {0}, ol[FAST_MAXN] = {0};
    int dt = -1, ok = 0;
    int inlist = PyList_CheckExact(inobj) || PyTuple_CheckExact(inobj);
    int outlist = PyList_CheckExact(outobj) || PyTuple_CheckExact(outobj);
    const char *name = NULL;
    switch (kind) {
    case PD_K_REDUCE:
        ok = !outlist && fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             fast_op_ok(dt, arg);
        ip[0] = opp[0];
        il[0] = ol[0];
        name = "reduce";
        break;
    case PD_K_GATHER:
        ok = !inlist && fast_side(self, &fv, inobj, 1, 0, 0, &dt, ip, il) &&
             (rank == root ? outlist && fast_side(self, &fv, outobj, n, 1, 0,
                                                  &dt, opp, ol)
                           : fast_absent(outobj));
        name = "gather";
        break;
    case PD_K_SCATTER:
        ok = !outlist &&
             fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             (rank == root ? inlist && fast_side(self, &fv, inobj, n, 0, 0,
                                                 &dt, ip, il)
                           : fast_absent(inobj));
        name = "scatter";
        break;
    case PD_K_ALLGATHER:
        ok = !inlist && fast_side(self, &fv, inobj, 1, 0, 0, &dt, ip, il) &&
             fast_side(self, &fv, outobj, n, 1, 0, &dt, opp, ol) &&
             (outlist || fast_stacked(&fv.v[1], &fv.v[0], n));
        name = outlist ? "all_gather" : "all_gather_into_tensor";
        break;
    case PD_K_REDUCE_SCATTER:
        ok = !outlist &&
             fast_side(self, &fv, outobj, 1, 1, 0, &dt, opp, ol) &&
             fast_side(self, &fv, inobj, n, 0, 0, &dt, ip, il) &&
             fast_op_ok(dt, arg);
        name = inlist ? "reduce_scatter" : "reduce_scatter_tensor";
        break;
    case PD_K_ALLTOALL:
        ok = inlist == outlist &&
             fast_side(self, &fv, inobj, n, 0, !inlist, &dt, ip, il) &&
             fast_side(self, &fv, outobj, n, 1, !outlist, &dt, opp, ol) &&
             il[rank] == ol[rank] && !blocks_overlap(ip, il, opp, ol, n);
        name = inlist ? "all_to_all" : "all_to_all_single";
        break;
    default:
        break;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    if (ok && kind != PD_K_ALLTOALL) {
        /* every block the size of the one-array side (submit's rule) */
        const pd_kind_info *ki = pd_kind_get(kind);
        size_t want = ki->in == PD_BLK_ONE ? il[0] : ol[0];
        int nin = pd_kind_blocks(kind, 0, rank, (int)root, n);
        int nout = pd_kind_blocks(kind, 1, rank, (int)root, n);
        for (int p = 0; p < nin; p++) {
            ok &= il[p] == want;
        }
        for (int p = 0; p < nout; p++) {
            ok &= ol[p] == want;
        }
        o.count = want / pd_dtype_size((pd_dtype)dt);
    }
    if (!ok) {
        for (int i = 0; i < fv.n; i++) {
            pd_view_release(&fv.v[i]);
        }
        Py_RETURN_FALSE;
    }
    o.kind = (pd_kind)kind;
    o.dtype = (pd_dtype)dt;
    if (kind == PD_K_REDUCE || kind == PD_K_REDUCE_SCATTER) {
        o.op = (pd_redop)arg;
    }
    o.root = (int)root;
    o.in = ip;
    o.out = opp;
    o.in_len = il;
    o.out_len = ol;
    o.nblocks = n;
    pd_strlcpy(o.name, name, sizeof(o.name));
    pd_work *handoff = NULL;
    int rc = pd_pg_run_inline(self, &o, &handoff);
    if (handoff != NULL) {
        keep_views(self, handoff, fv.v, fv.n, kind);
        return NULL; /* KeyboardInterrupt (or another signal's error) */
    }
    for (int i = 0; i < fv.n; i++) {
        pd_view_release(&fv.v[i]);
    }
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

/* fast(kind, array, arg[, input[, root]]): all_reduce (arg = op),
 * broadcast (arg = root), barrier (array None), or a collective with blocks
 * (fast_blocks: array = the output side, input = the input side) of
 * C-contiguous NumPy-like arrays, run on this thread when the group is idle.
 * True: done; False: not handled (nothing happened; use submit).  The
 * Python wrapper calls it first, so a blocking collective costs one C call. */
PyObject *
pd_pg_fast(PGObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(kind, array, arg[, input[, root]])");
        return NULL;
    }
    if (self->g == NULL) {
        Py_RETURN_FALSE;
    }
    long kind = PyLong_AsLong(args[0]);
    long arg = PyLong_AsLong(args[2]);
    if ((kind == -1 || arg == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    pd_view v;
    int have_view = 0;
    char *ptr = NULL;
    size_t len = 0;
    if (kind != PD_K_ALLREDUCE && kind != PD_K_BROADCAST &&
        kind != PD_K_BARRIER) {
        long root = nargs > 4 ? PyLong_AsLong(args[4]) : 0;
        if (root == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        return fast_blocks(self, (int)kind, args[1], arg,
                           nargs > 3 ? args[3] : Py_None, root);
    }
    if (kind == PD_K_ALLREDUCE || kind == PD_K_BROADCAST) {
        if (!pd_view_get_host(self->st, args[1], 1, &v)) {
            Py_RETURN_FALSE;
        }
        have_view = 1;
        int dt = v.dtype;
        if ((kind == PD_K_ALLREDUCE &&
             (arg < 0 || arg >= PD_NREDOPS ||
              !fast_op_ok(dt, arg))) ||
            (kind == PD_K_BROADCAST && (arg < 0 || arg >= self->size))) {
            pd_view_release(&v);
            Py_RETURN_FALSE;
        }
        o.dtype = (pd_dtype)dt;
        o.count = v.count;
        ptr = v.ptr;
        len = v.nbytes;
        if (kind == PD_K_ALLREDUCE) {
            o.op = (pd_redop)arg;
            pd_strlcpy(o.name, "all_reduce", sizeof(o.name));
        }
        else {
            o.root = (int)arg;
            pd_strlcpy(o.name, "broadcast", sizeof(o.name));
        }
    }
    else if (kind == PD_K_BARRIER) {
        pd_strlcpy(o.name, "barrier", sizeof(o.name));
    }
    else {
        Py_RETURN_FALSE;
    }
    o.kind = (pd_kind)kind;
    o.in = &ptr;
    o.out = &ptr;
    o.in_len = &len;
    o.out_len = &len;
    o.nblocks = 1;
    pd_work *handoff = NULL;
    int rc = pd_pg_run_inline(self, &o, &handoff);
    if (handoff != NULL) {
        keep_views(self, handoff, &v, have_view, (int)kind);
    }
    else if (have_view) {
        pd_view_release(&v);
    }
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}
