"""The first job on a host without rules measures it (PYDDP_TUNING_AUTO, the default): every rank
applies rank 0's crossovers, rank 0 keeps them in the per-user cache, later jobs read them; a
file of another host is never used; ranks sharing cores measure for their rank count; TCP, or
another job measuring now, leave the constants.  Results stay exact (NumPy reference) whatever was chosen."""
import fcntl
import json
import math
import os

import pytest

from _mp import run
from test_tune import _collectives

from pyddp import _C
from pyddp.distributed.backends.cpu import crossovers, tuning

MEASURED = set(crossovers.first_job_sizes()) | {None}
BUILT_IN = {"all_reduce": 32 << 20, "broadcast": 1 << 20, "gather": 16 << 20, "scatter": 16 << 20}


def _path_for(cache):
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        return tuning.default_path()
    finally:
        os.environ["XDG_CACHE_HOME"] = old if old is not None else ""
        if old is None:
            del os.environ["XDG_CACHE_HOME"]


def _env(cache, **more):
    return dict({"XDG_CACHE_HOME": str(cache), "PYDDP_TUNING_AUTO": "1", "PYDDP_TUNING_FILE": None,
                 "PYDDP_TUNING": None, "PYDDP_CMA_THRESHOLD": None}, **more)


def _job(rank, world_size):
    import time

    import pyddp.distributed as dist

    t0 = time.perf_counter()
    dist.init_process_group("cpu")
    took = time.perf_counter() - t0
    out = _collectives(rank, world_size)
    out["init_s"] = took
    cpg = dist.distributed_c10d._world.default_pg._cpg
    out["phase_ns"] = cpg.phase.get("phase_ns")
    out["slow"] = [list(x) for x in cpg.slow_rules]
    dist.destroy_process_group()
    return out


def _kept(t, kind):
    """A table's rule for ``kind`` as a group applies it: the threshold, with its gap [lo, hi)
    where the table has one (a list, as the rules come back from the ranks)."""
    v, band = t["cma_from"][kind], (t.get("cma_gap") or {}).get(kind)
    return [v, *band] if band else v


def _norm(v):
    return list(v) if isinstance(v, (tuple, list)) else v


def _applied_as_kept(out, doc, n=2):
    """A job's group (``_job``'s ``out`` of one rank) applies the rules of ``doc`` for ``n``
    ranks: where it has each phase's and each rank has a core for the probe, the fast phase's
    rules, the slow phase's and the threshold between them (as tuning.phased_for); else its
    table's, without phases."""
    ph = tuning.phased_for(doc, n, n)
    fast, slow = out["rules"][0], out["slow"][0]
    if ph is None:
        t = doc["tables"][str(n)]
        assert out["phase_ns"] == 0.0
        assert {k: _norm(fast[tuning.KIND_NAMES[k]]) for k in t["cma_from"]} == \
            {k: _kept(t, k) for k in t["cma_from"]}
        return
    assert out["phase_ns"] == ph["phase_ns"]
    for got, t in ((fast, ph["fast"]), (slow, ph["slow"])):
        assert {k: _norm(got[tuning.KIND_NAMES[k]]) for k in t["cma_from"]} == \
            {k: _kept(t, k) for k in t["cma_from"]}


def _constants(rules):
    cma = rules[0]
    return all(cma[_C.KINDS[k]["code"]] == v for k, v in BUILT_IN.items())


def test_the_first_job_measures_the_host_and_later_jobs_read_what_it_kept(tmp_path):
    path = _path_for(tmp_path)
    res = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
    assert [r["bad"] for r in res] == [[], []]
    if not res[0]["single_copy"]:
        pytest.skip("single copies (cross-memory attach) are not possible here: nothing to choose")
    assert res[0]["rules"] == res[1]["rules"]          # every rank applies rank 0's
    cma = res[0]["rules"][0]
    doc = tuning.load(path)
    assert doc["source"] == "first job" and doc["host"] == tuning.host_facts()
    assert set(doc["tables"]) == {"2"} and doc["seconds"]["2"] > 0
    table = doc["tables"]["2"]["cma_from"]
    assert table, "the first job chose nothing"
    for kind, (lo, hi) in (doc["tables"]["2"].get("cma_gap") or {}).items():
        # a band of measured sizes above the threshold where the banks won again
        assert table[kind] is not None and table[kind] < lo < hi, (kind, table[kind], lo, hi)
        assert lo in MEASURED and hi in MEASURED, (kind, lo, hi)
    for kind, code in tuning.KIND_NAMES.items():
        if kind in table:   # a measured size or never
            assert table[kind] in MEASURED, (kind, table[kind])
        else:               # single copies never won up to the largest size measured, and the
            # built-in threshold lies above it: the constant stays (first_job_table)
            assert BUILT_IN.get(kind, math.inf) > crossovers.FIRST_JOB_MAX, kind
            assert cma[code] == BUILT_IN[kind], (kind, cma[code])
    for r in res:   # applied as kept: the phases' rules where the file has them, as later jobs
        _applied_as_kept(r, doc)
    assert doc["jobs"] == {"2": 1}
    pairs = {k: dict((s, len(v)) for s, v in rows) for k, rows in doc["measured"]["2"][0]["ratios"].items()}
    # the next first jobs measure again, each adding its pairs to the earlier ones'
    for job in range(2, tuning.FIRST_JOBS + 1):
        again = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
        assert [r["bad"] for r in again] == [[], []]
        assert again[0]["rules"] == again[1]["rules"]
        doc = tuning.load(path)
        assert doc["jobs"] == {"2": job}
        for r in again:
            _applied_as_kept(r, doc)
        for k, rows in doc["measured"]["2"][0]["ratios"].items():
            for size, v in rows:
                assert len(v) == min(crossovers.MERGED_PAIRS, job * pairs[k][size]), (k, size)
    stamp = os.stat(path).st_mtime_ns
    # after them a job reads the file, measures nothing, and applies its rules
    last = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
    assert [r["bad"] for r in last] == [[], []]
    assert last[0]["rules"] == last[1]["rules"]
    # the same rules (and phases) as the last first job applied
    assert [(r["rules"], r["slow"], r["phase_ns"]) for r in last] == \
        [(r["rules"], r["slow"], r["phase_ns"]) for r in again]
    for r in last:
        _applied_as_kept(r, doc)
    assert os.stat(path).st_mtime_ns == stamp


def test_merged_pairs_decide_by_their_median():
    rows = [(4096, 2.0, 4.0), (65536, 10.0, 5.0)]
    new = {"kinds": {"all_reduce": rows}, "ratios": {"all_reduce": [[4096, [0.7, 0.7]],
                                                                    [65536, [-0.7, -0.7]]]}}
    old = {"jobs": 2, "ratios": {"all_reduce": [[4096, [-1.0, -1.0, -1.0]], [65536, [-0.7]]]}}
    out = crossovers.merge_paired(new, old)
    assert out["jobs"] == 3
    assert out["ratios"]["all_reduce"] == [[4096, [-1.0, -1.0, -1.0, 0.7, 0.7]],
                                           [65536, [-0.7, -0.7, -0.7]]]
    (s1, a1, b1), (s2, a2, b2) = out["kinds"]["all_reduce"]
    assert (s1, a1, s2, a2) == (4096, 2.0, 65536, 10.0)
    assert abs(b1 - 2.0 * math.exp(-1.0)) < 1e-9 and abs(b2 - 10.0 * math.exp(-0.7)) < 1e-9
    assert crossovers.merge_paired(new, None) is new


def test_a_rules_file_of_another_host_is_not_used(tmp_path):
    path = _path_for(tmp_path)
    os.makedirs(os.path.dirname(path))
    other = dict(tuning.host_facts(), cpu="Some Other CPU @ 9.99GHz")
    doc = {"format": tuning.FORMAT, "host": other, "created": "test", "source": "first job",
           "tables": {"2": {"cma_from": {k: 12345 for k in tuning.KIND_NAMES}, "small_bytes": {}}}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    outs = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
    assert [r["bad"] for r in outs] == [[], []]
    for r in outs:
        assert 12345 not in r["rules"][0]
        assert _constants(r["rules"])      # and nothing measured over the user's file
    assert json.load(open(path, encoding="utf-8")) == doc
    # PYDDP_TUNING_FILE naming it uses it anyway (the user said so)
    outs = run(_job, 2, timeout=120, init=False, env=_env(tmp_path, PYDDP_TUNING_FILE=path))
    assert all(r["rules"][0][_C.K_ALLREDUCE] == 12345 for r in outs)


def test_a_hand_run_tuners_file_is_kept_as_it_is(tmp_path):
    path = _path_for(tmp_path)
    os.makedirs(os.path.dirname(path))
    doc = {"format": tuning.FORMAT, "host": tuning.host_facts(), "created": "test",
           "tables": {"4": {"cma_from": {k: 12345 for k in tuning.KIND_NAMES}, "small_bytes": {}}}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    outs = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
    assert [r["bad"] for r in outs] == [[], []]
    assert all(_constants(r["rules"]) for r in outs)   # no table for 2 ranks: the constants
    assert json.load(open(path, encoding="utf-8")) == doc


@pytest.mark.parametrize("why", ["tcp", "auto_off", "another_job_measuring"])
def test_no_measurement_where_it_would_say_little_or_another_job_measures(tmp_path, why):
    path = _path_for(tmp_path)
    env = _env(tmp_path)
    held = None
    if why == "tcp":
        env["PYDDP_TRANSPORT"] = "tcp"
    elif why == "auto_off":
        env["PYDDP_TUNING_AUTO"] = "0"
    else:
        os.makedirs(os.path.dirname(path))
        held = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)
    try:
        outs = run(_job, 2, timeout=120, init=False, env=env)
    finally:
        if held is not None:
            os.close(held)
    assert [r["bad"] for r in outs] == [[], []]
    assert all(_constants(r["rules"]) for r in outs)
    assert not os.path.exists(path)


def test_ranks_sharing_cores_measure_for_their_rank_count(tmp_path):
    """More ranks than cores (4 on 2 here): the first job measures too, and its table is for
    that rank count; every rank applies rank 0's rules and the results stay exact."""
    path = _path_for(tmp_path)
    n = (os.cpu_count() or 1) + 1
    if n > 6:
        pytest.skip("this host has a core for every rank a quick test starts")
    outs = run(_job, n, timeout=180, init=False, env=_env(tmp_path))
    assert all(r["bad"] == [] for r in outs)
    assert all(r["rules"] == outs[0]["rules"] for r in outs)
    doc = tuning.load(path)
    assert doc["source"] == "first job" and set(doc["tables"]) == {str(n)}
    assert doc["jobs"] == {str(n): 1}
    # no phase probe where ranks share cores (it would time the scheduler)
    probes = doc["measured"][str(n)][0]["pair_probes"]
    assert probes and all(x is None for rows in probes.values() for _, v in rows for x in v)
    table = doc["tables"][str(n)]["cma_from"]
    if outs[0]["single_copy"]:
        cma = outs[0]["rules"][0]
        assert {k: _norm(cma[tuning.KIND_NAMES[k]]) for k in table} == \
            {k: _kept(doc["tables"][str(n)], k) for k in table}


def test_ranks_more_than_twice_the_cores_do_not_measure(tmp_path):
    """A measurement of 8 ranks on 2 cores took 1.85 s of the first init: past SHARED_MEASURE
    ranks per core the constants stay (and nothing is written)."""
    path = _path_for(tmp_path)
    n = tuning.SHARED_MEASURE * (os.cpu_count() or 1) + 1
    if n > 6:
        pytest.skip("too many ranks for a quick test on this host")
    outs = run(_job, n, timeout=180, init=False, env=_env(tmp_path))
    assert all(r["bad"] == [] for r in outs)
    assert all(_constants(r["rules"]) for r in outs)
    assert not os.path.exists(path)


def test_describe_says_which_rules_a_job_starts_with(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PYDDP_TUNING_AUTO", "1")
    assert tuning.describe() == ("built-in constants (no rules file yet: the first jobs on this "
                                 "host measure it)")
    monkeypatch.setenv("PYDDP_TUNING_AUTO", "0")
    assert tuning.describe() == "built-in constants"
    path = tuning.default_path()
    os.makedirs(os.path.dirname(path))
    doc = {"format": tuning.FORMAT, "host": tuning.host_facts(), "created": "2026-12-02T00:00:00Z",
           "source": "first job", "tables": {"2": {"cma_from": {}, "small_bytes": {}}}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    assert tuning.describe().startswith("measured by this host's first job 2026-12-02T00:00:00Z")
    doc["phased"] = {"2": {"fast": {"cma_from": {}}, "slow": {"cma_from": {}}, "phase_ns": 90.0}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    assert tuning.describe().startswith("measured by this host's first job 2026-12-02T00:00:00Z")
    assert "; each phase's rules for 2 ranks; python -m pyddp.tools.tune --show)" in tuning.describe()
    doc["host"] = dict(doc["host"], cores=doc["host"]["cores"] + 64)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    assert "was measured on another host" in tuning.describe()


def _merged(fast, slow, probes_fast=50.0, probes_slow=400.0, pairs=6, sizes=None):
    """A first jobs' measurement of all_to_all (second candidate over first: ``fast`` and ``slow``
    ratios per size, ``pairs`` pairs in each phase), as merge_paired leaves it."""
    sizes = sizes or [4 << 10, 64 << 10, 1 << 20]
    lr = {s: [math.log(fast[i])] * pairs + [math.log(slow[i])] * pairs for i, s in enumerate(sizes)}
    ns = [probes_fast] * pairs + [probes_slow] * pairs
    return {"path": "shm", "single_copy": True, "jobs": 3,
            "kinds": {"all_to_all": [(s, 10.0, 10.0 * math.exp(sorted(lr[s])[pairs])) for s in sizes]},
            "ratios": {"all_to_all": [[s, lr[s]] for s in sizes]},
            "pair_probes": {"all_to_all": [[s, list(ns)] for s in sizes]}}


def test_first_jobs_in_both_phases_give_each_phase_its_rules():
    """The banks win at every size in the fast phase (single copies 1.5x their time) and lose 3x
    in the slow one (as the 2-core VM's all_to_all of 64 KiB: 5 us against 24): the table made
    for both phases takes single copies where the worse phase says so, and each phase gets rules
    of its own with the run-time threshold (1.25x the fast pairs' highest probe, 50 ns: 62.5)."""
    res = _merged(fast=[1.5, 1.5, 1.5], slow=[0.3, 0.3, 0.3])
    split, limit = crossovers.first_job_phases(res)
    assert limit == 62.5
    assert [(s, round(f, 3), round(sl, 3)) for s, f, sl in split["all_to_all"]] == \
        [(4 << 10, 1.5, 0.3), (64 << 10, 1.5, 0.3), (1 << 20, 1.5, 0.3)]
    defaults = [None] * (max(k["code"] for k in _C.KINDS.values()) + 1)
    table = crossovers.first_job_table(res, defaults)
    ph = table["phased"]
    assert ph["phase_ns"] == 62.5
    assert ph["fast"]["cma_from"] == {"all_to_all": None}     # the banks at every size
    assert ph["slow"]["cma_from"] == {"all_to_all": 4 << 10}  # single copies from the smallest
    # both phases: a loss of log(1.5) in the fast phase against log(1/0.3) in the slow one
    assert table["cma_from"]["all_to_all"] == 4 << 10
    assert "slow_modelled" not in ph
    # one phase seen (every probe alike), or too few pairs in one: no measured phases' rules
    assert crossovers.first_job_phases(_merged([1.5] * 3, [0.3] * 3, probes_slow=50.0)) is None
    assert crossovers.first_job_phases(_merged([1.5] * 3, [0.3] * 3, pairs=2)) is None
    # pairs of older files have no probes: no phases, measured or modelled
    old = dict(res, pair_probes={"all_to_all": [[s, [None] * 12] for s, _ in res["ratios"]["all_to_all"]]})
    assert crossovers.first_job_phases(old) is None
    assert crossovers.modelled_phases(old) is None
    assert "phased" not in crossovers.first_job_table(old, defaults)


def test_first_jobs_in_one_phase_model_the_slow_phases_rules():
    """Pairs in one phase only (every probe 50 ns): that phase's rules as measured, with the tie
    (single copies 1.5x the banks' time: the banks everywhere), and the slow phase's modelled: the
    banks taken to slow down with the probe up to the classification's limit, 2x the pairs' 10th
    percentile (100 ns), so single copies at 1.5 / 2 = 0.75 of the banks' time win there (as the
    2-core VM's all_to_all of 64 KiB, 24 us through the banks in the slow state against 9 by single
    copies, measured at 10 and 13 in the fast one).  Sizes the model cannot turn (single copies 4x)
    stay with the banks; the pairs of a few slow rounds (too few for rules of their own) are left
    out of the measured phase's ratio.  The group switches to them where it would to measured
    slow rules: 1.25x the pairs' highest probe (62.5 ns), not at the limit."""
    defaults = [None] * (max(k["code"] for k in _C.KINDS.values()) + 1)
    one = _merged([1.5, 4.0, 4.0], [1.5, 4.0, 4.0], probes_slow=50.0)
    split, switch = crossovers.modelled_phases(one)
    assert switch == 62.5
    assert [(s, round(f, 6), round(sl, 6)) for s, f, sl in split["all_to_all"]] == \
        [(4 << 10, 1.5, 0.75), (64 << 10, 4.0, 2.0), (1 << 20, 4.0, 2.0)]
    table = crossovers.first_job_table(one, defaults)
    ph = table["phased"]
    assert ph["phase_ns"] == 62.5 and ph["slow_modelled"] is True
    assert table["cma_from"] == {"all_to_all": None} == ph["fast"]["cma_from"]
    # single copies win at 4 KiB only and lose 2x above: the banks (the threshold losing least)
    assert ph["slow"]["cma_from"] == {"all_to_all": None}
    two = _merged([1.5] * 3, [1.5] * 3, probes_slow=50.0)
    assert crossovers.first_job_table(two, defaults)["phased"]["slow"]["cma_from"] == \
        {"all_to_all": 4 << 10}
    # two slow pairs among six fast ones: too few for measured rules; the model from the fast six
    few = _merged([1.5] * 3, [0.3] * 3, pairs=2)
    split, switch = crossovers.modelled_phases(few)
    assert switch == 62.5 and [round(sl, 6) for _, _, sl in split["all_to_all"]] == [0.75] * 3


def test_first_jobs_keep_a_band_where_the_banks_win_again():
    """Single copies win from 4 KiB, lose 1.6x at 256 KiB-1 MiB (arrays on small pages) and win
    again from 2 MiB (huge pages), as all_gather on 2 ranks of the 2-core VM: the rules take them
    from 4 KiB with the banks again in [256 KiB, 2 MiB), in the table and the measured phase's;
    the modelled slow phase, whose banks are twice as slow, has no band.  A band needs
    FIRST_JOB_GAP_PAIRS pairs at each of its sizes; groups apply it as kept."""
    sizes = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20]
    assert set(sizes) <= set(crossovers.first_job_sizes())
    ratios = [0.5, 0.5, 1.6, 1.6, 0.7, 0.7]
    defaults = [None] * (max(k["code"] for k in _C.KINDS.values()) + 1)
    res = _merged(ratios, ratios, probes_slow=50.0, sizes=sizes)
    table = crossovers.first_job_table(res, defaults)
    assert table["cma_from"] == {"all_to_all": 4 << 10}
    assert table["cma_gap"] == {"all_to_all": [256 << 10, 2 << 20]}
    ph = table["phased"]
    assert ph["slow_modelled"] is True
    assert ph["fast"] == {"cma_from": {"all_to_all": 4 << 10},
                          "cma_gap": {"all_to_all": [256 << 10, 2 << 20]}}
    assert ph["slow"] == {"cma_from": {"all_to_all": 4 << 10}, "cma_gap": {}}
    # too few pairs for a band (2 a phase, one phase: 4 at each size)
    few = crossovers.first_job_table(_merged(ratios, ratios, probes_slow=50.0, pairs=2,
                                             sizes=sizes), defaults)
    assert few["cma_from"] == {"all_to_all": 4 << 10} and few["cma_gap"] == {}
    # both phases measured: each phase's own band (the slow phase's banks lose everywhere)
    both = crossovers.first_job_table(_merged(ratios, [0.3] * 6, sizes=sizes), defaults)
    assert both["phased"]["fast"]["cma_gap"] == {"all_to_all": [256 << 10, 2 << 20]}
    assert both["phased"]["slow"]["cma_gap"] == {}


def test_pairs_in_two_placements_weigh_the_worse_for_each_candidate():
    """Gather of 64 KiB blocks on the 2-core VM: single copies at 0.55x the banks' time with rank 0
    on the first core, 1.5x with it on the second.  A candidate's loss is taken in the placement
    where it does worst (as the phases'), so the size's log ratio is log 1.5 - log(1 / 0.55):
    single copies, which lose less; where both placements agree, the one further from a tie."""
    lr = [math.log(0.55)] * 6 + [math.log(1.5)] * 6
    places = [0] * 6 + [1] * 6
    assert abs(crossovers._placed_log(lr, places) - (math.log(1.5) + math.log(0.55))) < 1e-12
    # the crossover on the scalar agrees with the one on both placements' times
    rows = [(64 << 10, (1.0, 1.0), (0.55, 1.5))]
    scalar = [(64 << 10, 1.0, math.exp(crossovers._placed_log(lr, places)))]
    assert crossovers.crossover(rows) == crossovers.crossover(scalar) == 64 << 10
    assert crossovers._placed_log([math.log(1.2)] * 3 + [math.log(1.9)] * 3, [0] * 3 + [1] * 3) \
        == math.log(1.9)
    assert crossovers._placed_log([-0.1, -0.5, -0.3], [None] * 3) == -0.3   # one placement: median
    # merged over jobs, the placements travel with the pairs (an older file's pairs: None)
    new = {"kinds": {"gather": [(65536, 10.0, 10.0)]}, "ratios": {"gather": [[65536, lr]]},
           "pair_places": {"gather": [[65536, places]]}}
    old = {"jobs": 1, "ratios": {"gather": [[65536, [0.0, 0.0]]]}}
    out = crossovers.merge_paired(new, old)
    assert out["pair_places"]["gather"] == [[65536, [None, None] + places]]
    (_, a, b), = out["kinds"]["gather"]
    assert abs(b / a - math.exp(crossovers._placed_log([0.0, 0.0] + lr, [None, None] + places))) \
        < 1e-12


def _job_places(rank, world_size):
    import pyddp.distributed as dist
    from pyddp.distributed.backends.cpu import crossovers

    before = os.sched_getaffinity(0)
    dist.init_process_group("cpu")
    cpg = dist.distributed_c10d._world.default_pg._cpg
    res = crossovers._paired(cpg, ["gather"], [4 << 10], 6, 16 << 20, True)
    out = {"places": res["pair_places"]["gather"], "same": os.sched_getaffinity(0) == before,
           "threads": all(os.sched_getaffinity(int(t)) == before
                          for t in os.listdir("/proc/self/task"))}
    dist.destroy_process_group()
    return out


def test_first_jobs_measure_both_placements_and_restore_the_affinity():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two placements need a core for each of 2 ranks")
    outs = run(_job_places, 2, timeout=120, init=False, env={"PYDDP_TUNING": "0"})
    for r in outs:
        assert r["places"] == [[4096, [0] * 3 + [1] * 3]]
        assert r["same"] and r["threads"]


def test_merged_pairs_keep_their_probes():
    rows = [(4096, 2.0, 4.0)]
    new = {"kinds": {"all_reduce": rows}, "ratios": {"all_reduce": [[4096, [0.7, 0.7]]]},
           "pair_probes": {"all_reduce": [[4096, [300.0, 300.0]]]}}
    # an earlier job's pairs with probes, and one from an older version without them
    old = {"jobs": 1, "ratios": {"all_reduce": [[4096, [-1.0, -1.0, -1.0]]]},
           "pair_probes": {"all_reduce": [[4096, [50.0, 50.0]]]}}
    out = crossovers.merge_paired(new, old)
    assert out["ratios"]["all_reduce"] == [[4096, [-1.0, -1.0, -1.0, 0.7, 0.7]]]
    assert out["pair_probes"]["all_reduce"] == [[4096, [None, 50.0, 50.0, 300.0, 300.0]]]
    older = {"jobs": 1, "ratios": {"all_reduce": [[4096, [-1.0]]]}}
    out = crossovers.merge_paired(new, older)
    assert out["pair_probes"]["all_reduce"] == [[4096, [None, 300.0, 300.0]]]


def test_first_jobs_that_ran_in_different_phases_leave_rules_for_each(tmp_path):
    """Three first jobs, the second in the slow phase (its probe held at 400 ns, the others' at 50):
    the file gets each phase's rules with the threshold between them, and the next job's group
    switches between them at run time (its slow rules are the file's); results stay exact."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("the phase probe needs a core for each of 2 ranks")
    path = _path_for(tmp_path)
    for ns in ("50", "400", "50"):
        outs = run(_job, 2, timeout=120, init=False, env=_env(tmp_path, PYDDP_TEST_PHASE_NS=ns))
        assert [r["bad"] for r in outs] == [[], []]
        assert outs[0]["rules"] == outs[1]["rules"]
    if not outs[0]["single_copy"]:
        pytest.skip("single copies (cross-memory attach) are not possible here: nothing to choose")
    doc = tuning.load(path)
    assert doc["jobs"] == {"2": 3}
    ph = doc["phased"]["2"]
    assert ph["phase_ns"] == 62.5 and set(ph) == {"fast", "slow", "phase_ns"}
    probes = doc["measured"]["2"][0]["pair_probes"]
    assert all(sorted(set(v)) == [50.0, 400.0] for rows in probes.values() for _, v in rows)
    outs = run(_job, 2, timeout=120, init=False, env=_env(tmp_path))
    assert [r["bad"] for r in outs] == [[], []]
    for r in outs:
        assert r["phase_ns"] == 62.5
        slow, fast = r["slow"][0], r["rules"][0]
        for kind, code in tuning.KIND_NAMES.items():
            if kind in ph["slow"]["cma_from"]:
                assert _norm(slow[code]) == _kept(ph["slow"], kind), (kind, slow[code])
            if kind in ph["fast"]["cma_from"]:
                assert _norm(fast[code]) == _kept(ph["fast"], kind), (kind, fast[code])
