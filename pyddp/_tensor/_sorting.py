"""Sorting and order statistics: topk, sort, argsort, median, unique (values with their
indices, NaN as the largest value, ties in index order, as torch).

Each function follows torch 2.13 on the same inputs (values, dtypes, errors; the tests compare them
with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _mk, _new_on
from ._dtypes import _pyint, int64

__all__ = ["topk", "sort", "argsort", "median", "unique", "unique_consecutive"]

_TopK = namedtuple("topk", ["values", "indices"])
_Sort = namedtuple("sort", ["values", "indices"])


def _order(xd, d, descending, stable=True):
    """Indices sorting xd along d (NaN counts as the largest value, ties keep index order)."""
    if not descending:
        return np.argsort(xd, axis=d, kind="stable")
    if xd.dtype.kind == "b":
        key = ~xd
    elif xd.dtype.kind in "iu":
        key = ~xd      # order-reversing without overflow
    else:
        nan = np.isnan(xd)
        key = np.where(nan, 0, -xd.astype(np.result_type(xd.dtype, np.float32), copy=False))
        if nan.any():
            moved = np.moveaxis(key, d, -1)
            idx = np.lexsort((moved, ~np.moveaxis(nan, d, -1)), axis=-1)
            return np.moveaxis(idx, -1, d)
    return np.argsort(key, axis=d, kind="stable")


def _gather_result(x, idx, d, name):
    xd = x._data
    vals = np.take_along_axis(xd, idx, axis=d)
    shape = xd.shape

    def bw(g):
        gx = np.zeros(shape, dtype=g.dtype)
        np.put_along_axis(gx, idx, g, axis=d)
        return (gx,)
    return _mk(vals, name, bw, (x,), saves=False), _new_on(idx.astype(int64, copy=False), x)


def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    """The k largest (smallest) elements along dim: (values, indices)."""
    x = _t(input)
    xd = x._data
    if xd.ndim == 0:
        xd0 = xd.reshape(1)
        if not 0 <= k <= 1:
            raise RuntimeError("selected index k out of range")
        v, i = topk(_new_on(xd0, x), k, 0, largest, sorted)
        return _TopK(v.reshape(()) if k else v, i.reshape(()) if k else i)
    d = _dim(dim, xd.ndim)
    k = _pyint(k)
    if not 0 <= k <= xd.shape[d]:
        raise RuntimeError("selected index k out of range")
    idx = np.take(_order(xd, d, largest), np.arange(k), axis=d)
    v, i = _gather_result(x, idx, d, "TopkBackward0")
    return _TopK(v, i)


def sort(input, dim=-1, descending=False, stable=False, *, out=None):
    """Sorted along dim: (values, indices); ties keep their order."""
    x = _t(input)
    if x._data.ndim == 0:
        return _Sort(x.clone(), _new_on(np.zeros((), int64), x))
    d = _dim(dim, x._data.ndim)
    v, i = _gather_result(x, _order(x._data, d, descending), d, "SortBackward0")
    return _Sort(v, i)


def argsort(input, dim=-1, descending=False, stable=False):
    """The indices that sort input along dim."""
    return sort(input, dim, descending, stable).indices


def median(input, dim=None, keepdim=False):
    """The lower median of all elements, or (values, indices) along dim."""
    x = _t(input)
    if dim is None:
        flat = x.reshape(-1)
        return sort(flat).values[(flat.numel() - 1) // 2]
    d = _dim(dim, x._data.ndim)
    v, i = sort(x, d)
    k = (x.shape[d] - 1) // 2
    vals, idx = v.select(d, k), i.select(d, k)
    if keepdim:
        vals, idx = vals.unsqueeze(d), idx.unsqueeze(d)
    return _Sort(vals, idx)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct elements (sorted), with the inverse indices and counts when asked."""
    x = _t(input)
    if dim is not None:
        raise NotImplementedError("unique(dim=...) is not supported; unique over all elements "
                                  "only")
    vals, inv, counts = np.unique(x._data, return_inverse=True, return_counts=True)
    out = [_new_on(vals, x)]
    if return_inverse:
        out.append(_new_on(inv.reshape(x.shape).astype(int64), x))
    if return_counts:
        out.append(_new_on(counts.astype(int64), x))
    return out[0] if len(out) == 1 else tuple(out)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """The input with each run of equal consecutive elements (or slices along ``dim``) kept once,
    as torch.unique_consecutive: with ``return_inverse`` the index of each element's (slice's) run,
    with ``return_counts`` the length of each run (int64)."""
    x = _t(input)
    xd = x._data
    if dim is None:
        flat = xd.reshape(-1)
        new = np.ones(flat.shape[0], dtype=np.bool_)
        new[1:] = flat[1:] != flat[:-1]
        vals = flat[new]
        inv_shape = xd.shape
    else:
        d = _dim(dim, xd.ndim)
        moved = np.moveaxis(xd, d, 0)
        rows = moved.reshape(moved.shape[0], -1)
        new = np.ones(rows.shape[0], dtype=np.bool_)
        new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
        vals = np.moveaxis(moved[new], 0, d)
        inv_shape = (rows.shape[0],)
    starts = np.flatnonzero(new)
    out = [_new_on(np.ascontiguousarray(vals), x)]
    if return_inverse:
        out.append(_new_on((np.cumsum(new) - 1).astype(int64).reshape(inv_shape), x))
    if return_counts:
        out.append(_new_on(np.diff(np.append(starts, new.shape[0])).astype(int64), x))
    return out[0] if len(out) == 1 else tuple(out)


def _attach():
    for name in ("topk", "sort", "argsort", "unique", "median", "unique_consecutive"):
        setattr(Tensor, name, globals()[name])


_attach()
