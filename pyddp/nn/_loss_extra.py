"""More losses (torch.nn.functional): kl_div, smooth_l1_loss, huber_loss, binary_cross_entropy.

Built from pyddp's differentiable tensor ops (their gradients are the formulas'), with torch
2.13's reductions, warnings and errors; float16/bfloat16 inputs are upcast under autocast as the
other losses (pyddp/nn/_loss_functional.py).
"""
import warnings

from .. import _autocast
from .._tensor import Tensor, where
from ._loss_functional import _broadcast_warn, _check_reduction, _legacy_reduction, _t

__all__ = ["kl_div", "smooth_l1_loss", "huber_loss", "binary_cross_entropy"]


def _reduce(el, reduction):
    if reduction == "mean":
        return el.mean()
    if reduction == "sum":
        return el.sum()
    return el


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """Kullback-Leibler divergence of ``target`` from ``input`` (log-probabilities):
    ``target * (log(target) - input)`` (0 where target is 0), or with log_target
    ``exp(target) * (target - input)``; reduction 'batchmean' divides the sum by the batch size
    ('mean', with torch's warning, by the number of elements)."""
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, reduction)
    elif reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", UserWarning, stacklevel=2)
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    input = _autocast.upcast(_t(input, "kl_div"))
    target = _autocast.upcast(_t(target, "kl_div", "target", 2))
    if log_target:
        el = target.exp() * (target - input)
    else:
        el = target.xlogy(target) - target * input
    if reduction == "batchmean":
        if input.ndim == 0:
            return el.sum()
        return el.sum() / input.shape[0]
    return _reduce(el, reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (d = input - target;
    beta 0 is the L1 loss)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "smooth_l1_loss"))
    target = _autocast.upcast(_t(target, "smooth_l1_loss", "target", 2))
    _broadcast_warn(input, target)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    d = input - target
    a = d.abs()
    if beta == 0:
        return _reduce(a, reduction)
    el = where(a < beta, d * d * (0.5 / beta), a - 0.5 * beta)
    return _reduce(el, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """``0.5 d**2`` where ``|d| <= delta``, else ``delta (|d| - 0.5 delta)`` (optionally weighted
    elementwise)."""
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "huber_loss"))
    target = _autocast.upcast(_t(target, "huber_loss", "target", 2))
    _broadcast_warn(input, target)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    d = input - target
    a = d.abs()
    el = where(a <= delta, d * d * 0.5, (a - 0.5 * delta) * delta)
    if weight is not None:
        el = el * weight
    return _reduce(el, reduction)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """``-(target log(input) + (1 - target) log(1 - input))`` for probabilities in [0, 1], the
    logs clamped at -100 (as torch's)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input = _autocast.upcast(_t(input, "binary_cross_entropy"))
    target = _autocast.upcast(_t(target, "binary_cross_entropy", "target", 2))
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size (torch.Size({list(target.shape)})) that is "
                         f"different to the input size (torch.Size({list(input.shape)})) is "
                         "deprecated. Please ensure they have the same size.")
    xd = input._data
    if xd.size and ((xd < 0) | (xd > 1)).any():
        raise RuntimeError("all elements of input should be between 0 and 1")
    el = _Bce.apply(input, target)
    if weight is not None:
        el = el * (weight if isinstance(weight, Tensor) else _t(weight))
    return _reduce(el, reduction)


def _bce_function():
    import numpy as np

    from ..autograd.function import Function

    class _BceEl(Function):
        """The elementwise loss with torch's gradient, (x - t) / max(x (1 - x), 1e-12)."""

        @staticmethod
        def forward(ctx, input, target):
            x, t = input._data, target._data
            with np.errstate(divide="ignore"):
                lx = np.maximum(np.log(x), -100)
                l1x = np.maximum(np.log1p(-x), -100)
            ctx.save_for_backward(input, target)
            return Tensor((-(t * lx + (1 - t) * l1x)).astype(x.dtype))

        @staticmethod
        def backward(ctx, g):
            input, target = ctx.saved_tensors
            x, t = input._data, target._data
            gd = g._data * (x - t) / np.maximum((1 - x) * x, 1e-12)
            gt = None
            if ctx.needs_input_grad[1]:
                with np.errstate(divide="ignore"):
                    gt = Tensor((g._data * (np.maximum(np.log1p(-x), -100)
                                            - np.maximum(np.log(x), -100))).astype(x.dtype))
            return Tensor(gd.astype(x.dtype)), gt
    return _BceEl


_Bce = _bce_function()
