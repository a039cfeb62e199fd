"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

from . import _C  # noqa: F401  (fail early if the extension is missing)
from .notebook import notebook_launcher  # noqa: F401,E402

# tensors and autograd (pyddp.autograd first: pyddp._tensor imports its engine)
from . import autograd  # noqa: F401,E402
from ._tensor import *  # noqa: F401,F403,E402
from ._tensor import Tensor, default_generator  # noqa: F401,E402
from ._autocast import autocast, is_autocast_enabled, get_autocast_dtype  # noqa: F401,E402

# checkpoints (torch.save / torch.load)
from .serialization import save, load  # noqa: F401,E402
