#!/usr/bin/env python
"""The seed notes' ``mp.spawn`` DDP example (nn.Linear(10, 10), MSELoss, SGD, gloo), ported to pyddp.

    python examples/spawn_linear.py                 # 2 ranks, started by pyddp.multiprocessing.spawn
    python examples/spawn_linear.py --nproc 3 --steps 20

The original (the torch "DDP例程" tutorial script) imports torch.distributed, torch.multiprocessing, torch.nn,
torch.optim and torch.nn.parallel; here each import names the pyddp module of the same path.  Two
lines changed beyond the imports, both because pyddp tensors live on the CPU: ``model.to(rank)`` and
``torch.randn(20, 10).to(rank)`` moved the model and data to GPU ``rank``; here they stay on the CPU
(``Module.to(rank)`` is accepted and does nothing, ``Tensor.to(rank)`` would raise), and
``device_ids=[rank]`` is left out (pyddp would accept it with a warning).  Under
``PYDDP_CUDA_ON_CPU=1`` the original lines run as they are (tests/porting/test_porting_gpu_lines.py runs the
seed script this way).  The original takes one
step; this one takes ``--steps`` and checks what DDP promises: every rank ends with the same
parameters, although each saw different data.
"""
import argparse
import os
import socket

import numpy as np

import pyddp
import pyddp.distributed as dist
import pyddp.multiprocessing as mp
import pyddp.nn as nn
import pyddp.optim as optim
from pyddp.nn.parallel import DistributedDataParallel as DDP


def example(rank, world_size, port, steps):
    """One rank: build the model, wrap it in DDP, train on this rank's random data."""
    # 1. the default process group comes before any DDP operation
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    # a local model; different on every rank until DDP broadcasts rank 0's state_dict()
    pyddp.manual_seed(rank)
    model = nn.Linear(10, 10)

    # 2. the DDP model: every rank gets a reducer that averages gradients with allreduce
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    for step in range(steps):
        # forward pass on this rank's own data
        outputs = ddp_model(pyddp.randn(20, 10))
        labels = pyddp.randn(20, 10)
        # backward pass: the gradients are averaged over the ranks through allreduce
        loss = loss_fn(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        # every rank applies the same averaged gradient, so the models stay identical
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)

    # every rank's parameters equal rank 0's, to the bit
    flat = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    gathered = [np.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        same = all(np.array_equal(g, gathered[0]) for g in gathered)
        print(f"parameters identical on all {world_size} ranks: {same}", flush=True)
    dist.destroy_process_group()


def main():
    """Pick a free port and start the ranks with pyddp.multiprocessing.spawn."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (default 2)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world_size = args.nproc
    mp.spawn(example,
             args=(world_size, port, args.steps),
             nprocs=world_size,
             join=True)


if __name__ == "__main__":
    main()
