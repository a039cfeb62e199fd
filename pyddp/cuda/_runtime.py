"""The CUDA runtime part of ``pyddp.cuda`` (all but the legacy tensor types, the stand-in's
streams and events in _stream, and the lazy ``amp``/``nvtx`` submodules): device queries, the
``device`` context manager, memory statistics, seeds, device properties.

It knows no tensors, so the layers below pyddp's tensors (``pyddp._device``, ``pyddp.accelerator``,
``pyddp.distributed``) use it; ``pyddp.cuda`` re-exports every name (see that package for the whole
surface and how libcudart is loaded).
"""
from __future__ import annotations

from .. import _C
from . import _emulation, _lib, nccl  # nccl loads libnccl only when asked
from ._emulation import enabled as _emulated

__all__ = ["CudaUnavailableError", "is_available", "device_count", "current_device", "set_device",
           "synchronize", "device", "manual_seed", "manual_seed_all", "is_initialized", "init",
           "nccl", "seed", "seed_all", "is_bf16_supported", "empty_cache", "memory_allocated",
           "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
           "max_memory_cached", "memory_stats", "reset_peak_memory_stats",
           "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats", "get_device_name", "get_device_properties",
           "get_device_capability", "cudart", "is_emulated"]


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
    if _emulated():
        _initialized = True
        return
    if not _initialized:
        why = _why_unavailable()
        if why is not None:
            raise CudaUnavailableError(f"pyddp.cuda: CUDA is not available: {why}")
        _initialized = True


def is_available() -> bool:
    """Whether CUDA can be used: libcudart loads and sees at least one GPU.  Never raises."""
    return device_count() > 0


def device_count() -> int:
    """The number of GPUs CUDA sees (0 without libcudart, driver or GPU; one per local rank
    under PYDDP_CUDA_ON_CPU=1).  Never raises."""
    if _emulated():
        return _emulation.device_count()
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
    if _emulated():
        return _emulation.current
    return _C.cuda_get_device()


def set_device(device) -> None:
    """Select the current GPU: an int, 'cuda:N', or a torch.device (anything with ``.type`` and
    ``.index``).  A negative index does nothing, as in torch."""
    idx = _device_index(device, optional=False)
    if idx >= 0:
        _require()
        if _emulated():
            _emulation.current = _emulation.check_index(idx)
            return
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
            self.prev_idx = current_device()
            if self.prev_idx != self.idx:
                set_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx >= 0 and self.prev_idx != self.idx:
            set_device(self.prev_idx)
        return False


_device = device  # for the functions whose argument is named `device`


def synchronize(device=None) -> None:
    """Wait for all work on a GPU (the current one by default) to finish."""
    _require()
    if _emulated():
        idx = _device_index(device, optional=True)
        if idx >= 0:
            _emulation.check_index(idx)
        return
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


# --------------------------------------------------------------------------------------------
# Under PYDDP_CUDA_ON_CPU=1 (see pyddp.cuda._emulation): streams and events, device names and
# properties, legacy tensor types and cudart(), as a GPU script uses them.  Work on the emulated
# devices runs on the CPU in program order, so every stream is already in order with every
# other: waits return at once, queries answer True.  Without the stand-in these raise
# CudaUnavailableError (pyddp computes nothing on a GPU; use torch's or CuPy's streams there).

def is_emulated() -> bool:
    """Whether CUDA is emulated on the CPU here (PYDDP_CUDA_ON_CPU=1)."""
    return _emulated()


def _require_emulated(what):
    if not _emulated():
        raise CudaUnavailableError(
            f"pyddp.cuda.{what}: pyddp has no CUDA streams of its own (on a GPU use torch's or "
            f"CuPy's); under {_emulation.ENV}=1 they are ordered no-ops on the CPU")


def _index_or_current(dev):
    idx = -1 if dev is None else _device_index(dev, optional=True)
    return current_device() if idx < 0 else _emulation.check_index(idx)


class _Props:
    def __init__(self, idx):
        import os
        self.name = _emulation.NAME
        self.major, self.minor = 0, 0
        try:
            self.total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            self.total_memory = 0
        self.multi_processor_count = os.cpu_count() or 1
        self.is_integrated = False
        self.index = idx

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major=0, minor=0, "
                f"total_memory={self.total_memory >> 20}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None):
    """The stand-in's properties (name says it is no GPU; compute capability 0.0)."""
    _require_emulated("get_device_properties")
    return _Props(_index_or_current(device))


def get_device_name(device=None) -> str:
    """The stand-in's name (it says it is no GPU)."""
    return get_device_properties(device).name


def get_device_capability(device=None):
    """(0, 0): the stand-in has no compute capability (checks for sm_80 features answer no)."""
    get_device_properties(device)
    return (0, 0)


class _Cudart:
    def cudaProfilerStart(self):
        return 0

    def cudaProfilerStop(self):
        return 0


def cudart():
    """torch.cuda.cudart(): the profiler switches, no-ops returning 0 (cudaSuccess)."""
    _require_emulated("cudart")
    return _Cudart()
