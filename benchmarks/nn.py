#!/usr/bin/env python
"""Training-step benchmark: pyddp's autograd against torch (CPU), in one process, one thread each.

    python benchmarks/nn.py                  # MLP 784-1024-1024-10 and a small CNN, batch 64
    python benchmarks/nn.py --reps 30 --steps 5
    python benchmarks/nn.py --quick          # a few steps (smoke test)

A step is forward, cross-entropy loss, backward and a plain SGD update (p -= lr * p.grad, grads set
to None before each step), written on the functional APIs (F.linear, F.conv2d, F.max_pool2d,
F.cross_entropy) with explicit parameter tensors, so both libraries run the same computation from
the same initial values.  Models:
  MLP: 784 -> 1024 -> 1024 -> 10, ReLU, batch 64.
  CNN: 28x28x1 -> conv 1->16 3x3, ReLU, maxpool 2 -> conv 16->32 3x3, ReLU, maxpool 2 -> flatten
       (32*5*5) -> linear 10, batch 64.
Method: OMP/OpenBLAS/MKL threads set to 1 before NumPy loads, torch.set_num_threads(1); warm-up,
then --reps rounds, each timing --steps steps of pyddp then --steps steps of torch (interleaved so
drift hits both); the table shows the median time per step and the ratio pyddp/torch.  The
machine may be shared: repeat runs and read medians.
"""
import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import _report  # noqa: E402
import pyddp  # noqa: E402
import pyddp.nn.functional as PF  # noqa: E402

LR = 0.01
BATCH = 64


def init_params(kind, rng):
    """Initial parameter arrays (float32), Kaiming-uniform-like."""
    def u(shape, fan_in):
        b = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-b, b, shape).astype(np.float32)
    if kind == "mlp":
        return [u((1024, 784), 784), u((1024,), 784), u((1024, 1024), 1024), u((1024,), 1024),
                u((10, 1024), 1024), u((10,), 1024)]
    return [u((16, 1, 3, 3), 9), u((16,), 9), u((32, 16, 3, 3), 144), u((32,), 144),
            u((10, 800), 800), u((10,), 800)]


def forward(kind, F, p, x):
    """The model on either library's functional API."""
    if kind == "mlp":
        h = F.relu(F.linear(x, p[0], p[1]))
        h = F.relu(F.linear(h, p[2], p[3]))
        return F.linear(h, p[4], p[5])
    h = F.max_pool2d(F.relu(F.conv2d(x, p[0], p[1])), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p[2], p[3])), 2)
    return F.linear(h.flatten(1), p[4], p[5])


def make_step(lib, kind, arrays, x, y):
    """A closure running one training step with lib ('pyddp' or 'torch')."""
    if lib == "pyddp":
        params = [pyddp.tensor(a, requires_grad=True) for a in arrays]
        xt, yt = pyddp.tensor(x), pyddp.tensor(y)

        def step():
            for p in params:
                p.grad = None
            loss = PF.cross_entropy(forward(kind, PF, params, xt), yt)
            loss.backward()
            for p in params:
                d = p._data
                d -= LR * p.grad._data
            return loss
        return step, params
    import torch
    import torch.nn.functional as TF

    params = [torch.tensor(a, requires_grad=True) for a in arrays]
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step():
        for p in params:
            p.grad = None
        loss = TF.cross_entropy(forward(kind, TF, params, xt), yt)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-LR)
        return loss
    return step, params


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="timed rounds (default 20)")
    ap.add_argument("--steps", type=int, default=5, help="steps per round per library (5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--quick", action="store_true", help="3 rounds of 1 step (smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup = 3, 1, 1
    try:
        import torch

        torch.set_num_threads(1)
        have_torch = True
    except ImportError:
        have_torch = False
        print("# note: torch not installed; pyddp only")
    rows = []
    for kind in args.models.split(","):
        rng = np.random.default_rng(0)
        arrays = init_params(kind, rng)
        shape = (BATCH, 784) if kind == "mlp" else (BATCH, 1, 28, 28)
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, BATCH).astype(np.int64)
        libs = ["pyddp"] + (["torch"] if have_torch else [])
        steps = {lib: make_step(lib, kind, arrays, x, y) for lib in libs}
        # same start, same first loss
        losses = {lib: steps[lib][0]().item() for lib in libs}
        if have_torch and abs(losses["pyddp"] - losses["torch"]) > 1e-4 * abs(losses["torch"]):
            print(f"# warning: {kind} first-step losses differ: {losses}")
        for _ in range(args.warmup):
            for lib in libs:
                steps[lib][0]()
        times = {lib: [] for lib in libs}
        for _ in range(args.reps):
            for lib in libs:
                fn = steps[lib][0]
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                times[lib].append((time.perf_counter() - t0) / args.steps * 1e3)
        med = {lib: statistics.median(v) for lib, v in times.items()}
        rows.append((kind, med, losses))
    table = []
    for kind, med, _ in rows:
        t = med.get("torch")
        name = "MLP 784-1024-1024-10" if kind == "mlp" else "CNN conv16-conv32-fc10 (28x28)"
        target = "<= 1.5x" if kind == "mlp" else "<= 3x"
        table.append((name, f"{med['pyddp']:.2f}", f"{t:.2f}" if t else "-",
                      f"{med['pyddp'] / t:.2f}x" if t else "-", target))
    print()
    print(_report.block(f"Training step, batch {BATCH}, 1 thread (median of {args.reps} rounds x "
                        f"{args.steps} steps)",
                        ("model", "pyddp ms", "torch ms", "pyddp/torch", "target"), table,
                        align="lrrrl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
