"""Backend "mpi", its implementation (imported at the first group; the package registers it):
pyddp's collectives through the site's MPI, by way of mpi4py (the
interface every backend object has: pyddp.distributed.backends.interface).

mpi4py (the ``mpi`` extra) is imported the first time the backend is used, never by
``import pyddp``; it finds the site's MPI and handles Open MPI's and MPICH's different ABIs.
MPI is initialised with MPI_THREAD_MULTIPLE (the level mpi4py asks for by default) unless the
program imported mpi4py.MPI first: pyddp may wait on a Work from another thread than the one that
started it.  ``init_process_group("mpi")`` takes the rank and world size from MPI_COMM_WORLD (no
MASTER_ADDR, no store), as torch's.

One backend object per process group and rank.  It holds three duplicates of the group's
communicator, each with MPI_ERRORS_RETURN (an MPI error raises DistBackendError carrying MPI's own
error string; the job is never aborted from inside a call): ``coll`` for the collectives,
``p2p`` for send/recv (user tags), ``aux`` for the signature check, monitored_barrier and the
point-to-point halves of the list collectives.

Arrays go to MPI without copies: NumPy arrays and CPU torch tensors (as NumPy views) are handed to
mpi4py's buffer-based calls.  The list forms (``all_gather`` into a list, ``gather``, ``scatter``,
``all_to_all``, ``reduce_scatter`` of a list) move each array with its own message (or one
MPI_Reduce per destination) instead of packing them into one contiguous buffer.  MPI has no
float16 or bfloat16 type: their reductions run on float32 copies (rounded once at the end, as
pyddp's CPU backend accumulates them); data movement of any dtype is bytes.  CUDA arrays go
straight to MPI when it is CUDA-aware (MPIX_Query_cuda_support, or PYDDP_MPI_CUDA_AWARE=0/1) and
are staged through pinned host memory otherwise.

Mismatch detection: before each collective every rank's signature (sequence number, kind, dtype,
op, root, count) is compared by a MIN of the fields and of their negations, reduced by
dissemination (ceil(log2 n) rounds of nonblocking point-to-point messages on ``aux``; half the
time of Open MPI's MPI_Iallreduce for two ranks) and polled against the group's timeout.  A
mismatch raises DistBackendError on every rank, naming each rank's call, before the data moves; a
rank that never arrives raises a timeout instead of a hang.  The check costs that exchange per
collective (about 0.5 us between two ranks of a host, polled from C);
``PYDDP_MPI_CHECK=0`` turns it off (and with it the timeout of blocking collectives).  With the
check on, an ``async_op=True`` collective returns once every rank has reached it; its data then
moves in the background.
Async collectives (``async_op=True``) use MPI's nonblocking calls; ``Work.wait`` polls them
against its timeout.

Flight recorder: the backend keeps a ring of its own (``_C.FlightRecorder``; there is no host
group) where every call is recorded as a 'cpu' group's are: backend "mpi", transport "mpi",
algorithm "auto" (MPI's own tuning chooses; "p2p" for send and receive), enqueued before the
signature check, started when it passed, completed when MPI completed it (the call returned, or
its requests did), failed when the group failed, whose ring is then written to
PYDDP_FLIGHT_RECORDER_DIR; the timeline shows the same calls.

From C: the signature check and the small blocking collectives (all_reduce in place, broadcast,
barrier on C-contiguous CPU arrays of a type MPI reduces natively) call MPI from pyddp's C core
(``_C.MpiComm``: csrc/python/mpi.c over csrc/mpi/) on the library mpi4py loaded and the handles mpi4py gives:
mpi4py's own argument handling costs more than a small MPI call, and the check polled from Python
cost about 30 us.  ``PYDDP_MPI_FROM_C=0`` leaves every call to mpi4py.
"""
from __future__ import annotations

import secrets
import threading

import numpy as np

from .... import _C, _config
from ... import _observe
from ..._observe import describe_signature as _describe
from .. import staging as _staging
from ..interface import Backend
from . import library as _lib
from .kinds import Kinds
from .library import _FAST, _fast_ops, cuda_aware, load
from .work import MpiWork, _poll
from .library import (
    _K, _K_BROADCAST, _K_ALLREDUCE, _K_ALLGATHER, _K_REDUCE_SCATTER, _K_BARRIER, _K_MONITORED,
    _K_SEND, _K_RECV, _KIND_NAMES, _DTYPE_NAMES, _F16, _BF16, _AVG, _SIGN, _TAG_CHECK,
    _ST_MPI_ERROR, _ST_TIMEOUT, _ST_MISMATCH, _ST_CALL_ERROR)


# --------------------------------------------------------------------------------- backend

_FR_STARTED, _FR_COMPLETED, _FR_FAILED = _C.FR_STARTED, _C.FR_COMPLETED, _C.FR_FAILED
_SIZES = {code: _C.DTYPE_SIZES[name] for name, code in _C.DTYPE_CODES.items()}
_NOT_CHECKED = (_K_SEND, _K_RECV, _K_MONITORED)  # no sequence number (as the check's)


def _fr_status(status):
    """The flight record's status of a failed check (MpiComm.check's outcome)."""
    return {_ST_TIMEOUT: _C.ST_TIMEOUT, _ST_MISMATCH: _C.ST_MISMATCH}.get(status, _C.ST_BACKEND)


class MpiBackend(Kinds, Backend):
    """The backend object of one group on MPI (see the module docstring)."""

    transport = "mpi"
    algorithm = "auto"  # MPI's own tuning chooses per call

    def __init__(self, opts):
        mpi = load()
        self.types, self.ops, self.bool_ops, self.units, self.widen = _lib._tables
        self.rank = opts.group_rank
        self.size = opts.group_size
        self.ranks = list(opts.global_ranks_in_group)
        self.name = str(opts.group_id)
        self.timeout = opts.timeout.total_seconds()
        self.check = _config.get("PYDDP_MPI_CHECK")
        self.error = None
        self.seq = 0
        self.lock = threading.RLock()
        self._failed = threading.Event()  # the first _fail has written the records
        world = mpi.COMM_WORLD
        wr, wn = world.Get_rank(), world.Get_size()
        me = self.ranks[self.rank]
        if me != wr or max(self.ranks) >= wn:
            raise ValueError(
                f"backend 'mpi': pyddp rank {me} is MPI_COMM_WORLD rank {wr} of {wn}; the ranks "
                "of a job on backend 'mpi' must be MPI's (start it with mpirun/mpiexec/srun and "
                "let init_process_group take them from MPI)")
        if self.ranks == list(range(wn)):
            base = world
        else:  # new_group: collective over the members only (MPI_Comm_create_group)
            grp = world.Get_group().Incl(self.ranks)
            try:
                base = world.Create_group(grp, tag=0)
            except mpi.Exception as e:
                raise _C.DistBackendError(self._mpi_message(e, "new_group")) from None
            finally:
                grp.Free()
        try:
            self.coll = base.Dup()
            self.p2p = base.Dup()
            self.aux = base.Dup()
        except mpi.Exception as e:
            raise _C.DistBackendError(self._mpi_message(e, "MPI_Comm_dup")) from None
        finally:
            if base is not world:
                base.Free()
        for c in (self.coll, self.p2p, self.aux):
            c.Set_errhandler(mpi.ERRORS_RETURN)
        # the flight recorder (see the module docstring): its file's group id is rank 0's
        self.recorder = _C.FlightRecorder(self.transport)
        rec = self.recorder
        self._fr_via = rec.flight_via("mpi", self.transport, self.algorithm)
        self._fr_via_p2p = rec.flight_via("mpi", self.transport, "p2p")
        self._fr_note, self._fr_update = rec.flight_note, rec.flight_update
        token = self.aux.bcast(secrets.randbits(63) if self.rank == 0 else None, root=0)
        _observe.attach(rec, self.name, self.rank, self.size, token, "mpi",
                        "MPI_COMM_WORLD" if base is world else "MPI_Comm_create_group")
        self.fast_ops = _fast_ops(self.ops, self.bool_ops, self.widen)
        self._sig = np.zeros(2 * _SIGN, np.int64)
        self._sigr = np.zeros(2 * _SIGN, np.int64)
        self._sigp = np.zeros(2 * _SIGN, np.int64)
        self._left_to_mpi = []  # buffers of abandoned checks: MPI may still write them
        self._cuda = None
        self._mc = None
        if _config.get("PYDDP_MPI_FROM_C"):
            self._mc = self._c_comm(mpi)
            if self._mc is not None:  # one C call per small collective (see MpiComm)
                self.fast = self._mc.fast

    def _c_comm(self, mpi):
        """The C side of this group (_C.MpiComm: the check and the small blocking
        collectives called from C), or None where it cannot be made (then mpi4py does all)."""
        types = {code: t.handle for code, t in self.types.items()
                 if code not in (_F16, _BF16)}
        ops = {(code, int(op)): m.handle for (code, op), m in self.fast_ops.items()}
        try:
            return _C.MpiComm(
                handle_size=mpi._sizeof(mpi.Comm), coll=self.coll.handle, aux=self.aux.handle,
                in_place=int(mpi.IN_PLACE), sig_type=mpi.INT64_T.handle, types=types, ops=ops,
                rank=self.rank, size=self.size, check=self.check, timeout=self.timeout,
                fallback=self._py_fast, on_failure=self._fast_failed, recorder=self.recorder,
                via=self._fr_via)
        except (_C.DistError, TypeError, ValueError, AttributeError) as e:
            import warnings

            warnings.warn(f"backend 'mpi': calling MPI from pyddp's C core is not possible here "
                          f"({e}); every call goes through mpi4py", RuntimeWarning, stacklevel=2)
            return None

    def __repr__(self):
        return f"<pyddp mpi backend of group {self.name!r} rank {self.rank} of {self.size}>"

    def explain(self, kind, dtype, count):
        """(transport, algorithm) as explain() and DETAIL's log line give them: what the flight
        records name (MPI chooses its algorithm per call)."""
        return self.transport, self.algorithm

    def _where(self) -> str:
        return f"group {self.name!r} (ranks {self.ranks})"

    @staticmethod
    def _error_text(e) -> str:
        try:
            return e.Get_error_string()
        except Exception:  # noqa: BLE001
            return str(e)

    def _mpi_message(self, e, what) -> str:
        return f"{what} on {self._where()}, rank {self.rank}: MPI error: {self._error_text(e)}"

    def _fail(self, msg, status=None):
        """The group failed: later calls raise ``msg``; the calls still open in the flight
        recorder fail with ``status`` (_C.ST_*; default: a backend error) and its ring is written
        to PYDDP_FLIGHT_RECORDER_DIR (once)."""
        with self.lock:
            first = self.error is None
            if first:
                self.error = msg
            mc = getattr(self, "_mc", None)
            if mc is not None:
                mc.set_failed()
        if not first:
            # another thread is failing the group: return once its records are written, so
            # that the error raised from here never lets the process exit before the ring is
            # on disk (bounded: a hang would be worse than a missing file)
            self._failed.wait(max(10.0, 2 * self.timeout))
            return
        try:
            rec = getattr(self, "recorder", None)
            if rec is not None:
                rec.fail(_C.ST_BACKEND if status is None else status, f"group failed: {msg}")
        finally:
            self._failed.set()

    # ---------------------------------------------------------------- signature check
    def _check(self, kind, dtype, op, root, count, name, timeout):
        """Compare this call's signature with every rank's (see the module docstring)."""
        t = timeout if timeout > 0 else self.timeout
        mc = self._mc
        if mc is not None:  # polled from C: about 0.5 us between two ranks of a host
            st, text = mc.check(kind, dtype, int(op), int(root), int(count), t)
            if st:
                self._check_failed(name, st, text, t, np.frombuffer(mc.sig, np.int64), mc.seq)
            return
        self.seq += 1
        sig, out, peer = self._sig, self._sigr, self._sigp
        sig[0], sig[1], sig[2], sig[3], sig[4], sig[5] = self.seq, kind, dtype, op, root, count
        np.negative(sig[:_SIGN], out=sig[_SIGN:])
        # the dissemination MIN of MpiComm.check (the same messages: ranks may mix both)
        np.copyto(out, sig)
        deadline = _C.monotonic() + t
        n, d = self.size, 1
        while d < n:
            status, text = _ST_TIMEOUT, ""
            try:
                reqs = [self.aux.Irecv(peer, (self.rank - d) % n, _TAG_CHECK),
                        self.aux.Isend(out, (self.rank + d) % n, _TAG_CHECK)]
                ok = _poll(lambda: _lib.MPI.Request.Testall(reqs), deadline)
            except _lib.MPI.Exception as e:
                ok, status, text = False, _ST_MPI_ERROR, self._error_text(e)
            if not ok:  # a request may still be MPI's: so are its buffers
                self._left_to_mpi.append((sig, out, peer))
                self._sig, self._sigr, self._sigp = (np.zeros_like(sig), np.zeros_like(out),
                                                     np.zeros_like(peer))
                self._check_failed(name, status, text, t, sig, self.seq)
            np.minimum(out, peer, out=out)
            d *= 2
        if (out[:_SIGN] != -out[_SIGN:]).any():
            self._check_failed(name, _ST_MISMATCH, "", t, sig, self.seq)

    def _check_failed(self, name, status, text, t, sig, seq):
        """Raise the DistBackendError of a failed signature check (status as MpiComm.check's)
        and mark the group failed."""
        if status == _ST_MPI_ERROR:
            msg = (f"{name} (#{seq}, signature check) on {self._where()}, rank {self.rank}: "
                   f"MPI error: {text}")
        elif status == _ST_TIMEOUT:
            msg = (f"Watchdog caught collective operation timeout: {name} (#{seq}) on "
                   f"{self._where()}, rank {self.rank}, waited {t:g} s for the other ranks; a "
                   "rank did not reach it, died or is stuck")
        else:
            sig = np.array(sig, np.int64)
            sigs = np.zeros((self.size, 2 * _SIGN), np.int64)
            try:
                req = self.aux.Iallgather(sig, sigs)
                gathered = _poll(req.Test, _C.monotonic() + t)
            except _lib.MPI.Exception:
                gathered = False
            if gathered:
                rows = "; ".join(f"rank {self.ranks[r]} called {_describe(sigs[r])} as operation "
                                 f"#{int(sigs[r][0])}" for r in range(self.size))
            else:
                rows = f"rank {self.ranks[self.rank]} called {_describe(sig)}"
            msg = (f"mismatched collectives on {self._where()}: {rows} (every rank must call "
                   "the same collectives in the same order, with the same counts, dtypes, ops "
                   "and roots)")
        self._fail(msg, _fr_status(status))
        raise _C.DistBackendError(msg)

    def _fast_failed(self, what, status, text):
        """MpiComm.fast's failures (its on_failure): raise as the Python path would."""
        if status == _ST_CALL_ERROR:
            msg = f"{what} on {self._where()}, rank {self.rank}: MPI error: {text}"
            self._fail(msg)
            raise _C.DistBackendError(msg)
        mc = self._mc
        self._check_failed(what, status, text, self.timeout, np.frombuffer(mc.sig, np.int64),
                           mc.seq)

    # ------------------------------------------------------------------------- arrays
    def _host(self, arrays, name, writable, direct):
        """Arrays MPI can take for ``arrays`` (ndarrays or CUDA ArrayViews) and the copy-back
        to run after the operation (None when nothing was staged): a CUDA array's own memory
        when the MPI is CUDA-aware and ``direct`` (no host code reads it), else a pinned host
        copy."""
        if self._cuda is None:
            self._cuda = cuda_aware()
        out = []
        staged = []
        for a in arrays:
            if isinstance(a, np.ndarray):
                out.append(a)
            elif self._cuda and direct:  # the device pointer itself: the MPI reads and writes GPU memory
                buf = _lib.MPI.buffer.fromaddress(a.ptr, a.nbytes, readonly=False)
                out.append(np.frombuffer(buf, np.uint8).view(
                    np.uint16 if a.code == _BF16 else _DTYPE_NAMES[a.code]).reshape(a.shape))
            else:
                s = _staging.stage(a, getattr(a, "name", None) or name, writable)
                out.append(s)
                staged.append(s)
        after = None
        if staged and writable:
            after = _staging.copy_back_fn(staged)
        return tuple(out), after

    # --------------------------------------------------------------------- fast path
    def _py_fast(self, kind, array, arg, inp=None, root=0):
        """A small blocking collective of the default group on plain NumPy arrays, in fewer
        steps (pyddp's ``fast`` protocol); False (nothing done) for anything else, which then
        takes the checked general path.  The signature checked is the general path's, so ranks
        may mix both."""
        if type(array) is not np.ndarray or self.error is not None:
            return kind == _K_BARRIER and array is None and self.error is None and self._barrier()
        f = _FAST.get(array.dtype)
        if f is None:
            return False
        fl = array.flags
        if not (fl.c_contiguous and fl.writeable):
            return False
        code, t = f
        if kind == _K_ALLREDUCE:
            try:
                mop = self.fast_ops.get((code, arg))
            except TypeError:  # an unhashable op: the general path names the error
                return False
            if mop is None:
                return False
            return self._fast_call(kind, code, int(arg), 0, array.size, "all_reduce",
                                   lambda: self.coll.Allreduce(_lib.MPI.IN_PLACE, [array, t], mop))
        if kind == _K_BROADCAST:
            if type(arg) is not int or not 0 <= arg < self.size:
                return False
            return self._fast_call(kind, code, 0, arg, array.size, "broadcast",
                                   lambda: self.coll.Bcast([array, t], arg))
        if kind == _K_ALLGATHER or kind == _K_REDUCE_SCATTER:  # the *_tensor forms
            if type(inp) is not np.ndarray or inp.dtype != array.dtype or \
                    not inp.flags.c_contiguous or np.may_share_memory(inp, array):
                return False
            if kind == _K_ALLGATHER:
                if array.size != inp.size * self.size:
                    return False
                sig, name, mop = (0, inp.size), "all_gather_into_tensor", None
            else:
                if inp.size != array.size * self.size:
                    return False
                try:
                    mop = self.fast_ops.get((code, arg))
                except TypeError:
                    return False
                if mop is None:
                    return False
                sig, name = (int(arg), array.size), "reduce_scatter_tensor"
            if mop is None:
                def call():
                    self.coll.Allgather([inp, t], [array, t])
            else:
                def call():
                    c = array.size
                    self.coll.Reduce_scatter_block([inp, c, t], [array, c, t], mop)
            return self._fast_call(kind, code, sig[0], 0, sig[1], name, call)
        return False

    fast = _py_fast  # an instance's MpiComm.fast replaces it (see __init__)

    def _barrier(self):
        return self._fast_call(_K_BARRIER, 0, 0, 0, 0, "barrier", lambda: self.coll.Barrier())

    def _fast_call(self, kind, code, op, root, count, name, call):
        """One blocking collective of the fast path: its flight record, the check, ``call()``;
        True."""
        with self.lock:
            fid = self._fr_note(self._fr_via, kind, code, op, root, count,
                                count * _SIZES.get(code, 1), name, True)
            try:
                if self.check and self.size > 1:
                    self._check(kind, code, op, root, count, name, 0.0)
                self._fr_update(fid, _FR_STARTED)
                call()
            except _lib.MPI.Exception as e:
                self._fr_update(fid, _FR_FAILED, _C.ST_BACKEND)
                raise _C.DistBackendError(self._mpi_message(e, name)) from None
            except BaseException:
                self._fr_update(fid, _FR_FAILED, _C.ST_BACKEND)  # (a failed check: its status)
                raise
            self._fr_update(fid, _FR_COMPLETED)
        return True

    # ------------------------------------------------------------------------ run
    def run(self, request):
        (kind, dtype, op, root, tag, count, inputs, outputs, in_splits, out_splits, timeout,
         wait_all, name, blocking) = request
        if self.error is not None:
            raise _C.DistBackendError(self.error)
        if not (all(type(a) is np.ndarray for a in inputs) and
                all(type(a) is np.ndarray for a in outputs)):
            # device arrays: straight to a CUDA-aware MPI when no host code touches them
            direct = (len(inputs) <= 1 and len(outputs) <= 1 and op != _AVG and
                      not (dtype in (_F16, _BF16) and _K[_KIND_NAMES[kind]]["reduces"]))
            inputs, _ = self._host(inputs, name, False, direct)
            outputs, back = self._host(outputs, name, True, direct)
        else:
            back = None
        coll = kind not in _NOT_CHECKED
        nbytes = sum(in_splits) if in_splits is not None else count * _SIZES.get(dtype, 1)
        with self.lock:
            # its flight record: enqueued now, started once the check passed
            fid = self._fr_note(self._fr_via_p2p if kind == _K_SEND or kind == _K_RECV
                                else self._fr_via, kind, dtype, int(op), root, count, nbytes,
                                name, coll)
            try:
                if self.check and self.size > 1 and coll:
                    self._check(kind, dtype, op, root, count, name, timeout)
                self._fr_update(fid, _FR_STARTED)
                w = self._run(kind, dtype, op, root, tag, count, inputs, outputs, in_splits,
                              out_splits, timeout, wait_all, name, blocking, back)
            except _lib.MPI.Exception as e:
                self._fr_update(fid, _FR_FAILED, _C.ST_BACKEND)
                raise _C.DistBackendError(self._mpi_message(e, name)) from None
            except BaseException:
                self._fr_update(fid, _FR_FAILED, _C.ST_BACKEND)  # (a failed check: its status)
                raise
            if w is None:  # ran to completion (a blocking call)
                self._fr_update(fid, _FR_COMPLETED)
            else:
                w.fr = fid
            return w

    def _done(self, reqs, after, what, keep, blocking, status=None, peer=-1):
        work = MpiWork(self, reqs, after, what, keep, status, peer)
        if blocking:
            work.wait()
            return None
        return work

    # ----------------------------------------------------------------------- shutdown
    def destroy(self):
        """Free the communicators (never collective: MPI_Comm_free is local)."""
        mc = getattr(self, "_mc", None)
        if mc is not None:  # its handles are about to dangle: no more calls from C
            mc.set_failed()
        for attr in ("coll", "p2p", "aux"):
            c = getattr(self, attr, None)
            setattr(self, attr, None)
            if c is not None and _lib.MPI is not None and not _lib.MPI.Is_finalized():
                try:
                    c.Free()
                except _lib.MPI.Exception:
                    pass


def create(opts):
    """The factory registered for backend 'mpi'."""
    load()
    return MpiBackend(opts)
