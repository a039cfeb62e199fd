"""Tensor operations with their backward functions: elementwise, matmul, casts, reductions, shapes,
indexing, in-place arithmetic, softmax."""
import builtins
from collections import namedtuple

import numpy as np

from ._core import (_CAST_MIN, Tensor, _as_t, _binop_arrays, _check_inplace, _check_overlap,
                    _dims, _mk, _mm, _new, _new_on, _promote, _red, _to)
from ._dtypes import _F32, _HALFS, _dtype, _is_float_dtype, _pybool, _pyfloat, _pyint, int64
from ._grad_mode import _st

__all__ = [
    "cat", "concat", "stack", "where", "matmul", "mm", "bmm", "exp", "log", "sqrt",
    "rsqrt", "abs", "neg", "sin", "cos", "tanh", "sigmoid", "relu", "clamp", "clip", "sum",
    "mean", "max", "min", "amax", "amin", "var", "std", "argmax", "argmin", "reshape", "flatten",
    "permute", "transpose", "squeeze", "unsqueeze", "softmax", "log_softmax", "maximum",
    "minimum", "pow", "add", "sub", "mul", "div", "allclose", "equal", "isfinite", "isnan",
    "isinf", "log1p", "expm1", "square", "split", "chunk", "all", "any", "logsumexp", "swapaxes",
    "sign", "floor", "ceil", "round", "outer", "tril", "triu",
]


# ----------------------------------------------------------------------------------------------
# elementwise ops

def _bin_setup(a, b):
    if not isinstance(a, Tensor):
        a = _as_t(a, b if isinstance(b, Tensor) else None)
    return a


def add(a, b, alpha=1):
    """a + alpha * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if alpha != 1:
        bd = bd * alpha
    out = _half_op(np.add, ad, bd)
    bt = b if isinstance(b, Tensor) else None
    if not (_st.grad and (a._requires_grad or (bt is not None and bt._requires_grad))):
        return _new_on(out, a, b)
    sa, sb, dta = a.shape, (bt.shape if bt is not None else None), a.dtype
    dtb = bt.dtype if bt is not None else None

    def bw(g):
        return (_red(g, sa, dta),
                None if sb is None else _red(g if alpha == 1 else g * alpha, sb, dtb))
    return _mk(out, "AddBackward0", bw, (a, bt), saves=False)


def sub(a, b, alpha=1):
    """a - alpha * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if alpha != 1:
        bd = bd * alpha
    out = _half_op(np.subtract, ad, bd)
    bt = b if isinstance(b, Tensor) else None
    if not (_st.grad and (a._requires_grad or (bt is not None and bt._requires_grad))):
        return _new_on(out, a, b)
    sa, sb, dta = a.shape, (bt.shape if bt is not None else None), a.dtype
    dtb = bt.dtype if bt is not None else None

    def bw(g):
        return (_red(g, sa, dta), None if sb is None else _red(-g * alpha if alpha != 1 else -g,
                                                               sb, dtb))
    return _mk(out, "SubBackward0", bw, (a, bt), saves=False)


def _half_op(f, ad, bd):
    """f(ad, bd), where overflow to inf (and inf - inf) is the result, as in torch, not a NumPy
    warning: in float16/bfloat16 (as on half hardware), and for a one-element tensor (a loss that
    GradScaler's scale overflows, in any float type; the step is then skipped silently as torch's).
    Larger float32/float64 operations keep NumPy's default (the errstate costs microseconds)."""
    dt = ad.dtype
    if dt in _HALFS or ad.size == 1:
        with np.errstate(over="ignore", invalid="ignore"):
            if dt in _HALFS and ad.size >= _CAST_MIN:
                # NumPy's float16 and ml_dtypes' bfloat16 arithmetic are scalar loops: widen
                # (exact), compute in float32 and round once, which gives the same bits for
                # + - * / (float32 holds more than twice the half's precision), with a scalar
                # first rounded to the half type as NumPy does
                if type(bd) is np.ndarray:
                    if bd.dtype == dt:
                        return _to(f(_to(ad, _F32), _to(bd, _F32)), dt)
                elif type(bd) is _pyfloat or type(bd) is _pyint:
                    return _to(f(_to(ad, _F32), np.float32(dt.type(bd))), dt)
            return f(ad, bd)
    return f(ad, bd)


def mul(a, b):
    """a * b."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    out = _half_op(np.multiply, ad, bd)
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new_on(out, a, b)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = _red(_half_op(np.multiply, g, bd), sa, dta) if ra else None
        gb = _red(_half_op(np.multiply, g, ad), bt.shape, bt.dtype) if rb else None
        return ga, gb
    return _mk(out, "MulBackward0", bw, (a, bt))


def div(a, b, rounding_mode=None):
    """a / b (true division; integer inputs give the default float dtype)."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    if rounding_mode is not None:
        f = np.floor_divide if rounding_mode == "floor" else (
            lambda x, y: np.trunc(np.true_divide(x, y)).astype(np.result_type(x, y)))
        return _new_on(f(ad, bd), a, b)
    if not _is_float_dtype(ad.dtype):
        ad = ad.astype(_st.default)
    out = _half_op(np.true_divide, ad, bd)
    if out.dtype != ad.dtype and _is_float_dtype(ad.dtype) and not isinstance(b, Tensor):
        out = out.astype(ad.dtype)
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new_on(out, a, b)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = _red(g / bd, sa, dta) if ra else None
        gb = _red(-g * out / bd, bt.shape, bt.dtype) if rb else None
        return ga, gb
    return _mk(out, "DivBackward0", bw, (a, bt))


def pow(a, b):
    """a ** b (either may be a Python number)."""
    a = _bin_setup(a, b)
    ad, bd = _binop_arrays(a, b)
    out = np.power(ad, bd)
    bt = b if isinstance(b, Tensor) else None
    ra = a._requires_grad
    rb = bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new_on(out, a, b)
    sa, dta = a.shape, a.dtype

    def bw(g):
        ga = gb = None
        if ra:
            if bt is None and bd == 2:
                ga = _red(g * (2 * ad), sa, dta)
            else:
                ga = _red(g * (bd * np.power(ad, bd - 1)), sa, dta)
        if rb:
            with np.errstate(divide="ignore", invalid="ignore"):
                lg = np.where(ad > 0, np.log(np.where(ad > 0, ad, 1)), np.where(ad == 0, 0, np.nan))
            gb = _red(g * out * lg.astype(out.dtype, copy=False), bt.shape, bt.dtype)
        return ga, gb
    return _mk(out, "PowBackward0", bw, (a, bt))


def neg(a):
    """-a."""
    return _mk(np.negative(a._data), "NegBackward0", lambda g: (-g,), (a,), saves=False)


def _unary(name, f, dfn, use_out=False):
    """Make an elementwise op: f(x) forward, dfn(g, x, out) -> grad."""
    def op(x):
        if not isinstance(x, Tensor):
            x = _as_t(x)
        xd = x._data
        if _st.autocast is not None and name in _FP32_OPS and xd.dtype in _HALFS:
            x = _cast(x, _F32)
            xd = x._data
        if not _is_float_dtype(xd.dtype):
            xd = xd.astype(_st.default)
        out = f(xd)
        if not (_st.grad and x._requires_grad):
            return _new_on(out, x)
        return _mk(out, name, lambda g: (dfn(g, xd, out),), (x,))
    op.__name__ = name
    return op


_FP32_OPS = {"ExpBackward0", "LogBackward0"}


def _recip_sqrt(x):
    return 1.0 / np.sqrt(x)


exp = _unary("ExpBackward0", np.exp, lambda g, x, o: g * o)
log = _unary("LogBackward0", np.log, lambda g, x, o: g / x)
log1p = _unary("Log1PBackward0", np.log1p, lambda g, x, o: g / (x + 1))
expm1 = _unary("Expm1Backward0", np.expm1, lambda g, x, o: g * (o + 1))
sqrt = _unary("SqrtBackward0", np.sqrt, lambda g, x, o: g / (2 * o))
rsqrt = _unary("RsqrtBackward0", _recip_sqrt, lambda g, x, o: g * (-0.5 * o * o * o))
sin = _unary("SinBackward0", np.sin, lambda g, x, o: g * np.cos(x))
cos = _unary("CosBackward0", np.cos, lambda g, x, o: -g * np.sin(x))
tanh = _unary("TanhBackward0", np.tanh, lambda g, x, o: g * (1 - o * o))
square = _unary("PowBackward0", np.square, lambda g, x, o: g * (2 * x))


def _sigmoid_f(x):
    # stable for both signs: 1/(1+exp(-x)) = exp(-log1p(exp(-x)))
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


sigmoid = _unary("SigmoidBackward0", _sigmoid_f, lambda g, x, o: g * (o * (1 - o)))

for _name, _what in (("exp", "e**x"), ("log", "the natural logarithm"), ("log1p", "log(1 + x)"),
                     ("expm1", "e**x - 1"), ("sqrt", "the square root"),
                     ("rsqrt", "1 / sqrt(x)"), ("sin", "the sine"), ("cos", "the cosine"),
                     ("tanh", "the hyperbolic tangent"), ("square", "x * x"),
                     ("sigmoid", "the logistic sigmoid 1 / (1 + e**-x)")):
    globals()[_name].__name__ = globals()[_name].__qualname__ = _name
    globals()[_name].__doc__ = f"{_name}(x): {_what}, elementwise (torch.{_name}; differentiable)."
del _name, _what


def abs(x):  # noqa: A001
    """|x| (gradient sign(x), 0 at 0)."""
    xd = x._data
    return _mk(np.abs(xd), "AbsBackward0", lambda g: (g * np.sign(xd),), (x,))


def relu(x):
    """max(x, 0)."""
    xd = x._data
    out = np.maximum(xd, 0)

    def bw(g):
        return (g * (out > 0),)  # a bool mask multiplies fast (np.where with a scalar does not)
    return _mk(out, "ReluBackward0", bw, (x,))


def _nograd_unary(f):
    def op(x):
        return _mk(f(x._data), "ZeroBackward", lambda g: (np.zeros_like(g),), (x,), saves=False)
    op.__name__ = f.__name__
    op.__doc__ = f"Elementwise {f.__name__} of a Tensor (NumPy's np.{f.__name__}); its gradient is zero."
    return op


sign = _nograd_unary(np.sign)
floor = _nograd_unary(np.floor)
ceil = _nograd_unary(np.ceil)
round = _nograd_unary(np.round)  # noqa: A001


def clamp(x, min=None, max=None):  # noqa: A002
    """Clamp x into [min, max] (either may be None or a Tensor); gradient passes inside."""
    xd = x._data
    lo = min._data if isinstance(min, Tensor) else min
    hi = max._data if isinstance(max, Tensor) else max
    out = np.clip(xd, lo, hi) if (lo is not None or hi is not None) else xd.copy()
    if out.dtype != xd.dtype:
        out = out.astype(xd.dtype)

    def bw(g):
        m = np.ones(xd.shape, dtype=np.bool_)
        if lo is not None:
            m &= xd >= lo
        if hi is not None:
            m &= xd <= hi
        return (g * m,)
    return _mk(out, "ClampBackward1", bw, (x,))


clip = clamp


def maximum(a, b):
    """Elementwise max (ties split the gradient like torch)."""
    return _minmax2(a, b, np.maximum, "MaximumBackward0")


def minimum(a, b):
    """Elementwise min."""
    return _minmax2(a, b, np.minimum, "MinimumBackward0")


def _minmax2(a, b, f, name):
    a = _bin_setup(a, b)
    b = _as_t(b, a)
    ad, bd = _binop_arrays(a, b)
    out = f(ad, bd)

    def bw(g):
        wa = np.where(ad == bd, 0.5, (out == ad)).astype(g.dtype)
        wa = np.broadcast_to(wa, out.shape)
        return (_red(g * wa, a.shape, a.dtype), _red(g * (1 - wa), b.shape, b.dtype))
    return _mk(out, name, bw, (a, b))


def where(cond, a=None, b=None):
    """where(cond, a, b): a where cond else b (a, b Tensors or numbers); where(cond): indices."""
    c = cond._data if isinstance(cond, Tensor) else np.asarray(cond)
    if a is None:
        return tuple(_new_on(i.astype(int64, copy=False), cond) for i in np.nonzero(c))
    if not isinstance(a, Tensor):
        a = _as_t(a, b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = _as_t(b, a)
    ad, bd = _binop_arrays(a, b)
    out = np.where(c, ad, bd)

    def bw(g):
        ga = _red(g * c, a.shape, a.dtype) \
            if a._requires_grad else None
        gb = _red(g * ~c, b.shape, b.dtype) \
            if b._requires_grad else None
        return ga, gb
    return _mk(out, "WhereBackward0", bw, (a, b))


def _cast(x, dt):
    src = x._data.dtype
    # values beyond float16's range become inf, as torch's casts do, without a NumPy warning
    # (amp's loss scaler expects and handles them); float32 <-> half in one C pass (_to)
    out = _to(x._data, dt)
    if out is x._data:
        out = out.copy()
    if not _is_float_dtype(dt):
        return _new_on(out, x)

    def back(g):
        return (_to(g, src),)
    return _mk(out, "ToCopyBackward0", back, (x,), saves=False)


def matmul(a, b):
    """Matrix product with NumPy/torch broadcasting (1-D operands as vectors)."""
    if _st.autocast is not None:
        a, b = _ac_low(a), _ac_low(b)
    ad, bd = a._data, b._data
    if ad.dtype != bd.dtype:
        dt = _promote(ad, bd)
        ad, bd = ad.astype(dt), bd.astype(dt)
    out = _mm(ad, bd)
    ra, rb = a._requires_grad, b._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new_on(out, a, b)

    def bw(g):
        A = ad[None, :] if ad.ndim == 1 else ad
        B = bd[:, None] if bd.ndim == 1 else bd
        G = g
        if bd.ndim == 1:
            G = np.expand_dims(G, -1)
        if ad.ndim == 1:
            G = np.expand_dims(G, -2)
        ga = gb = None
        if ra:
            ga = _mm(G, np.swapaxes(B, -1, -2))
            ga = _red(ga, A.shape, a.dtype).reshape(ad.shape)
        if rb:
            gb = _mm(np.swapaxes(A, -1, -2), G)
            gb = _red(gb, B.shape, b.dtype).reshape(bd.shape)
        return ga, gb
    return _mk(out, "MmBackward0", bw, (a, b))


mm = matmul
bmm = matmul


def outer(a, b):
    """Outer product of two vectors."""
    return matmul(a.reshape(-1, 1), b.reshape(1, -1))


def _ac_low(t):
    dt = _st.autocast
    if t._data.dtype != dt and t._data.dtype.kind == "f":
        return _cast(t, dt)
    return t


def _ac_f32(t):
    """Under autocast, lower-precision float inputs go up to float32 (fp32-list ops)."""
    if _st.autocast is not None and t._data.dtype in _HALFS:
        return _cast(t, _F32)
    return t


# ----------------------------------------------------------------------------------------------
# reductions

def _expand_grad(g, shape, dim, keepdim):
    if dim is not None and not keepdim:
        g = np.expand_dims(g, dim)
    return np.broadcast_to(g, shape)


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001
    """Sum over dim (int or tuple; all when None)."""
    x = _ac_f32(x)
    xd = x._data
    d = _dims(dim, xd.ndim)
    dt = _dtype(dtype)
    if dt is None and xd.dtype.kind in "biu":
        dt = int64
    out = np.sum(xd, axis=d, keepdims=keepdim, dtype=dt)
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    shape, sdt = xd.shape, xd.dtype
    return _mk(out, "SumBackward1" if dim is not None else "SumBackward0",
               lambda g: (_expand_grad(g.astype(sdt, copy=False), shape, d, keepdim),), (x,),
               saves=False)


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean over dim (int or tuple; all when None)."""
    x = _ac_f32(x)
    xd = x._data
    if not _is_float_dtype(xd.dtype):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {xd.dtype}")
    d = _dims(dim, xd.ndim)
    out = np.mean(xd, axis=d, keepdims=keepdim, dtype=_dtype(dtype))
    if not isinstance(out, np.ndarray):
        out = np.asarray(out, dtype=xd.dtype)
    n = xd.size // builtins.max(out.size, 1) if out.size else 0
    shape = xd.shape

    def bw(g):
        return (_expand_grad(g / n if n else g, shape, d, keepdim),)
    return _mk(out, "MeanBackward1" if dim is not None else "MeanBackward0", bw, (x,),
               saves=False)


_MinMax = namedtuple("return_types", ["values", "indices"])


def _reduce_minmax(x, dim, keepdim, is_max):
    if isinstance(dim, Tensor):
        return (maximum if is_max else minimum)(x, dim)
    xd = x._data
    if dim is None:
        out = np.asarray(xd.max() if is_max else xd.min())

        def bw(g):
            m = (xd == out)
            return ((g / _pyint(m.sum())) * m,)
        return _mk(out, "MaxBackward1" if is_max else "MinBackward1", bw, (x,))
    d = dim % builtins.max(xd.ndim, 1)
    idx = np.argmax(xd, axis=d, keepdims=True) if is_max else np.argmin(xd, axis=d, keepdims=True)
    vals = np.take_along_axis(xd, idx, axis=d)
    if not keepdim:
        vals = np.squeeze(vals, d)

    def bw(g):
        gx = np.zeros(xd.shape, dtype=g.dtype)
        np.put_along_axis(gx, idx, g if keepdim else np.expand_dims(g, d), axis=d)
        return (gx,)
    v = _mk(vals, "MaxBackward0" if is_max else "MinBackward0", bw, (x,))
    return _MinMax(v, _new_on(idx if keepdim else np.squeeze(idx, d), x))


def max(x, dim=None, keepdim=False):  # noqa: A001
    """max(x), max(x, dim, keepdim) -> (values, indices), max(x, other) elementwise."""
    return _reduce_minmax(x, dim, keepdim, True)


def min(x, dim=None, keepdim=False):  # noqa: A001
    """min(x), min(x, dim, keepdim) -> (values, indices), min(x, other) elementwise."""
    return _reduce_minmax(x, dim, keepdim, False)


def _amaxmin(x, dim, keepdim, is_max):
    xd = x._data
    d = _dims(dim, xd.ndim)
    f = np.max if is_max else np.min
    out = np.asarray(f(xd, axis=d, keepdims=keepdim))

    def bw(g):
        o = out if keepdim or d is None else np.expand_dims(out, d)
        m = (xd == o)
        cnt = m.sum(axis=d, keepdims=True)
        gg = g if keepdim or d is None else np.expand_dims(g, d)
        return ((gg / cnt).astype(g.dtype, copy=False) * m,)
    return _mk(out, "AmaxBackward0" if is_max else "AminBackward0", bw, (x,))


def amax(x, dim=None, keepdim=False):
    """Max over dim (tuple allowed); ties share the gradient evenly."""
    return _amaxmin(x, dim, keepdim, True)


def amin(x, dim=None, keepdim=False):
    """Min over dim (tuple allowed); ties share the gradient evenly."""
    return _amaxmin(x, dim, keepdim, False)


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    if unbiased is None:
        return 1
    return 1 if unbiased else 0


def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Variance over dim with Bessel's correction (correction=1) by default."""
    if isinstance(unbiased, (_pyint,)) and not isinstance(unbiased, _pybool) and dim is None:
        dim, unbiased = unbiased, None
    c = _correction(unbiased, correction)
    xd = x._data
    d = _dims(dim, xd.ndim)
    mu = np.mean(xd, axis=d, keepdims=True)
    diff = xd - mu
    n = xd.size // builtins.max(mu.size, 1)
    out = np.asarray(np.sum(diff * diff, axis=d, keepdims=keepdim) / builtins.max(n - c, 0),
                     dtype=xd.dtype)

    def bw(g):
        gg = g if keepdim or d is None else np.expand_dims(g, d)
        return ((gg * (2.0 / (n - c))) * diff,)
    return _mk(out, "VarBackward0", bw, (x,))


def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Standard deviation over dim (correction=1 by default)."""
    return sqrt(var(x, dim, unbiased, keepdim, correction))


def argmax(x, dim=None, keepdim=False):
    """Index of the maximum (flattened when dim is None)."""
    xd = x._data
    if dim is None:
        return _new_on(np.asarray(np.argmax(xd), dtype=int64), x)
    return _new_on(np.argmax(xd, axis=dim, keepdims=keepdim).astype(int64, copy=False), x)


def argmin(x, dim=None, keepdim=False):
    """Index of the minimum (flattened when dim is None)."""
    xd = x._data
    if dim is None:
        return _new_on(np.asarray(np.argmin(xd), dtype=int64), x)
    return _new_on(np.argmin(xd, axis=dim, keepdims=keepdim).astype(int64, copy=False), x)


def all(x, dim=None):  # noqa: A001
    """All elements true."""
    return _new_on(np.asarray(np.all(x._data, axis=dim)), x)


def any(x, dim=None):  # noqa: A001
    """Any element true."""
    return _new_on(np.asarray(np.any(x._data, axis=dim)), x)


def isfinite(x):
    """Elementwise finiteness."""
    return _new_on(np.isfinite(x._data), x)


def isnan(x):
    """Elementwise NaN test."""
    return _new_on(np.isnan(x._data), x)


def isinf(x):
    """Elementwise infinity test."""
    return _new_on(np.isinf(x._data), x)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether all elements are close."""
    return _pybool(np.allclose(np.asarray(a), np.asarray(b), rtol, atol, equal_nan))


def equal(input, other):
    """True when both Tensors have the same shape and elements (torch.equal: dtypes may differ,
    NaN equals nothing)."""
    for pos, (name, v) in enumerate((("input", input), ("other", other)), 1):
        if not isinstance(v, Tensor):
            what = type(v).__name__ if type(v).__module__ == "builtins" else \
                f"{type(v).__module__}.{type(v).__qualname__}"
            raise TypeError(f"equal(): argument '{name}' (position {pos}) must be Tensor, not "
                            f"{what}")
    return input.shape == other.shape and _pybool(np.array_equal(input._data, other._data))


# ----------------------------------------------------------------------------------------------
# shapes

def reshape(x, *shape):
    """Same elements, new shape."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    xd = x._data
    out = xd.reshape(shape)
    ishape = xd.shape
    return _mk(out, "ViewBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one."""
    nd = x.ndim
    if nd == 0:
        return reshape(x, 1)
    s, e = start_dim % nd, end_dim % nd
    shp = x.shape
    new = shp[:s] + (-1 if builtins.all(shp) else _prod(shp[s:e + 1]),) + shp[e + 1:]
    return reshape(x, new)


def _prod(t):
    p = 1
    for v in t:
        p *= v
    return p


def permute(x, *dims):
    """Reorder dimensions."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    dims = tuple(d % x.ndim for d in dims)
    inv = tuple(np.argsort(dims))
    return _mk(x._data.transpose(dims), "PermuteBackward0", lambda g: (g.transpose(inv),), (x,),
               saves=False)


def transpose(x, dim0, dim1):
    """Swap two dimensions."""
    return _mk(np.swapaxes(x._data, dim0, dim1), "TransposeBackward0",
               lambda g: (np.swapaxes(g, dim0, dim1),), (x,), saves=False)


swapaxes = transpose


def squeeze(x, dim=None):
    """Drop size-1 dimensions (only dim's when given and of size 1)."""
    xd = x._data
    if dim is None:
        out = np.squeeze(xd)
    else:
        ds = (dim,) if isinstance(dim, _pyint) else tuple(dim)
        ds = tuple(d % builtins.max(xd.ndim, 1) for d in ds if xd.ndim and xd.shape[d] == 1)
        out = np.squeeze(xd, ds) if ds else xd
    ishape = xd.shape
    return _mk(out, "SqueezeBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def unsqueeze(x, dim):
    """Insert a size-1 dimension at dim."""
    xd = x._data
    out = np.expand_dims(xd, dim % (xd.ndim + 1))
    ishape = xd.shape
    return _mk(out, "UnsqueezeBackward0", lambda g: (g.reshape(ishape),), (x,), saves=False)


def cat(tensors, dim=0):
    """Concatenate along dim."""
    tensors = list(tensors)
    # torch's legacy rule: a 1-D tensor of size 0 is skipped whatever the others' shapes
    keep = [i for i, t in enumerate(tensors) if t._data.shape != (0,)]
    if not keep or len(keep) == len(tensors):
        keep = list(range(len(tensors)))
    arrs = [tensors[i]._data for i in keep]
    nd = arrs[0].ndim if arrs else 1
    if not -nd <= dim < nd:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], "
                         f"but got {dim})")
    out = np.concatenate(arrs, axis=dim)
    d = dim % nd
    bounds = np.cumsum([a.shape[d] for a in arrs])[:-1]
    n = len(tensors)

    def bw(g):
        parts = np.split(g, bounds, axis=d)
        if len(keep) == n:
            return tuple(parts)
        gs = [np.zeros((0,), dtype=g.dtype)] * n
        for i, p in zip(keep, parts):
            gs[i] = p
        return tuple(gs)
    return _mk(out, "CatBackward0", bw, tuple(tensors), saves=False)


concat = cat


def stack(tensors, dim=0):
    """Stack along a new dim."""
    tensors = list(tensors)
    out = np.stack([t._data for t in tensors], axis=dim)
    d = dim % out.ndim

    def bw(g):
        return tuple(np.take(g, i, axis=d) for i in range(len(tensors)))
    return _mk(out, "StackBackward0", bw, tuple(tensors), saves=False)


def split(x, split_size, dim=0):
    """Split along dim into chunks of split_size, or of the listed sizes."""
    n = x.shape[dim]
    if isinstance(split_size, _pyint):
        sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    else:
        sizes = list(split_size)
    res, start = [], 0
    for s in sizes:
        res.append(x.narrow(dim, start, s))
        start += s
    return tuple(res)


def chunk(x, chunks, dim=0):
    """Split into chunks pieces (the last may be smaller)."""
    n = x.shape[dim]
    return split(x, -(-n // chunks), dim)


def _is_basic(idx):
    items = idx if isinstance(idx, tuple) else (idx,)
    for i in items:
        if not (i is None or i is Ellipsis or isinstance(i, (slice, _pyint, np.integer))):
            return False
    return True


def _conv_index(idx):
    if isinstance(idx, Tensor):
        return idx._data
    if isinstance(idx, tuple):
        return tuple(i._data if isinstance(i, Tensor) else i for i in idx)
    if isinstance(idx, list) and idx and builtins.any(isinstance(i, Tensor) for i in idx):
        return np.array([i._data if isinstance(i, Tensor) else i for i in idx])
    return idx


def _getitem(x, idx):
    idx = _conv_index(idx)
    xd = x._data
    out = xd[idx]
    if not isinstance(out, np.ndarray):
        out = np.asarray(out)
    shape = xd.shape
    basic = _is_basic(idx)

    def bw(g):
        gx = np.zeros(shape, dtype=g.dtype)
        if basic:
            gx[idx] = g
        else:
            np.add.at(gx, idx, g)
        return (gx,)
    return _mk(out, "SliceBackward0" if basic else "IndexBackward0", bw, (x,), saves=False)


def _setitem(x, idx, value):
    idx = _conv_index(idx)
    xd = x._data
    if 0 in xd.strides and xd.size > 1:   # an expanded tensor: torch's checks of the written part
        if _is_basic(idx):
            _check_overlap(xd[idx])
        else:
            import warnings
            warnings.warn("Use of index_put_ on expanded tensors is deprecated. Please clone() the "
                          "tensor before performing this operation. This also applies to advanced "
                          "indexing e.g. tensor[indices] = tensor", UserWarning, stacklevel=3)
    vt = value if isinstance(value, Tensor) else None
    vd = value._data if vt is not None else value
    if _st.grad and (x._requires_grad or (vt is not None and vt._requires_grad)):
        _check_inplace(x)
        new = x._data.copy()
        new[idx] = vd
        vshape = None if vt is None else vt.shape
        vdt = None if vt is None else vt.dtype
        basic = _is_basic(idx)

        def bw(g):
            gx = g.copy()
            gx[idx] = 0
            gv = None
            if vshape is not None:
                sel = g[idx]
                gv = _red(np.asarray(sel), vshape, vdt) if sel.shape != vshape or not basic \
                    else sel
            return gx, gv
        r = _mk(new, "CopySlices", bw, (x, vt), saves=False)
        x._data, x.grad_fn, x._requires_grad = r._data, r.grad_fn, True
        return
    x._data[idx] = vd


def _ip_binary(self, other, op, alpha):
    """In-place add/sub/mul/div: numpy in place when no graph; else recorded out of place."""
    _check_inplace(self)
    ot = other if isinstance(other, Tensor) else None
    if _st.grad and (self._requires_grad or (ot is not None and ot._requires_grad)):
        if op == "add":
            r = add(self, other, alpha=alpha)
        elif op == "sub":
            r = sub(self, other, alpha=alpha)
        elif op == "mul":
            r = mul(self, other)
        else:
            r = div(self, other)
        self._data = r._data.astype(self._data.dtype, copy=False)
        self.grad_fn, self._requires_grad = r.grad_fn, r._requires_grad
        return self
    d = self._data
    o = ot._data if ot is not None else other
    if alpha != 1:
        o = o * alpha
    f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}[op]
    f(d, o, out=d, casting="unsafe")
    return self


# softmax / log_softmax / logsumexp (here, not in nn.functional: Tensor methods use them)

def softmax(x, dim=None, dtype=None):
    """exp(x) / sum(exp(x)) along dim."""
    x = _ac_f32(x)
    if dtype is not None:
        x = x.to(dtype)
    xd = x._data
    if dim is None:
        dim = 0 if xd.ndim in (0, 1, 3) else 1
    e = xd - xd.max(axis=dim, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=dim, keepdims=True)
    out = e

    def bw(g):
        s = (g * out).sum(axis=dim, keepdims=True)
        return (out * (g - s),)
    return _mk(out, "SoftmaxBackward0", bw, (x,))


def log_softmax(x, dim=None, dtype=None):
    """x - logsumexp(x) along dim."""
    x = _ac_f32(x)
    if dtype is not None:
        x = x.to(dtype)
    xd = x._data
    if dim is None:
        dim = 0 if xd.ndim in (0, 1, 3) else 1
    z = xd - xd.max(axis=dim, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=dim, keepdims=True))
    z -= lse
    out = z

    def bw(g):
        return (g - np.exp(out) * g.sum(axis=dim, keepdims=True),)
    return _mk(out, "LogSoftmaxBackward0", bw, (x,))


def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) along dim, computed stably."""
    xd = x._data
    m = xd.max(axis=dim, keepdims=True)
    s = np.exp(xd - m)
    tot = s.sum(axis=dim, keepdims=True)
    out = np.log(tot) + m
    res = out if keepdim else np.squeeze(out, dim)

    def bw(g):
        gg = g if keepdim else np.expand_dims(g, dim)
        return (gg * (s / tot),)
    return _mk(res, "LogsumexpBackward0", bw, (x,))


def _logsumexp_method(self, dim, keepdim=False):
    """log(sum(exp(self))) along dim, computed stably."""
    return logsumexp(self, dim, keepdim)


Tensor.logsumexp = _logsumexp_method


# ----------------------------------------------------------------------------------------------
# triangular parts

def _tri(x, diagonal, lower, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    if x.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    if isinstance(diagonal, (bool, np.bool_)) or not isinstance(diagonal, (int, np.integer)):
        raise TypeError(f"{name}(): argument 'diagonal' must be int, not {type(diagonal).__name__}")
    n, m = x.shape[-2], x.shape[-1]
    keep = np.tri(n, m, k=int(diagonal), dtype=bool) if lower else \
        ~np.tri(n, m, k=int(diagonal) - 1, dtype=bool)
    out = np.where(keep, x._data, np.zeros((), dtype=x._data.dtype))

    def bw(g):
        return (np.where(keep, g, np.zeros((), dtype=g.dtype)),)
    return _mk(out, "TrilBackward0" if lower else "TriuBackward0", bw, (x,), saves=False)


def tril(input, diagonal=0):
    """The lower triangle of the last two dimensions (the rest zero); ``diagonal`` > 0 keeps
    diagonals above the main one, < 0 drops some below it."""
    return _tri(input, diagonal, True, "tril")


def triu(input, diagonal=0):
    """The upper triangle of the last two dimensions (the rest zero)."""
    return _tri(input, diagonal, False, "triu")
