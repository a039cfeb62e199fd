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
from . import _emulation, _lib, nccl  # nccl loads libnccl only when asked
from ._emulation import enabled as _emulated

__all__ = ["CudaUnavailableError", "is_available", "device_count", "current_device",
           "set_device", "synchronize", "device", "manual_seed", "manual_seed_all",
           "is_initialized", "init", "nccl", "seed", "seed_all", "is_bf16_supported", "empty_cache",
           "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
           "memory_cached", "max_memory_cached", "memory_stats", "reset_peak_memory_stats",
           "reset_max_memory_allocated", "reset_max_memory_cached",
           "reset_accumulated_memory_stats", "Stream", "Event", "stream", "StreamContext",
           "current_stream", "default_stream", "get_device_name", "get_device_properties",
           "get_device_capability", "cudart", "amp", "nvtx", "FloatTensor", "DoubleTensor", "HalfTensor",
           "LongTensor", "IntTensor", "ByteTensor", "BoolTensor", "is_emulated"]


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


class Stream:
    """torch.cuda.Stream under the CPU stand-in: an ordered no-op (work runs in program order)."""

    def __init__(self, device=None, priority=0, **kwargs):
        _require_emulated("Stream")
        from .._tensor._dtypes import device as _dev
        self.device = _dev("cuda", _index_or_current(device))
        self.priority = int(priority)
        self.cuda_stream = 0

    def query(self):
        """True: nothing is pending."""
        return True

    def synchronize(self):
        """Returns at once."""

    def wait_stream(self, stream):
        """Returns at once (every stream is in order with every other)."""

    def wait_event(self, event):
        """Returns at once."""

    def record_event(self, event=None):
        """Record ``event`` (a new Event when None) on this stream; returns it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.device == self.device and \
            (other is self or (other._default and self._default))

    def __hash__(self):
        return hash((str(self.device), self._default or id(self)))

    _default = False

    def __repr__(self):
        return f"<pyddp.cuda.Stream device={self.device} (CPU stand-in)>"


class Event:
    """torch.cuda.Event under the CPU stand-in: records the time it was recorded at."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        _require_emulated("Event")
        self.enable_timing = bool(enable_timing)
        self._t = None

    def record(self, stream=None):
        """Mark this point of the (CPU-ordered) work."""
        import time
        self._t = time.perf_counter()

    def wait(self, stream=None):
        """Returns at once."""

    def query(self):
        """True: the work before the record is done."""
        return True

    def synchronize(self):
        """Returns at once."""

    def elapsed_time(self, end_event):
        """Milliseconds between this event's record and ``end_event``'s (both need
        enable_timing=True and a record, as torch's)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._t - self._t) * 1000.0


_streams = {}      # device index -> its default stream
_current_streams = {}


def default_stream(device=None) -> Stream:
    """The default stream of a device (the current one by default)."""
    idx = _index_or_current(device) if _emulated() else _require_emulated("default_stream")
    s = _streams.get(idx)
    if s is None:
        s = _streams[idx] = Stream(idx)
        s._default = True
    return s


def current_stream(device=None) -> Stream:
    """The stream selected by ``with pyddp.cuda.stream(s)`` (the default stream otherwise)."""
    idx = _index_or_current(device) if _emulated() else _require_emulated("current_stream")
    return _current_streams.get(idx) or default_stream(idx)


class StreamContext:
    """``with pyddp.cuda.stream(s):``: ``s`` is the current stream of its device inside."""

    def __init__(self, stream):
        self.stream = stream
        self._prev = None

    def __enter__(self):
        if self.stream is None:
            return None
        if not _emulated():
            _require_emulated("stream")
        idx = self.stream.device.index
        self._prev = (idx, _current_streams.get(idx))
        _current_streams[idx] = self.stream
        return self.stream

    def __exit__(self, *exc):
        if self._prev is not None:
            idx, prev = self._prev
            if prev is None:
                _current_streams.pop(idx, None)
            else:
                _current_streams[idx] = prev
        return False


def stream(stream) -> StreamContext:
    """Context manager selecting ``stream`` (None: no change)."""
    return StreamContext(stream)


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
