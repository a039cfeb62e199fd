# A DDP script in the style of torch's "Getting Started with DDP" tutorial (mp.spawn, a TCPStore
# made by hand, a subgroup, a communication hook), written for pyddp's tests: it uses the
# torch.distributed API that the README says behaves the same (store queues, append, list_keys,
# clone, barrier; new_group(sort_ranks=False); group queries on ranks outside a group;
# barrier(timeout=); supports_complex; GradBucket).  Only the imports differ from the torch script.
# import torch
# import torch.distributed as dist
# import torch.multiprocessing as mp
# import torch.nn as nn
# import torch.optim as optim
# from torch.nn.parallel import DistributedDataParallel as DDP
import pyddp as torch
import pyddp.distributed as dist
import pyddp.multiprocessing as mp
import pyddp.nn as nn
import pyddp.optim as optim
from pyddp.nn.parallel import DistributedDataParallel as DDP
import datetime
import os
import sys


def averaging_hook(state, bucket: dist.GradBucket):
    # the default all-reduce, written out as torch's comm hook tutorial does
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def worker(rank, world_size, port):
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    assert dist.get_pg_count() == 1

    # a work queue on the store: rank 0 hands out tasks, everyone pops until it is empty
    work = store.clone()
    if rank == 0:
        for task in range(12):
            work.queue_push("tasks", str(task))
    work.barrier("tasks-ready", world_size)
    done = []
    while True:
        try:
            done.append(int(work.queue_pop("tasks", block=False)))
        except dist.QueueEmptyError:
            break
    work.append("done", "".join(f"{t}," for t in done))
    work.multi_set([f"count/{rank}"], [str(len(done))])
    dist.barrier(timeout=datetime.timedelta(seconds=30))
    counts = work.multi_get([f"count/{r}" for r in range(world_size)])
    finished = sorted(int(t) for t in work.get("done").decode().split(",") if t)
    keys = [k for k in work.list_keys() if k.startswith("count/")]

    # a subgroup of the last rank and rank 0, in that order
    pair = dist.new_group([world_size - 1, 0], sort_ranks=False)
    pair_ranks = dist.get_process_group_ranks(pair)
    first = dist.get_global_rank(pair, 0)

    model = nn.Linear(10, 10)
    ddp_model = DDP(model)
    ddp_model.register_comm_hook(None, averaging_hook)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    torch.manual_seed(rank)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 10)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    same = bool(torch.equal(ref, flat))

    print(f"rank {rank}: tasks {sum(int(c) for c in counts)} finished {finished == list(range(12))} "
          f"keys {len(keys)} pair {pair_ranks} first {first} pg_count {dist.get_pg_count()} "
          f"complex AVG {dist.supports_complex(dist.ReduceOp.AVG)} "
          f"complex MAX {dist.supports_complex(dist.ReduceOp.MAX)} "
          f"parameters identical on all ranks: {same}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    port = int(os.environ.get("MASTER_PORT", "29511"))
    mp.spawn(worker, args=(world_size, port), nprocs=world_size, join=True)
