"""FusedAdam benchmark: one AdamW step over ~10 million float32 parameters (a list of arrays of
varied sizes), pyddp against the same update written as NumPy expressions and against
torch.optim.AdamW (fused=True and the default for-loop), all on one CPU thread.

Prints a markdown table: median milliseconds per step over many repetitions (implementations run
round-robin, so machine noise hits all of them alike), and each one's time relative to pyddp's
FusedAdam.  Every implementation starts from the same weights and gradients; the script checks that
pyddp's parameters after the timed steps match torch's within 1e-5 relative error.

    python benchmarks/optim.py                   # 10M parameters, 20 arrays, 15 repetitions
    python benchmarks/optim.py --numel 1e6 --reps 5 --quick
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pyddp.optim as O  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2


class Array:
    """The minimal tensor the optimizers need (pyddp.Tensor's ``_data`` / ``grad``)."""

    def __init__(self, data, grad=None):
        self._data = data
        self.grad = None if grad is None else Array(grad)

    def __array__(self, dtype=None, copy=None):
        return self._data


def sizes_for(numel, n):
    """n sizes of varied magnitude (1 : 40 between the smallest and the largest) summing to numel."""
    w = np.geomspace(1.0, 40.0, n)[np.random.default_rng(0).permutation(n)]
    s = np.floor(w / w.sum() * numel).astype(np.int64)
    s[0] += numel - s.sum()
    return [int(x) for x in s]


def numpy_adamw(params, grads, ms, vs, step):
    """torch's AdamW formulas as in-place NumPy expressions."""
    b1, b2 = BETAS
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    step_size = np.float32(LR / bc1)
    bc2s = np.float32(bc2 ** 0.5)
    for p, g, m, v in zip(params, grads, ms, vs):
        p *= np.float32(1 - LR * WD)
        m += np.float32(1 - b1) * (g - m)
        v *= np.float32(b2)
        v += np.float32(1 - b2) * g * g
        denom = np.sqrt(v)
        denom /= bc2s
        denom += np.float32(EPS)
        p -= step_size * m / denom


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=float, default=10e6, help="parameters in all (10e6)")
    ap.add_argument("--arrays", type=int, default=20, help="number of parameter arrays (20)")
    ap.add_argument("--reps", type=int, default=15, help="timed steps per implementation (15)")
    ap.add_argument("--quick", action="store_true", help="skip torch's slow for-loop AdamW")
    args = ap.parse_args(argv)
    numel = int(args.numel)
    sizes = sizes_for(numel, args.arrays)
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
    grads = [rng.standard_normal(n, dtype=np.float32) for n in sizes]

    impls = {}
    fused_params = [Array(a.copy(), g) for a, g in zip(init, grads)]
    fused = O.FusedAdam(fused_params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    impls["pyddp FusedAdam"] = fused.step
    plain_params = [Array(a.copy(), g) for a, g in zip(init, grads)]
    plain = O.AdamW(plain_params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    impls["pyddp AdamW"] = plain.step

    np_params = [a.copy() for a in init]
    np_m = [np.zeros_like(a) for a in init]
    np_v = [np.zeros_like(a) for a in init]
    np_step = [0]

    def np_step_fn():
        np_step[0] += 1
        numpy_adamw(np_params, grads, np_m, np_v, np_step[0])

    impls["NumPy expressions"] = np_step_fn
    notes = []
    torch_fused = None
    try:
        import torch

        torch.set_num_threads(1)
        tgrads = [torch.from_numpy(g) for g in grads]
        tp_fused = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
        for p, g in zip(tp_fused, tgrads):
            p.grad = g
        torch_fused = torch.optim.AdamW(tp_fused, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                        fused=True)
        impls["torch AdamW(fused=True)"] = torch_fused.step
        if not args.quick:
            tp_loop = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in init]
            for p, g in zip(tp_loop, tgrads):
                p.grad = g
            torch_loop = torch.optim.AdamW(tp_loop, lr=LR, betas=BETAS, eps=EPS,
                                           weight_decay=WD)
            impls["torch AdamW (default)"] = torch_loop.step
    except ImportError:
        notes.append("torch is not installed: no torch rows")

    # one untimed step each allocates the state; then round-robin timed steps
    for fn in impls.values():
        fn()
    times = {k: [] for k in impls}
    order = list(impls)
    shuffle = np.random.default_rng(2).shuffle
    for _ in range(args.reps):
        shuffle(order)  # no implementation always follows the same one (cache state)
        for name in order:
            t0 = time.perf_counter()
            impls[name]()
            times[name].append(time.perf_counter() - t0)

    if torch_fused is not None:
        steps = args.reps + 1
        ref = [p.detach().numpy() for p in torch_fused.param_groups[0]["params"]]
        # relative error, the denominator floored at 0.1 of the array's largest magnitude (as
        # tests/_optim_ref.py: elements that cancel differ by an ulp of their terms)
        bad = []
        for name, ours in (("pyddp FusedAdam", [p._data for p in fused_params]),
                           ("pyddp AdamW", [p._data for p in plain_params]),
                           ("NumPy", np_params)):
            err = max(float(np.max(np.abs(a - r) / np.maximum(np.abs(r), 0.1 * np.abs(r).max())))
                      for a, r in zip(ours, ref))
            if err > 1e-5:
                bad.append(f"WARNING: {name} differs from torch by {err:.3g} after {steps} steps")
        notes.extend(bad or [f"checked: pyddp's and NumPy's parameters equal torch's within "
                             f"1e-5 relative error after {steps} steps"])

    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    base = med["pyddp FusedAdam"]
    moved = numel * 4 * 7  # read p, g, m, v; write p, m, v
    rows = [(k, f"{med[k]:.2f}", f"{min(times[k]) * 1e3:.2f}", f"{med[k] / base:.2f}x",
             f"{moved / (med[k] * 1e-3) / 1e9:.1f}") for k in impls]
    print(_report.block(
        f"AdamW step over {numel:,} float32 parameters in {len(sizes)} arrays "
        f"({min(sizes):,}..{max(sizes):,} elements), 1 thread, median of {args.reps} steps",
        ("implementation", "median ms/step", "min ms", "time / pyddp FusedAdam", "GB/s moved"), rows))
    print()
    for n in notes:
        print(f"# note: {n}")


if __name__ == "__main__":
    main()
