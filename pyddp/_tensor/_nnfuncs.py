"""The torch.* spellings of neural-network functions training code calls directly
(``torch.layer_norm``, ``torch.embedding``, ``torch.dropout``, ...), with torch's signatures
(torch.embedding takes the weight first; torch.batch_norm's arguments are all positional;
torch.kl_div and torch.binary_cross_entropy_with_logits take the reduction as torch's enum,
0 none, 1 mean, 2 sum, and as torch 2.13's give the elementwise loss when it is not given).  Each calls pyddp.nn.functional's function (imported on first call).
"""
from __future__ import annotations

import importlib

__all__ = ["embedding", "layer_norm", "group_norm", "batch_norm", "dropout", "conv2d",
           "max_pool2d", "rms_norm", "pairwise_distance", "kl_div",
           "binary_cross_entropy_with_logits", "pixel_shuffle", "pixel_unshuffle", "prelu",
           "selu", "celu", "threshold", "hardshrink", "relu_", "selu_", "celu_", "threshold_"]


def _F():
    return importlib.import_module("pyddp.nn.functional")


_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


def _reduction(r):
    if r not in _REDUCTION:
        raise RuntimeError(f"{r} is not a valid value for reduction")
    return _REDUCTION[r]


def embedding(weight, input, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """Rows of weight at input's indices (torch.embedding: weight first; padding_idx -1 is
    none)."""
    return _F().embedding(input, weight, padding_idx=None if padding_idx == -1 else padding_idx,
                          scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05, cudnn_enable=True):
    """F.layer_norm."""
    return _F().layer_norm(input, normalized_shape, weight, bias, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-05, cudnn_enabled=True):
    """F.group_norm."""
    return _F().group_norm(input, num_groups, weight, bias, eps)


def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
               cudnn_enabled):
    """F.batch_norm, torch.batch_norm's argument order."""
    return _F().batch_norm(input, running_mean, running_var, weight, bias, training, momentum,
                           eps)


def dropout(input, p, train):
    """F.dropout(input, p, training=train)."""
    return _F().dropout(input, p, train)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d."""
    return _F().conv2d(input, weight, bias, stride, padding, dilation, groups)


def max_pool2d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """F.max_pool2d (stride () or None: the kernel size)."""
    return _F().max_pool2d(input, kernel_size, stride if stride not in ((), []) else None,
                           padding, dilation, ceil_mode)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """F.rms_norm."""
    return _F().rms_norm(input, normalized_shape, weight, eps)


def pairwise_distance(x1, x2, p=2.0, eps=1e-06, keepdim=False):
    """F.pairwise_distance."""
    return _F().pairwise_distance(x1, x2, p, eps, keepdim)


def kl_div(input, target, reduction=0, *, log_target=False):
    """F.kl_div with torch's reduction enum (as torch.kl_div, elementwise unless told; 1, mean,
    without F's warning)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _F().kl_div(input, target, reduction=_reduction(reduction), log_target=log_target)


def binary_cross_entropy_with_logits(input, target, weight=None, pos_weight=None, reduction=0):
    """F.binary_cross_entropy_with_logits with torch's reduction enum (elementwise unless told,
    as torch.binary_cross_entropy_with_logits)."""
    return _F().binary_cross_entropy_with_logits(input, target, weight,
                                                 reduction=_reduction(reduction),
                                                 pos_weight=pos_weight)


def pixel_shuffle(input, upscale_factor):
    """F.pixel_shuffle."""
    return _F().pixel_shuffle(input, upscale_factor)


def pixel_unshuffle(input, downscale_factor):
    """F.pixel_unshuffle."""
    return _F().pixel_unshuffle(input, downscale_factor)


def prelu(input, weight):
    """F.prelu."""
    return _F().prelu(input, weight)


def selu(input):
    """F.selu."""
    return _F().selu(input)


def celu(input, alpha=1.0):
    """F.celu."""
    return _F().celu(input, alpha)


def threshold(input, threshold, value):
    """F.threshold."""
    return _F().threshold(input, threshold, value)


def hardshrink(input, lambd=0.5):
    """F.hardshrink."""
    return _F().hardshrink(input, lambd)


def relu_(input):
    """input = relu(input), in place; returns input."""
    return _F().relu_(input)


def selu_(input):
    """In-place selu; returns input."""
    return _F().selu_(input)


def celu_(input, alpha=1.0):
    """In-place celu; returns input."""
    return _F().celu_(input, alpha)


def threshold_(input, threshold, value):
    """In-place threshold; returns input."""
    return _F().threshold_(input, threshold, value)
