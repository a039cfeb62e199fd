"""benchmarks/nccl.py: without a GPU it says why and exits 0 (with one, a short run prints its tables); its
worker's check and timing loop, run on pyddp's cpu backend with NumPy arrays standing in for CUDA arrays; the
tables, ratios and targets from fixed numbers."""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import _paths
from _mp import run

ROOT = _paths.ROOT
SCRIPT = os.path.join(ROOT, "benchmarks", "nccl.py")
OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")


def _nccl_bench():
    spec = importlib.util.spec_from_file_location("bench_nccl", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(400)
def test_script_runs_or_says_why_not(tmp_path):
    import pyddp

    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--worlds", "1", "--max-bytes", "4K",
                           "--timeout", "120"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=380)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert proc.stdout.startswith("# pyddp NCCL benchmark, "), out
    assert "# command: " in proc.stdout, out
    if "cannot run here" in proc.stdout:
        for lib in ("torch", "cupy", "pyddp"):
            assert re.search(rf"^#   {lib}: \S", proc.stdout, re.M), out
        return
    # a GPU: one table per collective, rows 8 B .. 4 KiB, no wrong result
    assert "# device: " in proc.stdout and "WRONG RESULT" not in proc.stdout, out
    for op in OPS:
        assert f"# {op}  (float32, 1 rank on 1 GPU" in proc.stdout, out


class NumpyArrays:
    """Host stand-in for TorchArrays/CupyArrays: events read the host clock."""

    class Event:
        def record(self):
            self.t = time.perf_counter()

    def __init__(self, dev):
        self.dev = dev

    def upload(self, host):
        return np.array(host, copy=True)

    def download(self, a):
        return a.copy()

    def zero(self, a):
        a[...] = 0

    def event(self):
        return self.Event()

    def elapsed_ms(self, start, end):
        return (end.t - start.t) * 1e3

    def sync(self):
        pass


def _cpu_coll(corrupt):
    def make(rank, world, dev, args):
        import pyddp.distributed as dist

        dist.init_process_group("cpu")
        coll = _nccl_bench().DistColl(dist)
        if corrupt:  # a broken allgather: the check must flag it
            good = coll.allgather
            coll.allgather = lambda a, out: (good(a, out), out.__setitem__(0, 12345.0))
        return coll
    return make


def _worker_child(rank, world, out, sizes, corrupt):
    mod = _nccl_bench()
    mod.ARRAY_TYPES["torch"] = NumpyArrays
    mod.COLLS["pyddp"] = _cpu_coll(corrupt)
    args = argparse.Namespace(worker="pyddp-torch", out=out, devices=1, ops=",".join(OPS),
                              sizes=",".join(map(str, sizes)), iters=3, batches=4, budget_bytes=1 << 20,
                              pg_timeout=30)
    return mod.worker(args)


@pytest.mark.parametrize("corrupt", [False, True], ids=["correct", "corrupt_allgather"])
def test_worker_checks_and_times_every_collective(tmp_path, corrupt):
    mod = _nccl_bench()
    sizes = [8, 4096, 1 << 20]
    out = str(tmp_path / "w")
    assert run(_worker_child, 2, out, sizes, corrupt, init=False, timeout=120) == [0, 0]
    import json

    per_rank = [json.load(open(f"{out}.{r}.json")) for r in range(2)]
    for r in per_rank:
        for rows in r["ops"].values():
            assert [len(row["us"]) for row in rows] == [4, 4, 4]
            assert rows[-1]["k"] == 1 and rows[0]["k"] == 3  # 1 MiB: the 1 MiB budget allows one call
    ops = mod.merge_ranks(per_rank)
    assert sorted(ops) == sorted(OPS)
    for op, rows in ops.items():
        assert [row["bytes"] for row in rows] == sizes
        assert all(row["median_us"] > 0 and row["iters"] == row_k * 4
                   for row, row_k in zip(rows, (3, 3, 1)))
        assert all(row["correct"] for row in rows) == (not corrupt or op != "allgather"), (op, rows)
    text = "\n".join(mod.table("allgather", "2 ranks on 1 GPU", {"pyddp-torch": ops}, 2))
    assert ("WRONG RESULT from pyddp (torch tensors)" in text) == corrupt, text


def test_merge_takes_the_slowest_rank_per_batch_then_the_median():
    mod = _nccl_bench()
    rows = [{"ops": {"allreduce": [{"bytes": 8, "k": 2, "us": us, "correct": ok}]}}
            for us, ok in (([1.0, 9.0, 3.0], True), ([2.0, 1.0, 5.0], False))]
    (r,) = mod.merge_ranks(rows)["allreduce"]
    assert r == {"bytes": 8, "median_us": 5.0, "min_us": 2.0, "iters": 6, "correct": False}


def _rows(scale, big_scale=None):
    return {op: [{"bytes": b, "median_us": (big_scale if big_scale and b >= 64 << 20 else scale) * (5 + b / 1e5),
                  "min_us": 1.0, "iters": 10, "correct": True} for b in (8, 1 << 20, 64 << 20, 1 << 30)]
            for op in OPS}


def test_table_ratios_and_targets():
    mod = _nccl_bench()
    # pyddp: 2% slower than torch at 64 MiB and above, 10% slower at small sizes; same as cupy everywhere
    peers = {"pyddp-torch": _rows(1.1, 1.02), "pyddp-cupy": _rows(1.0), "torch": _rows(1.0), "cupy": _rows(1.0)}
    text = "\n".join(mod.table("allreduce", "2 ranks on 1 GPU", peers, 2))
    for head in ("pyddp (torch tensors)", "pyddp (CuPy arrays)", "torch ProcessGroupNCCL", "cupy.cuda.nccl",
                 "pyddp/torch", "pyddp/cupy", "busbw = algbw * 1"):
        assert head in text, text
    rows = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 1 << 20, 64 << 20, 1 << 30]
    assert all(len(r) == 1 + 4 * 3 + 2 * 2 for r in rows), text
    big = rows[-1]
    assert float(big[2]) == pytest.approx((1 << 30) / float(big[1]) / 1e3, rel=1e-2)  # algbw = bytes / time
    assert float(big[3]) == float(big[2])  # 2 ranks: allreduce busbw = algbw
    assert [float(v) for v in big[13:17]] == [pytest.approx(1 / 1.02, abs=1e-3), 1.02, 1.0, 1.0]
    lines = mod.target_lines("2 ranks on 1 GPU", peers, OPS)
    assert len(lines) == 4, lines
    assert "busbw from 64 MiB >= 0.97x: met (lowest 0.980 at" in lines[0], lines
    assert "time at 8 B <= 1x: MISSED (1.100)" in lines[0], lines
    # one rank: busbw is algbw; reduce_scatter's factor with 4 ranks
    one = "\n".join(mod.table("reduce_scatter", "1 rank on 1 GPU", peers, 1))
    assert "busbw = algbw (one rank)" in one
    row = [line.split() for line in one.splitlines() if not line.startswith("#")][-1]
    assert row[2] == row[3]
    assert "busbw = algbw * 0.75" in mod.table("reduce_scatter", "4 ranks on 4 GPUs", peers, 4)[0]
    assert mod.table("allreduce", "x", {}, 2) == ["# allreduce: no results"]


def test_sizes_worlds_and_skips():
    mod = _nccl_bench()
    sizes = mod.sizes_for(8, 1 << 30, 4)
    assert sizes[0] == 8 and sizes[-1] == 1 << 30 and 64 << 20 in sizes and 16 in sizes and len(sizes) == 15
    assert mod.parse_worlds("auto", 1) == [(1, 1), (2, 1)]
    assert mod.parse_worlds("auto", 4) == [(1, 1), (2, 1), (4, 4)]
    assert mod.parse_worlds("1,2@1,3", 2) == [(1, 1), (2, 1), (3, 2)]
    for bad in ("2@3", "0", "x", "2@0"):
        with pytest.raises(ValueError, match="--worlds"):
            mod.parse_worlds(bad, 2)
    probe = {"torch": {"devices": 1, "nccl": "2.27.3"}, "cupy": {"why": "cupy does not import"},
             "pyddp": {"devices": 1, "nccl": "2.32.3"}}
    assert mod.skip_reason("pyddp-torch", probe, shared=True) == ""
    assert "cupy does not import" in mod.skip_reason("pyddp-cupy", probe, shared=False)
    assert mod.skip_reason("torch", probe, shared=False) == ""
    assert "NCCL >= 2.30" in mod.skip_reason("torch", probe, shared=True)
    assert "2.27.3" in mod.skip_reason("torch", probe, shared=True)
    assert mod.nccl_code_text(23203) == "2.32.3" and mod.nccl_code_text(2708) == "2.7.8"
