"""dtypes (NumPy dtype objects under torch's names), ``device``, dtype-argument normalisation and
the default float dtype."""
import builtins

import numpy as np

from .._device import _CPU, _NO_INDEX, _parse_device, _typename, device  # noqa: F401  (device is
# torch.device, served here with the dtypes as pyddp.device; _device is below the tensors)
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


_SCALAR_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                 "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                 "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def _scalar_name(dt):
    """torch's ScalarType name of a dtype, as its error messages write it ('Float', 'Long')."""
    name = str(dt)
    return _SCALAR_NAMES.get(name, name.capitalize())
