"""Fused unscale + non-finite check benchmark: ~10 million float32 gradient elements (a list of
arrays of varied sizes) multiplied by 1/scale with an inf/NaN check, pyddp's one-pass C kernel
(pyddp._kernels.unscale_) against NumPy (multiply, then isfinite) and against torch's
torch._amp_foreach_non_finite_check_and_unscale_, all on one CPU thread.

Prints a markdown table: median milliseconds per call over many repetitions (implementations
take turns in a shuffled order), and each one's time relative to pyddp's.  The inverse scale alternates between
2^-10 and 2^10 so the gradients stay the same values (exact) whatever the number of repetitions.
A check-only row (inv_scale = 1: read, no write) shows the cost of the check alone, and a row
with NumPy's in-place multiply alone (no check) shows what one pass over the memory costs: once
the arrays outgrow the caches every one-pass kernel is bound by it, which caps the speedup over
NumPy's two passes at about 2x.

    python benchmarks/amp.py                   # 10M elements, 20 arrays, 30 repetitions
    python benchmarks/amp.py --numel 1e6 --reps 5
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pyddp import _kernels as K  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402


def sizes_for(numel, n):
    """n sizes of varied magnitude (1 : 40) summing to numel."""
    w = np.geomspace(1.0, 40.0, n)[np.random.default_rng(0).permutation(n)]
    s = np.floor(w / w.sum() * numel).astype(np.int64)
    s[0] += numel - s.sum()
    return [int(x) for x in s]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=float, default=10e6, help="gradient elements in all (10e6)")
    ap.add_argument("--arrays", type=int, default=20, help="number of arrays (20)")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per implementation (30)")
    args = ap.parse_args(argv)
    numel = int(args.numel)
    sizes = sizes_for(numel, args.arrays)
    rng = np.random.default_rng(1)
    base = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
    invs = [np.float32(2.0 ** -10), np.float32(2.0 ** 10)]
    notes = []

    ours = [a.copy() for a in base]
    ours_found = np.zeros(1, np.float32)
    ours_inv = [np.array([v], np.float32) for v in invs]

    def pyddp_fn(k):
        K.unscale_(ours, ours_found, ours_inv[k % 2])

    check = [a.copy() for a in base]

    def check_fn(k):
        K.unscale_(check, ours_found, 1.0)

    npg = [a.copy() for a in base]
    np_found = np.zeros(1, np.float32)

    def numpy_fn(k):
        inv = invs[k % 2]
        bad = False
        for g in npg:
            g *= inv
            bad |= not np.isfinite(g).all()
        if bad:
            np_found[0] = 1.0

    npm = [a.copy() for a in base]

    def numpy_mul_fn(k):
        inv = invs[k % 2]
        for g in npm:
            g *= inv

    impls = {"pyddp unscale_ (fused)": pyddp_fn, "NumPy (multiply, then isfinite)": numpy_fn}
    try:
        import torch

        torch.set_num_threads(1)
        tg = [torch.from_numpy(a.copy()) for a in base]
        t_found = torch.zeros(1)
        t_inv = [torch.full((1,), float(v)) for v in invs]

        def torch_fn(k):
            torch._amp_foreach_non_finite_check_and_unscale_(tg, t_found, t_inv[k % 2])

        impls["torch _amp_foreach_non_finite_check_and_unscale_"] = torch_fn
    except ImportError:
        notes.append("torch is not installed: no torch row")
    impls["pyddp check only (inv_scale=1)"] = check_fn
    impls["NumPy multiply alone, no check (one-pass floor)"] = numpy_mul_fn

    for fn in impls.values():  # warm up (page in, caches)
        fn(1)
        fn(0)
    times = {k: [] for k in impls}
    order = list(impls)
    shuffle = np.random.default_rng(2).shuffle
    for r in range(args.reps):
        shuffle(order)  # no implementation always follows the same one (cache state)
        for name in order:
            t0 = time.perf_counter()
            impls[name](r)
            times[name].append(time.perf_counter() - t0)

    # correctness: everyone scaled the same way, nobody saw an inf; then an inf is caught
    rest = [a.copy() for a in ours]
    if args.reps % 2:
        for a in (ours, npg):
            K.unscale_(a, None, float(invs[args.reps % 2]))
    ok = all(np.array_equal(a, b) for a, b in zip(ours, npg)) and ours_found[0] == 0
    ok &= all(np.array_equal(a, b) for a, b in zip(ours, base))
    rest[-1][-1] = np.inf
    ok &= K.unscale_(rest, None, 0.5)
    notes.append("checked: pyddp's results equal NumPy's, no false inf, an inf is found"
                 if ok else "WARNING: pyddp's results differ from NumPy's")

    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    ref = med["pyddp unscale_ (fused)"]
    rows = []
    for k in impls:
        nbytes = numel * 4 * (1 if "check only" in k else 2)
        rows.append((k, f"{med[k]:.2f}", f"{min(times[k]) * 1e3:.2f}", f"{med[k] / ref:.2f}x",
                     f"{nbytes / (med[k] * 1e-3) / 1e9:.1f}"))
    print(_report.block(
        f"unscale + inf/NaN check of {numel:,} float32 gradient elements in {len(sizes)} "
        f"arrays ({min(sizes):,}..{max(sizes):,}), 1 thread, median of {args.reps} calls",
        ("implementation", "median ms", "min ms", "time / pyddp", "GB/s"), rows))
    print()
    for n in notes:
        print(f"# note: {n}")


if __name__ == "__main__":
    main()
