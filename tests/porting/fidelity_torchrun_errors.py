# A torchrun script in the style of the pytorch/examples "distributed/ddp-tutorial-series" and of
# apex's tests/distributed checks (--local_rank accepted, every rank verifies collective results and
# the errors torch raises), written for pyddp's tests.  Run it with torchrun (pyddp-run) or
# torch.distributed.launch (pyddp.launch); only the imports differ from the torch script.
# import torch
# import torch.distributed as dist
# from torch.utils.data import DataLoader, Dataset
import pyddp as torch
import pyddp.distributed as dist
from pyddp.utils.data import DataLoader, Dataset
import argparse
import datetime
import os
import time


class SlowDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(5)
        return i


def error_of(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__
    return "none"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", "--local-rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)))
    args = parser.parse_args()
    backend = "gloo" if dist.is_backend_available("gloo") else "mpi"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # results every rank can check
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    avg_ok = bool(torch.allclose(x, torch.full((4,), (world + 1) / 2)))
    out = torch.zeros(world * 2, 3)
    dist.all_gather_into_tensor(out, torch.full((2, 3), float(rank)))
    gather_ok = all(bool((out[2 * r:2 * r + 2] == r).all()) for r in range(world))

    # what torch refuses, with its exception types
    errors = [
        error_of(lambda: dist.all_reduce(torch.tensor([3, 4]), op=dist.ReduceOp.AVG)),
        error_of(lambda: dist.all_reduce(torch.tensor([1.0]), op=dist.ReduceOp.BAND)),
        error_of(lambda: dist.all_reduce(torch.tensor([1j]), op=dist.ReduceOp.PRODUCT)),
        error_of(lambda: dist.all_gather_into_tensor(torch.zeros(world, 2), torch.ones(2))),
    ]

    # a prefix store's timeout is its store's
    store = dist.PrefixStore("scratch", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False,
        timeout=datetime.timedelta(seconds=120), wait_for_workers=False))
    store.set_timeout(datetime.timedelta(seconds=1))
    t0 = time.monotonic()
    store_error = error_of(lambda: store.get(f"never-set-{rank}"))
    store_fast = time.monotonic() - t0 < 10

    # a DataLoader whose worker is too slow times out at its timeout
    batches = iter(DataLoader(SlowDataset(), batch_size=1, num_workers=1, timeout=1))
    t0 = time.monotonic()
    try:
        next(batches)
        loader_error = "none"
    except Exception as e:
        loader_error = type(e).__name__
    loader_fast = time.monotonic() - t0 < 3
    del batches  # shuts its worker down

    dist.barrier(timeout=datetime.timedelta(seconds=60))
    print(f"rank {rank}: avg {avg_ok} gather {gather_ok} errors {','.join(errors)} "
          f"store {store_error} {store_fast} loader {loader_error} {loader_fast}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
