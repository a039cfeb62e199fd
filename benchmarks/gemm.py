#!/usr/bin/env python
"""bfloat16 GEMM: pyddp._C.gemm_bf16 (AVX512-BF16 where the CPU has it) against NumPy's float32
matmul (OpenBLAS sgemm) on training-sized products, one thread each.

    python benchmarks/gemm.py                 # the GPT/ViT shapes of benchmarks/nn.py
    python benchmarks/gemm.py --rounds 15
    python benchmarks/gemm.py --quick         # two small shapes (smoke test)

Each shape is timed as np.matmul on float32 operands, gemm_bf16 on the same values rounded to
bfloat16 with a float32 result, and with a bfloat16 result (the autocast path: rounded in the
kernel); the operands are laid out as pyddp's autocast paths pass them (x @ W.T: W transposed,
g.T @ x: the first operand transposed, attention batches).  Method: OMP/OpenBLAS/MKL threads set to
1 before NumPy loads; per round the best of 3 calls of each, interleaved; the table shows GFLOP/s
(2*M*N*K*batch / median time) and the speed-up over float32.  The machine may be shared: repeat
runs and read medians.
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
from pyddp import _C  # noqa: E402

# (name, batch, M, K, N, first operand transposed, second operand transposed)
SHAPES = [
    ("GPT x @ W.T (fc1)", 1, 512, 384, 1536, False, True),
    ("GPT x @ W.T (fc2)", 1, 512, 1536, 384, False, True),
    ("GPT g @ W (fc2 dx)", 1, 512, 1536, 384, False, False),
    ("GPT g.T @ x (fc1 dW)", 1, 1536, 512, 384, True, False),
    ("ViT x @ W.T (qkv)", 1, 788, 192, 576, False, True),
    ("ViT x @ W.T (fc1)", 1, 788, 192, 768, False, True),
    ("ViT g.T @ x (qkv dW)", 1, 576, 788, 192, True, False),
    ("GPT q @ k.T (48 heads)", 48, 64, 64, 64, False, True),
    ("GPT p @ v (48 heads)", 48, 64, 64, 64, False, False),
    ("ViT q @ k.T (12 heads)", 12, 197, 64, 197, False, True),
    ("ViT p @ v (12 heads)", 12, 197, 197, 64, False, False),
    ("ViT p.T @ g (12 heads)", 12, 197, 197, 64, True, False),
]
QUICK = [("small x @ W.T", 1, 64, 96, 80, False, True),
         ("small batch q @ k.T", 4, 33, 16, 33, False, True)]


def _operands(rng, batch, M, K, N, at, bt):
    a = rng.standard_normal((batch, K, M) if at else (batch, M, K)).astype(np.float32)
    b = rng.standard_normal((batch, N, K) if bt else (batch, K, N)).astype(np.float32)
    a = np.swapaxes(a, 1, 2) if at else a
    b = np.swapaxes(b, 1, 2) if bt else b
    return (a[0], b[0]) if batch == 1 else (a, b)


def _best(fn, n=3):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds (default 9)")
    ap.add_argument("--quick", action="store_true", help="two small shapes, 2 rounds")
    args = ap.parse_args(argv)
    import ml_dtypes
    bf = np.dtype(ml_dtypes.bfloat16)
    shapes, rounds = (QUICK, 2) if args.quick else (SHAPES, args.rounds)
    rng = np.random.default_rng(0)
    rows = []
    for name, batch, M, K, N, at, bt in shapes:
        a, b = _operands(rng, batch, M, K, N, at, bt)
        a16, b16 = a.astype(bf).view(np.uint16), b.astype(bf).view(np.uint16)
        o32 = np.empty(a.shape[:-1] + (N,), np.float32)
        o16 = np.empty(o32.shape, np.uint16)
        fns = [lambda: np.matmul(a, b), lambda: _C.gemm_bf16(o32, a16, b16),
               lambda: _C.gemm_bf16(o16, a16, b16)]
        for fn in fns:
            fn()
        times = [[] for _ in fns]
        for _ in range(rounds):
            for t, fn in zip(times, fns):
                t.append(_best(fn))
        med = [statistics.median(t) for t in times]
        flop = 2.0 * batch * M * N * K
        shape = f"{batch}x{M}x{K}x{N}" if batch > 1 else f"{M}x{K}x{N}"
        rows.append([name, shape] + [f"{flop / s / 1e9:.1f}" for s in med] +
                    [f"{med[0] / med[1]:.2f}x", f"{med[0] / med[2]:.2f}x"])
    impl = "AVX512-BF16" if _C.gemm_bf16_native() else "portable C (no AVX512-BF16)"
    print(_report.block(
        f"bfloat16 GEMM ({impl}) against float32 np.matmul, 1 thread, GFLOP/s "
        f"(median of {rounds} rounds, best of 3 each)",
        ["product", "batch x M x K x N", "np.matmul f32", "gemm_bf16 -> f32",
         "gemm_bf16 -> bf16", "speed-up f32 out", "speed-up bf16 out"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
