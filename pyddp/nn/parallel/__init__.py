"""pyddp.nn.parallel: DistributedDataParallel and DataParallel (torch.nn.parallel's names), and
apex.parallel's SyncBatchNorm / convert_syncbn_model / Reducer."""
from .data_parallel import DataParallel, data_parallel  # noqa: F401
from .distributed import DistributedDataParallel  # noqa: F401
from .reducer import Reducer  # noqa: F401
from .sync_batchnorm import SyncBatchNorm, convert_syncbn_model  # noqa: F401

__all__ = ["DistributedDataParallel", "DataParallel", "data_parallel", "SyncBatchNorm",
           "convert_syncbn_model", "Reducer"]
