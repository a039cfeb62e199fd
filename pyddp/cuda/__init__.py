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

from .. import _C
from . import _lib, nccl  # nccl loads libnccl only when asked

__all__ = ["CudaUnavailableError", "is_available", "device_count", "current_device",
           "set_device", "synchronize", "device", "manual_seed", "manual_seed_all",
           "is_initialized", "init", "nccl", "seed", "seed_all", "is_bf16_supported", "empty_cache",
           "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
           "memory_cached", "max_memory_cached", "memory_stats", "reset_peak_memory_stats",
           "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats"]


class CudaUnavailableError(RuntimeError, AssertionError):
    """CUDA is not usable here: no libcudart, no NVIDIA driver, or no GPU.  An AssertionError
    as torch's CPU build raises ("Torch not compiled with CUDA enabled") and a RuntimeError as
    its CUDA build raises without a GPU."""


_initialized = False


def _why_unavailable():
    """None when CUDA has a device, else why not."""
    try:
        info = _lib.load_cudart()
    except RuntimeError as e:
        return str(e)
    if _C.cuda_fork_state() == 2:  # forked after the parent used CUDA
        return _C.CUDA_AFTER_FORK
    count, err = _C.cuda_device_count()
    if count > 0:
        return None
    if err == 0:
        return "cudaGetDeviceCount found no device"
    runtime, driver = info["runtime_version"], info["driver_version"]
    what = f"cudaGetDeviceCount: {_C.cuda_error_string(err)}"
    if driver == 0:
        return f"{what}: no NVIDIA driver on this machine"
    if driver < runtime:
        return (f"{what}: the NVIDIA driver supports CUDA {_lib.cuda_version_str(driver)}, older "
                f"than the CUDA runtime {_lib.cuda_version_str(runtime)} pyddp loaded from "
                f"{info['path']}; update the driver, or install the runtime and NCCL wheels of "
                "the driver's CUDA (e.g. pip install nvidia-cuda-runtime-cu12 nvidia-nccl-cu12)")
    return what


def _require():
    global _initialized
    if not _initialized:
        why = _why_unavailable()
        if why is not None:
            raise CudaUnavailableError(f"pyddp.cuda: CUDA is not available: {why}")
        _initialized = True


def is_available() -> bool:
    """Whether CUDA can be used: libcudart loads and sees at least one GPU.  Never raises."""
    return device_count() > 0


def device_count() -> int:
    """The number of GPUs CUDA sees (0 without libcudart, driver or GPU).  Never raises."""
    try:
        _lib.load_cudart()
    except RuntimeError:
        return 0
    return _C.cuda_device_count()[0]


def is_initialized() -> bool:
    """Whether pyddp has initialised CUDA (a call that needed a GPU found one)."""
    return _initialized


def init() -> None:
    """Initialise CUDA now (torch.cuda.init): raises CudaUnavailableError without a GPU."""
    _require()


def _device_index(dev, optional: bool) -> int:
    """torch.cuda's ``_get_device_index``: the index of an int, 'cuda:N', torch.device('cuda', N)
    or pyddp.cuda.device; 'cuda' or None give -1 (the current device) when ``optional``."""
    if isinstance(dev, device):
        return dev.idx
    if isinstance(dev, int):
        return dev
    if isinstance(dev, str):
        kind, sep, index = dev.partition(":")
        if not kind or (sep and not index.isdigit()):
            raise ValueError(f"Invalid device string: {dev!r} (expected 'cuda' or 'cuda:<index>')")
        idx = int(index) if index else None
    elif dev is not None and hasattr(dev, "type") and hasattr(dev, "index"):
        kind, idx = str(dev.type), dev.index
    elif dev is None:
        kind, idx = "cuda", None
    else:
        raise ValueError("Expected a torch.device with a specified index or an integer, "
                         f"but got:{dev}")
    if kind != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {dev}")
    if idx is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, "
                             f"but got:{dev}")
        return -1
    return int(idx)


def current_device() -> int:
    """The index of the current GPU (cudaGetDevice)."""
    _require()
    return _C.cuda_get_device()


def set_device(device) -> None:
    """Select the current GPU: an int, 'cuda:N', or a torch.device (anything with ``.type`` and
    ``.index``).  A negative index does nothing, as in torch."""
    idx = _device_index(device, optional=False)
    if idx >= 0:
        _require()
        _C.cuda_set_device(idx)


class device:
    """Context manager that makes ``device`` the current GPU inside its block (torch.cuda.device):
    an int, 'cuda:N', a torch.device; a negative index, None or 'cuda' change nothing."""

    def __init__(self, device):
        self.idx = _device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = -1
        if self.idx >= 0:
            _require()
            self.prev_idx = _C.cuda_get_device()
            if self.prev_idx != self.idx:
                _C.cuda_set_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx >= 0 and self.prev_idx != self.idx:
            _C.cuda_set_device(self.prev_idx)
        return False


_device = device  # for the functions whose argument is named `device`


def synchronize(device=None) -> None:
    """Wait for all work on a GPU (the current one by default) to finish."""
    _require()
    with _device(device):
        _C.cuda_synchronize()


def manual_seed(seed) -> None:
    """torch.cuda.manual_seed: pyddp draws no random numbers on the GPU (the arrays' own library,
    CuPy or torch, does), so this only checks that ``seed`` is an int-like value; it is accepted,
    with or without CUDA, so that ported scripts run unchanged."""
    int(seed)


def manual_seed_all(seed) -> None:
    """torch.cuda.manual_seed_all: as :func:`manual_seed`."""
    int(seed)


def seed() -> None:
    """torch.cuda.seed: as :func:`manual_seed`, nothing to seed (returns None, as torch)."""


def seed_all() -> None:
    """torch.cuda.seed_all: as :func:`seed`."""


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: pyddp computes nothing on the GPU (torch's CPU build answers False too)."""
    return False


# The caching allocator's statistics.  pyddp allocates no device memory through a caching
# allocator (CUDA arrays belong to torch, CuPy or JAX, which count their own), so these answer
# as torch's CPU build does: 0 bytes, empty stats, and the resets do nothing; empty_cache frees
# the idle pinned host blocks that staging keeps (pyddp.cuda._pinned).
# (torch's CPU build raises AttributeError from its internals for the reset_* functions; here they
# are harmless, so that benchmark scripts calling them run.)  ``device`` is accepted and ignored,
# as torch ignores it while CUDA is not initialised.

def memory_stats(device=None) -> dict:
    """An empty OrderedDict (no allocation was made through a caching allocator)."""
    import collections
    return collections.OrderedDict()


def memory_allocated(device=None) -> int:
    """0: bytes held by tensors through pyddp's caching allocator (it has none)."""
    return 0


def max_memory_allocated(device=None) -> int:
    """0: the peak of :func:`memory_allocated`."""
    return 0


def memory_reserved(device=None) -> int:
    """0: bytes reserved by pyddp's caching allocator (it has none)."""
    return 0


def max_memory_reserved(device=None) -> int:
    """0: the peak of :func:`memory_reserved`."""
    return 0


def memory_cached(device=None) -> int:
    """Deprecated name of :func:`memory_reserved` (a FutureWarning, as torch's)."""
    import warnings
    warnings.warn("`torch.cuda.memory_cached` has been renamed to `torch.cuda.memory_reserved`",
                  FutureWarning, stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated name of :func:`max_memory_reserved` (a FutureWarning, as torch's)."""
    import warnings
    warnings.warn("`torch.cuda.max_memory_cached` has been renamed to "
                  "`torch.cuda.max_memory_reserved`", FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def empty_cache() -> None:
    """Free the idle pinned host blocks that staging CUDA arrays through host memory keeps
    (cudaFreeHost each; blocks in use go back to the cache later).  No device memory is cached."""
    from . import _pinned

    _pinned.empty_cache()


def reset_peak_memory_stats(device=None) -> None:
    """Nothing to reset (no statistics are kept)."""


def reset_max_memory_allocated(device=None) -> None:
    """Nothing to reset."""


def reset_max_memory_cached(device=None) -> None:
    """Nothing to reset."""


def reset_accumulated_memory_stats(device=None) -> None:
    """Nothing to reset."""
