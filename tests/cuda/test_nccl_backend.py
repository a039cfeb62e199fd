"""Backend "nccl" on CUDA arrays, run without a GPU against the test-only stand-ins for libcudart and
libnccl in tests/fakecuda (device memory in host memory, streams as worker threads, NCCL across
processes through shared memory, hangs until ncclCommAbort as real NCCL).  What runs here is
pyddp's own code: loading, the array adapter on CUDA memory, stream ordering, Work, the signature
check, the watchdog, abort, dispatch by device and staging.  Every rank is a fresh interpreter
(spawn): CUDA libraries load once per process, and the pytest process may have loaded the real
ones.  tests/gpu/ runs the same paths on a real GPU.
"""
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import fakecuda
from _mp import free_port, run, run_outcomes
from _tiers import FULL, full

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is in the test extra
    ml_dtypes = None

pytestmark = pytest.mark.timeout(180)


def _env(devices=2, **kw):
    return fakecuda.env(devices=devices, **kw)


def _spawn(fn, n, *args, env=None, timeout=90, **kw):
    return run(fn, n, *args, init=False, env=env or _env(), timeout=timeout, start_method="spawn",
               **kw)


def _outcomes(fn, n, *args, env=None, timeout=90, **kw):
    return run_outcomes(fn, n, *args, init=False, env=env or _env(), timeout=timeout,
                        start_method="spawn", **kw)


def _init(rank, backend="nccl", device=None, **kw):
    import pyddp.cuda as cuda
    import pyddp.distributed as dist

    cuda.set_device(rank % 2 if device is None else device)
    dist.init_process_group(backend, **kw)
    return dist


def _dev(a, rank, **kw):
    if ml_dtypes is not None and np.asarray(a).dtype == ml_dtypes.bfloat16:
        kw.setdefault("protocol", "dlpack")
    return fakecuda.DeviceArray(a, device=rank % 2, **kw)


# --------------------------------------------------------------------------- every collective

_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bfloat16"]


def _np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def _all_collectives(rank, n, dtypes):
    dist = _init(rank)
    bad = []

    def check(what, got, want):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-2, atol=1e-2):
            bad.append(f"rank {rank} {what}: got {got.tolist()} want {want.tolist()}")

    for name in dtypes:
        dt = _np_dtype(name)
        base = [(np.arange(6) % 3 + r + 1).astype(dt) for r in range(n)]
        mine = base[rank]
        f64 = [b.astype(np.float64) for b in base]
        for op, ref in ((dist.ReduceOp.SUM, np.sum), (dist.ReduceOp.PRODUCT, np.prod),
                        (dist.ReduceOp.MIN, np.min), (dist.ReduceOp.MAX, np.max)):
            x = _dev(mine, rank)
            dist.all_reduce(x, op=op)
            check(f"{name} all_reduce {op.name}", x.numpy(), ref(np.stack(f64), axis=0))
        if name.startswith(("float", "bfloat")):
            x = _dev(mine, rank)
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            check(f"{name} all_reduce AVG", x.numpy(), np.mean(np.stack(f64), axis=0))
        x = _dev(mine, rank)
        dist.broadcast(x, src=n - 1)
        check(f"{name} broadcast", x.numpy(), f64[n - 1])
        x = _dev(mine, rank)
        dist.reduce(x, dst=0)
        check(f"{name} reduce", x.numpy(), sum(f64) if rank == 0 else f64[rank])
        outs = [_dev(np.zeros(6, dt), rank) for _ in range(n)]
        dist.all_gather(outs, _dev(mine, rank))
        for r in range(n):
            check(f"{name} all_gather[{r}]", outs[r].numpy(), f64[r])
        o = _dev(np.zeros(6 * n, dt), rank)
        dist.all_gather_into_tensor(o, _dev(mine, rank))
        check(f"{name} all_gather_into_tensor", o.numpy(), np.concatenate(f64))
        full = [np.concatenate([b] * n) for b in base]  # rank r's input: n chunks of base[r]
        o = _dev(np.zeros(6, dt), rank)
        dist.reduce_scatter_tensor(o, _dev(full[rank], rank))
        check(f"{name} reduce_scatter_tensor", o.numpy(), sum(f64))
        o = _dev(np.zeros(6, dt), rank)
        dist.reduce_scatter(o, [_dev(mine, rank) for _ in range(n)])
        check(f"{name} reduce_scatter", o.numpy(), sum(f64))
        ins = [_dev(np.full(2, 10 * rank + j, dt), rank) for j in range(n)]
        outs = [_dev(np.zeros(2, dt), rank) for _ in range(n)]
        dist.all_to_all(outs, ins)
        for j in range(n):
            check(f"{name} all_to_all[{j}]", outs[j].numpy(), np.full(2, 10 * j + rank))
        # all_to_all_single with uneven splits: rank r sends j+1 rows to rank j
        send = np.concatenate([np.full(j + 1, 10 * rank + j) for j in range(n)]).astype(dt)
        recv = _dev(np.zeros(n * (rank + 1), dt), rank)
        dist.all_to_all_single(recv, _dev(send, rank), output_split_sizes=[rank + 1] * n,
                               input_split_sizes=[j + 1 for j in range(n)])
        want = np.concatenate([np.full(rank + 1, 10 * j + rank) for j in range(n)])
        check(f"{name} all_to_all_single", recv.numpy(), want)
        gl = [_dev(np.zeros(6, dt), rank) for _ in range(n)] if rank == 0 else None
        dist.gather(_dev(mine, rank), gl, dst=0)
        if rank == 0:
            for r in range(n):
                check(f"{name} gather[{r}]", gl[r].numpy(), f64[r])
        o = _dev(np.zeros(6, dt), rank)
        dist.scatter(o, [_dev(b, rank) for b in base] if rank == 1 else None, src=1)
        check(f"{name} scatter", o.numpy(), f64[rank])
        # point to point around a ring
        right, left = (rank + 1) % n, (rank - 1) % n
        o = _dev(np.zeros(6, dt), rank)
        works = [dist.isend(_dev(mine, rank), right), dist.irecv(o, left)]
        for w in works:
            w.wait()
        check(f"{name} isend/irecv", o.numpy(), f64[left])
        o = _dev(np.zeros(6, dt), rank)
        ops = [dist.P2POp(dist.isend, _dev(mine, rank), right),
               dist.P2POp(dist.irecv, o, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(f"{name} batch_isend_irecv", o.numpy(), f64[left])
    dist.barrier()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    if objs != [{"rank": r} for r in range(n)]:
        bad.append(f"rank {rank} all_gather_object: {objs}")
    lst = [rank, "x"] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    if lst != [1, "x"]:
        bad.append(f"rank {rank} broadcast_object_list: {lst}")
    dist.destroy_process_group()
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_and_dtype(n):
    dtypes = [d for d in _DTYPES if d != "bfloat16" or ml_dtypes is not None]
    if n == 3:  # three ranks on two devices: two share one GPU
        env = _env(NCCL_MULTI_RANK_GPU_ENABLE=1)
        dtypes = ["float32", "int64", "float16"]
    else:
        env = _env()
    for bad in _spawn(_all_collectives, n, dtypes, env=env, timeout=150):
        assert bad == []


def _world_one(rank, n):
    dist = _init(rank)
    x = _dev(np.arange(4, dtype=np.float32), rank)
    dist.all_reduce(x)
    o = _dev(np.zeros(4, np.float32), rank)
    dist.all_gather_into_tensor(o, x)
    dist.barrier()
    dist.destroy_process_group()
    return x.numpy().tolist(), o.numpy().tolist()


def test_world_size_one():
    [(x, o)] = _spawn(_world_one, 1)
    assert x == o == [0.0, 1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------ streams

def _stream_order(rank, n):
    dist = _init(rank)
    s = fakecuda.Stream(device=rank % 2)
    x = _dev(np.zeros(4, np.float32), rank, stream=s)
    s.sleep(400)  # a slow kernel on the caller's stream, then it writes the input
    s.copy_from(np.full(4, rank + 1, np.float32), x)
    t0 = time.monotonic()
    work = dist.all_reduce(x, async_op=True)
    launch = time.monotonic() - t0
    running = not work.is_completed()
    t0 = time.monotonic()
    work.wait()  # the caller's stream waits; the host does not
    waited = time.monotonic() - t0
    fut = work.get_future()
    got = x.numpy()  # read on the caller's stream: after the collective
    done = work.is_completed()
    value = fut.wait()
    dist.destroy_process_group()
    return launch, running, waited, got.tolist(), done, value[0] is x


def test_stream_ordering_without_host_sync():
    for launch, running, waited, got, done, same in _spawn(_stream_order, 2):
        assert launch < 0.3 and waited < 0.3  # neither call waited for the 400 ms kernel
        assert running  # the collective had not run when all_reduce returned
        assert got == [3.0] * 4  # it saw the value the slow kernel wrote, and the reader saw it
        assert done and same


def _dlpack_stream(rank, n):
    dist = _init(rank)
    s = fakecuda.Stream(device=rank % 2)
    x = _dev(np.full(3, rank + 1.0, np.float32), rank, stream=s, protocol="dlpack")
    dist.all_reduce(x)  # DLPack names no stream of its own: the legacy default stream waits
    fakecuda.Stream.legacy(rank % 2).synchronize()
    got = x.numpy().tolist()
    dist.destroy_process_group()
    return got, x.dlpack_streams


def test_dlpack_arrays():
    for got, streams in _spawn(_dlpack_stream, 2):
        assert got == [3.0] * 3 and streams  # taken through DLPack (no CAI on these arrays)


def _fake_cupy():
    """A minimal stand-in for the CuPy module (what pyddp reads of it; CuPy needs a GPU to install
    and import): ``ndarray``, ``cuda.Device`` (makes a device current for its block) and
    ``cuda.get_current_stream()``, the CURRENT DEVICE's current stream, here a created stream per
    device (as inside ``with cupy.cuda.Stream():``).  Put in sys.modules as "cupy"."""
    import sys
    import types

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace()
    streams = {}

    def current():
        d = ctypes.c_int()
        fakecuda.cuda_call("cudaGetDevice", ctypes.byref(d))
        return d.value

    class ndarray(fakecuda.DeviceArray):
        pass

    class Device:
        def __init__(self, device):
            self.id = device

        def __enter__(self):
            self.prev = current()
            fakecuda.cuda_call("cudaSetDevice", self.id)
            return self

        def __exit__(self, *exc):
            fakecuda.cuda_call("cudaSetDevice", self.prev)

    def get_current_stream():
        d = current()
        if d not in streams:
            streams[d] = fakecuda.Stream(device=d)
        return types.SimpleNamespace(ptr=streams[d].handle, fake=streams[d])

    cupy.ndarray, cupy.cuda.Device, cupy.cuda.get_current_stream = ndarray, Device, get_current_stream
    sys.modules["cupy"] = cupy
    return cupy


def _cupy_other_device(rank, n):
    cupy = _fake_cupy()
    dist = _init(rank)  # the current device is rank's; the array lives on device rank + 2
    dev = rank + 2
    x = cupy.ndarray(np.zeros(4, np.float32), device=dev)
    with cupy.cuda.Device(dev):
        s = cupy.cuda.get_current_stream().fake  # the caller's stream for x
    s.sleep(200)  # a slow kernel on it, then it writes x: the collective must come after
    s.copy_from(np.full(4, rank + 1, np.float32), x)
    dist.all_reduce(x)
    s.synchronize()  # all_reduce's wait() made x's stream wait for the collective
    got = x.numpy().tolist()
    dist.destroy_process_group()
    return got


def test_cupy_arrays_use_the_stream_of_their_own_device():
    # cupy.cuda.get_current_stream() is the current device's: taken for an array on another device
    # its event was recorded on the wrong device's stream (cudaErrorInvalidResourceHandle)
    assert _spawn(_cupy_other_device, 2, env=_env(devices=4)) == [[3.0] * 4] * 2


# ------------------------------------------------------------------------------ never hang

def _mismatch(rank, n):
    dist = _init(rank)
    x = _dev(np.ones(4 if rank == 0 else 8, np.float32), rank)
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        return str(e), time.monotonic() - t0
    return None, time.monotonic() - t0


def test_mismatched_collectives_raise_on_every_rank():
    for msg, took in _spawn(_mismatch, 2):
        assert msg is not None and "mismatched collectives" in msg
        assert "count=4" in msg and "count=8" in msg and "rank 1" in msg
        assert took < 1.0


def _kind_mismatch(rank, n):
    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    try:
        if rank == 0:
            dist.all_reduce(x)
        else:
            dist.broadcast(x, src=0)
    except dist.DistBackendError as e:
        msg = str(e)
    else:
        msg = None
    try:  # the group stays failed
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        again = str(e)
    else:
        again = None
    return msg, again


def test_mismatched_kind_and_group_failed_after():
    for msg, again in _spawn(_kind_mismatch, 2):
        assert "all_reduce(" in msg and "broadcast(" in msg
        assert again is not None and "mismatched" in again


def _timeout(rank, n, check):
    from datetime import timedelta

    # the 2 s timeout also bounds init_process_group's store handshake: rank 1 starts it once rank
    # 0 is about to serve the store, so a slow start of rank 0's process (8 test workers on 2
    # cores) is not taken for the timeout under test
    ready = os.path.join(tempfile.gettempdir(), f"pyddp-test-timeout-{os.environ['MASTER_PORT']}")
    if rank == 0:
        open(ready, "w").close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        dist = _init(rank, timeout=timedelta(seconds=2))
    finally:
        if rank == 0:
            os.unlink(ready)
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)  # one that works
    if rank == 1:
        time.sleep(5)  # skips the next collective
        return None, 0.0
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        return str(e), time.monotonic() - t0
    return None, time.monotonic() - t0


@pytest.mark.parametrize("check", ["1", *full("0")])
def test_timeout_names_the_operation(check):
    # check=0: the signature check is off, so NCCL itself hangs and the watchdog aborts it
    env = _env(PYDDP_NCCL_CHECK=check, PYDDP_NCCL_BLOCKING_WAIT=1)
    outs = _spawn(_timeout, 2, check, env=env)
    msg, took = outs[0]
    assert msg is not None, outs
    assert "all_reduce" in msg and "default_pg" in msg, msg
    assert 1.5 < took < 6.0
    if check == "0":
        assert "Watchdog caught collective operation timeout" in msg and "#2" in msg


def _dead_peer(rank, n):
    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        x.numpy()
        dist.all_reduce(x)  # the next call raises if the last one was aborted
    except dist.DistBackendError as e:
        return str(e), time.monotonic() - t0
    return None, time.monotonic() - t0


@pytest.mark.parametrize("check", ["1", "0"])
def test_dead_peer_raises_naming_it(check):
    outs = _outcomes(_dead_peer, 2, env=_env(PYDDP_NCCL_CHECK=check), expect_death=(1,))
    assert outs[0].ok, outs[0].describe()
    msg, took = outs[0].value
    assert msg is not None and "rank 1" in msg, msg
    assert took < 5.0


def _async_error(rank, n):
    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    try:
        for _ in range(5):
            dist.all_reduce(x)
            x.numpy()
            time.sleep(0.2)
    except dist.DistBackendError as e:
        time.sleep(1.0)   # the peer meets its own asynchronous error before this rank exits
        return str(e)
    return None


def test_async_nccl_error_aborts():
    outs = _spawn(_async_error, 2, env=_env(FAKENCCL_ASYNC_ERROR_AFTER=2))
    for msg in outs:
        assert msg is not None and "asynchronous error" in msg, msg


def _destroy_hung(rank, n):
    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)
    if rank == 0:
        dist.all_reduce(x, async_op=True)  # rank 1 never joins
    t0 = time.monotonic()
    dist.destroy_process_group()
    return time.monotonic() - t0


@FULL
def test_destroy_never_hangs():
    for took in _spawn(_destroy_hung, 2, env=_env(PYDDP_NCCL_CHECK=0)):
        assert took < 12.0


def _same_gpu(rank, n):
    import pyddp.cuda as cuda
    import pyddp.distributed as dist

    cuda.set_device(0)
    dist.init_process_group("nccl")
    x = _dev(np.ones(2, np.float32), 0)
    try:
        dist.all_reduce(x)
    except dist.DistBackendError as e:
        return str(e)
    out = x.numpy().tolist()
    dist.destroy_process_group()
    return out


def test_duplicate_gpu_says_what_to_do():
    # NCCL 2.30 and later word it "Multiple Ranks are using the same GPU/Partition..."
    for msg in _spawn(_same_gpu, 2):
        assert "same GPU" in msg and "set_device(local_rank)" in msg, msg
    for msg in _spawn(_same_gpu, 2, env=_env(FAKENCCL_VERSION=22903)):
        assert "Duplicate GPU" in msg and "set_device(local_rank)" in msg, msg
    for out in _spawn(_same_gpu, 2, env=_env(NCCL_MULTI_RANK_GPU_ENABLE=1)):
        assert out == [2.0, 2.0]


# ------------------------------------------------------------------------------ bad arrays

def _bad_arrays(rank, n):
    dist = _init(rank, device_id=rank % 2)
    errs = {}

    def grab(key, fn):
        try:
            fn()
        except (TypeError, ValueError, RuntimeError) as e:
            errs[key] = f"{type(e).__name__}: {e}"

    other = fakecuda.DeviceArray(np.ones(2, np.float32), device=(rank + 1) % 2)
    grab("wrong_device", lambda: dist.all_reduce(other))
    grab("cpu_vs_cuda", lambda: dist.all_gather_into_tensor(
        np.zeros(4, np.float32), _dev(np.ones(2, np.float32), rank)))
    grab("strided", lambda: dist.all_reduce(
        _dev(np.ones((2, 2), np.float32), rank, strides=(16, 4))))
    grab("readonly", lambda: dist.all_reduce(_dev(np.ones(2, np.float32), rank, readonly=True)))
    grab("int16_sum", lambda: dist.all_reduce(_dev(np.ones(2, np.int16), rank)))
    grab("band", lambda: dist.all_reduce(_dev(np.ones(2, np.int32), rank),
                                         op=dist.ReduceOp.BAND))
    grab("any_source", lambda: dist.recv(_dev(np.ones(2, np.float32), rank)))
    # NCCL checks no pointer (NCCL_CHECK_POINTERS=0, the stand-in's default too): these reach it
    # only if pyddp lets them through, and would fault on the device
    grab("two_devices", lambda: dist.all_gather_into_tensor(
        fakecuda.DeviceArray(np.zeros(4, np.float32), device=(rank + 1) % 2),
        _dev(np.ones(2, np.float32), rank)))
    grab("out_too_small", lambda: dist.all_gather_into_tensor(
        _dev(np.zeros(3, np.float32), rank), _dev(np.ones(2, np.float32), rank)))
    grab("split_too_big", lambda: dist.all_to_all_single(
        _dev(np.zeros(4, np.float32), rank), _dev(np.ones(4, np.float32), rank),
        output_split_sizes=[2, 3], input_split_sizes=[2, 2]))
    # int16 is fine where nothing is reduced
    y = _dev(np.full(2, rank + 5, np.int16), rank)
    dist.broadcast(y, src=0)
    ok = y.numpy().tolist()
    # as torch's NCCL (not gloo): any output shape with world_size times the input's elements
    out = _dev(np.zeros((2, 2), np.float32), rank)
    dist.all_gather_into_tensor(out, _dev(np.full(2, rank + 1.0, np.float32), rank))
    gathered = out.numpy().tolist()
    dist.destroy_process_group()
    return errs, (ok, gathered)


def test_bad_arrays_raise_clear_errors():
    for errs, (ok, gathered) in _spawn(_bad_arrays, 2):
        assert ok == [5, 5]
        assert gathered == [[1.0, 1.0], [2.0, 2.0]]
        assert "cuda:" in errs["wrong_device"] and "device_id" in errs["wrong_device"]
        assert errs["wrong_device"].startswith("ValueError: all_reduce: tensor is on cuda:")
        m = errs["cpu_vs_cuda"]
        assert m.startswith("ValueError") and "input_tensor is on cuda:" in m and "cpu" in m, m
        assert "contiguous" in errs["strided"]
        assert "read-only" in errs["readonly"]
        assert errs["int16_sum"].startswith("TypeError") and "int16" in errs["int16_sum"]
        assert errs["band"].startswith("TypeError") and "BAND" in errs["band"]
        assert "any source" in errs["any_source"]
        assert errs["two_devices"].startswith("ValueError") and "cuda:" in errs["two_devices"]
        assert errs["out_too_small"].startswith(("ValueError", "RuntimeError")), errs["out_too_small"]
        assert errs["split_too_big"].startswith(("ValueError", "RuntimeError")), errs["split_too_big"]


# -------------------------------------------------------------------- dispatch and staging

def _mixed(rank, n, backend):
    dist = _init(rank, backend=backend)
    h = np.full(3, rank + 1.0)
    dist.all_reduce(h)  # host array: the cpu backend
    d = _dev(np.full(3, rank + 1.0, np.float32), rank)
    w = dist.all_reduce(d, async_op=True)
    w.wait()
    sub = dist.new_group([0, 1])
    e = _dev(np.full(2, 10.0 * (rank + 1), np.float32), rank)
    dist.all_reduce(e, group=sub)
    ranks = dist.get_process_group_ranks(sub)
    be = dist.get_backend()
    out = h.tolist(), d.numpy().tolist(), e.numpy().tolist(), ranks, be
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", None])
def test_dispatch_by_device(backend):
    for h, d, e, ranks, be in _spawn(_mixed, 2, backend):
        assert h == [3.0] * 3 and d == [3.0] * 3 and e == [30.0] * 2 and ranks == [0, 1]


def _staged(rank, n):
    dist = _init(rank, backend="gloo")
    s = fakecuda.Stream(device=rank % 2)
    x = _dev(np.zeros(4, np.float32), rank, stream=s)
    s.sleep(200)
    s.copy_from(np.full(4, rank + 1, np.float32), x)
    dist.all_reduce(x)  # staged: copied to the host on x's stream, reduced, copied back
    o = _dev(np.zeros(8, np.float32), rank)
    w = dist.all_gather_into_tensor(o, x, async_op=True)
    w.wait()
    dist.destroy_process_group()
    return x.numpy().tolist(), o.numpy().tolist()


def test_cpu_backend_stages_cuda_arrays():
    for x, o in _spawn(_staged, 2):
        assert x == [3.0] * 4 and o == [3.0] * 8


def _staged_many(rank, n, calls):
    import pyddp.cuda

    dist = _init(rank, backend="gloo")
    frees, blocks = fakecuda.host_free_count(), fakecuda.mem_stats()[2]
    got = []
    for i in range(calls):
        x = _dev(np.full(64 + i % 3, i + rank, np.float32), rank)  # sizes vary a little
        dist.all_reduce(x)
        o = _dev(np.zeros(2 * x.size, np.float32), rank)
        dist.all_gather_into_tensor(o, x, async_op=True).wait()
        got.append((x.numpy().tolist(), o.numpy().tolist()))
    during = fakecuda.host_free_count() - frees, fakecuda.mem_stats()[2] - blocks
    dist.destroy_process_group()
    pyddp.cuda.empty_cache()  # gives the cached blocks back
    return got, during, fakecuda.mem_stats()[2] - blocks


def test_staging_reuses_pinned_buffers():
    # cudaFreeHost waits for the whole device: N staged collectives must not call it N times
    calls = 12
    for got, (frees, cached), left in _spawn(_staged_many, 2, calls):
        for i, (x, o) in enumerate(got):
            want = float(2 * i + 1)  # (i + 0) + (i + 1)
            assert x == [want] * (64 + i % 3) and o == [want] * (2 * (64 + i % 3))
        assert frees == 0 and 0 < cached <= 4
        assert left == 0


def _pinned_cache(rank, n):
    import pyddp.cuda
    from pyddp.cuda import _pinned

    pyddp.cuda.init()
    out = {}
    a = _pinned.host_bytes(1000)
    out["a"] = (a.size, a.dtype.str, a.flags.writeable)
    view = a[10:20]
    ptr = a.ctypes.data
    del a
    out["idle_while_a_view_lives"] = _pinned.idle()
    del view
    out["idle_after"] = _pinned.idle()
    b = _pinned.host_bytes(600)  # the same size class (1024): the same block
    out["reused"] = b.ctypes.data == ptr
    c = _pinned.host_bytes(1024)  # none idle: a new one
    _pinned._IDLE_CAP = 1024
    frees = fakecuda.host_free_count()
    del b, c  # the second over the cap, its class not empty: freed
    out["over_cap"] = _pinned.idle(), fakecuda.host_free_count() - frees
    big = _pinned.host_bytes(5000)
    del big  # over the cap, but the only block of its class: kept
    out["big"] = _pinned.idle()
    out["emptied"] = pyddp.cuda._pinned.empty_cache(), _pinned.idle(), \
        fakecuda.host_free_count() - frees
    return out


def test_pinned_cache_reuses_blocks_by_size_class():
    out = _spawn(_pinned_cache, 1)[0]
    assert out["a"] == (1000, "|u1", True)
    assert out["idle_while_a_view_lives"] == (0, 0) and out["idle_after"] == (1, 1024)
    assert out["reused"]
    assert out["over_cap"] == ((1, 1024), 1)
    assert out["big"] == (2, 1024 + 8192)
    assert out["emptied"] == (2, (0, 0), 3)


# ------------------------------------------------------------------------ real libraries

def test_init_nccl_without_gpu_fails_fast_and_clearly():
    """The real libcudart / libnccl wheels on this GPU-less machine: a clear error in < 1 s."""
    code = ("import time, pyddp.distributed as dist\n"
            "t = time.monotonic()\n"
            "try:\n"
            f"    dist.init_process_group('nccl', init_method='tcp://127.0.0.1:{free_port()}', "
            "rank=0, world_size=1)\n"
            "except RuntimeError as e:\n"
            "    print(round(time.monotonic() - t, 3)); print(e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYDDP_", "FAKECUDA"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    if not r.stdout.strip():
        pytest.skip("this machine has a usable CUDA device: backend 'nccl' initialised")
    took, msg = r.stdout.split("\n", 1)
    if "CUDA device" not in msg:
        pytest.skip(f"this machine's CUDA libraries answer differently: {msg.strip()}")
    assert float(took) < 1.0
    assert "backend 'nccl' needs a CUDA device" in msg and "gloo" in msg


# ------------------------------------------------------------------- groups and lifetimes

def _subgroups(rank, n):
    dist = _init(rank)
    x = _dev(np.full(2, rank + 1.0, np.float32), rank)
    dist.all_reduce(x)  # the default group's communicator exists: new_group splits it
    sub = dist.new_group([0, 2])
    split = sub is not dist.GroupMember.NON_GROUP_MEMBER and bool(sub._backends["cuda"].comms)
    y = _dev(np.full(2, rank + 1.0, np.float32), rank)
    if sub is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.all_reduce(y, group=sub)
    other = dist.new_group([1, 2], use_local_synchronization=False)
    z = _dev(np.full(2, 10.0 * (rank + 1), np.float32), rank)
    dist.all_reduce(z, group=other)  # a non-member returns at once
    try:
        dist.all_reduce(np.ones(2))  # a host array on an nccl-only group: as torch, an error
        host = None
    except ValueError as e:
        host = str(e)
    dist.destroy_process_group()
    return x.numpy().tolist(), split, y.numpy().tolist(), z.numpy().tolist(), host


def test_new_group_splits_the_communicator():
    outs = _spawn(_subgroups, 3, env=_env(NCCL_MULTI_RANK_GPU_ENABLE=1))
    for rank, (x, split, y, z, host) in enumerate(outs):
        assert x == [6.0, 6.0]
        assert split == (rank != 1)
        assert y == ([4.0, 4.0] if rank != 1 else [2.0, 2.0])
        assert z == ([50.0, 50.0] if rank != 0 else [10.0, 10.0])
        assert host is not None and "device cpu" in host and "cuda:nccl" in host, host


def _keepalive(rank, n):
    import gc

    dist = _init(rank)
    s = fakecuda.Stream(device=rank % 2)
    x = _dev(np.full(4, rank + 1.0, np.float32), rank, stream=s)
    out = _dev(np.zeros(8, np.float32), rank, stream=s)
    release = s.hold()  # the caller's stream is busy: the collective cannot run yet
    w = dist.all_gather_into_tensor(out, x, async_op=True)
    del x  # the work keeps its input alive until it completed
    gc.collect()
    release.set()
    w.wait()
    got = out.numpy().tolist()
    dist.barrier()
    dist.destroy_process_group()
    return got


def test_inputs_stay_alive_until_the_work_completes():
    for got in _spawn(_keepalive, 2):
        assert got == [1.0] * 4 + [2.0] * 4


# ------------------------------------------------- what real NCCL and CUDA do that a kind stand-in hid
# The stand-in behaves as NCCL 2.32 / CUDA 13 here: a non-blocking communicator's ncclGroupEnd (and an
# ungrouped ncclSend/ncclRecv) connects to point-to-point peers first and answers ncclInProgress until
# the peer posts its side; ncclCommSplit on a non-blocking parent answers ncclInProgress and writes
# the child later from its own thread (test_new_group_splits_the_communicator); pointers are not
# checked; a CUDA call creates a context on the calling thread's current device.

def _p2p_stall(rank, n, how):
    import threading
    from datetime import timedelta

    dist = _init(rank, timeout=timedelta(seconds=2 if how == "timeout" else 60))
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)  # the communicator is up; rank 0 and 1 never sent to each other
    if rank == 1:
        if how == "dead":
            time.sleep(0.5)
            os._exit(3)  # never posts its receive, and its host group connection drops
        time.sleep(10)  # never posts its receive (past rank 0's deadline, even on a loaded host)
        return None
    if how == "sigint":
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        dist.send(x, 1)
        return "returned", time.monotonic() - t0, ""
    except KeyboardInterrupt:
        return "KeyboardInterrupt", time.monotonic() - t0, ""
    except dist.DistBackendError as e:
        return "DistBackendError", time.monotonic() - t0, str(e)


@pytest.mark.parametrize("how", [*full("timeout"), "dead", *full("sigint")])
def test_send_whose_peer_never_posts_ends_within_the_timeout(how):
    """A send whose peer never posts stays ncclInProgress inside NCCL: the launch is bounded by the
    group timeout, a dead peer noticed by the watchdog aborts it at once, and Ctrl-C interrupts it
    (before: the launch polled without a deadline holding the locks the watchdog needs)."""
    outs = _outcomes(_p2p_stall, 2, how, env=_env(), expect_death=(1,) if how == "dead" else (),
                     timeout=60)
    assert outs[0].ok, outs[0].describe()
    what, took, msg = outs[0].value
    if how == "timeout":
        # 2 s group timeout; up to 8 s where the suite's other processes hold the cores
        assert what == "DistBackendError" and 1.5 < took < 8.0, (what, took, msg)
        assert "still in progress" in msg and "rank 0" in msg and "aborted" in msg, msg
    elif how == "dead":
        assert what == "DistBackendError" and took < 10.0, (what, took, msg)
        assert "rank 1" in msg, msg
    else:
        assert what == "KeyboardInterrupt" and took < 5.0, (what, took, msg)


def _contexts(rank, n, set_first):
    """Rank 0 of one works on cuda:1 alone: no thread of pyddp may create a context on cuda:0."""
    import threading
    from datetime import timedelta

    import pyddp.cuda as cuda
    import pyddp.distributed as dist

    if set_first:
        cuda.set_device(1)
        dist.init_process_group("nccl")
    else:  # the caller never sets a device: the group's device_id names it
        dist.init_process_group("nccl", device_id=1)
    s = fakecuda.Stream(device=1)
    x = fakecuda.DeviceArray(np.arange(4, dtype=np.float32), device=1, stream=s)
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    # what the watchdog and the torch plug-in's futures thread do: ask and wait from a thread that
    # never set a device
    t = threading.Thread(target=lambda: (w.is_completed(), w.wait(timeout=timedelta(seconds=30))))
    t.start()
    t.join(60)
    time.sleep(0.3)  # the watchdog polls the works' events from its own thread
    dist.all_reduce(x)
    x.numpy()
    dist.destroy_process_group()
    return sorted(fakecuda.contexts())


@pytest.mark.parametrize("set_first", [True, False], ids=["set_device", "device_id"])
def test_no_context_on_a_device_pyddp_was_never_given(set_first):
    """The watchdog, Work.wait/synchronize and destroy run their CUDA calls on the communicator's
    device, and the caller's device is restored only where it has a context already (before: the
    watchdog's cudaEventQuery made a context on GPU 0, and restoring device 0 after a launch made
    one too: ~500 MiB of a GPU the rank never used)."""
    (ctx,) = _spawn(_contexts, 1, set_first, env=_env())
    assert ctx == [1], ctx


def _abort_keeps_arrays(rank, n):
    import gc
    import threading
    import weakref

    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(3)  # never joins the next all_reduce
        return None
    be = dist.distributed_c10d._world.default_pg._backends["cuda"]
    y = _dev(np.ones(1 << 16, np.float32), rank)
    gone = threading.Event()
    weakref.finalize(y, gone.set)
    dist.all_reduce(y, async_op=True)  # the Work is dropped: only the backend keeps y now
    del y
    gc.collect()
    work = be.pending[next(iter(be.pending))][-1]
    # the abort flag is up before ncclCommAbort returns (FAKENCCL_ABORT_DELAY_MS): meanwhile the
    # kernels still run, so the array must stay
    t = threading.Thread(target=be._fail, args=("test abort",))
    t.start()
    time.sleep(0.2)
    early = gone.is_set()
    failed = work.w.query()
    early = early or gone.is_set()
    t.join(10)
    for _ in range(200):  # once the abort returned and the stream went past the work
        work.w.query()
        if gone.is_set():
            break
        time.sleep(0.01)
    return early, failed, gone.is_set()


@FULL
def test_aborted_work_keeps_its_arrays_until_the_abort_returned():
    outs = _spawn(_abort_keeps_arrays, 2, env=_env(PYDDP_NCCL_CHECK=0, FAKENCCL_ABORT_DELAY_MS=1000))
    early, failed, freed = outs[0]
    assert failed == -1
    assert not early, "the array was let go before ncclCommAbort returned"
    assert freed, "the array was never let go after the abort"


# ------------------------------------------------- several ranks: NCCL's group jobs (issue 51)

def _concurrent_entries(rank, n, calls):
    dist = _init(rank)
    x = _dev(np.full(4, rank + 1.0, np.float32), rank)
    for _ in range(calls):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    got = x.numpy()
    # pyddp's own count (what tests/gpu/verify.sh reads on a GPU)
    own = sum(c.overlapping_entries for c in dist.group.WORLD._backends["cuda"].comms.values())
    dist.destroy_process_group()
    lib = ctypes.CDLL(os.environ["PYDDP_NCCL_LIBRARY"])
    lib.fakencclConcurrentEntries.restype = ctypes.c_long
    return int(lib.fakencclConcurrentEntries()), got.tolist(), own


def test_the_watchdog_never_enters_a_communicator_a_launch_is_in():
    """With two ranks every NCCL call is a group job that stays in progress while the launching
    thread polls ncclCommGetAsyncError; the watchdog's own query of the same communicator must
    not run beside it (NCCL joins and frees the finished job in that call).  The stand-in counts
    every entry into a communicator another thread is inside."""
    outs = _spawn(_concurrent_entries, 2, 300, timeout=150,
                  env=_env(FAKENCCL_CONCURRENT="count", FAKENCCL_JOB_US="300",
                           PYDDP_NCCL_WATCHDOG_INTERVAL="0.0005"))
    for rank, (entries, got, own) in enumerate(outs):
        assert entries == 0, f"rank {rank}: {entries} concurrent entries into a communicator"
        assert own == 0, f"rank {rank}: pyddp counted {own} overlapping entries"
        assert got == [2.0] * 4, f"rank {rank}: {got}"


def _destroy_beside_a_stuck_kernel(rank, n):
    dist = _init(rank)
    g = dist.new_group([0, 1])
    x = _dev(np.full(4, rank + 1.0, np.float32), rank)
    dist.all_reduce(x, group=g)
    dist.barrier(group=g)          # the barrier's device bytes are made for g's communicator
    got = x.numpy().tolist()
    other = fakecuda.Stream(rank % 2)
    gate = other.hold()            # a kernel of someone else's on this device that does not end
    t0 = time.monotonic()
    try:
        dist.destroy_process_group(g)
        took = time.monotonic() - t0
    finally:
        gate.set()
    dist.destroy_process_group()
    return got, took


def test_destroying_a_group_does_not_wait_for_another_kernel_on_its_device():
    """Destroy frees nothing that synchronises the device (cudaFree does: the barrier's bytes are
    one buffer per device for the process)."""
    outs = _spawn(_destroy_beside_a_stuck_kernel, 2, timeout=120)
    for rank, (got, took) in enumerate(outs):
        assert got == [3.0] * 4, f"rank {rank}: {got}"
        assert took < 5.0, f"rank {rank}: destroying the group took {took:.1f} s behind another kernel"


def _barrier_on_the_arrays_device(rank, n):
    import pyddp.distributed as dist

    # no set_device, no device_id: the script put its arrays on cuda:<rank> itself
    dist.init_process_group("nccl")
    x = fakecuda.DeviceArray(np.full(4, rank + 1.0, np.float32), device=rank)
    dist.all_reduce(x)
    # work queued on the device's blocking stream: the barrier orders after it (through the
    # legacy default stream) and returns once its own work there is done
    s = fakecuda.Stream(rank, nonblocking=False)
    with fakecuda.on_device(rank):
        s.sleep(1500)
        ev = s.record()
    t0 = time.monotonic()
    dist.barrier()
    waited = time.monotonic() - t0
    done = ev.query()
    dist.barrier(device_ids=[rank])
    got = x.numpy().tolist()
    dist.destroy_process_group()
    return got, done, waited


def test_barrier_runs_on_the_last_used_device_after_the_callers_stream():
    """barrier() on nccl without a bound device: on the device the group last ran on (the current
    one is cuda:0 on every rank here: NCCL refuses two ranks on one GPU), ordered after the
    caller's stream, as torch's."""
    outs = _spawn(_barrier_on_the_arrays_device, 2, timeout=120)
    for rank, (got, done, waited) in enumerate(outs):
        assert got == [3.0] * 4, f"rank {rank}: {got}"
        assert done, f"rank {rank}: barrier returned ({waited:.2f} s) before the stream's earlier work"


def _arrays_go_at_wait(rank, n):
    import pyddp.distributed as dist

    dist.init_process_group("nccl")  # the watchdog (which also lets completed works go) is slowed
    stream = fakecuda.Stream(rank % 2)
    dist.all_reduce(_dev(np.ones(4, np.float32), rank, stream=stream))  # the communicator exists
    live = []
    for how in ("blocking", "async + wait"):
        x = _dev(np.full(1 << 18, rank + 1.0, np.float32), rank, stream=stream)  # 1 MiB
        before = fakecuda.mem_stats()[1]
        if how == "blocking":
            dist.all_reduce(x)
        else:
            dist.all_reduce(x, async_op=True).wait()
        got = float(x.numpy()[0])
        del x                 # the caller's last reference: the memory goes now
        live.append((how, before - fakecuda.mem_stats()[1], got))
    dist.destroy_process_group()
    return live


def test_arrays_are_let_go_once_the_callers_stream_waited():
    """A work keeps its arrays alive only until the caller's stream waits for it (a blocking call
    does in its launch, an async one at wait()), not until the host sees the end: a large temporary
    output is freed when the script drops it (torch's TORCH_NCCL_AVOID_RECORD_STREAMS rule)."""
    outs = _spawn(_arrays_go_at_wait, 2, timeout=120,
                  env=_env(PYDDP_NCCL_WATCHDOG_INTERVAL="30"))
    for rank, live in enumerate(outs):
        for how, freed, got in live:
            assert got == 3.0, f"rank {rank} {how}: {got}"
            assert freed >= 1 << 20, f"rank {rank} {how}: only {freed} bytes freed after del"


def _peer_failed_and_stayed(rank, n):
    from datetime import timedelta

    dist = _init(rank, timeout=timedelta(seconds=30))
    x = _dev(np.ones(4, np.float32), rank)
    if rank == 1:
        # its third operation fails (found by its watchdog, or by the launch itself when the
        # stand-in ran it at once), and it calls nothing more for a while
        try:
            for _ in range(3):
                dist.all_reduce(x)
        except dist.DistBackendError:
            pass
        time.sleep(12)
        return None, 0.0
    t0 = time.monotonic()
    try:
        for _ in range(20):
            dist.all_reduce(x)
            x.numpy()
        out = None
    except dist.DistBackendError as e:
        out = str(e)
    return out, time.monotonic() - t0


@FULL
def test_a_failure_reaches_the_peers_without_the_signature_check():
    """Rank 1's communicator fails (an injected asynchronous error its watchdog finds) while rank 1
    is busy elsewhere: rank 0, waiting in NCCL for it, learns it through the host group within
    seconds, not at its own timeout, even with PYDDP_NCCL_CHECK=0 (torch's
    TORCH_NCCL_PROPAGATE_ERROR)."""
    outs = _spawn(_peer_failed_and_stayed, 2, timeout=120,
                  env=_env(FAKENCCL_ASYNC_ERROR_AFTER="2", FAKENCCL_ASYNC_ERROR_RANK="1",
                           PYDDP_NCCL_CHECK="0"))
    msg0, took0 = outs[0]
    assert msg0 is not None, "rank 0 finished with its peer's communicator failed"
    assert took0 < 10, f"rank 0 learnt it after {took0:.1f} s: {msg0}"
    assert "rank 1" in msg0 and "asynchronous error" in msg0, msg0


# ------------------------------------------------------ flight record, timeline, DETAIL (issue 52)

def _observed(rank, n, out_dir):
    import logging

    import pyddp
    from pyddp.distributed import flight_recorder

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("pyddp.distributed").addHandler(Keep())
    dist = _init(rank)
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)
    dist.broadcast(x, 1, async_op=True).wait(timeout=60)
    o = _dev(np.zeros(8, np.float32), rank)
    dist.all_gather_into_tensor(o, x)
    if rank == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    x.numpy()
    deadline = time.monotonic() + 20  # the watchdog's poll sees the last ends
    while True:
        recs = [r for r in flight_recorder.records() if r["backend"] == "nccl"]
        if all(r["state"] == "completed" for r in recs) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    flight_recorder.dump()
    dist.destroy_process_group()
    pyddp._C.timeline_close()
    logged = [ln.split("] ", 1)[1] for ln in lines if " on group default_pg: backend " in ln]
    return recs, logged


@pytest.mark.parametrize("algo", ["", "Ring"])
def test_flight_record_timeline_and_detail_log_name_nccl(algo, tmp_path):
    from pyddp.tools import flight_recorder as fr_tool
    from pyddp.tools import timeline as tl_tool

    env = _env(TORCH_DISTRIBUTED_DEBUG="DETAIL", PYDDP_TIMELINE=str(tmp_path / "tl") + os.sep,
               PYDDP_FLIGHT_RECORDER_DIR=str(tmp_path / "fr"), NCCL_ALGO=algo)
    want_algo = algo or "auto"
    outs = _spawn(_observed, 2, str(tmp_path), env=env)
    for rank, (recs, logged) in enumerate(outs):
        assert [r["kind"] for r in recs] == ["all_reduce", "broadcast", "all_gather",
                                            "send" if rank == 0 else "recv"], recs
        assert [r["seq"] for r in recs] == [1, 2, 3, 0]
        algos = [want_algo] * 3 + ["p2p"]  # NCCL_ALGO is not about send and recv
        for r, a in zip(recs, algos):
            assert (r["backend"], r["transport"], r["algorithm"]) == ("nccl", "nccl", a)
            assert r["state"] == "completed" and r["status"] == "ok", r
            assert 0 < r["t_enqueued"] <= r["t_started"] <= r["t_ended"], r
            assert r["dtype"] == "float32"
        assert recs[0]["count"] == 4 and recs[0]["bytes"] == 16 and recs[0]["op"] == "SUM"
        assert recs[1]["root"] == 1 and recs[3]["root"] == 1 - rank
        # DETAIL: one line per call, naming the same backend, transport and algorithm
        assert len(logged) == 4, logged
        for r, a, ln in zip(recs, algos, logged):
            assert ln.startswith(f"{r['name']} on group default_pg: backend nccl, transport "
                                 f"nccl, algorithm {a}, dtype float32"), ln
        # the timeline's slices (the host group's track) carry them too
        events = tl_tool.read_events(str(tmp_path / "tl" / f"timeline.rank{rank}.json"))
        slices = [(e["name"], e["args"]["backend"], e["args"]["transport"],
                   e["args"]["algorithm"], e["args"]["status"]) for e in events
                  if e.get("cat") == "collective" and e["args"]["backend"] == "nccl"]
        assert slices == [(r["name"], "nccl", "nccl", a, "ok") for r, a in zip(recs, algos)], \
            slices
    # the dumps: the analyzer reads them (NCCL's calls and the host group's own, apart)
    files, errors = fr_tool.load(str(tmp_path / "fr"))
    assert len(files) == 2 and not errors
    for f in files:
        nccl = [e for e in f["entries"] if e["backend"] == "nccl"]
        assert [e["algorithm"] for e in nccl] == algos
    lines, problem = fr_tool.analyse(files)
    assert not problem, lines
    assert any("its nccl calls" in ln for ln in lines), lines
    assert "  every rank completed collectives up to #3; no divergence" in lines, lines


def _timeout_recorded(rank, n):
    from datetime import timedelta

    dist = _init(rank, timeout=timedelta(seconds=2))
    x = _dev(np.ones(4, np.float32), rank)
    dist.all_reduce(x)  # one that works
    x.numpy()
    if rank == 1:
        time.sleep(6)  # skips the next collective
        return None
    try:
        dist.all_reduce(x)
        x.numpy()
    except dist.DistBackendError as e:
        return str(e)
    return None


@pytest.mark.parametrize("check", ["0", *full("1")])
def test_failed_nccl_call_leaves_a_failed_record_the_analyzer_reads(check, tmp_path):
    """Rank 1 skips a collective: rank 0's call fails (the watchdog's timeout, or the signature
    check's wait); its ring is written with the call failed, and the analyzer names rank 1."""
    from pyddp.tools import flight_recorder as fr_tool

    env = _env(PYDDP_NCCL_CHECK=check, PYDDP_NCCL_BLOCKING_WAIT=1,
               PYDDP_FLIGHT_RECORDER_DIR=str(tmp_path))
    outs = _spawn(_timeout_recorded, 2, env=env)
    assert outs[0] is not None and "all_reduce" in outs[0], outs
    files, errors = fr_tool.load(str(tmp_path))
    assert not errors
    mine = [f for f in files if f["meta"]["group_rank"] == 0]
    assert mine, [f["_path"] for f in files]
    nccl = [e for e in mine[0]["entries"] if e["backend"] == "nccl"]
    assert [(e["seq"], e["state"]) for e in nccl] == [(1, "completed"), (2, "failed")], nccl
    assert nccl[1]["status"] == "timeout", nccl[1]
    assert nccl[1]["t_ended"] >= nccl[1]["t_enqueued"] > 0
    p = subprocess.run([sys.executable, "-m", "pyddp.tools.flight_recorder", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "backend nccl" in p.stdout, p.stdout
    assert "collective #2 all_reduce(float32, count 4, SUM) (failed)" in p.stdout or \
        "#2 all_reduce(float32, count 4, SUM); not completed: rank 0 failed" in p.stdout, p.stdout
    if len(files) == 2:  # rank 1 wrote its ring too (the failure reached it)
        assert "rank 1 is BEHIND" in p.stdout, p.stdout
    else:
        assert "failed" in p.stdout, p.stdout
