#!/usr/bin/env python
"""pyddp as a torch.distributed backend: torch's own API on "gloo" and on "pyddp", in the same run.

    python benchmarks/torch_backend.py                     # 2 ranks, prints the tables
    python benchmarks/torch_backend.py --sizes 5.8M --rounds 9
    python benchmarks/torch_backend.py --coll-sizes 4,4K --sizes 0.27M --rounds 1 --steps 2 --iters 5

Two ranks (pyddp.run), one thread each.  Every rank initialises torch's default group on "pyddp"
(``import pyddp.torch_backend``) and a gloo group over the same ranks (``dist.new_group(backend=
"gloo")``); every measurement alternates between the two, round by round, so drift of the machine
hits both alike.

Collectives (allreduce, broadcast, allgather = all_gather_into_tensor, reduce_scatter =
reduce_scatter_tensor) of float32 tensors through ``torch.distributed``'s functions, timed as in
benchmarks/collectives.py (its worker's run_op: a correctness check, warm-up, then timed iterations
each after a barrier, the slowest rank's time per iteration, the median over iterations; the median
of the rounds' medians).  The table gives time and algbw per backend and pyddp's speed-up.  The
4 B allreduce is also timed back-to-back (OSU micro-benchmarks' and nccl-tests' latency: many
calls in a row after one barrier, per call; a barrier before each call adds the ranks' skew
leaving it to the time of a 4 B call).

torch DDP: the MLP of benchmarks/ddp.py (batch 64, SGD) plain, and wrapped in torch's own
DistributedDataParallel on gloo, on pyddp, and on pyddp with a no-op comm hook (torch's DDP cost
without communication); the median step time and its ratio to the plain step.

Targets (issue 18): pyddp at most 10 us for a 4 B allreduce and at least 5x gloo's algbw at 1 MiB;
torch DDP on pyddp at most 1.35x the plain step at 5.8M.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _report  # noqa: E402
import bench_worker  # noqa: E402
import ddp  # noqa: E402
from collectives import algbw, fmt_bw, fmt_size, fmt_us, free_port, merge_rows, parse_size  # noqa: E402

OPS = bench_worker.OPS
BACKENDS = ("gloo", "pyddp")
DDP_CONFIGS = ("torch plain", "torch DDP (gloo)", "torch DDP (pyddp)",
               "torch DDP (pyddp), no-op comm hook")
# the plain step followed by one allreduce of a gradient-sized tensor through torch's API on pyddp
# (the same volume with no DDP around it): "pyddp's allreduce-alone cost" of the second DDP target
ALLREDUCE_ALONE = "torch plain + one allreduce of the gradients' size (pyddp)"
TARGET_US, TARGET_BW_RATIO, TARGET_BW_BYTES, TARGET_DDP = 10.0, 5.0, 1 << 20, 1.35
TARGET_DDP_SUM = 0.05  # torch DDP on pyddp within this of (no-op hook ratio + allreduce alone)


def _parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coll-sizes", default="4,1M,16M", help="collective sizes (bytes, K/M/G)")
    ap.add_argument("--sizes", default="1.9M,5.8M",
                    help="DDP model sizes, a subset of " + ",".join(ddp.SIZES) + " ('' for none)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (each runs every measurement)")
    ap.add_argument("--iters", type=int, default=2000, help="most timed iterations per size")
    ap.add_argument("--budget-bytes", type=parse_size, default=parse_size("1G"),
                    help="bytes moved per size and round at most (fewer iterations for big sizes)")
    ap.add_argument("--steps", type=int, default=10, help="timed DDP steps per config per round")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--torch-port", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


class TorchGroupImpl(bench_worker.GlooImpl):
    """bench_worker's torch implementation on one group of an initialised default group."""

    def __init__(self, torch, dist, group):
        self.torch, self.dist, self.group = torch, dist, group
        # torch 2.13's names (the older ones warn that they are deprecated)
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self.name = dist.get_backend(group)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def allreduce(self, a, out):
        self.dist.all_reduce(a, group=self.group)

    def broadcast(self, a, out):
        self.dist.broadcast(a, src=0, group=self.group)

    def allgather(self, a, out):
        self._ag(out, a, group=self.group)

    def reduce_scatter(self, a, out):
        self._rs(out, a, group=self.group)

    def barrier(self):
        self.dist.barrier(group=self.group)

    def max_over_ranks(self, times):
        self.dist.all_reduce(self.torch.from_numpy(times), op=self.dist.ReduceOp.MAX,
                             group=self.group)
        return times


# Untimed calls before a back-to-back series: after another backend's turn (or any pause) the
# ranks' processes may share a core until the scheduler spreads them again, a few milliseconds of
# calls later (50 warm-up calls measured 10-15 us where 1000 measure 7 us); a fixed count, equal
# on every rank, as each call is a collective.
WARMUP = 1000


def back_to_back(impl, torch, iters):
    """Median us per 4 B allreduce over ``iters`` calls in a row after one barrier, the slowest
    rank's (OSU micro-benchmarks' and nccl-tests' latency: no barrier between iterations)."""
    import numpy as np

    t = torch.ones(1)
    for _ in range(WARMUP):
        impl.allreduce(t, None)
    clock = time.perf_counter
    impl.barrier()
    t0 = clock()
    for _ in range(iters):
        impl.allreduce(t, None)
    times = np.array([(clock() - t0) / iters])
    return float(impl.max_over_ranks(times)[0] * 1e6)


def floor_parts(pg, impl, torch, iters):
    """The two parts of the 4 B allreduce's floor through torch's API, back-to-back as above, us:
    ``api``, torch's own API over a backend that does nothing (dist.all_reduce with the pyddp
    group's allreduce replaced, for the measurement, by one returning its finished Work), and
    ``core``, pyddp's C inline path alone on the same tensor (what pyddp's own API runs)."""
    import numpy as np

    t = torch.ones(1)
    a = t.numpy()
    fast = pg._fast
    done = pg._finished([t])
    out = {}
    for part in ("api", "core"):
        if part == "api":
            pg.allreduce = lambda tensors, opts=None: done  # an instance attribute: torch calls it
            call = impl.allreduce
        else:
            call = lambda t, _: fast(pyddp_tb._K_ALLREDUCE, a, pyddp_tb._SUM_CODE)  # noqa: E731
        for _ in range(WARMUP):
            call(t, None)
        impl.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call(t, None)
        times = np.array([(time.perf_counter() - t0) / iters])
        if part == "api":
            del pg.allreduce
        out[part] = float(impl.max_over_ranks(times)[0] * 1e6)
    return out


def _noop_hook(state, bucket):
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _ddp_configs(h, gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def noop(m):
        d = DDP(m)
        d.register_comm_hook(None, _noop_hook)
        return d

    import torch
    import torch.distributed as dist

    wraps = (None, lambda m: DDP(m, process_group=gloo), DDP, noop)
    configs = {name: ddp._torch_setup(h, w) for name, w in zip(DDP_CONFIGS, wraps)}
    plain, n = ddp._torch_setup(h, None)
    buf = torch.ones(n)

    def plain_allreduce():
        plain()
        dist.all_reduce(buf)
        buf.mul_(0.5)  # an average, as DDP's (and bounded over many steps)
    configs[ALLREDUCE_ALONE] = (plain_allreduce, n)
    return configs


def _worker(args):
    import datetime

    import torch
    import torch.distributed as dist

    global pyddp_tb
    import pyddp.torch_backend as pyddp_tb

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("pyddp", init_method=f"tcp://127.0.0.1:{args.torch_port}", rank=rank,
                            world_size=ws, timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    impls = {"gloo": TorchGroupImpl(torch, dist, gloo), "pyddp": TorchGroupImpl(torch, dist, None)}
    sizes = [parse_size(s) for s in args.coll_sizes.split(",") if s]
    rounds = {b: {op: [] for op in OPS} for b in BACKENDS}
    b2b = {b: [] for b in BACKENDS}
    floors = {"api": [], "core": []}
    pg = dist.distributed_c10d._get_default_group()
    for _ in range(args.rounds):
        for op in OPS:
            for b in BACKENDS:
                rounds[b][op].append(bench_worker.run_op(impls[b], op, sizes, args))
        if 4 in sizes:
            for b in BACKENDS:
                b2b[b].append(back_to_back(impls[b], torch, args.iters))
            if pg._fast is not None:
                for k, v in floor_parts(pg, impls["pyddp"], torch, args.iters).items():
                    floors[k].append(v)
    coll = {b: {op: merge_rows(rounds[b][op]) for op in OPS} for b in BACKENDS}
    coll["back_to_back"] = {b: ddp._median(v) for b, v in b2b.items() if v}
    coll["floor"] = {k: ddp._median(v) for k, v in floors.items() if v}
    steps = {}
    for size in [s for s in args.sizes.split(",") if s]:
        configs = _ddp_configs(ddp.SIZES[size], gloo)
        times = {k: [] for k in configs}
        for step, _ in configs.values():  # warm-up (and DDP's bucket rebuild)
            for _ in range(3):
                step()
        for _ in range(args.rounds):
            for name, (step, _) in configs.items():
                dist.barrier()
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - t0)
        steps[size] = {"params": configs["torch plain"][1],
                       "times": {k: ddp._median(v) for k, v in times.items()}}
        del configs
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"collectives": coll, "ddp": steps}, f)
    dist.destroy_process_group()


def collective_lines(coll):
    """The markdown table of the collectives and the target lines."""
    rows = []
    targets = []
    b2b = coll.get("back_to_back") or {}
    for op in OPS:
        for g, p in zip(coll["gloo"][op], coll["pyddp"][op]):
            n = p["bytes"]
            bad = "".join(f" WRONG RESULT from {b}" for b, r in (("gloo", g), ("pyddp", p))
                          if not r["correct"])
            rows.append((op, fmt_size(n), fmt_us(g['median_us']), fmt_us(p['median_us']),
                         fmt_bw(algbw(n, g['median_us'])), fmt_bw(algbw(n, p['median_us'])),
                         f"{g['median_us'] / p['median_us']:.2f}x{bad}"))
            if op == "allreduce" and n <= 4:
                ok = p["median_us"] <= TARGET_US
                targets.append(f"target allreduce {fmt_size(n)}: pyddp {p['median_us']:.2f} us "
                               f"(<= {TARGET_US:g}) -> {'met' if ok else 'NOT met'}")
                if b2b:
                    ok = b2b["pyddp"] <= TARGET_US
                    targets.append(f"target allreduce {fmt_size(n)} back-to-back (OSU-style): "
                                   f"pyddp {b2b['pyddp']:.2f} us, gloo {b2b['gloo']:.2f} us "
                                   f"(<= {TARGET_US:g}) -> {'met' if ok else 'NOT met'}")
                fl = coll.get("floor") or {}
                if b2b and len(fl) == 2:
                    floor = fl["api"] + fl["core"]
                    targets.append(
                        f"floor of the 4 B allreduce through torch's API, back-to-back: torch's "
                        f"API over a no-op backend {fl['api']:.2f} us + pyddp's C path alone "
                        f"{fl['core']:.2f} us = {floor:.2f} us; pyddp through torch's API is "
                        f"{b2b['pyddp'] - floor:+.2f} us from it ({b2b['pyddp'] / floor:.2f}x)")
            if op == "allreduce" and n == TARGET_BW_BYTES:
                r = g["median_us"] / p["median_us"]
                targets.append(f"target allreduce {fmt_size(n)}: pyddp algbw {r:.2f}x gloo's "
                               f"(>= {TARGET_BW_RATIO:g}) -> "
                               f"{'met' if r >= TARGET_BW_RATIO else 'NOT met'}")
    lines = _report.table(("collective", "size", "gloo us", "pyddp us", "gloo GB/s", "pyddp GB/s",
                           "pyddp speed-up"), rows, align="llrrrrr")
    return lines, targets


def ddp_lines(steps):
    rows = []
    targets = []
    for size, r in steps.items():
        t = r["times"]
        for name, v in t.items():
            rows.append((f"{size} ({r['params'] / 1e6:.2f}M)", name, f"{v * 1e3:.2f}",
                         f"{v / t['torch plain']:.3f}"))
        ratio = t["torch DDP (pyddp)"] / t["torch plain"]
        if size == "5.8M":
            targets.append(f"target 5.8M torch DDP (pyddp): {ratio:.3f} of plain "
                           f"(<= {TARGET_DDP}) -> {'met' if ratio <= TARGET_DDP else 'NOT met'}")
        if ALLREDUCE_ALONE in t:
            noop = t["torch DDP (pyddp), no-op comm hook"] / t["torch plain"]
            alone = t[ALLREDUCE_ALONE] / t["torch plain"] - 1.0
            want = noop + alone
            ok = ratio <= want + TARGET_DDP_SUM
            targets.append(f"target {size} torch DDP (pyddp): {ratio:.3f} of plain, no-op hook "
                           f"{noop:.3f} + allreduce alone {alone:.3f} = {want:.3f} -> "
                           f"{ratio - want:+.3f} ({'within' if ok else 'NOT within'} "
                           f"{TARGET_DDP_SUM})")
    lines = _report.table(("model", "configuration", "step ms", "/ plain"), rows, align="llrr")
    return lines, targets


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        return _worker(args)
    for s in [s for s in args.sizes.split(",") if s]:
        if s not in ddp.SIZES:
            sys.exit(f"torch_backend.py: unknown model size {s!r} (known: {', '.join(ddp.SIZES)})")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "torch_backend.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", "2",
               os.path.abspath(__file__), "--worker", out, "--torch-port", str(free_port()),
               "--coll-sizes", args.coll_sizes, "--sizes", args.sizes, "--rounds",
               str(args.rounds), "--iters", str(args.iters), "--budget-bytes",
               str(args.budget_bytes), "--steps", str(args.steps)]
        subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
        with open(out) as f:
            res = json.load(f)
    print(f"torch.distributed collectives, 2 ranks, float32, one thread per rank, median of "
          f"{args.rounds} rounds' medians")
    print()
    info = _report.machine()
    print("\n".join(_report.header(argv, info=info)))
    print()
    lines, targets = collective_lines(res["collectives"])
    print("\n".join(lines))
    if res["ddp"]:
        print()
        print(f"torch DDP step time, 2 ranks, batch {ddp.BATCH} per rank, median of "
              f"{args.rounds}x{args.steps} steps")
        print()
        print("\n".join(_report.header(argv, info=info)))
        print()
        more, t2 = ddp_lines(res["ddp"])
        print("\n".join(more))
        targets += t2
    print()
    print("\n".join(targets))


if __name__ == "__main__":
    main()
