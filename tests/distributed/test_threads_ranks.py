"""No BLAS/OpenMP oversubscription however ranks start: pyddp.multiprocessing.spawn (and
start_processes with fork) give their children OMP_NUM_THREADS=1 and one-thread pools as the
launchers do; a process group created by ranks that plain multiprocessing started limits each
process's pools to its share of the cores, says so at INFO, and leaves a user's setting alone.
Real processes; every wait has a timeout."""
import ast
import os
import socket
import subprocess
import sys

import pytest

import pyddp

import _paths

pytest.importorskip("threadpoolctl")
pytestmark = pytest.mark.timeout(180)

SCRIPT = os.path.join(_paths.TESTS, "_threads_script.py")
LIMITED = "limited this process's BLAS/OpenMP thread pools"


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(how, **env):
    e = {k: v for k, v in os.environ.items() if k not in
         ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RANK", "WORLD_SIZE",
          "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYDDP_DEBUG",
          "THP_MEM_ALLOC_ENABLE")}
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    e["PYTHONPATH"] = here + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(env)
    p = subprocess.run([sys.executable, SCRIPT, how, str(_port())], env=e, capture_output=True,
                       text=True, timeout=150)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = dict(ln.split(" ", 1) for ln in p.stdout.splitlines() if " " in ln)
    cores = int(lines["cores"])
    assert lines["parent_thp"] == env.get("THP_MEM_ALLOC_ENABLE", "None")   # the parent's is kept
    return ast.literal_eval(lines["result"]), cores, lines["parent"], p.stderr


def test_plain_multiprocessing_ranks_take_their_share():
    res, cores, _, err = _run("plain", PYDDP_DEBUG="INFO")
    share = max(1, cores // 2)
    for rank, before, after, omp, thp in res:
        assert before == cores or before > share   # NumPy started a thread per core (up to its cap)
        assert after == min(before, share)         # the group knows 2 ranks share the host
        assert omp is None and thp is None         # the environment is the user's
    assert err.count(LIMITED) == 2, err   # said once per rank, at INFO


def test_plain_multiprocessing_user_setting_is_kept():
    res, cores, _, err = _run("plain", OMP_NUM_THREADS="2", PYDDP_DEBUG="INFO")
    for rank, before, after, omp, thp in res:
        assert after == before
        assert omp == "2"
    assert LIMITED not in err


def test_plain_multiprocessing_without_threadpoolctl_warns():
    res, cores, _, err = _run("plain-nothreadpoolctl")
    assert "install threadpoolctl" in err and "OMP_NUM_THREADS=" in err, err


@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_spawn_children_run_one_thread_parent_env_unchanged(how):
    res, cores, parent_omp, err = _run(how, PYDDP_DEBUG="INFO")
    assert parent_omp == "None"
    for rank, before, after, omp, thp in res:
        assert omp == "1"
        assert before == after == 1
        assert thp == "1"   # torch's large tensors on huge pages (read by the single copies)
    assert LIMITED not in err   # the launcher-style setting is in place: nothing more to do


def test_spawn_respects_the_users_threads():
    res, cores, parent_omp, err = _run("spawn", OMP_NUM_THREADS="2", THP_MEM_ALLOC_ENABLE="0")
    assert parent_omp == "2"
    for rank, before, after, omp, thp in res:
        assert omp == "2"
        assert thp == "0"
