"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import _C  # noqa: F401  (fail early if the extension is missing)

# tensors and autograd (pyddp.autograd first: pyddp._tensor imports its engine)
from . import autograd  # noqa: F401,E402
from ._tensor import *  # noqa: F401,F403,E402
from ._tensor import Tensor  # noqa: F401,E402
from ._autocast import autocast, is_autocast_enabled, get_autocast_dtype  # noqa: F401,E402

# torch's CPU generator and data loading (pyddp.default_generator is torch-compatible mt19937)
from ._random import Generator, default_generator, initial_seed, randperm  # noqa: F401,E402

# The rest is imported on first use (PEP 562 __getattr__ below), so that ``import pyddp.distributed``
# does not load nn, amp, optim, data loading, checkpoints or notebook_launcher: ``pyddp.nn``,
# ``pyddp.save`` or ``from pyddp import DistributedDataParallel`` import their module then.  (The
# tensor library above stays eager: pyddp.autograd and pyddp._tensor import each other, and only the
# order autograd-first works, so a lazy pyddp._tensor reached first from elsewhere would fail.)
_LAZY_SUBMODULES = frozenset({
    "amp",          # apex.amp's API, torch.amp.GradScaler
    "optim",        # pyddp.optim.SGD as torch.optim
    "optimizers",   # pyddp.optimizers.FusedAdam as apex.optimizers
    "nn", "utils", "serialization", "notebook", "distributed", "multiprocessing", "_kernels",
})
_LAZY_ATTRIBUTES = {   # name -> (submodule, attribute)
    # checkpoints (torch.save / torch.load)
    "save": ("serialization", "save"),
    "load": ("serialization", "load"),
    "DataLoader": ("utils.data", "DataLoader"),
    "DistributedSampler": ("utils.data", "DistributedSampler"),
    "DistributedDataParallel": ("nn.parallel", "DistributedDataParallel"),
    "notebook_launcher": ("notebook", "notebook_launcher"),
}

if _TYPE_CHECKING:   # what type checkers and IDEs see: the names as if imported eagerly
    from . import _kernels, amp, distributed, multiprocessing, nn, notebook, optim, optimizers  # noqa: F401
    from . import serialization, utils  # noqa: F401
    from .nn.parallel import DistributedDataParallel  # noqa: F401
    from .notebook import notebook_launcher  # noqa: F401
    from .serialization import load, save  # noqa: F401
    from .utils.data import DataLoader, DistributedSampler  # noqa: F401


def __getattr__(name):
    # Never ``from . import x`` here: that looks the name up on this module first, i.e. calls this.
    if name in _LAZY_SUBMODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    elif name in _LAZY_ATTRIBUTES:
        module, attr = _LAZY_ATTRIBUTES[name]
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), attr)
    elif name == "__all__":
        # ``from pyddp import *``: every public name, as when they were all imported eagerly.
        return [n for n in __dir__() if not n.startswith("_")]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | _LAZY_SUBMODULES | set(_LAZY_ATTRIBUTES))


def manual_seed(seed):
    """Seed pyddp's generator (``torch.manual_seed``): ``pyddp.default_generator``, which every
    random draw uses (randperm, samplers, data loading, randn/rand/dropout/initialisation).
    Returns it."""
    from . import _random

    return _random.manual_seed(seed)
