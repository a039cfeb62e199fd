"""DDP step time: plain training vs torch DDP (gloo) vs pyddp DDP (torch model and pyddp.nn model).

    python benchmarks/ddp.py                 # launches 2 ranks itself (pyddp.run), prints the table
    python benchmarks/ddp.py --sizes 1.9M --rounds 5

The model is a 3-layer MLP, the usual DDP overhead benchmark (784-h-h-10; h = 256, 1024,
2048 give 0.27M, 1.9M and 5.8M parameters), batch 64 per rank, cross-entropy, SGD, one thread per
rank. Each configuration runs in the same 2 processes, interleaved round by round so that drift of
the machine hits all alike; a step is zero_grad + forward + loss + backward + optimizer step, and
the table reports the median step time and its ratio to the plain (no DDP) step of the same
framework. Both ranks run the plain steps at the same time, so they compete for the machine as the
DDP runs do.

Floor rows bound what any DDP can reach on the machine: the plain step followed by one allreduce of
an array of the gradients' size already in the group's shared memory (the same allreduce volume
with no DDP around it: the reduction itself, with no copy in or out), for the pyddp.nn and for the
torch plain step, so each DDP ratio is read against the floor of its own framework; and the
pyddp.nn plain step followed by one copy of gradient-sized memory (what one pass over the gradients
costs). "torch DDP (gloo), no-op comm hook" is torch's own DDP cost without communication (a hook
that returns the bucket as it is). For torch models two more floors: one allreduce of a private
array of the gradients' size (the memory autograd's gradients are in, which no peer maps), and the
plain step with one allreduce of each gradient where autograd put it, after backward (the same
allreduces DDP has to make, on the same memory, with no DDP around them: on a host without a spare
core for overlap, what DDP's own machinery costs is the difference to this row).

pyddp's DDP makes each ``.grad`` a view of its bucket, so with ``zero_grad(set_to_none=False)``
autograd accumulates straight into the buckets and a torch model's step makes no copy at all; with
``set_to_none=True`` (``opt.zero_grad()``'s default, the plain rows) torch's autograd hands over a
fresh gradient, which is copied into its bucket once (pyddp.nn's linear computes it there).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402

SIZES = {"0.27M": 256, "1.9M": 1024, "5.8M": 2048}
BATCH = 64


def _parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.27M,1.9M,5.8M", help="comma-separated subset of " + ",".join(SIZES))
    ap.add_argument("--rounds", type=int, default=7, help="rounds (each runs every configuration)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per configuration per round")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--interleave", choices=("block", "step"), default="block",
                    help="block: each configuration runs --steps steps in a row, round by round; step: "
                         "the configurations take turns step by step (a change of the machine's speed "
                         "within a round then hits all of them alike)")
    ap.add_argument("--no-torch", action="store_true", help="pyddp.nn rows only")
    ap.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    ap.add_argument("--torch-port", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args()


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _torch_setup(h, wrap, set_to_none=True, after=None):
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(784, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                            torch.nn.ReLU(), torch.nn.Linear(h, 10))
    model = wrap(m) if wrap else m
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 784, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    lossf = torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad(set_to_none=set_to_none)
        lossf(model(x), y).backward()
        if after is not None:
            after(m)
        opt.step()
    return step, sum(p.numel() for p in m.parameters())


def _allreduce_each(dist):
    """After backward: one allreduce (AVG) of each parameter's gradient where autograd put it."""
    def after(m):
        for p in m.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    return after


def _copied_in(wrap):
    """pyddp's DDP with every gradient copied into a shared bucket (PYDDP_DDP_IN_PLACE=0 while it
    is built: what it did before large gradients were reduced where autograd puts them)."""
    def make(m):
        old = os.environ.get("PYDDP_DDP_IN_PLACE")
        os.environ["PYDDP_DDP_IN_PLACE"] = "0"
        try:
            return wrap(m)
        finally:
            if old is None:
                del os.environ["PYDDP_DDP_IN_PLACE"]
            else:
                os.environ["PYDDP_DDP_IN_PLACE"] = old
    return make


def _noop_hook(state, bucket):
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _torch_noop(m):
    from torch.nn.parallel import DistributedDataParallel as TDDP

    ddp = TDDP(m)
    ddp.register_comm_hook(None, _noop_hook)
    return ddp


def _pyddp_setup(h, wrap):
    import numpy as np

    import pyddp
    import pyddp.nn as nn
    import pyddp.nn.functional as F

    pyddp.manual_seed(0)
    m = nn.Sequential(nn.Linear(784, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    model = wrap(m) if wrap else m
    params = list(model.parameters())
    try:
        from pyddp.optim import SGD
        opt = SGD(params, lr=0.01)
        zero, upd = opt.zero_grad, opt.step
    except ImportError:  # optimizers not built: a plain in-place update
        def zero():
            for p in params:
                p.grad = None

        def upd():
            for p in params:
                p.numpy()[...] -= 0.01 * p.grad.numpy()
    rng = np.random.default_rng(1)
    x = pyddp.tensor(rng.standard_normal((BATCH, 784)).astype(np.float32))
    y = pyddp.tensor(rng.integers(0, 10, BATCH))

    def step():
        zero()
        F.cross_entropy(model(x), y).backward()
        upd()
    return step, sum(p.numel() for p in m.parameters())


FLOOR_COPY = "floor: pyddp.nn plain + one copy of the gradients"
FLOOR_ALLREDUCE = "floor: pyddp.nn plain + one allreduce of the gradients in shared memory"
FLOOR_TORCH = "floor: torch plain + one allreduce of the gradients in shared memory"
FLOOR_TORCH_PRIVATE = "floor: torch plain + one allreduce of a private array of the gradients' size"
FLOOR_TORCH_EACH = "floor: torch plain + one allreduce of each gradient after backward"


def _floor_setup(plain, dist, torch_plain=None):
    """The least any DDP can add to a plain step: one pass over gradient-sized memory (a copy),
    and the allreduce itself with no copy in or out (an array in the group's shared memory)."""
    import numpy as np

    step, n = plain
    tstep = torch_plain[0] if torch_plain else None
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    try:
        buf = dist._shared_array((n,), dtype=np.float32)
    except Exception:  # not a shared-memory group (PYDDP_TRANSPORT=tcp): an ordinary array
        buf = np.zeros(n, np.float32)

    def plain_copy():
        step()
        np.copyto(dst, src)

    def plain_allreduce():
        step()
        dist.all_reduce(buf, op=dist.ReduceOp.AVG)
    def torch_allreduce():
        tstep()
        dist.all_reduce(buf, op=dist.ReduceOp.AVG)
    # torch's autograd puts a fresh gradient in the process's own memory: any DDP reduces memory
    # no peer maps, which (on shared memory) is read by single copies rather than in place
    private = np.zeros(n, np.float32)

    def torch_allreduce_private():
        tstep()
        dist.all_reduce(private, op=dist.ReduceOp.AVG)
    out = {FLOOR_COPY: (plain_copy, n), FLOOR_ALLREDUCE: (plain_allreduce, n)}
    if tstep is not None:
        out[FLOOR_TORCH] = (torch_allreduce, n)
        out[FLOOR_TORCH_PRIVATE] = (torch_allreduce_private, n)
    return out


def _worker(args):
    import numpy as np  # noqa: F401

    import pyddp.distributed as dist
    from pyddp.nn.parallel import DistributedDataParallel as PDDP

    rank = int(os.environ["RANK"])
    ws = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cpu")
    use_torch = not args.no_torch
    if use_torch:
        import datetime

        import torch
        import torch.distributed as tdist
        from torch.nn.parallel import DistributedDataParallel as TDDP

        torch.set_num_threads(1)
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.torch_port}", rank=rank,
                                 world_size=ws, timeout=datetime.timedelta(seconds=120))
    results = {}
    for size in args.sizes.split(","):
        h = SIZES[size]
        configs = {}
        if use_torch:
            configs["torch plain"] = _torch_setup(h, None)
            configs["torch plain, zero_grad(set_to_none=False)"] = _torch_setup(h, None, set_to_none=False)
            configs["torch DDP (gloo)"] = _torch_setup(h, TDDP)
            configs["torch DDP (gloo), no-op comm hook"] = _torch_setup(h, _torch_noop)
            configs["pyddp DDP, torch model"] = _torch_setup(h, PDDP)
            configs["pyddp DDP, torch model, gradients copied into buckets"] = _torch_setup(h, _copied_in(PDDP))
            configs["pyddp DDP, torch model, zero_grad(set_to_none=False)"] = _torch_setup(
                h, PDDP, set_to_none=False)
        configs["pyddp.nn plain"] = _pyddp_setup(h, None)
        configs["pyddp DDP, pyddp.nn model"] = _pyddp_setup(h, PDDP)
        configs.update(_floor_setup(configs["pyddp.nn plain"], dist, configs.get("torch plain")))
        if use_torch:
            configs[FLOOR_TORCH_EACH] = _torch_setup(h, None, after=_allreduce_each(dist))
        times = {k: [] for k in configs}
        for name, (step, _) in configs.items():   # warm-up (and bucket rebuild)
            for _ in range(3):
                step()
        for _ in range(args.rounds):
            if args.interleave == "step":
                for _ in range(args.steps):
                    for name, (step, _) in configs.items():
                        dist.barrier()
                        t0 = time.perf_counter()
                        step()
                        times[name].append(time.perf_counter() - t0)
                continue
            for name, (step, _) in configs.items():
                dist.barrier()
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - t0)
        nparams = next(iter(configs.values()))[1]
        results[size] = {"params": nparams, "times": {k: _median(v) for k, v in times.items()}}
        del configs
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump(results, f)
    if use_torch:
        tdist.destroy_process_group()
    dist.destroy_process_group()


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = _parse()
    if args.worker:
        return _worker(args)
    if not args.no_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: pyddp.nn rows only")
            args.no_torch = True
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "pyddp.run", "--standalone", "--nproc-per-node", str(args.nproc),
               os.path.abspath(__file__), "--worker", out, "--torch-port", str(_free_port()),
               "--sizes", args.sizes, "--rounds", str(args.rounds), "--steps", str(args.steps),
               "--interleave", args.interleave]
        if args.no_torch:
            cmd.append("--no-torch")
        subprocess.run(cmd, env=env, check=True, timeout=3600)
        with open(out) as f:
            results = json.load(f)
    print(f"DDP step time, {args.nproc} ranks, batch {BATCH} per rank, one thread per rank, "
          f"median of {args.rounds}x{args.steps} steps")
    rows = []
    for size, r in results.items():
        t = r["times"]
        tddp = t.get("torch DDP (gloo)")
        for name, v in t.items():
            plain = t["pyddp.nn plain"]
            if name.endswith("zero_grad(set_to_none=False)"):
                plain = t["torch plain, zero_grad(set_to_none=False)"]
            elif name.startswith(("torch", "pyddp DDP, torch", FLOOR_TORCH, FLOOR_TORCH_PRIVATE,
                                  FLOOR_TORCH_EACH)):
                plain = t["torch plain"]
            vs = f"{tddp / v:.2f}x faster" if tddp and name.startswith("pyddp DDP") else ""
            rows.append((f"{size} ({r['params'] / 1e6:.2f}M)", name, f"{v * 1e3:.2f}",
                         f"{v / plain:.3f}", vs))
    print()
    print("\n".join(_report.header()))
    print()
    print("\n".join(_report.table(("model", "configuration", "step ms", "/ plain", "vs torch DDP"),
                                  rows, align="llrrl")))
    print()
    # targets (issue 18): pyddp's DDP at most its framework's allreduce floor + 0.04 (1.9M, 5.8M)
    for size, r in results.items():
        t = r["times"]
        torch_rows = ("pyddp DDP, torch model", "pyddp DDP, torch model, gradients copied into buckets")
        for name, plain, floor in (
                *((n, "torch plain", FLOOR_TORCH) for n in torch_rows),
                ("pyddp DDP, torch model, zero_grad(set_to_none=False)",
                 "torch plain, zero_grad(set_to_none=False)", FLOOR_TORCH),
                *((n, "torch plain", FLOOR_TORCH_PRIVATE) for n in torch_rows),
                *((n, "torch plain", FLOOR_TORCH_EACH) for n in torch_rows),
                ("pyddp DDP, pyddp.nn model", "pyddp.nn plain", FLOOR_ALLREDUCE)):
            if name in t and floor in t:
                # the floor: the allreduce's time (floor row - its plain step) added to this plain step
                base = "pyddp.nn plain" if floor == FLOOR_ALLREDUCE else "torch plain"
                ratio, fl = t[name] / t[plain], 1.0 + (t[floor] - t[base]) / t[plain]
                ok = ratio <= fl + 0.04
                which = {FLOOR_TORCH_PRIVATE: " (private-array floor)",
                         FLOOR_TORCH_EACH: " (each-gradient floor)"}.get(floor, "")
                print(f"{size} {name}: {ratio:.3f} of plain, floor{which} {fl:.3f} -> {ratio - fl:+.3f} "
                      f"over the floor ({'within' if ok else 'NOT within'} +0.04)")
        if "torch DDP (gloo), no-op comm hook" in t:
            print(f"{size} torch DDP's own cost without communication (no-op hook): "
                  f"{t['torch DDP (gloo), no-op comm hook'] / t['torch plain']:.3f} of plain")
        if FLOOR_COPY in t:
            print(f"{size} one copy of the gradients alone: {t[FLOOR_COPY] / t['pyddp.nn plain']:.3f} "
                  "of the pyddp.nn plain step")


if __name__ == "__main__":
    main()
