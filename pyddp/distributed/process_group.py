"""ProcessGroup (torch.distributed.ProcessGroup): one group's backend objects, one per device
type, and the routing of each checked request to the one serving its arrays' device; Work and
Future, the handles of what it started.  Below distributed_c10d (the public functions, which
check arguments and build the requests), above backends (which never import this module).
"""
from __future__ import annotations

import collections
import threading
from datetime import timedelta

import numpy as np

from .. import _C
from . import _observe
from .backends import registry as _registry
from .. import _threads
from .backends.interface import Request, checked as _checked, declared as _declared

__all__ = ["ProcessGroup", "Work", "Future"]

DistError = _C.DistError
_new_request = tuple.__new__  # a Request built as a tuple: its generated __new__ is a call more
_objects = threading.local()  # .active: an object collective runs on this thread


def _staging():
    """backends.staging, imported when a CUDA array is first staged (import stays light)."""
    from .backends import staging

    return staging


def _nbytes(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _library_why(backend, algorithm):
    """Why a library backend ("nccl", "mpi") names ``algorithm``: the library chooses per call."""
    if backend == "nccl":
        if algorithm != "auto":
            return f"NCCL chooses its algorithm per call among NCCL_ALGO={algorithm}"
        return "the nccl backend chooses its algorithm per call (NCCL_DEBUG=INFO logs it, " \
               "NCCL_ALGO sets it)"
    return f"the {backend} backend chooses its algorithm per call (the library's own tuning)"


def _rules_why(cpg, kind, dtype, count, transport, algorithm):
    """Why coll/select.c chose algorithm, in the words of the rules in force (cpg.rules)."""
    name = _observe.KIND_NAMES.get(kind, str(kind))
    esz = _C.DTYPE_SIZES.get(_observe.dtype_name(dtype), 1)
    nbytes = count * esz
    cma_rules, small_rules = cpg.rules
    if kind == _C.K_BARRIER:
        return f"over {transport}: the one algorithm for barrier"
    if algorithm in ("shm", "cma"):
        rule = cma_rules[kind] if kind < len(cma_rules) else None
        if not cpg.single_copy:
            cma = "single copies unavailable here (PYDDP_CMA=0, or the probe failed)"
        elif rule is None:
            cma = f"single copies never for {name}"
        elif isinstance(rule, tuple):
            cma = (f"single copies from {_nbytes(rule[0])} except in [{_nbytes(rule[1])}, "
                   f"{_nbytes(rule[2])})")
        else:
            cma = f"single copies from {_nbytes(rule)}"
        return (f"every rank on this host: shared memory; {_nbytes(nbytes)} per rank, {cma}"
                + (" (an all_reduce of a shared array, as DDP's buckets, runs shm-inplace)"
                   if kind == _C.K_ALLREDUCE and algorithm == "shm" else "")
                + (" (all_to_all settles it after its first sync, by every rank's longest "
                   "block)" if kind == _C.K_ALLTOALL else ""))
    if algorithm in ("direct", "flat", "ring", "chain"):
        small = small_rules[kind] if kind < len(small_rules) else 0
        if kind in (_C.K_ALLREDUCE, _C.K_REDUCE, _C.K_REDUCE_SCATTER):
            esz = 4 if _observe.dtype_name(dtype) in ("float16", "bfloat16") else esz
            nbytes = count * esz
            what = "reduced"
            if cpg.size == 1 or count < cpg.size:
                return f"over {transport}: fewer elements than ranks (or one rank): direct"
        elif kind == _C.K_ALLGATHER:
            nbytes *= cpg.size
            what = "the whole output"
        else:
            what = "the message"
        if kind in (_C.K_GATHER, _C.K_SCATTER, _C.K_BARRIER):
            return f"over {transport}: the one algorithm for {name}"
        side = "<=" if algorithm in ("direct", "flat") else ">"
        return (f"over {transport}: {what} {_nbytes(nbytes)} {side} the crossover "
                f"{_nbytes(small)}")
    if algorithm == "none":
        return "one rank: nothing moves"
    return f"over {transport}: the one algorithm for {name}"


class ProcessGroup:
    """A group of ranks with one backend object per device type it serves (see
    pyddp.distributed.backends); each collective goes to the backend of its arrays' device."""

    _noun = "arrays"  # what its messages call the arguments (the torch bridge's: "tensors")

    def __init__(self, backends, ranks, backend, name, timeout, rank, plan=None):
        # device type -> backend object, or _registry.Unavailable (named, not in this build)
        self._backends = dict(backends)
        self._plan = plan  # device type -> registry entry, for new_group(backend=None)
        self._ranks = list(ranks)  # global ranks, index = group rank
        self._rank = rank
        self._size = len(self._ranks)
        self._rank_of = {g: i for i, g in enumerate(self._ranks)}
        self._backend = backend
        self._name = name
        self._timeout = timeout
        self._pending = collections.deque()
        self._lock = threading.Lock()
        Unavailable = _registry.Unavailable
        live = {d: b for d, b in self._backends.items() if type(b) is not Unavailable}
        # device type -> the backend object's interface, read once (backends.interface.declared)
        self._decl = {d: _declared(b) for d, b in live.items()}
        # device type -> the callable taking a Request: the backend's runner, behind the check of
        # what its entry declares it supports when that refuses anything (the same words for
        # every backend; a backend that serves everything is called directly)
        self._runs = {}
        for d, decl in self._decl.items():
            entry = (plan or {}).get(d)
            supports = getattr(entry, "supports", None)
            if supports is not None and not supports.refuses_nothing():
                self._runs[d] = _checked(decl.run, supports, entry.name)
            else:
                self._runs[d] = decl.run
        cpu = self._backends.get("cpu")
        # one backend object for every device (mpi serves cpu and cuda): no routing by device
        cpu_only = cpu is not None and all(b is cpu for b in self._backends.values())
        # the 'cpu' device's backend object, used directly (the C process group for pyddp's own)
        self._cpg = live.get("cpu")
        cpu_decl = self._decl.get("cpu")
        # fast(kind, array, arg) -> bool: a small blocking collective in one C call (shm groups).
        # CPU-only groups: in a group with a device backend the attempt would cost every device
        # array an export (torch's __dlpack__ also orders streams) before it is turned down.
        # (A backend that serves the devices too, as mpi, turns device arrays down at once.)
        # Only a backend that refuses nothing: the fast path skips the check of _runs.
        device_live = any(d != "cpu" and b is not cpu for d, b in live.items())
        self._fast = None if device_live or cpu_decl is None or \
            self._runs["cpu"] is not cpu_decl.run else cpu_decl.fast
        if _observe._level >= _observe.DebugLevel.DETAIL:
            self._fast = None  # DETAIL logs every call: all go through _submit
        # host arrays of a group without a 'cpu' backend (object collectives on an nccl group):
        # the host group a device backend keeps beside it
        self._host = self._cpg
        if self._host is None:
            self._host = next((dc.host for dc in self._decl.values() if dc.host is not None),
                              None)
        # a CPU-only group sends everything to self._cpg; others choose by device.  A device
        # array always goes to _device_array (CUDA arrays given to the 'cpu' backend are staged
        # through pinned host memory, as torch's gloo does).
        self._host_run = None if self._host is None else (
            self._runs["cpu"] if self._host is self._cpg else _declared(self._host).run)
        self._run_cpu = self._runs.get("cpu")
        self._on_device = self._device_array
        self._route = None if cpu_only else self._route_arrays
        self._staging = False  # set once a CUDA array was staged: outputs are copied back

    def rank(self) -> int:
        """This process's rank within the group."""
        return self._rank

    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    def name(self) -> str:
        """The group's name (torch's group_name)."""
        return self._name

    @property
    def group_name(self) -> str:
        """The group's name, as a property (torch's ProcessGroup.group_name)."""
        return self._name

    def _submit(self, kind, dtype=0, op=0, root=0, tag=0, count=0, inputs=(), outputs=(),
                in_splits=None, out_splits=None, timeout=0.0, wait_all=False, name="",
                result=None, async_op=False, source=False):
        run = self._run_cpu if self._route is None else self._route(inputs, outputs, name)
        if run is None:
            raise DistError(f"{name}: the process group has been destroyed")
        if _observe._level >= _observe.DebugLevel.DETAIL:
            _observe.log_collective(self._name, name, _observe.dtype_name(dtype), inputs,
                                    outputs, async_op,
                                    self._path_of_call(kind, dtype, count, inputs, outputs,
                                                       in_splits))
        # the record built as a tuple: Request's generated __new__ is a Python call more
        cw = run(_new_request(Request, (kind, dtype, int(op), root, tag, count, inputs, outputs,
                                        in_splits, out_splits, float(timeout), bool(wait_all),
                                        name, not async_op and not source)))
        after = _staging().copy_back_fn(outputs) if self._staging else None
        if cw is None:  # ran to completion on this thread
            if after is not None:
                after()
            return None
        work = Work(cw, result, self if source else None, after)
        # The group holds every handle until it completes, so arrays stay alive even when
        # the caller drops an async handle or a blocking wait is interrupted (Ctrl-C).
        with self._lock:
            pend = self._pending
            while pend and pend[0].is_completed():
                pend.popleft()
            pend.append(cw)
        if not async_op:
            work.wait()
        return work

    def _path_of_call(self, kind, dtype, count, inputs, outputs, in_splits):
        """explain() for a request about to run (DETAIL's log line): its arrays' device, whether
        they were staged, all_to_all's longest block."""
        device, staged = "cpu", False
        for a in (*inputs, *outputs):
            if not isinstance(a, np.ndarray):
                device = a.device
            elif self._staging and isinstance(a, _staging().Staged):
                staged = True
            break
        if kind == _C.K_ALLTOALL:
            esz = max(_C.DTYPE_SIZES.get(_observe.dtype_name(dtype), 1), 1)
            if in_splits is not None:
                count = max(in_splits, default=0) // esz
            else:
                count = max((getattr(a, "nbytes", 0) for a in inputs), default=0) // esz
        try:
            return self._explain(kind, dtype, count, device, staged)
        except (ValueError, RuntimeError, DistError) as e:
            return {"backend": "?", "transport": "?", "algorithm": "?", "why": str(e)}

    def _explain(self, kind, dtype, count, device="cpu", staged=False) -> dict:
        """Which backend, transport and algorithm a collective of ``count`` elements of dtype
        code ``dtype`` (one rank's block; all_to_all: its longest) on arrays of ``device`` runs
        with: the routing of _route_arrays and _device_array, then the backend's own answer
        (the 'cpu' backend's is coll/select.c's decision, the one its calls run); nothing runs."""
        backends = self._backends
        if backends is None:
            raise DistError("explain: the process group has been destroyed")
        be = backends.get(device)
        why = []
        if be is None and device == "cuda" and self._cpg is not None:
            be, staged = self._cpg, True
        elif be is None and device == "cpu" and self._host is not None:
            be = self._host  # the host group beside a device backend (object collectives)
            why.append("host arrays of a device-only group go to its host group")
        if be is None or type(be) is _registry.Unavailable:
            raise self._no_backend(be, f"explain: arrays on device {device}")
        if staged:
            why.append("CUDA arrays staged through pinned host memory for the 'cpu' backend")
        entry = (self._plan or {}).get("cpu" if staged else device)
        if entry is not None and type(entry) is not _registry.Unavailable:
            backend = entry.name
        else:
            backend = "cpu" if hasattr(be, "flight_records") else type(be).__name__
        decl = _declared(be)
        transport = decl.transport or backend
        explain = decl.explain
        if kind in (_C.K_SEND, _C.K_RECV):
            algorithm = "p2p"
            why.append("point to point: the transport's own send and receive")
        elif callable(explain):
            transport, algorithm = explain(kind, dtype, count)
            if hasattr(be, "rules"):
                why.append(_rules_why(be, kind, dtype, count, transport, algorithm))
            else:
                why.append(_library_why(backend, algorithm))
        else:
            algorithm = "auto"
            why.append(_library_why(backend, algorithm))
        return {"backend": backend, "transport": transport, "algorithm": algorithm,
                "staged": staged, "why": "; ".join(w for w in why if w)}

    def _backends_desc(self) -> str:
        """'cpu:cpu, cuda:nccl (unavailable)': the group's devices and their backends."""
        out = []
        for d, e in (self._plan or {}).items():
            if type(e) is _registry.Unavailable:
                out.append(f"{d}:{e.entry.name} (unavailable)")
            else:
                out.append(f"{d}:{e.name}")
        return ", ".join(out)

    def _device_array(self, view, name, writable):
        """A device array given to a collective: (view, code) when a backend of the group serves
        its device; a staged host copy for a CUDA array on a group whose only backend for it is
        'cpu'; else the error naming both."""
        be = None if self._backends is None else self._backends.get(view.device)
        if type(be) is _registry.Unavailable:
            raise RuntimeError(f"{name} is on device {view.device_str}: {be.entry.reason()}")
        stage = be is None and view.device == "cuda" and self._cpg is not None
        if be is None and not stage:
            raise ValueError(f"{name} is on device {view.device_str}, which no backend of group "
                             f"{self._name!r} serves (its backends: {self._backends_desc()})")
        view.checked(name, writable)
        if stage:
            self._staging = True
            return _staging().stage(view, name, writable), view.code
        return view, view.code

    def _route_arrays(self, inputs, outputs, name):
        """The backend object for one request: the one serving its arrays' device."""
        backends = self._backends
        if backends is None:
            return None
        device = named = None
        for a in (*inputs, *outputs):
            d = "cpu" if isinstance(a, np.ndarray) else a.device
            if device is None:
                device = d
            elif d != device:
                v = a if d != "cpu" else named
                where = (f"{v.name} is on {v.device_str}" if v is not None
                         else f"an argument is on {d}")
                raise ValueError(f"{name}: {where} but another argument is on "
                                 f"{device if d != 'cpu' else 'cpu'}: all {self._noun} of one "
                                 "call must be on one device")
            if d != "cpu" and named is None:
                named = a
        if device is None:  # barrier: no arrays
            device = "cpu" if "cpu" in backends else next(iter(backends))
        if device == "cpu" and "cpu" not in backends and self._host is not None and \
                getattr(_objects, "active", False):
            return self._host_run  # the pickles of an object collective on a device-only group
        be = backends.get(device)
        if be is None or type(be) is _registry.Unavailable:
            raise self._no_backend(be, f"{name}: the arrays are on device {device}")
        return self._runs[device]

    def _no_backend(self, be, where):
        """The error for arrays whose device no backend of this group serves (``be`` None) or
        whose backend is not in this build (an Unavailable entry)."""
        if be is not None:
            return RuntimeError(f"{where}: {be.entry.reason()}")
        return ValueError(f"{where}: no backend of group {self._name!r} serves it (its backends: "
                          f"{self._backends_desc()})")

    # ------------------------------------------------ what callers above the seam may ask

    def _declared(self, device):
        """The declared interface (backends.interface.Declared) of the backend serving
        ``device``, or None (none does, or it is not in this build, or the group is gone)."""
        return self._decl.get(device) if self._backends is not None else None

    def _refusal(self, request, device):
        """The exception the backend serving ``device`` declares for ``request`` (None: served);
        for calls that do not pass _submit (batch_isend_irecv's batches)."""
        entry = (self._plan or {}).get(device)
        supports = getattr(entry, "supports", None)
        return None if supports is None else supports.refusal(request, entry.name)

    @property
    def _transport(self):
        """The 'cpu' device's backend's transport: 'shm' (every rank on this host), 'tcp',
        'local' (one rank), ..., or None (no such backend, or the group is gone)."""
        d = self._decl.get("cpu") if self._backends is not None else None
        return None if d is None else d.transport

    @property
    def _single_copy(self):
        """True when large shared-memory messages move with one copy (cross-memory attach)."""
        return bool(getattr(self._cpg, "single_copy", False))

    def _shared_alloc(self):
        """``shared_alloc(nbytes)`` of the 'cpu' device's backend when every rank of the group
        maps this host's memory (transport 'shm'), else None: what DDP's shared buckets need."""
        d = self._decl.get("cpu") if self._backends is not None else None
        if d is None or d.shared_alloc is None or d.transport != "shm":
            return None
        return d.shared_alloc

    def _fail(self, msg) -> None:
        """Make ``msg`` the group's error on every backend and tell the peers at once (the program
        is ending with an uncaught exception: peers waiting for this rank fail now, naming it,
        instead of at their timeout or when this process finally exits).  Backends without a way
        to fail are left to their goodbye."""
        backends = self._backends
        if backends is None:
            return
        seen = set()
        for b in backends.values():
            if type(b) is _registry.Unavailable or id(b) in seen:
                continue
            seen.add(id(b))
            fail = getattr(b, "fail", None) or getattr(b, "_fail", None)
            if fail is not None:
                try:
                    fail(msg)
                except Exception:   # a group already failed or destroyed: nothing to tell
                    pass

    def _overlap(self) -> bool:
        """Whether work handed to a backend's progress thread gets a core of its own here (DDP
        reduces buckets there while backward goes on; otherwise right where they become ready):
        _threads.spare_core, with this group's ranks on this host when they share its memory."""
        return _threads.spare_core(self._size if self._transport == "shm" else None)

    def _destroy(self):
        self._fast = None
        self._cpg = None
        self._run_cpu = self._host_run = None
        backends, self._backends = self._backends, None
        done = set()
        for b in (backends or {}).values():
            if type(b) is not _registry.Unavailable and id(b) not in done:
                done.add(id(b))
                b.destroy()
        self._pending.clear()

    def __repr__(self):
        return f"<pyddp ProcessGroup {self._name!r} rank {self.rank()} of {self.size()}>"


# ---------------------------------------------------------------------------------- Work

class Future:
    """The result of an asynchronous operation (torch.futures.Future's common surface).

    ``Future()`` makes one the caller completes with ``set_result`` (as torch's comm hooks do);
    a collective's ``work.get_future()`` completes with its work, its value the list of outputs.
    """

    _UNSET = object()

    def __init__(self, work=None, value_fn=None):
        self._work = work
        self._value_fn = value_fn
        self._result = Future._UNSET
        self._callbacks = []

    def wait(self):
        """Block until the operation finished (raising its error, if any); returns value()."""
        if self._work is not None:
            self._work.wait()
        elif self._result is Future._UNSET:
            raise RuntimeError("Future.wait(): no result was set (call set_result first)")
        return self.value()

    def value(self):
        """The result; raises RuntimeError if the operation has not completed yet."""
        if self._work is None:
            if self._result is Future._UNSET:
                raise RuntimeError("Future.value() called before a result was set")
            return self._result
        if not getattr(self._work, "_ordered", False) and not self._work.is_completed():
            raise RuntimeError("Future.value() called before the operation completed")
        self._work.wait()
        return self._value_fn()

    def done(self) -> bool:
        """Whether the result is available (for CUDA work, as torch's: once launched; reading it
        orders the caller's stream after the operation)."""
        if self._work is None:
            return self._result is not Future._UNSET
        return getattr(self._work, "_ordered", False) or self._work.is_completed()

    def set_result(self, result):
        """Complete a Future made with ``Future()``."""
        if self._work is not None:
            raise RuntimeError("set_result on a Future that belongs to a collective")
        if self._result is not Future._UNSET:
            raise RuntimeError("Future.set_result: the result was already set")
        self._result = result
        for cb in self._callbacks:
            cb(self)

    def then(self, callback):
        """A Future whose value is ``callback(self)``, computed once, when first asked for."""
        parent = self
        done = []

        def value():
            if not done:
                done.append(callback(parent))
            return done[0]
        if self._work is None:
            fut = Future(_CompletedWork(), value)
            if not self.done():
                raise RuntimeError("Future.then on an unset Future is not supported")
            return fut
        return Future(self._work, value)

    def add_done_callback(self, callback):
        """Call ``callback(future)`` once the result is set (at once if it already is)."""
        if self.done():
            callback(self)
        else:
            self._callbacks.append(callback)


class _CompletedWork:
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class Work:
    """Handle of an asynchronous collective or point-to-point operation."""

    def __init__(self, cwork, result, pg=None, after=None):
        self._cw = cwork
        self._result = result
        self._pg = pg
        self._exc = None
        self._after = after  # run once after a successful wait (staged outputs copied back)
        # a CUDA backend's work: wait() orders the caller's stream, the host does not block
        self._ordered = getattr(cwork, "stream_ordered", False)

    def wait(self, timeout=None) -> bool:
        """Block until the operation finished (``timeout``: seconds or a timedelta); raises the
        operation's DistError if it failed. Returns True."""
        t = None
        if timeout is not None:
            t = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        try:
            self._cw.wait(t)
        except DistError as e:
            self._exc = e
            raise
        after, self._after = self._after, None
        if after is not None:
            after()
        return True

    def synchronize(self):
        """torch's Work.synchronize(): for CUDA work the caller's current stream waits for the
        operation; otherwise the same as wait()."""
        sync = getattr(self._cw, "synchronize", None)
        if sync is None:
            self.wait()
        else:
            sync()

    def is_completed(self) -> bool:
        """Whether the operation has finished, successfully or not (never blocks)."""
        return self._cw.is_completed()

    def is_success(self) -> bool:
        """True once the operation finished without an error."""
        if not self._cw.is_completed():
            return False
        try:
            self._cw.wait(0)
        except DistError:
            return False
        return True

    def exception(self):
        """The operation's error once it finished with one, else None."""
        if not self._cw.is_completed():
            return None
        try:
            self._cw.wait(0)
        except DistError as e:
            return e
        return None

    def result(self):
        """Wait, then return the output arrays as a list (torch's Work.result())."""
        self.wait()
        r = self._result
        return [] if r is None else list(r) if isinstance(r, (list, tuple)) else [r]

    def get_future(self) -> Future:
        """A Future whose value is the list of output tensors, as torch's (``[tensor]``)."""
        return Future(self, self.result)

    def source_rank(self) -> int:
        """For recv/irecv from any source: the global rank the message came from."""
        src = self._cw.source_rank()
        return self._pg._ranks[src] if self._pg is not None and src >= 0 else src

    def _source(self):
        return self.source_rank()
