"""torch.distributed.algorithms.join.Join for DistributedDataParallel models."""
from __future__ import annotations

import contextlib


class Join:
    """``with Join([ddp_model]):`` lets ranks with fewer batches finish early (uneven inputs).

    pyddp supports DistributedDataParallel joinables (the same as ``ddp.join()``).
    """

    def __init__(self, joinables, enable=True, throw_on_early_termination=False, **kwargs):
        if not joinables:
            raise ValueError("The join context manager requires at least one joinable")
        divide = kwargs.pop("divide_by_initial_world_size", True)
        if kwargs:
            raise TypeError(f"Join got unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
        self._ctxs = [j.join(divide_by_initial_world_size=divide, enable=enable,
                             throw_on_early_termination=throw_on_early_termination)
                      for j in joinables]
        self._stack = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        for c in self._ctxs:
            self._stack.enter_context(c)
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)
