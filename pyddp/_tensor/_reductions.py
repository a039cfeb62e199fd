"""Reductions and scans: prod, norm, nansum / nanmean, count_nonzero, cumsum / cumprod, diff
(sum, mean, max, ... are pyddp._tensor._ops').

Each function follows torch 2.13 on the same inputs (values, dtypes, errors; the tests compare them
with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _mk, _new, _new_on
from ._dtypes import _dtype, _pyint, _scalar_name, int64
from ._ops import abs, pow, sqrt, sum

__all__ = ["cumsum", "cumprod", "prod", "norm", "diff", "nansum", "nanmean", "count_nonzero",
           "histc"]


def count_nonzero(input, dim=None):
    """The number of non-zero elements (along dim)."""
    x = _t(input)
    return _new_on(np.asarray(np.count_nonzero(x._data, axis=dim), dtype=int64), x)


def cumsum(input, dim, *, dtype=None):
    """Running sum along dim."""
    x = _t(input)
    xd = x._data
    if dtype is not None:
        xd = xd.astype(_dtype(dtype))
    elif xd.dtype.kind in "biu":
        xd = xd.astype(int64)
    d = _dim(dim, xd.ndim)
    out = np.cumsum(xd, axis=d) if xd.ndim else xd.copy()

    def bw(g):
        if not g.ndim:
            return (g,)
        return (np.flip(np.cumsum(np.flip(g, d), axis=d), d),)
    return _mk(out, "CumsumBackward0", bw, (x,), saves=False)


def cumprod(input, dim, *, dtype=None):
    """Running product along dim."""
    x = _t(input)
    xd = x._data
    if dtype is not None:
        xd = xd.astype(_dtype(dtype))
    elif xd.dtype.kind in "biu":
        xd = xd.astype(int64)
    d = _dim(dim, xd.ndim)
    out = np.cumprod(xd, axis=d) if xd.ndim else xd.copy()

    def bw(g):
        # d out_j / d x_i = out_j / x_i for j >= i (inputs without zeros)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.flip(np.cumsum(np.flip(g * out, d), axis=d), d) / xd
        return (r,)
    return _mk(out, "CumprodBackward0", bw, (x,), saves=False)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """Product of all elements, or along dim."""
    x = _t(input)
    xd = x._data
    if dtype is not None:
        xd = xd.astype(_dtype(dtype))
    elif xd.dtype.kind in "biu":
        xd = xd.astype(int64)
    d = None if dim is None else _dim(dim, xd.ndim)
    out = np.asarray(np.prod(xd, axis=d, keepdims=keepdim if d is not None else False))

    def bw(g):
        o = out if keepdim or d is None else np.expand_dims(out, d)
        gg = g if keepdim or d is None else np.expand_dims(g, d)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(xd != 0, gg * o / np.where(xd != 0, xd, 1), 0)
        zeros = xd == 0
        if zeros.any():   # the product of the others where exactly this element is zero
            for idx in zip(*np.nonzero(zeros)):
                others = xd.copy()
                others[idx] = 1
                if d is None:
                    r[idx] = g * np.prod(others)
                else:
                    sl = list(idx)
                    sl[d] = slice(None)
                    r[idx] = np.asarray(gg)[tuple(i if j != d else 0 for j, i in
                                                  enumerate(idx))] * np.prod(others[tuple(sl)])
        return (r.astype(xd.dtype, copy=False),)
    return _mk(out, "ProdBackward0", bw, (x,), saves=False)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """The p-norm (2 / 'fro' by default; 'nuc' not supported) over dim (all elements when
    None)."""
    x = _t(input)
    if dtype is not None:
        x = x.to(dtype)
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        raise RuntimeError(f"norm(): p={p!r} is not supported (use 'fro' or a number)")
    if isinstance(dim, (_pyint, np.integer)):
        dim = (dim,)
    if p == 2:
        return sqrt(sum(x * x, dim, keepdim))
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == float("inf"):
        return abs(x).amax(dim, keepdim)
    if p == float("-inf"):
        return abs(x).amin(dim, keepdim)
    if p == 0:
        return sum((x != 0).to(x.dtype), dim, keepdim)
    return pow(sum(pow(abs(x), p), dim, keepdim), 1.0 / p)


def diff(input, n=1, dim=-1):
    """n-th forward difference along dim."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    for _ in range(n):
        m = x.shape[d]
        x = x.narrow(d, 1, m - 1) - x.narrow(d, 0, m - 1)
    return x


def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """Sum treating NaN as zero."""
    x = _t(input)
    return sum(x.masked_fill(_new(np.isnan(x._data)), 0.0), dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """Mean of the non-NaN elements."""
    x = _t(input)
    keep = _new(~np.isnan(x._data))
    n = sum(keep.to(x.dtype), dim, keepdim)
    return nansum(x, dim, keepdim, dtype=dtype) / n


def histc(input, bins=100, min=0, max=0):
    """A histogram of the elements in ``bins`` equal-width bins over [min, max] (torch.histc):
    elements outside the range are not counted, the last bin includes max; ``min == max`` takes
    the range of the data (widened by 1 each way when that is a single value).  Float tensors
    only; the result has the input's dtype and no gradient."""
    x = _t(input)
    xd = x._data
    if xd.dtype.kind not in "fV":   # (V: bfloat16)
        raise NotImplementedError(f'"histogram_cpu" not implemented for '
                                  f"'{_scalar_name(xd.dtype)}'")
    bins = _pyint(bins)
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    dt = xd.dtype
    a = xd.reshape(-1)
    if a.dtype.itemsize < 4:
        a = a.astype(np.float32)
    lo, hi = a.dtype.type(min), a.dtype.type(max)
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    if lo == hi:
        if a.size:
            lo, hi = a.min(), a.max()
        if lo == hi:
            lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{_fmt(lo)}, {_fmt(hi)}] is not finite")
    inside = a[(a >= lo) & (a <= hi)]
    pos = ((inside - lo) * a.dtype.type(bins) / (hi - lo)).astype(np.int64)
    pos[pos == bins] = bins - 1   # max itself: the last bin
    out = np.bincount(pos, minlength=bins)[:bins].astype(dt)
    return _new_on(out, x)


def _fmt(v):
    v = float(v)
    return "-nan" if v != v else ("inf" if v == float("inf") else ("-inf" if v == -float("inf")
                                                                   else f"{v:g}"))


def _attach():
    for name in ("count_nonzero", "cumsum", "cumprod", "prod", "diff", "nansum", "nanmean",
                 "histc"):
        setattr(Tensor, name, globals()[name])

    def norm_method(self, p="fro", dim=None, keepdim=False, dtype=None):
        """The p-norm (2 by default) over dim (all elements when None)."""
        return norm(self, p, dim, keepdim, dtype)
    Tensor.norm = norm_method


_attach()
