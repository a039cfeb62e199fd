"""Rules of algorithm choice measured on the host: pyddp.tools.tune writes them, groups read them
(rank 0's, so every rank agrees), and any rules give the same results (NumPy reference)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _mp import run
from _tiers import FULL

import pyddp
from pyddp import _C
from pyddp.distributed.backends.cpu import tuning
from pyddp.tools.tune import crossover

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(pyddp.__file__)))
KINDS = list(tuning.KIND_NAMES)


def test_crossover_is_where_the_second_candidate_wins_for_good():
    assert crossover([]) is None
    assert crossover([(1, 1.0, 2.0), (2, 1.0, 2.0)]) is None  # never wins
    assert crossover([(1, 1.0, 2.0), (2, 3.0, 2.0), (4, 5.0, 2.0)]) == 2
    # a win below a loss does not count: only a run of wins up to the largest size
    assert crossover([(1, 3.0, 2.0), (2, 1.0, 2.0), (4, 5.0, 2.0)]) == 4
    assert crossover([(1, 3.0, 2.0), (2, 3.0, 2.0)]) == 1
    # one noisy size does not outweigh the others: a loss at the largest size among wins from 2 on
    # (the rule used to be "wins at every larger size", which gave never here)
    rows = [(1, 1.0, 2.0), (2, 4.0, 2.0), (4, 8.0, 2.0), (8, 16.0, 2.0), (16, 10.0, 11.0)]
    assert crossover(rows) == 2
    # ... but a loss that outweighs the wins below it moves the threshold past it
    assert crossover([(1, 1.0, 2.0), (2, 1.1, 1.0), (4, 1.0, 5.0), (8, 2.0, 1.0)]) == 8
    # equal times: the first candidate keeps the size
    assert crossover([(1, 1.0, 1.0)]) is None


def _group():
    import datetime

    import pyddp.distributed as dist

    dist.init_process_group("cpu", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    return dist, dist.distributed_c10d._world.default_pg._cpg


def test_set_rules_checks_its_arguments_and_rules_reads_back():
    dist, cpg = _group()
    try:
        n = _C.NKINDS
        cma, small = cpg.rules
        assert len(cma) == len(small) == n
        assert cma[_C.K_ALLREDUCE] == 32 << 20 and cma[_C.K_BROADCAST] == 1 << 20
        assert cma[_C.K_REDUCE] is None
        assert set(small) == {64 << 10}
        with pytest.raises(ValueError, match=f"cma_from must have {n} entries"):
            cpg.set_rules([0] * (n - 1), [0] * n)
        for bad in (-1, True, "1", 1.5):
            with pytest.raises(ValueError, match=r"cma_from\[2\] must be an int >= 0"):
                cpg.set_rules([0, 0, bad] + [0] * (n - 3), [0] * n)
        with pytest.raises(ValueError, match=r"small_bytes\[0\] must be an int >= 0"):
            cpg.set_rules([0] * n, [None] * n)
        for bad in ((5, 10, 10), (5, 20, 10), (5, 10), (5, -1, 10), [5, 10, 20]):
            with pytest.raises(ValueError, match=r"cma_from\[2\] must be an int >= 0.*gap_lo"):
                cpg.set_rules([0, 0, bad] + [0] * (n - 3), [0] * n)
        rules = [None, 5] + [0] * (n - 2)
        rules[_C.K_ALLGATHER] = (16, 512, 2048)
        cpg.set_rules(rules, [7] + [0] * (n - 1))
        cma, small = cpg.rules
        assert cma[0] is None and cma[1] == 5 and cma[_C.K_ALLREDUCE] == 32 << 20
        # single copies from 16 B, the banks in [512, 2048)
        assert cma[_C.K_ALLGATHER] == (16, 512, 2048)
        assert small[0] == 7 and small[1] == 64 << 10
        a = np.arange(10.0)
        dist.all_reduce(a)  # still runs
        assert np.array_equal(a, np.arange(10.0))
    finally:
        dist.destroy_process_group()


def _write_rules(path, cma=1, small=1, gap=None):
    doc = {"format": tuning.FORMAT, "host": tuning.host_facts(), "created": "test",
           "pyddp": pyddp.__version__,
           "tables": {"2": {"cma_from": {k: cma for k in KINDS},
                            "small_bytes": {k: small for k in KINDS
                                            if k not in ("gather", "scatter", "all_to_all")}}}}
    if gap is not None:
        doc["tables"]["2"]["cma_gap"] = {k: list(gap) for k in KINDS}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _collectives(rank, world_size):
    """Every kind at sizes on both sides of the thresholds; the rules in force; NumPy checks."""
    import pyddp.distributed as dist

    cpg = dist.distributed_c10d._world.default_pg._cpg
    n = world_size
    bad = []
    for count in (1, 1000, 70000, 300000):
        base = [np.arange(count, dtype=np.float32) % 97 + r for r in range(n)]
        a = base[rank].copy()
        dist.all_reduce(a)
        if not np.array_equal(a, sum(base)):
            bad.append(f"all_reduce {count}")
        a = base[rank].copy()
        dist.reduce(a, dst=1)
        if rank == 1 and not np.array_equal(a, sum(base)):
            bad.append(f"reduce {count}")
        a = base[rank].copy()
        dist.broadcast(a, src=1)
        if not np.array_equal(a, base[1]):
            bad.append(f"broadcast {count}")
        out = np.empty(count * n, dtype=np.float32)
        dist.all_gather_into_tensor(out, base[rank])
        if not np.array_equal(out, np.concatenate(base)):
            bad.append(f"all_gather {count}")
        gl = [np.empty(count, dtype=np.float32) for _ in range(n)] if rank == 0 else None
        dist.gather(base[rank], gl, dst=0)
        if rank == 0 and not all(np.array_equal(g, b) for g, b in zip(gl, base)):
            bad.append(f"gather {count}")
        s = np.empty(count, dtype=np.float32)
        dist.scatter(s, base if rank == 1 else None, src=1)
        if not np.array_equal(s, base[rank]):
            bad.append(f"scatter {count}")
        rs = np.empty(count, dtype=np.float32)
        dist.reduce_scatter_tensor(rs, np.concatenate(base) + rank)
        want = sum(np.concatenate(base) + r for r in range(n))[rank * count:(rank + 1) * count]
        if not np.array_equal(rs, want):
            bad.append(f"reduce_scatter {count}")
        src = np.concatenate([base[rank] + 10 * p for p in range(n)])
        out = np.empty(count * n, dtype=np.float32)
        dist.all_to_all_single(out, src)
        if not np.array_equal(out, np.concatenate([base[p] + 10 * rank for p in range(n)])):
            bad.append(f"all_to_all {count}")
    return {"bad": bad, "rules": [list(x) for x in cpg.rules], "transport": cpg.transport,
            "single_copy": bool(cpg.single_copy)}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_rank_applies_rank_0s_rules_and_results_stay_exact(tmp_path, transport):
    path = str(tmp_path / "rules.json")
    _write_rules(path, cma=1, small=1)  # single copies and rings from the first byte
    env = {"PYDDP_TRANSPORT": transport} if transport == "tcp" else {}
    # rank 1 has no rules file (and says so): rank 0's reach it through the address exchange
    res = run(_collectives, 2, timeout=120, env=env,
              rank_env={0: {"PYDDP_TUNING_FILE": path}, 1: {"PYDDP_TUNING": "0"}})
    for r in res:
        assert r["bad"] == [], r["bad"]
        assert r["transport"] == transport
    assert res[0]["rules"] == res[1]["rules"]
    cma, small = res[0]["rules"]
    assert cma[_C.K_ALLREDUCE] == 1 and small[_C.K_ALLREDUCE] == 1
    assert small[_C.K_GATHER] == 64 << 10  # not in the file: the default
    # and the built-in constants (no file) give the same results
    res = run(_collectives, 2, timeout=120, env=dict(env, PYDDP_TUNING="0"))
    assert [r["bad"] for r in res] == [[], []]
    assert res[0]["rules"][0][_C.K_ALLREDUCE] == 32 << 20


def test_a_gap_of_banks_reaches_every_rank_and_results_stay_exact(tmp_path):
    # single copies from the first byte but the banks from 100 KB to 1 MB: of the sizes
    # _collectives runs (4 B, 4 KB, 280 KB, 1.2 MB per rank) the third runs in the gap
    path = str(tmp_path / "rules.json")
    _write_rules(path, cma=1, small=1, gap=(100_000, 1_000_000))
    res = run(_collectives, 2, timeout=120,
              rank_env={0: {"PYDDP_TUNING_FILE": path}, 1: {"PYDDP_TUNING": "0"}})
    for r in res:
        assert r["bad"] == [], r["bad"]
    assert res[0]["rules"] == res[1]["rules"]
    cma = res[0]["rules"][0]
    assert cma[_C.K_ALLGATHER] == [1, 100_000, 1_000_000] or \
        tuple(cma[_C.K_ALLGATHER]) == (1, 100_000, 1_000_000)


def test_gap_is_the_band_where_the_first_candidate_wins_again():
    from pyddp.distributed.backends.cpu.crossovers import gap

    # the 2-rank all_gather of the 2-core VM (us, banks / single copies, 2026-11-28 10:44):
    # single copies from 16K, the banks faster at 512K-1M, single copies again from 2M
    K, M = 1 << 10, 1 << 20
    rows = [(4 * K, 2.2, 4.4), (8 * K, 2.9, 4.8), (16 * K, 4.8, 6.0), (32 * K, 7.0, 7.8),
            (64 * K, 14.1, 10.8), (128 * K, 24.4, 20.6), (256 * K, 43.8, 35.0),
            (512 * K, 52.7, 64.3), (1 * M, 108.8, 124.3), (2 * M, 230.9, 206.3),
            (4 * M, 947.6, 596.5), (8 * M, 2053.8, 1773.9), (16 * M, 4159.4, 4046.6)]
    start = crossover(rows)
    assert start == 64 * K
    assert gap(rows, start) == [512 * K, 2 * M]
    # one size a little behind among wins: no gap (it saves less than GAP_GAIN)
    rows2 = [(1, 2.0, 1.0), (2, 2.0, 1.0), (4, 1.0, 1.1), (8, 2.0, 1.0), (16, 2.0, 1.0)]
    assert crossover(rows2) == 1 and gap(rows2, 1) is None
    # the first candidate from some size to the largest is a later threshold (crossover's), not
    # a gap; nothing above "never"
    rows3 = [(1, 2.0, 1.0), (2, 2.0, 1.0), (4, 1.0, 2.0), (8, 1.0, 2.0)]
    assert crossover(rows3) is None and gap(rows3, crossover(rows3)) is None
    assert gap(rows, None) is None and gap([], 1) is None
    # the tables take a gap only from measurements of GAP_ROUNDS rounds or more
    from pyddp.distributed.backends.cpu.crossovers import _table

    def res(k):   # k rounds per size, in both phases (each phase's times decide: no tie)
        probes = [50.0, 500.0, 50.0][:k]
        return {"path": "shm", "single_copy": True, "kinds": {"all_gather": rows},
                "phases": {"phases": 2, "slow_fraction": 1 / 3},
                "rounds": {"all_gather": [[sz, [[p, a, b] for p in probes]]
                                          for sz, a, b in rows]}}
    assert _table([res(3)])["cma_gap"] == {"all_gather": [512 * K, 2 * M]}
    assert _table([res(2)])["cma_gap"] == {}
    assert _table([res(3)], gaps=False)["cma_gap"] == {}


def test_a_gap_in_a_file_is_checked(tmp_path, monkeypatch):
    path = str(tmp_path / "rules.json")
    for bad in ([10, 10], [20, 10], [10], "10-20", [10, True]):
        _write_rules(path, gap=bad)
        with pytest.raises(ValueError, match="cma_gap.broadcast must be \\[lo, hi\\]"):
            tuning.load(path)
    _write_rules(path, cma=None, gap=(10, 20))
    with pytest.raises(ValueError, match="a gap needs a cma_from threshold"):
        tuning.load(path)
    _write_rules(path, cma=4096, gap=(10_000, 20_000))
    monkeypatch.setenv("PYDDP_TUNING_FILE", path)
    cma, _ = tuning.decode(tuning.encode(2))
    assert cma[_C.K_ALLGATHER] == (4096, 10_000, 20_000)
    from pyddp.tools.tune import show
    import io
    out = io.StringIO()
    show(out, size=2)
    assert "4K, banks 10000-20000" in out.getvalue(), out.getvalue()


def test_rules_files_that_cannot_be_used_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDDP_TUNING_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="PYDDP_TUNING_FILE: rules file .*missing.json"):
        tuning.encode(2)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("PYDDP_TUNING_FILE", str(bad))
    with pytest.raises(ValueError, match="not JSON"):
        tuning.encode(2)
    bad.write_text(json.dumps({"format": 1, "tables": {"2": {"cma_from": {"allreduce": 1}}}}))
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        tuning.encode(2)
    bad.write_text(json.dumps({"format": 1, "tables": {"2": {"cma_from": {"all_reduce": -4}}}}))
    with pytest.raises(ValueError, match="cma_from.all_reduce must be a byte count"):
        tuning.encode(2)
    monkeypatch.setenv("PYDDP_TUNING", "yes")
    with pytest.raises(ValueError, match="PYDDP_TUNING must be 0"):
        tuning.encode(2)
    monkeypatch.setenv("PYDDP_TUNING", "0")
    assert tuning.encode(2) == ""  # off: the file is not read
    # a damaged file of this host's cache (not named by the user): a warning, the constants
    monkeypatch.delenv("PYDDP_TUNING")
    monkeypatch.delenv("PYDDP_TUNING_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    p = tuning.default_path()
    os.makedirs(os.path.dirname(p))
    with open(p, "w") as f:
        f.write("[]")
    with pytest.warns(RuntimeWarning, match="ignoring the rules file of this host"):
        assert tuning.encode(2) == ""


def test_table_for_picks_the_largest_count_not_above_the_group():
    doc = {"tables": {"2": {"x": 2}, "4": {"x": 4}}}
    assert tuning.table_for(doc, 1) is None
    assert tuning.table_for(doc, 3) == {"x": 2}
    assert tuning.table_for(doc, 4) == {"x": 4} == tuning.table_for(doc, 16)


def _rules_only(rank, world_size):
    import pyddp.distributed as dist

    return [list(x) for x in dist.distributed_c10d._world.default_pg._cpg.rules]


def _bound_rules(rank, world_size):
    """The rules a rank bound to one CPU (as mpirun binds ranks) applies."""
    import pyddp.distributed as dist

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    dist.init_process_group("cpu")
    try:
        return len(os.sched_getaffinity(0)), [list(x) for x in
                                              dist.distributed_c10d._world.default_pg._cpg.rules]
    finally:
        dist.destroy_process_group()


def test_ranks_bound_to_one_core_read_this_hosts_file(tmp_path):
    """A launcher that binds every rank to a core (mpirun's default) leaves one CPU in each rank's
    affinity mask; the host's file is keyed by the host's cores, so those ranks read it too."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity here")
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache), "PYDDP_TUNING_FILE": None, "PYDDP_TUNING": None}
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        path = tuning.default_path()
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old
    os.makedirs(os.path.dirname(path))
    _write_rules(path, cma=12345, small=4321)
    res = run(_bound_rules, 2, timeout=60, env=env, init=False)
    for ncpu, (cma, small) in res:
        assert ncpu == 1
        assert cma[_C.K_ALLREDUCE] == 12345 and small[_C.K_ALLREDUCE] == 4321


def test_the_tuner_writes_a_file_show_prints_it_and_groups_read_it(tmp_path):
    out = tmp_path / "rules.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "pyddp.tools.tune", "--quick", "--kinds", "all_reduce,gather",
           "--max-bytes", "64K", "--out", str(out), "--timeout", "120"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "measuring 2 ranks over shm" in p.stdout and f"wrote {out}" in p.stdout
    doc = tuning.load(str(out))
    t = doc["tables"]["2"]
    assert set(t["cma_from"]) <= {"all_reduce", "gather"}
    assert set(t["small_bytes"]) == {"all_reduce"}  # gather has no transport crossover
    for res in doc["measured"]["2"]:
        for rows in res["kinds"].values():
            assert [r[0] for r in rows] == [4096, 8192, 16384, 32768, 65536]  # --step 2
            assert all(a > 0 and b > 0 for _, a, b in rows)
    p = subprocess.run([sys.executable, "-m", "pyddp.tools.tune", "--show"],
                       env=dict(env, PYDDP_TUNING_FILE=str(out)), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"rules in force: {out} (PYDDP_TUNING_FILE)" in p.stdout
    assert "a group of 2 ranks:" in p.stdout and "all_reduce" in p.stdout
    res = run(_rules_only, 2, timeout=60, env={"PYDDP_TUNING_FILE": str(out)})
    small = t["small_bytes"]["all_reduce"]
    assert res[0] == res[1] and res[0][1][_C.K_ALLREDUCE] == small
    cma = t["cma_from"].get("all_reduce", 0)
    if cma is None:
        assert res[0][0][_C.K_ALLREDUCE] is None
    elif cma:
        assert res[0][0][_C.K_ALLREDUCE] == cma


def test_the_tuner_in_pairs_decides_as_the_first_jobs_and_merges_its_pairs(tmp_path):
    """--pairs: the shared-memory measurement is the first jobs' (pairs of calls, both placements
    where each rank has a core), its rules first_job_table's; --merge adds a second run's pairs."""
    from pyddp.distributed.backends.cpu import crossovers

    out = tmp_path / "rules.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "pyddp.tools.tune", "--pairs", "4", "--kinds", "all_reduce,gather",
           "--max-bytes", "16K", "--no-tcp", "--out", str(out), "--timeout", "120"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = tuning.load(str(out))
    (res,) = doc["measured"]["2"]
    assert res["how"] == "pairs" and set(res["kinds"]) == {"all_reduce", "gather"}
    assert [r[0] for r in res["kinds"]["gather"]] == [4096, 8192, 16384]
    if not res["single_copy"]:
        pytest.skip("single copies (cross-memory attach) are not possible here: nothing to choose")
    pairs = {k: dict((s, len(v)) for s, v in rows) for k, rows in res["ratios"].items()}
    assert all(n >= 3 for v in pairs.values() for n in v.values())
    defaults = [tuple(v) if isinstance(v, list) else v for v in res["defaults"]]
    want = crossovers.first_job_table(res, defaults)
    assert doc["tables"]["2"]["cma_from"] == want["cma_from"]
    assert doc["tables"]["2"].get("cma_gap", {}) == want["cma_gap"]
    assert doc.get("phased", {}).get("2") == want.get("phased")
    outs = run(_rules_only, 2, timeout=60, env={"PYDDP_TUNING_FILE": str(out)})
    assert outs[0] == outs[1]
    p = subprocess.run(cmd + ["--merge"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "merged the pairs of the file's earlier measurement" in p.stdout
    (again,) = tuning.load(str(out))["measured"]["2"]
    for k, rows in again["ratios"].items():
        assert all(len(v) == 2 * pairs[k][s] for s, v in rows), k


@FULL
def test_merge_adds_runs_up_and_keeps_what_this_run_did_not_measure(tmp_path):
    """--merge: the second run's rounds are the first run's plus its own at every size, the TCP
    measurement and table the second run skipped (--no-tcp) are kept, and the file records what it
    merged."""
    out = tmp_path / "rules.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "pyddp.tools.tune", "--quick", "--pairs", "0", "--kinds",
            "all_reduce,gather", "--max-bytes", "16K", "--out", str(out), "--timeout", "120"]
    p = subprocess.run(base + ["--merge"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no file at" in p.stdout
    first = tuning.load(str(out))
    shm1 = [m for m in first["measured"]["2"] if m["path"] == "shm"][0]
    assert all(len(rs) == 1 for v in shm1["rounds"].values() for _, rs in v)
    # a rank count this run does not measure keeps its measurement; its table is worked out again
    # by the rule in force (here single copies win at 4 KiB: the stale table's 999 goes)
    doc = json.loads(out.read_text())
    doc["tables"]["4"] = {"cma_from": {"gather": 999}, "small_bytes": {}}
    doc["measured"]["4"] = [{"path": "shm", "ranks": 4, "single_copy": True,
                             "kinds": {"gather": [[4096, 10.0, 1.0]]}}]
    out.write_text(json.dumps(doc))
    p = subprocess.run(base + ["--merge", "--no-tcp"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "merged 6 rounds" in p.stdout  # 2 kinds x 3 sizes, one round each
    second = tuning.load(str(out))
    assert second["merged"] == [first["created"]]
    paths = [m["path"] for m in second["measured"]["2"]]
    assert sorted(paths) == ["shm", "tcp"]
    shm2 = [m for m in second["measured"]["2"] if m["path"] == "shm"][0]
    assert all(len(rs) == 2 for v in shm2["rounds"].values() for _, rs in v)
    assert second["tables"]["2"]["small_bytes"] == first["tables"]["2"]["small_bytes"]
    assert second["tables"]["4"]["cma_from"] == {"gather": 4096}
    assert second["measured"]["4"][0]["kinds"]["gather"] == [[4096, 10.0, 1.0]]
    p = subprocess.run([sys.executable, "-m", "pyddp.tools.tune", "--show"],
                       env=dict(env, PYDDP_TUNING_FILE=str(out)), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"with the rounds of earlier runs (--merge): {first['created']}" in p.stdout, p.stdout
    # another host's file is not merged
    doc = json.loads(out.read_text())
    doc["host"] = dict(doc["host"], cpu="another cpu")
    out.write_text(json.dumps(doc))
    p = subprocess.run(base + ["--merge", "--no-tcp", "--kinds", "gather"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "measured on another host" in p.stdout and "merged" not in p.stdout.split("not merged")[1]
    assert "merged" not in tuning.load(str(out))


def test_a_run_keeps_the_rules_of_the_rank_counts_it_does_not_measure(tmp_path):
    """Without --merge a run replaces the rules of the rank counts it measures and keeps the
    others' (a run for 4 ranks used to throw away the file's 2-rank rules); another host's file
    keeps nothing."""
    out = tmp_path / "rules.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "pyddp.tools.tune", "--quick", "--kinds", "gather", "--max-bytes",
           "8K", "--no-tcp", "--out", str(out), "--timeout", "120"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    first = doc["measured"]["2"][0]
    # a 4-rank table (as a run with --nproc 4 leaves it; no measurement: kept as it is) and its phases
    doc["tables"]["4"] = {"cma_from": {"gather": 65536}, "small_bytes": {}}
    doc.setdefault("phased", {})["4"] = {"fast": {"cma_from": {"gather": 65536}, "cma_gap": {}},
                                         "slow": {"cma_from": {"gather": 4096}, "cma_gap": {}},
                                         "phase_ns": 80.0}
    out.write_text(json.dumps(doc))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"kept the rules of 4 ranks from {out}" in p.stdout, p.stdout
    again = tuning.load(str(out))
    assert again["tables"]["4"] == doc["tables"]["4"] and again["phased"]["4"] == doc["phased"]["4"]
    assert "merged" not in again                 # the 2-rank measurement is this run's alone
    if first.get("how") == "pairs":
        pairs = lambda m: [len(v) for _, v in m["ratios"]["gather"]]  # noqa: E731
        assert pairs(again["measured"]["2"][0]) == pairs(first)
    # groups of 2 ranks apply the 2-rank table, of 4 the 4-rank one
    assert tuning.table_for(again, 2) == again["tables"]["2"]
    assert tuning.table_for(again, 4)["cma_from"] == {"gather": 65536}
    # another host's file keeps nothing
    doc = json.loads(out.read_text())
    doc["host"] = dict(doc["host"], cpu="another cpu")
    out.write_text(json.dumps(doc))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "measured on another host" in p.stdout and "kept the rules" not in p.stdout, p.stdout
    assert set(tuning.load(str(out))["tables"]) == {"2"}


def test_merge_rounds_takes_the_median_over_both_runs():
    from pyddp.tools.tune import merge_rounds

    new = {"path": "shm", "ranks": 2, "kinds": {"gather": [(4096, 10.0, 20.0), (8192, 5.0, 5.0)]},
           "rounds": {"gather": [(4096, [[50.0, 10.0, 20.0]]), (8192, [[50.0, 5.0, 5.0]])]}}
    old = {"path": "shm", "ranks": 2,
           "rounds": {"gather": [[4096, [[300.0, 40.0, 21.0], [310.0, 42.0, 22.0]]],
                                 [16384, [[50.0, 1.0, 1.0]]]]}}
    assert merge_rounds(new, dict(old, ranks=4)) == 0 and merge_rounds(new, None) == 0
    assert merge_rounds(new, dict(old, path="tcp")) == 0
    assert merge_rounds(new, old) == 2
    assert new["kinds"]["gather"] == [(4096, 40.0, 21.0), (8192, 5.0, 5.0)]
    assert len(new["rounds"]["gather"][0][1]) == 3
    # the merged rounds are weighed by phase like the run's own
    from pyddp.tools.tune import weigh_phases
    rows, info = weigh_phases(new)
    assert info["phases"] == 2 and info["slow_fraction"] == 0.5


def test_merge_keeps_the_collectives_this_run_did_not_measure():
    """--kinds reduce --merge: the other collectives keep the file's measurement (their plain
    medians and rounds), so their rules are not lost to the built-in constants."""
    from pyddp.distributed.backends.cpu.crossovers import _table
    from pyddp.tools.tune import merge_rounds

    new = {"path": "shm", "ranks": 2, "single_copy": True,
           "kinds": {"reduce": [(4096, 10.0, 20.0)]},
           "rounds": {"reduce": [(4096, [[50.0, 10.0, 20.0]])]}}
    old = {"path": "shm", "ranks": 2,
           "kinds": {"gather": [(4096, 99.0, 99.0)], "reduce": [(4096, 1.0, 1.0)]},
           "median_rows": {"gather": [(4096, 9.0, 3.0)], "reduce": [(4096, 1.0, 1.0)]},
           "rounds": {"gather": [[4096, [[50.0, 9.0, 3.0]]]], "reduce": [[4096, [[50.0, 12.0, 22.0]]]]}}
    assert merge_rounds(new, old) == 2
    assert new["kinds"]["gather"] == [(4096, 9.0, 3.0)]  # the plain medians, not the weighed rows
    assert new["rounds"]["gather"] == [[4096, [[50.0, 9.0, 3.0]]]]
    assert new["kinds"]["reduce"] == [(4096, 11.0, 21.0)]  # measured again: both runs' rounds
    assert _table([new])["cma_from"] == {"gather": 4096, "reduce": None}


def test_weighed_phases_decide_without_the_tie():
    from pyddp.distributed.backends.cpu.crossovers import SHM_TIE, _table, _tie

    assert _tie({"path": "tcp"}) == 0.0
    assert _tie({"path": "shm"}) == SHM_TIE
    assert _tie({"path": "shm", "phases": {"phases": 1}}) == SHM_TIE
    assert _tie({"path": "shm", "phases": {"phases": 2, "slow_fraction": 0.03}}) == SHM_TIE
    assert _tie({"path": "shm", "phases": {"phases": 2, "slow_fraction": 0.3}}) == 0.0
    rows = [(4096, 10.0, 11.0)]
    res = {"path": "shm", "ranks": 2, "single_copy": True, "kinds": {"gather": rows},
           "phases": {"phases": 2, "slow_fraction": 0.3}}
    assert _table([res])["cma_from"]["gather"] is None
    res["phases"]["slow_fraction"] = 0.0
    assert _table([res])["cma_from"]["gather"] == 4096


def test_the_worse_phase_decides_each_size_whatever_share_of_rounds_it_had():
    """Shared memory measured in both phases: a size's loss is the phase where it is larger, so a
    candidate 1.65x slower in the fast phase and 2.8x faster in the slow one is taken however few
    rounds ran slow (the 4-rank reduce of the docs' VM at 1 MiB: banks 164/938 us fast/slow, single
    copies 271/330).  Weighing the phases by their share of rounds (10% slow here) kept the banks."""
    from pyddp.distributed.backends.cpu.crossovers import _table, phase_times
    from pyddp.tools.tune import weigh_phases

    fast, slow = 50.0, 300.0
    # (size, banks fast, banks slow, single copies fast, single copies slow)
    sizes = [(65536, 25.0, 73.0, 45.0, 95.0), (1048576, 164.0, 938.0, 271.0, 330.0)]
    rounds = {"reduce": [(z, [(fast, af, bf)] * 9 + [(slow, asl, bsl)]) for z, af, asl, bf, bsl in sizes]}
    res = {"path": "shm", "ranks": 4, "single_copy": True, "rounds": rounds,
           "kinds": {"reduce": [(z, af, bf) for z, af, _, bf, _ in sizes]}}
    by_phase, info = phase_times(res)
    assert info["phases"] == 2 and info["slow_fraction"] == pytest.approx(0.1)
    assert by_phase["reduce"][1] == (1048576, (164.0, 938.0), (271.0, 330.0))
    res["kinds"], res["phases"] = weigh_phases(res)
    # the weighed times alone: banks ahead at both sizes (1 MiB: 241 vs 277 us)
    assert crossover(res["kinds"]["reduce"]) is None
    assert _table([res])["cma_from"]["reduce"] == 1048576
    # over TCP the phases are not told apart: the weighed times decide
    tcp = dict(res, path="tcp")
    assert _table([tcp])["small_bytes"]["reduce"] == 1 << 62
    # tuples straight into crossover: the larger of the per-phase losses
    assert crossover([(1, (1.0, 4.0), (1.5, 2.0))]) == 1
    assert crossover([(1, (1.0, 2.0), (3.0, 2.1))]) is None


def test_the_slow_rules_take_over_just_above_the_fast_rounds_probes():
    """The run-time threshold of the slow phase's rules (phase_ns) is 1.25x the highest probe of
    the rounds classified fast (at least 10 ns above it, never above the classification's 2x the
    10th percentile): the banks' time follows the probe (2 ranks, 64 KiB all_reduce: 6.3 us at
    40-45 ns, 13 at 60-75, 43 at 245; single copies 12-16 throughout), so the fast rules hold
    near the probes they were measured at only."""
    from pyddp.distributed.backends.cpu.crossovers import phase_times, switch_ns
    from pyddp.tools.tune import _add_phased

    assert switch_ns([40.0, 45.0], 80.0) == 56.2
    assert switch_ns([20.0, 22.0], 80.0) == 32.0      # at least 10 ns above
    assert switch_ns([60.0, 75.0], 80.0) == 80.0      # never above the classification's
    assert switch_ns([], 80.0) == 80.0
    # a measurement of 2 ranks: 9 rounds at 40-45 ns, 7 at 245 (as the tuner's run of 16:59 UTC)
    fast = [(40.0 + i % 2 * 5, 6.3, 13.5) for i in range(9)]
    slow = [(245.0, 42.9, 16.1)] * 7
    res = {"path": "shm", "ranks": 2, "single_copy": True, "probe": "pingpong",
           "rounds": {"all_reduce": [(65536, fast + slow)]},
           "kinds": {"all_reduce": [(65536, 6.3, 13.5)]}}
    _, info = phase_times(res)
    assert info["slow_above_ns"] == 80.0 and info["switch_ns"] == 56.2
    res["phases"] = info
    doc = {}
    _add_phased(doc, 2, [res])
    ph = doc["phased"]["2"]
    assert ph["phase_ns"] == 56.2
    assert ph["fast"]["cma_from"]["all_reduce"] is None      # the banks near 40 ns
    assert ph["slow"]["cma_from"]["all_reduce"] == 65536     # single copies above


def test_one_sizes_stray_slow_rounds_do_not_outweigh_its_neighbours():
    """Split by phase, a size has few rounds per phase: the rule reads each size's per-phase ratio
    as the median of its own and its neighbours' (smooth_phases), so one size whose slow rounds
    landed far off (the 4-rank reduce of the docs' VM: banks 264 us at 1 MiB in the slow phase,
    393 at 512 KiB, 1635 at 2 MiB) does not keep the banks there."""
    from pyddp.distributed.backends.cpu.crossovers import _table, smooth_phases
    from pyddp.tools.tune import weigh_phases

    fast, slow = 50.0, 300.0
    # (size, banks fast, banks slow, single copies fast, single copies slow): measured 2026-11-28
    sizes = [(262144, 86.3, 216.2, 130.1, 141.3), (524288, 92.1, 393.0, 210.0, 162.1),
             (1048576, 207.2, 264.1, 352.9, 253.0), (2097152, 307.9, 1635.4, 385.8, 412.0)]
    rounds = {"reduce": [(z, [(fast, af, bf)] * 3 + [(slow, asl, bsl)]) for z, af, asl, bf, bsl in sizes]}
    res = {"path": "shm", "ranks": 4, "single_copy": True, "rounds": rounds,
           "kinds": {"reduce": [(z, af, bf) for z, af, _, bf, _ in sizes]}}
    res["kinds"], res["phases"] = weigh_phases(res)
    rows = [(z, (af, asl), (bf, bsl)) for z, af, asl, bf, bsl in sizes]
    # each size's own ratios: the 1 MiB row's losses outweigh the three sizes around it
    assert crossover(rows) == 2097152
    smooth = smooth_phases(rows)
    assert smooth[0][1] == pytest.approx((86.3 / 130.1, 216.2 / 141.3))  # an end keeps its own
    assert smooth[2][1][1] == pytest.approx(393.0 / 162.1)  # median of 2.42, 1.04, 3.97
    assert all(r[2] == (1.0, 1.0) for r in smooth)
    # smoothed: single copies from 1 MiB (at 512 KiB the banks' 1.7x in the fast phase, against
    # the slow phase's 1.5x, keeps them)
    assert _table([res])["cma_from"]["reduce"] == 1048576


def test_probe_handoff_measures_both_numbers_and_checks_its_argument():
    """Issue 37: the core-to-core probe printed beside benchmark tables and kept with the rules."""
    import os

    from pyddp import _C

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: nothing crosses between cores")
    # half a second: with the suite's other processes holding both cores (a tuner test's ranks
    # beside it), 50 ms could pass without one complete round
    ns, gbps = _C.probe_handoff(0.5)
    # a cache line takes tens to thousands of ns between cores, up to a scheduler's time slice when
    # other processes hold the cores (the suite runs beside this test); 1 MiB crosses at well under
    # 1 TB/s
    assert 1 < ns < 1e8 and 0 < gbps < 1000, (ns, gbps)
    for bad in (0, -1, 61, float("nan")):
        with pytest.raises(ValueError, match="seconds must be in"):
            _C.probe_handoff(bad)


def test_phase_note_warns_only_when_the_probes_disagree():
    from pyddp.tools import tune

    same = [{"before": (50.0, 24.0), "after": (60.0, 22.0)}]
    assert tune._phase_note(same) == ""
    assert tune._phase_note([]) == ""
    moved = same + [{"before": (280.0, 4.0), "after": (275.0, 4.1)}]
    note = tune._phase_note(moved)
    assert "changed phase" in note and "50 ns" in note and "280 ns" in note, note


def test_a_tie_on_shared_memory_goes_to_single_copies():
    """Issue 37: within the tie fraction the second candidate counts as winning (single copies keep
    their speed when the machine's phase changes; the banks do not)."""
    from pyddp.tools.tune import SHM_TIE

    rows = [(1, 1.0, 2.0), (2, 1.0, 1.1), (4, 1.0, 0.9)]
    assert crossover(rows) == 4
    assert crossover(rows, SHM_TIE) == 2
    assert crossover([(1, 1.0, 1.0 + SHM_TIE + 0.01)], SHM_TIE) is None


def test_rounds_are_weighed_by_the_phase_they_ran_in():
    """Each round carries rank 0's probe before it; a candidate's time is its expected time over the
    fast and slow phases, weighted by how many of the measurement's rounds were slow."""
    from pyddp.tools.tune import weigh_phases

    # banks: 10 us fast, 50 us slow; single copies 13 us in either; half the rounds slow
    fast, slow = 50.0, 300.0
    rounds = [(fast, 10.0, 13.0), (slow, 50.0, 13.0), (fast, 10.0, 13.0), (slow, 50.0, 13.0)]
    res = {"kinds": {"reduce": [(4096, 10.0, 13.0)]}, "rounds": {"reduce": [(4096, rounds)]}}
    rows, info = weigh_phases(res)
    assert info["phases"] == 2 and info["slow_fraction"] == 0.5, info
    (size, a, b), = rows["reduce"]
    assert size == 4096 and a == pytest.approx(30.0) and b == pytest.approx(13.0)
    assert crossover(rows["reduce"]) == 4096  # the medians alone (10 vs 13) would keep the banks
    assert crossover(res["kinds"]["reduce"]) is None

    # a size seen in the fast phase only gets the kind's slow/fast ratio of each candidate
    res["kinds"]["reduce"].append((16384, 20.0, 26.0))
    res["rounds"]["reduce"].append((16384, [(fast, 20.0, 26.0), (fast, 20.0, 26.0)]))
    rows, _ = weigh_phases(res)
    p = 2 / 6  # two of the measurement's six rounds were slow
    assert rows["reduce"][1][1] == pytest.approx((1 - p) * 20.0 + p * 100.0)
    assert rows["reduce"][1][2] == pytest.approx(26.0)

    # one phase throughout (or no probes): the medians stay
    calm = {"kinds": {"reduce": [(4096, 10.0, 13.0)]},
            "rounds": {"reduce": [(4096, [(fast, 10.0, 13.0)] * 2), (8192, [(55.0, 1.0, 1.0)] * 2)]}}
    rows, info = weigh_phases(calm)
    assert rows is calm["kinds"] and info["phases"] == 1
    assert weigh_phases({"kinds": {"reduce": []}})[1] == {"phases": 1}


def _online(rank, world_size, how):
    import pyddp.distributed as dist
    from pyddp.tools import tune

    cpg = dist.distributed_c10d._world.default_pg._cpg
    before = [list(x) for x in cpg.rules]
    table = None
    if how == "call":
        table = tune.online(kinds=["all_reduce", "broadcast", "all_gather"], min_bytes=4 << 10,
                            max_bytes=256 << 10, rounds=1, iters=3)
    after = [list(x) for x in cpg.rules]
    checked = _collectives(rank, world_size)   # results stay exact whatever was chosen
    return {"table": table, "before": before, "after": after, "bad": checked["bad"],
            "transport": checked["transport"]}


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_online_tuning_measures_on_the_job_and_every_rank_applies_the_same_rules(transport):
    env = {"PYDDP_TUNING": "0"}   # start from the built-in constants
    if transport == "tcp":
        env["PYDDP_TRANSPORT"] = "tcp"
    res = run(_online, 2, "call", timeout=180, env=env)
    assert [r["bad"] for r in res] == [[], []]
    assert res[0]["transport"] == transport
    assert res[0]["after"] == res[1]["after"]
    assert res[0]["table"] == res[1]["table"]
    cma, small = res[0]["after"]
    measured = {4 << 10, 16 << 10, 64 << 10, 256 << 10, None}
    if transport == "shm":
        assert set(res[0]["table"]["cma_from"]) == {"all_reduce", "broadcast", "all_gather"}
        for kind, v in res[0]["table"]["cma_from"].items():
            assert v in measured, (kind, v)
            assert cma[_C.KINDS[kind]["code"]] == v
        # kinds it did not measure keep their rules
        assert cma[_C.K_GATHER] == res[0]["before"][0][_C.K_GATHER] == 16 << 20
        assert small == res[0]["before"][1]
    else:
        assert res[0]["table"]["cma_from"] == {}
        assert set(res[0]["table"]["small_bytes"]) == {"all_reduce", "broadcast", "all_gather"}
        assert cma == res[0]["before"][0]


def test_online_tuning_at_init_with_the_environment_variable():
    res = run(_online, 2, "env", timeout=240,
              env={"PYDDP_TUNING": "0", "PYDDP_TUNING_ONLINE": "1", "PYDDP_DEBUG": "INFO"})
    assert [r["bad"] for r in res] == [[], []]
    assert res[0]["before"] == res[1]["before"]   # already tuned when the group was made
    # every collective it measures has a rule of the sizes it measured (16 KiB-16 MiB) or never,
    # none keeps a built-in constant (all_reduce 32 MiB, broadcast 1 MiB, gather/scatter 16 MiB)
    cma = res[0]["before"][0]
    for kind in ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
                 "reduce_scatter", "all_to_all"):
        v = cma[_C.KINDS[kind]["code"]]
        assert v is None or v in {16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20}, (kind, v)
    assert cma[_C.K_ALLREDUCE] != 32 << 20


def test_online_tuning_checks_its_arguments():
    from pyddp.tools import tune

    with pytest.raises(RuntimeError, match="call init_process_group first"):
        tune.online()
    dist, cpg = _group()
    try:
        with pytest.raises(ValueError, match="unknown collective"):
            tune.online(kinds=["allreduce"])
        with pytest.raises(ValueError, match="min_bytes must be an int >= 1"):
            tune.online(min_bytes=0)
        with pytest.raises(ValueError, match="larger than max_bytes"):
            tune.online(min_bytes=2 << 20, max_bytes=1 << 20)
        assert tune.online() == {}   # one rank: nothing to choose
    finally:
        dist.destroy_process_group()


def test_the_tuners_arrays_are_like_a_jobs_on_pages_of_their_own():
    """crossovers.user_array: the value asked for, writable float32, a mapping of its own per array
    (no two share memory), 2 MiB-aligned from 2 MiB on with huge pages asked for, kept alive by the
    array alone."""
    import gc
    import re

    from pyddp.distributed.backends.cpu.crossovers import HUGE_PAGE, user_array

    for count, value in ((1, 3.0), (1000, 0.0), (HUGE_PAGE // 4, 1.0), (HUGE_PAGE, 2.5)):
        a = user_array(count, value)
        assert a.dtype == np.float32 and a.shape == (count,) and a.flags.writeable
        assert a.flags.c_contiguous and np.all(a == value)
        if count * 4 >= HUGE_PAGE:
            assert a.ctypes.data % HUGE_PAGE == 0
    x, y = user_array(1 << 20, 1.0), user_array(1 << 20, 2.0)
    assert not np.shares_memory(x, y)
    view = user_array(HUGE_PAGE, 7.0)[5:10]
    gc.collect()
    assert np.all(view == 7.0)  # the mapping lives while a view does
    # where the kernel gives transparent huge pages on request, a large array is on them
    mode = defrag = ""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
        with open("/sys/kernel/mm/transparent_hugepage/defrag") as f:
            defrag = f.read()  # compaction at the fault for a region that asked: the page is there
    except OSError:
        pass
    if ("[always]" in mode or "[madvise]" in mode) and ("[always]" in defrag or "madvise]" in defrag):
        big = user_array(8 * HUGE_PAGE // 4, 1.0)
        start = big.ctypes.data
        with open("/proc/self/smaps") as f:
            text = f.read()
        huge_kb = 0
        for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
            lo, hi = (int(v, 16) for v in block.split(None, 1)[0].split("-"))
            if lo <= start < hi:
                m = re.search(r"AnonHugePages:\s+(\d+) kB", block)
                huge_kb = int(m.group(1)) if m else 0
        assert huge_kb > 0, "no huge pages under an 8 MiB array although the kernel gives them on request"
