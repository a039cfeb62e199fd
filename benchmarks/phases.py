"""The phases' rules against the table made for both phases, in the same processes, batch by batch.

    python benchmarks/phases.py                      # 2 ranks, about 3 minutes
    python benchmarks/phases.py --minutes 10 --ops all_gather,broadcast --sizes 8K,16K,32K,1M

On a machine whose speed between cores changes for minutes at a time (the machine's phases in
docs/benchmarks.md) the tuner writes single-copy rules for each phase beside the table made for
both, and a group switches between them at run time after its probe (ranks 0 and 1 handing a cache
line back and forth). This measures what that gives: the ranks (started here by pyddp's launcher)
run batches of each collective and size with the two configurations alternating, the phases' rules
(the fast and the slow table, switching) and the table for both phases (no switching), for as long
as asked; before each pair of batches rank 0 probes the handoff the same way the group does, so
every pair is filed under the phase it ran in. A batch's time per call is the slowest rank's batch
time over its calls. The table gives, per phase, collective and size, the median time of each
configuration and their ratio (> 1: the phases' rules faster), with the number of pairs; results are
checked against NumPy first.

Needs a rules file with the phases' rules for the rank count (python -m pyddp.tools.tune, where it saw
both phases; --show says): says so and exits 0 without one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _report  # noqa: E402
from pyddp.tools.tune import _parse_bytes as parse_bytes  # noqa: E402

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "gather", "scatter",
       "all_to_all")


def fmt_size(n):
    for unit, s in (("M", 20), ("K", 10)):
        if n >= 1 << s and n % (1 << s) == 0:
            return f"{n >> s}{unit}"
    return str(n)


def _op(dist, kind, rank, n, count):
    """(run one call, check it against NumPy) for ``kind`` of ``count`` float32 per rank's block."""
    base = [np.arange(count, dtype=np.float32) % 89 + r for r in range(n)]
    a = base[rank].copy()
    if kind == "all_reduce":
        def run():
            a[:] = base[rank]
            dist.all_reduce(a)
        return run, lambda: np.array_equal(a, sum(base))
    if kind == "reduce":
        def run():
            a[:] = base[rank]
            dist.reduce(a, dst=0)
        return run, lambda: rank != 0 or np.array_equal(a, sum(base))
    if kind == "broadcast":
        return (lambda: dist.broadcast(a, src=0)), lambda: np.array_equal(a, base[0])
    if kind == "all_gather":
        out = np.empty(count * n, dtype=np.float32)
        return ((lambda: dist.all_gather_into_tensor(out, a)),
                lambda: np.array_equal(out, np.concatenate(base)))
    if kind == "reduce_scatter":
        big = np.concatenate(base)
        return ((lambda: dist.reduce_scatter_tensor(a, big)),
                lambda: np.array_equal(a, n * big[rank * count:(rank + 1) * count]))
    if kind == "gather":
        lst = [np.empty(count, dtype=np.float32) for _ in range(n)] if rank == 0 else None
        return ((lambda: dist.gather(a, lst, dst=0)),
                lambda: rank != 0 or all(np.array_equal(x, y) for x, y in zip(lst, base)))
    if kind == "scatter":
        out = np.empty(count, dtype=np.float32)
        return ((lambda: dist.scatter(out, base if rank == 0 else None, src=0)),
                lambda: np.array_equal(out, base[rank]))
    if kind == "all_to_all":
        src = np.concatenate([base[rank] + 10 * p for p in range(n)])
        out = np.empty(count * n, dtype=np.float32)
        want = np.concatenate([base[p] + 10 * rank for p in range(n)])
        return (lambda: dist.all_to_all_single(out, src)), lambda: np.array_equal(out, want)
    raise ValueError(kind)


def worker(args):
    import pyddp.distributed as dist
    from pyddp.distributed.backends import tuning

    dist.init_process_group("cpu")
    rank, n = dist.get_rank(), dist.get_world_size()
    cpg = dist.distributed_c10d._world.default_pg._cpg
    doc = tuning.load(tuning.path_in_force()[0])
    both = tuning.decode(json.dumps([tuning._cma_list(tuning.table_for(doc, n)),
                                     list(cpg.rules[1])]))
    phased = list(cpg.rules[0]), list(cpg.slow_rules[0]), cpg.phase["phase_ns"]
    small = list(cpg.rules[1])
    configs = {"phases": lambda: (cpg.set_rules(phased[0], small),
                                  cpg.set_slow_rules(phased[1], small, phased[2])),
               "both": lambda: (cpg.set_rules(both[0], small),
                                cpg.set_slow_rules(both[0], small, 0.0))}
    t = np.zeros(1)
    flag = np.zeros(1)
    rows = []  # (kind, size, phase ns, {config: us per call})
    ops = [(k, parse_bytes(z)) for k in args.ops.split(",") for z in args.sizes.split(",")]
    # correctness first, in both configurations
    for name, apply in configs.items():
        dist.barrier()
        apply()
        for kind, size in ops:
            run, check = _op(dist, kind, rank, n, max(1, size // 4))
            run()
            if not check():
                raise SystemExit(f"rank {rank}: {kind} {size} B wrong with {name}")
    end = time.monotonic() + 60 * args.minutes
    k = 0
    while True:
        flag[0] = time.monotonic() < end if rank == 0 else 0
        dist.broadcast(flag, src=0)
        if not flag[0]:
            break
        kind, size = ops[k % len(ops)]
        run, _ = _op(dist, kind, rank, n, max(1, size // 4))
        calls = max(5, min(args.calls, (64 << 20) // max(1, size)))
        # which goes first alternates pass by pass (a pass: every collective and size once), so
        # each cell has both orders
        order = ("phases", "both") if (k // len(ops)) % 2 == 0 else ("both", "phases")
        dist.barrier()
        ns = cpg.probe_phase()
        got, in_force = {}, None
        for name in order:
            dist.barrier()
            configs[name]()
            # a few calls first: the group probes at its first collective after set_slow_rules,
            # and rank 0's verdict is in force from the next one
            for _ in range(3):
                run()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            t[0] = (time.perf_counter() - t0) / calls
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            got[name] = t[0] * 1e6
            if name == "phases":
                in_force = cpg.phase["phase"]
        rows.append((kind, size, ns, got, in_force))
        k += 1
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "phase_ns": phased[2]}, f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--ops", default="all_gather,broadcast,all_reduce,gather",
                    help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--sizes", default="8K,16K,32K,64K,512K,1M",
                    help="per rank's block (all_reduce: the message), comma-separated")
    ap.add_argument("--minutes", type=float, default=3.0, help="how long to alternate (default 3)")
    ap.add_argument("--calls", type=int, default=100, help="calls per batch (large sizes: fewer)")
    ap.add_argument("--json", help="also write every pair to this JSON file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for k in args.ops.split(","):
        if k not in OPS:
            ap.error(f"--ops: unknown collective {k!r} (expected some of {', '.join(OPS)})")
    if args.worker:
        worker(args)
        return 0
    from pyddp.distributed.backends import tuning

    path = tuning.path_in_force()[0]
    if path is None or tuning.phased_for(tuning.load(path), args.nproc, args.nproc) is None:
        print(f"no rules for each phase for {args.nproc} ranks in the rules file in force ({path}); "
              "python -m pyddp.tools.tune writes them where it sees both phases (--show)")
        return 0
    info = _report.machine()
    with tempfile.TemporaryDirectory(prefix="pyddp-phases-") as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", str(args.nproc),
               os.path.abspath(__file__), "--worker", "--out", out, "--ops", args.ops,
               "--sizes", args.sizes, "--minutes", str(args.minutes), "--calls", str(args.calls)]
        subprocess.run(cmd, check=True, timeout=120 + 90 * args.minutes)
        with open(out, encoding="utf-8") as f:
            data = json.load(f)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(data, machine=info), f, indent=1)
    limit = data["phase_ns"]
    table = []
    for phase, sel in (("fast", lambda ns: ns is not None and ns <= limit),
                       ("slow", lambda ns: ns is not None and ns > limit)):
        for kind in args.ops.split(","):
            for z in args.sizes.split(","):
                size = parse_bytes(z)
                pairs = [r[3] for r in data["rows"] if r[0] == kind and r[1] == size and sel(r[2])]
                if not pairs:
                    continue
                a = float(np.median([p["phases"] for p in pairs]))
                b = float(np.median([p["both"] for p in pairs]))
                table.append([phase, kind, fmt_size(size), f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}",
                              len(pairs)])
    unprobed = sum(1 for r in data["rows"] if r[2] is None)
    print(_report.block(
        f"The phases' rules against the table for both phases, {args.nproc} ranks, float32, "
        f"{len(data['rows'])} pairs of batches in {args.minutes:g} minutes (probe threshold "
        f"{limit:.0f} ns)",
        ["phase", "collective", "size", "phases' rules us", "both phases' table us",
         "both / phases", "pairs"], table, info=info,
        notes=[f"{unprobed} pairs without an answered probe are left out."] if unprobed else ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
