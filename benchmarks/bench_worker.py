"""One rank of benchmarks/collectives.py: times collectives with one implementation.

Started by collectives.py, never by hand:
  pyddp, gloo: one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment;
  mpi:         mpirun -np N python bench_worker.py --impl mpi ...
  pyddp-mpi:   mpirun -np N python bench_worker.py --impl pyddp-mpi ...  (pyddp's backend "mpi")

Every rank times every iteration itself (a barrier before each, the collective alone inside the clock);
the per-iteration times are reduced with MAX over ranks through the implementation's own all_reduce, and
rank 0 writes them as JSON to --out. The parent takes the median over iterations. With --timing loop an
iteration is a batch of calls back to back (a barrier before the batch only), and its time is the batch's
divided by its calls.

The transport of pyddp is the parent's business (PYDDP_TRANSPORT in the environment: "pyddp-tcp" is this
worker with PYDDP_TRANSPORT=tcp). --shm-buffer (pyddp only) adds, after the other collectives, an allreduce
of arrays allocated by pyddp.distributed._shared_array (once per size, on every rank), in result
"shm_buffer"; when this build has no _shared_array it says so there instead.
"""
import argparse
import glob
import json
import os
import resource
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather", "scatter", "alltoall")
# The collectives that split the array into one block per rank.
BLOCKED = ("allgather", "reduce_scatter", "gather", "scatter", "alltoall")


def counts_for(op, nbytes, world):
    """Element counts (input, output) of a float32 collective whose whole array is about nbytes.

    As nccl-tests: the size is the whole array (allgather's and gather's output, reduce_scatter's and
    scatter's input, each rank's all_to_all buffer), rounded down to a multiple of the world size for
    those that split it, never below one element per rank.
    """
    count = max(1, nbytes // 4)
    if op in BLOCKED:
        count = max(1, count // world) * world
        part = count // world
        if op in ("allgather", "gather"):
            return part, count
        if op in ("reduce_scatter", "scatter"):
            return count, part
    return count, count


def whole_bytes(op, n_in, n_out):
    """The size a table row shows (see counts_for)."""
    return 4 * (n_out if op in ("allgather", "gather") else n_in)


def iterations(nbytes, max_iters, budget_bytes):
    """Timed iterations for one size: max_iters for small arrays, fewer for large ones (same on all ranks)."""
    return int(max(5, min(max_iters, budget_bytes // max(nbytes, 1))))


LOOP_CALLS = 5000  # --timing loop: calls per row at most (small sizes), in LOOP_BATCHES batches
LOOP_BATCHES = 5


def loop_batches(iters, nbytes, budget_bytes):
    """--timing loop: (batches, calls per batch) for one size.  The calls of a batch run back to
    back (nccl-tests' method); only the batches have a barrier before them.  A batch holds many
    calls (up to LOOP_CALLS / LOOP_BATCHES, within budget_bytes of data per row, never fewer than
    the per-call timing's iters): a library whose ranks may run ahead (a gather's senders, an
    eager broadcast's root) buffers some calls' data, and a short batch would time the buffering
    instead of the steady pace of a loop (Open MPI's 4 KiB gather on 4 ranks sharing 2 cores:
    6.5 us per call in batches of 20, 15-18 us over 2000 calls)."""
    total = max(iters, min(LOOP_CALLS, budget_bytes // max(nbytes, 1)))
    batches = min(LOOP_BATCHES, total)
    return batches, max(1, total // batches)


def warmups(nbytes):
    return 5 if nbytes <= (1 << 20) else 2


def zeros(count):
    """count float32 zeros on the memory every library gets here: pages of their own, huge from
    2 MiB on, as a training job's arrays and the tuner's (pyddp.distributed.backends.cpu.crossovers.
    user_array).  From the heap, arrays land on pages of a history of their own, and in one process
    the library whose arrays were made second ran a 1 MiB all_to_all 1.4-1.8x faster."""
    from pyddp.distributed.backends.cpu.crossovers import user_array

    return user_array(count)


class Impl:
    """The four collectives, a barrier and a MAX all-reduce of float64 timings for one library."""

    name = "?"

    def make(self, count):
        return zeros(count)

    def blocks(self, arr):
        """The root's list of per-rank blocks of arr for gather and scatter (torch's API takes a
        list): views made once per array, as a program that reuses its buffers keeps them, so the
        timings hold the collective and not the building of a Python list every call."""
        last = getattr(self, "_last_blocks", None)
        if last is None or last[0] is not arr:
            last = self._last_blocks = (arr, self.split(arr))
        return last[1]


class PyddpImpl(Impl):
    name = "pyddp"
    backend = "cpu"

    def __init__(self):
        # Prefer an in-place build of this checkout over an installed copy, so a developer measures the
        # code in front of them; otherwise the installed package.
        if glob.glob(os.path.join(ROOT, "pyddp", "_C*.so")):
            sys.path.insert(0, ROOT)
        import pyddp.distributed as dist

        self.dist = dist
        t0 = time.perf_counter()
        dist.init_process_group(self.backend)
        # what init_process_group took, and of it what measuring a host without rules took (the
        # first job on it: backends.cpu.crossovers.first_job)
        self.init_s = time.perf_counter() - t0
        try:
            from pyddp.distributed.backends.cpu import crossovers

            self.first_job_s = (crossovers.last_first_job or {}).get("seconds")
        except ImportError:
            self.first_job_s = None
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def wrap(self, arr):
        return arr

    def allreduce(self, a, out):
        self.dist.all_reduce(a, op=self.dist.ReduceOp.SUM)

    def broadcast(self, a, out):
        self.dist.broadcast(a, src=0)

    def allgather(self, a, out):
        self.dist.all_gather_into_tensor(out, a)

    def reduce_scatter(self, a, out):
        self.dist.reduce_scatter_tensor(out, a, op=self.dist.ReduceOp.SUM)

    def reduce(self, a, out):
        self.dist.reduce(a, dst=0, op=self.dist.ReduceOp.SUM)

    def gather(self, a, out):
        self.dist.gather(a, self.blocks(out) if self.rank == 0 else None, dst=0)

    def scatter(self, a, out):
        self.dist.scatter(out, self.blocks(a) if self.rank == 0 else None, src=0)

    def split(self, arr):
        return list(arr.reshape(self.world, -1))

    def alltoall(self, a, out):
        self.dist.all_to_all_single(out, a)

    def barrier(self):
        self.dist.barrier()

    def max_over_ranks(self, times):
        self.dist.all_reduce(times, op=self.dist.ReduceOp.MAX)
        return times

    def close(self):
        self.dist.destroy_process_group()


class GlooImpl(Impl):
    name = "gloo"

    def __init__(self):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch = torch
        self.dist = dist
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def wrap(self, arr):
        # Shares memory with the numpy array: the same bytes are moved as for the other libraries.
        return self.torch.from_numpy(arr)

    def allreduce(self, a, out):
        self.dist.all_reduce(a, op=self.dist.ReduceOp.SUM)

    def broadcast(self, a, out):
        self.dist.broadcast(a, src=0)

    def allgather(self, a, out):
        self.dist.all_gather_into_tensor(out, a)

    def reduce_scatter(self, a, out):
        self.dist.reduce_scatter_tensor(out, a, op=self.dist.ReduceOp.SUM)

    def reduce(self, a, out):
        self.dist.reduce(a, dst=0, op=self.dist.ReduceOp.SUM)

    def gather(self, a, out):
        self.dist.gather(a, self.blocks(out) if self.rank == 0 else None, dst=0)

    def scatter(self, a, out):
        self.dist.scatter(out, self.blocks(a) if self.rank == 0 else None, src=0)

    def split(self, arr):
        return list(arr.view(self.world, -1).unbind(0))

    def alltoall(self, a, out):
        self.dist.all_to_all_single(out, a)

    def barrier(self):
        self.dist.barrier()

    def max_over_ranks(self, times):
        t = self.torch.from_numpy(times)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return times

    def close(self):
        self.dist.destroy_process_group()


class MpiImpl(Impl):
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world = self.comm.Get_size()

    def wrap(self, arr):
        return arr

    def allreduce(self, a, out):
        self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)

    def broadcast(self, a, out):
        self.comm.Bcast(a, root=0)

    def allgather(self, a, out):
        self.comm.Allgather(a, out)

    def reduce_scatter(self, a, out):
        self.comm.Reduce_scatter_block(a, out, op=self.MPI.SUM)

    def reduce(self, a, out):
        if self.rank == 0:
            self.comm.Reduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM, root=0)
        else:
            self.comm.Reduce(a, None, op=self.MPI.SUM, root=0)

    def gather(self, a, out):
        self.comm.Gather(a, out if self.rank == 0 else None, root=0)

    def scatter(self, a, out):
        self.comm.Scatter(a if self.rank == 0 else None, out, root=0)

    def alltoall(self, a, out):
        self.comm.Alltoall(a, out)

    def barrier(self):
        self.comm.Barrier()

    def max_over_ranks(self, times):
        self.comm.Allreduce(self.MPI.IN_PLACE, times, op=self.MPI.MAX)
        return times

    def close(self):
        pass


class PyddpMpiImpl(PyddpImpl):
    """pyddp on its backend "mpi" (mpi4py underneath), under mpirun like MpiImpl."""

    name = "pyddp-mpi"
    backend = "mpi"


def _cma_reader():
    """A function read(pid, address, dst) copying dst.nbytes from another process's memory into the
    NumPy array dst with process_vm_readv (one copy, by the kernel, as the single-copy paths of
    pyddp and Open MPI move large messages); None where libc has no process_vm_readv."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None

    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(IoVec), ctypes.c_ulong, ctypes.POINTER(IoVec),
                   ctypes.c_ulong, ctypes.c_ulong]

    def read(pid, address, dst):
        done, total, base = 0, dst.nbytes, dst.ctypes.data
        while done < total:
            mine = IoVec(base + done, total - done)
            theirs = IoVec(address + done, total - done)
            got = fn(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
            if got <= 0:
                e = ctypes.get_errno()
                raise OSError(e, f"process_vm_readv of process {pid}: {os.strerror(e)}")
            done += got

    return read


class FloorImpl(PyddpImpl):
    """The copy floor: no collective, every rank copies at the same time the bytes it would have to
    write into output memory if the collective's writes were shared evenly among the ranks: the
    bytes that must come from another rank from the next rank's memory, as a collective reads a
    peer's data (``_dirty`` says in which state), and a block that is the rank's own (all_to_all's,
    all_gather's) from memory of its own; pyddp only for the barrier and the MAX over ranks.  The
    writes of a collective of S bytes (the size of the tables; n ranks): all_reduce and all_to_all
    n*S in all (S per rank: every rank's output), all_gather n*S, broadcast (n-1)*S (every reader's
    copy), reduce, gather, scatter and reduce_scatter S.  No algorithm writes less than that, and a
    reduction reads more.

    How a peer's bytes are copied: plain copies out of the next rank's shared-memory segment (what
    two-copy paths pay on their second copy), or one copy by the kernel out of the next rank's
    private array (process_vm_readv: what single-copy paths pay; the array on the memory every
    library gets here, huge pages from 2 MiB on, which a shared-memory segment cannot have where
    the kernel's shmem_enabled is never).  The floor at each size is the faster of the two: run_op
    times each way (``ways``) and keeps the one with the lower median, reported in the row
    ("way").  With one way only (a segment read), a 64 MiB all_to_all on 2 ranks ran 0.74x "the
    floor" in both libraries; a choice made once from a few copies of each (a calibration) picked
    the slower way at 4 MiB in two of three runs.
    """

    name = "floor"
    checks = False
    ways = ("shm", "cma")   # run_op times both, sets self.way, keeps the faster

    def __init__(self):
        super().__init__()
        self._mine = self._peer = None
        self._own = self._src = None     # the segments: this rank's (written here), the next rank's
        self._priv = None                # this rank's private source (its own blocks; read by CMA)
        self._at = None                  # (pid, address) of the next rank's private source
        self._dst = np.zeros(0, dtype=np.float32)
        self._cap = 0
        self._count = 0                  # floats the last copy wrote (the next barrier rewrites them)
        self.way = "shm"
        self._read = _cma_reader()
        # single copies where every rank can read its peer (ptrace rules may forbid it)
        probe = np.ones(1, dtype=np.float32)
        self._at = self._locate(probe)
        failed = np.zeros(1, dtype=np.float64)
        try:
            if self._read is None:
                raise OSError("no process_vm_readv")
            self._read(self._at[0], self._at[1], np.zeros(1, dtype=np.float32))
        except OSError:
            failed[0] = 1.0
        if self.max_over_ranks(failed)[0]:
            self._read = None
            self.ways = ("shm",)
        self.dist.barrier()  # (the peers' probe arrays are read before they go)
        self._at = None

    def _locate(self, arr):
        """(pid, address) of the next rank's array arr (every rank passes its own)."""
        where = np.array([os.getpid(), arr.ctypes.data], dtype=np.int64)
        every = np.zeros(2 * self.world, dtype=np.int64)
        self.dist.all_gather_into_tensor(every, where)
        nxt = (self.rank + 1) % self.world
        return int(every[2 * nxt]), int(every[2 * nxt + 1])

    def _map(self, count):
        """Shared-memory segments of count floats (this rank's, written by it, and the next
        rank's, read here) and private arrays of count floats (this rank's source, and its
        destination); the next rank's source located for process_vm_readv.  Remade larger when a
        size needs it."""
        from multiprocessing import shared_memory

        self._unmap()
        tag = os.environ.get("MASTER_PORT", "0")
        nbytes = max(4, count * 4)
        self._mine = shared_memory.SharedMemory(f"pyddp-floor-{tag}-{self.rank}", create=True,
                                                size=nbytes)
        self.dist.barrier()
        self._peer = shared_memory.SharedMemory(f"pyddp-floor-{tag}-{(self.rank + 1) % self.world}")
        try:  # its owner unlinks it; this process's resource tracker must not try again at exit
            from multiprocessing import resource_tracker
            resource_tracker.unregister(self._peer._name, "shared_memory")
        except Exception:
            pass
        self.dist.barrier()
        self._mine.unlink()  # both ranks have it mapped: the name is no longer needed
        self._own = np.ndarray((count,), np.float32, buffer=self._mine.buf)
        self._src = np.ndarray((count,), np.float32, buffer=self._peer.buf)
        self._own[...] = 1.0
        self._priv = zeros(count)
        self._priv[...] = 1.0
        self._dst = zeros(count)
        self._cap = count
        self._at = self._locate(self._priv)

    def _unmap(self):
        self._own = self._src = self._priv = None
        for seg in (self._mine, self._peer):
            if seg is not None:
                seg.close()
        self._mine = self._peer = None

    def _dirty(self, count, how):
        """The data of the next copy, as each library's own reads find it: a two-copy path reads
        what its peer has just written into the shared window (dirty in the peer's caches: the
        segment is rewritten here), a single-copy path reads the peer's array, which the
        benchmark writes once (the private arrays are left as they are)."""
        if how == "shm":
            self._own[:count] += 1.0

    def barrier(self):
        if self._count:
            self._dirty(self._count, self.way)
        super().barrier()

    def _run(self, how, count, local):
        dst = self._dst
        if local:
            np.copyto(dst[:local], self._priv[:local])
        if count > local:
            if how == "cma":   # (offered only where every rank can read its peer: __init__)
                self._read(self._at[0], self._at[1] + 4 * local, dst[local:count])
            else:
                np.copyto(dst[local:count], self._src[local:count])

    def _copy(self, count, local=0):
        if count <= 0:
            self._count = 0
            return
        if self._cap < count:
            self._map(count)
        self._count = count
        self._run(self.way, count, local)

    def allreduce(self, a, out):
        self._copy(a.size)

    def broadcast(self, a, out):
        self._copy(a.size * (self.world - 1) // self.world)

    def allgather(self, a, out):
        self._copy(out.size, out.size // self.world)

    def reduce_scatter(self, a, out):
        self._copy(out.size)

    def reduce(self, a, out):
        self._copy(a.size // self.world)

    def gather(self, a, out):
        self._copy(a.size)

    def scatter(self, a, out):
        self._copy(out.size)

    def alltoall(self, a, out):
        self._copy(out.size, out.size // self.world)

    def close(self):
        self._unmap()
        super().close()


IMPLS = {"pyddp": PyddpImpl, "gloo": GlooImpl, "mpi": MpiImpl, "pyddp-mpi": PyddpMpiImpl, "floor": FloorImpl}


def check(impl, op, a, out):
    """One run with rank-dependent data in a (and out zeroed), compared with NumPy; leaves both zeroed.

    A wrong result is reported, not timed. The timed iterations then run on zeros (sums stay finite).
    """
    rank, world = impl.rank, impl.world
    n_in, n_out = a.size, out.size
    base = np.arange(n_in, dtype=np.float32) % 7
    a[...] = base + (rank + 1)
    out[...] = 0
    getattr(impl, op)(impl.wrap(a), impl.wrap(out))
    if op == "allreduce":
        got, want = a, base * world + world * (world + 1) / 2
    elif op == "broadcast":
        got, want = a, base + 1
    elif op == "allgather":
        got = out
        want = np.concatenate([base + r + 1 for r in range(world)])
    elif op == "reduce":  # the root's result; the others' arrays are unspecified (as torch says)
        got = want = a
        if rank == 0:
            want = base * world + world * (world + 1) / 2
    elif op == "gather":
        got = want = out
        if rank == 0:
            want = np.concatenate([base + r + 1 for r in range(world)])
    elif op == "scatter":
        got, want = out, (base + 1)[rank * n_out:(rank + 1) * n_out]
    elif op == "alltoall":
        part = n_in // world
        got = out
        want = np.concatenate([(base + s + 1)[rank * part:(rank + 1) * part] for s in range(world)])
    else:
        got = out
        full = base * world + world * (world + 1) / 2
        want = full[rank * n_out:(rank + 1) * n_out]
    ok = bool(np.allclose(got, want))
    a[...] = 0
    out[...] = 0
    return ok


def run_op(impl, op, sizes, args, make=None):
    """Rows of one collective over sizes; make(count) allocates the arrays (default impl.make)."""
    make = make or impl.make
    rows = []
    for nbytes in sizes:
        n_in, n_out = counts_for(op, nbytes, impl.world)
        a = make(n_in)
        # allreduce, broadcast and reduce work in place and ignore out (a 1-element array)
        out = make(n_out) if op in BLOCKED else np.zeros(1, dtype=np.float32)
        ok = check(impl, op, a, out) if getattr(impl, "checks", True) else True
        ta, tout = impl.wrap(a), impl.wrap(out)
        fn = getattr(impl, op)
        iters = iterations(nbytes, args.iters, args.budget_bytes)
        timing = getattr(args, "timing", "call")  # (other scripts pass args of their own)
        batches, per = (loop_batches(iters, nbytes, args.budget_bytes) if timing == "loop"
                        else (iters, 1))
        clock = time.perf_counter
        # an implementation with several ways to do the same work (the copy floor's) runs each
        # and keeps the faster: every rank sees the same MAX-reduced times, so all keep the same
        best = None
        for way in getattr(impl, "ways", None) or (None,):
            if way is not None:
                impl.way = way
            for _ in range(warmups(nbytes)):
                impl.barrier()
                fn(ta, tout)
            times = np.zeros(batches, dtype=np.float64)
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for i in range(batches):
                impl.barrier()
                t0 = clock()
                for _ in range(per):
                    fn(ta, tout)
                times[i] = (clock() - t0) / per
            # page faults per iteration (this rank; --json only): a library that maps fresh memory
            # on every call (a temporary buffer above malloc's mmap threshold) shows it here
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / (batches * per)
            times = impl.max_over_ranks(times)
            if best is None or np.median(times) < np.median(best[0]):
                best = (times, faults, way)
        times, faults, way = best
        whole = whole_bytes(op, n_in, n_out)
        rows.append({
            "bytes": whole,
            "count": whole // 4,
            "iters": batches * per,
            "timing": timing,
            "median_us": float(np.median(times) * 1e6),
            "min_us": float(times.min() * 1e6),
            "correct": ok,
            "faults_per_iter": faults,
        })
        if way is not None:
            rows[-1]["way"] = way
        impl._last_blocks = None
        del ta, tout, a, out  # a shared-memory buffer is given back before the next size is allocated
    return rows


def run_shm_buffer(impl, sizes, args):
    """allreduce of arrays from pyddp.distributed._shared_array: {"available", "rows"} (or "why")."""
    alloc = getattr(impl.dist, "_shared_array", None)
    if alloc is None:
        return {"available": False, "why": "pyddp.distributed._shared_array is missing in this build"}

    def make(count):
        return alloc((count,), dtype=np.float32)

    return {"available": True, "rows": run_op(impl, "allreduce", sizes, args, make=make)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=sorted(IMPLS), required=True)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", required=True, help="comma-separated byte sizes")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--timing", choices=("call", "loop"), default="call",
                   help="call: a barrier before every call, each timed alone; loop: batches of calls "
                        "back to back, a barrier before each batch, time per call = batch time / calls")
    p.add_argument("--budget-bytes", type=int, default=2 << 30)
    p.add_argument("--out", required=True)
    p.add_argument("--shm-buffer", action="store_true",
                   help="pyddp: also time allreduce on arrays from dist._shared_array")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    impl = IMPLS[args.impl]()
    result = {"impl": impl.name, "world_size": impl.world, "ops": {}, "errors": {}}
    if impl.name == "pyddp":
        result["transport_env"] = os.environ.get("PYDDP_TRANSPORT", "")
        try:  # the rules this run's groups applied (the parent labels its tables with them)
            from pyddp.distributed.backends.cpu import tuning

            result["rules"] = tuning.describe()
        except ImportError:
            pass
        result["init_s"] = getattr(impl, "init_s", None)
        result["first_job_s"] = getattr(impl, "first_job_s", None)

    def write():
        if impl.rank == 0:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, args.out)

    for op in args.ops.split(","):
        try:
            result["ops"][op] = run_op(impl, op, sizes, args)
        except Exception:  # one failing collective should not hide the others
            result["errors"][op] = traceback.format_exc(limit=3)
            if impl.rank == 0:
                print(f"[{impl.name}] {op} failed:\n{result['errors'][op]}", file=sys.stderr, flush=True)
            # The ranks may now be out of step: stop here rather than risk a hang.
            break
        write()
    if args.shm_buffer and impl.name == "pyddp" and not result["errors"]:
        # Last, so that a failure here hides none of the other collectives.
        try:
            result["shm_buffer"] = run_shm_buffer(impl, sizes, args)
        except Exception:
            result["shm_buffer"] = {"available": True, "error": traceback.format_exc(limit=3)}
            if impl.rank == 0:
                print(f"[pyddp] shm-buffer allreduce failed:\n{result['shm_buffer']['error']}",
                      file=sys.stderr, flush=True)
    write()
    impl.close()
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
