"""torch's generic_join tutorial (Counter, a Joinable whose join_device is cuda:<rank>, backend "nccl")
ported by its imports, run under PYDDP_CUDA_ON_CPU=1: tests/cuda/test_cuda_on_cpu.py runs it.  Only
MASTER_PORT comes from the environment (the tutorial fixes 29500)."""
import os

import pyddp as torch
import pyddp.distributed as dist
import pyddp.multiprocessing as mp
from pyddp.distributed.algorithms.join import Join, Joinable, JoinHook

BACKEND = "nccl"
WORLD_SIZE = 2
NUM_INPUTS = 5


class CounterJoinHook(JoinHook):
    def __init__(self, counter, sync_max_count):
        self.counter = counter
        self.sync_max_count = sync_max_count

    def main_hook(self):
        t = torch.zeros(1, device=self.counter.device)
        dist.all_reduce(t)

    def post_hook(self, is_last_joiner: bool):
        if not self.sync_max_count:
            return
        rank = dist.get_rank(self.counter.process_group)
        common_rank = torch.tensor([rank if is_last_joiner else -1], device=self.counter.device)
        dist.all_reduce(common_rank, op=dist.ReduceOp.MAX)
        if rank == common_rank.item():
            self.counter.max_count = self.counter.count.detach().clone()
        dist.broadcast(self.counter.max_count, src=common_rank.item())


class Counter(Joinable):
    def __init__(self, device, process_group):
        super(Counter, self).__init__()
        self.device = device
        self.process_group = process_group
        self.count = torch.tensor([0], device=device).float()
        self.max_count = torch.tensor([0], device=device).float()

    def __call__(self):
        Join.notify_join_context(self)
        t = torch.ones(1, device=self.device).float()
        dist.all_reduce(t)
        self.count += t

    def join_hook(self, **kwargs) -> JoinHook:
        sync_max_count = kwargs.get("sync_max_count", False)
        return CounterJoinHook(self, sync_max_count)

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self):
        return self.process_group


def worker(rank):
    assert torch.cuda.device_count() >= WORLD_SIZE
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ.setdefault('MASTER_PORT', '29500')
    dist.init_process_group(BACKEND, rank=rank, world_size=WORLD_SIZE)

    counter = Counter(torch.device(f"cuda:{rank}"), dist.group.WORLD)
    inputs = [torch.tensor([1]).float() for _ in range(NUM_INPUTS + rank)]

    with Join([counter], sync_max_count=True):
        for _ in inputs:
            counter()

    print(f"{int(counter.count.item())} inputs processed before rank {rank} joined!")
    print(f"{int(counter.max_count.item())} inputs processed across all ranks!")
    dist.destroy_process_group()


def main():
    mp.spawn(worker, nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
