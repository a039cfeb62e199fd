"""What DistributedDataParallel needs from a model's framework, for pyddp.nn and for torch.nn.

DDP's core is written once against an adapter: for pyddp.nn models the arrays are NumPy arrays
(a Tensor's ``_data``), for torch models they are torch tensors on the parameters' device and every
operation on buckets and gradients is torch's own (``copy_``, ``mul_``, ``zero_``, views), so the
same code runs on CPU tensors and on CUDA tensors. The adapter also installs the per-parameter
"gradient is final" hooks and queues the end-of-backward callback.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..._interop import is_torch_module, is_torch_tensor  # noqa: F401  (imported from here)


class PyddpAdapter:
    """pyddp.nn modules: Tensors wrap NumPy arrays in ``_data``; DDP's buckets are NumPy arrays."""

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

    # ---- the array operations DDP's core uses on buckets and gradients (NumPy)

    @staticmethod
    def as_array(x):
        """A hook's result (tensor, array, ...) as an array of this framework."""
        if isinstance(x, np.ndarray):
            return x
        if hasattr(x, "_data") and isinstance(x._data, np.ndarray):
            return x._data
        if is_torch_tensor(x):
            from ..._interop import cpu_array
            return cpu_array(x, "tensor")
        return np.asarray(x)

    @staticmethod
    def contiguous(a) -> bool:
        return a.flags.c_contiguous

    @staticmethod
    def numel(a) -> int:
        return a.size

    @staticmethod
    def ptr(a) -> int:
        return a.__array_interface__["data"][0]

    @staticmethod
    def zeros(n, dtype, like=None):
        return np.zeros(n, dtype=dtype)

    @staticmethod
    def empty(n, dtype, like=None):
        return np.empty(n, dtype=dtype)

    @staticmethod
    def host_dtype(dtype):
        """The NumPy dtype of a bucket that may live in shared host memory, else None."""
        return dtype

    @staticmethod
    def on_host(a) -> bool:
        return True

    @staticmethod
    def from_host(arr, like=None):
        return arr

    @staticmethod
    def alias(v):
        """A new array object sharing ``v``'s memory."""
        return v.view()

    @staticmethod
    def clone(v):
        return v.copy()

    @staticmethod
    def copy_(dst, src):
        np.copyto(dst, src, casting="unsafe")

    @staticmethod
    def copy_many(dsts, srcs):
        for d, s in zip(dsts, srcs):
            np.copyto(d, s, casting="unsafe")

    @staticmethod
    def scale_(dst, src, factor):
        """dst = src * factor (dst may be src)."""
        np.multiply(src, factor, out=dst, casting="unsafe")

    @staticmethod
    def zero_(a):
        a[...] = 0

    @staticmethod
    def writeable(a) -> bool:
        return a.flags.writeable

    @staticmethod
    def is_low_float(a) -> bool:
        dt = a.dtype
        return dt.kind == "f" and dt.itemsize < 4 or dt.name == "bfloat16"

    @staticmethod
    def to_float32(a):
        return a.astype(np.float32)

    @staticmethod
    def devices(module):
        return {"cpu"}

    @staticmethod
    def is_cpu_device(d) -> bool:
        return True


class TorchAdapter:
    """torch.nn modules, on any device: buckets are torch tensors in the parameters' dtype and
    device, gradients are views of them, every operation is torch's own (CPU tensors in CI, CUDA
    tensors on a GPU run the same code)."""

    name = "torch"

    @staticmethod
    def array(t):
        return t.detach()

    @staticmethod
    def grad_array(p):
        g = p.grad
        return None if g is None else g.detach()

    @staticmethod
    def set_grad(p, arr):
        # a fresh alias each time: DDP keeps only a weak reference to what it hands out, so that
        # a .grad still held elsewhere after zero_grad(set_to_none=True) is seen (see _held);
        # detach() makes it in 0.35 us, view(shape) took 2.5 (a step calls this once per parameter)
        t = p.grad = arr.detach()
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
        return arr

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

    # ---- the array operations DDP's core uses on buckets and gradients (torch's, any device)

    @staticmethod
    def as_array(x):
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach()
        if hasattr(x, "_data") and isinstance(x._data, np.ndarray):
            x = x._data
        return torch.as_tensor(np.asarray(x))

    @staticmethod
    def contiguous(a) -> bool:
        return a.is_contiguous()

    @staticmethod
    def numel(a) -> int:
        return a.numel()

    @staticmethod
    def ptr(a) -> int:
        return a.data_ptr()

    @staticmethod
    def zeros(n, dtype, like=None):
        import torch

        return torch.zeros(n, dtype=dtype, device=None if like is None else like.device)

    @staticmethod
    def empty(n, dtype, like=None):
        import torch

        return torch.empty(n, dtype=dtype, device=None if like is None else like.device)

    @staticmethod
    def host_dtype(dtype):
        import torch

        if dtype == torch.bfloat16 or dtype.is_complex or dtype == torch.bool:
            return None
        return torch.empty(0, dtype=dtype).numpy().dtype

    @staticmethod
    def on_host(a) -> bool:
        return a.device.type == "cpu"

    @staticmethod
    def from_host(arr, like=None):
        import torch

        return torch.from_numpy(arr)

    @staticmethod
    def alias(v):
        return v.detach()

    @staticmethod
    def clone(v):
        return v.detach().clone()

    @staticmethod
    def copy_(dst, src):
        dst.copy_(src)

    @staticmethod
    def copy_many(dsts, srcs):
        """dst.copy_(src) for each pair, as one torch call (one kernel launch per bucket on a GPU)."""
        import torch

        if len(dsts) > 1 and hasattr(torch, "_foreach_copy_"):
            with torch.no_grad():
                torch._foreach_copy_(dsts, srcs)
        else:
            for d, s in zip(dsts, srcs):
                d.copy_(s)

    @staticmethod
    def scale_(dst, src, factor):
        if dst is src or (dst.data_ptr() == src.data_ptr() and dst.dtype == src.dtype):
            dst.mul_(factor)
        elif dst.dtype == src.dtype:
            import torch

            torch.mul(src, factor, out=dst)
        else:
            dst.copy_(src * factor)

    @staticmethod
    def zero_(a):
        a.zero_()

    @staticmethod
    def writeable(a) -> bool:
        return True

    @staticmethod
    def is_low_float(a) -> bool:
        return a.is_floating_point() and a.element_size() < 4

    @staticmethod
    def to_float32(a):
        import torch

        return a.to(torch.float32)

    @staticmethod
    def devices(module):
        return {p.device for p in module.parameters()} | {b.device for b in module.buffers()}

    @staticmethod
    def is_cpu_device(d) -> bool:
        return d.type == "cpu"


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
