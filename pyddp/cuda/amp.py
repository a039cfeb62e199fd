"""``pyddp.cuda.amp``: torch.cuda.amp's GradScaler and autocast.

Under PYDDP_CUDA_ON_CPU=1 they work as on a GPU (autocast computes the listed ops in float16 on
the CPU, GradScaler scales and unscales pyddp's gradients).  Without the stand-in and without a
GPU they answer as torch's CPU build does: a warning, and they disable themselves.
"""
from __future__ import annotations

import warnings

from .. import _autocast
from ..amp import grad_scaler as _gs

__all__ = ["GradScaler", "autocast", "custom_fwd", "custom_bwd"]


def _cuda_ok(what) -> bool:
    from . import is_available
    if is_available():
        return True
    warnings.warn(f"torch.cuda.amp.{what} is enabled, but CUDA is not available.  Disabling.",
                  stacklevel=3)
    return False


class GradScaler(_gs.GradScaler):
    """torch.cuda.amp.GradScaler(init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if enabled:
            enabled = _cuda_ok("GradScaler")
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


class autocast(_autocast.autocast):
    """torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)."""

    def __init__(self, enabled=True, dtype=None, cache_enabled=True):
        if enabled:
            enabled = _cuda_ok("autocast")
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.enabled, self.fast_dtype):
                return fn(*args, **kwargs)
        return wrapper


def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.cuda.amp.custom_fwd: decorate an autograd Function's forward.  With
    ``cast_inputs=dtype`` inside an enabled autocast region, floating-point Tensor arguments are
    cast to ``dtype`` and forward runs with autocast off (as torch); otherwise it runs as is."""
    import functools

    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        from .._tensor import Tensor
        from .._tensor._grad_mode import _st
        if cast_inputs is None or _st.autocast is None:
            return fwd(*args, **kwargs)

        def cast(x):
            if isinstance(x, Tensor) and x.is_floating_point():
                return x.to(cast_inputs)
            return x
        with _autocast.autocast("cuda", enabled=False):
            return fwd(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
    return decorate_fwd


def custom_bwd(bwd):
    """torch.cuda.amp.custom_bwd: decorate an autograd Function's backward (pyddp runs backward
    without autocast, as a custom_fwd forward with cast inputs ran)."""
    return bwd
