"""benchmarks/nn.py --quick runs, prints its tables (MLP/CNN, and small GPT/ViT models in float32
and under autocast), and pyddp's first-step losses equal torch's (a smoke test, not a
measurement)."""
import importlib.util
import os
import subprocess
import sys

import _paths

ROOT = _paths.ROOT


def test_nn_benchmark_quick_against_torch():  # "torch" in the name: skipped by the ASan run
    # without torch (the README's fresh venv) the script times pyddp alone and prints "-" for torch
    have_torch = importlib.util.find_spec("torch") is not None
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "nn.py"), "--quick"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stdout, r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| MLP") or ln.startswith("| CNN")]
    assert len(rows) == 2, r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0
    # the small transformer models: GPT in float32 / autocast bf16 / fp16, ViT float32 / bf16,
    # the autocast rows with each library's autocast/float32 ratio
    tf = [ln for ln in r.stdout.splitlines() if ln.startswith("| GPT") or ln.startswith("| ViT")]
    assert len(tf) == 5, r.stdout
    for row in tf:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0
        assert (float(cells[2]) > 0) if have_torch else cells[2] == "-"
        if "autocast" in cells[0]:
            assert float(cells[4]) > 0
            assert (float(cells[5]) > 0) if have_torch else cells[5] == "-"
