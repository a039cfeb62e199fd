"""The short soak (benchmarks/soak.py --ops 2000): mixed collectives on 3 ranks, every result checked
against NumPy; after warm-up, file descriptors, threads and /dev/shm entries flat and resident memory
(all of it, and its anonymous part) grown by less than 1%, the rule of the long run (README)."""
import importlib.util
import os
import subprocess
import sys

import pytest

import _paths
from _tiers import FULL

ROOT = _paths.ROOT


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "benchmarks",
                                                                       "soak.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _samples(n, rss=None, anon=None, fds=None):
    out = []
    for i in range(n):
        out.append({"op": (i + 1) * 10, "rss": (rss or (lambda i: 50 << 20))(i),
                    "anon": (anon or (lambda i: 25 << 20))(i), "shmem": 4 << 20,
                    "file": 19 << 20, "fds": (fds or (lambda i: 17))(i), "threads": 4,
                    "shm": 0})
    return out


def _verdict(mod, samples):
    class Args:
        ops, warmup, max_growth = 500, 0.2, 0.01
    res = [{"rank": 0, "checked": 10, "failures": [], "samples": samples, "seconds": 1.0}]
    return mod.report(res, Args)[1]


def test_growth_rule():
    """The rule itself: flat passes; 2% more resident memory, 2% more anonymous memory inside a
    flat total, or one more file descriptor after warm-up fails; growth during warm-up does not."""
    mod = _soak_module()
    assert _verdict(mod, _samples(50))
    assert not _verdict(mod, _samples(50, rss=lambda i: (50 << 20) + i * (1 << 20) // 50))
    assert not _verdict(mod, _samples(50, anon=lambda i: (25 << 20) + i * (1 << 20) // 50))
    assert not _verdict(mod, _samples(50, fds=lambda i: 17 + (i > 30)))
    assert _verdict(mod, _samples(50, rss=lambda i: (50 << 20) - (5 << 20) * (i < 10),
                                  fds=lambda i: 17 - (i < 10)))


@FULL
@pytest.mark.timeout(900)
def test_short_soak():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYDDP_TIMELINE"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"),
                          "--ops", "2000", "--max-growth", "0.01", "--timeout", "800"],
                         env=env, capture_output=True, text=True, timeout=850)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "soak: PASSED" in res.stdout
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 3
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert int(cells[1]) > 1000 and cells[2] == "0", ln  # results checked, none wrong
        assert float(cells[6].rstrip("%")) < 1.0, ln  # resident memory after warm-up
        anon = cells[7]  # "23.76 -> 23.81 (+0.20%)"
        assert float(anon[anon.index("(") + 1:anon.index("%")]) < 1.0, ln
        for c in cells[10:13]:  # fds, threads, /dev/shm entries: "a -> b", b <= a
            a, b = (int(x) for x in c.split("->"))
            assert b <= a, ln
