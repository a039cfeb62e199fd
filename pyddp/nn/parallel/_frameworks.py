"""What DistributedDataParallel needs from a model's framework, for pyddp.nn and for torch.nn.

The reducer works on NumPy arrays only; an adapter turns a framework's parameters and gradients
into arrays that share their memory (no copies), installs the per-parameter "gradient is final"
hooks and queues the end-of-backward callback.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..._interop import is_torch_module, is_torch_tensor  # noqa: F401  (imported from here)


class PyddpAdapter:
    """pyddp.nn modules: Tensors wrap NumPy arrays in ``_data``."""

    name = "pyddp"

    @staticmethod
    def array(t) -> np.ndarray:
        return t._data

    @staticmethod
    def grad_array(p):
        g = p.grad
        return None if g is None else g._data

    @staticmethod
    def set_grad(p, arr):
        """Make ``arr`` (no copy) the parameter's gradient; returns the tensor now in ``.grad``."""
        from ..._tensor import Tensor

        t = p.grad = Tensor(arr)
        return t

    @staticmethod
    def grad_ptr(p) -> int:
        """Address of the gradient's first element, 0 without one."""
        g = p._grad
        return 0 if g is None else g._data.__array_interface__["data"][0]

    @staticmethod
    def grad_tensor(p):
        return p._grad

    @staticmethod
    def evacuate(t):
        """Give a gradient tensor DDP handed out memory of its own (same values)."""
        t._data = t._data.copy()

    @staticmethod
    def wrap(arr):
        from ..._tensor import Tensor

        return Tensor(arr)

    @staticmethod
    def post_accumulate_hook(p, fn):
        return p.register_post_accumulate_grad_hook(fn)

    # pyddp's linear computes a weight's gradient straight into this array during the next
    # backward (pyddp._tensor._claim_grad_dest); None withdraws the offer
    offers_grad_dest = True

    @staticmethod
    def offer_grad_dest(p, arr):
        try:
            p._grad_dest = arr
        except AttributeError:  # a Tensor with slots only: no offer
            pass

    @staticmethod
    def queue_callback(fn):
        from ... import autograd

        autograd.queue_callback(fn)

    @staticmethod
    def grad_enabled() -> bool:
        from ... import _tensor

        return _tensor.is_grad_enabled()

    @staticmethod
    def no_grad():
        from ... import _tensor

        return _tensor.no_grad()


class TorchAdapter:
    """torch.nn modules on the CPU: ``tensor.detach().numpy()`` shares the tensor's memory."""

    name = "torch"

    @staticmethod
    def array(t) -> np.ndarray:
        import torch

        if t.device.type != "cpu":
            raise ValueError(
                f"DistributedDataParallel on the 'cpu' backend needs CPU tensors, got one on {t.device}")
        t = t.detach()
        if t.dtype == torch.bfloat16:
            try:
                import ml_dtypes
            except ImportError:  # pragma: no cover - ml_dtypes is installed with the test extras
                raise TypeError("bfloat16 torch parameters need ml_dtypes installed") from None
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    @classmethod
    def grad_array(cls, p):
        g = p.grad
        return None if g is None else cls.array(g)

    @staticmethod
    def set_grad(p, arr):
        t = p.grad = TorchAdapter.wrap(arr)
        return t

    @staticmethod
    def grad_ptr(p) -> int:
        g = p.grad
        return 0 if g is None else g.data_ptr()

    @staticmethod
    def grad_tensor(p):
        return p.grad

    @staticmethod
    def evacuate(t):
        t.data = t.detach().clone()

    @staticmethod
    def wrap(arr):
        import torch

        if arr.dtype.name == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)

    @staticmethod
    def post_accumulate_hook(p, fn):
        return p.register_post_accumulate_grad_hook(fn)

    offers_grad_dest = False  # torch's autograd allocates its gradients itself

    @staticmethod
    def offer_grad_dest(p, arr):
        pass

    @staticmethod
    def queue_callback(fn):
        import torch

        torch.autograd.Variable._execution_engine.queue_callback(fn)

    @staticmethod
    def grad_enabled() -> bool:
        import torch

        return torch.is_grad_enabled()

    @staticmethod
    def no_grad():
        import torch

        return torch.no_grad()


def adapter_for(module):
    if is_torch_module(module):
        return TorchAdapter
    try:
        from ..modules.module import Module
    except ImportError:  # pragma: no cover
        Module = None
    if Module is not None and isinstance(module, Module):
        return PyddpAdapter
    raise TypeError("DistributedDataParallel: module must be a pyddp.nn.Module or a torch.nn.Module, "
                    f"got {type(module).__name__}")


@contextlib.contextmanager
def nullcontext():
    yield
