"""apex.parallel.LARC: layer-wise adaptive rate control wrapped around an optimizer.

``from apex.parallel.LARC import LARC`` ports as ``from pyddp.parallel.LARC import LARC`` (or
``pyddp.nn.parallel.LARC``).  Same arithmetic as apex's: before the wrapped optimizer's step,
each parameter's gradient becomes ``(grad + wd * p) * adaptive_lr`` with
``adaptive_lr = trust_coefficient * |p| / (|grad| + |p| * wd + eps)``, clipped to
``min(adaptive_lr / lr, 1)`` when ``clip`` (LARC) and used as is otherwise (LARS); parameters whose
norm or gradient norm is 0 are left alone.  The groups' weight decay is absorbed for the step (set
to 0 and put back after).  Works on pyddp parameters and torch tensors (a torch optimizer).
"""
from __future__ import annotations

__all__ = ["LARC"]


def _no_grad(p):
    """A no-grad context of p's framework (pyddp's or torch's)."""
    if type(p).__module__.startswith("torch"):
        import torch
        return torch.no_grad()
    from ... import autograd
    return autograd.no_grad()


class LARC:
    """LARC(optimizer, trust_coefficient=0.02, clip=True, eps=1e-8): wraps ``optimizer``; its
    ``param_groups``, ``state``, ``state_dict``, ``load_state_dict``, ``zero_grad`` and
    ``add_param_group`` are the wrapped optimizer's, as in apex.  ``amp.initialize`` accepts it
    as an optimizer."""

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    @property
    def state(self):
        """The wrapped optimizer's state."""
        return self.optim.state

    def __repr__(self):
        return self.optim.__repr__()

    @property
    def param_groups(self):
        """The wrapped optimizer's parameter groups (settable)."""
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    @property
    def defaults(self):
        """The wrapped optimizer's defaults."""
        return self.optim.defaults

    def state_dict(self):
        """The wrapped optimizer's state_dict (LARC keeps no state of its own)."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        """Load into the wrapped optimizer."""
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad."""
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        """Add a group to the wrapped optimizer."""
        self.optim.add_param_group(param_group)

    def step(self, closure=None):
        """Scale every gradient by its adaptive rate, then the wrapped optimizer's step."""
        weight_decays = []
        for group in self.optim.param_groups:
            # absorb the weight decay: LARC applies it itself
            weight_decay = group["weight_decay"] if "weight_decay" in group else 0
            weight_decays.append(weight_decay)
            group["weight_decay"] = 0
            for p in group["params"]:
                if p.grad is None:
                    continue
                with _no_grad(p):
                    param_norm = float(p.data.norm())
                    grad_norm = float(p.grad.data.norm())
                    if param_norm != 0 and grad_norm != 0:
                        adaptive_lr = self.trust_coefficient * param_norm / (
                            grad_norm + param_norm * weight_decay + self.eps)
                        if self.clip:
                            # so that adaptive_lr * lr == min(adaptive_lr, lr)
                            adaptive_lr = min(adaptive_lr / group["lr"], 1)
                        if weight_decay:
                            p.grad.data.add_(p.data, alpha=weight_decay)
                        p.grad.data.mul_(adaptive_lr)
        try:
            return self.optim.step(closure) if closure is not None else self.optim.step()
        finally:
            # give the weight decay back to the optimizer
            for i, group in enumerate(self.optim.param_groups):
                group["weight_decay"] = weight_decays[i]
