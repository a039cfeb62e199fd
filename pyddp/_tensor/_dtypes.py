"""dtypes (NumPy dtype objects under torch's names), ``device``, dtype-argument normalisation and
the default float dtype."""
import builtins

import numpy as np

from ._grad_mode import _st

# dtypes (numpy dtype objects)
float16 = half = np.dtype(np.float16)
float32 = float = np.dtype(np.float32)  # noqa: A001  (torch's names)
float64 = double = np.dtype(np.float64)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)
int16 = short = np.dtype(np.int16)
int32 = int = np.dtype(np.int32)  # noqa: A001
int64 = long = np.dtype(np.int64)
bool = np.dtype(np.bool_)  # noqa: A001
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)
try:
    import ml_dtypes as _ml

    bfloat16 = np.dtype(_ml.bfloat16)
except ImportError:  # optional
    bfloat16 = None

_F32 = float32
_F64 = float64
_HALFS = {float16} | ({bfloat16} if bfloat16 is not None else set())
_pyfloat = builtins.float
_pyint = builtins.int
_pybool = builtins.bool


def _is_float_dtype(dt):
    return dt.kind in "fc" or (bfloat16 is not None and dt == bfloat16)


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
            from .. import accelerator
            acc = accelerator.current_accelerator()
            if acc is None:
                raise RuntimeError("Cannot access accelerator device when none is available.")
            if type < 0:
                raise RuntimeError("Device index must not be negative")
            self.type, self.index = acc.type, type
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


def _dtype(d):
    """Normalise a dtype argument (np.dtype, numpy type, string, Python type) or None."""
    if d is None:
        return None
    if d is _pyfloat:
        return _st.default
    if d is _pyint:
        return int64
    if d is _pybool:
        return bool
    return np.dtype(d)


def get_default_dtype():
    """The dtype of float tensors made from Python floats (float32 unless changed)."""
    return _st.default


def set_default_dtype(d):
    """Set the default float dtype (float32 or float64)."""
    _st.default = _dtype(d)


class memory_format:
    """torch.memory_format: ``contiguous_format``, ``channels_last`` (4-D, NHWC strides),
    ``channels_last_3d`` (5-D) and ``preserve_format``."""

    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"torch.{self._name}"

    def __reduce__(self):
        return self._name


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")


def _check_memory_format(mf, where):
    if mf is not None and not isinstance(mf, memory_format):
        raise TypeError(f"{where}(): argument 'memory_format' must be torch.memory_format, not "
                        f"{_typename(mf)}")
    return mf


def _layout(a, mf, copy=False):
    """``a`` laid out in memory format ``mf`` (None / preserve_format: as it is), copying only
    when the layout changes (or ``copy``)."""
    import numpy as _np
    if mf is None or mf is preserve_format:
        return a.copy() if copy else a
    if mf is contiguous_format:
        return _np.array(a, order="C") if copy else _np.ascontiguousarray(a)
    rank = 4 if mf is channels_last else 5
    if a.ndim != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {mf._name} format")
    order = (0,) + tuple(range(2, rank)) + (1,)
    back = (0, rank - 1) + tuple(range(1, rank - 1))
    t = a.transpose(order)
    if not copy and t.flags.c_contiguous:
        return a
    return _np.ascontiguousarray(t).transpose(back) if not copy or not t.flags.c_contiguous \
        else t.copy().transpose(back)
