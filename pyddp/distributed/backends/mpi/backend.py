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

From C: the signature check and the small blocking collectives (all_reduce in place, broadcast,
barrier on C-contiguous CPU arrays of a type MPI reduces natively) call MPI from pyddp's C core
(``_C.MpiComm``: csrc/python/mpi.c over csrc/mpi/) on the library mpi4py loaded and the handles mpi4py gives:
mpi4py's own argument handling costs more than a small MPI call, and the check polled from Python
cost about 30 us.  ``PYDDP_MPI_FROM_C=0`` leaves every call to mpi4py.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from .... import _C, _config
from ..._observe import describe_signature as _describe
from .. import staging as _staging
from ..interface import Backend
from ._probe import INSTALL_HINT, reason

_K = _C.KINDS
_K_BROADCAST, _K_ALLREDUCE, _K_REDUCE = _C.K_BROADCAST, _C.K_ALLREDUCE, _K["reduce"]["code"]
_K_ALLGATHER, _K_GATHER, _K_SCATTER = _C.K_ALLGATHER, _K["gather"]["code"], _K["scatter"]["code"]
_K_REDUCE_SCATTER, _K_ALLTOALL, _K_BARRIER = _C.K_REDUCE_SCATTER, _C.K_ALLTOALL, _C.K_BARRIER
_K_MONITORED, _K_SEND, _K_RECV = _K["monitored_barrier"]["code"], _C.K_SEND, _C.K_RECV
_KIND_NAMES = {v["code"]: k for k, v in _K.items()}
_DTYPE_NAMES = {v: k for k, v in _C.DTYPE_CODES.items()}
_OP_NAMES = {v: k for k, v in _C.REDUCE_OPS.items()}
_D = _C.DTYPE_CODES
_F16, _BF16 = _D["float16"], _D["bfloat16"]
_BOOL = _D["bool"]
_AVG, _SUM = _C.REDUCE_OPS["AVG"], _C.REDUCE_OPS["SUM"]
_SIGN = 6  # signature fields: seq, kind, dtype, op, root, count
_TAG_LIST = 7  # tag of the list collectives' messages on aux
_TAG_MON, _TAG_MON_OK = 8, 9  # monitored_barrier's arrival and release
_TAG_CHECK = 11  # the signature check's messages (csrc/mpi/check.c: SIG_TAG)
_INT_MAX = 2 ** 31 - 1
# MpiComm.check's outcomes (and MpiComm.fast's failures: _ST_CALL_ERROR, the collective's own call)
_ST_MPI_ERROR, _ST_TIMEOUT, _ST_MISMATCH, _ST_CALL_ERROR = 1, 2, 3, 5

MPI = None  # mpi4py.MPI once loaded
_tables = None
_lock = threading.Lock()
_cuda_aware = None


def load():
    """mpi4py.MPI, imported (MPI initialised) on first use."""
    global MPI, _tables
    if MPI is not None:
        return MPI
    with _lock:
        if MPI is not None:
            return MPI
        try:
            import mpi4py
        except ImportError:
            raise RuntimeError(reason()) from None
        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.thread_level = "multiple"  # works only before mpi4py.MPI is imported
            mpi4py.rc.errors = "exception"
        try:
            from mpi4py import MPI as mpi
        except ImportError as e:  # mpi4py built against an MPI that is not here any more
            raise RuntimeError(f"backend 'mpi': mpi4py is installed but cannot load MPI ({e}); "
                               f"{INSTALL_HINT}") from None
        if not mpi.Is_initialized():
            mpi.Init_thread(mpi.THREAD_MULTIPLE)
        _tables = _make_tables(mpi) + (_saturating_sums(mpi),)
        MPI = mpi
    return MPI


def _make_tables(mpi):
    types = {_D["bool"]: mpi.C_BOOL, _D["int8"]: mpi.INT8_T, _D["uint8"]: mpi.UINT8_T,
             _D["int16"]: mpi.INT16_T, _D["uint16"]: mpi.UINT16_T, _D["int32"]: mpi.INT32_T,
             _D["uint32"]: mpi.UINT32_T, _D["int64"]: mpi.INT64_T, _D["uint64"]: mpi.UINT64_T,
             _D["float16"]: mpi.FLOAT, _D["bfloat16"]: mpi.FLOAT,  # reduced as float32 copies
             _D["float32"]: mpi.FLOAT, _D["float64"]: mpi.DOUBLE,
             _D["complex64"]: mpi.C_FLOAT_COMPLEX, _D["complex128"]: mpi.C_DOUBLE_COMPLEX}
    R = _C.REDUCE_OPS
    ops = {R["SUM"]: mpi.SUM, R["AVG"]: mpi.SUM, R["PRODUCT"]: mpi.PROD, R["MIN"]: mpi.MIN,
           R["MAX"]: mpi.MAX, R["BAND"]: mpi.BAND, R["BOR"]: mpi.BOR, R["BXOR"]: mpi.BXOR}
    # bool: SUM and MAX are OR, PRODUCT and MIN are AND (torch's and pyddp's CPU backend)
    bool_ops = {R["SUM"]: mpi.LOR, R["MAX"]: mpi.LOR, R["BOR"]: mpi.LOR, R["PRODUCT"]: mpi.LAND,
                R["MIN"]: mpi.LAND, R["BAND"]: mpi.LAND, R["BXOR"]: mpi.LXOR}
    units = {}  # element size -> an MPI type of that many bytes (bytes moved, counts < 2**31)
    for size, t in ((1, mpi.BYTE), (2, mpi.UINT16_T), (4, mpi.UINT32_T), (8, mpi.UINT64_T)):
        units[size] = t
    units[16] = mpi.C_DOUBLE_COMPLEX
    return types, ops, bool_ops, units


def _saturating_sums(mpi):
    """Codes of the small integer types whose MPI_SUM saturates instead of wrapping (Open MPI
    4.1.0 to 4.1.4's AVX reduction kernels): a local test reduction, once."""
    bad = set()
    for name, t in (("int8", mpi.INT8_T), ("uint8", mpi.UINT8_T), ("int16", mpi.INT16_T),
                    ("uint16", mpi.UINT16_T)):
        info = np.iinfo(name)
        a = np.full(256, info.max, name)
        b = np.full(256, info.max, name)
        mpi.SUM.Reduce_local([a, t], [b, t])
        want = (a.astype(np.int64) * 2).astype(name)  # wraps, as C's unsigned arithmetic
        if (b != want).any():
            bad.add(_D[name])
    return frozenset(bad)


_FAST = {}  # NumPy dtype -> (dtype code, MPI type) for the fast path (no half types)


def _fast_ops(ops, bool_ops, widen):
    """{(dtype code, ReduceOp): MPI op} the fast path reduces: the combinations pyddp accepts
    that need no copy and no division (AVG, half types and widened sums take the general path)."""
    if not _FAST:
        for name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "float32", "float64", "complex64", "complex128"):
            _FAST[np.dtype(name)] = (_D[name], _tables[0][_D[name]])
    out = {}
    for name, code in _D.items():
        if name in ("float16", "bfloat16"):
            continue
        for v in _C.REDUCE_OPS.values():  # pyddp.distributed.ReduceOp's values, in its order
            op = v
            if v == _AVG:
                continue
            opn = _OP_NAMES[v]
            if name == "bool":
                m = bool_ops.get(v)
            elif name.startswith("complex"):
                m = ops[v] if opn == "SUM" else None
            elif name.startswith("float"):
                m = ops[v] if opn in ("SUM", "PRODUCT", "MIN", "MAX") else None
            else:
                m = None if (opn == "SUM" and code in widen) else ops[v]
            if m is not None:
                out[(code, op)] = m
    return out


def cuda_aware() -> bool:
    """Whether the MPI takes CUDA device pointers: PYDDP_MPI_CUDA_AWARE (0/1) when set, else
    mpi4py's query where it has one, else Open MPI's MPIX_Query_cuda_support."""
    global _cuda_aware
    env = _config.get("PYDDP_MPI_CUDA_AWARE")
    if env is not None:
        return env
    if _cuda_aware is None:
        mpi = load()
        q = getattr(mpi, "Query_cuda_support", None)
        if q is not None:
            _cuda_aware = bool(q())
        else:
            import ctypes
            try:
                fn = ctypes.CDLL(None).MPIX_Query_cuda_support
                fn.restype = ctypes.c_int
                _cuda_aware = fn() == 1
            except (AttributeError, OSError):
                _cuda_aware = False
    return _cuda_aware


def world_rank_size(rank=-1, world_size=-1):
    """(rank, size) of this process in MPI_COMM_WORLD; ValueError when the given ones differ."""
    mpi = load()
    r, n = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    if world_size not in (-1, None) and world_size != n:
        raise ValueError(f"backend 'mpi': world_size={world_size} but MPI_COMM_WORLD has {n} ranks "
                         "(the MPI launcher decides it: mpirun -n N, srun -n N)")
    if rank not in (-1, None) and rank != r:
        raise ValueError(f"backend 'mpi': rank={rank} but this process is rank {r} of "
                         "MPI_COMM_WORLD (the MPI launcher decides it)")
    return r, n


def rendezvous_env(env):
    """For a job mixing 'mpi' with a backend that needs env:// (``"cpu:mpi,cuda:nccl"``): the
    variables env:// cannot derive from the launcher (MASTER_ADDR across hosts, MASTER_PORT under
    Hydra, RANK/WORLD_SIZE of a singleton), taken from MPI: rank 0's host name and a free port there,
    broadcast over MPI_COMM_WORLD.  Fills only what is unset; collective over the job."""
    import socket

    from ... import _cluster

    mpi = load()
    world = mpi.COMM_WORLD
    try:
        _cluster.resolve(env, -1, -1)
        need = False
    except ValueError:
        need = True
    if not world.allreduce(need, op=mpi.LOR):
        return
    info = None
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            info = (socket.gethostname(), s.getsockname()[1])
    host, port = world.bcast(info, root=0)
    env.setdefault("MASTER_ADDR", host)
    env.setdefault("MASTER_PORT", str(port))
    if not any(k in env for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")):
        env.setdefault("RANK", str(world.Get_rank()))
        env.setdefault("WORLD_SIZE", str(world.Get_size()))


def _bytes(a):
    """A view of host array ``a`` MPI can take as a buffer (ml_dtypes' bfloat16 exports none)."""
    if a.dtype.isbuiltin == 1 or a.dtype.char in "?bBhHiIlLqQefdFD":
        return a
    return a.view(f"u{a.dtype.itemsize}")


def _float32(a, code):
    """float32 copy of a float16 or bfloat16 host array (bfloat16 possibly as a uint16 view)."""
    if code == _F16:
        return a.astype(np.float32)
    u = a.view(np.uint16).astype(np.uint32) << 16
    return u.view(np.float32)


def _store_half(dst, f, code):
    """Round float32 ``f`` into the float16 / bfloat16 host array ``dst`` (nearest even)."""
    if code == _F16:
        np.copyto(dst, f, casting="unsafe")
        return
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    nan = np.isnan(f)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    np.copyto(dst.view(np.uint16), r.reshape(dst.shape))


def _poll(test, deadline):
    """Call ``test()`` until it returns True (-> True) or ``deadline`` passes (-> False): spin
    briefly, then yield the CPU between tests (MPI progresses only inside its calls)."""
    if test():
        return True
    spins = 0
    sleep = 0.0
    while True:
        spins += 1
        if test():
            return True
        if spins & 63 == 0:
            if _C.monotonic() > deadline:
                return test()
            if spins > 4096:
                sleep = min(1e-3, sleep + 2e-5)
                time.sleep(sleep)


# ----------------------------------------------------------------------------------- works

class MpiWork:
    """The handle pyddp.distributed.Work wraps for a nonblocking MPI operation."""

    __slots__ = ("be", "reqs", "after", "what", "keep", "done", "error", "status", "peer",
                 "lock", "t0")

    def __init__(self, be, reqs, after, what, keep, status=None, peer=-1):
        self.be = be
        self.reqs = reqs
        self.after = after  # run once when the requests completed (AVG, half types, staging)
        self.what = what
        self.keep = keep  # the arrays MPI reads and writes stay alive until completion
        self.done = False
        self.error = None
        self.status = status
        self.peer = peer
        self.lock = threading.Lock()
        self.t0 = _C.monotonic()

    def _test(self) -> bool:
        if self.done:
            return True
        with self.lock:
            if self.done:
                return True
            try:
                if len(self.reqs) == 1:
                    ok = self.reqs[0].Test(self.status)
                else:
                    ok = MPI.Request.Testall(self.reqs)
            except MPI.Exception as e:
                self.error = self.be._mpi_message(e, self.what)
                ok = True
            if ok:
                if self.error is None and self.after is not None:
                    try:
                        self.after()
                    except Exception as e:  # noqa: BLE001 - reported by wait()
                        self.error = f"{self.what}: {e}"
                self.after = self.keep = None
                self.done = True
            return ok

    def wait(self, timeout=None) -> bool:
        """Poll until done; DistBackendError after ``timeout`` seconds (default: the group's) or
        on an MPI error."""
        t = self.be.timeout if timeout is None else float(timeout)
        if not _poll(self._test, _C.monotonic() + t):
            msg = (f"{self.what} on {self.be._where()}, rank {self.be.rank}, did not complete "
                   f"within {t:g} s (started {_C.monotonic() - self.t0:.3g} s ago); a rank did "
                   "not reach it, died or is stuck")
            if timeout is None:
                self.be._fail(msg)
            raise _C.DistBackendError(msg)
        if self.error is not None:
            raise _C.DistBackendError(self.error)
        return True

    def is_completed(self) -> bool:
        """Whether every request of the operation completed."""
        return self._test()

    def source_rank(self) -> int:
        """The sender of a completed receive (its status), else the peer given."""
        if self.status is not None and self.done:
            return self.status.Get_source()
        return self.peer


# --------------------------------------------------------------------------------- backend

class MpiBackend(Backend):
    """The backend object of one group on MPI (see the module docstring)."""

    transport = "mpi"

    def __init__(self, opts):
        mpi = load()
        self.types, self.ops, self.bool_ops, self.units, self.widen = _tables
        self.rank = opts.group_rank
        self.size = opts.group_size
        self.ranks = list(opts.global_ranks_in_group)
        self.name = str(opts.group_id)
        self.timeout = opts.timeout.total_seconds()
        self.check = _config.get("PYDDP_MPI_CHECK")
        self.error = None
        self.seq = 0
        self.lock = threading.RLock()
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
                fallback=self._py_fast, on_failure=self._fast_failed)
        except (_C.DistError, TypeError, ValueError, AttributeError) as e:
            import warnings

            warnings.warn(f"backend 'mpi': calling MPI from pyddp's C core is not possible here "
                          f"({e}); every call goes through mpi4py", RuntimeWarning, stacklevel=2)
            return None

    def __repr__(self):
        return f"<pyddp mpi backend of group {self.name!r} rank {self.rank} of {self.size}>"

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

    def _fail(self, msg):
        with self.lock:
            if self.error is None:
                self.error = msg
            mc = getattr(self, "_mc", None)
            if mc is not None:
                mc.set_failed()

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
                ok = _poll(lambda: MPI.Request.Testall(reqs), deadline)
            except MPI.Exception as e:
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
            except MPI.Exception:
                gathered = False
            if gathered:
                rows = "; ".join(f"rank {self.ranks[r]} called {_describe(sigs[r])} as operation "
                                 f"#{int(sigs[r][0])}" for r in range(self.size))
            else:
                rows = f"rank {self.ranks[self.rank]} called {_describe(sig)}"
            msg = (f"mismatched collectives on {self._where()}: {rows} (every rank must call "
                   "the same collectives in the same order, with the same counts, dtypes, ops "
                   "and roots)")
        self._fail(msg)
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
                buf = MPI.buffer.fromaddress(a.ptr, a.nbytes, readonly=False)
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

    def _unit(self, a):
        """(MPI type, count) moving ``a``'s bytes."""
        n = a.nbytes
        for size in (16, 8, 4, 2):
            if n % size == 0 and a.dtype.itemsize % size == 0:
                return self.units[size], n // size
        return self.units[1], n

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
            with self.lock:
                if self.check and self.size > 1:
                    self._check(kind, code, int(arg), 0, array.size, "all_reduce", 0.0)
                try:
                    self.coll.Allreduce(MPI.IN_PLACE, [array, t], mop)
                except MPI.Exception as e:
                    raise _C.DistBackendError(self._mpi_message(e, "all_reduce")) from None
            return True
        if kind == _K_BROADCAST:
            if type(arg) is not int or not 0 <= arg < self.size:
                return False
            with self.lock:
                if self.check and self.size > 1:
                    self._check(kind, code, 0, arg, array.size, "broadcast", 0.0)
                try:
                    self.coll.Bcast([array, t], arg)
                except MPI.Exception as e:
                    raise _C.DistBackendError(self._mpi_message(e, "broadcast")) from None
            return True
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
            with self.lock:
                if self.check and self.size > 1:
                    self._check(kind, code, sig[0], 0, sig[1], name, 0.0)
                try:
                    if mop is None:
                        self.coll.Allgather([inp, t], [array, t])
                    else:
                        c = array.size
                        self.coll.Reduce_scatter_block([inp, c, t], [array, c, t], mop)
                except MPI.Exception as e:
                    raise _C.DistBackendError(self._mpi_message(e, name)) from None
            return True
        return False

    fast = _py_fast  # an instance's MpiComm.fast replaces it (see __init__)

    def _barrier(self):
        with self.lock:
            if self.check and self.size > 1:
                self._check(_K_BARRIER, 0, 0, 0, 0, "barrier", 0.0)
            try:
                self.coll.Barrier()
            except MPI.Exception as e:
                raise _C.DistBackendError(self._mpi_message(e, "barrier")) from None
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
        with self.lock:
            if self.check and self.size > 1 and kind not in (_K_SEND, _K_RECV, _K_MONITORED):
                self._check(kind, dtype, op, root, count, name, timeout)
            try:
                return self._run(kind, dtype, op, root, tag, count, inputs, outputs, in_splits,
                                 out_splits, timeout, wait_all, name, blocking, back)
            except MPI.Exception as e:
                raise _C.DistBackendError(self._mpi_message(e, name)) from None

    def _done(self, reqs, after, what, keep, blocking, status=None, peer=-1):
        work = MpiWork(self, reqs, after, what, keep, status, peer)
        if blocking:
            work.wait()
            return None
        return work

    def _reduce_prep(self, dtype, op, arrays):
        """(MPI type, MPI op, arrays to reduce, copied) for a reduction on ``arrays`` (the first
        is the output; ``copied``: they are copies): float32 copies for the half types, int32
        ones where this MPI's SUM saturates small integers; _finisher writes them back and
        applies AVG's division."""
        mop = (self.bool_ops if dtype == _BOOL else self.ops)[op]
        if mop is None:
            raise ValueError(f"op {_OP_NAMES[op]} is not supported for {_DTYPE_NAMES[dtype]}")
        if dtype in (_F16, _BF16):
            return self.types[dtype], mop, [_float32(a, dtype) for a in arrays], True
        if op == _SUM and dtype in self.widen:  # this MPI's SUM saturates them: int32 copies
            wide = np.int32 if _DTYPE_NAMES[dtype].startswith("int") else np.uint32
            return (MPI.INT32_T if wide is np.int32 else MPI.UINT32_T), mop, \
                [a.astype(wide) for a in arrays], True
        return self.types[dtype], mop, arrays, False

    def _run(self, kind, dtype, op, root, tag, count, inputs, outputs, in_splits, out_splits,
             timeout, wait_all, name, blocking, back):
        coll = self.coll
        n = self.size
        if kind == _K_ALLREDUCE:
            out = outputs[0]
            src = inputs[0] if inputs else None
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [out] + ([src] if src is not None
                                                                      else []))
            o = arrs[0]
            sbuf = MPI.IN_PLACE if src is None else [arrs[1], t]
            after = self._finisher(out, o, dtype, op, copied, back)
            if blocking:
                coll.Allreduce(sbuf, [o, t], mop)
                if after is not None:
                    after()
                return None
            req = coll.Iallreduce(sbuf, [o, t], mop)
            return self._done([req], after, name, (inputs, outputs, arrs), False)
        if kind == _K_BROADCAST:
            a = _bytes(outputs[0])
            if blocking:
                coll.Bcast(self._buf(a), root)
                if back is not None:
                    back()
                return None
            return self._done([coll.Ibcast(self._buf(a), root)], back, name, outputs, False)
        if kind == _K_REDUCE:
            a = outputs[0]
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [a])
            x = arrs[0]
            me = self.rank == root
            after = self._finisher(a, x, dtype, op, copied, back) if me else None
            sbuf = MPI.IN_PLACE if me else [x, t]
            rbuf = [x, t] if me else None
            if blocking:
                coll.Reduce(sbuf, rbuf, mop, root)
                if after is not None:
                    after()
                return None
            return self._done([coll.Ireduce(sbuf, rbuf, mop, root)], after, name,
                              (inputs, outputs, arrs), False)
        if kind == _K_ALLGATHER:
            a = _bytes(inputs[0])
            if len(outputs) == 1:
                o = _bytes(outputs[0])
                t, c = self._unit(a)
                if blocking:
                    coll.Allgather([a, c, t], [o, c, t])
                    if back is not None:
                        back()
                    return None
                return self._done([coll.Iallgather([a, c, t], [o, c, t])], back, name,
                                  (inputs, outputs), False)
            return self._list_ops(a, outputs, None, None, name, blocking, back, gather_to=-1)
        if kind == _K_GATHER:
            a = _bytes(inputs[0])
            return self._list_ops(a, outputs, None, None, name, blocking, back, gather_to=root)
        if kind == _K_SCATTER:
            o = _bytes(outputs[0])
            return self._list_ops(None, None, inputs, o, name, blocking, back, scatter_from=root)
        if kind == _K_REDUCE_SCATTER:
            out = outputs[0]
            if len(inputs) == 1:
                t, mop, arrs, copied = self._reduce_prep(dtype, op, [out, inputs[0]])
                after = self._finisher(out, arrs[0], dtype, op, copied, back)
                c = out.size
                if blocking:
                    coll.Reduce_scatter_block([arrs[1], c, t], [arrs[0], c, t], mop)
                    if after is not None:
                        after()
                    return None
                req = coll.Ireduce_scatter_block([arrs[1], c, t], [arrs[0], c, t], mop)
                return self._done([req], after, name, (inputs, outputs, arrs), False)
            # a list: one MPI_Reduce per destination rank, straight from each array
            t, mop, arrs, copied = self._reduce_prep(dtype, op, [out, *inputs])
            o = arrs[0]
            reqs = []
            for r in range(n):
                x = arrs[1 + r]
                if blocking:
                    if r == self.rank:
                        coll.Reduce([x, t], [o, t], mop, r)
                    else:
                        coll.Reduce([x, t], None, mop, r)
                else:
                    reqs.append(coll.Ireduce([x, t], [o, t] if r == self.rank else None, mop, r))
            after = self._finisher(out, o, dtype, op, copied, back)
            if blocking:
                if after is not None:
                    after()
                return None
            return self._done(reqs, after, name, (inputs, outputs, arrs), False)
        if kind == _K_ALLTOALL:
            if len(inputs) == 1 and len(outputs) == 1:
                a, o = _bytes(inputs[0]), _bytes(outputs[0])
                return self._alltoallv(a, o, in_splits, out_splits, name, blocking, back)
            return self._list_ops(None, outputs, inputs, None, name, blocking, back,
                                  alltoall=True)
        if kind == _K_BARRIER:
            if blocking:
                coll.Barrier()
                return None
            return self._done([coll.Ibarrier()], None, name, None, False)
        if kind == _K_MONITORED:
            self._monitored_barrier(timeout if timeout > 0 else self.timeout, wait_all)
            return None
        if kind == _K_SEND:
            a = _bytes(inputs[0])
            req = self.p2p.Isend(self._buf(a), dest=root, tag=tag)
            return self._done([req], None, f"{name} to rank {self.ranks[root]}", inputs, blocking)
        if kind == _K_RECV:
            a = _bytes(outputs[0])
            st = MPI.Status()
            src = MPI.ANY_SOURCE if root < 0 else root
            req = self.p2p.Irecv(self._buf(a), source=src, tag=tag)
            what = f"{name} from {'any rank' if root < 0 else f'rank {self.ranks[root]}'}"
            return self._done([req], back, what, outputs, blocking, st, root)
        raise ValueError(f"{name}: backend 'mpi' does not know operation kind {kind}")

    def _buf(self, a):
        t, c = self._unit(a)
        return [a, c, t]

    def _finisher(self, out, x, dtype, op, copied, back):
        """What to run once a reduction into ``x`` is done: ``out`` itself, or (``copied``) its
        float32 / int32 copy, written back."""
        avg = op == _AVG
        if not copied and not avg and back is None:
            return None
        n = self.size

        def finish():
            if avg:
                if dtype in (_F16, _BF16) or np.issubdtype(x.dtype, np.inexact):
                    np.divide(x, n, out=x)
                else:
                    np.floor_divide(x, n, out=x)  # never reached: AVG is refused on integers
            if copied and dtype in (_F16, _BF16):
                _store_half(out, x, dtype)
            elif copied:
                np.copyto(out, x, casting="unsafe")  # wraps, as C's integer arithmetic
            if back is not None:
                back()
        return finish

    def _alltoallv(self, a, o, in_splits, out_splits, name, blocking, back):
        n = self.size
        if in_splits is None:
            in_splits = (a.nbytes // n,) * n
        if out_splits is None:
            out_splits = (o.nbytes // n,) * n
        g = 0
        for s in (*in_splits, *out_splits):
            g = np.gcd(g, int(s))
        isz = a.dtype.itemsize
        size = next((k for k in (16, 8, 4, 2) if isz % k == 0 and (g % k == 0)), 1)
        t = self.units[size]
        sc = [int(s) // size for s in in_splits]
        rc = [int(s) // size for s in out_splits]
        sd = np.concatenate(([0], np.cumsum(sc)[:-1])).astype(np.int64).tolist()
        rd = np.concatenate(([0], np.cumsum(rc)[:-1])).astype(np.int64).tolist()
        if max(sd + rd + sc + rc + [0]) > _INT_MAX:
            raise ValueError(f"{name}: backend 'mpi' moves at most 2**31-1 elements of "
                             f"{size} bytes per rank and offset (MPI's int counts)")
        sbuf, rbuf = [a, (sc, sd), t], [o, (rc, rd), t]
        if blocking:
            self.coll.Alltoallv(sbuf, rbuf)
            if back is not None:
                back()
            return None
        return self._done([self.coll.Ialltoallv(sbuf, rbuf)], back, name, (a, o), False)

    def _list_ops(self, a, outs, ins, o, name, blocking, back, gather_to=None,
                  scatter_from=None, alltoall=False):
        """all_gather / gather into a list, scatter from a list, all_to_all of lists: one
        message per array (no packing copy), on ``aux`` with their own tag."""
        aux, me, n = self.aux, self.rank, self.size
        reqs = []
        keep = (a, outs, ins, o)
        if gather_to is not None:  # all_gather (gather_to == -1) or gather to a root
            for r in range(n):
                if r != me and (gather_to == -1 or gather_to == r):
                    reqs.append(aux.Isend(self._buf(a), dest=r, tag=_TAG_LIST))
            if gather_to == -1 or gather_to == me:
                for r in range(n):
                    dst = _bytes(outs[r])
                    if r == me:
                        np.copyto(dst.reshape(-1).view(np.uint8), a.reshape(-1).view(np.uint8))
                    else:
                        reqs.append(aux.Irecv(self._buf(dst), source=r, tag=_TAG_LIST))
        elif scatter_from is not None:
            if me == scatter_from:
                for r in range(n):
                    src = _bytes(ins[r])
                    if r == me:
                        np.copyto(o.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
                    else:
                        reqs.append(aux.Isend(self._buf(src), dest=r, tag=_TAG_LIST))
            else:
                reqs.append(aux.Irecv(self._buf(o), source=scatter_from, tag=_TAG_LIST))
        else:  # all_to_all of lists
            for r in range(n):
                dst = _bytes(outs[r])
                if r == me:
                    np.copyto(dst.reshape(-1).view(np.uint8),
                              _bytes(ins[r]).reshape(-1).view(np.uint8))
                else:
                    reqs.append(aux.Irecv(self._buf(dst), source=r, tag=_TAG_LIST))
            for r in range(n):
                if r != me:
                    reqs.append(aux.Isend(self._buf(_bytes(ins[r])), dest=r, tag=_TAG_LIST))
        if not reqs:
            if back is not None:
                back()
            return None
        return self._done(reqs, back, name, keep, blocking)

    def _monitored_barrier(self, t, wait_all):
        """torch's monitored_barrier: rank 0 waits (at most ``t`` s) for every rank's arrival and
        names those that did not come; then it releases them."""
        aux, me, n = self.aux, self.rank, self.size
        if n == 1:
            return
        token = np.zeros(1, np.int32)
        deadline = _C.monotonic() + t
        if me != 0:
            s = aux.Isend([token, MPI.INT32_T], dest=0, tag=_TAG_MON)
            ok = np.zeros(1, np.int32)
            r = aux.Irecv([ok, MPI.INT32_T], source=0, tag=_TAG_MON_OK)
            if not _poll(lambda: MPI.Request.Testall([s, r]), deadline):
                for q in (s, r):
                    q.Cancel()
                msg = (f"monitored_barrier on {self._where()}: rank {self.ranks[me]} was not "
                       f"released by rank {self.ranks[0]} within {t:g} s (rank 0 reports the "
                       "ranks that did not arrive)")
                self._fail(msg)
                raise _C.DistBackendError(msg)
            if ok[0] != 0:
                raise _C.DistBackendError(f"monitored_barrier on {self._where()}: rank "
                                          f"{self.ranks[0]} reported a failure")
            return
        bufs = [np.zeros(1, np.int32) for _ in range(n)]
        reqs = {r: aux.Irecv([bufs[r], MPI.INT32_T], source=r, tag=_TAG_MON)
                for r in range(1, n)}
        missing = []
        for r in range(1, n):
            if not _poll(reqs[r].Test, deadline):
                missing.append(r)
                if not wait_all:
                    break
        ms = int(round(t * 1000))
        if missing:
            for r in range(1, n):
                if not reqs[r].Test():
                    reqs[r].Cancel()
            names = ", ".join(str(self.ranks[r]) for r in missing)
            if wait_all:
                msg = (f"[Rank 0]: Ranks {names} failed to pass monitoredBarrier in {ms} ms")
            else:
                msg = (f"[Rank 0]: Rank {names} failed to pass monitoredBarrier in {ms} ms")
            raise _C.DistBackendError(msg)
        zero = np.zeros(1, np.int32)
        sends = [aux.Isend([zero, MPI.INT32_T], dest=r, tag=_TAG_MON_OK) for r in range(1, n)]
        _poll(lambda: MPI.Request.Testall(sends), deadline + t)

    # ----------------------------------------------------------------------- shutdown
    def destroy(self):
        """Free the communicators (never collective: MPI_Comm_free is local)."""
        mc = getattr(self, "_mc", None)
        if mc is not None:  # its handles are about to dangle: no more calls from C
            mc.set_failed()
        for attr in ("coll", "p2p", "aux"):
            c = getattr(self, attr, None)
            setattr(self, attr, None)
            if c is not None and MPI is not None and not MPI.Is_finalized():
                try:
                    c.Free()
                except MPI.Exception:
                    pass


def create(opts):
    """The factory registered for backend 'mpi'."""
    load()
    return MpiBackend(opts)
