"""Helpers of the GPU tests: what this machine has, CUDA arrays behind one interface, and a launcher.

machine() asks a child process (once per session) what torch, CuPy and pyddp see: the pytest process itself
never needs CUDA: the ranks are fresh interpreters (spawn), since CUDA does not survive a fork.

gpu_run(fn, ws, lib, backend, *args) runs fn(rank, ws, arrays, *args) on ws spawned ranks (tests/_mp.py), each
with its GPU selected (rank % devices) in the array library and, for the backends that use NCCL, in
pyddp.cuda, and a process group of `backend` initialised (timeout pg_timeout s) and destroyed around fn.
arrays is a TorchArrays or CupyArrays: NumPy in and out, streams, a spin kernel, a strided array.
"""
import functools
import importlib
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import pytest

from _mp import run, run_outcomes
from _ref import BFLOAT16, DTYPE_NAMES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The dtypes of the GPU path's tests (bfloat16 needs ml_dtypes for the NumPy reference).
GPU_DTYPES = [d for d in ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64")
              if d in DTYPE_NAMES]
REDUCE_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
MULTI_RANK_GPU_NCCL = (2, 30, 0)  # NCCL lets ranks share a GPU from 2.30 on (NCCL_MULTI_RANK_GPU_ENABLE=1)

_PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch"] = (torch.cuda.device_count() if torch.cuda.is_available() else
                    f"torch {torch.__version__}: torch.cuda.is_available() is False")
except Exception as e:
    out["torch"] = f"{type(e).__name__}: {e}"
try:
    import cupy
    out["cupy"] = cupy.cuda.runtime.getDeviceCount() or "cupy: no CUDA device"
except Exception as e:
    out["cupy"] = f"{type(e).__name__}: {e}"
try:
    import pyddp.cuda
    out["nccl"] = list(pyddp.cuda.nccl.version())[:3]
except Exception as e:
    out["nccl"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=None)
def machine():
    """{"torch": device count or why not, "cupy": the same, "nccl": pyddp's NCCL version [x, y, z] or why
    not, "devices": the larger count, "why": why no GPU test can run ('' when they can)}."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=180, env=env)
        found = json.loads(p.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        found = {"torch": "the probe timed out after 180 s", "cupy": "", "nccl": ""}
    except (IndexError, ValueError):
        found = {"torch": f"the probe failed (status {p.returncode}): {p.stderr.strip()[-500:]}", "cupy": "",
                 "nccl": ""}
    counts = [v for v in (found["torch"], found["cupy"]) if isinstance(v, int)]
    found["devices"] = max(counts, default=0)
    found["why"] = "" if found["devices"] else (
        f"no usable CUDA device (torch: {found['torch']}; cupy: {found['cupy'] or '-'})")
    return found


def nccl_version():
    v = machine()["nccl"]
    return tuple(v) if isinstance(v, list) else None


def need(lib, backend="cpu", ws=1):
    """Skip the calling test unless lib's arrays, and backend on ws ranks, can run here."""
    m = machine()
    if not isinstance(m[lib], int) or m[lib] < 1:
        pytest.skip(f"{lib} sees no CUDA device: {m[lib]}")
    if uses_nccl(backend):
        if nccl_version() is None:
            pytest.skip(f"pyddp loads no libnccl here: {m['nccl']}")
        if ws > m["devices"] and nccl_version() < MULTI_RANK_GPU_NCCL:
            pytest.skip(f"{ws} ranks on {m['devices']} GPU(s) need NCCL >= 2.30 with "
                        f"NCCL_MULTI_RANK_GPU_ENABLE=1; pyddp loads NCCL {'.'.join(map(str, nccl_version()))}")


def any_lib():
    """An array library that sees a device here (torch first)."""
    m = machine()
    return "torch" if isinstance(m["torch"], int) and m["torch"] > 0 else "cupy"


def uses_nccl(backend):
    return backend is None or "nccl" in backend


# ------------------------------------------------------------------------------ CUDA arrays

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


class TorchArrays:
    name = "torch"
    dtypes = GPU_DTYPES

    def __init__(self, dev):
        import torch

        torch.cuda.set_device(dev)
        self.torch, self.dev = torch, torch.device("cuda", dev)

    def to_device(self, a):
        t = self.torch
        if a.dtype == BFLOAT16:
            return t.from_numpy(np.ascontiguousarray(a).view(np.int16)).to(self.dev).view(t.bfloat16)
        return t.from_numpy(np.ascontiguousarray(a)).to(self.dev)

    def to_host(self, x):
        """A NumPy copy, read on the current stream."""
        if x.dtype == self.torch.bfloat16:
            return x.view(self.torch.int16).cpu().numpy().view(BFLOAT16)
        return x.cpu().numpy()

    def fill(self, x, value):
        x.fill_(value)

    def strided(self, n):
        return self.torch.zeros(2 * n, dtype=self.torch.float32, device=self.dev)[::2]

    def on_device(self, a, dev):
        return self.torch.from_numpy(a).to(self.torch.device("cuda", dev))

    def new_stream(self):
        return self.torch.cuda.Stream()

    def use(self, stream):
        return self.torch.cuda.stream(stream)

    def spin(self, cycles):
        self.torch.cuda._sleep(int(cycles))

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)

    def reached(self, event):
        """Whether the stream has passed ``event`` (never blocks)."""
        return event.query()

    def sync_current(self):
        self.torch.cuda.current_stream().synchronize()

    def sync_device(self):
        self.torch.cuda.synchronize()


class CupyArrays:
    name = "cupy"
    dtypes = [d for d in GPU_DTYPES if d != "bfloat16"]  # CuPy has no bfloat16 dtype

    def __init__(self, dev):
        import cupy

        cupy.cuda.Device(dev).use()
        self.cupy = cupy
        self._spin = cupy.RawKernel(_SPIN, "spin")

    def to_device(self, a):
        return self.cupy.asarray(a)

    def to_host(self, x):
        return self.cupy.asnumpy(x)

    def fill(self, x, value):
        x.fill(value)

    def strided(self, n):
        return self.cupy.zeros(2 * n, dtype=self.cupy.float32)[::2]

    def on_device(self, a, dev):
        with self.cupy.cuda.Device(dev):
            return self.cupy.asarray(a)

    def new_stream(self):
        return self.cupy.cuda.Stream(non_blocking=True)

    def use(self, stream):
        return stream  # a CuPy Stream is the context manager that makes it current

    def spin(self, cycles):
        self._spin((1,), (1,), (np.int64(cycles),))

    def event(self):
        return self.cupy.cuda.Event()

    def elapsed_ms(self, start, end):
        return self.cupy.cuda.get_elapsed_time(start, end)

    def reached(self, event):
        """Whether the stream has passed ``event`` (never blocks)."""
        return event.done

    def sync_current(self):
        self.cupy.cuda.get_current_stream().synchronize()

    def sync_device(self):
        self.cupy.cuda.Device().synchronize()


ARRAYS = {"torch": TorchArrays, "cupy": CupyArrays}


def spin_cycles(arrays, ms):
    """Clock cycles of arrays.spin() that keep the current stream busy for about ms milliseconds."""
    start, end = arrays.event(), arrays.event()
    arrays.spin(1000)  # CuPy compiles the kernel at its first launch: not inside the timing
    arrays.sync_device()
    start.record()
    arrays.spin(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / max(arrays.elapsed_ms(start, end), 1e-3))


# ------------------------------------------------------------------------------ launcher

def _rank_main(rank, ws, fn, lib, backend, devices, pg_timeout, args):
    import pyddp.distributed as dist

    arrays = ARRAYS[lib](rank % devices)
    if uses_nccl(backend):
        import pyddp.cuda

        pyddp.cuda.set_device(rank % devices)
    dist.init_process_group(backend, timeout=timedelta(seconds=pg_timeout))
    try:
        return fn(rank, ws, arrays, *args)
    finally:
        t0 = time.monotonic()
        if dist.is_initialized():
            dist.destroy_process_group()
        if time.monotonic() - t0 > 10:
            raise AssertionError(f"rank {rank}: destroy_process_group took {time.monotonic() - t0:.1f} s")


def _launch(runner, fn, ws, lib, backend, args, timeout, pg_timeout):
    try:  # once here rather than in every forked rank; importing torch does not initialise CUDA
        importlib.import_module("torch")
    except ImportError:
        pass
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # a JAX test must not take the GPU's memory
    if uses_nccl(backend) and ws > machine()["devices"]:
        env["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    # spawn: a fresh interpreter per rank, so a CUDA runtime this process initialised (another test
    # module asking pyddp.cuda or torch.cuda) never reaches a rank through fork
    return runner(_rank_main, ws, fn, lib, backend, machine()["devices"], pg_timeout, args, init=False,
                  env=env, timeout=timeout, start_method="spawn")


def gpu_run(fn, ws, lib, backend, *args, timeout=240, pg_timeout=60):
    """Every rank's return value of fn(rank, ws, arrays, *args) (see the module's docstring)."""
    return _launch(run, fn, ws, lib, backend, args, timeout, pg_timeout)


def gpu_run_outcomes(fn, ws, lib, backend, *args, timeout=240, pg_timeout=60):
    """As gpu_run, but every rank's RankOutcome (a rank may raise)."""
    return _launch(run_outcomes, fn, ws, lib, backend, args, timeout, pg_timeout)


def call(fn, *args, async_op=False, **kwargs):
    """fn(*args, **kwargs), or its async form and Work.wait(); checks what each form returns."""
    if async_op:
        work = fn(*args, async_op=True, **kwargs)
        if work is None:
            raise AssertionError("async_op=True returned None, not a Work")
        work.wait()
    else:
        ret = fn(*args, **kwargs)
        if ret is not None:
            raise AssertionError(f"a call without async_op returned {ret!r}, not None")


def exc_info(e):
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
