"""benchmarks/nn.py --quick runs, prints its table, and pyddp's first-step loss equals torch's
(a smoke test, not a measurement)."""
import os
import subprocess
import sys

import _paths

ROOT = _paths.ROOT


def test_nn_benchmark_quick_against_torch():  # "torch" in the name: skipped by the ASan run
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "nn.py"), "--quick"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stdout, r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| MLP") or ln.startswith("| CNN")]
    assert len(rows) == 2, r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0
