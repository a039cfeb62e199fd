"""apex.parallel.Reducer: gradients averaged over the ranks when the caller says so."""
from __future__ import annotations

import numpy as np

from ..._interop import host_array, is_torch_tensor
from ...distributed import distributed_c10d as c10d

__all__ = ["Reducer"]


def _flat_call(arrays, fn):
    """``fn`` on one flat buffer per dtype holding ``arrays``, copied back afterwards (torch
    tensors: one per dtype and device, with torch's operations, so CUDA tensors stay on the GPU)."""
    if arrays and is_torch_tensor(arrays[0]):
        import torch

        groups = {}
        for a in arrays:
            groups.setdefault((a.dtype, a.device), []).append(a)
        with torch.no_grad():
            for group in groups.values():
                flat = torch.cat([a.reshape(-1) for a in group])
                fn(flat)
                off = 0
                for a in group:
                    a.copy_(flat[off:off + a.numel()].view_as(a))
                    off += a.numel()
        return
    by_dtype = {}
    for a in arrays:
        by_dtype.setdefault(a.dtype, []).append(a)
    for dt, group in by_dtype.items():
        flat = np.concatenate([a.reshape(-1) for a in group]) if group else np.empty(0, dt)
        fn(flat)
        off = 0
        for a in group:
            a[...] = flat[off:off + a.size].reshape(a.shape)
            off += a.size


class Reducer:
    """``Reducer(module_or_grads_list)``: with a module, its parameters are broadcast from rank 0
    now and ``reduce()`` averages the gradients of its parameters over the ranks; with a list of
    gradient tensors, ``reduce()`` averages those (apex.parallel.Reducer)."""

    def __init__(self, module_or_grads_list):
        if hasattr(module_or_grads_list, "parameters") and callable(module_or_grads_list.parameters):
            self.module = module_or_grads_list
            self.grads = None
            arrays = [_arr(p, "parameter") for p in self.module.parameters()]
            _flat_call(arrays, lambda flat: c10d.broadcast(flat, 0))
        else:
            self.module = None
            self.grads = []
            _extract(module_or_grads_list, self.grads)
            if not self.grads:
                raise TypeError("Reducer: expected a module or an iterable of gradient tensors")

    def reduce(self):
        """All-reduce and average the gradients (one flat buffer per dtype)."""
        if self.module is not None:
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        else:
            grads = self.grads
        world = c10d.get_world_size()

        def avg(flat):
            c10d.all_reduce(flat)
            if isinstance(flat, np.ndarray):
                np.divide(flat, world, out=flat, casting="unsafe")
            else:
                flat.div_(world)
        _flat_call([_arr(g, "grad") for g in grads], avg)


def _arr(t, name):
    """A torch tensor as itself (detached, any device), anything else as a host array."""
    return t.detach() if is_torch_tensor(t) else host_array(t, name)


def _extract(obj, out):
    if isinstance(getattr(obj, "_data", None), np.ndarray) or type(obj).__module__.startswith(
            "torch"):
        out.append(obj)
        return
    try:
        items = iter(obj)
    except TypeError:
        return
    for item in items:
        _extract(item, out)
