"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

from . import _C  # noqa: F401  (fail early if the extension is missing)
from .notebook import notebook_launcher  # noqa: F401,E402
from ._random import (Generator, default_generator, initial_seed,  # noqa: F401,E402
                      manual_seed, randperm)
from .utils.data import DataLoader, DistributedSampler  # noqa: F401,E402
