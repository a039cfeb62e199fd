"""On a GPU: what the stand-in claims of CUDA after fork (every call of a child forked after the parent
initialised CUDA fails with cudaErrorInitializationError, 3) and pyddp's answers to it; the torch
plug-in's futures on CUDA tensors (complete at launch, the consumer ordered after the collective, issue
33 item 10); staging through cached pinned buffers (item 9).  Every case runs in a fresh interpreter."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from _gpu import ROOT, machine, need, nccl_version
from _mp import run

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, timeout=180):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_child_forked_after_cuda_use_fails_as_the_stand_in_says():
    if not machine()["devices"]:
        pytest.skip("no GPU")
    out = _python("""
        import ctypes, json
        import pyddp.cuda, pyddp.multiprocessing as mp
        from pyddp import _C
        from _mp import in_forked_child as in_child

        out = {"available": pyddp.cuda.is_available(), "state": _C.cuda_fork_state()}
        path = pyddp.cuda._lib.load_cudart()["path"]

        def raw():  # the runtime itself, not pyddp
            lib, n, p = ctypes.CDLL(path), ctypes.c_int(), ctypes.c_void_p()
            return [lib.cudaGetDeviceCount(ctypes.byref(n)), lib.cudaSetDevice(0),
                    lib.cudaMalloc(ctypes.byref(p), 16), lib.cudaGetDevice(ctypes.byref(n))]

        out["raw_child"] = in_child(raw)
        out["pyddp_child"] = in_child(lambda: [pyddp.cuda.is_available(), _C.cuda_fork_state(),
                                               pyddp.cuda._why_unavailable() == _C.CUDA_AFTER_FORK])
        try:
            mp.start_processes(print, nprocs=1, start_method="fork")
            out["refused"] = None
        except RuntimeError as e:
            out["refused"] = str(e)
        print(json.dumps(out))
    """)
    assert out["available"] and out["state"] == 1, out
    # cudaGetDeviceCount answers, every other call fails with cudaErrorInitializationError (as
    # tests/fakecuda answers; seen with CUDA 13 on an H100)
    assert out["raw_child"] == [0, 3, 3, 3], out
    assert out["pyddp_child"] == [False, 2, True], out
    assert out["refused"] and out["refused"].startswith("start_method='fork' after pyddp used CUDA"), out


def _torch_future_child(rank, ws):
    import time

    import torch
    import torch.distributed as dist

    import pyddp.cuda
    import pyddp.torch_backend  # noqa: F401

    torch.cuda.set_device(0)
    pyddp.cuda.set_device(0)
    dist.init_process_group("cpu:pyddp,cuda:nccl", rank=rank, world_size=ws)
    n = 1 << 22
    x = torch.arange(n, dtype=torch.float64, device="cuda")  # float64: the sums below are exact
    out = torch.zeros(n, dtype=torch.float64, device="cuda")
    behind = torch.cuda.Event()

    def step(cycles):
        torch.cuda._sleep(cycles)  # on the current stream: the collective waits for it
        x.add_(1)
        behind.record()  # ends with the write the collective must see
        t0 = time.monotonic()
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        fut = work.get_future()
        done, pending = fut.done(), not work.is_completed()
        still_busy = not behind.query()  # asked after the work: its pending is meaningful only if so
        chained = fut.then(lambda f: f.value()[0].sum())  # runs now, on a stream ordered after the collective
        launch = time.monotonic() - t0
        # torch.futures.Future.wait() takes no timeout: poll done() against a deadline first
        deadline = time.monotonic() + 60
        while not chained.done():
            if time.monotonic() > deadline:
                raise AssertionError("the chained future did not complete within 60 s")
            time.sleep(0.001)
        # done() was seen above, so wait() returns at once; it (not value()) makes the current stream wait
        # for the callback's stream, which .item() then reads on
        total = chained.wait().item()
        return {"done": done, "pending": pending, "still_busy": still_busy, "launch_s": launch, "total": total}

    # Every kernel of the sequence once before the timed run: CUDA loads a module at its first launch
    # (lazy loading), and that load can wait for the kernels in flight, so a first add_() after the
    # sleep would block the host until the sleep had ended (seen on an H100, CUDA 13).
    x.sub_(1)
    step(1000)
    torch.cuda.synchronize()
    out.zero_()
    res = step(400_000_000)  # ~0.2 s at 2 GHz
    res.update(want=float(n) * (n + 1) / 2, out=out[:3].tolist())
    dist.destroy_process_group()
    return res


def test_torch_cuda_futures_complete_at_launch_and_order_the_consumer():
    need("torch", "nccl")
    (res,) = run(_torch_future_child, 1, init=False, timeout=240, start_method="spawn")
    assert res["still_busy"], f"the host waited for the 0.2 s kernel before the collective ran: {res}"
    assert res["done"] and res["launch_s"] < 0.1, res
    assert res["pending"], res  # the collective still waited for the 0.2 s kernel
    assert res["total"] == res["want"] and res["out"] == [1.0, 2.0, 3.0], res


def _staged_child(rank, ws, calls):
    import torch

    import pyddp.cuda
    import pyddp.distributed as dist
    from pyddp.cuda import _pinned

    pyddp.cuda.set_device(0)
    dist.init_process_group("gloo")
    got = []
    for i in range(calls):
        x = torch.full((1000 + i % 3,), float(i + rank), device="cuda")
        dist.all_reduce(x)  # staged through pinned host memory
        got.append(x[0].item())
    idle = _pinned.idle()
    dist.destroy_process_group()
    return got, idle


def test_staging_reuses_pinned_buffers_on_a_gpu():
    need("torch")
    for got, (blocks, nbytes) in run(_staged_child, 2, 20, init=False, timeout=240, start_method="spawn"):
        assert got == [float(2 * i + 1) for i in range(20)]
        assert 1 <= blocks <= 2 and nbytes <= 8192


def _cupy_child(rank, ws):
    import cupy

    import pyddp.cuda
    import pyddp.distributed as dist

    pyddp.cuda.set_device(0)
    dist.init_process_group("nccl")
    with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=True):
        x = cupy.arange(1 << 20, dtype=cupy.float64)  # float64: the sum below is exact
        cupy.cuda.get_current_stream()  # the array's device's stream: the collective follows it
        dist.all_reduce(x)
        total = float(x.sum())
    dist.destroy_process_group()
    return total


def test_cupy_arrays_on_the_current_stream_of_their_device():
    need("cupy", "nccl")
    if nccl_version() is None:
        pytest.skip("no NCCL")
    n = 1 << 20
    assert run(_cupy_child, 1, init=False, timeout=240, start_method="spawn") == [float(n) * (n - 1) / 2]
