"""Tensor's method aliases (``multiply``, ``swapdims``, ``arctan2`` ...), small predicates and
conversions (``is_cpu``, ``short``, ``allclose`` ...), and the in-place ``_`` variants of the
elementwise and shape methods (``sin_``, ``clamp_min_``, ``t_`` ...).

Attached last, after every module that attaches methods (_methods and the op modules), since the
variants are made from the methods the class has by then.
"""
from __future__ import annotations

import numpy as np

from ._core import Tensor, _as_t, _check_inplace, _new_on
from ._dtypes import _scalar_name
from ._grad_mode import _st


def _inplace_of(fname):
    def m(self, *args, **kwargs):
        _check_inplace(self)
        r = getattr(self, fname)(*args, **kwargs)
        if r._requires_grad and _st.grad:
            self._data = r._data.astype(self._data.dtype, copy=False)
            self.grad_fn, self._requires_grad = r.grad_fn, True
            return self
        if r._data.dtype != self._data.dtype and not np.can_cast(r._data.dtype,
                                                                   self._data.dtype, "same_kind"):
            raise RuntimeError(f"result type {_scalar_name(r._data.dtype)} can't be cast to "
                               f"the desired output type {_scalar_name(self._data.dtype)}")
        np.copyto(self._data, np.broadcast_to(r._data, self._data.shape), casting="unsafe")
        return self
    m.__name__ = fname + "_"
    m.__doc__ = f"In-place {fname}; returns self."
    return m


def _where_method(self, condition, other):
    from ._ops import where
    return where(condition, self, _as_t(other, self) if not isinstance(other, Tensor) else other)


def _attach():
    T = Tensor
    T.where = lambda self, condition, other: _where_method(self, condition, other)
    T.where.__doc__ = "self where condition is True, else other (torch.where(condition, self, other))."
    T.ndimension = T.dim
    T.is_cpu = property(lambda self: self._dev.type == "cpu", doc="Whether on the CPU.")
    T.is_complex = lambda self: self._data.dtype.kind == "c"
    T.is_complex.__doc__ = "Whether the dtype is complex."
    T.is_signed = lambda self: self._data.dtype.kind in "ifc"
    T.is_signed.__doc__ = "Whether the dtype is signed."
    T.isinf = lambda self: _new_on(np.isinf(self._data), self)
    T.isinf.__doc__ = "Elementwise infinity test (bool)."
    T.allclose = lambda self, other, rtol=1e-05, atol=1e-08, equal_nan=False: bool(np.allclose(
        self._data, other._data if isinstance(other, Tensor) else other, rtol, atol, equal_nan))
    T.allclose.__doc__ = "Whether all elements are close (torch.allclose)."
    T.short = lambda self: self.to(np.int16)
    T.short.__doc__ = "int16 version."
    T.byte = lambda self: self.to(np.uint8)
    T.byte.__doc__ = "uint8 version."
    T.char = lambda self: self.to(np.int8)
    T.char.__doc__ = "int8 version."
    T.swapaxes = T.swapdims = T.transpose
    T.absolute = T.abs
    T.multiply = T.mul
    T.divide = T.div
    T.subtract = T.sub
    for fname in ("sin", "cos", "tan", "tanh", "sigmoid", "relu", "log", "log1p", "log2",
                  "log10", "expm1", "rsqrt", "square", "reciprocal", "sign", "floor", "ceil",
                  "round", "trunc", "frac", "erf", "erfinv", "exp2", "sinh", "cosh", "asin", "acos",
                  "atan", "pow", "fmod", "remainder", "clamp_min", "clamp_max", "lerp",
                  "logical_not", "logical_and", "logical_or", "logical_xor", "atan2",
                  "floor_divide", "addmm", "baddbmm", "cumsum", "cumprod", "t", "transpose",
                  "squeeze", "unsqueeze", "eq", "ne", "lt", "le", "gt", "ge", "masked_fill",
                  "tril", "triu", "maximum", "minimum", "negative", "true_divide", "multiply",
                  "divide", "subtract", "where"):
        if hasattr(T, fname) and not hasattr(T, fname + "_"):
            if fname in ("t", "transpose", "squeeze", "unsqueeze"):
                continue   # shape in-place variants change the tensor's own view: below
            setattr(T, fname + "_", _inplace_of(fname))

    def _shape_inplace(fname):
        def m(self, *args, **kwargs):
            r = getattr(self, fname)(*args, **kwargs)
            self._data = r._data     # same memory, new view of it
            if r.grad_fn is not None:
                self.grad_fn = r.grad_fn
            return self
        m.__name__ = fname + "_"
        m.__doc__ = f"In-place {fname} (this tensor becomes the view); returns self."
        return m
    for fname in ("t", "transpose", "squeeze", "unsqueeze"):
        if not hasattr(T, fname + "_"):
            setattr(T, fname + "_", _shape_inplace(fname))


_attach()
