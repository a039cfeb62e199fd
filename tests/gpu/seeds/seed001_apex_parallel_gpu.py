# Seed notes 001 ("Pytorch 多GPU并行处理": torch.distributed + apex.parallel.DistributedDataParallel + apex amp,
# the "汇总代码" block) on a GPU: the seed's GPU lines as written (backend='nccl', torch.cuda.set_device(gpu),
# device_ids=[gpu], .cuda(non_blocking=True)); the import lines changed, and one line more (marked "# PORT:"):
# torch.utils.data.distributed.DistributedSampler asks torch.distributed for the world size, which pyddp does not
# initialise, so the sampler is pyddp's. Run with
#     python -m pyddp.launch --nproc_per_node=<GPUs> seed001_apex_parallel_gpu.py
# The block has bugs of its own (opt_level '01', an optimizer made after amp.initialize, `images` never
# assigned); those fixes are marked "# SEED BUG" and are needed under torch + apex too. The dataset, model and
# criterion are the seed's "..." (scaffolding, a tiny synthetic data set).
# import torch
# import torch.distributed as dist
# from apex.parallel import DistributedDataParallel
# from apex import amp
import torch
import pyddp.utils.data.distributed
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel
from pyddp import amp
from torch import optim

# --- scaffolding (not in the seed): the seed's "..." ----------------------------------------------
import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
_g = torch.Generator().manual_seed(0)
_x = torch.randn(512, 20, generator=_g)
train_dataset = torch.utils.data.TensorDataset(_x, (_x[:, :10].argmax(1)))
criterion = torch.nn.CrossEntropyLoss()
CKPT = os.environ.get("CKPT", "seed001_checkpoint.pt")
# --- end of scaffolding ----------------------------------------------------------------------------

gpu = args.local_rank  # the seed's placeholder -1: this rank's GPU

dist.init_process_group(backend='nccl')
torch.cuda.set_device(gpu)

train_dataset = train_dataset
train_sampler = pyddp.utils.data.distributed.DistributedSampler(train_dataset)  # PORT: torch.utils... -> pyddp.utils...: torch's sampler asks torch.distributed, which pyddp does not initialise
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=64, sampler=train_sampler,
                                           pin_memory=True)  # scaffolding: pinned batches for non_blocking

torch.manual_seed(0)  # scaffolding
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda()
optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # SEED BUG: made before amp.initialize, which needs it
model, optimizer = amp.initialize(model, optimizer, opt_level='O1')  # SEED BUG: '01' (zero-one) is no opt_level
model = DistributedDataParallel(model, device_ids=[gpu])

for epoch in range(5):
   train_sampler.set_epoch(epoch)  # SEED BUG: without set_epoch every epoch sees the same order
   for batch_idx, (data, target) in enumerate(train_loader):
      images = data.cuda(non_blocking=True)  # SEED BUG: `images` was never assigned
      target = target.cuda(non_blocking=True)
      output = model(images)
      loss = criterion(output, target)
      optimizer.zero_grad()
      with amp.scale_loss(loss, optimizer) as scaled_loss:
         scaled_loss.backward()
      optimizer.step()

# --- check (not in the seed): accuracy, agreement of the ranks, a checkpoint reloaded
with torch.no_grad():
    acc = float((model(train_dataset.tensors[0].cuda()).argmax(1).cpu() == train_dataset.tensors[1]).float().mean())
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
ref = flat.clone()
dist.broadcast(ref, src=0)
same = bool(torch.equal(ref, flat))
if dist.get_rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}, CKPT)
dist.barrier()
ck = torch.load(CKPT)
model.load_state_dict(ck["model"])
optimizer.load_state_dict(ck["optimizer"])
amp.load_state_dict(ck["amp"])
restored = bool(torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), ref))
print(f"rank {dist.get_rank()}: train accuracy {acc:.4f}, parameters identical on all ranks: {same}, "
      f"restored: {restored}, pinned batches: {data.is_pinned()}", flush=True)
dist.destroy_process_group()
assert same and restored and acc > 0.5
