# Seed notes 001 ("Pytorch 多GPU并行处理": torch.distributed + apex.parallel.DistributedDataParallel +
# apex amp, the "汇总代码" block), ported to pyddp and run with
#     python -m pyddp.launch --nproc_per_node=2 seed001_apex_parallel.py
# Only the imports changed; each other changed line ends with "# PORT: <why>" and is listed in the
# README's porting table.  The block has bugs of its own (opt_level '01', an optimizer made after
# amp.initialize, `images` never assigned); those fixes are marked "# SEED BUG" and would be needed
# under torch + apex too.  The dataset, model and criterion are the seed's "..." (scaffolding).
# import torch
# import torch.distributed as dist
# from apex.parallel import DistributedDataParallel
# from apex import amp
# from torch import optim
import pyddp as torch
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel
from pyddp import amp
from pyddp import optim

# --- scaffolding (not in the seed): the seed's "..." ----------------------------------------------
import argparse
import numpy as np
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
_d = load_digits()
train_dataset = torch.utils.data.TensorDataset((_d.data / 16.0).astype(np.float32), _d.target.astype(np.int64))
criterion = torch.nn.CrossEntropyLoss()
# --- end of scaffolding ----------------------------------------------------------------------------

gpu = args.local_rank  # PORT: -1 -> args.local_rank: the seed leaves the device number as a placeholder

dist.init_process_group(backend='gloo')  # PORT: 'nccl' -> 'gloo': pyddp's CPU backend (nccl needs CUDA)
# PORT: torch.cuda.set_device(gpu) removed: no GPU, pyddp computes on the CPU

train_dataset = train_dataset
train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=64, sampler=train_sampler)

model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # SEED BUG: made before amp.initialize, which needs it
model, optimizer = amp.initialize(model, optimizer, opt_level='O1')  # SEED BUG: '01' (zero-one) is no opt_level
model = DistributedDataParallel(model, device_ids=[gpu])

for epoch in range(5):
   train_sampler.set_epoch(epoch)  # SEED BUG: without set_epoch every epoch sees the same order
   for batch_idx, (data, target) in enumerate(train_loader):
      images = data.to('cpu', non_blocking=True)  # PORT: data.cuda(non_blocking=True) -> .to('cpu', ...): no GPU, Tensor.cuda() raises as in torch's CPU build (SEED BUG: `images` was never assigned)
      target = target.to('cpu', non_blocking=True)  # PORT: target.cuda(non_blocking=True) -> .to('cpu', ...): no GPU, Tensor.cuda() raises as in torch's CPU build
      output = model(images)
      loss = criterion(output, target)
      optimizer.zero_grad()
      with amp.scale_loss(loss, optimizer) as scaled_loss:
         scaled_loss.backward()
      optimizer.step()

# --- check (not in the seed): accuracy on the training digits and agreement of the ranks
with torch.no_grad():
    acc = float((model(torch.from_numpy(train_dataset.tensors[0])).argmax(1).numpy() == train_dataset.tensors[1]).mean())
flat = np.concatenate([np.asarray(p.detach().numpy(), np.float64).ravel() for p in model.parameters()])
ref = flat.copy()
dist.broadcast(ref, src=0)
print(f"rank {dist.get_rank()}: train accuracy {acc:.4f}, parameters identical on all ranks: "
      f"{bool(np.array_equal(ref, flat))}", flush=True)
dist.destroy_process_group()
