"""benchmarks/gemm.py --quick runs and prints its table (a smoke test, not a measurement)."""
import os
import subprocess
import sys

import pytest

import _paths

ROOT = _paths.ROOT


def test_gemm_benchmark_quick():
    pytest.importorskip("ml_dtypes")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gemm.py"), "--quick"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| small")]
    assert len(rows) == 2, r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[2:5]), row
