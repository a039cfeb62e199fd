"""Argument normalisation the op modules share: ``_t`` (a Tensor, or the argument wrapped as
one) and ``_dim`` (a dimension argument checked and made non-negative, with torch's error)."""
from __future__ import annotations

import builtins

import numpy as np

from ._core import Tensor, _as_t
from ._dtypes import _pyint


def _t(x):
    return x if isinstance(x, Tensor) else _as_t(x)


def _dim(dim, ndim, name="dim"):
    if isinstance(dim, builtins.bool) or not isinstance(dim, (_pyint, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return _pyint(dim) % n

