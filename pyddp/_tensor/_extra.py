"""More of torch's tensor API that training scripts use: comparisons as functions, topk / sort /
argsort, gather / scatter / index_select, diag / diagonal (a view) / fill_diagonal_, einsum,
multinomial, cumulative and product reductions, norms, views (unflatten, as_strided, narrow,
select), flip / roll, and the in-place ``_`` variants of the elementwise ops.

Each function follows torch 2.13 on the same inputs (values, dtypes, aliasing, errors; the tests
compare them with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import builtins
import string
from collections import namedtuple

import numpy as np

from .._random import _np_gen
from ._core import Tensor, _as_t, _binop_arrays, _check_inplace, _mk, _new, _new_on, _red
from ._dtypes import _dtype, _is_float_dtype, _pyint, int64
from ._grad_mode import _st
from ._ops import abs, clamp, pow, sqrt, sum

__all__ = ["eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal",
           "not_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "topk", "sort",
           "argsort", "gather", "scatter", "scatter_add", "index_select", "masked_select",
           "take_along_dim", "diag", "diagonal", "trace", "einsum", "multinomial", "cumsum",
           "cumprod", "prod", "norm", "unflatten", "as_strided", "narrow", "select", "flip",
           "roll", "nonzero", "count_nonzero", "isclose", "unbind", "masked_fill", "clamp_min",
           "clamp_max", "addmm", "baddbmm", "lerp", "erf", "exp2", "log2", "log10", "sinh",
           "cosh", "tan", "asin", "acos", "atan", "atan2", "frac", "trunc", "fmod", "remainder",
           "floor_divide", "true_divide", "reciprocal", "negative", "cosine_similarity",
           "cdist", "broadcast_to", "diff", "movedim", "moveaxis", "dot", "mv", "inner",
           "addcmul", "addcdiv", "nan_to_num", "nansum", "nanmean", "repeat_interleave", "tile",
           "unique", "logaddexp", "logit", "median", "take", "tensor_split", "bernoulli"]

_TopK = namedtuple("topk", ["values", "indices"])
_Sort = namedtuple("sort", ["values", "indices"])


def _t(x):
    return x if isinstance(x, Tensor) else _as_t(x)


def _dim(dim, ndim, name="dim"):
    if isinstance(dim, builtins.bool) or not isinstance(dim, (_pyint, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return _pyint(dim) % n


# ----------------------------------------------------------------------------------------------
# comparisons and logic as functions (the methods exist on Tensor)

def _cmp(f):
    def op(input, other, *, out=None):
        a = _t(input)
        ad, bd = _binop_arrays(a, other)
        return _new_on(f(ad, bd), a, other)
    op.__name__ = f.__name__
    op.__doc__ = f"Elementwise {f.__name__} (a bool tensor)."
    return op


eq = _cmp(np.equal)
ne = not_equal = _cmp(np.not_equal)
lt = less = _cmp(np.less)
le = less_equal = _cmp(np.less_equal)
gt = greater = _cmp(np.greater)
ge = greater_equal = _cmp(np.greater_equal)
logical_and = _cmp(np.logical_and)
logical_or = _cmp(np.logical_or)
logical_xor = _cmp(np.logical_xor)


def logical_not(input):
    """Elementwise not (bool)."""
    a = _t(input)
    return _new_on(np.logical_not(a._data), a)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Elementwise |input - other| <= atol + rtol * |other| (bool)."""
    a = _t(input)
    ad, bd = _binop_arrays(a, other)
    return _new_on(np.isclose(ad, bd, rtol=rtol, atol=atol, equal_nan=equal_nan), a)


# ----------------------------------------------------------------------------------------------
# sorting

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


# ----------------------------------------------------------------------------------------------
# indexing

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


def count_nonzero(input, dim=None):
    """The number of non-zero elements (along dim)."""
    x = _t(input)
    return _new_on(np.asarray(np.count_nonzero(x._data, axis=dim), dtype=int64), x)


# ----------------------------------------------------------------------------------------------
# diagonals

def diagonal(input, offset=0, dim1=0, dim2=1):
    """The diagonal of dims dim1, dim2 as the last dimension: a view (writes reach input)."""
    x = _t(input)
    xd = x._data
    if xd.ndim < 2:
        raise RuntimeError(f"diagonal dimensions requires ndim larger than 1, but got {xd.ndim}")
    d1, d2 = _dim(dim1, xd.ndim, "dim1"), _dim(dim2, xd.ndim, "dim2")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    offset = _pyint(offset)
    n1, n2 = xd.shape[d1], xd.shape[d2]
    if offset >= 0:
        n = builtins.max(builtins.min(n1, n2 - offset), 0)
        start = [0] * xd.ndim
        start[d2] = builtins.min(offset, n2)
    else:
        n = builtins.max(builtins.min(n1 + offset, n2), 0)
        start = [0] * xd.ndim
        start[d1] = builtins.min(-offset, n1)
    base = xd[tuple(slice(s, None) for s in start)]
    keep = [i for i in range(xd.ndim) if i not in (d1, d2)]
    shape = tuple(xd.shape[i] for i in keep) + (n,)
    strides = tuple(xd.strides[i] for i in keep) + (xd.strides[d1] + xd.strides[d2],)
    out = np.lib.stride_tricks.as_strided(base, shape, strides, writeable=xd.flags.writeable) \
        if n else np.empty(shape, dtype=xd.dtype)
    ishape = xd.shape

    def bw(g):
        gx = np.zeros(ishape, dtype=g.dtype)
        if n:
            gb = gx[tuple(slice(s, None) for s in start)]
            np.lib.stride_tricks.as_strided(gb, shape, tuple(gx.strides[i] for i in keep) +
                                            (gx.strides[d1] + gx.strides[d2],),
                                            writeable=True)[...] = g
        return (gx,)
    return _mk(out, "DiagonalBackward0", bw, (x,), saves=False)


def diag(input, diagonal=0):
    """1-D input: a matrix with it on the given diagonal; 2-D input: that diagonal (a copy)."""
    x = _t(input)
    xd = x._data
    k = _pyint(diagonal)
    if xd.ndim == 1:
        n = xd.shape[0] + builtins.abs(k)
        out = np.zeros((n, n), dtype=xd.dtype)
        out[...] = np.diag(xd, k)

        def bw(g):
            return (np.diagonal(g, k).copy(),)
        return _mk(out, "DiagEmbedBackward0", bw, (x,), saves=False)
    if xd.ndim != 2:
        raise RuntimeError("diag(): Supports 1D or 2D tensors. Got " f"{xd.ndim}D")
    return globals()["diagonal"](x, k).clone()


def trace(input):
    """The sum of the main diagonal of a 2-D tensor."""
    x = _t(input)
    if x._data.ndim != 2:
        raise RuntimeError("trace: expected a matrix")
    return sum(diagonal(x))


def fill_diagonal_(self, fill_value, wrap=False):
    """Fill the main diagonal (all dims of equal length for ndim > 2) in place."""
    _check_inplace(self)
    d = self._data
    if d.ndim < 2:
        raise RuntimeError("dimensions must larger than 1")
    if d.ndim > 2 and len(set(d.shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    np.fill_diagonal(d, fill_value, wrap=wrap)
    return self


# ----------------------------------------------------------------------------------------------
# einsum

def _einsum_parse(eq, arrays):
    eq = eq.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    ins = lhs.split(",")
    if len(ins) != len(arrays):
        raise RuntimeError("einsum(): more operands were provided than specified in the "
                           "equation" if len(arrays) > len(ins) else
                           "einsum(): fewer operands were provided than specified in the equation")
    used = set(eq)
    free = [c for c in string.ascii_letters if c not in used]
    ell = 0
    for s, a in zip(ins, arrays):
        if "..." in s:
            ell = builtins.max(ell, a.ndim - (len(s) - 3))
    ell_letters = "".join(free[:ell])
    res = []
    for s, a in zip(ins, arrays):
        if "..." in s:
            k = a.ndim - (len(s) - 3)
            s = s.replace("...", ell_letters[ell - k:])
        if len(s) != a.ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(s)}) "
                               f"does not match the number of dimensions ({a.ndim}) for operand "
                               f"{len(res)}" + ("" if "..." in s else " and no ellipsis was "
                                                "given"))
        res.append(s)
    if out is None:
        counts = {}
        for s in res:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        out = ell_letters + "".join(sorted(c for c, n in counts.items()
                                           if n == 1 and c not in ell_letters))
    else:
        out = out.replace("...", ell_letters)
    return res, out


def einsum(equation, *operands):
    """Einstein summation (torch.einsum), differentiable in every operand."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    ts = [_t(o) for o in operands]
    arrays = [t._data for t in ts]
    ins, out = _einsum_parse(equation, arrays)
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dt:
            raise RuntimeError(f"expected scalar type {dt} but found {a.dtype}")
    res = np.einsum(",".join(ins) + "->" + out, *arrays, optimize=len(arrays) > 2)
    res = np.asarray(res, dtype=dt)

    def bw(g):
        grads = []
        for i, (s, a) in enumerate(zip(ins, arrays)):
            if not ts[i]._requires_grad:
                grads.append(None)
                continue
            others = [(ins[j], arrays[j]) for j in range(len(arrays)) if j != i]
            avail = set(out).union(*[set(o[0]) for o in others]) if others else set(out)
            uniq = "".join(dict.fromkeys(s))
            target = "".join(c for c in uniq if c in avail)
            expr = ",".join([out] + [o[0] for o in others]) + "->" + target
            r = np.einsum(expr, g, *[o[1] for o in others])
            # letters only in this operand were summed: broadcast back; repeated letters: diagonal
            sizes = {c: a.shape[s.index(c)] for c in uniq}
            full = np.broadcast_to(
                r.reshape([sizes[c] if c in target else 1 for c in uniq]).transpose(
                    [uniq.index(c) for c in uniq]), [sizes[c] for c in uniq])
            if uniq == s:
                grads.append(np.ascontiguousarray(full).astype(a.dtype, copy=False))
            else:
                gx = np.zeros(a.shape, dtype=a.dtype)
                np.einsum(s + "->" + uniq, gx)[...] = full   # writable diagonal view
                grads.append(gx)
        return tuple(grads)
    return _mk(res, "EinsumBackward0", bw, tuple(ts))


# ----------------------------------------------------------------------------------------------
# sampling

def multinomial(input, num_samples, replacement=False, *, generator=None):
    """num_samples indices drawn from each row's (unnormalised) probabilities."""
    x = _t(input)
    p = np.asarray(x._data, dtype=np.float64)
    if p.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not _is_float_dtype(x._data.dtype):
        raise RuntimeError("multinomial only supports floating-point dtypes for input")
    n = _pyint(num_samples)
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    rows = p.reshape(-1, p.shape[-1])
    if not replacement and n > rows.shape[1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if (rows < 0).any() or not np.isfinite(rows).all():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    g = _np_gen(generator)
    out = np.empty((rows.shape[0], n), dtype=int64)
    for r, w in enumerate(rows):
        s = w.sum()
        if s <= 0:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        if replacement:
            out[r] = g.choice(w.size, size=n, replace=True, p=w / s)
        else:   # torch's way: the n smallest exponential(1) / w (zero weights come last)
            with np.errstate(divide="ignore"):
                key = g.exponential(size=w.size) / w
            out[r] = np.argsort(key, kind="stable")[:n]
    return _new_on(out.reshape(p.shape[:-1] + (n,)), x)


# ----------------------------------------------------------------------------------------------
# reductions and norms

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


# ----------------------------------------------------------------------------------------------
# views

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


def masked_fill(input, mask, value):
    """Elements where mask is True replaced by value."""
    return _t(input).masked_fill(mask, value)


# ----------------------------------------------------------------------------------------------
# more elementwise math

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


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2)."""
    r = mat1 @ mat2
    if alpha != 1:
        r = r * alpha
    return (input if beta == 1 else input * beta) + r if beta != 0 else r


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * (batch1 @ batch2), batched."""
    return addmm(input, batch1, batch2, beta=beta, alpha=alpha)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along dim, norms clamped to eps
    (torch.cosine_similarity; pyddp.nn.functional.cosine_similarity is this)."""
    n1 = sqrt(sum(x1 * x1, dim, True))
    n2 = sqrt(sum(x2 * x2, dim, True))
    return sum((x1 / clamp(n1, min=eps)) * (x2 / clamp(n2, min=eps)), dim)


def cdist(x1, x2, p=2.0):
    """Pairwise p-distances between the rows of x1 and x2 (batched)."""
    d = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return norm(d, p, dim=-1)


# ----------------------------------------------------------------------------------------------
# more of what training code calls

def dot(input, other):
    """Inner product of two 1-D tensors."""
    a, b = _t(input), _t(other)
    if a._data.ndim != 1 or b._data.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a._data.ndim}D and {b._data.ndim}D "
                           "tensors")
    return (a * b).sum()


def mv(input, vec):
    """Matrix-vector product."""
    return _t(input) @ vec


def inner(input, other):
    """Sum over the last dimensions of the product (dot for 1-D tensors)."""
    a, b = _t(input), _t(other)
    if a.ndim == 1 and b.ndim == 1:
        return dot(a, b)
    return a @ b.transpose(-1, -2) if b.ndim > 1 else a @ b


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


def take(input, index):
    """input's elements at the flat indices ``index`` (shaped like index)."""
    x = _t(input).reshape(-1)
    idx = _index_arg(index, "take")
    n = x.shape[0]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"out of range: tried to access index {_pyint(idx.max())} on a tensor "
                         f"of {n} elements.")
    return x[idx % builtins.max(n, 1)]


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


def bernoulli(input, p=None, *, generator=None):
    """0/1 draws with probability input (or p)."""
    x = _t(input)
    prob = x._data if p is None else np.broadcast_to(np.asarray(p), x.shape)
    g = _np_gen(generator)
    return _new_on((g.random(x.shape) < prob).astype(x._data.dtype), x)


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


# ----------------------------------------------------------------------------------------------
# Tensor methods: the functions above, and in-place ``_`` variants

def _inplace_of(fname):
    def m(self, *args, **kwargs):
        _check_inplace(self)
        r = getattr(self, fname)(*args, **kwargs)
        if r._requires_grad and _st.grad:
            self._data = r._data.astype(self._data.dtype, copy=False)
            self.grad_fn, self._requires_grad = r.grad_fn, True
            return self
        if r._data.dtype != self._data.dtype and not np.can_cast(r._data.dtype,
                                                                   self._data.dtype, "same_kind"):
            raise RuntimeError(f"result type {str(r._data.dtype).capitalize()} can't be cast to "
                               f"the desired output type {str(self._data.dtype).capitalize()}")
        np.copyto(self._data, np.broadcast_to(r._data, self._data.shape), casting="unsafe")
        return self
    m.__name__ = fname + "_"
    m.__doc__ = f"In-place {fname}; returns self."
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


def _where_method(self, condition, other):
    from ._ops import where
    return where(condition, self, _as_t(other, self) if not isinstance(other, Tensor) else other)


def _attach():
    T = Tensor
    for name in ("topk", "sort", "argsort", "gather", "index_select", "masked_select",
                 "take_along_dim", "nonzero", "count_nonzero", "diagonal", "diag", "trace",
                 "cumsum", "cumprod", "prod", "unflatten", "as_strided", "flip", "roll",
                 "isclose", "erf", "exp2", "log2", "log10", "sinh", "cosh", "tan", "asin",
                 "acos", "atan", "atan2", "frac", "trunc", "fmod", "remainder", "floor_divide",
                 "true_divide", "negative", "clamp_min", "clamp_max", "lerp", "addmm", "baddbmm",
                 "logical_and", "logical_or", "logical_xor", "diff", "multinomial",
                 "greater", "greater_equal", "less", "less_equal", "not_equal", "narrow",
                 "select", "unbind", "broadcast_to"):
        setattr(T, name, globals()[name])
    for name in ("dot", "mv", "inner", "addcmul", "addcdiv", "nan_to_num", "nansum", "nanmean",
                 "repeat_interleave", "tile", "unique", "logaddexp", "logit", "median", "take",
                 "tensor_split", "bernoulli"):
        setattr(T, name, globals()[name])
    for op in ("add", "fill", "copy"):
        meth = _index_method(op)
        meth.__name__ = f"index_{op}"
        meth.__doc__ = f"A copy with source {'added' if op == 'add' else 'written'} at index " \
                       "along dim."
        setattr(T, f"index_{op}", meth)
        setattr(T, f"index_{op}_", _index_inplace(meth))
    T.where = lambda self, condition, other: _where_method(self, condition, other)
    T.where.__doc__ = "self where condition is True, else other (torch.where(condition, self, other))."
    T.ndimension = T.dim
    T.is_cpu = property(lambda self: self._dev.type == "cpu", doc="Whether on the CPU.")
    T.is_complex = lambda self: self._data.dtype.kind == "c"
    T.is_complex.__doc__ = "Whether the dtype is complex."
    T.is_signed = lambda self: self._data.dtype.kind in "ifc"
    T.is_signed.__doc__ = "Whether the dtype is signed."
    T.isinf = lambda self: _new_on(np.isinf(self._data), self)
    T.isinf.__doc__ = "Elementwise infinity test (bool)."
    T.allclose = lambda self, other, rtol=1e-05, atol=1e-08, equal_nan=False: bool(np.allclose(
        self._data, other._data if isinstance(other, Tensor) else other, rtol, atol, equal_nan))
    T.allclose.__doc__ = "Whether all elements are close (torch.allclose)."
    T.short = lambda self: self.to(np.int16)
    T.short.__doc__ = "int16 version."
    T.byte = lambda self: self.to(np.uint8)
    T.byte.__doc__ = "uint8 version."
    T.char = lambda self: self.to(np.int8)
    T.char.__doc__ = "int8 version."
    T.unfold = _unfold
    T.arctan2 = atan2
    T.swapaxes = T.swapdims = T.transpose
    T.movedim = T.moveaxis = movedim
    T.absolute = T.abs
    T.multiply = T.mul
    T.divide = T.div
    T.subtract = T.sub
    T.fill_diagonal_ = fill_diagonal_
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

    def norm_method(self, p="fro", dim=None, keepdim=False, dtype=None):
        """The p-norm (2 by default) over dim (all elements when None)."""
        return norm(self, p, dim, keepdim, dtype)
    T.norm = norm_method
    for fname in ("sin", "cos", "tan", "tanh", "sigmoid", "relu", "log", "log1p", "log2",
                  "log10", "expm1", "rsqrt", "square", "reciprocal", "sign", "floor", "ceil",
                  "round", "trunc", "frac", "erf", "exp2", "sinh", "cosh", "asin", "acos",
                  "atan", "pow", "fmod", "remainder", "clamp_min", "clamp_max", "lerp",
                  "logical_not", "logical_and", "logical_or", "logical_xor", "atan2",
                  "floor_divide", "addmm", "baddbmm", "cumsum", "cumprod", "t", "transpose",
                  "squeeze", "unsqueeze", "eq", "ne", "lt", "le", "gt", "ge", "masked_fill",
                  "tril", "triu", "maximum", "minimum", "negative", "true_divide", "multiply",
                  "divide", "subtract", "where"):
        if hasattr(T, fname) and not hasattr(T, fname + "_"):
            if fname in ("t", "transpose", "squeeze", "unsqueeze"):
                continue   # shape in-place variants change the tensor's own view: below
            setattr(T, fname + "_", _inplace_of(fname))

    def _shape_inplace(fname):
        def m(self, *args, **kwargs):
            r = getattr(self, fname)(*args, **kwargs)
            self._data = r._data     # same memory, new view of it
            if r.grad_fn is not None:
                self.grad_fn = r.grad_fn
            return self
        m.__name__ = fname + "_"
        m.__doc__ = f"In-place {fname} (this tensor becomes the view); returns self."
        return m
    for fname in ("t", "transpose", "squeeze", "unsqueeze"):
        if not hasattr(T, fname + "_"):
            setattr(T, fname + "_", _shape_inplace(fname))


_attach()
