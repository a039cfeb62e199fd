"""More elementwise math: erf, exp2, log2 / log10, the hyperbolic and inverse trigonometric
functions, atan2, frac / trunc, fmod / remainder, the division and clamp aliases, lerp, addcmul /
addcdiv, nan_to_num, logaddexp, logit, masked_fill (exp, log, sin, add, ... are
pyddp._tensor._ops').

Each function follows torch 2.13 on the same inputs (values, dtypes, errors; the tests compare them
with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import numpy as np

from ._args import _t
from ._core import Tensor, _binop_arrays, _mk, _new_on, _red
from ._dtypes import _is_float_dtype
from ._grad_mode import _st

__all__ = ["masked_fill", "clamp_min", "clamp_max", "lerp", "erf", "exp2", "log2", "log10", "sinh",
           "cosh", "tan", "asin", "acos", "atan", "atan2", "frac", "trunc", "fmod", "remainder",
           "floor_divide", "true_divide", "reciprocal", "negative", "addcmul", "addcdiv",
           "nan_to_num", "logaddexp", "logit", "erfinv"]


def masked_fill(input, mask, value):
    """Elements where mask is True replaced by value."""
    return _t(input).masked_fill(mask, value)


def _unary(name, f, df):
    def op(input, *, out=None):
        x = _t(input)
        xd = x._data
        if not _is_float_dtype(xd.dtype):
            xd = xd.astype(_st.default)
        r = f(xd)
        if not (_st.grad and x._requires_grad):
            return _new_on(r, x)
        return _mk(r, name, lambda g: (df(g, xd, r),), (x,))
    op.__name__ = name
    op.__doc__ = f"{name} elementwise (differentiable)."
    return op


def _erf_np(a):
    import math
    return np.vectorize(math.erf, otypes=[a.dtype])(a).astype(a.dtype)


erf = _unary("erf", _erf_np, lambda g, x, r: g * (2 / np.sqrt(np.pi)) * np.exp(-x * x))


def _erfinv_np(a):
    """The inverse error function: Giles' approximation refined by Newton steps on erf, in
    float64; 1 and -1 give +-inf, |x| > 1 and NaN give NaN (as torch)."""
    import math
    x = a.astype(np.float64)
    out = np.full(x.shape, np.nan)
    inside = np.abs(x) < 1
    xi = x[inside]
    w = -np.log((1.0 - xi) * (1.0 + xi))
    small = w < 5.0
    ws, wl = w - 2.5, np.sqrt(np.maximum(w, 5.0)) - 3.0
    ps = np.polyval([2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                     0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941], ws)
    pl = np.polyval([-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                     0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682], wl)
    y = np.where(small, ps, pl) * xi
    erf = np.vectorize(math.erf, otypes=[np.float64])
    for _ in range(2):   # Newton: erf(y) = x
        y = y - (erf(y) - xi) / (2 / np.sqrt(np.pi) * np.exp(-y * y))
    out[inside] = y
    out[x == 1] = np.inf
    out[x == -1] = -np.inf
    return out.astype(a.dtype)


erfinv = _unary("erfinv", _erfinv_np,
                lambda g, x, r: g * (np.sqrt(np.pi) / 2) * np.exp(r.astype(np.float64) ** 2)
                .astype(r.dtype))
exp2 = _unary("exp2", np.exp2, lambda g, x, r: g * r * np.log(2).astype(r.dtype))
log2 = _unary("log2", np.log2, lambda g, x, r: g / (x * np.log(2).astype(x.dtype)))
log10 = _unary("log10", np.log10, lambda g, x, r: g / (x * np.log(10).astype(x.dtype)))
sinh = _unary("sinh", np.sinh, lambda g, x, r: g * np.cosh(x))
cosh = _unary("cosh", np.cosh, lambda g, x, r: g * np.sinh(x))
tan = _unary("tan", np.tan, lambda g, x, r: g * (1 + r * r))
asin = _unary("asin", np.arcsin, lambda g, x, r: g / np.sqrt(1 - x * x))
acos = _unary("acos", np.arccos, lambda g, x, r: -g / np.sqrt(1 - x * x))
atan = _unary("atan", np.arctan, lambda g, x, r: g / (1 + x * x))


def atan2(input, other):
    """Elementwise arctangent of input / other (quadrant-aware)."""
    a = _t(input)
    ad, bd = _binop_arrays(a, other)
    if not _is_float_dtype(ad.dtype):
        ad, bd = ad.astype(_st.default), np.asarray(bd).astype(_st.default)
    out = np.arctan2(ad, bd)
    bt = other if isinstance(other, Tensor) else None

    def bw(g):
        den = ad * ad + bd * bd
        return (_red(g * bd / den, a.shape, a.dtype),
                None if bt is None else _red(-g * ad / den, bt.shape, bt.dtype))
    return _mk(out, "Atan2Backward0", bw, (a, bt))


def frac(input):
    """input - trunc(input)."""
    x = _t(input)
    return _mk(x._data - np.trunc(x._data), "FracBackward0", lambda g: (g,), (x,), saves=False)


def trunc(input):
    """Rounded toward zero (zero gradient)."""
    x = _t(input)
    return _mk(np.trunc(x._data), "TruncBackward0", lambda g: (np.zeros_like(g),), (x,),
               saves=False)


def fmod(input, other):
    """C fmod (the sign of input)."""
    a = _t(input)
    ad, bd = _binop_arrays(a, other)
    return _mk(np.fmod(ad, bd), "FmodBackward0", lambda g: (_red(g, a.shape, a.dtype), None),
               (a, other if isinstance(other, Tensor) else None), saves=False)


def remainder(input, other):
    """Python's modulo (the sign of other)."""
    a = _t(input)
    ad, bd = _binop_arrays(a, other)
    return _mk(np.remainder(ad, bd), "RemainderBackward0",
               lambda g: (_red(g, a.shape, a.dtype), None),
               (a, other if isinstance(other, Tensor) else None), saves=False)


def floor_divide(input, other):
    """Floor of input / other."""
    return _t(input) // other


def true_divide(input, other):
    """input / other."""
    return _t(input) / other


def reciprocal(input):
    """1 / input."""
    return _t(input).reciprocal()


def negative(input):
    """-input."""
    return -_t(input)


def clamp_min(input, min):  # noqa: A002
    """max(input, min)."""
    return _t(input).clamp(min=min)


def clamp_max(input, max):  # noqa: A002
    """min(input, max)."""
    return _t(input).clamp(max=max)


def lerp(input, end, weight):
    """input + weight * (end - input)."""
    x = _t(input)
    return x + weight * (end - x)


def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2."""
    return _t(input) + value * (tensor1 * tensor2)


def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2."""
    return _t(input) + value * (tensor1 / tensor2)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """NaN, +inf and -inf replaced (by 0 and the dtype's largest / smallest finite values)."""
    x = _t(input)
    out = np.nan_to_num(x._data, nan=nan, posinf=posinf, neginf=neginf)
    keep = np.isfinite(x._data) if _is_float_dtype(x._data.dtype) else None
    return _mk(out, "NanToNumBackward0",
               lambda g: (g if keep is None else g * keep,), (x,), saves=False)


def logaddexp(input, other):
    """log(exp(input) + exp(other)), stably."""
    a = _t(input)
    m = a.maximum(other) if isinstance(other, Tensor) else a.clamp(min=other)
    return m + ((a - m).exp() + (other - m).exp()).log()


def logit(input, eps=None):
    """log(p / (1 - p)) (p clamped to [eps, 1 - eps] when eps is given)."""
    x = _t(input)
    if eps is not None:
        x = x.clamp(eps, 1 - eps)
    return (x / (1 - x)).log()


def _attach():
    for name in ("erf", "erfinv", "exp2", "log2", "log10", "sinh", "cosh", "tan", "asin", "acos",
                 "atan", "atan2", "frac", "trunc", "fmod", "remainder", "floor_divide",
                 "true_divide", "negative", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv",
                 "nan_to_num", "logaddexp", "logit"):
        setattr(Tensor, name, globals()[name])
    Tensor.arctan2 = atan2


_attach()
