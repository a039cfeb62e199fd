# Seed notes 003 ("PYTORCH / 多卡 / DDP例程"): the mp.spawn DDP example, ported to pyddp.
# Only the imports changed; each other changed line ends with "# PORT: <why>" and is listed in
# the README's porting table.  tests/porting/test_porting.py runs it with MASTER_ADDR/MASTER_PORT set in the
# environment (the seed relies on them too: init_process_group("gloo", rank=..., world_size=...)).
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


def example(rank, world_size):
    #####
    # 1. 在所有DDP操作前，首先创建default process group
    #####
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    # example local model
    model = nn.Linear(10, 10).to(rank)

    #####
    # 2. 输入model，建立DDP model
    # 将rank=0进程上的`state_dict()`广播到其他进程
    # 每个进程都会创建一个local reducer，用以梯度同步
    #####
    ddp_model = DDP(model, device_ids=[rank])

    # define loss function and optimizer
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    # forward pass
    outputs = ddp_model(torch.randn(20, 10))  # PORT: .to(rank) dropped: pyddp tensors live on the CPU
    labels = torch.randn(20, 10)  # PORT: .to(rank) dropped: pyddp tensors live on the CPU

    # backward pass
    # 梯度会经过reducer，最后经过allreduce操作得到平均，然后传递给每个进程的所有参数
    loss_fn(outputs, labels).backward()

    # update parameters
    # 每个local model各自执行，执行完仍然是相同的
    optimizer.step()

    # --- check (not in the seed): every rank holds the same updated parameters
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    states = [None] * world_size
    dist.all_gather_object(states, state)
    same = all((s[k] == states[0][k]).all() for s in states for k in s)
    print(f"rank {rank}: parameters identical on all ranks: {same}", flush=True)


def main():
    # 假设只要两个进程并行
    world_size = 2
    # 开跑
    mp.spawn(example,
        args=(world_size,),
        nprocs=world_size,
        join=True)

if __name__=="__main__":
    main()
