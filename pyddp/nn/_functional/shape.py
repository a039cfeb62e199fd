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

    mode 'constant' (any value, negative pads crop); 'reflect', 'replicate', 'circular' (the last
    1, 2 or 3 dims of a 2-D to 5-D input, negative pads crop) forward and backward through
    np.pad's index map, with torch's checks: a reflection narrower than the dimension, a circular
    pad wrapping at most once, no ``value``.
    """
    xd = input._data
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    npairs = len(pad) // 2
    if mode == "constant" and npairs > xd.ndim:
        raise RuntimeError("Padding length should be less than or equal to two times the input "
                           f"dimension but got padding length {len(pad)} and input of dimension "
                           f"{xd.ndim}")
    widths = [(0, 0)] * (xd.ndim - npairs) + [(pad[2 * k], pad[2 * k + 1])
                                                for k in range(npairs)][::-1]
    crop = tuple(slice(-lo if lo < 0 else 0, (hi if hi < 0 else None)) for lo, hi in widths)
    pw = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    if mode == "constant":
        xc = xd[crop]
        out = np.pad(xc, pw, mode="constant", constant_values=0 if value is None else value)
        inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(pw, xc.shape))

        def bw(g):
            gx = np.zeros(xd.shape, dtype=g.dtype)
            gx[crop] = g[inner]
            return (gx,)
        return _mk(out, "ConstantPadNdBackward0", bw, (input,), saves=False)
    npmode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}.get(mode)
    if npmode is None:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    if npairs not in (1, 2, 3) or xd.ndim not in (npairs + 1, npairs + 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {xd.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    for k in range(npairs):
        d = xd.ndim - 1 - k
        lo, hi, n = pad[2 * k], pad[2 * k + 1], xd.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"Argument #{4 + 2 * k}: Padding size should be less than the "
                               f"corresponding input dimension, but got: padding ({lo}, {hi}) "
                               f"at dimension {d} of input {list(xd.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        if mode == "replicate" and n == 0:
            raise RuntimeError(f"Expected {npairs + 1}D or {npairs + 2}D (batch mode) tensor with "
                               "possibly 0 batch size and other non-zero dimensions for input, "
                               f"but got: {list(xd.shape)}")
    # index map: pad an array of flat indices, crop negative pads, then gather / scatter-add
    # (circular wraps around the cropped input, as torch's; the others crop the padded one)
    ids = np.arange(xd.size).reshape(xd.shape)
    if mode == "circular":
        pid = np.pad(ids[crop], pw, mode=npmode)
    else:
        pid = np.pad(ids, pw, mode=npmode)[crop]
    out = xd.reshape(-1)[pid]

    def bw(g):
        gx = np.zeros(xd.size, dtype=g.dtype)
        np.add.at(gx, pid.reshape(-1), g.reshape(-1))
        return (gx.reshape(xd.shape),)
    name = {"reflect": "ReflectionPad", "replicate": "ReplicationPad",
            "circular": "CircularPad"}[mode]
    return _mk(out, f"{name}{npairs}DBackward0", bw, (input,), saves=False)


def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim."""
    return _t.flatten(input, start_dim, end_dim)


# a NumPy array where a Tensor is expected: torch's TypeError (pyddp/nn/_argcheck.py)
_require_tensors(globals(), __all__, Tensor)
