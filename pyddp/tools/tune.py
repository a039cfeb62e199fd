"""Measure this host's crossovers of algorithm choice and write the rules file groups read.

    python -m pyddp.tools.tune                 # 2 ranks (and 4 with --nproc 2,4); writes the file
    python -m pyddp.tools.tune --show          # the file in force and the rules a group applies
    python -m pyddp.tools.tune --quick --out rules.json

pyddp's C core picks, per collective kind and size, between two ways on one host (the shared
banks, or single copies between the ranks' own buffers: cross-memory attach) and two over TCP (the
direct algorithms, or the rings and the chain).  Which is faster where depends on the host: cache
sizes, memory bandwidth, what ``process_vm_readv`` costs, how many ranks share the cores.  The
built-in crossovers were measured on one machine; this tool runs both candidates of every kind at
every size on this one, with the ranks it is asked for, and writes where each starts to win.

The cost model, in a paragraph: a bank transfer costs two copies through a small shared window
(fast while the message stays in cache, then bound by memory bandwidth twice over) and one sync per
window; a single copy costs one copy at the speed of ``process_vm_readv`` (page pinning, a third
of memcpy in cache here) plus two syncs, whatever the size.  So single copies win from the size at
which the second copy costs more than pinning, which moves with the cache size and the number of
ranks reading at once.  Over TCP, the direct algorithms send every rank's whole message to every
peer in one round (latency-optimal: one round trip), the rings send 1/n of it n-1 times
(bandwidth-optimal); the crossover is where the extra bytes cost more than the extra round trips.

Shared memory is measured as the first jobs of a host measure it (``--pairs``, 24 by default): the
two candidates of each size back to back in pairs of calls, the order alternating, in both
placements of the ranks on the cores where each rank has one, the probe of the machine's phase
before each size; the rules are the first jobs' (``crossovers.first_job_table``: the pairs' median
ratio per size, gaps, each phase's rules, measured where the pairs saw both phases, modelled where
they saw one).  A machine whose speed moves from one moment to the next moves it for both calls of
a pair alike.  ``--pairs 0`` measures shared memory in rounds, as TCP always is:

Timing: every rank runs each candidate in turn (alternating, round by round, so that drift hits
both), a barrier before every timed call; a call's time is the slowest rank's (an all_reduce MAX of
the ranks' times) and a candidate's time at a size is the median over calls and rounds.  A round is
one pass over every collective and size, so that the rounds of a size are spread over the whole
measurement rather than taken back to back.  The sizes are 2x apart (``--step``); the rule for a
kind is the threshold (a measured size, or never) that loses the least over all measured sizes, a
size's loss being log(time taken / the faster one's time) (``crossover``): where the second
candidate wins from some size on and loses below it, that size; one noisy size does not move it.
On shared memory a tie within 20% counts as a win for single copies, whose speed does not follow
the machine's phase (SHM_TIE says why), unless both phases were measured (below).

Phases: before each round rank 0 measures how fast a cache line crosses between two cores (a 10 ms
``pyddp._C.probe_handoff`` while the other ranks sleep).  On a machine that switches between a fast
and a slow phase while it is measured, each candidate gets a time per phase (``phase_times``), and a
size's loss is the one of the phase where it is larger (``crossover``): a candidate 1.5x ahead in the
fast phase and 4x behind in the slow one loses, whatever share of the rounds each phase had (that
share follows the hour more than the machine: on the docs' VM a quarter of the rounds one morning,
nearly all of them the next).  With each phase in at least a tenth of the rounds the phases decide
alone (no tie).  The tuner prints each phase's times, or where one phase was seen, the medians.
Where the slow phase had enough rounds, each phase also gets rules of its own, which a group
switches between at run time on the same probe; the slow phase's take over from 1.25x the fast
rounds' highest probe (``crossovers.switch_ns``): the banks' time follows the probe all the way,
so the fast rules hold only near the probes they were measured at.
Phases can last minutes, longer than one run: ``--merge`` adds a run's rounds to those the file
already holds, so runs at different times add up.  With or without it, the rank counts a run does
not measure keep the rules this host's file (or ``--out``'s) has for them: ``--nproc 4`` after
``--nproc 2`` leaves the file with both.
Every rank of a group applies rank 0's rules (backends.cpu.tuning), so the choice is the same everywhere.

Online: ``online()`` (or ``PYDDP_TUNING_ONLINE=1`` at ``init_process_group``) measures the same
candidates on the running job's default group and applies the crossovers to it, agreed the same way
(every call's time the slowest rank's; rank 0's rules broadcast), without writing a file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time

from pyddp.distributed.backends.cpu import crossovers as _crossovers
from pyddp.distributed.backends.cpu.crossovers import (  # noqa: F401  (crossover: API)
    _NEVER_SMALL, _SHM_KINDS, SHM_TIE, SLOW_FACTOR, _both_phases, _measure, _phase_loss, _table,
    _tie, crossover, phase_times, phased)

__all__ = ["main", "crossover", "handoff", "online", "merge_rounds", "weigh_phases", "SHM_TIE"]


def online(kinds=None, min_bytes=16 << 10, max_bytes=16 << 20, rounds=2, iters=10,
           budget_bytes=256 << 20):
    """Tune the default process group's algorithm choice in the job itself, on its own ranks: every
    rank calls it after ``init_process_group``.  For each collective of ``kinds`` (default: all) both
    candidates are timed from ``min_bytes`` to ``max_bytes`` (x4 apart), ``rounds`` alternations of
    at most ``iters`` calls, each call's time the slowest rank's; rank 0's crossovers are then
    broadcast and every rank applies the same rules to the group for its lifetime (nothing is
    written: ``python -m pyddp.tools.tune`` writes the file later groups read).  Returns
    {"cma_from": {kind: bytes or None}, "cma_gap": {kind: [lo, hi]}, "small_bytes": {kind: bytes}}
    (None: never; a gap: the banks again in [lo, hi) above the threshold); {} for one rank.
    """
    import pyddp.distributed as dist

    pg = dist.distributed_c10d._world.default_pg
    if pg is None:
        raise RuntimeError("pyddp.tools.tune.online: call init_process_group first")
    cpg = pg._cpg
    if cpg is None or not hasattr(cpg, "set_rules"):
        raise RuntimeError(f"pyddp.tools.tune.online: the default group's backend {pg._backend!r} "
                           "has no rules of algorithm choice (backend 'cpu' has)")
    return _crossovers.online(cpg, kinds, min_bytes, max_bytes, rounds, iters, budget_bytes)


def _parse_bytes(text):
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        v = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 4K or 64M, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0, got {text!r}")
    return v


def _fmt(n):
    if n is None:
        return "never"
    for unit, s in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << s and n % (1 << s) == 0:
            return f"{n >> s}{unit}"
    return str(n)


# ------------------------------------------------------------------------------------- phases

def weigh_phases(res, slow_factor=SLOW_FACTOR):
    """The rows of one measurement (``res["kinds"]``: kind -> [(size, a, b)]) recomputed as the
    time each candidate is expected to take over the machine's phases, from the per-round data
    (``res["rounds"]``, split by ``phase_times``): (1 - p) x its fast-phase time + p x its
    slow-phase time, p being the fraction of slow rounds in the whole measurement.  These are the
    times the tuner prints; the rules take each phase's times (``_table``).  Returns (rows by kind,
    info); rows are ``res["kinds"]`` unchanged when the measurement stayed in one phase."""
    by_phase, info = phase_times(res, slow_factor)
    p = info.get("slow_fraction")
    if p is not None:
        info["slow_fraction"] = round(p, 3)
    if by_phase is None:
        return res["kinds"], info
    out = {}
    for kind, rows in res["kinds"].items():
        split = {size: (a, b) for size, a, b in by_phase.get(kind, [])}
        new = []
        for size, a, b in rows:
            if size in split:
                (af, asl), (bf, bsl) = split[size]
                a, b = (1 - p) * af + p * asl, (1 - p) * bf + p * bsl
            new.append((size, a, b))
        out[kind] = new
    return out, info


def merge_rounds(res, old):
    """``res`` (one measurement: its ``"rounds"``) with the rounds of ``old`` (an earlier measurement
    of the same rank count and path, from a rules file's ``"measured"``) added at every collective
    and size the two share; each candidate's time at a size becomes the median of its rounds' times
    over both.  A collective this run did not measure (``--kinds``) keeps the earlier measurement.
    Returns the number of rounds added (0: ``res`` unchanged).

    On a machine that changes phase for minutes at a time, one run of the tuner may see only one
    phase; ``--merge`` runs add up, so that ``weigh_phases`` weighs the phases over all of them."""
    from statistics import median as med

    if not old or old.get("path") != res.get("path") or old.get("ranks") != res.get("ranks"):
        return 0
    # rounds probed another way (files of older versions: probe_handoff's threads, not the
    # run-time probe) keep their times but not their probes, which classify in other units
    keep = old.get("probe", "handoff") == res.get("probe", "handoff")
    earlier = {(kind, size): [[r[0] if keep else None] + list(r[1:]) for r in rs]
               for kind, v in (old.get("rounds") or {}).items() for size, rs in v}
    added = 0
    for kind, v in (res.get("rounds") or {}).items():
        rows = []
        for (size, rs), row in zip(v, res["kinds"][kind]):
            more = [list(r) for r in earlier.get((kind, size), []) if len(r) == 3]
            if more:
                rs.extend(more)
                added += len(more)
                row = (size, med(r[1] for r in rs), med(r[2] for r in rs))
            rows.append(row)
        res["kinds"][kind] = rows
    # collectives this run did not measure (--kinds) keep the earlier measurement as it was
    plain = old.get("median_rows") or old.get("kinds") or {}  # (before weigh_phases)
    for kind, rows in plain.items():
        if kind not in res["kinds"] and kind in (old.get("rounds") or {}):
            res["kinds"][kind] = [tuple(r) for r in rows]
            res.setdefault("rounds", {})[kind] = [[size, earlier[(kind, size)]]
                                                  for size, _ in old["rounds"][kind]]
            added += sum(len(rs) for _, rs in old["rounds"][kind])
    return added


# ------------------------------------------------------------------------------------- worker

def _worker(args):
    import pyddp.distributed as dist
    from pyddp import _config

    dist.init_process_group("cpu", init_method="env://")
    cpg = dist.distributed_c10d._world.default_pg._cpg
    path = "tcp" if _config.get("PYDDP_TRANSPORT") == "tcp" else "shm"
    if args.pairs and path == "shm":
        # as the first jobs measure (pairs of calls, both placements where each rank has a core)
        n = dist.get_world_size()
        result = _crossovers._paired(
            cpg, list(args.kinds), _crossovers._sizes(args.min_bytes, args.max_bytes, args.step),
            args.pairs, args.budget_bytes, phases=n <= len(os.sched_getaffinity(0)))
        result["defaults"] = [list(v) if isinstance(v, tuple) else v for v in cpg.rules[0]]
    else:
        result = _measure(cpg, path, args.kinds, args.min_bytes, args.max_bytes, args.rounds,
                          args.iters, args.budget_bytes, step=args.step)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(args.worker_out, "w", encoding="utf-8") as f:
            json.dump(result, f)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------- parent

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(n, path, args, tmp):
    """Run the workers of one measurement (``n`` ranks, ``path`` 'shm' or 'tcp'); their result."""
    out = os.path.join(tmp, f"{path}-{n}.json")
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(n),
               LOCAL_WORLD_SIZE=str(n), PYDDP_SECRET=secrets.token_hex(16), PYDDP_TUNING="0")
    env.pop("PYDDP_CMA_THRESHOLD", None)  # it would override every rule measured
    env.pop("PYDDP_TUNING_FILE", None)
    if path == "tcp":
        env["PYDDP_TRANSPORT"] = "tcp"
    else:
        env.pop("PYDDP_TRANSPORT", None)
    cmd = [sys.executable, "-m", "pyddp.tools.tune", "--worker-out", out,
           "--kinds", ",".join(args.kinds), "--min-bytes", str(args.min_bytes),
           "--max-bytes", str(args.max_bytes), "--step", str(args.step),
           "--rounds", str(args.rounds), "--pairs", str(args.pairs),
           "--iters", str(args.iters), "--budget-bytes", str(args.budget_bytes)]
    procs = []
    for r in range(n):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + args.timeout
    logs = []
    failed = False
    for p in procs:
        try:
            o, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, _ = p.communicate()
            failed = True
            logs.append(f"timed out after {args.timeout:.0f} s\n")
        logs.append(o.decode(errors="replace"))
        failed = failed or p.returncode != 0
    if failed or not os.path.exists(out):
        raise RuntimeError(f"tune: the {n}-rank {path} measurement failed:\n" +
                           "\n".join(x[-2000:] for x in logs if x))
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def handoff(seconds=0.2):
    """How fast data crosses between two cores right now: (one-way handoff of a cache line in ns,
    GB/s of 1 MiB handed over through shared memory), from ``pyddp._C.probe_handoff``; None on one
    core.  On some virtual machines it changes while a job runs (the host moves the virtual CPUs
    between cores that share a cache and cores that do not), and every collective between ranks
    changes with it: the tuner and the benchmarks print it beside what they measure."""
    if (os.cpu_count() or 1) < 2:
        return None
    from pyddp import _C

    try:
        return _C.probe_handoff(seconds)
    except RuntimeError:  # no complete round: no second thread, or out of memory
        return None


def _now_handoff():
    p = handoff()
    return f"{p[0]:.0f} ns" if p else "not measured"


def _phase_note(probes):
    """A warning when data crossed between cores much slower at some point of the tuning than at
    another: on some virtual machines the host moves the virtual CPUs between cores that share a
    cache and cores that do not, for minutes at a time, and every collective slows with it (2-core
    VM: a 1 MiB all_reduce 98 us in one phase, 500 us in the other); rules measured across both
    phases compare candidates measured in different ones.  '' when the probes agree."""
    ns = [x for p in probes for x in (p["before"][0], p["after"][0])]
    if len(ns) < 2 or max(ns) <= 2 * min(ns):
        return ""
    return (f"the machine changed phase while tuning: a cache line crossed between cores in "
            f"{min(ns):.0f} ns at one point and {max(ns):.0f} ns at another (see 'between cores' "
            "above); candidates are alternated round by round, so each size compares both in "
            "similar conditions, but rerun the tuner to check the rules")


def _print_rows(n, res, out):
    a_name, b_name = ("banks", "single copy") if res["path"] == "shm" else ("direct", "ring")
    by_phase = phase_times(res)[0] if _both_phases(res) else None
    for kind, rows in res["kinds"].items():
        split = by_phase.get(kind) if by_phase else None
        if split and len(split) == len(rows):
            # the rule reads each phase's times: show them, and which way the worse phase goes
            print(f"  {n} ranks, {res['path']}, {kind}: {a_name} us fast/slow phase, {b_name} us "
                  "fast/slow phase", file=out)
            for size, a, b in split:
                best = (min(a[0], b[0]), min(a[1], b[1]))
                mark = "  <-" if _phase_loss(b, best) < _phase_loss(a, best) else ""
                print(f"    {_fmt(size):>6}  {a[0]:10.1f} {a[1]:10.1f}  {b[0]:10.1f} {b[1]:10.1f}"
                      f"{mark}", file=out)
            continue
        print(f"  {n} ranks, {res['path']}, {kind}: {a_name} us / {b_name} us", file=out)
        tie = _tie(res)
        for size, a, b in rows:
            mark = "  <-" if b < a else "  <= (a tie: single copies)" if b < a * (1 + tie) else ""
            print(f"    {_fmt(size):>6}  {a:10.1f}  {b:10.1f}  x{a / b:5.2f}{mark}", file=out)


def _add_paired(doc, n, results):
    """A shared-memory measurement in pairs (``--pairs``) decides the single-copy rules of ``n``
    ranks as the first jobs' do (``crossovers.first_job_table``: gaps, each phase's rules, measured
    or modelled), into ``doc``; True where there was one."""
    shm = [r for r in results if isinstance(r, dict) and r.get("how") == "pairs"]
    if not shm:
        return False
    defaults = [tuple(v) if isinstance(v, list) else v for v in shm[0].get("defaults") or []]
    t = _crossovers.first_job_table(shm[0], defaults)
    doc["tables"][str(n)]["cma_from"] = t["cma_from"]
    doc["tables"][str(n)]["cma_gap"] = t.get("cma_gap") or {}
    if t.get("phased"):
        doc.setdefault("phased", {})[str(n)] = t["phased"]
    return True


def _add_phased(doc, n, results):
    """The phases' rules of ``n`` ranks into ``doc["phased"]`` where its shared-memory measurement
    saw both phases, classified by the run-time probe (``phased``): the fast phase's single-copy
    rules, the slow phase's, and the probe's threshold between them; printed too."""
    shm = [r for r in results if isinstance(r, dict) and r.get("path") == "shm"]
    if not shm or not phased(shm[0]):
        return
    fast, slow = (_table(shm, phase=k) for k in (0, 1))
    ph = {"fast": {"cma_from": fast["cma_from"], "cma_gap": fast["cma_gap"]},
          "slow": {"cma_from": slow["cma_from"], "cma_gap": slow["cma_gap"]},
          "phase_ns": shm[0]["phases"].get("switch_ns") or shm[0]["phases"]["slow_above_ns"]}
    doc.setdefault("phased", {})[str(n)] = ph
    print(f"  {n} ranks: rules of their own for each phase (slow: the probe over "
          f"{ph['phase_ns']:.0f} ns): single copies from " + ", ".join(
              f"{k} {_fmt(v)} / {_fmt(slow['cma_from'].get(k))}"
              for k, v in fast["cma_from"].items()), flush=True)


def show(out=sys.stdout, size=None):
    """Print the rules file in force and the rules a group applies (``--show``)."""
    from pyddp import _C, _config
    from pyddp.distributed.backends.cpu import tuning

    path, explicit = tuning.path_in_force()
    print(f"host: {json.dumps(tuning.host_facts())}", file=out)
    print(f"this host's file: {tuning.default_path()}", file=out)
    if path is None:
        why = "PYDDP_TUNING=0" if not _config.get("PYDDP_TUNING") else \
            "no rules file for this host (python -m pyddp.tools.tune writes one)"
        print(f"rules in force: the built-in constants ({why})", file=out)
        doc = None
    else:
        doc = tuning.load(path)
        print(f"rules in force: {path}" + (" (PYDDP_TUNING_FILE)" if explicit else ""), file=out)
        print(f"  written {doc.get('created', '?')} by pyddp {doc.get('pyddp', '?')} on "
              f"{json.dumps(doc.get('host', {}))}", file=out)
        probes = (doc.get("measured") or {}).get("handoff") or []
        ns = [x for p in probes for x in (p["before"][0], p["after"][0])]
        if ns:
            print(f"  a cache line crossed between cores in {min(ns):.0f}-{max(ns):.0f} ns while "
                  f"it was measured (now: {_now_handoff()})", file=out)
        if doc.get("merged"):
            print(f"  with the rounds of earlier runs (--merge): {', '.join(map(str, doc['merged']))}",
                  file=out)
        for n, results in sorted((doc.get("measured") or {}).items()):
            for res in results if isinstance(results, list) else []:
                ph = res.get("phases") if isinstance(res, dict) else None
                if ph and ph.get("phases") == 2:
                    how = ("each phase's times decide, the worse phase per size" if _both_phases(res)
                           else "times weighed by that share")
                    print(f"  {n} ranks over {res.get('path')}: {ph['slow_fraction']:.0%} of the "
                          f"rounds in the slow phase; {how}", file=out)
        if (doc.get("measured") or {}).get("phase_note"):
            print(f"  note: {doc['measured']['phase_note']}", file=out)
    sizes = [size] if size else sorted({2, 4} | {int(k) for k in (doc or {}).get("tables", {})})
    def cell(c):
        return ("never" if c is None else
                f"{_fmt(c[0])}, banks {_fmt(c[1])}-{_fmt(c[2])}" if isinstance(c, tuple) else
                _fmt(c) if c else "default")

    for n in sizes:
        enc = tuning.encode(n, n)
        rules = tuning.decode(enc) or ([0] * _C.NKINDS, [0] * _C.NKINDS)
        cma, small = rules[:2]
        slow = rules[2] if len(rules) == 4 else None
        print(f"a group of {n} ranks:" + ("" if enc else " built-in constants"), file=out)
        head = "single copies from"
        if slow is not None:
            print(f"  the machine's phases: from the collective after rank 0's probe of the "
                  f"handoff between ranks 0 and 1 exceeds {rules[3]:.0f} ns, the slow phase's "
                  "rules (ranks sharing cores: the table for both phases)", file=out)
            ph = tuning.phased_for(doc, n, n) if doc else None
            if ph and ph.get("slow_modelled"):
                print("  (the first jobs saw one phase: the slow phase's rules are modelled, the "
                      "banks taken to slow down with the probe, single copies not)", file=out)
            head = "single copies (fast phase / slow phase) from"
        print(f"  {'collective':<16}{head:>{max(20, len(head) + 2)}}{'direct over TCP up to':>24}",
              file=out)
        for kind in tuning.KIND_NAMES:
            code = _C.KINDS[kind]["code"]
            c = cell(cma[code]) + (f" / {cell(slow[code])}" if slow is not None else "")
            s = small[code]
            s = ("always" if s >= _NEVER_SMALL else _fmt(s)) if s else "default"
            print(f"  {kind:<16}{c:>{max(20, len(head) + 2)}}{s:>24}", file=out)
    print("(default: the built-in constants of csrc/coll/rules.c: single copies from 32M for "
          "all_reduce, 1M for broadcast and 16M for gather and scatter, never for the others; direct up to 64K)",
          file=out)


def main(argv=None):
    """The command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m pyddp.tools.tune", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--show", action="store_true", help="print the rules in force and exit")
    ap.add_argument("--nproc", default="2",
                    help="comma-separated rank counts to measure (default 2; e.g. 2,4)")
    ap.add_argument("--kinds", default=",".join(_SHM_KINDS),
                    help="comma-separated collectives (default: all)")
    ap.add_argument("--min-bytes", type=_parse_bytes, default=_parse_bytes("4K"))
    ap.add_argument("--max-bytes", type=_parse_bytes, default=_parse_bytes("64M"))
    ap.add_argument("--step", type=int, choices=(2, 4), default=2,
                    help="size multiplier between measured sizes (default 2: a crossover found "
                         "within a factor of 2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternations of the candidates over TCP (and shared memory with "
                         "--pairs 0): passes over every collective and size, so that a size's "
                         "rounds are spread over the whole measurement")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per round (at most)")
    ap.add_argument("--pairs", type=int, default=24,
                    help="shared memory: measure as the first jobs of a host do, in this many "
                         "pairs of calls per size at most (the two ways back to back, both "
                         "placements of the ranks on the cores where each has one), the rules "
                         "with gaps and each phase's (default 24; 0: rounds, as TCP)")
    ap.add_argument("--budget-bytes", type=_parse_bytes, default=_parse_bytes("1G"),
                    help="cap on calls x bytes per size, which keeps large sizes short")
    ap.add_argument("--no-tcp", action="store_true", help="skip the TCP crossovers")
    ap.add_argument("--quick", action="store_true",
                    help="4K to 1M, one round of 5 calls (3 pairs on shared memory): a check that "
                         "it works, not a tuning")
    ap.add_argument("--out", help="where to write (default: this host's file, --show says where)")
    ap.add_argument("--merge", action="store_true",
                    help="add this run's pairs (or rounds) to those the file (--out, or this "
                         "host's) already holds, for the same rank counts and collectives, before "
                         "choosing: runs at different times add up, so a machine that changes "
                         "phase is measured in both phases (rank counts a run does not measure "
                         "keep their rules with or without it)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in args.kinds if k not in _SHM_KINDS]
    if bad:
        ap.error(f"--kinds: unknown collective(s) {', '.join(bad)} (expected "
                 f"{', '.join(_SHM_KINDS)})")
    if args.quick:
        args.max_bytes, args.rounds, args.iters = min(args.max_bytes, 1 << 20), 1, 5
        args.pairs = min(args.pairs, 3)
    if args.pairs < 0:
        ap.error("--pairs: expected a count of at least 0")
    if args.worker_out:
        return _worker(args)
    if args.show:
        show()
        return 0
    try:
        counts = sorted({int(x) for x in args.nproc.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--nproc: expected rank counts like 2 or 2,4, got {args.nproc!r}")
    if not counts or counts[0] < 2:
        ap.error("--nproc: every rank count must be at least 2")
    if args.min_bytes > args.max_bytes:
        ap.error("--min-bytes is larger than --max-bytes")

    import pyddp
    from pyddp.distributed.backends.cpu import tuning

    facts = tuning.host_facts()
    doc = {"format": tuning.FORMAT, "host": facts,
           "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "pyddp": pyddp.__version__, "tables": {}, "measured": {}}
    probes = doc["measured"]["handoff"] = []
    # The file this run replaces: with --merge its measurements add up with this run's; either
    # way the rank counts this run does not measure keep their rules (a run for 4 ranks must not
    # throw away the tuning of 2).  Another host's file, or one that does not load, keeps nothing.
    earlier = None
    where = args.out or tuning.default_path(facts)
    if os.path.exists(where):
        try:
            earlier = tuning.load(where)
        except ValueError as e:
            print(f"{e}: replaced, nothing of it kept", flush=True)
        if earlier is not None and earlier.get("host") != facts:
            print(f"{where} was measured on another host ({earlier.get('host')}): "
                  + ("not merged" if args.merge else "replaced, nothing of it kept"), flush=True)
            earlier = None
    elif args.merge:
        print(f"--merge: no file at {where} yet; this run starts it", flush=True)
    merged = earlier if args.merge else None
    with tempfile.TemporaryDirectory(prefix="pyddp-tune-") as tmp:
        for n in counts:
            results = []
            for path in ("shm",) if args.no_tcp else ("shm", "tcp"):
                t0 = time.monotonic()
                probe = handoff()
                print(f"measuring {n} ranks over {path} ..." +
                      (f" (between cores: {probe[0]:.0f} ns, {probe[1]:.1f} GB/s)" if probe else ""),
                      flush=True)
                res = _launch(n, path, args, tmp)
                if res.get("how") == "pairs":
                    old = [m for m in (merged or {}).get("measured", {}).get(str(n), [])
                           if isinstance(m, dict) and m.get("how") == "pairs"]
                    if old:
                        res = _crossovers.merge_paired(res, old[0])
                        print(f"  merged the pairs of the file's earlier measurement "
                              f"({merged.get('created', '?')})", flush=True)
                    _print_rows(n, res, sys.stdout)
                    print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
                    results.append(res)
                    continue
                if merged is not None:
                    old = [m for m in merged.get("measured", {}).get(str(n), [])
                           if isinstance(m, dict) and m.get("path") == path]
                    added = merge_rounds(res, old[0] if old else None)
                    if added:
                        print(f"  merged {added} rounds of the file's earlier measurement "
                              f"({merged.get('created', '?')})", flush=True)
                res["median_rows"] = res["kinds"]
                res["kinds"], res["phases"] = weigh_phases(res)
                if res["phases"]["phases"] == 2:
                    how = ("each candidate's times in the fast and the slow phase below; the worse "
                           "phase decides each size" if _both_phases(res) else
                           "each candidate's time below is its expected time over both phases")
                    print(f"  the machine changed phase during it: {res['phases']['slow_fraction']:.0%} "
                          f"of the rounds slow (probe over {res['phases']['slow_above_ns']:.0f} ns); "
                          f"{how}", flush=True)
                after = handoff()
                if probe and after:
                    probes.append({"ranks": n, "path": path, "before": probe, "after": after})
                _print_rows(n, res, sys.stdout)
                print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
                results.append(res)
            if merged is not None:
                # a path not measured this time (--no-tcp) keeps the file's measurement
                done = {r["path"] for r in results}
                results += [m for m in merged.get("measured", {}).get(str(n), [])
                            if isinstance(m, dict) and m.get("path") not in done
                            and isinstance(m.get("kinds"), dict)]
            doc["tables"][str(n)] = _table(results)
            doc["measured"][str(n)] = results
            _add_paired(doc, n, results) or _add_phased(doc, n, results)
    if earlier is not None:
        # rank counts not measured this time keep the file's measurements, their tables worked
        # out again by the rule in force now
        for n, t in (earlier.get("tables") or {}).items():
            if n not in doc["tables"]:
                kept = earlier.get("measured", {}).get(n)
                if isinstance(kept, list) and kept:
                    doc["measured"][n] = kept
                    doc["tables"][n] = _table(kept)
                    _add_paired(doc, int(n), kept) or _add_phased(doc, int(n), kept)
                else:  # a table without its measurement: kept as it is, its phases too
                    doc["tables"][n] = t
                    phases = (earlier.get("phased") or {}).get(n)
                    if phases is not None:
                        doc.setdefault("phased", {})[n] = phases
                print(f"kept the rules of {n} ranks from {where} ({earlier.get('created', '?')})",
                      flush=True)
    if merged is not None:
        doc["merged"] = list(merged.get("merged") or []) + [merged.get("created")]
    phase = _phase_note(probes)
    if phase:
        doc["measured"]["phase_note"] = phase
        print(f"warning: {phase}", flush=True)
    tuning.validate(doc)
    out = args.out or tuning.default_path(facts)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, out)
    print(f"wrote {out}")
    for n, t in doc["tables"].items():
        print(f"  {n} ranks: single copies from " + ", ".join(
            f"{k} {_fmt(v)}" for k, v in t["cma_from"].items()))
        if t.get("cma_gap"):
            print(f"  {n} ranks: but the banks in " + ", ".join(
                f"{k} [{_fmt(lo)}, {_fmt(hi)})" for k, (lo, hi) in t["cma_gap"].items()))
        if t["small_bytes"]:
            print(f"  {n} ranks: direct over TCP up to " + ", ".join(
                f"{k} {'always' if v >= _NEVER_SMALL else _fmt(v)}"
                for k, v in t["small_bytes"].items()))
    from pyddp import _config

    if args.out and not _config.get("PYDDP_TUNING_FILE"):
        print(f"groups read it with PYDDP_TUNING_FILE={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
