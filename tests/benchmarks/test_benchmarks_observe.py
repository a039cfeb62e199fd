"""benchmarks/observe.py: a tiny run prints its table (a smoke test, not a measurement)."""
import os
import re
import subprocess
import sys

import pytest

import _paths

ROOT = _paths.ROOT


@pytest.mark.timeout(300)
def test_observe_benchmark_prints_its_table():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYDDP_TIMELINE"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "observe.py"),
                          "--rounds", "1", "--iters", "40"], env=env, capture_output=True,
                         text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    rows = [ln for ln in res.stdout.splitlines() if re.match(r"\| (4 B|64 KiB|1 MiB) \|", ln)]
    assert len(rows) == 3, res.stdout
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[1:4]), ln
