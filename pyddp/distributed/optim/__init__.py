"""pyddp.distributed.optim: ZeroRedundancyOptimizer (torch.distributed.optim's path)."""
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer  # noqa: F401

__all__ = ["ZeroRedundancyOptimizer"]
