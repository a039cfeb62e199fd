"""torch's float32 matmul precision switch (``torch.set_float32_matmul_precision``), kept as
torch's CPU build keeps it: the value is recorded and read back, and changes nothing (pyddp's
matmuls are NumPy's float32 BLAS, which has no TF32 or bfloat16 passes to allow).
"""
from __future__ import annotations

import warnings

__all__ = ["set_float32_matmul_precision", "get_float32_matmul_precision"]

_PRECISIONS = ("highest", "high", "medium")
_state = {"precision": "highest"}


def set_float32_matmul_precision(precision):
    """Record the float32 matmul precision: 'highest' (the default), 'high' or 'medium'.

    Another string is ignored with torch's UserWarning; a non-string raises torch's
    RuntimeError.  The value changes no computation (see the module docstring)."""
    if not isinstance(precision, str):
        raise RuntimeError("set_float32_matmul_precision expects a str, but got "
                           f"{type(precision).__name__}")
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "setFloat32MatmulPrecision call has no effect.", UserWarning, stacklevel=2)
        return
    _state["precision"] = precision


def get_float32_matmul_precision():
    """The value last given to set_float32_matmul_precision ('highest' by default)."""
    return _state["precision"]
