# A GPU-style DDP script as tutorials and apex's ImageNet example write it: device_count() as the
# world size, set_device, backend "nccl" through a variable, .cuda(), device="cuda", .to(rank),
# an apex-style stream prefetcher, torch.cuda.amp, topk accuracy, cuda.synchronize.  Only the
# imports changed.  tests/cuda/test_cuda_on_cpu.py runs it unchanged on a machine without a GPU under
# PYDDP_CUDA_ON_CPU=1 (2 emulated devices -> 2 ranks).
# import torch
# import torch.distributed as dist
# import torch.multiprocessing as mp
# import torch.nn as nn
# import torch.nn.functional as F
# from torch.nn.parallel import DistributedDataParallel as DDP
import pyddp as torch
import pyddp.distributed as dist
import pyddp.multiprocessing as mp
import pyddp.nn as nn
import pyddp.nn.functional as F
from pyddp.nn.parallel import DistributedDataParallel as DDP
import os
import sys


class data_prefetcher():
    def __init__(self, loader):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            self.next_input = self.next_input.cuda(non_blocking=True)
            self.next_target = self.next_target.cuda(non_blocking=True)

    def next(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        input = self.next_input
        target = self.next_target
        if input is not None:
            input.record_stream(torch.cuda.current_stream())
        if target is not None:
            target.record_stream(torch.cuda.current_stream())
        self.preload()
        return input, target


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))

        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def worker(rank, world_size, backend):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.cuda.set_device(rank)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    assert torch.cuda.current_device() == rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5)).cuda(rank)
    model = DDP(model, device_ids=[rank], output_device=rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    data = [(x[i:i + 8], y[i:i + 8]) for i in range(rank * 8, 64, 8 * world_size)]
    first = None
    for epoch in range(15):
        prefetcher = data_prefetcher(data)
        input, target = prefetcher.next()
        while input is not None:
            assert input.is_cuda and input.device == torch.device("cuda", rank)
            with torch.cuda.amp.autocast():
                output = model(input)
                loss = F.cross_entropy(output.float(), target)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            input, target = prefetcher.next()
        if first is None:
            first = loss.item()
    torch.cuda.synchronize()
    acc1, acc5 = accuracy(model(x.to(rank)), y.to(rank), topk=(1, 5))
    total = torch.zeros(1, device="cuda")
    total += loss.detach()
    dist.all_reduce(total)
    w = list(model.parameters())[0].detach().cpu().numpy().sum()
    print(f"rank {rank}: backend {dist.get_backend()} first loss {first:.4f} last loss "
          f"{loss.item():.4f} acc1 {acc1.item():.1f} acc5 {acc5.item():.1f} sum of losses "
          f"{total.item():.4f} weights {w:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ngpus = torch.cuda.device_count()
    if not torch.cuda.is_available():
        print("no GPU, exiting", flush=True)
        sys.exit(0)
    assert ngpus >= 2, "needs two GPUs"
    backend = "nccl"
    os.environ["MASTER_PORT"] = sys.argv[1] if len(sys.argv) > 1 else "29531"
    mp.spawn(worker, args=(ngpus, backend), nprocs=ngpus, join=True)
