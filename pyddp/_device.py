"""``pyddp.device`` (torch.device) and where a pyddp tensor may be placed.

Below the tensors (which re-export ``device`` from pyddp._tensor._dtypes) and beside
pyddp.accelerator, so that the random generator, pyddp.accelerator and pyddp.cuda's runtime can
use devices without importing the tensor library.
"""
import builtins

import numpy as np

_pyint = builtins.int
_pybool = builtins.bool


def _accelerator():
    """The accelerator's device type, 'cuda' when CUDA sees a GPU (or PYDDP_CUDA_ON_CPU=1 emulates
    one), else None: pyddp's only accelerator is CUDA (pyddp.accelerator answers from this)."""
    from .cuda import _runtime
    return "cuda" if _runtime.is_available() else None


_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
                 "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                 "privateuseone")
_NO_INDEX = object()


def _parse_device(s):
    """(type, index) of a device string, with torch's errors."""
    if not s:
        raise RuntimeError("Device string must not be empty")
    kind, sep, idx = s.partition(":")
    if kind not in _DEVICE_TYPES:
        if not kind or not kind.isalnum():
            raise RuntimeError(f"Invalid device string: '{s}'")
        raise RuntimeError(f"Expected one of {', '.join(_DEVICE_TYPES)} device type at start of "
                           f"device string: {kind}")
    if not sep:
        return kind, None
    if not idx.isdigit() or not idx.isascii() or (len(idx) > 1 and idx[0] == "0"):
        raise RuntimeError(f"Invalid device string: '{s}'")
    return kind, _pyint(idx)


class device:
    """torch.device: ``device("cpu")``, ``device("cuda:1")``, ``device("cuda", 0)``; equal to its
    string form.  Strings parse as torch's (known types only, a non-negative decimal index);
    ``device(N)`` is accelerator N (under PYDDP_CUDA_ON_CPU=1: 'cuda:N')."""

    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=_NO_INDEX):  # noqa: A002
        if isinstance(type, device):
            if index is not _NO_INDEX:
                raise TypeError("device(): a device and an index were both given")
            self.type, self.index = type.type, type.index
            return
        if isinstance(type, _pyint) and not isinstance(type, _pybool) and index is _NO_INDEX:
            acc = _accelerator()
            if acc is None:
                raise RuntimeError("Cannot access accelerator device when none is available.")
            if type < 0:
                raise RuntimeError("Device index must not be negative")
            self.type, self.index = acc, type
            return
        if not isinstance(type, str):
            if hasattr(type, "type") and hasattr(type, "index") and index is _NO_INDEX:
                self.type, self.index = str(type.type), type.index   # a torch.device
                return
            raise TypeError(f"device(): argument 'type' must be str, not {_typename(type)}")
        kind, idx = _parse_device(type)
        if index is not _NO_INDEX:
            if idx is not None:
                raise RuntimeError("type (string) must not include an index because index was "
                                   f"passed explicitly: {type}")
            if index is not None:
                if isinstance(index, _pybool) or not isinstance(index, (_pyint, np.integer)):
                    raise TypeError("device(): argument 'index' (position 2) must be int, not "
                                    f"{_typename(index)}")
                if index < 0:
                    raise RuntimeError("Device index must not be negative")
                idx = _pyint(index)
        self.type = kind
        self.index = idx

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other):
        if isinstance(other, (device, str)):
            return str(self) == str(other)
        return NotImplemented

    def __hash__(self):
        return hash(str(self))

    def __reduce__(self):
        return (device, (self.type, self.index))


def _typename(x):
    return builtins.type(x).__name__


_CPU = device("cpu")


def _cuda_error(what):
    """What torch's CPU build raises for a CUDA tensor (an AssertionError, "Torch not compiled
    with CUDA enabled"): pyddp.cuda.CudaUnavailableError, an AssertionError and a RuntimeError."""
    from .cuda._runtime import CudaUnavailableError
    return CudaUnavailableError(
        f"{what}: pyddp tensors live on the CPU, CUDA is not available to them (torch's CPU "
        "build says 'Torch not compiled with CUDA enabled'); keep GPU data in torch, CuPy or "
        "JAX arrays, which pyddp's collectives take in place")


def _check_device(d):
    """The device a pyddp tensor is placed on for ``d`` ('cpu', 'cpu:0', device('cpu'),
    torch.device('cpu'); under PYDDP_CUDA_ON_CPU=1 also 'cuda', 'cuda:N', N and CUDA devices,
    which stay in host memory); raise what torch's CPU build raises for the others."""
    if isinstance(d, _pybool) or not isinstance(d, (str, _pyint, np.integer)) and \
            not hasattr(d, "type"):
        raise TypeError(f"device must be a str, an int or a device, got {type(d).__name__}")
    from .cuda import _emulation
    if isinstance(d, (_pyint, np.integer)):   # an accelerator's index, as torch.device(0)
        if _emulation.enabled():
            if d < 0:
                raise RuntimeError(f"Device index must not be negative (got {d})")
            return device("cuda", _emulation.check_index(_pyint(d)))
        if _accelerator() is not None:
            raise _cuda_error(f"cannot place a pyddp tensor on device {d}")
        raise RuntimeError("Cannot access accelerator device when none is available "
                           f"(device {d}: pyddp tensors live on the CPU)")
    dev = device(d) if isinstance(d, str) else device(str(d.type), d.index)
    if dev.type == "cpu":
        return _CPU
    if dev.type == "cuda":
        if _emulation.enabled():
            from .cuda import _runtime
            idx = _runtime.current_device() if dev.index is None else \
                _emulation.check_index(dev.index)
            return device("cuda", idx)
        raise _cuda_error(f"cannot place a pyddp tensor on device {str(d)!r}")
    raise RuntimeError(f"pyddp tensors live on the CPU; cannot move to device {str(d)!r}")
