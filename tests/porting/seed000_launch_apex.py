# Seed notes 000 ("PyTorch Note: DDP 多卡分布式训练" and "apex 混合精度", with the apex README's
# checkpoint recipe), ported to pyddp and run with
#     python -m pyddp.launch --nproc_per_node 2 seed000_launch_apex.py
# Only the imports changed; each other changed line ends with "# PORT: <why>" and is listed in the
# README's porting table.  The seed's fragments use an image and a text encoder, a dataset and a
# train() they do not define: the small definitions marked "scaffolding" fill them in.
# import torch
# import torch.distributed as dist
# from torch.nn.parallel import DistributedDataParallel as DDP
# from torch.utils.data.distributed import DistributedSampler
# import apex
# from apex import amp
import pyddp as torch
import pyddp.distributed as dist
from pyddp.nn.parallel import DistributedDataParallel as DDP
from pyddp.utils.data.distributed import DistributedSampler
import pyddp as apex
from pyddp import amp

# --- scaffolding (not in the seed) -----------------------------------------------------------------
import os
import numpy as np
from pyddp.utils.data import DataLoader, TensorDataset

OPT_LEVEL = os.environ.get("OPT_LEVEL", "O1")
_rng = np.random.default_rng(0)
_x = _rng.standard_normal((256, 16)).astype(np.float32)
dataset = TensorDataset(_x, np.tanh(_x @ _rng.standard_normal((16, 12))).astype(np.float32))
def make_encoders():
    return (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)),
            torch.nn.Linear(12, 8))


img_encoder, text_encoder = make_encoders()
is_distributed = True
start_epoch, n_epochs = 0, 3


def full_loss():
    with torch.no_grad():
        x, t = torch.from_numpy(dataset.tensors[0]), torch.from_numpy(dataset.tensors[1])
        return float(((img_encoder(x).float() - text_encoder(t).float()) ** 2).mean().item())


def train(loader):
    for image, text in loader:
        loss = ((img_encoder(image) - text_encoder(text)) ** 2).mean()
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
    # PORT: torch.cuda.set_device(f'cuda:{local_rank}') removed: no GPU, pyddp computes on the CPU
    dist.init_process_group(backend='gloo')  # PORT: 'nccl' -> 'gloo': pyddp's CPU backend (nccl needs CUDA)
    dist.get_rank()
    dist.get_world_size()

init_ddp()

optimizer = apex.optimizers.FusedAdam([
        {'params':img_encoder.parameters()},
        {'params':text_encoder.parameters()}
    ], lr=1e-5, betas=(0.9, 0.99))

(img_encoder, text_encoder), optimizer = amp.initialize(
        [img_encoder, text_encoder], optimizer,
        opt_level=OPT_LEVEL #, loss_scale=128
    )

img_encoder = DDP(img_encoder, device_ids=[local_rank], output_device=local_rank, find_unused_parameters=True)
text_encoder = DDP(text_encoder, device_ids=[local_rank], output_device=local_rank, find_unused_parameters=True)

loss_before = full_loss()  # scaffolding
sampler = DistributedSampler(dataset) if is_distributed else None
loader = DataLoader(dataset, shuffle=(sampler is None),
                    sampler=sampler)
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
saved = {k: np.asarray(v.numpy(), dtype=np.float64) for k, v in checkpoint['model'].items()}  # scaffolding
if dist.get_rank() == 0:
    torch.save(checkpoint, 'amp_checkpoint.pt')
dist.barrier()

# Restore
model = torch.nn.ModuleList(make_encoders())  # scaffolding: the seed's "model = ..."
optimizer = apex.optimizers.FusedAdam([{'params': model[0].parameters()},  # scaffolding: "optimizer = ..."
                                       {'params': model[1].parameters()}], lr=1e-5, betas=(0.9, 0.99))
checkpoint = torch.load('amp_checkpoint.pt')

model, optimizer = amp.initialize(model, optimizer, opt_level=OPT_LEVEL)
model.load_state_dict(checkpoint['model'])
optimizer.load_state_dict(checkpoint['optimizer'])
amp.load_state_dict(checkpoint['amp'])

# --- check (not in the seed): the ranks agree, training moved the loss, the restore is exact
# (``saved``: the model's state when the checkpoint was made; under O2 state_dict() shows amp's float32
# master weights, which the second amp.initialize above hands over to the restored model)
state = saved
states = [None] * dist.get_world_size()
dist.all_gather_object(states, state)
same = all(np.array_equal(s[k], states[0][k]) for s in states for k in s)
restored = all(np.array_equal(np.asarray(v.numpy(), dtype=np.float64), state[k])
               for k, v in model.state_dict().items())
print(f"rank {dist.get_rank()}: opt_level {OPT_LEVEL} loss {loss_before:.6f} -> {loss_after:.6f}, parameters identical on all ranks: {same}, "
      f"restored: {restored}", flush=True)
dist.destroy_process_group()
