"""FusedLAMB with apex.optimizers.FusedLAMB's signature, for torch parameters (pyddp.optim._torch_fused:
torch's foreach kernels, any device). pyddp has no LAMB kernel for its own tensors."""
from __future__ import annotations

from .fused_adam import _TorchParamsDispatch

__all__ = ["FusedLAMB"]


class FusedLAMB(metaclass=_TorchParamsDispatch):
    """apex.optimizers.FusedLAMB: ``FusedLAMB(params, lr=1e-3, bias_correction=True,
    betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, amsgrad=False, adam_w_mode=True,
    grad_averaging=True, set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False)`` on torch
    parameters (CPU or CUDA), with torch's foreach kernels; pyddp tensors raise TypeError."""

    _torch_factory = "fused_lamb"

    def __init__(self, params, *args, **kwargs):
        raise TypeError("FusedLAMB: params must be torch tensors (pyddp has no LAMB kernel for "
                        "pyddp tensors; use pyddp.optim.AdamW or FusedAdam)")
