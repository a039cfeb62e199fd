"""``apex.fp16_utils`` as apex's old ImageNet script imports it (``from apex.fp16_utils import *``
becomes ``from pyddp.fp16_utils import *``): to_python_float, network_to_half, BN_convert_float,
tofp16, prep_param_lists, model_grads_to_master_grads, master_params_to_model_params and
FP16_Optimizer (fp32 master weights for an fp16 model, static or dynamic loss scaling through
pyddp.amp's LossScaler).  New code: use pyddp.amp or pyddp.autocast with GradScaler.
"""
from __future__ import annotations

import numpy as np

from . import nn
from .amp.scaler import LossScaler
from .nn.modules.batchnorm import _BatchNorm

__all__ = ["to_python_float", "network_to_half", "BN_convert_float", "tofp16",
           "prep_param_lists", "model_grads_to_master_grads", "master_params_to_model_params",
           "FP16_Optimizer"]


def to_python_float(t):
    """A one-element tensor's value as a Python number (``t.item()``; ``t[0]`` without .item)."""
    if hasattr(t, "item"):
        return t.item()
    return t[0]


class tofp16(nn.Module):
    """A module that casts its input to float16."""

    def forward(self, input):
        return input.half()


def BN_convert_float(module):
    """Batch-norm layers (affine ones) back to float32, recursively, as apex; returns module."""
    if isinstance(module, _BatchNorm) and module.affine:
        module.float()
    for child in module.children():
        BN_convert_float(child)
    return module


def network_to_half(network):
    """``Sequential(tofp16(), BN_convert_float(network.half()))``: the network in float16 but
    its batch norms, its input cast to float16."""
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def prep_param_lists(model, flat_master=False):
    """(model_params, master_params): the trainable parameters and float32 copies of them that
    require grad (``flat_master=True``: one flat float32 parameter)."""
    from ._tensor import tensor
    model_params = [p for p in model.parameters() if p.requires_grad]
    if flat_master:
        flat = np.concatenate([p.detach().numpy().astype(np.float32).ravel()
                               for p in model_params])
        master = nn.Parameter(tensor(flat))
        return model_params, [master]
    master = [nn.Parameter(tensor(p.detach().numpy().astype(np.float32)))
              for p in model_params]
    return model_params, master


def model_grads_to_master_grads(model_params, master_params, flat_master=False):
    """Copy the model's (fp16) gradients into the master parameters' (fp32) .grad."""
    from ._tensor import tensor
    if flat_master:
        g = np.concatenate([(p.grad.numpy() if p.grad is not None else
                             np.zeros(p.shape, np.float32)).astype(np.float32).ravel()
                            for p in model_params])
        master_params[0].grad = tensor(g)
        return
    for m, p in zip(master_params, model_params):
        if p.grad is None:
            m.grad = None
        else:
            m.grad = tensor(p.grad.numpy().astype(np.float32))


def master_params_to_model_params(model_params, master_params, flat_master=False):
    """Copy the master (fp32) values back into the model's parameters."""
    if flat_master:
        flat, off = master_params[0].detach().numpy(), 0
        for p in model_params:
            n = p.numel()
            p.data.numpy()[...] = flat[off:off + n].reshape(p.shape)
            off += n
        return
    for m, p in zip(master_params, model_params):
        p.data.numpy()[...] = m.detach().numpy()


class FP16_Optimizer:
    """apex's FP16_Optimizer(init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
    dynamic_loss_args=None, verbose=True): the optimizer steps float32 master copies of the
    model's float16 parameters; ``optimizer.backward(loss)`` scales the loss, ``step()`` unscales,
    skips the step on inf/NaN (dynamic scaling) and copies the masters back."""

    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False,
                 dynamic_loss_args=None, verbose=True):
        self.optimizer = init_optimizer
        self.fp16_groups, self.fp32_from_fp16_groups = [], []
        for group in init_optimizer.param_groups:
            fp16, fp32 = [], []
            for i, p in enumerate(group["params"]):
                if p.requires_grad and p.dtype == np.float16:
                    master = nn.Parameter(p.detach().float().clone())
                    group["params"][i] = master
                    fp16.append(p)
                    fp32.append(master)
                elif p.requires_grad and p.dtype != np.float32:
                    raise TypeError("FP16_Optimizer: wrapped parameters must be float16 or "
                                    f"float32, got {p.dtype}")
            self.fp16_groups.append(fp16)
            self.fp32_from_fp16_groups.append(fp32)
        args = dict(dynamic_loss_args or {})
        self.loss_scaler = LossScaler("dynamic", **args) if dynamic_loss_scale else \
            LossScaler(float(static_loss_scale))
        self.overflow = False
        self.verbose = verbose

    @property
    def loss_scale(self):
        """The current loss scale."""
        return self.loss_scaler.loss_scale()

    @property
    def param_groups(self):
        """The wrapped optimizer's groups (holding the float32 masters)."""
        return self.optimizer.param_groups

    @property
    def state(self):
        """The wrapped optimizer's state."""
        return self.optimizer.state

    def zero_grad(self, set_grads_to_None=False):
        """Clear the masters' and the model's gradients."""
        self.optimizer.zero_grad(set_to_none=set_grads_to_None)
        for group in self.fp16_groups:
            for p in group:
                p.grad = None

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        """(loss * loss_scale).backward(), then the model's gradients into the masters."""
        (loss.float() * self.loss_scale).backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self):
        """Unscale the model's gradients into the masters' .grad; notes inf/NaN."""
        from ._tensor import tensor
        self.loss_scaler.clear_overflow_state()
        grads = []
        for fp16, fp32 in zip(self.fp16_groups, self.fp32_from_fp16_groups):
            for p, m in zip(fp16, fp32):
                if p.grad is None:
                    m.grad = None
                    continue
                m.grad = tensor(p.grad.numpy().astype(np.float32))
                grads.append(m.grad.numpy())
        for group in self.optimizer.param_groups:   # float32 model parameters stay in place
            for p in group["params"]:
                if p.grad is not None and not any(p is m for g in self.fp32_from_fp16_groups
                                                  for m in g):
                    grads.append(p.grad.numpy())
        self.loss_scaler.unscale(grads, self.loss_scale)

    def clip_master_grads(self, max_norm, norm_type=2):
        """Clip the masters' gradients (-1 on overflow, as apex)."""
        if self.loss_scaler.has_overflow():
            return -1
        params = [p for g in self.optimizer.param_groups for p in g["params"]
                  if p.grad is not None]
        return nn.utils.clip_grad_norm_(params, max_norm, norm_type)

    def step(self, closure=None):
        """Step the masters and copy them into the model (skipped, and the scale lowered, on
        inf/NaN with dynamic scaling)."""
        if closure is not None:
            raise NotImplementedError("FP16_Optimizer.step(closure) is not supported")
        self.overflow = self.loss_scaler.update_scale()
        if self.overflow:
            if self.verbose:
                print(f"OVERFLOW! Skipping step. Attempted loss scale: "
                      f"{self.loss_scale * 2 if self.loss_scaler.dynamic else self.loss_scale}, "
                      f"reducing to {self.loss_scale}")
            return None
        r = self.optimizer.step()
        for fp16, fp32 in zip(self.fp16_groups, self.fp32_from_fp16_groups):
            master_params_to_model_params(fp16, fp32)
        return r

    def state_dict(self):
        """The wrapped optimizer's state, the scaler's and the masters."""
        return {"loss_scaler": self.loss_scaler.__dict__.copy(), "overflow": self.overflow,
                "optimizer_state_dict": self.optimizer.state_dict(),
                "fp32_from_fp16": [[m.detach().numpy().copy() for m in g]
                                   for g in self.fp32_from_fp16_groups]}

    def load_state_dict(self, state_dict):
        """Restore what state_dict() returned."""
        self.loss_scaler.__dict__.update(state_dict["loss_scaler"])
        self.overflow = state_dict["overflow"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        for g, saved in zip(self.fp32_from_fp16_groups, state_dict["fp32_from_fp16"]):
            for m, s in zip(g, saved):
                m.data.numpy()[...] = s
