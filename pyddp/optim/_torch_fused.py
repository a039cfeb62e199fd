"""apex's FusedAdam and FusedSGD for torch parameters: torch's own fused (or foreach) kernels.

``pyddp.optimizers.FusedAdam(model.parameters(), ...)`` given torch tensors builds one of the
classes here: torch.optim.Adam / SGD underneath (``fused=True`` where torch has a fused kernel for
the parameters' device and dtype, else ``foreach=True``), with apex's argument names and
semantics: ``adam_w_mode`` (True: decoupled weight decay, torch's AdamW; False: L2 added to the
gradient, torch's Adam), ``set_grad_none``, apex's refusals (``amsgrad=True``). The same code runs
on CPU tensors and CUDA tensors; the state (``step``, ``exp_avg``, ``exp_avg_sq``,
``momentum_buffer``) and ``state_dict`` are torch's, and torch's GradScaler / pyddp's GradScaler
pass ``grad_scale`` / ``found_inf`` to the fused step as torch's do.

Imported only when the parameters are torch tensors.
"""
from __future__ import annotations

import torch

__all__ = ["fused_adam", "fused_sgd", "fused_lamb"]

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _params_list(params):
    """The parameters as a list, every param group's "params" read once into a list of its own (a
    generator read here for the fused-kernel check would otherwise reach torch empty)."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params argument given to the optimizer should be an iterable of Tensors or "
                        f"dicts, but got {torch.typename(params)}")
    params = [dict(p, params=[p["params"]] if isinstance(p["params"], torch.Tensor)
                   else list(p["params"])) if isinstance(p, dict) else p for p in params]
    if not params:
        raise ValueError("optimizer got an empty parameter list")
    return params


def _tensors(params):
    for p in params:
        if isinstance(p, dict):
            yield from p["params"] if not isinstance(p["params"], torch.Tensor) else [p["params"]]
        else:
            yield p


def _can_fuse(params) -> bool:
    """torch's fused kernels: CUDA (and CPU) floating tensors, one device type."""
    ts = list(_tensors(params))
    types = {t.device.type for t in ts}
    return len(types) == 1 and types <= {"cuda", "cpu"} and \
        all(t.dtype in _FUSED_DTYPES for t in ts)


class _SkipMixin:
    """``last_step_skipped`` as pyddp's optimizers have it: whether the last step was skipped for
    the found_inf a GradScaler passed (read lazily: no device sync in step)."""

    _found_inf_seen = None

    def step(self, closure=None):
        found = getattr(self, "found_inf", None)
        self._found_inf_seen = found.detach().clone() if isinstance(found, torch.Tensor) else None
        return super().step(closure)

    @property
    def last_step_skipped(self) -> bool:
        f = self._found_inf_seen
        return bool(f is not None and float(f.reshape(-1)[0].item()) != 0.0)


_classes = {}


def _adam_class():
    cls = _classes.get("adam")
    if cls is None:
        class FusedAdam(_SkipMixin, torch.optim.Adam):
            """apex.optimizers.FusedAdam on torch parameters (torch's fused Adam/AdamW kernel).

            Args (apex's): params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
            adam_w_mode=True, weight_decay=0.0, amsgrad=False (True raises, as apex),
            set_grad_none=True. Keyword-only: maximize, capturable (torch's).
            """

            def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                         eps=1e-8, adam_w_mode=True, weight_decay=0.0, amsgrad=False,
                         set_grad_none=True, *, master_weights=False, maximize=False,
                         capturable=False):
                if amsgrad:
                    raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
                if not bias_correction:
                    raise ValueError("FusedAdam: bias_correction=False is not supported for torch "
                                     "parameters (torch's Adam kernels always correct the bias)")
                if master_weights:
                    raise ValueError("FusedAdam: master_weights=True is for pyddp parameters; "
                                     "for torch models use amp.initialize(opt_level='O2')")
                params = _params_list(params)
                fused = _can_fuse(params)
                super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 amsgrad=False, maximize=maximize, capturable=capturable,
                                 foreach=None if fused else True, fused=fused or None,
                                 decoupled_weight_decay=bool(adam_w_mode))
                self.adam_w_mode = 1 if adam_w_mode else 0
                self.set_grad_none = set_grad_none

            def zero_grad(self, set_to_none=None):
                """Clear gradients: to None when ``set_to_none`` (default: set_grad_none)."""
                super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

        cls = _classes["adam"] = FusedAdam
    return cls


def _sgd_class():
    cls = _classes.get("sgd")
    if cls is None:
        class FusedSGD(_SkipMixin, torch.optim.SGD):
            """apex.optimizers.FusedSGD on torch parameters (torch's fused SGD kernel).

            Args (apex's): params, lr (required), momentum=0, dampening=0, weight_decay=0,
            nesterov=False, wd_after_momentum=False (True with weight_decay != 0 raises),
            materialize_master_grads=True (accepted), set_grad_none=False.
            """

            def __init__(self, params, lr=None, momentum=0, dampening=0, weight_decay=0,
                         nesterov=False, wd_after_momentum=False, materialize_master_grads=True,
                         set_grad_none=False, *, master_weights=False, maximize=False):
                if lr is None:
                    raise TypeError("FusedSGD: lr is required")
                if wd_after_momentum and weight_decay != 0:
                    raise ValueError("FusedSGD: wd_after_momentum=True is not supported by pyddp")
                if master_weights:
                    raise ValueError("FusedSGD: master_weights=True is for pyddp parameters; "
                                     "for torch models use amp.initialize(opt_level='O2')")
                params = _params_list(params)
                fused = _can_fuse(params)
                super().__init__(params, lr=lr, momentum=momentum, dampening=dampening,
                                 weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                                 foreach=None if fused else True, fused=fused or None)
                self.set_grad_none = set_grad_none
                self.wd_after_momentum = wd_after_momentum
                self.materialize_master_grads = materialize_master_grads

            def zero_grad(self, set_to_none=None):
                """Clear gradients: to None when ``set_to_none`` (default: set_grad_none)."""
                super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

        cls = _classes["sgd"] = FusedSGD
    return cls


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _lamb_class():
    cls = _classes.get("lamb")
    if cls is None:
        class FusedLAMB(torch.optim.Optimizer):
            """apex.optimizers.FusedLAMB on torch parameters, with torch's foreach kernels (any
            device): apex's multi_tensor_lamb arithmetic, step by step.

            Args (apex's): params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
            weight_decay=0.01, amsgrad=False (True raises, as apex), adam_w_mode=True,
            grad_averaging=True, set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False.

            A step: the gradients are divided by ``global_norm / max_grad_norm`` when their global
            L2 norm exceeds ``max_grad_norm``; Adam's moments (``beta3 = 1 - beta1`` with
            grad_averaging, else 1) with bias correction; the update ``m_hat / (sqrt(v_hat) + eps)``
            plus ``weight_decay * p`` (adam_w_mode; otherwise the decay is added to the gradient
            first); each parameter moves by ``lr * ||p|| / ||update||`` times its update (the trust
            ratio, when weight_decay != 0 or use_nvlamb and both norms are non-zero; else lr).
            State: 'exp_avg', 'exp_avg_sq' per parameter, 'step' per group (as apex).
            """

            def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                         eps=1e-6, weight_decay=0.01, amsgrad=False, adam_w_mode=True,
                         grad_averaging=True, set_grad_none=True, max_grad_norm=1.0,
                         use_nvlamb=False):
                if amsgrad:
                    raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
                if not 0.0 <= lr:
                    raise ValueError(f"Invalid learning rate: {lr}")
                if not 0.0 <= eps:
                    raise ValueError(f"Invalid epsilon value: {eps}")
                if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
                    raise ValueError(f"Invalid beta parameters: {betas}")
                defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas),
                                eps=eps, weight_decay=weight_decay, grad_averaging=grad_averaging,
                                max_grad_norm=max_grad_norm)
                super().__init__(_params_list(params), defaults)
                self.adam_w_mode = 1 if adam_w_mode else 0
                self.set_grad_none = set_grad_none
                self.use_nvlamb = use_nvlamb

            def zero_grad(self, set_to_none=None):
                """Clear gradients: to None when ``set_to_none`` (default: set_grad_none)."""
                super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

            @torch.no_grad()
            def step(self, closure=None):
                loss = None
                if closure is not None:
                    with torch.enable_grad():
                        loss = closure()
                grads = [p.grad for g in self.param_groups for p in g["params"]
                         if p.grad is not None]
                if not grads:
                    return loss
                if any(g.is_sparse for g in grads):
                    raise RuntimeError("FusedLAMB does not support sparse gradients")
                # one global norm over every gradient (apex: float32 accumulation per dtype)
                dev = grads[0].device
                norms = torch._foreach_norm([g.to(_acc(g.dtype)) for g in grads])
                acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else \
                    torch.float32
                global_norm = torch.linalg.vector_norm(
                    torch.stack([n.to(device=dev, dtype=acc) for n in norms]))
                for group in self.param_groups:
                    ps = [p for p in group["params"] if p.grad is not None]
                    if not ps:
                        continue
                    beta1, beta2 = group["betas"]
                    beta3 = 1.0 - beta1 if group["grad_averaging"] else 1.0
                    group["step"] = group.get("step", 0) + 1
                    step = group["step"]
                    bc1 = 1.0 - beta1 ** step if group["bias_correction"] else 1.0
                    bc2 = 1.0 - beta2 ** step if group["bias_correction"] else 1.0
                    decay, lr, eps = group["weight_decay"], group["lr"], group["eps"]
                    mgn = group["max_grad_norm"]
                    clip = torch.where(global_norm > mgn, global_norm / mgn,
                                       torch.ones_like(global_norm)) if mgn > 0 else \
                        torch.ones_like(global_norm)
                    for p in ps:
                        st = self.state[p]
                        if not st:
                            st["exp_avg"] = torch.zeros_like(p, dtype=_acc(p.dtype))
                            st["exp_avg_sq"] = torch.zeros_like(p, dtype=_acc(p.dtype))
                    # float32 arithmetic for half parameters (apex's), float64 stays float64
                    p32 = [p.to(_acc(p.dtype)) for p in ps]
                    g = torch._foreach_div([q.grad.to(_acc(q.dtype)) for q in ps], clip.to(dev))
                    if not self.adam_w_mode and decay != 0:
                        torch._foreach_add_(g, p32, alpha=decay)
                    m = [self.state[p]["exp_avg"] for p in ps]
                    v = [self.state[p]["exp_avg_sq"] for p in ps]
                    torch._foreach_mul_(m, beta1)
                    torch._foreach_add_(m, g, alpha=beta3)
                    torch._foreach_mul_(v, beta2)
                    torch._foreach_addcmul_(v, g, g, value=1.0 - beta2)
                    denom = torch._foreach_sqrt(torch._foreach_div(v, bc2))
                    torch._foreach_add_(denom, eps)
                    update = torch._foreach_div(torch._foreach_div(m, bc1), denom)
                    if self.adam_w_mode and decay != 0:
                        torch._foreach_add_(update, p32, alpha=decay)
                    if self.use_nvlamb or decay != 0:
                        pn = torch._foreach_norm(p32)
                        un = torch._foreach_norm(update)
                        ratios = [torch.where((a != 0) & (b != 0), lr * a / b,
                                              torch.full_like(a, lr)) for a, b in zip(pn, un)]
                    else:
                        ratios = None
                    for i, p in enumerate(ps):
                        r = ratios[i] if ratios is not None else lr
                        p.copy_(p32[i] - r * update[i])
                return loss

        cls = _classes["lamb"] = FusedLAMB
    return cls


def fused_lamb(params, *args, **kwargs):
    """apex's FusedLAMB for torch parameters (torch's foreach kernels, any device)."""
    return _lamb_class()(params, *args, **kwargs)


def _host_only(params, name, what):
    """pyddp's own kernels take what torch's do not (``what``), on CPU tensors only: None sends
    the caller to them; parameters on another device raise."""
    devs = {t.device.type for t in _tensors(params)}
    if devs <= {"cpu"}:
        return None
    raise ValueError(f"{name}: {what} is not supported for parameters on {sorted(devs)} (pyddp runs "
                     "it with its host kernels, on CPU tensors only); for torch models on a GPU "
                     "use amp.initialize(opt_level='O2') for float32 master weights")


def fused_adam(params, *args, **kwargs):
    """torch's FusedAdam for torch parameters, or None for pyddp's host kernels (CPU tensors with
    master_weights=True or bias_correction=False, which torch's kernels do not have)."""
    bias_correction = args[1] if len(args) > 1 else kwargs.get("bias_correction", True)
    if kwargs.get("master_weights") or not bias_correction:
        return _host_only(params, "FusedAdam", "master_weights=True or bias_correction=False")
    return _adam_class()(params, *args, **kwargs)


def fused_sgd(params, *args, **kwargs):
    """torch's FusedSGD for torch parameters, or None for pyddp's host kernels (CPU tensors with
    master_weights=True)."""
    if kwargs.get("master_weights"):
        return _host_only(params, "FusedSGD", "master_weights=True")
    return _sgd_class()(params, *args, **kwargs)
