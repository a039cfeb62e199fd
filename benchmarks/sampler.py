"""One epoch of DistributedSampler indices: pyddp vs torch, in the same run.

For a dataset of N samples (default 10 million) over R replicas (default 4),
each repetition sets a new epoch and times, for one rank:

  - torch:  list(torch.utils.data.DistributedSampler(...))   (Python ints)
  - pyddp:  list(pyddp.DistributedSampler(...))              (Python ints)
  - pyddp:  DistributedSampler.indices()                     (NumPy int64)

and, for reference, torch.randperm(N) vs pyddp.randperm(N) alone.  The
libraries alternate within every repetition, so background load hits both
alike; the table gives medians (and minimums) of all repetitions and the
speedup of the medians, in wall-clock time and in the CPU time of the calling
thread (time.thread_time: on a loaded machine the wall clock also counts the
time the process waits for a core; both libraries run these on one thread).  Every epoch's indices are checked to be identical.

    python benchmarks/sampler.py                 # N=10M, R=4, 15 repetitions
    python benchmarks/sampler.py --n 1000000 --reps 30 --json out.json
    python benchmarks/sampler.py --quick         # a few small repetitions
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402

import pyddp  # noqa: E402
from pyddp.utils.data import DistributedSampler  # noqa: E402


CPU = {}  # key -> the calling thread's CPU seconds of every repetition


def _time(fn, key=None):
    c = time.thread_time()
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    if key is not None:
        CPU.setdefault(key, []).append(time.thread_time() - c)
    return dt, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="N=100000, 3 repetitions (a smoke run)")
    ap.add_argument("--json", help="also write the raw timings here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.reps = 100_000, 3

    try:
        import torch
        from torch.utils.data.distributed import \
            DistributedSampler as TorchDistributedSampler
    except ImportError:
        torch = None
        print("# note: torch is not installed: pyddp columns only")

    n, R, rank = args.n, args.replicas, args.rank
    dataset = range(n)
    ps = DistributedSampler(dataset, num_replicas=R, rank=rank, seed=args.seed)
    ts = (TorchDistributedSampler(dataset, num_replicas=R, rank=rank,
                                  seed=args.seed) if torch else None)
    rows = {k: [] for k in ("torch_list", "pyddp_list", "pyddp_indices",
                            "torch_randperm", "pyddp_randperm")}
    # warm-up (first-touch page faults, lazy imports)
    ps.indices()
    if torch:
        list(ts)
    for epoch in range(args.reps):
        ps.set_epoch(epoch)
        if torch:
            ts.set_epoch(epoch)
            dt, ref = _time(lambda: list(ts), "torch_list")
            rows["torch_list"].append(dt)
        dt, got = _time(lambda: list(ps), "pyddp_list")
        rows["pyddp_list"].append(dt)
        dt, arr = _time(ps.indices, "pyddp_indices")
        rows["pyddp_indices"].append(dt)
        if torch and (got != ref or arr.tolist() != ref):
            raise SystemExit(f"MISMATCH at epoch {epoch}: pyddp != torch")
        del got, arr
        if torch:
            del ref
            tg = torch.Generator()
            tg.manual_seed(epoch)
            dt, tp = _time(lambda: torch.randperm(n, generator=tg), "torch_randperm")
            rows["torch_randperm"].append(dt)
        pg = pyddp.Generator().manual_seed(epoch)
        dt, pp = _time(lambda: pyddp.randperm(n, generator=pg), "pyddp_randperm")
        rows["pyddp_randperm"].append(dt)
        if torch and not np.array_equal(pp, tp.numpy()):
            raise SystemExit(f"MISMATCH: randperm seed {epoch}")

    def med(k):
        return statistics.median(rows[k]) * 1e3 if rows[k] else float("nan")

    def mn(k):
        return min(rows[k]) * 1e3 if rows[k] else float("nan")

    table = [
        ("one epoch, list of Python ints", "torch_list", "pyddp_list"),
        ("one epoch, pyddp indices() (NumPy int64)", "torch_list",
         "pyddp_indices"),
        (f"randperm({n:,}) alone", "torch_randperm", "pyddp_randperm"),
    ]
    out = []
    for label, tk, pk in table:
        t = f"{med(tk):.1f} ({mn(tk):.1f})" if rows[tk] else "n/a"
        sp = f"{med(tk) / med(pk):.1f}x" if rows[tk] else "n/a"
        sc = (f"{statistics.median(CPU[tk]) / statistics.median(CPU[pk]):.1f}x"
              if rows[tk] else "n/a")
        out.append((label, t, f"{med(pk):.1f} ({mn(pk):.1f})", sp, sc))
    print(_report.block(
        f"DistributedSampler, one epoch of rank {rank}'s indices: N={n:,}, num_replicas={R}, "
        f"medians (minimums) of {args.reps} repetitions; indices identical to torch's: "
        f"{'yes, every epoch' if torch else 'not checked (no torch)'}",
        ("what", "torch median ms (min)", "pyddp median ms (min)", "speedup",
         "speedup, CPU time"), out, align="lrrrr"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "num_replicas": R, "rank": rank,
                       "seconds": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
