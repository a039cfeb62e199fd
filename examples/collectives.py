#!/usr/bin/env python
"""A short tour of pyddp's collectives, point-to-point messages and object collectives.

    pyddp-run --standalone --nproc-per-node 2 examples/collectives.py     # one process per rank
    python examples/collectives.py --nproc 3                              # spawns the ranks itself

Every call is torch.distributed's, on NumPy arrays (torch CPU tensors and pyddp Tensors work the
same way, updated in place).  Each step checks its result against what NumPy computes from every
rank's input, so a wrong answer stops the tour with an AssertionError; rank 0 prints what it got.
"""
import argparse
import os
import socket

import numpy as np

import pyddp.distributed as dist


def say(*msg):
    """Print on rank 0 only."""
    if dist.get_rank() == 0:
        print(*msg, flush=True)


def tour():
    """Run every collective once on the default group and check it."""
    dist.init_process_group("cpu")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    say(f"{world} ranks, backend {dist.get_backend()}")

    def data(r, n=4):  # what rank r contributes
        return np.arange(n, dtype=np.float32) + 10 * r

    everyone = np.stack([data(r) for r in range(world)])

    # all_reduce: every rank ends with the sum (or AVG, MIN, MAX, PRODUCT, ...) of all inputs
    x = data(rank)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    assert np.array_equal(x, everyone.sum(0))
    say("all_reduce(SUM)      ", x)
    x = data(rank)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert np.array_equal(x, everyone.max(0))
    say("all_reduce(MAX)      ", x)

    # broadcast: rank 0's array everywhere
    x = data(rank)
    dist.broadcast(x, src=0)
    assert np.array_equal(x, data(0))
    say("broadcast(src=0)     ", x)

    # reduce: the sum on the destination only
    x = data(rank)
    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
    if rank == 0:
        assert np.array_equal(x, everyone.sum(0))
    say("reduce(dst=0)        ", x)

    # all_gather: a list with every rank's array; all_gather_into_tensor: one array
    out = [np.empty(4, np.float32) for _ in range(world)]
    dist.all_gather(out, data(rank))
    assert np.array_equal(np.stack(out), everyone)
    flat = np.empty(4 * world, np.float32)
    dist.all_gather_into_tensor(flat, data(rank))
    assert np.array_equal(flat, everyone.ravel())
    say("all_gather_into_tensor", flat)

    # gather / scatter: to and from one rank
    out = [np.empty(4, np.float32) for _ in range(world)] if rank == 0 else None
    dist.gather(data(rank), gather_list=out, dst=0)
    if rank == 0:
        assert np.array_equal(np.stack(out), everyone)
    x = np.empty(4, np.float32)
    dist.scatter(x, scatter_list=[data(r) * -1 for r in range(world)] if rank == 0 else None, src=0)
    assert np.array_equal(x, -data(rank))
    say("scatter(src=0)       ", x)

    # reduce_scatter_tensor: sum over ranks, then rank r keeps chunk r
    big = np.arange(2 * world, dtype=np.float32) + rank
    mine = np.empty(2, np.float32)
    dist.reduce_scatter_tensor(mine, big)
    total = sum(np.arange(2 * world, dtype=np.float32) + r for r in range(world))
    assert np.array_equal(mine, total[2 * rank:2 * rank + 2])
    say("reduce_scatter_tensor", mine)

    # all_to_all_single: rank r sends chunk j to rank j
    send = np.arange(world, dtype=np.int64) + 100 * rank
    recv = np.empty(world, np.int64)
    dist.all_to_all_single(recv, send)
    assert np.array_equal(recv, np.arange(world) * 100 + rank)
    say("all_to_all_single    ", recv)

    # point to point around a ring: isend/irecv return Work handles
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    got = np.empty(1, np.int64)
    reqs = [dist.isend(np.array([rank], np.int64), dst=nxt), dist.irecv(got, src=prv)]
    for r in reqs:
        r.wait()
    assert got[0] == prv
    say("isend/irecv ring     ", f"rank 0 got {got[0]} from rank {prv}")

    # async collectives overlap with other work
    x = data(rank)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    assert np.array_equal(x, everyone.sum(0))

    # object collectives: any picklable Python object
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "pid": os.getpid()})
    assert [o["rank"] for o in objs] == list(range(world))
    say("all_gather_object    ", [o["rank"] for o in objs])
    box = [{"lr": 0.1, "note": "from rank 0"} if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    assert box[0]["note"] == "from rank 0"
    say("broadcast_object_list", box[0])
    piece = [None]
    dist.scatter_object_list(piece, [f"task {r}" for r in range(world)] if rank == 0 else None,
                             src=0)
    assert piece[0] == f"task {rank}"

    # a subgroup: collectives among some of the ranks
    evens = dist.new_group(ranks=list(range(0, world, 2)))
    if rank % 2 == 0:
        x = np.ones(1, np.float32)
        dist.all_reduce(x, group=evens)
        assert x[0] == len(range(0, world, 2))
    dist.barrier()
    say("all checks passed")
    dist.destroy_process_group()


def _spawned(rank, world, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tour()


def main():
    """Run the tour in this process (launched per rank) or start --nproc ranks with spawn."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not launched (2)")
    args = p.parse_args()
    if "RANK" in os.environ:
        tour()
        return
    import pyddp.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args.nproc, port), nprocs=args.nproc)


if __name__ == "__main__":
    main()
