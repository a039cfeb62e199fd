"""benchmarks/_report.py: the header and markdown tables the README's benchmark figures are pasted from,
and one quick benchmark run printing its block through it (a shape check, not a measurement)."""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

import _paths
from _tiers import FULL

ROOT = _paths.ROOT
BENCH = os.path.join(ROOT, "benchmarks")


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", os.path.join(BENCH, "_report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cells(line):
    assert line.startswith("| ") and line.endswith(" |"), line
    return [c.strip() for c in line[2:-2].split(" | ")]


def test_header_names_command_machine_and_versions():
    r = _report()
    info = r.machine(memcpy=False)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", info["date"])
    assert info["cores"] >= 1 and info["memcpy_gbs"] is None
    lines = r.header(["--n", "1000", "a b"], script=os.path.join(BENCH, "sampler.py"), info=info)
    assert len(lines) == 2
    assert lines[0].rstrip() == "Command: `python benchmarks/sampler.py --n 1000 'a b'`"
    assert lines[1].startswith("Machine: " + info["date"] + ", ")
    assert f"{info['cores']} cores" in lines[1] and f"NumPy {info['numpy']}" in lines[1]
    assert "memcpy" not in lines[1]
    # the rules of algorithm choice in force (pyddp.tools.tune), beside the machine
    assert info["rules"] and lines[1].endswith("pyddp rules: " + info["rules"])
    if info["loadavg"] is not None:
        assert re.search(r"load average \d+\.\d\d \d+\.\d\d \d+\.\d\d", lines[1])
    info["memcpy_gbs"] = 12.345
    assert "memcpy 12.3 GB/s (np.copyto, 64 MiB)" in r.header([], script="x.py", info=info)[1]
    assert r.memcpy_gbs(nbytes=1 << 20, reps=2) > 0


def test_table_shape_alignment_and_errors():
    r = _report()
    lines = r.table(("what", "ms", "speedup"), [("a|b", "1.50", "2.0x"), ("c", "10.25 (9.1)", "n/a")])
    assert lines[0] == "| what | ms | speedup |"
    assert lines[1] == "|---|---:|---|"  # "n/a" is not a number: the column stays left-aligned
    assert _cells(lines[2]) == ["a\\|b", "1.50", "2.0x"]
    assert len(lines) == 4
    assert r.table(("a", "b"), [(1, "x")])[1] == "|---:|---|"
    assert r.table(("a", "b"), [(1, "x")], align="lr")[1] == "|---|---:|"
    with pytest.raises(ValueError, match="2 cells, the header 3"):
        r.table(("a", "b", "c"), [("1", "2")])
    with pytest.raises(ValueError, match="align"):
        r.table(("a", "b"), [], align="lc")
    text = r.block("Title", ("a", "b"), [("x", "1")], notes=["n1"], argv=[], script="s.py",
                   info=r.machine(memcpy=False))
    out = text.splitlines()
    assert out[0] == "Title" and out[1] == "" and out[2].startswith("Command: `python s.py`")
    assert out[3].startswith("Machine: ") and out[4] == "" and out[5] == "| a | b |"
    assert out[-2:] == ["", "n1"]


@FULL
@pytest.mark.timeout(120)
def test_sampler_quick_prints_a_generated_block():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, os.path.join(BENCH, "sampler.py"), "--quick"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("Command: "))
    assert lines[i].rstrip() == "Command: `python benchmarks/sampler.py --quick`"
    assert lines[i + 1].startswith("Machine: ") and "memcpy" in lines[i + 1] and "GB/s" in lines[i + 1]
    assert lines[i + 2] == ""
    assert _cells(lines[i + 3]) == ["what", "torch median ms (min)", "pyddp median ms (min)", "speedup",
                                    "speedup, CPU time"]
    assert lines[i + 4] == "|---|---:|---:|---:|---:|"
    rows = [_cells(ln) for ln in lines[i + 5:] if ln.startswith("| ")]
    assert [c[0] for c in rows] == ["one epoch, list of Python ints",
                                    "one epoch, pyddp indices() (NumPy int64)", "randperm(100,000) alone"]
    for c in rows:
        assert re.fullmatch(r"\d+\.\d \(\d+\.\d\)", c[2]), c
        assert re.fullmatch(r"\d+\.\dx|n/a", c[3]) and re.fullmatch(r"\d+\.\dx|n/a", c[4]), c
