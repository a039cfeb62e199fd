"""``init_process_group("cpu:pyddp,cuda:nccl")`` on the "pyddp" torch backend, and CUDA arrays on a
"pyddp" group routed to pyddp's own NCCL backend, without a GPU: the ranks load the test-only
stand-ins for libcudart and libnccl (tests/fakecuda), as tests/cuda/test_nccl_backend.py does, and call
ProcessGroupPyddp's methods (what torch's API calls) with fakecuda arrays exposing
``__cuda_array_interface__``.  Every rank is a fresh interpreter (spawn).  tests/gpu/ runs real
torch CUDA tensors on "cpu:pyddp,cuda:nccl".
"""
import contextlib
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
    out["nccl_after_cpu"] = pg._cuda.nccl is not None  # lazily: not yet
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
    out["nccl"] = type(pg._cuda.nccl).__name__
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
    # the future completes at launch (torch's NCCL future): the caller's stream held, the value is
    # there at once, and reading it on its stream comes after the collective
    s = fakecuda.Stream(rank)
    x = fakecuda.DeviceArray(mine, device=rank, stream=s)
    release = s.hold()  # the collective cannot start before this stream's work
    try:
        fut = pg.allreduce([x], asy).get_future()
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


def _future_child(rank, n):
    import threading

    from torch._C import _distributed_c10d as dist_mod

    dist = _init(rank, n)
    pg = dist.group.WORLD
    asy = dist_mod.AllreduceOptions()
    asy.asyncOp = True
    s = fakecuda.Stream(rank)
    x = fakecuda.DeviceArray(np.full(4, rank + 1.0, np.float32), device=rank, stream=s)
    release = s.hold()  # a kernel still running on x's stream: the collective must wait for it
    try:
        t0 = time.monotonic()
        work = pg.allreduce([x], asy)
        fut = work.get_future()
        ran_on = []
        chained = fut.then(lambda f: ran_on.append(threading.get_ident()) or f.value()[0])
        out = {"launch_s": time.monotonic() - t0, "done": fut.done(), "value": fut.value()[0] is x,
               "chained": chained.done() and chained.value() is x,
               "then_here": ran_on == [threading.get_ident()],
               "work_completed": work.is_completed(),
               "threads": [t.name for t in threading.enumerate() if "futures" in t.name]}
    finally:
        release.set()
    out["got"] = x.numpy().tolist()  # read on x's stream: after the collective
    dist.destroy_process_group()
    return out


def test_cuda_futures_complete_at_launch_and_order_the_consumers_stream():
    # torch's NCCL Work future: complete at launch, consumers ordered on the GPU; not a host wait on
    # a watcher thread, whose then() callbacks ran on that thread (issue 33 item 10)
    n = 2
    for out in run(_future_child, n, init=False, env=fakecuda.env(devices=n), timeout=120,
                   start_method="spawn"):
        assert out["done"] and out["value"] and out["chained"] and out["then_here"], out
        assert not out["work_completed"] and out["launch_s"] < 0.5, out  # the kernel still held it
        assert out["threads"] == []  # no futures thread for CUDA works
        assert out["got"] == [3.0] * 4


class _FakeFuture:
    """What _cuda_future may call of torch.futures.Future, recording the current streams."""

    made = []

    def __init__(self, devices=None):
        self.devices, self.calls = devices, []
        _FakeFuture.made.append(self)

    def set_result(self, value):
        self.calls.append(("set_result", value, list(_current)))

    def set_exception(self, e):
        self.calls.append(("set_exception", e, list(_current)))


_current = []  # the fake torch.cuda.stream contexts entered, innermost last


@contextlib.contextmanager
def _fake_stream_ctx(stream):
    _current.append(stream)
    try:
        yield
    finally:
        _current.pop()


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it is on cuda:1 (this torch build has no CUDA)."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", 1)


class _FakeNcclWork:
    def __init__(self, comm):
        self.comm, self.calls = comm, []

    def wait(self, timeout=None):
        self.calls.append("wait")

    def synchronize_host(self, timeout):
        self.calls.append("synchronize_host")


def test_torch_cuda_tensor_futures_record_their_events_on_the_communicators_stream(monkeypatch):
    """The torch-tensor half of _cuda_future, which needs CUDA torch: the future is made for the
    tensors' devices and its result set while the communicator's stream is current (so torch records
    its events there, after the collective); nothing waits on the host or on the caller's stream."""
    import types

    from pyddp import torch_backend as tb

    monkeypatch.setattr(tb.work, "Future", _FakeFuture)  # (torch_bridge.work makes the futures)
    monkeypatch.setattr(torch.cuda, "stream", _fake_stream_ctx)
    monkeypatch.setattr(torch.cuda, "ExternalStream",
                        lambda ptr, device=None: ("external", ptr, device))
    _FakeFuture.made.clear()
    comm = types.SimpleNamespace(stream=0x7f00, device=1)
    nws = [_FakeNcclWork(comm), _FakeNcclWork(comm)]
    t = torch.zeros(3).as_subclass(_CudaLike)
    pg = types.SimpleNamespace(_watch=lambda w: pytest.fail("a CUDA work went to the watcher"))
    work = tb.Work(tuple(tb._CudaHandle(nw) for nw in nws), [t], pg)
    fut = work.get_future()
    assert fut is work.get_future() is _FakeFuture.made[0] and len(_FakeFuture.made) == 1
    assert fut.devices == [torch.device("cuda", 1)]
    ((call, value, streams),) = fut.calls
    assert call == "set_result" and value == [t] and value[0] is t
    assert streams == [("external", 0x7f00, torch.device("cuda", 1))]  # one per communicator
    assert all(nw.calls == [] for nw in nws)  # no host wait, no wait on the caller's stream
    assert _current == []


def test_cuda_array_futures_order_the_arrays_stream_at_launch(monkeypatch):
    """Arrays that are not torch tensors (read on the stream their __cuda_array_interface__ names):
    that stream waits now (NcclWork.wait(), no host block), then the plain future completes."""
    import types

    from pyddp import torch_backend as tb

    monkeypatch.setattr(tb.work, "Future", _FakeFuture)  # (torch_bridge.work makes the futures)
    _FakeFuture.made.clear()
    nw = _FakeNcclWork(types.SimpleNamespace(stream=0x7f00, device=0))
    arr = object()
    pg = types.SimpleNamespace(_watch=lambda w: pytest.fail("a CUDA work went to the watcher"))
    fut = tb.Work((tb._CudaHandle(nw),), [arr], pg).get_future()
    assert fut.devices is None and nw.calls == ["wait"]
    assert [(c, v) for c, v, _ in fut.calls] == [("set_result", [arr])]


def _mixed_future_child(rank, n):
    from torch._C import _distributed_c10d as dist_mod

    dist = _init(rank, n)
    pg = dist.group.WORLD
    asy = dist_mod.AllreduceOptions()
    asy.asyncOp = True
    t = torch.full((3,), rank + 1.0)
    x = fakecuda.DeviceArray(np.full(4, rank + 1.0, np.float32), device=rank)
    fut = pg.allreduce([t, x], asy).get_future()  # one CPU and one CUDA work: the watcher completes it
    fut.wait()
    out = {"cpu": t.tolist(), "cuda": x.numpy().tolist(), "contexts": sorted(fakecuda.contexts())}
    dist.destroy_process_group()
    return out


def test_a_future_completed_on_the_watcher_thread_creates_no_context_on_another_gpu():
    # the watcher thread never set a device: its CUDA wait would make a context on GPU 0 (issue 33
    # item 3); rank 1 uses only GPU 1
    outs = run(_mixed_future_child, 2, init=False, env=fakecuda.env(devices=2), timeout=120,
               start_method="spawn")
    for rank, out in enumerate(outs):
        assert out["cpu"] == [3.0] * 3 and out["cuda"] == [3.0] * 4, out
        assert out["contexts"] == [rank], out


class _HostWork:
    def __init__(self, log):
        self.log = log

    def wait(self, timeout=None):
        self.log.append(("host wait",))

    def is_completed(self):
        return False


def test_the_futures_thread_sets_the_communicators_device_before_a_cuda_wait(monkeypatch):
    """A work mixing CPU and CUDA arrays still completes its future on the watcher thread: that
    thread makes the communicator's device current before its host wait on the CUDA work (on its
    default device, CUDA would create a context on GPU 0; issue 33 item 3)."""
    import queue
    import threading
    import types

    from pyddp import torch_backend as tb

    log = []
    monkeypatch.setattr(tb._C, "cuda_set_device",
                        lambda d: log.append(("set_device", d, threading.get_ident())))
    nw = _FakeNcclWork(types.SimpleNamespace(stream=0x7f00, device=3))
    nw.be = types.SimpleNamespace(timeout=5.0)
    nw.synchronize_host = lambda timeout: log.append(("synchronize_host", threading.get_ident()))
    q = queue.SimpleQueue()
    work = tb.Work((_HostWork(log), tb._CudaHandle(nw)), [], types.SimpleNamespace(_watch=q.put))
    fut = work.get_future()
    q.put(None)
    t = threading.Thread(target=tb.ProcessGroupPyddp._watcher, args=(q,))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and fut.done()
    assert [e[0] for e in log] == ["set_device", "host wait", "synchronize_host"]
    assert log[0][1] == 3 and log[0][2] == log[2][1] == t.ident


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
        assert out["future_done_while_held"] is True
        assert out["ring"] and out["coalesced_ring"]
