"""Linear algebra: diagonals (diagonal, a view; diag; trace; fill_diagonal_), einsum, the
fused products addmm / baddbmm, dot / mv / inner, cosine_similarity and cdist (matmul, mm, bmm and
outer are pyddp._tensor._ops').

Each function follows torch 2.13 on the same inputs (values, dtypes, aliasing, errors; the tests
compare them with torch); the Tensor methods of the same names are attached at the end.
"""
from __future__ import annotations

import builtins
import string

import numpy as np

from ._args import _dim, _t
from ._core import Tensor, _check_inplace, _mk
from ._dtypes import _pyint
from ._ops import clamp, sqrt, sum
from ._reductions import norm

__all__ = ["diag", "diagonal", "trace", "einsum", "addmm", "baddbmm", "dot", "mv", "inner",
           "cosine_similarity", "cdist"]


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


def _attach():
    for name in ("diagonal", "diag", "trace", "addmm", "baddbmm", "dot", "mv", "inner"):
        setattr(Tensor, name, globals()[name])
    Tensor.fill_diagonal_ = fill_diagonal_


_attach()
