"""benchmarks/optim.py and benchmarks/amp.py: a tiny run prints its table and its own correctness
check passes (a smoke test, not a measurement)."""
import os
import subprocess
import sys

import pytest

import _paths
from _tiers import FULL

ROOT = _paths.ROOT


@FULL
@pytest.mark.timeout(120)
@pytest.mark.parametrize("script,args", [("optim.py", ["--numel", "2e5", "--reps", "2", "--quick"]),
                                         ("amp.py", ["--numel", "2e5", "--reps", "2"])])
def test_benchmark_prints_table(script, args):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
                          capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| implementation |" in out and "pyddp" in out
    assert "WARNING" not in out, out
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert "torch" in out and "# note: checked" in out, out
