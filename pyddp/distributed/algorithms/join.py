"""torch.distributed.algorithms.join: the generic join context for uneven inputs.

``Join([joinable, ...])`` lets ranks that run out of inputs early keep shadowing the collective
communications of the ranks still training, as torch's does:

* each joinable's ``join_hook(**kwargs)`` gives a :class:`JoinHook`;
* every iteration, a rank still in the loop calls ``Join.notify_join_context(joinable)`` (the
  first joinable of the list does one all-reduce of a 1, "I am still here");
* a rank whose loop has ended (``__exit__``) all-reduces a 0 matching that, then runs every hook's
  ``main_hook()`` (which shadows the joinable's collectives), until the sum is 0; then every
  ``post_hook(is_last_joiner)``.

pyddp's DistributedDataParallel and ZeroRedundancyOptimizer are Joinables, so
``with Join([ddp_model, zero_optimizer]):`` works as in torch; user classes subclass
:class:`Joinable` (torch's generic join tutorial runs unchanged).
"""
from __future__ import annotations

import abc
import warnings
from typing import NamedTuple

import numpy as np

from .. import distributed_c10d as _c10d

__all__ = ["Join", "Joinable", "JoinHook"]


class JoinHook:
    """What a joined rank runs for one joinable: ``main_hook()`` once per iteration in which some
    rank is still training (shadow the joinable's collectives there), ``post_hook(is_last_joiner)``
    once when every rank has joined. Both do nothing by default."""

    def main_hook(self) -> None:
        """Shadow one iteration's collective communications of the joinable."""

    def post_hook(self, is_last_joiner: bool) -> None:
        """Run once after every rank has joined (e.g. synchronise final state)."""


class _JoinConfig(NamedTuple):
    enable: bool
    throw_on_early_termination: bool
    is_first_joinable: bool

    @staticmethod
    def construct_disabled_join_config():
        """The configuration of a joinable outside any join context."""
        return _JoinConfig(enable=False, throw_on_early_termination=False, is_first_joinable=False)


class Joinable(abc.ABC):
    """A class whose per-iteration collectives a joined rank can shadow (torch's Joinable).

    Subclasses call ``super().__init__()``, implement ``join_hook(**kwargs)``, and the properties
    ``join_device`` and ``join_process_group``; they call ``Join.notify_join_context(self)`` once
    per iteration before their collectives.
    """

    @abc.abstractmethod
    def __init__(self):
        super().__init__()
        self._join_config = _JoinConfig.construct_disabled_join_config()

    @abc.abstractmethod
    def join_hook(self, **kwargs) -> JoinHook:
        """The JoinHook for this joinable (``kwargs`` come from ``Join(..., **kwargs)``)."""

    @property
    @abc.abstractmethod
    def join_device(self):
        """The device the join context's own collectives use (pyddp: "cpu")."""

    @property
    @abc.abstractmethod
    def join_process_group(self):
        """The process group of the joinable's collectives (None: the default group)."""


def _flag(value, device=None):
    """The join context's one-element flag: host memory, or a torch tensor on the joinables'
    GPU (``join_device``), where the nccl backend needs it.

    ``join_device`` may be a torch.device, a pyddp.device, a string or an index.  Host memory
    serves the CPU and the emulated CUDA devices (``PYDDP_CUDA_ON_CPU=1``: "nccl" runs on the cpu
    backend there); a real GPU gets a torch tensor on ``torch.device(str(device))`` (torch.full
    refuses a pyddp.device itself)."""
    if device is None:
        return np.full(1, value, dtype=np.float32)
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        kind = "cuda"
    else:
        kind = str(getattr(device, "type", None) or str(device).partition(":")[0])
    if kind == "cpu":
        return np.full(1, value, dtype=np.float32)
    from ...cuda import _emulation
    if _emulation.enabled():
        return np.full(1, value, dtype=np.float32)
    import torch

    if not isinstance(device, (torch.device, int, np.integer)):
        device = torch.device(str(device))
    return torch.full((1,), float(value), dtype=torch.float32, device=device)


class Join:
    """``with Join(joinables, enable=True, throw_on_early_termination=False, **kwargs):``.

    ``kwargs`` go to every joinable's ``join_hook`` (DistributedDataParallel reads
    ``divide_by_initial_world_size``; user joinables read their own). With
    ``throw_on_early_termination=True`` every rank raises RuntimeError as soon as one rank
    has run out of inputs.
    """

    def __init__(self, joinables, enable=True, throw_on_early_termination=False, **kwargs):
        joinables = list(joinables)
        if len(joinables) == 0:
            raise ValueError("The join context manager requires at least one joinable")
        for j in joinables:
            if not hasattr(j, "join_hook"):
                raise TypeError(f"Join: {type(j).__name__} is not a Joinable (it has no "
                                "join_hook)")
        self._joinables = joinables
        self._join_hooks = [j.join_hook(**kwargs) for j in joinables]
        self._enable = enable
        self._throw_on_early_termination = throw_on_early_termination
        self._set_joinable_configs()
        self._extract_dist_info()

    def _set_joinable_configs(self):
        first = True
        for j in self._joinables:
            j._join_config = _JoinConfig(enable=self._enable,
                                         throw_on_early_termination=self._throw_on_early_termination,
                                         is_first_joinable=first)
            first = False

    def _extract_dist_info(self):
        process_group = None
        device = None
        for j in self._joinables:
            pg = j.join_process_group
            if process_group is None:
                process_group = pg
            elif process_group != pg:
                raise ValueError("Using join context manager with multiple process groups")
            if device is None:
                device = j.join_device
        self._process_group = process_group
        self._rank = _c10d.get_rank(process_group)
        self._device = device

    def __enter__(self):
        for h in self._join_hooks:
            enter = getattr(h, "_join_enter", None)
            if enter is not None:
                enter(self._enable)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if not self._enable or exc_type is not None:
                return None  # an exception propagates as it is
            all_joined = False
            is_last_joiner = True
            i = 0
            while not all_joined:
                if i > 1000:
                    warnings.warn(
                        "Detected uneven input skew of greater than 1000. This means that rank "
                        f"{self._rank} has at least 1000 fewer inputs than other currently-active "
                        "ranks. This level of skew could lead to performance degradation during "
                        "training.", stacklevel=2)
                if self._get_num_nonjoined_procs() == 0:
                    all_joined = True
                else:
                    if self._throw_on_early_termination:
                        self._notify_procs_to_terminate()
                    for h in self._join_hooks:
                        h.main_hook()
                    is_last_joiner = False
                    i += 1
            for h in self._join_hooks:
                h.post_hook(is_last_joiner)
            return None
        finally:
            for h in self._join_hooks:
                leave = getattr(h, "_join_exit", None)
                if leave is not None:
                    leave()
            for j in self._joinables:
                j._join_config = _JoinConfig.construct_disabled_join_config()

    def _get_num_nonjoined_procs(self):
        n = _flag(0, self._device)
        _c10d.all_reduce(n, group=self._process_group)
        return int(n[0])

    def _notify_procs_to_terminate(self):
        _c10d.all_reduce(_flag(1, self._device), group=self._process_group)
        raise RuntimeError(f"Rank {self._rank} exhausted all inputs.")

    @staticmethod
    def notify_join_context(joinable):
        """Called by a joinable once per iteration, before its collectives: the first joinable of
        an enabled context all-reduces a 1 (matched by the joined ranks' 0). Returns the async
        work handle (or None when there is nothing to notify)."""
        if not hasattr(joinable, "_join_config"):
            raise AssertionError(f"Check that the {type(joinable)} constructor calls the "
                                 "``Joinable`` constructor")
        cfg = joinable._join_config
        if not cfg.is_first_joinable or not cfg.enable:
            return None
        pg = joinable.join_process_group
        device = joinable.join_device
        work = _c10d.all_reduce(_flag(1, device), group=pg, async_op=True)
        if cfg.throw_on_early_termination:
            zeros = _flag(0, device)
            _c10d.all_reduce(zeros, group=pg)
            if zeros[0]:
                raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing "
                                   "across all ranks.")
        return work
