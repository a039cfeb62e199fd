"""pyddp.nn.functional: neural-network operations on pyddp Tensors (torch.nn.functional).

Everything is NumPy: conv2d is im2col (a strided view copied once) plus one BLAS matmul; its
backward is two matmuls and a col2im that adds kh*kw strided slices.  Pooling loops over the
kernel positions with strided slices.  Losses (cross_entropy, nll_loss, mse_loss, ...) come from
pyddp/nn/_loss_functional.py.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import _tensor as _t
from .._random import _np_gen
from .._tensor import Tensor, log_softmax, sigmoid, softmax, tanh  # noqa: F401
from .._tensor import _core
from .._tensor._core import _mk, _mm
from .._tensor._dtypes import _F32, _HALFS
from .._tensor._grad_mode import _st
from .._tensor._ops import _ac_f32, _ac_low, _cast, _sigmoid_f

__all__ = [
    "linear", "bilinear", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
    "adaptive_max_pool2d", "dropout", "embedding", "layer_norm", "batch_norm", "relu", "relu6",
    "leaky_relu", "gelu", "silu", "elu", "softplus", "hardtanh", "tanh", "sigmoid", "softmax",
    "log_softmax", "pad", "one_hot", "normalize", "flatten", "threshold", "dropout1d",
    "dropout2d", "dropout3d", "scaled_dot_product_attention", "multi_head_attention_forward",
]


def _pair(v):
    if isinstance(v, (tuple, list)):
        return tuple(int(x) for x in v)
    return (int(v), int(v))


def _low(t):
    """autocast: cast a float tensor to the lower-precision dtype (differentiably)."""
    if t is None:
        return None
    return _ac_low(t)


def _up(t):
    return _ac_f32(t)


def _f32(t):
    """float16/bfloat16 tensors cast (differentiably) to float32; others as they are."""
    if t is None or t.dtype not in _HALFS:
        return t
    return _cast(t, _F32)


# ----------------------------------------------------------------------------------------------
# linear

def linear(input, weight, bias=None):
    """input @ weight.T + bias (weight: (out_features, in_features))."""
    if _st.autocast is not None:
        input, weight, bias = _low(input), _low(weight), _low(bias)
    xd, wd = input._data, weight._data
    if xd.dtype != wd.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {xd.dtype} and "
                           f"{wd.dtype}")
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


def bilinear(input1, input2, weight, bias=None):
    """y = x1^T A x2 + b (weight: (out, in1, in2))."""
    y = ((input1.unsqueeze(-2).unsqueeze(-2) @ weight) .squeeze(-2) * input2.unsqueeze(-2)).sum(-1)
    return y + bias if bias is not None else y


# ----------------------------------------------------------------------------------------------
# convolution

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


# ----------------------------------------------------------------------------------------------
# pooling

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


# ----------------------------------------------------------------------------------------------
# dropout, embedding, normalisation

def dropout(input, p=0.5, training=True, inplace=False):
    """Zero elements with probability p and scale the rest by 1/(1-p) (training only)."""
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0:
        return input
    xd = input._data
    if p == 1:
        m = np.zeros(xd.shape, dtype=xd.dtype)
    else:
        wdt = xd.dtype if xd.dtype in (_F32, np.float64) else _F32
        m = (_np_gen().random(xd.shape, dtype=wdt) >= p).astype(xd.dtype)
        m *= 1.0 / (1.0 - p)
    out = xd * m
    if inplace and not (_st.grad and input._requires_grad):
        xd[...] = out
        return input
    return _mk(out, "MulBackward0", lambda g: (g * m,), (input,))


def _feature_dropout(input, p, training, inplace):
    """Zero whole channels: one draw per (N, C), broadcast over the remaining dimensions."""
    if not training or p == 0:
        return input
    xd = input._data
    mshape = tuple(xd.shape[:2]) + (1,) * (xd.ndim - 2)
    if p == 1:
        m = np.zeros(mshape, dtype=xd.dtype)
    else:
        wdt = xd.dtype if xd.dtype in (_F32, np.float64) else _F32
        m = (_np_gen().random(mshape, dtype=wdt) >= p).astype(xd.dtype)
        m *= 1.0 / (1.0 - p)
    out = xd * m
    if inplace and not (_st.grad and input._requires_grad):
        xd[...] = out
        return input
    return _mk(out, "MulBackward0", lambda g: (g * m,), (input,))


def _check_p(p):
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _need_tensor(input, name):
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' must be a pyddp Tensor, not "
                        f"{type(input).__name__}")


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero entire channels of (N, C, L) or (C, L) input with probability p (torch's dropout1d)."""
    _need_tensor(input, "dropout1d")
    _check_p(p)
    nd = input.ndim
    if nd not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {nd}D input. Note that dropout1d "
            "exists to provide channel-wise dropout on inputs with 1 spatial dimension, a channel "
            "dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    if nd == 3:
        return _feature_dropout(input, p, training, inplace)
    if not training or p == 0:
        return input
    out = _feature_dropout(input.unsqueeze(0), p, training, False).squeeze(0)
    if inplace and not (_st.grad and input._requires_grad):
        input._data[...] = out._data
        return input
    return out


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero entire channels of (N, C, H, W) input with probability p (torch's dropout2d; a 3-D
    input is taken as (N, C, L), with torch's warning)."""
    import warnings
    _need_tensor(input, "dropout2d")
    _check_p(p)
    nd = input.ndim
    if nd not in (3, 4):
        warnings.warn(
            f"dropout2d: Received a {nd}-D input to dropout2d, which is deprecated and will result "
            "in an error in a future release. To retain the behavior and silence this warning, "
            "please use dropout instead. Note that dropout2d exists to provide channel-wise "
            "dropout on inputs with 2 spatial dimensions, a channel dimension, and an optional "
            "batch dimension (i.e. 3D or 4D inputs).", stacklevel=2)
    if nd == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
            "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel "
            "dim. This behavior will change in a future release to interpret the input as one "
            "without a batch dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise "
            "dropout behavior, please switch to using dropout1d instead.", stacklevel=2)
    return _feature_dropout(input, p, training, inplace)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero entire channels of (N, C, D, H, W) or (C, D, H, W) input with probability p."""
    import warnings
    _need_tensor(input, "dropout3d")
    _check_p(p)
    nd = input.ndim
    if nd not in (4, 5):
        warnings.warn(
            f"dropout3d: Received a {nd}-D input to dropout3d, which is deprecated and will result "
            "in an error in a future release. To retain the behavior and silence this warning, "
            "please use dropout instead. Note that dropout3d exists to provide channel-wise "
            "dropout on inputs with 3 spatial dimensions, a channel dimension, and an optional "
            "batch dimension (i.e. 4D or 5D inputs).", stacklevel=2)
    if nd == 5:
        return _feature_dropout(input, p, training, inplace)
    if not training or p == 0:
        return input
    out = _feature_dropout(input.unsqueeze(0), p, training, False).squeeze(0)
    if inplace and not (_st.grad and input._requires_grad):
        input._data[...] = out._data
        return input
    return out


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of weight picked by the integer indices in input."""
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {idx.dtype} instead")
    wd = weight._data
    if padding_idx is not None and padding_idx < 0:
        padding_idx += wd.shape[0]
    if max_norm is not None:
        rows = np.unique(idx)
        n = np.linalg.norm(wd[rows], ord=norm_type, axis=1, keepdims=True)
        scale = np.where(n > max_norm, max_norm / (n + 1e-7), 1).astype(wd.dtype)
        wd[rows] *= scale
    out = wd[idx]
    shape = wd.shape

    def bw(g):
        gw = np.zeros(shape, dtype=g.dtype)
        flat = idx.reshape(-1)
        g2 = g.reshape(-1, shape[1])
        if scale_grad_by_freq:
            cnt = np.bincount(flat, minlength=shape[0])
            g2 = g2 / cnt[flat][:, None]
        np.add.at(gw, flat, g2)
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw,)
    return _mk(out, "EmbeddingBackward0", bw, (weight,))


def _norm_backward(g, xhat, rstd, w, axes, n):
    """Gradient of (x - mean) * rstd (then * w) w.r.t. x, statistics over axes."""
    gh = g * w if w is not None else g
    m1 = gh.mean(axis=axes, keepdims=True)
    m2 = (gh * xhat).mean(axis=axes, keepdims=True)
    return (gh - m1 - xhat * m2) * rstd


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing normalized_shape dims, then scale and shift."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if input.dtype in _HALFS and _st.autocast is None:
        return _cast(layer_norm(_f32(input), normalized_shape, _f32(weight), _f32(bias), eps),
                        input.dtype)
    input, weight, bias = _up(input), (None if weight is None else _up(weight)), \
        (None if bias is None else _up(bias))
    xd = input._data
    k = len(normalized_shape)
    if tuple(xd.shape[-k:]) != tuple(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with "
                           f"shape [*, {', '.join(map(str, normalized_shape))}], but got input of "
                           f"size{list(xd.shape)}")
    axes = tuple(range(xd.ndim - k, xd.ndim))
    mu = xd.mean(axis=axes, keepdims=True)
    xc = xd - mu
    var = (xc * xc).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    wd = weight._data if weight is not None else None
    out = xhat * wd if wd is not None else xhat.copy()
    if bias is not None:
        out += bias._data
    lead = tuple(range(xd.ndim - k))

    def bw(g):
        gx = _norm_backward(g, xhat, rstd, wd, axes, None) if input._requires_grad else None
        gw = (g * xhat).sum(axis=lead) if weight is not None and weight._requires_grad else None
        gb = g.sum(axis=lead) if bias is not None and bias._requires_grad else None
        return gx, gw, gb
    return _mk(out, "NativeLayerNormBackward0", bw, (input, weight, bias))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalisation over (N, C, ...) per channel.

    training: normalise with the batch statistics and update running_mean / running_var in place
    (running = (1 - momentum) * running + momentum * batch; the variance is the unbiased one).
    Otherwise normalise with the running statistics.  A float16/bfloat16 input is normalised in
    float32 and the result returned in its dtype (parameters may stay float32, as apex's
    keep_batchnorm_fp32 wants).
    """
    if input.dtype in _HALFS and _st.autocast is None:
        return _cast(batch_norm(_f32(input), running_mean, running_var, _f32(weight),
                                   _f32(bias), training, momentum, eps), input.dtype)
    input, weight, bias = _up(input), (None if weight is None else _up(weight)), \
        (None if bias is None else _up(bias))
    xd = input._data
    if xd.ndim < 2:
        raise ValueError(f"expected at least 2-D input (got {xd.ndim}-D input)")
    C = xd.shape[1]
    axes = (0,) + tuple(range(2, xd.ndim))
    bshape = (1, C) + (1,) * (xd.ndim - 2)
    n = xd.size // C
    wd = weight._data.reshape(bshape) if weight is not None else None
    bd = bias._data.reshape(bshape) if bias is not None else None
    if training:
        if n <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {list(xd.shape)}")
        mu = xd.mean(axis=axes, keepdims=True)
        xc = xd - mu
        var = (xc * xc).mean(axis=axes, keepdims=True)
        if running_mean is not None:
            rm = running_mean._data
            rm *= (1 - momentum)
            rm += (momentum * mu.reshape(C)).astype(rm.dtype, copy=False)
        if running_var is not None:
            rv = running_var._data
            rv *= (1 - momentum)
            rv += (momentum * var.reshape(C) * (n / (n - 1))).astype(rv.dtype, copy=False)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
        mu = running_mean._data.reshape(bshape).astype(xd.dtype, copy=False)
        xc = xd - mu
        var = running_var._data.reshape(bshape).astype(xd.dtype, copy=False)
    rstd = (1.0 / np.sqrt(var + eps)).astype(xd.dtype, copy=False)
    xhat = xc * rstd
    out = xhat * wd if wd is not None else xhat.copy()
    if bd is not None:
        out += bd

    def bw(g):
        gx = gw = gb = None
        if input._requires_grad:
            if training:
                gx = _norm_backward(g, xhat, rstd, wd, axes, n)
            else:
                gx = g * (rstd * wd if wd is not None else rstd)
        if weight is not None and weight._requires_grad:
            gw = (g * xhat).sum(axis=axes)
        if bias is not None and bias._requires_grad:
            gb = g.sum(axis=axes)
        return gx, gw, gb
    return _mk(out, "NativeBatchNormBackward0", bw, (input, weight, bias))


# ----------------------------------------------------------------------------------------------
# activations

def relu(input, inplace=False):
    """max(input, 0)."""
    if inplace and not (_st.grad and input._requires_grad):
        np.maximum(input._data, 0, out=input._data)
        return input
    return _t.relu(input)


def relu6(input, inplace=False):
    """min(max(input, 0), 6)."""
    return hardtanh(input, 0.0, 6.0)


def threshold(input, threshold, value, inplace=False):
    """input where input > threshold, else value."""
    xd = input._data
    m = xd > threshold
    out = np.where(m, xd, value).astype(xd.dtype, copy=False)
    return _mk(out, "ThresholdBackward0", lambda g: (g * m,),
               (input,))


def leaky_relu(input, negative_slope=0.01, inplace=False):
    """input where positive, else negative_slope * input."""
    xd = input._data
    m = xd > 0
    out = np.where(m, xd, xd * negative_slope)
    return _mk(out, "LeakyReluBackward0",
               lambda g: (np.where(m, g, g * negative_slope),), (input,))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """Clamp into [min_val, max_val] (zero gradient at and outside the bounds... like torch)."""
    xd = input._data
    out = np.clip(xd, min_val, max_val)
    m = (xd > min_val) & (xd < max_val)
    return _mk(out, "HardtanhBackward0", lambda g: (g * m,), (input,))


def elu(input, alpha=1.0, inplace=False):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    xd = input._data
    m = xd > 0
    e = np.expm1(np.minimum(xd, 0))
    out = np.where(m, xd, alpha * e)
    return _mk(out, "EluBackward0", lambda g: (np.where(m, g, g * (alpha * (e + 1))),), (input,))


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta (linear above threshold)."""
    xd = input._data
    bx = xd * beta
    lin = bx > threshold
    out = np.where(lin, xd, np.log1p(np.exp(np.minimum(bx, threshold))) / beta)
    s = _sigmoid_f(bx)
    return _mk(out.astype(xd.dtype, copy=False), "SoftplusBackward0",
               lambda g: (np.where(lin, g, g * s),), (input,))


def silu(input, inplace=False):
    """x * sigmoid(x)."""
    xd = input._data
    s = _sigmoid_f(xd)
    out = xd * s
    return _mk(out, "SiluBackward0", lambda g: (g * (s * (1 + xd * (1 - s))),), (input,))


_erf_impl = []


def _erf(x):
    """erf elementwise: scipy's when installed (imported on first use), else math.erf."""
    if not _erf_impl:
        try:
            from scipy.special import erf
        except ImportError:  # scipy is optional
            v = np.vectorize(math.erf, otypes=[np.float64])

            def erf(a):
                return v(a).astype(a.dtype, copy=False)
        _erf_impl.append(erf)
    return _erf_impl[0](x)

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K_TANH = math.sqrt(2.0 / math.pi)


def gelu(input, approximate="none"):
    """x * Phi(x) (approximate='tanh': the tanh formula)."""
    xd = input._data
    if approximate == "tanh":
        inner = _K_TANH * (xd + 0.044715 * xd * xd * xd)
        t = np.tanh(inner)
        out = 0.5 * xd * (1 + t)

        def bw(g):
            dinner = _K_TANH * (1 + 3 * 0.044715 * xd * xd)
            return (g * (0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * dinner),)
    elif approximate == "none":
        cdf = 0.5 * (1 + _erf(xd * _SQRT1_2)).astype(xd.dtype, copy=False)
        out = xd * cdf

        def bw(g):
            pdf = _INV_SQRT_2PI * np.exp(-0.5 * xd * xd)
            return (g * (cdf + xd * pdf),)
    else:
        raise RuntimeError(f"approximate argument must be either none or tanh, got "
                           f"{approximate!r}")
    return _mk(out, "GeluBackward0", bw, (input,))


# ----------------------------------------------------------------------------------------------
# misc

def pad(input, pad, mode="constant", value=None):
    """Pad the trailing dims: pad = (left_last, right_last, left_prev, right_prev, ...).

    mode 'constant' (any value, negative pads crop); 'reflect', 'replicate', 'circular' forward and
    backward through np.pad's index map.
    """
    xd = input._data
    if len(pad) % 2:
        raise ValueError("Padding length must be divisible by 2")
    npairs = len(pad) // 2
    widths = [(0, 0)] * (xd.ndim - npairs) + [(pad[2 * k], pad[2 * k + 1])
                                                for k in range(npairs)][::-1]
    if mode == "constant":
        crop = tuple(slice(-lo if lo < 0 else 0, (hi if hi < 0 else None)) for lo, hi in widths)
        xc = xd[crop]
        pw = [(builtins_max(lo, 0), builtins_max(hi, 0)) for lo, hi in widths]
        out = np.pad(xc, pw, mode="constant", constant_values=0 if value is None else value)
        inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(pw, xc.shape))

        def bw(g):
            gx = np.zeros(xd.shape, dtype=g.dtype)
            gx[crop] = g[inner]
            return (gx,)
        return _mk(out, "ConstantPadNdBackward0", bw, (input,), saves=False)
    npmode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}.get(mode)
    if npmode is None:
        raise NotImplementedError(f"pad mode {mode!r}")
    # index map: pad an array of flat indices, then gather / scatter-add
    ids = np.arange(xd.size).reshape(xd.shape)
    pid = np.pad(ids, widths, mode=npmode)
    out = xd.reshape(-1)[pid]

    def bw(g):
        gx = np.zeros(xd.size, dtype=g.dtype)
        np.add.at(gx, pid.reshape(-1), g.reshape(-1))
        return (gx.reshape(xd.shape),)
    return _mk(out, "ReflectionPadBackward", bw, (input,), saves=False)


def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding along a new last dim."""
    idx = tensor._data
    n = int(idx.max()) + 1 if num_classes < 0 else num_classes
    out = np.zeros(idx.shape + (n,), dtype=np.int64)
    np.put_along_axis(out, idx[..., None], 1, axis=-1)
    return Tensor._wrap(out)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """input / max(||input||_p along dim, eps)."""
    n = input.norm(p, dim, keepdim=True)
    return input / n.clamp(min=eps)


def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim."""
    return _t.flatten(input, start_dim, end_dim)


# the losses (cross_entropy, nll_loss, mse_loss, l1_loss, binary_cross_entropy_with_logits, ...)
try:
    from ._loss_functional import *  # noqa: F401,F403,E402
    from ._loss_functional import __all__ as _loss_all  # noqa: E402
    __all__ += list(_loss_all)
except ImportError:  # not written yet
    pass


# ----------------------------------------------------------------------------------------------
# attention

def _mask_array(mask, name):
    """A mask argument as an ndarray (bool or float); None stays None."""
    if mask is None:
        return None
    a = mask._data if isinstance(mask, Tensor) else np.asarray(mask)
    if a.dtype != np.bool_ and a.dtype.kind != "f" and a.dtype not in _HALFS:
        raise AssertionError(f"only bool and floating types of {name} are supported")
    return a


def _float_mask(a, dtype):
    """torch's _canonical_mask: a bool mask becomes 0 / -inf (True = not attended)."""
    if a is None or a.dtype != np.bool_:
        return a
    out = np.zeros(a.shape, dtype=dtype)
    out[a] = -np.inf
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(Q K^T * scale + mask) V over the last two dimensions (torch's math reference).

    A bool ``attn_mask`` marks the positions that take part (True); a float one is added;
    ``is_causal`` applies the lower-triangular mask (then ``attn_mask`` must be None).
    """
    if enable_gqa:
        raise NotImplementedError("scaled_dot_product_attention: enable_gqa is not supported")
    L, S = query.shape[-2], key.shape[-2]
    E = query.shape[-1]
    s = 1.0 / math.sqrt(E) if scale is None else float(scale)
    qd = query._data.dtype
    bias = None
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                               "set when is_causal=True")
        bias = _t.tensor(np.where(np.tri(L, S, dtype=bool), 0, -np.inf).astype(qd))
    elif attn_mask is not None:
        m = _mask_array(attn_mask, "attn_mask")
        if m.dtype == np.bool_:
            bias = _t.tensor(np.where(m, 0, -np.inf).astype(qd))
        else:  # a float mask is added (differentiably, when it is a Tensor)
            bias = attn_mask if isinstance(attn_mask, Tensor) else _t.tensor(m)
    scores = _t.matmul(query * s, key.transpose(-2, -1))
    if bias is not None:
        scores = scores + bias
    w = softmax(scores, -1)
    if dropout_p > 0.0:
        w = dropout(w, dropout_p, True)
    return _t.matmul(w, value)


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                                 out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False):
    """torch.nn.functional.multi_head_attention_forward on pyddp Tensors ((L, N, E) layout, or
    unbatched (L, E)); returns (attn_output, attn_weights or None)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"multi_head_attention_forward(): argument '{name}' must be a pyddp "
                            f"Tensor, not {type(t).__name__}")
    kpm = _mask_array(key_padding_mask, "key_padding_mask")
    am = _mask_array(attn_mask, "attn_mask")
    qdim = query.ndim
    if qdim == 3:
        batched = True
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError(
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if kpm is not None and kpm.ndim != 2:
            raise AssertionError("For batched (3-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 2-D but found {kpm.ndim}-D tensor instead")
        if am is not None and am.ndim not in (2, 3):
            raise AssertionError("For batched (3-D) `query`, expected `attn_mask` to be `None`, "
                                 f"2-D or 3-D but found {am.ndim}-D tensor instead")
    elif qdim == 2:
        batched = False
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError(
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively")
        if kpm is not None and kpm.ndim != 1:
            raise AssertionError("For unbatched (2-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 1-D but found {kpm.ndim}-D tensor instead")
        if am is not None:
            if am.ndim not in (2, 3):
                raise AssertionError("For unbatched (2-D) `query`, expected `attn_mask` to be "
                                     f"`None`, 2-D or 3-D but found {am.ndim}-D tensor instead")
            if am.ndim == 3 and am.shape != (num_heads, query.shape[0], key.shape[0]):
                raise AssertionError(
                    f"Expected `attn_mask` shape to be {(num_heads, query.shape[0], key.shape[0])} "
                    f"but got {tuple(am.shape)}")
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if kpm is not None:
            kpm = kpm[None]
    else:
        raise AssertionError("query should be unbatched 2D or batched 3D tensor but received "
                             f"{qdim}-D query tensor")
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    fdt = query._data.dtype
    kpm = _float_mask(kpm, fdt)
    if is_causal and am is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and kpm is None and not need_weights:
        # torch hands is_causal to scaled_dot_product_attention, which ignores the mask
        am = np.where(np.tri(tgt_len, src_len, dtype=bool), 0, -np.inf).astype(fdt)
    else:
        am = _float_mask(am, fdt)
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but "
                             f"got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    E = embed_dim
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do not "
                                 f"match value's {tuple(value.shape[:2])}")
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is True but q_proj_weight, "
                                 "k_proj_weight or v_proj_weight is None")
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape "
                                 f"{tuple(value.shape)}")
        if in_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        wq, wk, wv = in_proj_weight[0:E], in_proj_weight[E:2 * E], in_proj_weight[2 * E:]
    if in_proj_bias is None:
        bq = bk = bv = None
    else:
        bq, bk, bv = in_proj_bias[0:E], in_proj_bias[E:2 * E], in_proj_bias[2 * E:]
    q = linear(query, wq, bq)
    k = linear(key, wk, bk)
    v = linear(value, wv, bv)
    if am is not None:
        if am.ndim == 2:
            if tuple(am.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {list(am.shape)}, but "
                                   f"should be {(tgt_len, src_len)}.")
            am = am[None]
        elif am.ndim == 3:
            if tuple(am.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {list(am.shape)}, but "
                                   f"should be {(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {am.ndim} is not supported")
    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise AssertionError("bias cannot be added to static key.")
        k = _t.cat([k, _t.cat([bias_k] * bsz, 1)])
        v = _t.cat([v, _t.cat([bias_v] * bsz, 1)])
        if am is not None:
            am = np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        if kpm is not None:
            kpm = np.pad(kpm, [(0, 0), (0, 1)])
    elif bias_k is not None or bias_v is not None:
        raise AssertionError("bias_k and bias_v must both be set or both be None")
    q = q.reshape(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = (k.reshape(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_k is None
         else static_k)
    v = (v.reshape(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_v is None
         else static_v)
    if add_zero_attn:
        z = _t.zeros(bsz * num_heads, 1, head_dim, dtype=k.dtype)
        k = _t.cat([k, z], 1)
        v = _t.cat([v, z], 1)
        if am is not None:
            am = np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        if kpm is not None:
            kpm = np.pad(kpm, [(0, 0), (0, 1)])
    src_len = k.shape[1]
    if kpm is not None:
        if kpm.shape[0] != bsz:
            raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                                 f"{kpm.shape[0]}")
        if kpm.shape[1] != src_len:
            raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but got "
                                 f"{kpm.shape[1]}")
        kpm = np.broadcast_to(kpm.reshape(bsz, 1, 1, src_len),
                              (bsz, num_heads, 1, src_len)).reshape(bsz * num_heads, 1, src_len)
        am = kpm if am is None else am + kpm
    if not training:
        dropout_p = 0.0
    scores = _t.matmul(q * math.sqrt(1.0 / float(head_dim)), k.transpose(-2, -1))
    if am is not None:
        scores = scores + _t.tensor(am)
    w = softmax(scores, -1)
    wd = dropout(w, dropout_p, True) if dropout_p > 0.0 else w
    out = _t.matmul(wd, v)
    out = out.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).reshape(tgt_len, bsz, embed_dim)
    if not batched:
        out = out.squeeze(1)
    if not need_weights:
        return out, None
    w = wd.reshape(bsz, num_heads, tgt_len, src_len)  # torch returns them after dropout
    if average_attn_weights:
        w = w.mean(dim=1)
    if not batched:
        w = w.squeeze(0)
    return out, w

# ------------------------------------------------------------------ more activations, similarity
# (composed from differentiable tensor ops: autograd follows)

def mish(input, inplace=False):
    """x * tanh(softplus(x))."""
    return input * tanh(softplus(input))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with SELU's constants."""
    return elu(input, _SELU_ALPHA) * _SELU_SCALE


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return relu(input) + _t.clamp(_t.expm1(_t.clamp(input, max=0) / alpha) * alpha, max=0)


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6."""
    return relu6(input + 3.0) / 6.0


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6."""
    return input * hardsigmoid(input)


def logsigmoid(input):
    """log(sigmoid(x)), stably (-softplus(-x))."""
    return -softplus(-input)


def softsign(input):
    """x / (1 + |x|)."""
    return input / (_t.abs(input) + 1.0)


def tanhshrink(input):
    """x - tanh(x)."""
    return input - tanh(input)


def softshrink(input, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, else 0."""
    return _t.where(input > lambd, input - lambd,
                    _t.where(input < -lambd, input + lambd, input * 0.0))


def hardshrink(input, lambd=0.5):
    """x where |x| > lambd, else 0."""
    return _t.where(_t.abs(input) > lambd, input, input * 0.0)


def glu(input, dim=-1):
    """a * sigmoid(b), a and b the halves of input along dim."""
    n = input.shape[dim]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim % input.ndim} is "
                           f"size {n}")
    a, b = input.chunk(2, dim)
    return a * sigmoid(b)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x) along dim."""
    return softmax(-input, dim, dtype=dtype)


def prelu(input, weight):
    """x where positive, else weight * x (weight per channel, dim 1, or one for all)."""
    w = weight
    if w.numel() > 1:
        if input.ndim < 2 or input.shape[1] != w.numel():
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                               f"parameter numbers = {w.numel()} and channel size = "
                               f"{input.shape[1] if input.ndim > 1 else 1}.")
        w = w.reshape((1, -1) + (1,) * (input.ndim - 2))
    return _t.where(input > 0, input, input * w)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along dim (norms clamped to eps): the tensor op
    pyddp.cosine_similarity."""
    return _t.cosine_similarity(x1, x2, dim, eps)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps along the last dimension."""
    d = x1 - x2 + eps
    if p == 2:
        return _t.sqrt(_t.sum(d * d, -1, keepdim))
    if p == 1:
        return _t.sum(_t.abs(d), -1, keepdim)
    return _t.pow(_t.sum(_t.pow(_t.abs(d), p), -1, keepdim), 1.0 / p)


__all__ += ["mish", "selu", "celu", "hardsigmoid", "hardswish", "logsigmoid", "softsign",
            "tanhshrink", "softshrink", "hardshrink", "glu", "softmin", "prelu",
            "cosine_similarity", "pairwise_distance"]


# A NumPy array where a Tensor is expected: torch's TypeError, not an AttributeError (the losses
# and embedding take arrays and convert them).
from ._argcheck import require_tensors as _require_tensors  # noqa: E402

_require_tensors(globals(), [n for n in __all__ if globals()[n].__module__ == __name__]
                 + ["softmax", "log_softmax"], Tensor, exempt=("embedding",))
