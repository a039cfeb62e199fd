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

Transformer models (--models gpt,vit; in the default set), written on nn.Module APIs as real scripts
are (nn.Embedding, nn.Linear, nn.LayerNorm, nn.GELU, nn.Conv2d patch embedding,
F.scaled_dot_product_attention, F.cross_entropy, optim.AdamW, amp.GradScaler), one class body run
with pyddp's modules and with torch's; torch's parameters are copied from pyddp's, so both start
from the same values:
  GPT: character-level GPT like nanoGPT's shakespeare-char (vocab 65, n_embd 384, 6 heads,
       6 layers, causal attention, no dropout), block 64, batch 8; float32, under
       autocast(dtype=bfloat16), and under autocast(dtype=float16) with GradScaler.
  ViT: ViT-tiny (224x224x3, patch 16, dim 192, depth 12, 3 heads, MLP 768, class token,
       1000 classes), batch 4; float32 and under autocast(dtype=bfloat16).
  For the autocast rows the table also shows each library's autocast/float32 step-time ratio
  (the target: pyddp's no worse than torch's own CPU autocast).  In this table the ratios are
  medians of per-round ratios (the steps compared ran seconds apart in the same round), the
  times medians over rounds.  --quick shrinks these models
  (1 layer, small batch) so the smoke test stays fast.
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


# ---------------------------------------------------------------------------------------------
# transformer models on nn.Module APIs (one definition, run with either library's modules)

GPT_CFG = dict(vocab=65, d=384, heads=6, layers=6, block=64, batch=8)
VIT_CFG = dict(img=224, patch=16, d=192, depth=12, heads=3, classes=1000, batch=4)
QUICK_GPT = dict(vocab=65, d=64, heads=2, layers=1, block=16, batch=2)
QUICK_VIT = dict(img=32, patch=16, d=32, depth=1, heads=2, classes=10, batch=2)


def model_classes(torch):
    """GPT and ViT classes written against ``torch`` (real torch or pyddp)."""
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, heads, causal):
            super().__init__()
            self.heads, self.causal = heads, causal
            self.ln_1 = nn.LayerNorm(d)
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d)
            self.c_fc = nn.Linear(d, 4 * d)
            self.gelu = nn.GELU()
            self.mlp_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            h = self.heads
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab, d, heads, layers, block, **_):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(block, d)
            self.h = nn.ModuleList([Block(d, heads, True) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx, targets):
            T = idx.size(1)
            pos = torch.arange(0, T, dtype=torch.long)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    class ViT(nn.Module):
        def __init__(self, img, patch, d, depth, heads, classes, **_):
            super().__init__()
            n = (img // patch) ** 2
            self.patch_embed = nn.Conv2d(3, d, kernel_size=patch, stride=patch)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
            self.pos_embed = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
            self.blocks = nn.ModuleList([Block(d, heads, False) for _ in range(depth)])
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, classes)

        def forward(self, x, targets):
            x = self.patch_embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            x = x + self.pos_embed
            for blk in self.blocks:
                x = blk(x)
            return F.cross_entropy(self.head(self.norm(x)[:, 0]), targets)

    return GPT, ViT


MODES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def make_tf_step(lib, kind, mode, cfg, data, init):
    """(step closure, model) for a transformer model; init: parameter arrays by name (None: this
    model's own are the reference, returned through its named_parameters)."""
    if lib == "pyddp":
        mod = pyddp
    else:
        import torch as mod
    GPT, ViT = model_classes(mod)
    mod.manual_seed(0)
    model = GPT(**cfg) if kind == "gpt" else ViT(**cfg)
    if init is not None:
        with mod.no_grad():
            for name, p in model.named_parameters():
                p.copy_(mod.tensor(init[name]))
    x, y = (mod.tensor(a) for a in data)
    opt = mod.optim.AdamW(model.parameters(), lr=1e-4)
    dt = getattr(mod, MODES[mode]) if MODES[mode] else None
    scaler = mod.amp.GradScaler("cpu") if mode == "fp16" else None

    def step():
        opt.zero_grad(set_to_none=True)
        with mod.autocast(device_type="cpu", dtype=dt or mod.bfloat16, enabled=dt is not None):
            loss = model(x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss
    return step, model


def tf_data(kind, cfg, rng):
    if kind == "gpt":
        idx = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["block"] + 1)).astype(np.int64)
        return idx[:, :-1].copy(), idx[:, 1:].copy()
    x = rng.standard_normal((cfg["batch"], 3, cfg["img"], cfg["img"])).astype(np.float32)
    return x, rng.integers(0, cfg["classes"], cfg["batch"]).astype(np.int64)


def run_transformer(kind, modes, libs, args, quick):
    """{(lib, mode): median ms}, {(lib, mode): first loss} for one transformer model."""
    cfg = dict((QUICK_GPT if kind == "gpt" else QUICK_VIT) if quick else
               (GPT_CFG if kind == "gpt" else VIT_CFG))
    if args.batch:
        cfg["batch"] = args.batch
    rng = np.random.default_rng(0)
    data = tf_data(kind, cfg, rng)
    steps, init = {}, None
    for mode in modes:
        for lib in libs:
            fn, model = make_tf_step(lib, kind, mode, cfg, data, init)
            if init is None:
                init = {n: np.array(p.detach().numpy()) for n, p in model.named_parameters()}
            steps[(lib, mode)] = fn
    losses = {k: float(fn().item()) for k, fn in steps.items()}
    for _ in range(args.warmup):
        for fn in steps.values():
            fn()
    times = {k: [] for k in steps}
    reps = args.reps_tf
    for _ in range(reps):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(args.steps_tf):
                fn()
            times[k].append((time.perf_counter() - t0) / args.steps_tf * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    # ratios as medians of per-round ratios: the two steps of a pair ran seconds apart, so a
    # shared machine's load changes hit both (steadier than a ratio of medians)
    ratio = {}
    for k, v in times.items():
        lib, mode = k
        if ("torch", mode) in times and lib == "pyddp":
            ratio[("vs_torch", mode)] = statistics.median(
                a / b for a, b in zip(v, times[("torch", mode)]))
        if mode != "fp32" and (lib, "fp32") in times:
            ratio[(lib, mode)] = statistics.median(a / b for a, b in zip(v, times[(lib, "fp32")]))
    med["ratio"] = ratio
    return med, losses, cfg


def tf_table(kind, med, losses, cfg, modes, have_torch):
    rows, warnings = [], []
    if kind == "gpt":
        base = (f"GPT-char d{cfg['d']} L{cfg['layers']} T{cfg['block']} B{cfg['batch']}")
    else:
        base = (f"ViT-tiny {cfg['img']}px d{cfg['d']} L{cfg['depth']} B{cfg['batch']}")
    label = {"fp32": "float32", "bf16": "autocast bf16", "fp16": "autocast fp16+scaler"}
    ratio = med["ratio"]
    for mode in modes:
        p = med[("pyddp", mode)]
        t = med.get(("torch", mode))
        if have_torch:
            lp, lt = losses[("pyddp", mode)], losses[("torch", mode)]
            tol = 1e-3 if mode == "fp32" else 3e-2
            if abs(lp - lt) > tol * abs(lt):
                warnings.append(f"# warning: {kind} {mode} first-step losses differ: "
                                f"pyddp {lp:.6f} torch {lt:.6f}")
        if mode == "fp32":
            pr = tr = "-"
            target = "<= 1.5x" if kind == "vit" else "-"
        else:
            pr = f"{ratio[('pyddp', mode)]:.2f}" if ("pyddp", mode) in ratio else "-"
            tr = f"{ratio[('torch', mode)]:.2f}" if ("torch", mode) in ratio else "-"
            target = "pyddp ac/fp32 <= torch's"
        vs = ratio.get(("vs_torch", mode))
        rows.append((f"{base} {label[mode]}", f"{p:.1f}", f"{t:.1f}" if t else "-",
                     f"{vs:.2f}x" if vs else "-", pr, tr, target))
    return rows, warnings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="timed rounds (default 20)")
    ap.add_argument("--steps", type=int, default=5, help="steps per round per library (5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps-tf", type=int, default=5,
                    help="timed rounds for gpt/vit (default 5)")
    ap.add_argument("--steps-tf", type=int, default=1, help="steps per round for gpt/vit (1)")
    ap.add_argument("--models", default="mlp,cnn,gpt,vit")
    ap.add_argument("--modes", default="fp32,bf16,fp16",
                    help="GPT precisions: fp32, bf16 (autocast), fp16 (autocast + GradScaler)")
    ap.add_argument("--batch", type=int, default=0, help="override gpt/vit batch")
    ap.add_argument("--quick", action="store_true",
                    help="3 rounds of 1 step, small transformer models (smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup = 3, 1, 1
        args.reps_tf, args.steps_tf = 2, 1
    try:
        import torch

        torch.set_num_threads(1)
        have_torch = True
    except ImportError:
        have_torch = False
        print("# note: torch not installed; pyddp only")
    rows, tf_rows, notes = [], [], []
    libs = ["pyddp"] + (["torch"] if have_torch else [])
    modes = [m for m in args.modes.split(",") if m]
    for kind in args.models.split(","):
        if kind in ("gpt", "vit"):
            kmodes = modes if kind == "gpt" else [m for m in modes if m != "fp16"]
            med, losses, cfg = run_transformer(kind, kmodes, libs, args, args.quick)
            r, w = tf_table(kind, med, losses, cfg, kmodes, have_torch)
            tf_rows += r
            notes += w
            continue
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
    for n in notes:
        print(n)
    if table:
        print()
        print(_report.block(f"Training step, batch {BATCH}, 1 thread (median of {args.reps} rounds "
                            f"x {args.steps} steps)",
                            ("model", "pyddp ms", "torch ms", "pyddp/torch", "target"), table,
                            align="lrrrl"))
    if tf_rows:
        print()
        print(_report.block(f"Transformer training step (AdamW), 1 thread (median of "
                            f"{args.reps_tf} rounds x {args.steps_tf} steps)",
                            ("model", "pyddp ms", "torch ms", "pyddp/torch", "pyddp ac/fp32",
                             "torch ac/fp32", "target"), tf_rows, align="lrrrrrl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
