"""The interface every backend of pyddp.distributed implements (see the package docstring).

One method runs every collective: ``run(request) -> Work or None``, where ``request`` is a
``Request`` record.  Not one method per collective kind (torch's ``c10d::Backend`` has a virtual per
collective): the checks above the seam already reduce every call to the same fields (kind, dtype
code, op, root, counts, input and output arrays), every backend dispatches on ``kind`` below it
(pyddp's C core through one kind table, NCCL and MPI through tables of their own), and a dozen
methods would be a dozen places for each backend to forget a check, a timeout or the signature
compare.  A new kind (``K_*`` in the C core's table) then reaches every backend without touching
the interface.

What a backend serves is declared, not found out by calling it: its registry entry names the
devices and a ``Supports`` record (kinds, dtypes, the dtypes and ReduceOps it reduces, receives
from any source), and ProcessGroup refuses anything outside it above the seam, with one wording
for every backend, before a rank sends a byte (torch's Backend base class does the same).  The
optional members a backend may have (``fast``, ``split``, ``host``, ``shared_alloc``,
``batch_p2p``, ``explain``, ``set_barrier_device``, ``transport``, ``error``, ``fail``) are
declared on ``Backend`` with None for "has none" and read once per backend object
(``declared``), never looked up call by call.

The record's fields are in the order of the C process group's ``submit`` (the 'cpu' backend's
object is ``pyddp._C.ProcessGroup`` itself), so ``submit(*request)`` is the same call spelt
positionally; ``runner()`` gives the one callable ProcessGroup calls for either spelling.
"""
from __future__ import annotations

import abc
from typing import NamedTuple, Optional, Protocol, runtime_checkable

__all__ = ["Request", "Backend", "Work", "Completed", "Rendezvous", "BackendOptions", "runner",
           "Supports", "Declared", "declared", "checked", "OPTIONAL"]


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

    Two members are required, ``run`` and ``destroy``.  The others are optional: None here means
    "this backend has none", and ProcessGroup reads them once per object (``declared``):

    - ``fast(kind, array, arg[, input[, root]]) -> bool``: a small blocking collective on the
      default group in one call (False: not handled, the call then goes through ``run``); taken
      only for a backend whose ``Supports`` refuses nothing;
    - ``split(rank, size) -> {device: communicator}``: new communicators for new_group, every
      rank of the parent taking part (rank None: a non-member);
    - ``host``: a host group beside a device backend (object collectives, host arrays of a
      device-only group), itself a backend object;
    - ``shared_alloc(nbytes)``: a buffer every rank of the host maps (DDP's shared buckets);
    - ``batch_p2p(ops) -> Work``: ``[(is_send, view, peer)]`` as one group of sends and receives;
    - ``explain(kind, dtype, count) -> (transport, algorithm)``: what a collective would run with,
      asked of the code that decides it (without it pyddp.distributed.explain says the backend
      chooses);
    - ``set_barrier_device(index)``: barrier(device_ids=[index]) runs the next barrier there;
    - ``transport``: a word for logs and explain ('shm': every rank shares this host's memory);
    - ``error`` (the group's first fatal error, or None) and ``fail(msg)`` (make it the group's
      error, tell the peers): what a device backend watches its host group with."""

    fast = None
    split = None
    host = None
    shared_alloc = None
    batch_p2p = None
    explain = None
    set_barrier_device = None
    transport = None
    error = None
    fail = None

    @abc.abstractmethod
    def run(self, request: Request):
        """Start ``request``; None when it completed (a blocking request), else a ``Work``."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release everything; pending works fail or finish. Called once."""


# the optional members of Backend, in the order of Declared's fields after run
OPTIONAL = ("fast", "split", "host", "shared_alloc", "batch_p2p", "explain",
            "set_barrier_device", "transport")


class Declared(NamedTuple):
    """A backend object's interface as ProcessGroup uses it, read once (``declared``): its runner
    and its optional members (None: it has none).  ``error`` and ``fail`` change or act on the
    object, so they are read from it where used."""

    run: object
    fast: object = None
    split: object = None
    host: object = None
    shared_alloc: object = None
    batch_p2p: object = None
    explain: object = None
    set_barrier_device: object = None
    transport: Optional[str] = None


def declared(obj) -> Declared:
    """The ``Declared`` record of backend object ``obj`` (a Backend, the C process group, or a
    user's object written against either)."""
    return Declared(runner(obj), *(getattr(obj, m, None) for m in OPTIONAL))


_KIND_NAMES = None  # kind code -> name, dtype code -> name, op code -> name (pyddp._C's tables)


def _names():
    global _KIND_NAMES
    if _KIND_NAMES is None:
        from ... import _C

        _KIND_NAMES = ({v["code"]: k for k, v in _C.KINDS.items()},
                       {v: k for k, v in _C.DTYPE_CODES.items()},
                       {v: k for k, v in _C.REDUCE_OPS.items()},
                       {v["code"] for v in _C.KINDS.values() if v["reduces"]},
                       _C.KINDS["recv"]["code"])
    return _KIND_NAMES


def _listed(names) -> str:
    return ", ".join(sorted(names))


class Supports(NamedTuple):
    """What a backend serves, besides its devices (a registry entry's ``supports``).  None: every
    kind, dtype or op pyddp has (pyddp._C.KINDS, DTYPE_CODES, REDUCE_OPS: names as there).

    ``kinds``: collective kinds it runs; ``dtypes``: dtypes it moves at all; ``reduce_dtypes``:
    dtypes the reducing kinds (all_reduce, reduce, reduce_scatter) take; ``ops``: the ReduceOps
    they take; ``any_source``: recv without src.  ProcessGroup asks ``refusal`` before it hands a
    request to the backend; a Supports() that refuses nothing costs no call at all."""

    kinds: Optional[frozenset] = None
    dtypes: Optional[frozenset] = None
    reduce_dtypes: Optional[frozenset] = None
    ops: Optional[frozenset] = None
    any_source: bool = True

    def refuses_nothing(self) -> bool:
        """True for the backend that serves every request (no check is made)."""
        return self == _EVERYTHING

    def refusal(self, request, backend: str):
        """The exception for a request this backend does not serve (naming the argument and what
        the backend supports), or None."""
        kinds, dtypes, ops, reducing, recv = _names()
        name = request.name or kinds.get(request.kind, "collective")
        kind = kinds.get(request.kind, str(request.kind))
        if self.kinds is not None and kind not in self.kinds:
            return NotImplementedError(
                f"{name}: backend {backend!r} does not support {kind}; it supports "
                f"{_listed(self.kinds)}")
        has_arrays = request.inputs or request.outputs
        dtype = dtypes.get(request.dtype, str(request.dtype))
        if has_arrays and self.dtypes is not None and dtype not in self.dtypes:
            return TypeError(f"{name}: backend {backend!r} does not support dtype {dtype}; it "
                             f"supports {_listed(self.dtypes)}")
        if request.kind in reducing:
            if self.reduce_dtypes is not None and dtype not in self.reduce_dtypes:
                return TypeError(
                    f"{name}: backend {backend!r} does not reduce dtype {dtype} (it can only "
                    f"be broadcast, gathered, scattered or sent); it reduces "
                    f"{_listed(self.reduce_dtypes)}")
            op = ops.get(request.op, str(request.op))
            if self.ops is not None and op not in self.ops:
                return TypeError(f"{name}: backend {backend!r} does not support ReduceOp.{op}; "
                                 f"it supports ReduceOp {_listed(self.ops)}")
        if request.kind == recv and request.root < 0 and not self.any_source:
            return ValueError(f"{name}: backend {backend!r} cannot receive from any source; "
                              "give src")
        return None

    def describe(self) -> str:
        """One line: what it supports ('every kind, dtype and op' for Supports())."""
        if self.refuses_nothing():
            return "every kind, dtype and op"
        parts = [f"kinds {_listed(self.kinds)}" if self.kinds is not None else "every kind",
                 f"dtypes {_listed(self.dtypes)}" if self.dtypes is not None else "every dtype"]
        if self.reduce_dtypes is not None:
            parts.append(f"reductions on {_listed(self.reduce_dtypes)}")
        if self.ops is not None:
            parts.append(f"ReduceOp {_listed(self.ops)}")
        if not self.any_source:
            parts.append("no receive from any source")
        return "; ".join(parts)


_EVERYTHING = Supports()


def checked(run, supports: Supports, backend: str):
    """``run`` (a runner) behind ``supports``'s check: the one place requests are refused."""
    refusal = supports.refusal

    def run_checked(request):
        e = refusal(request, backend)
        if e is not None:
            raise e
        return run(request)

    return run_checked


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
                 "once", "default")

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
        self.default = False  # init_process_group's group, the job's default one
