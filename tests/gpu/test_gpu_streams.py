"""Stream semantics (as torch's ProcessGroupNCCL), Work and Future on CUDA arrays, and a group that dispatches
each call by the array's device ("cpu:gloo,cuda:nccl", backend=None)."""
import contextlib
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _gpu import gpu_run, need, spin_cycles
from _ref import Checker, assert_clean

pytestmark = pytest.mark.timeout(300)

LIBS = ["torch", "cupy"]
SPIN_MS = 400  # the slow kernel queued ahead of a collective


def _ones_reduced(ws):
    return ws * (ws + 1) / 2  # all_reduce SUM of rank + 1 over the ranks


def _warm(arrays, x):
    """The communicator exists, and CuPy has compiled fill and * 2, before the part that is timed."""
    dist.all_reduce(x)
    arrays.fill(x, 1)
    x * 2
    arrays.sync_device()


def _early(arrays, done, written):
    """True when a work (or future) said ``done`` while its input was not yet written on the stream:
    asked in that order, so a stream that passed ``written`` only after ``done`` was read still counts.
    With NCCL the launch returns at once and the work must not be done behind the busy stream; the 'cpu'
    backend's staging waits on the host for the stream at the launch (its documented behaviour), after
    which the work may complete at any moment: the check holds for both."""
    return bool(done) and not arrays.reached(written)


def _stream_child(rank, ws, arrays, side):
    x = arrays.to_device(np.zeros(1 << 20, np.float32))
    _warm(arrays, x)
    cycles = spin_cycles(arrays, SPIN_MS)
    with arrays.use(arrays.new_stream()) if side else contextlib.nullcontext():
        arrays.spin(cycles)  # a slow kernel on the current stream, then the input is written behind it
        arrays.fill(x, rank + 1)
        written = arrays.event()
        written.record()
        t0 = time.monotonic()
        work = dist.all_reduce(x, async_op=True)
        early = _early(arrays, work.is_completed(), written)
        work.wait()
        y = x * 2  # a kernel on the current stream that reads the output
        host_s = time.monotonic() - t0
        arrays.sync_current()
        got = arrays.to_host(y)
    want = 2 * _ones_reduced(ws)
    return {"early": early, "host_s": host_s, "wrong": int((got != want).sum()), "first": float(got[0]),
            "want": want}


@pytest.mark.parametrize("side", [False, True], ids=["default_stream", "side_stream"])
@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", ["nccl", "cpu"])
@pytest.mark.parametrize("lib", LIBS)
def test_collective_is_ordered_after_the_current_stream_and_before_what_follows(lib, backend, ws, side):
    """The collective sees a value written on the current stream behind a slow kernel; after Work.wait() a
    kernel on the current stream sees the result. With NCCL the host is not blocked meanwhile."""
    need(lib, backend, ws)
    problems = []
    for rank, r in enumerate(gpu_run(_stream_child, ws, lib, backend, side)):
        if r["wrong"]:
            problems.append(f"rank {rank}: {r['wrong']} elements wrong after wait(), first {r['first']} "
                            f"(expected {r['want']}; 0 means the collective ran before the write)")
        if r["early"]:
            problems.append(f"rank {rank}: is_completed() was True while the stream was still busy")
        if backend == "nccl" and r["host_s"] > SPIN_MS / 2000:
            problems.append(f"rank {rank}: the host spent {r['host_s'] * 1e3:.0f} ms in all_reduce + wait() "
                            f"behind a {SPIN_MS} ms kernel: it waited for the GPU")
    assert not problems, "\n".join(problems)


def _work_child(rank, ws, arrays):
    x = arrays.to_device(np.zeros(1 << 16, np.float32))
    _warm(arrays, x)
    cycles = spin_cycles(arrays, SPIN_MS)
    arrays.spin(cycles)
    arrays.fill(x, rank + 1)
    written = arrays.event()
    written.record()
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    completed, fut_done = work.is_completed(), fut.done()
    res = {"early": _early(arrays, completed, written), "fut_done": fut_done,
           "fut_early": _early(arrays, fut_done, written)}
    work.synchronize()  # the current stream waits for the collective
    y = x * 2
    arrays.sync_current()
    deadline = time.monotonic() + 10
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)
    res["completed"] = work.is_completed()
    value = fut.wait()
    res["value"] = f"{type(value).__name__} of {len(value)}" if isinstance(value, list) else repr(type(value))
    ok = res["value"] == "list of 1"
    res["value_wrong"] = int((arrays.to_host(value[0]) != _ones_reduced(ws)).sum()) if ok else -1
    res["y_wrong"] = int((arrays.to_host(y) != 2 * _ones_reduced(ws)).sum())
    res["wait_after"] = work.wait()
    # Future.wait() while the stream is still busy: the value comes back, ordered on the current stream
    arrays.spin(cycles)
    arrays.fill(x, rank + 1)
    t0 = time.monotonic()
    value = dist.all_reduce(x, async_op=True).get_future().wait()
    y = value[0] * 2
    res["fut_host_s"] = time.monotonic() - t0
    arrays.sync_current()
    res["fut_y_wrong"] = int((arrays.to_host(y) != 2 * _ones_reduced(ws)).sum())
    return res


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", ["nccl", "cpu"])
@pytest.mark.parametrize("lib", LIBS)
def test_work_is_completed_synchronize_and_future(lib, backend, ws):
    need(lib, backend, ws)
    problems = []
    for rank, r in enumerate(gpu_run(_work_child, ws, lib, backend)):
        if r["early"]:
            problems.append(f"rank {rank}: is_completed() was True before the stream reached the collective")
        # torch: a NCCL work's future is done once launched (reading it orders the caller's stream); with
        # host staging it is done when the host part is, never before the stream wrote the input
        if backend == "nccl" and not r["fut_done"]:
            problems.append(f"rank {rank}: get_future().done() was False right after the launch (torch's NCCL "
                            "future is done once the collective is queued)")
        if backend != "nccl" and r["fut_early"]:
            problems.append(f"rank {rank}: get_future().done() was True before the stream wrote the input")
        if not r["completed"]:
            problems.append(f"rank {rank}: is_completed() still False 10 s after synchronize() and a stream sync")
        if r["value"] != "list of 1" or r["value_wrong"]:
            problems.append(f"rank {rank}: get_future().wait() gave {r['value']}, {r['value_wrong']} elements "
                            "wrong (expected [the output array] holding the result)")
        if r["y_wrong"]:
            problems.append(f"rank {rank}: a kernel queued after synchronize() read {r['y_wrong']} wrong elements")
        if r["wait_after"] is not True:
            problems.append(f"rank {rank}: wait() on a completed work returned {r['wait_after']!r}")
        if r["fut_y_wrong"]:
            problems.append(f"rank {rank}: a kernel queued after get_future().wait() read {r['fut_y_wrong']} "
                            "wrong elements")
        if backend == "nccl" and r["fut_host_s"] > SPIN_MS / 2000:
            problems.append(f"rank {rank}: get_future().wait() held the host {r['fut_host_s'] * 1e3:.0f} ms "
                            f"behind a {SPIN_MS} ms kernel (torch's returns once the current stream waits for it)")
    assert not problems, "\n".join(problems)


def _dispatch_child(rank, ws, arrays, backend):
    ck = Checker(rank)
    if backend is not None:
        got = dist.get_backend()
        ck.expect("get_backend", None if got == backend else f"get_backend() = {got!r}")
    for i in range(3):  # host and device calls interleaved, each checked
        base = rank + 1 + i
        want = sum(r + 1 + i for r in range(ws))
        h = np.full(5, base, np.float32)
        d = arrays.to_device(np.full(7, base, np.float64))
        if ck.call(f"all_reduce numpy [{i}]", lambda: dist.all_reduce(h)):
            ck.expect(f"all_reduce numpy [{i}]", None if (h == want).all() else f"got {h}")
        if ck.call(f"all_reduce {arrays.name} [{i}]", lambda: dist.all_reduce(d, async_op=True).wait()):
            got = arrays.to_host(d)
            ck.expect(f"all_reduce {arrays.name} [{i}]", None if (got == want).all() else f"got {got}")
        hg = np.zeros(5 * ws, np.float32)
        dg = arrays.to_device(np.zeros(7 * ws, np.float64))
        if ck.call(f"all_gather_into_tensor numpy [{i}]",
                   lambda: dist.all_gather_into_tensor(hg, np.full(5, base, np.float32))):
            ck.expect(f"all_gather_into_tensor numpy [{i}]",
                      None if (hg == np.repeat([r + 1 + i for r in range(ws)], 5)).all() else f"got {hg}")
        if ck.call(f"all_gather_into_tensor {arrays.name} [{i}]",
                   lambda: dist.all_gather_into_tensor(dg, arrays.to_device(np.full(7, base, np.float64)))):
            got = arrays.to_host(dg)
            ck.expect(f"all_gather_into_tensor {arrays.name} [{i}]",
                      None if (got == np.repeat([r + 1 + i for r in range(ws)], 7)).all() else f"got {got}")
        got = [None] * ws
        if ck.call(f"all_gather_object [{i}]", lambda: dist.all_gather_object(got, (rank, i))):
            ck.expect(f"all_gather_object [{i}]", None if got == [(r, i) for r in range(ws)] else f"got {got}")
    return ck.report()


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", None], ids=["cpu_gloo_cuda_nccl", "None"])
@pytest.mark.parametrize("lib", LIBS)
def test_mixed_backend_dispatches_by_device(lib, backend, ws):
    need(lib, backend, ws)
    assert_clean(gpu_run(_dispatch_child, ws, lib, backend, backend), min_checks=30)
