/* pyddp._C.ProcessGroup.submit: any operation of the group.  The binding
 * turns Python buffers into the per-rank block pointers of a pd_op, checks
 * every length against what the collective will read or write (so a wrong
 * size can never be read or written out of bounds), and submits it; the
 * Work it returns owns the array views until the operation has completed.
 */
#include <string.h>

#include "../kernels/kernels.h"
#include "../util/kinds.h"
#include "group_internal.h"

/* Fill ptrs/lens for one side from a tuple of buffers: either one buffer
 * per block, or one buffer split into nblocks (evenly, or by splits). */
static int
fill_side(WorkObject *w, PyObject *bufs, PyObject *splits, int nblocks,
          int writable, char **ptrs, size_t *lens, const char *what,
          const char *opname)
{
    Py_ssize_t nb = PyTuple_GET_SIZE(bufs);
    if (nblocks == 0) {
        return 0;
    }
    if (nb != nblocks && nb != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: expected %d %s arrays (one per rank) or one array, "
                     "got %zd", opname, nblocks, what, nb);
        return -1;
    }
    pd_module_state *st = pd_state_from_type(Py_TYPE(w));
    for (Py_ssize_t i = 0; i < nb; i++) {
        pd_view *v = &w->views[w->nviews];
        PyObject *obj = PyTuple_GET_ITEM(bufs, i);
        if (pd_view_get(st, obj, writable ? PD_VIEW_WRITABLE : 0, v) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd must be C-contiguous%s", opname,
                         what, i, writable ? " and writable" : "");
            return -1;
        }
        w->nviews++;
        if (v->device != PD_DEV_CPU) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd is on device %s:%d; this process "
                         "group's C core takes CPU memory", opname, what, i,
                         pd_device_name(v->device), v->device_index);
            return -1;
        }
        if (!v->contiguous || (writable && v->readonly)) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s array %zd must be C-contiguous%s", opname,
                         what, i, writable ? " and writable" : "");
            return -1;
        }
        if (nb == nblocks) {
            ptrs[i] = v->ptr;
            lens[i] = v->nbytes;
        }
    }
    if (nb == nblocks) {
        return 0;
    }
    /* split one buffer */
    pd_view *v = &w->views[w->nviews - 1];
    size_t total = v->nbytes, off = 0;
    for (int p = 0; p < nblocks; p++) {
        size_t len;
        if (splits != Py_None) {
            len = PyLong_AsSize_t(PyTuple_GET_ITEM(splits, p));
            if (len == (size_t)-1 && PyErr_Occurred()) {
                return -1;
            }
        }
        else {
            if (total % (size_t)nblocks != 0) {
                PyErr_Format(PyExc_ValueError,
                             "%s: %s array of %zu bytes cannot be split into "
                             "%d equal blocks", opname, what, total, nblocks);
                return -1;
            }
            len = total / (size_t)nblocks;
        }
        if (off + len > total) {
            PyErr_Format(PyExc_ValueError,
                         "%s: split sizes exceed the %s array (%zu bytes)",
                         opname, what, total);
            return -1;
        }
        ptrs[p] = v->ptr + off;
        lens[p] = len;
        off += len;
    }
    if (splits != Py_None && off != total) {
        PyErr_Format(PyExc_ValueError,
                     "%s: split sizes add up to %zu bytes but the %s array "
                     "has %zu bytes", opname, off, what, total);
        return -1;
    }
    return 0;
}

static int
check_lens(const size_t *lens, int n, size_t want, const char *what,
           const char *opname)
{
    for (int p = 0; p < n; p++) {
        if (lens[p] != want) {
            PyErr_Format(PyExc_ValueError,
                         "%s: %s block %d has %zu bytes, expected %zu", opname,
                         what, p, lens[p], want);
            return -1;
        }
    }
    return 0;
}

PyObject *
pd_pg_submit(PGObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"kind", "dtype", "op", "root", "tag", "count",
                             "inputs", "outputs", "in_splits", "out_splits",
                             "timeout", "wait_all", "name", "blocking", NULL};
    int kind, dtype, op, root, tag, wait_all, blocking = 0;
    Py_ssize_t count;
    PyObject *ins, *outs, *in_splits, *out_splits;
    double timeout;
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "iiiiinO!O!OOdps|p:submit", kwlist, &kind, &dtype,
            &op, &root, &tag, &count, &PyTuple_Type, &ins, &PyTuple_Type,
            &outs, &in_splits, &out_splits, &timeout, &wait_all, &name,
            &blocking)) {
        return NULL;
    }
    if (pg_check(self) < 0) {
        return NULL;
    }
    pd_module_state *st = pg_state((PyObject *)self);
    if (kind <= PD_K_NONE || kind >= PD_NKINDS ||
        pd_kind_has(kind, PD_KF_INTERNAL) || dtype < 0 ||
        dtype >= PD_NDTYPES || op < 0 || op >= PD_NREDOPS || count < 0) {
        PyErr_SetString(PyExc_ValueError, "submit: invalid kind/dtype/op");
        return NULL;
    }
    int size = self->size, rank = self->rank;
    const pd_kind_info *ki = pd_kind_get(kind);
    int needs_root = (ki->flags & PD_KF_ROOTED) != 0;
    if (needs_root && !(kind == PD_K_RECV && root == -1) &&
        (root < 0 || root >= size)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: rank %d is out of range: expected 0 <= rank < %d",
                     name, root, size);
        return NULL;
    }
    if ((ki->flags & PD_KF_P2P) && root == rank) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d cannot %s itself", name,
                     rank, kind == PD_K_SEND ? "send to" : "receive from");
        return NULL;
    }
    if (in_splits != Py_None && !PyTuple_Check(in_splits)) {
        PyErr_SetString(PyExc_TypeError, "in_splits must be a tuple or None");
        return NULL;
    }
    if (out_splits != Py_None && !PyTuple_Check(out_splits)) {
        PyErr_SetString(PyExc_TypeError, "out_splits must be a tuple or None");
        return NULL;
    }
    if ((ki->flags & PD_KF_REDUCES) &&
        pd_redop_check((pd_dtype)dtype, (pd_redop)op) != PD_OK) {
        return pd_py_set_error(st, PD_ETYPE, pd_errmsg());
    }
    int nin = pd_kind_blocks(kind, 0, rank, root, size);
    int nout = pd_kind_blocks(kind, 1, rank, root, size);
    if (kind == PD_K_ALLREDUCE && PyTuple_GET_SIZE(ins) == 1) {
        nin = 1; /* out of place (internal: _all_reduce_into) */
    }
    if ((in_splits != Py_None && PyTuple_GET_SIZE(in_splits) != nin) ||
        (out_splits != Py_None && PyTuple_GET_SIZE(out_splits) != nout)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: split sizes must have one entry per rank (%d)", name,
                     size);
        return NULL;
    }
    /* a root-only side may be given (and ignored) on the other ranks */
    if ((nin == 0 && PyTuple_GET_SIZE(ins) != 0 &&
         ki->in != PD_BLK_ROOT_ALL) ||
        (nout == 0 && PyTuple_GET_SIZE(outs) != 0 &&
         ki->out != PD_BLK_ROOT_ALL)) {
        PyErr_Format(PyExc_ValueError, "%s: unexpected arrays", name);
        return NULL;
    }
    WorkObject *w = pd_py_work_alloc(st);
    if (w == NULL) {
        return NULL;
    }
    w->w = NULL;
    w->nviews = 0;
    w->keep = NULL;
    w->kind = kind;
    int nslots = nin + nout + 2;
    w->views = PyMem_Calloc((size_t)(PyTuple_GET_SIZE(ins) +
                                     PyTuple_GET_SIZE(outs) + 1),
                            sizeof(pd_view));
    w->ptrs = PyMem_Calloc((size_t)nslots, sizeof(char *));
    w->lens = PyMem_Calloc((size_t)nslots, sizeof(size_t));
    if (w->views == NULL || w->ptrs == NULL || w->lens == NULL) {
        Py_DECREF(w);
        return PyErr_NoMemory();
    }
    char **ip = w->ptrs, **op_ = w->ptrs + nin + 1;
    size_t *il = w->lens, *ol = w->lens + nin + 1;
    if ((nin && PyTuple_GET_SIZE(ins) > 0 &&
         fill_side(w, ins, in_splits, nin, 0, ip, il, "input", name) < 0) ||
        (nout && PyTuple_GET_SIZE(outs) > 0 &&
         fill_side(w, outs, out_splits, nout, 1, op_, ol, "output", name) <
             0)) {
        Py_DECREF(w);
        return NULL;
    }
    if ((nin && PyTuple_GET_SIZE(ins) == 0) ||
        (nout && PyTuple_GET_SIZE(outs) == 0)) {
        PyErr_Format(PyExc_ValueError, "%s: missing %s array", name,
                     nin && PyTuple_GET_SIZE(ins) == 0 ? "input" : "output");
        Py_DECREF(w);
        return NULL;
    }
    /* Every length the algorithm relies on is checked here. */
    size_t esz = pd_dtype_size((pd_dtype)dtype);
    size_t want = (size_t)count * esz;
    int bad = 0;
    if (ki->in == PD_BLK_NONE && ki->out == PD_BLK_ONE &&
        !(ki->flags & PD_KF_P2P) && nin == 0) {
        /* in place (broadcast, all_reduce): the output is the input */
        bad = check_lens(ol, 1, want, "output", name);
        ip[0] = op_[0];
        il[0] = ol[0];
    }
    else if (!(ki->flags & (PD_KF_P2P | PD_KF_SPLITS))) {
        bad = check_lens(il, nin, want, "input", name) ||
              check_lens(ol, nout, want, "output", name);
    }
    if (bad) {
        Py_DECREF(w);
        return NULL;
    }
    pd_op o;
    memset(&o, 0, sizeof(o));
    o.kind = (pd_kind)kind;
    o.dtype = (pd_dtype)dtype;
    o.op = (pd_redop)op;
    o.root = root;
    o.tag = tag;
    o.count = (size_t)count;
    o.in = ip;
    o.out = op_;
    o.in_len = il;
    o.out_len = ol;
    o.nblocks = size;
    o.timeout = timeout;
    o.wait_all = wait_all;
    pd_strlcpy(o.name, name, sizeof(o.name));
    if (blocking) {
        /* small collective on an idle shared-memory group: run it here */
        pd_work *handoff = NULL;
        int rc = pd_pg_run_inline(self, &o, &handoff);
        if (handoff != NULL) {
            w->w = handoff;
            pd_pg_keep_handoff(self, (PyObject *)w);
        }
        if (rc != 0) {
            Py_DECREF(w);
            if (rc < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    pd_status s = pd_group_submit(self->g, &o, &w->w);
    if (s != PD_OK) {
        char msg[PD_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", pd_errmsg());
        Py_DECREF(w);
        return pd_py_set_error(st, s, msg);
    }
    return (PyObject *)w;
}
