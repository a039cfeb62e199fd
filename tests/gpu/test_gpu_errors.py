"""Errors on the GPU path: arrays pyddp must refuse (non-contiguous, CPU mixed with CUDA, the wrong device, an
immutable JAX array as an output), a rank that never calls a collective (timeout), ranks that call different
counts (mismatch), and destroy_process_group with a collective that can never finish."""
import re
import threading
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from _gpu import any_lib, exc_info, gpu_run, machine, need

pytestmark = pytest.mark.timeout(240)

LIBS = ["torch", "cupy"]


def _expect_error(problems, label, fn, types, words):
    """fn() must raise one of types, its message naming each of words ('a|b': either)."""
    try:
        fn()
    except types as e:
        low = str(e).lower()
        missing = [w for w in words if not any(alt in low for alt in w.split("|"))]
        if missing:
            problems.append(f"{label}: {type(e).__name__} does not name {missing}: {e}")
        return
    except Exception as e:
        problems.append(f"{label}: raised {type(e).__name__}, not {types}: {e}")
        return
    problems.append(f"{label}: no error")


ARRAY_ERRORS = (ValueError, TypeError, RuntimeError)


def _bad_arrays_child(rank, ws, arrays, backend):
    problems = []
    _expect_error(problems, "all_reduce of a non-contiguous array", lambda: dist.all_reduce(arrays.strided(8)),
                  ValueError, ["tensor", "contiguous"])
    if backend != "cpu":  # (the cpu backend stages CUDA arrays through host memory: it may mix them)
        host = np.zeros(8, np.float32)
        dev_out = arrays.to_device(np.zeros(8 * ws, np.float32))
        _expect_error(problems, "all_gather_into_tensor(CUDA output, NumPy input)",
                      lambda: dist.all_gather_into_tensor(dev_out, host), ARRAY_ERRORS,
                      ["input_tensor|output_tensor", "cpu", "cuda"])
        _expect_error(problems, "all_gather_into_tensor(NumPy output, CUDA input)",
                      lambda: dist.all_gather_into_tensor(np.zeros(8 * ws, np.float32), arrays.to_device(host)),
                      ARRAY_ERRORS, ["input_tensor|output_tensor", "cpu", "cuda"])
        _expect_error(problems, "all_gather(CUDA list, NumPy tensor)",
                      lambda: dist.all_gather([arrays.to_device(host) for _ in range(ws)], host), ARRAY_ERRORS,
                      ["tensor", "cpu", "cuda"])
    # the group still works after refusing them
    x = arrays.to_device(np.ones(4, np.float32))
    dist.all_reduce(x)
    if not (arrays.to_host(x) == ws).all():
        problems.append(f"all_reduce after the refused calls gave {arrays.to_host(x)}")
    return problems


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "cpu"])
@pytest.mark.parametrize("lib", LIBS)
def test_bad_arrays_raise_naming_the_argument(lib, backend, ws):
    """Non-contiguous arrays; CPU and CUDA arrays in one call, where NCCL serves the CUDA ones."""
    need(lib, backend, ws)
    problems = [p for per_rank in gpu_run(_bad_arrays_child, ws, lib, backend, backend) for p in per_rank]
    assert not problems, "\n".join(problems)


def _numpy_on_nccl_child(rank, ws, arrays):
    problems = []
    _expect_error(problems, "all_reduce of a NumPy array on a group whose only backend is nccl",
                  lambda: dist.all_reduce(np.zeros(4, np.float32)), ARRAY_ERRORS, ["cpu"])
    return problems


def test_numpy_array_on_an_nccl_only_group_raises_as_torch():
    """torch raises for a CPU tensor given to a ProcessGroupNCCL-only group ("no backend for device cpu")."""
    lib = any_lib()
    need(lib, "nccl", 1)
    (problems,) = gpu_run(_numpy_on_nccl_child, 1, lib, "nccl")
    assert not problems, "\n".join(problems)


def _wrong_device_child(rank, ws, arrays):
    problems = []
    x0 = arrays.to_device(np.ones(4, np.float32))  # cuda:0, the launcher's device for rank 0
    dist.all_reduce(x0)
    x1 = arrays.on_device(np.ones(4, np.float32), 1)
    _expect_error(problems, "all_gather_into_tensor(output on cuda:0, input on cuda:1)",
                  lambda: dist.all_gather_into_tensor(arrays.to_device(np.zeros(4, np.float32)), x1),
                  ARRAY_ERRORS, ["input_tensor|output_tensor", "cuda:0", "cuda:1"])
    if arrays.name == "torch":  # a group bound to cuda:0 with device_id (torch's spelling) gets a cuda:1 array
        import torch

        dist.destroy_process_group()
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        _expect_error(problems, "all_reduce of a cuda:1 array in a group with device_id cuda:0",
                      lambda: dist.all_reduce(x1), ARRAY_ERRORS, ["tensor", "cuda:0", "cuda:1"])
    return problems


@pytest.mark.parametrize("lib", LIBS)
def test_array_on_another_gpu_raises_naming_both_devices(lib):
    need(lib, "nccl", 1)
    if machine()["devices"] < 2:
        pytest.skip(f"needs two GPUs, this machine has {machine()['devices']}")
    (problems,) = gpu_run(_wrong_device_child, 1, lib, "nccl")
    assert not problems, "\n".join(problems)


def _jax_child(rank, ws, arrays):
    try:
        import jax
        import jax.numpy as jnp

        gpus = jax.devices("gpu")
    except Exception as e:  # not installed, or a CPU-only jaxlib
        return {"skip": f"JAX has no GPU here: {type(e).__name__}: {e}"}
    x = jax.device_put(jnp.arange(8, dtype=jnp.float32) + rank, gpus[rank % len(gpus)])
    x.block_until_ready()
    res = {}
    try:
        dist.all_reduce(x)
        res["output_error"] = None
    except Exception as e:
        res["output_error"] = exc_info(e)
    out = arrays.to_device(np.zeros(8 * ws, np.float32))
    dist.all_gather_into_tensor(out, x)  # a JAX array as an input is read in place
    res["gathered"] = arrays.to_host(out).tolist()
    return res


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("backend", ["nccl", "cpu"])
def test_jax_array_is_refused_as_an_output_and_read_as_an_input(backend, ws):
    lib = any_lib()
    need(lib, backend, ws)
    res = gpu_run(_jax_child, ws, lib, backend)
    if "skip" in res[0]:
        pytest.skip(res[0]["skip"])
    problems = []
    want = np.concatenate([np.arange(8, dtype=np.float32) + r for r in range(ws)]).tolist()
    for rank, r in enumerate(res):
        e = r["output_error"]
        if e is None:
            problems.append(f"rank {rank}: all_reduce into an immutable JAX array raised nothing")
        elif e["type"] != "ValueError" or "tensor" not in e["msg"] or not re.search(
                r"read-?only|immutable|writ", e["msg"], re.I):
            problems.append(f"rank {rank}: expected a ValueError naming 'tensor' and saying it is read-only, got "
                            f"{e['type']}: {e['msg']}")
        if r["gathered"] != want:
            problems.append(f"rank {rank}: all_gather_into_tensor of JAX inputs gave {r['gathered']}, not {want}")
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------------------------
# a rank that never calls, ranks that call different counts, destroy with a collective pending

PG_TIMEOUT = 3


def _timeout_child(rank, ws, arrays):
    x = arrays.to_device(np.ones(1000, np.float32))
    for _ in range(3):
        dist.all_reduce(x)
    arrays.sync_device()
    if rank == 1:
        time.sleep(5 * PG_TIMEOUT)  # never calls the fourth all_reduce
        return None
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        dist.barrier()  # blocks the host: the error shows here at the latest
        return {"type": None, "elapsed": time.monotonic() - t0}
    except Exception as e:
        return dict(exc_info(e), elapsed=time.monotonic() - t0)


def test_rank_that_skips_a_collective_gives_dist_backend_error_within_the_timeout():
    lib = any_lib()
    need(lib, "nccl", 2)
    r = gpu_run(_timeout_child, 2, lib, "nccl", pg_timeout=PG_TIMEOUT, timeout=90)[0]
    assert r["type"] is not None, f"all_reduce + barrier returned after {r['elapsed']:.1f} s without rank 1"
    assert "DistBackendError" in r["mro"], r
    assert re.search(r"all_?reduce", r["msg"], re.I), f"the error does not name all_reduce: {r['msg']}"
    assert PG_TIMEOUT * 0.8 <= r["elapsed"] <= PG_TIMEOUT + 5, f"raised after {r['elapsed']:.1f} s: {r['msg']}"


def _mismatch_child(rank, ws, arrays):
    x = arrays.to_device(np.ones(10, np.float32))
    dist.all_reduce(x)
    dist.all_reduce(x)
    arrays.sync_device()
    a = arrays.to_device(np.ones(10 if rank == 0 else 20, np.float32))
    t0 = time.monotonic()
    try:
        dist.all_reduce(a)
        dist.barrier()
        res = {"type": None}
    except Exception as e:
        res = exc_info(e)
    res["elapsed"] = time.monotonic() - t0
    time.sleep(1.0)  # let every rank see the mismatch before this one tears its group down
    return res


def test_mismatched_counts_raise_on_every_rank_within_a_second():
    lib = any_lib()
    need(lib, "nccl", 2)
    problems = []
    for rank, r in enumerate(gpu_run(_mismatch_child, 2, lib, "nccl", timeout=90)):
        if r["type"] is None:
            problems.append(f"rank {rank}: all_reduce of 10 against 20 elements returned ({r['elapsed']:.2f} s)")
            continue
        if "DistError" not in r["mro"]:
            problems.append(f"rank {rank}: raised {r['type']}, not a DistError: {r['msg']}")
        if r["elapsed"] >= 1.0:
            problems.append(f"rank {rank}: took {r['elapsed']:.2f} s to report the mismatch")
        if not (re.search(r"(?<!\d)10(?!\d)", r["msg"]) and re.search(r"(?<!\d)20(?!\d)", r["msg"])):
            problems.append(f"rank {rank}: the message does not name both counts: {r['msg']}")
    assert not problems, "\n".join(problems)


def _destroy_pending_child(rank, ws, arrays):
    x = arrays.to_device(np.ones(1000, np.float32))
    dist.all_reduce(x)
    arrays.sync_device()
    if rank == 1:
        time.sleep(3)  # never joins rank 0's second all_reduce; the launcher then destroys this group
        return {}
    dist.all_reduce(x, async_op=True)
    t0 = time.monotonic()
    dist.destroy_process_group()
    took = time.monotonic() - t0
    synced = threading.Event()  # the stream must not stay stuck behind the aborted collective
    threading.Thread(target=lambda: (arrays.sync_device(), synced.set()), daemon=True).start()
    return {"destroy_s": took, "synced": synced.wait(15)}


def test_destroy_process_group_with_a_collective_that_cannot_finish_returns():
    lib = any_lib()
    need(lib, "nccl", 2)
    r = gpu_run(_destroy_pending_child, 2, lib, "nccl", timeout=90)[0]  # rank 1's destroy is timed by the launcher
    assert r["destroy_s"] < 10, f"destroy_process_group took {r['destroy_s']:.1f} s"
    assert r["synced"], "the device did not synchronize within 15 s after destroy_process_group: the aborted " \
                        "collective still holds the stream"
