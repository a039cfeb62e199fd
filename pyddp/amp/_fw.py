"""The few framework-specific operations amp needs, for pyddp.nn and torch.nn models."""
from __future__ import annotations

import numpy as np

from .._interop import is_torch_module, is_torch_tensor, loaded_torch as _torch
from .._kernels import as_array


def dtype_name(x) -> str:
    """'float32', 'float16', 'bfloat16', 'float64', ... for an array or tensor."""
    if is_torch_tensor(x):
        return str(x.dtype).replace("torch.", "")
    d = getattr(x, "_data", x)
    return d.dtype.name if isinstance(d, np.ndarray) else np.asarray(d).dtype.name

__all__ = ["is_torch", "dtype_name", "as_array", "is_module", "is_optimizer", "make_master",
           "new_grad", "to_type", "cast_module", "is_batchnorm", "is_ddp"]

is_torch = is_torch_tensor


def is_module(m) -> bool:
    """A pyddp.nn.Module or a torch.nn.Module."""
    from ..nn.modules.module import Module

    return isinstance(m, Module) or is_torch_module(m)


def is_optimizer(o) -> bool:
    """A pyddp.optim.Optimizer, a torch.optim.Optimizer, or apex's LARC wrapping one (which apex's
    amp.initialize accepts too)."""
    from ..nn.parallel.LARC import LARC
    from ..optim.optimizer import Optimizer

    if isinstance(o, (Optimizer, LARC)):
        return True
    torch = _torch()
    return torch is not None and isinstance(o, torch.optim.Optimizer)


def is_ddp(m):
    """The name of the data-parallel wrapper ``m`` is, or None."""
    from ..nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(m, DistributedDataParallel):
        return "pyddp.nn.parallel.DistributedDataParallel"
    if isinstance(m, DataParallel):
        return "pyddp.nn.parallel.DataParallel"
    torch = _torch()
    if torch is not None:
        if isinstance(m, torch.nn.parallel.DistributedDataParallel):
            return "torch.nn.parallel.DistributedDataParallel"
        if isinstance(m, torch.nn.DataParallel):
            return "torch.nn.parallel.DataParallel"
    return None


def is_batchnorm(m) -> bool:
    """Batch norm with affine parameters (apex keeps these in float32 under keep_batchnorm_fp32)."""
    from ..nn.modules.batchnorm import _BatchNorm

    if isinstance(m, _BatchNorm):
        return bool(getattr(m, "affine", True))
    torch = _torch()
    if torch is not None and isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
        return bool(m.affine)
    return False


def _np_dtype(name):
    return {"float16": np.float16, "float32": np.float32, "float64": np.float64}[name]


def _torch_dtype(name):
    torch = _torch()
    return {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
            "bfloat16": torch.bfloat16}[name]


def dtype_str(dtype) -> str:
    """'float16' / 'float32' / ... for a NumPy, pyddp or torch dtype (or its name)."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return dtype.replace("torch.", "")
    s = str(dtype)
    if s.startswith("torch."):
        return s[6:]
    try:
        return np.dtype(dtype).name
    except TypeError:
        return s


def to_type(dtype_name_, t):
    """apex's to_type: a floating tensor (pyddp, torch or ndarray) cast to the dtype, else t."""
    if is_torch_tensor(t):
        if t.is_floating_point():
            return t.to(_torch_dtype(dtype_name_))
        return t
    d = getattr(t, "_data", None)
    if isinstance(d, np.ndarray):
        if d.dtype.kind == "f" and d.dtype.name != dtype_name_:
            return t.to(_np_dtype(dtype_name_))
        return t
    if isinstance(t, np.ndarray) and t.dtype.kind == "f" and t.dtype.name != dtype_name_:
        return t.astype(_np_dtype(dtype_name_))
    return t


def applier(value, fn):
    """apex's applier: fn applied to every tensor in nested tuples, lists and dicts."""
    if is_torch_tensor(value) or isinstance(getattr(value, "_data", None), np.ndarray) or \
            isinstance(value, np.ndarray):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((k, applier(v, fn)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(applier(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(applier(v, fn) for v in value)
    return value


def cast_module(model, dtype_name_, keep_batchnorm_fp32):
    """Cast a model's floating parameters and buffers in place (Parameter objects kept);
    affine batch-norm layers stay float32 when keep_batchnorm_fp32 (apex's convert_network)."""
    if is_torch_module(model):
        dt = _torch_dtype(dtype_name_)

        def fn(t):
            return t.to(dt) if t.is_floating_point() else t
    else:
        dt = _np_dtype(dtype_name_)

        def fn(a):
            return a.astype(dt) if a.dtype.kind == "f" and a.dtype != dt else a
    if not keep_batchnorm_fp32:
        if is_torch_module(model):
            model.to(dt)
        else:
            model._apply(fn)
        return
    for m in model.modules():
        if is_batchnorm(m):
            continue
        m._apply(fn, recurse=False)


def make_master(p):
    """A float32 leaf copy of parameter ``p`` that requires grad (amp O2's master weight)."""
    if is_torch_tensor(p):
        m = p.detach().clone().float()
        m.requires_grad_(True)
        return m
    from ..nn.parameter import Parameter

    return Parameter(np.array(as_array(p), dtype=np.float32, copy=True),
                     requires_grad=True)


def new_grad(master) -> np.ndarray:
    """Give ``master`` a fresh (uninitialised) float32 gradient; returns its array (a torch
    tensor on the master's device for torch masters)."""
    if is_torch_tensor(master):
        torch = _torch()
        master.grad = torch.empty_like(master)
        return master.grad
    from .._tensor import Tensor

    arr = np.empty(master._data.shape, dtype=np.float32)
    master.grad = Tensor(arr)
    return arr


def detach_copy_value(master):
    """What model.state_dict() shows for a parameter with a master: the master, detached."""
    return master.detach()


# ------------------------------------------------------------------ torch tensors, any device
# amp's kernels on torch gradients are torch's own, so the same code runs on CPU and CUDA tensors.

def torch_unscale_(grads, found, inv_scale):
    """torch's fused unscale-and-check (``torch._amp_foreach_non_finite_check_and_unscale_``,
    what torch.amp.GradScaler runs): every gradient times ``inv_scale`` in place, inf/NaN recorded
    in a one-element float32 flag per device. ``found`` maps device -> flag (created as needed);
    returns it."""
    torch = _torch()
    groups = {}
    for g in grads:
        groups.setdefault(g.device, {}).setdefault(g.dtype, []).append(g)
    for dev, by_dtype in groups.items():
        flag = found.get(dev)
        if flag is None:
            flag = found[dev] = torch.zeros(1, dtype=torch.float32, device=dev)
        if isinstance(inv_scale, torch.Tensor):
            inv = inv_scale.to(device=dev, dtype=torch.float32).reshape(1)
        else:
            inv = torch.full((1,), float(np.asarray(inv_scale, dtype=np.float32).reshape(-1)[0]),
                             dtype=torch.float32, device=dev)
        for gs in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, inv)
    return found


def torch_copy_(dsts, srcs):
    """dst <- src for each pair (cast to dst's dtype, round to nearest even), without autograd."""
    torch = _torch()
    with torch.no_grad():
        torch._foreach_copy_(list(dsts), list(srcs))
