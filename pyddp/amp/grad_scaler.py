"""GradScaler: torch.amp.GradScaler's API, state machine and messages, for pyddp and torch
optimizers on the CPU.

The scale and growth tracker are float32 / int32 one-element arrays (torch keeps float32 and
int32 tensors) updated with torch's ``_amp_update_scale_`` rule in float32:
found inf -> ``scale *= backoff_factor``, tracker = 0; else tracker += 1 and when it reaches
``growth_interval`` ``scale *= growth_factor`` (only if the result is finite), tracker = 0.
Unscaling is pyddp's fused kernel (``_C.amp_unscale_``: multiply by 1/scale and check for
inf/NaN in one pass).
"""
from __future__ import annotations

import inspect
import warnings
from collections import defaultdict
from enum import Enum

import numpy as np

from .. import _kernels
from . import _fw

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    """Per-optimizer stage within one iteration (torch.amp.grad_scaler.OptState)."""
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state():
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _is_pyddp_tensor(x) -> bool:
    return isinstance(getattr(x, "_data", None), np.ndarray)


class GradScaler:
    """torch.amp.GradScaler(device="cpu", init_scale=2.**16, growth_factor=2.0,
    backoff_factor=0.5, growth_interval=2000, enabled=True).

    ``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()``; ``unscale_``
    between backward and step for gradient clipping.  ``device`` is "cpu" or "cuda" (torch's
    signature): the scale stays in host memory either way; torch gradients are unscaled and checked
    where they are, with torch's fused kernel, one found-inf flag per device.
    """

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        kind = getattr(device, "type", device)
        if not isinstance(kind, str) or kind.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"GradScaler: device must be 'cpu' or 'cuda' (a GPU's gradients are "
                             f"unscaled where they are), got {device!r}")
        self._device = device
        self._enabled = enabled
        if self._enabled:
            assert growth_factor > 1.0, "The growth factor must be > 1.0."
            assert backoff_factor < 1.0, "The backoff factor must be < 1.0."
            self._init_scale = init_scale
            self._scale = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker = None
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _check_scale_growth_tracker(self, funcname):
        fix = ("This may indicate your script did not use scaler.scale(loss or outputs) earlier "
               "in the iteration.")
        assert self._scale is not None, f"Attempted {funcname} but _scale is None.  " + fix
        assert self._growth_tracker is not None, \
            f"Attempted {funcname} but _growth_tracker is None.  " + fix
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self):
        assert self._growth_tracker is None, "_growth_tracker initialized before _scale"
        self._scale = np.full((), self._init_scale, dtype=np.float32)
        self._growth_tracker = np.full((), self._init_growth_tracker, dtype=np.int32)

    def _scale_for(self, t):
        if _fw.is_torch(t):
            import torch

            return torch.from_numpy(self._scale.copy()).to(t.device)
        from .._tensor import Tensor

        return Tensor(self._scale.copy())

    def scale(self, outputs):
        """Multiply a loss (or a nested list/tuple of outputs) by the scale factor."""
        if not self._enabled:
            return outputs
        if _fw.is_torch(outputs) or _is_pyddp_tensor(outputs):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker()
            return outputs * self._scale_for(outputs)

        def apply_scale(val):
            if _fw.is_torch(val) or _is_pyddp_tensor(val):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker()
                return val * self._scale_for(val)
            if isinstance(val, (list, tuple)):
                iterable = map(apply_scale, val)
                return type(val)(iterable)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        grads = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if (not allow_fp16) and _fw.dtype_name(param.grad) == "float16":
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if _fw.is_torch(param.grad) and param.grad.is_sparse:
                    raise NotImplementedError("sparse gradients are not supported by pyddp's "
                                              "GradScaler")
                grads.append(param.grad)
        if grads and _fw.is_torch(grads[0]):
            # torch's fused unscale-and-check on each device's gradients (one flag per device)
            return _fw.torch_unscale_(grads, {}, inv_scale)
        if grads:
            _kernels.unscale_(grads, found_inf, inv_scale)
        return {"cpu": found_inf}

    def unscale_(self, optimizer):
        """Divide the optimizer's gradients by the scale, in place, and record inf/NaN.

        At most once per optimizer between update() calls."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # the reciprocal in float64, rounded to float32 (as torch)
        inv_scale = np.array([np.float32(1.0 / np.float64(self._scale))], dtype=np.float32)
        found_inf = np.zeros(1, dtype=np.float32)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(
            optimizer, inv_scale, found_inf, False)
        optimizer_state["stage"] = OptState.UNSCALED

    def _check_inf_per_device(self, optimizer):
        self._check_scale_growth_tracker("_check_inf_per_device")
        found_inf = np.zeros(1, dtype=np.float32)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = \
            self._unscale_grads_(optimizer, 1.0, found_inf, True)
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer):
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        retval = None
        found = optimizer_state["found_inf_per_device"].values()
        if not sum(float(v.reshape(-1)[0]) for v in found):
            retval = optimizer.step(*args, **kwargs)
        return retval

    def step(self, optimizer, *args, **kwargs):
        """Unscale (if unscale_ was not called) and run ``optimizer.step()`` unless a gradient
        was inf/NaN.  Returns what optimizer.step returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError(
                "Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        retval = None
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # The optimizer unscales inside its fused step: hand it grad_scale and found_inf.
            kwargs_ = kwargs
            has_grad_scaler_kwarg = "grad_scaler" in inspect.signature(
                optimizer.step).parameters
            if has_grad_scaler_kwarg:
                warnings.warn(
                    "GradScaler is going to stop passing itself as a keyword argument to the "
                    "passed optimizer. In the near future GradScaler registers `grad_scale: "
                    "Tensor` and `found_inf: Tensor` to the passed optimizer and let the "
                    "optimizer use them directly.", FutureWarning, stacklevel=2)
                kwargs_.update({"grad_scaler": self})
            else:
                if optimizer_state["stage"] is OptState.READY:
                    self._check_inf_per_device(optimizer)
                found = sum(np.float32(float(t.reshape(-1)[0]))
                            for t in optimizer_state["found_inf_per_device"].values())
                found_inf = np.asarray(found, dtype=np.float32).reshape(1)
                p0 = optimizer.param_groups[0]["params"][0]
                if _fw.is_torch(p0):
                    import torch

                    # on the parameters' device, 0-d as torch's GradScaler passes them: torch's
                    # fused kernels read them there (and subtract found_inf from 0-d step counts)
                    scaler = torch.from_numpy(self._scale.reshape(()).copy()).to(p0.device)
                    found_inf = torch.from_numpy(found_inf.reshape(())).to(p0.device)
                else:
                    scaler = self._scale.reshape(1).copy()
                optimizer.grad_scale = (
                    getattr(optimizer, "grad_scale", None)
                    if optimizer_state["stage"] == OptState.UNSCALED
                    else scaler * getattr(optimizer, "grad_scale", 1))
                optimizer.found_inf = found_inf
            retval = optimizer.step(*args, **kwargs_)
            optimizer_state["stage"] = OptState.STEPPED
            if not has_grad_scaler_kwarg:
                del optimizer.grad_scale
                del optimizer.found_inf
            return retval

        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        assert len(optimizer_state["found_inf_per_device"]) > 0, \
            "No inf checks were recorded for this optimizer."
        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale=None):
        """Update the scale for the next iteration (or set it to ``new_scale``)."""
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, float):
                self._scale[...] = new_scale
            else:
                reason = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                          "torch.FloatTensor with requires_grad=False.")
                arr = new_scale.detach().cpu().numpy() if _fw.is_torch(new_scale) else \
                    _kernels.as_array(new_scale, "new_scale")
                assert arr.size == 1, reason
                assert not getattr(new_scale, "requires_grad", False), reason
                self._scale[...] = np.float32(arr.reshape(-1)[0])
        else:
            found_infs = [np.float32(float(f.reshape(-1)[0]))
                          for state in self._per_optimizer_states.values()
                          for f in state["found_inf_per_device"].values()]
            assert len(found_infs) > 0, "No inf checks were recorded prior to update."
            found_inf_combined = np.float32(0.0)
            for f in found_infs:
                found_inf_combined = np.float32(found_inf_combined + f)
            if found_inf_combined:
                self._scale[...] = np.float32(_scale * np.float32(self._backoff_factor))
                self._growth_tracker[...] = 0
            else:
                successful = int(_growth_tracker) + 1
                if successful == self._growth_interval:
                    new = np.float32(_scale * np.float32(self._growth_factor))
                    if np.isfinite(new):
                        self._scale[...] = new
                    self._growth_tracker[...] = 0
                else:
                    self._growth_tracker[...] = successful
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _get_scale_async(self):
        return self._scale

    def get_scale(self):
        """The current scale as a Python float (1.0 when disabled)."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale)
        return 1.0

    def get_growth_factor(self):
        """The growth factor."""
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        """Set the growth factor."""
        self._growth_factor = new_factor

    def get_backoff_factor(self):
        """The backoff factor."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        """Set the backoff factor."""
        self._backoff_factor = new_factor

    def get_growth_interval(self):
        """The growth interval."""
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        """Set the growth interval."""
        self._growth_interval = new_interval

    def _get_growth_tracker(self):
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None \
                else int(self._growth_tracker)
        return 0

    def is_enabled(self):
        """Whether scaling is enabled."""
        return self._enabled

    def state_dict(self):
        """``{'scale', 'growth_factor', 'backoff_factor', 'growth_interval', '_growth_tracker'}``
        ({} when disabled)."""
        if self._enabled:
            return {
                "scale": self.get_scale(),
                "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker(),
            }
        return {}

    def load_state_dict(self, state_dict):
        """Restore from ``state_dict()`` (also a torch GradScaler's)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled "
                "instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale[...] = state_dict["scale"]
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker[...] = state_dict["_growth_tracker"]

    def __getstate__(self):
        state = self.__dict__.copy()
        if self._enabled:
            assert len(self._per_optimizer_states) == 0, (
                "A GradScaler instance may only be pickled at the beginning of an iteration, "
                "or at the end after scaler.update().")
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
