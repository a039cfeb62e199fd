"""Backend "mpi": MPI itself, through mpi4py.  Loading it (MPI_THREAD_MULTIPLE unless the program
imported mpi4py.MPI first), the tables that map pyddp's dtypes and ReduceOps onto MPI's types and
ops (which small-integer sums saturate on this MPI), whether it takes CUDA device pointers, and the
rendezvous hooks (the ranks are MPI_COMM_WORLD's; env:// variables derived from MPI).  Also the
constants the backend's modules share (kind, dtype and op codes, message tags).
"""
from __future__ import annotations

import sys
import threading

import numpy as np

from .... import _C, _config
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
    # torchrun's variables from a launcher that is not MPI's (pyddp-run, spawn, notebook ranks):
    # each process is then an MPI singleton, rank 0 of 1, and would run alone without a word
    import os

    env_size = os.environ.get("WORLD_SIZE", "").strip()
    if world_size in (-1, None) and env_size.isdigit() and int(env_size) != n:
        raise ValueError(f"backend 'mpi': WORLD_SIZE={env_size} in the environment but "
                         f"MPI_COMM_WORLD has {n} rank{'s' if n != 1 else ''}: backend 'mpi' takes its "
                         "ranks from the MPI launcher, so start the job with mpirun -n "
                         f"{env_size} (or srun), not with a launcher that sets WORLD_SIZE")
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

