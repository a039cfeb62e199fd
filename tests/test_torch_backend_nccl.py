"""``init_process_group("cpu:pyddp,cuda:nccl")`` on the "pyddp" torch backend, and CUDA arrays on a
"pyddp" group routed to pyddp's own NCCL backend, without a GPU: the ranks load the test-only
stand-ins for libcudart and libnccl (tests/fakecuda), as tests/test_nccl_backend.py does, and call
ProcessGroupPyddp's methods (what torch's API calls) with fakecuda arrays exposing
``__cuda_array_interface__``.  Every rank is a fresh interpreter (spawn).  tests/gpu/ runs real
torch CUDA tensors on "cpu:pyddp,cuda:nccl".
"""
import datetime
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fakecuda  # noqa: E402
from _mp import run  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _init(rank, world_size, backend="cpu:pyddp,cuda:nccl"):
    import datetime

    import torch.distributed as dist

    import pyddp.cuda
    import pyddp.torch_backend  # noqa: F401

    pyddp.cuda.set_device(rank)  # one (fake) GPU per rank, as torch.cuda.set_device in a script
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    return dist


def _dev(a, rank):
    return fakecuda.DeviceArray(np.asarray(a), device=rank)


def _cpu_and_cuda_child(rank, n):
    from torch._C import _distributed_c10d as dist_mod

    from pyddp.torch_backend import ProcessGroupPyddp

    dist = _init(rank, n)
    pg = dist.group.WORLD
    out = {"type": type(pg) is ProcessGroupPyddp, "backend": dist.get_backend(),
           "transport": pg.transport, "bad": []}
    bad = out["bad"]

    def check(what, got, want):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape or not np.allclose(got, want):
            bad.append(f"rank {rank} {what}: got {got.tolist()} want {want.tolist()}")

    # (a) CPU tensors: torch's API on pyddp's C core, as on gloo
    gloo = dist.new_group(backend="gloo")
    for g in (None, gloo):
        t = torch.arange(4.0) + rank
        dist.all_reduce(t, group=g)
        check(f"cpu all_reduce {g}", t.numpy(), sum(np.arange(4.0) + r for r in range(n)))
        o = torch.zeros(3 * n)
        dist.all_gather_into_tensor(o, torch.full((3,), float(rank)), group=g)
        check(f"cpu all_gather_into_tensor {g}", o.numpy(), np.repeat(np.arange(n), 3))
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})  # torch picks cpu for objects on this group
    check("all_gather_object", [o["rank"] for o in objs], np.arange(n))
    out["nccl_after_cpu"] = pg.__dict__.get("_nccl") is not None  # lazily: not yet
    out["comms_after_cpu"] = fakecuda.comm_count()

    # (b) CUDA arrays through ProcessGroupPyddp's methods: pyddp's NCCL backend
    base = [np.arange(6, dtype=np.float32) % 3 + r + 1 for r in range(n)]
    mine = base[rank]
    sync = dist_mod.AllreduceOptions()  # asyncOp False, as torch's blocking call passes
    sync.asyncOp = False
    for op, ref in ((dist.ReduceOp.SUM, np.sum), (dist.ReduceOp.MAX, np.max),
                    (dist.ReduceOp.AVG, np.mean)):
        x = _dev(mine, rank)
        sync.reduceOp = op
        pg.allreduce([x], sync).wait(datetime.timedelta(seconds=60))
        check(f"allreduce {op}", x.numpy(), ref(np.stack(base), axis=0))
    out["nccl"] = type(pg.__dict__.get("_nccl")).__name__
    out["comms"] = fakecuda.comm_count()
    x = _dev(mine, rank)
    opts = dist_mod.BroadcastOptions()
    opts.rootRank = n - 1
    pg.broadcast([x], opts).wait(datetime.timedelta(seconds=60))
    check("broadcast", x.numpy(), base[n - 1])
    x = _dev(mine, rank)
    opts = dist_mod.ReduceOptions()
    opts.rootRank = 0
    pg.reduce([x], opts).wait(datetime.timedelta(seconds=60))
    if rank == 0:
        check("reduce", x.numpy(), sum(base))
    outs = [_dev(np.zeros(6, np.float32), rank) for _ in range(n)]
    pg.allgather([outs], [_dev(mine, rank)]).wait(datetime.timedelta(seconds=60))
    for r in range(n):
        check(f"allgather[{r}]", outs[r].numpy(), base[r])
    o = _dev(np.zeros(6 * n, np.float32), rank)
    ag = dist_mod.AllgatherOptions()
    ag.asyncOp = False
    pg._allgather_base(o, _dev(mine, rank), ag).wait(datetime.timedelta(seconds=60))
    check("_allgather_base", o.numpy(), np.concatenate(base))
    o = _dev(np.zeros(6 * n, np.float32), rank)
    w = pg.allgather_into_tensor_coalesced([o], [_dev(mine, rank)])
    w.wait(datetime.timedelta(seconds=60))
    check("allgather_into_tensor_coalesced", o.numpy(), np.concatenate(base))
    o = _dev(np.zeros(6, np.float32), rank)
    rs = dist_mod.ReduceScatterOptions()
    rs.asyncOp = False
    pg._reduce_scatter_base(o, _dev(np.concatenate([mine] * n), rank), rs).wait(datetime.timedelta(seconds=60))
    check("_reduce_scatter_base", o.numpy(), sum(base))
    o = _dev(np.zeros(6, np.float32), rank)
    pg.reduce_scatter([o], [[_dev(mine, rank) for _ in range(n)]]).wait(datetime.timedelta(seconds=60))
    check("reduce_scatter", o.numpy(), sum(base))
    send = np.concatenate([np.full(j + 1, 10 * rank + j) for j in range(n)]).astype(np.float32)
    recv = _dev(np.zeros(n * (rank + 1), np.float32), rank)
    pg.alltoall_base(recv, _dev(send, rank), [rank + 1] * n, [j + 1 for j in range(n)]).wait(datetime.timedelta(seconds=60))
    check("alltoall_base", recv.numpy(),
          np.concatenate([np.full(rank + 1, 10 * j + rank) for j in range(n)]))
    # a ring of sends and receives, large enough that NCCL must see them as one group: as
    # torch's batch_isend_irecv issues them on this group (one by one), and coalesced
    right, left = (rank + 1) % n, (rank - 1) % n
    big = [np.arange(1 << 16, dtype=np.float32) + r for r in range(n)]
    o = _dev(np.zeros(1 << 16, np.float32), rank)
    works = [pg.send([_dev(big[rank], rank)], right, 0), pg.recv([o], left, 0)]
    for w in works:
        w.wait(datetime.timedelta(seconds=60))
    out["ring"] = bool(np.array_equal(o.numpy(), big[left]))
    o = _dev(np.zeros(1 << 16, np.float32), rank)
    pg._start_coalescing()
    pg.send([_dev(big[rank], rank)], right, 0)
    pg.recv([o], left, 0)
    pg._end_coalescing().wait(datetime.timedelta(seconds=60))
    out["coalesced_ring"] = bool(np.array_equal(o.numpy(), big[left]))
    o = _dev(np.zeros(6, np.float32), rank)  # blocking, in order: rank 0 sends first
    if rank == 0:
        pg.send([_dev(mine, rank)], right, 0).wait(datetime.timedelta(seconds=60))
        pg.recv([o], left, 0).wait(datetime.timedelta(seconds=60))
    else:
        pg.recv([o], left, 0).wait(datetime.timedelta(seconds=60))
        pg.send([_dev(mine, rank)], right, 0).wait(datetime.timedelta(seconds=60))
    check("send/recv in order", o.numpy(), base[left])
    # asynchronous, with a future
    x = _dev(mine, rank)
    asy = dist_mod.AllreduceOptions()
    asy.asyncOp = True
    fut = pg.allreduce([x], asy).get_future()
    fut.wait()
    check("allreduce future", x.numpy(), sum(base))
    # the future completes once the result is there: the caller's stream held, it waits
    s = fakecuda.Stream(rank)
    x = fakecuda.DeviceArray(mine, device=rank, stream=s)
    release = s.hold()  # the collective cannot start before this stream's work
    try:
        fut = pg.allreduce([x], asy).get_future()
        time.sleep(0.5)
        out["future_done_while_held"] = fut.done()
    finally:
        release.set()
    fut.wait()
    check("allreduce future after a held stream", x.numpy(), sum(base))
    try:  # one call, two devices: named, not run
        pg._allgather_base(_dev(np.zeros(2 * n, np.float32), rank), torch.zeros(2))
        bad.append("a call mixing a CUDA array and a CPU tensor did not raise")
    except ValueError as e:
        out["mixed"] = str(e)
    x = _dev(np.ones(4 + rank, np.float32), rank)  # a different count on every rank
    try:
        pg.allreduce([x], sync).wait(datetime.timedelta(seconds=60))
        bad.append("a mismatched CUDA allreduce returned")
    except dist.DistBackendError as e:
        out["mismatch"] = str(e)
    dist.barrier()  # the CPU side is unaffected
    dist.destroy_process_group()
    out["comms_after_destroy"] = fakecuda.comm_count()
    return out


@pytest.mark.parametrize("n", [3])
def test_cpu_pyddp_cuda_nccl_routes_cuda_arrays_to_pyddps_nccl(n):
    """(a) the group starts and runs CPU tensors on pyddp's C core; (b) CUDA arrays given to its
    methods run on pyddp's NCCL backend (one communicator, created lazily), a mismatch among them
    raises DistBackendError on every rank."""
    outs = run(_cpu_and_cuda_child, n, init=False, env=fakecuda.env(devices=n), timeout=180,
               start_method="spawn")
    for rank, out in enumerate(outs):
        assert out["type"], f"rank {rank}: the group is not a ProcessGroupPyddp"
        assert out["backend"] == "cpu:pyddp,cuda:nccl"
        assert out["transport"] == "shm"
        assert not out["bad"], "\n".join(out["bad"])
        assert not out["nccl_after_cpu"] and out["comms_after_cpu"] == 0
        assert out["nccl"] == "NcclBackend" and out["comms"] == 1, out
        assert "all tensors of one call must be on one device" in out["mixed"], out["mixed"]
        assert "all_reduce" in out["mismatch"] or "allreduce" in out["mismatch"], out["mismatch"]
        assert out["comms_after_destroy"] == 0
        assert out["future_done_while_held"] is False
        assert out["ring"] and out["coalesced_ring"]
