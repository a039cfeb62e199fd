"""torch.*'s in-place functions (``torch.sigmoid_(t)`` is ``t.sigmoid_()``): each calls the
Tensor method of the same name, which checks and records the write as torch's do; and
Tensor.nan_to_num_ / logit_ / fix / fix_."""
from __future__ import annotations

import numpy as np

from ._aliases import _inplace_of
from ._core import Tensor, _check_inplace
from ._grad_mode import _st


def _write_result(self, r):
    """self takes r's values (and, when r is recorded, its place in the graph), as the in-place
    variants of _aliases do; returns self."""
    _check_inplace(self)
    if r._requires_grad and _st.grad:
        self._data = r._data.astype(self._data.dtype, copy=False)
        self.grad_fn, self._requires_grad = r.grad_fn, True
        return self
    np.copyto(self._data, np.broadcast_to(r._data, self._data.shape), casting="unsafe")
    return self

_NAMES = ("abs_", "acos_", "asin_", "atan_", "ceil_", "clamp_", "clamp_max_", "clamp_min_",
          "clip_", "cos_", "cosh_", "erf_", "erfc_", "exp_", "exp2_", "expm1_", "fill_",
          "floor_", "frac_", "log_", "log10_", "log1p_", "log2_", "neg_", "negative_",
          "reciprocal_", "round_", "rsqrt_", "sigmoid_", "sin_", "sinh_", "sqrt_", "square_",
          "tan_", "tanh_", "trunc_", "zero_", "nan_to_num_", "logit_", "deg2rad_", "rad2deg_",
          "xlogy_", "sinc_", "acosh_", "asinh_", "atanh_", "arccos_", "arcsin_", "arctan_",
          "arccosh_", "arcsinh_", "arctanh_", "fix_")

__all__ = [n for n in _NAMES if n.endswith("_")] + ["fix"]


def _fn(name):
    def f(input, *args, **kwargs):
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not "
                            f"{type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"input.{name}(...): in place; returns input (torch.{name})."
    return f


def _attach():
    T = Tensor
    T.fix = T.trunc
    for base in ("nan_to_num", "logit", "fix", "clip", "exp", "log", "sqrt", "neg", "abs",
                 "fill"):
        if not hasattr(T, base + "_") and hasattr(T, base):
            setattr(T, base + "_", _inplace_of(base))


def fix(input, *, out=None):
    """trunc's other name."""
    return input.trunc()


_attach()
for _n in __all__:
    if _n != "fix":
        globals()[_n] = _fn(_n)
del _n
