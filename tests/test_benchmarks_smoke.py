"""benchmarks/collectives.py runs pyddp on 2 ranks and prints its tables (a smoke test, not a measurement)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env_with_this_pyddp():
    """The workers import the same pyddp as this test process (in-place build or installed copy)."""
    import pyddp

    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.mark.timeout(180)
def test_collectives_quick_table():
    try:
        import pyddp.distributed as dist
    except ImportError as e:
        pytest.skip(f"pyddp is not importable: {e}")
    if not hasattr(dist, "init_process_group"):
        pytest.skip("pyddp.distributed has no process groups in this build")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "collectives.py"), "--quick", "--peers", "pyddp",
         "--max-bytes", "4096", "--timeout", "120"],
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "numpy copy (memcpy) bandwidth" in proc.stdout, out
    assert "note:" not in proc.stdout, out
    assert "WRONG RESULT" not in proc.stdout, out
    for op in ("allreduce", "broadcast", "allgather", "reduce_scatter"):
        assert re.search(rf"^# {op} ", proc.stdout, re.M), out
    # One row per size: size, count, then time / algbw / busbw of pyddp.
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", proc.stdout, re.M)
    assert len(rows) >= 8, out
    assert all(float(r[2]) > 0 for r in rows), out
