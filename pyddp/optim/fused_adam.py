"""FusedAdam with apex.optimizers.FusedAdam's signature, on pyddp's multi-tensor C kernel."""
from __future__ import annotations

import numpy as np

from .._detect import is_torch_tensor
from .._kernels import cast_
from ._functional import state_zeros
from .adam import _AdamBase, _check_adam_args

__all__ = ["FusedAdam"]


class _TorchParamsDispatch(type):
    """Given torch parameters, apex's name builds pyddp.optim._torch_fused's torch optimizer
    (torch's fused kernels on the parameters' device); pyddp parameters get this class."""

    _torch_factory = None  # the name of the factory in pyddp.optim._torch_fused

    def __call__(cls, params=None, *args, **kwargs):
        if params is None:
            raise TypeError(f"{cls.__name__}() missing 1 required positional argument: 'params'")
        if not isinstance(params, (list, tuple)) and not is_torch_tensor(params):
            params = list(params)  # a generator is read once, here
        if _first_torch(params):
            from . import _torch_fused

            opt = getattr(_torch_fused, cls._torch_factory)(params, *args, **kwargs)
            if opt is not None:
                return opt
        return super().__call__(params, *args, **kwargs)

    def __instancecheck__(cls, obj):
        t = type(obj)
        return super().__instancecheck__(obj) or (
            t.__module__ == "pyddp.optim._torch_fused" and t.__name__ == cls.__name__)


def _first_torch(params) -> bool:
    if is_torch_tensor(params):
        return True
    for p in params:
        if isinstance(p, dict):
            ps = p.get("params")
            if is_torch_tensor(ps):
                return True
            ps = list(ps) if ps is not None else []
            p["params"] = ps
            return bool(ps) and is_torch_tensor(ps[0])
        return is_torch_tensor(p)
    return False


class FusedAdam(_AdamBase, metaclass=_TorchParamsDispatch):
    """apex.optimizers.FusedAdam: one C call updates every parameter of a group (GIL released).

    Args (apex's): params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
        adam_w_mode=True (decoupled weight decay, torch's AdamW; False: L2 added to the gradient,
        torch's Adam), weight_decay=0.0, amsgrad=False (True raises, as apex), set_grad_none=True
        (zero_grad() sets grads to None).
    pyddp additions (keyword-only): master_weights=False -- float16/bfloat16 parameters get a
        float32 master copy (state['master_param']) that the kernel updates and rounds (to
        nearest even) into the parameter each step; without it a half parameter is widened,
        updated in float32 and rounded back.  maximize=False.

    State per parameter: 'step', 'exp_avg', 'exp_avg_sq' (float32).  ``step(grad_scale=...,
    found_inf=..., inv_scale=..., check_finite=...)`` fuses gradient unscaling and the
    overflow skip into the update (see pyddp.optim._scaled).

    Given torch parameters (any device) this name builds torch's optimizer with torch's fused
    kernel and apex's arguments instead (pyddp.optim._torch_fused).
    """

    _torch_factory = "fused_adam"

    _decoupled_key = "adam_w_mode"

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True, *,
                 master_weights=False, maximize=False, capturable=False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if capturable:
            raise ValueError("capturable=True (CUDA graphs) is not supported by pyddp.optim")
        lr = _check_adam_args(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction,
                        betas=tuple(float(b) for b in betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=bool(adam_w_mode),
                        maximize=maximize)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.master_weights = master_weights
        super().__init__(params, defaults)

    def _bias_correction(self, group) -> bool:
        return bool(group["bias_correction"])

    def _amsgrad(self, group) -> bool:
        return False

    def _init_state(self, p, a, st, group):
        super()._init_state(p, a, st, group)
        if self.master_weights and a.dtype in (np.float16, np.uint16):
            master = state_zeros(a)
            cast_([master], [p])
            st["master_param"] = master

    def zero_grad(self, set_to_none=None):
        """Clear gradients: to None when ``set_to_none`` (default: the set_grad_none argument),
        else to zeros in place."""
        if set_to_none is None:
            set_to_none = self.set_grad_none
        super().zero_grad(set_to_none)
