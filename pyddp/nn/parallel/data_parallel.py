"""DataParallel (torch.nn.DataParallel) as torch behaves on a machine without several GPUs.

torch's DataParallel replicates the module over the visible GPUs; where there is no GPU it keeps
the module, sets ``device_ids = []`` and its forward is the module's forward. pyddp runs on the
CPU, so this is what it does, always: scripts written for DataParallel run unchanged, their
checkpoints carry torch's "module." prefix, and ``model.module`` is the wrapped model. For
parallel training over processes use DistributedDataParallel.
"""
from __future__ import annotations

from ..._interop import is_torch_module
from ..modules.module import Module

__all__ = ["DataParallel", "data_parallel"]


class DataParallel(Module):
    """Wrap ``module`` (``dp.module``); forward calls it (the single-device case of torch's
    DataParallel). ``device_ids``/``output_device``/``dim`` are kept as torch keeps them."""

    def __new__(cls, module=None, *args, **kwargs):
        if module is not None and is_torch_module(module):
            # a torch model: torch's own DataParallel (the same behaviour on this machine)
            import torch
            return torch.nn.DataParallel(module, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be a pyddp.nn.Module, got "
                            f"{type(module).__name__}")
        self.module = module
        self.device_ids = []
        self.dim = dim
        self.output_device = None
        self.src_device_obj = None

    def forward(self, *inputs, **kwargs):
        """The wrapped module's forward."""
        return self.module(*inputs, **kwargs)


def data_parallel(module, inputs, device_ids=None, output_device=None, dim=0, module_kwargs=None):
    """torch.nn.parallel.data_parallel: ``module(*inputs, **module_kwargs)`` on this machine."""
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    return module(*inputs, **(module_kwargs or {}))
