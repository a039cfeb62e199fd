"""pyddp.distributed's groups as the API module sees them: the job's state (the default group, the
store, the groups made so far), ``GroupMember`` and ``group.WORLD``, the resolution of a ``group``
argument to a ProcessGroup, and the questions about ranks and groups (get_rank, get_world_size,
get_backend, get_global_rank, ...).  distributed_c10d creates and destroys the groups; this module
holds what every part of the API reads.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np

from . import _observe
from .backends import registry as _registry
from .process_group import ProcessGroup

default_pg_timeout = timedelta(minutes=30)


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
