"""The other torch.optim optimizers training scripts use: RMSprop, Adagrad, Adadelta, Adamax,
NAdam, RAdam and Rprop, with torch 2.13's formulas (its single-tensor path) and state keys, in
NumPy (float16 / bfloat16 parameters are updated in float32 and rounded back)."""
from __future__ import annotations

import numpy as np

from . import _scaled
from ._functional import grad_array, param_array
from .optimizer import Optimizer

__all__ = ["RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "Rprop"]


def _check(name, value, low=0.0, high=None, closed_high=False):
    ok = value >= low and (high is None or (value <= high if closed_high else value < high))
    if not ok:
        raise ValueError(f"Invalid {name}: {value}")


class _NumpyOptimizer(Optimizer):
    """Loops over parameters with gradients; subclasses define _update(p32, g32, state, group).
    GradScaler unscales their gradients before step (no fused scaling)."""

    _step_supports_amp_scaling = False

    def step(self, closure=None, *, grad_scale=None, found_inf=None, inv_scale=None,
             check_finite=False):
        """One optimization step over every group; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        inv, flag, skip = _scaled.resolve(self, grad_scale, found_inf, inv_scale, check_finite)
        self.last_step_skipped = skip
        if skip:
            return loss
        scale = None if inv is None else float(np.asarray(inv).reshape(-1)[0])
        for group in self.param_groups:
            for p in group["params"]:
                g = grad_array(p)
                if g is None:
                    continue
                a = param_array(p)
                work = a.dtype if a.dtype == np.float64 else np.float32
                x = a.astype(work, copy=True).reshape(-1)
                gg = np.asarray(g, dtype=work).reshape(-1)
                if scale is not None:
                    gg = gg * scale
                if group.get("maximize", False):
                    gg = -gg
                st = self.state[p]
                if not st:
                    self._init_state(st, x, group)
                self._update(x, gg, st, group)
                a[...] = x.reshape(a.shape).astype(a.dtype)
        return loss


class RMSprop(_NumpyOptimizer):
    """torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
    centered=False, maximize=False)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        for n, v in (("learning rate", lr), ("epsilon value", eps),
                     ("momentum value", momentum), ("weight_decay value", weight_decay),
                     ("alpha value", alpha)):
            _check(n, v)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered,
                                      capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["square_avg"] = np.zeros_like(x)
        if group["momentum"] > 0:
            st["momentum_buffer"] = np.zeros_like(x)
        if group["centered"]:
            st["grad_avg"] = np.zeros_like(x)

    def _update(self, x, g, st, group):
        st["step"] += 1
        alpha, wd = group["alpha"], group["weight_decay"]
        if wd:
            g = g + wd * x
        sq = st["square_avg"]
        sq *= alpha
        sq += (1 - alpha) * g * g
        if group["centered"]:
            ga = st["grad_avg"]
            ga += (g - ga) * (1 - alpha)
            avg = np.sqrt(sq - ga * ga)
        else:
            avg = np.sqrt(sq)
        avg += group["eps"]
        if group["momentum"] > 0:
            buf = st["momentum_buffer"]
            buf *= group["momentum"]
            buf += g / avg
            x -= group["lr"] * buf
        else:
            x -= group["lr"] * (g / avg)


class Adagrad(_NumpyOptimizer):
    """torch.optim.Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0,
    initial_accumulator_value=0, eps=1e-10, maximize=False)."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        for n, v in (("learning rate", lr), ("lr_decay value", lr_decay),
                     ("weight_decay value", weight_decay),
                     ("initial_accumulator_value value", initial_accumulator_value),
                     ("epsilon value", eps)):
            _check(n, v)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["sum"] = np.full_like(x, group["initial_accumulator_value"])

    def _update(self, x, g, st, group):
        st["step"] += 1
        step = float(st["step"])
        if group["weight_decay"]:
            g = g + group["weight_decay"] * x
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        st["sum"] += g * g
        x -= clr * (g / (np.sqrt(st["sum"]) + group["eps"]))


class Adadelta(_NumpyOptimizer):
    """torch.optim.Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, maximize=False)."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        _check("learning rate", lr)
        _check("rho value", rho, 0.0, 1.0, closed_high=True)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, capturable=capturable, foreach=foreach,
                                      differentiable=differentiable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["square_avg"] = np.zeros_like(x)
        st["acc_delta"] = np.zeros_like(x)

    def _update(self, x, g, st, group):
        st["step"] += 1
        rho, eps = group["rho"], group["eps"]
        if group["weight_decay"]:
            g = g + group["weight_decay"] * x
        sq, acc = st["square_avg"], st["acc_delta"]
        sq *= rho
        sq += (1 - rho) * g * g
        delta = np.sqrt(acc + eps) / np.sqrt(sq + eps) * g
        acc *= rho
        acc += (1 - rho) * delta * delta
        x -= group["lr"] * delta


class Adamax(_NumpyOptimizer):
    """torch.optim.Adamax(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    maximize=False)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 foreach=None, *, maximize=False, differentiable=False, capturable=False):
        _check("learning rate", lr)
        _check("epsilon value", eps)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        _check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, capturable=capturable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["exp_avg"] = np.zeros_like(x)
        st["exp_inf"] = np.zeros_like(x)

    def _update(self, x, g, st, group):
        st["step"] += 1
        step = float(st["step"])
        b1, b2 = group["betas"]
        if group["weight_decay"]:
            g = g + group["weight_decay"] * x
        m, u = st["exp_avg"], st["exp_inf"]
        m += (g - m) * (1 - b1)
        np.maximum(u * b2, np.abs(g) + group["eps"], out=u)
        clr = group["lr"] / (1 - b1 ** step)
        x -= clr * (m / u)


class NAdam(_NumpyOptimizer):
    """torch.optim.NAdam(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    momentum_decay=4e-3, decoupled_weight_decay=False, maximize=False)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None,
                 maximize=False, capturable=False, differentiable=False):
        _check("learning rate", lr)
        _check("epsilon value", eps)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        _check("weight_decay value", weight_decay)
        _check("momentum_decay value", momentum_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["mu_product"] = np.array(1.0, np.float32)
        st["exp_avg"] = np.zeros_like(x)
        st["exp_avg_sq"] = np.zeros_like(x)

    def _update(self, x, g, st, group):
        st["step"] += 1
        step = float(st["step"])
        b1, b2 = group["betas"]
        lr, wd, md = group["lr"], group["weight_decay"], group["momentum_decay"]
        bc2 = 1 - b2 ** step
        if wd:
            if group["decoupled_weight_decay"]:
                x *= 1 - lr * wd
            else:
                g = g + wd * x
        mu = b1 * (1.0 - 0.5 * (0.96 ** (step * md)))
        mu_next = b1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * md)))
        st["mu_product"] = np.array(st["mu_product"] * np.float32(mu), np.float32)
        mp = float(st["mu_product"])
        m, v = st["exp_avg"], st["exp_avg_sq"]
        m += (g - m) * (1 - b1)
        v *= b2
        v += (1 - b2) * g * g
        denom = np.sqrt(v / bc2) + group["eps"]
        x += (-lr * (1.0 - mu) / (1.0 - mp)) * (g / denom)
        x += (-lr * mu_next / (1.0 - mp * mu_next)) * (m / denom)


class RAdam(_NumpyOptimizer):
    """torch.optim.RAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    decoupled_weight_decay=False, maximize=False)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False):
        _check("learning rate", lr)
        _check("epsilon value", eps)
        _check("beta parameter at index 0", betas[0], 0.0, 1.0)
        _check("beta parameter at index 1", betas[1], 0.0, 1.0)
        _check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize, foreach=foreach, capturable=capturable,
                                      differentiable=differentiable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["exp_avg"] = np.zeros_like(x)
        st["exp_avg_sq"] = np.zeros_like(x)

    def _update(self, x, g, st, group):
        st["step"] += 1
        step = float(st["step"])
        b1, b2 = group["betas"]
        lr, wd = group["lr"], group["weight_decay"]
        if wd:
            if group["decoupled_weight_decay"]:
                x *= 1 - lr * wd
            else:
                g = g + wd * x
        m, v = st["exp_avg"], st["exp_avg_sq"]
        m += (g - m) * (1 - b1)
        v *= b2
        v += (1 - b2) * g * g
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        mhat = m / bc1
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * step * (b2 ** step) / bc2
        if rho_t > 5.0:
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf /
                    ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive = (bc2 ** 0.5) / (np.sqrt(v) + group["eps"])
            x -= mhat * lr * adaptive * rect
        else:
            x -= mhat * lr


class Rprop(_NumpyOptimizer):
    """torch.optim.Rprop(params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50),
    maximize=False)."""

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        _check("learning rate", lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, dict(lr=lr, etas=etas, step_sizes=step_sizes,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, capturable=capturable))

    def _init_state(self, st, x, group):
        st["step"] = np.array(0.0, np.float32)
        st["prev"] = np.zeros_like(x)
        st["step_size"] = np.full_like(x, group["lr"])

    def _update(self, x, g, st, group):
        st["step"] += 1
        etaminus, etaplus = group["etas"]
        lo, hi = group["step_sizes"]
        s = np.sign(g * st["prev"])
        factor = np.where(s > 0, etaplus, np.where(s < 0, etaminus, 1.0)).astype(x.dtype)
        ss = st["step_size"]
        ss *= factor
        np.clip(ss, lo, hi, out=ss)
        g = np.where(factor == etaminus, 0, g).astype(x.dtype)
        x -= np.sign(g) * ss
        st["prev"][...] = g
