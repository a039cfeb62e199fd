"""apex.optimizers' names on pyddp: ``from pyddp.optimizers import FusedAdam, FusedSGD`` (scripts
written for ``apex.optimizers.FusedAdam`` port by changing the import)."""
from .optim.fused_adam import FusedAdam
from .optim.fused_lamb import FusedLAMB
from .optim.fused_sgd import FusedSGD

__all__ = ["FusedAdam", "FusedSGD", "FusedLAMB"]
