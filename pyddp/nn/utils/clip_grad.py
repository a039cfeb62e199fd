"""clip_grad_norm_ and clip_grad_value_ (torch.nn.utils.clip_grad)."""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..._tensor import Tensor, _new

__all__ = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm"]


def _tensors(parameters, name="parameters"):
    if isinstance(parameters, Tensor):
        return [parameters]
    if isinstance(parameters, np.ndarray):
        raise TypeError(f"{name} must be a pyddp Tensor or an iterable of Tensors, not a NumPy "
                        "array")
    try:
        out = list(parameters)
    except TypeError:
        raise TypeError(f"{name} must be a pyddp Tensor or an iterable of Tensors, got "
                        f"{type(parameters).__name__}") from None
    for t in out:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must hold pyddp Tensors, got {type(t).__name__}")
    return out


def _norm_type(norm_type):
    if isinstance(norm_type, str):
        if norm_type in ("inf", "+inf"):
            return math.inf
        if norm_type == "-inf":
            return -math.inf
        raise ValueError(f"norm_type must be a number or 'inf', got {norm_type!r}")
    return float(norm_type)


def _vector_norm(a: np.ndarray, p: float) -> float:
    a = np.abs(a.astype(np.float64, copy=False)).ravel()
    if p == math.inf:
        return float(a.max()) if a.size else 0.0
    if p == -math.inf:
        return float(a.min()) if a.size else math.inf
    if p == 0:
        return float(np.count_nonzero(a))
    if p == 1:
        return float(a.sum())
    if p == 2:
        return float(np.sqrt(np.dot(a, a)))
    return float(np.sum(a ** p) ** (1.0 / p))


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the norms of ``tensors`` (as if concatenated into one vector), a 0-d Tensor
    of their dtype; 0 when there are none."""
    ts = _tensors(tensors, "tensors")
    p = _norm_type(norm_type)
    if not ts:
        return _new(np.array(0.0, dtype=np.float32))
    norms = np.array([_vector_norm(t._data, p) for t in ts])
    total = _vector_norm(norms, p)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {float(p)} for gradients from `parameters` is non-finite, "
            "so it cannot be clipped. To disable this error and scale the gradients by the "
            "non-finite norm anyway, set `error_if_nonfinite=False`")
    dt = np.result_type(*[t._data.dtype for t in ts])
    if dt.kind != "f":
        dt = np.dtype(np.float32)
    return _new(np.array(total, dtype=dt))


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale the gradients of ``parameters`` in place so that their total ``norm_type`` norm
    (2, 1, ``inf``, ...) is at most ``max_norm``; returns the total norm before clipping (a 0-d
    Tensor), as torch does. The scale is max_norm / (total + 1e-6), capped at 1."""
    params = _tensors(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    max_norm = float(max_norm)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    coef = max_norm / (float(total._data) + 1e-6)
    coef = min(coef, 1.0)
    for g in grads:
        a = g._data
        a *= a.dtype.type(coef) if a.dtype.kind == "f" else coef
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Deprecated alias of clip_grad_norm_ (as in torch)."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient of ``parameters`` into [-clip_value, clip_value], in place."""
    params = _tensors(parameters)
    clip_value = float(clip_value)
    for p in params:
        g = p.grad
        if g is not None:
            np.clip(g._data, -clip_value, clip_value, out=g._data)
