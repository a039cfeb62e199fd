"""Turning user arrays into contiguous NumPy views the C core can take (no copies).

Accepted: NumPy arrays (including ml_dtypes.bfloat16), torch CPU tensors (shared memory via
``Tensor.numpy()``), any object exporting DLPack on the CPU, and buffer-protocol objects
(bytearray, memoryview, array.array).  Every problem raises TypeError or ValueError naming the
argument.
"""
from __future__ import annotations

import numpy as np

# dtype codes: the order of pd_dtype in csrc/kernels/kernels.h
BOOL, INT8, UINT8, INT16, UINT16, INT32, UINT32, INT64, UINT64 = range(9)
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, COMPLEX64, COMPLEX128 = range(9, 15)

DTYPE_NAMES = [
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
]

_NP_CODES = {
    np.dtype(np.bool_): BOOL,
    np.dtype(np.int8): INT8,
    np.dtype(np.uint8): UINT8,
    np.dtype(np.int16): INT16,
    np.dtype(np.uint16): UINT16,
    np.dtype(np.int32): INT32,
    np.dtype(np.uint32): UINT32,
    np.dtype(np.int64): INT64,
    np.dtype(np.uint64): UINT64,
    np.dtype(np.float16): FLOAT16,
    np.dtype(np.float32): FLOAT32,
    np.dtype(np.float64): FLOAT64,
    np.dtype(np.complex64): COMPLEX64,
    np.dtype(np.complex128): COMPLEX128,
}

_SUPPORTED = ", ".join(DTYPE_NAMES)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def _is_pyddp_tensor(x) -> bool:
    from .._tensor import Tensor

    return isinstance(x, Tensor)


def _torch_view(t, name: str):
    import torch  # only reached when the caller passed a torch tensor

    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on device {t.device}; the 'cpu' backend takes CPU tensors "
            "(CUDA tensors need the nccl backend)")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), BFLOAT16
    return t.numpy(), None


def as_array(x, name: str, writable: bool = False):
    """Return (ndarray sharing x's memory, dtype code)."""
    code = None
    if isinstance(x, np.ndarray):
        a = x
    elif isinstance(getattr(x, "_data", None), np.ndarray) and _is_pyddp_tensor(x):
        a = x._data  # pyddp.Tensor: its own array, updated in place
    elif _is_torch(x):
        a, code = _torch_view(x, name)
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev = x.__dlpack_device__()
        if int(dev[0]) != 1:
            raise ValueError(
                f"{name} lives on DLPack device {tuple(dev)}; the 'cpu' backend takes CPU arrays")
        try:
            a = np.from_dlpack(x)
        except Exception as e:  # e.g. bfloat16 through DLPack, unsupported by numpy
            raise TypeError(f"{name}: cannot view this array through DLPack: {e}") from None
    elif isinstance(x, (bytearray, memoryview, bytes)) or hasattr(x, "__buffer__") or (
            type(x).__name__ == "array" and type(x).__module__ == "array"):
        try:
            a = np.asarray(memoryview(x))
        except Exception as e:
            raise TypeError(f"{name}: cannot read the buffer: {e}") from None
    else:
        raise TypeError(
            f"{name} must be an array (numpy.ndarray, torch CPU tensor, DLPack or buffer object), "
            f"got {type(x).__name__}")
    if code is None:
        code = _NP_CODES.get(a.dtype)
        if code is None:
            if a.dtype.name == "bfloat16":
                code = BFLOAT16
                a = a.view(np.uint16)
            else:
                raise TypeError(f"{name} has unsupported dtype {a.dtype}; supported: {_SUPPORTED}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {a.strides} for shape {a.shape})")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; it is an output and must be writable")
    return a, code


def nbytes_per_row(a: np.ndarray) -> int:
    if a.ndim == 0:
        return a.itemsize
    if a.shape[0] == 0:
        return 0
    return a.nbytes // a.shape[0]
