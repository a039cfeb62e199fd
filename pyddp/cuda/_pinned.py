"""A cache of pinned (page-locked) host blocks, for staging CUDA arrays through host memory.

cudaHostAlloc is slow and cudaFreeHost waits for the whole device, so a pinned buffer per staged
collective would stall every stream at each call.  As torch's CachingHostAllocator does, blocks
are kept by size class (the next power of two, at least 512 bytes) and reused: ``host_bytes(n)``
returns a uint8 array over a block whose NumPy base is a lease; when the last array (or view) of
it dies, the lease gives the block back.  A block is given back only once nothing uses it: the
staging code (pyddp.distributed.backends.staging) synchronises the stream after each copy into
or out of it, and the collective that reads or writes it holds the array until it completed.
Idle blocks are freed by ``pyddp.cuda.empty_cache()``; beyond ``_IDLE_CAP`` idle bytes a block
given back is freed at once, unless it is the only idle block of its size class (so a repeated
large collective keeps its one block).
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from .. import _C

_MIN_BLOCK = 512
_IDLE_CAP = 256 << 20  # idle bytes the cache keeps

# A lease's __del__ may run on any thread, or on this one when a collection starts inside the
# locked section: a re-entrant lock, and only deque appends and pops under it.
_lock = threading.RLock()
_idle = collections.defaultdict(collections.deque)  # size class -> idle PinnedBuffers
_idle_bytes = 0


def _size_class(nbytes: int) -> int:
    return max(_MIN_BLOCK, 1 << (max(nbytes, 1) - 1).bit_length())


class _Lease:
    """The NumPy base of the arrays over one cached block: gives the block back when it dies."""

    __slots__ = ("buf", "__array_interface__")

    def __init__(self, buf):
        self.buf = buf
        self.__array_interface__ = {"shape": (buf.nbytes,), "typestr": "|u1", "version": 3,
                                    "data": (buf.ptr, False)}

    def __del__(self):
        buf, self.buf = self.buf, None
        if buf is not None and _give_back is not None:  # None: interpreter shutdown
            _give_back(buf)


def _give_back(buf):
    global _idle_bytes
    size = buf.nbytes
    with _lock:
        free = _idle[size]
        if _idle_bytes + size <= _IDLE_CAP or not free:
            free.append(buf)
            _idle_bytes += size
            return
    # over the cap: dropped here, freed with cudaFreeHost (PinnedBuffer's dealloc)


def host_bytes(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` in pinned host memory, from the cache (a new block
    with cudaHostAlloc when none of its size class is idle).  RuntimeError from cudaHostAlloc."""
    global _idle_bytes
    size = _size_class(nbytes)
    buf = None
    with _lock:
        free = _idle.get(size)
        if free:
            buf = free.pop()
            _idle_bytes -= size
    if buf is None:
        buf = _C.cuda_host_alloc(size)
    return np.asarray(_Lease(buf))[:nbytes]


def empty_cache() -> int:
    """Free every idle block (cudaFreeHost each, which waits for the device); returns how many.
    Blocks in use are not affected: they return to the cache when their arrays die."""
    global _idle_bytes
    with _lock:
        blocks = [b for free in _idle.values() for b in free]
        _idle.clear()
        _idle_bytes = 0
    n = len(blocks)
    del blocks  # each PinnedBuffer is freed as its last reference goes
    return n


def idle() -> tuple:
    """(idle blocks, their bytes): what the cache holds now."""
    with _lock:
        return sum(len(f) for f in _idle.values()), _idle_bytes
