"""torch.distributed's process-group API on pyddp's C core.

Names, argument order, defaults and error types follow torch.distributed (2.x).  This module
checks arguments, turns arrays into views (pyddp._interop) and reduces each call to one request;
a ProcessGroup (process_group.py) routes it to the backend serving the arrays' device
(pyddp.distributed.backends: the C core, pyddp._C, for 'cpu'), which moves the bytes.
"""
from __future__ import annotations

import atexit
import enum
import functools
import hashlib
import io
import os
import pickle
import threading
from datetime import timedelta

import numpy as np

from .. import _C, _config, _interop
from . import _observe
from .backends import registry as _registry
from .backends.interface import BackendOptions, Request
from .process_group import Future, ProcessGroup, Work, _objects  # noqa: F401  (public here)
from .._interop import cpu_array as as_array
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore, job_secret  # noqa: F401

DistError = _C.DistError
DistBackendError = _C.DistBackendError
DistNetworkError = _C.DistNetworkError
DistStoreError = _C.DistStoreError

default_pg_timeout = timedelta(minutes=30)

# The C core's reduction operators (pd_redop), as pyddp._C exports them from its table.
_REDUCE_OPS = _C.REDUCE_OPS


class ReduceOp(enum.IntEnum):
    """Reduction operators (values match the C core's pd_redop)."""

    SUM = _REDUCE_OPS["SUM"]
    AVG = _REDUCE_OPS["AVG"]
    PRODUCT = _REDUCE_OPS["PRODUCT"]
    MIN = _REDUCE_OPS["MIN"]
    MAX = _REDUCE_OPS["MAX"]
    BAND = _REDUCE_OPS["BAND"]
    BOR = _REDUCE_OPS["BOR"]
    BXOR = _REDUCE_OPS["BXOR"]

    # torch's members are ReduceOp.RedOpType's and print as such: str(ReduceOp.SUM) == "RedOpType.SUM".
    # Python 3.11 made IntEnum's str() the bare number, so the text is spelled out here.
    def __str__(self):
        return f"RedOpType.{self.name}"

    def __repr__(self):
        return f"<RedOpType.{self.name}: {int(self)}>"

    def __format__(self, spec):
        return format(str(self), spec)

    # torch spells the type ReduceOp.RedOpType
    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        return None


ReduceOp.RedOpType = ReduceOp  # type: ignore[attr-defined]


class Backend(str):
    """Backend names: "cpu" (pyddp's own) and "gloo" (its alias); "nccl" (CUDA arrays, where
    libnccl loads) and "mpi" (where mpi4py is installed); those added with ``register_backend``."""

    CPU = "cpu"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise TypeError(f"backend must be a string, got {type(name).__name__}")
        return str.__new__(cls, name.lower())

    @classmethod
    def register_backend(cls, name, func, extended_api=False, devices=None, *,
                         supports=None) -> None:
        """Register a backend (torch's ``Backend.register_backend``).

        ``func(store, rank, world_size, timeout)`` (``func(backend_options, pg_options)`` with
        ``extended_api=True``) creates the backend object of one group on this rank; it
        implements pyddp's backend interface, pyddp.distributed.backends.interface.Backend:
        ``run(request)`` and ``destroy()``, and any of the optional members it declares
        (``fast``, ``split``, ``batch_p2p``, ...; an object with the C process group's positional
        ``submit`` instead of ``run`` is accepted too).  ``devices``: the device type(s) it
        serves (default 'cpu' and 'cuda', with a warning).  ``supports`` (pyddp's addition): a
        backends.interface.Supports saying which kinds, dtypes and ops it serves; what it leaves
        out is refused before the backend is called (default: everything).
        ``init_process_group(name)`` and ``new_group(backend=name)`` then use it, as do
        'device:name' strings."""
        _registry.register_plugin(name, func, extended_api, devices, supports)
        if not hasattr(cls, name.upper()):
            setattr(cls, name.upper(), name.lower())


# ------------------------------------------------------------------------------------ groups

class _NonMember:
    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    """torch's GroupMember: WORLD is the default group once initialized; NON_GROUP_MEMBER is what
    new_group() returns on ranks outside the group."""
    WORLD = None
    NON_GROUP_MEMBER = _NonMember()


class group:  # noqa: N801  (torch's spelling)
    """torch's ``dist.group``: ``group.WORLD`` is the default process group once initialized."""
    WORLD = None


class _World:
    def __init__(self):
        self.default_pg = None
        self.store = None
        self.backend = None
        self.groups = []  # every live ProcessGroup, default first
        self.group_count = 0  # new_group calls every rank makes (groups named pg1, pg2, ...)
        # new_group(use_local_synchronization=True) calls per rank list, made by its members only
        self.local_counts = {}
        self.owns_store = False  # the store came from init_method rendezvous
        self.round = 0
        self.device_id = None  # init_process_group's device_id, inherited by new_group
        self.failing_exit = False  # the program is ending with an uncaught exception
        self.pg_count = 0  # get_pg_count(): groups named so far, the default group included
        self.non_member_ranks = None  # ranks of the latest group this rank is not a member of
        self.lock = threading.Lock()


_world = _World()
_observe.default_group = lambda: _world.default_pg


def _set_world(pg):
    _world.default_pg = pg
    GroupMember.WORLD = pg
    group.WORLD = pg


def is_available() -> bool:
    """True: pyddp.distributed is always available (torch.distributed.is_available)."""
    return True


def is_initialized() -> bool:
    """Whether init_process_group has created the default process group."""
    return _world.default_pg is not None


def _registered_available(name) -> bool:
    e = _registry.lookup(name)
    return e is not None and e.is_available()


def is_gloo_available() -> bool:
    """True: the name 'gloo' selects pyddp's own CPU backend."""
    return _registered_available("gloo")


def is_nccl_available() -> bool:
    """Whether the 'nccl' backend can be used: libnccl (NCCL 2.18 or later) loads; see
    pyddp.cuda._lib for where pyddp looks.  As torch's, this does not need a GPU.  True under
    PYDDP_CUDA_ON_CPU=1, where "nccl" runs on the cpu backend."""
    from ..cuda import _emulation
    return _emulation.enabled() or _registered_available("nccl")


def is_mpi_available() -> bool:
    """Whether the 'mpi' backend can be used: mpi4py is installed (the ``mpi`` extra)."""
    return _registered_available("mpi")


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` ("gloo", "nccl", "cpu:gloo,cuda:nccl", a registered name; any case)
    can be used here, as torch answers."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    b = backend.lower()
    names = [part.split(":", 1)[1] for part in b.split(",")] if ":" in b else [b]
    return all(_registered_available(name.strip()) for name in names)


def get_pg_count() -> int:
    """The number of process groups created (the default group included; 0 before
    init_process_group), as torch counts them: every rank counts every new_group call."""
    return _world.pg_count if _world.default_pg is not None else 0


def _default_pg() -> ProcessGroup:
    if _world.default_pg is None:
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return _world.default_pg


def explain(collective, tensor=None, *, nbytes=None, dtype=None, group=None) -> dict:
    """Which backend, transport and algorithm a collective on ``group`` (default: the default
    group) would run with now, asked of the same code that decides when it runs; runs nothing.

    ``collective``: its name ("all_reduce") or the function (``dist.all_reduce``).  ``tensor``:
    the array one rank contributes (all_gather, gather: its input; reduce_scatter, scatter: its
    output block; all_to_all: its largest block), or give ``nbytes`` (and ``dtype``, default
    uint8).  Returns ``{"backend", "transport", "algorithm", "staged", "why"}``; the flight
    record and the DETAIL log name the same three for every call that ran."""
    name = getattr(collective, "__name__", collective)
    name = {"all_reduce_coalesced": "all_reduce", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
            "gather_object": "gather", "broadcast_object_list": "broadcast",
            "all_gather_object": "all_gather", "scatter_object_list": "scatter",
            "send": "send", "recv": "recv", "isend": "send", "irecv": "recv"}.get(name, name)
    info_ = _C.KINDS.get(name)
    if info_ is None or info_["code"] == 0:
        raise ValueError(f"explain: unknown collective {collective!r} (one of "
                         f"{', '.join(k for k in _C.KINDS if _C.KINDS[k]['code'])})")
    pg = _resolve(group)
    if pg is None:
        raise ValueError("explain: this rank is not a member of the group")
    if tensor is not None:
        if nbytes is not None:
            raise ValueError("explain: give tensor or nbytes, not both")
        view = _interop.describe(tensor, "tensor")
        if view.code is None:
            raise TypeError(f"explain: tensor has unsupported dtype {view.dtype}")
        device, code, count = view.device, view.code, view.size
    else:
        device = "cpu"
        code = _interop.dtype_code("uint8" if dtype is None else
                                   str(dtype).replace("torch.", ""), "dtype")
        count = int(nbytes or 0) // max(_C.DTYPE_SIZES.get(_observe.dtype_name(code), 1), 1)
    return pg._explain(info_["code"], code, count, device)


def _get_default_store():
    """The store of the default process group (torch's ``_get_default_store``)."""
    _default_pg()
    return _world.store


def _resolve(group) -> ProcessGroup | None:
    """The ProcessGroup to use; None when this rank is not a member of `group`."""
    if group is None or group is GroupMember.WORLD:
        return _default_pg()
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup returned by new_group() or None, "
                        f"got {type(group).__name__}")
    if group._backends is None:
        raise ValueError(f"group {group._name!r} has been destroyed")
    return group


def get_rank(group=None) -> int:
    """This process's rank in ``group`` (the default group when None); -1 on a rank that is not a
    member."""
    pg = _resolve(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group=None) -> int:
    """Number of ranks in ``group`` (the default group when None); -1 on a rank that is not a
    member."""
    pg = _resolve(group)
    return -1 if pg is None else pg.size()


def get_backend(group=None) -> str:
    """The backend name of ``group`` as given to init_process_group or new_group, lower case
    ('cpu', 'gloo', 'cpu:gloo,cuda:nccl', ...; 'cpu' for the default)."""
    pg = _resolve(group)
    if pg is None:
        raise ValueError("Invalid process group specified: this rank is not a member")
    return pg._backend


def _group_ranks(group) -> list:
    """Global ranks of ``group``'s members in group-rank order; these are known on every rank,
    members or not (as torch answers on a rank outside the group)."""
    if group is None or group is GroupMember.WORLD:
        return list(_default_pg()._ranks)
    if group is GroupMember.NON_GROUP_MEMBER:
        # torch keeps the ranks of the latest group this rank is not a member of under its
        # NON_GROUP_MEMBER value, and answers with them.
        if _world.non_member_ranks is None:
            raise ValueError(f"Group {group!r} is not registered, please create group with "
                             "new_group")
        return list(_world.non_member_ranks)
    pg = _resolve(group)
    return list(pg._ranks)


def get_process_group_ranks(group) -> list:
    """The global ranks of ``group``'s members, in group-rank order (also on a rank outside the
    group, as torch)."""
    return _group_ranks(group)


def get_global_rank(group, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (also on a rank outside the group)."""
    ranks = _group_ranks(group)
    if isinstance(group_rank, bool) or not isinstance(group_rank, (int, np.integer)) or \
            not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of group {_group_label(group)}")
    return ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    """The rank in ``group`` of the process whose global rank is ``global_rank`` (also on a rank
    outside the group)."""
    ranks = _group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {_group_label(group)}")
    return ranks.index(global_rank)


def _group_label(group) -> str:
    if group is None or group is GroupMember.WORLD:
        return "the default group"
    name = getattr(group, "_name", None)
    return repr(name) if name is not None else repr(group)


# -------------------------------------------------------------------------------- rendezvous

def _timeout_seconds(timeout, name="timeout") -> float:
    if timeout is None:
        return default_pg_timeout.total_seconds()
    if isinstance(timeout, timedelta):
        s = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        s = float(timeout)
    else:
        raise TypeError(f"{name} must be a datetime.timedelta, got {type(timeout).__name__}")
    if s <= 0:
        raise ValueError(f"{name} must be positive, got {timeout}")
    return s


def _device_index(device_id):
    """The CUDA ordinal of init_process_group's / new_group's ``device_id`` (an int, 'cuda:N',
    or a torch.device), or None."""
    if device_id is None:
        return None
    if isinstance(device_id, (int, np.integer)) and not isinstance(device_id, bool):
        return int(device_id)
    dtype_, index = getattr(device_id, "type", None), getattr(device_id, "index", None)
    if dtype_ is None and isinstance(device_id, str):
        dtype_, _, idx = device_id.partition(":")
        index = int(idx) if idx.isdigit() else None
    if dtype_ != "cuda":
        raise ValueError(f"device_id must be a CUDA device (an int, 'cuda:N' or a torch.device), "
                         f"got {device_id!r}")
    if index is None:
        from ..cuda import _runtime as cuda
        index = cuda.current_device()
    return int(index)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """Initialize the default process group (torch.distributed.init_process_group)."""
    with _world.lock:
        if _world.default_pg is not None:
            raise ValueError("trying to initialize the default process group twice!")
        bname, plan = _registry.parse(backend)
        tsec = _timeout_seconds(timeout)
        _config.check()  # every PYDDP_*/TORCH_* variable, before anything reads one
        if store is not None and init_method is not None:
            raise ValueError("Cannot specify both init_method and store.")
        if not isinstance(world_size, int) or not isinstance(rank, int):
            raise TypeError("world_size and rank must be integers")
        hooks = [getattr(e, "rendezvous", None) for e in plan.values()]
        if store is None and init_method is None and hooks and all(hooks):
            # a backend with a launcher of its own serves every device ("mpi"): rank and world
            # size come from it, as torch's, no rendezvous (a local store keeps new_group's
            # bookkeeping; the backend never reads it)
            rank, world_size = hooks[0].world(rank, world_size)
            store, owns = HashStore(), False
        elif store is not None:
            if world_size <= 0:
                raise ValueError("world_size must be positive if using store")
            if rank < 0:
                raise ValueError("rank must be non-negative if using store")
            from ._rendezvous import check_rank as _check_rank  # (at init: a lighter import)

            _check_rank(rank, world_size)
            owns = False
        else:
            if init_method is None:
                # "cpu:mpi,cuda:nccl": the other backend's rendezvous is env://; what the
                # launcher's variables leave open (MASTER_ADDR across hosts, ...) comes from MPI
                for hook in dict.fromkeys(h for h in hooks if h is not None):
                    hook.prepare_env(os.environ)
            from ._rendezvous import rendezvous as _rendezvous

            store, rank, world_size = _rendezvous(init_method or "env://", rank, world_size, tsec)
            owns = True
        pstore = PrefixStore("default_pg", store)
        name = group_name or "default_pg"
        dev = _device_index(device_id)
        opts = BackendOptions(pstore, rank, world_size, timedelta(seconds=tsec), name,
                              range(world_size), pg_options, dev)
        opts.default = True  # (backend 'cpu' tunes it online under PYDDP_TUNING_ONLINE=1)
        pg = ProcessGroup(_registry.create(plan, opts), range(world_size), bname, name, tsec,
                          rank, plan)
        _world.store = store
        _world.owns_store = owns
        _world.round = opts.round
        _world.backend = bname
        _world.device_id = dev
        _world.groups = [pg]
        _world.group_count = 0
        _world.local_counts = {}
        _world.pg_count = 1
        _world.non_member_ranks = None
        _set_world(pg)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None, sort_ranks=True):
    """Create a subgroup.  Every rank of the default group must call it, in the same order.
    Group ranks follow the sorted global ranks, or the order of ``ranks`` with
    ``sort_ranks=False`` (as torch)."""
    world = _default_pg()
    n = world.size()
    if ranks is None:
        ranks = list(range(n))
    ranks = [int(r) for r in ranks]
    if sort_ranks:
        ranks.sort()
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks contains duplicates: {ranks}")
    for r in ranks:
        if not 0 <= r < n:
            raise ValueError(f"rank {r} in ranks is out of range [0, {n - 1}]")
    bname, plan = _registry.parse(backend) if backend is not None else (world._backend, world._plan)
    tsec = _timeout_seconds(timeout) if timeout is not None else world._timeout
    me = world.rank()
    if use_local_synchronization and me not in ranks:
        # only the members synchronise (torch's option): a non-member's call is a no-op
        _world.non_member_ranks = list(ranks)
        return GroupMember.NON_GROUP_MEMBER
    with _world.lock:
        if use_local_synchronization:
            name = _local_group_name(ranks)
        else:
            _world.group_count += 1
            name = f"pg{_world.group_count}"
    # A device backend that splits its communicators (NCCL's ncclCommSplit) does it with every
    # rank of the default group taking part, members or not.
    parent = (world._backends or {}).get("cuda")
    decl = world._declared("cuda")
    if use_local_synchronization or plan.get("cuda") is not (world._plan or {}).get("cuda") or \
            decl is None or decl.split is None:
        parent = None
    if not use_local_synchronization:
        _world.pg_count += 1
    if me not in ranks:
        if parent is not None:
            decl.split(None, None)
        _world.non_member_ranks = list(ranks)
        return GroupMember.NON_GROUP_MEMBER
    store = PrefixStore(name, PrefixStore("default_pg", _world.store))
    dev = _device_index(device_id) if device_id is not None else _world.device_id
    opts = BackendOptions(store, ranks.index(me), len(ranks), timedelta(seconds=tsec),
                          group_desc or name, ranks, pg_options, dev)
    opts.split_from = parent
    opts.once = True
    pg = ProcessGroup(_registry.create(plan, opts), ranks, bname, group_desc or name, tsec,
                      ranks.index(me), plan)
    _world.groups.append(pg)
    return pg


def _local_group_name(ranks):
    """The name of a group that only its members create (use_local_synchronization): derived
    from what those ranks share, the rank list and how many groups of that list they made
    before, never from a count that ranks outside it do not advance (two disjoint sets making
    their groups at once must not meet under one name).  torch's names: the SHA-1 of the rank
    list, rehashed with "_" for each earlier group of the same list.  Called under _world.lock."""
    key = tuple(ranks)
    k = _world.local_counts.get(key, 0)
    _world.local_counts[key] = k + 1
    name = hashlib.sha1("_".join(map(str, ranks)).encode(), usedforsecurity=False).hexdigest()
    for _ in range(k):
        name = hashlib.sha1((name + "_").encode(), usedforsecurity=False).hexdigest()
    return name


def destroy_process_group(group=None):
    """Destroy `group`, or every group and the default group when None."""
    if group is None or group is GroupMember.WORLD:
        groups, _world.groups = _world.groups, []
        world = _world.default_pg
        for pg in reversed(groups):
            pg._destroy()
        store, _world.store = _world.store, None
        if world is not None and _world.owns_store:
            _release_store(store, world.rank(), world.size(), _world.round)
        del store
        _set_world(None)
        _world.local_counts = {}
        _world.pg_count = 0
        _world.non_member_ranks = None
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup, got {type(group).__name__}")
    group._destroy()
    if group in _world.groups:
        _world.groups.remove(group)


def _exit_timeout(default: float) -> float:
    """PYDDP_EXIT_TIMEOUT in seconds (>= 0; 0: do not wait), or ``default`` when unset; a value
    that is not a non-negative number is reported and replaced by the default."""
    from .. import _config

    try:
        seconds = _config.get("PYDDP_EXIT_TIMEOUT")
    except ValueError as e:  # at exit: say so and go on
        import warnings

        warnings.warn(f"{e}; using {default:g}", RuntimeWarning, stacklevel=3)
        return default
    return default if seconds is None else seconds


def _release_store(store, rank, size, rnd):
    """Shut down a store this job created, without stranding the other ranks.

    The master's store server must not outlive the round: a rank that destroys its group and
    calls init_process_group again must reach the next round's server, not the old one.  So
    every rank checks out; the master shuts its server down once all have (or after a few
    seconds), and the others return only when the old server is gone."""
    if size <= 1 or not isinstance(store, TCPStore):
        return
    pstore = PrefixStore(f"default_pg/pg/{rnd}", store)
    # A rank dying of an uncaught exception does not wait for the others to check out: they may
    # be blocked in a collective it will never join (the launcher waits for its exit status).
    default = 0.2 if _world.failing_exit else 5.0
    seconds = _exit_timeout(default)
    limit = timedelta(seconds=seconds)
    try:
        if pstore.add("exit", 1) == size:
            pstore.set("exit_done", b"1")
        if seconds == 0:
            # PYDDP_EXIT_TIMEOUT=0: check out without waiting for the others (a store timeout of
            # 0 would mean "no limit", and an exit must never wait forever).
            return
        if rank == 0:
            pstore.wait(["exit_done"], limit)
        else:
            # returns (with an error) as soon as the master closes the server
            pstore.wait(["never"], limit)
    except (DistError, OSError, ValueError):
        pass


@atexit.register
def _destroy_at_exit():
    # Say goodbye to the peers so they see a clean exit, not a crash.
    # sys.last_value (sys.last_exc from 3.12) is set when an uncaught exception ends the program.
    import sys

    _world.failing_exit = getattr(sys, "last_value", None) is not None or \
        getattr(sys, "last_exc", None) is not None
    try:
        destroy_process_group()
    except Exception:
        pass


# ------------------------------------------------------------------------------- helpers

class _PremulSum:
    """A PREMUL_SUM reduction (``_make_nccl_premul_sum(factor)``, torch's): each rank's input is
    multiplied by ``factor`` before a SUM."""
    __slots__ = ("factor",)

    op = "PREMUL_SUM"

    def __init__(self, factor):
        self.factor = factor

    def __repr__(self):
        return f"<RedOpType.PREMUL_SUM factor={self.factor!r}>"


def _make_nccl_premul_sum(factor):
    """torch's ``dist._make_nccl_premul_sum(factor)``: an op that scales every rank's input by
    ``factor`` (a number, or a one-element array) and sums (all_reduce, reduce, reduce_scatter)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        try:
            arr = np.asarray(factor)
        except Exception:
            arr = None
        if arr is None or arr.size != 1 or arr.dtype.kind not in "iuf":
            raise TypeError(f"_make_nccl_premul_sum: factor must be a real number or a one-element "
                            f"array, got {type(factor).__name__}")
    return _PremulSum(factor)


def _op_of(op, premul=False):
    """The ReduceOp of ``op``, as torch accepts it: a ReduceOp member (``ReduceOp.SUM``, which is
    also ``ReduceOp.RedOpType.SUM``), torch's own ReduceOp / RedOpType objects, and with
    ``premul`` a premul-sum object; anything else (a bool, an int, a float, a string) is a
    TypeError, never a silent reinterpretation (``op=True`` is not AVG)."""
    if type(op) is ReduceOp:
        return op
    if type(op) is _PremulSum:
        if premul:
            return op
        raise ValueError("op: PREMUL_SUM is supported by all_reduce, reduce and reduce_scatter only")
    mod = type(op).__module__ or ""
    if mod.split(".")[0] == "torch":  # torch.distributed.ReduceOp(.RedOpType) objects
        inner = getattr(op, "op", op)  # a ReduceOp instance wraps a RedOpType
        name = getattr(inner, "name", None)
        if name == "PREMUL_SUM":
            if not premul:
                raise ValueError("op: PREMUL_SUM is supported by all_reduce, reduce and "
                                 "reduce_scatter only")
            return _PremulSum(getattr(op, "factor", None))
        if isinstance(name, str) and name in ReduceOp.__members__:
            return ReduceOp[name]
    raise TypeError(f"op must be a ReduceOp (ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR) "
                    f"or a premul-sum op, got {op!r} of type {type(op).__name__}")


def _premul_input(pg, a, op, what):
    """For a PREMUL_SUM ``op``: ``a`` (a host array) scaled by the factor, and SUM; else (a, op)."""
    if type(op) is not _PremulSum:
        return a, op
    if type(a) is not np.ndarray:
        raise ValueError(f"{what}: PREMUL_SUM is supported on host (NumPy) arrays only")
    if a.dtype.kind not in "fc":
        raise ValueError(f"{what}: PREMUL_SUM needs a floating-point tensor, got {a.dtype}")
    factor = op.factor
    if factor is None:
        raise ValueError(f"{what}: PREMUL_SUM without a factor")
    return a * np.asarray(factor, dtype=a.dtype).reshape(()), ReduceOp.SUM


_TORCH_TYPE_NAMES = {"bool": "Bool", "int8": "Char", "uint8": "Byte", "int16": "Short",
                     "uint16": "UInt16", "int32": "Int", "uint32": "UInt32", "int64": "Long",
                     "uint64": "UInt64"}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _check_reduce_op(a, code, op, name, value_error=False, call=None):
    """torch's (gloo's) refusals of a reduction op for the dtype of a host array, with its
    exception types: bitwise ops on floating types, AVG on integers and bool, and only SUM / AVG
    on complex.  Device arrays (the NCCL backend) keep NCCL's rules, checked by the backend.
    ``call`` names the function in the AVG message (default ``name``, the one torch's complex
    message names).  Raised before any communication, on every rank that passes the dtype."""
    if type(a) is not np.ndarray:
        return
    dname = _interop.DTYPE_NAMES[code]
    if dname.startswith("complex"):
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            msg = f"{name} does not support RedOpType.{op.name} on complex tensors"
            raise (ValueError if value_error else RuntimeError)(msg)
        return
    if dname in _TORCH_TYPE_NAMES:
        if op is ReduceOp.AVG:
            # torch's gloo fails dividing the sum in place; its words are kept at the end
            raise RuntimeError(f"{call or name}: Cannot use ReduceOp.AVG with non-floating point "
                               f"dtype {dname} (use a floating point array, or SUM and divide; "
                               f"torch: result type Float can't be cast to the desired output "
                               f"type {_TORCH_TYPE_NAMES[dname]})")
    elif op in _BITWISE:
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")


def supports_complex(reduceOp) -> bool:  # noqa: N803 (torch's name)
    """Whether ``reduceOp`` may reduce complex tensors (SUM and AVG), as torch answers."""
    try:
        op = _op_of(reduceOp)
    except (ValueError, TypeError):
        return True
    return op not in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT) + _BITWISE


def _shape_str(shape) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def _check_gather_shape(output_tensor, input_tensor, n):
    """torch (gloo) splits the output of all_gather_into_tensor with torch.chunk(output, n) and
    requires every chunk to have the input's shape: output is (n * d0, d1, ...)."""
    oshape = getattr(output_tensor, "shape", None)
    ishape = getattr(input_tensor, "shape", None)
    if oshape is None or ishape is None:
        return
    oshape, ishape = tuple(oshape), tuple(ishape)
    if ishape and oshape == (n * ishape[0],) + ishape[1:]:
        return
    if not oshape:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    d0 = oshape[0]
    chunk = -(-d0 // n) if d0 else 0
    count = -(-d0 // chunk) if chunk else n
    if count != n:
        raise RuntimeError(f"ProcessGroupGloo::allgather: invalid output tensor list at index 0 "
                           f"(expected length {n}, got {count})")
    for i in range(n):
        got = (min(chunk, d0 - i * chunk),) + oshape[1:] if chunk else oshape
        if got != ishape:
            raise RuntimeError(f"ProcessGroupGloo::allgather: invalid tensor size at index {i} "
                               f"(expected {_shape_str(ishape)}, got {_shape_str(got)})")


def _group_rank(pg, global_rank, what):
    if not isinstance(global_rank, (int, np.integer)) or isinstance(global_rank, bool):
        raise TypeError(f"{what} must be an int rank, got {type(global_rank).__name__}")
    r = pg._rank_of.get(int(global_rank))
    if r is None:
        if pg is _world.default_pg:
            raise ValueError(f"{what}={global_rank} is out of range: expected 0 <= {what} < {pg.size()}")
        raise ValueError(f"{what}={global_rank} is not a member of group {pg._name!r} "
                         f"(ranks {pg._ranks})")
    return r


def _check_same(a, code, ref, ref_code, what, ref_what):
    if code != ref_code:
        raise TypeError(f"{what} has dtype {_interop.DTYPE_NAMES[code]} but {ref_what} has dtype "
                        f"{_interop.DTYPE_NAMES[ref_code]}")


def _list_arg(lst, name):
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{name} must be a list of arrays, got {type(lst).__name__}")
    return lst


def _rank_arrays(pg, lst, name, ref, ref_code, ref_name, writable):
    """Views of a list with one array per rank, each like `ref` (dtype, element count)."""
    _list_arg(lst, name)
    n = pg.size()
    if len(lst) != n:
        raise ValueError(f"{name} must have one array per rank ({n}), got {len(lst)}")
    out = []
    for i, t in enumerate(lst):
        a, code = as_array(t, f"{name}[{i}]", writable, pg._on_device)
        _check_same(a, code, ref, ref_code, f"{name}[{i}]", ref_name)
        if a.size != ref.size:
            raise ValueError(f"{name}[{i}] has {a.size} elements but {ref_name} has {ref.size}")
        out.append(a)
    return tuple(out)


def _root(pg, group_root, root, name):
    """The root's group rank: ``group_root`` (group_src / group_dst) when given, else the group
    rank of the global rank ``root`` (default 0)."""
    if group_root is not None:
        return group_root
    return _group_rank(pg, root if root is not None else 0, name)


def _root_list(pg, root, lst, name, ref, ref_code, writable, role):
    """gather's / scatter's list of one array per rank: its arrays on the root, () on the others
    (where it must be None or empty)."""
    if pg.rank() == root:
        if lst is None:
            raise ValueError(f"{name} must be given on the {role} rank")
        return _rank_arrays(pg, lst, name, ref, ref_code, "tensor", writable)
    if lst:
        raise ValueError(f"{name} must be None or empty on non-{role} ranks")
    return ()


# ------------------------------------------------------------------------------ collectives

def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Copy ``tensor`` of rank ``src`` (global rank; ``group_src``: rank in the group) into
    ``tensor`` on every rank of ``group``, in place. Returns a Work with ``async_op=True``,
    else None."""
    pg = _start(group, not async_op and group_src is None and src is not None,
                _K_BROADCAST, tensor, src)
    if pg is None:
        return None
    root = _root(pg, group_src, src, "src")
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    return _ret(pg._submit(_C.K_BROADCAST, code, 0, root, 0, a.size, (), (a,),
                           name="broadcast", result=tensor, async_op=async_op), async_op)


_K_ALLREDUCE, _K_BROADCAST, _K_BARRIER = _C.K_ALLREDUCE, _C.K_BROADCAST, _C.K_BARRIER
_K_ALLGATHER, _K_REDUCE_SCATTER = _C.K_ALLGATHER, _C.K_REDUCE_SCATTER
_K_REDUCE, _K_GATHER, _K_SCATTER, _K_ALLTOALL = _C.K_REDUCE, _C.K_GATHER, _C.K_SCATTER, _C.K_ALLTOALL


def _start(group, fast, kind, x, arg, y=None, root=None):
    """What every collective does first: with ``fast`` (a blocking call the C fast path may take)
    on the default group, try the C fast path, ``fast(kind, x, arg[, y, root])`` (one C call;
    None: done); else the ProcessGroup to run on, or None on a rank outside ``group`` (nothing to
    do).  Fixed arguments, no ``*args``: a small blocking collective is about 1 us, and packing
    and unpacking a tuple was a tenth of it."""
    if fast and group is None:
        pg = _world.default_pg
        if pg is not None:
            f = pg._fast
            if f is not None and (f(kind, x, arg) if y is None and root is None
                                  else f(kind, x, arg, y, root or 0)):
                return None
    return _resolve(group)


def _ret(work, async_op):
    return work if async_op else None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` over every rank of ``group`` with ``op`` (a ReduceOp) and leave the result
    in ``tensor`` on every rank, in place. Returns a Work with ``async_op=True``, else None."""
    if group is None and not async_op:  # _start written out for the most frequent call (0.1 us)
        pg = _world.default_pg
        if pg is not None and pg._fast is not None and type(op) is ReduceOp and \
                pg._fast(_K_ALLREDUCE, tensor, op):
            return None
    pg = _resolve(group)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    if type(op) is _PremulSum:
        scaled, op = _premul_input(pg, a, op, "all_reduce")
        a[...] = scaled
    _check_reduce_op(a, code, op, "all_reduce", value_error=True)
    return _ret(pg._submit(_C.K_ALLREDUCE, code, op, 0, 0, a.size, (), (a,),
                           name="all_reduce", result=tensor, async_op=async_op), async_op)


def _all_reduce_as(array, code, op=ReduceOp.SUM, group=None, async_op=False):
    """all_reduce of a contiguous NumPy array whose bytes hold dtype ``code`` (internal: bfloat16
    carried in a uint16 view when ml_dtypes is absent)."""
    pg = _resolve(group)
    if pg is None:
        return None
    a, _ = as_array(array, "tensor", True, pg._on_device)
    return _ret(pg._submit(_C.K_ALLREDUCE, code, _op_of(op), 0, 0, a.size, (), (a,),
                           name="all_reduce", result=array, async_op=async_op), async_op)


def _all_reduce_into(src, dst, op=ReduceOp.SUM, group=None, async_op=False):
    """all_reduce of ``src`` with the result written to ``dst`` (internal; DistributedDataParallel
    reduces its buckets in place now, their slots being the .grads).

    ``src`` is left holding partial results.  When it is a ``_shared_array`` the reduction reads
    every rank's buffer in place and writes this rank's result straight into ``dst``, saving the
    copy back out of the buffer."""
    pg = _resolve(group)
    if pg is None:
        return None
    a, code = as_array(src, "src", True, pg._on_device)
    d, dcode = as_array(dst, "dst", True, pg._on_device)
    if dcode != code or d.size != a.size:
        raise ValueError(f"_all_reduce_into: dst must match src's dtype and size ({a.dtype}, {a.size}), "
                         f"got {d.dtype}, {d.size}")
    if np.shares_memory(a, d):  # False for device views (object arrays to NumPy)
        raise ValueError("_all_reduce_into: src and dst must not overlap")
    return _ret(pg._submit(_C.K_ALLREDUCE, code, _op_of(op), 0, 0, a.size, (a,), (d,),
                           name="all_reduce", result=dst, async_op=async_op), async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` over the ranks of ``group`` with ``op``; the result lands in ``tensor`` on
    rank ``dst`` only (the other ranks' tensors are unchanged)."""
    pg = _start(group, not async_op and group_dst is None and (dst is None or type(dst) is int)
                and type(op) is ReduceOp, _K_REDUCE, tensor, op, None, dst or 0)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    root = _root(pg, group_dst, dst, "dst")
    a, code = as_array(tensor, "tensor", True, pg._on_device)
    src, op = _premul_input(pg, a, op, "reduce")
    _check_reduce_op(a, code, op, "reduce")
    return _ret(pg._submit(_C.K_REDUCE, code, op, root, 0, a.size, (src,), (a,),
                           name="reduce", result=tensor, async_op=async_op), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Fill ``tensor_list`` (one array per rank of ``group``, shaped like ``tensor``) with every
    rank's ``tensor``, on every rank."""
    pg = _start(group, not async_op, _K_ALLGATHER, tensor_list, 0, tensor)
    if pg is None:
        return None
    a, code = as_array(tensor, "tensor", False, pg._on_device)
    outs = _rank_arrays(pg, tensor_list, "tensor_list", a, code, "tensor", True)
    return _ret(pg._submit(_C.K_ALLGATHER, code, 0, 0, 0, a.size, (a,), outs,
                           name="all_gather", result=tensor_list, async_op=async_op), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Concatenate every rank's ``input_tensor``, in rank order, into ``output_tensor`` (world_size
    times as many elements), on every rank."""
    # the C fast path takes an output shaped (world_size * d0, d1, ...) for an input shaped
    # (d0, d1, ...) and leaves any other shape to the checks below
    pg = _start(group, not async_op, _K_ALLGATHER, output_tensor, 0, input_tensor)
    if pg is None:
        return None
    a, code = as_array(input_tensor, "input_tensor", False, pg._on_device)
    o, oc = as_array(output_tensor, "output_tensor", True, pg._on_device)
    if isinstance(o, np.ndarray):  # gloo's rule; torch's NCCL checks the element count alone
        _check_gather_shape(output_tensor, input_tensor, pg.size())
    _check_same(o, oc, a, code, "output_tensor", "input_tensor")
    if o.size != a.size * pg.size():
        raise ValueError(f"output_tensor must have world_size * input_tensor.numel() = "
                         f"{a.size * pg.size()} elements, got {o.size}")
    return _ret(pg._submit(_C.K_ALLGATHER, code, 0, 0, 0, a.size, (a,), (o,),
                           name="all_gather_into_tensor", result=output_tensor,
                           async_op=async_op), async_op)


def _all_gather_base(output_tensor, input_tensor, group=None, async_op=False):
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (None on the other
    ranks)."""
    pg = _start(group, not async_op and group_dst is None and (dst is None or type(dst) is int),
                _K_GATHER, gather_list, dst or 0, tensor)
    if pg is None:
        return None
    root = _root(pg, group_dst, dst, "dst")
    a, code = as_array(tensor, "tensor", False, pg._on_device)
    outs = _root_list(pg, root, gather_list, "gather_list", a, code, True, "destination")
    return _ret(pg._submit(_C.K_GATHER, code, 0, root, 0, a.size, (a,), outs,
                           name="gather", result=gather_list, async_op=async_op), async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """Rank ``src`` sends ``scatter_list[i]`` to rank i; every rank receives into ``tensor``."""
    pg = _start(group, not async_op and group_src is None and (src is None or type(src) is int),
                _K_SCATTER, tensor, src or 0, scatter_list)
    if pg is None:
        return None
    root = _root(pg, group_src, src, "src")
    o, code = as_array(tensor, "tensor", True, pg._on_device)
    ins = _root_list(pg, root, scatter_list, "scatter_list", o, code, False, "source")
    return _ret(pg._submit(_C.K_SCATTER, code, 0, root, 0, o.size, ins, (o,),
                           name="scatter", result=tensor, async_op=async_op), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input_list`` element-wise over the ranks with ``op``; rank i receives the i-th
    reduced array in ``output``."""
    pg = _start(group, not async_op and type(op) is ReduceOp, _K_REDUCE_SCATTER, output, op,
                input_list)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    o, code = as_array(output, "output", True, pg._on_device)
    ins = _rank_arrays(pg, input_list, "input_list", o, code, "output", False)
    if type(op) is _PremulSum:
        premul = op
        ins = tuple(_premul_input(pg, x, premul, "reduce_scatter")[0] for x in ins)
        op = ReduceOp.SUM
    _check_reduce_op(o, code, op, "reduce_scatter")
    return _ret(pg._submit(_C.K_REDUCE_SCATTER, code, op, 0, 0, o.size, ins, (o,),
                           name="reduce_scatter", result=output, async_op=async_op), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input`` (world_size times the size of ``output``) over the ranks with ``op``; rank i
    receives the i-th chunk in ``output``."""
    pg = _start(group, not async_op and type(op) is ReduceOp, _K_REDUCE_SCATTER, output, op, input)
    if pg is None:
        return None
    op = _op_of(op, premul=True)
    o, code = as_array(output, "output", True, pg._on_device)
    a, ac = as_array(input, "input", False, pg._on_device)
    _check_same(a, ac, o, code, "input", "output")
    a, op = _premul_input(pg, a, op, "reduce_scatter_tensor")
    # torch's complex message names all_reduce here too
    _check_reduce_op(a, code, op, "all_reduce", call="reduce_scatter_tensor")
    if a.size != o.size * pg.size():
        raise ValueError(f"input must have world_size * output.numel() = {o.size * pg.size()} "
                         f"elements, got {a.size}")
    return _ret(pg._submit(_C.K_REDUCE_SCATTER, code, op, 0, 0, o.size, (a,), (o,),
                           name="reduce_scatter_tensor", result=output, async_op=async_op),
                async_op)


def _reduce_scatter_base(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    return reduce_scatter_tensor(output, input, op, group, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """Rank i sends ``input_tensor_list[j]`` to rank j, which receives it in
    ``output_tensor_list[i]``."""
    pg = _start(group, not async_op, _K_ALLTOALL, output_tensor_list, 0, input_tensor_list)
    if pg is None:
        return None
    n = pg.size()
    _list_arg(output_tensor_list, "output_tensor_list")
    _list_arg(input_tensor_list, "input_tensor_list")
    if len(output_tensor_list) != n or len(input_tensor_list) != n:
        raise ValueError(f"output_tensor_list and input_tensor_list must have one array per rank "
                         f"({n}), got {len(output_tensor_list)} and {len(input_tensor_list)}")
    ins, outs = [], []
    code = None
    for i, t in enumerate(input_tensor_list):
        a, ac = as_array(t, f"input_tensor_list[{i}]", False, pg._on_device)
        if code is None:
            code = ac
        _check_same(a, ac, None, code, f"input_tensor_list[{i}]", "input_tensor_list[0]")
        ins.append(a)
    for i, t in enumerate(output_tensor_list):
        o, oc = as_array(t, f"output_tensor_list[{i}]", True, pg._on_device)
        _check_same(o, oc, None, code, f"output_tensor_list[{i}]", "input_tensor_list[0]")
        outs.append(o)
    if ins[pg.rank()].nbytes != outs[pg.rank()].nbytes:
        raise ValueError(f"output_tensor_list[{pg.rank()}] must match input_tensor_list[{pg.rank()}] "
                         "in size (the block a rank sends to itself)")
    ins = _unaliased(ins, outs)
    return _ret(pg._submit(_C.K_ALLTOALL, code, 0, 0, 0, 0, tuple(ins), tuple(outs),
                           name="all_to_all", result=output_tensor_list, async_op=async_op),
                async_op)


def _unaliased(ins, outs):
    """``ins``, copied when any of them shares memory with an output (all_to_all in place: the
    peers read a rank's input while it writes its output, so it must not change under them)."""
    host = all(type(a) is np.ndarray for a in ins) and all(type(o) is np.ndarray for o in outs)
    if host and any(np.may_share_memory(a, o) for a in ins for o in outs):
        return [a.copy() for a in ins]
    return ins


def _nbytes_per_row(a) -> int:
    if a.ndim == 0:
        return a.itemsize
    if a.shape[0] == 0:
        return 0
    return a.nbytes // a.shape[0]


def _splits(splits, arr, n, name, arrname):
    row = _nbytes_per_row(arr)
    rows = arr.shape[0] if arr.ndim else 1
    if splits is None or len(splits) == 0:
        if rows % n != 0:
            raise ValueError(f"{arrname} has {rows} rows, not divisible by world size {n}; "
                             f"give {name}")
        return tuple([(rows // n) * row] * n)
    splits = list(splits)
    if len(splits) != n:
        raise ValueError(f"{name} must have one entry per rank ({n}), got {len(splits)}")
    if any((not isinstance(s, (int, np.integer))) or s < 0 for s in splits):
        raise ValueError(f"{name} must be non-negative integers, got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"{name} adds up to {sum(splits)} rows but {arrname} has {rows}")
    return tuple(int(s) * row for s in splits)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    """all_to_all on single arrays split along the first dimension: equal chunks, or
    ``input_split_sizes`` / ``output_split_sizes`` rows per rank."""
    pg = _start(group, not async_op and output_split_sizes is None and input_split_sizes is None,
                _K_ALLTOALL, output, 0, input)
    if pg is None:
        return None
    n = pg.size()
    o, code = as_array(output, "output", True, pg._on_device)
    a, ac = as_array(input, "input", False, pg._on_device)
    _check_same(a, ac, o, code, "input", "output")
    ins = _splits(input_split_sizes, a, n, "input_split_sizes", "input")
    outs = _splits(output_split_sizes, o, n, "output_split_sizes", "output")
    if ins[pg.rank()] != outs[pg.rank()]:
        raise ValueError(f"input_split_sizes[{pg.rank()}] and output_split_sizes[{pg.rank()}] must "
                         "match (the block a rank sends to itself)")
    a, = _unaliased([a], [o])
    return _ret(pg._submit(_C.K_ALLTOALL, code, 0, 0, 0, 0, (a,), (o,), in_splits=ins,
                           out_splits=outs, name="all_to_all_single", result=output,
                           async_op=async_op), async_op)


def _shared_array(shape, dtype=np.float32, group=None):
    """A NumPy array in the group's shared memory (internal; DistributedDataParallel keeps its
    gradient buckets there).

    A collective: every rank calls it with the same shape and dtype and gets its own array, which
    every other rank of the group has mapped, so ``all_reduce`` on it (or on a contiguous slice of
    it) reduces straight from the ranks' arrays without copying them in first. Needs a group
    whose ranks are all on this host (its 'cpu' backend's transport 'shm'); otherwise, or when /dev/shm
    is too small on any rank, it raises on every rank and the group goes on.
    """
    pg = _resolve(group)
    if pg is None:
        return None
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)
    count = 1
    for n in shape:
        if n < 0:
            raise ValueError(f"shape must not have negative entries, got {shape}")
        count *= n
    decl = pg._declared("cpu")
    if decl is None:
        raise DistError("_shared_array: the process group has been destroyed")
    alloc = decl.shared_alloc
    if alloc is None:
        raise DistError(f"_shared_array: the 'cpu' backend of group {pg._name!r} has no shared "
                        "memory")
    buf = alloc(count * dt.itemsize)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def _check_device_ids(device_ids):
    """torch 2.13's checks of barrier's ``device_ids``: a list must hold device indices (its
    BarrierOptions refuses anything else with a TypeError) and at least one, the first not negative
    (it makes ``torch.device(type, device_ids[0])``: IndexError, RuntimeError).  Anything that is
    not a list torch 2.13 ignores, and so does pyddp (``device_ids=local_rank`` runs under torch
    2.13; torch 2.0-2.5 raised TypeError).  Checked on every rank before the barrier."""
    if not isinstance(device_ids, list):
        return
    for d in device_ids:
        # torch.device(type, index) takes a Python or NumPy integer, or a torch integer tensor
        if isinstance(d, (bool, np.bool_)) or not (
                isinstance(d, (int, np.integer)) or (type(d).__module__.split(".")[0] == "torch"
                                                     and hasattr(d, "__index__"))):
            raise TypeError(f"barrier: device_ids type should be List[int], got {device_ids!r} "
                            f"(an entry of type {type(d).__name__})")
    if not device_ids:
        raise IndexError("barrier: device_ids is an empty list (torch uses device_ids[0]): give "
                         "the device of this rank, e.g. [local_rank], or leave it None")
    if int(device_ids[0].__index__()) < 0:
        raise RuntimeError(f"barrier: device_ids[0] is {device_ids[0]}: Device index must not be "
                           f"negative")


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Block until every rank of ``group`` has entered the barrier; ``timeout`` (a timedelta)
    replaces the group's timeout for this call.  ``device_ids`` is checked as torch 2.13 checks it
    (a list of device indices, at least one); on a CUDA backend the barrier runs on the first
    (else on the group's bound, last-used or current device) after the caller's current stream,
    and returns once its work there is done, as torch's NCCL barrier."""
    if device_ids is not None:
        _check_device_ids(device_ids)
    pg = _start(group, not async_op and timeout is None, _K_BARRIER, None, 0)
    if pg is None:
        return None
    if isinstance(device_ids, list):
        # a device backend's barrier runs on the first of them (torch's), else on the group's
        # bound or last-used device
        for decl in pg._decl.values():
            if decl.set_barrier_device is not None:
                decl.set_barrier_device(device_ids[0])
    t = 0.0 if timeout is None else _timeout_seconds(timeout)
    return _ret(pg._submit(_C.K_BARRIER, timeout=t, name="barrier", async_op=async_op), async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that names the ranks that did not arrive within ``timeout`` (all of them with
    ``wait_all_ranks=True``), as torch's."""
    pg = _resolve(group)
    if pg is None:
        return None
    t = _timeout_seconds(timeout) if timeout is not None else pg._timeout
    pg._submit(_C.K_MONITORED_BARRIER, timeout=t, wait_all=wait_all_ranks,
               name="monitored_barrier")


# -------------------------------------------------------------------------- point to point

def _p2p(kind, tensor, peer, group, tag, name, writable):
    pg = _resolve(group)
    if pg is None:
        return None, None
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    if not 0 <= int(tag) < 2 ** 31:
        raise ValueError(f"tag must be in [0, 2**31), got {tag}")
    a, code = as_array(tensor, "tensor", writable, pg._on_device)
    if peer is None:
        root = -1
    else:
        root = _group_rank(pg, peer, "dst" if kind == _C.K_SEND else "src")
        if root == pg.rank():
            raise ValueError(f"{name}: rank {peer} cannot {'send to' if kind == _C.K_SEND else 'receive from'} itself")
    ins, outs = ((a,), ()) if kind == _C.K_SEND else ((), (a,))
    return pg, (kind, code, 0, root, int(tag), a.size, ins, outs)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Start sending ``tensor`` to rank ``dst`` (``tag`` matches sends to receives); returns a Work."""
    if dst is None and group_dst is None:
        raise ValueError("isend: dst must be given")
    pg, args = _p2p(_C.K_SEND, tensor, dst if group_dst is None else _global(group, group_dst),
                    group, tag, "isend", False)
    if pg is None:
        return None
    return pg._submit(*args, name="send", result=tensor, async_op=True, source=True)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Start receiving into ``tensor`` from rank ``src`` (None: any rank); returns a Work whose
    source_rank() names the sender."""
    pg, args = _p2p(_C.K_RECV, tensor, src if group_src is None else _global(group, group_src),
                    group, tag, "irecv", True)
    if pg is None:
        return None
    return pg._submit(*args, name="recv", result=tensor, async_op=True, source=True)


def _global(group, group_rank):
    return get_global_rank(group if group is not None else _default_pg(), group_rank)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to rank ``dst`` (isend, then wait for it to complete)."""
    w = isend(tensor, dst, group, tag, group_dst)
    if w is not None:
        w.wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into `tensor`; src=None receives from any rank.  Returns the sender's rank."""
    w = irecv(tensor, src, group, tag, group_src)
    if w is None:
        return -1
    w.wait()
    return w.source_rank()


class P2POp:
    """A point-to-point operation for batch_isend_irecv: P2POp(dist.isend, tensor, peer)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("P2POp: op must be pyddp.distributed.isend or pyddp.distributed.irecv")
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list):
    """Start every operation of the list; returns their Work handles."""
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("batch_isend_irecv expects a list of P2POp")
    batched = _batch_on_device(p2p_op_list)
    if batched is not None:
        return batched
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return works


def _batch_on_device(p2p_op_list):
    """batch_isend_irecv as one operation of a device backend that batches (NCCL's group call):
    the Work of the whole batch for each op, as torch's; None when the ops are not all on one
    such backend."""
    if not p2p_op_list:
        return None
    pg = _resolve(p2p_op_list[0].group)
    if pg is None or pg._route is None or any(_resolve(p.group) is not pg for p in p2p_op_list):
        return None
    ops, be = [], None
    for i, p in enumerate(p2p_op_list):
        send = p.op is isend
        peer = p.peer if p.group_peer is None else _global(p.group, p.group_peer)
        if peer is None:
            return None
        v = describe_device(p.tensor)
        if v is None:
            return None
        a, code = as_array(p.tensor, f"p2p_op_list[{i}].tensor", not send, pg._on_device)
        device = getattr(a, "device", "cpu")
        b = pg._declared(device)
        if b is None or b.batch_p2p is None or (be is not None and b is not be):
            return None
        be = b
        r = _group_rank(pg, peer, "peer")
        if r == pg.rank():
            raise ValueError(f"batch_isend_irecv: p2p_op_list[{i}] has this rank as its peer")
        e = pg._refusal(Request(_C.K_SEND if send else _C.K_RECV, code, 0, r, p.tag, a.size,
                                (a,) if send else (), () if send else (a,), None, None, 0.0,
                                False, "batch_isend_irecv", False), device)
        if e is not None:
            raise e
        ops.append((send, a, r))
    work = Work(be.batch_p2p(ops), [p.tensor for p in p2p_op_list])
    with pg._lock:
        pg._pending.append(work._cw)
    return [work] * len(ops)


def describe_device(x):
    """An ArrayView of ``x`` when it lives on a device, else None (cheap for host arrays)."""
    if isinstance(x, np.ndarray) or isinstance(getattr(x, "_data", None), np.ndarray):
        return None
    try:
        v = _interop.describe(x)
    except TypeError:
        return None
    return None if v.device == "cpu" else v


# ------------------------------------------------------------------------- object collectives



def _object_collective(fn):
    """Object collectives move their pickles in host arrays, on a device-only group (nccl) too:
    through the host group its backend keeps (torch moves them through the device instead)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = getattr(_objects, "active", False)
        _objects.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            _objects.active = outer
    return wrapper


def _pickle(obj) -> np.ndarray:
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8).copy()


def _unpickle(a: np.ndarray):
    return pickle.loads(a.tobytes())


# The envelope of an object collective: the pickles' sizes (int64, from the sending ranks), then
# the bytes.  The sizes are checked before anything is allocated from them; the bytes of each
# object are then exactly the size its sender announced.  What pickle itself runs is trusted, as
# in torch: only ranks that know the job secret (PYDDP_SECRET) reach this point.
_MAX_OBJECT_BYTES = 1 << 40  # no pickle of a real object comes near a terabyte


def _envelope_sizes(sizes, what, senders):
    """The announced pickle sizes as Python ints; a DistError naming the sender for a negative
    size or a total beyond _MAX_OBJECT_BYTES (a corrupt or mismatched collective)."""
    out = [int(x) for x in np.asarray(sizes, dtype=np.int64).reshape(-1)]
    total = 0
    for i, n in enumerate(out):
        total += max(n, 0)
        if n < 0 or total > _MAX_OBJECT_BYTES:
            raise DistError(f"{what}: rank {senders(i)} announced a pickle of {n} bytes for "
                            f"object {i} (sizes must be in [0, {_MAX_OBJECT_BYTES}] in all); "
                            f"the ranks called different object collectives or the data is "
                            f"corrupt")
    return out


def _unpickle_concat(data: np.ndarray, sizes, what):
    """Objects pickled back to back in `data` (broadcast_object_list)."""
    if sum(sizes) != data.size:
        raise DistError(f"{what}: {data.size} bytes of pickles received, the sizes announce "
                        f"{sum(sizes)}")
    objs, off = [], 0
    for n in sizes:
        objs.append(_unpickle(data[off:off + n]))
        off += n
    return objs


def _unpickle_rows(rows, sizes, what):
    """One object at the start of each row (padded to the longest: all_gather_object,
    gather_object, scatter_object_list)."""
    objs = []
    for i, (row, n) in enumerate(zip(rows, sizes)):
        if n > row.size:
            raise DistError(f"{what}: object {i} announced {n} bytes but {row.size} arrived")
        objs.append(_unpickle(row[:n]))
    return objs


@_object_collective
def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace the items of ``object_list`` on every rank with those of rank ``src`` (any picklable
    objects; the lists must have equal lengths)."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(object_list, "object_list")
    root = _root(pg, group_src, src, "src")
    me = pg.rank()
    sizes = np.zeros(len(object_list), dtype=np.int64)
    if me == root:
        blobs = [_pickle(o) for o in object_list]
        sizes[:] = [b.size for b in blobs]
    broadcast(sizes, group=group, group_src=root)
    if me == root:
        data = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
    else:
        ns = _envelope_sizes(sizes, "broadcast_object_list", lambda i: root)
        data = np.zeros(sum(ns), np.uint8)
    broadcast(data, group=group, group_src=root)
    if me != root:
        object_list[:] = _unpickle_concat(data, ns, "broadcast_object_list")


def _gather_blobs(obj, pg, group):
    blob = _pickle(obj)
    n = pg.size()
    sizes = np.zeros(n, dtype=np.int64)
    all_gather_into_tensor(sizes, np.array([blob.size], dtype=np.int64), group=group)
    sizes = _envelope_sizes(sizes, "object collective", lambda i: i)
    m = max(sizes) if n else 0
    padded = np.zeros(m, dtype=np.uint8)
    padded[:blob.size] = blob
    return sizes, m, padded


@_object_collective
def all_gather_object(object_list, obj, group=None):
    """Fill ``object_list`` (world_size items) with every rank's picklable ``obj``, on every rank."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(object_list, "object_list")
    if len(object_list) != pg.size():
        raise ValueError(f"object_list must have world_size ({pg.size()}) entries, got {len(object_list)}")
    sizes, m, padded = _gather_blobs(obj, pg, group)
    out = np.zeros(m * pg.size(), dtype=np.uint8)
    all_gather_into_tensor(out, padded, group=group)
    object_list[:] = _unpickle_rows(out.reshape(pg.size(), m), sizes, "all_gather_object")


@_object_collective
def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Collect every rank's picklable ``obj`` into ``object_gather_list`` on rank ``dst`` (None
    elsewhere)."""
    pg = _resolve(group)
    if pg is None:
        return
    root = _root(pg, group_dst, dst, "dst")
    me = pg.rank()
    if me == root:
        _list_arg(object_gather_list, "object_gather_list")
        if len(object_gather_list) != pg.size():
            raise ValueError(f"object_gather_list must have world_size ({pg.size()}) entries, "
                             f"got {len(object_gather_list)}")
    sizes, m, padded = _gather_blobs(obj, pg, group)
    outs = [np.zeros(m, dtype=np.uint8) for _ in range(pg.size())] if me == root else None
    gather(padded, outs, group=group, group_dst=root)
    if me == root:
        object_gather_list[:] = _unpickle_rows(outs, sizes, "gather_object")


@_object_collective
def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Rank ``src`` sends ``scatter_object_input_list[i]`` to rank i, which receives it in
    ``scatter_object_output_list[0]``."""
    pg = _resolve(group)
    if pg is None:
        return
    _list_arg(scatter_object_output_list, "scatter_object_output_list")
    if len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_output_list must have at least one element")
    root = _root(pg, group_src, src, "src")
    me, n = pg.rank(), pg.size()
    sizes = np.zeros(n, dtype=np.int64)
    blobs = None
    if me == root:
        _list_arg(scatter_object_input_list, "scatter_object_input_list")
        if len(scatter_object_input_list) != n:
            raise ValueError(f"scatter_object_input_list must have world_size ({n}) entries, "
                             f"got {len(scatter_object_input_list)}")
        blobs = [_pickle(o) for o in scatter_object_input_list]
        sizes[:] = [b.size for b in blobs]
    broadcast(sizes, group=group, group_src=root)
    sizes = _envelope_sizes(sizes, "scatter_object_list", lambda i: root)
    m = max(sizes)
    ins = None
    if me == root:
        ins = []
        for b in blobs:
            p = np.zeros(m, dtype=np.uint8)
            p[:b.size] = b
            ins.append(p)
    out = np.zeros(m, dtype=np.uint8)
    scatter(out, ins, group=group, group_src=root)
    scatter_object_output_list[0] = _unpickle_rows([out], [sizes[me]], "scatter_object_list")[0]
