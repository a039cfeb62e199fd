"""Convolution: conv2d as im2col (a strided view copied once) plus one BLAS matmul; its backward is
two matmuls and a col2im that adds kh*kw strided slices.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..._tensor import Tensor
from ..._tensor._core import _mk
from ..._tensor._dtypes import _F32, _HALFS
from ..._tensor._grad_mode import _st
from .._argcheck import require_tensors as _require_tensors
from ._common import _low, _pair

__all__ = ["conv2d"]


def _conv_out(n, k, s, p_lo, p_hi, d, ceil=False):
    eff = d * (k - 1) + 1
    span = n + p_lo + p_hi - eff
    if span < 0:
        raise RuntimeError(f"Calculated output size is too small (input {n}, kernel {k})")
    if ceil:
        o = -(-span // s) + 1
        if (o - 1) * s >= n + p_lo:  # the last window must start inside the input or left pad
            o -= 1
        return o
    return span // s + 1


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation) of input (N, C, H, W) with weight (O, C/groups, kh, kw).

    padding: int, pair, 'valid' or 'same'.
    """
    if _st.autocast is not None:
        input, weight, bias = _low(input), _low(weight), _low(bias)
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    xd, wd = input._data, weight._data
    if xd.ndim != 4 or wd.ndim != 4:
        raise RuntimeError(f"conv2d expects a 4-D input and weight, got {xd.shape} and "
                           f"{wd.shape}")
    N, C, H, W = xd.shape
    O, Cg, kh, kw = wd.shape
    G = int(groups)
    if C != Cg * G or O % G:
        raise RuntimeError(f"Given groups={G}, weight of size {list(wd.shape)}, expected input"
                           f"{list(xd.shape)} to have {Cg * G} channels, but got {C} channels")
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            pt = pb = pl = pr = 0
        elif padding == "same":
            th, tw = dh * (kh - 1), dw * (kw - 1)
            pt, pl = th // 2, tw // 2
            pb, pr = th - pt, tw - pl
        else:
            raise ValueError(f"Invalid padding string {padding!r}")
    else:
        ph, pw = _pair(padding)
        pt = pb = ph
        pl = pr = pw
    Ho = _conv_out(H, kh, sh, pt, pb, dh)
    Wo = _conv_out(W, kw, sw, pl, pr, dw)
    cdt = _F32 if xd.dtype in _HALFS else xd.dtype
    xs = xd if xd.dtype == cdt else xd.astype(cdt)
    if pt or pb or pl or pr:
        xp = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=cdt)
        xp[:, :, pt:pt + H, pl:pl + W] = xs
    else:
        xp = xs
    s0, s1, s2, s3 = xp.strides
    # (C, kh, kw, N, Ho, Wo) window view -> columns (K, N*L), one copy
    v = as_strided(xp, (C, kh, kw, N, Ho, Wo), (s1, s2 * dh, s3 * dw, s0, s2 * sh, s3 * sw))
    L = N * Ho * Wo
    Kg = Cg * kh * kw
    Og = O // G
    cols = v.reshape(G, Kg, L)
    w3 = wd.reshape(G, Og, Kg)
    if w3.dtype != cdt:
        w3 = w3.astype(cdt)
    if G == 1:
        out = np.matmul(w3[0], cols[0])
    else:
        out = np.matmul(w3, cols)
    out = out.reshape(O, N, Ho, Wo)
    if bias is not None:
        out += bias._data.astype(cdt, copy=False).reshape(O, 1, 1, 1)
    # NCHW contiguous: what follows (activations, pooling, their backward) runs on contiguous data
    res = np.empty((N, O, Ho, Wo), dtype=xd.dtype)
    np.copyto(res, out.transpose(1, 0, 2, 3), casting="unsafe")
    rx, rw = input._requires_grad, weight._requires_grad
    rb = bias is not None and bias._requires_grad
    if not (_st.grad and (rx or rw or rb)):
        r = Tensor._wrap(res)
        return r.squeeze(0) if unbatched else r
    xdt, wdt = xd.dtype, wd.dtype
    bdt = bias._data.dtype if bias is not None else None

    def bw(g):
        g = g.astype(cdt, copy=False)
        g2 = g.transpose(1, 0, 2, 3).reshape(G, Og, L)   # copy when needed
        gx = gw = gb = None
        if rw:
            if G == 1:
                gw = np.matmul(g2[0], cols[0].T)
            else:
                gw = np.matmul(g2, cols.transpose(0, 2, 1))
            gw = gw.reshape(wd.shape).astype(wdt, copy=False)
        if rb:
            gb = g2.reshape(O, L).sum(1).astype(bdt, copy=False)
        if rx:
            if G == 1:
                gc = np.matmul(w3[0].T, g2[0])
            else:
                gc = np.matmul(w3.transpose(0, 2, 1), g2)
            gc = gc.reshape(C, kh, kw, N, Ho, Wo)
            gxp = np.zeros((N, C) + xp.shape[2:], dtype=cdt)
            gxt = gxp.transpose(1, 0, 2, 3)          # (C, N, Hp, Wp) view
            for i in range(kh):
                for j in range(kw):
                    gxt[:, :, i * dh:i * dh + sh * (Ho - 1) + 1:sh,
                        j * dw:j * dw + sw * (Wo - 1) + 1:sw] += gc[:, i, j]
            gx = gxp[:, :, pt:pt + H, pl:pl + W]
            if gx.dtype != xdt:
                gx = gx.astype(xdt)
        return gx, gw, gb
    r = _mk(res, "ConvolutionBackward0", bw, (input, weight, bias))
    return r.squeeze(0) if unbatched else r


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
