"""``pyddp.cuda``: what distributed scripts use of ``torch.cuda``.

is_available, device_count, current_device, set_device, synchronize, the ``device`` context
manager, manual_seed(_all), seed(_all), is_initialized, is_bf16_supported, the caching allocator's
statistics (memory_allocated, max_memory_allocated, memory_reserved, ..., empty_cache,
reset_peak_memory_stats) and ``nccl.version()``.  libcudart is loaded on the
first call that needs it (see ``pyddp.cuda._lib`` for where pyddp looks); importing this module
loads nothing.  Without CUDA (no libcudart, no driver, no GPU) the questions answer as torch's
CPU build does, without raising: ``is_available()`` is False and ``device_count()`` 0;
``current_device``, ``set_device`` and ``synchronize`` raise ``CudaUnavailableError``, which is
both an AssertionError (what torch's CPU build raises) and a RuntimeError (what its CUDA build
raises on a machine without a GPU), with the reason.

Fork: once a process has used CUDA (``is_available()`` and ``device_count()`` included: they ask
the runtime), a child it forks cannot use CUDA; the runtime fails there with
cudaErrorInitializationError.  In such a child pyddp's CUDA functions raise RuntimeError saying so
(torch's "Cannot re-initialize CUDA in forked subprocess"), ``is_available()`` is False, and
``pyddp.multiprocessing.start_processes(start_method='fork')`` and ``pyddp.notebook_launcher`` refuse
to fork ranks from a process that used CUDA.  DataLoader workers are still forked (they rarely use
CUDA); one that does gets that error, re-raised in the main process: give the DataLoader
``multiprocessing_context='spawn'``.
"""
from __future__ import annotations

from . import _runtime, _stream
from ._runtime import *  # noqa: F401,F403  (torch.cuda's runtime surface)
from ._runtime import _index_or_current, _require_emulated, _why_unavailable  # noqa: F401
from ._stream import *  # noqa: F401,F403  (streams and events)

# _runtime's and _stream's names, the submodules amp and nvtx, and the legacy tensor types below
__all__ = _runtime.__all__ + _stream.__all__ + [
    "amp", "nvtx", "FloatTensor", "DoubleTensor", "HalfTensor", "LongTensor", "IntTensor",
    "ByteTensor", "BoolTensor"]

# The classes keep their public name (pyddp.cuda.CudaUnavailableError in tracebacks, pickles).
for _cls in (CudaUnavailableError, Stream, Event, StreamContext, device):  # noqa: F405
    _cls.__module__ = __name__
del _cls


# torch.cuda.FloatTensor & co.: tensor types, so this package sits above pyddp's tensors (the
# runtime below them is _runtime); the tensor library is imported on their first use only.
class _LegacyMeta(type):
    def __instancecheck__(cls, obj):
        from .._tensor._core import Tensor
        return isinstance(obj, Tensor) and obj.is_cuda and obj.dtype == cls._dtype()


def _legacy(name, dtype_name):
    def __new__(cls, *args, device=None):
        """torch.cuda.<Type>Tensor(*sizes) or (data): a tensor on the current emulated device."""
        import numpy as np

        from .. import _tensor as T
        _require_emulated(name)
        dt = np.dtype(dtype_name)
        dev = f"cuda:{_index_or_current(device)}"
        if len(args) == 1 and not isinstance(args[0], int):
            return T.tensor(args[0], dtype=dt, device=dev)
        return T.empty(*args, dtype=dt, device=dev)
    return _LegacyMeta(name, (), {"__new__": __new__, "_dtype": staticmethod(
        lambda: __import__("numpy").dtype(dtype_name)),
        "__doc__": f"torch.cuda.{name}(*sizes) or (data): a {dtype_name} tensor on the current "
                   "emulated device (PYDDP_CUDA_ON_CPU=1); isinstance() checks dtype and device."})


FloatTensor = _legacy("FloatTensor", "float32")
DoubleTensor = _legacy("DoubleTensor", "float64")
HalfTensor = _legacy("HalfTensor", "float16")
LongTensor = _legacy("LongTensor", "int64")
IntTensor = _legacy("IntTensor", "int32")
ByteTensor = _legacy("ByteTensor", "uint8")
BoolTensor = _legacy("BoolTensor", "bool")


def __getattr__(name):
    if name in ("amp", "nvtx"):   # torch.cuda.amp (GradScaler, autocast), torch.cuda.nvtx
        import importlib
        mod = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = mod
        return mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
