"""The flight recorder (torch's NCCL flight recorder is the model): the last operations of each
process group, kept in a ring by the C core.

    PYDDP_FLIGHT_RECORDER_DIR=/tmp/fr pyddp-run --nproc-per-node 2 train.py
    python -m pyddp.tools.flight_recorder /tmp/fr      # which rank diverged, on which collective

Each record: ``id``, ``seq`` (the collective's sequence number in its group and backend; 0 for
send/recv), ``name``, ``kind``, ``dtype``, ``op``, ``root``, ``count``, ``bytes``, ``backend``,
``transport`` and ``algorithm`` (what ran it), ``state`` (enqueued, started, completed, failed),
``status``, and the wall-clock times ``t_enqueued``, ``t_started``, ``t_ended`` (seconds since the
epoch; 0 when not reached).

Every backend's calls are recorded:

- ``cpu`` (and ``gloo``): by the C group that runs them, with coll/select.c's transport and
  algorithm (``shm``/``tcp``; ``ring``, ``chain``, ...);
- ``nccl``: in the ring of the host group the backend keeps beside its communicators (so
  ``records(group)`` also holds that group's own signature checks and object collectives, as
  backend ``cpu``, numbered apart), as ``nccl``/``nccl``/``auto`` (NCCL_ALGO's value when set;
  ``p2p`` for send/recv); completed when the host sees the call's end event (a wait, a query or the
  watchdog's poll), so ``t_ended`` is when the host saw it;
- ``mpi``: in a ring of the backend's own, as ``mpi``/``mpi``/``auto`` (``p2p`` for send/recv).

When a group fails, its calls still open are written as failed, with the status (timeout,
collective mismatch, backend error).

``PYDDP_FLIGHT_RECORDER_SIZE`` (else ``TORCH_FR_BUFFER_SIZE``) sets the ring's length (default
2000, 0 turns recording off).  With ``PYDDP_FLIGHT_RECORDER_DIR`` set, every rank writes a
group's records there when the group fails (mismatched collectives, a dead peer, a timeout):
``rank{R}-{group}-{id}.json``.  ``dump()`` writes them at any time.
"""
from __future__ import annotations

from . import _observe

__all__ = ["records", "dump", "dump_all"]


def _cgroup(group):
    from .distributed_c10d import _resolve

    pg = _resolve(group)
    if pg is None:
        raise ValueError("flight_recorder: this rank is not a member of the group")
    cpg = getattr(pg, "_host", None)
    if cpg is not None and not hasattr(cpg, "flight_records"):
        cpg = getattr(cpg, "recorder", None)  # a backend's own ring (backend 'mpi')
    if cpg is None or not hasattr(cpg, "flight_records"):
        raise ValueError(f"flight_recorder: group {pg.group_name!r} has no pyddp C group "
                         f"(backends: {pg._backends_desc()})")
    return cpg


def records(group=None) -> list:
    """The group's records (default group: None), oldest first."""
    return _observe.records(_cgroup(group))


def dump(path=None, group=None) -> str:
    """Write the group's records as JSON to ``path`` (default: its file in
    PYDDP_FLIGHT_RECORDER_DIR); returns the path."""
    return _observe.dump(_cgroup(group), path)


def dump_all() -> list:
    """Write every live group's records to PYDDP_FLIGHT_RECORDER_DIR; the paths."""
    return [_observe.dump(g) for _, g in _observe.live_groups()]
