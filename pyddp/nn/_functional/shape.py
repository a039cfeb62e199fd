"""Shape operations: pad (constant, reflect, replicate, circular) and flatten.
"""
from __future__ import annotations

import numpy as np

from ... import _tensor as _t
from ..._tensor import Tensor
from ..._tensor._core import _mk
from .._argcheck import require_tensors as _require_tensors

__all__ = ["pad", "flatten"]


def pad(input, pad, mode="constant", value=None):
    """Pad the trailing dims: pad = (left_last, right_last, left_prev, right_prev, ...).

    mode 'constant' (any value, negative pads crop); 'reflect', 'replicate', 'circular' forward and
    backward through np.pad's index map.
    """
    xd = input._data
    if len(pad) % 2:
        raise ValueError("Padding length must be divisible by 2")
    npairs = len(pad) // 2
    widths = [(0, 0)] * (xd.ndim - npairs) + [(pad[2 * k], pad[2 * k + 1])
                                                for k in range(npairs)][::-1]
    if mode == "constant":
        crop = tuple(slice(-lo if lo < 0 else 0, (hi if hi < 0 else None)) for lo, hi in widths)
        xc = xd[crop]
        pw = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
        out = np.pad(xc, pw, mode="constant", constant_values=0 if value is None else value)
        inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(pw, xc.shape))

        def bw(g):
            gx = np.zeros(xd.shape, dtype=g.dtype)
            gx[crop] = g[inner]
            return (gx,)
        return _mk(out, "ConstantPadNdBackward0", bw, (input,), saves=False)
    npmode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}.get(mode)
    if npmode is None:
        raise NotImplementedError(f"pad mode {mode!r}")
    # index map: pad an array of flat indices, then gather / scatter-add
    ids = np.arange(xd.size).reshape(xd.shape)
    pid = np.pad(ids, widths, mode=npmode)
    out = xd.reshape(-1)[pid]

    def bw(g):
        gx = np.zeros(xd.size, dtype=g.dtype)
        np.add.at(gx, pid.reshape(-1), g.reshape(-1))
        return (gx.reshape(xd.shape),)
    return _mk(out, "ReflectionPadBackward", bw, (input,), saves=False)


def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim."""
    return _t.flatten(input, start_dim, end_dim)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
