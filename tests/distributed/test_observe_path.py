"""Which backend, transport and algorithm ran each call (issue 52 item 2): the flight record, the
DETAIL log line, the timeline and pyddp.distributed.explain agree with each other and with what
the rules choose (coll/select.c, coll/rules.c), on sizes and settings that choose differently."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pyddp.distributed as dist
from pyddp.distributed import distributed_c10d as c10d
from pyddp.tools import flight_recorder as fr_tool
from pyddp.tools import timeline as tl_tool

import _paths
from _mp import run

ROOT = _paths.ROOT
SMALL, BIG = 4, 1 << 20  # float32 elements: 16 B, 4 MiB (over the 64 KiB crossover)


def _calls(rank):
    """(label, explain's arguments, the call): sizes on both sides of every rule."""
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    return [
        ("all_reduce small", ("all_reduce", ones(SMALL)), lambda: dist.all_reduce(ones(SMALL))),
        ("all_reduce big", ("all_reduce", ones(BIG)), lambda: dist.all_reduce(ones(BIG))),
        ("broadcast small", (dist.broadcast, ones(SMALL)),
         lambda: dist.broadcast(ones(SMALL), 0)),
        ("broadcast big", (dist.broadcast, ones(BIG)), lambda: dist.broadcast(ones(BIG), 0)),
        ("all_gather small", ("all_gather", ones(SMALL)),
         lambda: dist.all_gather([ones(SMALL), ones(SMALL)], ones(SMALL))),
        ("all_gather big", ("all_gather", ones(BIG)),
         lambda: dist.all_gather([ones(BIG), ones(BIG)], ones(BIG))),
        ("all_to_all", ("all_to_all", ones(SMALL)),
         lambda: dist.all_to_all([ones(SMALL)] * 2, [ones(SMALL)] * 2)),
        ("barrier", ("barrier",), dist.barrier),
        # the same size through a tuned crossover's arguments: nbytes and dtype
        ("reduce nbytes", ("reduce", None, BIG * 4, "float32"),
         lambda: dist.reduce(ones(BIG), 0)),
    ]


def _agree(rank, world_size):
    out = []
    for label, args, call in _calls(rank):
        name, tensor = args[0], (args[1] if len(args) > 1 else None)
        kw = {"nbytes": args[2], "dtype": args[3]} if len(args) > 2 else {}
        told = dist.explain(name, tensor, **kw)
        call()
        rec = dist.flight_recorder.records()[-1]
        out.append((label, told["backend"], told["transport"], told["algorithm"],
                    rec["backend"], rec["transport"], rec["algorithm"], told["why"]))
    pg = c10d._world.default_pg
    if pg._transport == "shm":
        a = c10d._shared_array(BIG)
        a[:] = 1
        dist.all_reduce(a)
        rec = dist.flight_recorder.records()[-1]
        out.append(("shared array", "cpu", "shm", "shm-inplace", rec["backend"],
                    rec["transport"], rec["algorithm"], ""))
    return out, pg._single_copy


# what the default rules choose for 2 ranks (coll/rules.c): over the transport the direct, flat
# algorithms up to 64 KiB; in shared memory the banks, single copies for broadcast from 1 MiB
_TCP = {"all_reduce small": "direct", "all_reduce big": "ring", "broadcast small": "flat",
        "broadcast big": "chain", "all_gather small": "direct", "all_gather big": "ring",
        "all_to_all": "pairwise", "barrier": "direct", "reduce nbytes": "ring"}
_SHM = {k: "shm" for k in _TCP}
_SHM["broadcast big"] = "cma"
_SHM["shared array"] = "shm-inplace"
_CMA_1K = dict(_SHM, **{"all_reduce big": "cma", "reduce nbytes": "cma",
                        "all_gather big": "cma"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env,want,transport", [
    ({"PYDDP_TRANSPORT": "tcp"}, _TCP, "tcp"),
    ({}, _SHM, "shm"),
    ({"PYDDP_CMA_THRESHOLD": "1K"}, _CMA_1K, "shm"),
    ({"PYDDP_CMA": "0"}, dict(_SHM, **{"broadcast big": "shm"}), "shm"),
], ids=["tcp", "shm", "cma-1K", "cma-off"])
def test_record_and_explain_agree_with_the_rules(env, want, transport):
    for rank, (rows, single_copy) in enumerate(run(_agree, 2, env=env, timeout=240)):
        for label, be, tr, algo, rbe, rtr, ralgo, why in rows:
            expect = want[label]
            if expect == "cma" and not single_copy:
                expect = "shm"  # no cross-memory attach on this host: the banks
            assert (rbe, rtr, ralgo) == ("cpu", transport, expect), (rank, label, why)
            if label != "shared array":  # explain cannot know a shared array: DDP's buckets
                assert (be, tr, algo) == (rbe, rtr, ralgo), (rank, label, why)
                assert why, label


def test_explain_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown collective"):
        dist.explain("all_reduse", nbytes=4)


_JOB = """
import json, os
import numpy as np
import pyddp.distributed as dist
dist.init_process_group("cpu")
dist.all_reduce(np.ones(4, np.float32))
dist.all_reduce(np.ones(1 << 20, np.float32))
dist.broadcast(np.ones(1 << 20, np.float32), 0)
dist.all_reduce(np.ones(3, np.float32), async_op=True).wait(timeout=60)
recs = [(r["name"], r["backend"], r["transport"], r["algorithm"])
        for r in dist.flight_recorder.records()]
with open(os.path.join(os.environ["JOB_OUT"], f"rec{dist.get_rank()}.json"), "w") as f:
    json.dump(recs, f)
dist.flight_recorder.dump()
dist.destroy_process_group()
"""


def _launch(tmp_path, env):
    path = tmp_path / "job.py"
    path.write_text(_JOB)
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("PYDDP_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "PYDDP_TIMELINE", "PYDDP_TRANSPORT",
              "PYDDP_FLIGHT_RECORDER_DIR", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "pyddp.run", "--nproc-per-node", "2",
                           str(path)], env=e, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_detail_log_record_and_timeline_name_the_same_path(tmp_path, transport):
    tl = tmp_path / "tl"
    p = _launch(tmp_path, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "PYDDP_TRANSPORT": transport,
                           "PYDDP_TIMELINE": str(tl) + os.sep, "JOB_OUT": str(tmp_path),
                           "PYDDP_FLIGHT_RECORDER_DIR": str(tmp_path / "fr")})
    assert p.returncode == 0, p.stderr
    for rank in (0, 1):
        recs = [tuple(r) for r in json.loads((tmp_path / f"rec{rank}.json").read_text())]
        assert len(recs) == 4
        # DETAIL: one line per call, in order, naming what the record names
        logged = [ln.split(f"[rank {rank}] ", 1)[1] for ln in p.stderr.splitlines()
                  if f"[rank {rank}] " in ln and " on group default_pg: backend " in ln]
        assert len(logged) == 4, p.stderr
        for (name, backend, tr, algo), ln in zip(recs, logged):
            assert ln.startswith(f"{name} on group default_pg: backend {backend}, transport "
                                 f"{tr}, algorithm {algo}, dtype float32"), ln
        # the timeline's slices carry the same fields
        events = tl_tool.read_events(str(tl / f"timeline.rank{rank}.json"))
        slices = [(e["name"], e["args"]["backend"], e["args"]["transport"],
                   e["args"]["algorithm"]) for e in events if e.get("cat") == "collective"]
        assert slices == recs
        # the dumped file too, and the analyzer's listing
        dumped = fr_tool.load(str(tmp_path / "fr"))[0]
        mine = next(f for f in dumped if f["meta"]["group_rank"] == rank)
        assert [(e["name"], e["backend"], e["transport"], e["algorithm"])
                for e in mine["entries"]] == recs
        algos = [r[3] for r in recs]
        if transport == "tcp":
            assert algos == ["direct", "ring", "chain", "direct"]
        else:
            # the 1 MiB calls: the banks or single copies, by the rules of the machine's phase at
            # the time (a loaded machine's slow phase has rules of its own)
            assert algos[0] == "shm" and algos[1] in ("shm", "cma") and algos[2] in ("cma", "shm")
    listing = subprocess.run([sys.executable, "-m", "pyddp.tools.flight_recorder", "-v",
                              str(tmp_path / "fr")], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    assert listing.returncode == 0, listing.stdout + listing.stderr
    want = f"[{transport}, {recs[1][3]}]"   # the 1 MiB all_reduce, as rank 1 recorded it
    assert any(ln.startswith("  #2 all_reduce(") and ln.endswith(want)
               for ln in listing.stdout.splitlines()), listing.stdout
