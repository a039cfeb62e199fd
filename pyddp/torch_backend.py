"""pyddp as a torch.distributed backend: ``import pyddp.torch_backend`` registers "pyddp" (the
module is pyddp.distributed.torch_bridge, under this name too)."""
import sys

from .distributed import torch_bridge

sys.modules[__name__] = torch_bridge
