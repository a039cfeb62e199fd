"""Backend "nccl": pyddp's collectives on CUDA arrays through NCCL (backend.py; see its docstring).
This module registers it and says whether libnccl loads, without importing the implementation.
"""
from __future__ import annotations

from ..interface import Supports
from ..registry import BackendEntry, register

__all__ = ["create", "SUPPORTS"]


def create(opts):
    """The factory registered for backend 'nccl': the group's NcclBackend."""
    from . import backend

    return backend.create(opts)


def _nccl_error():
    """Why libnccl cannot be used (None when it loads), from pyddp.cuda's loader."""
    from ....cuda import _lib

    try:
        _lib.load_nccl()
    except RuntimeError as e:
        return str(e)
    return None


# What NCCL serves (csrc/nccl/enqueue.c maps pyddp's dtypes and ops onto NCCL's): every kind but
# monitored_barrier (torch's is gloo's only), every dtype moved, no reductions on int16/uint16
# (NCCL has no such type), no bitwise ops, receives from a given rank only.
SUPPORTS = Supports(
    kinds=frozenset(k for k in ("broadcast", "all_reduce", "reduce", "all_gather", "gather",
                                "scatter", "reduce_scatter", "all_to_all", "barrier", "send",
                                "recv")),
    reduce_dtypes=frozenset(("bool", "int8", "uint8", "int32", "uint32", "int64", "uint64",
                             "float16", "bfloat16", "float32", "float64", "complex64",
                             "complex128")),
    ops=frozenset(("SUM", "AVG", "PRODUCT", "MIN", "MAX")),
    any_source=False)

register(BackendEntry(
    "nccl", ("cuda",), create, available=lambda: _nccl_error() is None, supports=SUPPORTS,
    reason=lambda: f"backend 'nccl' is not available (use backend='cpu' or 'gloo' for CPU "
                   f"arrays): {_nccl_error()}",
    needs="libnccl (pip install 'pyddp[cuda]') and a GPU"))
