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

__all__ = ["fused_adam", "fused_sgd"]

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _params_list(params):
    params = list(params)
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
