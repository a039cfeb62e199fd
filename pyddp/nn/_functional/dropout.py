"""Dropout: elementwise (dropout) and whole channels (dropout1d / 2d / 3d), from pyddp's one generator.
"""
from __future__ import annotations

import numpy as np

from ..._random import _np_gen
from ..._tensor import Tensor
from ..._tensor._core import _mk
from ..._tensor._dtypes import _F32
from ..._tensor._grad_mode import _st
from .._argcheck import require_tensors as _require_tensors

__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d"]


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


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
