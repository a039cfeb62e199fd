"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

from . import _C  # noqa: F401  (fail early if the extension is missing)
from .notebook import notebook_launcher  # noqa: F401,E402
from . import optim, optimizers  # noqa: F401,E402  (pyddp.optim.SGD as torch.optim; pyddp.optimizers.FusedAdam as apex.optimizers)
