"""Similarity and distance between batches of vectors: cosine_similarity and pairwise_distance.
"""
from __future__ import annotations

from ... import _tensor as _t
from ..._tensor import Tensor
from .._argcheck import require_tensors as _require_tensors

__all__ = ["cosine_similarity", "pairwise_distance"]


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along dim (norms clamped to eps): the tensor op
    pyddp.cosine_similarity."""
    return _t.cosine_similarity(x1, x2, dim, eps)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps along the last dimension."""
    d = x1 - x2 + eps
    if p == 2:
        return _t.sqrt(_t.sum(d * d, -1, keepdim))
    if p == 1:
        return _t.sum(_t.abs(d), -1, keepdim)
    return _t.pow(_t.sum(_t.pow(_t.abs(d), p), -1, keepdim), 1.0 / p)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
