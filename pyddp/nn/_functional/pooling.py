"""Pooling: max_pool2d and avg_pool2d loop over the kernel positions with strided slices;
adaptive_avg_pool2d / adaptive_max_pool2d over torch's adaptive bins.
"""
from __future__ import annotations

import numpy as np

from ... import _tensor as _t
from ..._tensor import Tensor
from ..._tensor._core import _mk
from ..._tensor._dtypes import _F32, _HALFS
from .._argcheck import require_tensors as _require_tensors
from ._common import _pair
from .conv import _conv_out

__all__ = ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d"]


def _pool_geometry(xd, kernel_size, stride, padding, dilation, ceil_mode):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride if stride is not None and stride != [] and stride != () else
                   kernel_size)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if ph > kh // 2 or pw > kw // 2:
        raise RuntimeError("pad should be at most half of effective kernel size")
    H, W = xd.shape[-2:]
    Ho = _conv_out(H, kh, sh, ph, ph, dh, ceil_mode)
    Wo = _conv_out(W, kw, sw, pw, pw, dw, ceil_mode)
    # extra right/bottom padding so every (ceil_mode) window fits
    eh = builtins_max(0, (Ho - 1) * sh + dh * (kh - 1) + 1 - (H + 2 * ph))
    ew = builtins_max(0, (Wo - 1) * sw + dw * (kw - 1) + 1 - (W + 2 * pw))
    return kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, eh, ew


builtins_max = max


def _padded(xd, ph, pw, eh, ew, fill):
    if not (ph or pw or eh or ew):
        return xd
    H, W = xd.shape[-2:]
    xp = np.full(xd.shape[:-2] + (H + 2 * ph + eh, W + 2 * pw + ew), fill, dtype=xd.dtype)
    xp[..., ph:ph + H, pw:pw + W] = xd
    return xp


def _win(a, i, j, dh, dw, sh, sw, Ho, Wo):
    return a[..., i * dh:i * dh + sh * (Ho - 1) + 1:sh, j * dw:j * dw + sw * (Wo - 1) + 1:sw]


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over kh x kw windows; the gradient goes to the (first) maximum of each window."""
    xd = input._data
    kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, eh, ew = _pool_geometry(
        xd, kernel_size, stride, padding, dilation, ceil_mode)
    fill = -np.inf if xd.dtype.kind == "f" else np.iinfo(xd.dtype).min
    xp = _padded(xd, ph, pw, eh, ew, fill)
    out = None
    for i in range(kh):
        for j in range(kw):
            w = _win(xp, i, j, dh, dw, sh, sw, Ho, Wo)
            if out is None:
                out = w.copy()
            else:
                np.maximum(out, w, out=out)
    H, W = xd.shape[-2:]

    def first_max_masks():
        remaining = np.ones(out.shape, dtype=np.bool_)
        for i in range(kh):
            for j in range(kw):
                m = _win(xp, i, j, dh, dw, sh, sw, Ho, Wo) == out
                m &= remaining
                remaining &= ~m
                yield i, j, m

    tiled = (sh, sw) == (kh, kw) and (dh, dw) == (1, 1) and not (ph or pw or eh or ew)

    def bw(g):
        if tiled:
            # non-overlapping windows: one comparison over a (.., Ho, kh, Wo, kw) view
            lead = xd.shape[:-2]
            xv = xd[..., :Ho * kh, :Wo * kw].reshape(lead + (Ho, kh, Wo, kw))
            m = xv == out[..., :, None, :, None]
            if np.count_nonzero(m) == out.size:  # no ties: exactly one maximum per window
                gv = m * g[..., :, None, :, None]
                gv = gv.reshape(lead + (Ho * kh, Wo * kw))
                if gv.shape[-2:] == (H, W):
                    return (gv,)
                gx = np.zeros(xd.shape, dtype=g.dtype)
                gx[..., :Ho * kh, :Wo * kw] = gv
                return (gx,)
        gxp = np.zeros(xp.shape, dtype=g.dtype)
        for i, j, m in first_max_masks():
            _win(gxp, i, j, dh, dw, sh, sw, Ho, Wo)[...] += g * m
        return (gxp[..., ph:ph + H, pw:pw + W],)
    r = _mk(out, "MaxPool2DWithIndicesBackward0", bw, (input,))
    if return_indices:
        idx = np.zeros(out.shape, dtype=np.int64)
        oh = np.arange(Ho)[:, None] * sh
        ow = np.arange(Wo)[None, :] * sw
        for i, j, m in first_max_masks():
            pos = (oh + i * dh - ph) * W + (ow + j * dw - pw)
            idx[m] = np.broadcast_to(pos, out.shape)[m]
        return r, Tensor._wrap(idx)
    return r


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over kh x kw windows (torch's divisor rules for padding and ceil_mode)."""
    xd = input._data
    kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, eh, ew = _pool_geometry(
        xd, kernel_size, stride, padding, 1, ceil_mode)
    xp = _padded(xd, ph, pw, eh, ew, 0)
    H, W = xd.shape[-2:]
    acc = None
    for i in range(kh):
        for j in range(kw):
            w = _win(xp, i, j, dh, dw, sh, sw, Ho, Wo)
            if acc is None:
                acc = w.astype(_F32 if xd.dtype in _HALFS else xd.dtype, copy=True)
            else:
                acc += w
    if divisor_override:
        div = float(divisor_override)
    elif not (ph or pw or eh or ew):
        div = float(kh * kw)
    else:
        # count the cells of each window that lie inside the padded (or the real) input
        ones = np.zeros(xp.shape[-2:], dtype=acc.dtype)
        if count_include_pad:
            ones[:H + 2 * ph, :W + 2 * pw] = 1
        else:
            ones[ph:ph + H, pw:pw + W] = 1
        div = sum(_win(ones, i, j, dh, dw, sh, sw, Ho, Wo) for i in range(kh) for j in range(kw))
    out = (acc / div).astype(xd.dtype, copy=False)

    def bw(g):
        gd = g / div
        gxp = np.zeros(xp.shape, dtype=g.dtype)
        for i in range(kh):
            for j in range(kw):
                _win(gxp, i, j, dh, dw, sh, sw, Ho, Wo)[...] += gd
        return (gxp[..., ph:ph + H, pw:pw + W],)
    return _mk(out, "AvgPool2DBackward0", bw, (input,), saves=False)


def _adaptive_bounds(n, o):
    return [((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)]


def adaptive_avg_pool2d(input, output_size):
    """Average pooling to a fixed output size (torch's window bounds)."""
    xd = input._data
    H, W = xd.shape[-2:]
    Ho, Wo = _pair(output_size) if not isinstance(output_size, (tuple, list)) else (
        H if output_size[0] is None else output_size[0],
        W if output_size[1] is None else output_size[1])
    if H % Ho == 0 and W % Wo == 0:
        return avg_pool2d(input, (H // Ho, W // Wo), (H // Ho, W // Wo))
    hb, wb = _adaptive_bounds(H, Ho), _adaptive_bounds(W, Wo)
    out = np.empty(xd.shape[:-2] + (Ho, Wo), dtype=xd.dtype)
    for i, (h0, h1) in enumerate(hb):
        for j, (w0, w1) in enumerate(wb):
            out[..., i, j] = xd[..., h0:h1, w0:w1].mean(axis=(-2, -1))

    def bw(g):
        gx = np.zeros(xd.shape, dtype=g.dtype)
        for i, (h0, h1) in enumerate(hb):
            for j, (w0, w1) in enumerate(wb):
                gx[..., h0:h1, w0:w1] += (g[..., i, j] / ((h1 - h0) * (w1 - w0)))[..., None, None]
        return (gx,)
    return _mk(out, "AdaptiveAvgPool2DBackward0", bw, (input,), saves=False)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max pooling to a fixed output size (divisible sizes use max_pool2d)."""
    H, W = input.shape[-2:]
    Ho, Wo = _pair(output_size)
    if H % Ho == 0 and W % Wo == 0:
        return max_pool2d(input, (H // Ho, W // Wo), return_indices=return_indices)
    hb, wb = _adaptive_bounds(H, Ho), _adaptive_bounds(W, Wo)
    rows = []
    for (h0, h1) in hb:
        cols = [input[..., h0:h1, w0:w1].amax(dim=(-2, -1)) for (w0, w1) in wb]
        rows.append(_t.stack(cols, -1))
    return _t.stack(rows, -2)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
