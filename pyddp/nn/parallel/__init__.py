"""pyddp.nn.parallel: DistributedDataParallel and DataParallel (torch.nn.parallel's names), and
apex.parallel's SyncBatchNorm / convert_syncbn_model / create_syncbn_process_group / Reducer and
its LARC module (``from apex.parallel.LARC import LARC``)."""
from .data_parallel import DataParallel, data_parallel  # noqa: F401
from .distributed import DistributedDataParallel  # noqa: F401
from .reducer import Reducer  # noqa: F401
from .sync_batchnorm import SyncBatchNorm, convert_syncbn_model  # noqa: F401
from .sync_batchnorm import create_syncbn_process_group  # noqa: F401
from . import LARC  # noqa: F401  (apex.parallel.LARC is the module holding the class LARC)

__all__ = ["DistributedDataParallel", "DataParallel", "data_parallel", "SyncBatchNorm",
           "convert_syncbn_model", "create_syncbn_process_group", "Reducer", "LARC"]
