"""Finding and counting: searchsorted / bucketize, bincount, isin, argwhere; and writing at
indices with gradients: index_add / index_copy / index_fill (torch.* and Tensor methods, their
in-place ``_`` variants) and scatter_reduce (sum, prod, mean, amax, amin; include_self).

Values, dtypes and errors follow torch 2.13; gradients as torch's (scatter_reduce's amax/amin
share the gradient evenly among the elements equal to the result, prod's handles zeros).
"""
from __future__ import annotations

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _check_inplace, _mk, _new, _new_on
from ._dtypes import _is_float_dtype, _pyint, int64
from ._grad_mode import _st

__all__ = ["searchsorted", "bucketize", "bincount", "isin", "argwhere", "index_add",
           "index_copy", "index_fill", "scatter_reduce"]


def _long(dt):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool", "float32": "Float", "float64": "Double",
            "float16": "Half"}.get(np.dtype(dt).name, np.dtype(dt).name)


def _sorted_search(seq, vals, right):
    side = "right" if right else "left"
    if seq.ndim == 1:
        return np.searchsorted(seq, vals, side=side)
    s2 = seq.reshape(-1, seq.shape[-1])
    v2 = vals.reshape(-1, vals.shape[-1])
    out = np.stack([np.searchsorted(s2[i], v2[i], side=side) for i in range(s2.shape[0])]) \
        if s2.shape[0] else np.zeros(v2.shape, np.int64)
    return out.reshape(vals.shape)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                 sorter=None, out=None):
    """For each value, the index where it would be inserted into sorted_sequence's last
    dimension to keep it sorted (the first such index; the last with right=True or
    side='right')."""
    seq = _t(sorted_sequence)
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, "
                               "got side of left while right was True")
        right = side == "right"
    scalar = not isinstance(input, Tensor)
    v = _t(input) if not scalar else None
    sd = seq._data
    if sorter is not None:
        sd = np.take_along_axis(sd, sorter._data, axis=-1)
    vd = np.asarray(input, dtype=sd.dtype) if scalar else v._data
    if sd.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or the "
                           "first N-1 dimensions of boundaries tensor and input value tensor must "
                           "match, but we got boundaries tensor [] and input value tensor "
                           f"{list(vd.shape)}")
    if sd.ndim > 1 and (vd.ndim != sd.ndim or vd.shape[:-1] != sd.shape[:-1]):
        raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the "
                           f"first N-1 dimensions of boundaries tensor and input value tensor "
                           f"must match, but we got boundaries tensor {list(sd.shape)} and input "
                           f"value tensor {list(vd.shape)}")
    res = _sorted_search(sd, vd, right)
    return _new_on(np.asarray(res).astype(np.int32 if out_int32 else np.int64), seq)


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    """For each value, the index of the bucket of 1-D ``boundaries`` it falls in (as
    searchsorted(boundaries, input))."""
    b = _t(boundaries)
    if b._data.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({b._data.ndim})")
    return searchsorted(b, input, out_int32=out_int32, right=right)


def bincount(input, weights=None, minlength=0):
    """Counts of each value of a 1-D non-negative integer tensor (weighted sums with weights:
    their float dtype, float64 for integer weights)."""
    x = _t(input)
    xd = x._data
    if xd.dtype.kind not in "iub":
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{_long(xd.dtype)}'")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if xd.ndim != 1 or (xd.size and xd.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is None:
        return _new_on(np.bincount(xd, minlength=minlength).astype(np.int64), x)
    w = _t(weights)
    if w._data.ndim != 1 or w._data.shape[0] != xd.shape[0]:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    dt = w._data.dtype if _is_float_dtype(w._data.dtype) else np.float64
    return _new_on(np.bincount(xd, weights=w._data.astype(np.float64),
                               minlength=minlength).astype(dt), x)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each element of ``elements`` is in ``test_elements`` (either may be a number)."""
    scalar = not isinstance(elements, Tensor)
    e = np.asarray(elements) if scalar else elements._data
    te = test_elements._data if isinstance(test_elements, Tensor) else np.asarray(test_elements)
    r = np.isin(e, te, invert=invert)
    ref = elements if not scalar else test_elements
    return _new_on(np.asarray(r), ref) if isinstance(ref, Tensor) else _new(np.asarray(r))


def argwhere(input):
    """The indices of the non-zero elements, one row each (N, input.ndim)."""
    x = _t(input)
    return _new_on(np.argwhere(x._data).astype(int64), x)


# ----------------------------------------------------------------------------------------------
# index_add / index_copy / index_fill

def _index_check(x, d, idx, name, source=None):
    if not isinstance(idx, Tensor):
        raise TypeError(f"{name}(): argument 'index' (position 3) must be Tensor, not "
                        f"{type(idx).__name__}")
    i = idx._data
    if i.dtype.kind not in "iu":
        raise RuntimeError(f"{name}_(): Expected dtype int32/int64 for index" if name !=
                           "index_fill" else "index_fill_(): Expected dtype int64 for index.")
    if i.ndim > 1:
        raise IndexError(f"{name}_(): Index is supposed to be a vector")
    i = i.reshape(-1).astype(np.int64)
    n = x._data.shape[d] if x._data.ndim else 1
    if i.size and (i.min() < -n or i.max() >= n):
        bad = _pyint(i.max() if i.max() >= n else i.min())
        msg = f"index {bad} is out of bounds for dimension {d} with size {n}"
        if name == "index_add":
            raise RuntimeError(msg)
        raise IndexError(f"index_copy_(): {msg}" if name == "index_copy" else msg)
    return np.where(i < 0, i + n, i)


def _key(d, i):
    return (slice(None),) * d + (i,)


def _finish(x, r, inplace):
    if not inplace:
        return r
    if r.grad_fn is not None:
        x._data, x.grad_fn, x._requires_grad = r._data.astype(x._data.dtype, copy=False), \
            r.grad_fn, True
    else:
        np.copyto(x._data, r._data, casting="unsafe")
    return x


def index_add(input, dim, index, source, *, alpha=1, _inplace=False):
    """input with alpha * source's slices added at index along dim (repeated indices add
    up)."""
    x, src = _t(input), _t(source)
    if _inplace:
        _check_inplace(x)
    d = _dim(dim, x._data.ndim)
    i = _index_check(x, d, index, "index_add")
    xd = x._data
    sd = src._data if src._data.ndim else src._data.reshape(1)
    if xd.ndim and (sd.ndim != xd.ndim or sd.shape[d] != i.size or
                    any(sd.shape[k] != xd.shape[k] for k in range(xd.ndim) if k != d)):
        raise RuntimeError(f"index_add_(): Source/destination tensor must have same slice shapes. "
                           f"Destination slice shape: {_slice(xd.shape, d)} at dimension {d} and "
                           f"source slice shape: {_slice(sd.shape, d)} at dimension 0.")
    out = xd.copy() if xd.ndim else xd.reshape(1).copy()
    np.add.at(out, _key(d, i), sd * alpha if alpha != 1 else sd.astype(out.dtype, copy=False))
    out = out.reshape(xd.shape)
    ra, rb = x._requires_grad, src._requires_grad

    def bw(g):
        gg = g if g.ndim else g.reshape(1)
        gs = gg[_key(d, i)]
        if alpha != 1:
            gs = gs * alpha
        return (g if ra else None, gs.reshape(src.shape) if rb else None)
    return _finish(x, _mk(out, "IndexAddBackward0", bw, (x, src), saves=False), _inplace)


def _slice(shape, d):
    s = list(shape)
    if s:
        del s[d]
    return "[" + ", ".join(str(v) for v in s) + "]"


def index_copy(input, dim, index, source, *, _inplace=False):
    """input with source's slices written at index along dim."""
    x, src = _t(input), _t(source)
    if _inplace:
        _check_inplace(x)
    d = _dim(dim, x._data.ndim)
    i = _index_check(x, d, index, "index_copy")
    xd = x._data
    sd = src._data if src._data.ndim else src._data.reshape(1)
    if xd.ndim and (sd.ndim != xd.ndim or sd.shape[d] != i.size):
        raise IndexError("index_copy_(): Number of indices (" + str(i.size) + ") should be equal "
                         "to source.size(dim) (" + str(sd.shape[d] if sd.ndim > d else 1) + ")")
    out = xd.copy() if xd.ndim else xd.reshape(1).copy()
    out[_key(d, i)] = sd
    out = out.reshape(xd.shape)

    def bw(g):
        gg = g if g.ndim else g.reshape(1)
        gx = gg.copy()
        gx[_key(d, i)] = 0
        return gx.reshape(g.shape), gg[_key(d, i)].reshape(src.shape)
    return _finish(x, _mk(out, "IndexCopyBackward0", bw, (x, src), saves=False), _inplace)


def index_fill(input, dim, index, value, *, _inplace=False):
    """input with value written into the slices at index along dim (value a number or 0-d
    tensor)."""
    x = _t(input)
    if _inplace:
        _check_inplace(x)
    d = _dim(dim, x._data.ndim)
    i = _index_check(x, d, index, "index_fill")
    vt = value if isinstance(value, Tensor) else None
    if vt is not None and vt._data.ndim:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {vt._data.ndim} dimension(s).")
    xd = x._data
    out = xd.copy() if xd.ndim else xd.reshape(1).copy()
    out[_key(d, i)] = vt._data if vt is not None else value
    out = out.reshape(xd.shape)

    def bw(g):
        gg = (g if g.ndim else g.reshape(1)).copy()
        gv = None
        if vt is not None and vt._requires_grad:
            gv = np.asarray(gg[_key(d, i)].sum(), dtype=vt._data.dtype)
        gg[_key(d, i)] = 0
        return gg.reshape(g.shape), gv
    return _finish(x, _mk(out, "IndexFillBackward0", bw, (x, vt), saves=False), _inplace)


# ----------------------------------------------------------------------------------------------
# scatter_reduce

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True, _inplace=False):
    """input with src's elements reduced into the positions index names along dim (reduce:
    sum, prod, mean, amax, amin; include_self=False leaves input's values out where an element
    lands)."""
    from ._indexing import _check_scatter
    x, s = _t(input), _t(src)
    if reduce not in _REDUCES:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    if not isinstance(index, Tensor):
        raise TypeError(f"scatter_reduce(): argument 'index' (position 3) must be Tensor, not "
                        f"{type(index).__name__}")
    if _inplace:
        _check_inplace(x)
    d = _dim(dim, x._data.ndim)
    idx = index._data
    if idx.dtype != np.int64:
        raise RuntimeError("scatter_reduce(): Expected dtype int64 for index")
    _check_scatter(x, d, idx, s)
    xd, sd = x._data, s._data[tuple(slice(0, n) for n in idx.shape)]
    grids = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx
    key = tuple(grids)
    hit = np.zeros(xd.shape, dtype=bool)
    hit[key] = True
    cnt = np.zeros(xd.shape, dtype=np.int64)
    np.add.at(cnt, key, 1)
    f64 = xd.dtype
    out = xd.copy()
    if not include_self:
        ident = {"sum": 0, "mean": 0, "prod": 1}.get(reduce)
        if ident is None:
            ident = (-np.inf if reduce == "amax" else np.inf) if _is_float_dtype(xd.dtype) else \
                (np.iinfo(xd.dtype).min if reduce == "amax" else np.iinfo(xd.dtype).max)
        out[hit] = ident
    sv = sd.astype(f64, copy=False)
    if reduce in ("sum", "mean"):
        np.add.at(out, key, sv)
    elif reduce == "prod":
        np.multiply.at(out, key, sv)
    elif reduce == "amax":
        np.maximum.at(out, key, sv)
    else:
        np.minimum.at(out, key, sv)
    total = cnt + (1 if include_self else 0)
    if reduce == "mean":
        div = np.where(hit, total, 1)
        out = np.where(hit, out / div if _is_float_dtype(xd.dtype) else out // div, out) \
            .astype(xd.dtype)
    ra, rs = x._requires_grad, s._requires_grad

    def bw(g):
        gx = gs = None
        if reduce == "sum":
            gx = g if include_self else np.where(hit, 0, g).astype(g.dtype)
            gs = g[key]
        elif reduce == "mean":
            gd = g / np.where(hit, total, 1)
            gx = gd if include_self else np.where(hit, 0, g).astype(g.dtype)
            gs = gd[key]
        elif reduce in ("amax", "amin"):
            # torch's: ties share evenly, counting self's equal element even when
            # include_self=False (whose gradient is then zero where an element landed)
            selfeq = xd == out
            srceq = sv == out[key]
            n = selfeq.astype(g.dtype)
            np.add.at(n, key, srceq.astype(g.dtype))
            share = g / np.where(n == 0, 1, n)
            gx = share * selfeq
            if not include_self:
                gx = np.where(hit, 0, gx)
            gs = share[key] * srceq
        else:   # prod: the product of the other contributors (zeros counted apart)
            z = np.zeros(xd.shape, np.int64)
            np.add.at(z, key, (sv == 0).astype(np.int64))
            nz = np.ones(xd.shape, dtype=xd.dtype)
            np.multiply.at(nz, key, np.where(sv == 0, 1, sv))
            if include_self:
                z += xd == 0
                nz = nz * np.where(xd == 0, 1, xd)

            def others(c, zc, nc):
                return np.where(c == 0, np.where(zc == 1, nc, 0),
                                np.where(zc == 0, nc / np.where(c == 0, 1, c), 0))
            gx = g * others(xd, z, nz) if include_self else np.where(hit, 0, g)
            gs = g[key] * others(sv, z[key], nz[key])
        gsf = None
        if rs and gs is not None:
            gsf = np.zeros(s.shape, dtype=g.dtype)
            gsf[tuple(slice(0, n) for n in idx.shape)] = gs
        return (np.asarray(gx, dtype=g.dtype) if ra else None), gsf
    r = _mk(out, "ScatterReduceBackward0", bw, (x, s), saves=False) if \
        _st.grad and (ra or rs) else _new_on(out, x)
    return _finish(x, r, _inplace)


def _attach():
    T = Tensor

    def method(f, name, inplace):
        def m(self, *args, **kwargs):
            return f(self, *args, _inplace=inplace, **kwargs)
        m.__name__ = name + ("_" if inplace else "")
        m.__doc__ = (f.__doc__ or "").split("\n")[0] + (" In place; returns self." if inplace
                                                        else "")
        return m
    for name in ("index_add", "index_copy", "index_fill", "scatter_reduce"):
        f = globals()[name]
        setattr(T, name, method(f, name, False))
        setattr(T, name + "_", method(f, name, True))
    T.bincount = bincount
    T.argwhere = argwhere


_attach()
