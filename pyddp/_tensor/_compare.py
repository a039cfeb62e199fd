"""Comparisons and logic as functions (torch.eq, torch.logical_and, torch.isclose, ...); the
Tensor operators and methods of the same names exist on the class, this module attaches the
aliases torch adds (``greater``, ``not_equal``, ...) and ``isclose`` / ``logical_*``.

Each function follows torch 2.13 on the same inputs (values, dtypes, errors; the tests compare them
with torch).
"""
from __future__ import annotations

import numpy as np

from ._args import _t
from ._core import Tensor, _binop_arrays, _new_on

__all__ = ["eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal",
           "not_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "isclose"]


def _cmp(f):
    def op(input, other, *, out=None):
        a = _t(input)
        ad, bd = _binop_arrays(a, other)
        return _new_on(f(ad, bd), a, other)
    op.__name__ = f.__name__
    op.__doc__ = f"Elementwise {f.__name__} (a bool tensor)."
    return op


eq = _cmp(np.equal)
ne = not_equal = _cmp(np.not_equal)
lt = less = _cmp(np.less)
le = less_equal = _cmp(np.less_equal)
gt = greater = _cmp(np.greater)
ge = greater_equal = _cmp(np.greater_equal)
logical_and = _cmp(np.logical_and)
logical_or = _cmp(np.logical_or)
logical_xor = _cmp(np.logical_xor)


def logical_not(input):
    """Elementwise not (bool)."""
    a = _t(input)
    return _new_on(np.logical_not(a._data), a)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Elementwise |input - other| <= atol + rtol * |other| (bool)."""
    a = _t(input)
    ad, bd = _binop_arrays(a, other)
    return _new_on(np.isclose(ad, bd, rtol=rtol, atol=atol, equal_nan=equal_nan), a)


def _attach():
    for name in ("isclose", "logical_and", "logical_or", "logical_xor", "greater",
                 "greater_equal", "less", "less_equal", "not_equal"):
        setattr(Tensor, name, globals()[name])


_attach()
