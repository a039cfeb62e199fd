"""AdamW (torch.optim.AdamW): Adam with decoupled weight decay, on the fused C kernel."""
from __future__ import annotations

from .adam import Adam

__all__ = ["AdamW"]


class AdamW(Adam):
    """torch.optim.AdamW: ``param *= 1 - lr * weight_decay`` before the Adam update.

    Same arguments as torch (weight_decay defaults to 1e-2); see :class:`pyddp.optim.Adam`.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def _after_load(self):
        super()._after_load()
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
