"""Lookups and encodings of indices: embedding (a row gather; max_norm renormalises the rows it
reads) and one_hot.
"""
from __future__ import annotations

import numpy as np

from ..._tensor import Tensor
from ..._tensor._core import _mk
from .._argcheck import require_tensors as _require_tensors

__all__ = ["embedding", "one_hot"]


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of weight picked by the integer indices in input."""
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {idx.dtype} instead")
    wd = weight._data
    if padding_idx is not None and padding_idx < 0:
        padding_idx += wd.shape[0]
    if max_norm is not None:
        rows = np.unique(idx)
        n = np.linalg.norm(wd[rows], ord=norm_type, axis=1, keepdims=True)
        scale = np.where(n > max_norm, max_norm / (n + 1e-7), 1).astype(wd.dtype)
        wd[rows] *= scale
    out = wd[idx]
    shape = wd.shape

    def bw(g):
        gw = np.zeros(shape, dtype=g.dtype)
        flat = idx.reshape(-1)
        g2 = g.reshape(-1, shape[1])
        if scale_grad_by_freq:
            cnt = np.bincount(flat, minlength=shape[0])
            g2 = g2 / cnt[flat][:, None]
        np.add.at(gw, flat, g2)
        if padding_idx is not None:
            gw[padding_idx] = 0
        return (gw,)
    return _mk(out, "EmbeddingBackward0", bw, (weight,))


def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding along a new last dim."""
    idx = tensor._data
    n = int(idx.max()) + 1 if num_classes < 0 else num_classes
    out = np.zeros(idx.shape + (n,), dtype=np.int64)
    np.put_along_axis(out, idx[..., None], 1, axis=-1)
    return Tensor._wrap(out)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor, exempt=("embedding",))
