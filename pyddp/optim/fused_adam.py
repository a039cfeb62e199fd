"""FusedAdam with apex.optimizers.FusedAdam's signature, on pyddp's multi-tensor C kernel."""
from __future__ import annotations

import numpy as np

from .._kernels import cast_
from ._functional import state_zeros
from .adam import _AdamBase, _check_adam_args

__all__ = ["FusedAdam"]


class FusedAdam(_AdamBase):
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
    """

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
