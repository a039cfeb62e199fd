"""Special functions and more elementwise math: lgamma, digamma, erfc, xlogy, hypot,
copysign, signbit, sgn, deg2rad / rad2deg, logaddexp2, sinc, fmax / fmin, heaviside, the
inverse hyperbolic functions (acosh, asinh, atanh) and torch's ``arc*`` / ``multiply`` /
``subtract`` / ``divide`` / ``absolute`` spellings, with the Tensor methods and their in-place
``_`` variants.

Values follow torch 2.13 (float64 internally for the special functions, then the input's float
dtype; integer inputs give the default float dtype), with torch's gradients: lgamma's is digamma,
digamma's is trigamma (both by recurrence, reflection and an asymptotic series, NumPy only).
"""
from __future__ import annotations

import math

import numpy as np

from ._args import _t
from ._core import Tensor, _binop_arrays, _mk, _new_on, _red
from ._dtypes import _is_float_dtype
from ._grad_mode import _st
from ._pointwise import _unary

__all__ = ["lgamma", "digamma", "erfc", "xlogy", "hypot", "copysign", "signbit", "sgn",
           "deg2rad", "rad2deg", "logaddexp2", "sinc", "fmax", "fmin", "heaviside", "acosh",
           "asinh", "atanh", "arccosh", "arcsinh", "arctanh", "arccos", "arcsin", "arctan",
           "arctan2", "absolute", "multiply", "subtract", "divide"]


# ----------------------------------------------------------------------------------------------
# the gamma family (float64 NumPy)

def _lgamma_np(a):
    x = a.astype(np.float64)
    pole = (x <= 0) & (x == np.floor(x))
    safe = np.where(pole | ~np.isfinite(x), 1.0, x)
    out = np.vectorize(math.lgamma, otypes=[np.float64])(safe) if x.size else safe
    out = np.where(pole, np.inf, out)
    out = np.where(np.isinf(x), np.inf, out)
    out = np.where(np.isnan(x), np.nan, out)
    return out.astype(a.dtype)


def _shift_series(x, small, series):
    """f(x) for f with f(x) = f(x + 1) + small(x), shifting x up to >= 6 before ``series``."""
    acc = np.zeros_like(x)
    y = x.copy()
    for _ in range(64):
        m = y < 6
        if not m.any():
            break
        acc = np.where(m, acc + small(np.where(m, y, 1.0)), acc)
        y = np.where(m, y + 1, y)
    return series(y) + acc


def _digamma64(x):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        refl = x < 0.5
        y = np.where(refl, 1 - x, x)

        def series(z):
            f = 1 / (z * z)
            return np.log(z) - 0.5 / z - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (
                1 / 240 - f * (1 / 132)))))
        y = np.where(np.isfinite(y), y, 1.0)
        out = _shift_series(y, lambda z: -1 / z, series)
        out = np.where(refl, out - np.pi / np.tan(np.pi * x), out)
        out = np.where((x <= 0) & (x == np.floor(x)), np.nan, out)
        out = np.where(x == 0, np.where(np.signbit(x), np.inf, -np.inf), out)
        out = np.where(x == np.inf, np.inf, out)
        out = np.where(np.isnan(x) | (x == -np.inf), np.nan, out)
    return out


def _trigamma64(x):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        refl = x < 0.5
        y = np.where(refl, 1 - x, x)

        def series(z):
            f = 1 / (z * z)
            return 1 / z + f / 2 + f / z * (1 / 6 - f * (1 / 30 - f * (1 / 42 - f / 30)))
        y = np.where(np.isfinite(y), y, 1.0)
        out = _shift_series(y, lambda z: 1 / (z * z), series)
        out = np.where(refl, (np.pi / np.sin(np.pi * x)) ** 2 - out, out)
        out = np.where((x <= 0) & (x == np.floor(x)), np.inf, out)
        out = np.where(x == np.inf, 0.0, out)
        out = np.where(np.isnan(x) | (x == -np.inf), np.nan, out)
    return out


def _digamma_np(a):
    return _digamma64(a.astype(np.float64)).astype(a.dtype)


lgamma = _unary("lgamma", _lgamma_np, lambda g, x, r: g * _digamma_np(x))
digamma = _unary("digamma", _digamma_np,
                 lambda g, x, r: g * _trigamma64(x.astype(np.float64)).astype(x.dtype))


def _erfc_np(a):
    if not a.size:
        return a.copy()
    return np.vectorize(math.erfc, otypes=[np.float64])(a.astype(np.float64)).astype(a.dtype)


erfc = _unary("erfc", _erfc_np,
              lambda g, x, r: g * (-2 / np.sqrt(np.pi)) * np.exp(-(x.astype(np.float64) ** 2))
              .astype(x.dtype))


def _sinc_np(a):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sinc(a.astype(np.float64)).astype(a.dtype)


def _sinc_grad(g, x, r):
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(x64 == 0, 0.0, (np.cos(np.pi * x64) - np.sinc(x64)) / np.where(x64 == 0, 1,
                                                                                      x64))
    return g * d.astype(x.dtype)


sinc = _unary("sinc", _sinc_np, _sinc_grad)
deg2rad = _unary("deg2rad", lambda a: a * np.asarray(np.pi / 180, a.dtype),
                 lambda g, x, r: g * np.asarray(np.pi / 180, g.dtype))
rad2deg = _unary("rad2deg", lambda a: a * np.asarray(180 / np.pi, a.dtype),
                 lambda g, x, r: g * np.asarray(180 / np.pi, g.dtype))


def _inv_hyp(name, f, df):
    def npf(a):
        with np.errstate(invalid="ignore", divide="ignore"):
            return f(a)

    def grad(g, x, r):
        with np.errstate(invalid="ignore", divide="ignore"):
            return g * df(x)
    return _unary(name, npf, grad)


acosh = _inv_hyp("acosh", np.arccosh, lambda x: 1 / np.sqrt(x * x - 1))
asinh = _inv_hyp("asinh", np.arcsinh, lambda x: 1 / np.sqrt(x * x + 1))
atanh = _inv_hyp("atanh", np.arctanh, lambda x: 1 / (1 - x * x))
arccosh, arcsinh, arctanh = acosh, asinh, atanh


def signbit(input, *, out=None):
    """Whether the sign bit is set (True for -0.0; bool)."""
    x = _t(input)
    return _new_on(np.signbit(x._data), x)


def sgn(input, *, out=None):
    """The sign (-1, 0, 1; 0 for NaN, as torch's) of real input; its gradient is zero."""
    x = _t(input)
    xd = x._data
    out_ = np.sign(xd)
    if xd.dtype.kind == "f" or _is_float_dtype(xd.dtype):
        out_ = np.where(np.isnan(xd), np.zeros((), xd.dtype), out_)
    return _mk(out_, "SgnBackward0", lambda g: (np.zeros_like(g),), (x,), saves=False)


# ----------------------------------------------------------------------------------------------
# binary

def _need_tensor(name, other):
    if not isinstance(other, Tensor):
        raise TypeError(f"{name}(): argument 'other' (position 2) must be Tensor, not "
                        f"{type(other).__name__}")


def _float_args(a, other):
    ad, bd = _binop_arrays(a, other)
    if not _is_float_dtype(ad.dtype):
        ad = ad.astype(_st.default)
        bd = np.asarray(bd).astype(_st.default) if isinstance(bd, np.ndarray) else \
            np.asarray(bd, dtype=_st.default)
    return ad, bd


def _long(dt):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}.get(np.dtype(dt).name, np.dtype(dt).name)


def _binary(name, node, a, other, fwd, bwa, bwb):
    """fwd(ad, bd) -> out; bwa/bwb(g, ad, bd, out) -> the gradients (None: none)."""
    bt = other if isinstance(other, Tensor) else None
    ad, bd = _float_args(a, other)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = fwd(ad, bd)
    ra, rb = a._requires_grad, bt is not None and bt._requires_grad
    if not (_st.grad and (ra or rb)):
        return _new_on(out, a, other)

    def bw(g):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ga = _red(np.broadcast_to(bwa(g, ad, bd, out), out.shape), a.shape, a.dtype) \
                if ra else None
            gb = _red(np.broadcast_to(bwb(g, ad, bd, out), out.shape), bt.shape, bt.dtype) \
                if rb else None
        return ga, gb
    return _mk(out, node, bw, (a, bt))


def xlogy(input, other, *, out=None):
    """input * log(other), 0 where input is 0 (unless other is NaN); either may be a number."""
    if isinstance(input, Tensor):
        a = input
    else:
        from ._core import _as_t
        other = _t(other)
        a = _as_t(input, other)
        if not _is_float_dtype(a._data.dtype) and _is_float_dtype(other._data.dtype):
            a = _new_on(a._data.astype(other._data.dtype), a)

    def fwd(x, y):
        r = x * np.log(y)
        return np.where((x == 0) & ~np.isnan(y), np.zeros((), r.dtype), r)

    def ga(g, x, y, o):   # torch's: xlogy(g, y), 0 where x == 0 and y <= 0
        lg = np.log(y)
        return g * np.where((x == 0) & (y <= 0), np.zeros((), lg.dtype), lg)
    return _binary("xlogy", "XlogyBackward0", a, other, fwd, ga, lambda g, x, y, o: g * x / y)


def hypot(input, other, *, out=None):
    """sqrt(input**2 + other**2) (float tensors)."""
    a = _t(input)
    _need_tensor("hypot", other)
    ad, bd = _binop_arrays(a, other)
    if not _is_float_dtype(ad.dtype):
        raise NotImplementedError(f"\"hypot_cpu\" not implemented for '{_long(ad.dtype)}'")
    return _binary("hypot", "HypotBackward0", a, other, np.hypot,
                   lambda g, x, y, o: g * x / o, lambda g, x, y, o: g * y / o)


def copysign(input, other, *, out=None):
    """|input| with other's sign (integers give the default float dtype)."""
    a = _t(input)

    def ga(g, x, y, o):
        return g * np.where(o == 0, np.zeros((), o.dtype), x / np.where(o == 0, 1, o))
    return _binary("copysign", "CopysignBackward0", a, other, np.copysign, ga,
                   lambda g, x, y, o: np.zeros_like(g))


def logaddexp2(input, other, *, out=None):
    """log2(2**input + 2**other), stably."""
    a = _t(input)
    _need_tensor("logaddexp2", other)

    def fwd(x, y):
        return np.logaddexp2(x, y)

    def ga(g, x, y, o):
        return g / (1 + np.exp2(y - x))

    def gb(g, x, y, o):
        return g / (1 + np.exp2(x - y))
    return _binary("logaddexp2", "Logaddexp2Backward0", a, other, fwd, ga, gb)


def _fminmax(name, f, is_max):
    def op(input, other, *, out=None):
        a = _t(input)
        _need_tensor(name, other)
        ad, bd = _binop_arrays(a, other)
        out_ = f(ad, bd)
        ra, rb = a._requires_grad, other._requires_grad
        if not (_st.grad and (ra or rb)):
            return _new_on(out_, a, other)
        pick_a = ((ad >= bd) if is_max else (ad <= bd)) | np.isnan(bd)

        def bw(g):
            ga = _red(g * pick_a, a.shape, a.dtype) if ra else None
            gb = _red(g * ~pick_a, other.shape, other.dtype) if rb else None
            return ga, gb
        return _mk(out_, "FmaxBackward0" if is_max else "FminBackward0", bw, (a, other))
    op.__name__ = name
    op.__doc__ = f"Elementwise {'max' if is_max else 'min'}imum, NaN only where both are NaN."
    return op


fmax = _fminmax("fmax", np.fmax, True)
fmin = _fminmax("fmin", np.fmin, False)


def heaviside(input, values, *, out=None):
    """0 where input < 0, 1 where > 0, values where 0 (same dtypes; no gradient)."""
    a = _t(input)
    if not isinstance(values, Tensor):
        raise TypeError(f"heaviside(): argument 'values' (position 2) must be Tensor, not "
                        f"{type(values).__name__}")
    if a._data.dtype != values._data.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    out = np.heaviside(a._data, values._data).astype(a._data.dtype)
    if _st.grad and (a._requires_grad or values._requires_grad):
        def bw(g):
            raise RuntimeError("derivative for aten::heaviside is not implemented")
        return _mk(out, "HeavisideBackward0", bw, (a, values), saves=False)
    return _new_on(out, a, values)


# ----------------------------------------------------------------------------------------------
# torch.* spellings of existing ops

def arccos(input, *, out=None):
    """acos's other name."""
    return _t(input).acos()


def arcsin(input, *, out=None):
    """asin's other name."""
    return _t(input).asin()


def arctan(input, *, out=None):
    """atan's other name."""
    return _t(input).atan()


def arctan2(input, other, *, out=None):
    """atan2's other name."""
    return _t(input).atan2(other)


def absolute(input, *, out=None):
    """abs's other name."""
    return _t(input).abs()


def multiply(input, other, *, out=None):
    """mul's other name."""
    return _t(input).mul(other) if isinstance(input, Tensor) else _t(other).mul(input)


def subtract(input, other, *, alpha=1, out=None):
    """sub's other name."""
    from ._ops import sub
    return sub(input, other, alpha=alpha)


def divide(input, other, *, rounding_mode=None, out=None):
    """div's other name."""
    from ._ops import div
    return div(input, other, rounding_mode=rounding_mode)


def _attach():
    from ._aliases import _inplace_of
    T = Tensor
    for name in ("lgamma", "digamma", "erfc", "xlogy", "hypot", "copysign", "signbit", "sgn",
                 "deg2rad", "rad2deg", "logaddexp2", "sinc", "fmax", "fmin", "heaviside",
                 "acosh", "asinh", "atanh"):
        setattr(T, name, globals()[name])
    T.arccosh, T.arcsinh, T.arctanh = T.acosh, T.asinh, T.atanh
    T.arccos, T.arcsin, T.arctan = T.acos, T.asin, T.atan
    for name in ("lgamma", "digamma", "erfc", "xlogy", "hypot", "copysign", "sgn", "deg2rad",
                 "rad2deg", "sinc", "heaviside", "acosh", "asinh", "atanh", "arccosh", "arcsinh",
                 "arctanh", "arccos", "arcsin", "arctan"):
        if not hasattr(T, name + "_"):
            setattr(T, name + "_", _inplace_of(name))


_attach()
