"""One training step on one GPU: pyddp's DistributedDataParallel + pyddp amp O1 against torch's DDP (nccl) +
torch.amp, in the same process.

    python benchmarks/ddp_gpu.py                       # a small CNN and a small transformer
    python benchmarks/ddp_gpu.py --rounds 9 --steps 20 --json out.json

World size 1 on the ``nccl`` backend for both (pyddp's own NCCL binding; torch's ProcessGroupNCCL), so the
numbers are the cost of each runtime's DDP and mixed-precision machinery around the same torch model, the
same cuDNN/cuBLAS kernels and a one-rank allreduce. A step is zero_grad + forward under float16 autocast +
loss + scaled backward (bucketed allreduce during backward) + unscale/inf-check + optimizer step; the step
time is measured between two ``torch.cuda.synchronize()`` calls, step by step, the configurations taking
turns (rounds x steps samples of each; a pause of the machine costs one sample, not a round); the table
gives the median step time and pyddp's ratio to torch (the target: at most 1.03x). ``--breakdown`` adds
the mixed configurations (pyddp DDP + torch.amp, torch DDP + amp O1, no DDP) that say whether a gap is
DDP's or amp's; ``--kernels`` and ``--profile`` say where it goes (GPU kernels and operators per step,
host time per function). Without a usable GPU it says so and exits 0.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402


def _parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per configuration per round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="cnn,transformer")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="after the table, profile STEPS steps of each configuration with cProfile and print "
                         "the functions that take the most host time (where a gap between the two comes from)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the mixed configurations (pyddp DDP + torch.amp, torch DDP + pyddp amp O1, "
                         "O1 with the casts off during backward, no DDP) to attribute a gap to DDP or to amp")
    ap.add_argument("--kernels", type=int, default=0, metavar="STEPS",
                    help="count the operators and GPU kernels of STEPS steps of each configuration "
                         "(torch.profiler) and list those whose counts differ")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the same steps on the CPU (gloo, CPU autocast): checks the script, times nothing "
                         "worth reading")
    return ap.parse_args()


def _no_gpu_reason():
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    try:
        import pyddp.cuda

        pyddp.cuda.nccl.version()
    except Exception as e:  # pyddp found no libnccl / libcudart
        return f"pyddp's nccl backend is not available: {type(e).__name__}: {e}"
    return ""


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models(torch, which, dev="cuda"):
    nn = torch.nn
    out = {}
    if "cnn" in which:
        def cnn():
            torch.manual_seed(0)
            return nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                nn.Flatten(), nn.Linear(128, 10)).to(dev)

        def cnn_batch():
            g = torch.Generator(device=dev).manual_seed(1)
            return (torch.randn(64, 3, 32, 32, device=dev, generator=g),
                    torch.randint(0, 10, (64,), device=dev, generator=g))
        out["cnn (3 conv, 32x32, batch 64)"] = (cnn, cnn_batch, nn.CrossEntropyLoss())
    if "transformer" in which:
        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(1000, 256)
                layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
                self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = nn.Linear(256, 1000)

            def forward(self, x):
                return self.head(self.enc(self.emb(x))).flatten(0, 1)

        def tiny():
            torch.manual_seed(0)
            return Tiny().to(dev)

        def tiny_batch():
            g = torch.Generator(device=dev).manual_seed(1)
            x = torch.randint(0, 1000, (16, 128), device=dev, generator=g)
            return x, torch.randint(0, 1000, (16 * 128,), device=dev, generator=g)
        out["transformer (2 layers, d 256, seq 128, batch 16)"] = (tiny, tiny_batch, nn.CrossEntropyLoss())
    return out


def _profile(keys, steps, n, sync, top=25):
    """cProfile over n steps of each configuration: the functions with the most own host time."""
    import cProfile
    import io
    import pstats

    for k in keys:
        for name, fn in steps:
            prof = cProfile.Profile()
            sync()
            prof.enable()
            for _ in range(n):
                fn(k)
            sync()
            prof.disable()
            buf = io.StringIO()
            st = pstats.Stats(prof, stream=buf)
            print(f"# profile: {name}, {k}, {n} steps, {st.total_tt / n * 1e3:.3f} ms of host time per step "
                  f"(under the profiler)")
            st.sort_stats("tottime").print_stats(top)
            print("\n".join("#   " + line for line in buf.getvalue().splitlines() if line.strip()))


def _kernels(torch, keys, configs, n, sync):
    """torch.profiler over n steps of each configuration: the operators the host dispatched and the GPU
    kernels per step, the kernels' summed GPU time, and the operators and kernels whose counts differ."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for k in keys:
        counts = {}
        for name, fn in configs:
            fn(k)
            sync()
            with profile(activities=acts) as prof:
                for _ in range(n):
                    fn(k)
                sync()
            ops, kern, us = Counter(), Counter(), 0.0
            for e in prof.events():
                if "CUDA" in str(getattr(e, "device_type", "")):
                    kern[e.name] += 1
                    us += getattr(e, "device_time_total", 0.0)
                elif e.name.startswith("aten::"):
                    ops[e.name] += 1
            counts[name] = ops + Counter({"kernel " + kn: v for kn, v in kern.items()})
            print(f"# profiler: {k}, {name}: {sum(ops.values()) / n:.0f} aten operators, "
                  f"{sum(kern.values()) / n:.0f} GPU kernels ({us / n / 1e3:.3f} ms of GPU time) per step")
        names = [name for name, _ in configs]
        ref = counts[names[1]]
        diff = sorted((kn for kn in set().union(*counts.values())
                       if len({counts[a][kn] for a in names}) > 1),
                      key=lambda kn: -max(abs(counts[a][kn] - ref[kn]) for a in names))
        print(f"# per step, the operators and kernels whose counts differ ({' | '.join(names)}):")
        for kn in diff[:30]:
            print("#   " + " | ".join(f"{counts[a][kn] / n:g}" for a in names) + "   " + kn[:100])


def main():
    args = _parse()
    why = "" if args.cpu_smoke else _no_gpu_reason()
    if why:
        print(f"benchmarks/ddp_gpu.py: skipped: {why}")
        return 0
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import pyddp.distributed as dist
    from pyddp import amp
    from pyddp.nn.parallel import DistributedDataParallel as DDP

    dev = "cpu" if args.cpu_smoke else "cuda"
    if dev == "cuda":
        import pyddp.cuda

        torch.cuda.set_device(0)
        pyddp.cuda.set_device(0)
    backend = "nccl" if dev == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    tdist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    torch.backends.cudnn.benchmark = True
    ids = [0] if dev == "cuda" else None

    specs = _models(torch, args.models.split(","), dev)
    keys = list(specs)
    sgd = (lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    # pyddp: apex's order (amp.initialize, then DDP), one initialize for every model (a second call undoes
    # the first): "p" pyddp DDP + O1, and with --breakdown "to" torch DDP + O1, "no" O1 without DDP
    o1_sets = ["p"] + (["to", "no"] if args.breakdown else [])
    o1_models = [(c, k, s[0]()) for c in o1_sets for k, s in specs.items()]
    ms, os_ = amp.initialize([m for _, _, m in o1_models], [sgd(m) for _, _, m in o1_models],
                             opt_level="O1", verbosity=0)
    o1 = {(c, k): (m, o) for (c, k, _), m, o in zip(o1_models, ms, os_)}
    wrap = {"p": lambda m: DDP(m, device_ids=ids), "to": lambda m: TorchDDP(m, device_ids=ids),
            "no": lambda m: m}
    o1 = {ck: (wrap[ck[0]](m), o) for ck, (m, o) in o1.items()}
    # torch.amp configurations: "t" torch DDP (the reference), with --breakdown "pt" pyddp DDP, "nt" no DDP
    ta_wrap = {"t": lambda m: TorchDDP(m, device_ids=ids)}
    if args.breakdown:
        ta_wrap.update({"pt": lambda m: DDP(m, device_ids=ids), "nt": lambda m: m})
    ta = {}
    for c, w in ta_wrap.items():
        for k, s in specs.items():
            m = s[0]()
            ta[c, k] = (w(m), sgd(m), torch.amp.GradScaler(dev))
    batches = {k: specs[k][1]() for k in keys}

    def o1_step(c, k, casts_in_backward=True):
        x, y = batches[k]
        model, o = o1[c, k]
        o.zero_grad()
        loss = specs[k][2](model(x), y)
        with amp.scale_loss(loss, o) as scaled:
            if casts_in_backward:
                scaled.backward()
            else:
                with amp.disable_casts():
                    scaled.backward()
        o.step()

    def torch_amp_step(c, k):
        x, y = batches[k]
        model, o, s = ta[c, k]
        o.zero_grad()
        with amp.disable_casts():  # pyddp's O1 casts off: torch's own autocast context instead
            with torch.autocast(dev, dtype=torch.float16):
                loss = specs[k][2](model(x), y)
            s.scale(loss).backward()
            s.step(o)
            s.update()

    def pyddp_step(k):
        o1_step("p", k)

    def torch_step(k):
        torch_amp_step("t", k)

    configs = [("pyddp", pyddp_step), ("torch", torch_step)]
    if args.breakdown:
        configs += [("pyddp DDP + torch.amp", lambda k: torch_amp_step("pt", k)),
                    ("torch DDP + amp O1", lambda k: o1_step("to", k)),
                    ("pyddp DDP + amp O1, casts off in backward", lambda k: o1_step("p", k, False)),
                    ("no DDP + amp O1", lambda k: o1_step("no", k)),
                    ("no DDP + torch.amp", lambda k: torch_amp_step("nt", k))]

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def timed(fn, k, n):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(k)
        sync()
        return (time.perf_counter() - t0) / n

    def one(fn, k):
        sync()
        t0 = time.perf_counter()
        fn(k)
        sync()
        return time.perf_counter() - t0

    rows, out, extra = [], {}, []
    for k in keys:
        for _, fn in configs:
            timed(fn, k, args.warmup)
        # step by step, the configurations in turn (the order reversed every other step): a pause of the
        # machine (the GPU hosts are VMs) costs one sample of one configuration, not a whole round
        t = {name: [] for name, _ in configs}
        for i in range(args.rounds * args.steps):
            for name, fn in (configs if i % 2 == 0 else configs[::-1]):
                t[name].append(one(fn, k))
        p, q = statistics.median(t["pyddp"]), statistics.median(t["torch"])
        rows.append([k, f"{q * 1e3:.3f}", f"{p * 1e3:.3f}", f"{p / q:.3f}"])
        out[k] = {"torch_ms": q * 1e3, "pyddp_ms": p * 1e3, "ratio": p / q,
                  "torch_all_ms": [v * 1e3 for v in t["torch"]], "pyddp_all_ms": [v * 1e3 for v in t["pyddp"]],
                  "quartiles_ms": {name: [v * 1e3 for v in statistics.quantiles(t[name], n=4)]
                                   for name in ("torch", "pyddp") if len(t[name]) > 1}}
        for name, _ in configs[2:]:
            m = statistics.median(t[name])
            extra.append([k, name, f"{m * 1e3:.3f}", f"{m / q:.3f}"])
            out[k][name + " ms"] = m * 1e3
    if args.profile:
        _profile(keys, configs, args.profile, sync)
    if args.kernels:
        _kernels(torch, keys, configs, args.kernels, sync)
    print(_report.block(
        "One training step on one GPU: pyddp DDP + amp O1 vs torch DDP (nccl) + torch.amp (median of "
        f"{args.rounds * args.steps} steps each, timed one by one, the configurations in turn)",
        ["model", "torch DDP + torch.amp (ms)", "pyddp DDP + amp O1 (ms)", "ratio (target <= 1.03)"], rows,
        notes=[f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
               f"pyddp NCCL {'.'.join(map(str, pyddp.cuda.nccl.version()))}" if dev == "cuda" else
               "--cpu-smoke: the same steps on the CPU (gloo, CPU autocast); not a measurement"]))
    if extra:
        print(_report.block("Breakdown: the same step in mixed configurations (median ms, ratio to torch DDP + "
                            "torch.amp)", ["model", "configuration", "ms", "ratio"], extra))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    tdist.destroy_process_group()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
