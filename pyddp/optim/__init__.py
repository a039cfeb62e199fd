"""pyddp.optim: torch.optim's optimizers and schedulers for pyddp Tensors and torch CPU tensors,
plus apex's FusedAdam / FusedSGD, all updating a whole parameter group in one C call."""
from . import lr_scheduler  # noqa: F401
from .adam import Adam
from .adamw import AdamW
from .fused_adam import FusedAdam
from .fused_sgd import FusedSGD
from .lbfgs import LBFGS, SparseAdam
from .optimizer import Optimizer
from .sgd import SGD
from ._more import Adadelta, Adagrad, Adamax, NAdam, RAdam, RMSprop, Rprop

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "FusedAdam", "FusedSGD", "lr_scheduler",
           "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "Rprop",
           "LBFGS", "SparseAdam"]
