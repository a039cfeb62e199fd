"""Backend "nccl", its implementation (imported at the first group; the package registers it):
pyddp's collectives on CUDA arrays through NCCL (the interface every backend
object has: pyddp.distributed.backends.interface).

One backend object per process group and rank.  It holds:

- one NCCL communicator per CUDA device (``pyddp._C.NcclComm``), created at the first collective
  on that device (or at init when ``device_id`` is given) from a unique id that rank 0 publishes
  in the group's store;
- a companion host group (pyddp's own C process group over shared memory or TCP) that never moves
  array data: it compares every collective's signature across ranks before NCCL sees it (so a
  mismatch raises on every rank instead of hanging or corrupting memory), notices dead peers,
  and carries object collectives;
- a watchdog thread that polls the oldest running work of each communicator, NCCL's asynchronous
  error and the host group's health, and aborts the communicators (ncclCommAbort, never destroy on
  a broken one) on a timeout, an NCCL error or a dead peer.  The waiting call, or the next one,
  raises DistBackendError naming the operation, its sequence number, the group and its ranks.

Stream rules are torch's ProcessGroupNCCL's: the communicator's stream waits (an event, no host
sync) for the caller's current stream, and ``Work.wait()`` makes the caller's current stream wait
for the collective's end; the host blocks only in barrier(), with ``Work.wait(timeout)`` or under
``TORCH_NCCL_BLOCKING_WAIT=1`` / ``PYDDP_NCCL_BLOCKING_WAIT=1``.  The caller's current stream is
torch's (of the tensor's device) for torch tensors, CuPy's (of the array's device) for CuPy arrays,
and otherwise the stream an array's ``__cuda_array_interface__`` names (the legacy default stream
when it names none).

Every call is recorded in the host group's flight-recorder ring beside the group's own operations
(pyddp.distributed.flight_recorder): backend "nccl", transport "nccl", algorithm "auto" (NCCL
chooses per call) or NCCL_ALGO's value when it is set ("p2p" for send and receive); enqueued before the signature check,
started once NCCL has it on the stream, completed when the host sees its end event (a wait, a
query, or the watchdog's poll), failed with the group.  The host group's dump on failure, the
analyzer and the timeline therefore show NCCL's calls as they show the 'cpu' backend's.

Environment: ``PYDDP_NCCL_CHECK=0`` turns the signature check off; ``NCCL_*`` variables reach
NCCL unchanged.
"""
from __future__ import annotations

import collections
import os
import threading
import warnings

import numpy as np

from .... import _C, _config
from ..._observe import describe_signature as _describe
from ..interface import Backend, Request, declared
from ..registry import host_group
from ..staging import current_stream as _current_stream
from ..staging import stream_family as _stream_family

_K_ALLGATHER, _K_ALLTOALL, _K_BARRIER = _C.K_ALLGATHER, _C.K_ALLTOALL, _C.K_BARRIER
_K_SEND, _K_RECV = _C.K_SEND, _C.K_RECV
_KIND_NAMES = {v["code"]: k for k, v in _C.KINDS.items()}
_DTYPE_NAMES = {v: k for k, v in _C.DTYPE_CODES.items()}
_OP_NAMES = {v: k for k, v in _C.REDUCE_OPS.items()}
_SIG = 8  # int64 fields of a signature: seq, kind, dtype, op, root, count, 0, 0
_FR_STARTED, _FR_COMPLETED, _FR_FAILED = _C.FR_STARTED, _C.FR_COMPLETED, _C.FR_FAILED
_SIZES = {code: _C.DTYPE_SIZES[name] for name, code in _C.DTYPE_CODES.items()}


def algorithm() -> str:
    """What the flight records and explain() name as NCCL's algorithm: NCCL_ALGO's value when it
    is set (NCCL chooses among those), else "auto" (NCCL chooses per call)."""
    return os.environ.get("NCCL_ALGO", "").strip() or "auto"


def _env_flag(*names) -> bool:
    return any(_config.get(n) for n in names)


def _argname(view) -> str:
    return getattr(view, "name", None) or "an array"


_PARKED = []  # works of destroyed groups whose arrays NCCL may still touch (see destroy)


# ---------------------------------------------------------------------------------- works

class NcclWork:
    """The handle pyddp.distributed.Work wraps for an NCCL operation."""

    __slots__ = ("be", "comm", "w", "what", "stream_fn", "peer", "fr")
    stream_ordered = True  # wait() orders the caller's stream; the host does not block

    def __init__(self, be, comm, w, what, stream_fn, peer=-1, fr=0):
        self.be = be
        self.comm = comm
        self.w = w
        self.what = what  # (name, count, dtype code): described only when something fails
        self.stream_fn = stream_fn
        self.peer = peer
        self.fr = fr  # its flight record(s) in the host group's ring: an id, or a tuple of them

    def ended(self):
        """The host saw the operation end: its flight record(s) completed, and those of the
        works launched before it on the same communicator (its stream runs them in order), so
        that records end in the order the calls ran."""
        be = self.be
        host = be.host
        if host is None:
            self.fr = 0
            return
        pend = be.pending.get(self.comm)
        if pend:
            ahead = list(pend)  # a copy: the watchdog pops meanwhile
            try:
                ahead = ahead[:ahead.index(self)]
            except ValueError:  # popped already: so were the ones before it
                ahead = ()
            for work in ahead:
                if work.fr:
                    work._ended(host)
        self._ended(host)

    def _ended(self, host):
        fr, self.fr = self.fr, 0
        if fr:
            for i in (fr if type(fr) is tuple else (fr,)):
                host.flight_update(i, _FR_COMPLETED)

    @property
    def desc(self) -> str:
        """The operation as messages name it: name, sequence number, count x dtype."""
        name, count, dtype = self.what
        if count is None:
            return f"{name} (#{self.w.seq})"
        return f"{name} (#{self.w.seq}, {count} x {_DTYPE_NAMES.get(dtype, dtype)})"

    def wait(self, timeout=None) -> bool:
        """Make the caller's current stream wait for the operation (torch's Work.wait()); with a
        timeout, or in blocking-wait mode, wait on the host, bounded, and raise on failure."""
        if timeout is None and not self.be.blocking_wait:
            self.w.wait_stream(self.stream_fn())  # raises the abort reason
            return True
        return self.synchronize_host(self.be.timeout if timeout is None else timeout)

    def synchronize(self):
        """torch's Work.synchronize(): the current stream waits for the operation."""
        self.w.wait_stream(self.stream_fn())

    def synchronize_host(self, timeout) -> bool:
        """Block the host until the operation ends (bounded by ``timeout``); raise on failure."""
        q = self.w.synchronize(float(timeout))
        if q == 0:
            self.be._fail(self.be._timeout_message(self), _C.ST_TIMEOUT)
            q = -1
        if q < 0:
            raise _C.DistBackendError(self.comm.abort_reason or "NCCL operation failed")
        if self.fr:
            self.ended()
        return True

    def is_completed(self) -> bool:
        """Whether the operation ended (successfully or not)."""
        q = self.w.query()
        if q == 1 and self.fr:
            self.ended()
        return q != 0

    def source_rank(self) -> int:
        """The peer of a receive (-1 otherwise): NCCL receives from a given rank only."""
        return self.peer


# --------------------------------------------------------------------------------- backend

class NcclBackend(Backend):
    """The 'cuda' device's backend object of one group (see the module docstring)."""

    transport = "nccl"

    def __init__(self, opts, cuda):
        self.rank = opts.group_rank
        self.size = opts.group_size
        self.ranks = list(opts.global_ranks_in_group)
        self.name = str(opts.group_id)
        self.timeout = opts.timeout.total_seconds()
        self.store = opts.store
        self._cuda = cuda
        self.device_id = getattr(opts, "device_id", None)
        self.check = _config.get("PYDDP_NCCL_CHECK")
        self.blocking_wait = _env_flag("TORCH_NCCL_BLOCKING_WAIT", "PYDDP_NCCL_BLOCKING_WAIT")
        self.comms = {}        # device -> NcclComm
        self.pending = {}      # NcclComm -> deque of NcclWork, oldest first
        self.lock = threading.RLock()
        self._err_lock = threading.Lock()  # self.error only: _fail never waits for self.lock
        self._failed = threading.Event()  # the first _fail has recorded and propagated the error
        self.error = None      # the first fatal error: later calls raise it
        self.seq = 0           # signature-checked operations
        self.ncomm = 0
        self.last_device = None   # the device of the last call with arrays (barrier's choice)
        self._barrier_device = None  # barrier(device_ids=[d]): d, for the next barrier only
        self._warned_device = False
        self._sig = np.zeros(_SIG, np.int64)
        self._sigs = np.zeros((self.size, _SIG), np.int64)
        # the host group (registry.host_group: backend 'cpu''s) that checks signatures, notices
        # dead peers and carries object collectives; used through its declared interface
        self.host = host_group(opts, "nccl", label=self.name, backend="nccl")
        self.round = opts.round
        host = declared(self.host)
        self._host_fast, self._host_run = host.fast, host.run
        # this backend's calls in the host group's flight-recorder ring
        self.algorithm = algorithm()
        self._fr_via = self.host.flight_via("nccl", self.transport, self.algorithm)
        self._fr_via_p2p = self.host.flight_via("nccl", self.transport, "p2p")  # send, recv
        self._fr_note, self._fr_update = self.host.flight_note, self.host.flight_update
        self._fr_id = 0  # the record of the call being checked
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"pyddp-nccl-watchdog-{self.name}",
                                          daemon=True)
        self._watchdog.start()
        parent = getattr(opts, "split_from", None)
        if parent is not None:
            for dev, c in parent.split(self.rank, self.size).items():
                self.comms[dev] = c
                self.pending[c] = collections.deque()
        if self.device_id is not None:
            self._comm(self.device_id)

    def __repr__(self):
        return f"<pyddp nccl backend of group {self.name!r} rank {self.rank} of {self.size}>"

    def explain(self, kind, dtype, count):
        """(transport, algorithm) as explain() and DETAIL's log line give them: what the flight
        records name (NCCL chooses its algorithm per call; NCCL_ALGO limits the choice)."""
        return self.transport, self.algorithm

    # -------------------------------------------------------------------- communicators
    def _where(self) -> str:
        return f"group {self.name!r} (ranks {self.ranks})"

    def _comm(self, device):
        """The communicator on ``device``, created now (collective over the group) if needed."""
        c = self.comms.get(device)
        if c is not None:
            return c
        with self.lock:
            c = self.comms.get(device)
            if c is not None:
                return c
            self.ncomm += 1
            key = f"nccl/{self.round}/uid/{self.ncomm}"
            if self.rank == 0:
                uid = _C.nccl_unique_id()
                self.store.set(key, uid)
            else:
                uid = bytes(self.store.get(key))
            try:
                c = _C.NcclComm(uid, self.size, self.rank, device, self.timeout)
            except _C.DistBackendError as e:
                raise _C.DistBackendError(self._advice(str(e), device)) from None
            deadline = _C.monotonic() + self.timeout
            r = c.wait_ready(0.05)
            while r == 7 and _C.monotonic() < deadline:
                herr = self.host.error  # a rank that died while the others wait here
                if herr is not None:
                    c.abort(herr)
                    raise _C.DistBackendError(
                        f"NCCL communicator of {self._where()} on cuda:{device}: {herr}")
                r = c.wait_ready(0.05)
            if r != 0:
                text = c.error_string(r) if r != 7 else ""
                c.abort("initialisation failed")
                if r == 7:
                    raise _C.DistBackendError(
                        f"NCCL communicator of {self._where()} on cuda:{device}: not every rank "
                        f"joined within the timeout ({self.timeout:g} s); rank {self.rank} waited")
                raise _C.DistBackendError(self._advice(
                    f"ncclCommInitRank failed on rank {self.rank} (cuda:{device}) of "
                    f"{self._where()}: NCCL error {r}: {text}", device))
            if self.rank == 0:
                # ready means every rank joined, so each has read the unique id: a group that
                # makes communicators all along does not grow the store
                try:
                    self.store.delete_key(key)
                except NotImplementedError:
                    pass  # a user's Store without delete_key (optional) keeps it
            self.comms[device] = c
            self.pending[c] = collections.deque()
            return c

    @staticmethod
    def _advice(msg, device) -> str:
        # NCCL before 2.30: "Duplicate GPU detected"; 2.30 and later: "Multiple Ranks are using the
        # same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 ..."
        if any(t in msg for t in ("Duplicate GPU", "duplicate GPU", "same GPU")):
            msg += (f"; two ranks of this communicator are on one GPU (cuda:{device}): call "
                    "pyddp.cuda.set_device(local_rank) (or torch.cuda.set_device) before the first "
                    "collective, or pass device_id to init_process_group; NCCL 2.30 and later "
                    "also allow several ranks per GPU with NCCL_MULTI_RANK_GPU_ENABLE=1")
        return msg

    def split(self, rank, size):
        """ncclCommSplit of each of this group's communicators, collective over its ranks: a
        member of the new group (``rank`` of ``size``) gets {device: NcclComm}, the others
        (rank None) take part and get {}.  Nothing when this libnccl has no ncclCommSplit."""
        out = {}
        with self.lock:
            items = list(self.comms.items())
        for dev, c in items:
            try:
                child = (c.split(0, rank, size, rank, self.timeout) if rank is not None
                         else c.split(-1, 0, 1, 0, self.timeout))  # NCCL_SPLIT_NOCOLOR
            except NotImplementedError:
                return out
            r = c.wait_ready(self.timeout)
            if child is not None:
                r = r or child.wait_ready(self.timeout)
                if r != 0:
                    child.abort("ncclCommSplit failed")
                    raise _C.DistBackendError(
                        f"ncclCommSplit of {self._where()} on cuda:{dev} failed: NCCL error {r}: "
                        f"{c.error_string(r) if r != 7 else 'not every rank joined in time'}")
                out[dev] = child
        return out

    def _device_of(self, views, name):
        first = None
        for v in views:
            if first is None:
                first = v
            elif v.index != first.index:
                raise ValueError(f"{name}: {_argname(v)} is on cuda:{v.index} but "
                                 f"{_argname(first)} is on cuda:{first.index}: all arrays of one "
                                 "call must be on one device")
        if first is None:
            return self._arrayless_device(name)
        if self.device_id is not None and first.index != self.device_id:
            raise ValueError(f"{name}: {_argname(first)} is on cuda:{first.index} but group "
                             f"{self.name!r} uses cuda:{self.device_id} (its device_id)")
        return first.index

    def _arrayless_device(self, name):
        """The device of a call without arrays (barrier), as torch's ProcessGroupNCCL chooses it:
        barrier(device_ids=[d]), the bound device (device_id), the device of this group's last
        call, else the current one (said once: every rank on cuda:0 when no script set one)."""
        dev, self._barrier_device = self._barrier_device, None
        if dev is None:
            dev = self.device_id if self.device_id is not None else self.last_device
        if dev is None:
            dev = _C.cuda_get_device()
            if not self._warned_device and self.rank == 0:
                self._warned_device = True
                warnings.warn(f"{name}(): using the current device (cuda:{dev}) of each rank: no "
                              "device is bound and the group has not been used yet. Give "
                              "device_id to init_process_group, call pyddp.cuda.set_device, or "
                              "pass device_ids to barrier.", stacklevel=4)
        return dev

    def set_barrier_device(self, device):
        """barrier(device_ids=[device]): the next barrier runs on ``device``."""
        self._barrier_device = int(device)

    # ------------------------------------------------------------------------- failures
    def _fail(self, msg, status=None):
        """Record ``msg`` as the group's error and abort every communicator.  Never takes
        self.lock: a launch holds it while NCCL is connecting, and the abort is what ends that
        wait (NcclComm.abort sets its flag before it takes any lock).  ``status`` (_C.ST_*: a
        timeout, a mismatch): what this backend's open flight records fail with (else a
        backend error)."""
        with self._err_lock:
            first = self.error is None
            if first:
                self.error = msg
        for c in list(self.comms.values()):
            c.abort(msg)
        if not first:
            # another thread (the watchdog, or a caller's blocking wait timing out at the same
            # moment) is failing the group: return once it has written the records and told
            # the peers, so that an exception raised from here never lets the process exit
            # before its ring is on disk.  Bounded: that thread never waits for this one, but
            # a hang here would be worse than a missing file.
            self._failed.wait(max(10.0, 2 * self.timeout))
            return
        try:
            host = self.host
            if host is not None:
                if status is not None:
                    self._fail_records(status)
                # the peers learn it at once through the host group (whatever the signature
                # check does, torch's TORCH_NCCL_PROPAGATE_ERROR): a peer waiting in NCCL for
                # this rank is aborted by its watchdog instead of waiting out its own timeout.
                # The host group's failure also fails this backend's open records and writes
                # its ring (PYDDP_FLIGHT_RECORDER_DIR).
                host.fail(msg)
        finally:
            self._failed.set()

    def _fail_records(self, status):
        """Fail the flight records of the calls still pending (before the host group's failure
        fails the rest as backend errors)."""
        for pend in list(self.pending.values()):
            for work in list(pend):
                fr, work.fr = work.fr, 0
                for i in (fr if type(fr) is tuple else (fr,) if fr else ()):
                    self._fr_update(i, _FR_FAILED, status)

    def _timeout_message(self, work) -> str:
        return (f"Watchdog caught collective operation timeout: {work.desc} on {self._where()}, "
                f"rank {self.rank}, ran for {_C.monotonic() - work.w.t0:.3g} s (timeout "
                f"{self.timeout:g} s); a rank did not reach it, died or is stuck")

    def _watch(self):
        interval = _config.get("PYDDP_NCCL_WATCHDOG_INTERVAL")
        while not self._stop.wait(interval):
            try:
                self._poll()
            except Exception as e:  # noqa: BLE001 - the watchdog must keep watching
                self._fail(f"NCCL watchdog of {self._where()} failed: {e!r}")

    def _poll(self):
        if self.error is not None:
            return
        herr = self.host.error if self.host is not None else None
        if herr is not None:
            self._fail(f"NCCL backend of {self._where()}, rank {self.rank}: {herr}")
            return
        now = _C.monotonic()
        for c, pend in list(self.pending.items()):
            r = c.async_error()
            if r not in (0, 7):
                self._fail(f"NCCL communicator of {self._where()} on cuda:{c.device}, rank "
                           f"{self.rank}, reported an asynchronous error: NCCL error {r}: "
                           f"{c.error_string(r)}")
                return
            while pend and pend[0].w.query() == 1:  # a failed work keeps its arrays (destroy)
                work = pend.popleft()
                if work.fr:
                    work.ended()
            if pend and now - pend[0].w.t0 > self.timeout:
                self._fail(self._timeout_message(pend[0]), _C.ST_TIMEOUT)
                return

    def _raise_if_failed(self):
        if self.error is not None:
            raise _C.DistBackendError(self.error)

    # ---------------------------------------------------------------- signature check
    def _check(self, kind, dtype, op, root, count, name):
        """Compare this call's signature with every rank's before NCCL sees it."""
        self.seq += 1
        sig, sigs = self._sig, self._sigs
        sig[:] = (self.seq, kind, dtype, op, root, count, 0, 0)
        try:
            fast = self._host_fast
            if fast is None or not fast(_K_ALLGATHER, sigs, 0, sig):
                self._host_run(Request(_K_ALLGATHER, _C.DTYPE_CODES["int64"], 0, 0, 0, _SIG,
                                       (sig,), (sigs,), None, None, self.timeout, False,
                                       f"{name} (signature check)", True))
        except _C.DistError as e:
            msg = f"{name} (#{self.seq}) on {self._where()}, rank {self.rank}: {e}"
            self._fr_update(self._fr_id, _FR_FAILED, _C.ST_NETWORK
                            if isinstance(e, _C.DistNetworkError) else _C.ST_BACKEND)
            self._fail(msg)
            raise _C.DistBackendError(msg) from None
        if (sigs != sig).any():
            rows = [f"rank {self.ranks[r]} called {_describe(sigs[r])} as operation "
                    f"#{int(sigs[r][0])}" for r in range(self.size)]
            msg = (f"mismatched collectives on {self._where()}: " + "; ".join(rows) +
                   " (every rank must call the same collectives in the same order, with the "
                   "same counts, dtypes, ops and roots)")
            self._fr_update(self._fr_id, _FR_FAILED, _C.ST_MISMATCH)
            self._fail(msg)
            raise _C.DistBackendError(msg)

    # ------------------------------------------------------------------------ run
    def run(self, request):
        (kind, dtype, op, root, _tag, count, inputs, outputs, in_splits, out_splits, _timeout,
         _wait_all, name, blocking) = request
        self._raise_if_failed()
        views = (*inputs, *outputs)
        dev = self._device_of(views, name)
        comm = self.comms.get(dev) or self._comm(dev)
        if views:
            self.last_device = dev
            stream_fn = _stream_family(views[0])
        else:
            # torch's barrier: after the work the caller queued on its current stream (the host
            # then waits for the barrier's end)
            stream = _current_stream(dev)
            stream_fn = lambda: stream  # noqa: E731
        if kind == _K_ALLTOALL:
            if in_splits is None:
                in_splits = tuple(v.nbytes for v in inputs)
            if out_splits is None:
                out_splits = tuple(v.nbytes for v in outputs)
        ustream = stream_fn()
        # A blocking call's Work.wait() is the caller's stream waiting for the end: done in the
        # launch itself, and no Work is returned (the pending list keeps the arrays alive)
        inline = blocking and ustream >= 0 and not self.blocking_wait and kind != _K_BARRIER
        p2p = kind == _K_SEND or kind == _K_RECV
        with self.lock:  # one call at a time: the signature buffers, and the same order on NCCL
            # its flight record (the host group's ring): enqueued now, started once on the stream
            nbytes = sum(in_splits) if in_splits is not None else count * _SIZES.get(dtype, 1)
            fid = self._fr_id = self._fr_note(self._fr_via_p2p if p2p else self._fr_via, kind,
                                              dtype, op, root, count, nbytes, name, not p2p)
            if self.check and self.size > 1 and not p2p:
                self._check(kind, dtype, op, root, count, name)
            try:
                w = comm.run(kind, dtype, op, root, count, tuple(v.ptr for v in inputs),
                             tuple(v.ptr for v in outputs), in_splits, out_splits, ustream,
                             (inputs, outputs), inline)
            except _C.DistBackendError as e:
                self._fr_update(fid, _FR_FAILED)
                self._raise_if_failed()
                # NCCL failed the call (its communicator is broken): the group's error, told
                # to the peers now rather than at the watchdog's next look
                self._fail(str(e))
                raise
            self._fr_update(fid, _FR_STARTED)
        work = NcclWork(self, comm, w, (name, count, dtype), stream_fn,
                        root if kind == _K_RECV else -1, fid)
        self.pending[comm].append(work)
        if inline:
            return None
        if kind == _K_BARRIER:  # torch's NCCL barrier blocks the host until it is done
            work.synchronize_host(self.timeout)
        return work

    def batch_p2p(self, ops, name="batch_isend_irecv"):
        """One NCCL group of sends and receives: ops = [(is_send, view, peer)]; one work each."""
        self._raise_if_failed()
        views = tuple(v for _, v, _ in ops)
        dev = self._device_of(views, name)
        comm = self.comms.get(dev) or self._comm(dev)
        self.last_device = dev
        stream_fn = _stream_family(views[0])
        with self.lock:  # as run: one call into NCCL at a time, in the order of the calls
            # a flight record per operation (send/recv, the peer as root), one work for all
            fids = tuple(self._fr_note(self._fr_via_p2p, _K_SEND if s else _K_RECV, v.code, 0, p,
                                       v.nbytes // max(_SIZES.get(v.code, 1), 1), v.nbytes,
                                       name, False) for s, v, p in ops)
            try:
                w = comm.run_p2p(tuple((bool(s), v.ptr, v.nbytes, p) for s, v, p in ops),
                                 stream_fn(), views)
            except _C.DistBackendError:
                for i in fids:
                    self._fr_update(i, _FR_FAILED)
                raise
            for i in fids:
                self._fr_update(i, _FR_STARTED)
        work = NcclWork(self, comm, w, (f"{name} ({len(ops)} operations)", None, None), stream_fn,
                        -1, fids)
        self.pending[comm].append(work)
        return work

    # ----------------------------------------------------------------------- shutdown
    def destroy(self):
        """Let running work finish (bounded: a few seconds), then destroy each communicator, or
        abort it when it is still busy or broken; never hangs."""
        deadline = _C.monotonic() + min(self.timeout, 5.0)
        if self.error is None:
            for pend in list(self.pending.values()):
                if pend:
                    pend[-1].w.synchronize(max(0.0, deadline - _C.monotonic()))
        self._stop.set()
        if self._watchdog.is_alive() and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)
        with self.lock:
            comms, self.comms = list(self.comms.values()), {}
            pending, self.pending = self.pending, {}
        for c in comms:
            c.destroy(min(self.timeout, 10.0))
        # Only now, after ncclCommDestroy/ncclCommAbort returned, may the arrays of the works
        # still queued go: the ones whose stream has not gone past them yet stay alive with
        # the process (a caching allocator would hand memory that NCCL kernels still touch to
        # someone else).
        for pend in pending.values():
            _PARKED.extend(pend)
        _PARKED[:] = [work for work in _PARKED if work.w.query() != 1 and work.w.holds_arrays]
        host, self.host = self.host, None
        if host is not None:
            host.destroy()


def create(opts):
    """The factory registered for backend 'nccl'."""
    from ....cuda import _runtime as cuda

    cuda._lib.load_nccl()  # raises with every place it looked
    why = cuda._why_unavailable()
    if why is not None:
        raise RuntimeError(f"backend 'nccl' needs a CUDA device, but none is usable ({why}); "
                           "use backend='gloo' (or 'cpu') on a machine without a GPU")
    return NcclBackend(opts, cuda)
