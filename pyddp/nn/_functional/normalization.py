"""Normalisation: layer_norm, group_norm and batch_norm (running statistics updated in place, as
torch), and normalize (Lp-normalised along a dimension).
"""
from __future__ import annotations

import numpy as np

from ..._tensor import Tensor
from ..._tensor._core import _mk
from ..._tensor._dtypes import _HALFS
from ..._tensor._grad_mode import _st
from ..._tensor._ops import _cast
from .._argcheck import require_tensors as _require_tensors
from ._common import _f32, _up

__all__ = ["layer_norm", "group_norm", "batch_norm", "normalize"]


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


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise (N, C, ...) over each group of C / num_groups channels and the remaining dims
    (one mean and variance per sample and group), then scale and shift per channel (torch's
    F.group_norm).  float16/bfloat16 inputs are normalised in float32, returned in their dtype."""
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received "
                           f"{len(shape)}")
    N, C = shape[0], shape[1]
    if C % num_groups:
        raise RuntimeError("Expected number of channels in input to be divisible by num_groups, "
                           f"but got input of shape {list(shape)} and num_groups={num_groups}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and (p.ndim != 1 or p.shape[0] != C):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of "
                               f"channels in input, but got {name} of shape {list(p.shape)} and "
                               f"input of shape {list(shape)}")
    if input.dtype in _HALFS and _st.autocast is None:
        return _cast(group_norm(_f32(input), num_groups, _f32(weight), _f32(bias), eps),
                     input.dtype)
    input, weight, bias = _up(input), (None if weight is None else _up(weight)), \
        (None if bias is None else _up(bias))
    xd = input._data
    xg = xd.reshape(N, num_groups, -1)
    mu = xg.mean(axis=2, keepdims=True)
    xc = xg - mu
    var = (xc * xc).mean(axis=2, keepdims=True)
    rstd = (1.0 / np.sqrt(var + eps)).astype(xd.dtype, copy=False)
    xhat = (xc * rstd).reshape(shape)
    cshape = (1, C) + (1,) * (len(shape) - 2)
    wd = weight._data.reshape(cshape) if weight is not None else None
    out = xhat * wd if wd is not None else xhat.copy()
    if bias is not None:
        out += bias._data.reshape(cshape)
    axes = (0,) + tuple(range(2, len(shape)))

    def bw(g):
        gx = gw = gb = None
        if input._requires_grad:
            gh = (g * wd if wd is not None else g).reshape(N, num_groups, -1)
            xh = xhat.reshape(N, num_groups, -1)
            gx = _norm_backward(gh, xh, rstd, None, (2,), None).reshape(shape)
        if weight is not None and weight._requires_grad:
            gw = (g * xhat).sum(axis=axes)
        if bias is not None and bias._requires_grad:
            gb = g.sum(axis=axes)
        return gx, gw, gb
    return _mk(out, "NativeGroupNormBackward0", bw, (input, weight, bias))


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


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """input / max(||input||_p along dim, eps)."""
    n = input.norm(p, dim, keepdim=True)
    return input / n.clamp(min=eps)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
