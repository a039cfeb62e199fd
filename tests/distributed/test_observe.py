"""Seeing what a job does: debug levels, the flight recorder and its analyzer, the timeline."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pyddp.distributed as dist
from pyddp import _C
from pyddp.distributed import _observe
from pyddp.tools import flight_recorder as fr_tool
from pyddp.tools import timeline as tl_tool

import _paths
from _mp import run, run_outcomes

ROOT = _paths.ROOT


# ------------------------------------------------------------------------- debug levels

def test_debug_level_api_matches_torch():
    torch_dist = pytest.importorskip("torch.distributed")
    assert [(m.name, int(m.value)) for m in dist.DebugLevel] == \
        [(n, int(getattr(torch_dist.DebugLevel, n))) for n in ("OFF", "INFO", "DETAIL")]
    old = dist.get_debug_level()
    try:
        for v in ("INFO", "detail", dist.DebugLevel.OFF, 1):
            dist.set_debug_level(v)
        assert dist.get_debug_level() == dist.DebugLevel.INFO
        with pytest.raises(ValueError, match="OFF, INFO or DETAIL"):
            dist.set_debug_level("LOUD")
    finally:
        dist.set_debug_level(old)


def test_debug_level_from_env(monkeypatch):
    old = dist.get_debug_level()
    try:
        monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        monkeypatch.setenv("PYDDP_DEBUG", "INFO")
        dist.set_debug_level_from_env()
        assert dist.get_debug_level() == dist.DebugLevel.DETAIL  # torch's variable first
        monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
        dist.set_debug_level_from_env()
        assert dist.get_debug_level() == dist.DebugLevel.INFO
        monkeypatch.setenv("PYDDP_DEBUG", "bogus")
        with pytest.raises(ValueError, match="PYDDP_DEBUG"):
            dist.set_debug_level_from_env()
    finally:
        dist.set_debug_level(old)


_SCRIPT = textwrap.dedent("""
    import numpy as np, pyddp.distributed as dist
    dist.init_process_group("cpu")
    x = np.ones((3, 4), np.float32)
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    dist.destroy_process_group()
""")


def _launch(tmp_path, script, env=None, args=()):
    path = tmp_path / "job.py"
    path.write_text(script)
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("PYDDP_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "PYDDP_TIMELINE",
              "PYDDP_FLIGHT_RECORDER_DIR", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pyddp.run", "--nproc-per-node", "2", *args,
                           str(path)], env=e, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_info_and_detail_logging_through_logging_module(tmp_path):
    off = _launch(tmp_path, _SCRIPT)
    assert off.returncode == 0, off.stderr
    assert "pyddp INFO" not in off.stderr
    info = _launch(tmp_path, _SCRIPT, {"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert info.returncode == 0, info.stderr
    for r in (0, 1):
        assert (f"pyddp INFO [rank {r}] group default_pg: rank {r} of 2, backend cpu, "
                f"transport shm (every rank on this host)") in info.stderr
    assert "all_reduce on group" not in info.stderr
    detail = _launch(tmp_path, _SCRIPT, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert detail.returncode == 0, detail.stderr
    for r in (0, 1):
        assert (f"[rank {r}] all_reduce on group default_pg: backend cpu, transport shm, "
                f"algorithm shm, dtype float32, inputs [], outputs [(3, 4)]") in detail.stderr
        assert f"[rank {r}] broadcast on group default_pg" in detail.stderr


# ------------------------------------------------------------------------ flight recorder

def _records_after_calls(rank, world_size):
    x = np.arange(6, dtype=np.float64)
    dist.all_reduce(x)
    w = dist.all_reduce(np.ones(3, np.int32), op=dist.ReduceOp.MAX, async_op=True)
    w.wait(60)
    dist.broadcast(x, 1)
    if rank == 0:
        dist.send(np.ones(5, np.float32), 1)
    else:
        dist.recv(np.empty(5, np.float32), 0)
    return dist.flight_recorder.records()


def test_records_follow_the_calls():
    for recs in run(_records_after_calls, 2, timeout=120):
        colls = [r for r in recs if r["seq"] > 0]
        assert [(r["kind"], r["dtype"], r["count"], r["bytes"]) for r in colls] == [
            ("all_reduce", "float64", 6, 48), ("all_reduce", "int32", 3, 12),
            ("broadcast", "float64", 6, 48)]
        assert [r["seq"] for r in colls] == [1, 2, 3]
        assert colls[1]["op"] == "MAX" and colls[2]["root"] == 1
        p2p = [r for r in recs if r["seq"] == 0]
        assert len(p2p) == 1 and p2p[0]["kind"] in ("send", "recv") and p2p[0]["bytes"] == 20
        for r in recs:
            assert r["state"] == "completed" and r["status"] == "ok"
            assert 0 < r["t_enqueued"] <= r["t_started"] <= r["t_ended"]
        assert [r["id"] for r in recs] == sorted(r["id"] for r in recs)


def _ring(rank, world_size):
    x = np.ones(2, np.float32)
    for _ in range(7):
        dist.all_reduce(x)
    return [r["seq"] for r in dist.flight_recorder.records()]


def test_ring_keeps_the_last_n_and_size_zero_turns_it_off():
    assert run(_ring, 2, env={"PYDDP_FLIGHT_RECORDER_SIZE": "3"}) == [[5, 6, 7]] * 2
    assert run(_ring, 2, env={"PYDDP_FLIGHT_RECORDER_SIZE": "0"}) == [[], []]


def _dump_on_demand(rank, world_size, path):
    dist.all_reduce(np.ones(4, np.float32))
    p = dist.flight_recorder.dump(os.path.join(path, f"r{rank}.json"))
    with open(p) as f:
        return json.load(f)


def test_dump_on_demand(tmp_path, monkeypatch):
    for rank, d in enumerate(run(_dump_on_demand, 2, str(tmp_path))):
        assert d["reason"] == "on demand"
        assert d["meta"] == {}  # no PYDDP_FLIGHT_RECORDER_DIR: nothing configured
        assert [e["kind"] for e in d["entries"]] == ["all_reduce"]
    monkeypatch.delenv("PYDDP_FLIGHT_RECORDER_DIR", raising=False)
    with pytest.raises(ValueError, match="PYDDP_FLIGHT_RECORDER_DIR"):
        _observe.dump(None)  # no path and no directory: said before the group is touched


def _mismatch(rank, world_size):
    x = np.ones(4, np.float32)
    dist.all_reduce(x)
    dist.all_reduce(x)
    try:
        if rank == 2:
            # the others are inside their third call when this one arrives: each dump then holds it
            # (a rank still on its way when the group failed dumps without it, and its call raises
            # the group's error unrecorded, which left the analyzer one all_reduce against one
            # broadcast in a CI run)
            time.sleep(1.0)
            dist.broadcast(x, 0)
        else:
            dist.all_reduce(x)
    except dist.DistError as e:
        return str(e)
    return None


@pytest.mark.timeout(300)
def test_mismatch_dumps_every_rank_and_the_analyzer_names_the_odd_one(tmp_path):
    outs = run_outcomes(_mismatch, 3, env={"PYDDP_FLIGHT_RECORDER_DIR": str(tmp_path)},
                        timeout=120)
    assert all(o.ok and "mismatch" in o.value for o in outs), outs
    files, errors = fr_tool.load(str(tmp_path))
    assert not errors and len(files) == 3
    assert {f["meta"]["global_rank"] for f in files} == {0, 1, 2}
    assert all(f["reason"].startswith("group failed") for f in files)
    lines, problem = fr_tool.analyse(files)
    text = "\n".join(lines)
    assert problem
    assert "DIVERGED at collective #3" in text
    assert "ranks 0, 1 called all_reduce(float32, count 4, SUM)" in text
    assert "rank 2 called broadcast(float32, count 4, root 0)" in text
    assert "-> rank 2 diverged from the others" in text
    cli = subprocess.run([sys.executable, "-m", "pyddp.tools.flight_recorder", str(tmp_path)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert cli.returncode == 1 and "rank 2 diverged" in cli.stdout


def _lagging(rank, world_size):
    x = np.ones(4, np.float32)
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(6)  # busy elsewhere past the others' timeout: never calls the second one
        return "skipped"
    try:
        dist.all_reduce(x)
    except dist.DistError as e:
        return str(e)
    return None


@pytest.mark.timeout(300)
def test_a_rank_that_never_calls_is_named_behind(tmp_path):
    outs = run_outcomes(_lagging, 3, env={"PYDDP_FLIGHT_RECORDER_DIR": str(tmp_path)},
                        init_kwargs={"timeout": __import__("datetime").timedelta(seconds=3)},
                        timeout=120)
    assert outs[0].ok and outs[0].value and outs[2].ok and outs[2].value
    files, _ = fr_tool.load(str(tmp_path))
    lines, problem = fr_tool.analyse(files)
    text = "\n".join(lines)
    assert problem, text
    assert "-> rank 1 is BEHIND: its last collective is #1 all_reduce" in text, text


def _clean(rank, world_size):
    dist.all_reduce(np.ones(4, np.float32))
    dist.flight_recorder.dump()
    return True


def test_analyzer_clean_run(tmp_path):
    run(_clean, 2, env={"PYDDP_FLIGHT_RECORDER_DIR": str(tmp_path)})
    lines, problem = fr_tool.analyse(fr_tool.load(str(tmp_path))[0])
    assert not problem
    assert "every rank completed collectives up to #1; no divergence" in "\n".join(lines)
    assert fr_tool.main([str(tmp_path / "missing")]) == 2


# ------------------------------------------------------------------------------- timeline

def test_timeline_path_forms(tmp_path):
    assert _observe.timeline_path(str(tmp_path), 3) == str(tmp_path / "timeline.rank3.json")
    assert _observe.timeline_path("/x/t-{rank}.json", 2) == "/x/t-2.json"
    assert _observe.timeline_path("/x/trace.json", 1) == "/x/trace.rank1.json"
    assert _observe.timeline_path("/x/out/", 0) == "/x/out/timeline.rank0.json"


@pytest.mark.timeout(300)
def test_pyddp_run_timeline_merges_ranks(tmp_path):
    d = tmp_path / "tl"
    res = _launch(tmp_path, _SCRIPT, args=("--timeline", str(d)))
    assert res.returncode == 0, res.stderr
    assert "timeline of ranks 0, 1" in res.stderr
    with open(d / "timeline.json") as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    colls = [e for e in events if e.get("cat") == "collective"]
    for pid in (0, 1):
        mine = [e for e in colls if e["pid"] == pid]
        assert [e["name"] for e in mine] == ["all_reduce", "broadcast"]
        assert mine[0]["args"]["bytes"] == 48 and mine[0]["args"]["seq"] == 1
        assert all(e["ph"] == "X" and e["dur"] >= 0 for e in mine)
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "group default_pg (2 ranks, shm)" in tracks


def test_merge_tolerates_a_file_cut_short(tmp_path):
    good = tmp_path / "timeline.rank0.json"
    good.write_text('[\n{"name":"a","ph":"X","pid":0,"tid":1,"ts":1,"dur":2}\n]\n')
    cut = tmp_path / "timeline.rank1.json"
    cut.write_text('[\n{"name":"b","ph":"X","pid":1,"tid":1,"ts":3,"dur":1},\n{"name":"c","ph')
    path, ranks, n = tl_tool.merge_dir(str(tmp_path))
    assert ranks == [0, 1] and n == 2
    with open(path) as f:
        assert [e["name"] for e in json.load(f)["traceEvents"]] == ["a", "b"]


def test_timeline_off_by_default():
    assert not _C.timeline_enabled()


def test_plot_draws_a_png(tmp_path):
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("matplotlib's C++ extensions do not run under the preloaded ASan runtime")
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "group g"}},
        {"name": "all_reduce", "cat": "collective", "ph": "X", "pid": 0, "tid": 1, "ts": 10.0,
         "dur": 5.0},
        {"name": "backward", "cat": "backward", "ph": "X", "pid": 1, "tid": 1000, "ts": 12.0,
         "dur": 9.0}]}))
    out = tl_tool.plot(str(trace), str(tmp_path / "t.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no spans"):
        (tmp_path / "e.json").write_text("[]")
        tl_tool.plot(str(tmp_path / "e.json"), str(tmp_path / "e.png"))


_DDP_SCRIPT = textwrap.dedent("""
    import pyddp, pyddp.nn as nn, pyddp.distributed as dist
    from pyddp.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("cpu")
    pyddp.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)),
                bucket_cap_mb=0.005)
    opt = pyddp.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(pyddp.randn(8, 32)).sum().backward()
        opt.step()
    dist.destroy_process_group()
""")


@pytest.mark.timeout(300)
def test_timeline_has_ddp_bucket_and_backward_events(tmp_path):
    d = tmp_path / "tl"
    res = _launch(tmp_path, _DDP_SCRIPT, args=("--timeline", str(d)))
    assert res.returncode == 0, res.stderr
    with open(d / "timeline.json") as f:
        events = json.load(f)["traceEvents"]
    for pid in (0, 1):
        mine = [e for e in events if e["pid"] == pid]
        back = [e for e in mine if e.get("cat") == "backward"]
        assert len(back) == 3 and all(e["dur"] > 0 for e in back)
        spans = [e for e in mine if e.get("cat") == "ddp" and e["ph"] == "X"]
        ready = [e for e in mine if e.get("cat") == "ddp" and e["ph"] == "i"]
        nb = len({e["args"]["bucket"] for e in spans})
        assert nb >= 1 and len(spans) == len(ready) == 3 * nb
        assert all(e["tid"] == _observe.TRACK_DDP for e in spans + back)
        # each bucket's allreduce lies within its backward pass
        for e in spans:
            b = next(x for x in back if x["args"]["iteration"] == e["args"]["iteration"])
            assert b["ts"] <= e["ts"] + 1 and e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 1
