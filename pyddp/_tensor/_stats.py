"""Cumulative and order statistics: cummax / cummin, logcumsumexp, kthvalue, nanmedian,
quantile / nanquantile, std_mean / var_mean, aminmax, with the Tensor methods.

Values, index choices (ties, NaN) and errors follow torch 2.13; gradients as torch's
(cummax/cummin/kthvalue/nanmedian route the gradient to the selected element, quantile's is the
interpolation's, built from sort's).
"""
from __future__ import annotations

import builtins
from collections import namedtuple

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _mk, _new, _new_on
from ._dtypes import _is_float_dtype, int64

__all__ = ["cummax", "cummin", "logcumsumexp", "kthvalue", "nanmedian", "quantile",
           "nanquantile", "std_mean", "var_mean", "aminmax"]

_CumMax = namedtuple("cummax", ["values", "indices"])
_CumMin = namedtuple("cummin", ["values", "indices"])
_Kth = namedtuple("kthvalue", ["values", "indices"])
_NanMedian = namedtuple("nanmedian", ["values", "indices"])
_AMinMax = namedtuple("aminmax", ["min", "max"])


def _select_grad(x, vals, idx, d, name):
    """vals (taken at idx along d) as a result whose gradient goes back to those positions."""
    shape, keep = x.shape, idx

    def bw(g):
        gx = np.zeros(shape, dtype=g.dtype)
        np.add.at(gx, _along(keep, d), g.reshape(keep.shape))
        return (gx,)
    return _mk(vals, name, bw, (x,), saves=False)


def _along(idx, d):
    grids = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx
    return tuple(grids)


def _cum_ext(input, dim, is_max, cls):
    x = _t(input)
    xd = x._data
    if xd.ndim == 0:
        _dim(dim, 0)
        return cls(x.clone(), _new_on(np.zeros((), np.int64), x))
    d = _dim(dim, xd.ndim)
    a = np.moveaxis(xd, d, -1)
    n = a.shape[-1]
    vals = np.empty_like(a)
    idx = np.empty(a.shape, dtype=np.int64)
    if n:
        cur, ci = a[..., 0].copy(), np.zeros(a.shape[:-1], np.int64)
        vals[..., 0], idx[..., 0] = cur, ci
        isf = a.dtype.kind == "f" or _is_float_dtype(a.dtype)
        for i in range(1, n):
            v = a[..., i]
            take = (v >= cur) if is_max else (v <= cur)
            if isf:
                take = take | np.isnan(v)
                take = take & ~(np.isnan(cur) & ~np.isnan(v))
            cur = np.where(take, v, cur)
            ci = np.where(take, i, ci)
            vals[..., i], idx[..., i] = cur, ci
    vals, idx = np.moveaxis(vals, -1, d), np.moveaxis(idx, -1, d)
    v = _select_grad(x, np.ascontiguousarray(vals), np.ascontiguousarray(idx), d,
                     "CummaxBackward0" if is_max else "CumminBackward0")
    return cls(v, _new_on(np.ascontiguousarray(idx), x))


def cummax(input, dim, *, out=None):
    """(values, indices): the running maximum along dim (the last index among equal maxima;
    NaN propagates)."""
    return _cum_ext(input, dim, True, _CumMax)


def cummin(input, dim, *, out=None):
    """(values, indices): the running minimum along dim."""
    return _cum_ext(input, dim, False, _CumMin)


def logcumsumexp(input, dim, *, out=None):
    """log(cumsum(exp(input))) along dim, stably (float inputs)."""
    x = _t(input)
    xd = x._data
    if not _is_float_dtype(xd.dtype):
        raise NotImplementedError(f"\"logcumsumexp_out_cpu\" not implemented for "
                                  f"'{_long(xd.dtype)}'")
    if xd.ndim == 0:
        _dim(dim, 0)
        return x.clone()
    d = _dim(dim, xd.ndim)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.logaddexp.accumulate(xd.astype(np.float64), axis=d).astype(xd.dtype)

    def bw(g):
        # d out_j / d x_i = exp(x_i - out_j) for i <= j: a reversed cumulative sum of
        # g_j exp(-out_j), times exp(x_i), done in log space for range
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            g64, o64, x64 = g.astype(np.float64), out.astype(np.float64), xd.astype(np.float64)
            pos, neg = np.where(g64 > 0, g64, 0), np.where(g64 < 0, -g64, 0)
            r = np.zeros_like(x64)
            for part, sgn in ((pos, 1.0), (neg, -1.0)):
                lw = np.log(part) - o64
                acc = np.flip(np.logaddexp.accumulate(np.flip(lw, d), axis=d), d)
                r += sgn * np.exp(acc + x64)
            return (np.nan_to_num(r, nan=0.0).astype(g.dtype),)
    return _mk(out, "LogcumsumexpBackward0", bw, (x,), saves=False)


def _long(dt):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}.get(np.dtype(dt).name, np.dtype(dt).name)


def kthvalue(input, k, dim=-1, keepdim=False, *, out=None):
    """(values, indices): the k-th smallest element along dim (1-based k)."""
    x = _t(input)
    xd = x._data
    nd = xd.ndim
    d = _dim(dim, nd)
    n = xd.shape[d] if nd else 1
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    a = xd if nd else xd.reshape(1)
    order = np.argsort(a, axis=d, kind="stable")
    idx = np.take(order, [k - 1], axis=d)
    vals = np.take_along_axis(a, idx, axis=d)
    if not keepdim or not nd:
        idx, vals = np.squeeze(idx, d), np.squeeze(vals, d)
    if not nd:
        idx, vals = idx.reshape(()), vals.reshape(())
    gi = idx if keepdim or not nd else np.expand_dims(idx, d)
    v = _select_grad(x, np.ascontiguousarray(vals), gi, d, "KthvalueBackward0") if nd else \
        _scalar_pick(x, vals)
    return _Kth(v, _new_on(np.ascontiguousarray(idx).astype(int64), x))


def _scalar_pick(x, vals):
    return _mk(np.asarray(vals).copy(), "KthvalueBackward0", lambda g: (g.copy(),), (x,),
               saves=False)


def nanmedian(input, dim=None, keepdim=False, *, out=None):
    """The median ignoring NaN (the lower of the two middle values); with dim, (values,
    indices); NaN only where a slice is all NaN."""
    x = _t(input)
    xd = x._data
    if dim is None:
        flat = xd.reshape(-1)
        if flat.size == 0:
            return _new_on(np.asarray(np.nan, dtype=xd.dtype), x)
        order = np.argsort(flat, kind="stable")   # NaN sorts last
        cnt = builtins.int((~np.isnan(flat)).sum()) if xd.dtype.kind == "f" or \
            _is_float_dtype(xd.dtype) else flat.size
        pick = order[(cnt - 1) // 2] if cnt else order[0]
        val = flat[pick] if cnt else np.asarray(np.nan, dtype=xd.dtype)
        shape = xd.shape

        def bw(g):   # shared evenly among the elements equal to the median (torch's)
            eq = flat == val
            n = eq.sum()
            gx = (g * eq / n).astype(g.dtype) if n else np.zeros(flat.shape, g.dtype)
            return (gx.reshape(shape),)
        return _mk(np.asarray(val, dtype=xd.dtype), "NanmedianBackward0", bw, (x,), saves=False)
    nd = xd.ndim
    d = _dim(dim, nd)
    a = xd if nd else xd.reshape(1)
    if a.shape[d] == 0:
        raise IndexError(f"nanmedian(): Expected reduction dim {d} to have non-zero size.")
    order = np.argsort(a, axis=d, kind="stable")
    isf = _is_float_dtype(a.dtype)
    cnt = (~np.isnan(a)).sum(axis=d, keepdims=True) if isf else \
        np.full(np.take(a, [0], axis=d).shape, a.shape[d])
    pos = np.where(cnt > 0, (cnt - 1) // 2, 0)
    idx = np.take_along_axis(order, pos, axis=d)
    vals = np.take_along_axis(a, idx, axis=d)
    if not keepdim or not nd:
        idx, vals = np.squeeze(idx, d), np.squeeze(vals, d)
    if not nd:
        return _NanMedian(_scalar_pick(x, vals.reshape(())),
                          _new_on(np.zeros((), np.int64), x))
    gi = idx if keepdim else np.expand_dims(idx, d)
    v = _select_grad(x, np.ascontiguousarray(vals), gi, d, "NanmedianBackward0")
    return _NanMedian(v, _new_on(np.ascontiguousarray(idx).astype(int64), x))


_INTERP = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(name, input, q, dim, keepdim, interpolation, ignore_nan):
    x = _t(input)
    xd = x._data
    if not _is_float_dtype(xd.dtype) or xd.dtype.itemsize < 4:
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    if interpolation not in _INTERP:
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest, but got {interpolation}")
    if isinstance(q, Tensor):
        if q._data.ndim > 1:
            raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
        if q._data.dtype != xd.dtype:
            raise RuntimeError(f"{name}() q tensor must be same dtype as the input tensor")
        qa = q._data.astype(np.float64)
        scalar_q = q._data.ndim == 0
    else:
        qa = np.asarray([q], dtype=np.float64)
        scalar_q = True
    if np.any((qa < 0) | (qa > 1)):
        if not isinstance(q, Tensor):
            raise RuntimeError(f"{name}() q must be in the range [0, 1] but got {q}")
        raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    qa = qa.reshape(-1)
    if dim is None:
        src = x.reshape(-1)
        d = 0
    else:
        d = _dim(dim, xd.ndim)
        src = x if xd.ndim else x.reshape(1)
    if src.shape[d] == 0:
        raise IndexError(f"{name}() input tensor must be non-empty")
    s = src.sort(dim=d)[0]            # NaN last; differentiable (sort's gradient)
    sd = s._data
    n = sd.shape[d]
    # torch's ranks: NaN-free count - 1 (nanquantile; 0 for an all-NaN slice), else the last
    # index where a slice has NaN (the result is then that NaN, and so is its gradient's path)
    if ignore_nan:
        cnt = (~np.isnan(sd)).sum(axis=d, keepdims=True)
    else:
        has_nan = np.isnan(sd).any(axis=d, keepdims=True)
    outs = []
    for qv in qa:
        if ignore_nan:
            rank = np.maximum(qv * (cnt - 1).astype(np.float64), 0)
        else:
            rank = np.where(has_nan, n - 1, qv * (n - 1))
        if interpolation == "lower":
            rank = np.floor(rank)
        elif interpolation == "higher":
            rank = np.ceil(rank)
        elif interpolation == "nearest":
            rank = np.round(rank)   # half to even, as torch's
        lo = np.floor(rank).astype(np.int64)
        vlo = s.gather(d, _new(lo))
        if interpolation in ("linear", "midpoint"):
            hi = np.ceil(rank).astype(np.int64)
            w = np.full(rank.shape, 0.5) if interpolation == "midpoint" else rank - lo
            vhi = s.gather(d, _new(hi))
            r = vlo + (vhi - vlo) * _new(w.astype(sd.dtype))
        else:
            r = vlo
        outs.append(r)
    from ._ops import cat
    res = cat(outs, d) if len(outs) > 1 else outs[0]    # q along d for now
    if dim is None:
        res = res.reshape(-1)
        if keepdim:
            res = res.reshape((len(qa),) + (1,) * xd.ndim)
    else:
        if not xd.ndim:
            res = res.reshape(len(qa))
        elif keepdim:
            res = res.movedim(d, 0).unsqueeze(d + 1)
        else:
            res = res.movedim(d, 0)
    if scalar_q:
        res = res.squeeze(0) if res.ndim and res.shape[0] == 1 else res
    return res


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    """The q-th quantiles (q a number or 1-D tensor in [0, 1]) over all elements or along dim;
    a 1-D q adds a leading dimension.  NaN where a slice has NaN."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear", out=None):
    """quantile ignoring NaN (NaN only where a slice is all NaN)."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


def var_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    """(variance, mean) over dim (all when None), Bessel's correction by default."""
    x = _t(input)
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    c = correction if unbiased is None else (1 if unbiased else 0)
    return x.var(dim, keepdim=keepdim, correction=c), x.mean(dim, keepdim=keepdim) \
        if dim is not None else x.mean()


def std_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    """(standard deviation, mean) over dim (all when None)."""
    x = _t(input)
    if isinstance(dim, bool):
        unbiased, dim = dim, None
    c = correction if unbiased is None else (1 if unbiased else 0)
    return x.std(dim, keepdim=keepdim, correction=c), x.mean(dim, keepdim=keepdim) \
        if dim is not None else x.mean()


def aminmax(input, *, dim=None, keepdim=False, out=None):
    """(min, max) over all elements or along dim."""
    x = _t(input)
    xd = x._data
    if dim is None:
        if xd.size == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the "
                               "operation has no identity.")
        r = _AMinMax(x.amin(), x.amax())
        if keepdim:
            r = _AMinMax(r.min.reshape((1,) * xd.ndim), r.max.reshape((1,) * xd.ndim))
        return r
    d = _dim(dim, xd.ndim)
    if xd.ndim and xd.shape[d] == 0:
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the "
                           "operation has no identity.")
    if not xd.ndim:
        return _AMinMax(x.clone(), x.clone())
    return _AMinMax(x.amin(d, keepdim=keepdim), x.amax(d, keepdim=keepdim))


def _attach():
    T = Tensor
    for name in ("cummax", "cummin", "logcumsumexp", "kthvalue", "nanmedian", "quantile",
                 "nanquantile", "aminmax"):
        setattr(T, name, globals()[name])


_attach()
