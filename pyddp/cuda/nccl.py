"""``pyddp.cuda.nccl``: what scripts use of ``torch.cuda.nccl``.  libnccl is loaded on the first
call (see ``pyddp.cuda._lib`` for where pyddp looks); a missing or too old NCCL raises
RuntimeError saying where pyddp looked and what to pip install."""
from __future__ import annotations

from .. import _C
from . import _lib

__all__ = ["version", "unique_id"]


def version() -> tuple:
    """The loaded NCCL's version as ``(major, minor, patch)``, e.g. ``(2, 32, 3)``, as
    torch.cuda.nccl.version()."""
    _lib.load_nccl()
    return _lib.nccl_version_tuple(_C.nccl_version())


def unique_id() -> bytes:
    """A new ncclUniqueId (128 bytes, ncclGetUniqueId), as torch.cuda.nccl.unique_id(): rank 0
    makes one and shares it with the others.  Needs no GPU."""
    _lib.load_nccl()
    return _C.nccl_unique_id()
