"""The phases' rules against the table made for both phases, in the same processes, batch by batch.

    python benchmarks/phases.py                      # 2 ranks, about 3 minutes
    python benchmarks/phases.py --minutes 10 --ops allgather,broadcast --sizes 8K,16K,32K,1M

On a machine whose speed between cores changes for minutes at a time (the machine's phases in
docs/benchmarks.md) the tuner writes single-copy rules for each phase beside the table made for
both, and a group switches between them at run time after its probe (ranks 0 and 1 handing a cache
line back and forth). This measures what that gives: the ranks (started here by pyddp's launcher)
run batches of each collective and size with the two configurations alternating, the phases' rules
(the fast and the slow table, switching) and the table for both phases (no switching), for as long
as asked; before each pair of batches rank 0 probes the handoff the same way the group does, so
every pair is filed under the phase it ran in. The collectives and their check against NumPy are
collectives.py's (bench_worker). A batch's time per call is the slowest rank's batch time over its
calls. The table gives, per phase, collective and size, the median time of each configuration and
their ratio (> 1: the phases' rules faster), with the number of pairs; results are checked against
NumPy first.

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
import bench_worker as bw  # noqa: E402
from pyddp.tools.tune import _parse_bytes as parse_bytes  # noqa: E402

def fmt_size(n):
    for unit, s in (("M", 20), ("K", 10)):
        if n >= 1 << s and n % (1 << s) == 0:
            return f"{n >> s}{unit}"
    return str(n)


def worker(args):
    from pyddp.distributed.backends.cpu import tuning

    impl = bw.PyddpImpl()  # the collectives as collectives.py runs them, and its NumPy check
    dist, rank, n = impl.dist, impl.rank, impl.world
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
    rows = []  # (op, size, probe ns, {config: us per call}, the phase in force)
    cells = []  # (op, per-rank block bytes, input, output)
    for op in args.ops.split(","):
        for z in args.sizes.split(","):
            size = parse_bytes(z)
            # sizes are per rank's block, the unit of the rules (counts_for takes the whole array)
            n_in, n_out = bw.counts_for(op, size * n if op in bw.BLOCKED else size, n)
            cells.append((op, size, impl.make(n_in),
                          impl.make(n_out) if op in bw.BLOCKED else np.zeros(1, np.float32)))
    for name, apply in configs.items():  # correctness first, in both configurations
        dist.barrier()
        apply()
        for op, size, a, out in cells:
            if not bw.check(impl, op, a, out):
                raise SystemExit(f"rank {rank}: {op} of {size} B wrong with {name}")
    end = time.monotonic() + 60 * args.minutes
    k = 0
    while True:
        flag[0] = time.monotonic() < end if rank == 0 else 0
        dist.broadcast(flag, src=0)
        if not flag[0]:
            break
        op, size, a, out = cells[k % len(cells)]
        run = getattr(impl, op)
        calls = max(5, min(args.calls, (64 << 20) // max(1, size)))
        # which goes first alternates pass by pass (a pass: every collective and size once), so
        # each cell has both orders
        order = ("phases", "both") if (k // len(cells)) % 2 == 0 else ("both", "phases")
        dist.barrier()
        ns = cpg.probe_phase()
        got, in_force = {}, None
        for name in order:
            dist.barrier()
            configs[name]()
            # a few calls first: the group probes at its first collective after set_slow_rules,
            # and rank 0's verdict is in force from the next one
            for _ in range(3):
                run(a, out)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                run(a, out)
            t[0] = (time.perf_counter() - t0) / calls
            impl.max_over_ranks(t)
            got[name] = t[0] * 1e6
            if name == "phases":
                in_force = cpg.phase["phase"]
        rows.append((op, size, ns, got, in_force))
        k += 1
    impl.close()
    if rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "phase_ns": phased[2]}, f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--ops", default="allgather,broadcast,allreduce,gather",
                    help=f"comma-separated subset of {','.join(bw.OPS)}")
    ap.add_argument("--sizes", default="8K,16K,32K,64K,512K,1M",
                    help="per rank's block (allreduce, broadcast, reduce: the message), "
                         "comma-separated")
    ap.add_argument("--minutes", type=float, default=3.0, help="how long to alternate (default 3)")
    ap.add_argument("--calls", type=int, default=100, help="calls per batch (large sizes: fewer)")
    ap.add_argument("--json", help="also write every pair to this JSON file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for k in args.ops.split(","):
        if k not in bw.OPS:
            ap.error(f"--ops: unknown collective {k!r} (expected some of {', '.join(bw.OPS)})")
    if args.worker:
        worker(args)
        return 0
    from pyddp.distributed.backends.cpu import tuning

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
