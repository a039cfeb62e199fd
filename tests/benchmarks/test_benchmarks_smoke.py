"""benchmarks/collectives.py: a quick pyddp run prints its tables, and the table/plot code handles every column
(a smoke test, not a measurement; needs neither torch nor MPI)."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import _paths
from _tiers import FULL

ROOT = _paths.ROOT
SCRIPT = os.path.join(ROOT, "benchmarks", "collectives.py")
OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather", "scatter", "alltoall")
# Notes that say what this build or machine lacks, not that something failed.
BENIGN_NOTES = ("# note: pyddp shm-buffer: not available", "# note: plot skipped")


def _env_with_this_pyddp():
    """The workers import the same pyddp as this test process (in-place build or installed copy)."""
    import pyddp

    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _has_matplotlib():
    """matplotlib imports and can draw here.  Not under the AddressSanitizer runtime that .ci/run
    preloads: matplotlib's C++ extensions throw C++ exceptions, which that runtime cannot intercept
    when libstdc++ was not loaded first (it aborts: "real___cxa_throw != 0")."""
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        import matplotlib  # noqa: F401
    except Exception:
        return False
    return True


def _need_process_groups():
    """Skip where this build of pyddp cannot start a process group."""
    try:
        import pyddp.distributed as dist
    except ImportError as e:
        pytest.skip(f"pyddp is not importable: {e}")
    if not hasattr(dist, "init_process_group"):
        pytest.skip("pyddp.distributed has no process groups in this build")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _collectives():
    return _load("bench_collectives", SCRIPT)


def _worker_module():
    return _load("bench_worker", os.path.join(ROOT, "benchmarks", "bench_worker.py"))


@FULL
@pytest.mark.timeout(180)
def test_collectives_quick_table(tmp_path):
    _need_process_groups()
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--peers", "pyddp,pyddp-tcp", "--max-bytes", "4096",
         "--timeout", "120", "--json", str(out_json)]
        + (["--plot", str(out_png)] if _has_matplotlib() else ["--no-plot"]),
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "numpy copy (memcpy) bandwidth" in proc.stdout, out
    notes = [line for line in proc.stdout.splitlines() if line.startswith("# note:")]
    assert all(line.startswith(BENIGN_NOTES) for line in notes), out
    assert "WRONG RESULT" not in proc.stdout, out
    tables = {}
    for op in OPS:
        m = re.search(rf"^# {op} .*?(?=^# (?:{'|'.join(OPS)}) |^# target|^# note|^# plot|\Z)", proc.stdout,
                      re.M | re.S)
        assert m, out
        tables[op] = m.group(0)
        assert "pyddp-tcp" in tables[op] and "memcpy" in tables[op] and "GB/s" in tables[op], out
    assert "pyddp/" in tables["allreduce"], out  # pyddp algbw / memcpy, allreduce only
    assert "pyddp/" not in tables["broadcast"], out
    # One row per size: size, memcpy GB/s, then time / algbw / busbw of pyddp and of pyddp-tcp
    # (allreduce: then pyddp/memcpy, and the shm-buffer columns once dist._shared_array exists).
    num = r"\s+([0-9.]+)"
    for op in OPS:
        rows = re.findall(rf"^\s+(\d+){num * 7}", tables[op], re.M)
        assert len(rows) == 3, tables[op]
        assert all(float(v) > 0 for r in rows for v in (r[1], r[2], r[5])), tables[op]
    data = json.loads(out_json.read_text())
    assert set(data["results"]) == {"pyddp", "pyddp-tcp"}, data["notes"]
    assert data["results"]["pyddp-tcp"]["transport_env"] == "tcp"
    assert data["results"]["pyddp"]["transport_env"] == ""
    for rows in data["results"]["pyddp"]["ops"].values():
        assert all(str(r["bytes"]) in data["memcpy"] for r in rows)
    shm = data["results"]["pyddp"]["shm_buffer"]
    if shm["available"]:
        assert "pyddp shm-buffer" in tables["allreduce"] and "shm-buf/" in tables["allreduce"], out
        assert all(r["correct"] for r in shm["rows"]), shm
    else:
        assert "# note: pyddp shm-buffer: not available" in proc.stdout, out
    if _has_matplotlib():
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out
    else:
        assert not out_png.exists(), out


def _fake_results(mod, world=2):
    """Rows for every column, times in fixed ratios: gloo 3x and mpi 1.5x pyddp, pyddp-tcp 2x, shm 0.5x."""
    sizes = [4 << (4 * i) for i in range(7)]  # 4 B .. 64 MiB

    def rows(op, scale):
        out = []
        for n in sizes:
            n_in, n_out = mod.counts_for(op, n, world)
            b = 4 * (n_out if op == "allgather" else n_in)
            out.append({"bytes": b, "count": b // 4, "iters": 5, "median_us": scale * (20 + b / 4e3),
                        "min_us": 1.0, "correct": True})
        return out

    results = {}
    for c, scale in (("pyddp", 1.0), ("pyddp-shm", 0.5), ("pyddp-tcp", 2.0), ("gloo", 3.0), ("mpi", 1.5)):
        ops = ["allreduce"] if c == "pyddp-shm" else OPS
        results[c] = {"ops": {op: rows(op, scale) for op in ops}, "errors": {}}
    results["gloo"]["ops"]["broadcast"][0]["correct"] = False
    memcpy = {n: {"us": n / 10e3, "gbps": 10.0} for n in mod.row_sizes(OPS, sizes, world)}
    return results, memcpy


def test_table_every_column():
    mod = _collectives()
    results, memcpy = _fake_results(mod)
    text = "\n".join(mod.table("allreduce", results, 2, memcpy))
    for head in ("memcpy", "pyddp shm-buffer", "pyddp-tcp", "torch gloo", "Open MPI", "gloo/", "mpi/",
                 "shm-buf/"):
        assert head in text, text
    rows = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert len(rows) == 7, text
    # size, memcpy, 5 x (time, algbw, busbw), gloo/pyddp, mpi/pyddp, gloo/pyddp-tcp, pyddp/, shm-buf/
    assert all(len(r) == 2 + 15 + 5 for r in rows), text
    big = rows[-1]
    assert int(big[0]) == 64 << 20
    assert [float(v) for v in big[17:20]] == [3.0, 1.5, 1.5], text
    pyddp_bw, shm_bw = float(big[3]), float(big[6])
    assert float(big[20]) == pytest.approx(pyddp_bw / 10.0, abs=1e-3)
    assert float(big[21]) == pytest.approx(shm_bw / 10.0, abs=1e-3)
    # Other collectives: no shm-buffer and no memcpy fraction; a wrong result is marked.
    text = "\n".join(mod.table("broadcast", results, 2, memcpy))
    assert "shm-buf" not in text and "pyddp/\n" not in text and "WRONG RESULT from torch gloo" in text, text
    assert "!" in text.splitlines()[3], text
    targets = "\n".join(mod.target_lines(results, memcpy, OPS))
    assert "mpi/pyddp 1.50 (>= 1.5: met)" in targets and "gloo/pyddp 3.00 (>= 4: MISSED)" in targets, targets
    assert "pyddp-tcp at least as fast as gloo at every size: met" in targets, targets


def test_summary_block_counts_points_and_marks_the_ones_behind():
    """The README's generated table: peer time / pyddp time per collective and size, under the
    Command and Machine lines, with the count of points where pyddp is ahead."""
    import types

    mod = _collectives()
    results, memcpy = _fake_results(mod)
    first = results["pyddp"]["ops"]["broadcast"][0]
    peer = {r["bytes"]: r for r in results["mpi"]["ops"]["broadcast"]}[first["bytes"]]
    results["pyddp"]["ops"]["broadcast"][0] = dict(first, median_us=peer["median_us"] * 2)  # 0.50
    args = types.SimpleNamespace(ops=list(OPS), rounds=5)
    text = mod.summary_block(args, results, 2, memcpy)
    assert text.startswith("Open MPI time / pyddp time, 2 ranks") and "torch gloo time / pyddp time" in text
    lines = text.split("\n\n\n")[0].splitlines() if "\n\n\n" in text else text.splitlines()
    assert lines[2].startswith("Command: `") and lines[3].startswith("Machine: ")
    table = []
    for line in lines:
        if line.startswith("| ") and not line.startswith("| collective"):
            table.append([c.strip() for c in line.split("|")[1:-1]])
        if line.startswith("torch gloo"):
            break
    rows = {r[0]: r[1:] for r in table}
    assert set(rows) == set(OPS), rows
    col = sorted({r["bytes"] for op in OPS for r in results["pyddp"]["ops"][op]}).index(first["bytes"])
    assert rows["broadcast"][col] == "**0.50**", rows
    cells = [c for r in rows.values() for c in r if c != "-"]
    behind = [c for c in cells if c.startswith("**")]
    assert behind == ["**0.50**"], rows
    assert f"pyddp ahead at {len(cells) - 1} of {len(cells)} points" in lines[0], lines[0]
    only = {"pyddp": results["pyddp"]}
    assert mod.summary_block(args, only, 2, memcpy) is None


def test_table_without_peers():
    """pyddp alone: no ratio columns, and a missing library is no error."""
    mod = _collectives()
    results, memcpy = _fake_results(mod)
    only = {"pyddp": results["pyddp"]}
    text = "\n".join(mod.table("allreduce", only, 2, memcpy))
    assert "gloo/" not in text and "pyddp/" in text and "shm-buf/" not in text, text
    assert mod.table("allreduce", {}, 2, memcpy) == ["# allreduce: no results"]
    targets = mod.target_lines(only, memcpy, OPS)
    assert len(targets) == 1 and "pyddp/memcpy" in targets[0] and "gloo" not in targets[0], targets


@FULL
def test_plot(tmp_path):
    if not _has_matplotlib():
        pytest.skip("matplotlib is not installed (or cannot run under the ASan runtime)")
    mod = _collectives()
    results, memcpy = _fake_results(mod)
    path = tmp_path / "plot.png"
    assert mod.plot(str(path), list(OPS), results, 2, memcpy) == ""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_peer_is_refused(capsys):
    mod = _collectives()
    with pytest.raises(SystemExit):
        mod.main(["--peers", "pyddp,nccl"])
    assert "unknown peer 'nccl'" in capsys.readouterr().err


def test_rounds_are_merged_by_the_median_of_their_medians():
    mod = _collectives()
    row = {"bytes": 4, "count": 1, "iters": 10, "correct": True}
    rounds = [{"ops": {"allreduce": [dict(row, median_us=m, min_us=m / 2, correct=m != 9.0)]},
               "errors": {}} for m in (1.0, 9.0, 3.0)]
    merged = mod.merge_rounds(rounds)
    r = merged["ops"]["allreduce"][0]
    assert r["median_us"] == 3.0 and r["min_us"] == 0.5 and r["iters"] == 30 and r["rounds"] == 3
    assert r["correct"] is False  # one wrong round marks the row
    assert mod.merge_rounds(rounds[:1]) is rounds[0]


def test_points_behind_say_in_how_many_rounds_they_were_behind():
    """Rounds run the libraries next to each other: a point behind on the median of the rounds'
    medians says in how many of the rounds both libraries ran it was behind, round against round
    (a round that one library missed is left out)."""
    import types

    mod = _collectives()
    row = {"bytes": 4096, "count": 1024, "iters": 10, "correct": True}

    def runs(times, skip=()):
        # a second size (8 KiB) at 20 us for both: level, never behind
        return [{"ops": {"allgather": [dict(row, median_us=t, min_us=t),
                                       dict(row, bytes=8192, count=2048, median_us=20.0, min_us=20.0)]},
                 "errors": {}, "round": i}
                for i, t in enumerate(times) if i not in skip]

    # pyddp: 10, 10, 10, 10; Open MPI: 12, 9, 9, 8 (rounds 1-3 behind; median 9 < 10)
    results = {"pyddp": mod.merge_rounds(runs([10.0, 10.0, 10.0, 10.0])),
               "mpi": mod.merge_rounds(runs([12.0, 9.0, 9.0, 8.0]))}
    assert results["mpi"]["ops"]["allgather"][0]["round_medians"] == [[0, 12.0], [1, 9.0], [2, 9.0],
                                                                       [3, 8.0]]
    args = types.SimpleNamespace(ops=["allgather"], rounds=4)
    memcpy = {4096: {"gbps": 10.0}}
    text = mod.summary_block(args, results, 2, memcpy)
    assert "**0.90**" in text and "pyddp ahead at 1 of 2 points" in text, text
    assert "allgather 4K 0.90, behind in 3 of 4 rounds" in text, text
    assert "behind in more than half of the rounds at 1 of 2 points" in text, text
    # Open MPI missed round 0: the other three pair up (all behind)
    results["mpi"] = mod.merge_rounds(runs([12.0, 9.0, 9.0, 8.0], skip=(0,)))
    assert "behind in 3 of 3 rounds" in mod.summary_block(args, results, 2, memcpy)
    # one round each (or none in common): no round count
    results = {"pyddp": mod.merge_rounds(runs([10.0])), "mpi": mod.merge_rounds(runs([9.0]))}
    assert "Round by round" not in mod.summary_block(args, results, 2, memcpy)
    assert mod.rounds_behind({"round_medians": [[0, 1.0], [1, 1.0]]},
                             {"round_medians": [[2, 2.0], [3, 2.0]]}) is None


@FULL
@pytest.mark.timeout(180)
def test_torch_backend_quick_table():
    """benchmarks/torch_backend.py, tiny: both tables with every row, correct results."""
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "benchmarks", "torch_backend.py")
    proc = subprocess.run(
        [sys.executable, script, "--coll-sizes", "4,4K", "--sizes", "0.27M", "--rounds", "1",
         "--steps", "2", "--iters", "5", "--timeout", "150"],
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=170,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WRONG RESULT" not in proc.stdout and "deprecated" not in out, out
    num = r"([0-9.]+)"
    rows = re.findall(rf"^\| (\w+) \| ([0-9]+ \w+) \| {num} \| {num} \| {num} \| {num} \| {num}x \|$",
                      proc.stdout, re.M)
    assert [r[0] for r in rows] == [op for op in OPS for _ in range(2)], out
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows), out
    ddp_rows = re.findall(r"^\| 0.27M \(0.27M\) \| (.+?) \| ([0-9.]+) \| ([0-9.]+) \|$", proc.stdout,
                          re.M)
    assert [r[0] for r in ddp_rows] == ["torch plain", "torch DDP (gloo)", "torch DDP (pyddp)",
                                        "torch DDP (pyddp), no-op comm hook",
                                        "torch plain + one allreduce of the gradients' size (pyddp)"], out
    assert float(ddp_rows[0][2]) == 1.0, out
    assert re.search(r"^target allreduce 4 B: pyddp [0-9.]+ us \(<= 10\) -> (met|NOT met)$",
                     proc.stdout, re.M), out
    # the second DDP target, checked from the rows' "/ plain" column (3 decimals, from the unrounded
    # times as the target line is: recomputing it from the rows' ms, rounded to 2 decimals, was off by
    # more than 0.01 when a loaded machine made the ratios large)
    r = {name: float(rel) for name, _, rel in ddp_rows}
    ratio = r["torch DDP (pyddp)"]
    want = (r["torch DDP (pyddp), no-op comm hook"]
            + r["torch plain + one allreduce of the gradients' size (pyddp)"] - 1.0)
    m = re.search(r"^target 0.27M torch DDP \(pyddp\): ([0-9.]+) of plain, no-op hook [0-9.]+ \+ "
                  r"allreduce alone -?[0-9.]+ = (-?[0-9.]+) -> [-+][0-9.]+ \((within|NOT within) 0.05\)$",
                  proc.stdout, re.M)
    assert m, out
    assert abs(float(m.group(1)) - ratio) <= 0.0011 and abs(float(m.group(2)) - want) <= 0.0021, out


@FULL
@pytest.mark.timeout(180)
def test_mpi_overhead_quick_table():
    """benchmarks/mpi_overhead.py, tiny: raw mpi4py and backend mpi in one launch, every row, the
    target lines, correct results (skipped without mpirun and mpi4py)."""
    import shutil

    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    script = os.path.join(ROOT, "benchmarks", "mpi_overhead.py")
    proc = subprocess.run([sys.executable, script, "--rounds", "2", "--iters", "5",
                           "--max-bytes", "64K", "--timeout", "150"],
                          cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True,
                          timeout=170)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WRONG RESULT" not in out, out
    rows = re.findall(r"^\| ([0-9]+ \w+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["4 B", "16 B", "64 B", "256 B", "1 KiB", "4 KiB", "16 KiB",
                                    "64 KiB"], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), out
    assert re.search(r"^target 4 B within 1.5 us of raw mpi4py: [+-][0-9.]+ us -> (met|NOT met)$",
                     proc.stdout, re.M), out
    assert re.search(r"^target at most 5% slower from 64 KiB: worst [0-9.]+x at 64 KiB -> "
                     r"(met|NOT met)$", proc.stdout, re.M), out


@FULL
def test_elastic_quick_table():
    """benchmarks/elastic.py, tiny: plain, elastic, a killed worker recovered in the process and
    the restart-from-checkpoint comparison, every column filled."""
    script = os.path.join(ROOT, "benchmarks", "elastic.py")
    proc = subprocess.run([sys.executable, script, "--nproc", "2", "--rounds", "1", "--steps", "12",
                           "--params", "10K", "--timeout", "120"],
                          cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    row = re.search(r"^\| 2 \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9]+) \| ([0-9]+) \| "
                    r"([0-9.]+)x \|$", proc.stdout, re.M)
    assert row, out
    assert all(float(x) > 0 for x in row.groups()), out


def test_untuned_pyddp_runs_beside_the_tuned_one_in_the_same_table():
    """Issue 37: with a rules file in force, "pyddp-untuned" (PYDDP_TUNING=0, the built-in constants)
    runs in the same run, gets its own ratio column and its own README block against Open MPI."""
    import types

    mod = _collectives()
    assert mod.peer_env("pyddp-untuned") == {"PYDDP_TUNING": "0"}
    assert mod.peer_env("pyddp") == {}
    results, memcpy = _fake_results(mod)
    slow = {op: [dict(r, median_us=r["median_us"] * 4) for r in rows]
            for op, rows in results["pyddp"]["ops"].items()}
    results["pyddp-untuned"] = {"ops": slow, "errors": {}}
    text = "\n".join(mod.table("allreduce", results, 2, memcpy))
    assert "pyddp untuned" in text and "mpi/" in text, text
    args = types.SimpleNamespace(ops=list(OPS), rounds=3)
    blocks = mod.summary_block(args, results, 2, memcpy)
    assert "Open MPI time / pyddp untuned (PYDDP_TUNING=0: the built-in constants) time" in blocks, blocks
    # every untuned point is 4x slower than the tuned one: the untuned block counts fewer points ahead
    import re

    counts = re.findall(r"(pyddp(?: untuned)?) ahead at (\d+) of (\d+) points on this machine", blocks)
    got = {who: int(n) for who, n, _ in counts}
    assert got["pyddp"] > got["pyddp untuned"], counts


def test_phase_results_compare_runs_of_one_phase_only():
    """Issue 37: when the machine changed phase during a run (the core-to-core probe moved by more
    than 2x), the summaries compare only runs whose probes before and after agree on the phase."""
    mod = _collectives()
    results, _ = _fake_results(mod)
    fast, slow = (50.0, 24.0), (300.0, 13.0)
    p, m = results["pyddp"], results["mpi"]
    assert mod.phase_results([("pyddp", p, fast, fast), ("mpi", m, fast, fast)], ["pyddp", "mpi"]) == []
    phased = [("pyddp", p, fast, fast), ("mpi", m, slow, slow), ("pyddp", p, slow, slow),
              ("mpi", m, fast, slow)]  # the last one is mixed: left out
    out = mod.phase_results(phased, ["pyddp", "mpi"])
    assert [label.split(" phase")[0] for label, _ in out] == ["only the runs in the far"], out
    label, res = out[0]
    assert "Open MPI 1" in label and "pyddp 1" in label and set(res) == {"pyddp", "mpi"}


@FULL
def test_collectives_split_ops_runs_every_collective_on_its_own(tmp_path):
    """--split-ops: each collective in processes of its own, libraries alternating per collective;
    every table still has every library's rows, and each run's probes are printed."""
    try:
        import pyddp.distributed as dist  # noqa: F401
    except ImportError as e:
        pytest.skip(f"pyddp is not importable: {e}")
    ops = "allreduce,broadcast"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--split-ops", "--ops", ops, "--peers", "pyddp,pyddp-tcp",
         "--max-bytes", "1024", "--timeout", "120", "--no-plot"],
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    runs = [line for line in proc.stdout.splitlines() if re.match(r"# pyddp(-tcp)? (allreduce|broadcast): ", line)]
    assert len(runs) == 4, out  # two libraries x two collectives, one round
    for op in ops.split(","):
        m = re.search(rf"^# {op} .*?(?=^# (?:allreduce|broadcast) |^# target|^# note|\Z)", proc.stdout, re.M | re.S)
        assert m and "pyddp-tcp" in m.group(0), out
        assert "WRONG RESULT" not in m.group(0), out


def test_floor_block_names_the_rules_of_its_rows_and_the_floors_way():
    """The copy-floor table: each library's time over the floor's; its Machine line names the
    rules of the pyddp rows in it (not this process's), it says which way the floor copied a
    peer's bytes at each size, and where pyddp out of the box is behind Open MPI, both multiples."""
    import types

    mod = _collectives()

    def rows(times, **kw):
        return [dict({"bytes": n, "median_us": t, "min_us": t, "correct": True, "iters": 5}, **kw)
                for n, t in times]

    results = {
        "pyddp-oob": {"ops": {"alltoall": rows([(1 << 20, 50.0), (64 << 20, 7500.0)])},
                      "rules": "measured by this host's first job"},
        "mpi": {"ops": {"alltoall": rows([(1 << 20, 60.0), (64 << 20, 7400.0)])}},
        "floor": {"ops": {"alltoall": [dict(r, way=w) for r, w in zip(
            rows([(1 << 20, 25.0), (64 << 20, 7000.0)]), ("shm", "cma"))]}},
    }
    args = types.SimpleNamespace(ops=["alltoall"], rounds=3,
                                 machine={"date": "d", "cpu": "c", "cores": 2, "python": "3",
                                          "numpy": "2", "rules": "tuned (this process's file)"})
    text = mod.floor_block(args, results, 2)
    assert "| alltoall | pyddp out-of-the-box | 2.00 | 1.07 |" in text, text
    assert "| alltoall | Open MPI | 2.40 | 1.06 |" in text, text
    assert "this process's file" not in text, text
    assert "pyddp rules: pyddp out-of-the-box: measured by this host's first job; out of the box" \
        in text, text
    assert "alltoall cma at 64M, shm at 1M" in text, text
    assert ("pyddp out-of-the-box behind Open MPI at: alltoall 64M (Open MPI/pyddp out-of-the-box "
            "0.99; pyddp out-of-the-box 1.07x the floor, Open MPI 1.06x)") in text, text


def test_noise_block_measures_the_spread_of_identical_code_and_what_lies_beyond_it():
    """The A/A control (peer mpi-again): Open MPI against itself per point, the spread (the lowest of
    r and 1/r), and pyddp's points behind Open MPI split into those within it and those beyond; its
    Machine line names no pyddp rules (none ran in it)."""
    import types

    mod = _collectives()

    def rows(times):
        return [{"bytes": n, "median_us": t, "min_us": t, "correct": True, "iters": 5} for n, t in times]

    k, m = 4 << 10, 1 << 20
    results = {
        "mpi": {"ops": {"allgather": rows([(k, 10.0), (m, 100.0)]), "reduce": rows([(k, 8.0), (m, 90.0)])}},
        "mpi-again": {"ops": {"allgather": rows([(k, 9.0), (m, 100.0)]),      # 10/9: 1.11 -> 0.90
                              "reduce": rows([(k, 8.4), (m, 90.0)])}},         # 8/8.4: 0.95
        # allgather 4K 0.95 (a tie within 0.90), reduce 1M 0.60 (beyond it), reduce 4K ahead
        "pyddp-oob": {"ops": {"allgather": rows([(k, 10.5), (m, 90.0)]), "reduce": rows([(k, 7.0), (m, 150.0)])}},
    }
    aa, spread = mod.noise_spread(types.SimpleNamespace(ops=["allgather", "reduce"]), results)
    assert aa[("allgather", k)] == pytest.approx(10 / 9) and aa[("reduce", k)] == pytest.approx(8 / 8.4)
    assert spread == pytest.approx(0.9)
    args = types.SimpleNamespace(ops=["allgather", "reduce"], rounds=3,
                                 machine={"date": "d", "cpu": "c", "cores": 2, "python": "3",
                                          "numpy": "2", "rules": "tuned (this process's file)"})
    text = mod.noise_block(args, results, 2)
    assert "| allgather | 1.11 | 1.00 |" in text and "| reduce | 0.95 | 1.00 |" in text, text
    assert "as far behind itself as 0.90" in text, text
    assert "this process's file" not in text, text
    assert ("pyddp out-of-the-box behind Open MPI at 2 points; by more than the A/A spread (below 0.90) "
            "at 1: reduce 1M 0.60 (A/A 1.00)") in text, text
    # without the control, no block and no spread
    assert mod.noise_block(args, {k2: v for k2, v in results.items() if k2 != "mpi-again"}, 2) is None
    assert "mpi-again" in mod.PEERS and "mpi-again" in mod.OPT_IN


@FULL
@pytest.mark.timeout(180)
def test_collectives_copy_floor_peer():
    """--peers ...,floor: every rank copies its share of the collective's output bytes from memory
    the next rank just wrote (the faster of two ways, which it says); a last table gives each
    library's time as a multiple of it."""
    _need_process_groups()
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--peers", "pyddp,floor", "--ops", "allreduce,broadcast,scatter",
         "--min-bytes", "4K", "--max-bytes", "1M", "--timeout", "120", "--no-plot"],
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "time / copy floor time, 2 ranks" in proc.stdout, out
    rows = re.findall(r"^\| (allreduce|broadcast|scatter) \| pyddp \|(.*)\|$", proc.stdout, re.M)
    assert [op for op, _ in rows] == ["allreduce", "broadcast", "scatter"], out
    for _, cells in rows:
        vals = [float(c) for c in cells.split("|")]
        assert len(vals) == 3 and all(v > 0 for v in vals), out   # 4K, 64K, 1M (--quick: step 16)
    assert "leaked shared_memory" not in out, out
    way = re.search(r"^The floor copies a peer's bytes the faster way .*: (.*)$", proc.stdout, re.M)
    assert way and all(op in way.group(1) for op in ("allreduce", "broadcast", "scatter")), out
    # the default peers leave the floor out
    mod = _collectives()
    assert "floor" in mod.PEERS and "floor" in mod.OPT_IN


@FULL
@pytest.mark.timeout(180)
def test_collectives_loop_timing_runs_calls_back_to_back(tmp_path):
    """--timing loop: batches of calls back to back, a barrier before each batch only; the rows
    say so in the JSON and the summary's title names it; results are still checked."""
    _need_process_groups()
    out_json = tmp_path / "loop.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--peers", "pyddp,pyddp-tcp", "--ops", "allreduce,gather",
         "--min-bytes", "4K", "--max-bytes", "64K", "--timing", "loop", "--timeout", "120", "--no-plot",
         "--json", str(out_json)],
        cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True, timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WRONG RESULT" not in out, out
    doc = json.loads(out_json.read_text())
    for peer in ("pyddp", "pyddp-tcp"):
        for op in ("allreduce", "gather"):
            rows = doc["results"][peer]["ops"][op]
            assert rows and all(r["timing"] == "loop" and r["correct"] and r["median_us"] > 0
                                for r in rows), rows
    wmod = _worker_module()
    # many calls per batch for small sizes, fewer as the budget of bytes per row runs out
    assert wmod.loop_batches(200, 4096, 2 << 30) == (5, 1000)
    assert wmod.loop_batches(200, 1 << 20, 2 << 30) == (5, 409)
    assert wmod.loop_batches(5, 64 << 20, 64 << 20) == (5, 1)
    assert wmod.loop_batches(1, 64 << 20, 1 << 20) == (1, 1)
    for peer in ("pyddp", "pyddp-tcp"):   # --quick: a budget of 64 MiB per row
        for op in ("allreduce", "gather"):
            for r in doc["results"][peer]["ops"][op]:
                b, per = wmod.loop_batches(10, r["bytes"], 64 << 20)
                assert r["iters"] == b * per, r


@FULL
def test_interleaved_quick_table():
    """benchmarks/interleaved.py, tiny: pyddp and Open MPI in the same processes, every row of the
    ratio table and of the times table, both libraries checked against NumPy (skipped without
    mpirun and mpi4py)."""
    import shutil

    if shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpirun and mpi4py")
    _need_process_groups()
    script = os.path.join(ROOT, "benchmarks", "interleaved.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--ops", "allreduce,gather,alltoall",
                           "--max-bytes", "16K", "--times", "--timeout", "150"],
                          cwd=ROOT, env=_env_with_this_pyddp(), capture_output=True, text=True,
                          timeout=170)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WRONG RESULT" not in out, out
    assert re.search(r"pyddp ahead at [0-6] of 6 points on this machine", proc.stdout), out
    machine = re.search(r"^Machine: .*$", proc.stdout, re.M)
    assert machine, out
    # one probe before each row; a probe that finds no complete round on a loaded machine is left out
    probes = re.search(r"between cores [0-9]+-[0-9]+ ns over ([0-9]+) probes", machine.group(0))
    assert probes is None or 1 <= int(probes.group(1)) <= 6, out
    for op in ("allreduce", "gather", "alltoall"):
        assert re.search(rf"^\| {op} \| (\**[0-9.]+\**) \| (\**[0-9.]+\**) \|$", proc.stdout,
                         re.M), out
        for size in ("4K", "16K"):
            assert re.search(rf"^\| {op} \| {size} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 20 \|",
                             proc.stdout, re.M), out


def test_interleaved_report_marks_what_is_behind_and_wrong():
    mod = _load("bench_interleaved", os.path.join(ROOT, "benchmarks", "interleaved.py"))

    def cell(n, p, m, ok=True):
        return {"bytes": n, "iters": 5, "probe_ns": 50.0, "pyddp_us": p, "mpi_us": m,
                "pyddp_correct": ok, "mpi_correct": True}

    result = {"world": 2, "ops": {"allreduce": [cell(4096, 1.0, 2.0), cell(16384, 4.0, 2.0)],
                                  "gather": [cell(4096, 1.0, 1.0, ok=False), cell(16384, 1.0, 3.0)]}}

    class A:
        ops, times = ["allreduce", "gather"], False

    info = {"date": "d", "cpu": "c", "cores": 2, "python": "3", "numpy": "2"}
    text, ahead, total, wrong = mod.report(result, A, info)
    assert (ahead, total, wrong) == (3, 4, True)
    assert "| allreduce | 2.00 | **0.50** |" in text and "| gather | 1.00 | 3.00 |" in text
    assert "pyddp behind Open MPI at: allreduce 16K (0.50)" in text
    assert "WRONG RESULT: pyddp gather 4K" in text


def test_interleaved_says_what_is_missing():
    script = os.path.join(ROOT, "benchmarks", "interleaved.py")
    env = dict(_env_with_this_pyddp(), PATH=os.path.dirname(sys.executable))
    proc = subprocess.run([sys.executable, script, "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "interleaved.py: skipped: mpirun not found" in proc.stdout, (
        proc.stdout + proc.stderr)


@FULL
def test_phases_quick_table(tmp_path):
    """benchmarks/phases.py, a few seconds on a rules file with rules for each phase (the host's
    facts, so that this host reads it): every row filed under a phase, both configurations checked
    against NumPy first; without such a file it says so and exits 0."""
    _need_process_groups()
    from pyddp.distributed.backends.cpu import tuning

    script = os.path.join(ROOT, "benchmarks", "phases.py")
    env = dict(_env_with_this_pyddp(), PYDDP_TUNING="0")
    proc = subprocess.run([sys.executable, script, "--minutes", "0.02"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "no rules for each phase for 2 ranks" in proc.stdout, (
        proc.stdout + proc.stderr)
    kinds = list(tuning.KIND_NAMES)
    doc = {"format": tuning.FORMAT, "host": dict(tuning.host_facts(), cores=2), "created": "test",
           "pyddp": "test", "tables": {"2": {"cma_from": {k: 16384 for k in kinds}}},
           "phased": {"2": {"fast": {"cma_from": {k: 65536 for k in kinds}},
                            "slow": {"cma_from": {k: 4096 for k in kinds}}, "phase_ns": 1e6}}}
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(doc))
    env = dict(_env_with_this_pyddp(), PYDDP_TUNING_FILE=str(path))
    proc = subprocess.run([sys.executable, script, "--minutes", "0.05", "--ops",
                           "allgather,reduce_scatter", "--sizes", "8K,32K", "--calls", "5"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"^Machine: .*pyddp rules: tuned test", proc.stdout, re.M), out
    # a threshold of 1 ms: every answered probe is the fast phase
    for op in ("allgather", "reduce_scatter"):
        for size in ("8K", "32K"):
            assert re.search(rf"^\| fast \| {op} \| {size} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| "
                             r"[0-9]+ \|$", proc.stdout, re.M), out
    assert "| slow |" not in proc.stdout, out


def test_the_first_jobs_measurement_is_printed_with_what_other_runs_paid():
    mod = _collectives()
    assert mod.first_job_line({"pyddp": {"inits": [(0.02, None)]}}) == ""
    runs = {"pyddp-oob": {"inits": [(0.21, 0.15), (0.19, 0.14), (0.03, None)]},
            "pyddp-untuned": {"inits": [(0.02, None), (0.04, None)]}}
    line = mod.first_job_line(runs)
    assert line == ("# first job on a new host (pyddp out-of-the-box): init_process_group 0.21 s, "
                    "of which 0.15 s measuring the host (kept in the per-user cache for later "
                    "jobs); the next 1 measured again (up to 0.14 s each); the 3 pyddp runs that "
                    "did not measure: init_process_group median 0.03 s")
    assert line in mod.rules_lines(runs)
