"""CUDA arrays on the 'cpu' backend: staged through pinned host memory, as torch's gloo does.

A CUDA array given to a group whose only backend for it is 'cpu' is copied into a pinned host
buffer on the caller's current stream (the stream is synchronised: the collective reads the copy
on the host), the collective runs on that buffer, and an output is copied back on the same
stream once the operation completed (at once for a blocking call, at ``Work.wait()`` for an
async one), the host buffer kept until the copy finished.  Jobs without NCCL, and ranks sharing
one GPU, work this way, at host-memory speed.  The pinned buffers come from a cache
(pyddp.cuda._pinned): cudaHostAlloc is slow and cudaFreeHost waits for the whole device.

The 'mpi' backend stages the same way where its MPI is not CUDA-aware; ``stream_family`` (the
caller's current stream for an array: torch's, CuPy's or its __cuda_array_interface__'s) serves
the 'nccl' backend's stream ordering too.
"""
from __future__ import annotations

import sys

import numpy as np

from ... import _C, _interop

_D2H, _H2D = 2, 1


class Staged(np.ndarray):
    """A pinned host copy of a CUDA array; ``_pd_stage`` = (view, stream) of an output (its
    pinned block goes back to the cache when the array and its views die)."""

    _pd_stage = None


def _np_dtype(code):
    name = _interop.DTYPE_NAMES[code]
    return np.dtype(np.uint16 if name == "bfloat16" else name)


def stage(view, name, writable):
    """The Staged host copy of the CUDA array ``view`` (C-contiguous, checked by the caller);
    DeviceError naming ``name`` where CUDA does not work in this process."""
    from ...cuda import _runtime as cuda
    from ...cuda import _pinned

    why = cuda._why_unavailable()
    if why is not None:
        raise _interop.DeviceError(name, view.device_str, (
            "the 'cpu' backend takes CPU tensors (CUDA tensors need the nccl backend, or CUDA "
            f"working here to be staged through host memory: {why})"), view)
    stream = stream_family(view)()
    host = _pinned.host_bytes(view.nbytes)
    a = host.view(_np_dtype(view.code)).reshape(view.shape).view(Staged)
    if view.nbytes:
        _C.cuda_memcpy_async(a.ctypes.data, view.ptr, view.nbytes, _D2H, stream)
        _C.cuda_stream_synchronize(stream)
    a._pd_stage = (view, stream) if writable else None
    return a


def stream_family(view):
    """A function returning the caller's current stream for arrays like ``view`` (an int
    cudaStream_t; 0 is the legacy default stream)."""
    owner = view.owner
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(owner, torch.Tensor):
        dev = owner.device
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:  # the handle alone: no torch.cuda.Stream object per call
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            return lambda: raw(index)
        return lambda: torch.cuda.current_stream(dev).cuda_stream
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(owner, cupy.ndarray):
        # get_current_stream() answers for the current device: ask with the array's device current
        # (an event of one device cannot be recorded on another device's stream)
        dev = view.index

        def cupy_stream():
            with cupy.cuda.Device(dev):
                return cupy.cuda.get_current_stream().ptr
        return cupy_stream
    s = view.stream or 0
    return lambda: s



def current_stream(device) -> int:
    """The caller's current stream on CUDA ``device`` for a call without arrays (barrier): torch's
    once torch has initialised CUDA, else CuPy's once imported, else the legacy default stream
    (0), which waits for the work of every blocking stream of the device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_stream(device).cuda_stream
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().ptr
    return 0


def copy_back_fn(outputs):
    """A function copying the staged outputs among ``outputs`` back to their CUDA arrays, or
    None when there are none."""
    staged = [a for a in outputs if type(a) is Staged and a._pd_stage is not None]
    if not staged:
        return None

    def copy_back():
        streams = set()
        for a in staged:
            view, stream = a._pd_stage
            if view.nbytes:
                _C.cuda_memcpy_async(view.ptr, a.ctypes.data, view.nbytes, _H2D, stream)
                streams.add(stream)
        for s in streams:  # the pinned blocks are reused (or freed) once their arrays die
            _C.cuda_stream_synchronize(s)
    return copy_back
