"""Seeing what a job does: debug levels, the flight recorder and the timeline.

Debug levels (torch's): ``TORCH_DISTRIBUTED_DEBUG`` or ``PYDDP_DEBUG`` = OFF / INFO / DETAIL, or
``set_debug_level``.  INFO logs each group's setup (backend, transport and why, sizes); DETAIL
also logs every collective with its shapes (and turns the one-call fast path off, so that every
call is seen).  Messages go through the ``logging`` module, logger ``pyddp.distributed``, each
prefixed with the rank; a stderr handler is added when nothing else handles them.

Flight recorder: every C process group keeps its last ``PYDDP_FLIGHT_RECORDER_SIZE`` operations
(default 2000; 0 turns it off) in a ring (csrc/group/flight.c); the ``nccl`` backend notes its
calls in the ring of its host group, the ``mpi`` backend in a ring of its own
(``_C.FlightRecorder``, attached here as a group's).  With
``PYDDP_FLIGHT_RECORDER_DIR`` set, each rank writes the ring of a group there when the group
fails (a mismatch, a dead peer, a timeout); ``pyddp.distributed.flight_recorder.dump()`` writes
it on demand; ``python -m pyddp.tools.flight_recorder DIR`` reads the files of all ranks.

Timeline: ``PYDDP_TIMELINE=path`` writes a Chrome / Perfetto trace per rank (csrc/util/
timeline.c): a directory (or a path ending in "/") gets ``timeline.rank{R}.json``, a path with
``{rank}`` is formatted, any other path gets ``.rank{R}`` before its extension.
"""
from __future__ import annotations

import atexit
import enum
import itertools
import json
import logging
import os
import socket
import threading
import weakref

from .. import _C, _config

log = logging.getLogger("pyddp.distributed")


class DebugLevel(enum.IntEnum):
    """torch.distributed.DebugLevel."""

    OFF = 0
    INFO = 1
    DETAIL = 2

    # As torch's: print(get_debug_level()) shows "DebugLevel.OFF" (Python 3.11's IntEnum would print 0).
    def __str__(self):
        return f"DebugLevel.{self.name}"

    def __format__(self, spec):
        return format(str(self), spec)


_ALIASES = {"OFF": DebugLevel.OFF, "WARN": DebugLevel.OFF, "INFO": DebugLevel.INFO,
            "DETAIL": DebugLevel.DETAIL, "TRACE": DebugLevel.DETAIL}
_level = DebugLevel.OFF
_handler = None


def _parse_level(value, what):
    if isinstance(value, DebugLevel):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DebugLevel(value)
        except ValueError:
            pass
    elif isinstance(value, str) and value.strip().upper() in _ALIASES:
        return _ALIASES[value.strip().upper()]
    raise ValueError(f"{what}: expected OFF, INFO or DETAIL (a DebugLevel, its name or 0-2), "
                     f"got {value!r}")


def get_debug_level() -> DebugLevel:
    """The debug level (torch.distributed.get_debug_level)."""
    return _level


def set_debug_level(level) -> None:
    """Set the debug level: DebugLevel.OFF / INFO / DETAIL, or their names."""
    global _level, _handler
    _level = _parse_level(level, "set_debug_level(level)")
    log.setLevel({DebugLevel.OFF: logging.WARNING, DebugLevel.INFO: logging.INFO,
                  DebugLevel.DETAIL: logging.DEBUG}[_level])
    # nothing configured to show them: a stderr handler, as torch's C++ logging has
    if _level != DebugLevel.OFF and _handler is None and not logging.getLogger().handlers:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("%(asctime)s pyddp %(levelname)s %(message)s"))
        log.addHandler(_handler)


def set_debug_level_from_env() -> None:
    """Read TORCH_DISTRIBUTED_DEBUG, else PYDDP_DEBUG (torch.distributed.set_debug_level_from_env);
    an unknown value raises ValueError naming the variable."""
    for var in ("TORCH_DISTRIBUTED_DEBUG", "PYDDP_DEBUG"):
        v = os.environ.get(var)
        if v:
            set_debug_level(_parse_level(v, var))
            return
    set_debug_level(DebugLevel.OFF)


def _no_group():
    return None


# () -> the default ProcessGroup or None; distributed_c10d installs its own (this module sits
# below it: the backends log through it)
default_group = _no_group


def _global_rank(default):
    pg = default_group()
    if pg is not None:
        return pg.rank()
    env = os.environ.get("RANK", "")
    return int(env) if env.isdigit() else default


def info(msg, *args, rank=None):
    """Log at INFO with the rank prefix (cheap when off)."""
    if _level >= DebugLevel.INFO:
        log.info("[rank %s] " + msg, _global_rank(rank) if rank is None else rank, *args)


def detail(msg, *args):
    if _level >= DebugLevel.DETAIL:
        log.debug("[rank %s] " + msg, _global_rank(None), *args)


_DTYPE_NAMES = {v: k for k, v in _C.DTYPE_CODES.items()}


def dtype_name(code):
    return _DTYPE_NAMES.get(code, str(code))


KIND_NAMES = {v["code"]: k for k, v in _C.KINDS.items()}
OP_NAMES = {v: k for k, v in _C.REDUCE_OPS.items()}


def describe_signature(sig) -> str:
    """'all_reduce(count=4, float32, op=SUM)' for one row of the signatures the device backends
    ("nccl", "mpi") compare across ranks: (seq, kind, dtype, op, root, count, ...)."""
    kind = int(sig[1])
    name = KIND_NAMES.get(kind, f"kind {kind}")
    if kind == _C.K_BARRIER:
        return "barrier()"
    dtype = _DTYPE_NAMES.get(int(sig[2]), f"dtype {int(sig[2])}")
    if kind == _C.K_ALLTOALL:
        return f"{name}({_DTYPE_NAMES.get(int(sig[2]), '')})"
    parts = [f"count={int(sig[5])}", dtype]
    info = _C.KINDS.get(name, {})
    if info.get("reduces"):
        parts.append(f"op={OP_NAMES.get(int(sig[3]), int(sig[3]))}")
    if info.get("rooted"):
        parts.append(f"root={int(sig[4])}")
    return f"{name}({', '.join(parts)})"


def _shapes(arrays):
    return [tuple(getattr(a, "shape", ())) for a in arrays]


def log_collective(group_name, name, dtype, inputs, outputs, async_op, path=None):
    """DETAIL: one line per collective, naming the backend, transport and algorithm it runs with
    (path: ProcessGroup._explain's dict; the C core's flight record keeps what ran)."""
    path = path or {}
    detail("%s on group %s: backend %s%s, transport %s, algorithm %s, dtype %s, inputs %s, "
           "outputs %s%s", name, group_name, path.get("backend", "?"),
           " (staged)" if path.get("staged") else "", path.get("transport", "?"),
           path.get("algorithm", "?"), dtype, _shapes(inputs), _shapes(outputs),
           " (async)" if async_op else "")


# ------------------------------------------------------------------------ flight recorder

_groups = weakref.WeakValueDictionary()  # C group id -> (label, C group): dump() on demand
_labels = {}
_track_ids = itertools.count(1)
_lock = threading.Lock()


def _fr_dir():
    return _config.get("PYDDP_FLIGHT_RECORDER_DIR") or None


def _fr_path(directory, rank, label, token):
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
    return os.path.join(directory, f"rank{rank}-{safe}-{token & 0xffffffff:08x}.json")


def attach(cpg, label, rank, size, token, backend, transport_why=""):
    """A C group was connected: configure its flight-recorder dump and its timeline track, and
    log its setup at INFO."""
    grank = _global_rank(rank)
    key = id(cpg)
    with _lock:
        _groups[key] = cpg
        _labels[key] = (label, token, grank, rank, size)
    directory = _fr_dir()
    if directory is not None:
        meta = {"global_rank": grank, "group": label, "group_id": f"{token:x}",
                "group_rank": rank, "group_size": size, "backend": backend,
                "transport": cpg.transport, "host": socket.gethostname(), "pid": os.getpid()}
        try:
            os.makedirs(directory, exist_ok=True)
            cpg.flight_recorder_configure(_fr_path(directory, grank, label, token),
                                          json.dumps(meta))
        except OSError as e:
            log.warning("[rank %s] flight recorder: cannot use PYDDP_FLIGHT_RECORDER_DIR=%s: %s",
                        grank, directory, e)
    if _timeline_start(grank):
        tid = next(_track_ids)
        cpg.set_timeline_track(tid)
        _C.timeline_event("thread_name", "__metadata", "M", 0.0, 0.0, tid,
                          json.dumps({"name": f"group {label} ({size} ranks, {cpg.transport})"}))
    info("group %s: rank %d of %d, backend %s, transport %s%s", label, rank, size, backend,
         cpg.transport, f" ({transport_why})" if transport_why else "", rank=grank)


def records(cpg):
    """The flight recorder's records of a C group, oldest first (a list of dicts)."""
    return cpg.flight_records()


def dump(cpg, path=None, reason="on demand"):
    """Write a C group's records as JSON; returns the path.  path None: the group's file in
    PYDDP_FLIGHT_RECORDER_DIR (ValueError when it is unset)."""
    if path is None:
        directory = _fr_dir()
        if directory is None:
            raise ValueError("flight_recorder.dump: give a path, or set "
                             "PYDDP_FLIGHT_RECORDER_DIR")
        label, token, grank, _, _ = _labels.get(id(cpg), ("group", 0, _global_rank(0), 0, 0))
        os.makedirs(directory, exist_ok=True)
        path = _fr_path(directory, grank, label, token)
    cpg.flight_recorder_dump(os.fspath(path), reason)
    return os.fspath(path)


def shm_prefixes():
    """The /dev/shm name prefixes of this process's groups' segments ("pyddp.<token>.")."""
    with _lock:
        return [f"pyddp.{tok & (2**64 - 1):016x}." for (_, tok, _, _, _) in _labels.values()]


def live_groups():
    with _lock:
        return [(k, g) for k, g in _groups.items()]


# ------------------------------------------------------------------------------- timeline

_tl_state = {"started": False, "path": None}
TRACK_DDP = 1000  # the DDP and backward-pass track


def timeline_path(spec, rank):
    """Where rank writes its timeline for PYDDP_TIMELINE=spec."""
    if "{rank}" in spec:
        return spec.format(rank=rank)
    if spec.endswith(os.sep) or os.path.isdir(spec):
        return os.path.join(spec, f"timeline.rank{rank}.json")
    root, ext = os.path.splitext(spec)
    return f"{root}.rank{rank}{ext or '.json'}"


def _timeline_start(rank):
    """Open this process's timeline once, when PYDDP_TIMELINE is set; whether it is on."""
    if _tl_state["started"]:
        return _C.timeline_enabled()
    spec = _config.get("PYDDP_TIMELINE")
    if not spec:
        return False
    with _lock:
        if _tl_state["started"]:
            return _C.timeline_enabled()
        _tl_state["started"] = True
        path = timeline_path(spec, rank)
        d = os.path.dirname(path)
        try:
            if d:
                os.makedirs(d, exist_ok=True)
            _C.timeline_open(path, int(rank), f"rank {rank}")
        except (OSError, _C.DistError) as e:
            log.warning("[rank %s] timeline: cannot write PYDDP_TIMELINE=%s: %s", rank, spec, e)
            return False
        _tl_state["path"] = path
        _C.timeline_event("thread_name", "__metadata", "M", 0.0, 0.0, TRACK_DDP,
                          json.dumps({"name": "DDP"}))
        atexit.register(_C.timeline_close)
    info("timeline: writing %s", path, rank=rank)
    return True


def timeline_on() -> bool:
    return _C.timeline_enabled()


def timeline_span(name, cat, t0, t1, args=None, tid=TRACK_DDP):
    """A finished span (wall-clock seconds, as _C.wall()) on a track; nothing when off."""
    if _C.timeline_enabled():
        _C.timeline_event(name, cat, "X", t0 * 1e6, (t1 - t0) * 1e6, tid,
                          json.dumps(args) if args else None)


def timeline_instant(name, cat, args=None, tid=TRACK_DDP):
    if _C.timeline_enabled():
        _C.timeline_event(name, cat, "i", _C.wall() * 1e6, 0.0, tid,
                          json.dumps(args) if args else None)




def _init_from_env():
    try:
        set_debug_level_from_env()
    except ValueError as e:
        log.warning("%s; debug level stays OFF", e)


_init_from_env()
