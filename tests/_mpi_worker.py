"""One rank of a backend 'mpi' test job, started by tests/distributed/test_backend_mpi.py under mpirun:

    mpirun -n N python tests/_mpi_worker.py SUITE OUTDIR

Each rank runs SUITE (its checks against NumPy references from tests/_ref.py) and writes its
Checker report to OUTDIR/rank<R>.json; the test reads every rank's file.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyddp.distributed as dist  # noqa: E402
from _ref import (DTYPE_NAMES, OPS, Checker, garbage, input_kind, kind, mismatch,  # noqa: E402
                  op_valid, rank_input, reduce_ref, same_bytes)

SIZES = [0, 1, 7, 33, 20011]


def _op(name):
    return getattr(dist.ReduceOp, name)


def _ik(name):
    return "normal" if kind(name) in ("float", "complex") else "full"


def colls(ck, rank, ws):
    """Every collective x dtype x op x size against NumPy."""
    for name in DTYPE_NAMES:
        # the large size for a few dtypes, with 2 and 3 ranks (4 ranks oversubscribe small CI machines)
        large = name in ("float32", "bfloat16", "float16", "int64", "bool") and ws < 4
        sizes = SIZES if large else SIZES[:4]
        for n in sizes:
            for op in OPS:
                if not op_valid(name, op):
                    continue
                ins = [rank_input(name, n, r, input_kind(name, op)) for r in range(ws)]
                want = reduce_ref(ins, op, name)
                exact = op != "AVG"
                a = ins[rank].copy()
                lab = f"all_reduce {name} {op} n={n}"
                if ck.call(lab, lambda: dist.all_reduce(a, op=_op(op))):
                    ck.expect(lab, mismatch(a, want, name, exact=exact))
                a = ins[rank].copy()
                lab = f"all_reduce async {name} {op} n={n}"
                if ck.call(lab, lambda: dist.all_reduce(a, op=_op(op), async_op=True).wait(60)):
                    ck.expect(lab, mismatch(a, want, name, exact=exact))
                dst = n % ws
                a = ins[rank].copy()
                lab = f"reduce {name} {op} n={n} dst={dst}"
                if ck.call(lab, lambda: dist.reduce(a, dst, op=_op(op))):
                    ck.expect(lab, mismatch(a, want if rank == dst else ins[rank], name,
                                            exact=exact))
                # reduce_scatter: a list and one tensor
                chunks = [[rank_input(name, n, 10 + r * ws + i, input_kind(name, op))
                           for i in range(ws)] for r in range(ws)]
                want_rs = reduce_ref([chunks[r][rank] for r in range(ws)], op, name)
                out = garbage(name, n)
                lab = f"reduce_scatter {name} {op} n={n}"
                if ck.call(lab, lambda: dist.reduce_scatter(out, [c.copy() for c in chunks[rank]],
                                                            op=_op(op))):
                    ck.expect(lab, mismatch(out, want_rs, name, exact=exact))
                out = garbage(name, n)
                big = np.concatenate(chunks[rank])
                lab = f"reduce_scatter_tensor {name} {op} n={n}"
                asy = n % 2 == 1  # blocking (the fast path) and async, alternately

                def rst():
                    w = dist.reduce_scatter_tensor(out, big, op=_op(op), async_op=asy)
                    if asy:
                        w.wait(60)
                if ck.call(lab, rst):
                    ck.expect(lab, mismatch(out, want_rs, name, exact=exact))
            ins = [rank_input(name, n, r, _ik(name)) for r in range(ws)]
            src = (n + 1) % ws
            a = ins[rank].copy()
            lab = f"broadcast {name} n={n} src={src}"
            if ck.call(lab, lambda: dist.broadcast(a, src)):
                ck.expect(lab, same_bytes(a, ins[src]))
            outs = [garbage(name, n) for _ in range(ws)]
            lab = f"all_gather {name} n={n}"
            if ck.call(lab, lambda: dist.all_gather(outs, ins[rank])):
                for i in range(ws):
                    ck.expect(f"{lab} [{i}]", same_bytes(outs[i], ins[i]))
            out = garbage(name, ws * n)
            lab = f"all_gather_into_tensor {name} n={n}"
            if ck.call(lab, lambda: dist.all_gather_into_tensor(out, ins[rank])):
                ck.expect(lab, same_bytes(out, np.concatenate(ins)))
            dst = n % ws
            lst = [garbage(name, n) for _ in range(ws)] if rank == dst else None
            lab = f"gather {name} n={n} dst={dst}"
            if ck.call(lab, lambda: dist.gather(ins[rank], lst, dst=dst)) and rank == dst:
                for i in range(ws):
                    ck.expect(f"{lab} [{i}]", same_bytes(lst[i], ins[i]))
            chunks = [rank_input(name, n, 50 + i, _ik(name)) for i in range(ws)]
            out = garbage(name, n)
            lab = f"scatter {name} n={n} src={src}"
            if ck.call(lab, lambda: dist.scatter(out, chunks if rank == src else None, src=src)):
                ck.expect(lab, same_bytes(out, chunks[rank]))
            # all_to_all: lists, then one tensor with uneven splits
            blocks = [[rank_input(name, n + i, 100 + r * ws + i, _ik(name)) for i in range(ws)]
                      for r in range(ws)]
            outs = [garbage(name, n + rank) for _ in range(ws)]
            lab = f"all_to_all {name} n={n}"
            if ck.call(lab, lambda: dist.all_to_all(outs, blocks[rank])):
                for i in range(ws):
                    ck.expect(f"{lab} [{i}]", same_bytes(outs[i], blocks[i][rank]))
            out = garbage(name, ws * n + ws * rank)
            lab = f"all_to_all_single {name} n={n}"
            if ck.call(lab, lambda: dist.all_to_all_single(
                    out, np.concatenate(blocks[rank]), [n + rank] * ws,
                    [n + i for i in range(ws)], async_op=True).wait(60)):
                ck.expect(lab, same_bytes(out, np.concatenate([blocks[i][rank]
                                                               for i in range(ws)])))
    ck.call("barrier", lambda: dist.barrier())
    ck.call("barrier async", lambda: dist.barrier(async_op=True).wait(60))
    ck.call("monitored_barrier", lambda: dist.monitored_barrier())


def misc(ck, rank, ws):
    """p2p, object collectives, async Work, new_group, torch tensors, MPI errors, mismatches."""
    ck.expect("rank from MPI", None if (rank, ws) == (int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                                      int(os.environ["OMPI_COMM_WORLD_SIZE"]))
              else f"rank {rank} of {ws}")
    ck.expect("get_backend", None if dist.get_backend() == "mpi" else dist.get_backend())
    ck.expect("is_mpi_available", None if dist.is_mpi_available() else "False")
    # the check and the small blocking collectives call MPI from C (_C.MpiComm) unless
    # PYDDP_MPI_FROM_C=0, which leaves every call to mpi4py
    from pyddp.distributed import distributed_c10d as c10d
    be = c10d._world.default_pg._cpg
    from_c = os.environ.get("PYDDP_MPI_FROM_C", "1") != "0"
    ck.expect("MPI called from C", None if (be._mc is not None) == from_c and
              (type(be.fast).__name__ == "builtin_function_or_method") == from_c
              else f"{be._mc!r} {be.fast!r}")
    # p2p: a ring with tags, any-source receive, batch_isend_irecv
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    x = np.arange(5, dtype=np.float64) + rank
    y = np.zeros(5)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt, tag=3),
                                   dist.P2POp(dist.irecv, y, prv, tag=3)])
    for w in reqs:
        w.wait(60)
    ck.expect("ring", mismatch(y, np.arange(5, dtype=np.float64) + prv, "float64"))
    if rank == 0:
        got = set()
        for _ in range(ws - 1):
            z = np.zeros(1, np.int32)
            got.add(dist.recv(z))
            ck.expect("recv any source value", None if z[0] == 7 else z)
        ck.expect("recv any source ranks", None if got == set(range(1, ws)) else got)
    else:
        dist.send(np.array([7], np.int32), 0)
    # object collectives
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    ck.expect("all_gather_object", None if objs == [{"rank": r, "s": "x" * r} for r in range(ws)]
              else objs)
    lst = [("hello", rank)] if rank == 1 else [None]
    dist.broadcast_object_list(lst, src=1)
    ck.expect("broadcast_object_list", None if lst == [("hello", 1)] else lst)
    g = [None] * ws if rank == 0 else None
    dist.gather_object(rank * 10, g, dst=0)
    if rank == 0:
        ck.expect("gather_object", None if g == [r * 10 for r in range(ws)] else g)
    out = [None]
    dist.scatter_object_list(out, [f"o{r}" for r in range(ws)] if rank == 0 else None, src=0)
    ck.expect("scatter_object_list", None if out == [f"o{rank}"] else out)
    # async Work
    a = np.full(1 << 16, rank + 1.0, np.float32)
    w = dist.all_reduce(a, async_op=True)
    w.wait(timeout=60)
    ck.expect("async all_reduce", None if w.is_completed() and a[0] == ws * (ws + 1) / 2 else a[:2])
    ck.expect("async result", None if w.result()[0] is a else "result")
    # new_group: the odd ranks, and every rank but 0
    odd = [r for r in range(ws) if r % 2]
    sub = dist.new_group(odd)
    if rank in odd:
        b = np.array([rank], np.int64)
        dist.all_reduce(b, group=sub)
        ck.expect("new_group all_reduce", None if b[0] == sum(odd) else b)
        ck.expect("new_group rank", None if dist.get_rank(sub) == odd.index(rank) else "rank")
    else:
        ck.expect("non-member", None if sub is dist.GroupMember.NON_GROUP_MEMBER else sub)
    rest = dist.new_group(list(range(1, ws)))
    if rank >= 1:
        b = np.array([1.0])
        dist.broadcast(b * rank, src=ws - 1, group=rest)
        c = np.array([float(rank)])
        dist.broadcast(c, src=ws - 1, group=rest)
        ck.expect("new_group broadcast", None if c[0] == ws - 1 else c)
    # torch CPU tensors, zero-copy
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        for tdt in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
            t = torch.full((9,), float(rank + 1), dtype=tdt)
            dist.all_reduce(t)
            ck.expect(f"torch all_reduce {tdt}", None if bool((t == ws * (ws + 1) // 2).all())
                      else t)
        # rank 0 on the fast path (a NumPy array), the others on the general one (tensors):
        # both check the same signature
        m = np.ones(3, np.float32) if rank == 0 else torch.ones(3)
        dist.all_reduce(m)
        ck.expect("fast and general paths mixed", None if float(m[0]) == ws else m)
        t = torch.arange(4, dtype=torch.float64) * (rank + 1)
        outs = [torch.zeros(4, dtype=torch.float64) for _ in range(ws)]
        dist.all_gather(outs, t)
        ck.expect("torch all_gather", None if all(bool((outs[r] == torch.arange(4) * (r + 1)).all())
                                                  for r in range(ws)) else outs)
    # an MPI error: a message longer than the receive buffer (MPI_ERR_TRUNCATE)
    if rank == 0:
        dist.send(np.ones(8, np.float32), 1, tag=9)
    elif rank == 1:
        try:
            dist.recv(np.zeros(2, np.float32), 0, tag=9)
            ck.expect("truncate raises", "no error")
        except dist.DistBackendError as e:
            ck.expect("truncate message", None if "MPI error" in str(e) and "truncat" in
                      str(e).lower() else str(e))
    dist.barrier()
    # mismatch detection, on a group of its own (the group is broken afterwards)
    mm = dist.new_group(list(range(ws)))
    a = np.zeros(4 if rank else 8, np.float32)
    try:
        dist.all_reduce(a, group=mm)
        ck.expect("mismatch raises", "no error")
    except dist.DistBackendError as e:
        ck.expect("mismatch message", None if "mismatched collectives" in str(e) and
                  "count=8" in str(e) and "count=4" in str(e) else str(e))
    try:
        dist.all_reduce(a, group=mm)
        ck.expect("broken group raises", "no error")
    except dist.DistBackendError:
        pass
    b = np.zeros(3, np.float32) if rank else np.zeros(3, np.int32)
    mm2 = dist.new_group(list(range(ws)))
    try:
        if rank == 0:
            dist.broadcast(b, 0, group=mm2)
        else:
            dist.all_reduce(b, group=mm2)
        ck.expect("kind mismatch raises", "no error")
    except dist.DistBackendError as e:
        ck.expect("kind mismatch message", None if "broadcast" in str(e) and "all_reduce" in
                  str(e) else str(e))
    # a rank that never arrives: a timeout, not a hang
    late = dist.new_group(list(range(ws)), timeout=1.0)
    if rank == 0:
        try:
            dist.all_reduce(np.ones(1), group=late)
            ck.expect("timeout raises", "no error")
        except dist.DistBackendError as e:
            ck.expect("timeout message", None if "timeout" in str(e) else str(e))
    dist.barrier()  # the default group still works
    c = np.ones(2)
    dist.all_reduce(c)
    ck.expect("default group after failures", None if c[0] == ws else c)


def cuda_logic(ck, rank, ws):
    """The CUDA-aware decision (no GPU here): PYDDP_MPI_CUDA_AWARE overrides the query."""
    from pyddp.distributed.backends.mpi import backend as _mpi
    os.environ["PYDDP_MPI_CUDA_AWARE"] = "1"
    ck.expect("env 1", None if _mpi.cuda_aware() else "False")
    os.environ["PYDDP_MPI_CUDA_AWARE"] = "0"
    ck.expect("env 0", None if not _mpi.cuda_aware() else "True")
    del os.environ["PYDDP_MPI_CUDA_AWARE"]
    ck.expect("query", None if isinstance(_mpi.cuda_aware(), bool) else "not bool")


class _CudaStandIn:
    """The 'cuda' half of a mixed backend string where no GPU is usable (nccl needs one)."""

    def submit(self, *args):
        raise RuntimeError("no CUDA arrays in this test")

    def destroy(self):
        pass


def _mixed_backend():
    import pyddp.cuda

    if dist.is_nccl_available() and pyddp.cuda.is_available():
        return "cpu:mpi,cuda:nccl"
    dist.Backend.register_backend("standin", lambda *a: _CudaStandIn(), devices="cuda")
    return "cpu:mpi,cuda:standin"


def mixed(ck, rank, ws):
    """'cpu:mpi,cuda:nccl' (a stand-in for nccl without a GPU): host arrays on MPI, the
    rendezvous of the other backend through env:// (mpirun's variables)."""
    ck.expect("backend", None if dist.get_backend().startswith("cpu:mpi,cuda:") else
              dist.get_backend())
    a = np.full(3, rank + 1, np.int32)
    dist.all_reduce(a)
    ck.expect("all_reduce", None if (a == ws * (ws + 1) // 2).all() else a)
    objs = [None] * ws
    dist.all_gather_object(objs, rank)
    ck.expect("all_gather_object", None if objs == list(range(ws)) else objs)


def mixed_hosts(ck, rank, ws):
    """As mixed, with every rank pretending to be alone on its host: env:// cannot default
    MASTER_ADDR, so it comes from MPI (rank 0's host name)."""
    import socket

    ck.expect("MASTER_ADDR from MPI", None if os.environ.get("MASTER_ADDR") == socket.gethostname()
              else os.environ.get("MASTER_ADDR"))
    mixed(ck, rank, ws)


def main():
    suite, outdir = sys.argv[1], sys.argv[2]
    if suite == "mixed_hosts":
        os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"  # as if each rank were on its own host
        os.environ.pop("MASTER_ADDR", None)
    backend = _mixed_backend() if suite.startswith("mixed") else "mpi"
    dist.init_process_group(backend)
    rank, ws = dist.get_rank(), dist.get_world_size()
    ck = Checker(rank)
    try:
        {"colls": colls, "misc": misc, "mixed": mixed, "mixed_hosts": mixed_hosts,
         "cuda_logic": cuda_logic}[suite](ck, rank, ws)
    except Exception as e:  # noqa: BLE001 - reported to the test
        import traceback
        ck.failures.append(f"raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(ck.report(), f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
