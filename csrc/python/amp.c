/* pyddp._C: amp kernels (fused unscale + non-finite check, multi-array
 * casts) and the float-array views shared with the optimizer binding.
 *
 * Arrays come through the buffer protocol.  Buffer formats name the dtype:
 * 'e' float16, 'f' float32, 'd' float64, and 'H' (uint16) stands for
 * bfloat16, because NumPy cannot export ml_dtypes.bfloat16 buffers: the
 * Python layer passes those as uint16 views (pyddp/_kernels.py).
 */
#include "binding.h"

#include "../kernels/amp.h"
#include "../kernels/gelu.h"
#include "../kernels/gemm_bf16.h"

/* The float kernels' dtypes: float16, float32, float64 by format, and
 * bfloat16 as a uint16 view ('H'), because NumPy cannot export
 * ml_dtypes.bfloat16 buffers (the Python layer passes those as uint16
 * views, pyddp/_kernels.py); a DLPack bfloat16 tensor is bfloat16 itself. */
static pd_dtype
float_dtype_of(const pd_view *v)
{
    switch (v->dtype) {
    case PD_UINT16:
        return PD_BFLOAT16;
    case PD_FLOAT16:
    case PD_BFLOAT16:
    case PD_FLOAT32:
    case PD_FLOAT64:
        return (pd_dtype)v->dtype;
    default:
        return PD_NDTYPES;
    }
}

static void
describe(char *out, size_t n, const char *name, Py_ssize_t idx)
{
    if (idx >= 0) {
        PyOS_snprintf(out, n, "%s[%zd]", name, idx);
    } else {
        PyOS_snprintf(out, n, "%s", name);
    }
}

static const char *
allowed_names(unsigned mask)
{
    static const char *const names[16] = {
        "(none)", "float16", "bfloat16", "float16 or bfloat16",
        "float32", "float16 or float32", "bfloat16 or float32",
        "float16, bfloat16 or float32", "float64", "float16 or float64",
        "bfloat16 or float64", "float16, bfloat16 or float64",
        "float32 or float64", "float16, float32 or float64",
        "bfloat16, float32 or float64",
        "float16, bfloat16, float32 or float64",
    };
    return names[mask & 15u];
}

unsigned
pd_py_dtype_bit(int dt)
{
    switch (dt) {
    case PD_FLOAT16:
        return PD_F16_BIT;
    case PD_BFLOAT16:
        return PD_BF16_BIT;
    case PD_FLOAT32:
        return PD_F32_BIT;
    case PD_FLOAT64:
        return PD_F64_BIT;
    default:
        return 0;
    }
}

int
pd_py_fview_get(PyObject *obj, const char *fn, const char *name,
                Py_ssize_t idx, int writable, unsigned allowed,
                pd_fview *v)
{
    char what[96];
    describe(what, sizeof(what), name, idx);
    v->held = 0;
    /* no module state here: pyddp Tensors arrive unwrapped (_kernels.py) */
    if (pd_view_get(NULL, obj, 0, &v->view) < 0) {
        PyObject *exc_type, *exc, *tb;
        PyErr_Fetch(&exc_type, &exc, &tb);
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be an array (numpy.ndarray or a buffer), "
                     "got %.100s", fn, what, Py_TYPE(obj)->tp_name);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        return -1;
    }
    v->held = 1;
    v->dt = float_dtype_of(&v->view);
    if (v->view.device != PD_DEV_CPU) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s is on device %s:%d; the kernels take CPU arrays",
                     fn, what, pd_device_name(v->view.device),
                     v->view.device_index);
        goto fail;
    }
    if (v->dt == PD_NDTYPES || !(pd_py_dtype_bit(v->dt) & allowed)) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be %s (bfloat16 as a uint16 view), got "
                     "%s", fn, what, allowed_names(allowed),
                     v->view.dtype >= 0
                         ? pd_dtype_name((pd_dtype)v->view.dtype)
                         : "an unknown dtype");
        goto fail;
    }
    if (!v->view.contiguous) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be C-contiguous", fn,
                     what);
        goto fail;
    }
    if (writable && v->view.readonly) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s is read-only; it is updated in place", fn, what);
        goto fail;
    }
    v->ptr = v->view.ptr;
    v->nbytes = v->view.nbytes;
    v->count = v->view.count;
    return 0;
fail:
    pd_py_fview_release(v);
    return -1;
}

void
pd_py_fview_release(pd_fview *v)
{
    if (v->held) {
        pd_view_release(&v->view);
        v->held = 0;
    }
}

void
pd_py_fviews_release(pd_fview *v, Py_ssize_t n)
{
    if (v == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        pd_py_fview_release(&v[i]);
    }
    PyMem_RawFree(v);
}

pd_fview *
pd_py_fviews_get(PyObject *seq, Py_ssize_t expect, const char *fn,
                 const char *name, int writable, unsigned allowed,
                 Py_ssize_t *n_out)
{
    PyObject *fast = PySequence_Fast(seq, "");
    if (fast == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s: %s must be a list or tuple of arrays, got %.100s",
                     fn, name, Py_TYPE(seq)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (expect >= 0 && n != expect) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s has %zd arrays, expected %zd (one per "
                     "parameter)", fn, name, n, expect);
        Py_DECREF(fast);
        return NULL;
    }
    pd_fview *v = PyMem_RawCalloc(n > 0 ? (size_t)n : 1, sizeof(pd_fview));
    if (v == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (pd_py_fview_get(item, fn, name, i, writable, allowed, &v[i]) <
            0) {
            pd_py_fviews_release(v, i);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    *n_out = n;
    return v;
}

/* found_inf: a writable float32 buffer of one element, or None. */
int
pd_py_found_inf(PyObject *obj, const char *fn, pd_fview *v, float **flag)
{
    *flag = NULL;
    v->held = 0;
    if (obj == Py_None) {
        return 0;
    }
    if (pd_py_fview_get(obj, fn, "found_inf", -1, 1, PD_F32_BIT, v) < 0) {
        return -1;
    }
    if (v->count != 1) {
        PyErr_Format(PyExc_ValueError,
                     "%s: found_inf must hold exactly 1 element, got %zu",
                     fn, v->count);
        pd_py_fview_release(v);
        return -1;
    }
    *flag = (float *)v->ptr;
    return 0;
}

/* inv_scale: a Python number or a 1-element float32 array (torch passes a
 * tensor).  Converted to float32, the type torch keeps it in. */
int
pd_py_inv_scale(PyObject *obj, const char *fn, float *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = 1.0f;
        return 0;
    }
    if (PyObject_CheckBuffer(obj)) {
        pd_fview v;
        if (pd_py_fview_get(obj, fn, "inv_scale", -1, 0, PD_F32_BIT, &v) <
            0) {
            return -1;
        }
        if (v.count != 1) {
            PyErr_Format(PyExc_ValueError,
                         "%s: inv_scale must hold exactly 1 element, got "
                         "%zu", fn, v.count);
            pd_py_fview_release(&v);
            return -1;
        }
        *out = *(const float *)v.ptr;
        pd_py_fview_release(&v);
        return 0;
    }
    double d = PyFloat_AsDouble(obj);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError,
                     "%s: inv_scale must be a float or a 1-element float32 "
                     "array, got %.100s", fn, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = (float)d;
    return 0;
}

static PyObject *
amp_unscale(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static const char *fn = "amp_unscale_";
    static char *kwlist[] = {"arrays", "found_inf", "inv_scale", NULL};
    PyObject *arrays, *found_obj, *inv_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:amp_unscale_",
                                     kwlist, &arrays, &found_obj, &inv_obj)) {
        return NULL;
    }
    float inv;
    if (pd_py_inv_scale(inv_obj, fn, &inv) < 0) {
        return NULL;
    }
    pd_fview fv;
    float *flag;
    if (pd_py_found_inf(found_obj, fn, &fv, &flag) < 0) {
        return NULL;
    }
    Py_ssize_t n = 0;
    pd_fview *v = pd_py_fviews_get(arrays, -1, fn, "arrays",
                                   inv != 1.0f, PD_ALLFLOAT_BITS, &n);
    if (v == NULL) {
        pd_py_fview_release(&fv);
        return NULL;
    }
    int found = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        found |= pd_amp_unscale(v[i].dt, v[i].ptr, v[i].count, inv);
    }
    if (found && flag != NULL) {
        *flag = 1.0f;
    }
    Py_END_ALLOW_THREADS
    pd_py_fviews_release(v, n);
    pd_py_fview_release(&fv);
    return PyBool_FromLong(found);
}

static PyObject *
cast_arrays(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static const char *fn = "cast_";
    static char *kwlist[] = {"dsts", "srcs", NULL};
    PyObject *dsts, *srcs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:cast_", kwlist, &dsts,
                                     &srcs)) {
        return NULL;
    }
    Py_ssize_t nd = 0, ns = 0;
    pd_fview *d = pd_py_fviews_get(dsts, -1, fn, "dsts", 1, PD_ALLFLOAT_BITS,
                                   &nd);
    if (d == NULL) {
        return NULL;
    }
    pd_fview *s = pd_py_fviews_get(srcs, nd, fn, "srcs", 0, PD_ALLFLOAT_BITS,
                                   &ns);
    if (s == NULL) {
        pd_py_fviews_release(d, nd);
        return NULL;
    }
    PyObject *ret = NULL;
    for (Py_ssize_t i = 0; i < nd; i++) {
        if (d[i].count != s[i].count) {
            PyErr_Format(PyExc_ValueError,
                         "%s: dsts[%zd] has %zu elements but srcs[%zd] has "
                         "%zu", fn, i, d[i].count, i, s[i].count);
            goto done;
        }
        if (s[i].dt == PD_FLOAT64 &&
            (d[i].dt == PD_FLOAT16 || d[i].dt == PD_BFLOAT16)) {
            PyErr_Format(PyExc_TypeError,
                         "%s: cannot cast srcs[%zd] (float64) to dsts[%zd] "
                         "(%s): cast to float32 first", fn, i, i,
                         pd_dtype_name(d[i].dt));
            goto done;
        }
        const char *lo = d[i].ptr, *hi = lo + d[i].nbytes;
        const char *slo = s[i].ptr, *shi = slo + s[i].nbytes;
        if (d[i].nbytes > 0 && s[i].nbytes > 0 && lo < shi && slo < hi) {
            PyErr_Format(PyExc_ValueError,
                         "%s: dsts[%zd] and srcs[%zd] overlap in memory", fn,
                         i, i);
            goto done;
        }
    }
    pd_status st = PD_OK;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nd && st == PD_OK; i++) {
        st = pd_cast(d[i].dt, d[i].ptr, s[i].dt, s[i].ptr,
                     d[i].count);
    }
    Py_END_ALLOW_THREADS
    if (st != PD_OK) {
        pd_py_set_error(pd_get_state(module), st, pd_errmsg());
        goto done;
    }
    Py_INCREF(Py_None);
    ret = Py_None;
done:
    pd_py_fviews_release(d, nd);
    pd_py_fviews_release(s, ns);
    return ret;
}

/* A C-contiguous float32 buffer of obj ('f' format), or -1 with TypeError. */
static int
f32_buffer(PyObject *obj, const char *fn, const char *name, int writable,
           Py_buffer *b)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (writable) {
        flags |= PyBUF_WRITABLE;
    }
    if (PyObject_GetBuffer(obj, b, flags) < 0) {
        return -1;
    }
    const char *f = b->format != NULL ? b->format : "B";
    if (*f == '<' || *f == '=') {
        f++;
    }
    if (b->itemsize != 4 || strcmp(f, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a float32 array", fn,
                     name);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *
gelu_f32(PyObject *module, PyObject *args)
{
    PyObject *out_o, *x_o;
    if (!PyArg_ParseTuple(args, "OO:gelu", &out_o, &x_o)) {
        return NULL;
    }
    Py_buffer out, x;
    if (f32_buffer(out_o, "gelu", "out", 1, &out) < 0) {
        return NULL;
    }
    if (f32_buffer(x_o, "gelu", "x", 0, &x) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *ret = NULL;
    if (out.len != x.len) {
        PyErr_SetString(PyExc_ValueError, "gelu: out and x differ in size");
    } else {
        Py_BEGIN_ALLOW_THREADS
        pd_gelu_f32(out.buf, x.buf, (size_t)x.len / 4);
        Py_END_ALLOW_THREADS
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&x);
    return ret;
}

static PyObject *
gelu_backward_f32(PyObject *module, PyObject *args)
{
    PyObject *gx_o, *g_o, *x_o;
    if (!PyArg_ParseTuple(args, "OOO:gelu_backward", &gx_o, &g_o, &x_o)) {
        return NULL;
    }
    Py_buffer gx, g, x;
    if (f32_buffer(gx_o, "gelu_backward", "gx", 1, &gx) < 0) {
        return NULL;
    }
    if (f32_buffer(g_o, "gelu_backward", "g", 0, &g) < 0) {
        PyBuffer_Release(&gx);
        return NULL;
    }
    if (f32_buffer(x_o, "gelu_backward", "x", 0, &x) < 0) {
        PyBuffer_Release(&gx);
        PyBuffer_Release(&g);
        return NULL;
    }
    PyObject *ret = NULL;
    if (gx.len != x.len || g.len != x.len) {
        PyErr_SetString(PyExc_ValueError,
                        "gelu_backward: gx, g and x differ in size");
    } else {
        Py_BEGIN_ALLOW_THREADS
        pd_gelu_backward_f32(gx.buf, g.buf, x.buf, (size_t)x.len / 4);
        Py_END_ALLOW_THREADS
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&gx);
    PyBuffer_Release(&g);
    PyBuffer_Release(&x);
    return ret;
}

#define GEMM_MAXD 8

/* A strided array of 2 to GEMM_MAXD dimensions for gemm_bf16 (the leading
 * ones batch dimensions): the operands 'H' (bfloat16 as uint16); out
 * writable, 'f' (float32) or 'H' (*out_bf16 set), unit last stride.  Shape
 * and strides (in elements) are copied out. */
static int
gemm_operand(PyObject *obj, const char *name, int is_out, Py_buffer *b,
             Py_ssize_t shape[GEMM_MAXD], ptrdiff_t strides[GEMM_MAXD],
             int *out_bf16)
{
    int flags = PyBUF_STRIDES | PyBUF_FORMAT;
    if (is_out) {
        flags |= PyBUF_WRITABLE;
    }
    if (PyObject_GetBuffer(obj, b, flags) < 0) {
        return -1;
    }
    const char *f = b->format != NULL ? b->format : "B";
    if (*f == '<' || *f == '=') {
        f++;
    }
    int is_f32 = b->itemsize == 4 && strcmp(f, "f") == 0;
    int is_u16 = b->itemsize == 2 && strcmp(f, "H") == 0;
    if (!(is_u16 || (is_out && is_f32))) {
        PyErr_Format(PyExc_TypeError,
                     "gemm_bf16: %s must be a %s array", name,
                     is_out ? "float32 or uint16 (bfloat16 bits)"
                            : "uint16 (bfloat16 bits)");
        goto fail;
    }
    if (out_bf16 != NULL) {
        *out_bf16 = is_u16;
    }
    Py_ssize_t item = b->itemsize;
    if (b->ndim < 2 || b->ndim > GEMM_MAXD) {
        PyErr_Format(PyExc_ValueError,
                     "gemm_bf16: %s must have 2 to %d dimensions, not %d",
                     name, GEMM_MAXD, b->ndim);
        goto fail;
    }
    for (int d = 0; d < b->ndim; d++) {
        if (b->strides[d] % item != 0) {
            PyErr_Format(PyExc_ValueError,
                         "gemm_bf16: %s's strides are not whole elements",
                         name);
            goto fail;
        }
        shape[d] = b->shape[d];
        strides[d] = (ptrdiff_t)(b->strides[d] / item);
    }
    int nd = b->ndim;
    if (is_out && shape[nd - 1] > 1 && strides[nd - 1] != 1) {
        PyErr_SetString(PyExc_ValueError,
                        "gemm_bf16: out's last dimension must be contiguous");
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(b);
    return -1;
}

static PyObject *
gemm_bf16(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"out", "a", "b", "bias", "portable", NULL};
    PyObject *out_o, *a_o, *b_o, *bias_o = Py_None;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|Op:gemm_bf16", kwlist,
                                     &out_o, &a_o, &b_o, &bias_o,
                                     &portable)) {
        return NULL;
    }
    Py_buffer ob, ab, bb, biasb;
    Py_ssize_t os[GEMM_MAXD], as[GEMM_MAXD], bs[GEMM_MAXD];
    ptrdiff_t ost[GEMM_MAXD], ast[GEMM_MAXD], bst[GEMM_MAXD];
    int out_bf16 = 0;
    if (gemm_operand(out_o, "out", 1, &ob, os, ost, &out_bf16) < 0) {
        return NULL;
    }
    if (gemm_operand(a_o, "a", 0, &ab, as, ast, NULL) < 0) {
        PyBuffer_Release(&ob);
        return NULL;
    }
    if (gemm_operand(b_o, "b", 0, &bb, bs, bst, NULL) < 0) {
        PyBuffer_Release(&ob);
        PyBuffer_Release(&ab);
        return NULL;
    }
    int have_bias = bias_o != Py_None;
    PyObject *ret = NULL;
    if (have_bias && f32_buffer(bias_o, "gemm_bf16", "bias", 0, &biasb) < 0) {
        goto done;
    }
    int nd = ab.ndim;
    int match = bb.ndim == nd && ob.ndim == nd;
    for (int d = 0; match && d < nd - 2; d++) {
        match = as[d] == bs[d] && os[d] == as[d];
    }
    if (!match || as[nd - 1] != bs[nd - 2] || os[nd - 2] != as[nd - 2] ||
        os[nd - 1] != bs[nd - 1]) {
        PyErr_SetString(PyExc_ValueError,
                        "gemm_bf16: shapes do not match: out (..., M, N), "
                        "a (..., M, K), b (..., K, N), one batch shape");
        goto done;
    }
    if (have_bias && biasb.len / 4 != os[nd - 1]) {
        PyErr_SetString(PyExc_ValueError,
                        "gemm_bf16: bias must have N elements");
        goto done;
    }
    size_t M = (size_t)as[nd - 2], K = (size_t)as[nd - 1];
    size_t N = (size_t)bs[nd - 1];
    /* the innermost batch dimension goes to the kernel; the others (an
     * odometer over them) are separate calls */
    size_t batch = nd >= 3 ? (size_t)as[nd - 3] : 1;
    ptrdiff_t abs_ = nd >= 3 ? ast[nd - 3] : 0, bbs = nd >= 3 ? bst[nd - 3] : 0;
    ptrdiff_t obs = nd >= 3 ? ost[nd - 3] : 0;
    int outer_nd = nd > 3 ? nd - 3 : 0;
    size_t outer = 1;
    for (int d = 0; d < outer_nd; d++) {
        outer *= (size_t)as[d];
    }
    const float *bias = have_bias ? (const float *)biasb.buf : NULL;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t idx[GEMM_MAXD] = {0};
    for (size_t o = 0; o < outer && rc == 0; o++) {
        ptrdiff_t aoff = 0, boff = 0, ooff = 0;
        for (int d = 0; d < outer_nd; d++) {
            aoff += idx[d] * ast[d];
            boff += idx[d] * bst[d];
            ooff += idx[d] * ost[d];
        }
        void *c = out_bf16 ? (void *)((uint16_t *)ob.buf + ooff)
                           : (void *)((float *)ob.buf + ooff);
        rc = pd_gemm_bf16(batch, M, N, K, (const uint16_t *)ab.buf + aoff,
                          abs_, ast[nd - 2], ast[nd - 1],
                          (const uint16_t *)bb.buf + boff, bbs, bst[nd - 2],
                          bst[nd - 1], c, out_bf16, obs, ost[nd - 2], bias,
                          portable);
        for (int d = outer_nd - 1; d >= 0; d--) {
            if (++idx[d] < as[d]) {
                break;
            }
            idx[d] = 0;
        }
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
    } else {
        ret = Py_NewRef(Py_None);
    }
done:
    if (have_bias && biasb.obj != NULL) {
        PyBuffer_Release(&biasb);
    }
    PyBuffer_Release(&ob);
    PyBuffer_Release(&ab);
    PyBuffer_Release(&bb);
    return ret;
}

static PyObject *
gemm_bf16_native(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(pd_gemm_bf16_native() == PD_GEMM_BF16_NATIVE);
}

static PyMethodDef amp_methods[] = {
    {"amp_unscale_", (PyCFunction)(void (*)(void))amp_unscale,
     METH_VARARGS | METH_KEYWORDS,
     "amp_unscale_(arrays, found_inf, inv_scale) -> bool\n\n"
     "Multiply every array in place by inv_scale and check for inf/NaN in "
     "one pass (torch._amp_foreach_non_finite_check_and_unscale_).  arrays: "
     "float16/bfloat16(uint16 view)/float32/float64, C-contiguous, writable; "
     "found_inf: 1-element float32 array set to 1.0 when any input element "
     "is inf or NaN, or None; inv_scale: float or 1-element float32 array "
     "(exactly 1.0: check only, nothing written).  Returns whether inf/NaN "
     "was seen."},
    {"cast_", (PyCFunction)(void (*)(void))cast_arrays,
     METH_VARARGS | METH_KEYWORDS,
     "cast_(dsts, srcs) -> None\n\n"
     "dsts[i][...] = srcs[i] converted, for every pair in one call "
     "(float16, bfloat16 as uint16 view, float32, float64; round to nearest "
     "even, inf and NaN preserved).  Element counts must match."},
    {"gelu", gelu_f32, METH_VARARGS,
     "gelu(out, x) -> None\n\n"
     "out = x / 2 * (1 + erf(x / sqrt 2)) (exact GELU) on C-contiguous "
     "float32 arrays of one size; out must not overlap x."},
    {"gelu_backward", gelu_backward_f32, METH_VARARGS,
     "gelu_backward(gx, g, x) -> None\n\n"
     "gx = g * (Phi(x) + x * phi(x)), exact GELU's gradient, on C-contiguous "
     "float32 arrays of one size; gx must not overlap g or x."},
    {"gemm_bf16", (PyCFunction)(void (*)(void))gemm_bf16,
     METH_VARARGS | METH_KEYWORDS,
     "gemm_bf16(out, a, b, bias=None, portable=False) -> None\n\n"
     "out[t] = a[t] @ b[t] (+ bias) with bfloat16 operands and float32 "
     "sums: a (..., M, K) and b (..., K, N) uint16 views of bfloat16 "
     "arrays, any strides (transposes, stride-0 broadcasts), one batch shape "
     "(up to 6 dimensions); out (..., M, N) float32, or uint16 (bfloat16 "
     "bits: the float32 result rounded to nearest even), with a contiguous "
     "last dimension, not overlapping a or b; bias: N contiguous float32 or "
     "None.  AVX512-BF16 "
     "(vdpbf16ps) where the CPU has it, else plain C; portable=True forces "
     "the plain C."},
    {"gemm_bf16_native", gemm_bf16_native, METH_NOARGS,
     "gemm_bf16_native() -> bool\n\n"
     "Whether gemm_bf16 runs the AVX512-BF16 kernel on this CPU."},
    {NULL, NULL, 0, NULL},
};

int
pd_amp_add_functions(PyObject *m, pd_module_state *st)
{
    return PyModule_AddFunctions(m, amp_methods);
}
