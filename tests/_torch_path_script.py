"""One rank of the torch-model path, pyddp against torch: run under ``python -m pyddp.run --standalone
--nproc-per-node 2 tests/_torch_path_script.py --device cpu|cuda --backend cpu|nccl --tport PORT --out DIR``.

Every scenario trains the same torch model twice in this process, once through pyddp (pyddp's
DistributedDataParallel, apex amp, fused optimizers, SyncBatchNorm, on pyddp's process group) and once
through torch (torch's DistributedDataParallel on gloo, torch.autocast + torch.amp.GradScaler,
torch.optim), and writes both results to DIR/rank<r>.npz; tests/parallel/test_torch_path.py (CPU tensors) and
tests/gpu/test_gpu_torch_path.py (CUDA tensors) compare them. The code is the same on both devices.
"""
import argparse
import datetime
import os

import numpy as np
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import pyddp.distributed as dist
from pyddp import amp
from pyddp.distributed.algorithms.ddp_comm_hooks import default_hooks as pyddp_hooks
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.nn.parallel import convert_syncbn_model
from pyddp.optimizers import FusedAdam, FusedSGD

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu")
ap.add_argument("--backend", default="cpu")
ap.add_argument("--tport", type=int, required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--only", default="")
args = ap.parse_args()

rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = int(os.environ.get("LOCAL_RANK", rank))
torch.set_num_threads(1)
if args.device == "cuda":
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if args.backend == "nccl":
        import pyddp.cuda
        pyddp.cuda.set_device(dev.index)
else:
    dev = torch.device("cpu")
dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.tport}", rank=rank, world_size=ws,
                         timeout=datetime.timedelta(seconds=120))
B = 4
res = {}
ONLY = set(filter(None, args.only.split(",")))


def scenario(fn):
    if not ONLY or fn.__name__ in ONLY:
        fn()
    return fn


def save(name, model, extra=()):
    for k, p in enumerate(model.parameters()):
        res[f"{name}/p{k}"] = p.detach().float().cpu().numpy() if p.dtype == torch.bfloat16 else \
            p.detach().cpu().numpy()
    for k, b in enumerate(model.buffers()):
        res[f"{name}/b{k}"] = b.detach().cpu().numpy()
    for k, e in enumerate(extra):
        res[f"{name}/x{k}"] = np.asarray(e.detach().cpu().numpy() if torch.is_tensor(e) else e)


class WithExtra(torch.nn.Module):
    """An MLP plus a layer its forward uses only when ``use_extra`` is set (on one rank, one step)."""

    def __init__(self, seq):
        super().__init__()
        self.seq = seq
        self.extra = torch.nn.Linear(3, 3)
        self.use_extra = False

    def forward(self, x):
        y = self.seq(x)
        return self.extra(y) if self.use_extra else y


def mlp(seed, dtype=torch.float64, bn=False, extra=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(6, 16)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(16))
    layers += [torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)]
    m = torch.nn.Sequential(*layers)
    if extra:
        m = WithExtra(m)
    return m.to(device=dev, dtype=dtype)


def data(steps, dtype=torch.float64, seed=1, n=None):
    g = torch.Generator().manual_seed(seed)
    n = n or ws * B
    X = torch.randn(steps, n, 6, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(steps, n, 3, generator=g, dtype=torch.float64).to(dtype)
    return X, Y


def mine(t, s):
    return t[s, rank * B:(rank + 1) * B].to(dev)


def forward_loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x).float(), y.float())


def _sgd(impl, ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


def both(name, make, steps=3, opt=_sgd, dtype=torch.float64, apex=None, **kw):
    """Train ``make(seed)`` through pyddp's DDP and torch's DDP with the same keyword arguments
    (``apex``: apex.parallel.DistributedDataParallel's, for pyddp's only); ``opt(impl, params)`` makes
    each one's optimizer."""
    X, Y = data(steps, dtype=dtype)
    for impl, cls in (("pyddp", DDP), ("torch", TorchDDP)):
        m = make(rank)  # different initial weights per rank: construction broadcasts rank 0's
        ddp = cls(m, **kw, **(apex or {})) if impl == "pyddp" else cls(m, **kw)
        o = opt(impl, list(ddp.parameters()))
        res[f"{name}/{impl}/optimizer"] = np.array(type(o).__name__)
        for s in range(steps):
            o.zero_grad(set_to_none=s % 2 == 0)
            if isinstance(m, WithExtra):  # the extra layer: used by rank 0 at step 1 only
                m.use_extra = rank == 0 and s == 1
            forward_loss(ddp, mine(X, s), mine(Y, s)).backward()
            o.step()
        save(f"{name}/{impl}", m)


@scenario
def ddp():
    both("ddp_default", mlp)
    both("ddp_small_buckets", mlp, bucket_cap_mb=0.001)
    both("ddp_bucket_view", mlp, gradient_as_bucket_view=True, bucket_cap_mb=0.001)
    both("ddp_static_graph", mlp, static_graph=True)
    both("ddp_buffers", lambda s: mlp(s, bn=True), broadcast_buffers=True)
    both("ddp_no_broadcast", lambda s: mlp(s, bn=True), broadcast_buffers=False)
    both("ddp_unused", lambda s: mlp(s, extra=True), find_unused_parameters=True)
    both("ddp_float32", lambda s: mlp(s, dtype=torch.float32), dtype=torch.float32,
         bucket_cap_mb=0.001)
    # apex's keyword arguments on a torch model: with two ranks apex's arithmetic (all_reduce(g / f),
    # then * f / world) is exact, so the result equals torch's averaging
    both("apex_predivide_delay", mlp, apex=dict(gradient_predivide_factor=2.0, delay_allreduce=True))
    both("apex_message_size_retain", mlp, apex=dict(message_size=64, retain_allreduce_buffers=True))
    both("apex_fp32_allreduce", lambda s: mlp(s, dtype=torch.float32), dtype=torch.float32,
         apex=dict(allreduce_always_fp32=True, num_allreduce_streams=2))


@scenario
def no_sync():
    X, Y = data(2, n=2 * ws * B)
    for impl, cls in (("pyddp", DDP), ("torch", TorchDDP)):
        m = mlp(0)
        ddp = cls(m, bucket_cap_mb=0.001)
        o = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for s in range(2):
            o.zero_grad()
            for k in range(2):
                x = X[s, (2 * rank + k) * B:(2 * rank + k + 1) * B].to(dev)
                y = Y[s, (2 * rank + k) * B:(2 * rank + k + 1) * B].to(dev)
                if k == 0:
                    with ddp.no_sync():
                        forward_loss(ddp, x, y).backward()
                else:
                    forward_loss(ddp, x, y).backward()
            o.step()
        save(f"no_sync/{impl}", m)


@scenario
def reducer():
    # apex.parallel.Reducer on a torch model: rank 0's parameters at construction, reduce() averages
    from pyddp.nn.parallel import Reducer

    X, Y = data(3)
    for impl in ("pyddp", "torch"):
        m = mlp(rank)
        model = TorchDDP(m) if impl == "torch" else m
        red = Reducer(m) if impl == "pyddp" else None
        o = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for s in range(3):
            o.zero_grad()
            forward_loss(model, mine(X, s), mine(Y, s)).backward()
            if red is not None:
                red.reduce()
            o.step()
        save(f"reducer/{impl}", m)


@scenario
def hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks

    for hook in ("fp16_compress_hook", "bf16_compress_hook", "allreduce_hook"):
        X, Y = data(3, dtype=torch.float32)
        for impl, cls, mod in (("pyddp", DDP, pyddp_hooks), ("torch", TorchDDP, torch_hooks)):
            m = mlp(rank, dtype=torch.float32)
            ddp = cls(m, bucket_cap_mb=0.001)
            try:
                ddp.register_comm_hook(None, getattr(mod, hook))
            except TypeError:  # torch's bf16 hook wants NCCL: the test compares against fp32
                assert impl == "torch" and hook == "bf16_compress_hook"
                continue
            o = torch.optim.SGD(ddp.parameters(), lr=0.1)
            for s in range(3):
                o.zero_grad()
                forward_loss(ddp, mine(X, s), mine(Y, s)).backward()
                o.step()
            save(f"hook_{hook}/{impl}", m)


@scenario
def join():
    # rank 0 has 3 batches, rank 1 has 2: the joined rank shadows the others' collectives
    X, Y = data(3)
    for impl, cls in (("pyddp", DDP), ("torch", TorchDDP)):
        m = mlp(0)
        ddp = cls(m, bucket_cap_mb=0.001)
        o = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with ddp.join():
            for s in range(3 - rank):
                o.zero_grad()
                forward_loss(ddp, mine(X, s), mine(Y, s)).backward()
                o.step()
        save(f"join/{impl}", m)


@scenario
def fused():
    f32 = dict(dtype=torch.float32)
    both("fused_adam", lambda s: mlp(s, **f32), **f32,
         opt=lambda impl, ps: FusedAdam(ps, lr=0.01, weight_decay=0.01) if impl == "pyddp" else
         torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01, fused=True))
    both("fused_adam_l2", lambda s: mlp(s, **f32), **f32,
         opt=lambda impl, ps: FusedAdam(ps, lr=0.01, weight_decay=0.01, adam_w_mode=False)
         if impl == "pyddp" else torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, fused=True))
    both("fused_sgd", lambda s: mlp(s, **f32), **f32,
         opt=lambda impl, ps: FusedSGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True)
         if impl == "pyddp" else torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3,
                                                 nesterov=True, fused=True))


@scenario
def syncbn():
    # pyddp's SyncBatchNorm (torch model, uneven batches: rank 1 has one sample more) against
    # batch norm on the whole batch in one process; forward, input gradients, parameter grads
    def conv(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                   torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)).to(dev, torch.float64)

    g = torch.Generator().manual_seed(7)
    sizes = [3 + r for r in range(ws)]
    X = torch.randn(sum(sizes), 3, 6, 6, generator=g, dtype=torch.float64)
    W = torch.randn(sum(sizes), 2, 4, 4, generator=g, dtype=torch.float64)
    lo = sum(sizes[:rank])
    sl = slice(lo, lo + sizes[rank])
    m = convert_syncbn_model(conv(0))
    ddp = DDP(m)
    x = X[sl].to(dev).requires_grad_(True)
    out = ddp(x)
    (out * W[sl].to(dev)).sum().backward()
    res["syncbn/type"] = np.array(type(m[1]).__name__)
    res["syncbn/pyddp/out"] = out.detach().cpu().numpy()
    res["syncbn/pyddp/gx"] = x.grad.cpu().numpy()
    # DDP averages the parameter gradients; the full-batch reference sums: times ws
    res["syncbn/pyddp/gw"] = np.concatenate([p.grad.cpu().numpy().ravel() * ws for p in m.parameters()])
    res["syncbn/pyddp/rm"] = m[1].running_mean.cpu().numpy()
    res["syncbn/pyddp/rv"] = m[1].running_var.cpu().numpy()
    ref = conv(0)
    xr = X.to(dev).requires_grad_(True)
    outr = ref(xr)
    (outr * W.to(dev)).sum().backward()
    res["syncbn/torch/out"] = outr[sl].detach().cpu().numpy()
    res["syncbn/torch/gx"] = xr.grad[sl].cpu().numpy()
    res["syncbn/torch/gw"] = np.concatenate([p.grad.cpu().numpy().ravel() for p in ref.parameters()])
    res["syncbn/torch/rm"] = ref[1].running_mean.cpu().numpy()
    res["syncbn/torch/rv"] = ref[1].running_var.cpu().numpy()


@scenario
def syncbn_apex():
    # apex's SyncBatchNorm extras on a torch layer: channel_last input (N, L, C), the residual z and
    # fuse_relu, momentum=None (cumulative average); against batch norm over the whole batch
    from pyddp.nn.modules import _torch_syncbn

    g = torch.Generator().manual_seed(9)
    sizes = [2 + 2 * r for r in range(ws)]
    X = torch.randn(sum(sizes), 5, 3, generator=g, dtype=torch.float64)
    Z = torch.randn(sum(sizes), 5, 3, generator=g, dtype=torch.float64)
    lo = sum(sizes[:rank])
    sl = slice(lo, lo + sizes[rank])
    bn = _torch_syncbn.TorchSyncBatchNorm(3, momentum=None, channel_last=True, fuse_relu=True).to(
        dev, torch.float64)
    x = X[sl].to(dev).requires_grad_(True)
    for _ in range(2):
        out = bn(x, z=Z[sl].to(dev))
    out.square().sum().backward()
    res["syncbn_apex/pyddp/out"] = out.detach().cpu().numpy()
    res["syncbn_apex/pyddp/gx"] = x.grad.cpu().numpy()
    res["syncbn_apex/pyddp/rv"] = bn.running_var.cpu().numpy()
    ref = torch.nn.BatchNorm1d(3, momentum=None).to(dev, torch.float64)
    xr = X.to(dev).requires_grad_(True)
    for _ in range(2):
        outr = torch.relu(ref(xr.movedim(-1, 1)).movedim(1, -1) + Z.to(dev))
    outr.square().sum().backward()  # the loss of every rank together
    res["syncbn_apex/torch/out"] = outr[sl].detach().cpu().numpy()
    res["syncbn_apex/torch/gx"] = xr.grad[sl].cpu().numpy()
    res["syncbn_apex/torch/rv"] = ref.running_var.cpu().numpy()


@scenario
def amp_o1():
    # apex's O1 through pyddp (amp.initialize + scale_loss, pyddp DDP) against torch.autocast +
    # torch.amp.GradScaler (torch DDP): the same float16 casts, the same dynamic scale. Step 2 puts
    # an inf into rank 1's batch only: both ranks skip that step and halve the scale.
    steps = 4
    X, Y = data(steps, dtype=torch.float32)

    def batch(s):
        x, y = mine(X, s), mine(Y, s)
        if s == 2 and rank == 1:
            x = x.clone()
            x[0, 0] = float("inf")
        return x, y

    m = mlp(rank, dtype=torch.float32)
    o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    m, o = amp.initialize(m, o, opt_level="O1", verbosity=0)
    ddp = DDP(m, device_ids=[dev.index] if dev.type == "cuda" else None)
    scales = []
    for s in range(steps):
        o.zero_grad()
        x, y = batch(s)
        loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
        with amp.scale_loss(loss, o) as scaled:
            scaled.backward()
        o.step()
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    save("amp_o1/pyddp", m, [np.array(scales)])
    state = amp.state_dict()
    res["amp_o1/state"] = np.array([state["loss_scaler0"]["loss_scale"],
                                    state["loss_scaler0"]["unskipped"]])
    with amp.disable_casts():  # O1's casts off: torch's own autocast for the torch run
        m = mlp(rank, dtype=torch.float32)
        ddp = TorchDDP(m, device_ids=[dev.index] if dev.type == "cuda" else None)
        o = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 16)
        scales = []
        for s in range(steps):
            o.zero_grad()
            x, y = batch(s)
            with torch.autocast(dev.type, dtype=torch.float16):
                out = ddp(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            scaler.step(o)
            scaler.update()
            scales.append(scaler.get_scale())
    save("amp_o1/torch", m, [np.array(scales)])


np.savez(os.path.join(args.out, f"rank{rank}.npz"), **res)
tdist.destroy_process_group()
dist.destroy_process_group()
