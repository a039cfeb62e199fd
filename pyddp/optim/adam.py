"""Adam (torch.optim.Adam) on the fused C kernel."""
from __future__ import annotations

import numpy as np

from . import _scaled
from ._functional import adam_group, entry, param_array, state_zeros
from .optimizer import Optimizer

__all__ = ["Adam"]


def _check_adam_args(lr, betas, eps, weight_decay):
    lr = float(lr) if hasattr(lr, "item") else lr
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    return lr


class _AdamBase(Optimizer):
    """Shared step of Adam, AdamW and FusedAdam: one fused C call per parameter group."""

    _step_supports_amp_scaling = True
    _decoupled_key = "decoupled_weight_decay"

    def _decoupled(self, group) -> bool:
        return bool(group.get(self._decoupled_key, False))

    def _amsgrad(self, group) -> bool:
        return bool(group.get("amsgrad", False))

    def _maximize(self, group) -> bool:
        return bool(group.get("maximize", False))

    def _bias_correction(self, group) -> bool:
        return True

    def _init_state(self, p, a, st, group):
        st["step"] = np.array(0.0, dtype=np.float32)
        st["exp_avg"] = state_zeros(a)
        st["exp_avg_sq"] = state_zeros(a)
        if self._amsgrad(group):
            st["max_exp_avg_sq"] = state_zeros(a)

    def step(self, closure=None, *, grad_scale=None, found_inf=None, inv_scale=None,
             check_finite=False):
        """One optimization step over every group; returns ``closure()``'s loss if given.

        See pyddp.optim._scaled for ``grad_scale``, ``found_inf``, ``inv_scale`` and
        ``check_finite`` (gradient scaling fused into the update).
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
                st = self.state[p]
                if len(st) == 0:
                    self._init_state(p, param_array(p), st, group)
                if self._amsgrad(group) and "max_exp_avg_sq" not in st:
                    st["max_exp_avg_sq"] = state_zeros(param_array(p))
                entries.append(entry(p, st))
            if not entries:
                continue
            beta1, beta2 = group["betas"]
            adam_group(entries, lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                       eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                       amsgrad=self._amsgrad(group), maximize=self._maximize(group),
                       decoupled=self._decoupled(group),
                       bias_correction=self._bias_correction(group), inv_scale=inv,
                       found_inf=flag)
        return loss


class Adam(_AdamBase):
    """torch.optim.Adam: same arguments, param_groups and state (step, exp_avg, exp_avg_sq,
    max_exp_avg_sq).

    Every group runs in one fused C call (float32 arithmetic following torch 2.13's formulas;
    float16/bfloat16 parameters are updated in float32 with float32 state and rounded back;
    float64 parameters use NumPy in float64).  ``foreach`` and ``fused`` are accepted for
    compatibility (the update is always fused); ``capturable`` and ``differentiable`` must be False.
    ``decoupled_weight_decay=True`` makes it AdamW.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        lr = _check_adam_args(lr, betas, eps, weight_decay)
        if capturable:
            raise ValueError("capturable=True (CUDA graphs) is not supported by pyddp.optim")
        if differentiable:
            raise ValueError("differentiable=True is not supported by pyddp.optim")
        betas = tuple(float(b) for b in betas)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)
