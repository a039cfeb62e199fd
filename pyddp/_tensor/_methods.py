"""Tensor's methods that are operations (arithmetic, comparisons' aliases, reductions, shape,
conversions, ``new_*``): each calls its function in _ops or _factories.

They are attached to Tensor when pyddp._tensor imports this module (right after _ops, as the op
modules by concern attach their own), so that _core, which defines the class and the graph helpers,
does not import the modules built on it: _core <- _factories, _ops <- _methods, _compare, _shape,
....  The class body below is only a
namespace: the methods read this module's globals, as they read _core's before.
"""
from __future__ import annotations

import builtins

import numpy as np

from .._device import _check_device
from ._core import Tensor, _as_t, _check_inplace, _to_device
from ._dtypes import _check_memory_format, _dtype
from ._dtypes import preserve_format as _preserve_format
from ._factories import empty, full, ones, tensor, zeros
from ._grad_mode import _st
from ._ops import (_cast, _getitem, _ip_binary, _setitem, abs, add, all, amax, amin, any, argmax,
                   argmin, ceil, chunk, clamp, cos, div, equal, exp, expm1, flatten, floor, log,
                   log1p, log_softmax, matmul, max, maximum, mean, min, minimum, mul, neg, permute,
                   pow, relu, reshape, round, rsqrt, sigmoid, sign, sin, softmax, split, sqrt,
                   square, squeeze, std, sub, sum, tanh, transpose, tril, triu, unsqueeze, var,
                   where)


class _Methods:
    # --- conversions ----------------------------------------------------------------------------
    def to(self, *args, **kwargs):
        """to(dtype) / to(device) / to(device, dtype) / to(other): a converted tensor (self when
        nothing changes; ``copy=True`` always copies)."""
        dt = kwargs.get("dtype")
        copy = kwargs.get("copy", False)
        dev = None
        for a in args:
            if isinstance(a, Tensor):
                dt, dev = a.dtype, a._dev
            elif isinstance(a, builtins.bool):   # non_blocking / copy given positionally
                continue
            elif isinstance(a, (str, builtins.int, np.integer)) or type(a).__name__ == "device":
                dev = _check_device(a)
            elif a is not None:
                try:
                    dt = _dtype(a)
                except TypeError:
                    raise TypeError(f"to(): unexpected argument {a!r}") from None
        if "device" in kwargs and kwargs["device"] is not None:
            dev = _check_device(kwargs["device"])
        _check_memory_format(kwargs.get("memory_format"), "to")
        dt = _dtype(dt)
        r = self
        if dev is not None and dev != self._dev:
            r = _to_device(self, dev)
            copy = False
        mf = kwargs.get("memory_format")
        if dt is not None and dt != r._data.dtype:
            r = _cast(r, dt)
        elif copy:
            r = r.clone()
        if mf is not None and mf is not _preserve_format:
            r = r.contiguous(memory_format=mf)
        return r

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        """zeros with this tensor's dtype (and device)."""
        return zeros(*size, dtype=dtype or self.dtype, device=device or self._dev,
                     requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        """ones with this tensor's dtype (and device)."""
        return ones(*size, dtype=dtype or self.dtype, device=device or self._dev,
                     requires_grad=requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
        """empty with this tensor's dtype (and device)."""
        return empty(*size, dtype=dtype or self.dtype, device=device or self._dev,
                     requires_grad=requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        """full with this tensor's dtype (and device)."""
        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self._dev,
                    requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        """tensor(data) with this tensor's dtype (and device)."""
        return tensor(data, dtype=dtype or self.dtype, device=device or self._dev,
                      requires_grad=requires_grad)

    # --- arithmetic -----------------------------------------------------------------------------
    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(self, other)

    def __sub__(self, other):
        return sub(self, other)

    def __rsub__(self, other):
        return sub(_as_t(other, self), self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(self, other)

    def __truediv__(self, other):
        return div(self, other)

    def __rtruediv__(self, other):
        return div(_as_t(other, self), self)

    def __pow__(self, other):
        return pow(self, other)

    def __rpow__(self, other):
        return pow(_as_t(other, self), self)

    def __neg__(self):
        return neg(self)

    def __abs__(self):
        return abs(self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(_as_t(other), self)

    def add(self, other, alpha=1):
        """self + alpha * other."""
        return add(self, other, alpha=alpha)

    def sub(self, other, alpha=1):
        """self - alpha * other."""
        return sub(self, other, alpha=alpha)

    def mul(self, other):
        """self * other."""
        return mul(self, other)

    def div(self, other):
        """self / other."""
        return div(self, other)

    def pow(self, other):
        """self ** other."""
        return pow(self, other)

    def neg(self):
        """-self."""
        return neg(self)

    def matmul(self, other):
        """self @ other."""
        return matmul(self, other)

    mm = matmul

    bmm = matmul

    # --- in-place (no graph recorded for leaves; checked like torch) ----------------------------
    def add_(self, other, alpha=1):
        """In-place self += alpha * other."""
        return _ip_binary(self, other, "add", alpha)

    def sub_(self, other, alpha=1):
        """In-place self -= alpha * other."""
        return _ip_binary(self, other, "sub", alpha)

    def mul_(self, other):
        """In-place self *= other."""
        return _ip_binary(self, other, "mul", 1)

    def div_(self, other):
        """In-place self /= other."""
        return _ip_binary(self, other, "div", 1)

    __iadd__ = add_

    __isub__ = sub_

    __imul__ = mul_

    __itruediv__ = div_

    def equal(self, other):
        """True when ``other`` has the same shape and elements (torch.equal)."""
        return equal(self, other)

    def copy_(self, src, non_blocking=False):
        """Copy src's values into self (broadcasting, casting)."""
        _check_inplace(self)
        if _st.grad and isinstance(src, Tensor) and src._requires_grad:
            r = _cast(src, self._data.dtype) if src.dtype != self.dtype else src.clone()
            r = r.expand(*self.shape) if r.shape != self.shape else r
            self._data = np.array(r._data)
            self.grad_fn = r.grad_fn
            self._requires_grad = True
            return self
        np.copyto(self._data, src._data if isinstance(src, Tensor) else np.asarray(src),
                  casting="unsafe")
        return self

    def clamp_(self, min=None, max=None):
        """Clamp in place."""
        _check_inplace(self)
        if _st.grad and self._requires_grad:
            r = clamp(self, min, max)
            self._data, self.grad_fn = r._data, r.grad_fn
            return self
        np.clip(self._data, min, max, out=self._data)
        return self

    clip_ = clamp_

    def masked_fill(self, mask, value):
        """Elements where mask is True replaced by value."""
        return where(mask, _as_t(value, self), self)

    def tril(self, diagonal=0):
        """The lower triangle of the last two dimensions (pyddp.tril)."""
        return tril(self, diagonal)

    def triu(self, diagonal=0):
        """The upper triangle of the last two dimensions (pyddp.triu)."""
        return triu(self, diagonal)

    def tril_(self, diagonal=0):
        """In-place lower triangle."""
        _check_inplace(self)
        self._data[...] = tril(self.detach(), diagonal)._data
        return self

    def triu_(self, diagonal=0):
        """In-place upper triangle."""
        _check_inplace(self)
        self._data[...] = triu(self.detach(), diagonal)._data
        return self

    # --- unary math -----------------------------------------------------------------------------
    def exp(self):
        """e ** self."""
        return exp(self)

    def log(self):
        """Natural log."""
        return log(self)

    def log1p(self):
        """log(1 + self)."""
        return log1p(self)

    def expm1(self):
        """exp(self) - 1."""
        return expm1(self)

    def sqrt(self):
        """Square root."""
        return sqrt(self)

    def rsqrt(self):
        """1 / sqrt."""
        return rsqrt(self)

    def square(self):
        """self * self."""
        return square(self)

    def abs(self):
        """Absolute value."""
        return abs(self)

    def sin(self):
        """Sine."""
        return sin(self)

    def cos(self):
        """Cosine."""
        return cos(self)

    def tanh(self):
        """Hyperbolic tangent."""
        return tanh(self)

    def sigmoid(self):
        """Logistic sigmoid."""
        return sigmoid(self)

    def relu(self):
        """max(self, 0)."""
        return relu(self)

    def clamp(self, min=None, max=None):
        """Clamp into [min, max]."""
        return clamp(self, min, max)

    clip = clamp

    def reciprocal(self):
        """1 / self."""
        return div(_as_t(1.0, self), self)

    def sign(self):
        """Sign (no gradient)."""
        return sign(self)

    def floor(self):
        """Floor (zero gradient)."""
        return floor(self)

    def ceil(self):
        """Ceil (zero gradient)."""
        return ceil(self)

    def round(self):
        """Round (zero gradient)."""
        return round(self)

    def softmax(self, dim):
        """softmax along dim."""
        return softmax(self, dim)

    def log_softmax(self, dim):
        """log_softmax along dim."""
        return log_softmax(self, dim)

    def maximum(self, other):
        """Elementwise max."""
        return maximum(self, other)

    def minimum(self, other):
        """Elementwise min."""
        return minimum(self, other)

    # --- reductions -----------------------------------------------------------------------------
    def sum(self, dim=None, keepdim=False, dtype=None):
        """Sum over dim (all when None)."""
        return sum(self, dim, keepdim, dtype=dtype)

    def mean(self, dim=None, keepdim=False, dtype=None):
        """Mean over dim (all when None)."""
        return mean(self, dim, keepdim, dtype=dtype)

    def max(self, dim=None, keepdim=False):
        """max(): the maximum; max(dim): (values, indices); max(tensor): elementwise."""
        return max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        """min(): the minimum; min(dim): (values, indices); min(tensor): elementwise."""
        return min(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        """Maximum over dim (ties share the gradient)."""
        return amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        """Minimum over dim (ties share the gradient)."""
        return amin(self, dim, keepdim)

    def var(self, dim=None, unbiased=None, keepdim=False, correction=None):
        """Variance (unbiased by default)."""
        return var(self, dim, unbiased, keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim=False, correction=None):
        """Standard deviation (unbiased by default)."""
        return std(self, dim, unbiased, keepdim, correction=correction)

    def argmax(self, dim=None, keepdim=False):
        """Index of the maximum."""
        return argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        """Index of the minimum."""
        return argmin(self, dim, keepdim)

    def all(self, dim=None):
        """All true."""
        return all(self, dim)

    def any(self, dim=None):
        """Any true."""
        return any(self, dim)

    def norm(self, p=2, dim=None, keepdim=False):
        """p-norm (2 by default)."""
        if p == 2:
            return sqrt(sum(self * self, dim, keepdim))
        if p == 1:
            return sum(abs(self), dim, keepdim)
        return sum(abs(self) ** p, dim, keepdim) ** (1.0 / p)

    # --- shapes ---------------------------------------------------------------------------------
    def reshape(self, *shape):
        """Same data, new shape (-1 inferred)."""
        return reshape(self, *shape)

    def reshape_as(self, other):
        """reshape to other's shape."""
        return reshape(self, other.shape)

    def flatten(self, start_dim=0, end_dim=-1):
        """Merge dims start_dim..end_dim."""
        return flatten(self, start_dim, end_dim)

    def permute(self, *dims):
        """Reorder dimensions."""
        return permute(self, *dims)

    def transpose(self, dim0, dim1):
        """Swap two dimensions."""
        return transpose(self, dim0, dim1)

    def t(self):
        """2-D transpose."""
        return transpose(self, 0, 1) if self.ndim == 2 else self

    def squeeze(self, dim=None):
        """Drop size-1 dimensions."""
        return squeeze(self, dim)

    def unsqueeze(self, dim):
        """Insert a size-1 dimension."""
        return unsqueeze(self, dim)

    def split(self, split_size, dim=0):
        """Chunks of split_size (int) or of the listed sizes along dim."""
        return split(self, split_size, dim)

    def chunk(self, chunks, dim=0):
        """Split into chunks pieces along dim."""
        return chunk(self, chunks, dim)

    def __getitem__(self, idx):
        return _getitem(self, idx)

    def __setitem__(self, idx, value):
        _setitem(self, idx, value)


_SKIP = ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__")
for _name, _fn in list(vars(_Methods).items()):
    if _name in _SKIP:
        continue
    if getattr(_fn, "__name__", None) == _name:
        _fn.__qualname__ = f"Tensor.{_name}"
    setattr(Tensor, _name, _fn)
del _Methods, _name, _fn
