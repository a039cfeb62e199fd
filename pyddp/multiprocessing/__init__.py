"""pyddp.multiprocessing: torch.multiprocessing for pyddp jobs.

Like torch.multiprocessing it re-exports the standard library's multiprocessing (so
``import pyddp.multiprocessing as mp`` replaces ``import torch.multiprocessing as mp``) and adds
``spawn`` / ``start_processes``, which run fn(i, *args) in nprocs new processes and report the first
failure as ProcessRaisedException (with the child's traceback) or ProcessExitedException::

    import pyddp.distributed as dist
    import pyddp.multiprocessing as mp

    def main(rank, world_size):
        dist.init_process_group("cpu", init_method="tcp://127.0.0.1:29500",
                                rank=rank, world_size=world_size)
        ...

    if __name__ == "__main__":
        mp.spawn(main, args=(2,), nprocs=2, join=True)

NumPy arrays are pickled by value between processes, so torch's tensor sharing strategies do not
apply; set_sharing_strategy and friends exist so that code calling them runs unchanged.
"""
import multiprocessing
import sys

__all__ = ["set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies"]

from multiprocessing import *  # noqa: E402,F401,F403

__all__ += multiprocessing.__all__

from .spawn import (  # noqa: E402,F401
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    spawn,
    start_processes,
)

if sys.platform == "darwin" or sys.platform == "win32":
    _sharing_strategy = "file_system"
    _all_sharing_strategies = {"file_system"}
else:
    _sharing_strategy = "file_descriptor"
    _all_sharing_strategies = {"file_descriptor", "file_system"}


def set_sharing_strategy(new_strategy):
    """Set the strategy for sharing tensors between processes (kept for torch compatibility: NumPy
    arrays are pickled by value, so the strategy changes nothing in pyddp)."""
    global _sharing_strategy
    if new_strategy not in _all_sharing_strategies:
        raise ValueError(f"new_strategy must be one of {sorted(_all_sharing_strategies)}, "
                         f"got {new_strategy!r}")
    _sharing_strategy = new_strategy


def get_sharing_strategy():
    """Return the current strategy for sharing tensors."""
    return _sharing_strategy


def get_all_sharing_strategies():
    """Return the set of sharing strategies supported on this system."""
    return _all_sharing_strategies
