"""rms_norm (torch.nn.functional.rms_norm) and the in-place activations' functional spellings
(relu_, elu_, leaky_relu_, hardtanh_, selu_, celu_, threshold_)."""
from __future__ import annotations

import numbers

import numpy as np

from ..._tensor import Tensor
from . import activation as _act

__all__ = ["rms_norm", "relu_", "elu_", "leaky_relu_", "hardtanh_", "selu_", "celu_",
           "threshold_"]


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """``input / sqrt(mean(input**2 over normalized_shape's trailing dims) + eps) * weight``;
    eps None is the input dtype's machine epsilon (as torch's)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"rms_norm(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(input).__name__}")
    if isinstance(normalized_shape, numbers.Integral):
        raise TypeError(f"rms_norm(): argument 'normalized_shape' (position 2) must be tuple of "
                        f"ints, not {type(normalized_shape).__name__}")
    ns = tuple(int(s) for s in normalized_shape)
    k = len(ns)
    if tuple(input.shape[input.ndim - k:]) != ns or k > input.ndim:
        raise RuntimeError(f"Given normalized_shape={list(ns)}, expected input with shape "
                           f"[*{', '.join(str(s) for s in ns)}], but got input of size"
                           f"{list(input.shape)}")
    if weight is not None and tuple(weight.shape) != ns:
        raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got "
                           f"weight of shape {list(weight.shape)} and normalized_shape = "
                           f"{list(ns)}")
    if eps is None:
        eps = float(np.finfo(input.dtype if input.is_floating_point() else np.float32).eps)
    dims = tuple(range(input.ndim - k, input.ndim))
    x = input
    low = input.dtype in (np.float16,) or input.dtype.name == "bfloat16"
    if low:
        x = x.float()
    y = x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt() if dims else \
        x * ((x * x) + eps).rsqrt()
    if low:
        y = y.to(input.dtype)
    if weight is not None:
        y = y * weight
    return y


def _inplace(f, name):
    def op(input, *args, **kwargs):
        from ..._tensor._inplace import _write_result
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not "
                            f"{type(input).__name__}")
        return _write_result(input, f(input, *args, **kwargs))
    op.__name__ = name
    op.__doc__ = f"In-place {f.__name__}: input takes the result (recorded for autograd as " \
                 "torch's in-place ops); returns input."
    return op


relu_ = _inplace(_act.relu, "relu_")
elu_ = _inplace(_act.elu, "elu_")
leaky_relu_ = _inplace(_act.leaky_relu, "leaky_relu_")
hardtanh_ = _inplace(_act.hardtanh, "hardtanh_")
selu_ = _inplace(_act.selu, "selu_")
celu_ = _inplace(_act.celu, "celu_")
threshold_ = _inplace(_act.threshold, "threshold_")
