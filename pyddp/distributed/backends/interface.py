"""The interface every backend of pyddp.distributed implements (see the package docstring).

One method runs every collective: ``run(request) -> Work or None``, where ``request`` is a
``Request`` record.  Not one method per collective kind (torch's ``c10d::Backend`` has a virtual per
collective): the checks above the seam already reduce every call to the same fields (kind, dtype
code, op, root, counts, input and output arrays), every backend dispatches on ``kind`` below it
(pyddp's C core through one kind table, NCCL and MPI through tables of their own), and a dozen
methods would be a dozen places for each backend to forget a check, a timeout or the signature
compare.  A new kind (``K_*`` in the C core's table) then reaches every backend without touching
the interface.

The record's fields are in the order of the C process group's ``submit`` (the 'cpu' backend's
object is ``pyddp._C.ProcessGroup`` itself), so ``submit(*request)`` is the same call spelt
positionally; ``runner()`` gives the one callable ProcessGroup calls for either spelling.
"""
from __future__ import annotations

import abc
from typing import NamedTuple, Optional, Protocol, runtime_checkable

__all__ = ["Request", "Backend", "Work", "Completed", "Rendezvous", "BackendOptions", "runner"]


class Request(NamedTuple):
    """One collective or point-to-point operation, its arguments checked by pyddp.distributed."""

    kind: int              # a pyddp._C.K_* code (the C core's kind table)
    dtype: int             # a dtype code (pyddp._interop.DTYPE_CODES)
    op: int                # a ReduceOp value (0 where the kind does not reduce)
    root: int              # group rank of the root / peer (0 where the kind has none)
    tag: int               # point-to-point tag
    count: int             # elements per rank's chunk (0 for all_to_all: the splits say)
    inputs: tuple          # arrays read: C-contiguous NumPy arrays on 'cpu', else ArrayViews
    outputs: tuple         # arrays written (in-place kinds name the array here only)
    in_splits: Optional[tuple]   # all_to_all_single: bytes sent to each rank, or None
    out_splits: Optional[tuple]  # bytes received from each rank, or None
    timeout: float         # seconds (monitored_barrier), 0.0: the group's
    wait_all: bool         # monitored_barrier(wait_all_ranks=True)
    name: str              # the public function's name, for messages
    blocking: bool         # True: the caller waits; the backend may finish it and return None


@runtime_checkable
class Work(Protocol):
    """What ``run`` returns for an operation still in flight (pyddp.distributed.Work wraps it)."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until done (or ``timeout`` seconds: False); raise the operation's error."""

    def is_completed(self) -> bool:
        """Done, successfully or not."""

    def source_rank(self) -> int:
        """The sender of a completed receive from any source (-1 otherwise)."""


class Completed:
    """A Work that is already done: what ``run`` returns for a non-blocking request it finished
    on the caller's thread (a blocking one returns None)."""

    __slots__ = ()

    def wait(self, timeout=None) -> bool:
        """Done already: True."""
        return True

    def is_completed(self) -> bool:
        """Always True."""
        return True

    def source_rank(self) -> int:
        """-1: no receive from any source."""
        return -1


class Backend(abc.ABC):
    """A group's backend object for the devices its registry entry serves; one per group and rank,
    made by the entry's factory from a ``BackendOptions``.

    Optional members ProcessGroup uses when present: ``fast(kind, array, arg[, input[, root]])``
    (a small blocking collective on the default group in one call; False: not handled, the call
    then goes through ``run``), ``transport`` (a word for logs), ``shared_alloc(nbytes)``, ``host``
    (a host group beside a device backend, for object collectives), ``split(rank, size)`` (new
    communicators for new_group, every rank of the parent taking part), ``batch_p2p(ops)``,
    ``explain(kind, dtype, count)`` (``(transport, algorithm)`` a collective of count elements
    would run with, asked of the code that decides it; without it pyddp.distributed.explain says
    the backend chooses)."""

    fast = None
    transport = None
    host = None

    @abc.abstractmethod
    def run(self, request: Request):
        """Start ``request``; None when it completed (a blocking request), else a ``Work``."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release everything; pending works fail or finish. Called once."""


class Rendezvous(Protocol):
    """A backend's own way of finding its ranks (a registry entry's ``rendezvous``), for
    ``init_process_group`` without ``store`` or ``init_method``."""

    def world(self, rank: int, world_size: int) -> tuple:
        """(rank, world_size) from the backend's launcher, when it serves every device of the
        group: no store, no env:// (MPI's ranks); ValueError when the given ones differ."""

    def prepare_env(self, environ) -> None:
        """When it shares the group with a backend that needs env://: fill what the launcher's
        variables leave open in ``environ`` (collective over the job)."""


def runner(obj):
    """The callable taking one Request for the backend object ``obj``: its ``run``, or its
    positional ``submit`` (pyddp._C.ProcessGroup, and user backends written against it: the fields
    of a Request in order); None when it has neither."""
    run = getattr(obj, "run", None)
    if callable(run):
        return run
    submit = getattr(obj, "submit", None)
    if not callable(submit):
        return None
    return lambda request: submit(*request)


class BackendOptions:
    """What a factory gets (the fields of torch's _DistributedBackendOptions).  A factory may set
    ``round`` (a backend that connects through the store records its rendezvous round there)."""

    __slots__ = ("store", "group_rank", "group_size", "timeout", "group_id",
                 "global_ranks_in_group", "pg_options", "round", "device_id", "split_from",
                 "once")

    def __init__(self, store, group_rank, group_size, timeout, group_id, global_ranks_in_group,
                 pg_options=None, device_id=None):
        self.store = store
        self.group_rank = group_rank
        self.group_size = group_size
        self.timeout = timeout  # a timedelta, as torch's
        self.group_id = group_id
        self.global_ranks_in_group = list(global_ranks_in_group)
        self.pg_options = pg_options
        self.round = 0
        self.device_id = device_id  # the CUDA ordinal a group is bound to, or None
        self.split_from = None  # new_group: the default group's backend object for this device,
        # when it can split its communicators (every rank of the default group calls its split())
        self.once = False  # new_group: the store prefix names this group alone, never reused
        # within the job (no round counter; every setup key is deleted once all ranks connected)
