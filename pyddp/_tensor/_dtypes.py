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


class device:
    """torch.device-like: ``device("cpu")``, ``device("cuda", 0)``; equal to its string form."""

    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):  # noqa: A002
        if isinstance(type, device):
            type, index = type.type, type.index
        s = str(type)
        if ":" in s:
            s, i = s.split(":", 1)
            index = _pyint(i)
        self.type = s
        self.index = index

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
