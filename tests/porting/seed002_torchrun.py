# Seed notes 002 ("使用Pytorch进行分布式训练": RANK/LOCAL_RANK from the environment, DistributedSampler,
# SyncBN, DDP, rank-0 logging and saving), ported to pyddp and run with
#     python -m pyddp.run --standalone --nproc_per_node=2 seed002_torchrun.py --epochs 3
# Only the imports changed; each other changed line ends with "# PORT: <why>" and is listed in the
# README's porting table.  The seed leaves the dataset, model, loss and optimizer to the reader
# ("your_training_dataset", "your_model", ...): the small definitions marked "scaffolding" fill them in.
# import os
# import torch
# import torch.distributed as dist
# import torch.nn as nn
# import torchvision
# from torch.nn.parallel import DistributedDataParallel as DDP
import os
import pyddp as torch
import pyddp.distributed as dist
import pyddp.nn as nn
from pyddp.nn.parallel import DistributedDataParallel as DDP
import argparse

# --- scaffolding (not in the seed): what the seed leaves to the reader ----------------------------
import numpy as np
from sklearn.datasets import load_digits

BATCH_SIZE = 32
NUM_WORKERS = 1
CHECKPOINT_PATH = os.environ.get("CHECKPOINT_PATH", "seed002_checkpoint.pt")


def _digits(train):
    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    idx = order[360:] if train else order[:360]
    return torch.utils.data.TensorDataset((d.data[idx] / 16.0).astype(np.float32),
                                          d.target[idx].astype(np.int64))


def your_training_dataset(root, train, transform=None):
    return _digits(train=True)


def your_testing_dataset(root):
    return _digits(train=False)


def your_model(args):
    return nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


def your_loss_function():
    return nn.CrossEntropyLoss()


def your_optimizer():
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def log_something():
    print(f"epoch {epoch} step {idx} loss {loss.item():.4f}", flush=True)


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--save_epochs", type=int, default=1)
parser.add_argument("--syncBN", type=int, default=1)
args = parser.parse_args()
# --- end of scaffolding ---------------------------------------------------------------------------

# initialize the process group
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
# PORT: torch.cuda.set_device(rank % torch.cuda.device_count()) removed: no GPU, pyddp computes on the CPU
dist.init_process_group(backend="gloo")  # PORT: "nccl" -> "gloo": pyddp's CPU backend (nccl needs CUDA)
device = torch.device("cpu")  # PORT: "cuda", local_rank -> "cpu": pyddp tensors live on the CPU

# define your dataset
train_set = your_training_dataset(root='train_path', train=True,
    transform=None)  # PORT: torchvision.transforms.Compose([...]) -> None: no torchvision (scaffolding data)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_set,
    shuffle=True,
)
train_loader = torch.utils.data.DataLoader(
    train_set,
    batch_size=BATCH_SIZE,
    num_workers=NUM_WORKERS,
    pin_memory=False,
    sampler=train_sampler,
)

test_set = your_testing_dataset(root='test_path')
test_loader = torch.utils.data.DataLoader(
    test_set,
    batch_size=BATCH_SIZE,
    shuffle=False,
    num_workers=NUM_WORKERS)

# define your model
model = your_model(args)
model = model.to(device)
# if open SyncBN
if args.syncBN:
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
# use DDP
model = DDP(model, device_ids=[local_rank], output_device=local_rank)

# define your optimizer and loss function
criterion = your_loss_function()
optimizer = your_optimizer()

model.train()
for epoch in range(args.epochs):
    # reset random seed every epoch
    train_loader.sampler.set_epoch(epoch)

    # normal training procedure
    for idx, (inputs, labels) in enumerate(train_loader):
        inputs, labels = inputs.to(device), labels.to(device)
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        # some other operations
        ...

        if rank == 0 and idx % 10 == 0:
            log_something()

    # only save model on rank-0
    if rank == 0 and epoch % args.save_epochs == 0:
        torch.save(model.state_dict(), CHECKPOINT_PATH)  # PORT: net -> model: the seed's `net` is undefined (a bug in the notes)

# --- check (not in the seed): test accuracy over the whole test set, on every rank
model.eval()
correct = total = 0
with torch.no_grad():
    for data in test_loader:
        # some test operations
        # do not need to change your original test code
        inputs, labels = data
        correct += int((model(inputs).argmax(1) == labels).sum())
        total += len(labels)
print(f"rank {rank}: test accuracy {correct / total:.4f}", flush=True)
dist.destroy_process_group()
