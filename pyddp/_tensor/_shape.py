"""Shape and view operations: unflatten, as_strided, narrow, select, unbind, movedim, unfold,
broadcast_to (views of the input's memory, as torch's), and flip, roll, tile, repeat_interleave,
tensor_split (reshape, permute, cat, ... are pyddp._tensor._ops').

Each function follows torch 2.13 on the same inputs (values, dtypes, aliasing, errors; the tests
compare them with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import builtins

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _mk, _new
from ._dtypes import _pyint, int64
from ._indexing import index_select

__all__ = ["unflatten", "as_strided", "narrow", "select", "unbind", "flip", "roll", "movedim",
           "moveaxis", "broadcast_to", "repeat_interleave", "tile", "tensor_split"]


def unflatten(input, dim, sizes):
    """dim split into sizes (a view when possible, as reshape)."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    sizes = tuple(_pyint(s) for s in sizes)
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 not in sizes and known != x.shape[d]:
        raise RuntimeError(f"unflatten: Provided sizes {list(sizes)} don't multiply up to the "
                           f"size of dim {dim} ({x.shape[d]}) in the input tensor")
    return x.reshape(*(x.shape[:d] + sizes + x.shape[d + 1:]))


def _storage_root(a):
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def as_strided(input, size, stride, storage_offset=None):
    """A view of input's storage with the given size, stride and offset (in elements)."""
    x = _t(input)
    xd = x._data
    root = _storage_root(xd)
    if not root.flags.c_contiguous and not root.flags.f_contiguous:
        raise RuntimeError("as_strided: the tensor's storage is not one block of memory")
    item = xd.itemsize
    start = root.__array_interface__["data"][0]
    here = xd.__array_interface__["data"][0]
    off = (here - start) // item if storage_offset is None else _pyint(storage_offset)
    size = tuple(_pyint(n) for n in size)
    stride = tuple(_pyint(s) for s in stride)
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    if builtins.any(n < 0 for n in size) or builtins.any(s < 0 for s in stride) or off < 0:
        raise RuntimeError("as_strided: negative size, stride or storage offset")
    nel = root.size
    last = off + builtins.sum((n - 1) * s for n, s in zip(size, stride)) if builtins.all(size) \
        else off - 1
    if last >= nel:
        raise RuntimeError(f"setStorage: sizes {list(size)}, strides {list(stride)}, storage "
                           f"offset {off}, and itemsize {item} requiring a storage size of "
                           f"{(last + 1) * item} are out of bounds for storage of size "
                           f"{nel * item}")
    flat = root.reshape(-1, order="A")
    out = np.lib.stride_tricks.as_strided(flat[off:] if off < nel else flat[:0], size,
                                          tuple(s * item for s in stride),
                                          writeable=xd.flags.writeable)
    ishape = xd.shape
    ioff = (here - start) // item
    istr = tuple(s // item for s in xd.strides)

    def bw(g):
        # scatter-add into a storage-shaped buffer, then read input's elements from it
        buf = np.zeros(builtins.max(nel, 1), dtype=g.dtype)
        view = np.lib.stride_tricks.as_strided(buf[off:] if off < nel else buf[:0], size,
                                               tuple(s * buf.itemsize for s in stride))
        idx = np.lib.stride_tricks.as_strided(np.arange(buf.size)[off:] if off < nel else
                                              np.arange(0), size,
                                              tuple(s * 8 for s in stride))
        np.add.at(buf, idx.reshape(-1), g.reshape(-1))
        del view
        return (np.lib.stride_tricks.as_strided(buf[ioff:], ishape,
                                                tuple(s * buf.itemsize for s in istr)).copy(),)
    return _mk(out, "AsStridedBackward0", bw, (x,), saves=False)


def narrow(input, dim, start, length):
    """The slice start:start+length along dim (a view)."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    n = x.shape[d]
    start = _pyint(start)
    if start < 0:
        start += n
    if not 0 <= start <= n or length < 0 or start + length > n:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({n}).")
    return x[(slice(None),) * d + (slice(start, start + length),)]


def select(input, dim, index):
    """The slice at index along dim, dim removed (a view)."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(x.shape)} at dimension {d}")
    return x[(slice(None),) * d + (_pyint(index),)]


def unbind(input, dim=0):
    """The slices along dim (views)."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def flip(input, dims):
    """Reversed along dims (a copy, as torch's)."""
    x = _t(input)
    ds = (dims,) if isinstance(dims, (_pyint, np.integer)) else tuple(dims)
    ds = tuple(_dim(d, x._data.ndim) for d in ds)
    out = np.flip(x._data, ds).copy()
    return _mk(out, "FlipBackward0", lambda g: (np.flip(g, ds).copy(),), (x,), saves=False)


def roll(input, shifts, dims=None):
    """Elements shifted cyclically along dims (flattened when None)."""
    x = _t(input)
    xd = x._data
    if dims is None:
        out = np.roll(xd.reshape(-1), shifts).reshape(xd.shape)
        return _mk(out, "RollBackward0",
                   lambda g: (np.roll(g.reshape(-1), -np.asarray(shifts)).reshape(xd.shape),),
                   (x,), saves=False)
    out = np.roll(xd, shifts, dims)
    neg = tuple(-s for s in shifts) if isinstance(shifts, (tuple, list)) else -shifts
    return _mk(out, "RollBackward0", lambda g: (np.roll(g, neg, dims),), (x,), saves=False)


def movedim(input, source, destination):
    """Dimensions source moved to destination (a view)."""
    x = _t(input)
    nd = x._data.ndim
    src = (source,) if isinstance(source, (_pyint, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (_pyint, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} "
                           f"dims) should contain the same number of dims as destination "
                           f"({list(dst)} dims)")
    src = [_dim(d, nd) for d in src]
    dst = [_dim(d, nd) for d in dst]
    rest = [d for d in range(nd) if d not in src]
    order = [None] * nd
    for s_, d_ in zip(src, dst):
        order[d_] = s_
    it = iter(rest)
    order = [o if o is not None else next(it) for o in order]
    return x.permute(*order)


moveaxis = movedim


def _unfold(self, dimension, size, step):
    """Tensor.unfold: windows of ``size`` elements every ``step`` along ``dimension``, as a new
    last dimension (a view)."""
    xd = self._data
    d = _dim(dimension, xd.ndim)
    n = xd.shape[d] if xd.ndim else 1
    size, step = _pyint(size), _pyint(step)
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    count = (n - size) // step + 1
    shape = xd.shape[:d] + (count,) + xd.shape[d + 1:] + (size,)
    strides = xd.strides[:d] + (xd.strides[d] * step,) + xd.strides[d + 1:] + (xd.strides[d],)
    out = np.lib.stride_tricks.as_strided(xd, shape, strides, writeable=xd.flags.writeable)
    ishape = xd.shape

    def bw(g):
        gx = np.zeros(ishape, dtype=g.dtype)
        for k in range(count):   # windows overlap when step < size: add them one by one
            win = np.take(g, k, axis=d)                   # (..., [dims after d], size)
            dst = (slice(None),) * d + (slice(k * step, k * step + size),)
            gx[dst] += np.moveaxis(win, -1, d)
        return (gx,)
    return _mk(out, "UnfoldBackward0", bw, (self,), saves=False)


def broadcast_to(input, size):
    """input expanded to size (a view)."""
    return _t(input).expand(*size)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element repeated ``repeats`` times (along dim; flattened when None)."""
    x = _t(input)
    if dim is None:
        x = x.reshape(-1)
        dim = 0
    d = _dim(dim, x._data.ndim)
    r = repeats._data if isinstance(repeats, Tensor) else repeats
    idx = np.repeat(np.arange(x.shape[d]), r)
    return index_select(x, d, _new(idx.astype(int64)))


def tile(input, dims):
    """input repeated along each dimension (leading ones added as needed)."""
    x = _t(input)
    dims = tuple(dims)
    if len(dims) < x._data.ndim:
        dims = (1,) * (x._data.ndim - len(dims)) + dims
    return x.repeat(*dims)


def tensor_split(input, indices_or_sections, dim=0):
    """Views of input split into n near-equal parts, or at the given indices, along dim."""
    x = _t(input)
    d = _dim(dim, x._data.ndim)
    n = x.shape[d]
    if isinstance(indices_or_sections, (_pyint, np.integer)):
        k = _pyint(indices_or_sections)
        q, r = divmod(n, k)
        bounds, start = [], 0
        for j in range(k):
            start += q + (1 if j < r else 0)
            bounds.append(start)
        bounds = bounds[:-1]
    else:
        bounds = [_pyint(b) for b in indices_or_sections]
    edges = [0] + bounds + [n]
    return tuple(x.narrow(d, builtins.min(a, n), builtins.max(0, builtins.min(b, n) -
                                                              builtins.min(a, n)))
                 for a, b in zip(edges[:-1], edges[1:]))


def _attach():
    for name in ("unflatten", "as_strided", "flip", "roll", "narrow", "select", "unbind",
                 "broadcast_to", "repeat_interleave", "tile", "tensor_split"):
        setattr(Tensor, name, globals()[name])
    Tensor.unfold = _unfold
    Tensor.movedim = Tensor.moveaxis = movedim


_attach()
