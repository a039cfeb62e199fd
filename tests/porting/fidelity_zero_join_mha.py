# A DDP script in the style of torch's generic-join and ZeroRedundancyOptimizer tutorials and the
# pytorch/examples DDP series, written for pyddp's tests: mp.spawn, a small attention model
# (nn.MultiheadAttention with a causal mask, LayerNorm, Embedding, Dropout1d), a DataLoader with the
# default collate, DDP + ZeroRedundancyOptimizer under Join with uneven inputs, clip_grad_norm_,
# parameters_to_vector, nn.DataParallel's state-dict keys and the device housekeeping scripts do on a
# machine without a GPU.  Only the imports differ from the torch script; it prints the same lines.
# import torch
# import torch.distributed as dist
# import torch.multiprocessing as mp
# import torch.nn as nn
# from torch.distributed.algorithms.join import Join
# from torch.distributed.optim import ZeroRedundancyOptimizer
# from torch.nn.parallel import DistributedDataParallel as DDP
# from torch.utils.data import DataLoader, TensorDataset
import pyddp as torch
import pyddp.distributed as dist
import pyddp.multiprocessing as mp
import pyddp.nn as nn
from pyddp.distributed.algorithms.join import Join
from pyddp.distributed.optim import ZeroRedundancyOptimizer
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.utils.data import DataLoader, TensorDataset
import os
import sys


class TinyAttention(nn.Module):
    def __init__(self, vocab=16, dim=8, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout1d(p=0.0)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        n = tokens.shape[1]
        mask = torch.triu(torch.ones(n, n), diagonal=1).bool()
        y, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return self.head(self.drop(self.norm(x + y)))


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    facts = [f"device {device.type}", f"accelerator {torch.accelerator.is_available()}",
             f"backend {dist.get_default_backend_for_device(device)}",
             f"cudnn {torch.backends.cudnn.enabled}"]

    # uneven data: rank r holds 4 + 2 * r sequences
    n = 4 + 2 * rank
    tokens = (torch.arange(n * 6).reshape(n, 6) * (rank + 3)) % 16
    loader = DataLoader(TensorDataset(tokens), batch_size=2, shuffle=False)
    first = next(iter(loader))
    facts.append(f"batch {type(first).__name__} {type(first[0]).__name__} "
                 f"{str(first[0].dtype).split('.')[-1]} {tuple(first[0].shape)}")

    model = DDP(TinyAttention().to(device))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    steps = 0
    with Join([model, opt]):
        for (batch,) in loader:
            opt.zero_grad()
            out = model(batch[:, :-1])
            loss = loss_fn(out.reshape(-1, 16), batch[:, 1:].reshape(-1))
            loss.backward()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
    facts.append(f"steps {steps} clip norm finite {bool(torch.isfinite(norm))}")

    # every rank ends with the same parameters
    vec = nn.utils.parameters_to_vector(model.parameters()).detach()
    gathered = [torch.zeros_like(vec) for _ in range(world_size)]
    dist.all_gather(gathered, vec)
    facts.append(f"parameters identical on all ranks: "
                 f"{all(bool(torch.equal(g, gathered[0])) for g in gathered)}")

    opt.consolidate_state_dict(to=0)
    if rank == 0:
        state = opt.state_dict()
        facts.append(f"zero state groups {len(state['param_groups'])} "
                     f"params {len(state['param_groups'][0]['params'])}")
    dp = nn.DataParallel(TinyAttention())
    facts.append(f"DataParallel keys {sorted(dp.state_dict())[0]}")
    print(f"rank {rank}: " + "; ".join(facts), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    port = int(os.environ.get("MASTER_PORT", "29512"))
    mp.spawn(worker, args=(world_size, port), nprocs=world_size, join=True)
