"""Joining, broadcasting and arranging tensors: hstack / vstack / dstack / column_stack /
row_stack / concatenate, atleast_1d/2d/3d, broadcast_tensors / broadcast_shapes, meshgrid,
rot90 / fliplr / flipud, tril_indices / triu_indices, unravel_index, diag_embed, kron,
tensordot, cross, and the torch.* spellings of Tensor methods (clone, detach, t, ravel,
swapdims).

Built from pyddp's differentiable ops (cat, reshape, expand, flip, permute, matmul,
index_select), so gradients come from theirs; torch 2.13's errors where the tests compare them.
"""
from __future__ import annotations

import builtins
import warnings

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _mk, _new, _new_on
from ._dtypes import _dtype, _pybool, _pyint, int64
from ._ops import cat, matmul, reshape

__all__ = ["hstack", "vstack", "dstack", "column_stack", "row_stack", "concatenate",
           "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors", "broadcast_shapes",
           "meshgrid", "rot90", "fliplr", "flipud", "tril_indices", "triu_indices",
           "unravel_index", "diag_embed", "kron", "tensordot", "cross", "clone", "detach", "t",
           "ravel", "swapdims"]


def _broadcast_error(a, b):
    """torch's RuntimeError for two shapes that do not broadcast."""
    for i in range(1, builtins.max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            return RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b "
                                f"({y}) at non-singleton dimension "
                                f"{builtins.max(len(a), len(b)) - i}")
    return RuntimeError(f"shapes {a} and {b} cannot be broadcast")


def _checked_cat(tensors, dim, name):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError(f"{name} expects a non-empty TensorList")
    for i, x in enumerate(tensors):
        if not isinstance(x, Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got "
                            f"{type(x).__name__}")
    kept = [x for x in tensors if x._data.shape != (0,)] or tensors
    nd = kept[0]._data.ndim
    for x in kept[1:]:
        if x._data.ndim != nd:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {nd} and "
                               f"{x._data.ndim}")
    d = _dim(dim, nd)
    for i, x in enumerate(tensors):
        if x._data.shape == (0,) and len(kept) != len(tensors):
            continue
        for k in range(nd):
            if k != d and x._data.shape[k] != kept[0]._data.shape[k]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. "
                                   f"Expected size {kept[0]._data.shape[k]} but got size "
                                   f"{x._data.shape[k]} for tensor number {i} in the list.")
    return cat(tensors, d)


def concatenate(tensors, dim=0, *, out=None):
    """torch.cat's other name."""
    return _checked_cat(tensors, dim, "cat")


def atleast_1d(*tensors):
    """Each tensor with at least 1 dimension (a 0-d one becomes shape (1,)); one tensor in, one
    out, else a tuple."""
    return _atleast(tensors, 1)


def atleast_2d(*tensors):
    """At least 2 dimensions: 0-d -> (1, 1), 1-d (n,) -> (1, n)."""
    return _atleast(tensors, 2)


def atleast_3d(*tensors):
    """At least 3 dimensions: 0-d -> (1, 1, 1), (n,) -> (1, n, 1), (m, n) -> (m, n, 1)."""
    return _atleast(tensors, 3)


def _atleast(tensors, n):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(_atleast1(_t(x), n) for x in tensors[0])
    out = tuple(_atleast1(_t(x), n) for x in tensors)
    return out[0] if len(out) == 1 else out


def _atleast1(x, n):
    s = x.shape
    if len(s) >= n:
        return x
    if n == 1 or len(s) == 0:
        return reshape(x, (1,) * n)
    if n == 2:
        return reshape(x, (1,) + s)
    return reshape(x, (1,) + s + (1,)) if len(s) == 1 else reshape(x, s + (1,))


def hstack(tensors, *, out=None):
    """Concatenated column-wise: along dim 1, or dim 0 for 1-D tensors."""
    ts = atleast_1d(tuple(tensors)) if len(tensors) else ()
    if not ts:
        raise RuntimeError("hstack expects a non-empty TensorList")
    return _checked_cat(ts, 0 if ts[0].ndim == 1 else 1, "hstack")


def vstack(tensors, *, out=None):
    """Concatenated row-wise (dim 0), 1-D tensors taken as rows."""
    ts = atleast_2d(tuple(tensors)) if len(tensors) else ()
    if not ts:
        raise RuntimeError("vstack expects a non-empty TensorList")
    return _checked_cat(ts, 0, "vstack")


row_stack = vstack


def dstack(tensors, *, out=None):
    """Concatenated depth-wise (dim 2), after atleast_3d."""
    ts = atleast_3d(tuple(tensors)) if len(tensors) else ()
    if not ts:
        raise RuntimeError("dstack expects a non-empty TensorList")
    return _checked_cat(ts, 2, "dstack")


def column_stack(tensors, *, out=None):
    """0-d and 1-D tensors as columns, others as they are, concatenated along dim 1."""
    tensors = [_t(x) for x in tensors]
    if not tensors:
        raise RuntimeError("column_stack expects a non-empty TensorList")
    ts = [reshape(x, (x.numel(), 1)) if x.ndim <= 1 else x for x in tensors]
    return _checked_cat(ts, 1, "column_stack")


def broadcast_shapes(*shapes):
    """The shape the given shapes broadcast to (a torch.Size-like tuple)."""
    out = []
    norm = []
    for s in shapes:
        if isinstance(s, (_pyint, np.integer)) and not isinstance(s, _pybool):
            s = (s,)
        norm.append(tuple(_pyint(v) for v in s))
    nd = builtins.max((len(s) for s in norm), default=0)
    out = [1] * nd
    for i, s in enumerate(norm):
        for k in range(1, len(s) + 1):
            v = s[-k]
            if v < 0:
                raise RuntimeError(f"Trying to create tensor with negative dimension {v}: {list(s)}")
            if out[-k] == 1:
                out[-k] = v
            elif v != 1 and v != out[-k]:
                raise RuntimeError(f"Attempting to broadcast a dimension of length {v} at -{k}! "
                                   f"Mismatching argument at index {i} had {s}; but expected "
                                   f"shape should be broadcastable to {out}")
    return tuple(out)


def broadcast_tensors(*tensors):
    """The tensors expanded to their common shape (views)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    ts = [_t(x) for x in tensors]
    shape = ()
    for x in ts:
        try:
            shape = np.broadcast_shapes(shape, x.shape)
        except ValueError:
            raise _broadcast_error(shape, x.shape) from None
    return tuple(x if x.shape == shape else x.expand(*shape) for x in ts)


def meshgrid(*tensors, indexing=None):
    """Coordinate grids from 0-d/1-D tensors: ``indexing='ij'`` (the default, with torch's
    warning when not given) gives shape (len(t0), len(t1), ...), 'xy' swaps the first two."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass the "
                      "indexing argument.", UserWarning, stacklevel=2)
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: '
                           f'{indexing}')
    ts = [_t(x) for x in tensors]
    if not ts:
        raise RuntimeError("meshgrid expects a non-empty TensorList")
    for x in ts:
        if x.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but "
                               f"got: {x.ndim}D")
    ts = [reshape(x, (-1,)) if x.ndim == 0 else x for x in ts]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(x.shape[0] for x in ts)
    out = []
    for i, x in enumerate(ts):
        v = [1] * len(ts)
        v[i] = shape[i]
        out.append(reshape(x, tuple(v)).expand(*shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def rot90(input, k=1, dims=(0, 1)):
    """Rotated by 90 degrees k times in the plane of dims (from the first towards the second)."""
    x = _t(input)
    dims = list(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if x.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {x.ndim}")
    d0, d1 = _dim(dims[0], x.ndim), _dim(dims[1], x.ndim)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and "
                           f"dim1 = {d1}")
    k = k % 4
    if k == 1:
        return x.flip(d1).transpose(d0, d1)
    if k == 2:
        return x.flip((d0, d1))
    if k == 3:
        return x.flip(d0).transpose(d0, d1)
    return x.clone()


def fliplr(input):
    """Reversed along dim 1 (left/right)."""
    x = _t(input)
    if x.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return x.flip(1)


def flipud(input):
    """Reversed along dim 0 (up/down)."""
    x = _t(input)
    if x.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return x.flip(0)


def _tri_indices(name, lower, row, col, offset, dtype):
    dt = _dtype(dtype) or int64
    if dt.kind not in "iu":
        raise NotImplementedError(f"\"{name}\" not implemented for "
                                  f"'{'Float' if dt == np.float32 else dt.name}'")
    if row < 0:
        raise RuntimeError(f"row must be non-negative, got{row}")
    if col < 0:
        raise RuntimeError(f"col must be non-negative, got{col}")
    r, c = np.tril_indices(row, offset, col) if lower else np.triu_indices(row, offset, col)
    return _new(np.stack([r, c]).astype(dt).reshape(2, -1))


def tril_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """The (2, N) row/column indices of the lower triangle of a row x col matrix (row-major)."""
    return _tri_indices("tril_indices", True, row, col, offset, dtype)


def triu_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    """The (2, N) row/column indices of the upper triangle of a row x col matrix."""
    return _tri_indices("triu_indices", False, row, col, offset, dtype)


def unravel_index(indices, shape):
    """Flat indices into ``shape`` as a tuple of coordinate tensors (negative ones counted from
    the end, as torch's)."""
    if not isinstance(indices, Tensor):
        raise TypeError(f"expected 'indices' to be a Tensor, but got {type(indices).__name__}")
    a = indices._data
    if a.dtype.kind not in "iu":
        raise TypeError(f"expected 'indices' to be integer dtype, but got "
                        f"torch.{'float32' if a.dtype == np.float32 else a.dtype.name}")
    shape = (shape,) if isinstance(shape, (_pyint, np.integer)) else tuple(shape)
    for s in shape:
        if s < 0:
            raise ValueError("'shape' cannot have negative values, but got "
                             f"{tuple(shape)}")
    n = 1
    for s in shape:
        n *= s
    if np.any(a < -n) or np.any(a >= n):
        raise ValueError("'indices' must be in range [-{0}, {1}), but got {2}"
                         .format(n, n, "values out of range"))
    a = np.where(a < 0, a + n, a).astype(np.int64)
    out = []
    for s in reversed(shape):
        out.append(a % s if s else a)
        a = a // s if s else a
    return tuple(_new_on(o, indices) for o in reversed(out))


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """Matrices whose (offset) diagonals, in dims dim1 and dim2 of the result, are input's last
    dimension."""
    x = _t(input)
    xd = x._data
    nd = xd.ndim + 1
    d1, d2 = _dim(dim1, nd), _dim(dim2, nd)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = xd.shape[-1] + builtins.abs(offset) if xd.ndim else 1 + builtins.abs(offset)
    m = xd.shape[-1] if xd.ndim else 1
    rest = xd.shape[:-1]
    rows = np.arange(m) + builtins.max(-offset, 0)
    cols = np.arange(m) + builtins.max(offset, 0)
    # build with the two diagonal dims last, then move them into place
    base = np.zeros(rest + (n, n), dtype=xd.dtype)
    base[..., rows, cols] = xd.reshape(rest + (m,))
    order = [i for i in range(nd) if i not in (d1, d2)]
    perm = [None] * nd
    for i, o in enumerate(order):
        perm[o] = i
    perm[d1], perm[d2] = nd - 2, nd - 1
    out = np.ascontiguousarray(base.transpose(perm))
    inv = np.argsort(perm)

    def bw(g):
        gb = g.transpose(inv)
        return (np.ascontiguousarray(gb[..., rows, cols]).reshape(xd.shape),)
    return _mk(out, "DiagEmbedBackward0", bw, (x,), saves=False)


def kron(input, other):
    """The Kronecker product (shapes multiplied dimension by dimension, the shorter one padded
    with leading ones)."""
    a, b = _t(input), _t(other)
    nd = builtins.max(a.ndim, b.ndim)
    sa = (1,) * (nd - a.ndim) + a.shape
    sb = (1,) * (nd - b.ndim) + b.shape
    ai = reshape(a, tuple(v for s in sa for v in (s, 1)))
    bi = reshape(b, tuple(v for s in sb for v in (1, s)))
    return reshape(ai * bi, tuple(x * y for x, y in zip(sa, sb)))


def tensordot(a, b, dims=2, out=None):
    """Sum over the contracted dims: ``dims`` an int n (a's last n with b's first n), or two
    lists of dims."""
    a, b = _t(a), _t(b)
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, (_pyint, np.integer)):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > builtins.min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        da = list(range(-dims, 0))
        db = list(range(dims))
    else:
        da, db = dims
        da = [da] if isinstance(da, (_pyint, np.integer)) else list(da)
        db = [db] if isinstance(db, (_pyint, np.integer)) else list(db)
        if len(da) != len(db):
            raise RuntimeError("both dimension lists should have same length")
    for x, y in zip(da, db):
        if a.shape[x] != b.shape[y]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size "
                               f"{a.shape[x]} in dim {x} and second has size {b.shape[y]} in "
                               f"dim {y}")
    da = [_dim(d, a.ndim) for d in da]
    db = [_dim(d, b.ndim) for d in db]
    fa = [d for d in range(a.ndim) if d not in da]
    fb = [d for d in range(b.ndim) if d not in db]
    k = 1
    for d in da:
        k *= a.shape[d]
    am = reshape(a.permute(*(fa + da)), (-1, k) if a.numel() else
                 (int(np.prod([a.shape[d] for d in fa])), k))
    bm = reshape(b.permute(*(db + fb)), (k, -1) if b.numel() else
                 (k, int(np.prod([b.shape[d] for d in fb]))))
    return reshape(matmul(am, bm), tuple(a.shape[d] for d in fa) + tuple(b.shape[d] for d in fb))


def cross(input, other, dim=None, *, out=None):
    """The cross product of 3-vectors along dim (input and other broadcast together); without
    dim, the first dimension of size 3 (with torch's deprecation warning)."""
    a, b = _t(input), _t(other)
    a, b = broadcast_tensors(a, b)
    if dim is None:
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated.\nPlease "
                      "either pass the dim explicitly or simply use torch.linalg.cross.\nThe "
                      "default value of dim will change to agree with that of linalg.cross in a "
                      "future release.", UserWarning, stacklevel=2)
        found = [i for i, s in enumerate(a.shape) if s == 3]
        if not found:
            raise RuntimeError("no dimension of size 3 in input")
        d = found[0]
    else:
        d = _dim(dim, a.ndim)
        if a.shape[d] != 3:
            raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got "
                               f"{input.shape[d] if input.ndim == a.ndim else a.shape[d]} and "
                               f"{other.shape[d] if other.ndim == a.ndim else b.shape[d]}")
    i1 = _new(np.array([1, 2, 0], dtype=np.int64))
    i2 = _new(np.array([2, 0, 1], dtype=np.int64))
    return a.index_select(d, i1) * b.index_select(d, i2) - \
        a.index_select(d, i2) * b.index_select(d, i1)


def clone(input, *, memory_format=None):
    """A copy (gradients flow back to input)."""
    x = _t(input)
    return x.clone() if memory_format is None else x.clone(memory_format=memory_format)


def detach(input):
    """input outside the graph, sharing its data."""
    return _t(input).detach()


def t(input):
    """A tensor of <= 2 dimensions transposed."""
    x = _t(input)
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return x.t()


def ravel(input):
    """Flattened to 1-D (a copy when not contiguous)."""
    return _t(input).ravel()


def swapdims(input, dim0, dim1):
    """transpose's other name."""
    return _t(input).transpose(dim0, dim1)


def _attach():
    T = Tensor
    T.diag_embed = diag_embed
    T.kron = kron
    T.cross = cross
    T.rot90 = rot90
    T.fliplr = fliplr
    T.flipud = flipud
    from ._ops import outer
    T.outer = outer


_attach()
