"""Backend "nccl": pyddp's collectives on CUDA arrays through NCCL (backend.py; see its docstring).
This module registers it and says whether libnccl loads, without importing the implementation.
"""
from __future__ import annotations

from ..registry import BackendEntry, register

__all__ = ["create"]


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


register(BackendEntry(
    "nccl", ("cuda",), create, available=lambda: _nccl_error() is None,
    reason=lambda: f"backend 'nccl' is not available (use backend='cpu' or 'gloo' for CPU "
                   f"arrays): {_nccl_error()}",
    needs="libnccl (pip install 'pyddp[cuda]') and a GPU"))
