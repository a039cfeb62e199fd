"""The registry of backends: which backend serves which device, parsed from backend strings.

As in torch, where gloo and NCCL are separate backends behind one ProcessGroup, a pyddp
ProcessGroup holds one backend object per device type ('cpu', 'cuda') and hands each collective
to the backend serving the device of its arrays (the interface: backends.interface).

A backend is registered once, by name, with what it declares: the devices it serves and what it
supports on them (``supports``: a backends.interface.Supports; the default refuses nothing),
whether it is available in this build (and why not), a factory ``factory(opts) -> backend
object`` called once per group and rank (``opts``: a ``BackendOptions``), optionally a rendezvous
hook (backends.interface: ``Rendezvous``) and, for the backend that keeps host groups ('cpu'),
``host(opts, name, label=None, backend="cpu") -> backend object``: the host group a device backend or the torch
bridge keeps beside its own (``host_group``).  This module registers nothing: each backend module registers itself
(backends/__init__.py imports the built-in ones); users add theirs with torch's
``Backend.register_backend(name, func, extended_api=False, devices=None)``.  Parsing of
``init_process_group`` / ``new_group`` backend strings, ``Backend``, ``is_*_available`` and the
dispatch by device all read the registry.

Backend strings, as torch parses them: None (the default: 'cpu', plus 'cuda:nccl' when nccl is
available and CUDA sees a GPU: torch too picks nccl by default only on a machine with one), one
name ('cpu', 'gloo', 'nccl', 'mpi', a registered one: every device it serves) or 'device:name'
pairs ('cpu:gloo,cuda:nccl').  A backend that is named but unavailable is an
error when no named backend is available; otherwise its device is recorded as unavailable and an
array on that device raises the backend's reason at the call.
"""
from __future__ import annotations

import warnings

from .interface import BackendOptions, Supports, runner

__all__ = ["BackendEntry", "BackendOptions", "Unavailable", "register", "lookup", "names",
           "parse", "create", "host_group"]


class BackendEntry:
    """One registered backend."""

    __slots__ = ("name", "devices", "factory", "extended_api", "_available", "_reason", "aliases",
                 "rendezvous", "supports", "host", "needs")

    def __init__(self, name, devices, factory, available=True, reason=None, aliases=(),
                 extended_api=False, rendezvous=None, supports=None, host=None, needs=""):
        self.name = name
        self.needs = needs            # what it needs beyond pyddp, in a few words (messages)
        self.supports = supports if supports is not None else Supports()
        self.host = host  # host(opts, name, label, backend) -> a host group (backend 'cpu' has it)
        self.rendezvous = rendezvous  # a backends.interface.Rendezvous, or None
        self.devices = tuple(devices)
        self.factory = factory
        self.extended_api = extended_api
        self._available = available
        self._reason = reason
        self.aliases = tuple(aliases)

    def is_available(self) -> bool:
        """Whether this build (and machine) can run the backend."""
        a = self._available
        return bool(a() if callable(a) else a)

    def reason(self) -> str:
        """Why the backend is not available ('' when it is)."""
        if self.is_available():
            return ""
        r = self._reason
        return (r() if callable(r) else r) or f"backend {self.name!r} is not available"

    def __repr__(self):
        return f"<pyddp backend {self.name!r} serving {', '.join(self.devices)}>"


class Unavailable:
    """A group's entry for a device whose named backend is not available: an array on that
    device raises the backend's reason."""

    __slots__ = ("entry",)

    def __init__(self, entry):
        self.entry = entry

    def __repr__(self):
        return f"<unavailable backend {self.entry.name!r}>"


_registry: dict = {}  # name or alias -> BackendEntry


def register(entry: BackendEntry) -> BackendEntry:
    """Add (or replace) a backend under its name and aliases."""
    for key in (entry.name, *entry.aliases):
        _registry[key] = entry
    return entry


def lookup(name: str):
    """The entry registered under ``name`` (or an alias), or None."""
    return _registry.get(name.lower())


def names() -> list:
    """Every registered name and alias, in registration order."""
    return list(_registry)


def _has_gpu() -> bool:
    from ...cuda import _runtime as cuda

    return cuda.is_available()


def _invalid(backend) -> ValueError:
    """Unknown backend name: every registered backend with the devices it serves and what an
    unavailable one needs, and the nearest registered name."""
    import difflib

    seen, parts = set(), []
    for entry in _registry.values():
        if id(entry) in seen:
            continue
        seen.add(id(entry))
        what = repr(entry.name)
        if entry.aliases:
            what += f" (alias {', '.join(repr(a) for a in entry.aliases)})"
        what += f" for {' and '.join(d.upper() for d in entry.devices)} arrays"
        if entry.needs:
            what += f", needs {entry.needs}"
        if not entry.is_available():
            what += " (not available here)"
        parts.append(what)
    near = difflib.get_close_matches(str(backend).lower(), list(_registry), n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return ValueError(f"Invalid backend {backend!r}{hint} pyddp's backends: " + "; ".join(parts)
                      + ". Also: None (the default: 'cpu', plus 'nccl' for CUDA arrays when a GPU "
                      "is visible) and 'device:name' pairs such as 'cpu:gloo,cuda:nccl'")


def parse(backend):
    """``(name get_backend() returns, {device: BackendEntry or Unavailable})`` for a backend
    string (see the module docstring).  Raises ValueError for malformed or unknown names,
    RuntimeError (the backend's reason) when none of the named backends is available.

    Under PYDDP_CUDA_ON_CPU=1 (pyddp.cuda._emulation) "nccl" runs on the cpu backend: the
    emulated CUDA tensors are host arrays, so the cpu backend serves the whole plan; the name
    returned stays the one given (get_backend() answers "nccl" as on a GPU)."""
    if isinstance(backend, str) and "nccl" in backend.lower():
        from ...cuda import _emulation
        if _emulation.enabled():
            b = backend.lower()
            rest = [p for p in b.split(",") if p.split(":")[-1].strip() != "nccl"]
            parse(",".join(rest) if rest else "cpu")   # the other pairs are checked as usual
            e = _registry.get("cpu")
            return b, {"cpu": e}
    if backend is None:
        plan = {}
        for device, name in (("cpu", "cpu"), ("cuda", "nccl")):
            e = _registry.get(name)
            if e is not None and e.is_available() and (device != "cuda" or _has_gpu()):
                plan[device] = e
        return "cpu", plan
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string or None, got {type(backend).__name__}")
    b = backend.lower()
    if ":" not in b:
        e = _registry.get(b)
        if e is None:
            raise _invalid(backend)
        if not e.is_available():
            raise RuntimeError(e.reason())
        return b, dict.fromkeys(e.devices, e)
    plan = {}
    for pair in b.split(","):
        parts = pair.split(":")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"Invalid device:backend pairing {pair!r} in backend {backend!r}; "
                             "expected '<device>:<backend>,<device>:<backend>', e.g. "
                             "'cpu:gloo,cuda:nccl'")
        device, name = parts[0].strip(), parts[1].strip()
        if device in plan:
            raise ValueError(f"Duplicate device type {device!r} in backend {backend!r}")
        e = _registry.get(name)
        if e is None:
            raise _invalid(name)
        if device not in e.devices:
            raise ValueError(f"backend {backend!r}: backend {name!r} does not serve device "
                             f"{device!r} (it serves {', '.join(e.devices)})")
        plan[device] = e if e.is_available() else Unavailable(e)
    if all(type(e) is Unavailable for e in plan.values()):
        raise RuntimeError(next(iter(plan.values())).entry.reason())
    return b, plan


def create(plan, opts: BackendOptions) -> dict:
    """``{device: backend object or Unavailable}`` for one group: one object per entry (an entry
    serving several devices is created once); destroys what it made if a factory fails."""
    made, objs = {}, {}
    try:
        for device, e in plan.items():
            if type(e) is Unavailable:
                objs[device] = e
                continue
            if e.name not in made:
                obj = e.factory(opts)
                if runner(obj) is None:
                    raise TypeError(f"backend {e.name!r}: its factory returned "
                                    f"{type(obj).__name__}, which has no submit() or run() (see "
                                    "pyddp.distributed.backends.interface)")
                made[e.name] = obj
            objs[device] = made[e.name]
    except BaseException:
        for obj in made.values():
            destroy = getattr(obj, "destroy", None)
            if destroy is not None:
                destroy()
        raise
    return objs


def host_group(opts: BackendOptions, name: str, label=None, backend="cpu"):
    """The host group a device backend (or the torch bridge) keeps beside its communicators: a
    backend object of the registered backend that has ``host`` ('cpu'), connected through
    ``opts.store`` under ``name``; ``label`` names the group and ``backend`` its owner in logs
    and flight records.  Sets ``opts.round``."""
    for e in _registry.values():
        if e.host is not None and e.is_available():
            return e.host(opts, name, label, backend)
    raise RuntimeError("no registered backend keeps host groups (backend 'cpu' does)")


def register_plugin(name, func, extended_api=False, devices=None, supports=None) -> BackendEntry:
    """torch's ``Backend.register_backend``: ``func(store, rank, world_size, timeout)`` (a
    timedelta), or ``func(opts, pg_options)`` with ``extended_api=True``, returns the group's
    backend object.  ``devices``: a device type or a list of them (default: 'cpu' and 'cuda',
    with a warning, as torch); ``supports``: a backends.interface.Supports (default: all)."""
    if not isinstance(name, str) or not name:
        raise ValueError("register_backend: name must be a non-empty string")
    if not callable(func):
        raise TypeError("register_backend: func must be callable")
    if devices is None:
        warnings.warn(f"Device capability of {name} unspecified, assuming `cpu` and `cuda`. "
                      "Please specify it via the `devices` argument of `register_backend`.",
                      stacklevel=3)
        devices = ("cpu", "cuda")
    elif isinstance(devices, str):
        devices = (devices,)
    if extended_api:
        def factory(opts):
            return func(opts, opts.pg_options)
    else:
        def factory(opts):
            return func(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    if supports is not None and not isinstance(supports, Supports):
        raise TypeError("register_backend: supports must be a "
                        "pyddp.distributed.backends.Supports")
    return register(BackendEntry(name.lower(), devices, factory, extended_api=extended_api,
                                 supports=supports))
