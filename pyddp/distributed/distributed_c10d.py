"""torch.distributed's process-group API on pyddp's C core.

Names, argument order, defaults and error types follow torch.distributed (2.x).  The API checks
arguments, turns arrays into views (pyddp._interop) and reduces each call to one request; a
ProcessGroup (process_group.py) routes it to the backend serving the arrays' device
(pyddp.distributed.backends: the C core, pyddp._C, for 'cpu'), which moves the bytes.

As torch's module of the same name, this one holds the whole API's namespace; its parts live by
concern beside it: _groups.py (the job's state, resolving ``group`` arguments, the questions about
ranks and groups), _collectives.py (ReduceOp, the argument checks, collectives and point to point),
_object_collectives.py (pickled objects).  Here: Backend (names and registration), creating and
destroying groups (init_process_group's rendezvous, new_group, destroy_process_group, the exit
path) and explain().
"""
from __future__ import annotations

import atexit
import hashlib
import os
from datetime import timedelta

import numpy as np

from .. import _C, _config, _interop
from . import _observe
from .backends import registry as _registry
from .backends.interface import BackendOptions
from .process_group import Future, ProcessGroup, Work, _objects  # noqa: F401  (public here)
from .._interop import cpu_array as as_array
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore, job_secret  # noqa: F401
from ._collectives import (  # noqa: F401  (torch's API module holds them all)
    all_gather, all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single, barrier,
    batch_isend_irecv, broadcast, describe_device, gather, irecv, isend, monitored_barrier, P2POp,
    recv, reduce, reduce_scatter, reduce_scatter_tensor, ReduceOp, scatter, send,
    supports_complex, _all_reduce_as, _all_reduce_into, _make_nccl_premul_sum, _shared_array)
from ._groups import (  # noqa: F401  (the same)
    get_backend, get_global_rank, get_group_rank, get_pg_count, get_process_group_ranks, get_rank,
    get_world_size, group, GroupMember, is_available, is_backend_available, is_gloo_available,
    is_initialized, is_mpi_available, is_nccl_available, _default_pg, _get_default_store,
    _resolve, _set_world, _timeout_seconds, _world, default_pg_timeout)
from ._object_collectives import (  # noqa: F401  (the same)
    all_gather_object, broadcast_object_list, gather_object, scatter_object_list)

DistError = _C.DistError
DistBackendError = _C.DistBackendError
DistNetworkError = _C.DistNetworkError
DistStoreError = _C.DistStoreError

# The C core's reduction operators (pd_redop), as pyddp._C exports them from its table.


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


# -------------------------------------------------------------------------------- rendezvous
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


def _fail_for_uncaught(exc) -> None:
    """The program is ending with ``exc``, uncaught: every live group fails with it and tells its
    peers now (the launchers call this before the exception's report: a rank whose exit is slow,
    such as one with atexit work or DataLoader workers to stop, must not leave its peers waiting in
    a collective until their timeout)."""
    if not _world.groups:
        return
    first = (str(exc).strip().splitlines() or [""])[0]
    rank = _world.default_pg.rank() if _world.default_pg is not None else "?"
    msg = (f"rank {rank} raised {type(exc).__name__}" + (f": {first}" if first else "")
           + " (uncaught: the process is exiting)")
    for pg in list(_world.groups):
        pg._fail(msg)


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
