"""FusedSGD with apex.optimizers.FusedSGD's signature, on pyddp's multi-tensor C kernel."""
from __future__ import annotations

import numpy as np

from .._kernels import cast_
from .fused_adam import _TorchParamsDispatch
from ._functional import param_array, state_zeros
from .optimizer import required
from .sgd import _SGDBase, _check_sgd_args

__all__ = ["FusedSGD"]


class FusedSGD(_SGDBase, metaclass=_TorchParamsDispatch):
    """apex.optimizers.FusedSGD: torch.optim.SGD's math, one C call per group (GIL released).

    Args (apex's): params, lr (required), momentum=0, dampening=0, weight_decay=0,
        nesterov=False, wd_after_momentum=False (True with weight_decay != 0 is not supported:
        ValueError), materialize_master_grads=True (accepted; gradients are read in their own
        dtype), set_grad_none=False.
    pyddp additions (keyword-only): master_weights=False (float32 master copies of half
        parameters, as FusedAdam), maximize=False.  ``step`` takes grad_scale / found_inf /
        inv_scale / check_finite (pyddp.optim._scaled).

    Given torch parameters (any device) this name builds torch's optimizer with torch's fused
    kernel and apex's arguments instead (pyddp.optim._torch_fused).
    """

    _torch_factory = "fused_sgd"

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, wd_after_momentum=False, materialize_master_grads=True,
                 set_grad_none=False, *, master_weights=False, maximize=False):
        _check_sgd_args(lr, momentum, dampening, weight_decay, nesterov)
        if wd_after_momentum and weight_decay != 0:
            raise ValueError("FusedSGD: wd_after_momentum=True is not supported by pyddp")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.set_grad_none = set_grad_none
        self.master_weights = master_weights
        super().__init__(params, defaults)

    def step(self, closure=None, *, grad_scale=None, found_inf=None, inv_scale=None,
             check_finite=False):
        """One step over every group; returns ``closure()``'s loss if given."""
        if self.master_weights:
            for group in self.param_groups:
                for p in group["params"]:
                    a = param_array(p)
                    st = self.state[p]
                    if a.dtype in (np.float16, np.uint16) and "master_param" not in st:
                        master = state_zeros(a)
                        cast_([master], [p])
                        st["master_param"] = master
        return super().step(closure, grad_scale=grad_scale, found_inf=found_inf,
                            inv_scale=inv_scale, check_finite=check_finite)

    def zero_grad(self, set_to_none=None):
        """Clear gradients: to None when ``set_to_none`` (default: set_grad_none), else zero."""
        if set_to_none is None:
            set_to_none = self.set_grad_none
        super().zero_grad(set_to_none)
