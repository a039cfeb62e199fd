#!/usr/bin/env python
"""Data-parallel training of a small CNN on handwritten digits: a PyTorch-style DDP script on pyddp.

    pyddp-run --standalone --nproc-per-node 2 examples/train_digits.py            # torchrun style
    python -m pyddp.launch --nproc_per_node 2 examples/train_digits.py            # --local_rank style
    pyddp-run --standalone --nproc-per-node 2 examples/train_digits.py --opt-level O1  # apex amp
    pyddp-run --standalone --nproc-per-node 2 examples/train_digits.py --resume runs/digits/digits_ckpt.pt --epochs 20
    python examples/train_digits.py                                               # one rank, no launcher

This is the common torch DDP training script (as in the "DDP 多卡分布式训练" tutorials and the apex
notes) with ``torch`` replaced by ``pyddp``: argparse with ``--local_rank`` (pyddp.launch) and the
``LOCAL_RANK`` variable (pyddp.run), ``init_process_group``, a ``DistributedSampler`` with ``set_epoch``
every epoch, a CNN from ``pyddp.nn`` wrapped in ``DistributedDataParallel``, optional apex-style mixed
precision (``amp.initialize`` / ``amp.scale_loss``), ``FusedAdam`` (apex.optimizers) or SGD with an lr
scheduler, evaluation over all ranks, and logging plus checkpointing ``{'model', 'optimizer', 'amp'}`` on
rank 0 only, with ``--resume``.

Data: the 1,797 8x8 handwritten digits that ship inside scikit-learn (``sklearn.datasets.load_digits``,
no download); without scikit-learn the same array bundled in examples/data/digits.npz is used.  Rank 0
shows a tqdm progress bar (when tqdm is installed and stderr is a terminal; in a log file or CI the
one line per epoch is the progress) and writes a PNG of the loss and accuracy curves (when matplotlib
is installed): ``pip install ".[examples]"`` installs both.  The checkpoint and the PNG go into
``--out`` (default ``runs/digits`` under the working directory; ``runs/`` is ignored by git).

Threads: every rank computes with one BLAS/OpenMP thread unless OMP_NUM_THREADS says otherwise, also
when the script runs alone as one rank (the launchers set it only for several workers per node).  This
model's matrix products are small (8x8 images, 32 per step), where more threads only wait for one
another: run bare on a busy 2-core machine, a thread per core made training 3-5x slower.

The defaults (12 epochs, FusedAdam lr 3e-3 with cosine decay, 64 images per step over all ranks) reach
about 98.9% test accuracy (98.6% with --opt-level O1 or O2); measured times, with the machine and its
load, are in docs/benchmarks.md ("Training examples and mixed precision").
"""
import argparse
import math
import os
import socket
import sys
import time

# Before NumPy loads its BLAS, which reads it once (see the docstring: one thread per rank by default).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import pyddp
import pyddp.distributed as dist
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.optim import SGD
from pyddp.optim.lr_scheduler import CosineAnnealingLR
from pyddp.optimizers import FusedAdam
from pyddp.utils.data import DataLoader, Subset, TensorDataset
from pyddp.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    """The command line (pyddp.launch appends ``--local_rank=N``; pyddp.run sets LOCAL_RANK)."""
    p = argparse.ArgumentParser(description="Data-parallel CNN on the scikit-learn digits with pyddp.")
    # multiprocessing settings, as in the seed notes; LOCAL_RANK is the torchrun/pyddp.run way
    p.add_argument("--local_rank", "--local-rank", type=int,
                   default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="local rank, set by pyddp.launch (default: $LOCAL_RANK or 0)")
    p.add_argument("-e", "--epochs", type=int, default=12, help="epochs to train (default: 12)")
    p.add_argument("-b", "--batch-size", type=int, default=64,
                   help="images per step over all ranks (default: 64)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: 3e-3 for fusedadam, 0.05 for sgd)")
    p.add_argument("--optimizer", choices=["fusedadam", "sgd"], default="fusedadam")
    p.add_argument("--opt-level", choices=["O0", "O1", "O2", "O3"], default=None,
                   help="apex-style mixed precision through pyddp.amp (default: off, float32)")
    p.add_argument("--backend", default="gloo",
                   help="process-group backend: gloo (pyddp's own, the default) or mpi (under "
                        "mpirun/srun, needs mpi4py)")
    p.add_argument("--sync-bn", action="store_true", help="convert BatchNorm layers to SyncBatchNorm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join("runs", "digits"), metavar="DIR",
                   help="directory for the checkpoint and the curves, created by rank 0 "
                        "(default: runs/digits)")
    p.add_argument("--checkpoint", default=None,
                   help="checkpoint written by rank 0 after every epoch (default: OUT/digits_ckpt.pt)")
    p.add_argument("--resume", default=None, metavar="PATH",
                   help="continue from this checkpoint (model, optimizer, scheduler, amp, epoch)")
    p.add_argument("--plot", default=None,
                   help="PNG of the loss and accuracy curves written at the end "
                        "(default: OUT/digits_curves.png; '' for none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on rank 0 (there is none either when stderr is not a terminal)")
    args = p.parse_args(argv)
    if args.checkpoint is None:
        args.checkpoint = os.path.join(args.out, "digits_ckpt.pt")
    if args.plot is None:
        args.plot = os.path.join(args.out, "digits_curves.png")
    return args


def load_digits(test_fraction=0.2, seed=0):
    """Train and test split of the 8x8 digits as (N, 1, 8, 8) float32 images in [0, 1] and int64
    labels; the same split on every rank."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
        d = sk_load_digits()
        x, y = d.data, d.target
    except ImportError:  # the same array, bundled (examples/data/README.md)
        with np.load(os.path.join(HERE, "data", "digits.npz")) as f:
            x, y = f["X"], f["y"]
    x = (np.asarray(x, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(y, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class DigitsCNN(nn.Module):
    """conv 1->32 3x3, BN, ReLU, conv 32->64 3x3, BN, ReLU, 2x2 max-pool, dropout, linear 1024->10."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 4 * 4, 10))

    def forward(self, x):
        """Logits of a batch of (N, 1, 8, 8) images."""
        return self.classifier(self.features(x))


def init_ddp(backend="gloo"):
    """Join the process group (env://: pyddp.run, pyddp.launch, mpirun and srun set the variables;
    backend 'mpi' takes the ranks from MPI itself).

    Started without a launcher, this process becomes a job of one rank on a free local port."""
    launched = any(v in os.environ for v in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                             "SLURM_PROCID"))
    if not launched:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    # 'gloo' as in a torch CPU script; it is an alias of pyddp's own "cpu" backend
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def evaluate(model, test_set, rank, world, batch_size=256):
    """Loss and accuracy on the whole test set: each rank scores every world-th image, one
    all_reduce adds the counts (exact: no sample is padded or counted twice)."""
    model.eval()
    part = Subset(test_set, range(rank, len(test_set), world))
    stats = np.zeros(3, dtype=np.float64)  # loss sum, correct, count
    with pyddp.no_grad():
        for x, y in DataLoader(part, batch_size=batch_size, shuffle=False):
            logits = model(x)          # the loader yields pyddp Tensors, as torch's yields tensors
            stats[0] += float(F.cross_entropy(logits.float(), y, reduction="sum").item())
            stats[1] += int((logits.argmax(1) == y).sum())
            stats[2] += len(y)
    dist.all_reduce(stats)
    model.train()
    return stats[0] / stats[2], stats[1] / stats[2]


def save_plot(history, path):
    """Write the training loss, test loss and test accuracy per epoch to a PNG (needs matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", flush=True)
        return
    epochs = np.arange(1, len(history["train_loss"]) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(epochs, history["train_loss"], "o-", label="train")
    ax1.plot(epochs, history["test_loss"], "s-", label="test")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("cross-entropy")
    ax1.set_yscale("log")
    ax1.legend()
    ax2.plot(epochs, history["test_acc"], "o-", color="C2")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy")
    ax2.set_ylim(min(0.8, min(history["test_acc"])), 1.0)
    ax2.grid(alpha=0.3)
    fig.suptitle(f"digits CNN, {history['world_size']} ranks (pyddp DDP)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"curves written to {path}", flush=True)


def main(argv=None):
    """Train, evaluate and checkpoint; returns the final test accuracy."""
    args = parse_args(argv)
    t_start = time.perf_counter()
    rank, world = init_ddp(args.backend)
    local_rank = args.local_rank
    is_main = rank == 0
    pyddp.manual_seed(args.seed + rank)  # different on purpose: DDP broadcasts rank 0's parameters

    train_set, test_set = load_digits(seed=args.seed)
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    per_rank = max(1, args.batch_size // world)
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=False)

    model = DigitsCNN()
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if args.optimizer == "fusedadam":
        optimizer = FusedAdam(model.parameters(), lr=args.lr or 3e-3, betas=(0.9, 0.999),
                              weight_decay=1e-4)
    else:
        optimizer = SGD(model.parameters(), lr=args.lr or 0.05, momentum=0.9, weight_decay=1e-4)

    amp = None
    if args.opt_level is not None:
        from pyddp import amp  # apex.amp's API: initialize / scale_loss / state_dict
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    # model first, amp.initialize second, DDP last (as the seed notes say)
    model = DDP(model)
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)

    start_epoch = 0
    history = {"train_loss": [], "test_loss": [], "test_acc": [], "world_size": world}
    if args.resume:
        ckpt = pyddp.load(args.resume)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if amp is not None and ckpt.get("amp") is not None:
            amp.load_state_dict(ckpt["amp"])
        scheduler.load_state_dict(ckpt["scheduler"])
        # The schedule now ends at this run's --epochs.  The saved learning rate may already be
        # the end of the old schedule (0 after all its epochs), and cosine steps only scale the
        # current rate: put it where the longer cosine schedule stands at this epoch.
        scheduler.T_max = args.epochs
        t = min(scheduler.last_epoch, args.epochs)
        for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = scheduler.eta_min + (base_lr - scheduler.eta_min) * \
                (1 + math.cos(math.pi * t / args.epochs)) / 2
        start_epoch = int(ckpt["epoch"]) + 1
        history.update({k: list(v) for k, v in ckpt["history"].items() if k != "world_size"})
        if is_main:
            print(f"resumed from {args.resume} at epoch {start_epoch + 1}", flush=True)

    if is_main:
        for path in (args.checkpoint, args.plot):
            if path and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"digits: {len(train_set)} train / {len(test_set)} test images, {world} ranks "
              f"(local rank {local_rank} here), {per_rank} images per rank per step, "
              f"{n_params} parameters, {type(optimizer).__name__}, "
              f"opt_level {args.opt_level or 'off'}", flush=True)

    progress = None
    if is_main and not args.no_progress:
        try:
            from tqdm import tqdm
            progress = tqdm
        except ImportError:
            pass

    criterion = nn.CrossEntropyLoss()
    acc = float("nan")
    for epoch in range(start_epoch, args.epochs):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        model.train()
        seen = np.zeros(2, dtype=np.float64)  # loss sum, count
        batches = loader
        if progress is not None:
            # On stderr; disable=None: no bar when stderr is not a terminal, where its carriage
            # returns would leave a stuck fragment per epoch in the log (the epoch line follows anyway).
            batches = progress(loader, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False,
                               dynamic_ncols=True, mininterval=0.5, disable=None)
        for images, labels in batches:
            output = model(images)
            loss = criterion(output.float(), labels)
            optimizer.zero_grad()
            if amp is not None:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            seen += (float(loss.item()) * len(labels), len(labels))
        scheduler.step()
        dist.all_reduce(seen)
        test_loss, acc = evaluate(model, test_set, rank, world)
        history["train_loss"].append(seen[0] / seen[1])
        history["test_loss"].append(test_loss)
        history["test_acc"].append(acc)
        # only log and save on rank 0
        if is_main:
            print(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {seen[0] / seen[1]:.4f}  "
                  f"test loss {test_loss:.4f}  test accuracy {acc:.4f}  "
                  f"lr {scheduler.get_last_lr()[0]:.2e}  ({time.perf_counter() - t0:.2f} s)",
                  flush=True)
            checkpoint = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "amp": amp.state_dict() if amp is not None else None,
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
                "history": history,
            }
            pyddp.save(checkpoint, args.checkpoint)

    # Every rank took the same steps from the same start: the parameters agree to the bit.
    flat = np.concatenate([p.detach().numpy().ravel().astype(np.float64)
                           for p in model.parameters()])
    ref = flat.copy()
    dist.broadcast(ref, src=0)
    same = np.array([float(np.array_equal(ref, flat))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if is_main:
        print(f"parameters identical on all {world} ranks: {bool(same[0])}", flush=True)
        print(f"final test accuracy {acc:.4f} after {len(history['test_acc'])} epochs, "
              f"{time.perf_counter() - t_start:.1f} s", flush=True)
        if args.plot and history["test_acc"]:
            save_plot(history, args.plot)
    dist.destroy_process_group()
    return acc


if __name__ == "__main__":
    main()
