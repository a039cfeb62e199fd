"""pyddp.nn: modules, parameters, losses, initialisation and functional ops (torch.nn)."""
from .parameter import Buffer, Parameter  # noqa: F401
from . import functional, init, utils  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules import Module, RemovableHandle  # noqa: F401
from .modules import __all__ as _modules_all

__all__ = ["Parameter", "Buffer", "functional", "init", "utils"] + list(_modules_all)
from . import parallel  # noqa: F401,E402  (pyddp.nn.parallel.DistributedDataParallel)
from .parallel import DataParallel  # noqa: F401,E402

__all__ += ["DataParallel", "parallel"]
