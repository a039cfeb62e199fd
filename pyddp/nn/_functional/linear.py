"""Linear maps: linear (one BLAS matmul; the weight gradient written straight into DDP's bucket
when it has claimed it) and bilinear.
"""
from __future__ import annotations

import numpy as np

from ..._tensor import Tensor
from ..._tensor import _core
from ..._tensor._core import _mk, _mm, _mm32, _mm_bf16, _to
from ..._tensor._dtypes import _F32, _HALFS, bfloat16
from ..._tensor._grad_mode import _st
from .._argcheck import require_tensors as _require_tensors
from ._common import _low

__all__ = ["linear", "bilinear"]


def linear(input, weight, bias=None):
    """input @ weight.T + bias (weight: (out_features, in_features))."""
    if _st.autocast is not None:
        input, weight, bias = _low(input), _low(weight), _low(bias)
    xd, wd = input._data, weight._data
    if xd.dtype != wd.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {xd.dtype} and "
                           f"{wd.dtype}")
    if xd.dtype in _HALFS:
        return _linear_half(input, weight, bias)
    out = _mm(xd, wd.T)
    bd = None
    if bias is not None:
        bd = bias._data
        out += bd
    rx, rw = input._requires_grad, weight._requires_grad
    rb = bias is not None and bias._requires_grad
    if not (_st.grad and (rx or rw or rb)):
        return Tensor._wrap(out)
    O = wd.shape[0]

    def bw(g):
        gx = gw = gb = None
        if rx:
            gx = _mm(g, wd)
        if rw or rb:
            g2 = g.reshape(-1, O)
            if rw:
                x2 = xd.reshape(-1, xd.shape[-1])
                dest = None if g2.dtype in _HALFS else \
                    _core._claim_grad_dest(weight, wd.shape, g2.dtype)
                gw = _mm(g2.T, x2) if dest is None else np.matmul(g2.T, x2, out=dest)
            if rb:
                dest = None if g2.dtype in _HALFS else \
                    _core._claim_grad_dest(bias, bd.shape, g2.dtype)
                if dest is not None:
                    gb = g2.sum(0, out=dest)
                else:
                    gb = g2.sum(0, dtype=np.float32 if g2.dtype in _HALFS else None) \
                        .astype(bd.dtype, copy=False)
        return gx, gw, gb
    return _mk(out, "AddmmBackward0", bw, (input, weight, bias))


def _linear_half(input, weight, bias):
    """linear on float16/bfloat16: the operands widened (exactly) to float32 once, one float32
    BLAS product with the bias added in float32, rounded once to the half type (torch's CPU addmm
    accumulates in float32 and rounds once too).  Backward reuses the widened operands and widens
    the incoming gradient once."""
    dt = input._data.dtype
    if dt == bfloat16:
        out = _linear_bf16(input, weight, bias)
        if out is not None:
            return out
    x32, w32 = _to(input._data, _F32), _to(weight._data, _F32)
    with np.errstate(over="ignore", invalid="ignore"):
        o32 = np.matmul(x32, w32.T)
        if bias is not None:
            o32 += _to(bias._data, _F32)
    out = _to(o32, dt)
    rx, rw = input._requires_grad, weight._requires_grad
    rb = bias is not None and bias._requires_grad
    if not (_st.grad and (rx or rw or rb)):
        return Tensor._wrap(out)
    O = w32.shape[0]

    def bw(g):
        gx = gw = gb = None
        g32 = _to(g, _F32)
        with np.errstate(over="ignore", invalid="ignore"):
            if rx:
                gx = _to(np.matmul(g32, w32), dt)
            g2 = g32.reshape(-1, O)
            if rw:
                gw = _to(np.matmul(g2.T, x32.reshape(-1, x32.shape[-1])), dt)
            if rb:
                gb = _to(g2.sum(0), bias._data.dtype)
        return gx, gw, gb
    return _mk(out, "AddmmBackward0", bw, (input, weight, bias))


def _linear_bf16(input, weight, bias):
    """linear on bfloat16 by pyddp._C.gemm_bf16 (bfloat16 products, float32 sums, the bias added
    in float32, one rounding: _linear_half's numerics without widening the operands), and its
    backward the same way on the bfloat16 gradient; None where the native kernel does not apply
    (no AVX512-BF16, a small product), for _linear_half's float32 BLAS path."""
    xd, wd = input._data, weight._data
    if xd.ndim == 0 or wd.ndim != 2:
        return None
    x2 = xd.reshape(-1, xd.shape[-1])
    b32 = None if bias is None else np.ascontiguousarray(_to(bias._data, _F32))
    out = _mm_bf16(x2, wd.T, b32)
    if out is None:
        return None
    O = wd.shape[0]
    out = out.reshape(xd.shape[:-1] + (O,))
    rx, rw = input._requires_grad, weight._requires_grad
    rb = bias is not None and bias._requires_grad
    if not (_st.grad and (rx or rw or rb)):
        return Tensor._wrap(out)

    def bw(g):
        gx = gw = gb = None
        g2 = g.reshape(-1, O)
        # a gradient of another dtype is multiplied as it comes, widened to float32
        mm = _mm if g.dtype == bfloat16 else (lambda p, q: _to(_mm32(p, q), bfloat16))
        with np.errstate(over="ignore", invalid="ignore"):
            if rx:
                gx = mm(g2, wd).reshape(xd.shape)
            if rw:
                gw = mm(g2.T, x2)
            if rb:
                # widened in one C pass, summed in float32 (a reduction with dtype=float32
                # over bfloat16 casts through ml_dtypes' scalar loop)
                gb = _to(_to(g2, _F32).sum(0), bias._data.dtype)
        return gx, gw, gb
    return _mk(out, "AddmmBackward0", bw, (input, weight, bias))


def bilinear(input1, input2, weight, bias=None):
    """y = x1^T A x2 + b (weight: (out, in1, in2))."""
    y = ((input1.unsqueeze(-2).unsqueeze(-2) @ weight) .squeeze(-2) * input2.unsqueeze(-2)).sum(-1)
    return y + bias if bias is not None else y


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
