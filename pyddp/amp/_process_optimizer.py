"""How amp.initialize changes an optimizer (apex's _process_optimizer).

Every processed optimizer gets an ``_amp_stash`` and two methods scale_loss calls around the
backward: ``_prepare_amp_backward`` (stash already-unscaled gradients, so gradient accumulation
over several scale_loss blocks works) and ``_post_amp_backward(scaler)`` (unscale the new
gradients and check them for inf/NaN in one C pass, then add the stash back).

With master weights (O2) every float16 parameter of the optimizer is replaced in its
param_groups by a float32 master Parameter; the float16 model gradients are cast into the
masters' float32 gradients (one ``_C.cast_`` call) and unscaled there (one ``_C.amp_unscale_``
call), and after each ``optimizer.step()`` the masters are cast back into the model parameters
(one ``_C.cast_`` call, round to nearest even).
"""
from __future__ import annotations

import types

import numpy as np

from .. import _kernels
from . import _fw
from ._amp_state import _amp_state, maybe_print


class AmpOptimizerState:
    """The per-optimizer bookkeeping (apex's ``optimizer._amp_stash``)."""

    def __init__(self):
        self.already_patched = False
        self.params_have_scaled_gradients = False
        self.all_fp16_params = []
        self.all_fp32_from_fp16_params = []
        self.all_fp32_params = []          # parameters the optimizer steps directly
        self.all_fp32_grad_stash = []
        self.masters_checked = True
        self.skip_next = None              # (loss_id, scaler) after an overflow


def _grad_arr(p):
    g = p.grad
    if g is None:
        return None
    # torch gradients stay torch tensors (any device): amp runs torch's kernels on them
    return g if _fw.is_torch(g) else _kernels.as_array(g, "grad")


# ------------------------------------------------------------------ no master weights
def _prepare_backward_no_master_weights(self):
    stash = self._amp_stash
    for i, param in enumerate(stash.all_fp32_params):
        stash.all_fp32_grad_stash[i] = param.grad
        param.grad = None


def _post_backward_models_are_masters(scaler, params, stashed_grads):
    scale = scaler.loss_scale()
    if scale == 1.0 and not scaler.dynamic:
        for i in range(len(stashed_grads)):
            stashed_grads[i] = None
        return
    fresh = []
    with_stash = []
    for i, (param, stashed) in enumerate(zip(params, stashed_grads)):
        if param.grad is None and stashed is not None:
            param.grad = stashed
        elif param.grad is not None:
            fresh.append(_grad_arr(param))
            if stashed is not None:
                with_stash.append((fresh[-1], stashed if _fw.is_torch(stashed)
                                   else _kernels.as_array(stashed, "grad")))
    # out = grad / scale (+ stashed, which is already unscaled); the check covers the new grads
    scaler.unscale(fresh, scale)
    for g, s in with_stash:
        if _fw.is_torch(g):
            g.add_(s)
        else:
            np.add(g, s, out=g, casting="unsafe")
    for i in range(len(stashed_grads)):
        stashed_grads[i] = None


def _post_backward_no_master_weights(self, scaler):
    stash = self._amp_stash
    _post_backward_models_are_masters(scaler, stash.all_fp32_params, stash.all_fp32_grad_stash)


# ------------------------------------------------------------------ master weights (O2)
def _sync_masters(stash):
    """Refresh masters whose model parameter no longer rounds-trips from them (the model was
    changed after initialize, e.g. DistributedDataParallel broadcast rank 0's parameters)."""
    stash.masters_checked = True
    if stash.all_fp16_params and _fw.is_torch(stash.all_fp16_params[0]):
        import torch

        with torch.no_grad():
            for p, m in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
                if not torch.equal(m.to(p.dtype), p):
                    m.copy_(p)
        return
    model = [_kernels.as_array(p, "param") for p in stash.all_fp16_params]
    if not model:
        return
    rounded = [np.empty(a.shape, dtype=a.dtype) for a in model]
    _kernels.cast_(rounded, stash.all_fp32_from_fp16_params)
    for a, r, m in zip(model, rounded, stash.all_fp32_from_fp16_params):
        if not np.array_equal(a.view(np.uint16), r.view(np.uint16)):
            _kernels.as_array(m, "master")[...] = a


def _prepare_backward_with_master_weights(self):
    stash = self._amp_stash
    if not stash.masters_checked:
        _sync_masters(stash)
    for param in stash.all_fp16_params:
        param.grad = None
    for i, param in enumerate(stash.all_fp32_params):
        stash.all_fp32_grad_stash[i] = param.grad
        param.grad = None


def _post_backward_with_master_weights(self, scaler):
    stash = self._amp_stash
    new_src, new_dst = [], []
    acc = []
    for fp16_param, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        g16 = _grad_arr(fp16_param)
        if g16 is None:
            continue
        if master.grad is None:
            new_src.append(g16)
            new_dst.append(_fw.new_grad(master))
        else:
            acc.append((g16, _grad_arr(master)))
    scale = scaler.loss_scale()
    if (new_dst or acc) and _fw.is_torch((new_dst or [acc[0][1]])[0]):
        # torch: the same steps with torch's kernels, on the parameters' device
        if new_dst:
            _fw.torch_copy_(new_dst, new_src)
            scaler.unscale(new_dst, scale)
        if acc:
            tmp = [g.float() for g, _ in acc]
            scaler.unscale(tmp, scale)
            for t, (_, m) in zip(tmp, acc):
                m.add_(t)
        _post_backward_models_are_masters(scaler, stash.all_fp32_params,
                                          stash.all_fp32_grad_stash)
        return
    if new_dst:
        _kernels.cast_(new_dst, new_src)       # float16 -> float32, one C call
        scaler.unscale(new_dst, scale)         # unscale + inf/NaN check, one C pass
    if acc:
        tmp = [np.empty(g.shape, dtype=np.float32) for g, _ in acc]
        _kernels.cast_(tmp, [g for g, _ in acc])
        scaler.unscale(tmp, scale)
        for t, (_, m) in zip(tmp, acc):
            m += t
    _post_backward_models_are_masters(scaler, stash.all_fp32_params, stash.all_fp32_grad_stash)


def _master_params_to_model_params(self):
    stash = self._amp_stash
    if stash.all_fp16_params:
        if _fw.is_torch(stash.all_fp16_params[0]):
            _fw.torch_copy_(stash.all_fp16_params, stash.all_fp32_from_fp16_params)
        else:
            _kernels.cast_(stash.all_fp16_params, stash.all_fp32_from_fp16_params)


def _setup_master_weights(optimizer, stash):
    for group in optimizer.param_groups:
        params = group["params"]
        for i, p in enumerate(params):
            name = _fw.dtype_name(p)
            if name == "float16":
                master = _fw.make_master(p)
                params[i] = master
                stash.all_fp16_params.append(p)
                stash.all_fp32_from_fp16_params.append(master)
                _amp_state.masters[id(p)] = (p, master)
                if p in optimizer.state:
                    optimizer.state[master] = optimizer.state.pop(p)
            elif name == "float32":
                stash.all_fp32_params.append(p)
            else:
                raise TypeError("Optimizer's parameters must be either torch.cuda.FloatTensor "
                                "or torch.cuda.HalfTensor (float32 or float16). Received "
                                f"{name}")
    stash.all_fp32_grad_stash = [None for _ in stash.all_fp32_params]
    # DistributedDataParallel, built after initialize, broadcasts rank 0's parameters into the
    # model: the first backward re-reads masters that no longer match their model parameter.
    stash.masters_checked = False


def process_optimizer(optimizer, properties):
    """Attach amp's stash and methods to ``optimizer`` (in place) and return it."""
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    optimizer._amp_stash = stash = AmpOptimizerState()
    if properties.master_weights:
        _setup_master_weights(optimizer, stash)
        optimizer._master_params_to_model_params = types.MethodType(
            _master_params_to_model_params, optimizer)
        old_zero_grad = optimizer.zero_grad

        def new_zero_grad(self, set_to_none=None):
            # the model's float16 grads as zero_grad would; the masters' grads (independent of
            # the model's) are dropped
            for param in stash.all_fp16_params:
                param.grad = None
            old_zero_grad() if set_to_none is None else old_zero_grad(set_to_none)
            for param in stash.all_fp32_from_fp16_params:
                param.grad = None

        optimizer.zero_grad = types.MethodType(new_zero_grad, optimizer)
        optimizer._prepare_amp_backward = types.MethodType(
            _prepare_backward_with_master_weights, optimizer)
        optimizer._post_amp_backward = types.MethodType(
            _post_backward_with_master_weights, optimizer)
    else:
        for group in optimizer.param_groups:
            stash.all_fp32_params.extend(group["params"])
        stash.all_fp32_grad_stash = [None for _ in stash.all_fp32_params]
        optimizer._prepare_amp_backward = types.MethodType(
            _prepare_backward_no_master_weights, optimizer)
        optimizer._post_amp_backward = types.MethodType(
            _post_backward_no_master_weights, optimizer)
    _patch_step(optimizer, stash, properties)
    return optimizer


def _patch_step(optimizer, stash, properties):
    """One step wrapper for the life of the optimizer: it skips the step once after an overflow
    (apex swaps ``step`` for a one-shot skip function; a flag does the same and keeps an lr
    scheduler's step counting intact), copies O2 masters back into the model after a step, and
    under O1 runs the step with casts disabled."""
    old_step = optimizer.step
    master_weights = bool(properties.master_weights)
    patched = bool(properties.patch_torch_functions)

    def step(self, closure=None, *args, **kwargs):
        if stash.skip_next is not None:
            loss_id, scaler = stash.skip_next
            stash.skip_next = None
            if closure is not None:
                raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
            maybe_print("Gradient overflow.  Skipping step, loss scaler "
                        f"{loss_id} reducing loss scale to {scaler.loss_scale()}", rank0=True)
            for param in stash.all_fp32_from_fp16_params:
                param.grad = None
            self.last_step_skipped = True
            if getattr(step, "_wrapped_by_lr_sched", False):
                self._opt_called = True  # what the scheduler's own wrapper would have noted
            return None
        if master_weights and closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        if patched:
            from .handle import disable_casts

            with disable_casts():
                retval = old_step(closure, *args, **kwargs)
        else:
            retval = old_step(closure, *args, **kwargs)
        if master_weights:
            self._master_params_to_model_params()
            for param in stash.all_fp32_from_fp16_params:
                param.grad = None
        return retval

    if getattr(old_step, "_wrapped_by_lr_sched", False):  # a scheduler made before initialize
        step._wrapped_by_lr_sched = True
    step.__doc__ = getattr(old_step, "__doc__", None)
    optimizer.step = types.MethodType(step, optimizer)
