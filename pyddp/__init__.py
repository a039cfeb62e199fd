"""pyddp: torch.distributed-style data-parallel training for NumPy and CUDA arrays."""
__version__ = "0.1.0"

from . import _C  # noqa: F401  (fail early if the extension is missing)
from .notebook import notebook_launcher  # noqa: F401,E402

# tensors and autograd (pyddp.autograd first: pyddp._tensor imports its engine)
from . import autograd  # noqa: F401,E402
from ._tensor import *  # noqa: F401,F403,E402
from ._tensor import Tensor  # noqa: F401,E402
from ._autocast import autocast, is_autocast_enabled, get_autocast_dtype  # noqa: F401,E402

# checkpoints (torch.save / torch.load)
from .serialization import save, load  # noqa: F401,E402

# torch's CPU generator and data loading (pyddp.default_generator is torch-compatible mt19937)
from ._random import Generator, default_generator, initial_seed, randperm  # noqa: F401,E402
from .utils.data import DataLoader, DistributedSampler  # noqa: F401,E402
from .nn.parallel import DistributedDataParallel  # noqa: F401,E402
from . import amp  # noqa: F401,E402  (apex.amp's API, torch.amp.GradScaler)
from . import optim, optimizers  # noqa: F401,E402  (pyddp.optim.SGD as torch.optim; pyddp.optimizers.FusedAdam as apex.optimizers)


def manual_seed(seed):
    """Seed pyddp's generator (``torch.manual_seed``): ``pyddp.default_generator``, which every
    random draw uses (randperm, samplers, data loading, randn/rand/dropout/initialisation).
    Returns it."""
    from . import _random

    return _random.manual_seed(seed)
