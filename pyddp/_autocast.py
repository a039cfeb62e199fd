"""pyddp.autocast: mixed precision for CPU NumPy tensors (torch.autocast semantics, amp O1).

Inside ``with pyddp.autocast(dtype=pyddp.float16):`` matmul/@, linear and conv2d round their float
inputs to the lower-precision dtype, compute on float32 BLAS and round the result back;
softmax, log_softmax, exp, log, sum, mean, layer_norm, batch_norm and losses cast lower-precision
inputs up to float32.  Gradients flow back through the casts in each input's own dtype.
"""
from __future__ import annotations

import functools

from ._tensor._dtypes import _dtype, bfloat16, float16
from ._tensor._grad_mode import _st
from ._tensor._ops import _ac_f32

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "upcast"]


class autocast:
    """autocast(device_type="cpu", dtype=pyddp.float16, enabled=True, cache_enabled=None)."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        if dtype is None:
            dtype = float16
        self.device_type = device_type
        self.fast_dtype = _dtype(dtype)
        if self.fast_dtype.kind != "f" and self.fast_dtype != bfloat16:
            raise ValueError(f"autocast dtype must be a float type, got {self.fast_dtype}")
        self.enabled = bool(enabled)
        self._prev = []

    def __enter__(self):
        self._prev.append(_st.autocast)
        _st.autocast = self.fast_dtype if self.enabled else None
        return self

    def __exit__(self, *exc):
        _st.autocast = self._prev.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapper


def is_autocast_enabled(device_type=None):
    """True inside an enabled autocast region."""
    return _st.autocast is not None


def get_autocast_dtype(device_type=None):
    """The lower-precision dtype of the active autocast region (float16 when none)."""
    return _st.autocast if _st.autocast is not None else float16


def upcast(t):
    """Inside autocast, a float16/bfloat16 tensor cast to float32 (differentiably); else t.

    For fp32-list ops written elsewhere (losses)."""
    return _ac_f32(t)
