#!/usr/bin/env python
"""Data-parallel training of a small MLP on handwritten digits, NumPy only, with pyddp.

    python examples/train_mlp.py --nproc 2            # starts 2 ranks on this machine
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/train_mlp.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python examples/train_mlp.py
                                                      # or one process per rank, as torchrun starts them

The data is the UCI "Optical Recognition of Handwritten Digits" test set (1,797 8x8 images, 10 classes;
the same array as sklearn's load_digits), bundled in examples/data/digits.npz: nothing is downloaded.

What each rank does, as torch's DistributedDataParallel would:
  1. builds the model with its own random seed, then takes rank 0's parameters (dist.broadcast), so every
     rank starts from the same point;
  2. each epoch, shuffles the training set with a seed shared by all ranks and takes every world_size-th
     example starting at its rank (as DistributedSampler does);
  3. per step, computes the gradient of its own mini-batch with a forward and backward pass written out in
     NumPy, sums the gradients of all ranks (dist.all_reduce into one flat buffer) and divides by world_size,
     and takes the same SGD-with-momentum step as every other rank.
Rank 0 prints the training loss (averaged over all ranks) and the test accuracy after every epoch.
"""
import argparse
import os
import socket
import sys
import time

import numpy as np

try:
    import pyddp.distributed as dist
except ImportError:  # run from a source checkout built in place (python setup.py build_ext --inplace)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import pyddp.distributed as dist

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.npz")


def load_digits(test_fraction=0.2, seed=0):
    """Train/test split of the bundled digits, features scaled to [0, 1]; the same on every rank."""
    with np.load(DATA) as f:
        x = f["X"].astype(np.float32) / 16.0
        y = f["y"].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


class MLP:
    """in -> hidden -> ReLU -> hidden -> ReLU -> classes, softmax cross-entropy.

    All parameters are views into one flat array (and all gradients into another), so a whole gradient is
    averaged across ranks with a single all_reduce, as DDP does with its buckets.
    """

    def __init__(self, sizes, seed):
        self.shapes = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            self.shapes += [(fan_in, fan_out), (fan_out,)]
        total = sum(int(np.prod(s)) for s in self.shapes)
        self.flat = np.zeros(total, dtype=np.float32)
        self.grad_flat = np.zeros(total, dtype=np.float32)
        self.params = self._views(self.flat)
        self.grads = self._views(self.grad_flat)
        rng = np.random.default_rng(seed)
        for w in self.params[0::2]:
            # He initialisation for ReLU layers; biases stay zero.
            w[...] = rng.standard_normal(w.shape, dtype=np.float32) * np.sqrt(2.0 / w.shape[0])

    def _views(self, flat):
        views, offset = [], 0
        for s in self.shapes:
            n = int(np.prod(s))
            views.append(flat[offset:offset + n].reshape(s))
            offset += n
        return views

    def forward(self, x):
        """Logits, and the activations the backward pass needs."""
        acts = [x]
        h = x
        n_layers = len(self.params) // 2
        for i in range(n_layers):
            w, b = self.params[2 * i], self.params[2 * i + 1]
            h = h @ w + b
            if i < n_layers - 1:
                h = np.maximum(h, 0.0)
                acts.append(h)
        return h, acts

    def loss_and_grad(self, x, y):
        """Mean cross-entropy of the batch; fills self.grads with its gradient."""
        logits, acts = self.forward(x)
        logits = logits - logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        probs = exp / exp.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
        delta = probs
        delta[np.arange(n), y] -= 1.0
        delta /= n
        for i in range(len(self.params) // 2 - 1, -1, -1):
            a = acts[i]
            np.matmul(a.T, delta, out=self.grads[2 * i])
            np.sum(delta, axis=0, out=self.grads[2 * i + 1])
            if i > 0:
                delta = (delta @ self.params[2 * i].T) * (a > 0)
        return loss

    def predict(self, x):
        return self.forward(x)[0].argmax(axis=1)


def shard(n, epoch, rank, world, seed):
    """This rank's example indices for one epoch (DistributedSampler: shuffle, pad, take every world-th)."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    per_rank = -(-n // world)
    order = np.concatenate([order, order[: per_rank * world - n]])  # pad so all ranks take equal steps
    return order[rank::world]


def train(args):
    dist.init_process_group("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_digits(seed=args.seed)

    # Different on every rank on purpose: the broadcast below is what makes them agree.
    model = MLP([x_train.shape[1], args.hidden, args.hidden, 10], seed=args.seed + 1 + rank)
    dist.broadcast(model.flat, src=0)
    velocity = np.zeros_like(model.flat)

    local_batch = max(1, args.batch_size // world)
    if rank == 0:
        print(f"digits: {len(y_train)} train / {len(y_test)} test examples, {world} ranks, "
              f"batch {local_batch} per rank ({local_batch * world} in all), "
              f"{model.flat.size} parameters", flush=True)
    stats = np.zeros(2, dtype=np.float64)
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        mine = shard(len(y_train), epoch, rank, world, args.seed)
        stats[:] = 0.0
        for start in range(0, len(mine), local_batch):
            idx = mine[start:start + local_batch]
            loss = model.loss_and_grad(x_train[idx], y_train[idx])
            # Average the gradient over ranks: sum in place, then divide.
            dist.all_reduce(model.grad_flat, op=dist.ReduceOp.SUM)
            model.grad_flat /= world
            velocity *= args.momentum
            velocity += model.grad_flat
            model.flat -= args.lr * velocity
            stats += (loss * len(idx), len(idx))
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        if rank == 0:
            accuracy = float((model.predict(x_test) == y_test).mean())
            print(f"epoch {epoch + 1:3d}  loss {stats[0] / stats[1]:.4f}  test accuracy {accuracy:.4f}  "
                  f"({time.perf_counter() - t0:.2f} s)", flush=True)

    # Every rank took the same steps from the same start, so the parameters must agree to the bit.
    reference = model.flat.copy()
    dist.broadcast(reference, src=0)
    in_sync = np.array([float(np.array_equal(reference, model.flat))], dtype=np.float64)
    dist.all_reduce(in_sync, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"parameters identical on all {world} ranks: {bool(in_sync[0])}", flush=True)
    dist.destroy_process_group()
    return 0 if in_sync[0] else 1


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned_rank(rank, world, port, args):
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    sys.exit(train(args))


def spawn(args):
    """Start args.nproc ranks on this machine and wait for them, each wait bounded by args.timeout."""
    import multiprocessing as mp
    import secrets

    # Ranks prove to each other that they belong to this job (see the README on PYDDP_SECRET).
    os.environ.setdefault("PYDDP_SECRET", secrets.token_hex(16))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_spawned_rank, args=(r, args.nproc, port, args), name=f"rank{r}")
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    status = 0
    try:
        while any(p.is_alive() for p in procs):
            if time.monotonic() > deadline:
                print(f"train_mlp: timed out after {args.timeout:.0f} s", file=sys.stderr)
                status = 1
                break
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                # One rank died: the others would wait on it, so stop them now.
                print(f"train_mlp: {failed[0].name} exited with status {failed[0].exitcode}",
                      file=sys.stderr)
                status = 1
                break
            for p in procs:
                p.join(timeout=0.1)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    if status == 0 and any(p.exitcode != 0 for p in procs):
        bad = next(p for p in procs if p.exitcode != 0)
        print(f"train_mlp: {bad.name} exited with status {bad.exitcode}", file=sys.stderr)
        status = 1
    return status


def main(argv=None):
    ap = argparse.ArgumentParser(description="Data-parallel MLP on the UCI digits with pyddp (NumPy only).")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to start on this machine (ignored when RANK/WORLD_SIZE are set), default 2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for the spawned ranks")
    args = ap.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return train(args)  # started per rank, torchrun style
    if args.nproc < 1:
        ap.error("--nproc must be >= 1")
    return spawn(args)


if __name__ == "__main__":
    sys.exit(main())
