# Seed notes 002 ("使用Pytorch进行分布式训练": RANK/LOCAL_RANK from the environment, DistributedSampler, SyncBN,
# DDP, rank-0 logging and saving) on a GPU: the seed's GPU lines as written (torch.cuda.set_device,
# backend="nccl", device = cuda:local_rank, device_ids=[local_rank]). Run with
#     python -m pyddp.run --standalone --nproc_per_node=<GPUs> seed002_torchrun_gpu.py --epochs 3
# The import lines changed, and two lines more (marked "# PORT:"): the seed calls
# torch.nn.SyncBatchNorm.convert_sync_batchnorm, which with torch.distributed not initialised would silently
# be plain batch norm (pyddp's is nn.SyncBatchNorm, nn being pyddp.nn here), and
# torch.utils.data.distributed.DistributedSampler, which asks torch.distributed for the world size (pyddp's
# sampler asks pyddp). The seed leaves the dataset,
# model, loss and optimizer to the reader: the small definitions marked "scaffolding" fill them in.
# import os
# import torch
# import torch.distributed as dist
# import torch.nn as nn
# import torchvision
# from torch.nn.parallel import DistributedDataParallel as DDP
import os
import torch
import pyddp.utils.data.distributed
import pyddp.distributed as dist
import pyddp.nn as nn
from pyddp.nn.parallel import DistributedDataParallel as DDP
import argparse

# --- scaffolding (not in the seed): what the seed leaves to the reader ----------------------------
BATCH_SIZE = 32
NUM_WORKERS = 1
CHECKPOINT_PATH = os.environ.get("CHECKPOINT_PATH", "seed002_checkpoint.pt")
_g = torch.Generator().manual_seed(0)
_x = torch.randn(640, 20, generator=_g)
_y = _x[:, :10].argmax(1)


def your_training_dataset(root, train, transform=None):
    return torch.utils.data.TensorDataset(_x[128:], _y[128:])


def your_testing_dataset(root):
    return torch.utils.data.TensorDataset(_x[:128], _y[:128])


def your_model(args):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def your_loss_function():
    return torch.nn.CrossEntropyLoss()


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
torch.cuda.set_device(rank % torch.cuda.device_count())
dist.init_process_group(backend="nccl")
device = torch.device("cuda", local_rank)

# define your dataset
train_set = your_training_dataset(root='train_path', train=True,
    transform=None)  # scaffolding: no torchvision transforms for the synthetic data
train_sampler = pyddp.utils.data.distributed.DistributedSampler(  # PORT: torch.utils... -> pyddp.utils...: torch's sampler asks torch.distributed, which pyddp does not initialise
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
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)  # PORT: torch.nn.SyncBatchNorm -> nn.SyncBatchNorm (pyddp.nn)
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
        torch.save(model.state_dict(), CHECKPOINT_PATH)  # SEED BUG: the seed saves an undefined `net`

# --- check (not in the seed): test accuracy on every rank, the checkpoint reloaded, SyncBN in place
dist.barrier()
state = torch.load(CHECKPOINT_PATH, map_location=device)
model.load_state_dict(state)
model.eval()
correct = total = 0
with torch.no_grad():
    for data in test_loader:
        # some test operations
        # do not need to change your original test code
        inputs, labels = data
        inputs, labels = inputs.to(device), labels.to(device)
        correct += int((model(inputs).argmax(1) == labels).sum())
        total += len(labels)
syncbn = type(model.module[1]).__name__
print(f"rank {rank}: test accuracy {correct / total:.4f}, batch norm layer {syncbn}, "
      f"checkpoint reloaded, on {next(model.parameters()).device}", flush=True)
dist.destroy_process_group()
assert syncbn == "TorchSyncBatchNorm" and correct / total > 0.3
