"""``pyddp.cuda.nvtx``: torch.cuda.nvtx's profiler markers (range_push, range_pop, range_start,
range_end, mark, range).  Under PYDDP_CUDA_ON_CPU=1 they do nothing (there is no GPU profiler to
mark for); otherwise they raise what torch's CPU build raises."""
from __future__ import annotations

import contextlib

from . import _emulation

__all__ = ["range_push", "range_pop", "range_start", "range_end", "mark", "range"]


def _check():
    if not _emulation.enabled():
        raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")


def range_push(msg):
    """Open a nested range (depth 0 returned, as NVTX's first level)."""
    _check()
    return 0


def range_pop():
    """Close the innermost range."""
    _check()
    return 0


def range_start(msg) -> int:
    """Start a range that may end on another thread; returns its id."""
    _check()
    return 0


def range_end(range_id) -> None:
    """End a range started with range_start."""
    _check()


def mark(msg) -> None:
    """An instantaneous event."""
    _check()


@contextlib.contextmanager
def range(msg, *args, **kwargs):  # noqa: A001  (torch's name)
    """``with nvtx.range("name"):`` a range around the block."""
    range_push(msg)
    try:
        yield
    finally:
        range_pop()
