# Seed notes 000 ("PyTorch Note: DDP 多卡分布式训练" and "apex 混合精度", with the apex README's checkpoint
# recipe) on a GPU: the seed's GPU lines as written (torch.cuda.set_device, backend='nccl',
# device_ids=[local_rank], FusedAdam, amp O1); only the import lines changed. Run with
#     python -m pyddp.launch --nproc_per_node <GPUs> seed000_launch_apex_gpu.py
# The seed's fragments use an image and a text encoder, a dataset and a train() they do not define: the
# small definitions marked "scaffolding" fill them in (a tiny synthetic data set).
# import torch.distributed as dist
# from torch.nn.parallel import DistributedDataParallel as DDP
# from torch.utils.data.distributed import DistributedSampler
# import apex
# from apex import amp
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.utils.data.distributed import DistributedSampler
import pyddp as apex
from pyddp import amp

# --- scaffolding (not in the seed) -----------------------------------------------------------------
import os
import torch
from torch.utils.data import DataLoader, TensorDataset

OPT_LEVEL = os.environ.get("OPT_LEVEL", "O1")
CKPT = os.environ.get("CKPT", "amp_checkpoint.pt")
_g = torch.Generator().manual_seed(0)
_x = torch.randn(256, 16, generator=_g)
dataset = TensorDataset(_x, torch.tanh(_x @ torch.randn(16, 12, generator=_g)))


def make_encoders():
    torch.manual_seed(0)
    return (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda(),
            torch.nn.Linear(12, 8).cuda())


is_distributed = True
start_epoch, n_epochs = 0, 3


def full_loss():
    with torch.no_grad():
        x, t = dataset.tensors[0].cuda(), dataset.tensors[1].cuda()
        return float(((img_encoder(x).float() - text_encoder(t).float()) ** 2).mean().item())


def train(loader):
    for image, text in loader:
        image, text = image.cuda(non_blocking=True), text.cuda(non_blocking=True)
        loss = ((img_encoder(image).float() - text_encoder(text).float()) ** 2).mean()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
# --- end of scaffolding ----------------------------------------------------------------------------

import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0)
FLAGS = parser.parse_args()
local_rank = int(FLAGS.local_rank)

def init_ddp():
    torch.cuda.set_device(f'cuda:{local_rank}')
    dist.init_process_group(backend='nccl')
    dist.get_rank()
    dist.get_world_size()

init_ddp()
img_encoder, text_encoder = make_encoders()  # scaffolding: on this rank's GPU

optimizer = apex.optimizers.FusedAdam([
        {'params':img_encoder.parameters()},
        {'params':text_encoder.parameters()}
    ], lr=1e-3, betas=(0.9, 0.99))

(img_encoder, text_encoder), optimizer = amp.initialize(
        [img_encoder, text_encoder], optimizer,
        opt_level=OPT_LEVEL #, loss_scale=128
    )

img_encoder = DDP(img_encoder, device_ids=[local_rank], output_device=local_rank, find_unused_parameters=True)
text_encoder = DDP(text_encoder, device_ids=[local_rank], output_device=local_rank, find_unused_parameters=True)

loss_before = full_loss()  # scaffolding
sampler = DistributedSampler(dataset) if is_distributed else None
loader = DataLoader(dataset, shuffle=(sampler is None),
                    sampler=sampler, batch_size=16)  # scaffolding: batch_size (the seed's default is 1)
for epoch in range(start_epoch, n_epochs):
    if is_distributed:
        sampler.set_epoch(epoch)
    train(loader)

loss_after = full_loss()  # scaffolding

# Save checkpoint
model = torch.nn.ModuleList([img_encoder.module, text_encoder.module])  # scaffolding: the seed's "model"
checkpoint = {
    'model': model.state_dict(),
    'optimizer': optimizer.state_dict(),
    'amp': amp.state_dict()
}
saved = {k: v.detach().double().cpu() for k, v in checkpoint['model'].items()}  # scaffolding
if dist.get_rank() == 0:
    torch.save(checkpoint, CKPT)
dist.barrier()

# Restore
model = torch.nn.ModuleList(make_encoders())  # scaffolding: the seed's "model = ..."
optimizer = apex.optimizers.FusedAdam([{'params': model[0].parameters()},  # scaffolding: "optimizer = ..."
                                       {'params': model[1].parameters()}], lr=1e-3, betas=(0.9, 0.99))
checkpoint = torch.load(CKPT)

model, optimizer = amp.initialize(model, optimizer, opt_level=OPT_LEVEL)
model.load_state_dict(checkpoint['model'])
optimizer.load_state_dict(checkpoint['optimizer'])
amp.load_state_dict(checkpoint['amp'])

# --- check (not in the seed): on the GPU, the ranks agree, training moved the loss, the restore is exact
states = [None] * dist.get_world_size()
dist.all_gather_object(states, saved)
same = all(torch.equal(s[k], states[0][k]) for s in states for k in s)
restored = all(torch.equal(v.detach().double().cpu(), saved[k]) for k, v in model.state_dict().items())
on_gpu = all(p.is_cuda for p in model.parameters())
print(f"rank {dist.get_rank()}: opt_level {OPT_LEVEL} loss {loss_before:.6f} -> {loss_after:.6f}, "
      f"parameters identical on all ranks: {same}, restored: {restored}, on the GPU: {on_gpu}", flush=True)
dist.destroy_process_group()
assert same and restored and on_gpu and loss_after < loss_before
