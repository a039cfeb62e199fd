#!/usr/bin/env python
"""A torch model trained with pyddp as its distributed runtime (no torch.distributed, no gloo).

    pyddp-run --standalone --nproc-per-node 2 examples/torch_model.py
    pyddp-run --standalone --nproc-per-node 2 examples/torch_model.py --opt-level O1

The model, the loss and the forward/backward passes are torch's (CPU); pyddp supplies the rest:
``pyddp.distributed`` (process group over shared memory), ``pyddp.nn.parallel.DistributedDataParallel``
(gradient buckets allreduced while torch's backward runs, found through torch's post-accumulate-grad
hooks), ``pyddp.utils.data.DistributedSampler`` + ``DataLoader`` (pyddp Tensor batches, torch's indices bit for
bit), ``pyddp.optimizers.FusedAdam`` updating the torch parameters in place, and, with --opt-level,
apex-style mixed precision from ``pyddp.amp``.  Needs torch (the CPU wheel: ``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu``) and the
digits of scikit-learn (or the bundled copy in examples/data).
"""
import argparse
import os
import socket
import time

import numpy as np
import torch
import torch.nn as tnn

import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.optimizers import FusedAdam
from pyddp.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))


def load_digits(seed=0):
    """The digits as (N, 1, 8, 8) float32 images and int64 labels, split 80/20 the same way on every
    rank."""
    try:
        from sklearn.datasets import load_digits as sk
        d = sk()
        x, y = d.data, d.target
    except ImportError:
        with np.load(os.path.join(HERE, "data", "digits.npz")) as f:
            x, y = f["X"], f["y"]
    x = (np.asarray(x, np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(y, np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = len(y) // 5
    return (x[order[n_test:]], y[order[n_test:]]), (x[order[:n_test]], y[order[:n_test]])


def make_model():
    """A small torch CNN: conv 1->16, ReLU, conv 16->32, ReLU, max-pool, linear 512->10."""
    return tnn.Sequential(
        tnn.Conv2d(1, 16, 3, padding=1), tnn.ReLU(),
        tnn.Conv2d(16, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Flatten(), tnn.Linear(32 * 4 * 4, 10),
    )


def main():
    """Train for --epochs and print the test accuracy after each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64, help="images per step over all ranks")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--opt-level", choices=["O0", "O1", "O2", "O3"], default=None,
                   help="mixed precision through pyddp.amp (default: off)")
    args = p.parse_args()

    if "RANK" not in os.environ:  # no launcher: a job of one rank
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(s.getsockname()[1]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # pyddp's backend: the name is an alias
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's parameters

    (xtr, ytr), (xte, yte) = load_digits()
    train_set = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=max(1, args.batch_size // world), sampler=sampler)

    model = make_model()
    optimizer = FusedAdam(model.parameters(), lr=args.lr)  # updates the torch parameters in place
    amp = None
    if args.opt_level is not None:
        from pyddp import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    model = DDP(model)
    criterion = tnn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        model.train()
        stats = np.zeros(2)
        for x, y in loader:
            x, y = torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy())  # pyddp -> torch, no copy
            loss = criterion(model(x).float(), y)
            optimizer.zero_grad()
            if amp is not None:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
            stats += (loss.item() * len(y), len(y))
        dist.all_reduce(stats)
        model.eval()
        with torch.no_grad():
            # each rank scores every world-th test image; one all_reduce adds the counts
            logits = model(torch.from_numpy(xte[rank::world])).float()
            correct = np.array([(logits.argmax(1).numpy() == yte[rank::world]).sum(), len(logits)],
                               dtype=np.float64)
        dist.all_reduce(correct)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  train loss {stats[0] / stats[1]:.4f}  "
                  f"test accuracy {correct[0] / correct[1]:.4f}  ({time.perf_counter() - t0:.2f} s)",
                  flush=True)

    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).numpy()
    ref = flat.copy()
    dist.broadcast(ref, src=0)
    same = np.array([float(np.array_equal(ref, flat))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"parameters identical on all {world} ranks: {bool(same[0])}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
