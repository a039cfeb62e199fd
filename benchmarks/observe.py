#!/usr/bin/env python
"""What watching a job costs: the flight recorder (on by default) and the timeline (off by default).

    python benchmarks/observe.py                  # 2 ranks, prints the table
    python benchmarks/observe.py --rounds 9 --iters 20000

Two ranks (pyddp.run), one thread each, in the same run, round by round: allreduce of float32
arrays (4 B: the one-call inline path; 64 KiB and 1 MiB: the progress thread) through pyddp's own
API on three groups over the same ranks: the flight recorder off (PYDDP_FLIGHT_RECORDER_SIZE=0),
the flight recorder on (the default), and the flight recorder on with the timeline being
written (PYDDP_TIMELINE).  Each round times a block of iterations on every rank after a barrier;
the slowest rank's time per call counts; the table gives the median over rounds and the cost
against the recorder-off group.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _report  # noqa: E402

CONFIGS = ("recorder off", "recorder on (default)", "recorder on + timeline")
SIZES = (4, 64 << 10, 1 << 20)


def _parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=5000, help="calls per round at 4 B (fewer for "
                                                            "larger sizes)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _worker(args):
    import numpy as np

    import pyddp.distributed as dist
    from pyddp import _C

    dist.init_process_group("cpu")
    rank = dist.get_rank()
    groups = {}
    for name, size in zip(CONFIGS, ("0", "2000", "2000")):
        os.environ["PYDDP_FLIGHT_RECORDER_SIZE"] = size  # read when the C group is created
        groups[name] = dist.new_group([0, 1])
    tldir = tempfile.mkdtemp(prefix="pyddp-observe-")
    times = {c: {s: [] for s in SIZES} for c in CONFIGS}
    for rnd in range(args.rounds):
        for size in SIZES:
            x = np.ones(max(1, size // 4), np.float32)
            n = max(20, args.iters * 4 // max(size, 4)) if size > 4 else args.iters
            n = min(n, args.iters)
            for c in CONFIGS:
                g = groups[c]
                if c.endswith("timeline"):
                    _C.timeline_open(os.path.join(tldir, f"r{rank}-{rnd}.json"), rank, "bench")
                for _ in range(max(2, n // 20)):
                    dist.all_reduce(x, group=g)
                dist.barrier(group=g)
                t0 = time.perf_counter()
                for _ in range(n):
                    dist.all_reduce(x, group=g)
                dt = np.array([(time.perf_counter() - t0) / n], np.float64)
                if c.endswith("timeline"):
                    _C.timeline_close()
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                times[c][size].append(float(dt[0]))
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump({c: {str(s): v for s, v in d.items()} for c, d in times.items()}, f)
    dist.destroy_process_group()


def fmt_size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def table(res):
    rows = []
    for s in SIZES:
        med = [statistics.median(res[c][str(s)]) * 1e6 for c in CONFIGS]
        rows.append([fmt_size(s)] + [f"{m:.2f}" for m in med] +
                    [f"{med[1] - med[0]:+.2f} us ({(med[1] / med[0] - 1) * 100:+.1f}%)",
                     f"{med[2] - med[1]:+.2f} us ({(med[2] / med[1] - 1) * 100:+.1f}%)"])
    return _report.table(["allreduce"] + [f"{c} us" for c in CONFIGS] +
                         ["recorder cost", "timeline cost"], rows, align="l" + "r" * (len(CONFIGS) + 2))


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        _worker(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", "2", __file__,
               "--worker", out, "--rounds", str(args.rounds), "--iters", str(args.iters)]
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
        with open(out) as f:
            res = json.load(f)
    print(f"flight recorder and timeline cost, 2 ranks, float32 allreduce, median of "
          f"{args.rounds} rounds (slowest rank per round)")
    print()
    print("\n".join(_report.header(argv)))
    print()
    print("\n".join(table(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
