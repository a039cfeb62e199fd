"""SGD (torch.optim.SGD) on the fused C kernel."""
from __future__ import annotations

from . import _scaled
from ._functional import entry, sgd_group
from .optimizer import Optimizer, required

__all__ = ["SGD"]


class _SGDBase(Optimizer):
    """Shared step of SGD and FusedSGD: one fused C call per parameter group."""

    _step_supports_amp_scaling = True

    def step(self, closure=None, *, grad_scale=None, found_inf=None, inv_scale=None,
             check_finite=False):
        """One optimization step over every group; returns ``closure()``'s loss if given.

        See pyddp.optim._scaled for ``grad_scale``, ``found_inf``, ``inv_scale`` and
        ``check_finite``.
        """
        loss = self._run_closure(closure)
        inv, flag, skip = _scaled.resolve(self, grad_scale, found_inf, inv_scale, check_finite)
        self.last_step_skipped = skip
        if skip:
            return loss
        for group in self.param_groups:
            entries = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                # torch keeps no state without momentum; master copies live there too
                st = self.state[p] if group["momentum"] != 0 or p in self.state else {}
                entries.append(entry(p, st))
            if not entries:
                continue
            sgd_group(entries, lr=float(group["lr"]), momentum=float(group["momentum"]),
                      dampening=float(group["dampening"]),
                      weight_decay=float(group["weight_decay"]),
                      nesterov=bool(group["nesterov"]),
                      maximize=bool(group.get("maximize", False)), inv_scale=inv,
                      found_inf=flag)
        return loss


def _check_sgd_args(lr, momentum, dampening, weight_decay, nesterov):
    if lr is not required and lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if momentum < 0.0:
        raise ValueError(f"Invalid momentum value: {momentum}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")


class SGD(_SGDBase):
    """torch.optim.SGD: momentum, dampening, nesterov, weight_decay, maximize; state
    'momentum_buffer' per parameter (when momentum != 0).

    Every group runs in one fused C call (float32 arithmetic, torch 2.13's formulas; float16 /
    bfloat16 params updated in float32 with a float32 momentum buffer; float64 via NumPy).
    ``foreach`` / ``fused`` are accepted for compatibility; ``differentiable`` must be False.
    """

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        _check_sgd_args(lr, momentum, dampening, weight_decay, nesterov)
        if differentiable:
            raise ValueError("differentiable=True is not supported by pyddp.optim")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
