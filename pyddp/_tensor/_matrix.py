"""Matrix functions with gradients (batched over leading dimensions, NumPy's LAPACK):
inverse, det, slogdet, logdet, cholesky, pinverse, matrix_power.

Errors follow torch 2.13's texts (a singular or non-positive-definite input raises
``pyddp.LinAlgError``, a RuntimeError as torch's ``torch._C._LinAlgError``); gradients are
torch's formulas (det's at a singular matrix is torch's value, g * det * A^-T with a
pseudo-inverse, i.e. zero at det 0).
"""
from __future__ import annotations

import warnings
from collections import namedtuple

import numpy as np

from ._args import _t
from ._core import Tensor, _mk
from ._dtypes import _is_float_dtype, _HALFS

__all__ = ["inverse", "det", "slogdet", "logdet", "cholesky", "pinverse", "matrix_power"]

_SlogDet = namedtuple("slogdet", ["sign", "logabsdet"])


class LinAlgError(RuntimeError):
    """A linear-algebra function's input was singular or not positive-definite (torch's
    torch._C._LinAlgError, also a RuntimeError)."""


def _long(dt):
    return {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool", "float16": "Half"}.get(np.dtype(dt).name, np.dtype(dt).name)


def _square(x, name):
    a = x._data
    if a.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor A must have at least 2 dimensions.")
    if not _is_float_dtype(a.dtype) or a.dtype in _HALFS:
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got "
                           f"{_long(a.dtype)}")
    if a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"{name}: A must be batches of square matrices, but they are "
                           f"{a.shape[-2]} by {a.shape[-1]} matrices")
    return a


def _mT(a):
    return np.swapaxes(a, -1, -2)


def _first_zero_pivot(a):
    """The 1-based index of the first zero pivot of LU with partial pivoting (torch's error
    names it), for one matrix."""
    u = a.astype(np.float64).copy()
    n = u.shape[-1]
    for k in range(n):
        p = k + int(np.argmax(np.abs(u[k:, k])))
        if u[p, k] == 0:
            return k + 1
        u[[k, p]] = u[[p, k]]
        u[k + 1:] -= np.outer(u[k + 1:, k] / u[k, k], u[k])
    return n


def _inv(a, name):
    try:
        return np.linalg.inv(a)
    except np.linalg.LinAlgError:
        flat = a.reshape((-1,) + a.shape[-2:])
        for i, m in enumerate(flat):
            if np.linalg.matrix_rank(m) < m.shape[-1] or not np.all(np.isfinite(m)):
                k = _first_zero_pivot(m)
                where = f"(Batch element {i}): " if a.ndim > 2 else ""
                raise LinAlgError(f"{name}: {where}The diagonal element {k} is zero, the "
                                  "inversion could not be completed because the input matrix "
                                  "is singular.") from None
        raise


def inverse(input, *, out=None):
    """The inverse of each square matrix."""
    x = _t(input)
    a = _square(x, "linalg.inv")
    y = _inv(a, "linalg.inv").astype(a.dtype)

    def bw(g):
        yt = _mT(y)
        return (-(yt @ g @ yt),)
    return _mk(y, "LinalgInvExBackward0", bw, (x,), saves=False)


def _inv_t_or_pinv(a):
    """A^-T, or the pseudo-inverse's transpose where A is singular (finite, as torch's
    backward's values)."""
    try:
        return _mT(np.linalg.inv(a))
    except np.linalg.LinAlgError:
        return _mT(np.linalg.pinv(a))


def det(input):
    """The determinant of each square matrix."""
    x = _square(_t(input), "linalg.det")
    xt = _t(input)
    d = np.linalg.det(x).astype(x.dtype)

    def bw(g):
        return ((np.asarray(g * d)[..., None, None] * _inv_t_or_pinv(x)).astype(g.dtype),)
    return _mk(np.asarray(d), "LinalgDetBackward0", bw, (xt,), saves=False)


def slogdet(input):
    """(sign, log|det|) of each square matrix; log|det| is -inf for a singular one."""
    xt = _t(input)
    x = _square(xt, "linalg.slogdet")
    with np.errstate(divide="ignore"):
        s, ld = np.linalg.slogdet(x)
    s, ld = np.asarray(s, x.dtype), np.asarray(ld, x.dtype)

    def bw(g):
        return ((np.asarray(g)[..., None, None] * _inv_t_or_pinv(x)).astype(g.dtype),)
    # the sign is recorded too (torch's is, for complex input), with a zero gradient
    sign = _mk(s, "LinalgSlogdetBackward0", lambda g: (np.zeros(x.shape, g.dtype),), (xt,),
               saves=False)
    return _SlogDet(sign, _mk(ld, "LinalgSlogdetBackward0", bw, (xt,), saves=False))


def logdet(input):
    """log(det) of each square matrix: NaN where det < 0, -inf where det is 0."""
    xt = _t(input)
    x = _square(xt, "linalg.slogdet")
    with np.errstate(divide="ignore"):
        s, ld = np.linalg.slogdet(x)
    out = np.where(s < 0, np.nan, np.where(s == 0, -np.inf, ld)).astype(x.dtype)

    def bw(g):
        return ((np.asarray(g)[..., None, None] * _inv_t_or_pinv(x)).astype(g.dtype),)
    return _mk(np.asarray(out), "LogdetBackward0", bw, (xt,), saves=False)


_CHOLESKY_WARNED = []


def cholesky(input, upper=False, *, out=None):
    """The Cholesky factor of each symmetric positive-definite matrix: lower L with
    A = L L^T (upper=True: U = L^T).  Deprecated in torch for torch.linalg.cholesky; warns
    once, as torch's."""
    if not _CHOLESKY_WARNED:
        _CHOLESKY_WARNED.append(True)
        warnings.warn("torch.cholesky is deprecated in favor of torch.linalg.cholesky and will "
                      "be removed in a future PyTorch release.\nL = torch.cholesky(A)\nshould be "
                      "replaced with\nL = torch.linalg.cholesky(A)\nand\nU = torch.cholesky(A, "
                      "upper=True)\nshould be replaced with\nU = torch.linalg.cholesky(A).mH\n"
                      "This transform will produce equivalent results for all valid (symmetric "
                      "positive definite) inputs.", UserWarning, stacklevel=2)
    xt = _t(input)
    a = _square(xt, "cholesky")
    try:
        low = np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        flat = a.reshape((-1,) + a.shape[-2:])
        for i, m in enumerate(flat):
            for k in range(1, m.shape[-1] + 1):
                sub = m[:k, :k]
                try:
                    np.linalg.cholesky(sub)
                except np.linalg.LinAlgError:
                    where = f"(Batch element {i}): " if a.ndim > 2 else ""
                    raise LinAlgError(
                        f"cholesky: {where}The factorization could not be completed because the "
                        f"input is not positive-definite (the leading minor of order {k} is not "
                        "positive-definite).") from None
        raise
    low = low.astype(a.dtype)
    out_ = _mT(low).copy() if upper else low

    def bw(g):
        gl = _mT(g) if upper else g
        n = low.shape[-1]
        phi = np.tril(_mT(low) @ gl)
        phi[..., range(n), range(n)] *= 0.5
        linv = np.linalg.inv(low)
        s = _mT(linv) @ phi @ linv
        return ((0.5 * (s + _mT(s))).astype(g.dtype),)
    return _mk(out_, "CholeskyBackward0", bw, (xt,), saves=False)


def pinverse(input, rcond=1e-15):
    """The Moore-Penrose pseudo-inverse of each matrix (singular values below rcond times the
    largest are dropped)."""
    xt = _t(input)
    a = xt._data
    if a.ndim < 2 or not _is_float_dtype(a.dtype) or a.dtype in _HALFS:
        raise RuntimeError(f"linalg.pinv({_long(a.dtype)}{{{list(a.shape)}}}): expected a tensor "
                           "with 2 or more dimensions of float, double, cfloat or cdouble types")
    p = np.linalg.pinv(a, rcond=rcond).astype(a.dtype) if a.size else \
        np.zeros(a.shape[:-2] + (a.shape[-1], a.shape[-2]), a.dtype)

    def bw(g):
        m, n = a.shape[-2], a.shape[-1]
        ph, gh = _mT(p), _mT(g)
        if m <= n:
            k = gh @ p
            kph = k @ ph
            r = -_mT(p @ k) + kph - (a @ p) @ kph + (ph @ p) @ (gh - k @ a)
        else:
            k = p @ gh
            phk = ph @ k
            r = -_mT(k @ p) + (gh - a @ k) @ p @ ph + phk - phk @ p @ a
        return (r.astype(g.dtype),)
    return _mk(p, "PinverseBackward0", bw, (xt,), saves=False)


def matrix_power(input, n):
    """The n-th power of each square matrix (n < 0: of its inverse; n = 0: the identity)."""
    from ._ops import matmul
    xt = _t(input)
    a = xt._data
    if a.ndim < 2:
        raise RuntimeError("linalg.matrix_power: The input tensor A must have at least 2 "
                           "dimensions.")
    if a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, but they "
                           f"are {a.shape[-2]} by {a.shape[-1]} matrices")
    if n == 0:
        eye = np.broadcast_to(np.eye(a.shape[-1], dtype=a.dtype), a.shape).copy()
        return _mk(eye, "LinalgMatrixPowerBackward0", lambda g: (np.zeros_like(g),), (xt,),
                   saves=False)
    base = inverse(xt) if n < 0 else xt
    k = abs(n)
    result, sq = None, base
    while k:
        if k & 1:
            result = sq if result is None else matmul(result, sq)
        k >>= 1
        if k:
            sq = matmul(sq, sq)
    return result.clone() if result is xt else result


def _attach():
    T = Tensor
    for name in ("inverse", "det", "slogdet", "logdet", "cholesky", "pinverse", "matrix_power"):
        setattr(T, name, globals()[name])


_attach()
