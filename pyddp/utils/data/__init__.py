"""pyddp.utils.data: torch.utils.data for NumPy data, yielding pyddp Tensors.

DistributedSampler (torch's indices bit for bit, computed in C), the other
samplers, datasets and a DataLoader with worker processes.  See
pyddp/utils/data/dataloader.py and README.md, "Data loading".
"""
from . import _utils  # noqa: F401  (torch's layout: pyddp.utils.data._utils.collate)
from ._collate import default_collate, default_convert
from ._worker import WorkerInfo, get_worker_info
from .dataloader import DataLoader
from .dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset,
                      StackDataset, Subset, TensorDataset, random_split)
from .distributed import DistributedSampler
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler,
                      SubsetRandomSampler, WeightedRandomSampler)

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset",
    "DistributedSampler", "IterableDataset", "RandomSampler", "Sampler",
    "SequentialSampler", "StackDataset", "Subset", "SubsetRandomSampler",
    "TensorDataset", "WeightedRandomSampler", "WorkerInfo", "default_collate",
    "default_convert", "get_worker_info", "random_split",
]
