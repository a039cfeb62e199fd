"""Helpers the functional modules share: ``_pair`` (an int or a pair of ints as a pair) and the
autocast casts ``_low`` / ``_up`` / ``_f32``."""
from __future__ import annotations

from ..._tensor._dtypes import _F32, _HALFS
from ..._tensor._ops import _ac_f32, _ac_low, _cast


def _pair(v):
    if isinstance(v, (tuple, list)):
        return tuple(int(x) for x in v)
    return (int(v), int(v))


def _low(t):
    """autocast: cast a float tensor to the lower-precision dtype (differentiably)."""
    if t is None:
        return None
    return _ac_low(t)


def _up(t):
    return _ac_f32(t)


def _f32(t):
    """float16/bfloat16 tensors cast (differentiably) to float32; others as they are."""
    if t is None or t.dtype not in _HALFS:
        return t
    return _cast(t, _F32)
