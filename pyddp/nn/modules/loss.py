"""Loss modules: CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCEWithLogitsLoss, BCELoss, KLDivLoss,
SmoothL1Loss, HuberLoss (as torch.nn)."""
import warnings

import numpy as np

from ..._tensor import Tensor
from .. import _loss_functional as LF
from .module import Module

__all__ = ["CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "BCEWithLogitsLoss", "BCELoss",
           "KLDivLoss", "SmoothL1Loss", "HuberLoss"]


def _legacy_get_string(size_average, reduce, emit_warning=True):
    """torch's mapping of the deprecated size_average/reduce flags to ``reduction``."""
    if size_average is None:
        size_average = True
    if reduce is None:
        reduce = True
    if size_average and reduce:
        ret = "mean"
    elif reduce:
        ret = "sum"
    else:
        ret = "none"
    if emit_warning:
        warnings.warn("size_average and reduce args will be deprecated, please use "
                      f"reduction='{ret}' instead.", stacklevel=3)
    return ret


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            self.reduction = _legacy_get_string(size_average, reduce)
        else:
            self.reduction = reduction


def _as_buffer(value):
    if value is None or isinstance(value, Tensor):
        return value
    return Tensor(np.asarray(value))


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _as_buffer(weight))


class L1Loss(_Loss):
    """Mean (or sum, or elementwise) absolute error ``|input - target|``."""

    __constants__ = ["reduction"]

    def forward(self, input, target):
        """The L1 loss of ``input`` against ``target``."""
        return LF.l1_loss(input, target, reduction=self.reduction)


class MSELoss(_Loss):
    """Mean (or sum, or elementwise) squared error ``(input - target)**2``."""

    __constants__ = ["reduction"]

    def forward(self, input, target):
        """The squared-error loss of ``input`` against ``target``."""
        return LF.mse_loss(input, target, reduction=self.reduction)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class indices, given log-probabilities (N, C[, d1, ...]).

    ``weight`` rescales each class; targets equal to ``ignore_index`` contribute
    nothing (and are left out of the weighted mean's denominator).
    """

    __constants__ = ["ignore_index", "reduction"]

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        """The NLL loss of log-probabilities ``input`` for class indices ``target``."""
        return LF.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                           reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """Cross entropy of logits (N, C[, d1, ...]) or (C,) against class indices or probabilities.

    As ``torch.nn.CrossEntropyLoss``: ``weight`` per class, ``ignore_index`` (index
    targets), ``label_smoothing`` in [0, 1], ``reduction`` in {"mean", "sum", "none"}.
    Computed by one fused log-softmax + NLL autograd Function.
    """

    __constants__ = ["ignore_index", "reduction", "label_smoothing"]

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        """The cross-entropy loss of logits ``input`` against ``target``."""
        return LF.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                                reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid + binary cross entropy in one numerically stable step.

    ``weight`` rescales each element (broadcast), ``pos_weight`` the positive term per
    class (broadcast along the last dimension), as ``torch.nn.BCEWithLogitsLoss``.
    """

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean",
                 pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _as_buffer(weight))
        self.register_buffer("pos_weight", _as_buffer(pos_weight))

    def forward(self, input, target):
        """The loss of logits ``input`` against targets in [0, 1]."""
        return LF.binary_cross_entropy_with_logits(input, target, self.weight,
                                                   pos_weight=self.pos_weight,
                                                   reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """Binary cross entropy of probabilities ``input`` against ``target``
    (F.binary_cross_entropy)."""

    __constants__ = ["reduction"]

    def forward(self, input, target):
        """The loss of ``input`` against ``target``."""
        from .. import _loss_extra
        return _loss_extra.binary_cross_entropy(input, target, weight=self.weight,
                                                reduction=self.reduction)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence (F.kl_div); ``reduction='batchmean'`` is the mathematical
    definition."""

    __constants__ = ["reduction"]

    def __init__(self, size_average=None, reduce=None, reduction="mean", log_target=False):
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):
        """The divergence of ``target`` from ``input`` (log-probabilities)."""
        from .. import _loss_extra
        return _loss_extra.kl_div(input, target, reduction=self.reduction,
                                  log_target=self.log_target)


class SmoothL1Loss(_Loss):
    """Squared error below ``beta``, absolute error above it (F.smooth_l1_loss)."""

    __constants__ = ["reduction"]

    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        """The loss of ``input`` against ``target``."""
        from .. import _loss_extra
        return _loss_extra.smooth_l1_loss(input, target, reduction=self.reduction,
                                          beta=self.beta)


class HuberLoss(_Loss):
    """Squared error below ``delta``, delta-scaled absolute error above it (F.huber_loss)."""

    __constants__ = ["reduction", "delta"]

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input, target):
        """The loss of ``input`` against ``target``."""
        from .. import _loss_extra
        return _loss_extra.huber_loss(input, target, reduction=self.reduction, delta=self.delta)
