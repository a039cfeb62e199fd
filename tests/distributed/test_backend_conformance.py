"""One conformance suite, run on every backend: the cpu one (pyddp's C core), nccl on the test-only
stand-in for CUDA (tests/fakecuda), mpi under mpirun, and the ten-line example of the backends
package docstring ('solo').

The checks (tests/_conformance.py) run every collective kind, async work, point to point and object
collectives, the dtypes and ReduceOps each backend declares (its registry entry's ``supports``) in
a few calls, and the error cases: what a backend declares it does not serve is refused above the
seam, on every rank, in the same words for all, and the group goes on.  Results are compared with
NumPy.  Real processes, a timeout on every wait.  The compact matrix runs here; with
``PYDDP_SLOW_TESTS=1`` every dtype runs every kind and every op it reduces with.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import timedelta

import numpy as np
import pytest

import _conformance
import _paths
import fakecuda
from _mp import run

HERE = _paths.TESTS
ROOT = os.path.dirname(HERE)
SLOW = os.environ.get("PYDDP_SLOW_TESTS") == "1"
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

pytestmark = pytest.mark.timeout(300)


def _assert_clean(reports, min_checks):
    bad = [b for r in reports for b in r["bad"]]
    assert bad == [], "\n".join(bad[:20])
    assert all(r["checks"] >= min_checks for r in reports), [r["checks"] for r in reports]


# ------------------------------------------------------------------------------------ cpu

def _cpu(rank, n, exhaustive):
    import pyddp.distributed as dist

    return _conformance.check(dist, rank, n, "cpu", exhaustive=exhaustive)


@pytest.mark.parametrize("transport", ["shm"] + (["tcp"] if SLOW else []))
def test_cpu_backend_conforms(transport):
    env = {"PYDDP_TRANSPORT": transport}
    reports = run(_cpu, 2, SLOW, backend="cpu", env=env, timeout=120 if not SLOW else 280)
    _assert_clean(reports, 40)


# --------------------------------------------------------------- nccl on the stand-in

def _nccl(rank, n, exhaustive):
    import pyddp.cuda as cuda
    import pyddp.distributed as dist

    cuda.set_device(rank % 2)
    dist.init_process_group("nccl", timeout=timedelta(seconds=60))
    try:
        def dev(a):
            kw = {"protocol": "dlpack"} if a.dtype == _conformance.BF16 else {}
            return fakecuda.DeviceArray(np.ascontiguousarray(a), device=rank % 2, **kw)

        return _conformance.check(dist, rank, n, "nccl", dev, lambda x: x.numpy(),
                                  exhaustive=exhaustive)
    finally:
        dist.destroy_process_group()


def test_nccl_backend_conforms():
    reports = run(_nccl, 2, SLOW, init=False, env=fakecuda.env(devices=2), timeout=180,
                  start_method="spawn")
    _assert_clean(reports, 40)


# ------------------------------------------------------------------------------ mpi

@pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY,
                    reason="needs mpirun and mpi4py (pip install 'pyddp[mpi]')")
def test_mpi_backend_conforms(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = [MPIRUN, "-n", "2", sys.executable, os.path.join(HERE, "_conformance.py"), "mpi",
           str(tmp_path)] + (["exhaustive"] if SLOW else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)
               if (tmp_path / f"rank{r}.json").exists()]
    assert len(reports) == 2, f"rc={out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    _assert_clean(reports, 40)
    assert out.returncode == 0, out.stderr[-3000:]


# ------------------------------------------------------- the docstring's example backend

def _solo(rank, n, exhaustive, body):
    import pyddp.distributed as dist

    exec(compile(body, "solo_backend", "exec"), {"__name__": "solo_backend"})  # registers 'solo'
    dist.init_process_group("solo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        return _conformance.check(dist, 0, 1, "solo", exhaustive=exhaustive)
    finally:
        dist.destroy_process_group()


def test_example_backend_conforms():
    import pyddp.distributed.backends as backends

    doc = backends.__doc__
    body = textwrap.dedent(doc.split("the devices it serves::\n", 1)[1]
                           .split("\nafter which", 1)[0]).strip()
    reports = run(_solo, 1, SLOW, body, init=False, timeout=60)
    _assert_clean(reports, 30)


# ---------------------------------------------------------- a backend's declaration

def test_a_declared_refusal_names_the_backend_and_what_it_supports():
    """A user's backend registered with ``supports``: refused before its run() is called."""
    import pyddp.distributed as dist
    from pyddp.distributed.backends import Backend, Completed, Supports, registry

    calls = []

    class Half(Backend):
        def __init__(self, opts):
            pass

        def run(self, request):
            calls.append(request.name)
            return None if request.blocking else Completed()

        def destroy(self):
            pass

    saved = dict(registry._registry)
    try:
        dist.Backend.register_backend(
            "half", lambda opts, _: Half(opts), extended_api=True, devices="cpu",
            supports=Supports(kinds=frozenset({"all_reduce", "barrier"}),
                              dtypes=frozenset({"float32", "float64"}),
                              ops=frozenset({"SUM", "MAX"})))
        dist.init_process_group("half", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
        try:
            dist.all_reduce(np.ones(2, np.float32))
            with pytest.raises(TypeError, match=r"all_reduce: backend 'half' does not support "
                                                r"dtype int32; it supports float32, float64"):
                dist.all_reduce(np.ones(2, np.int32))
            with pytest.raises(TypeError, match=r"ReduceOp.MIN; it supports ReduceOp MAX, SUM"):
                dist.all_reduce(np.ones(2), op=dist.ReduceOp.MIN)
            with pytest.raises(NotImplementedError,
                               match=r"broadcast: backend 'half' does not support broadcast"):
                dist.broadcast(np.ones(2), src=0)
            dist.barrier()
            assert calls == ["all_reduce", "barrier"]
            assert registry.lookup("half").supports.describe() == (
                "kinds all_reduce, barrier; dtypes float32, float64; ReduceOp MAX, SUM")
        finally:
            dist.destroy_process_group()
    finally:
        registry._registry.clear()
        registry._registry.update(saved)
