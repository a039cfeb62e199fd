"""Indexing by tensors of indices: gather / scatter / scatter_add, index_select, masked_select,
take, take_along_dim, nonzero, and the Tensor methods index_add / index_fill / index_copy (with
their in-place ``_`` variants) and scatter_ / scatter_add_.

Each function follows torch 2.13 on the same inputs (values, dtypes, errors; the tests compare them
with torch); the Tensor methods are attached at the end.
"""
from __future__ import annotations

import builtins

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _check_inplace, _mk, _new_on
from ._dtypes import _pyint, int64
from ._grad_mode import _st

__all__ = ["gather", "scatter", "scatter_add", "index_select", "masked_select", "take_along_dim",
           "nonzero", "take"]


def _index_arg(index, name="index"):
    if not isinstance(index, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(index).__name__}")
    if index._data.dtype.kind not in "iu":
        raise RuntimeError(f"{name}(): Expected dtype int64 for index")
    return index._data


def gather(input, dim, index, *, sparse_grad=False, out=None):
    """out[i][j] = input[index[i][j]][j] (dim 0), as torch.gather."""
    x = _t(input)
    idx = _index_arg(index, "gather")
    xd = x._data
    d = _dim(dim, xd.ndim)
    if idx.ndim != builtins.max(xd.ndim, 1) and not (xd.ndim == 0 and idx.ndim <= 1):
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    for i, (a, b) in enumerate(zip(idx.shape, xd.shape)):
        if i != d and a > b:
            raise RuntimeError(f"Size does not match at dimension {i} expected index "
                               f"{list(idx.shape)} to be no larger than self {list(xd.shape)} "
                               f"apart from dimension {d}")
    n = xd.shape[d] if xd.ndim else 1
    if idx.size and (idx.min() < -n or idx.max() >= n) or (idx.size and idx.min() < 0):
        raise RuntimeError(f"index {_pyint(idx.max() if idx.max() >= n else idx.min())} is out "
                           f"of bounds for dimension {d} with size {n}")
    sub = xd[tuple(slice(0, s) if i != d else slice(None) for i, s in enumerate(idx.shape))]
    vals = np.take_along_axis(sub, idx, axis=d)
    shape = xd.shape
    sl = tuple(slice(0, s) if i != d else slice(None) for i, s in enumerate(idx.shape))

    def bw(g):
        gx = np.zeros(shape, dtype=g.dtype)
        _scatter_into(gx[sl], d, idx, g, "add")
        return (gx,)
    return _mk(vals, "GatherBackward0", bw, (x,), saves=False)


def _scatter_into(target, d, idx, src, reduce):
    """target[..., idx, ...] (op)= src along d, in place (numpy, no graph)."""
    src = np.broadcast_to(src, idx.shape) if np.ndim(src) == 0 else \
        src[tuple(slice(0, s) for s in idx.shape)]
    grids = list(np.indices(idx.shape, sparse=True))
    grids[d] = idx
    key = tuple(grids)
    if reduce is None:
        target[key] = src
    elif reduce == "add":
        np.add.at(target, key, src)
    elif reduce == "multiply":
        np.multiply.at(target, key, src)
    else:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce!r}")


def _check_scatter(x, d, idx, src):
    xd = x._data
    if idx.ndim != xd.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    n = xd.shape[d]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = _pyint(idx.max() if idx.max() >= n else idx.min())
        raise RuntimeError(f"index {bad} is out of bounds for dimension {d} with size {n}")


def _scatter(input, dim, index, src, reduce, inplace, name):
    x = _t(input)
    idx = _index_arg(index, name)
    d = _dim(dim, x._data.ndim)
    _check_scatter(x, d, idx, src)
    sd = src._data if isinstance(src, Tensor) else src
    if inplace:
        _check_inplace(x)
        needs = _st.grad and (x._requires_grad or (isinstance(src, Tensor) and
                                                   src._requires_grad))
        if not needs:
            _scatter_into(x._data, d, idx, np.asarray(sd, dtype=x._data.dtype), reduce)
            return x
    out = x._data.copy()
    _scatter_into(out, d, idx, np.asarray(sd, dtype=out.dtype), reduce)
    st = src if isinstance(src, Tensor) else None

    def bw(g):
        gx = g.copy()
        gs = None
        if reduce is None:
            _scatter_into(gx, d, idx, np.zeros((), g.dtype), None)
        if st is not None:
            gs = np.zeros(st.shape, dtype=g.dtype)
            sl = tuple(slice(0, s) for s in idx.shape)
            gs[sl] = np.take_along_axis(g, idx, axis=d)
        return gx, gs
    r = _mk(out, "ScatterAddBackward0" if reduce == "add" else "ScatterBackward0", bw, (x, st),
            saves=False)
    if inplace:
        x._data, x.grad_fn, x._requires_grad = r._data, r.grad_fn, r._requires_grad
        return x
    return r


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """A copy of input with src's (or value's) elements written at index along dim."""
    if src is None:
        src = value
    return _scatter(input, dim, index, src, reduce, False, "scatter")


def scatter_add(input, dim, index, src):
    """A copy of input with src's elements added at index along dim."""
    return _scatter(input, dim, index, src, "add", False, "scatter_add")


def index_select(input, dim, index):
    """The entries of input at index (1-D) along dim."""
    x = _t(input)
    idx = _index_arg(index, "index_select")
    if idx.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    d = _dim(dim, x._data.ndim)
    sl = (slice(None),) * d + (idx.reshape(-1),)
    return x[sl]


def masked_select(input, mask):
    """The elements where mask (broadcast) is True, as a 1-D tensor."""
    x = _t(input)
    m = np.asarray(mask._data if isinstance(mask, Tensor) else mask)
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {m.dtype}")
    shape = np.broadcast_shapes(x.shape, m.shape)
    xb = x.expand(*shape) if x.shape != shape else x
    return xb[np.broadcast_to(m, shape)]


def take_along_dim(input, indices, dim=None):
    """Values of input at indices along dim (flattened when dim is None)."""
    x = _t(input)
    if dim is None:
        return gather(x.reshape(-1), 0, indices.reshape(-1))
    return gather(x, dim, indices)


def nonzero(input, *, as_tuple=False):
    """Indices of the non-zero elements: an (n, ndim) int64 tensor, or a tuple of 1-D ones."""
    x = _t(input)
    nz = np.nonzero(x._data if x._data.ndim else x._data.reshape(1))
    if as_tuple:
        return tuple(_new_on(i.astype(int64), x) for i in nz)
    return _new_on(np.stack(nz, axis=1).astype(int64) if nz else np.zeros((0, 0), int64), x)


def take(input, index):
    """input's elements at the flat indices ``index`` (shaped like index)."""
    x = _t(input).reshape(-1)
    idx = _index_arg(index, "take")
    n = x.shape[0]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"out of range: tried to access index {_pyint(idx.max())} on a tensor "
                         f"of {n} elements.")
    return x[idx % builtins.max(n, 1)]


def _index_method(op):
    def m(self, dim, index, source, *, alpha=1):
        d = _dim(dim, self._data.ndim)
        idx = _index_arg(index, "index_" + op).reshape(-1)
        key = (slice(None),) * d + (idx,)
        if op == "fill":
            val = source._data if isinstance(source, Tensor) else source
            res = self.clone()
            res._data[key] = val
            return res
        src = source._data if isinstance(source, Tensor) else np.asarray(source)
        res = self.clone() if not (_st.grad and (self._requires_grad or (
            isinstance(source, Tensor) and source._requires_grad))) else None
        if res is None:
            raise NotImplementedError(f"index_{op} with gradients is not supported")
        if op == "add":
            np.add.at(res._data, key, src * alpha if alpha != 1 else src)
        else:
            res._data[key] = src
        return res
    return m


def _scatter_method(inplace, reduce_default):
    def m(self, dim, index, src=None, value=None, *, reduce=reduce_default):
        if src is None:
            src = value
        return _scatter(self, dim, index, src, reduce, inplace, "scatter")
    m.__name__ = "scatter_" if inplace else "scatter"
    m.__doc__ = ("Write src's elements (or a value) at index along dim" +
                 (", in place; returns self." if inplace else ", into a copy."))
    return m


def _index_inplace(meth):
    def m(self, dim, index, source, **kw):
        _check_inplace(self)
        r = meth(self, dim, index, source, **kw)
        self._data[...] = r._data
        return self
    m.__name__ = meth.__name__ + "_"
    m.__doc__ = meth.__doc__.replace("A copy with", "In place:").rstrip(".") + "; returns self."
    return m


def _attach():
    for name in ("gather", "index_select", "masked_select", "take_along_dim", "nonzero", "take"):
        setattr(Tensor, name, globals()[name])
    T = Tensor
    for op in ("add", "fill", "copy"):
        meth = _index_method(op)
        meth.__name__ = f"index_{op}"
        meth.__doc__ = f"A copy with source {'added' if op == 'add' else 'written'} at index " \
                       "along dim."
        setattr(T, f"index_{op}", meth)
        setattr(T, f"index_{op}_", _index_inplace(meth))
    T.scatter = _scatter_method(False, None)
    T.scatter_ = _scatter_method(True, None)

    def scatter_add_method(self, dim, index, src):
        """A copy with src's elements added at index along dim."""
        return _scatter(self, dim, index, src, "add", False, "scatter_add")

    def scatter_add_inplace(self, dim, index, src):
        """Add src's elements at index along dim, in place; returns self."""
        return _scatter(self, dim, index, src, "add", True, "scatter_add_")
    T.scatter_add = scatter_add_method
    T.scatter_add_ = scatter_add_inplace


_attach()
