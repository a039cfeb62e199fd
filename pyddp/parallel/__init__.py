"""``pyddp.parallel``: apex.parallel's names, which live in ``pyddp.nn.parallel`` (DistributedDataParallel,
SyncBatchNorm, convert_syncbn_model, create_syncbn_process_group, Reducer, the LARC module).

This package makes the porting rule ``apex`` -> ``pyddp`` hold for attribute access
(``import pyddp as apex; apex.parallel.SyncBatchNorm``) and for import statements alike
(``from pyddp.parallel import DistributedDataParallel``, ``from pyddp.parallel.LARC import LARC``);
the names are pyddp.nn.parallel's own objects.
"""
from ..nn.parallel import *  # noqa: F401,F403
from ..nn.parallel import __all__  # noqa: F401
from . import LARC  # noqa: F401  (apex.parallel.LARC is the module holding the class LARC)
